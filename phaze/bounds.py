"""Optimistic bounds of a design's objectives, for the exact search (:mod:`phaze.exact`).

Three levels, each at least as optimistic as the next (the property tests check it on random
designs and workloads):

0. **Closed form, vectorised over the whole grid** (:func:`grid_bounds`): a device's step is at
   least its share of the tensor work over the tensor units' peak and of the vector work over
   the vector lanes' (and special-function units') rate. The work is what the cheapest layout of
   the placement space executes (the fewest FLOPs over its tensor widths and recompute modes,
   causal skipping included); numpy evaluates the bound for every point of the space at once.
1. **The placement's layout bounds** (:func:`placement_bound`): the placement's own dynamic
   program run on the lower bounds of every layer schedule (critical path and per-pool work,
   no solver), within the chip's memory; the smallest over all layouts.
2. **The exact evaluation** (:func:`phaze.candidate.evaluate_chip`).

A throughput bound is an upper bound of the weighted geometric mean of tokens/s; area and cost
are exact (the silicon model); power is bounded below by the die's leakage. Why level 0 is a
bound: every tensor op takes at least its executed multiply-accumulates over the MACs of the
units it runs on times the clock (the tile model's cycles count whole tiles in whole waves, never
fewer MACs); a schedule runs the ops of one unit pool within the pool's capacity; a device's step
under 1F1B is at least its micro-batches times its stage time, and the busiest device does at
least the mean work. A mixture of experts' routed experts count as one product a rank over all
the tokens it receives at the mean load (:func:`_bound_experts`): a grouped product pads each
expert's tokens and pays a prologue and a fill for each, never less than one over their sum.
Under context parallelism every rank of the ring runs the same ops in the step model, so one
rank's work times the ranks of its group is the cluster's.

Monotonicity (:data:`MONOTONE`): more tensor or vector units, lanes, SRAM, HBM capacity or
bandwidth, link bandwidth or clock never lowers the best throughput (the property tests check it
end to end), so an evaluated design bounds every design it dominates in those parameters.
"""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from .arch import Chip
from .area import _sent_bytes, _step_activity, activity_energy_j, energy_coefficients, logic_power_w, silicon
from .configio import ConfigError
from .cost import Efficiency, fused_columns
from .graph import ExpertLayout, edge_graph, layer_graph
from .placement import (
    all_mbs_values,
    cp_values,
    etp_values,
    layouts,
    place_bound,
    place_step_bounds,
    routing_values,
)
from .plan import Plan, graph_recompute, layer_modes
from .space import _BINOPS, PARAMETERS, SweepConfig, WorkloadSpec
from .stage import _shard, expert_layout, layer_mix
from .system import apply_system

# Parameters in which a design is never slower with a larger value (for a fixed value of the
# others). The array shape (rows, columns) is not among them: a larger array wastes more of its
# tiles on small products.
MONOTONE = ("tensor_units", "vector_units", "vector_lanes", "local_sram_kib", "shared_buffer_mib",
            "hbm_gib", "hbm_bandwidth_gb_per_s", "link_bandwidth_gb_per_s", "clock_ghz")

_NP_FUNCS = {"min": np.minimum, "max": np.maximum, "ceil": np.ceil, "floor": np.floor, "log2": np.log2}


def _np_eval(node: ast.AST, env: dict):
    """A sweep expression over arrays (the same grammar as :func:`phaze.space._eval`)."""
    if isinstance(node, ast.Expression):
        return _np_eval(node.body, env)
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BinOp):
        return _BINOPS[type(node.op)](_np_eval(node.left, env), _np_eval(node.right, env))
    if isinstance(node, ast.UnaryOp):
        return -_np_eval(node.operand, env)
    if isinstance(node, ast.Call):
        args = [_np_eval(a, env) for a in node.args]
        out = args[0]
        for a in args[1:]:
            out = _NP_FUNCS[node.func.id](out, a)
        return _NP_FUNCS[node.func.id](out) if len(args) == 1 and node.func.id not in ("min", "max") else out
    raise ValueError(f"unsupported expression node {type(node).__name__}")


@dataclass(frozen=True)
class Grid:
    """Every point of a sweep config's space: the sampler's choices (``choices[param]``, one
    array each) and every parameter's physical value in config units (``values[key]``)."""

    params: tuple[str, ...]
    choices: dict
    values: dict

    @property
    def size(self) -> int:
        return len(next(iter(self.choices.values()))) if self.choices else 1

    def point(self, i: int) -> dict:
        """The sampler's choices of point ``i`` (Python scalars, as Optuna stores them)."""
        return {p: self.choices[p][i].item() for p in self.params}


def grid(cfg: SweepConfig) -> Grid:
    """Every point of ``cfg``'s space, in the order of :func:`itertools.product` over
    :meth:`SweepConfig.grid` (the order ``phaze sweep`` walks)."""
    g = cfg.grid()
    params = tuple(g)
    axes = [np.asarray(g[p]) for p in params]
    mesh = np.meshgrid(*axes, indexing="ij") if axes else []
    choices = {p: m.ravel() for p, m in zip(params, mesh, strict=True)}
    n = len(next(iter(choices.values()))) if choices else 1
    env: dict = {}
    for d in cfg.dimensions:
        if d.expression:
            v = _np_eval(ast.parse(d.expression, mode="eval"), env)
            env[d.key] = np.broadcast_to(np.asarray(v, dtype=float), (n,)).copy()
        elif d.fixed:
            env[d.key] = np.full(n, d.values[0])
        else:
            c = choices[d.param].astype(float)
            env[d.key] = 2.0 ** c if d.log2 else c
    return Grid(params, choices, env)


# --- level 0: the closed form --------------------------------------------------------------------
@dataclass(frozen=True)
class Work:
    """What one layout option executes over the whole cluster in one step, on arrays of a given
    shape: tensor work in unit-cycles (one array busy for one clock cycle) and vector work as lane
    FLOPs and special-function evaluations."""

    tensor_cycles: float
    vector_flops: float
    special: float


def _gemm_cycles(b: int, M: int, K: float, N: int, w: float, R: int, C: int, fill: bool,
                 columns: int = 0) -> float:
    """Unit-cycles of ``b`` products M x K . K x N (share ``w`` executed) on R x C arrays: every
    output tile is a multiple of the array, so the outputs pad to whole arrays, each pass streams
    its K (plus the tile's prologue) and each wave fills and drains the array once (a product has
    at least one tile per batch entry). ``columns``: the array columns the N outputs occupy
    (default N padded to whole arrays; a fused attention's, :func:`phaze.cost.fused_columns`)."""
    width = columns / C if columns else math.ceil(N / C)
    return b * w * (math.ceil(M / R) * width * K + ((R + C) if fill else 0))


def _ops_work(ops, eff: Efficiency, R: int, C: int, fill: bool) -> tuple[float, float, float]:
    """(tensor unit-cycles, vector lane FLOPs, special evaluations) of ``ops``. A GEMM tile pays
    ``tile_overhead_k`` extra K-steps; fused attention pays it over its work fraction per query
    tile and runs at ``attention_fraction`` of its roofline, as :func:`phaze.cost.op_time` costs
    them."""
    t = v = s = 0.0
    k0 = eff.tile_overhead_k
    for o in ops:
        if o.unit == "tensor":
            b, M, K, N = o.gemm
            t += _gemm_cycles(b, M, K + k0, N, o.work_fraction, R, C, fill)
        elif o.unit == "tensor+vector":
            # the query tiles pad to whole arrays; of the width, only the values' columns pad
            # (phaze.cost.fused_columns), as the cost model's tiles do
            b, M, K, N = o.gemm
            w = o.work_fraction
            passes = o.flops / (2.0 * b * M * K * N)
            cycles = _gemm_cycles(b, M, K + k0 / w, N, w, R, C, fill, fused_columns(N, o.value_width, C))
            t += passes * cycles / eff.attention_fraction
            v += w * o.vector_flops
            s += w * o.special
        elif o.unit == "vector":
            v += o.flops
            s += o.special
    return t, v, s


def _layout_options(spec: WorkloadSpec):
    """(tp, sp, mbs, recompute, experts, rank model, ranks) of every layout option the placement
    may pick for ``spec``: ``experts`` the expert layers' bounding layout (:func:`_bound_experts`,
    None for a dense model), the model as one rank of a micro-batch's group runs it (its share of
    the sequence under context parallelism, :func:`phaze.stage._shard`) and the group's ranks
    (tp x cp). Every rank of a context-parallel group runs the same ops (the ring's causal
    blocks balanced over the ranks, as the step model has them): the options at cp > 1 are those
    of the placement's own layouts (:func:`_cp_layouts`)."""
    m, o = spec.model, spec.options
    if m.context_parallel > 1:
        return
    modes = _graph_modes(o)
    for tp in sorted(set(o.tp)) if 1 in cp_values(m, o) else ():
        if spec.devices % tp or m.heads % tp or m.ffn_hidden % tp:   # never placed
            continue
        for experts in (_bound_experts(m, o, etp) for etp in etp_values(m, tp, o)) if m.moe else (None,):
            for mbs in all_mbs_values(spec.devices, spec.global_batch, o):   # padding and fills do not scale
                for r in modes:
                    yield tp, o.sp and tp > 1, mbs, r, experts, m, tp
    for plan in _cp_layouts(spec):
        experts = _bound_experts(m, o, plan.etp) if m.moe else None
        for r in modes:
            yield plan.tp, plan.sp, plan.mbs, r, experts, _shard(m, plan), plan.tp * plan.cp


def _graph_modes(options) -> tuple[str, ...]:
    """What a layer may re-run under the placement's searches (:func:`phaze.plan.graph_recompute`):
    each recompute mode (a block stage runs none and full layers), and a full recompute beside each
    activation offload searched (which re-runs less than a plain full one)."""
    modes = [graph_recompute(r, options.recompute_modules) for r in layer_modes(options.recompute)]
    modes += [graph_recompute("full", options.recompute_modules, off) for off in options.offloads if off]
    return tuple(dict.fromkeys(modes))


@lru_cache(maxsize=256)
def _cp_layouts(spec: WorkloadSpec) -> tuple[Plan, ...]:
    """The placement's layouts of ``spec`` with context parallelism, one for each tp, micro-batch,
    cp, K/V exchange and expert tensor width (what a rank's ops depend on)."""
    seen = {}
    if max(cp_values(spec.model, spec.options)) == 1:
        return ()
    for schedule in spec.options.pipe_schedules:
        for plan in layouts(spec.model, spec.devices, spec.global_batch, spec.options, pipe_schedule=schedule):
            if plan.cp > 1:
                seen.setdefault((plan.tp, plan.sp, plan.mbs, plan.cp, plan.cp_comm, plan.cp_a2a, plan.etp), plan)
    return tuple(seen.values())


def _bound_experts(model, options, etp: int) -> ExpertLayout:
    """The expert layout whose layer graph bounds the work of every ep at expert tensor width
    ``etp``: each rank's experts as one product over all the tokens it receives (one expert a
    rank, ``ep`` = the experts), since a grouped product of ``local`` experts pads each expert's
    tokens to whole arrays and pays a tile prologue and a fill for each, never less than one over
    their sum; and the mean rank's tokens (``load`` 1, or a capacity factor below 1 where the
    placement may pad to it), since the busiest device does at least the mean work."""
    load = min(expert_layout(model, Plan(routing=r), mean=True).load for r in routing_values(model, options))
    return ExpertLayout(ep=model.experts, etp=etp, load=min(1.0, load))


def _layer_graphs(spec: WorkloadSpec, rank, mbs: int, tp: int, sp: bool, r: str, experts):
    """One rank's layer graphs with their weights in the mean layer: an MoE model's dense layers
    and a hybrid's kinds weigh by their shares, as the step weighs them (:func:`phaze.stage.layer_mix`).
    Compiled: the fewest ops a full recompute may run on any chip (a lower bound for each)."""
    attention = spec.options.attention
    return tuple((layer_graph(k, mbs, tp, sp, attention, r, lm, True), w) for w, k, lm in layer_mix(rank, experts))


@lru_cache(maxsize=4096)
def workload_work(spec: WorkloadSpec, eff: Efficiency, rows: int, cols: int, fill: bool) -> tuple[Work, ...]:
    """The work of each tensor width, micro-batch and recompute mode the placement may pick for
    ``spec`` (every layer at its width, the output layer once per micro-batch) on arrays of ``rows`` x
    ``cols`` (:func:`_layout_options`; empty when it has none)."""
    m = spec.model
    out = []
    for tp, sp, mbs, r, experts, rank, ranks in _layout_options(spec):
        head = _ops_work(edge_graph(rank, mbs, tp, sp)["head"], eff, rows, cols, fill)
        parts = [(_ops_work(g.ops, eff, rows, cols, fill), w) for g, w in _layer_graphs(spec, rank, mbs, tp, sp, r,
                                                                                        experts)]
        layer = tuple(sum(work[j] * w for work, w in parts) for j in range(3))
        # per micro-batch, over the tp x cp ranks of its group: every layer (the multi-token
        # prediction modules' too), and the head once (the modules' heads in it)
        per_mb = [ranks * ((m.layers + m.mtp_layers) * a + h) for a, h in zip(layer, head, strict=True)]
        out.append(Work(*(spec.global_batch / mbs * x for x in per_mb)))
    return tuple(out)


def _precision_scale(base: Chip, precision: str) -> float:
    """The tensor rate in ``precision`` relative to the units' 16-bit rate (an fp8 chip: the
    higher of the two, so the bound stays optimistic)."""
    try:
        return max(1.0, base.peak_flops(precision) / base.implied_peak_flops_per_s)
    except Exception:
        return 1.0


def grid_bounds(cfg: SweepConfig, g: Grid, eff_of) -> np.ndarray:
    """Level 0: an upper bound of every grid point's throughput (weighted geometric mean of
    tokens/s), ``inf`` where a workload cannot be bounded in closed form. ``eff_of(chip)`` gives
    the efficiency a candidate is scored with. Per point: each workload's step is at least the
    slower of its tensor work over the arrays' cycles and its vector work over the lanes' and
    special units' rates, for the cheapest layout option."""
    base = cfg.base
    v = g.values
    n = g.size

    def val(key, default):
        return v[key] if key in v else np.full(n, float(default))

    clock = val("clock_ghz", base.clock_hz / 1e9) * 1e9
    units = val("tensor_units", base.tensor.count)
    rows = val("tensor_rows", base.tensor.rows).astype(int)
    cols = val("tensor_cols", base.tensor.cols).astype(int)
    lanes = val("vector_lanes", base.vector.lanes)
    vcount = val("vector_units", base.vector.count)
    vflops = vcount * lanes * base.vector.flops_per_lane_per_cycle * clock
    special = np.maximum(1.0, np.round(base.vector.special_per_cycle * lanes / base.vector.lanes))
    sps = vcount * special * clock
    eff: Efficiency = eff_of(base)
    t0 = base.tensor
    shapes = np.unique(np.stack([rows, cols], axis=1), axis=0)
    logs = np.zeros(n)
    weights = 0.0
    for w in cfg.workloads:
        rate = units * clock * _precision_scale(base, w.model.precision) * eff.tensor_fraction
        step = np.full(n, np.inf)
        for R, C in shapes:
            R, C = int(R), int(C)
            at = (rows == R) & (cols == C)
            # a configured tile of the template (kept only at its own shape) may not be a whole
            # number of arrays: no padding there
            padded = not (t0.tile_m and (R, C) == (t0.rows, t0.cols) and (t0.tile_m % R or t0.tile_n % C))
            works = workload_work(w, eff, R if padded else 1, C if padded else 1, t0.fill_drain and padded)
            if not works:
                return np.full(n, np.inf)
            for k in works:
                t = np.maximum(k.tensor_cycles / rate[at], k.vector_flops / vflops[at] + k.special / sps[at])
                step[at] = np.minimum(step[at], t / w.devices)
        tokens = w.global_batch * w.model.seq_len
        logs += w.weight * np.log(tokens / step)
        weights += w.weight
    return np.exp(logs / weights)


# --- level 1: the placement's bounds -------------------------------------------------------------
def chip_bound(chip: Chip, workloads: tuple[WorkloadSpec, ...], eff: Efficiency) -> float:
    """Level 1: an upper bound of ``chip``'s throughput from the placement's layout bounds (0 when
    some workload has no layout that fits)."""
    logs, weights = 0.0, 0.0
    for w in workloads:
        c = apply_system(chip, w.system)
        step = place_bound(w.model, c, w.devices, w.global_batch, w.options, eff)
        if not math.isfinite(step):
            return 0.0
        logs += w.weight * math.log(w.global_batch * w.model.seq_len / step)
        weights += w.weight
    return math.exp(logs / weights)


def _ops_energy(ops, k: dict, precision: str, p: int, tp: int) -> float:
    """A lower bound of :func:`phaze.area._ops_activity`'s energy that does not depend on the
    chip's geometry: tensor FLOPs (causal skipping applied); vector FLOPs and special functions;
    the vector ops' bytes through HBM, the shared buffer and local SRAM; a GEMM's HBM traffic at
    least its operands and output once (through the shared buffer too); the bytes each device
    sends in the tensor-parallel collectives."""
    e = 0.0
    for op in ops:
        if op.unit == "link":
            # the experts' exchanges depend on their layout (none at ep 1): left out of the bound
            if op.collective.group == "tp":
                e += _sent_bytes(op.collective.kind, op.collective.bytes, tp) * k["link"]
        elif op.unit in ("tensor", "tensor+vector"):
            e += op.flops * op.work_fraction * k["tensor"]
            if op.unit == "tensor+vector":
                e += op.work_fraction * (op.vector_flops + op.special) * k["vector"]
                e += op.bytes * (k["hbm"] + k["shared_buffer"])
            elif not op.name.removeprefix("recompute.").startswith("expert_"):
                # (a routed expert's GEMMs here hold every expert on one rank, whose weights an
                # ep-way layout splits over its ranks: their bytes are left out of the bound)
                batch, M, K, N = op.gemm
                q = 1 if (precision == "fp8" and op.weighted) else p
                e += q * batch * (M * K + K * N + M * N) * (k["hbm"] + k["shared_buffer"])
        elif op.unit == "vector":
            e += (op.flops + op.special) * k["vector"] + op.bytes * (k["hbm"] + k["shared_buffer"] + k["local_sram"])
    return e


def _energy_min(spec: WorkloadSpec, k: dict) -> float:
    """The least energy of one step over the cluster that the energy model charges for the ops'
    work, over the layout options (the reduction and optimizer traffic, at least 0, left out;
    0 where :func:`_layout_options` has none)."""
    m = spec.model
    best = math.inf
    for tp, sp, mbs, r, experts, rank, ranks in _layout_options(spec):
        e = edge_graph(rank, mbs, tp, sp)
        edges = _ops_energy(e["embedding"] + e["head"], k, m.precision, m.bytes_per_element, tp)
        layer = sum(_ops_energy(g.ops, k, m.precision, m.bytes_per_element, tp) * w
                    for g, w in _layer_graphs(spec, rank, mbs, tp, sp, r, experts))
        best = min(best, spec.global_batch / mbs * ranks * ((m.layers + m.mtp_layers) * layer + edges))
    return 0.0 if not math.isfinite(best) else best


def _layouts_energy(spec: WorkloadSpec, chip: Chip, layouts, k: dict) -> float:
    """The least dynamic energy per device and step (the energy model's, logic and leakage apart)
    of a plan with one of ``layouts`` (the layouts the chosen plan may have): the energy model's
    activity of the layout under each recompute mode the placement may use, the least of them. A
    plan's stage split does not change its activity (each stage's reduction and optimizer work is
    linear in its parameters, and every layer is counted once), and a plan recomputing by stage
    spends at least what the cheapest uniform mode does on each layer. 0 without layouts."""
    modes = layer_modes(spec.options.recompute)
    best = math.inf
    for base in layouts:
        for r in modes:
            try:        # a mode the layout's schedule does not run (a DualPipe layout's block)
                a = _step_activity(spec.model, chip, spec.devices, spec.global_batch,
                                   replace(base, recompute=r, stage_recompute=(), stages=()))
            except ConfigError:
                continue
            best = min(best, sum(activity_energy_j(a, k).values()))
    return 0.0 if not math.isfinite(best) else best


@dataclass(frozen=True)
class PowerBounds:
    """Level 1 with power. The design's throughput X is at most ``throughput_ub`` and at least
    ``throughput_lb``; its power at load is at least ``power_lb`` and at least ``leakage_w +
    per_throughput * X``: a workload's power is leakage plus (op energy + logic power x busy time)
    / step, and its step is its tokens / throughput, so each workload's power grows with its
    throughput; the highest over the workloads is at least their weighted geometric mean, which is
    ``per_throughput`` (the weighted geometric mean of each workload's coefficient) times X."""

    throughput_ub: float
    power_lb: float
    throughput_lb: float = 0.0
    leakage_w: float = 0.0
    per_throughput: float = 0.0

    def power_at(self, x):
        """The lower bound of the power of the design if its throughput is ``x``."""
        return np.maximum(self.power_lb, self.leakage_w + self.per_throughput * x)


def chip_power_bounds(chip: Chip, workloads: tuple[WorkloadSpec, ...], eff: Efficiency) -> PowerBounds:
    """:class:`PowerBounds` of ``chip`` (throughput 0 and power the leakage when some workload
    has no plan that fits). The dynamic energy is the least over the layouts the chosen plan may
    have (:func:`_layouts_energy`), never below the closed form over every layout option."""
    si = silicon(chip)
    logic_w = logic_power_w(chip)
    k = energy_coefficients(chip)
    hi = lo = per = weights = 0.0
    power = si.leakage_w
    for w in workloads:
        c = apply_system(chip, w.system)
        b = place_step_bounds(w.model, c, w.devices, w.global_batch, w.options, eff)
        if b is None:
            return PowerBounds(0.0, si.leakage_w, 0.0, si.leakage_w, 0.0)
        tokens = w.global_batch * w.model.seq_len
        hi += w.weight * math.log(tokens / b.step_lb)
        lo += w.weight * math.log(tokens / b.step_ub)
        # joules per device and step, at least: over the layouts the chosen plan may have, and
        # (what needs no layout) over every layout option
        energy = max(_energy_min(w, k) / w.devices, _layouts_energy(w, c, b.layouts, k))
        power = max(power, si.leakage_w + logic_w * b.busy_share_lb + energy / b.step_ub)
        coeff = (energy + logic_w * b.busy_lb_s) / tokens
        per += w.weight * math.log(coeff) if coeff > 0 else -math.inf
        weights += w.weight
    return PowerBounds(math.exp(hi / weights), power, math.exp(lo / weights), si.leakage_w,
                       math.exp(per / weights) * (1 - 1e-9) if math.isfinite(per) else 0.0)


# --- dominance -----------------------------------------------------------------------------------
def dominance_keys(cfg: SweepConfig, g: Grid) -> tuple[np.ndarray, np.ndarray]:
    """(monotone values [n, k], other values [n, j]) of every point: point a dominates point b
    when a's monotone values are all at least b's and its other values equal b's."""
    keys = [k for k in PARAMETERS if k in g.values]
    mono = [k for k in keys if k in MONOTONE]
    other = [k for k in keys if k not in MONOTONE]
    m = np.stack([g.values[k] for k in mono], axis=1) if mono else np.zeros((g.size, 0))
    o = np.stack([g.values[k] for k in other], axis=1) if other else np.zeros((g.size, 0))
    return m, o


def dominated_by(mono: np.ndarray, other: np.ndarray, i: int) -> np.ndarray:
    """Mask of the points that point ``i`` dominates (itself included)."""
    mask = np.all(mono <= mono[i], axis=1)
    if other.shape[1]:
        mask &= np.all(other == other[i], axis=1)
    return mask


__all__ = ["MONOTONE", "Grid", "Work", "chip_bound", "dominance_keys", "dominated_by", "grid", "grid_bounds",
           "workload_work"]
