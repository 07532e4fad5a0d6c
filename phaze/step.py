"""Step time of one training step under a given plan: the function every later stage calls.

``evaluate`` is pure and cached by its arguments: (workload, chip, cluster, batch, plan,
efficiency) -> :class:`StepResult`. Layer times are the makespans of the layers' optimal
schedules (on a GPU, the sum of the operators: its kernels run one after another); pipeline,
data-parallel and optimizer terms follow shared/DESIGN.md section 5.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

import numpy as np

from .arch import Chip
from .configio import ConfigError
from .cost import IDEAL, Efficiency, collective_time, op_time
from .graph import edge_graph, layer_graph, optimizer_op, tensor_flops
from .memory import StageMemory, activation_bytes_per_layer, memory_reserve_bytes, state_bytes_per_param
from .plan import Plan
from .workload import Model, with_seq_len


@dataclass(frozen=True)
class PhaseTime:
    """Seconds of one op sequence, split by what bounds it."""

    compute: float = 0.0        # tensor-unit ops (GEMMs, fused attention)
    memory: float = 0.0         # vector-unit ops: element-wise, norms, softmax (bandwidth-bound)
    communication: float = 0.0  # collectives on the links

    @property
    def total(self) -> float:
        return self.compute + self.memory + self.communication

    def __add__(self, o: PhaseTime) -> PhaseTime:
        return PhaseTime(self.compute + o.compute, self.memory + o.memory,
                         self.communication + o.communication)

    def __mul__(self, k: float) -> PhaseTime:
        return PhaseTime(self.compute * k, self.memory * k, self.communication * k)


def exposed(comm, cover, eff: Efficiency):
    """Time ``comm`` adds when it runs concurrently with ``cover`` seconds of compute: what does
    not fit under it, plus the slowdown the overlapped part causes (scalars or arrays)."""
    if isinstance(comm, np.ndarray) or isinstance(cover, np.ndarray):
        return np.maximum(0.0, comm - cover) + eff.overlap_slowdown * np.minimum(comm, cover)
    return max(0.0, comm - cover) + eff.overlap_slowdown * min(comm, cover)


def _sum_ops(ops, chip: Chip, precision: str, eff: Efficiency, groups: dict, p: int) -> PhaseTime:
    acc = {"compute": 0.0, "memory": 0.0, "communication": 0.0}
    for op in ops:
        t = op_time(op, chip, precision, eff, groups=groups, bytes_per_element=p)
        key = {"link": "communication", "vector": "memory"}.get(op.unit, "compute")
        acc[key] += t
    return PhaseTime(**acc)


@lru_cache(maxsize=16384)
def _layer_sums(model: Model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str, recompute: str,
                eff: Efficiency) -> tuple[PhaseTime, PhaseTime]:
    """(forward, backward) sums of the layer's operator times, split by what bounds each op."""
    g = layer_graph(model, mbs, tp, sp, attention, recompute)
    groups = {"tp": (tp, 1)}
    p = model.bytes_per_element
    return (_sum_ops(g.fwd, chip, model.precision, eff, groups, p),
            _sum_ops(g.bwd, chip, model.precision, eff, groups, p))


@lru_cache(maxsize=65536)
def layer_time(model: Model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str,
               recompute: str, eff: Efficiency = IDEAL,
               schedule: str = "optimal") -> tuple[PhaseTime, PhaseTime]:
    """(forward, backward incl. recompute) time of one layer for one micro-batch.

    ``optimal``: the makespan of the CP-SAT schedule of each phase on the chip's units
    (:mod:`phaze.schedule`), its parts scaled from the operators' sums; ``sequential``: the sum
    of the operator times. On a chip whose units are shared sequentially (a GPU) the optimal
    schedule is that sum, computed directly."""
    fwd, bwd = _layer_sums(model, chip, mbs, tp, sp, attention, recompute, eff)
    if schedule == "sequential" or chip.unit_sharing == "sequential":
        return fwd, bwd
    from .schedule import schedule_layer
    sf, sb = schedule_layer(model, chip, mbs, tp, sp, attention, recompute, eff)
    return fwd * (sf.makespan_s / fwd.total), bwd * (sb.makespan_s / bwd.total)


@lru_cache(maxsize=16384)
def layer_time_bounds(model: Model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str,
                      recompute: str, eff: Efficiency = IDEAL, schedule: str = "optimal"
                      ) -> tuple[tuple[PhaseTime, PhaseTime], tuple[PhaseTime, PhaseTime]]:
    """((forward, backward) lower bounds, (forward, backward) upper bounds) of :func:`layer_time`,
    without a solver: the critical-path and energy bounds and the list schedule of each phase
    (:func:`phaze.schedule.layer_bounds`), split into parts as :func:`layer_time` splits them."""
    fwd, bwd = _layer_sums(model, chip, mbs, tp, sp, attention, recompute, eff)
    if schedule == "sequential" or chip.unit_sharing == "sequential":
        return (fwd, bwd), (fwd, bwd)
    from .schedule import layer_bounds
    (fl, fh), (bl, bh) = layer_bounds(model, chip, mbs, tp, sp, attention, recompute, eff)
    return ((fwd * (fl / fwd.total), bwd * (bl / bwd.total)),
            (fwd * (fh / fwd.total), bwd * (bh / bwd.total)))


@lru_cache(maxsize=16384)
def edge_time(model: Model, chip: Chip, mbs: int, tp: int, sp: bool,
              eff: Efficiency = IDEAL) -> tuple[PhaseTime, PhaseTime]:
    """(embedding, head) time per micro-batch, forward plus backward."""
    e = edge_graph(model, mbs, tp, sp)
    groups = {"tp": (tp, 1)}
    p = model.bytes_per_element
    return (_sum_ops(e["embedding"], chip, model.precision, eff, groups, p),
            _sum_ops(e["head"], chip, model.precision, eff, groups, p))


@lru_cache(maxsize=4096)
def model_flops_per_sample(model: Model) -> float:
    """Model FLOPs of one sequence, forward and backward, no recompute, non-causal attention
    counted in full (the Narayanan / MFU convention)."""
    g = layer_graph(model, 1, 1, False, "standard", "none")
    e = edge_graph(model, 1, 1, False)
    return model.layers * tensor_flops(g.ops) + tensor_flops(e["embedding"] + e["head"])


def stage_layers(layers: int, pp: int) -> tuple[int, ...]:
    """Even contiguous split; the remainder goes to the middle stages, away from the first
    (embedding) and last (logits and loss) stages."""
    base, extra = divmod(layers, pp)
    counts = [base] * pp
    order = sorted(range(pp), key=lambda i: (i in (0, pp - 1), abs(i - (pp - 1) / 2)))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


@dataclass(frozen=True)
class StepResult:
    workload: str
    chip: str
    devices: int
    global_batch: int
    plan: str
    dp: int
    micro_batches: int
    step_time_s: float
    samples_per_s: float
    tokens_per_s: float
    model_flops_per_step: float
    mfu: float
    hfu: float
    memory_per_device_bytes: float
    hbm_bytes: float
    fits: bool
    binding_stage: int
    breakdown_s: dict = field(default_factory=dict)
    stage_memory: tuple = ()
    memory_reserve_bytes: float = 0.0   # kept free for the runtime (CUDA context, NCCL, fragmentation)
    headroom_bytes: float = 0.0         # HBM - reserve - the binding stage's need (negative: does not fit)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stage_memory"] = [dict(asdict(m), total_bytes=m.total_bytes) for m in self.stage_memory]
        return d

    def memory_message(self) -> str:
        m = self.stage_memory[self.binding_stage]
        return (f"needs {m.total_bytes / 1e9:.1f} GB per device on stage {m.stage}, "
                f"chip has {self.hbm_bytes / 1e9:.1f} GB")

    def __repr__(self) -> str:
        return (f"StepResult({self.workload} on {self.devices} x {self.chip}, batch {self.global_batch}, "
                f"plan {self.plan}: step {self.step_time_s:.4g} s, {self.tokens_per_s:,.0f} tokens/s, "
                f"MFU {100 * self.mfu:.1f} %, memory {self.memory_per_device_bytes / 2 ** 30:.1f} of "
                f"{self.hbm_bytes / 2 ** 30:.1f} GiB (reserve {self.memory_reserve_bytes / 2 ** 30:.1f}, "
                f"headroom {self.headroom_bytes / 2 ** 30:.1f}), {'fits' if self.fits else 'DOES NOT FIT'})")

    def _repr_html_(self) -> str:
        from html import escape
        gib = 2.0 ** 30
        rows = [("workload", self.workload), ("cluster", f"{self.devices} x {self.chip}"),
                ("global batch", f"{self.global_batch}"), ("plan", self.plan),
                ("dp, micro-batches", f"{self.dp}, {self.micro_batches}"),
                ("step time", f"{self.step_time_s:.4g} s"), ("throughput", f"{self.tokens_per_s:,.0f} tokens/s"),
                ("MFU / HFU", f"{100 * self.mfu:.1f} % / {100 * self.hfu:.1f} %"),
                ("memory per device", f"{self.memory_per_device_bytes / gib:.1f} GiB of {self.hbm_bytes / gib:.1f}"
                                      f" GiB, reserve {self.memory_reserve_bytes / gib:.1f} GiB, headroom "
                                      f"{self.headroom_bytes / gib:.1f} GiB: "
                                      f"{'fits' if self.fits else 'DOES NOT FIT'}")]
        rows += [(k.removesuffix("_s").replace("_", " "), f"{v:.4g} s") for k, v in self.breakdown_s.items()]
        body = "".join(f"<tr><th style='text-align:left'>{escape(k)}</th><td style='text-align:left'>"
                       f"{escape(v)}</td></tr>" for k, v in rows)
        return f"<table>{body}</table>"


def check_plan(model: Model, devices: int, global_batch: int, plan: Plan) -> None:
    """Raise :class:`ConfigError` naming the plan field and what is allowed."""
    def divisors(n):
        return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
    if devices < 1:
        raise ConfigError("--devices", None, f"must be a positive integer, got {devices}")
    if global_batch < 1:
        raise ConfigError("--global-batch", None, f"must be a positive integer, got {global_batch}")
    if model.heads % plan.tp or model.ffn_hidden % plan.tp:
        raise ConfigError("--plan", "tp", f"must divide the heads ({model.heads}) and FFN width "
                          f"({model.ffn_hidden}) of {model.name}; allowed: "
                          f"{divisors(math.gcd(model.heads, model.ffn_hidden))}")
    if model.kv_heads % plan.tp and plan.tp % model.kv_heads:
        raise ConfigError("--plan", "tp", f"must divide or be a multiple of the kv heads "
                                          f"({model.kv_heads}), got {plan.tp}")
    width = plan.tp * plan.pp * plan.cp
    if devices % width:
        raise ConfigError("--plan", "tp*pp*cp", f"{plan.tp}*{plan.pp}*{plan.cp} = {width} must divide "
                                               f"the devices ({devices})")
    if plan.pp * plan.vp > model.layers:
        raise ConfigError("--plan", "pp", f"pp*vp must be <= layers ({model.layers}), "
                                          f"got {plan.pp * plan.vp}")
    if plan.vp > 1 and (plan.pp == 1 or model.layers % (plan.pp * plan.vp)):
        raise ConfigError("--plan", "vp", f"interleaving needs pp > 1 and pp*vp dividing the "
                                          f"layers ({model.layers}), got pp={plan.pp}, vp={plan.vp}")
    if plan.sp and plan.tp > 1 and model.seq_len % plan.tp:
        raise ConfigError("--plan", "sp", f"sequence parallelism needs tp ({plan.tp}) to divide "
                                          f"the sequence length ({model.seq_len})")
    if model.seq_len % plan.cp:
        raise ConfigError("--plan", "cp", f"must divide the sequence length ({model.seq_len})")
    if plan.stages and (len(plan.stages) != plan.pp or sum(plan.stages) != model.layers):
        raise ConfigError("--plan", "stages", f"must give pp = {plan.pp} layer counts summing to the "
                                              f"layers ({model.layers}), got {':'.join(map(str, plan.stages))}")
    if plan.stages and plan.vp > 1 and any(n % plan.vp for n in plan.stages):
        raise ConfigError("--plan", "stages", f"with vp = {plan.vp} every stage's layers must be a "
                                              f"multiple of vp")
    if plan.stage_recompute and len(plan.stage_recompute) != plan.pp:
        raise ConfigError("--plan", "stage_recompute", f"must give one mode per stage (pp = {plan.pp}), "
                                                       f"got {len(plan.stage_recompute)}")
    dp = devices // width
    if global_batch % (dp * plan.mbs):
        raise ConfigError("--global-batch", None, f"must be a multiple of dp*mbs = {dp}*{plan.mbs} "
                                                  f"= {dp * plan.mbs}, got {global_batch}")


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

    def mode(self, r: str) -> ModeCosts:
        """One layer's costs under recompute ``r`` (computed on first use, then kept)."""
        if r not in self._modes:
            self._modes[r] = mode_costs(self.model, self.chip, self.devices, self.plan, self.eff, r)
        return self._modes[r]

    def params(self, i: int, n: int) -> float:
        """Parameters one device of stage ``i`` holds with ``n`` layers."""
        m, pp = self.model, self.plan.pp
        q = n * m.layer_params
        if i == 0:
            q += m.embedding_params
        if i == pp - 1:
            q += m.head_params
            if m.tied_embeddings and pp > 1:   # the last stage keeps its own copy of the table
                q += m.vocab * (m.embedding_projection_dim or m.hidden)
        return q / self.plan.tp

    def time(self, i: int, n: int, r: str) -> PhaseTime:
        """Stage ``i`` with ``n`` layers and recompute ``r``: one micro-batch forward + backward."""
        t = self.mode(r).layer * n + PhaseTime(communication=self.send_s)
        if i == 0:
            t = t + self.embedding
        if i == self.plan.pp - 1:
            t = t + self.head
        return t

    def tail(self, i: int, n, r: str):
        """(exposed data-parallel communication, optimizer step) after the stage's last backward;
        ``n`` may be an array of layer counts."""
        plan, chip, eff = self.plan, self.chip, self.eff
        p = self.model.bytes_per_element
        dp = plan.dp(self.devices)
        params = self.params(i, n)
        group, stride = dp * plan.cp, (plan.tp * plan.pp if plan.cp == 1 else plan.tp)
        grad_bytes = 4 if plan.reduce_fp32 else p

        def coll(kind, nbytes):   # a collective's time is affine in its size: slope + latency
            one = collective_time(kind, 1.0, group, chip, stride, eff)
            return (collective_time(kind, 2.0, group, chip, stride, eff) - one) * (nbytes - 1.0) + one

        exposed_s = 0.0 * params
        if group > 1 and plan.zero < 3:
            # gradients accumulate over micro-batches: only the last backward can hide their reduction
            bwd_window = self.mode(r).bwd.total * n if plan.dp_overlap else 0.0 * params
            if plan.zero >= 1:
                # distributed optimizer: reduce-scatter the gradients under the last backward,
                # all-gather the updated weights under the next step's first forward
                fwd_window = self.mode(r).fwd.total * n if plan.dp_overlap else 0.0 * params
                exposed_s = (exposed(coll("reduce_scatter", grad_bytes * params), bwd_window, eff)
                             + exposed(coll("all_gather", p * params), fwd_window, eff))
            else:
                exposed_s = exposed(coll("all_reduce", grad_bytes * params), bwd_window, eff)
        opt = optimizer_op(1.0, plan.optimizer)    # per parameter; the update is element-wise
        updated = params / (group if plan.zero >= 1 else 1)
        opt_s = np.maximum(opt.flops * updated / chip.vector_flops_per_s,
                           opt.bytes * updated / (chip.hbm_bandwidth_bytes_per_s * eff.hbm_fraction))
        return exposed_s, opt_s + eff.kernel_overhead_s

    def memory_table(self, r: str, ns: np.ndarray) -> np.ndarray:
        """``memory(i, n, r).total_bytes`` for every stage ``i`` (rows) and layer count in ``ns``
        (columns), with the same floating-point operations in the same order."""
        plan, m = self.plan, self.model
        pp, v, tp = plan.pp, plan.vp, plan.tp
        i = np.arange(pp, dtype=float)[:, None]
        inflight = np.minimum(pp - i, self.micro_batches) * (1 + (pp - 1) / (pp * v) if v > 1 else 1.0)
        q = np.broadcast_to(ns * m.layer_params, (pp, len(ns))).copy()
        q[0] += m.embedding_params
        q[pp - 1] += m.head_params
        if m.tied_embeddings and pp > 1:
            q[pp - 1] += m.vocab * (m.embedding_projection_dim or m.hidden)
        transient = np.full((pp, 1), self.full_act_bytes if r != "none" else 0.0)
        transient[pp - 1] += 4.0 * plan.mbs * (m.seq_len // plan.cp) * m.vocab / plan.tp
        if plan.zero >= 3:
            transient += 2 * m.bytes_per_element * m.layer_params / plan.tp
        return self.state_bytes_per_param * (q / tp) + ns * self.mode(r).act_bytes * inflight + transient

    def memory(self, i: int, n: int, r: str) -> StageMemory:
        """Peak bytes on a device of stage ``i``: under 1F1B it holds min(pp - i, m) micro-batches."""
        plan, m = self.plan, self.model
        pp, v = plan.pp, plan.vp
        inflight = min(pp - i, self.micro_batches) * (1 + (pp - 1) / (pp * v) if v > 1 else 1.0)
        transient = self.full_act_bytes if r != "none" else 0.0    # one layer re-materialised
        if i == pp - 1:   # fp32 logits for the loss
            transient += 4.0 * plan.mbs * (m.seq_len // plan.cp) * m.vocab / plan.tp
        if plan.zero >= 3:
            transient += 2 * m.bytes_per_element * m.layer_params / plan.tp   # gathered layer weights
        return StageMemory(i, n, self.state_bytes_per_param * self.params(i, n),
                           n * self.mode(r).act_bytes * inflight, transient)


@dataclass(frozen=True)
class ModeCosts:
    """One layer, one micro-batch, under one recompute mode."""

    layer: PhaseTime       # forward + backward, with exposed FSDP / context-parallel traffic
    fwd: PhaseTime
    bwd: PhaseTime         # recompute included
    act_bytes: float       # stored activations


def _shard(model: Model, plan: Plan) -> Model:
    """Context parallelism splits each sequence over cp devices: a layer sees seq/cp tokens."""
    return model if plan.cp == 1 else with_seq_len(model, model.seq_len // plan.cp)


@lru_cache(maxsize=65536)
def mode_costs(model: Model, chip: Chip, devices: int, plan: Plan, eff: Efficiency,
               r: str) -> ModeCosts:
    """The costs of one layer of the layout ``plan`` under recompute ``r``."""
    fwd, bwd = layer_time(_shard(model, plan), chip, plan.mbs, plan.tp, plan.sp, plan.attention, r, eff,
                          plan.schedule)
    f, b, total = _layer_costs(model, chip, devices, plan, eff, fwd, bwd)
    return ModeCosts(total, f, b, _act_bytes(model, plan, r))


@lru_cache(maxsize=65536)
def mode_cost_bounds(model: Model, chip: Chip, devices: int, plan: Plan, eff: Efficiency,
                     r: str) -> ModeCosts:
    """A lower bound of :func:`mode_costs` for the placement search, from
    :func:`layer_time_bounds`: the layer time from the lower bounds of the phases, and the
    forward and backward windows that hide data-parallel traffic from their upper bounds (a
    longer window hides more). A stage's time (monotone in the layer's phases) and its tail
    (non-increasing in the windows) are then at most their values with the optimal schedules,
    and so is the step time of every stage assignment."""
    lo, hi = layer_time_bounds(_shard(model, plan), chip, plan.mbs, plan.tp, plan.sp, plan.attention, r, eff,
                               plan.schedule)
    _, _, total = _layer_costs(model, chip, devices, plan, eff, *lo)
    f, b, _ = _layer_costs(model, chip, devices, plan, eff, *hi)
    return ModeCosts(total, f, b, _act_bytes(model, plan, r))


@lru_cache(maxsize=65536)
def _act_bytes(model: Model, plan: Plan, r: str) -> float:
    return activation_bytes_per_layer(_shard(model, plan), plan.mbs, plan.tp, plan.sp, r, plan.attention)


def _layer_costs(model: Model, chip: Chip, devices: int, plan: Plan, eff: Efficiency, fwd: PhaseTime,
                 bwd: PhaseTime) -> tuple[PhaseTime, PhaseTime, PhaseTime]:
    """(forward, backward, forward + backward with exposed FSDP / ring traffic) of one layer whose
    phases take ``fwd`` and ``bwd``; every part is monotone in them."""
    tp, pp, dp = plan.tp, plan.pp, plan.dp(devices)
    p = model.bytes_per_element
    shard = _shard(model, plan)
    if plan.tp_overlap:   # collectives run under the GEMMs; only what exceeds them shows
        fwd = PhaseTime(fwd.compute, fwd.memory, exposed(fwd.communication, fwd.compute, eff))
        bwd = PhaseTime(bwd.compute, bwd.memory, exposed(bwd.communication, bwd.compute, eff))
    total = fwd + bwd
    if plan.cp > 1:   # ring attention: K and V pass around the cp ring, once forward, twice backward
        kv = p * plan.mbs * shard.seq_len * 2 * model.kv_dim / tp
        ring = 3 * collective_time("all_gather", kv * plan.cp, plan.cp, chip, tp, eff)
        total = total + PhaseTime(communication=exposed(ring, total.compute, eff))
    if plan.zero >= 3 and dp > 1:
        # FSDP, per layer and micro-batch: the next layer's weights are gathered under this
        # layer's forward; in backward they are gathered again and the gradients
        # reduce-scattered on the same communication stream, under the layer's backward
        grad_bytes = 4 if plan.reduce_fp32 else p
        stride = tp * pp * plan.cp
        gather = collective_time("all_gather", p * model.layer_params / tp, dp, chip, stride, eff)
        scatter = collective_time("reduce_scatter", grad_bytes * model.layer_params / tp, dp, chip,
                                  stride, eff)
        total = total + PhaseTime(communication=exposed(gather, fwd.compute + fwd.memory, eff)
                                  + exposed(gather + scatter, bwd.compute + bwd.memory, eff))
    return fwd, bwd, total


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
    emb, head = edge_time(shard, chip, plan.mbs, tp, plan.sp, eff)
    send = 0.0
    if pp > 1:
        # scatter/gather (Narayanan et al. SC'21, 4.1): each of the tp ranks sends 1/tp of the
        # activation over its own link; without sequence parallelism the receivers re-gather it
        act = p * plan.mbs * shard.seq_len * model.hidden
        one = collective_time("send", act / tp, 2, chip, tp * plan.cp, eff)
        if tp > 1 and not plan.sp:
            one += collective_time("all_gather", act, tp, chip, 1, eff)
        send = 2 * v * one
    full_act = activation_bytes_per_layer(shard, plan.mbs, tp, plan.sp, "none", plan.attention)
    # fp32 gradient reduction keeps fp32 main gradients (Megatron's --accumulate-allreduce-grads-in-fp32:
    # 18 bytes per parameter with Adam, 6 + 12/d with the distributed optimizer)
    grad_bytes = 4 if plan.reduce_fp32 else p
    return StageCosts(model, plan, devices, global_batch // (dp * plan.mbs), full_act, emb, head, send,
                      state_bytes_per_param(plan.optimizer, plan.zero, dp * plan.cp, p, grad_bytes), chip, eff)


def layout_of(plan: Plan) -> Plan:
    """The plan without its recompute and stage choices (the key of :func:`stage_costs`)."""
    return replace(plan, recompute="none", stages=(), stage_recompute=())


def step_time_of(costs: StageCosts, counts, recomputes) -> tuple[float, int, int, list[float]]:
    """Step time of a stage assignment under 1F1B: ``m * T_max + (sum T - T_max) / v`` plus the
    largest stage tail (data-parallel reduction not hidden, optimizer). Returns (seconds,
    critical stage, tail stage, stage times). The placement DP minimises this same expression
    over the same :class:`StageCosts` (its tests check the two agree)."""
    m, v = costs.micro_batches, costs.plan.vp
    times = [costs.time(i, n, r).total for i, (n, r) in enumerate(zip(counts, recomputes, strict=False))]
    tails = [sum(costs.tail(i, n, r)) for i, (n, r) in enumerate(zip(counts, recomputes, strict=False))]
    crit = max(range(len(times)), key=times.__getitem__)
    last = max(range(len(tails)), key=tails.__getitem__)
    return (m - 1.0 / v) * times[crit] + sum(times) / v + tails[last], crit, last, times


@lru_cache(maxsize=8192)
def evaluate(model: Model, chip: Chip, devices: int, global_batch: int, plan: Plan,
             eff: Efficiency = IDEAL) -> StepResult:
    """Step time, throughput, utilisation and per-device memory of ``plan``."""
    check_plan(model, devices, global_batch, plan)
    pp, v = plan.pp, plan.vp
    costs = stage_costs(model, chip, devices, global_batch, layout_of(plan), eff)
    counts = plan.stages or stage_layers(model.layers, pp)
    recs = plan.stage_recompute or (plan.recompute,) * pp
    step, crit, last, times = step_time_of(costs, counts, recs)
    per_mb = costs.time(crit, counts[crit], recs[crit])
    m = costs.micro_batches
    bubble = (sum(times) - times[crit]) / v
    dp_exposed, t_opt = costs.tail(last, counts[last], recs[last])
    breakdown = {
        "compute_s": m * per_mb.compute,
        "memory_bound_s": m * per_mb.memory,
        "communication_exposed_s": m * per_mb.communication + dp_exposed,
        "pipeline_bubble_s": bubble,
        "optimizer_s": t_opt,
    }
    flops = model_flops_per_sample(model) * global_batch
    peak = chip.peak_flops(model.precision) * devices
    hw = sum(n * _hardware_flops_per_layer(model, r) for n, r in zip(counts, recs, strict=False)) / model.layers
    hw = (hw + _edge_flops(model)) * global_batch
    stages = [StageMemory(s.stage, int(s.layers), float(s.weights_and_optimizer_bytes), float(s.activation_bytes),
                          float(s.transient_bytes))
              for s in (costs.memory(i, n, r) for i, (n, r) in enumerate(zip(counts, recs, strict=False)))]
    worst = max(range(pp), key=lambda i: stages[i].total_bytes)
    need = stages[worst].total_bytes
    reserve = memory_reserve_bytes(chip, plan.memory_reserve)
    step = float(step)
    return StepResult(
        workload=model.name, chip=chip.name, devices=devices, global_batch=global_batch,
        plan=plan.label(), dp=plan.dp(devices), micro_batches=m, step_time_s=step,
        samples_per_s=global_batch / step, tokens_per_s=global_batch * model.seq_len / step,
        model_flops_per_step=float(flops), mfu=float(flops / (step * peak)), hfu=float(hw / (step * peak)),
        memory_per_device_bytes=need, hbm_bytes=float(chip.hbm_bytes), fits=bool(need + reserve <= chip.hbm_bytes),
        binding_stage=worst, breakdown_s={k: float(v) for k, v in breakdown.items()}, stage_memory=tuple(stages),
        memory_reserve_bytes=reserve, headroom_bytes=float(chip.hbm_bytes - reserve - need))


@lru_cache(maxsize=4096)
def _hardware_flops_per_layer(model: Model, recompute: str) -> float:
    """FLOPs the hardware executes per layer and sequence, recompute included (for HFU)."""
    return model.layers * tensor_flops(layer_graph(model, 1, 1, False, "standard", recompute).ops)


@lru_cache(maxsize=4096)
def _edge_flops(model: Model) -> float:
    e = edge_graph(model, 1, 1, False)
    return tensor_flops(e["embedding"] + e["head"])


def _hardware_flops_per_sample(model: Model, plan: Plan) -> float:
    """FLOPs the hardware executes per sequence under a uniform recompute (for HFU)."""
    return _hardware_flops_per_layer(model, plan.recompute) + _edge_flops(model)


def clear_caches(workload_too: bool = False) -> None:
    """Empty every in-memory cache on the evaluation path that depends on a chip (layer times,
    costs, step results, schedules, bounds, the cost model's GEMM geometry); with
    ``workload_too`` also the chip-independent operator graphs. Every cache is size-capped
    anyway: a long search's memory stays bounded without calling this."""
    from . import cost, schedule
    for f in (_layer_sums, layer_time, layer_time_bounds, edge_time, mode_costs, mode_cost_bounds, stage_costs,
              evaluate, cost._gemm_geometry):
        f.cache_clear()
    schedule.clear_memory_cache()
    if workload_too:
        from . import graph
        for f in (graph.layer_graph, graph.edge_graph, model_flops_per_sample, _hardware_flops_per_layer,
                  _edge_flops, _act_bytes):
            f.cache_clear()
