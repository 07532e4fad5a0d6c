"""The library entry points a notebook calls; the CLI is a thin layer over these."""
from __future__ import annotations

from pathlib import Path

from .arch import Chip, load_chip
from .cost import IDEAL, Efficiency
from .plan import Plan, parse_plan
from .step import StepResult, evaluate as _evaluate
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


def evaluate(workload: str | Path | Model, arch: str | Path | Chip, devices: int, global_batch: int,
             plan: str | Plan | None = None, efficiency: Efficiency = IDEAL,
             seq_len: int | None = None) -> StepResult:
    """Evaluate one training plan: ``phaze.evaluate("gpt3-175b", "a100-80gb", 1024, 1536,
    "tp=8,pp=16,mbs=1,recompute=full")``. Names resolve to shipped configs; paths and
    objects work too. Raises :class:`phaze.ConfigError` on bad input."""
    return _evaluate(as_model(workload, seq_len), as_chip(arch), int(devices), int(global_batch),
                     as_plan(plan), efficiency)
