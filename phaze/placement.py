"""Device placement: the best execution plan of a model on a cluster.

For every layout (tensor-parallel width tp, pipeline depth pp, micro-batch mbs, interleaving vp)
an exact dynamic program chooses the contiguous stage partition of the layers and each stage's
recompute mode, within every device's memory, to minimise the step time of
:func:`phaze.step.step_time_of`::

    step = (m - 1/v) * max_i T_i + sum_i T_i / v + max_i tail_i

The two maxima are handled by enumerating caps: for a cap on the slowest stage time and a cap on
the largest tail, a (min, +) recurrence over (stages used, layers placed) gives the smallest sum of
stage times; the minimum over caps of ``(m - 1/v) * cap_T + sum / v + cap_tail`` is the optimum
(attained when both caps equal the true maxima). Caps are visited in increasing order and pruned
by a lower bound, so only a few are solved.
"""
from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, replace
from functools import lru_cache
from html import escape

import numpy as np

from .arch import Chip
from .configio import ConfigError
from .cost import IDEAL, Efficiency
from .memory import memory_reserve_bytes
from .plan import (
    OFFLOADS,
    PIPE_SCHEDULES,
    PLAN_RECOMPUTE,
    SEARCHED_RECOMPUTE,
    Plan,
    cp_a2a_groups,
    hides_dp_reduction,
    layer_modes,
    shared_overlap_conflict,
)
from .plan_check import check_plan, fp8_params_error, optimizer_error, runs_op_recompute, stage_split
from .stage import (
    PhaseTime,
    StageCosts,
    expert_layout,
    inflight_micro_batches,
    mode_cost_bounds,
    mode_cost_upper,
    mode_layout,
    shard_ranks,
    stage_costs,
)
from .step import StepResult, critical_weight, evaluate, host_offload_bytes_per_layer, layout_of
from .workload import Model

GiB = 2.0 ** 30
_SLACK = 1 - 1e-9   # bounds are summed in another order than exact step times: allow for rounding


SEARCH_ZERO = -1                 # PlacementOptions.zero: search DEFAULT_ZERO_STAGES
DEFAULT_ZERO_STAGES = (0, 1)     # no sharding, and Megatron's distributed optimizer (ZeRO-1)


@dataclass(frozen=True)
class PlacementOptions:
    """The space searched. ``tp``, ``mbs``, ``vp``: candidate values (invalid ones are skipped);
    ``pp``: candidate depths (empty: every divisor of devices/tp up to the layer count);
    ``zero``: a ZeRO stage, a tuple of stages to search, or ``SEARCH_ZERO`` (the default) for
    :data:`DEFAULT_ZERO_STAGES`; ``memory_reserve``: bytes kept free per device (None: the
    chip's modelled reserve, :func:`phaze.memory.memory_reserve_bytes`)."""

    tp: tuple[int, ...] = (1, 2, 4, 8)
    mbs: tuple[int, ...] = ()   # empty: every divisor of a replica's batch up to MAX_AUTO_MBS (:func:`mbs_values`)
    recompute: tuple[str, ...] = SEARCHED_RECOMPUTE
    pp: tuple[int, ...] = ()
    vp: tuple[int, ...] = ()    # empty: every vp Megatron accepts up to MAX_AUTO_VP (:func:`vp_values`)
    zero: int | tuple[int, ...] = SEARCH_ZERO
    attention: str = "flash"
    sp: bool = True
    optimizer: str = "adam"
    exhaustive: bool = False    # solve every layout's layer schedules (no bounding): for checks
    memory_reserve: float | None = None
    reduce_fp32: bool = False
    ep: tuple[int, ...] = ()    # expert parallel widths (empty: 1 for a dense model, the powers of
                                # two dividing the experts for a mixture of experts)
    cp: tuple[int, ...] = ()    # context parallel widths (empty: :func:`cp_values`)
    etp: tuple[int, ...] = ()   # expert tensor parallel widths (empty: :func:`etp_values`)
    routing: tuple[str, ...] = ()   # MoE routings to search (empty: the model's own)
    dispatcher: tuple[str, ...] = ()   # MoE token dispatchers to search (empty: the plan's default, alltoall)
    ep_overlap: tuple[bool, ...] = ()  # MoE all-to-all overlap settings to search (empty: off)
    tp_async: bool = False      # every plan's tp_async, tp_overlap, dp_overlap and loss (a framework's defaults)
    tp_overlap: bool = False
    dp_overlap: bool = True
    dp_overlap_flat: bool = False   # dp_overlap only in plans without pipeline and sequence parallelism
    loss: str = "torch"
    grad_accum_fusion: bool = True   # adam-megatron's weight-gradient GEMMs add into the main gradients
    fsdp_pp: str = "micro_batch"     # zero 3 with pp > 1: weights gathered per micro-batch | per step
    fp8_params: bool = False         # an fp8 run's linear weights held and gathered in fp8
    pipe_p2p: str = "batched"        # how pipeline stages exchange activations (phaze.plan.PIPE_P2P)
    pipe_schedule: str | tuple[str, ...] = "1f1b"   # the pipeline schedule, or the schedules searched
                                                   # (phaze.plan.PIPE_SCHEDULES; :attr:`pipe_schedules`)
    offload: str | tuple[str, ...] = ""   # activations a full recompute keeps on the host ("": none;
                                          # phaze.plan.OFFLOADS), or those searched (:attr:`offloads`)
    shared_overlap: bool = False     # shared experts beside the all-to-alls, in the plans that allow it
    dp_shard: int | tuple[int, ...] = 0   # data-parallel ranks of a ZeRO shard group, or the groupings
                                          # searched (phaze.plan.Plan.dp_shard; :attr:`dp_shards`)
    cp_comm: str | tuple[str, ...] = "p2p"   # context parallelism's K/V exchange, or the exchanges
                                             # searched (phaze.plan.Plan.cp_comm; :attr:`cp_comms`)
    execution: str = ""         # how the chip's work is issued (phaze.arch.EXECUTION; "": the chip's)
    recompute_modules: tuple[str, ...] = ()   # what a selective stage re-runs (Megatron-Core's modules,
                                              # phaze.plan.RECOMPUTE_MODULES; empty: Megatron-LM's)

    @property
    def dp_shards(self) -> tuple[int, ...]:
        """The ZeRO shard groupings searched with zero > 0, in the given order (a layout without
        ZeRO takes the first: nothing is sharded)."""
        return (self.dp_shard,) if isinstance(self.dp_shard, int) else tuple(dict.fromkeys(self.dp_shard))

    @property
    def cp_comms(self) -> tuple[str, ...]:
        """The K/V exchanges searched at cp > 1, in the given order (a layout at cp = 1 takes the
        first: there is nothing to exchange)."""
        return (self.cp_comm,) if isinstance(self.cp_comm, str) else tuple(dict.fromkeys(self.cp_comm))

    @property
    def pipe_schedules(self) -> tuple[str, ...]:
        """The pipeline schedules searched, in the given order: ``1f1b`` by the dynamic program,
        ``dualpipe`` over even splits (:func:`place`)."""
        return ((self.pipe_schedule,) if isinstance(self.pipe_schedule, str)
                else tuple(dict.fromkeys(self.pipe_schedule)))

    @property
    def offloads(self) -> tuple[str, ...]:
        """The activation offloads searched, in the given order ("": none); a plan that offloads
        recomputes every stage in full (:func:`place` searches each offload on its own)."""
        return (self.offload,) if isinstance(self.offload, str) else tuple(dict.fromkeys(self.offload))

    @property
    def zero_stages(self) -> tuple[int, ...]:
        if isinstance(self.zero, int):
            return DEFAULT_ZERO_STAGES if self.zero == SEARCH_ZERO else (self.zero,)
        return tuple(sorted(set(self.zero)))


@dataclass(frozen=True)
class Placement:
    plan: Plan
    result: StepResult


@dataclass(frozen=True)
class PlacementResult:
    best: Placement | None
    top: tuple[Placement, ...]
    baseline: Placement | None          # even split, one recompute mode: a Megatron-style plan
    layouts_considered: int
    layouts_feasible: int               # known to fit (an interleaved layout bounded out through
                                        # its vp = 1 sibling is not examined)
    solve_time_s: float
    infeasible_reason: str = ""
    layouts_solved: int = 0             # layouts whose layer schedules were solved (not pruned)
    infeasible_source: str = ""         # the flag (or parameter) the reason is about
    baseline_kind: str = ""             # what the baseline is (how it was chosen)

    def to_dict(self) -> dict:
        """Plain data (JSON-ready): the best plan, the runners-up and the baseline with their results."""
        def one(p):
            return None if p is None else dict(p.result.to_dict(), plan=p.plan.label())
        return {"best": one(self.best), "top": [one(p) for p in self.top], "baseline": one(self.baseline),
                "baseline_kind": self.baseline_kind, "gain_over_baseline": self.gain_over_baseline,
                "layouts_considered": self.layouts_considered, "layouts_feasible": self.layouts_feasible,
                "layouts_solved": self.layouts_solved, "solve_time_s": float(self.solve_time_s),
                "infeasible_reason": self.infeasible_reason}

    def to_frame(self):
        """The ranked plans as a pandas DataFrame: one row each (rank 1 is the best), then the baseline."""
        import pandas as pd  # deferred: pandas imports slowly and only to_frame() needs it
        rows = []
        for rank, p in [(k, p) for k, p in enumerate(self.top, 1)] + ([("baseline", self.baseline)]
                                                                      if self.baseline else []):
            r = p.result
            rows.append({"rank": rank, "plan": p.plan.label(), "tp": p.plan.tp, "pp": p.plan.pp,
                         "mbs": p.plan.mbs, "zero": p.plan.zero, "recompute": p.plan.recompute,
                         "step_time_s": r.step_time_s, "tokens_per_s": r.tokens_per_s, "mfu": r.mfu,
                         "memory_gib": r.memory_per_device_bytes / GiB, "headroom_gib": r.headroom_bytes / GiB,
                         "fits": r.fits})
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        if self.best is None:
            return f"PlacementResult(no plan: {self.infeasible_reason})"
        r = self.best.result
        gain = self.gain_over_baseline
        return (f"PlacementResult(best {self.best.plan.label()}: step {r.step_time_s:.4g} s, "
                f"{r.tokens_per_s:,.0f} tokens/s, MFU {100 * r.mfu:.1f} %, headroom {r.headroom_bytes / GiB:.1f} GiB; "
                f"{len(self.top)} plans ranked, {self.layouts_feasible} of {self.layouts_considered} layouts fit"
                + ("" if gain is None else f"; {100 * gain:+.1f} % over the baseline") + ")")

    def _repr_html_(self) -> str:
        if self.best is None:
            return f"<p>no plan: {escape(self.infeasible_reason)}</p>"
        frame = self.to_frame()
        return (f"<p>{self.best.result.workload} on {self.best.result.devices} x {self.best.result.chip}: "
                f"{self.layouts_feasible} of {self.layouts_considered} layouts fit; baseline: "
                f"{self.baseline_kind}</p>" + frame.to_html(index=False, float_format=lambda x: f"{x:.4g}"))

    @property
    def gain_over_baseline(self) -> float | None:
        """Throughput of the best plan over the baseline's, minus one."""
        if not self.best or not self.baseline:
            return None
        return float(self.baseline.result.step_time_s / self.best.result.step_time_s - 1.0)


# --- per-stage option tables -----------------------------------------------------------------------
@dataclass(frozen=True)
class _Options:
    """For each stage i, layer count n (index n, 0 unused) and recompute r: time, tail, fits."""

    time: np.ndarray      # [pp, L+1, R]
    tail: np.ndarray      # [pp, L+1, R]
    fits: np.ndarray      # [pp, L+1, R] bool
    memory: np.ndarray    # [pp, L+1, R] bytes
    modes: tuple[str, ...]
    full_layers: np.ndarray | None = None   # [pp, L+1, R] layers a ``block`` column re-runs whole


def _options(costs: StageCosts, modes: tuple[str, ...], allowed_n, tails: dict | None = None,
             bound: bool = False) -> _Options:
    """Evaluate every (stage, layers, recompute) through :class:`StageCosts` itself (its time and
    memory are linear in the layer count and accept an array of counts), so the DP scores exactly
    what :func:`phaze.step.evaluate` scores. Interior stages share times and tails. ``tails``: a
    cache of the tails over every layer count, shared by the interleaved variants of a layout
    (a stage's tail does not depend on vp). A ``block`` stage re-runs the fewest of its layers
    whole that fit it in memory (:func:`_block_layers`). ``bound``: tables for lower bounds only,
    where a block stage's tail is taken with all its layers' backward windows (a longer window
    hides more, so no count has a smaller tail): an interleaved or other ZeRO variant of the
    layout, whose memory sets another count, is then bounded too. Otherwise a block stage may also
    re-run more of its layers, where that can pay (:func:`_longer_blocks`): more ``block`` columns,
    appended after ``modes``."""
    pp, L = costs.plan.pp, costs.model.layers
    R = len(modes)
    shape = (pp, L + 1, R)
    t, tl, mem = np.full(shape, np.inf), np.full(shape, np.inf), np.full(shape, np.inf)
    ns = np.asarray(sorted(allowed_n), dtype=float)
    idx = ns.astype(int)
    layout = mode_layout(costs.plan)
    reserve = memory_reserve_bytes(costs.chip, costs.plan.memory_reserve)
    budget = costs.chip.hbm_bytes - reserve
    full_layers = None
    longer: list = []       # more block columns: (time, tail, memory, layers re-run whole)
    for k, r in enumerate(modes):
        if costs.plan.ep_overlap and r in ("full", "block"):
            continue        # Megatron-Core refuses them beside the all-to-all overlap (phaze.step)
        if r == "block":
            # the stages' memory without recompute (the none column's, when built before)
            none = mem[:, idx, modes.index("none")] if "none" in modes[:k] else costs.memory_table("none", ns)
            full = modes.index("full") if "full" in modes[:k] else None
            ks, table = _block_layers(costs, ns, budget, none)
            full_layers = np.zeros(shape, dtype=int)
            useful = ks > 0
            kf = np.where(useful, ks, 0).astype(float)
            if table is not None:
                full_layers[:, idx, k] = np.where(useful, ks, 0)
                mem[:, idx, k] = table
                if not bound:
                    t[:, idx, k], tl[:, idx, k] = _block_rows(costs, ns, kf, useful, kf)
                elif full is not None:      # every layer re-run whole: full's tail, to the digit
                    t[:, idx, k] = _block_rows(costs, ns, kf, useful)[0]
                    tl[:, idx, k] = np.where(useful, tl[:, idx, full], np.inf)
                else:
                    t[:, idx, k], tl[:, idx, k] = _block_rows(costs, ns, kf, useful, np.broadcast_to(ns, kf.shape))
            if not bound:       # from the fewest that fit, or from none where the stage fits without
                longer = _longer_blocks(costs, ns, kf, useful | (none <= budget), t[:, idx, k], tl[:, idx, k])
            continue
        classes = {0, pp - 1} | ({1} if pp > 2 else set())
        for i in classes:
            t[i, idx, k] = costs.time(i, ns, r, groups=False).total
            if tails is None:
                comm, opt = costs.tail(i, ns, r)
                tl[i, idx, k] = comm + opt
                continue
            key = (layout, i, r, id(costs.mode(r)))     # the costs are alive for the whole search
            if key not in tails:
                comm, opt = costs.tail(i, np.arange(1, L + 1, dtype=float), r)
                tails[key] = np.concatenate(([np.inf], comm + opt))       # index: the layer count
            tl[i, idx, k] = tails[key][idx]
        if pp > 3:          # interior stages 2 .. pp-2 are stage 1's copies
            t[2:pp - 1, idx, k], tl[2:pp - 1, idx, k] = t[1, idx, k], tl[1, idx, k]
        mem[:, idx, k] = costs.memory_table(r, ns)
    if longer:      # the extra block columns, after the modes' own
        extra = [np.full((pp, L + 1, len(longer)), fill) for fill in (np.inf, np.inf, np.inf, 0)]
        for j, parts in enumerate(zip(*longer, strict=True)):      # time, tail, memory, count
            extra[j][:, idx, :] = np.stack(parts, axis=-1)
        t, tl, mem, full_layers = (np.concatenate((a, b), axis=2) for a, b in zip((t, tl, mem, full_layers), extra,
                                                                                    strict=True))
        full_layers = full_layers.astype(int)
        modes = modes + ("block",) * len(longer)
    fits = mem + reserve <= costs.chip.hbm_bytes
    if costs.plan.offload and costs.chip.host_memory_bytes:    # the host's memory holds the offloaded
        inflight = np.array([inflight_micro_batches(pp, costs.plan.vp, costs.micro_batches, i) for i in range(pp)])
        held = host_offload_bytes_per_layer(costs.model, costs.plan) * np.arange(L + 1) * inflight[:, None]
        fits &= (held <= costs.chip.host_memory_bytes)[:, :, None]      # copies, as evaluate checks
    return _Options(t, tl, fits, mem, modes, full_layers)


def _block_rows(costs: StageCosts, ns: np.ndarray, counts: np.ndarray, alive: np.ndarray,
                tail_counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Time and tail ([stages, len(ns)], inf where not ``alive``) of block stages re-running
    ``counts`` of their layers whole, the first and last stages, then every interior stage at once;
    the tail with the windows of ``tail_counts`` layers re-run whole (None: no tail)."""
    pp = costs.plan.pp
    tt = np.full(alive.shape, np.inf)
    tail = None if tail_counts is None else np.full(alive.shape, np.inf)
    for rows in ([0], [pp - 1] if pp > 1 else [], list(range(1, pp - 1))):
        if not rows or not alive[rows].any():
            continue
        n2 = np.broadcast_to(ns, (len(rows), len(ns)))
        on = alive[rows]
        whole = costs.time(rows[0], n2, "block", np.where(on, counts[rows], 0.0), groups=False)
        tt[rows] = np.where(on, whole.total, np.inf)
        if tail is not None:
            comm, opt = costs.tail(rows[0], n2, "block", np.where(on, tail_counts[rows], 0.0))
            tail[rows] = np.where(on, comm + opt, np.inf)
    return tt, tail


def _longer_blocks(costs: StageCosts, ns: np.ndarray, k0: np.ndarray, start: np.ndarray,
                   time0: np.ndarray, tail0: np.ndarray) -> list[tuple]:
    """The counts a ``block`` stage may re-run whole beyond ``k0`` (the fewest that fit, or 0 where
    the stage fits without recompute; where ``start``; [stages, len(ns)]; ``time0``, ``tail0``:
    the fewest's times and tails, inf where there are none): one column per count more, each
    (time, tail, memory, count) [stages, len(ns)], inf where it cannot pay. One more
    layer re-run whole adds dT to the stage's time, so at least dT / v to the step
    (a T_max + sum T / v + tail_max), and lengthens the windows that hide the data-parallel
    reduction, which shortens the stage's tail by dL, the most the step can gain from it; dL does
    not grow with the count (exposed time is convex in its window). So a count pays only while
    dL > dT / v, and the first that does not loses to the one before, as does every larger
    count, whatever the other stages hold. Nothing when no count can pay: dT / v at least
    (1 - overlap_slowdown) times the windows' growth per layer (exposed time falls at most that
    fast), as on a pipeline without interleaving whose windows grow no faster than its time."""
    v = costs.plan.vp
    none, full = costs.mode("none"), costs.mode("full")
    grow = max(0.0, full.bwd.total - none.bwd.total) + max(0.0, full.fwd.total - none.fwd.total)
    if not costs.plan.dp_overlap or not start.any() or (full.layer.total - none.layer.total) / v >= (
            max(0.0, 1.0 - costs.eff.overlap_slowdown) * grow):
        return []
    out, alive = [], start.copy()
    fresh = start & ~np.isfinite(time0)         # from none: no recompute yet
    t_none, tail_none = _block_rows(costs, ns, k0, fresh, k0)
    last_t, last_tail = np.where(fresh, t_none, time0), np.where(fresh, tail_none, tail0)
    j = 1
    while True:
        kj = k0 + j
        alive &= kj <= ns - 1
        if not alive.any():
            return out
        tt, tail = _block_rows(costs, ns, kj, alive, kj)
        with np.errstate(invalid="ignore"):     # inf - inf where a count is out of play
            alive &= (last_tail - tail) > (tt - last_t) / v
        if not alive.any():
            return out
        counts = np.where(alive, kj, 0.0)
        out.append((np.where(alive, tt, np.inf), np.where(alive, tail, np.inf),
                    np.where(alive, costs.memory_table("block", ns, counts), np.inf), counts.astype(int)))
        last_t, last_tail, j = np.where(alive, tt, last_t), np.where(alive, tail, last_tail), j + 1


def _block_layers(costs: StageCosts, ns: np.ndarray, budget: float,
                  none: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """([stages, len(ns)]: the fewest layers a ``block`` stage of each layer count re-runs whole
    to fit in ``budget`` bytes, -1 where none is needed, as ``none`` fits, or where fewer than all
    of them do not suffice, as then ``full`` is the same stage; the memory table of those counts,
    None when every count is -1). Memory is linear in the count: each layer re-run whole keeps its
    input instead of its activations, in every micro-batch in flight; the count is then checked on
    the exact table (rounding) and raised by one where it falls short. Fewest is fastest, but for
    a longer backward window hiding more of the gradient reduction (:func:`_longer_blocks`).
    ``none``: the stages' memory without recompute ([stages, len(ns)])."""
    plan = costs.plan
    over = none > budget
    if not over.any():
        return np.full(none.shape, -1), None
    inflight = inflight_micro_batches(plan.pp, plan.vp, costs.micro_batches, np.arange(plan.pp, dtype=float))
    saved = (costs.mode("none").act_bytes - costs.mode("full").act_bytes) * inflight[:, None]
    need = none + costs.full_act_bytes - budget           # with the re-materialised layer
    if not (saved > 0).all():
        return np.full(none.shape, -1), None
    ks = np.maximum(np.ceil(need / saved), 1.0)
    ok = over & (ks < ns)
    table = costs.memory_table("block", ns, np.where(ok, ks, 0.0))
    short = ok & (table > budget)
    if short.any():
        ks = ks + short
        ok &= ks < ns
        table = costs.memory_table("block", ns, np.where(ok, ks, 0.0))
    if not ok.any():
        return np.full(none.shape, -1), None
    return np.where(ok, ks, -1.0).astype(int), table


def _min_plus(best: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """new[j] = min over n >= 1 of best[j - n] + cost[n], with the arg-min n (``cost[0]`` must be
    inf; where no n reaches j, new[j] is inf and its arg-min meaningless). Only the counts whose
    cost is finite are tried (a stage's caps leave few), the smallest n among equals."""
    L = len(best) - 1
    cols = np.flatnonzero(cost < np.inf)
    if not len(cols):
        return np.full(L + 1, np.inf), np.zeros(L + 1, dtype=int)
    padded = np.concatenate((np.full(L, np.inf), best))
    total = padded[(L + np.arange(L + 1))[:, None] - cols[None, :]] + cost[cols]   # [j, c]: best[j - n_c] + cost
    arg = np.argmin(total, axis=1)
    return total[np.arange(L + 1), arg], cols[arg]


def _splits(ok: np.ndarray, L: int) -> bool:
    """Whether the ``L`` layers split contiguously over the stages, stage ``i`` taking ``n``
    layers only where ``ok[i, n]`` (``ok``: [stages, L + 1], column 0 unused). Stage costs grow
    with the layer count, so the counts allowed under caps are usually a prefix 1..c per stage:
    then a split exists iff every c >= 1 and they sum to at least ``L``."""
    ok = ok[:, 1:]
    caps = ok.sum(axis=1)
    if not (ok[:, 1:] & ~ok[:, :-1]).any():        # no count allowed after one that is not
        return bool((caps >= 1).all() and caps.sum() >= L)
    reach = np.zeros(L + 1, dtype=bool)            # general case: reachability over the stages
    reach[0] = True
    for row in ok:
        nxt = np.zeros_like(reach)
        for n in np.flatnonzero(row) + 1:
            nxt[n:] |= reach[:L + 1 - n]
        reach = nxt
    return bool(reach[L])


def _smallest_cap(fastest: np.ndarray, t_caps: np.ndarray, L: int) -> int:
    """The index in ``t_caps`` (sorted, some cap feasible) of the smallest stage-time cap under
    which the ``L`` layers still split over the stages, ``fastest[i, n]`` being stage ``i``'s
    fastest time with ``n`` layers (inf where nothing fits). Where each stage's time does not
    fall as it takes more layers, the counts a cap allows are a prefix of each row, and the
    smallest cap is read off directly: every stage must take one layer, and the caps must allow
    ``L`` (stage, count) cells in all, the L-th smallest time. Otherwise feasibility, which
    only grows with the cap, is bisected."""
    rows = fastest[:, 1:]
    if (rows[:, 1:] >= rows[:, :-1]).all():
        cells = np.sort(rows, axis=None)
        return int(np.searchsorted(t_caps, max(rows[:, 0].max(), cells[L - 1])))
    lo, hi = 0, len(t_caps) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _splits(fastest <= t_caps[mid], L) else (mid + 1, hi)
    return lo


def _solve_layout(costs: StageCosts, opts: _Options, weights: tuple[float, float] | None = None):
    """Exact optimum of one layout: (objective, counts, recomputes, layers each block stage
    re-runs whole) or None if nothing fits.
    ``weights``: (a, v) replacing the layout's critical-stage weight and interleaving in the
    objective a T_max + sum T / v + tail (a bound over several vp: the smallest a, the largest v)."""
    pp, L = costs.plan.pp, costs.model.layers
    m, v = costs.micro_batches, costs.plan.vp
    a = critical_weight(m, pp, v)
    if weights is not None:
        a, v = weights
    ok = opts.fits & np.isfinite(opts.time)
    if not ok.any():
        return None

    def run(t_cap: float, tail_cap: float):
        """Smallest sum of stage times with every stage within both caps, and its solution."""
        allowed = ok & (opts.time <= t_cap) & (opts.tail <= tail_cap)
        masked = np.where(allowed, opts.time, np.inf)
        stage_cost, stage_mode = masked.min(axis=2), masked.argmin(axis=2)
        acc = np.full(L + 1, np.inf)
        acc[0] = 0.0
        args = []
        for i in range(pp):
            acc, arg = _min_plus(acc, stage_cost[i])
            args.append(arg)
        if not np.isfinite(acc[L]):
            return None
        counts, j = [], L
        for i in reversed(range(pp)):
            counts.append(int(args[i][j]))
            j -= counts[-1]
        counts.reverse()
        ks = [int(stage_mode[i, n]) for i, n in enumerate(counts)]
        t_max = max(opts.time[i, n, k] for i, (n, k) in enumerate(zip(counts, ks, strict=False)))
        tail_max = max(opts.tail[i, n, k] for i, (n, k) in enumerate(zip(counts, ks, strict=False)))
        return float(acc[L]), float(t_max), float(tail_max), counts, ks

    t_caps = np.unique(opts.time[ok])
    tails = np.unique(opts.tail[ok])
    if not _splits(ok.any(axis=2), L):
        return None
    lo = _smallest_cap(np.where(ok, opts.time, np.inf).min(axis=2), t_caps, L)
    widest = run(t_caps[-1], math.inf)
    floor = widest[0] / v + tails[0]          # no solution has a smaller sum or tail
    best_obj, best = math.inf, None
    for t_cap in t_caps[lo:]:
        if a * t_cap + floor >= best_obj:
            break
        sol = run(t_cap, math.inf)
        # walk the tail cap down through the tails the optimal sums actually reach
        while sol is not None:
            total, t_max, tail_max, counts, ks = sol
            obj = a * t_max + total / v + tail_max
            if obj < best_obj:
                best_obj, best = obj, (counts, ks)
            lower = tails[tails < tail_max]
            if not len(lower) or a * t_cap + total / v + tails[0] >= best_obj:
                break
            sol = run(t_cap, lower[-1])
    counts, ks = best
    fulls = tuple(int(opts.full_layers[i, n, k]) if opts.modes[k] == "block" and opts.full_layers is not None else 0
                  for i, (n, k) in enumerate(zip(counts, ks, strict=True)))    # None: a bound's merged tables
    return best_obj, tuple(counts), tuple(opts.modes[k] for k in ks), fulls


# --- layouts -----------------------------------------------------------------------------------------
def _depths(model: Model, devices: int, tp: int, options: PlacementOptions, cp: int = 1) -> tuple[int, ...]:
    """Candidate pipeline depths: the listed ones, or every divisor of devices/(tp cp) that is at
    most the layer count (a deeper pipeline has an empty stage); O(layers), whatever the devices."""
    return options.pp or _divisors(devices // (tp * cp), model.layers)


def _divisors(n: int, cap: int) -> tuple[int, ...]:
    """The divisors of ``n`` that are at most ``cap``, in order; O(min(n, cap))."""
    return tuple(d for d in range(1, min(n, cap) + 1) if n % d == 0)


MAX_AUTO_MBS = 128       # assumption: the largest micro-batch searched by default without a pipeline;
                         # the published runs go to 104 sequences (llm-foundry's MPT-125M under FSDP)
MAX_PIPELINE_MBS = 8     # assumption: ... and with one, whose bubble grows as micro-batches grow; the
                         # published pipelined recipes (Megatron, NeMo, MaxText) use 1 to 8
MAX_AUTO_VP = 8          # assumption: the most chunks per stage searched by default; Megatron's
                         # and NeMo's published recipes use at most 8 (Llama 3 405B: pp 16, vp 8)
CP_FROM_SEQ = 16384      # assumption: context parallelism is searched from this sequence length on
                         # (Llama 3 trains 8K tokens at cp 1 and 128K at cp 16, Dubey et al. 2024)
CP_MIN_TOKENS = 4096     # ... with at least this many tokens per rank


def mbs_values(options: PlacementOptions, replica_batch: int, pp: int = 1) -> tuple[int, ...]:
    """Micro-batches searched where a data-parallel replica runs ``replica_batch`` sequences a step
    through ``pp`` stages: the listed values, or every divisor of it up to :data:`MAX_AUTO_MBS`
    without a pipeline (data-parallel and FSDP runs take the largest that fits) and up to
    :data:`MAX_PIPELINE_MBS` with one (its bubble is a share of (pp - 1) / micro-batches)."""
    if options.mbs:
        return tuple(sorted(set(options.mbs)))
    return _divisors(replica_batch, MAX_AUTO_MBS if pp == 1 else MAX_PIPELINE_MBS)


def all_mbs_values(devices: int, global_batch: int, options: PlacementOptions) -> tuple[int, ...]:
    """Every micro-batch some layout of ``devices`` may search (:func:`mbs_values` over the
    data-parallel widths dividing the global batch)."""
    if options.mbs:
        return tuple(sorted(set(options.mbs)))
    widths = {d for i in range(1, math.isqrt(devices) + 1) if devices % i == 0 for d in (i, devices // i)}
    return tuple(sorted({m for dp in widths if global_batch % dp == 0
                         for m in mbs_values(options, global_batch // dp)}))


def vp_values(model: Model, pp: int, options: PlacementOptions) -> tuple[int, ...]:
    """Interleaving searched at depth ``pp``: the listed values, or every vp Megatron accepts for
    the layer count up to :data:`MAX_AUTO_VP`, uneven splits included (pp > 1 and pp x vp at most
    the layers + 2, the embedding and the loss taking a chunk each); 1 for a hybrid, which NeMo runs
    without interleaving."""
    if options.vp:
        return tuple(sorted(set(options.vp)))
    if model.hybrid:
        return (1,)
    return (1,) + tuple(v for v in range(2, MAX_AUTO_VP + 1) if pp > 1 and pp * v <= model.layers + 2)


def cp_values(model: Model, options: PlacementOptions) -> tuple[int, ...]:
    """Context parallelism searched: the listed values, or 1 and, for a sequence of at least
    :data:`CP_FROM_SEQ` tokens, every power of two leaving each rank :data:`CP_MIN_TOKENS` tokens."""
    if options.cp:
        return tuple(sorted(set(options.cp)))
    if model.seq_len < CP_FROM_SEQ or model.hybrid:   # a hybrid's Mamba-2 context parallelism: not modelled
        return (1,)
    return tuple(2 ** k for k in range(0, 11) if model.seq_len % 2 ** k == 0
                 and model.seq_len // 2 ** k >= CP_MIN_TOKENS)


def etp_values(model: Model, tp: int, options: PlacementOptions) -> tuple[int, ...]:
    """Expert tensor parallelism searched at width ``tp``: the listed values; else 1 for a dense
    model and, for a mixture of experts, 1 and tp (Megatron-Core's default etp is tp)."""
    if options.etp:
        return tuple(sorted(set(options.etp)))
    return tuple(sorted({1, tp})) if model.moe else (1,)


def routing_values(model: Model, options: PlacementOptions) -> tuple[str, ...]:
    """MoE routings searched: the listed ones, or the model's own ("": capacity when the model has
    a capacity factor, else dropless); a dense model has none."""
    if not model.moe:
        return ("",)
    return tuple(dict.fromkeys(options.routing)) if options.routing else ("",)


def dispatcher_values(model: Model, options: PlacementOptions) -> tuple[str, ...]:
    """MoE token dispatchers searched: the listed ones (``alltoall`` as the plan's default, ""),
    or the default; a dense model has none."""
    if not (model.moe and options.dispatcher):
        return ("",)
    return tuple(dict.fromkeys("" if d == "alltoall" else d for d in options.dispatcher))


def ep_overlap_values(model: Model, options: PlacementOptions) -> tuple[bool, ...]:
    """MoE all-to-all overlap searched: the listed settings, or off; a dense model has none."""
    return tuple(dict.fromkeys(options.ep_overlap)) if model.moe and options.ep_overlap else (False,)


def exchange_values(options: PlacementOptions, cp: int) -> list[tuple[str, int]]:
    """(cp_comm, cp_a2a) searched at context-parallel width ``cp``: each listed exchange, ``a2a+p2p``
    with every all-to-all group it can run (:func:`phaze.plan.cp_a2a_groups`); at cp = 1 the first
    exchange alone (there is nothing to exchange)."""
    if cp == 1:
        return [(options.cp_comms[0], 1)]
    return [(c, a) for c in options.cp_comms for a in (cp_a2a_groups(cp) if c == "a2a+p2p" else (1,))]


def _plan_of(options: PlacementOptions, tp: int, pp: int, mbs: int, vp: int = 1, cp: int = 1, zero: int = 0,
             offload: str = "", ep: int = 1, etp: int = 1, routing: str = "", dp_shard: int = 0, cp_comm: str = "p2p",
             cp_a2a: int = 1, dispatcher: str = "", ep_overlap: bool = False, pipe_schedule: str = "1f1b") -> Plan:
    """The base plan of one layout of ``options`` (no recompute, or full beside an offload)."""
    sp = options.sp and tp > 1
    return Plan(tp=tp, pp=pp, mbs=mbs, vp=vp, cp=cp, zero=zero, sp=sp, offload=offload,
                recompute="full" if offload else "none",
                attention=options.attention, optimizer=options.optimizer,
                reduce_fp32=options.reduce_fp32, memory_reserve=options.memory_reserve,
                ep=ep, etp=etp, routing=routing, tp_async=options.tp_async, tp_overlap=options.tp_overlap,
                dp_overlap=hides_dp_reduction(options.dp_overlap, options.dp_overlap_flat, pp, sp),
                loss=options.loss, recompute_modules=options.recompute_modules,
                grad_accum_fusion=options.grad_accum_fusion, dp_shard=dp_shard,
                cp_comm=cp_comm, cp_a2a=cp_a2a, dispatcher=dispatcher, ep_overlap=ep_overlap,
                fsdp_pp=options.fsdp_pp, fp8_params=options.fp8_params,
                pipe_p2p=options.pipe_p2p, pipe_schedule=pipe_schedule)


def layouts(model: Model, devices: int, global_batch: int, options: PlacementOptions, chip: Chip | None = None,
            pipe_schedule: str = "1f1b"):
    """Every valid layout of the option space under ``pipe_schedule``, as base plans. With
    ``chip``, of the shard groupings (``dp_shard``) that give a layout the same group of ranks (and
    the same expert layout, which names its dispatcher) only the first is kept: they are the same plan."""
    zeros = options.zero_stages
    dispatchers, overlaps = dispatcher_values(model, options), ep_overlap_values(model, options)
    same_plans = chip is not None and len(options.dp_shards) > 1
    for tp in sorted(set(options.tp)):
        if tp > devices or devices % tp:
            continue
        for cp in cp_values(model, options):
            if devices % (tp * cp):
                continue
            for pp in sorted(set(_depths(model, devices, tp, options, cp))):
                if devices % (tp * pp * cp):
                    continue
                for zero in zeros:
                    if zero and 0 in zeros and devices // (tp * pp) == 1 and not model.moe:
                        continue      # a dense model's dp x cp is one rank: the same plans as zero=0
                    comms = exchange_values(options, cp)
                    shards = options.dp_shards if zero else options.dp_shards[:1]
                    seen: set = set()
                    dp = devices // (tp * pp * cp)
                    for vp, mbs, ep, etp, routing, (comm, a2a), shard, disp, overlap, off in itertools.product(
                            vp_values(model, pp, options),
                            mbs_values(options, global_batch // dp, pp) if global_batch % dp == 0 else (),
                            expert_widths(model, options),
                            etp_values(model, tp, options), routing_values(model, options), comms, shards,
                            dispatchers, overlaps, options.offloads):
                        plan = _plan_of(options, tp, pp, mbs, vp, cp, zero, off, ep, etp, routing, shard, comm,
                                        a2a, disp, overlap, pipe_schedule)
                        if options.shared_overlap:   # where Megatron-Core allows it (no stage recomputes yet)
                            plan = replace(plan, shared_overlap=not (shared_overlap_conflict(plan, model.shared_experts)
                                                                     or "shared_experts" in options.recompute_modules))
                        if zero and 0 in zeros and not shards_anything(model, plan, devices):
                            continue      # experts with one expert data-parallel rank too: as zero=0
                        try:
                            check_plan(model, devices, global_batch, plan)
                        except ConfigError:
                            continue
                        if same_plans:
                            same = (vp, mbs, ep, etp, routing, comm, a2a, overlap, off,
                                    shard_ranks(plan, devices, chip), expert_layout(model, plan, chip))
                            if same in seen:
                                continue
                            seen.add(same)
                        yield plan


def shards_anything(model: Model, plan: Plan, devices: int) -> bool:
    """Whether ZeRO has ranks to shard over in ``plan``: the dense state's shard group spans the
    data- and context-parallel ranks (the distributed optimizer's and FSDP's group with context
    parallelism), a mixture of experts' state the expert data-parallel ranks, which need not be
    data-parallel ones (tp x cp ranks re-folded as ep x etp x edp). Until 2026-12-07 a layout with
    one data-parallel rank skipped ZeRO outright, losing the plans that shard over cp or edp."""
    return plan.dp(devices) * plan.cp > 1 or (model.moe and plan.edp(devices) > 1)


def expert_widths(model: Model, options: PlacementOptions) -> tuple[int, ...]:
    """Candidate ep: the listed ones; else 1 for a dense model and the powers of two dividing the
    experts for a mixture of experts (a small set; invalid ones are skipped by the plan check)."""
    if options.ep:
        return tuple(sorted(set(options.ep)))
    if not model.moe:
        return (1,)
    return tuple(e for e in (2 ** i for i in range(model.experts.bit_length())) if model.experts % e == 0)


def _listing(values, limit: int = 12) -> str:
    values = sorted(set(values))
    if len(values) > limit:
        return ", ".join(map(str, values[:limit // 2])) + ", ..., " + ", ".join(map(str, values[-2:]))
    return ", ".join(map(str, values))


# plan fields that ``phaze place`` sets with a flag of the same name (--ep, --recompute-modules, ...)
_PLACE_FLAGS = ("tp", "pp", "vp", "cp", "mbs", "ep", "etp", "offload", "recompute_modules", "zero", "dp_shard",
                "cp_comm", "pipe_schedule", "fsdp_pp", "fp8_params", "attention", "dispatcher", "ep_overlap")


def tp_problem(model: Model, devices: int, tp: int, options: PlacementOptions) -> str:
    """Why tensor parallelism of width ``tp`` cannot split ``model`` on ``devices`` ('' when it can):
    the heads, KV heads, FFN width and Mamba-2 heads and groups of the layer kinds the model has
    (what :func:`phaze.plan_check.check_plan` asks), the devices, and with sequence parallelism the sequence."""
    attention, ffn = model.attention_layers > 0, model.has_ffn
    if (attention and model.heads % tp) or (ffn and model.ffn_hidden % tp):
        return f"{tp} does not divide the heads ({model.heads}) and the FFN width ({model.ffn_hidden})"
    if attention and model.kv_heads % tp and tp % model.kv_heads:
        return f"{tp} neither divides nor is a multiple of the KV heads ({model.kv_heads})"
    if "M" in model.hybrid_pattern and (model.mamba_heads % tp or model.mamba_groups % tp):
        return f"{tp} does not divide the Mamba-2 heads ({model.mamba_heads}) and groups ({model.mamba_groups})"
    if devices % tp:
        return f"{tp} does not divide the devices ({devices})"
    if options.sp and tp > 1 and model.seq_len % tp:
        return f"{tp} does not divide the sequence length ({model.seq_len}) (sequence parallelism)"
    return ""


def no_layout_reason(model: Model, devices: int, global_batch: int, options: PlacementOptions) -> tuple[str, str]:
    """Why no layout of the options is valid: (the flag at fault, the reason with the nearest
    values that work). Checked in the order a layout is built: tp, pp, vp, the global batch."""
    def problem(tp: int) -> str:
        return tp_problem(model, devices, tp, options)

    tps = [tp for tp in sorted(set(options.tp)) if not problem(tp)]
    if not tps:
        good = [t for t in _divisors(devices, 64) if not problem(t)]
        return "--tp", ("no tensor-parallel width works: " + "; ".join(problem(t) for t in sorted(set(options.tp)))
                        + f"; allowed: {_listing(good)}")
    eps = [e for e in expert_widths(model, options) if not model.moe or model.experts % e == 0]
    if not eps:
        good = [e for e in range(1, model.experts + 1) if model.experts % e == 0 and devices % e == 0]
        return "--ep", (f"no expert-parallel width works: none of {_listing(options.ep)} divides the experts "
                        f"({model.experts}); allowed: {_listing(good)}")
    structural = []      # (tp, pp, vp) that build a layout whatever the batch
    depth_ok = set()
    for tp in tps:
        for pp in _depths(model, devices, tp, options):
            if (devices // tp) % pp or pp > model.layers:
                continue
            depth_ok.add((tp, pp))
            for vp in vp_values(model, pp, options):
                if pp * vp <= model.layers + (2 if vp > 1 else 0) and (vp == 1 or pp > 1):
                    structural.append((tp, pp, vp))
    if not depth_ok:
        good = sorted({d for tp in tps for d in _divisors(devices // tp, model.layers)})
        bad = "; ".join(f"{pp} " + (f"exceeds the layers ({model.layers})" if pp > model.layers else
                                    f"does not divide devices/tp ({', '.join(str(devices // t) for t in tps)})")
                        for pp in sorted(set(options.pp)))
        return "--pp", f"no pipeline depth works: {bad}; allowed (with tp {_listing(tps)}): {_listing(good)}"
    if not structural:
        return "--vp", (f"interleaving needs pp > 1 and pp*vp at most the layers ({model.layers}) + 2; with the "
                        f"depths {_listing(pp for _, pp in depth_ok)} no vp of {_listing(options.vp or (1,))} does; "
                        f"allowed: vp = 1, or a vp with pp*vp <= {model.layers + 2}")
    mbss = options.mbs or (1,)      # by default any divisor of a replica's batch: 1 always is
    grains = sorted({(devices // (tp * pp)) * mbs for tp, pp, _ in structural for mbs in set(mbss)})
    if not any(global_batch % g == 0 for g in grains):
        b = global_batch
        below = max((b // g * g for g in grains if b // g), default=None)
        above = min(-(-b // g) * g for g in grains)
        nearest = " or ".join(f"{x:,}" for x in (below, above) if x)
        dps = sorted({devices // (tp * pp) for tp, pp, _ in structural})
        most = max(tp * pp for tp, pp, _ in structural)
        more = (f"; or use at most {b * most:,} devices (dp <= {b:,} with tp*pp <= {most})"
                if b < min(dps) else "")
        mbs_text = _listing(options.mbs) if options.mbs else "any"
        return "--global-batch", (f"{b:,} is not a multiple of dp*mbs for any layout (dp = devices/(tp*pp) is "
                                  f"{_listing(dps)}, mbs {mbs_text}); nearest that work: {nearest}{more}")
    off = options.offload if isinstance(options.offload, str) else ""     # place searches one at a time
    cps = [cp for cp in cp_values(model, options) if cp > 1] or [1]    # a listed cp > 1 first: its reason
    if not any(devices % (tp * pp * cp) == 0 for tp, pp, _ in structural for cp in cps):
        good = sorted({c for tp, pp, _ in structural for c in _divisors(devices // (tp * pp), devices)})
        return "--cp", (f"no context-parallel width of {_listing(cps)} divides the devices left by tp*pp "
                        f"({_listing(devices // (tp * pp) for tp, pp, _ in structural)}); allowed: {_listing(good)}")
    first = None        # the first remaining reason (context, sequence, offload, ...), if every probe has one
    for tp, pp, vp in structural:
        for cp, mbs in itertools.product(cps, sorted(set(mbss))):
            if devices % (tp * pp * cp):
                continue
            try:
                check_plan(model, devices, global_batch, _plan_of(options, tp, pp, mbs, vp, cp, offload=off, ep=eps[0],
                                                                  cp_comm=options.cp_comms[0]))
            except ConfigError as exc:
                first = first or exc
                continue
            return "--tp", "no valid layout in the options"    # a probe runs: the refusal is in what it leaves out
    field = "recompute_modules" if first.field == "recompute" and options.recompute_modules else first.field
    if field in _PLACE_FLAGS:       # a flag of place's own
        return "--" + field.replace("_", "-"), first.message
    return first.source, (f"field '{first.field}': " if first.field else "") + first.message


@lru_cache(maxsize=65536)
def _allowed_n(L: int, pp: int, v: int) -> tuple[int, ...]:
    """The layer counts a stage may hold: without interleaving 1 .. L - pp + 1; interleaved, chunks
    of c or c + 1 layers (c = L // (pp v)), so a stage's v chunks hold v c .. v c + v layers (c = 0:
    pp v is the layers + 1 or 2, the embedding and loss chunks hold none)."""
    c = L // (pp * v)
    return tuple(sorted(range(v * c if c else v - 1, v * c + v + 1) if v > 1 else range(1, L - pp + 2)))


def _fits_somehow(opts: _Options, L: int) -> bool:
    """Whether some contiguous split, each stage in some mode, fits in memory (what the DP finds
    feasible)."""
    return _splits((opts.fits & np.isfinite(opts.time)).any(axis=2), L)


def _bound_costs(costs: StageCosts, modes: tuple[str, ...]) -> StageCosts:
    """``costs`` with every recompute mode's layer costs replaced by lower bounds
    (:func:`phaze.stage.mode_cost_bounds`): every stage assignment's step time under them is a
    lower bound of its step time with the optimal layer schedules."""
    key = mode_layout(costs.plan)
    bound = {r: mode_cost_bounds(costs.model, costs.chip, costs.devices, key, costs.eff, r)
             for r in layer_modes(modes)}
    return replace(costs, _modes=bound)


def _quick_bound(costs: StageCosts, modes: tuple[str, ...], weights: tuple[float, float] | None = None) -> float:
    """A closed-form lower bound of a layout's step time under bound costs (no DP, no memory):
    the stage times sum to at least every layer at its cheapest mode plus sends and edges, the
    slowest is at least their mean, and tails are non-negative. ``weights``: (a, v) as in
    :func:`_solve_layout`."""
    pp, L, m, v = costs.plan.pp, costs.model.layers, costs.micro_batches, costs.plan.vp
    a = critical_weight(m, pp, v)
    if weights is not None:
        a, v = weights
    layer = min(costs.mode(r).layer.total for r in layer_modes(modes))
    total = (L + costs.model.mtp_layers) * layer + pp * costs.send_s + costs.embedding.total + costs.head.total
    edge = layer + costs.send_s + max(costs.embedding.total, costs.head.total)
    return a * max(total / pp, edge if pp > 1 else total) + total / v


def searched_modes(model: Model, options: PlacementOptions) -> tuple[str, ...]:
    """The stage recompute modes a placement searches: ``options.recompute`` in
    :data:`PLAN_RECOMPUTE` order, without torchtitan's per-op policy where ``model`` cannot run it
    (a preset that maps selective recompute to it then searches none, full and block). ``block``
    brings ``none`` and ``full``, the ends of its range: a block stage re-runs the fewest of its
    layers whole that fit, none of them where the stage fits without, all of them at the most."""
    wanted = set(options.recompute) | ({"none", "full"} if "block" in options.recompute else set())
    return tuple(r for r in PLAN_RECOMPUTE if r in wanted and (r != "op" or runs_op_recompute(model)))


def _variant_key(plan: Plan, zero: bool) -> tuple:
    """A layout without its interleaving (and without its ZeRO stage unless ``zero``): the
    fields :func:`layouts` varies, as a tuple (cheaper to build and hash than a Plan)."""
    return (plan.tp, plan.pp, plan.cp, plan.mbs, plan.ep, plan.etp, plan.routing, plan.cp_comm, plan.cp_a2a,
            plan.dp_shard, plan.dispatcher, plan.ep_overlap, plan.zero if zero else None)


def _group_weights(info: dict, members) -> tuple[float, float]:
    """(the smallest critical-stage weight, the largest vp) over a group's layouts."""
    a = min(critical_weight(info[i][1].micro_batches, info[i][0].pp, info[i][0].vp) for i in members)
    return a, max(info[i][0].vp for i in members)


def _even_bound(ts: np.ndarray, tails: np.ndarray, m: int, pp: int, v: int) -> float:
    """The 1F1B step of stage times ``ts`` and tails ``tails`` (the step time of
    :func:`phaze.step.step_time_of`): a lower bound of the even split's step under bound times."""
    return critical_weight(m, pp, v) * ts.max() + ts.sum() / v + tails.max()


def _deferred_baseline(base: Plan, costs: StageCosts, sibling: list, modes, base_cands: list, index: int) -> None:
    """The even-split, one-mode (Megatron-style) candidate of an interleaved layout whose tables
    are not built: its stage times at the even split are its vp = 1 sibling's lower bounds plus
    the extra sends, its memory is computed at the even split alone."""
    scosts, sopts = sibling[1], sibling[5]
    pp, v = base.pp, base.vp
    even = stage_split(costs.model, base)
    rows = np.arange(pp)
    ns = np.asarray(even, dtype=float)
    reserve = memory_reserve_bytes(costs.chip, costs.plan.memory_reserve)
    lb = _bound_costs(costs, modes)         # activation bytes without solving a schedule
    for k, r in enumerate(modes):
        if r == "block":      # not one mode for every stage
            continue
        mem = lb.memory_table(r, ns)[rows, rows]
        if not (mem + reserve <= costs.chip.hbm_bytes).all():
            continue
        ts = sopts.time[rows, even, k] + (costs.send_s - scosts.send_s)
        tails = sopts.tail[rows, even, k]
        if not np.isfinite(ts).all():
            continue
        base_cands.append((_even_bound(ts, tails, costs.micro_batches, pp, v), index, replace(base, recompute=r)))
        return


def place(model: Model, chip: Chip, devices: int, global_batch: int,
          options: PlacementOptions = PlacementOptions(), eff: Efficiency = IDEAL,
          top: int = 5, progress=None, with_baseline: bool = True) -> PlacementResult:
    """The best plan (and the ``top`` best, one per layout) of ``model`` on ``devices`` chips
    (:func:`_place`). With activation offloads among ``options.offloads``, each is searched on
    its own, its plans recomputing every stage in full (what offload runs beside), and the ranked
    plans merged; the baseline is the first search's (the one without offload, when listed)."""
    offloads = options.offloads
    for key, got, allowed in (("pipe_schedule", options.pipe_schedules, PIPE_SCHEDULES),
                              ("offload", offloads, ("",) + OFFLOADS)):
        if not got or any(x not in allowed for x in got):
            raise ConfigError("PlacementOptions", key, f"must be one or more of "
                              f"{', '.join(x or 'none' for x in allowed)}, got {got!r}")
    if offloads == ("",):
        return _place(model, chip, devices, global_batch, options, eff, top, progress, with_baseline)
    bad = offload_error(model, chip, options)
    if bad:
        raise ConfigError("--offload", None, bad)
    parts, done = [], [0, 0]

    def step(d: int, t: int) -> None:       # one progress count over the searches
        progress(done[0] + d, done[1] + t)

    for i, one in enumerate(offload_searches(options)):
        res = _place(model, chip, devices, global_batch, one, eff, top, step if progress else None,
                     with_baseline and i == 0)
        done[0] += res.layouts_feasible
        done[1] += res.layouts_feasible
        parts.append(res)
    first = parts[0]
    ranked = tuple(sorted((p for r in parts for p in r.top), key=lambda p: -p.result.tokens_per_s)[:max(1, top)])
    why = next(((r.infeasible_reason, r.infeasible_source) for r in parts if r.infeasible_reason), ("", ""))
    return PlacementResult(ranked[0] if ranked else None, ranked, first.baseline,
                           sum(r.layouts_considered for r in parts), sum(r.layouts_feasible for r in parts),
                           sum(r.solve_time_s for r in parts), "" if ranked else why[0],
                           sum(r.layouts_solved for r in parts), "" if ranked else why[1], first.baseline_kind)


def offload_error(model: Model, chip: Chip, options: PlacementOptions) -> str:
    """Why the activation offloads of ``options`` cannot be searched on ``chip`` ('' when they
    can, or when there are none): they need the chip's host link and a full recompute to run beside."""
    wanted = [o for o in options.offloads if o]
    if wanted and not chip.host_bandwidth_bytes_per_s:
        return (f"{'/'.join(wanted)} sends activations over the host link, which {chip.name}'s chip file does "
                f"not give (host_bandwidth_bytes_per_s); allowed: none on this chip")
    if wanted and "full" not in searched_modes(model, options):
        return ("an offload runs beside a full recompute of every stage: needs full (or block) among the recompute "
                "modes searched; allowed: none, or add full")
    return ""


def offload_searches(options: PlacementOptions) -> tuple[PlacementOptions, ...]:
    """The searches :func:`place` runs, one for each activation offload of ``options.offloads``
    (a plan that offloads recomputes every stage in full), each with that offload alone."""
    return tuple(replace(options, offload=off, recompute=("full",) if off else options.recompute)
                 for off in options.offloads)


def _place(model: Model, chip: Chip, devices: int, global_batch: int, options: PlacementOptions, eff: Efficiency,
           top: int, progress, with_baseline: bool) -> PlacementResult:
    """The best plan (and the ``top`` best, one per layout) of ``model`` on ``devices`` chips,
    with at most one activation offload (``options.offload``).

    Bound first, solve what can win: every layout gets a lower bound of its best step time from
    lower bounds of the layer schedules (no solver); layouts are then solved exactly, best
    bound first, until no remaining bound can reach the ``top`` best found (nor the baseline).
    The result is exactly what solving every layout returns (``options.exhaustive`` does that).
    With ``dualpipe`` among ``options.pipe_schedules``, each layout DualPipe can run is also
    ranked at its even split with one recompute mode for every stage (:func:`_dualpipe_candidates`:
    its step has no closed form for the dynamic program), evaluated best bound first while a
    bound can enter the top; without ``1f1b`` only those are ranked.
    ``progress(done, total)``, if given, is called as layouts are solved or ruled out.
    ``with_baseline``: also score the Megatron-style baseline (a design search, which keeps only
    the best plan, leaves it out: it may need layer schedules of its own)."""
    chip = chip.with_execution(options.execution)
    start = time.perf_counter()
    modes = searched_modes(model, options)
    if not modes:
        raise ConfigError("--recompute", None, f"must list at least one of {', '.join(PLAN_RECOMPUTE)}")
    bad = fp8_params_error(model, "off") if options.fp8_params else None
    if bad:
        raise ConfigError("--fp8-params", None, bad)
    bad = optimizer_error(model, options.optimizer, options.fp8_params, "adam-megatron")
    if bad:
        raise ConfigError("PlacementOptions", "optimizer", bad)
    keep = max(1, top)
    tokens = global_batch * model.seq_len
    exhaustive = options.exhaustive
    queue: list = []        # (bound, index, stage): 0 quick bound, 1 DP bound (of a group), 2 solve,
                            # 3 an interleaved variant's closed-form bound (its tables not built)
    info: dict = {}         # index -> (base, costs, bound costs, allowed_n, even, DP bound solution)
    groups: dict = {}       # the layout without its ZeRO stage -> indices of its variants
    base_cands: list = []   # (bound, index, plan) of the even-split, one-mode baselines
    tail_cache: dict = {}   # stage tails over every layer count, shared by a layout's vp variants
    closest = None
    considered = feasible = 0
    flat: dict = {}         # a layout without interleaving -> its index (if some split fits)
    plain: set = set()      # the layouts without interleaving the space has (layouts() yields them first)
    late_base: list = []    # interleaved layouts whose Megatron-style candidate is built on demand
    for base in layouts(model, devices, global_batch, options, chip):
        considered += 1
        L, pp = model.layers, base.pp
        if base.vp == 1:
            plain.add(_variant_key(base, True))
        # bounded through its vp = 1 sibling, where the space has it (an all-to-all overlap needs
        # interleaving under a pipeline: no sibling, the layout is built on its own)
        interleaved = base.vp > 1 and not exhaustive and _variant_key(base, True) in plain
        if interleaved and _variant_key(base, True) not in flat:
            continue            # nothing fits even without interleaving: nothing fits with it
        costs = stage_costs(model, chip, devices, global_batch, layout_of(base), eff)
        even = stage_split(model, base)
        allowed_n = _allowed_n(L, pp, base.vp)
        if interleaved:
            # interleaved: bounded through its vp = 1 sibling, its tables built only if that bound
            # can win (the sibling's times are no larger, its memory no larger, its splits a superset)
            sib = flat[_variant_key(base, True)]
            late_base.append((base, costs, sib, considered))
            info[considered] = [base, costs, None, allowed_n, even, None]
            groups.setdefault(_variant_key(base, False), []).append(considered)
            continue
        lb_costs = costs if exhaustive else _bound_costs(costs, modes)
        opts = _options(lb_costs, modes, allowed_n, tail_cache, bound=True)   # memory does not depend on the bounds
        # the Megatron-style plan: even split, one recompute mode for every stage
        for k, r in enumerate(modes):
            if r != "block" and opts.fits[np.arange(pp), even, k].all():
                ts, tails = opts.time[np.arange(pp), even, k], opts.tail[np.arange(pp), even, k]
                base_cands.append((_even_bound(ts, tails, lb_costs.micro_batches, pp, base.vp), considered,
                                   replace(base, recompute=r)))
                break
        if not _fits_somehow(opts, L):
            for k, r in enumerate(modes):
                if r == "block":    # between none and full: full is closer
                    continue
                i_max = max(range(pp), key=lambda i: opts.memory[i, even[i], k])
                need = opts.memory[i_max, even[i_max], k]
                if closest is None or need < closest[0]:
                    closest = (need, replace(base, recompute=r), i_max)
            continue
        feasible += 1
        info[considered] = [base, costs, lb_costs, allowed_n, even, opts]
        if base.vp == 1:
            flat[_variant_key(base, True)] = considered
        groups.setdefault(_variant_key(base, False), []).append(considered)
    # the ZeRO and vp variants of a layout share their layer times and differ in tails, sends,
    # memory and the pipeline's weights: one DP on the element-wise smallest times and tails of the
    # built (vp = 1) variants, with what fits in any of them, and the smallest critical weight and
    # largest vp of all, bounds them all; a group is split only if that bound can win
    group_of: dict = {}     # a group's first built variant -> (its variants, their pipeline weights)
    for members in groups.values():
        built = [i for i in members if info[i][5] is not None]
        if not built:
            continue
        weights = _group_weights(info, members)
        quick = 0.0 if exhaustive else min(_quick_bound(info[i][2], modes, weights) for i in built)
        heapq.heappush(queue, (quick, built[0], 0))
        group_of[built[0]] = (members, weights)
    heap: list = []         # the `keep` best (tokens/s, index, Placement) solved so far
    solved_n = 0
    if progress:
        progress(0, feasible)

    def beaten(bound: float) -> bool:
        """No layout whose step time is at least ``bound`` can enter the top ``keep``."""
        return (not exhaustive and len(heap) >= keep and bound > 0
                and tokens / (bound * _SLACK) < heap[0][0])

    if "1f1b" not in options.pipe_schedules:
        queue = []          # 1F1B's layouts were built for the baseline and the reason nothing fits
        considered = feasible = 0
    while queue:
        bound, idx, stage = heapq.heappop(queue)
        if beaten(bound):
            break
        base, costs, lb_costs, allowed_n, even, _ = info[idx]
        pp = base.pp
        if stage == 0:
            members, weights = group_of[idx]
            if exhaustive:
                for i in members:
                    heapq.heappush(queue, (0.0, i, 2))
                continue
            each = [info[i][5] for i in members if info[i][5] is not None]
            if len(each) == 1:
                both = each[0]
            else:
                both = _Options(np.minimum.reduce([o.time for o in each]), np.minimum.reduce([o.tail for o in each]),
                                np.logical_or.reduce([o.fits for o in each]), each[0].memory, each[0].modes)
            lb = _solve_layout(lb_costs, both, weights)
            heapq.heappush(queue, (lb[0], idx, 1 if len(members) > 1 else 2))
            continue
        if stage == 1:      # the group's bound can still win: bound each variant on its own,
            for i in group_of[idx][0]:     # first in closed form (an interleaved one: no tables yet)
                if info[i][2] is None:
                    info[i][2] = _bound_costs(info[i][1], modes)
                heapq.heappush(queue, (max(bound, _quick_bound(info[i][2], modes)), i, 3))
            continue
        if stage == 3:      # a variant whose closed-form bound can win: its tables, its DP bound
            if info[idx][5] is None:
                o = _options(lb_costs, modes, allowed_n, tail_cache, bound=True)
                if not _fits_somehow(o, model.layers):
                    continue
                feasible += 1
                info[idx][5] = o
            lb = _solve_layout(lb_costs, info[idx][5])
            heapq.heappush(queue, (lb[0], idx, 2))
            continue
        # solve the layout exactly (its layer schedules)
        solved_n += 1
        opts = _options(costs, modes, allowed_n, tail_cache)
        _, counts, recs, fulls = _solve_layout(costs, opts)
        uniform = len(set(recs)) == 1
        blocks = {k for r, k in zip(recs, fulls, strict=True) if r == "block"}
        plan = replace(base, recompute=recs[0],
                       stages=() if counts == even else counts,
                       stage_recompute=() if uniform else recs,
                       recompute_layers=() if not blocks else (blocks.pop(),) if len(blocks) == 1 else fulls)
        res = evaluate(model, chip, devices, global_batch, plan, eff)
        heapq.heappush(heap, (res.tokens_per_s, idx, Placement(plan, res)))
        if len(heap) > keep:
            heapq.heappop(heap)
        if progress:
            progress(solved_n, feasible)
    if "dualpipe" in options.pipe_schedules:
        dual = _dualpipe_candidates(model, chip, devices, global_batch, options, eff, modes)
        considered += dual[1]
        feasible += len({layout_of(p) for _, _, p, _ in dual[0]})
        best_of: dict = {}      # a layout -> its fastest DualPipe plan
        for bound, _, plan, _ in sorted(dual[0], key=lambda c: c[:2]):
            # the keep-th best of the plans in hand, one a layout, only rises: a plan whose bound
            # cannot reach it never enters the top
            held = sorted([h[0] for h in heap] + [p.result.tokens_per_s for p in best_of.values()], reverse=True)
            if not exhaustive and len(held) >= keep and tokens / (bound * _SLACK) < held[keep - 1]:
                break
            res = evaluate(model, chip, devices, global_batch, plan, eff)
            key = layout_of(plan)
            if res.fits and (key not in best_of or res.tokens_per_s > best_of[key].result.tokens_per_s):
                best_of[key] = Placement(plan, res)
        solved_n += len(best_of)
        for j, p in enumerate(best_of.values()):
            heapq.heappush(heap, (p.result.tokens_per_s, considered + 1 + j, p))
            if len(heap) > keep:
                heapq.heappop(heap)
    if progress:
        progress(feasible, feasible)
    ranked = tuple(p for _, _, p in sorted(heap, key=lambda x: (-x[0], x[1])))

    baseline, kind = None, ""
    if with_baseline:
        # the baseline, Megatron-style: tensor parallelism over the node (the first link level, up
        # to its width; the widest valid tp on a one-level network), an even split and one recompute
        # mode for every stage; the best such plan (the earliest layout among equals)
        node = chip.links[0].devices if chip.links and chip.links[0].devices > 0 else devices
        # the widest tp within the node that has a candidate (else the narrowest that has one); the
        # interleaved layouts' candidates are built for the widths examined only
        all_tps = sorted({b.tp for b, _, _, _ in late_base} | {plan.tp for _, _, plan in base_cands})
        order = [t for t in reversed(all_tps) if t <= node] + [t for t in all_tps if t > node]
        node_tp = 0
        for t in order:
            for b, c, sib, k in late_base:
                if b.tp == t:
                    _deferred_baseline(b, c, info[sib], modes, base_cands, k)
            if any(plan.tp == t for _, _, plan in base_cands):
                node_tp = t
                break
        base_cands = [c for c in base_cands if c[2].tp == node_tp]
        kind = (f"Megatron-style: tp={node_tp} (tensor parallelism over the {node}-chip node), an even split "
                f"and one recompute mode for every stage, the best such plan" if node < devices else
                f"Megatron-style: tp={node_tp} (the widest that fits the options), an even split and one "
                f"recompute mode for every stage, the best such plan")
        baseline, best_key = None, None
        for bound, idx, plan in sorted(base_cands, key=lambda c: (c[0], c[1])):
            if best_key is not None and not exhaustive and bound * _SLACK > best_key[0]:
                break
            res = evaluate(model, chip, devices, global_batch, plan, eff)
            if best_key is None or (res.step_time_s, idx) < best_key:
                best_key, baseline = (res.step_time_s, idx), Placement(plan, res)
    reason, source = "", ""
    if not ranked and "1f1b" not in options.pipe_schedules:
        source = "--pipe-schedule"
        reason = ("no DualPipe plan fits: " + (f"none of its {dual[1]} layouts fits at the even split with one "
                                                "recompute mode" if dual[1] else
                                                "no layout of the options runs it (an even pp, no interleaving, at "
                                                "least 2 pp micro-batches, ZeRO below 3, batched sends, no offload, "
                                                "not a hybrid or Gated DeltaNet model)")
                  + "; allowed: 1f1b, more devices or a chip with more HBM")
    elif not ranked:
        if closest is None:
            source, reason = no_layout_reason(model, devices, global_batch, options)
        else:
            need, plan, stage = closest
            reserve = memory_reserve_bytes(chip, options.memory_reserve)
            source = "--arch"
            reason = (f"nothing fits: the closest plan ({plan.label()}) needs {need / GiB:.1f} GiB per "
                      f"device on stage {stage}, {chip.name} has {chip.hbm_bytes / GiB:.1f} GiB"
                      + (f" ({(chip.hbm_bytes - reserve) / GiB:.1f} GiB after a {reserve / GiB:.1f} GiB reserve)"
                         if reserve else "")
                      + "; allowed: more devices, a chip with more HBM, or a smaller --memory-reserve")
    return PlacementResult(ranked[0] if ranked else None, ranked, baseline, considered, feasible,
                           time.perf_counter() - start, reason, solved_n, source, kind if baseline else "")


def _dualpipe_candidates(model: Model, chip: Chip, devices: int, global_batch: int,
                         options: PlacementOptions, eff: Efficiency, modes: tuple[str, ...]) -> tuple[list, int]:
    """The DualPipe plans :func:`place` ranks, as ``(lower bound, index, plan, busy)``, and the count of
    layouts DualPipe can run. Each layout of the space (without interleaving) that DualPipe can
    run (:func:`phaze.plan_check.check_plan`: an even pp, enough micro-batches, ZeRO below 3, batched
    sends), at its even split (:func:`phaze.plan_check.stage_split`),
    with each searched recompute mode but ``block`` for every stage (as the Megatron-style
    baseline), that fits under the layer bounds' memory. The bound: every rank runs half the
    micro-batches through each of its two stages, so it is busy at least m / 2 times their two
    stage times under the layer schedules' lower bounds (the paired chunks' overlapped times;
    the wait for peers and the tail only add). ``busy``: the seconds its critical rank computes
    (what the energy model's logic power counts), at least m / 2 times the compute and memory
    parts of the two stage times of the rank where they are least (the lower bounds' parts are
    the exact layers' or less; the critical rank is one of the ranks)."""
    out, n = [], 0
    reserve = memory_reserve_bytes(chip, options.memory_reserve)
    for plan in layouts(model, devices, global_batch, replace(options, vp=(1,)), chip, "dualpipe"):
        pp = plan.pp
        costs = stage_costs(model, chip, devices, global_batch, layout_of(plan), eff)
        even = stage_split(model, plan)
        half = costs.micro_batches / 2
        n += 1
        for r in modes:
            if r == "block":
                continue
            try:            # what a recompute mode excludes (e.g. ep_overlap under full recompute)
                check_plan(model, devices, global_batch, replace(plan, recompute=r))
            except ConfigError:
                continue
            lb = _bound_costs(costs, (r,))
            recs, ks = (r,) * pp, (0,) * pp
            if any(lb.pair_memory(i, even, recs, ks).total_bytes + reserve > chip.hbm_bytes for i in range(pp)):
                continue
            ts = [lb.time(i, c, r, 0, groups=False) for i, c in enumerate(even)]
            bound = half * max(ts[i].total + ts[pp - 1 - i].total for i in range(pp))
            busy = half * min(ts[i].compute + ts[i].memory + ts[pp - 1 - i].compute + ts[pp - 1 - i].memory
                              for i in range(pp))
            out.append((bound, len(out), replace(plan, recompute=r), busy))
    return out, n


def place_bound(model: Model, chip: Chip, devices: int, global_batch: int,
                options: PlacementOptions = PlacementOptions(), eff: Efficiency = IDEAL) -> float:
    """A lower bound of the best step time :func:`place` can return (``inf`` when no plan fits),
    without a solver: over each of its searches (:func:`offload_searches`), the smallest over every
    1F1B layout of the dynamic program run on the layer schedules' lower bounds (what :func:`place`
    bounds layouts with before it solves any) and over every DualPipe plan of its lower bound
    (:func:`_dualpipe_candidates`, what :func:`place` prunes them with).
    1F1B layouts are visited in order of their closed-form bound and skipped once that bound
    reaches the best found."""
    chip = chip.with_execution(options.execution)
    best = math.inf
    for one in offload_searches(options):
        modes = searched_modes(model, one)
        if "dualpipe" in one.pipe_schedules:
            for lb, *_ in _dualpipe_candidates(model, chip, devices, global_batch, one, eff, modes)[0]:
                best = min(best, lb)
        if "1f1b" in one.pipe_schedules:
            best = min(best, _bound_1f1b(model, chip, devices, global_batch, one, eff, modes, best))
    return best * _SLACK if math.isfinite(best) else best


def _bound_1f1b(model: Model, chip: Chip, devices: int, global_batch: int, options: PlacementOptions,
                eff: Efficiency, modes: tuple[str, ...], best: float) -> float:
    """:func:`place_bound` over the 1F1B layouts of one search, or ``best`` if none is lower."""
    cands = []
    for base in layouts(model, devices, global_batch, options, chip):
        costs = stage_costs(model, chip, devices, global_batch, layout_of(base), eff)
        lb_costs = _bound_costs(costs, modes)
        cands.append((_quick_bound(lb_costs, modes), len(cands), base, lb_costs))
    for quick, _, base, lb_costs in sorted(cands, key=lambda c: c[:2]):
        if quick * _SLACK >= best:
            break
        L = model.layers
        allowed_n = _allowed_n(L, base.pp, base.vp)
        opts = _options(lb_costs, modes, allowed_n, bound=True)
        if not _fits_somehow(opts, L):
            continue
        lb = _solve_layout(lb_costs, opts)
        if lb is not None:
            best = min(best, lb[0])
    return best


@dataclass(frozen=True)
class StepBounds:
    """Bounds of the plan :func:`place` chooses: its step time lies in [``step_lb``, ``step_ub``]
    and the share of that step its critical stage's units are busy (what the energy model's logic
    power counts) is at least ``busy_share_lb``."""

    step_lb: float
    step_ub: float
    busy_share_lb: float
    busy_lb_s: float = 0.0      # seconds the chosen plan's units are busy, at least
    layouts: tuple[Plan, ...] = ()   # every layout the chosen plan may have (its lower bound
                                     # at most ``step_ub``), one recompute mode each


def place_step_bounds(model: Model, chip: Chip, devices: int, global_batch: int,
                      options: PlacementOptions = PlacementOptions(), eff: Efficiency = IDEAL) -> StepBounds | None:
    """Bounds of the best plan's step time and busy share without a solver (None: nothing fits),
    over :func:`place`'s searches (:func:`offload_searches`) and schedules: each search's 1F1B
    bounds (:func:`_step_bounds_1f1b`) merged, the smallest step bounds and busy shares and every
    layout (the best plan is the best of its own search, so it lies in that search's bounds).
    DualPipe plans (:func:`_dualpipe_candidates`) lower the step's lower bound to theirs; one whose
    lower bound is at most ``step_ub`` may be chosen, so its layout joins ``layouts`` and its busy
    time bounds the chosen plan's with the others (over ``step_ub``, its share). When no 1F1B plan
    fits, ``step_ub`` is the step of the DualPipe plan with the least bound that fits, evaluated."""
    chip = chip.with_execution(options.execution)
    parts, duals = [], []
    for one in offload_searches(options):
        if "1f1b" in one.pipe_schedules:
            b = _step_bounds_1f1b(model, chip, devices, global_batch, one, eff)
            if b is not None:
                parts.append(b)
        if "dualpipe" in one.pipe_schedules:
            duals += _dualpipe_candidates(model, chip, devices, global_batch, one, eff, searched_modes(model, one))[0]
    step_ub = min((b.step_ub for b in parts), default=math.inf)
    duals.sort(key=lambda c: c[:2])
    if not parts:
        for _, _, plan, _ in duals:     # the least bound first: the first that fits gives a step some plan runs
            res = evaluate(model, chip, devices, global_batch, plan, eff)
            if res.fits:
                step_ub = res.step_time_s / _SLACK
                break
        else:
            return None
    chosen = [(plan, busy * _SLACK) for lb, _, plan, busy in duals if lb * _SLACK <= step_ub]
    share = min([b.busy_share_lb for b in parts] + [busy / step_ub for _, busy in chosen])
    busy = min([b.busy_lb_s for b in parts] + [busy for _, busy in chosen])
    return StepBounds(min([b.step_lb for b in parts] + [lb * _SLACK for lb, *_ in duals]), step_ub,
                      max(0.0, min(1.0, share)), busy,
                      tuple(p for b in parts for p in b.layouts) + tuple(plan for plan, _ in chosen))


def _step_bounds_1f1b(model: Model, chip: Chip, devices: int, global_batch: int, options: PlacementOptions,
                      eff: Efficiency) -> StepBounds | None:
    """:func:`place_step_bounds` among the 1F1B plans of one search (None: none fits).

    ``step_ub``: the smallest over all layouts of the dynamic program on upper bounds of the layer
    schedules (list schedules), a step some plan achieves, so the best plan's is no longer. The
    chosen plan's layout is then one whose lower bound is at most ``step_ub``; for each, its busy
    time is at least m * beta * (sum of the stage times) / pp (the critical stage is the slowest,
    so at least the mean, and at least a share beta of it is compute and memory work: beta bounds
    that share for any layer count, edge and recompute mode, from the layer bounds' parts, which
    give the exact layer's share or less), over ``step_ub``; or, from the step's own form, at
    least m * beta / (w + pp / v + tail / T_c) of the step (w the critical stage's weight in the
    1F1B step, T_c at least the mean stage time, the tail at most the largest upper-bound tail)."""
    modes = searched_modes(model, options)
    L = model.layers
    rows, late, flat, plain = [], [], {}, set()
    tail_cache: dict = {}

    def row(base, costs, lb_costs, opts, allowed):
        up = {r: mode_cost_upper(model, chip, devices, mode_layout(base), eff, r) for r in layer_modes(modes)}
        ub_costs = replace(costs, _modes=up)
        ub_opts = _options(ub_costs, modes, allowed, tail_cache)
        ub = _solve_layout(ub_costs, ub_opts)
        tails = ub_opts.tail[np.isfinite(ub_opts.tail)]
        tail_ub = float(tails.max()) if tails.size else 0.0
        rows.append((base, costs, lb_costs, opts, allowed, tail_ub, ub[0] if ub else math.inf))

    for base in layouts(model, devices, global_batch, options, chip):
        costs = stage_costs(model, chip, devices, global_batch, layout_of(base), eff)
        allowed = _allowed_n(L, base.pp, base.vp)
        lb_costs = _bound_costs(costs, modes)
        if base.vp == 1:
            plain.add(_variant_key(base, True))
        elif _variant_key(base, True) in plain:     # as place bounds it: through its vp = 1 sibling
            late.append((base, costs, lb_costs, allowed))      # after the vp = 1 layouts (below)
            continue
        opts = _options(lb_costs, modes, allowed, tail_cache, bound=True)
        if not _fits_somehow(opts, L):
            continue
        if base.vp == 1:
            flat[_variant_key(base, True)] = (lb_costs, opts)
        row(base, costs, lb_costs, opts, allowed)
    if not rows:
        return None
    # an interleaved layout is examined only if its bound through its vp = 1 sibling (whose times,
    # memory and splits are no smaller) can reach the step in hand: otherwise it is never chosen,
    # and its own lower bound, above that step, cannot be the smallest
    ub_now = min(r[-1] for r in rows)
    for base, costs, lb_costs, allowed in late:
        sib = flat.get(_variant_key(base, True))
        if sib is None or _quick_bound(lb_costs, modes) * _SLACK > ub_now:
            continue
        weights = (critical_weight(costs.micro_batches, base.pp, base.vp), base.vp)
        through = _solve_layout(sib[0], sib[1], weights)
        if through is None or through[0] * _SLACK > ub_now:
            continue
        opts = _options(lb_costs, modes, allowed, tail_cache, bound=True)
        if not _fits_somehow(opts, L):
            continue
        row(base, costs, lb_costs, opts, allowed)
        ub_now = min(ub_now, rows[-1][-1])
    step_ub = min(r[-1] for r in rows)
    step_lb, share, busy_min = math.inf, 1.0, math.inf
    candidates = []
    for base, costs, lb_costs, opts, allowed, tail_ub, _ in rows:
        lb = _solve_layout(lb_costs, opts)
        if lb is None:
            continue
        step_lb = min(step_lb, lb[0])
        if lb[0] * _SLACK > step_ub:
            continue                      # slower than a plan already in hand: never chosen
        candidates.append(base)
        pp, m = base.pp, costs.micro_batches
        beta = 1.0
        tau = math.inf
        for r in layer_modes(modes):
            layer = lb_costs.mode(r).layer
            tau = min(tau, layer.total)
            b = (layer.compute + layer.memory) / layer.total if layer.total > 0 else 1.0
            beta = min(beta, b)
        n0 = max(0, min(allowed)) * tau
        s = costs.send_s
        edges = [PhaseTime()]
        if pp == 1:
            edges = [costs.embedding + costs.head]
        else:
            edges += [costs.embedding, costs.head]
        beta_layer = beta
        for e in edges:
            den = n0 + e.total + s
            if den > 0:
                beta = min(beta, (beta_layer * n0 + e.compute + e.memory) / den)
        stages_sum = (L + costs.model.mtp_layers) * tau + costs.embedding.total + costs.head.total + pp * s
        busy = m * beta * stages_sum / pp
        # the share also follows from the step's own form: step = w T_c + sum T / v + tail
        # <= (w + pp / v) T_c + tail, with T_c at least the mean stage time
        v = base.vp
        t_c = stages_sum / pp
        ratio = (m * beta / (critical_weight(m, pp, v) + pp / v + tail_ub / t_c)) if t_c > 0 else 0.0
        share = min(share, max(busy / step_ub, ratio))
        busy_min = min(busy_min, busy)
    busy_min = 0.0 if not math.isfinite(busy_min) else busy_min * _SLACK
    return StepBounds(step_lb * _SLACK, step_ub / _SLACK, max(0.0, min(1.0, share * _SLACK)), busy_min,
                      tuple(candidates))
