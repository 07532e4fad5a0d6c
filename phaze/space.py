"""Sweep configs: the chip design space, the workloads, constraints and objectives of a search.

A sweep config (``search/*.yaml``) names a template chip, the workloads a design is scored on,
the space of chip parameters, budgets and objectives. Each parameter is a fixed value, a list, a
range with a step, a powers-of-two range (``log2``), or an arithmetic expression of the others
(``"max(1, tensor_rows * tensor_cols / 64)"``). Values in the config carry their unit in the key
(``shared_buffer_mib``); :func:`build_chip` converts them to the SI fields of :class:`Chip`.
"""
from __future__ import annotations

import ast
import hashlib
import itertools
import json
import math
import operator
from dataclasses import dataclass, field, replace
from pathlib import Path

from .arch import Chip, load_chip
from .configio import ConfigError, Fields, read_mapping
from .framework import framework, options_with
from .placement import PlacementOptions
from .plan import RECOMPUTE
from .system import System, load_system
from .workload import Model, load_model

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
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}
_FUNCS = {"min": min, "max": max, "ceil": math.ceil, "floor": math.floor, "log2": math.log2}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id not in _FUNCS}


def _eval(node: ast.AST, env: dict) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body, env)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, env)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
        return _FUNCS[node.func.id](*(_eval(a, env) for a in node.args))
    raise ValueError("only numbers, parameter names, + - * / // **, min, max, ceil, floor, log2")


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


def _dimension(key: str, raw, source: str) -> Dimension:
    where = f"space.{key}"
    integer = PARAMETERS[key][2]

    def num(v, what=""):
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
        if not ok:
            raise ConfigError(source, where + what, f"must be a positive number, got {v!r}")
        if integer and not float(v).is_integer():
            raise ConfigError(source, where + what, f"must be a whole number, got {v!r}")
        return float(v)

    if isinstance(raw, str):
        try:
            tree = ast.parse(raw, mode="eval")
            _eval(tree, dict.fromkeys(_names(tree), 1.0))
        except (SyntaxError, ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
            raise ConfigError(source, where, f"not a valid expression {raw!r}: {exc}; allowed: numbers, "
                              f"parameter names, + - * / // **, min, max, ceil, floor, log2") from None
        return Dimension(key, expression=raw)
    if isinstance(raw, list):
        if not raw:
            raise ConfigError(source, where, "empty list; give at least one value")
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
        n = int(math.floor((hi - lo) / step + 1e-9)) + 1
        values = tuple(round(lo + i * step, 9) for i in range(n))
        for v in values:
            num(v)
        return Dimension(key, values)
    return Dimension(key, (num(raw),))


def _order(dims: dict[str, Dimension], source: str) -> tuple[str, ...]:
    """Parameters in an order where every expression comes after what it reads."""
    done: list[str] = [k for k, d in dims.items() if not d.expression]
    pending = {k: _names(ast.parse(d.expression, mode="eval")) for k, d in dims.items() if d.expression}
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
    options: PlacementOptions = PlacementOptions()
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
        """Every sampler-visible parameter's choices (for the grid sampler and ``phaze sweep``)."""
        return {d.param: list(d.choices) for d in self.searched}

    def grid_size(self) -> int:
        return math.prod(len(d.values) for d in self.searched)

    def values(self, params: dict) -> dict[str, float]:
        """The physical value of every parameter (config units) from a trial's choices."""
        env: dict[str, float] = {}
        for d in self.dimensions:
            if d.expression:
                env[d.key] = float(_eval(ast.parse(d.expression, mode="eval"), env))
            elif d.fixed:
                env[d.key] = d.values[0]
            else:
                env[d.key] = d.value(params[d.param])
        return env

    def fingerprint(self) -> str:
        """What a study's trials depend on: the space, workloads, constraints, objectives, template
        chip and the calibrated efficiency parameters that score it. A study is only resumed by a
        config with the same fingerprint (a recalibrated phaze starts a new study)."""
        from .validate import load_default_params
        params = load_default_params() or {}
        desc = {"base": repr(self.base),
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
    every link level to the first. Published die area and TDP do not carry over."""
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
        links=links, area_mm2=None, tdp_w=None,
        process_node_nm=process_node_nm if process_node_nm is not None else base.process_node_nm)


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
    if not raw or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in raw):
        raise f.error(key, f"must be a positive integer or a list of them, got {raw!r}")
    return tuple(raw)


def _system(f: Fields, default: System | None) -> System | None:
    """The ``system`` key of a sweep or of one workload entry (a shipped name or a YAML path)."""
    name = f.str("system", None)
    if name is None:
        return default
    try:
        return load_system(name)
    except ConfigError as exc:
        if exc.source != "--system":     # a system file that exists names its own file and field
            raise
        raise f.error("system", exc.message) from None


def _workload(item, source: str, i: int, system: System | None = None) -> WorkloadSpec:
    f = Fields(item, source, f"workloads[{i}].") if isinstance(item, dict) else None
    if f is None:
        raise ConfigError(source, f"workloads[{i}]", "must be a mapping with workload, devices, global_batch")
    seq = f.int("seq_len", None)
    source = f.str("workload")
    model = load_model(source, seq)
    devices, batch = f.int("devices"), f.int("global_batch")
    weight = f.number("weight", 1.0)
    system = _system(f, system)
    d = PlacementOptions()
    p = f.sub("placement", None)
    options = d
    if p is not None:
        rec = p._get("recompute", None)
        rec = d.recompute if rec is None else tuple(rec if isinstance(rec, list) else [rec])
        if not rec or any(r not in RECOMPUTE for r in rec):
            raise p.error("recompute", f"must be a subset of {', '.join(RECOMPUTE)}, got {rec!r}")
        options = PlacementOptions(
            tp=_int_tuple(p, "tp", d.tp), mbs=_int_tuple(p, "mbs", d.mbs), pp=_int_tuple(p, "pp", d.pp),
            vp=_int_tuple(p, "vp", d.vp), cp=_int_tuple(p, "cp", d.cp), ep=_int_tuple(p, "ep", d.ep),
            etp=_int_tuple(p, "etp", d.etp), recompute=rec, zero=p.int("zero", d.zero, minimum=0),
            attention=p.choice("attention", ("flash", "flash2", "standard"), d.attention),
            optimizer=p.choice("optimizer", ("adam", "sgd"), d.optimizer))
        if options.zero > 3:
            raise p.error("zero", f"must be 0, 1, 2 or 3, got {options.zero}")
        fw_name = p.str("framework", "")
        if fw_name:
            fw = framework(fw_name, p.source, p.prefix + "framework")
            options = options_with(fw, options, {k for k in ("attention", "zero", "recompute") if p.has(k)})[0]
        p.finish()
    f.finish()
    return WorkloadSpec(model, devices, batch, weight, options, source, system)


def load_sweep(path: str | Path) -> SweepConfig:
    """Read and check a sweep config; every problem is one :class:`ConfigError` line."""
    path = Path(path)
    source = str(path)
    f = Fields(read_mapping(path), source)
    name = f.str("name", path.stem)
    if not all(c.isalnum() or c in "-_." for c in name):
        raise f.error("name", f"letters, digits, '-', '_' and '.' only (it names results/<name>), got {name!r}")
    base = load_chip(f.str("base", "tpuv4"))
    system = _system(f, None)
    workloads = tuple(_workload(w, source, i, system) for i, w in enumerate(f.list("workloads")))
    names = [w.model.name for w in workloads]
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
            cons.append((key, c.number(key)))
    objectives = f._get("objectives", ["throughput"])
    objectives = objectives if isinstance(objectives, list) else [objectives]
    for o in objectives:
        if o not in OBJECTIVES:
            raise f.error("objectives", f"unknown objective {o!r}; allowed: {', '.join(OBJECTIVES)}")
    if len(set(objectives)) != len(objectives) or not objectives:
        raise f.error("objectives", "list each objective once, at least one")
    sampler = f.choice("sampler", SAMPLERS, "tpe")
    baselines = f._get("baselines", [])
    if not isinstance(baselines, list) or not all(isinstance(b, str) for b in baselines):
        raise f.error("baselines", f"must be a list of chip names or YAML paths, got {baselines!r}")
    for b in baselines:
        load_chip(b)
    options = f.sub("sampler_options", None)
    cfg = SweepConfig(
        name=name, source=source, base=base, workloads=workloads,
        dimensions=tuple(dims[k] for k in order), constraints=tuple(cons),
        objectives=tuple(objectives), sampler=sampler, trials=f.int("trials", 100),
        seed=f.int("seed", 0, minimum=0), storage=f.str("storage", ""), baselines=tuple(baselines),
        process_node_nm=f.number("process_node_nm", base.process_node_nm),
        link_latency_s=f.number("link_latency_s", base.links[0].latency_s, inclusive=True),
        sampler_options=dict(options.data) if options is not None else {})
    f.finish()
    return cfg


def override(cfg: SweepConfig, **changes) -> SweepConfig:
    """The config with command-line overrides (``trials``, ``sampler``, ``seed``, ``storage``)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    if "sampler" in changes and changes["sampler"] not in SAMPLERS:
        raise ConfigError("--sampler", None, f"must be one of {', '.join(SAMPLERS)}, got {changes['sampler']!r}")
    return replace(cfg, **changes)
