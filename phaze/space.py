"""Sweep configs: the chip design space, the workloads, constraints and objectives of a search.

A sweep config (``search/*.yaml``) names a template chip, the workloads a design is scored on,
the space of chip parameters, budgets and objectives. Each parameter is a fixed value, a list, a
range with a step, a powers-of-two range (``log2``), or an arithmetic expression of the others
(``"max(1, tensor_rows * tensor_cols / 64)"``). Values in the config carry their unit in the key
(``shared_buffer_mib``); :func:`build_chip` converts them to the SI fields of :class:`Chip`.
Every value a design can take, an expression's included, is checked when the config is read: a
whole number where the key counts something, a finite number in :data:`RANGES` elsewhere, so the
cost model never sees zero, a fraction of a unit, infinity or 1e308.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import itertools
import json
import math
import operator
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from .arch import Chip, load_chip, process_node
from .area import held_share, reference_clock_at, top_clock_hz
from .calibrate import load_default_params
from .catalogue import load_model
from .configio import ConfigError, Fields, quote, read_mapping
from .framework import framework, model_with, options_with
from .placement import PlacementOptions, offload_error
from .plan import (
    CP_COMMS_ALLOWED,
    DISPATCHERS,
    DP_SHARD_ALLOWED,
    FSDP_PP,
    OFFLOADS_ALLOWED,
    OPTIMIZERS,
    PIPE_SCHEDULES_ALLOWED,
    PLAN_RECOMPUTE,
    RECOMPUTE_MODULES,
    cp_comm_value,
    dp_shard_value,
    offload_value,
    one_or_several,
    ordered_modules,
    pipe_schedule_value,
    several,
)
from .plan_check import fp8_params_error, optimizer_error
from .system import System, load_system
from .workload import Model

KiB, MiB, GiB = 2.0 ** 10, 2.0 ** 20, 2.0 ** 30

# key -> (what it sets, factor to SI, integer?)
PARAMETERS = {
    "tensor_units": ("tensor units (matrix engines) per chip", 1.0, True),
    "tensor_rows": ("rows of each systolic array", 1.0, True),
    "tensor_cols": ("columns of each systolic array", 1.0, True),
    "vector_units": ("vector (SIMD) units per chip", 1.0, True),
    "vector_lanes": ("lanes per vector unit", 1.0, True),
    "local_sram_kib": ("local SRAM per tensor unit, KiB", KiB, False),
    "shared_buffer_mib": ("shared on-chip buffer, MiB", MiB, False),
    "hbm_gib": ("HBM capacity, GiB", GiB, False),
    "hbm_bandwidth_gb_per_s": ("HBM bandwidth, GB/s", 1e9, False),
    "link_bandwidth_gb_per_s": ("chip-to-chip bandwidth per direction, GB/s", 1e9, False),
    "clock_ghz": ("clock, GHz", 1e9, False),
}
# key -> (lowest, highest) value a design may take, config units: a thousand times past any chip
# built on either side, so that the cost model only sees finite, representable quantities
RANGES = {
    "tensor_units": (1, 2 ** 16), "tensor_rows": (1, 2 ** 14), "tensor_cols": (1, 2 ** 14),
    "vector_units": (1, 2 ** 16), "vector_lanes": (1, 2 ** 20),
    "local_sram_kib": (1e-3, 2.0 ** 24), "shared_buffer_mib": (1e-3, 2.0 ** 20), "hbm_gib": (1e-3, 2.0 ** 20),
    "hbm_bandwidth_gb_per_s": (1e-3, 1e7), "link_bandwidth_gb_per_s": (1e-3, 1e7), "clock_ghz": (1e-3, 100.0),
}
MAX_VALUES = 10_000          # values of one parameter (a range's step is refused beyond)
MAX_DEVICES = 1 << 24        # chips of a workload's cluster (as ``--devices``)
MAX_BATCH = 1 << 24          # sequences per step (as ``--global-batch``)
MAX_SEQ_LEN = 1 << 22        # tokens per sequence (as ``--seq-len``)
MAX_SEED = 2 ** 32 - 1       # NumPy's (and so Optuna's samplers') largest seed
MAX_TRIALS = 10 ** 7         # complete trials of a study
# the micro-batches a sweep config's workload searches unless it lists its own: the design search
# places every workload on every candidate, so it keeps the four of Megatron's recipes (phaze place
# searches every divisor of a replica's batch, phaze.placement.mbs_values)
SWEEP_MICRO_BATCHES = (1, 2, 4, 8)
_SWEEP_OPTIONS = PlacementOptions(mbs=SWEEP_MICRO_BATCHES)   # a sweep workload's placement defaults
MAX_DEGREE = 1 << 20         # a placement's tp, pp, mbs, ... candidates
MAX_GRID = 2_000_000         # points of a space that is enumerated (grid, exact, ``phaze sweep``)
MAX_NAME = 100              # characters of a study's name (it names results/<name>/)
MAX_CHECKED = 10_000         # points on which a config's expressions are tried when it is read

OBJECTIVES = {  # name -> (direction, label)
    "throughput": ("maximize", "throughput (weighted geometric mean of tokens/s per workload)"),
    "area": ("minimize", "die area (mm²)"),
    "power": ("minimize", "power at load (W, the highest over the workloads)"),
    "cost": ("minimize", "chip cost ($, die and HBM)"),
    "throughput_per_mm2": ("maximize", "throughput per mm²"),
    "throughput_per_w": ("maximize", "throughput per watt"),
    "throughput_per_usd": ("maximize", "throughput per dollar"),
}
CONSTRAINTS = {  # key -> (metric, sense)
    "area_mm2": ("area", "max"), "min_area_mm2": ("area", "min"),
    "power_w": ("power", "max"), "cost_usd": ("cost", "max"),
}
SAMPLERS = ("tpe", "nsga2", "gp", "random", "grid", "exact")


def power_budget(constraints) -> float | None:
    """The tightest power budget of ``constraints`` ((key, bound) pairs), or None: a candidate runs
    within it (:mod:`phaze.power` lowers its clock until it fits)."""
    budgets = [b for k, b in constraints if CONSTRAINTS[k] == ("power", "max")]
    return min(budgets) if budgets else None


# --- expressions ---------------------------------------------------------------------------------
# Expressions are evaluated in floating point with every step checked, so that their cost is
# bounded by their size (no big integers: ``9 ** 9 ** 9`` fails at once) and no value but a finite
# real number comes out.
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: math.pow}
_FUNCS = {"min": min, "max": max, "ceil": math.ceil, "floor": math.floor, "log2": math.log2}
_ARITY = {"min": (1, 16), "max": (1, 16), "ceil": (1, 1), "floor": (1, 1), "log2": (1, 1)}
GRAMMAR = "numbers, parameter names, + - * / // **, min, max, ceil, floor, log2"
MAX_EXPRESSION_CHARS = 500
MAX_EXPRESSION_NODES = 100
MAX_EXPRESSION_DEPTH = 20
MAX_EXPONENT = 64            # |b| in a ** b


class ExpressionError(ValueError):
    """An expression that is not in the grammar, too large, or fails on the values given."""


@functools.lru_cache(maxsize=256)
def _parse(text: str) -> ast.Expression:
    """``text`` parsed and checked against the grammar and the size limits."""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"{len(text):,} characters; allowed: at most {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, RecursionError, MemoryError, ValueError) as exc:
        raise ExpressionError(f"{getattr(exc, 'msg', None) or type(exc).__name__}; allowed: {GRAMMAR}") from None
    stack, nodes = [(tree.body, 1)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_EXPRESSION_NODES or depth > MAX_EXPRESSION_DEPTH:
            raise ExpressionError(f"too large; allowed: at most {MAX_EXPRESSION_NODES} terms nested "
                                  f"at most {MAX_EXPRESSION_DEPTH} deep")
        if isinstance(node, ast.Constant):
            ok = (isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
                  and math.isfinite(node.value) and abs(node.value) < 1e300)
            if not ok:
                raise ExpressionError(f"constant {quote(node.value)}; allowed: finite numbers")
        elif isinstance(node, ast.Name):
            if node.id in _FUNCS:
                raise ExpressionError(f"{node.id} must be called")
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            stack += [(node.left, depth + 1), (node.right, depth + 1)]
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            stack.append((node.operand, depth + 1))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
              and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args)):
            lo, hi = _ARITY[node.func.id]
            if not lo <= len(node.args) <= hi:
                raise ExpressionError(f"{node.func.id} takes {lo if lo == hi else f'{lo} to {hi}'} "
                                      f"argument{'s' if hi > 1 else ''}, got {len(node.args)}")
            stack += [(a, depth + 1) for a in node.args]
        else:
            raise ExpressionError(f"{type(node).__name__} is not allowed; allowed: {GRAMMAR}")
    return tree


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id not in _FUNCS}


def _eval(node: ast.AST, env: dict) -> float:
    """The value of a checked expression (:func:`_parse`) with the names of ``env``: a finite
    float, else :class:`ExpressionError` saying which step failed."""
    if isinstance(node, ast.Expression):
        return _eval(node.body, env)
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return float(env[node.id])
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env), _eval(node.right, env)
        op = type(node.op)
        if op is ast.Pow and abs(b) > MAX_EXPONENT:
            raise ExpressionError(f"exponent {b:g} in {a:g} ** {b:g}; allowed: at most {MAX_EXPONENT} in size")
        if op is ast.Pow and a < 0 and not b.is_integer():
            raise ExpressionError(f"({a:g}) ** {b:g} is not a real number")
        if op in (ast.Div, ast.FloorDiv) and b == 0:
            raise ExpressionError(f"division by zero ({a:g} / 0)")
        if op is ast.Pow and a == 0 and b < 0:
            raise ExpressionError(f"division by zero (0 ** {b:g})")
        try:
            r = _BINOPS[op](a, b)
        except (OverflowError, ValueError, ZeroDivisionError):
            r = math.inf
    else:   # a call (the only other node _parse lets through)
        args = [_eval(a, env) for a in node.args]
        name = node.func.id
        if name == "log2" and args[0] <= 0:
            raise ExpressionError(f"log2({args[0]:g}) of a number <= 0")
        r = float(_FUNCS[name](*args))
    if not math.isfinite(r):
        raise ExpressionError("a result out of range (over 1e308)")
    return r


def evaluate(text: str, env: dict) -> float:
    """The value of expression ``text`` with the names in ``env`` (:class:`ExpressionError`)."""
    return _eval(_parse(text), env)


# --- dimensions ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dimension:
    """One chip parameter: ``values`` (ordered, physical units of the key) it may take, or an
    ``expression`` of other parameters. ``log2``: the sampler sees the exponent (powers of two
    are neighbours), under the name ``log2_<key>``."""

    key: str
    values: tuple[float, ...] = ()
    log2: bool = False
    expression: str = ""

    @property
    def fixed(self) -> bool:
        return not self.expression and len(self.values) == 1

    @property
    def param(self) -> str:
        return f"log2_{self.key}" if self.log2 else self.key

    @property
    def choices(self) -> tuple:
        """What the sampler chooses among (exponents for log2 dimensions)."""
        if self.log2:
            return tuple(int(round(math.log2(v))) for v in self.values)
        return tuple(int(v) for v in self.values) if PARAMETERS[self.key][2] else self.values

    def value(self, choice) -> float:
        return float(2 ** int(choice)) if self.log2 else float(choice)

    def suggest(self, trial):
        c = self.choices
        if self.log2:
            return trial.suggest_int(self.param, c[0], c[-1])
        step = _even_step(c)
        is_int = PARAMETERS[self.key][2] and all(float(x).is_integer() for x in c)
        if step is not None and is_int:
            return trial.suggest_int(self.param, int(c[0]), int(c[-1]), step=int(step))
        if step is not None:
            return trial.suggest_float(self.param, c[0], c[-1], step=step)
        return trial.suggest_categorical(self.param, list(c))

    def distribution(self):
        """The Optuna distribution :meth:`suggest` samples from (what a sampler proposing whole
        designs at once declares)."""
        from optuna import distributions as od  # deferred: optuna imports slowly
        c = self.choices
        if self.log2:
            return od.IntDistribution(c[0], c[-1])
        step = _even_step(c)
        is_int = PARAMETERS[self.key][2] and all(float(x).is_integer() for x in c)
        if step is not None and is_int:
            return od.IntDistribution(int(c[0]), int(c[-1]), step=int(step))
        if step is not None:
            return od.FloatDistribution(c[0], c[-1], step=step)
        return od.CategoricalDistribution(list(c))

    def nearest_choice(self, value: float):
        """The choice closest to ``value`` (log distance): where a baseline chip lands."""
        best = min(self.values, key=lambda v: abs(math.log(v / value)) if value > 0 else v)
        return self.choices[self.values.index(best)]


def design_key(params: dict) -> tuple:
    """A design's identity: its sampler choices, sorted (what the study stores as ``params``)."""
    return tuple(sorted(params.items()))


def _even_step(c: tuple) -> float | None:
    if len(c) < 2:
        return None
    steps = {round(b - a, 9) for a, b in itertools.pairwise(c)}
    return steps.pop() if len(steps) == 1 and next(iter(steps)) > 0 else None


def allowed(key: str) -> str:
    """What parameter ``key`` may be, in words."""
    lo, hi = RANGES[key]
    return (f"a whole number from {lo:,} to {hi:,}" if PARAMETERS[key][2]
            else f"a number from {lo:g} to {hi:g}")


def check_value(key: str, v) -> float:
    """``v`` as parameter ``key``'s value: a finite number in :data:`RANGES`, whole where the key
    counts something; else :class:`ValueError` saying what is allowed."""
    lo, hi = RANGES[key]
    ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi
          and (not PARAMETERS[key][2] or float(v).is_integer()))
    if not ok:
        raise ValueError(f"must be {allowed(key)}, got {quote(v)}")
    return float(v)


def _dimension(key: str, raw, source: str) -> Dimension:
    where = f"space.{key}"
    integer = PARAMETERS[key][2]

    def num(v, what=""):
        try:
            return check_value(key, v)
        except ValueError as exc:
            raise ConfigError(source, where + what, str(exc)) from None

    if isinstance(raw, str):
        try:
            _parse(raw)
        except ExpressionError as exc:
            raise ConfigError(source, where, f"not a valid expression {quote(raw)}: {exc}") from None
        return Dimension(key, expression=raw)
    if isinstance(raw, list):
        if not raw:
            raise ConfigError(source, where, "empty list; give at least one value")
        if len(raw) > MAX_VALUES:
            raise ConfigError(source, where, f"{len(raw):,} values; allowed: at most {MAX_VALUES:,}")
        values = sorted({num(v, f"[{i}]") for i, v in enumerate(raw)})
        exps = [math.log2(v) for v in values]
        powers = len(values) > 2 and all(e.is_integer() for e in exps) and _even_step(tuple(exps)) == 1
        return Dimension(key, tuple(values), log2=powers)   # consecutive powers of two: ordered
    if isinstance(raw, dict):
        f = Fields(raw, source, where + ".")
        lo, hi = f.number("low"), f.number("high")
        log2 = f.bool("log2", False)
        step = f.number("step", None)
        f.finish()
        num(lo, ".low")
        num(hi, ".high")
        if hi < lo:
            raise ConfigError(source, where, f"reversed range: low {lo:g} > high {hi:g}")
        if log2:
            if step is not None:
                raise ConfigError(source, where + ".step", "a log2 range takes no step (it doubles)")
            e0, e1 = math.ceil(math.log2(lo) - 1e-9), math.floor(math.log2(hi) + 1e-9)
            if e1 < e0:
                raise ConfigError(source, where, f"empty range: no power of two in [{lo:g}, {hi:g}]")
            return Dimension(key, tuple(float(2 ** e) for e in range(e0, e1 + 1)), log2=True)
        if step is None:
            raise ConfigError(source, where, "a range needs 'step' (or 'log2: true' for powers of two)")
        if integer and not step.is_integer():
            raise ConfigError(source, where + ".step", f"must be a whole number (the parameter counts "
                              f"something), got {step:g}")
        count = (hi - lo) / step + 1
        if count > MAX_VALUES:
            raise ConfigError(source, where + ".step", f"{step:g} makes {count:,.0f} values from {lo:g} to "
                              f"{hi:g}; allowed: at most {MAX_VALUES:,} values (a larger step, or log2: true)")
        values = tuple(round(lo + i * step, 9) for i in range(int(math.floor(count - 1 + 1e-9)) + 1))
        if len(set(values)) < len(values):
            raise ConfigError(source, where + ".step", f"{step:g} is below the resolution of 1e-9; "
                              f"allowed: a step whose values differ")
        for v in values:
            num(v)
        return Dimension(key, values)
    return Dimension(key, (num(raw),))


def _expression_value(d: Dimension, env: dict, source: str) -> float:
    """The value of expression dimension ``d`` given the values of what it reads, checked as a
    value of its key; else one :class:`ConfigError` naming the field and the values."""
    try:
        v = evaluate(d.expression, env)
        if PARAMETERS[d.key][2] and abs(v - round(v)) <= 1e-9 * abs(v):     # 0.1 * 10 counts as 1
            v = float(round(v))
        return check_value(d.key, v)
    except ValueError as exc:      # ExpressionError included
        at = ", ".join(f"{k} = {env[k]:g}" for k in sorted(_names(_parse(d.expression))))
        at = f" at {at}" if at else ""
        raise ConfigError(source, f"space.{d.key}", f"{quote(d.expression)}{at}: {exc}") from None


def _check_expressions(dims: dict[str, Dimension], order: tuple[str, ...], source: str) -> dict[str, float]:
    """Evaluate every expression on every point of the space it depends on (a sample of
    :data:`MAX_CHECKED` points and the corners where there are more), so that a value that
    fails (a division by zero, a fraction of a count, a value out of range) is refused when the
    config is read rather than in the middle of a search. Returns each parameter's highest value
    (an expression's over the points tried)."""
    highest = {k: max(d.values) for k, d in dims.items() if not d.expression}
    for key in order:
        if not dims[key].expression:
            continue
        needed, todo = set(), [key]
        while todo:
            k = todo.pop()
            if k not in needed:
                needed.add(k)
                todo += _names(_parse(dims[k].expression)) if dims[k].expression else []
        roots = [k for k in order if k in needed and not dims[k].expression]
        chain = [k for k in order if k in needed and dims[k].expression]
        axes = [dims[k].values for k in roots]
        if math.prod(len(a) for a in axes) <= MAX_CHECKED:
            points = itertools.product(*axes)
        else:
            rng = random.Random(0)
            points = itertools.chain(itertools.product(*((a[0], a[-1]) for a in axes)),
                                     (tuple(rng.choice(a) for a in axes) for _ in range(MAX_CHECKED)))
        for point in points:
            env = dict(zip(roots, point, strict=True))
            for k in chain:
                env[k] = _expression_value(dims[k], env, source)
            highest[key] = max(highest.get(key, env[key]), env[key])
    return highest


def _order(dims: dict[str, Dimension], source: str) -> tuple[str, ...]:
    """Parameters in an order where every expression comes after what it reads."""
    done: list[str] = [k for k, d in dims.items() if not d.expression]
    pending = {k: _names(_parse(d.expression)) for k, d in dims.items() if d.expression}
    for k, names in pending.items():
        unknown = names - set(dims)
        if unknown:
            raise ConfigError(source, f"space.{k}", f"expression reads unknown parameter "
                              f"{sorted(unknown)[0]!r}; allowed: {', '.join(dims)}")
    while pending:
        ready = [k for k, names in pending.items() if names <= set(done)]
        if not ready:
            raise ConfigError(source, f"space.{next(iter(pending))}", "expressions depend on each other in a cycle")
        for k in ready:
            done.append(k)
            del pending[k]
    return tuple(done)


# --- workloads and the config ------------------------------------------------------------------------
@dataclass(frozen=True)
class WorkloadSpec:
    """One workload a design is scored on: the model, its cluster and global batch, its weight in
    the geometric mean, and the plans the placement may choose among."""

    model: Model
    devices: int
    global_batch: int
    weight: float = 1.0
    options: PlacementOptions = _SWEEP_OPTIONS
    source: str = field(default="", repr=False, compare=False)   # as the config names it (not in the fingerprint)
    system: System | None = field(default=None, repr=False)      # the cluster (None: the chip's links)

    @property
    def label(self) -> str:
        return f"{self.model.name}@{self.devices}"


@dataclass(frozen=True)
class SweepConfig:
    name: str
    source: str
    base: Chip
    workloads: tuple[WorkloadSpec, ...]
    dimensions: tuple[Dimension, ...]          # in evaluation order (expressions last)
    constraints: tuple[tuple[str, float], ...]  # (key of CONSTRAINTS, bound)
    objectives: tuple[str, ...]
    sampler: str = "tpe"
    trials: int = 100
    seed: int = 0
    storage: str = ""
    baselines: tuple[str, ...] = ()
    process_node_nm: float = 7.0
    link_latency_s: float = 1e-6
    sampler_options: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def directions(self) -> list[str]:
        return [OBJECTIVES[o][0] for o in self.objectives]

    @property
    def searched(self) -> tuple[Dimension, ...]:
        return tuple(d for d in self.dimensions if not d.expression and not d.fixed)

    def grid(self) -> dict[str, list]:
        """Every sampler-visible parameter's choices (for the grid and exact samplers and ``phaze
        sweep``, which enumerate every point: a space past :data:`MAX_GRID` points is refused)."""
        if self.grid_size() > MAX_GRID:
            raise ConfigError(self.source, "space", f"{self.grid_size():,} designs to enumerate; allowed: at most "
                              f"{MAX_GRID:,} for the grid and exact samplers and phaze sweep (fewer values, "
                              f"or sampler tpe, nsga2 or random, which search a space of any size)")
        return {d.param: list(d.choices) for d in self.searched}

    def grid_size(self) -> int:
        return math.prod(len(d.values) for d in self.searched)

    def values(self, params: dict) -> dict[str, float]:
        """The physical value of every parameter (config units) from a trial's choices."""
        env: dict[str, float] = {}
        for d in self.dimensions:
            if d.expression:
                env[d.key] = _expression_value(d, env, self.source)
            elif d.fixed:
                env[d.key] = d.values[0]
            else:
                env[d.key] = d.value(params[d.param])
        return env

    def fingerprint(self) -> str:
        """What a study's trials depend on: the space, workloads, constraints, objectives, template
        chip and the calibrated efficiency parameters that score it. A study is only resumed by a
        config with the same fingerprint (a recalibrated phaze starts a new study)."""
        params = load_default_params() or {}
        base = repr(self.base) + (f" dies={self.base.dies}" if self.base.dies != 1 else "")
        desc = {"base": base,
                "workloads": [repr(w) + (f" in {w.system!r}" if w.system else "") for w in self.workloads],
                "dimensions": [repr(d) for d in self.dimensions], "constraints": self.constraints,
                "objectives": self.objectives, "node": self.process_node_nm,
                "calibration": {fam: repr(e) for fam, e in sorted(params.items())}}
        return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def build_chip(base: Chip, values: dict[str, float], process_node_nm: float | None = None,
               link_latency_s: float | None = None, name: str | None = None) -> Chip:
    """A candidate chip: ``base`` with the given parameters (config units) replaced.

    What the space does not set keeps the template's value; quantities that follow from the set
    ones keep the template's ratios: the shared-buffer bandwidth per array row per clock, the
    local-SRAM bandwidth per array cell, transcendental units per vector lane, and the ratio of
    every link level to the first. Published die area and TDP do not carry over. Its reference
    clock is the template's, moved to its node (:func:`phaze.area.reference_clock_at`)."""
    node = process_node_nm if process_node_nm is not None else base.process_node_nm
    v = {k: values[k] * PARAMETERS[k][1] for k in values}
    t0, v0 = base.tensor, base.vector
    count = int(v.get("tensor_units", t0.count))
    rows, cols = int(v.get("tensor_rows", t0.rows)), int(v.get("tensor_cols", t0.cols))
    clock = v.get("clock_ghz", base.clock_hz)
    tensor = replace(t0, count=count, rows=rows, cols=cols,
                     tile_m=0 if (rows, cols) != (t0.rows, t0.cols) else t0.tile_m,
                     tile_n=0 if (rows, cols) != (t0.rows, t0.cols) else t0.tile_n)
    lanes = int(v.get("vector_lanes", v0.lanes))
    vector = replace(v0, count=int(v.get("vector_units", v0.count)), lanes=lanes,
                     special_per_cycle=max(1, round(v0.special_per_cycle * lanes / v0.lanes)))
    rate0 = t0.count * t0.rows * base.clock_hz
    sb_bw = base.shared_buffer_bandwidth_bytes_per_s * (count * rows * clock) / rate0
    local_bw = base.local_sram_bandwidth_bytes_per_cycle * (rows * cols) / (t0.rows * t0.cols)
    links = base.links
    if "link_bandwidth_gb_per_s" in v:
        k = v["link_bandwidth_gb_per_s"] / links[0].bandwidth_bytes_per_s
        links = tuple(replace(lv, bandwidth_bytes_per_s=lv.bandwidth_bytes_per_s * k) for lv in links)
    if link_latency_s is not None:
        links = tuple(replace(lv, latency_s=link_latency_s) for lv in links)
    label = name or "candidate-" + hashlib.sha256(
        json.dumps(sorted(values.items())).encode()).hexdigest()[:10]
    return replace(
        base, name=label, family=label, clock_hz=clock, tensor=tensor, vector=vector,
        local_sram_bytes=v.get("local_sram_kib", base.local_sram_bytes),
        local_sram_bandwidth_bytes_per_cycle=local_bw,
        shared_buffer_bytes=v.get("shared_buffer_mib", base.shared_buffer_bytes),
        shared_buffer_bandwidth_bytes_per_s=sb_bw,
        hbm_bytes=v.get("hbm_gib", base.hbm_bytes),
        hbm_bandwidth_bytes_per_s=v.get("hbm_bandwidth_gb_per_s", base.hbm_bandwidth_bytes_per_s),
        links=links, area_mm2=None, tdp_w=None, process_node_nm=node,
        reference_clock_hz=reference_clock_at(base, node))


def chip_values(chip: Chip) -> dict[str, float]:
    """A chip's parameters in config units (where a baseline sits in the space)."""
    return {"tensor_units": chip.tensor.count, "tensor_rows": chip.tensor.rows,
            "tensor_cols": chip.tensor.cols, "vector_units": chip.vector.count,
            "vector_lanes": chip.vector.lanes, "local_sram_kib": chip.local_sram_bytes / KiB,
            "shared_buffer_mib": chip.shared_buffer_bytes / MiB, "hbm_gib": chip.hbm_bytes / GiB,
            "hbm_bandwidth_gb_per_s": chip.hbm_bandwidth_bytes_per_s / 1e9,
            "link_bandwidth_gb_per_s": chip.links[0].bandwidth_bytes_per_s / 1e9,
            "clock_ghz": chip.clock_hz / 1e9}


def _int_tuple(f: Fields, key: str, default: tuple) -> tuple:
    raw = f._get(key, None)
    if raw is None:
        return default
    raw = raw if isinstance(raw, list) else [raw]
    if not raw or len(raw) > 64 or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_DEGREE
                                       for x in raw):
        raise f.error(key, f"must be a positive integer up to {MAX_DEGREE:,} or a list of at most 64 of them, "
                           f"got {quote(raw)}")
    return tuple(raw)


def _zero(p: Fields, default: int) -> int | tuple[int, ...]:
    """A workload's ``placement.zero``: one ZeRO stage, or a list of them to search (as ``--zero``)."""
    raw = p._get("zero", None)
    if raw is None:
        return default
    items = raw if isinstance(raw, list) else [raw]
    if not items or any(isinstance(x, bool) or x not in (0, 1, 2, 3) for x in items):
        raise p.error("zero", f"must be 0, 1, 2 or 3 or a non-empty list of them, got {quote(raw)}")
    return items[0] if not isinstance(raw, list) else tuple(sorted(set(items)))


def _named(f: Fields, key: str, load, flag: str, name: str):
    """``load(name)`` for a name given at ``key`` of a config: an unknown name or a missing file is
    blamed on this file's field, not on the command-line ``flag`` the loader names (a file that
    exists names its own file and field)."""
    try:
        return load(name)
    except ConfigError as exc:
        if exc.source != flag:
            raise
        raise f.error(key, exc.message) from None


def _system(f: Fields, default: System | None) -> System | None:
    """The ``system`` key of a sweep or of one workload entry (a shipped name or a YAML path)."""
    name = f.str("system", None)
    return default if name is None else _named(f, "system", load_system, "--system", name)


def _modules(p: Fields) -> tuple[str, ...]:
    """A placement's ``recompute_modules``: Megatron-Core modules, a list or joined by '+'."""
    raw = p._get("recompute_modules", None)
    if raw is None:
        return ()
    mods = raw.split("+") if isinstance(raw, str) else raw
    ordered = ordered_modules(mods) if isinstance(mods, list) else None
    if ordered is None:
        raise p.error("recompute_modules", f"must be distinct modules of {', '.join(RECOMPUTE_MODULES)}, got "
                                           f"{quote(raw)}")
    return ordered


def _dispatchers(p: Fields) -> tuple[str, ...]:
    """A placement's ``dispatcher`` (alltoall, deepep; one or a list) to search for a mixture of
    experts (empty: the default)."""
    raw = p._get("dispatcher", None)
    items = [] if raw is None else raw if isinstance(raw, list) else [raw]
    disp = tuple(dict.fromkeys(x.strip().lower() if isinstance(x, str) else x for x in items))
    if (raw is not None and not disp) or any(d not in DISPATCHERS for d in disp):
        raise p.error("dispatcher", f"must be one of {', '.join(DISPATCHERS)} or a non-empty list of them, "
                                    f"got {quote(raw)}")
    return disp


def _overlaps(p: Fields) -> tuple[bool, ...]:
    """A placement's ``ep_overlap`` (true, false or a list of them) to search for a mixture of
    experts (empty: off)."""
    raw = p._get("ep_overlap", None)
    items = [] if raw is None else raw if isinstance(raw, list) else [raw]
    if (raw is not None and not items) or any(not isinstance(x, bool) for x in items):
        raise p.error("ep_overlap", f"must be true, false or a non-empty list of them, got {quote(raw)}")
    return tuple(dict.fromkeys(items))


def _workload(item, source: str, i: int, system: System | None = None) -> WorkloadSpec:
    f = Fields(item, source, f"workloads[{i}].") if isinstance(item, dict) else None
    if f is None:
        raise ConfigError(source, f"workloads[{i}]", "must be a mapping with workload, devices, global_batch")
    seq = f.int("seq_len", None, maximum=MAX_SEQ_LEN)
    source = f.str("workload")
    model = _named(f, "workload", lambda s: load_model(s, seq), "--workload", source)
    devices, batch = f.int("devices", maximum=MAX_DEVICES), f.int("global_batch", maximum=MAX_BATCH)
    weight = f.number("weight", 1.0, maximum=1e6)
    system = _system(f, system)
    d = _SWEEP_OPTIONS
    p = f.sub("placement", None)
    options = d
    if p is not None:
        rec = p._get("recompute", None)
        rec = d.recompute if rec is None else tuple(rec if isinstance(rec, list) else [rec])
        if not rec or any(not isinstance(r, str) or r not in PLAN_RECOMPUTE for r in rec):
            raise p.error("recompute", f"must be a subset of {', '.join(PLAN_RECOMPUTE)}, got {quote(rec)}")
        options = PlacementOptions(
            tp=_int_tuple(p, "tp", d.tp), mbs=_int_tuple(p, "mbs", d.mbs), pp=_int_tuple(p, "pp", d.pp),
            vp=_int_tuple(p, "vp", d.vp), cp=_int_tuple(p, "cp", d.cp), ep=_int_tuple(p, "ep", d.ep),
            etp=_int_tuple(p, "etp", d.etp), recompute=rec, zero=_zero(p, d.zero),
            attention=p.choice("attention", ("flash", "flash2", "standard"), d.attention),
            optimizer=p.choice("optimizer", OPTIMIZERS, d.optimizer),
            recompute_modules=_modules(p), dp_shard=_dp_shard(p),
            cp_comm=_words(p, "cp_comm", "p2p", cp_comm_value, CP_COMMS_ALLOWED), dispatcher=_dispatchers(p),
            ep_overlap=_overlaps(p), fsdp_pp=p.choice("fsdp_pp", FSDP_PP, d.fsdp_pp),
            fp8_params=p.bool("fp8_params", d.fp8_params), shared_overlap=p.bool("shared_overlap", d.shared_overlap),
            pipe_schedule=_words(p, "pipe_schedule", "1f1b", pipe_schedule_value, PIPE_SCHEDULES_ALLOWED),
            offload=_words(p, "offload", "none", offload_value, OFFLOADS_ALLOWED))
        fw_name = p.str("framework", "")
        if fw_name:
            fw = framework(fw_name, p.source, p.prefix + "framework")
            given = {k for k in ("attention", "zero", "recompute", "vp", "optimizer", "recompute_modules", "dp_shard",
                                "cp_comm", "fsdp_pp", "fp8_params", "shared_overlap") if p.has(k)}
            options = options_with(fw, options, given, model.precision, model)[0]
            model = model_with(fw, model)[0]
        bad = fp8_params_error(model, "false") if options.fp8_params else None
        if bad:
            raise p.error("fp8_params", bad)
        bad = optimizer_error(model, options.optimizer, options.fp8_params, "adam-megatron")
        if bad:
            raise p.error("optimizer", bad)
        p.finish()
    f.finish()
    return WorkloadSpec(model, devices, batch, weight, options, source, system)


def _words(p: Fields, key: str, default: str, parse, allowed: str) -> str | tuple[str, ...]:
    """A workload's ``placement.<key>`` read word by word as its flag reads it (``parse``, a
    ValueError for a bad word; ``allowed`` says what is): one setting, or a list of them to search."""
    try:
        return several(p._get(key, default), parse, allowed)
    except ValueError as exc:
        raise p.error(key, str(exc)) from None


def _dp_shard(p: Fields) -> int | tuple[int, ...]:
    """A workload's ``placement.dp_shard``: ``all`` (default), ``node`` or a positive count up to
    ``MAX_DEVICES`` (:attr:`phaze.plan.Plan.dp_shard`), or a non-empty list of them to search."""
    raw = p._get("dp_shard", "all")
    values = [dp_shard_value(x) for x in (raw if isinstance(raw, list) else [raw])]
    if not values or any(v is None or v > MAX_DEVICES for v in values):
        raise p.error("dp_shard", f"must be {DP_SHARD_ALLOWED}, up to {MAX_DEVICES:,}"
                      + (", or a non-empty list of them" if isinstance(raw, list) else "") + f", got {quote(raw)}")
    return one_or_several(values)


def study_name_ok(name: str) -> bool:
    """Whether ``name`` can name a study and its folder ``results/<name>/`` on any file system."""
    return 0 < len(name) <= MAX_NAME and name not in (".", "..") and all(c.isalnum() or c in "-_." for c in name)


def load_sweep(path: str | Path) -> SweepConfig:
    """Read and check a sweep config; every problem is one :class:`ConfigError` line."""
    path = Path(path)
    source = str(path)
    f = Fields(read_mapping(path), source)
    name = f.str("name", path.stem)
    if not study_name_ok(name):
        raise f.error("name", f"1 to {MAX_NAME} letters, digits, '-', '_' and '.' (it names results/<name>), "
                              f"got {quote(name)}")
    base = _named(f, "base", load_chip, "--arch", f.str("base", "tpuv4"))
    system = _system(f, None)
    workloads = tuple(_workload(w, source, i, system) for i, w in enumerate(f.list("workloads")))
    names = [w.model.name for w in workloads]
    for i, w in enumerate(workloads):
        bad = offload_error(w.model, base, w.options)
        if bad:
            raise ConfigError(source, f"workloads[{i}].placement.offload", bad)
    for i, n in enumerate(names):
        if n in names[:i]:
            raise ConfigError(source, f"workloads[{i}]", f"{n} is listed twice; allowed: each model once "
                              f"(its columns in trials.csv are named after it)")
    space = f.sub("space")
    dims = {}
    for key in space.data:
        if key not in PARAMETERS:
            raise space.error(str(key), f"unknown parameter; allowed: {', '.join(PARAMETERS)}")
        dims[key] = _dimension(key, space._get(key, None), source)
    order = _order(dims, source)
    highest = _check_expressions(dims, order, source)
    fixed = [w.system.name for w in workloads if w.system and w.system.intra_node_bandwidth_bytes_per_s]
    if "link_bandwidth_gb_per_s" in dims and fixed:
        raise ConfigError(source, "space.link_bandwidth_gb_per_s", f"has no effect: system {fixed[0]!r} fixes the "
                          f"intra-node bandwidth; allowed: a system without intra_node bandwidth_bytes_per_s "
                          f"(e.g. cluster-100g: the chip's own links inside the node), or no link_bandwidth_gb_per_s")
    if not any(not dims[k].fixed and not dims[k].expression for k in order):
        raise ConfigError(source, "space", "nothing to search: every parameter is fixed")
    cons = []
    c = f.sub("constraints", None)
    if c is not None:
        for key in c.data:
            if key not in CONSTRAINTS:
                raise c.error(str(key), f"unknown constraint; allowed: {', '.join(CONSTRAINTS)}")
            cons.append((key, c.number(key, maximum=1e12)))
    objectives = f._get("objectives", ["throughput"])
    objectives = objectives if isinstance(objectives, list) else [objectives]
    for o in objectives:
        if not isinstance(o, str) or o not in OBJECTIVES:
            raise f.error("objectives", f"unknown objective {quote(o)}; allowed: {', '.join(OBJECTIVES)}")
    if len(set(objectives)) != len(objectives) or not objectives:
        raise f.error("objectives", "list each objective once, at least one")
    sampler = f.choice("sampler", SAMPLERS, "tpe")
    baselines = f._get("baselines", [])
    if not isinstance(baselines, list) or not all(isinstance(b, str) for b in baselines):
        raise f.error("baselines", f"must be a list of chip names or YAML paths, got {quote(baselines)}")
    for i, b in enumerate(baselines):
        _named(f, f"baselines[{i}]", load_chip, "--arch", b)
    options = f.sub("sampler_options", None)
    cfg = SweepConfig(
        name=name, source=source, base=base, workloads=workloads,
        dimensions=tuple(dims[k] for k in order), constraints=tuple(cons),
        objectives=tuple(objectives), sampler=sampler, trials=f.int("trials", 100, maximum=MAX_TRIALS),
        seed=f.int("seed", 0, minimum=0, maximum=MAX_SEED), storage=f.str("storage", ""), baselines=tuple(baselines),
        process_node_nm=process_node(f, base.process_node_nm),
        link_latency_s=f.number("link_latency_s", base.links[0].latency_s, inclusive=True, maximum=1.0),
        sampler_options=dict(options.data) if options is not None else {})
    f.finish()
    _check_clock(cfg, highest)
    return cfg


def _check_clock(cfg: SweepConfig, highest: dict[str, float]) -> None:
    """Refuse a sweep whose clock goes past the top of its template's V-f curve at the sweep's
    node (:func:`phaze.area.top_clock_hz`): no voltage takes the silicon there."""
    ref = build_chip(cfg.base, {}, cfg.process_node_nm)
    top = top_clock_hz(ref)
    ghz = highest.get("clock_ghz", cfg.base.clock_hz / 1e9)
    if ghz * 1e9 <= top * (1 + 1e-9):
        return
    where = (f"past the top of {cfg.base.name}'s V-f curve at {cfg.process_node_nm:g} nm, {top / 1e9:.3f} GHz (its "
             f"held clock there, {ref.reference_clock_hz / 1e9:.3f} GHz, over {held_share(ref):.3f}: docs/power.md)")
    if "clock_ghz" in highest:
        raise ConfigError(cfg.source, "space.clock_ghz", f"{ghz:g} GHz is {where}; allowed: clocks up to "
                          f"{top / 1e9:.3f} GHz")
    raise ConfigError(cfg.source, "process_node_nm", f"the template's {ghz:g} GHz clock is {where}; allowed: a "
                      f"newer node, or a space.clock_ghz up to {top / 1e9:.3f} GHz")


def override(cfg: SweepConfig, **changes) -> SweepConfig:
    """The config with command-line overrides (``trials``, ``sampler``, ``seed``, ``storage``)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    if "sampler" in changes and changes["sampler"] not in SAMPLERS:
        raise ConfigError("--sampler", None, f"must be one of {', '.join(SAMPLERS)}, got {changes['sampler']!r}")
    if changes.get("seed", 0) > MAX_SEED:
        raise ConfigError("--seed", None, f"must be an integer from 0 to {MAX_SEED:,}, got {changes['seed']}")
    if changes.get("trials", 1) > MAX_TRIALS:
        raise ConfigError("--trials", None, f"must be a positive integer up to {MAX_TRIALS:,}, got {changes['trials']}")
    return replace(cfg, **changes)
