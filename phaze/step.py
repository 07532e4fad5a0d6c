"""Step time of one training step under a given plan: the function every later stage calls.

``evaluate`` is pure and cached by its arguments: (workload, chip, cluster, batch, plan,
efficiency) -> :class:`StepResult`. Layer times are the sequential sum of their operators (a GPU
runs a layer's kernels one after another); pipeline, data-parallel and optimizer terms follow
shared/DESIGN.md section 5.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from .arch import Chip
from .configio import ConfigError
from .cost import IDEAL, Efficiency, collective_time, op_time, vector_time
from .graph import edge_graph, layer_graph, optimizer_op, tensor_flops
from .memory import StageMemory, activation_bytes_per_layer, state_bytes_per_param
from .plan import Plan
from .workload import Model, with_seq_len

CATEGORIES = ("compute", "memory", "communication")


@dataclass(frozen=True)
class PhaseTime:
    """Seconds of one op sequence, split by what bounds it."""

    compute: float = 0.0        # tensor-unit ops (GEMMs, fused attention)
    memory: float = 0.0         # vector-unit ops: element-wise, norms, softmax (bandwidth-bound)
    communication: float = 0.0  # collectives on the links

    @property
    def total(self) -> float:
        return self.compute + self.memory + self.communication

    def __add__(self, o: "PhaseTime") -> "PhaseTime":
        return PhaseTime(self.compute + o.compute, self.memory + o.memory,
                         self.communication + o.communication)

    def __mul__(self, k: float) -> "PhaseTime":
        return PhaseTime(self.compute * k, self.memory * k, self.communication * k)


def exposed(comm: float, cover: float, eff: Efficiency) -> float:
    """Time ``comm`` adds when it runs concurrently with ``cover`` seconds of compute: what does
    not fit under it, plus the slowdown the overlapped part causes."""
    return max(0.0, comm - cover) + eff.overlap_slowdown * min(comm, cover)


def _sum_ops(ops, chip: Chip, precision: str, eff: Efficiency, groups: dict, p: int) -> PhaseTime:
    acc = {"compute": 0.0, "memory": 0.0, "communication": 0.0}
    for op in ops:
        t = op_time(op, chip, precision, eff, groups=groups, bytes_per_element=p)
        key = {"link": "communication", "vector": "memory"}.get(op.unit, "compute")
        acc[key] += t
    return PhaseTime(**acc)


@lru_cache(maxsize=65536)
def layer_time(model: Model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str,
               recompute: str, eff: Efficiency = IDEAL) -> tuple[PhaseTime, PhaseTime]:
    """(forward, backward incl. recompute) time of one layer for one micro-batch, sequential."""
    g = layer_graph(model, mbs, tp, sp, attention, recompute)
    groups = {"tp": (tp, 1)}
    p = model.bytes_per_element
    return (_sum_ops(g.fwd, chip, model.precision, eff, groups, p),
            _sum_ops(g.bwd, chip, model.precision, eff, groups, p))


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

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stage_memory"] = [dict(asdict(m), total_bytes=m.total_bytes) for m in self.stage_memory]
        return d

    def memory_message(self) -> str:
        m = self.stage_memory[self.binding_stage]
        return (f"needs {m.total_bytes / 1e9:.1f} GB per device on stage {m.stage}, "
                f"chip has {self.hbm_bytes / 1e9:.1f} GB")


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
    dp = devices // width
    if global_batch % (dp * plan.mbs):
        raise ConfigError("--global-batch", None, f"must be a multiple of dp*mbs = {dp}*{plan.mbs} "
                                                  f"= {dp * plan.mbs}, got {global_batch}")


@lru_cache(maxsize=65536)
def evaluate(model: Model, chip: Chip, devices: int, global_batch: int, plan: Plan,
             eff: Efficiency = IDEAL) -> StepResult:
    """Step time, throughput, utilisation and per-device memory of ``plan``."""
    check_plan(model, devices, global_batch, plan)
    tp, pp, v = plan.tp, plan.pp, plan.vp
    dp = plan.dp(devices)
    m = global_batch // (dp * plan.mbs)
    # context parallelism splits each sequence over cp devices: a layer sees seq/cp tokens
    shard = model if plan.cp == 1 else with_seq_len(model, model.seq_len // plan.cp)
    fwd, bwd = layer_time(shard, chip, plan.mbs, tp, plan.sp, plan.attention, plan.recompute, eff)
    emb, head = edge_time(shard, chip, plan.mbs, tp, plan.sp, eff)
    p = model.bytes_per_element
    if plan.tp_overlap:   # collectives run under the GEMMs; only what exceeds them shows
        fwd = PhaseTime(fwd.compute, fwd.memory, exposed(fwd.communication, fwd.compute, eff))
        bwd = PhaseTime(bwd.compute, bwd.memory, exposed(bwd.communication, bwd.compute, eff))
    layer = fwd + bwd
    if plan.cp > 1:   # ring attention: K and V pass around the cp ring, once forward, twice backward
        kv = p * plan.mbs * shard.seq_len * 2 * model.kv_dim / tp
        ring = 3 * collective_time("all_gather", kv * plan.cp, plan.cp, chip, tp, eff)
        layer = layer + PhaseTime(communication=exposed(ring, layer.compute, eff))
    counts = stage_layers(model.layers, pp)
    grad_bytes = 4 if plan.reduce_fp32 else p
    if plan.zero >= 3 and dp > 1:
        # FSDP, per layer and micro-batch: the next layer's weights are gathered under this
        # layer's forward; in backward they are gathered again and the gradients reduce-scattered
        # on the same communication stream, under the layer's backward
        group = (dp, tp * pp * plan.cp)
        gather = collective_time("all_gather", p * model.layer_params / tp, group[0], chip, group[1], eff)
        scatter = collective_time("reduce_scatter", grad_bytes * model.layer_params / tp, group[0], chip,
                                  group[1], eff)
        layer = layer + PhaseTime(communication=exposed(gather, fwd.compute + fwd.memory, eff)
                                  + exposed(gather + scatter, bwd.compute + bwd.memory, eff))
    send = 0.0
    if pp > 1:
        # scatter/gather (Narayanan et al. SC'21, 4.1): each of the tp ranks sends 1/tp of the
        # activation over its own link; without sequence parallelism the receivers re-gather it
        act = p * plan.mbs * shard.seq_len * model.hidden
        one = collective_time("send", act / tp, 2, chip, tp * plan.cp, eff)
        if tp > 1 and not plan.sp:
            one += collective_time("all_gather", act, tp, chip, 1, eff)
        send = 2 * v * one
    stage_t = []
    for i, n in enumerate(counts):
        t = layer * n + PhaseTime(communication=send)
        if i == 0:
            t = t + emb
        if i == pp - 1:
            t = t + head
        stage_t.append(t)
    crit = max(range(pp), key=lambda i: stage_t[i].total)
    t_max = stage_t[crit].total
    bubble = (sum(s.total for s in stage_t) - t_max) / v
    per_mb = stage_t[crit]

    # parameters held by one device of each stage (embedding on the first stage, head on the last)
    emb_params = model.embedding_params
    head_params = model.head_params + (model.vocab * (model.embedding_projection_dim or model.hidden)
                                       if model.tied_embeddings and pp > 1 else 0)
    stage_params = []
    for i, n in enumerate(counts):
        q = n * model.layer_params + (emb_params if i == 0 else 0) + (head_params if i == pp - 1 else 0)
        stage_params.append(q / tp)
    grads = grad_bytes * stage_params[crit]
    group, stride = dp * plan.cp, (tp * pp if plan.cp == 1 else tp)
    dp_exposed = 0.0
    if group > 1 and plan.zero < 3:
        # gradients accumulate over micro-batches: only the last backward can hide their reduction
        bwd_window = bwd.total * counts[crit] if plan.dp_overlap else 0.0
        if plan.zero >= 1:
            # distributed optimizer: reduce-scatter the gradients under the last backward, all-gather
            # the updated weights under the next step's first forward
            rs = collective_time("reduce_scatter", grads, group, chip, stride, eff)
            ag = collective_time("all_gather", p * stage_params[crit], group, chip, stride, eff)
            fwd_window = fwd.total * counts[crit] if plan.dp_overlap else 0.0
            dp_exposed = exposed(rs, bwd_window, eff) + exposed(ag, fwd_window, eff)
        else:
            dp_exposed = exposed(collective_time("all_reduce", grads, group, chip, stride, eff),
                                 bwd_window, eff)
    opt_params = stage_params[crit] / (dp * plan.cp if plan.zero >= 1 else 1)
    opt = optimizer_op(opt_params, plan.optimizer)
    t_opt = vector_time(opt.elements, opt.flops, opt.bytes, chip, eff)

    step = m * t_max + bubble + dp_exposed + t_opt
    breakdown = {
        "compute_s": m * per_mb.compute,
        "memory_bound_s": m * per_mb.memory,
        "communication_exposed_s": m * per_mb.communication + dp_exposed,
        "pipeline_bubble_s": bubble,
        "optimizer_s": t_opt,
    }
    flops = model_flops_per_sample(model) * global_batch
    peak = chip.peak_flops(model.precision) * devices
    hw = _hardware_flops_per_sample(model, plan) * global_batch

    # memory per stage under 1F1B: stage i holds min(pp - i, m) micro-batches in flight
    act = activation_bytes_per_layer(shard, plan.mbs, tp, plan.sp, plan.recompute, plan.attention)
    full_act = activation_bytes_per_layer(shard, plan.mbs, tp, plan.sp, "none", plan.attention)
    per_param = state_bytes_per_param(plan.optimizer, plan.zero, dp * plan.cp, p, p)
    interleave = 1 + (pp - 1) / (pp * v) if v > 1 else 1.0
    stages = []
    for i, n in enumerate(counts):
        inflight = min(pp - i, m) * interleave
        transient = full_act if plan.recompute != "none" else 0.0  # one layer re-materialised
        if i == pp - 1:
            transient += 4.0 * plan.mbs * shard.seq_len * model.vocab / tp  # fp32 logits for the loss
        if plan.zero >= 3:
            transient += 2 * p * model.layer_params / tp                  # gathered layer weights
        stages.append(StageMemory(i, n, per_param * stage_params[i], n * act * inflight, transient))
    worst = max(range(pp), key=lambda i: stages[i].total_bytes)
    need = stages[worst].total_bytes
    return StepResult(
        workload=model.name, chip=chip.name, devices=devices, global_batch=global_batch,
        plan=plan.label(), dp=dp, micro_batches=m, step_time_s=step,
        samples_per_s=global_batch / step, tokens_per_s=global_batch * model.seq_len / step,
        model_flops_per_step=flops, mfu=flops / (step * peak), hfu=hw / (step * peak),
        memory_per_device_bytes=need, hbm_bytes=chip.hbm_bytes, fits=need <= chip.hbm_bytes,
        binding_stage=worst, breakdown_s=breakdown, stage_memory=tuple(stages))


def _hardware_flops_per_sample(model: Model, plan: Plan) -> float:
    """FLOPs the hardware executes per sequence, recompute included (for HFU)."""
    g = layer_graph(model, 1, 1, False, "standard", plan.recompute if plan.recompute != "selective"
                    else "selective")
    e = edge_graph(model, 1, 1, False)
    return model.layers * tensor_flops(g.ops) + tensor_flops(e["embedding"] + e["head"])
