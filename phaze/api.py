"""The library entry points a notebook calls; the CLI is a thin layer over these.

Errors are :class:`phaze.ConfigError` naming the function's parameter (``plan``, ``devices``,
``global_batch``, ``tp``, ...) or the file at fault, never a command-line flag.
"""
from __future__ import annotations

import functools
from dataclasses import fields, replace
from pathlib import Path

from .arch import Chip, load_chip
from .calibrate import calibrated_efficiency
from .catalogue import load_model
from .configio import ConfigError, config_dirs
from .cost import Efficiency
from .placement import PlacementOptions
from .placement import place as _place
from .plan import (
    CP_COMMS_ALLOWED,
    OFFLOADS_ALLOWED,
    PIPE_SCHEDULES_ALLOWED,
    Plan,
    cp_comm_value,
    offload_value,
    parse_plan,
    pipe_schedule_value,
    several,
)
from .power import place_within_limit
from .step import StepResult
from .step import evaluate as _evaluate
from .system import System, apply_system, as_system
from .workload import Model, with_seq_len

# CLI flags as the library's parameter names
_PARAMETER = {"--plan": "plan", "--baseline": "plan", "--devices": "devices", "--global-batch": "global_batch",
              "--workload": "workload", "--arch": "arch", "--seq-len": "seq_len", "--tp": "tp", "--pp": "pp",
              "--mbs": "mbs", "--vp": "vp", "--ep": "ep", "--cp": "cp", "--etp": "etp", "--routing": "routing",
              "--zero": "zero", "--recompute": "recompute",
              "--attention": "attention", "--memory-reserve": "memory_reserve", "--params": "efficiency",
              "--system": "system"}


# what ``--workload``, ``--arch`` and ``--system`` name, by the folder their files sit in
SHIPPED_KINDS = {"workloads": "workloads", "chips": "arch_configs", "systems": "system_configs"}


def shipped(kind: str) -> dict[str, Path]:
    """The names ``--workload``, ``--arch`` or ``--system`` take (``kind``: workloads, chips or
    systems), sorted, each with its file: ``./workloads`` (``./arch_configs``, ``./system_configs``)
    first, then the shipped ones, a name found first hiding the same name later."""
    if kind not in SHIPPED_KINDS:
        raise ConfigError("kind", None, f"must be one of {', '.join(SHIPPED_KINDS)}, got {kind!r}")
    out: dict[str, Path] = {}
    for folder in config_dirs(SHIPPED_KINDS[kind]):
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
            out.setdefault(path.stem, path)
    return dict(sorted(out.items()))


def _library_errors(fn):
    """Re-raise a :class:`ConfigError` that names a CLI flag with the parameter's name instead."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            if exc.source not in _PARAMETER:
                raise
            raise ConfigError(_PARAMETER[exc.source], exc.field, _unflag(exc.message)) from None
    return wrapper


def as_model(workload: str | Path | Model, seq_len: int | None = None) -> Model:
    if isinstance(workload, Model):
        return workload if seq_len is None else with_seq_len(workload, seq_len)
    return load_model(workload, seq_len)


def as_chip(arch: str | Path | Chip) -> Chip:
    return arch if isinstance(arch, Chip) else load_chip(arch)


def with_system(chip: Chip, system: str | Path | System | None) -> Chip:
    """The chip in a cluster (:mod:`phaze.system`); ``None`` keeps the chip file's links."""
    return apply_system(chip, as_system(system))


def as_plan(plan: str | Plan | None, source: str = "--plan") -> Plan:
    if plan is None:
        return Plan()
    return plan if isinstance(plan, Plan) else parse_plan(plan, source)


MAX_SIZE = 1 << 24       # devices or sequences per step: past anything built (as the CLI)


def _check_size(name: str, value) -> int:
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and float(value).is_integer()
          and 1 <= value <= MAX_SIZE)
    if not ok:
        raise ConfigError(name, None, f"must be a positive integer up to {MAX_SIZE:,}, got {value!r}")
    return int(value)


@_library_errors
def evaluate(workload: str | Path | Model, arch: str | Path | Chip, devices: int, global_batch: int,
             plan: str | Plan | None = None, efficiency: Efficiency | None = None,
             seq_len: int | None = None, memory_reserve_gib: float | None = None,
             system: str | Path | System | None = None) -> StepResult:
    """Evaluate one training plan: ``phaze.evaluate("gpt3-175b", "a100-80gb", 1024, 1536,
    "tp=8,pp=16,mbs=1,recompute=full")``. Names resolve to shipped configs; paths and objects
    work too. ``efficiency`` defaults to the shipped calibration (``phaze.Efficiency()`` is the
    ideal datasheet machine); ``memory_reserve_gib`` replaces the chip's modelled memory reserve;
    ``system`` (a shipped name such as ``"dgx-a100-superpod"``, a path or a :class:`phaze.System`)
    replaces the chip file's links with that cluster's. Raises :class:`phaze.ConfigError` on bad
    input."""
    devices, global_batch = _check_size("devices", devices), _check_size("global_batch", global_batch)
    chip = with_system(as_chip(arch), system)
    eff = calibrated_efficiency(chip) if efficiency is None else efficiency
    p = as_plan(plan, "plan")
    if memory_reserve_gib is not None:
        p = replace(p, memory_reserve=float(memory_reserve_gib) * 2.0 ** 30)
    return _evaluate(as_model(workload, seq_len), chip, devices, global_batch, p, eff)


_WORDS = {"cp_comm": (cp_comm_value, CP_COMMS_ALLOWED), "pipe_schedule": (pipe_schedule_value, PIPE_SCHEDULES_ALLOWED),
          "offload": (offload_value, OFFLOADS_ALLOWED)}


@_library_errors
def place(workload: str | Path | Model, arch: str | Path | Chip, devices: int, global_batch: int,
          options=None, efficiency: Efficiency | None = None, top: int = 5, seq_len: int | None = None,
          system: str | Path | System | None = None, power_limit_w: float | None = None, **space):
    """Best execution plans of a workload on ``devices`` chips: ``phaze.place("gpt3-175b",
    "a100-80gb", 1024, 1536).best.plan``. The space searched is ``options``
    (:class:`phaze.PlacementOptions`) or its fields as keywords: ``tp``, ``mbs``, ``pp``, ``vp``,
    ``cp``, ``ep``, ``etp``, ``routing`` (a value or a list; ``vp``, ``cp``, ``etp`` empty: searched
    as :mod:`phaze.placement` says), ``recompute`` (modes), ``zero`` (a stage or a list of stages),
    ``attention``, ``optimizer``, ``reduce_fp32``; ``memory_reserve_gib`` replaces the chip's
    modelled memory reserve; ``system`` the cluster, as in :func:`evaluate`. The plans are ranked
    at the nominal clock; with ``power_limit_w`` (watts, as ``phaze place --power-limit``) they are
    the fastest within that limit, their steps at the clock they run at
    (:func:`phaze.power.place_within_limit`)."""
    devices, global_batch = _check_size("devices", devices), _check_size("global_batch", global_batch)
    if power_limit_w is not None and (isinstance(power_limit_w, bool) or not isinstance(power_limit_w, (int, float))
                                      or not power_limit_w > 0):
        raise ConfigError("power_limit_w", None, f"must be a positive number of watts, got {power_limit_w!r}")
    opts = options or PlacementOptions()
    known = {f.name for f in fields(PlacementOptions)} - {"memory_reserve"}
    changes = {}
    for key, value in space.items():
        if key == "memory_reserve_gib":
            changes["memory_reserve"] = None if value is None else float(value) * 2.0 ** 30
            continue
        if key not in known:
            allowed = ", ".join(sorted(known | {"memory_reserve_gib"}))
            raise ConfigError(key, None, f"unknown keyword; allowed: {allowed}")
        listed = ("tp", "mbs", "pp", "vp", "cp", "ep", "etp", "routing", "recompute", "zero")
        if key in listed and isinstance(value, (int, str)):
            value = (value,)
        if key in _WORDS:       # one setting or several to search, each read as the flag reads it
            try:
                value = several(value, *_WORDS[key])
            except ValueError as exc:
                raise ConfigError(key, None, str(exc)) from None
        changes[key] = tuple(value) if isinstance(value, list) else value
    if changes:
        opts = replace(opts, **changes)
    chip = with_system(as_chip(arch), system)
    eff = calibrated_efficiency(chip) if efficiency is None else efficiency
    model = as_model(workload, seq_len)
    if power_limit_w is None:
        res = _place(model, chip, devices, global_batch, opts, eff, top)
    else:
        res, _ = place_within_limit(model, chip, devices, global_batch, opts, eff, top, float(power_limit_w))
    if res.best is None:        # the reason names parameters, not flags
        res = replace(res, infeasible_source=_PARAMETER.get(res.infeasible_source, res.infeasible_source),
                      infeasible_reason=_unflag(res.infeasible_reason))
    return res


def _unflag(message: str) -> str:
    for flag, name in sorted(_PARAMETER.items(), key=lambda kv: -len(kv[0])):
        message = message.replace(flag, name)
    return message
