"""Fit the cost model's efficiency parameters on published runs (scipy least squares).

The parameters are the fields of :class:`phaze.cost.Efficiency`: each scales one physical
resource of a chip family (tensor units, fused attention, HBM, links, per-kernel cost). They are
fitted per chip family on the log of predicted / measured step time, within physical bounds,
and never depend on a model name, a source or a row. The shipped calibration
(``phaze/data/calibration.json``) and which of its sets a chip is scored with (its family's, its
execution model's, the pooled ``default``: :func:`params_for`) live here too, so that the cost,
search and report code reads it without the validation.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, fields
from functools import lru_cache
from pathlib import Path

import numpy as np

from .arch import Chip
from .configio import ConfigError, read_mapping
from .cost import IDEAL, Efficiency

# name: (lower bound, upper bound, prior). Bounds are physical: a fraction of a datasheet
# resource lies in (0, 1]. The prior is where a parameter stays when the rows do not constrain it
# (a light ridge pulls toward it): tensor_fraction 0.8 ~ the best achieved matmul throughput in
# reference/gemm_benchmarks.csv (80-87 % of peak); hbm_fraction 0.8 and link_fraction 0.8 ~ what
# bandwidth benchmarks (STREAM-like copies, NCCL bus bandwidth) reach; attention_fraction 0.5 ~
# fused attention at half the GEMM rate; kernel_overhead_s 5 us ~ a CUDA launch; overlap_slowdown
# 0.2 and tile_overhead_k 128 are middling guesses (tile_overhead_k also sets fused attention's
# per-query-tile prologue and epilogue: FlashAttention-2's published causal forward+backward
# throughput, A100, head dim 128, 512 to 16k tokens, about 90 to 200 TFLOP/s, follows
# w*s / (w*s + k) with k ~ 250-350 key steps, w = 1/2 the causal share). host_overhead_s 20 us ~
# what an eager framework's host spends per op phaze models (Python, the framework's modules and
# autograd functions, PyTorch's dispatcher; the 5-20 us per op of framework overhead studies, e.g.
# "Making Deep Learning Go Brrrr", count PyTorch alone), measured by
# tests/bench/bench_host_overhead.py with PyTorch 2.13 on a 2-core Xeon, without the CUDA launch
# call: Megatron-LM's layer code (apex's autograd functions, the tensor-parallel regions, the RNG
# tracker) 14-19 us per modelled op on the idle machine, 21-25 us with its other core busy, 2-5 us
# more with a GPU's launch call; plain torch.nn layers, the floor without a framework, 6-11 us per
# kernel-launching aten op; up to 50 us, a slow host.
BOUNDS = {
    "tensor_fraction": (0.3, 1.0, 0.8),
    "attention_fraction": (0.1, 1.0, 0.5),
    "hbm_fraction": (0.2, 1.0, 0.8),
    "link_fraction": (0.1, 1.0, 0.8),
    "kernel_overhead_s": (0.0, 50e-6, 5e-6),
    "overlap_slowdown": (0.0, 1.0, 0.2),
    "tile_overhead_k": (0.0, 2048.0, 128.0),
    "host_overhead_s": (0.0, 50e-6, 20e-6),
}
PRIOR_WEIGHT = 0.02   # per parameter, against a total data weight of one per source
FITTED = tuple(BOUNDS)
# least squares stops when an iteration lowers the cost by less than this share of it; scipy's
# default 1e-8 let the slowest fit crawl along a flat valley for minutes (the cost falling by
# ~2e-9 a step at 3.6e-2) for predictions that moved by under 0.1 %
FTOL = 1e-6


def _to_x(eff: Efficiency, names) -> np.ndarray:
    return np.array([(getattr(eff, n) - BOUNDS[n][0]) / (BOUNDS[n][1] - BOUNDS[n][0]) for n in names])


def _from_x(x, names, base: Efficiency = IDEAL) -> Efficiency:
    values = asdict(base)
    for n, v in zip(names, x, strict=True):
        lo, hi, _ = BOUNDS[n]
        values[n] = lo + float(np.clip(v, 0.0, 1.0)) * (hi - lo)
    return Efficiency(**values)


def fit(cases, predict, names=FITTED, start: Efficiency | None = None,
        weights=None) -> tuple[Efficiency, dict]:
    """Weighted least-squares fit of ``names`` on ``cases`` (log of predicted / measured);
    ``predict(case, eff)`` gives seconds per step. Returns the fitted efficiency and a report."""
    names = tuple(names)
    if not cases:
        return start or Efficiency(**{n: BOUNDS[n][2] for n in names}), {"rows": 0}
    start = start or Efficiency(**{n: BOUNDS[n][2] for n in names})
    measured = np.array([c.measured_step_s for c in cases])
    w = np.sqrt(np.ones(len(cases)) if weights is None else np.asarray(weights, dtype=float))

    prior = _to_x(Efficiency(**{n: BOUNDS[n][2] for n in names}), names)
    ridge = math.sqrt(PRIOR_WEIGHT * (1.0 if weights is None else float(np.sum(w ** 2))))

    def residuals(x):
        eff = _from_x(x, names, start)
        pred = np.array([predict(c, eff) for c in cases])
        return np.concatenate([w * np.log(pred / measured), ridge * (x - prior)])

    from scipy.optimize import least_squares  # imported here: loading parameters must stay cheap
    res = least_squares(residuals, _to_x(start, names), bounds=(0.0, 1.0), diff_step=1e-3,
                        x_scale=1.0, max_nfev=200, ftol=FTOL)
    eff = _from_x(res.x, names, start)
    data = res.fun[:len(cases)]
    report = {"rows": len(cases), "rms_log_error": float(math.sqrt(np.sum(data ** 2) / np.sum(w ** 2))),
              "evaluations": int(res.nfev), "status": res.message}
    return eff, report


def save_params(params: dict[str, Efficiency], path: str | Path, meta: dict | None = None) -> None:
    """Write fitted parameters per chip family as JSON."""
    data = {"parameters": {fam: asdict(e) for fam, e in sorted(params.items())}}
    if meta:
        data.update(meta)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def load_params(path: str | Path) -> dict[str, Efficiency]:
    """Read a parameter file written by :func:`save_params`."""
    data = read_mapping(path)
    table = data.get("parameters")
    if not isinstance(table, dict):
        raise ConfigError(path, "parameters", "must map chip family -> efficiency parameters")
    allowed = {f.name for f in fields(Efficiency)}
    out = {}
    for fam, values in table.items():
        if not isinstance(values, dict):
            raise ConfigError(path, f"parameters.{fam}", "must be a mapping")
        for key, value in values.items():
            if key not in allowed:
                raise ConfigError(path, f"parameters.{fam}.{key}",
                                  f"unknown parameter; allowed: {', '.join(sorted(allowed))}")
            lo, hi = BOUNDS[key][:2] if key in BOUNDS else (0.0, 1.0)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
                raise ConfigError(path, f"parameters.{fam}.{key}",
                                  f"must be a number in [{lo:g}, {hi:g}], got {value!r}")
        out[fam] = Efficiency(**values)
    return out


EXECUTION_KEY = "execution:"


def fit_key(chip: Chip, params: dict[str, Efficiency] | None) -> str | None:
    """Which parameter set :func:`params_for` takes for ``chip`` (None: none, the ideal machine)."""
    for key in (chip.family, EXECUTION_KEY + chip.execution, "default"):
        if params and key in params:
            return key
    return None


def params_for(chip: Chip, params: dict[str, Efficiency] | None) -> Efficiency:
    """The parameters a chip is scored with: its family's fit, else its execution model's, else
    ``default``, else :data:`phaze.cost.IDEAL`."""
    key = fit_key(chip, params)
    return params[key] if key else IDEAL


def calibrated_efficiency(chip: Chip) -> Efficiency:
    """The shipped calibration for the chip (:func:`params_for`: its family's fit, else its
    execution model's, else the pooled ``default``)."""
    return params_for(chip, load_default_params())


def params_held_out(path: str | Path) -> tuple[str, ...]:
    """The sources a parameter file says it was fitted without (``held_out_sources``)."""
    return tuple(read_mapping(path).get("held_out_sources") or ())


def shipped_params_path() -> Path:
    return Path(__file__).resolve().parent / "data" / "calibration.json"


@lru_cache(maxsize=1)
def load_default_params() -> dict[str, Efficiency] | None:
    """The calibration shipped with phaze (``phaze calibrate`` on the bundled runs)."""
    path = shipped_params_path()
    return load_params(path) if path.exists() else None
