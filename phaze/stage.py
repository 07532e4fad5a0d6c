"""What one pipeline stage of a plan costs: its layers' times (the makespans of their optimal
schedules, or on a GPU the sum of their kernels), the communication each phase leaves exposed, the
optimizer's and the framework's passes over the weights, and the bytes it keeps and moves, for each
recompute mode (:class:`StageCosts`, built by :func:`stage_costs`), with optimistic and pessimistic
bounds of the same for the search (:func:`mode_cost_bounds`, :func:`mode_cost_upper`).
:mod:`phaze.step` assembles a step from them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from . import cost, dualpipe
from .arch import Chip
from .cost import IDEAL, Efficiency, collective_time, kernel_overhead, op_time
from .graph import (
    DEEPSPEED_BUCKET_ELEMENTS,
    DROPLESS_LOAD,
    ExpertLayout,
    TensorPasses,
    bf16_moment_passes,
    collective_groups,
    deepspeed_reduce_passes,
    deepspeed_tensor_passes,
    deepspeed_zero3_passes,
    deepspeed_zero_passes,
    edge_graph,
    kv_heads_read,
    kv_width,
    layer_graph,
    offloaded_bytes,
    optimizer_op,
    runs_deepspeed_zero,
)
from .memory import StageMemory, activation_bytes_per_layer, optimizer_step_bytes_per_param, state_bytes_per_param
from .plan import DP_SHARD_NODE, MEGATRON_OPTIMIZERS, Plan, graph_recompute
from .schedule import layer_bounds, schedule_layer
from .workload import Model, dense_view, gdn_views, hybrid_views, with_seq_len


class PhaseTime(NamedTuple):
    """Seconds of one op sequence, split by what bounds it. A named tuple, not a frozen dataclass:
    a placement builds and adds some 10^5 of them a candidate chip, and a tuple of ten is built
    as fast as a frozen dataclass of five."""

    compute: float = 0.0        # tensor-unit ops (GEMMs, fused attention)
    memory: float = 0.0         # vector-unit ops: element-wise, norms, softmax (bandwidth-bound)
    communication: float = 0.0  # collectives on the links
    async_hidden: float = 0.0   # of ``communication``, what asynchronous issue would hide (``tp_async``)
    # ``communication`` by parallel group, each what of it shows once the overlaps have hidden theirs
    # (they sum to it): the tensor-parallel group's collectives (what Transformer Engine's
    # userbuffers overlap, ``tp_overlap``), the experts' (token all-to-alls, expert-tensor-parallel
    # gathers), context parallelism's K/V exchange, the data-parallel group's (FSDP's per-layer
    # gathers and reduce-scatters, DeepSpeed ZeRO-2's per-micro-batch reduces), the pipeline's sends
    # and the activations offloaded to the host and fetched back (``Plan.offload``)
    tp_comm: float = 0.0
    ep_comm: float = 0.0
    cp_comm: float = 0.0
    dp_comm: float = 0.0
    pp_comm: float = 0.0
    host_comm: float = 0.0

    @property
    def total(self) -> float:
        return self.compute + self.memory + self.communication

    def __add__(self, o: PhaseTime) -> PhaseTime:
        return PhaseTime(self.compute + o.compute, self.memory + o.memory,
                         self.communication + o.communication, self.async_hidden + o.async_hidden,
                         self.tp_comm + o.tp_comm, self.ep_comm + o.ep_comm, self.cp_comm + o.cp_comm,
                         self.dp_comm + o.dp_comm, self.pp_comm + o.pp_comm, self.host_comm + o.host_comm)

    def __rmul__(self, k):   # not a tuple's repetition
        return NotImplemented

    def __mul__(self, k: float) -> PhaseTime:
        # a group part that is a float zero stays one, not an array of zeros when k is an array
        # (the placement's arrays of layer counts multiply ModeCosts.main, which has no group parts)
        tp, ep, cp, dp, pp, ho = (self.tp_comm, self.ep_comm, self.cp_comm, self.dp_comm, self.pp_comm,
                                  self.host_comm)
        return PhaseTime(self.compute * k, self.memory * k, self.communication * k, self.async_hidden * k,
                         tp * k if tp.__class__ is not float or tp else 0.0,
                         ep * k if ep.__class__ is not float or ep else 0.0,
                         cp * k if cp.__class__ is not float or cp else 0.0,
                         dp * k if dp.__class__ is not float or dp else 0.0,
                         pp * k if pp.__class__ is not float or pp else 0.0,
                         ho * k if ho.__class__ is not float or ho else 0.0)


def exposed(comm, cover, eff: Efficiency):
    """Time ``comm`` adds when it runs concurrently with ``cover`` seconds of compute: what does
    not fit under it, plus the slowdown the overlapped part causes (scalars or arrays)."""
    if isinstance(comm, np.ndarray) or isinstance(cover, np.ndarray):
        return np.maximum(0.0, comm - cover) + eff.overlap_slowdown * np.minimum(comm, cover)
    return max(0.0, comm - cover) + eff.overlap_slowdown * min(comm, cover)


# the PhaseTime part that carries each layer graph's collective group (phaze.graph)
_GROUP_PART = {"tp": "tp_comm", "ep": "ep_comm", "ep_node": "ep_comm", "etp": "ep_comm"}


def _sum_ops(ops, chip: Chip, precision: str, eff: Efficiency, groups: dict, p: int) -> PhaseTime:
    """The ops one after another, split by what bounds each; ``async_hidden``: what the collectives
    issued asynchronously under a GEMM (``Op.hidden_by``) would save (:func:`exposed`)."""
    acc = {"compute": 0.0, "memory": 0.0, "communication": 0.0, "async_hidden": 0.0, "tp_comm": 0.0,
           "ep_comm": 0.0}
    times, hidden = {}, []
    for op in ops:
        t = op_time(op, chip, precision, eff, groups=groups, bytes_per_element=p)
        times[op.name] = t
        key = {"link": "communication", "vector": "memory"}.get(op.unit, "compute")
        acc[key] += t
        if op.unit == "link":
            acc[_GROUP_PART[op.collective.group]] += t
        if op.hidden_by:
            hidden.append((t, op.hidden_by))
    for t, under in hidden:
        if under in times:
            acc["async_hidden"] += t - exposed(t, times[under], eff)
    return PhaseTime(**acc)


def layer_mix(model: Model, moe: ExpertLayout | None = None) -> tuple[tuple[float, Model, ExpertLayout | None], ...]:
    """The kinds of layer the mean layer weighs, as (weight, model of that kind alone, its expert
    layout): the model itself; for a mixture of experts with dense layers its MoE layers (laid out
    by ``moe``) and its dense ones (:func:`dense_view`) by their shares; for a hybrid its Mamba-2,
    attention and MLP layers (:func:`phaze.workload.hybrid_views`) by theirs. Every per-layer
    figure (time, schedule, FLOPs, activity, weight-gradient share) is this mean."""
    if model.hybrid and model.layer_kind is None:   # a hybrid: each kind's share of the layers
        return tuple((w, view, moe if view.moe else None) for w, view in hybrid_views(model))
    if views := gdn_views(model):   # Gated DeltaNet beside full attention, each kind as layer_mix takes it
        return tuple((share * v, m, lm) for share, view in views for v, m, lm in layer_mix(view, moe))
    if not (model.moe and model.dense_ffn_layers):
        return ((1.0, model, moe),)
    w = model.dense_ffn_layers / model.layers
    return ((1 - w, replace(model, dense_layers=0, moe_layer_interval=1), moe), (w, dense_view(model), None))


def _mean(parts):
    """The weighted sum of ``(weight, value)`` pairs; one part of weight 1 is itself."""
    (w, total), *rest = parts
    if not rest and w == 1.0:
        return total
    total = total * w
    for w, v in rest:
        total = total + v * w
    return total


def expert_layout(model: Model, plan: Plan, chip: Chip | None = None, mean: bool = False) -> ExpertLayout | None:
    """The expert layers' layout of ``plan`` (None for a dense model): ep, etp, the busiest
    rank's load under the plan's routing (forced 1, capacity the capacity factor (padded),
    dropless :data:`phaze.graph.DROPLESS_LOAD`) and, for the ``deepep`` dispatcher, the nodes
    (domains of the chip's first link level) the ep ranks span. ``mean``: the mean rank's load
    instead (dropless 1; padding to capacity loads every rank alike), for counts summed over
    the ranks such as the energy's."""
    if not model.moe:
        return None
    routing = plan.routing or ("capacity" if model.capacity_factor else "dropless")
    load = {"forced": 1.0, "capacity": model.capacity_factor or 1.0,
            "dropless": 1.0 if mean else DROPLESS_LOAD}[routing]
    nodes = 1
    if plan.dispatcher == "deepep" and chip is not None and chip.links and chip.links[0].devices:
        local = max(1, min(plan.ep, chip.links[0].devices // plan.etp))
        nodes = plan.ep // local if plan.ep % local == 0 else 1
    return ExpertLayout(plan.ep, plan.etp, load, nodes, plan.ep_overlap,
                        plan.shared_overlap and model.shared_experts > 0, plan.dispatcher == "deepep")


# Megatron-Core's --moe-shared-expert-overlap (megatron-core 0.16.1 transformer/moe/shared_experts.py,
# token_dispatcher.py MoEAlltoAllTokenDispatcher): the shared experts run on a stream of their own,
# their first linear and activation issued beside the dispatch all-to-all, their second linear
# beside the combine; their backward runs on the same stream beside the all-to-alls' mirrors.
# Each all-to-all (phaze's op name) and the shared-expert ops that cover it.
SHARED_COVER_FWD = (("dispatch.all_to_all", ("shared_up", "shared_{act}")), ("combine.all_to_all", ("shared_down",)))
SHARED_COVER_BWD = (("combine.all_to_all.bwd", ("shared_down.dgrad", "shared_down.wgrad")),
                    ("dispatch.all_to_all.bwd", ("shared_{act}.bwd", "shared_up.dgrad", "shared_up.wgrad")),
                    *(("recompute." + a2a, tuple("recompute." + n for n in under))   # a re-run forward's
                      for a2a, under in SHARED_COVER_FWD))


def _beside_shared(ops, t: PhaseTime, chip: Chip, model: Model, eff: Efficiency, groups: dict,
                   cover) -> PhaseTime:
    """``t`` with each token all-to-all run beside the shared-expert ops that cover it
    (:data:`SHARED_COVER_FWD`, :data:`SHARED_COVER_BWD`): what does not fit under them shows, plus
    ``overlap_slowdown`` of the rest (:func:`exposed`)."""
    names = {n.format(act=model.activation) for _, under in cover for n in under} | {a for a, _ in cover}
    times = {o.name: op_time(o, chip, model.precision, eff, groups=groups, bytes_per_element=model.bytes_per_element)
             for o in ops if o.name in names}
    saved = 0.0
    for a2a, under in cover:
        if a2a in times:
            window = sum(times.get(n.format(act=model.activation), 0.0) for n in under)
            saved += times[a2a] - exposed(times[a2a], window, eff)
    return t._replace(communication=t.communication - saved, ep_comm=t.ep_comm - saved)


@lru_cache(maxsize=16384)
def _graph_sums(model: Model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str, recompute: str,
                eff: Efficiency, moe: ExpertLayout | None = None) -> tuple[PhaseTime, PhaseTime]:
    """(forward, backward) sums of one kind of layer's operator times, split by what bounds each
    op."""
    g = layer_graph(model, mbs, tp, sp, attention, recompute, moe, chip.compiled)
    groups = collective_groups(tp, moe)
    p = model.bytes_per_element
    fwd, bwd = (_sum_ops(g.fwd, chip, model.precision, eff, groups, p),
                _sum_ops(g.bwd, chip, model.precision, eff, groups, p))
    if moe is not None and moe.overlap:   # the ep all-to-alls hide under the phase's compute
        def hide(ops, t: PhaseTime) -> PhaseTime:
            a2a = _sum_ops([o for o in ops if o.collective and o.collective.kind == "all_to_all"],
                           chip, model.precision, eff, groups, p).communication
            shown = exposed(a2a, t.compute, eff)
            return t._replace(communication=t.communication - a2a + shown, ep_comm=t.ep_comm - a2a + shown,
                              async_hidden=0.0)
        fwd, bwd = hide(g.fwd, fwd), hide(g.bwd, bwd)
    elif moe is not None and moe.shared_overlap:
        fwd, bwd = (_beside_shared(g.fwd, fwd, chip, model, eff, groups, SHARED_COVER_FWD),
                    _beside_shared(g.bwd, bwd, chip, model, eff, groups, SHARED_COVER_BWD))
    return fwd, bwd


@lru_cache(maxsize=16384)
def _layer_sums(model: Model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str, recompute: str,
                eff: Efficiency, moe: ExpertLayout | None = None) -> tuple[PhaseTime, PhaseTime]:
    """(forward, backward) sums of the mean layer's operator times (:func:`layer_mix`)."""
    sums = [(w, _graph_sums(m, chip, mbs, tp, sp, attention, recompute, eff, lm)) for w, m, lm in layer_mix(model, moe)]
    return _mean([(w, f) for w, (f, _) in sums]), _mean([(w, b) for w, (_, b) in sums])


@lru_cache(maxsize=65536)
def layer_time(model: Model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str,
               recompute: str, eff: Efficiency = IDEAL,
               schedule: str = "optimal", moe: ExpertLayout | None = None) -> tuple[PhaseTime, PhaseTime]:
    """(forward, backward incl. recompute) time of one layer for one micro-batch.

    ``optimal``: the makespan of the CP-SAT schedule of each phase on the chip's units
    (:mod:`phaze.schedule`), its parts scaled from the operators' sums; ``sequential``: the sum
    of the operator times. On a chip whose units are shared sequentially (a GPU) the optimal
    schedule is that sum, computed directly. ``moe``: the expert layers' layout. A model with
    more than one kind of layer (:func:`layer_mix`): each kind's schedule, weighed."""
    if schedule == "sequential" or chip.unit_sharing == "sequential":
        return _layer_sums(model, chip, mbs, tp, sp, attention, recompute, eff, moe)
    fwds, bwds = [], []   # each kind of layer scheduled on its own, then weighed
    for w, m, lm in layer_mix(model, moe):
        fwd, bwd = _graph_sums(m, chip, mbs, tp, sp, attention, recompute, eff, lm)
        sf, sb = schedule_layer(m, chip, mbs, tp, sp, attention, recompute, eff, moe=lm)
        fwds.append((w, _scaled(fwd, sf.makespan_s)))
        bwds.append((w, _scaled(bwd, sb.makespan_s)))
    return _mean(fwds), _mean(bwds)


def _scaled(t: PhaseTime, makespan_s: float) -> PhaseTime:
    """A phase's parts scaled to a schedule's makespan; the schedule already overlaps collectives
    with compute wherever the graph allows, so nothing is left for ``tp_async`` to hide."""
    return (t * (makespan_s / t.total))._replace(async_hidden=0.0)


@lru_cache(maxsize=16384)
def layer_time_bounds(model: Model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str,
                      recompute: str, eff: Efficiency = IDEAL, schedule: str = "optimal",
                      moe: ExpertLayout | None = None
                      ) -> tuple[tuple[PhaseTime, PhaseTime], tuple[PhaseTime, PhaseTime]]:
    """((forward, backward) lower bounds, (forward, backward) upper bounds) of :func:`layer_time`,
    without a solver: the critical-path and energy bounds and the list schedule of each phase
    (:func:`phaze.schedule.layer_bounds`), split into parts as :func:`layer_time` splits them."""
    if schedule == "sequential" or chip.unit_sharing == "sequential":
        fwd, bwd = _layer_sums(model, chip, mbs, tp, sp, attention, recompute, eff, moe)
        return (fwd, bwd), (fwd, bwd)
    parts = []
    for w, m, lm in layer_mix(model, moe):
        fwd, bwd = _graph_sums(m, chip, mbs, tp, sp, attention, recompute, eff, lm)
        (fl, fh), (bl, bh) = layer_bounds(m, chip, mbs, tp, sp, attention, recompute, eff, lm)
        parts.append((w, (_scaled(fwd, fl), _scaled(bwd, bl), _scaled(fwd, fh), _scaled(bwd, bh))))
    fl, bl, fh, bh = (_mean([(w, t[j]) for w, t in parts]) for j in range(4))
    return (fl, bl), (fh, bh)


@lru_cache(maxsize=16384)
def edge_time(model: Model, chip: Chip, mbs: int, tp: int, sp: bool,
              eff: Efficiency = IDEAL, loss: str = "torch") -> tuple[PhaseTime, PhaseTime]:
    """(embedding, head) time per micro-batch, forward plus backward."""
    e = edge_graph(model, mbs, tp, sp, loss)
    groups = {"tp": (tp, 1)}
    p = model.bytes_per_element
    return (_sum_ops(e["embedding"], chip, model.precision, eff, groups, p),
            _sum_ops(e["head"], chip, model.precision, eff, groups, p))


def shard_ranks(plan: Plan, devices: int, chip: Chip) -> int:
    """Data-parallel ranks one ZeRO shard group spans (:attr:`phaze.plan.Plan.dp_shard`): every
    rank, the given count, or for ``node`` those inside one node or pod slice (the chip's first
    link level: ranks are ordered tp, cp, dp, so a node holds node / (tp * cp) of them, at least
    one). Fewer than dp: hybrid sharding, the groups are replicas of one another."""
    dp = plan.dp(devices)
    if not plan.zero or not plan.dp_shard:
        return dp
    if plan.dp_shard != DP_SHARD_NODE:
        return math.gcd(dp, plan.dp_shard)
    node = chip.links[0].devices if chip.links else 0
    return math.gcd(dp, max(1, node // (plan.tp * plan.cp))) if node else dp


def expert_shard(plan: Plan, devices: int, chip: Chip) -> tuple[int, int]:
    """(ranks, replicas) of a routed expert's ZeRO shard group: the expert data-parallel group
    (:meth:`phaze.plan.Plan.edp`) split into as many replicas as the dense shard groups have,
    where it divides."""
    edp = plan.edp(devices)
    replicas = math.gcd(plan.dp(devices) // shard_ranks(plan, devices, chip), edp)
    return edp // replicas, replicas


def inflight_micro_batches(pp: int, v: int, m: int, i):
    """Micro-batches' worth of its layers' activations stage ``i`` holds at its peak: under 1F1B,
    min(pp - i, m); interleaved (v chunks of a stage's layers), Megatron's warm-up of
    2(pp - i - 1) + (v - 1) pp chunk forwards plus the one in flight, at most m v chunks, each 1/v
    of the stage (``i`` may be an array)."""
    least = min if isinstance(i, int) else np.minimum
    if v == 1:
        return least(pp - i, m)
    return least(m * v, 2 * (pp - i - 1) + (v - 1) * pp + 1) / v


@dataclass(frozen=True)
class StageCosts:
    """Everything a stage's time, tail and memory depend on, for one layout (tp, pp, mbs, ...)
    and each recompute mode: the pieces :func:`evaluate` and the placement search share."""

    model: Model
    plan: Plan
    devices: int
    micro_batches: int
    full_act_bytes: float  # activations of one layer without recompute, one micro-batch
    embedding: PhaseTime
    head: PhaseTime
    send_s: float
    state_bytes_per_param: float
    chip: Chip
    eff: Efficiency

    _modes: dict = field(default_factory=dict, repr=False, compare=False)
    _affine: dict = field(default_factory=dict, repr=False, compare=False)   # collective -> (time of 1 B, slope)
    _tails: dict = field(default_factory=dict, repr=False, compare=False)    # :meth:`_tail_parts`, by (stage, counts)

    def mode(self, r: str) -> ModeCosts:
        """One layer's costs under recompute ``r`` (computed on first use, then kept)."""
        if r not in self._modes:
            self._modes[r] = mode_costs(self.model, self.chip, self.devices, mode_layout(self.plan), self.eff, r)
        return self._modes[r]

    def layers_on(self, i: int, n):
        """Transformer layers a device of stage ``i`` runs with ``n`` of the model's: the last
        stage also runs each multi-token prediction module's layer (Megatron-Core builds them
        there, ``get_mtp_num_layers_to_build``; a layer of the repeated kind, costed as the mean
        layer as every stage's are). ``n`` may be an array."""
        return n + self.model.mtp_layers if i == self.plan.pp - 1 else n

    def _table_copy(self, i: int) -> bool:
        """Whether stage ``i`` keeps its own copy of the embedding table: the last of several
        stages does when the head is tied to it or multi-token prediction looks tokens up. Not
        under DualPipe: the ranks that run the last stage run the first too, and the embedding is
        theirs (the DeepSeek-V3 report's Sec. 3.2.3: the embedding and output head on one rank,
        their parameters and gradients shared physically with the multi-token prediction module)."""
        m, pp = self.model, self.plan.pp
        return (pp > 1 and i == pp - 1 and (m.tied_embeddings or m.mtp_layers > 0)
                and self.plan.pipe_schedule != "dualpipe")

    def params(self, i: int, n: int) -> float:
        """Parameters one device of stage ``i`` holds with ``n`` layers (the last stage's
        multi-token prediction modules included)."""
        m, pp = self.model, self.plan.pp
        n = self.layers_on(i, n)
        q = n * tp_layer_params(m, self.plan.tp)
        if i == 0:
            q += m.embedding_params
        if i == pp - 1:
            q += m.head_params + m.mtp_layers * m.mtp_module_params
        if self._table_copy(i):   # the last stage keeps its own copy of the table
            q += m.table_params
        if m.moe:   # routed experts are sharded over ep x etp, not tp
            return q / self.plan.tp + n * self._expert_shift()
        return q / self.plan.tp

    def fp8_weights(self, i: int, n):
        """Linear-weight parameters one device of stage ``i`` holds with ``n`` layers
        (:func:`fp8_linear_params`; ``n`` may be an array)."""
        return self.layers_on(i, n) * self._fp8_per_layer()

    def _fp8_per_layer(self) -> float:
        m, tp = self.model, self.plan.tp
        return fp8_linear_params(m, tp) / tp + (self._expert_shift() if m.moe else 0.0)

    def weight_cast_bytes(self, i: int, n, sharded):
        """HBM bytes of the step's one cast of stage ``i``'s linear weights to fp8 under
        Megatron-Core (``fp8_casts`` fused, ZeRO below 3; None otherwise): the 16-bit weights in
        both layouts on the first micro-batch (read 2, write 2), or, with fp8 weights, the
        optimizer's fp32 shard (read 4, write 1; ``sharded``, the share of the parameters the
        device's optimizer updates) and the gathered weights' transpose (read 1, write 1)."""
        if not self.model.fp8_fused or state_zero(self.plan) >= 3:
            return None
        w = self.fp8_weights(i, n)
        return 5.0 * w * sharded + 2.0 * w if self.plan.fp8_params else 4.0 * w

    def _weight_cache(self) -> float:
        """Per layer: bytes of the fp8 weight casts kept through the step (:func:`caches_fp8_weights`)."""
        return 2.0 * self._fp8_per_layer() if caches_fp8_weights(self.model, self.plan) else 0.0

    def _expert_shift(self) -> float:
        """Per layer: routed-expert parameters a device holds beyond their tp-sharded share."""
        plan = self.plan
        return self.model.expert_layer_params * (1.0 / (plan.ep * plan.etp) - 1.0 / plan.tp)

    def updated_params(self, i: int, n):
        """Parameters one device of stage ``i`` updates in the optimizer step with ``n`` layers:
        its shard under ZeRO 1-3, the dense ones' over the shard group and context parallelism,
        the routed experts' over the expert data-parallel group."""
        params = self.params(i, n)
        if self.plan.zero < 1:
            return params
        group = self._dense_shards()
        if self.model.moe:
            experts = self.expert_params(self.layers_on(i, n))
            return (params - experts) / group + experts / expert_shard(self.plan, self.devices, self.chip)[0]
        return params / group

    def _dense_shards(self) -> int:
        """The ranks a dense parameter's optimizer state is sharded over: its ZeRO shard group
        and context parallelism (1 without ZeRO)."""
        plan = self.plan
        return shard_ranks(plan, self.devices, self.chip) * plan.cp if plan.zero >= 1 else 1

    def expert_params(self, n):
        """Routed-expert parameters one device holds with ``n`` layers (0 for a dense model)."""
        return n * self.model.expert_layer_params / (self.plan.ep * self.plan.etp)

    def _expert_state_shift(self) -> float:
        """Per layer: bytes of the routed experts' state beyond ``state_bytes_per_param``: their
        gradients and optimizer state are sharded over the expert data-parallel group."""
        plan, m = self.plan, self.model
        p = m.bytes_per_element
        edp = state_bytes_per_param(plan.optimizer, state_zero(plan), expert_shard(plan, self.devices, self.chip)[0], p,
                                    main_grad_bytes(m, plan))
        return self.expert_params(1) * (edp - self.state_bytes_per_param)

    def tensors(self, i: int, n, hooked: bool = False):
        """Parameter tensors one device of stage ``i`` holds with ``n`` layers (each sharded over
        tp, each expert whole on its ep rank); ``hooked``: only those no weight-gradient GEMM
        adds into the main gradients (:meth:`phaze.workload.Model.layer_tensors`; the head's
        weight, or the last stage's copy of a tied table, is a GEMM's)."""
        m, pp = self.model, self.plan.pp
        q = self.layers_on(i, n) * m.layer_tensors(m.experts / self.plan.ep if m.moe else None, hooked)
        if i == 0:
            q = q + m.embedding_tensors
        if i == pp - 1:
            # each multi-token prediction module: three norms and eh_proj (a GEMM's)
            q = q + m.mtp_layers * (3 * m.norm_tensors + (0 if hooked else 1))
            if hooked:   # less the head's weight
                q = q + m.head_tensors - (0 if m.tied_embeddings else 1)
            else:
                q = q + m.head_tensors
        if self._table_copy(i) and (not hooked or m.mtp_layers):   # the last stage's copy of the table:
            q = q + 1   # a tied head's weight is a GEMM's, a multi-token prediction lookup's is hooked
        return q

    def accumulation(self, i: int, n):
        """Seconds per micro-batch of adding its gradients into the main gradients, stage ``i``
        with ``n`` layers. ``adam-deepspeed``: :func:`deepspeed_tensor_passes` (fp16 keeps the
        first micro-batch's; the mean over the micro-batches); under its ZeRO-2 optimizer the
        passes around each micro-batch's reduction (:meth:`_deepspeed_zero2_passes`).
        ``adam-megatron``: a backward hook
        adds each tensor's 16-bit gradient into its main gradient (read 2 and the main gradient's
        bytes, write those); under gradient-accumulation fusion only the tensors no GEMM adds
        into (norms, biases, the router, the embedding tables: their bytes; the norms' and
        biases' few thousand values each are not counted, their kernels are)."""
        stream, parts = self._accumulation_passes(i, n)
        out = stream / (self.chip.hbm_bandwidth_bytes_per_s * self.eff.hbm_fraction)
        for share, passes, tensors, params in parts:
            out = out + share * tensor_pass_time(passes, tensors, params, self.chip, self.eff)
        return out

    def accumulation_bytes(self, i: int, n):
        """HBM bytes per micro-batch of :meth:`accumulation` (read and written)."""
        stream, parts = self._accumulation_passes(i, n)
        for share, passes, _, params in parts:
            stream = stream + share * (passes.read + passes.write) * params
        return stream

    def _zero2(self) -> bool:
        """Whether DeepSpeed's ZeRO optimizer reduces every micro-batch (stage 2)."""
        return deepspeed_zero(self.model, self.plan) and self.plan.zero >= 2

    def _partition(self, i: int, n):
        """(tensors, parameters, the rank's partition's tensors, its parameters) of stage ``i``
        with ``n`` layers under DeepSpeed's ZeRO optimizer. Assumption: a partition holds its
        share of the stage's tensors (the pieces at its edges are not counted as launches)."""
        tensors, params = self.tensors(i, n), self.params(i, n)
        share = self.updated_params(i, n) / params
        return tensors, params, tensors * share, params * share

    def _deepspeed_zero2_passes(self, i: int, n):
        """(bytes streamed, ((share of the micro-batches, :class:`TensorPasses`, tensors,
        parameters), ...)) of each micro-batch's reduction under DeepSpeed's ZeRO-2 optimizer
        (DeepSpeed 0.9.5 runtime/zero/stage_1_and_2.py: the gradient hooks and
        ``independent_gradient_partition_epilogue``, which the engine's backward runs every
        micro-batch): each gradient copied into the bucket buffer, the whole buffer divided by dp,
        the partition copied out, and from the second micro-batch on added into the first's
        (``accumulated_grad.add_``: read 4, write 2)."""
        into, out, _, _, add = deepspeed_zero_passes(self.model.precision)
        tensors, params, part_tensors, part = self._partition(i, n)
        k = self.micro_batches
        return self._bucket_stream(params), ((1.0, into, tensors, params), (1.0, out, part_tensors, part),
                                             ((k - 1) / k, add, part_tensors, part))

    def _deepspeed_zero3_passes(self, i: int, n):
        """(bytes streamed, ((share of the micro-batches, :class:`TensorPasses`, tensors,
        parameters), ...)) of each micro-batch's reduction under DeepSpeed's ZeRO-3 optimizer
        (:func:`deepspeed_zero3`; :func:`phaze.graph.deepspeed_zero3_passes`): each gradient
        copied into the bucket buffer (cast to an fp32 wire); each bucket flattened by
        ``reduce_scatter_coalesced`` (``torch.cat``, read and write a gradient's wire bytes) and
        divided by the ranks (``div_``, the same); the partition copied into the 16-bit partition
        buffer on the first micro-batch and added into it on the others (cast back first from an
        fp32 wire)."""
        into, cast, copy, add, back, _ = deepspeed_zero3_passes(self._wire_fp32())
        tensors, params, part_tensors, part = self._partition(i, n)
        k = self.micro_batches
        w = reduced_grad_bytes(self.model, self.plan)
        return 4.0 * w * params, ((1.0, into, tensors, params), (1.0, cast, tensors, params),
                                  (1.0 / k, copy, part_tensors, part), ((k - 1) / k, add, part_tensors, part),
                                  (1.0, back, part_tensors, part))

    def _wire_fp32(self) -> bool:
        """Whether DeepSpeed's gradients go on the wire in fp32 while it keeps them in 16 bits."""
        return reduced_grad_bytes(self.model, self.plan) != self.model.bytes_per_element

    def _last_bucket(self, params):
        """Gradients of the last bucket DeepSpeed's ZeRO-3 optimizer fills in a backward, which it
        reduce-scatters after the backward (``independent_gradient_partition_epilogue``, then
        the host waits for the reduce stream): what is left after whole buckets of
        :data:`DEEPSPEED_BUCKET_ELEMENTS` (scalars or arrays)."""
        return params - DEEPSPEED_BUCKET_ELEMENTS * (deepspeed_buckets(params) - 1)

    def _bucket_stream(self, params):
        """Bytes DeepSpeed's ZeRO optimizer streams over its bucket buffers, each whole buffer
        (:data:`DEEPSPEED_BUCKET_ELEMENTS` 16-bit elements) however few gradients it holds
        (``average_tensor``): divided by dp (read 2, write 2) and, when the wire type differs
        (``communication_data_type``, ``reduce_fp32``), cast to it and copied back (read 2,
        write 4, read 4, write 2)."""
        per = 4.0 + (12.0 if self._wire_fp32() else 0.0)
        return per * DEEPSPEED_BUCKET_ELEMENTS * deepspeed_buckets(params)

    def _accumulation_passes(self, i: int, n):
        """(bytes streamed in a few kernels, ((share of the micro-batches, :class:`TensorPasses`,
        tensors, parameters), ...)) of :meth:`accumulation`."""
        m, plan = self.model, self.plan
        if self._zero2():
            return self._deepspeed_zero2_passes(i, n)
        if deepspeed_zero3(m, plan):
            return self._deepspeed_zero3_passes(i, n)
        if plan.optimizer == "adam-deepspeed":
            k = self.micro_batches
            share = (k - 1) / k if m.precision == "fp16" else 1.0   # fp16: the first is kept
            return 0.0 * n, ((share, deepspeed_tensor_passes(m.precision)[0], self.tensors(i, n), self.params(i, n)),)
        if plan.optimizer not in MEGATRON_OPTIMIZERS:
            return 0.0 * n, ()
        p = m.bytes_per_element
        g = main_grad_bytes(m, plan)
        passes = TensorPasses(1, float(p + g), float(g))
        if not plan.grad_accum_fusion:
            return 0.0 * n, ((1.0, passes, self.tensors(i, n), self.params(i, n)),)
        table = m.table_params if self._table_copy(i) and m.mtp_layers else 0.0
        params = ((m.embedding_params if i == 0 else 0.0) + table) / plan.tp + 0.0 * n
        return 0.0 * n, ((1.0, passes, self.tensors(i, n, hooked=True), params),)

    def step_pass_bytes(self, i: int, n):
        """HBM bytes of the optimizer step's work beyond its element-wise kernel
        (:func:`phaze.graph.optimizer_op`) and the weights' fp8 cast (:meth:`_step_passes`)."""
        stream, passes = self._step_passes(i, n)
        for tp, _, params in passes:
            stream = stream + (tp.read + tp.write) * params
        return stream

    def _step_passes(self, i: int, n):
        """(bytes streamed in one kernel, ((:class:`TensorPasses`, tensors, parameters), ...)) of
        the optimizer step beyond its element-wise kernel, as :meth:`_tail_parts` times them and
        :meth:`step_pass_bytes` counts them: DeepSpeed's per-tensor check and copies; Megatron's
        zeroed main-gradient buffer (one kernel) and the bf16 moments' copies to fp32 and back."""
        plan = self.plan
        if deepspeed_zero3(self.model, plan):   # its ZeRO-3 optimizer: each gradient's norm in fp64
            _, _, part_tensors, part = self._partition(i, n)
            return 0.0 * part, ((deepspeed_zero3_passes(self._wire_fp32())[-1], part_tensors, part),)
        if deepspeed_zero(self.model, plan):   # its ZeRO optimizer: the bucket, then the partition
            tensors, params, part_tensors, part = self._partition(i, n)
            into, out, check, norm, _ = deepspeed_zero_passes(self.model.precision)
            steps = ((check, part_tensors, part), (norm, part_tensors, part))
            if self._zero2():   # reduced every micro-batch (accumulation)
                return 0.0 * params, steps
            return self._bucket_stream(params), ((into, tensors, params), (out, part_tensors, part), *steps)
        if plan.optimizer == "adam-deepspeed":   # its checks and copies, tensor by tensor
            m = self.model
            _, check, copies = deepspeed_tensor_passes(m.precision)
            tensors, params = self.tensors(i, n), self.params(i, n)
            # and the passes around its gradient all-reduce (graph.deepspeed_reduce_passes)
            flat, one_bucket, back = deepspeed_reduce_passes(m.precision, reduced_grad_bytes(m, plan))
            flat = flat + np.where(params <= DEEPSPEED_BUCKET_ELEMENTS, one_bucket, 0.0)
            return flat * params, ((check, tensors, params), (copies, tensors, params), (back, tensors, params))
        if plan.optimizer not in MEGATRON_OPTIMIZERS:
            return 0.0 * n, ()
        params = self.params(i, n)
        stream = main_grad_bytes(self.model, plan) * params   # the whole main-gradient buffer zeroed
        if plan.optimizer != "adam-megatron-pa-bf16":
            return stream, ()
        # bf16 moments copied to fp32 and back; assumption: a device's shard holds its share of
        # the stage's tensors (the pieces of tensors at the shard's edges are not counted)
        updated = self.updated_params(i, n)
        return stream, ((bf16_moment_passes(), self.tensors(i, n) * updated / params, updated),)

    def _layers(self, attr: str, n, r: str, k=0):
        """``attr`` of ``n`` layers under ``r`` (``fwd``/``bwd``: their total seconds); a ``block``
        stage's first ``k`` re-run whole (``full``), the rest nothing (``none``). ``n`` and ``k``
        may be arrays."""
        if r != "block":
            x = getattr(self.mode(r), attr)
            return (x.total if attr in ("fwd", "bwd") else x) * n
        a, b = getattr(self.mode("none"), attr), getattr(self.mode("full"), attr)
        if attr in ("fwd", "bwd"):
            a, b = a.total, b.total
        return a * (n - k) + b * k

    def time(self, i: int, n: int, r: str, k=0, groups: bool = True) -> PhaseTime:
        """Stage ``i`` with ``n`` layers and recompute ``r`` (``block``: ``k`` of them re-run whole):
        one micro-batch forward + backward and its gradient accumulation (:meth:`accumulation`).
        ``groups`` False: without the layers' communication by group (the same total, for the
        placement's arrays of layer counts)."""
        t = self._layers("layer" if groups else "main", self.layers_on(i, n), r, k) + PhaseTime(
            communication=self.send_s, pp_comm=self.send_s)
        if i == 0:
            t = t + self.embedding
        if i == self.plan.pp - 1:
            t = t + self.head
        if self.plan.optimizer == "adam-deepspeed" or self.plan.optimizer in MEGATRON_OPTIMIZERS:
            t = t + PhaseTime(memory=self.accumulation(i, n))
        if self._zero2():   # DeepSpeed's ZeRO-2 reduces each micro-batch's gradients, exposed
            group = self._dense_shards()
            reduces = self._deepspeed_reduces(self.params(i, n), group, self._coll(group))
            t = t + PhaseTime(communication=reduces, dp_comm=reduces)
        if deepspeed_zero3(self.model, self.plan):   # its ZeRO-3 reduces the last bucket after each backward
            group = self._dense_shards()
            last = self._coll(group)("reduce_scatter", reduced_grad_bytes(self.model, self.plan)
                                     * self._last_bucket(self.params(i, n))) if group > 1 else 0.0
            t = t + PhaseTime(communication=last, dp_comm=last)
        return t

    def tail(self, i: int, n, r: str, k=0):
        """(exposed data-parallel communication, the token table's gradient sum included
        (:meth:`table_sync_s`), optimizer step) after the stage's last backward;
        ``n`` (and a ``block`` stage's ``k``) may be arrays of layer counts. Only the windows that
        hide the reduction depend on the recompute (:meth:`_tail_parts` keeps the rest)."""
        params, colls, opt_s, table_s = self._tail_parts(i, n)
        if colls is None:
            return 0.0 * params + table_s, opt_s
        # gradients accumulate over micro-batches: only the last backward can hide their reduction;
        # FSDP under a pipeline schedule reduce-scatters them after it, and gathers the weights
        # under the next step's first forward (FSDP2 prefetches the next layer's)
        once = self.plan.fsdp_once
        bwd_window = self._layers("bwd", self.layers_on(i, n), r, k) if self.plan.dp_overlap and not once \
            else 0.0 * params
        if len(colls) == 2:
            # distributed optimizer: reduce-scatter the gradients under the last backward,
            # all-gather the updated weights under the next step's first forward
            fwd_window = self._layers("fwd", self.layers_on(i, n), r, k) if self.plan.dp_overlap or once \
                else 0.0 * params
            return (exposed(colls[0], bwd_window, self.eff) + exposed(colls[1], fwd_window, self.eff) + table_s,
                    opt_s)
        return exposed(colls[0], bwd_window, self.eff) + table_s, opt_s

    def _tail_parts(self, i: int, n):
        """(parameters, the data-parallel collectives' times or None, optimizer seconds, the table's
        gradient sum's seconds) of stage ``i`` with ``n`` layers: what :meth:`tail` needs that no
        recompute mode changes, kept per (stage, counts) as the placement asks for them under
        every mode."""
        key = (i, n.shape, n.tobytes()) if isinstance(n, np.ndarray) else (i, n)
        hit = self._tails.get(key)
        if hit is not None:
            return hit
        plan, chip, eff = self.plan, self.chip, self.eff
        p = self.model.bytes_per_element
        dp = plan.dp(self.devices)
        params = self.params(i, n)
        shard = shard_ranks(plan, self.devices, chip)
        replicas = dp // shard     # hybrid sharding: each shard group's gradients all-reduced over them
        group, stride = shard * plan.cp, plan.tp   # rank order tp, cp, dp, pp (Megatron, torchtitan)
        grad_bytes, wire = main_grad_bytes(self.model, plan), reduced_grad_bytes(self.model, plan)

        coll = self._coll(group, stride)

        experts = self.expert_params(self.layers_on(i, n)) if self.model.moe else 0.0
        edp, e_replicas = expert_shard(plan, self.devices, chip)
        base = coll

        def across(per_param):   # each shard group's gradients all-reduced over its replicas
            out = 0.0 * params
            if replicas > 1:
                out = out + base("all_reduce", per_param * (params - experts) / group, replicas, stride * group)
            if self.model.moe and e_replicas > 1:
                out = out + base("all_reduce", per_param * experts / edp, e_replicas, plan.etp * plan.ep * edp)
            return out

        if self.model.moe:   # dense gradients over dp x cp, the experts' over the expert-DP group
            dense_coll = coll

            def coll(kind, nbytes):
                per = nbytes / params
                return (dense_coll(kind, per * (params - experts))
                        + dense_coll(kind, per * experts, edp, plan.etp * plan.ep))

        colls = None
        scalars = self._deepspeed_scalars(coll) if deepspeed_zero3(self.model, plan) and group > 1 else 0.0
        if (group > 1 or (self.model.moe and edp > 1)) and state_zero(plan) < 3:
            if plan.zero >= 1:
                if deepspeed_zero(self.model, plan):   # at stage 2 the reduces ran every micro-batch
                    reduce = self._deepspeed_scalars(coll) + (
                        0.0 * params if self._zero2() else self._deepspeed_reduces(params, group, coll))
                else:   # DeepSpeed's BF16_Optimizer all-reduces the whole gradients
                    reduce = coll("all_reduce" if deepspeed_bf16(self.model, plan) else "reduce_scatter", wire * params)
                colls = (reduce,
                         coll("all_gather", gathered_bytes(self.model, plan, p * params,
                                                           self.fp8_weights(i, n) if plan.fp8_params else 0.0)))
            else:
                colls = (coll("all_reduce", wire * params),)
        # hybrid sharding (no replicas without ZeRO): under the last backward, after the reduce-scatter
        if replicas > 1 or (self.model.moe and e_replicas > 1):
            colls = (across(wire),) if colls is None else (colls[0] + across(wire), *colls[1:])
        opt = optimizer_op(1.0, plan.optimizer, self.model.precision, grad_bytes, plan.zero)   # per parameter
        updated = self.updated_params(i, n)
        opt_s = np.maximum(opt.flops * updated / chip.vector_flops_per_s,
                           opt.bytes * updated / (chip.hbm_bandwidth_bytes_per_s * eff.hbm_fraction))
        stream, passes = self._step_passes(i, n)   # per-tensor checks, copies, the zeroed buffer
        opt_s = opt_s + stream / (chip.hbm_bandwidth_bytes_per_s * eff.hbm_fraction)
        for tp, tensors, count in passes:
            opt_s = opt_s + tensor_pass_time(tp, tensors, count, chip, eff)
        cast = self.weight_cast_bytes(i, n, updated / params)
        if cast is not None:
            opt_s = opt_s + cast / (chip.hbm_bandwidth_bytes_per_s * eff.hbm_fraction)
        # the fourth: exposed after the last backward beside the reduction (the table's gradient
        # sum; DeepSpeed's ZeRO-3 step's two scalar all-reduces, its reduction being per layer)
        hit = self._tails[key] = (params, colls, opt_s + kernel_overhead(chip, eff), self.table_sync_s(i) + scalars)
        return hit

    def _coll(self, group: int, stride: int | None = None):
        """A data-parallel collective's seconds as a function ``(kind, nbytes, group, stride)`` of
        its bytes (scalars or arrays; ``group`` and ``stride`` default to these): affine in them,
        slope and start-up from :func:`phaze.cost.collective_time`, kept per (kind, group, stride)."""
        stride = self.plan.tp if stride is None else stride
        chip, eff = self.chip, self.eff

        def coll(kind, nbytes, group=group, stride=stride):
            key = (kind, group, stride)
            if key not in self._affine:
                one = collective_time(kind, 1.0, group, chip, stride, eff)
                self._affine[key] = (one, collective_time(kind, 2.0, group, chip, stride, eff) - one)
            one, slope = self._affine[key]
            return slope * (nbytes - 1.0) + one
        return coll

    def _deepspeed_reduces(self, params, group: int, coll):
        """Seconds of DeepSpeed's ZeRO optimizer's gradient reduction (:func:`deepspeed_zero`;
        DeepSpeed 0.9.5 runtime/zero/stage_1_and_2.py ``average_tensor``): each bucket is reduced
        by one ``dist.reduce`` a partition, each to the rank that owns it, one after another on
        the compute stream, where a reduce-scatter would run one collective. On a ring a reduce
        of S/n bytes moves S/n over each link, so the n of them move n/(n - 1) times the
        reduce-scatter's bytes: costed as that reduce-scatter of n/(n - 1) times the gradients,
        plus a start-up for each further reduce (n for each of Megatron-DeepSpeed's two parameter
        groups, and one more for each bucket beyond the first). At stage 1 after the last
        backward, at stage 2 after every backward (:meth:`time`)."""
        plan, chip = self.plan, self.chip
        wire = reduced_grad_bytes(self.model, plan)
        if group <= 1:
            return coll("reduce_scatter", wire * params)
        reduces = 2 * group + deepspeed_buckets(params) - 1
        return (coll("reduce_scatter", wire * params * group / (group - 1))
                + (reduces - 1) * chip.collective_latency_s)

    def _deepspeed_scalars(self, coll):
        """Seconds of the ZeRO optimizer's step all-reducing its overflow flag and, in fp16 or at
        stage 3, its gradient norm over data parallelism, a scalar each (``has_overflow``,
        ``get_grad_norm_direct``)."""
        both = self.model.precision == "fp16" or deepspeed_zero3(self.model, self.plan)
        return (2 if both else 1) * coll("all_reduce", 4.0)

    def table_sync_s(self, i: int) -> float:
        """Seconds stage ``i`` spends summing the token table's gradients with the other stage that
        holds a copy: when the last of several stages keeps its own copy (:meth:`_table_copy`, a
        tied head or multi-token prediction), the first and last stages all-reduce the two copies'
        gradients once a step, after the data-parallel reduction and before the optimizer, nothing
        running beside it (Megatron-Core 0.16.1 finalize_model_grads.py
        ``_allreduce_word_embedding_grads``, over the embedding group of the two stages; Megatron-LM's
        2021 training.py ``_allreduce_embedding_grads``; DeepSpeed's pipeline engine
        ``reduce_tied_grads``). The table's vocabulary-parallel shard (1/tp), its main gradients'
        bytes (4 in fp32), between ranks ``pp - 1`` stages apart; under FSDP each rank's shard of it."""
        nbytes = self.table_sync_bytes(i)
        if not nbytes:
            return 0.0
        plan = self.plan
        stride = plan.tp * plan.cp * plan.dp(self.devices) * (plan.pp - 1)
        return collective_time("all_reduce", nbytes, 2, self.chip, stride, self.eff)

    def table_sync_bytes(self, i: int) -> float:
        """Bytes of the token table's gradients stage ``i`` all-reduces with the other copy's stage
        (:meth:`table_sync_s`); 0 where it holds no shared copy."""
        plan, m, pp = self.plan, self.model, self.plan.pp
        if pp == 1 or i not in (0, pp - 1) or not self._table_copy(pp - 1):
            return 0.0
        nbytes = main_grad_bytes(m, plan) * m.table_params / plan.tp
        if state_zero(plan) >= 3:
            nbytes /= shard_ranks(plan, self.devices, self.chip) * plan.cp
        return nbytes

    def memory_table(self, r: str, ns: np.ndarray, ks=0) -> np.ndarray:
        """``memory(i, n, r, k).total_bytes`` for every stage ``i`` (rows) and layer count in ``ns``
        (columns; ``ks``: a block stage's layers re-run whole, broadcast to [stages, counts]), with
        the same floating-point operations in the same order."""
        plan, m = self.plan, self.model
        pp, v, tp = plan.pp, plan.vp, plan.tp
        i = np.arange(pp, dtype=float)[:, None]
        inflight = inflight_micro_batches(pp, v, self.micro_batches, i)
        given = ns
        ns = np.broadcast_to(ns, (pp, len(ns))).astype(float)
        ns[pp - 1] += m.mtp_layers   # the last stage's multi-token prediction layers (:meth:`layers_on`)
        q = ns * tp_layer_params(m, tp)
        q[0] += m.embedding_params
        q[pp - 1] += m.head_params + m.mtp_layers * m.mtp_module_params
        if self._table_copy(pp - 1):
            q[pp - 1] += m.table_params
        if r != "block":
            transient = np.full((pp, 1), self.full_act_bytes if r != "none" else 0.0)
        else:       # a layer re-materialised where some re-run whole
            transient = np.where(np.broadcast_to(np.asarray(ks) > 0, ns.shape), self.full_act_bytes, 0.0)
        transient = transient + np.zeros(ns.shape)
        bucket = self.bucket_buffer_bytes()
        transient[pp - 1] += self.logits_bytes() + bucket
        transient += cp_transient_bytes(m, plan)
        transient += self.gathered_layer_bytes()
        cache = self._weight_cache()
        act = self._layers("act_bytes", ns, r, ks) * inflight
        step = self.step_bytes_per_param()
        if step:   # as memory(): the optimizer step's buffers once the activations are freed
            counts = np.asarray(given, dtype=float)
            updated = np.stack([self.updated_params(s, counts) for s in range(pp)])
            transient = np.maximum(transient, step * updated + bucket - act)
        if m.moe:
            return (self.state_bytes_per_param * (q / tp + ns * self._expert_shift()) + ns * self._expert_state_shift()
                    + ns * cache + act + transient)
        return self.state_bytes_per_param * (q / tp) + ns * cache + act + transient

    def step_bytes_per_param(self) -> float:
        """Bytes the optimizer step holds beyond the state per parameter it updates
        (:func:`phaze.memory.optimizer_step_bytes_per_param`)."""
        m = self.model
        return optimizer_step_bytes_per_param(self.plan.optimizer, m.precision, main_grad_bytes(m, self.plan))

    def bucket_buffer_bytes(self) -> float:
        """Bytes of DeepSpeed's ZeRO optimizer's bucket buffer (:func:`deepspeed_zero`): 16-bit,
        :data:`DEEPSPEED_BUCKET_ELEMENTS` long whatever the gradients (``torch.empty`` of
        ``reduce_bucket_size``). The stage that computes the loss allocates it before each backward
        (runtime/zero/stage_1_and_2.py ``backward``, which the engine calls there) and holds it
        through it; every stage holds one for the reduction after the last backward (the pipeline
        engine's ``reduce_gradients``); 0 otherwise. At stage 2 (one stage) it holds the
        gradients until their reduction; the partition's new gradients beside the accumulated
        ones (2 bytes an updated parameter) are not counted. Its ZeRO-3 optimizer allocates its
        bucket buffer once and holds it, and ``reduce_scatter_coalesced`` flattens each bucket
        into a copy of it while it is reduced: two buckets (assumption: the copy is counted at a
        whole bucket, as a stage of over 500M parameters' first buckets are)."""
        if deepspeed_zero3(self.model, self.plan):
            return 2.0 * 2.0 * DEEPSPEED_BUCKET_ELEMENTS
        return 2.0 * DEEPSPEED_BUCKET_ELEMENTS if deepspeed_zero(self.model, self.plan) else 0.0

    def gathered_layer_bytes(self) -> float:
        """FSDP gathering per micro-batch: one layer's gathered 16-bit weights and the next one's,
        prefetched, those of each unit that gathers (:func:`fsdp_units`: a mixture of experts'
        own experts; a unit whose group is one rank holds its weights whole already, counted in
        the state, and gathers nothing); 0 otherwise. Until 2026-12-07 every unit was counted."""
        plan, m = self.plan, self.model
        if state_zero(plan) < 3:
            return 0.0
        own = sum(u[0] for u in fsdp_units(m, plan, self.devices, self.chip))
        return 2 * m.bytes_per_element * own

    def logits_bytes(self) -> float:
        """The last stage's fp32 logits for the loss, one micro-batch: the main head's and each
        multi-token prediction module's, whose losses are all taken in the forward pass and
        kept for the backward. Transformer Engine's loss (``loss=te``) upcasts nothing: it keeps
        the 16-bit logits, its gradient written over them. Soft-capped logits (Gemma 2) keep the
        tanh's 16-bit output beside them."""
        plan, m = self.plan, self.model
        width = m.bytes_per_element if plan.loss == "te" else 4.0
        if m.logit_softcap:   # the soft-cap's tanh keeps its 16-bit output (Gemma 2)
            width += m.bytes_per_element
        return (1 + m.mtp_layers) * width * plan.mbs * (m.seq_len // plan.cp) * m.vocab / plan.tp

    def memory(self, i: int, n: int, r: str, k: int = 0) -> StageMemory:
        """Peak bytes on a device of stage ``i``: under 1F1B it holds min(pp - i, m) micro-batches."""
        weights, act, transient, step = self._memory_parts(i, n, r, k)
        if step is not None:   # the optimizer step's buffers, after the last backward has freed the activations
            transient = max(transient, step - act)
        return StageMemory(i, n, weights, act, transient)

    def pair_memory(self, rank: int, counts, recomputes, full_layers) -> StageMemory:
        """Peak bytes on rank ``rank`` under DualPipe (``pipe_schedule`` dualpipe): it holds stages
        ``h`` and ``pp - 1 - h`` (``h = min(rank, pp - 1 - rank)``), both with their parameters and
        state (the report's 2x), and :func:`phaze.dualpipe.peak_inflight` micro-batches of each
        one's activations (pp - h and h + 1); one layer re-materialised at a time, and the optimizer
        step's buffers for both stages' shards once the activations are freed. The two end ranks
        hold the first and last stages together, and with them the token table once
        (:meth:`_table_copy`)."""
        pp, m = self.plan.pp, self.micro_batches
        held = dualpipe.peak_inflight(pp, m, rank)            # by direction
        stages = [dualpipe.chunk_stage(pp, rank, d) for d in (0, 1)]
        parts = [self._memory_parts(s, counts[s], recomputes[s], full_layers[s], held[d]) for d, s in enumerate(stages)]
        weights, act = parts[0][0] + parts[1][0], parts[0][1] + parts[1][1]
        step = None if parts[0][3] is None else parts[0][3] + parts[1][3]
        transient = max(parts[0][2], parts[1][2])
        if step is not None:
            transient = max(transient, step - act)
        return StageMemory(rank, int(counts[stages[0]] + counts[stages[1]]), weights, act, transient)

    def _memory_parts(self, i: int, n: int, r: str, k: int = 0, inflight=None):
        """(weights and state, activations, transient, the optimizer step's bytes or None) of stage
        ``i``, holding ``inflight`` micro-batches' activations (default: its 1F1B count)."""
        plan, m = self.plan, self.model
        pp, v = plan.pp, plan.vp
        if inflight is None:
            inflight = inflight_micro_batches(pp, v, self.micro_batches, i)
        recomputes = r != "none" and (r != "block" or k > 0)
        transient = self.full_act_bytes if recomputes else 0.0    # one layer re-materialised
        bucket = self.bucket_buffer_bytes()
        if i == pp - 1:   # fp32 logits for the loss, and DeepSpeed's bucket buffer through the backward
            transient += self.logits_bytes() + bucket
        transient += cp_transient_bytes(m, plan)
        transient += self.gathered_layer_bytes()
        weights = self.state_bytes_per_param * self.params(i, n)
        runs = self.layers_on(i, n)
        if m.moe:
            weights = weights + runs * self._expert_state_shift()
        weights = weights + runs * self._weight_cache()
        act = self._layers("act_bytes", runs, r, k) * inflight
        step = self.step_bytes_per_param()
        return weights, act, transient, (step * self.updated_params(i, n) + bucket if step else None)

    def chunk_times(self, i: int, n: int, r: str, k=0) -> tuple[float, float, float]:
        """(forward, backward, weight gradients) seconds of one micro-batch on stage ``i``, for
        :mod:`phaze.dualpipe`: :meth:`time`'s total split in the proportion of its layers'
        forward and backward (the edges', sends' and accumulation's shares split alike), and of
        the backward the layers' weight-gradient GEMMs (:func:`wgrad_share`), which a
        zero-bubble backward defers."""
        total = self.time(i, n, r, k).total
        runs = self.layers_on(i, n)
        f, b = self._layers("fwd", runs, r, k), self._layers("bwd", runs, r, k)
        fwd = total * f / (f + b)
        if r == "block":
            w = (self.mode("none").bwd.total * self._wgrad("none") * (runs - k)
                 + self.mode("full").bwd.total * self._wgrad("full") * k)
        else:
            w = self.mode(r).bwd.total * self._wgrad(r) * runs
        return fwd, total - fwd, min(w, total - fwd)

    def _wgrad(self, r: str) -> float:
        return wgrad_share(self.model, self.chip, mode_layout(self.plan), self.eff, r)


def tensor_pass_time(passes: TensorPasses, tensors, params, chip: Chip, eff: Efficiency):
    """Seconds of a per-tensor pass (:class:`phaze.graph.TensorPasses`) over ``tensors``
    parameter tensors holding ``params`` parameters. Synchronised, nothing overlaps: each
    tensor's kernels and its copy to the host pay their host issue and launch one after another,
    plus the bytes. Otherwise the host issues the kernels ahead of the device: the longer of the
    host's issue time and the device's launches plus bytes (scalars or arrays)."""
    if not passes.launches:
        return 0.0 * tensors
    h, k = cost.host_overhead(chip, eff), kernel_overhead(chip, eff)
    stream = (passes.read + passes.write) * params / (chip.hbm_bandwidth_bytes_per_s * eff.hbm_fraction)
    if passes.synced:
        return tensors * (passes.launches + 1) * (h + k) + stream
    return np.maximum(tensors * passes.launches * h, tensors * passes.launches * k + stream)


@dataclass(frozen=True)
class ModeCosts:
    """One layer, one micro-batch, under one recompute mode."""

    layer: PhaseTime       # forward + backward, with exposed FSDP / context-parallel traffic
    fwd: PhaseTime
    bwd: PhaseTime         # recompute included
    act_bytes: float       # stored activations
    # ``layer`` without its group parts (set from it): what the placement's arrays of layer counts
    # multiply, which need its total alone (StageCosts.time, groups False)
    main: PhaseTime = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        t = self.layer
        object.__setattr__(self, "main", PhaseTime(t.compute, t.memory, t.communication, t.async_hidden))


@lru_cache(maxsize=4096)
def fsdp_units(model: Model, plan: Plan, devices: int, chip: Chip) -> tuple[tuple[float, float, int, int], ...]:
    """The collectives FSDP runs per layer, each ``(parameters, of them linear weights, ranks,
    stride)`` for one device: the dense weights (``tp``'s share) over the shard group and context
    parallelism (stride tp); a mixture of experts' routed experts (``ep`` x ``etp``'s share) over
    their own shard group of the expert data-parallel ranks (stride ep x etp), as torchtitan wraps
    the experts in their own ``fully_shard`` over its ``dp_shard_mod_ep`` mesh under expert
    parallelism and Megatron-Core's FSDP keeps expert weights in buffers of the expert
    data-parallel group (megatron-core 0.16.1 ``megatron_fsdp/param_and_grad_buffer.py``). One
    collective when the two groups coincide (no expert parallelism: one FSDP unit a layer).
    Groups of one rank gather nothing and are left out."""
    tp, width = plan.tp, plan.ep * plan.etp
    dense, fp8 = tp_layer_params(model, tp) / tp, fp8_linear_params(model, tp) / tp
    shards = shard_ranks(plan, devices, chip) * plan.cp
    edp = expert_shard(plan, devices, chip)[0] if model.moe else shards
    if not model.moe or (edp, width) == (shards, tp):   # the experts are tp's share, in the layer's unit
        units = ((dense, fp8, shards, tp),)
    else:
        experts, own = model.expert_layer_params / tp, model.expert_layer_params / width
        units = ((dense - experts, fp8 - experts, shards, tp), (own, own, edp, width))
    return tuple(u for u in units if u[2] > 1)


def tp_layer_params(model: Model, tp: int) -> int:
    """Parameters of one layer summed over its ``tp`` ranks: ``layer_params``, plus the copies of
    the K/V projections when tp exceeds the KV heads (each rank holds one whole KV head, as
    Megatron replicates them)."""
    if tp <= model.kv_heads or not model.attention_layers:
        return model.layer_params
    bias = 1 if (model.bias or model.qkv_bias) else 0
    copies = 2 * (model.hidden + bias) * (tp * kv_width(model, tp) - model.kv_dim)
    if model.hybrid:   # only the attention layers have K/V projections
        return model.layer_params + copies * model.attention_layers / model.layers
    return model.layer_params + copies


@lru_cache(maxsize=4096)
def fp8_linear_params(model: Model, tp: int) -> float:
    """Parameters of one layer's linear weights summed over its ``tp`` ranks: what an fp8 run
    quantises (:func:`tp_layer_params` less the layer's norms; the biases and the router, under
    0.1 % of a layer, counted with them)."""
    if model.hybrid:   # each layer's norm; a Mamba-2 mixer's convolution, A, D, dt bias and gated norm
        w = model.hybrid_pattern.count("M") / model.layers
        linear = model.hidden * model.mamba_in_width + model.mamba_inner * model.hidden
        return tp_layer_params(model, tp) - model.norm_params - w * (model.mamba_params - linear)
    return tp_layer_params(model, tp) - model.layer_norms * model.norm_params


def gathered_bytes(model: Model, plan: Plan, nbytes: float, fp8_params: float) -> float:
    """Bytes of a weight gather of ``nbytes`` in the model's 16-bit precision, of which ``fp8_params``
    parameters are linear weights: those move one byte each under ``fp8_params``."""
    if not plan.fp8_params:
        return nbytes
    return nbytes - (model.bytes_per_element - 1) * fp8_params


def caches_fp8_weights(model: Model, plan: Plan) -> bool:
    """Whether a device keeps each step's fp8 casts of its 16-bit linear weights, both layouts
    (2 bytes a parameter), through the step: Transformer Engine's modules under Megatron-Core
    (``fp8_casts`` fused), which pass ``is_first_microbatch`` so the first micro-batch casts the
    weights and the others reuse the cast (Transformer Engine 2.4 ``module/base.py``
    ``get_weight_workspace``, ``cache_name="weight"``). Not with fp8 weights (the weight is its own
    cast), nor under FSDP, whose gathered weights are freed after each layer."""
    return model.fp8_fused and not plan.fp8_params and state_zero(plan) < 3


def main_grad_bytes(model: Model, plan: Plan) -> int:
    """Bytes of one main gradient: fp32 where the plan reduces in fp32 (``reduce_fp32``) or
    DeepSpeed's BF16_Optimizer keeps fp32 copies (``adam-deepspeed`` not in fp16), else the
    model's 16-bit element, which DeepSpeed's ZeRO optimizer keeps whatever its wire
    (:func:`deepspeed_zero`)."""
    if deepspeed_bf16(model, plan):
        return 4
    if deepspeed_zero(model, plan) or deepspeed_zero3(model, plan):   # the model's type (its
        return model.bytes_per_element                                 # grad_accum_dtype); the wire's may differ
    return 4 if plan.reduce_fp32 else model.bytes_per_element


def reduced_grad_bytes(model: Model, plan: Plan) -> int:
    """Bytes of one gradient on the data-parallel wire: the main gradient's, but under
    ``adam-deepspeed`` DeepSpeed's ``communication_data_type``, fp32 with ``reduce_fp32`` and
    else the run's 16-bit type, its default (DeepSpeed 0.9.5 runtime/engine.py: the
    BF16_Optimizer's fp32 gradients are cast to bf16 for the all-reduce and back)."""
    if plan.optimizer == "adam-deepspeed":
        return 4 if plan.reduce_fp32 else model.bytes_per_element
    return main_grad_bytes(model, plan)


def deepspeed_zero(model: Model, plan: Plan) -> bool:
    """Whether DeepSpeed's ZeRO optimizer runs (``adam-deepspeed``; DeepSpeed 0.9.5
    runtime/zero/stage_1_and_2.py): at stage 2, or at stage 1 in fp16 (bf16 at stage 1 runs
    BF16_Optimizer, :func:`deepspeed_bf16`: the pipeline engine reduces only its fp32 gradients,
    ``_bf16_reduce_grads``). It copies the gradients into a bucket buffer and reduces each
    partition to its rank (:meth:`StageCosts._deepspeed_reduces`,
    :func:`phaze.graph.deepspeed_zero_passes`)."""
    return runs_deepspeed_zero(plan.optimizer, model.precision, plan.zero)


def deepspeed_zero3(model: Model, plan: Plan) -> bool:
    """Whether DeepSpeed's ZeRO-3 optimizer runs (``adam-deepspeed`` with ``zero`` 3; DeepSpeed
    0.9.5 runtime/zero/stage3.py): the 16-bit weights partitioned and gathered by hooks module by
    module, forward and backward (FSDP's per-layer collectives, one all-gather a weight tensor);
    each micro-batch's gradients copied into a bucket buffer and reduce-scattered bucket by
    bucket beside the backward (``overlap_comm``, on at stage 3), the last bucket after it; the
    step on the rank's partition (:func:`phaze.graph.deepspeed_zero3_passes`). Refused with
    pipeline parallelism and a mixture of experts (:func:`phaze.plan_check.check_plan`)."""
    return plan.optimizer == "adam-deepspeed" and plan.zero >= 3


def deepspeed_buckets(params):
    """Buckets DeepSpeed fills with ``params`` gradients of :data:`DEEPSPEED_BUCKET_ELEMENTS`
    (scalars or arrays): one at least."""
    return np.maximum(1.0, np.ceil(params / DEEPSPEED_BUCKET_ELEMENTS))


def deepspeed_bf16(model: Model, plan: Plan) -> bool:
    """Whether DeepSpeed's BF16_Optimizer runs (``adam-deepspeed`` not in fp16). It keeps fp32
    gradients (:func:`main_grad_bytes`) and shards its fp32 weights and Adam state (ZeRO-1), but
    all-reduces the whole gradients, then all-gathers the updated 16-bit weights (DeepSpeed 0.9.5
    runtime/bf16_optimizer.py ``update_lp_params``; its pipeline engine's ``_bf16_reduce_grads``):
    no reduce-scatter."""
    return plan.optimizer == "adam-deepspeed" and model.precision != "fp16" and plan.zero < 2


def _shard(model: Model, plan: Plan) -> Model:
    """Context parallelism splits each sequence over cp devices: a layer holds seq/cp tokens,
    whose queries attend over the whole sequence's keys (``Model.context_parallel``)."""
    if plan.cp == 1:
        return model
    return replace(with_seq_len(model, model.seq_len // plan.cp), context_parallel=plan.cp,
                   context_parallel_comm=plan.cp_comm, context_parallel_a2a=plan.cp_a2a)


@lru_cache(maxsize=65536)
def mode_costs(model: Model, chip: Chip, devices: int, plan: Plan, eff: Efficiency,
               r: str) -> ModeCosts:
    """The costs of one layer of the layout ``plan`` under recompute ``r`` (a selective one: the
    plan's Megatron-Core modules, :func:`phaze.plan.graph_recompute`)."""
    r = graph_recompute(r, plan.recompute_modules, plan.offload)
    fwd, bwd = layer_time(_shard(model, plan), chip, plan.mbs, plan.tp, plan.sp, plan.attention, r, eff,
                          plan.schedule, expert_layout(model, plan, chip))
    f, b, total = _layer_costs(model, chip, devices, plan, eff, fwd, bwd, r)
    return ModeCosts(total, f, b, _act_bytes(model, plan, r))


@lru_cache(maxsize=4096)
def wgrad_share(model: Model, chip: Chip, plan: Plan, eff: Efficiency, r: str) -> float:
    """The share of one layer's backward operator time (recompute included) that its
    weight-gradient GEMMs (``*.wgrad``) take under recompute ``r``: the part a zero-bubble
    schedule defers (:mod:`phaze.dualpipe`), in the mean layer (:func:`layer_mix`)."""
    def share(m: Model, moe) -> float:
        g = layer_graph(_shard(m, plan), plan.mbs, plan.tp, plan.sp, plan.attention,
                        graph_recompute(r, plan.recompute_modules, plan.offload), moe, chip.compiled)
        groups = collective_groups(plan.tp, moe)
        times = [(o.name.endswith(".wgrad"), op_time(o, chip, m.precision, eff, groups=groups,
                                                      bytes_per_element=m.bytes_per_element)) for o in g.bwd]
        total = sum(t for _, t in times)
        return sum(t for w, t in times if w) / total if total else 0.0

    return _mean([(w, share(m, lm)) for w, m, lm in layer_mix(model, expert_layout(model, plan, chip))])


@lru_cache(maxsize=65536)
def mode_cost_bounds(model: Model, chip: Chip, devices: int, plan: Plan, eff: Efficiency,
                     r: str) -> ModeCosts:
    """A lower bound of :func:`mode_costs` for the placement search, from
    :func:`layer_time_bounds`: the layer time from the lower bounds of the phases, and the
    forward and backward windows that hide data-parallel traffic from their upper bounds (a
    longer window hides more). A stage's time (monotone in the layer's phases) and its tail
    (non-increasing in the windows) are then at most their values with the optimal schedules,
    and so is the step time of every stage assignment."""
    return _bound_costs(model, chip, devices, plan, eff, r, upper=False)


@lru_cache(maxsize=65536)
def mode_cost_upper(model: Model, chip: Chip, devices: int, plan: Plan, eff: Efficiency,
                    r: str) -> ModeCosts:
    """An upper bound of :func:`mode_costs`: the layer time from the list schedules' makespans
    (feasible schedules, so at least the optimum) and the windows that hide data-parallel traffic
    from the lower bounds (a shorter window hides less). Every stage assignment's step time under
    it is at least its step time with the optimal layer schedules."""
    return _bound_costs(model, chip, devices, plan, eff, r, upper=True)


def _bound_costs(model: Model, chip: Chip, devices: int, plan: Plan, eff: Efficiency, r: str,
                 upper: bool) -> ModeCosts:
    """:func:`mode_cost_bounds` (``upper`` False) or :func:`mode_cost_upper`: the layer time from
    one side of the phases' bounds, the windows that hide data-parallel traffic from the other."""
    r = graph_recompute(r, plan.recompute_modules, plan.offload)
    lo, hi = layer_time_bounds(_shard(model, plan), chip, plan.mbs, plan.tp, plan.sp, plan.attention, r, eff,
                               plan.schedule, expert_layout(model, plan, chip))
    time_side, window_side = (hi, lo) if upper else (lo, hi)
    _, _, total = _layer_costs(model, chip, devices, plan, eff, *time_side, r)
    f, b, _ = _layer_costs(model, chip, devices, plan, eff, *window_side, r)
    return ModeCosts(total, f, b, _act_bytes(model, plan, r))


@lru_cache(maxsize=65536)
def _act_bytes(model: Model, plan: Plan, r: str) -> float:
    return activation_bytes_per_layer(_shard(model, plan), plan.mbs, plan.tp, plan.sp, r, plan.attention)


def _cp_blocks(model: Model, plan: Plan) -> tuple[float, float, float]:
    """Bytes one context-parallel rank holds per layer and micro-batch: its K and V, its Q, and
    its attention output (``tp``'s share of the heads, ``seq/cp`` tokens, 16-bit). V is as wide as
    the value heads (MLA's 128 beside its 192-wide keys); key/value heads copied to one per query
    head (``kv_repeat`` copied) are exchanged as the copies the attention reads."""
    tokens = model.bytes_per_element * plan.mbs * (model.seq_len // plan.cp)
    kv_heads = kv_heads_read(model, plan.tp)
    return (tokens * kv_heads * (model.head_dim + model.v_head_dim), tokens * (model.q_dim // plan.tp),
            tokens * (model.o_dim // plan.tp))


def cp_transient_bytes(model: Model, plan: Plan) -> float:
    """Bytes context parallelism holds for the layer in flight beyond the ring's blocks: the
    gathered K and V of ``all_gather`` and ``torch``, and ``torch``'s fp32 dQ, dK, dV accumulators
    and received dK, dV."""
    if plan.cp == 1 or plan.cp_comm not in ("all_gather", "torch"):
        return 0.0
    kv, q, _ = _cp_blocks(model, plan)
    extra = (q + 2 * kv) * 4 / model.bytes_per_element if plan.cp_comm == "torch" else 0.0
    return plan.cp * kv + extra


def cp_sent_bytes(model: Model, plan: Plan, r: str, compiled: bool = False) -> float:
    """Bytes a device sends for context parallelism per layer and micro-batch, forward and
    backward (and a recompute's re-run of the attention), under ``plan.cp_comm``."""
    cp = plan.cp
    if cp == 1:
        return 0.0
    kv, q, o = _cp_blocks(model, plan)
    passes = 2 if _reruns_attention(model, plan, r, compiled) else 1   # the forward's exchanges

    def ulysses(group: int) -> float:   # Q, K, V and the output there; dO and dQ, dK, dV back
        return (group - 1) / group * (passes * (q + kv + o) + o + q + kv)

    def ring_of(steps: int) -> float:   # K/V each step, then K/V and dK/dV
        return (steps - 1) * (kv * passes + 2 * kv)

    if plan.cp_comm == "a2a":
        return ulysses(cp)
    if plan.cp_comm == "a2a+p2p":     # a2a's inside a group of cp_a2a, p2p's over the cp / cp_a2a groups
        return ulysses(plan.cp_a2a) + ring_of(cp // plan.cp_a2a)
    if plan.cp_comm == "all_gather":  # each gather and the gradients' reduce-scatter: (cp-1)/cp of cp blocks
        return (cp - 1) * kv * (passes + 2)
    if plan.cp_comm == "torch":       # gathers as all_gather; fp32 dK, dV round the ring (cp sends)
        return (cp - 1) * kv * (passes + 1) + cp * kv * 4 / model.bytes_per_element
    return ring_of(cp)


@lru_cache(maxsize=16384)
def _reruns_attention(model: Model, plan: Plan, r: str, compiled: bool) -> bool:
    """Whether the backward under recompute ``r`` re-runs the core attention (full, Megatron-Core's
    core_attn), and with it context parallelism's forward exchange."""
    g = layer_graph(_shard(model, plan), plan.mbs, plan.tp, plan.sp, plan.attention, r, None, compiled)
    return any(o.core_attention and o.name.startswith("recompute.") for o in g.bwd)


@lru_cache(maxsize=16384)
def _cp_exposed(model: Model, chip: Chip, plan: Plan, eff: Efficiency, r: str) -> float:
    """Exposed time of context parallelism's K/V exchange, one layer and micro-batch
    (:attr:`phaze.plan.Plan.cp_comm`). The cp ranks sit at stride tp (Megatron's and torchtitan's
    order: tp innermost, then cp), so a ring's slowest hop is on the link level that holds tp * cp
    devices, and a collective spans cp ranks tp apart.

    - ``p2p`` (Transformer Engine's ring): each of the cp - 1 steps sends the K and V block a rank
      holds to the next rank while the attention of the step's block runs: forward once, backward
      K/V again plus dK/dV, and again in a recompute's re-run of the attention; only the attention
      kernel of that step hides it.
    - ``all_gather`` (``AttnFuncWithCPAndKVAllGather``: "KV all-gather between CP ranks is
      exposed"): K and V gathered before the forward and again before the backward, which
      reduce-scatters dK and dV after it; nothing hides them.
    - ``a2a`` (``AttnFuncWithCPAndQKVOA2A``, DeepSpeed-Ulysses): all-to-alls of Q, K, V before the
      attention and of its output after; of dO before the backward and of dQ, dK, dV after it;
      exposed: the attention needs all of them.
    - ``a2a+p2p`` (``AttnFuncWithCPAndKVP2P`` with ``cp_group = [a2a, p2p]``): ``a2a``'s exchanges
      inside each group of ``cp_a2a`` adjacent cp ranks (tp apart), then ``p2p``'s ring over the
      cp / cp_a2a groups: the K and V block a rank holds is as large as ``p2p``'s (cp_a2a times
      the tokens of a cp_a2a-th of the heads), and each step hides under a (cp_a2a / cp)-th of
      the attention.
    - ``torch`` (torch 2.6-2.13 ``_templated_ring_attention``, default ``_RotateMethod.ALL_GATHER``):
      K and V gathered once, the gather in flight under the first step (the local block, 1/cp of
      the attention), in the forward and again in the backward; the backward passes the fp32
      dK and dV (``convert_to_f32``) to the next rank after each step, each pass under the next
      step's attention and the last after the loop, exposed."""
    cp = plan.cp
    shard = _shard(model, plan)
    kv, q, o = _cp_blocks(model, plan)
    g = layer_graph(shard, plan.mbs, plan.tp, plan.sp, plan.attention, r, None, chip.compiled)

    def attention(ops, recomputed: bool) -> float:   # one ring step's share of the attention
        return sum(op_time(o, chip, model.precision, eff, bytes_per_element=model.bytes_per_element)
                   for o in ops if o.core_attention and o.name.startswith("recompute.") == recomputed) / cp

    f, b, rerun = attention(g.fwd, False), attention(g.bwd, False), attention(g.bwd, True)
    ring = max(1, plan.tp * cp // 2)    # a ring's slowest hop: two ranks tp * cp / 2 apart

    def send(nbytes: float) -> float:
        return collective_time("send", nbytes, 2, chip, ring, eff)

    def coll(kind: str, nbytes: float, group: int = cp) -> float:
        return collective_time(kind, nbytes, group, chip, plan.tp, eff)

    def ulysses(group: int) -> float:   # one all-to-all a tensor (flash_attn_a2a_communicate)
        inputs = coll("all_to_all", q, group) + 2 * coll("all_to_all", kv / 2, group)
        forward = inputs + coll("all_to_all", o, group)
        return forward * (1 + (rerun > 0)) + coll("all_to_all", o, group) + inputs

    def ring_of(steps: int, share: float) -> float:   # steps blocks, each under share x the attention
        hop, hop2 = send(kv), send(2 * kv)
        out = exposed(hop, f * share, eff) + exposed(hop2, b * share, eff)
        if rerun:   # a recompute that re-runs the attention (full, Megatron-Core's core_attn) re-exchanges K/V
            out += exposed(hop, rerun * share, eff)
        return (steps - 1) * out

    if plan.cp_comm == "all_gather":   # K and V apart (gather_along_first_dim each), dK and dV too
        gather = 2 * coll("all_gather", cp * kv / 2)
        return gather * (2 + (rerun > 0)) + 2 * coll("reduce_scatter", cp * kv / 2)
    if plan.cp_comm == "a2a":
        return ulysses(cp)
    if plan.cp_comm == "a2a+p2p":      # the groups' all-to-alls, then a ring of cp / cp_a2a steps
        return ulysses(plan.cp_a2a) + ring_of(cp // plan.cp_a2a, plan.cp_a2a)
    if plan.cp_comm == "torch":
        gather = coll("all_gather", cp * kv)
        grads = send(kv * 4 / model.bytes_per_element)
        out = exposed(gather, f, eff) + exposed(gather, b, eff) + (cp - 1) * exposed(grads, b, eff) + grads
        return out + (exposed(gather, rerun, eff) if rerun else 0.0)
    return ring_of(cp, 1.0)


def _layer_costs(model: Model, chip: Chip, devices: int, plan: Plan, eff: Efficiency, fwd: PhaseTime,
                 bwd: PhaseTime, r: str = "none") -> tuple[PhaseTime, PhaseTime, PhaseTime]:
    """(forward, backward, forward + backward with exposed FSDP / ring traffic) of one layer whose
    phases take ``fwd`` and ``bwd``; every part is monotone in them."""
    tp = plan.tp
    p = model.bytes_per_element
    if plan.tp_overlap:   # collectives under the GEMMs: the tensor-parallel ones, or every one under XLA
        fwd, bwd = _tp_overlapped(fwd, chip, eff), _tp_overlapped(bwd, chip, eff)
    elif plan.tp_async:   # Megatron's asynchronous backward collectives, each under its GEMM
        fwd = fwd._replace(communication=fwd.communication - fwd.async_hidden,
                           tp_comm=fwd.tp_comm - fwd.async_hidden, async_hidden=0.0)
        bwd = bwd._replace(communication=bwd.communication - bwd.async_hidden,
                           tp_comm=bwd.tp_comm - bwd.async_hidden, async_hidden=0.0)
    total = fwd + bwd
    if plan.cp > 1:
        ring = _cp_exposed(model, chip, plan, eff, r)
        total = total + PhaseTime(communication=ring, cp_comm=ring)
    units = fsdp_units(model, plan, devices, chip) if state_zero(plan) >= 3 else ()
    if units:
        # FSDP, per layer and micro-batch: the next layer's weights are gathered under this
        # layer's forward; in backward they are gathered again and the gradients
        # reduce-scattered on the same communication stream, under the layer's backward.
        # DeepSpeed's ZeRO-3 gathers module by module: one all-gather a weight tensor (its norms
        # and biases, under stage3_param_persistence_threshold's 1e5 elements, stay whole)
        grad_bytes = reduced_grad_bytes(model, plan)
        k = model.layer_tensors() - model.layer_tensors(hooked=True) if deepspeed_zero3(model, plan) else 1
        gather = sum(k * collective_time("all_gather", gathered_bytes(model, plan, p * params, fp8) / k, group,
                                         chip, stride, eff) for params, fp8, group, stride in units)
        scatter = sum(collective_time("reduce_scatter", grad_bytes * params, group, chip, stride, eff)
                      for params, _, group, stride in units)
        shown = (exposed(gather, fwd.compute + fwd.memory, eff)
                 + exposed(gather + scatter, bwd.compute + bwd.memory, eff))
        total = total + PhaseTime(communication=shown, dp_comm=shown)
    host = offloaded_bytes(_shard(model, plan), plan.mbs, tp, r) if plan.offload else 0.0
    if host:
        # sent to the host as the forward makes them and fetched back ahead of the backward (JAX's
        # offload: XLA's asynchronous copies), each under its phase's compute, over the host link
        move = host / (chip.host_bandwidth_bytes_per_s * eff.link_fraction)
        shown = exposed(move, fwd.compute + fwd.memory, eff) + exposed(move, bwd.compute + bwd.memory, eff)
        total = total + PhaseTime(communication=shown, host_comm=shown)
    return fwd, bwd, total


def _tp_overlapped(t: PhaseTime, chip: Chip, eff: Efficiency) -> PhaseTime:
    """A phase under ``tp_overlap``: on an eager GPU Transformer Engine's userbuffers cover its
    tensor-parallel collectives (a mixture of experts' all-to-alls and expert-tensor-parallel
    gathers stay exposed); XLA runs every collective asynchronously beside the compute, and what
    shows of them is split among the groups in proportion to their time."""
    if not chip.compiled:
        shown = exposed(t.tp_comm, t.compute, eff)
        return PhaseTime(t.compute, t.memory, t.communication - t.tp_comm + shown, tp_comm=shown,
                         ep_comm=t.ep_comm)
    shown = exposed(t.communication, t.compute, eff)
    share = shown / t.communication if t.communication else 0.0
    return PhaseTime(t.compute, t.memory, shown, tp_comm=t.tp_comm * share, ep_comm=t.ep_comm * share)


@lru_cache(maxsize=4096)
def stage_costs(model: Model, chip: Chip, devices: int, global_batch: int, plan: Plan,
                eff: Efficiency = IDEAL) -> StageCosts:
    """Per-stage costs of a layout; per-layer costs of each recompute mode come from
    :meth:`StageCosts.mode`. ``plan``'s recompute and stage fields are ignored: callers pass the
    layout only."""
    tp, pp, v = plan.tp, plan.pp, plan.vp
    dp = plan.dp(devices)
    p = model.bytes_per_element
    shard = _shard(model, plan)
    emb, head = edge_time(shard, chip, plan.mbs, tp, plan.sp, eff, plan.loss)
    send = 0.0
    if pp > 1:
        # scatter/gather (Narayanan et al. SC'21, 4.1): each of the tp ranks sends 1/tp of the
        # activation over its own link; without sequence parallelism the receivers re-gather it
        act = p * plan.mbs * shard.seq_len * model.hidden
        # pipeline stages are outermost in the rank order: neighbours tp * cp * dp ranks apart
        one = collective_time("send", act / tp, 2, chip, tp * plan.cp * dp, eff)
        if tp > 1 and not plan.sp:
            one += collective_time("all_gather", act, tp, chip, 1, eff)
        transfers = 2
        if plan.pipe_p2p == "blocking":
            # DeepSpeed's pipeline engine: a split tensor's metadata (a LongTensor: its sizes and
            # the partition bounds) goes first, each send and receive blocking in turn; between
            # two stages a micro-batch waits through four transfers, two at either end
            # (its TrainSchedule's order: SendGrad then RecvActivation, RecvGrad then SendActivation)
            if tp > 1:
                one += collective_time("send", 8 * (7 + tp), 2, chip, tp * plan.cp * dp, eff)
            transfers = 4 if pp > 2 else 2
        send = transfers * v * one
        if plan.pipe_p2p == "overlapped" and v > 1:
            # Megatron-Core's overlap_p2p_comm (schedules.py, forward_backward_pipelining_with_
            # interleaving: pp_post_forward and pp_post_backward post send_*_recv_* asynchronously,
            # pp_pre_forward and pp_pre_backward wait for them): a forward's transfer runs under
            # the backward chunk computed next, a backward's under the next forward chunk, so each
            # is hidden under at least a chunk's forward (its fewest layers, no recompute)
            chunk = max(1, model.layers // (pp * v))
            window = chunk * mode_costs(model, chip, devices, mode_layout(plan), eff, "none").fwd.total
            send = transfers * v * exposed(one, window, eff)
    full_act = activation_bytes_per_layer(shard, plan.mbs, tp, plan.sp, "none", plan.attention)
    # fp32 gradient reduction keeps fp32 main gradients (Megatron's --accumulate-allreduce-grads-in-fp32:
    # 18 bytes per parameter with Adam, 6 + 12/d with the distributed optimizer)
    grad_bytes = main_grad_bytes(model, plan)
    return StageCosts(model, plan, devices, global_batch // (dp * plan.mbs), full_act, emb, head, send,
                      state_bytes_per_param(plan.optimizer, state_zero(plan),
                                            shard_ranks(plan, devices, chip) * plan.cp, p, grad_bytes), chip, eff)


def state_zero(plan: Plan) -> int:
    """The ZeRO stage a plan's state is held at: FSDP that keeps a pipeline stage's weights and
    gradients whole through the step (:attr:`phaze.plan.Plan.fsdp_once`) holds them as the
    distributed optimizer does, the optimizer state and fp32 weights sharded, the 16-bit weights
    and the reduce-precision gradients whole (FSDP2 accumulates them in its reduce dtype)."""
    return 1 if plan.fsdp_once else plan.zero


def mode_layout(plan: Plan) -> Plan:
    """The key of a layer's costs: the layout without its interleaving and pipeline schedule, which
    change the pipeline (its sends, bubble and in-flight activations), not one layer's time (so
    every vp and schedule shares the cached layer costs)."""
    if plan.vp != 1 or plan.pipe_schedule != "1f1b":
        return replace(plan, vp=1, pipe_schedule="1f1b")
    return plan


def clear_caches(workload_too: bool = False) -> None:
    """Empty this module's in-memory caches (layer times, stage costs and their bounds); with
    ``workload_too`` also the chip-independent activation sizes (:func:`phaze.step.clear_caches`
    empties the rest of the evaluation path's)."""
    for f in (_graph_sums, _layer_sums, layer_time, layer_time_bounds, edge_time, mode_costs, mode_cost_bounds,
              mode_cost_upper, stage_costs):
        f.cache_clear()
    if workload_too:
        _act_bytes.cache_clear()
