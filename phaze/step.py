"""Step time of one training step under a given plan: the function every later stage calls.

``evaluate`` is pure and cached by its arguments: (workload, chip, cluster, batch, plan,
efficiency) -> :class:`StepResult`. Each stage's costs come from :mod:`phaze.stage` (layer times
are the makespans of the layers' optimal schedules; on a GPU, the sum of the operators: its kernels
run one after another); pipeline, data-parallel and optimizer terms are the 1F1B formula of
:func:`step_time_of`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from html import escape

from . import cost, dualpipe, graph, schedule, stage
from .arch import Chip
from .cost import IDEAL, Efficiency
from .graph import edge_graph, layer_graph, offloaded_bytes, tensor_flops
from .memory import StageMemory, memory_reserve_bytes
from .plan import Plan, graph_recompute
from .plan_check import check_offload, check_plan, stage_split
from .stage import StageCosts, _shard, inflight_micro_batches, layer_mix, shard_ranks, stage_costs
from .workload import Model, dense_view, gdn_views

# the parallel groups whose exposed communication a step reports apart (StepResult.communication_by_group_s)
# and how a printout names them
COMMUNICATION_GROUPS = {
    "tensor_parallel_s": "tensor-parallel",
    "expert_parallel_s": "expert-parallel",
    "context_parallel_s": "context-parallel",
    "data_parallel_s": "data-parallel",
    "pipeline_parallel_s": "pipeline sends",
    "host_offload_s": "host offload",
}


@lru_cache(maxsize=4096)
def model_flops_per_sample(model: Model) -> float:
    """Model FLOPs of one sequence, forward and backward, no recompute, non-causal attention
    counted in full (the Narayanan / MFU convention); a mixture of experts counts its router, the
    top-k routed and the shared experts (Megatron's convention); multi-token prediction counts
    each module's layer, projection and logits, work the step must do."""
    return _layers_flops(model, "none") + _edge_flops(model)


def _counted_flops(ops) -> float:
    """Tensor FLOPs as MFU and HFU count them: without what a fused kernel's backward re-runs inside
    itself (the Mamba-2 scan's ``.rerun`` ops, as a fused attention's re-made scores are not
    counted: FLOPs are counted on the unfused graph)."""
    return tensor_flops(o for o in ops if not o.name.endswith(".rerun"))


@lru_cache(maxsize=4096)
def _layers_flops(model: Model, recompute: str, compiled: bool = False, mtp: bool = True) -> float:
    """Tensor FLOPs of all the layers for one sequence (balanced routing over one rank), recompute
    included: what the hardware executes (for HFU; ``compiled``: as :func:`phaze.graph.layer_graph`);
    ``mtp``: with the multi-token prediction modules' layers."""
    if (model.hybrid and model.layer_kind is None) or gdn_views(model):
        return model.layers * sum(w * _layers_flops(m, recompute, compiled, mtp) / m.layers
                                  for w, m, _ in layer_mix(model))
    layer = _counted_flops(layer_graph(model, 1, 1, False, "standard", recompute, None, compiled).ops)
    flops = model.layers * layer
    if model.moe and model.dense_ffn_layers:
        dense = _counted_flops(layer_graph(dense_view(model), 1, 1, False, "standard", recompute, None, compiled).ops)
        flops = model.moe_layers * flops / model.layers + model.dense_ffn_layers * dense
    if mtp and model.mtp_layers:   # each multi-token prediction module's layer, of the repeated (MoE) kind
        flops = flops + model.mtp_layers * layer
    return flops


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
    binding_stage: int                  # the entry of stage_memory that needs the most
    breakdown_s: dict = field(default_factory=dict)
    stage_memory: tuple = ()            # one StageMemory a pipeline stage (under DualPipe, a rank:
                                        # its two stages, phaze.stage.StageCosts.pair_memory)
    memory_reserve_bytes: float = 0.0   # kept free for the runtime (CUDA context, NCCL, fragmentation)
    headroom_bytes: float = 0.0         # HBM - reserve - the binding stage's need (negative: does not fit)
    model_flops_per_s_per_device: float = 0.0     # the model's FLOPs (MFU's count) per second and device
    hardware_flops_per_s_per_device: float = 0.0  # recompute included (HFU's count, Megatron's TFLOP/s)
    clock_hz: float = 0.0               # the clock the step ran at
    zero_group_ranks: int = 0           # data-parallel ranks one ZeRO shard group spans (0: no ZeRO);
                                        # fewer than dp: hybrid sharding over dp / it replicas
    communication_by_group_s: dict = field(default_factory=dict)   # breakdown_s's exposed communication
                                        # by parallel group (COMMUNICATION_GROUPS); they sum to it

    @property
    def tokens_per_s_per_device(self) -> float:
        return self.tokens_per_s / self.devices

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stage_memory"] = [dict(asdict(m), total_bytes=m.total_bytes) for m in self.stage_memory]
        d["tokens_per_s_per_device"] = self.tokens_per_s_per_device
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
        gib = 2.0 ** 30
        rows = [("workload", self.workload), ("cluster", f"{self.devices} x {self.chip}"),
                ("global batch", f"{self.global_batch}"), ("plan", self.plan),
                ("dp, micro-batches", f"{self.dp}, {self.micro_batches}"),
                ("step time", f"{self.step_time_s:.4g} s"), ("throughput", f"{self.tokens_per_s:,.0f} tokens/s"),
                ("MFU / HFU", f"{100 * self.mfu:.1f} % / {100 * self.hfu:.1f} %"),
                ("TFLOP/s per device", f"{self.model_flops_per_s_per_device / 1e12:.1f} model, "
                                       f"{self.hardware_flops_per_s_per_device / 1e12:.1f} hardware"),
                ("memory per device", f"{self.memory_per_device_bytes / gib:.1f} GiB of {self.hbm_bytes / gib:.1f}"
                                      f" GiB, reserve {self.memory_reserve_bytes / gib:.1f} GiB, headroom "
                                      f"{self.headroom_bytes / gib:.1f} GiB: "
                                      f"{'fits' if self.fits else 'DOES NOT FIT'}")]
        rows += [(k.removesuffix("_s").replace("_", " "), f"{v:.4g} s") for k, v in self.breakdown_s.items()]
        body = "".join(f"<tr><th style='text-align:left'>{escape(k)}</th><td style='text-align:left'>"
                       f"{escape(v)}</td></tr>" for k, v in rows)
        return f"<table>{body}</table>"


def host_offload_bytes(model: Model, devices: int, global_batch: int, plan: Plan) -> float:
    """Bytes of activations one device keeps in its host's memory at the step's peak (0 when
    ``plan`` offloads nothing): each layer's offloaded tensors (:func:`phaze.graph.offloaded_bytes`)
    for every layer of a stage and every micro-batch in flight on it (1F1B's warm-up, as for the
    activations kept on the device), on the stage that holds the most."""
    if not plan.offload:
        return 0.0
    per = host_offload_bytes_per_layer(model, plan)
    m = global_batch // (plan.dp(devices) * plan.mbs)
    return max(per * n * inflight_micro_batches(plan.pp, plan.vp, m, i) for i, n in enumerate(stage_split(model, plan)))


def host_offload_bytes_per_layer(model: Model, plan: Plan) -> float:
    """Bytes one layer of ``plan`` sends to the host's memory for one micro-batch (0 when it
    offloads nothing): its offloaded tensors (:func:`phaze.graph.offloaded_bytes`)."""
    if not plan.offload:
        return 0.0
    return offloaded_bytes(_shard(model, plan), plan.mbs, plan.tp, graph_recompute("full", plan.recompute_modules,
                                                                                  plan.offload))


def layout_of(plan: Plan) -> Plan:
    """The plan without its recompute and stage choices (the key of :func:`stage_costs`)."""
    if plan.recompute == "none" and not plan.stages and not plan.stage_recompute:
        return plan
    return replace(plan, recompute="none", stages=(), stage_recompute=())


def step_time_of(costs: StageCosts, counts, recomputes, full_layers=None) -> tuple[float, int, int, list[float]]:
    """Step time of a stage assignment under 1F1B: ``m * T_max + (sum T - T_max) / v`` plus the
    largest stage tail (data-parallel reduction not hidden, optimizer). Returns (seconds,
    critical stage, tail stage, stage times). ``full_layers``: the layers each ``block`` stage
    re-runs whole. The placement DP minimises this same expression over the same
    :class:`StageCosts` (its tests check the two agree)."""
    m, v = costs.micro_batches, costs.plan.vp
    stages = list(zip(counts, recomputes, full_layers or (0,) * len(counts), strict=True))
    times = [costs.time(i, n, r, k, groups=False).total for i, (n, r, k) in enumerate(stages)]
    tails = [sum(costs.tail(i, n, r, k)) for i, (n, r, k) in enumerate(stages)]
    crit = max(range(len(times)), key=times.__getitem__)
    last = max(range(len(tails)), key=tails.__getitem__)
    return (critical_weight(m, len(times), v) * times[crit] + sum(times) / v + tails[last], crit, last,
            times)


def dualpipe_step(costs: StageCosts, plain: StageCosts, counts, recomputes, full_layers):
    """(step seconds, critical rank, its mean PhaseTime a micro-batch, bubble, exposed data-parallel
    communication, optimizer) under DualPipe: :func:`phaze.dualpipe.finish_times` on each stage's
    :meth:`StageCosts.chunk_times`, paired chunks from ``costs`` (the all-to-alls overlapped when
    ``ep_overlap`` is on) and lone ones from ``plain`` (the same layout without the overlap), then
    the largest tail of a rank: those of both its stages, whose gradients it reduces and whose
    shards it updates (no copy of the token table to sum across the ends: :meth:`StageCosts._table_copy`).
    The critical rank is the one whose two stages take longest a micro-batch;
    the bubble, the pipeline's time beyond m of those. Assumption: the copies' gradients are
    reduced with the data-parallel ones, costed as the data-parallel group's (the pair of ranks
    doubles the group's size, not its bytes)."""
    pp, m = costs.plan.pp, costs.micro_batches
    stages = list(zip(counts, recomputes, full_layers, strict=True))
    paired = [costs.chunk_times(i, n, r, k) for i, (n, r, k) in enumerate(stages)]
    lone = paired if plain is costs else [plain.chunk_times(i, n, r, k) for i, (n, r, k) in enumerate(stages)]
    done = dualpipe.finish_times(pp, m, [c[0] for c in lone], [c[1] for c in lone], [c[2] for c in lone],
                                 [c[0] for c in paired], [c[1] for c in paired])
    times = [costs.time(i, n, r, k) for i, (n, r, k) in enumerate(stages)]
    pairs = [(times[i] + times[pp - 1 - i]) * 0.5 for i in range(pp)]
    crit = max(range(pp), key=lambda i: pairs[i].total)     # the rank whose two chunks take longest
    tails = [costs.tail(i, n, r, k) for i, (n, r, k) in enumerate(stages)]
    rank_tails = [tuple(a + b for a, b in zip(tails[i], tails[pp - 1 - i], strict=True)) for i in range(pp)]
    last = max(range(pp), key=lambda i: sum(rank_tails[i]))
    return (max(done) + sum(rank_tails[last]), crit, pairs[crit], max(done) - m * pairs[crit].total,
            *rank_tails[last])


def critical_weight(m: int, pp: int, v: int) -> float:
    """Weight of the slowest stage's time in the 1F1B step time: m - 1/v. Interleaved with fewer
    micro-batches than stages, each of the v - 1 later rounds of chunks also waits (pp - m) chunk
    times for its first micro-batch to come round the pipeline (at m = 1: pp stage times)."""
    return m - 1.0 / v + (v - 1) * max(0, pp - m) / v


@lru_cache(maxsize=8192)
def evaluate(model: Model, chip: Chip, devices: int, global_batch: int, plan: Plan,
             eff: Efficiency = IDEAL) -> StepResult:
    """Step time, throughput, utilisation and per-device memory of ``plan``."""
    check_plan(model, devices, global_batch, plan)
    check_offload(chip, plan)
    pp, v = plan.pp, plan.vp
    costs = stage_costs(model, chip, devices, global_batch, layout_of(plan), eff)
    counts = stage_split(model, plan)
    recs, ks = plan.stage_modes()
    m = costs.micro_batches
    if plan.pipe_schedule == "dualpipe":
        plain = costs if not plan.ep_overlap else stage_costs(model, chip, devices, global_batch,
                                                              layout_of(replace(plan, ep_overlap=False)), eff)
        step, crit, per_mb, bubble, dp_exposed, t_opt = dualpipe_step(costs, plain, counts, recs, ks)
    else:
        step, crit, last, times = step_time_of(costs, counts, recs, ks)
        per_mb = costs.time(crit, counts[crit], recs[crit], ks[crit])
        bubble = (sum(times) - times[crit]) / v + (critical_weight(m, pp, v) - m + 1.0 / v) * times[crit]
        dp_exposed, t_opt = costs.tail(last, counts[last], recs[last], ks[last])
    breakdown = {
        "compute_s": m * per_mb.compute,
        "memory_bound_s": m * per_mb.memory,
        "communication_exposed_s": m * per_mb.communication + dp_exposed,
        "pipeline_bubble_s": bubble,
        "optimizer_s": t_opt,
    }
    by_group = {"tensor_parallel_s": m * per_mb.tp_comm, "expert_parallel_s": m * per_mb.ep_comm,
                "context_parallel_s": m * per_mb.cp_comm, "data_parallel_s": m * per_mb.dp_comm + dp_exposed,
                "pipeline_parallel_s": m * per_mb.pp_comm, "host_offload_s": m * per_mb.host_comm}
    flops = model_flops_per_sample(model) * global_batch
    peak = chip.peak_flops(model.precision) * devices
    hw = sum((n - k) * _layers_flops(model, _counted_recompute(r, plan), chip.compiled, mtp=False)
             + k * _layers_flops(model, "full", chip.compiled, mtp=False)
             for n, r, k in zip(counts, recs, ks, strict=True))
    hw /= model.layers
    if model.mtp_layers:   # the last stage's modules' layers, re-run with it (not under block: Megatron-Core skips)
        r = "none" if recs[-1] == "block" else _counted_recompute(recs[-1], plan)
        hw += _layers_flops(model, r, chip.compiled) - _layers_flops(model, r, chip.compiled, mtp=False)
    hw = (hw + _edge_flops(model)) * global_batch
    if plan.pipe_schedule == "dualpipe":   # one entry a rank: its two stages
        held = [costs.pair_memory(i, counts, recs, ks) for i in range(pp)]
    else:
        held = [costs.memory(i, n, r, k) for i, (n, r, k) in enumerate(zip(counts, recs, ks, strict=True))]
    stages = [StageMemory(s.stage, int(s.layers), float(s.weights_and_optimizer_bytes), float(s.activation_bytes),
                          float(s.transient_bytes)) for s in held]
    worst = max(range(pp), key=lambda i: stages[i].total_bytes)
    need = stages[worst].total_bytes
    reserve = memory_reserve_bytes(chip, plan.memory_reserve)
    host = host_offload_bytes(model, devices, global_batch, plan)   # offloaded activations, in the host's memory
    host_fits = not chip.host_memory_bytes or host <= chip.host_memory_bytes
    step = float(step)
    return StepResult(
        workload=model.name, chip=chip.name, devices=devices, global_batch=global_batch,
        plan=plan.label(), dp=plan.dp(devices), micro_batches=m, step_time_s=step,
        samples_per_s=global_batch / step, tokens_per_s=global_batch * model.seq_len / step,
        model_flops_per_step=float(flops), mfu=float(flops / (step * peak)), hfu=float(hw / (step * peak)),
        memory_per_device_bytes=need, hbm_bytes=float(chip.hbm_bytes),
        fits=bool(need + reserve <= chip.hbm_bytes and host_fits),
        binding_stage=worst, breakdown_s={k: float(v) for k, v in breakdown.items()}, stage_memory=tuple(stages),
        memory_reserve_bytes=reserve, headroom_bytes=float(chip.hbm_bytes - reserve - need),
        model_flops_per_s_per_device=float(flops / (step * devices)),
        hardware_flops_per_s_per_device=float(hw / (step * devices)), clock_hz=float(chip.clock_hz),
        zero_group_ranks=shard_ranks(plan, devices, chip) if plan.zero else 0,
        communication_by_group_s={k: float(v) for k, v in by_group.items()})


@lru_cache(maxsize=4096)
def _edge_flops(model: Model) -> float:
    e = edge_graph(model, 1, 1, False)
    return tensor_flops(e["embedding"] + e["head"])


def _counted_recompute(r: str, plan: Plan) -> str:
    """The recompute whose FLOPs HFU counts for a stage mode ``r`` (FLOPs are counted on the unfused
    graph): a block stage's most layers (its whole re-runs are added apart) and Megatron-LM's
    selective recompute of a fused attention, which has nothing to re-run, count none."""
    if r == "block" or (r == "selective" and not plan.recompute_modules and plan.attention in ("flash", "flash2")):
        return "none"
    return graph_recompute(r, plan.recompute_modules, plan.offload)


def _hardware_flops_per_sample(model: Model, plan: Plan) -> float:
    """FLOPs the hardware executes per sequence under a uniform recompute (for HFU)."""
    return _layers_flops(model, _counted_recompute(plan.recompute, plan)) + _edge_flops(model)


def clear_caches(workload_too: bool = False) -> None:
    """Empty every in-memory cache on the evaluation path that depends on a chip (layer times,
    costs, step results, schedules, bounds, the cost model's GEMM geometry); with
    ``workload_too`` also the chip-independent operator graphs. Every cache is size-capped
    anyway: a long search's memory stays bounded without calling this."""
    stage.clear_caches(workload_too)
    for f in (evaluate, cost._gemm_geometry):
        f.cache_clear()
    schedule.clear_memory_cache()
    if workload_too:
        for f in (graph.layer_graph, graph.edge_graph, model_flops_per_sample, _layers_flops, _edge_flops):
            f.cache_clear()
