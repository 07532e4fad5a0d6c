"""phaze: co-design a training accelerator and the way large language models are trained on it.

>>> import phaze
>>> r = phaze.evaluate("gpt3-175b", "a100-80gb", devices=1024, global_batch=1536,
...                    plan="tp=8,pp=16,mbs=1,recompute=full")
>>> r.step_time_s, r.mfu, r.fits
"""
from .api import evaluate, place, shipped
from .arch import Chip, load_chip
from .catalogue import load_model
from .configio import ConfigError
from .cost import Efficiency
from .placement import PlacementOptions, PlacementResult
from .plan import Plan, parse_plan
from .step import StepResult
from .system import System, apply_system, load_system
from .workload import Model

__all__ = ["evaluate", "place", "shipped", "PlacementOptions", "PlacementResult", "Chip", "load_chip", "ConfigError",
           "Efficiency", "Plan", "parse_plan", "StepResult", "Model", "load_model", "System",
           "load_system", "apply_system"]
__version__ = "0.1.0"
