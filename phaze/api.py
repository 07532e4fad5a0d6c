"""The library entry points a notebook calls; the CLI is a thin layer over these."""
from __future__ import annotations

from pathlib import Path

from .arch import Chip, load_chip
from .cost import Efficiency
from .plan import Plan, parse_plan
from .step import StepResult
from .step import evaluate as _evaluate
from .workload import Model, load_model, with_seq_len


def as_model(workload: str | Path | Model, seq_len: int | None = None) -> Model:
    if isinstance(workload, Model):
        return workload if seq_len is None else with_seq_len(workload, seq_len)
    return load_model(workload, seq_len)


def as_chip(arch: str | Path | Chip) -> Chip:
    return arch if isinstance(arch, Chip) else load_chip(arch)


def as_plan(plan: str | Plan | None) -> Plan:
    if plan is None:
        return Plan()
    return plan if isinstance(plan, Plan) else parse_plan(plan)


def calibrated_efficiency(chip: Chip) -> Efficiency:
    """The shipped calibration for the chip's family (pooled ``default`` for other chips)."""
    from .validate import load_default_params, params_for
    return params_for(chip, load_default_params())


def evaluate(workload: str | Path | Model, arch: str | Path | Chip, devices: int, global_batch: int,
             plan: str | Plan | None = None, efficiency: Efficiency | None = None,
             seq_len: int | None = None) -> StepResult:
    """Evaluate one training plan: ``phaze.evaluate("gpt3-175b", "a100-80gb", 1024, 1536,
    "tp=8,pp=16,mbs=1,recompute=full")``. Names resolve to shipped configs; paths and objects
    work too. ``efficiency`` defaults to the shipped calibration (``phaze.Efficiency()`` is the
    ideal datasheet machine). Raises :class:`phaze.ConfigError` on bad input."""
    chip = as_chip(arch)
    eff = calibrated_efficiency(chip) if efficiency is None else efficiency
    return _evaluate(as_model(workload, seq_len), chip, int(devices), int(global_batch),
                     as_plan(plan), eff)


def place(workload: str | Path | Model, arch: str | Path | Chip, devices: int, global_batch: int,
          options=None, efficiency: Efficiency | None = None, top: int = 5, seq_len: int | None = None):
    """Best execution plans of a workload on ``devices`` chips: ``phaze.place("gpt3-175b",
    "a100-80gb", 1024, 1536).best.plan``. ``options`` is a :class:`phaze.PlacementOptions`."""
    from .placement import PlacementOptions
    from .placement import place as _place
    chip = as_chip(arch)
    eff = calibrated_efficiency(chip) if efficiency is None else efficiency
    return _place(as_model(workload, seq_len), chip, int(devices), int(global_batch),
                  options or PlacementOptions(), eff, top)

