"""Whether a plan can run a model on a number of devices and a global batch: the checks that
turn an impossible or unmodelled plan into one line naming the plan field and what is allowed
(:func:`check_plan`), and the layer split a pipelined plan implies (:func:`stage_split`), which the
checks read and the step time uses. Apart from :mod:`phaze.step`, which costs a plan, so that
what a plan may be is read in one place.
"""
from __future__ import annotations

import math
from functools import lru_cache

from . import dualpipe
from .arch import Chip
from .configio import ConfigError, divisors
from .graph import kv_width
from .plan import (
    DP_SHARD_NODE,
    PRECISION_AWARE,
    Plan,
    cp_a2a_groups,
    dp_shard_text,
    shared_overlap_conflict,
)
from .workload import Model


@lru_cache(maxsize=65536)
def stage_layers(layers: int, pp: int, vp: int = 1, last: int = 0) -> tuple[int, ...]:
    """Even contiguous split; the remainder goes to the middle stages, away from the first
    (embedding) and last (logits and loss) stages. Interleaved (``vp`` chunks per stage), the
    layers split so into pp * vp chunks (the shorter ones first and last, as Megatron's uneven
    first and last pipeline stages), stage i holding chunks i, i + pp, ...: its layer count.
    ``last``: layers the last stage runs besides its share (multi-token prediction modules'),
    split as layers and taken from its share, unless that would leave it none."""
    if last:
        counts = stage_layers(layers + last, pp, vp)
        if counts[-1] > last:
            return (*counts[:-1], counts[-1] - last)
        return stage_layers(layers, pp, vp)
    if vp > 1:
        chunks = stage_layers(layers, pp * vp)
        return tuple(sum(chunks[i::pp]) for i in range(pp))
    base, extra = divmod(layers, pp)
    counts = [base] * pp
    order = sorted(range(pp), key=lambda i: (i in (0, pp - 1), abs(i - (pp - 1) / 2)))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


def stage_split(model: Model, plan: Plan) -> tuple[int, ...]:
    """Layers per pipeline stage: the plan's ``stages``, else the default split, in which the last
    stage's multi-token prediction layers (:meth:`phaze.stage.StageCosts.layers_on`) take slots of the split as
    Megatron-Core's pipeline layouts place them ('m'); so NeMo 2.6's DeepSeek-V3 recipe splits its
    61 layers and one module over 16 stages: 3, fourteen of 4, and 2 beside the module."""
    return plan.stages or stage_layers(model.layers, plan.pp, plan.vp, model.mtp_layers)


def runs_op_recompute(model: Model) -> bool:
    """Whether torchtitan's per-op recompute (``op``) is modelled for ``model``: sequential dense
    layers with ordinary attention projections (no experts, no MLA, no parallel block, no norms
    after the attention and the FFN)."""
    return not (model.moe or model.mla or model.parallel_block or model.hybrid or model.sandwich_norm)


def check_plan(model: Model, devices: int, global_batch: int, plan: Plan) -> None:
    """Raise :class:`ConfigError` naming the plan field and what is allowed."""
    if devices < 1:
        raise ConfigError("--devices", None, f"must be a positive integer, got {devices}")
    if global_batch < 1:
        raise ConfigError("--global-batch", None, f"must be a positive integer, got {global_batch}")
    attention, ffn = model.attention_layers > 0, model.has_ffn
    if (attention and model.heads % plan.tp) or (ffn and model.ffn_hidden % plan.tp):
        raise ConfigError("--plan", "tp", f"must divide the heads ({model.heads}) and FFN width "
                          f"({model.ffn_hidden}) of {model.name}; allowed: "
                          f"{divisors(math.gcd(model.heads if attention else 0, model.ffn_hidden if ffn else 0))}")
    if attention and model.kv_heads % plan.tp and plan.tp % model.kv_heads:
        raise ConfigError("--plan", "tp", f"must divide or be a multiple of the kv heads "
                                          f"({model.kv_heads}), got {plan.tp}")
    if model.hybrid:
        _check_hybrid(model, plan)
    if model.gdn_layers:
        _check_gdn(model, plan)
    if plan.optimizer == "adam-deepspeed" and plan.zero >= 2 and plan.pp > 1:
        raise ConfigError("--plan", "zero", f"must be 0 or 1 with optimizer=adam-deepspeed and pp > 1 "
                          f"(DeepSpeed 0.9.5's pipeline engine asserts that ZeRO-2 and 3 are incompatible "
                          f"with pipeline parallelism), got zero {plan.zero} with pp {plan.pp}; allowed: "
                          f"zero 0-1, or pp 1")
    if plan.optimizer == "adam-deepspeed" and plan.zero >= 2 and model.moe:
        raise ConfigError("--plan", "zero", f"must be 0 or 1 with optimizer=adam-deepspeed for a mixture of "
                          f"experts ({model.name}): its ZeRO-{plan.zero} reduction of the experts' gradients "
                          f"over their own group is not modelled; allowed: zero 0-1")
    bad = fp8_params_error(model, "fp8_params=0") if plan.fp8_params else None
    if bad:
        raise ConfigError("--plan", "fp8_params", bad)
    bad = optimizer_error(model, plan.optimizer, plan.fp8_params, "optimizer=adam-megatron")
    if bad:
        raise ConfigError("--plan", "optimizer", bad)
    width = plan.tp * plan.pp * plan.cp
    if devices % width:
        raise ConfigError("--plan", "tp*pp*cp", f"{plan.tp}*{plan.pp}*{plan.cp} = {width} must divide "
                                               f"the devices ({devices})")
    if plan.optimizer in PRECISION_AWARE and not plan.zero and devices // width > 1:
        raise ConfigError("--plan", "zero", f"{plan.optimizer} is Megatron-Core's precision-aware optimizer, "
                                            f"which runs only as its distributed optimizer (optimizer_config.py "
                                            f"asserts it); allowed: zero 1-3")
    # interleaved, the embedding and the loss may take a chunk each (Megatron's
    # --account-for-embedding/loss-in-pipeline-split): the first and last chunks may hold no layer
    chunks = model.layers + (2 if plan.vp > 1 else 0)
    if plan.pp * plan.vp > chunks or plan.pp > model.layers:
        raise ConfigError("--plan", "pp", f"pp*vp must be <= layers ({model.layers})"
                          + (" + 2 (embedding and loss)" if plan.vp > 1 else "") + f", got {plan.pp * plan.vp}")
    if plan.vp > 1 and plan.pp == 1:
        raise ConfigError("--plan", "vp", f"interleaving needs pp > 1, got pp={plan.pp}, vp={plan.vp}")
    if plan.sp and plan.tp > 1 and model.seq_len % plan.tp:
        raise ConfigError("--plan", "sp", f"sequence parallelism needs tp ({plan.tp}) to divide "
                                          f"the sequence length ({model.seq_len})")
    if model.seq_len % plan.cp:
        raise ConfigError("--plan", "cp", f"must divide the sequence length ({model.seq_len})")
    if plan.cp_a2a > 1 and (plan.cp_comm != "a2a+p2p" or plan.cp == 1):
        raise ConfigError("--plan", "cp_a2a", "is the all-to-all group of cp_comm=a2a+p2p (with cp > 1); "
                                              "allowed: 1 here")
    if plan.cp > 1 and plan.cp_comm == "a2a+p2p" and plan.cp_a2a not in cp_a2a_groups(plan.cp):
        raise ConfigError("--plan", "cp_a2a", f"a2a+p2p needs an all-to-all group that divides cp ({plan.cp}) "
                                              f"with a ring of two or more groups; allowed: "
                                              + (", ".join(map(str, cp_a2a_groups(plan.cp)))
                                                 or f"none at cp {plan.cp}: use p2p or a2a"))
    if plan.cp > 1 and plan.cp_comm in ("a2a", "a2a+p2p"):
        heads, kv_heads = model.heads // plan.tp, kv_width(model, plan.tp) // model.head_dim
        group = plan.cp if plan.cp_comm == "a2a" else plan.cp_a2a
        name = "cp" if plan.cp_comm == "a2a" else "cp_a2a"
        if heads % group or kv_heads % group:
            raise ConfigError("--plan", "cp_comm", f"{plan.cp_comm} splits each rank's heads over {name}: {name} "
                                                   f"({group}) must divide the query heads ({heads}) and kv heads "
                                                   f"({kv_heads}) per tensor-parallel rank; allowed: p2p, "
                                                   f"all_gather or torch")
    if plan.stages and (len(plan.stages) != plan.pp or sum(plan.stages) != model.layers):
        raise ConfigError("--plan", "stages", f"must give pp = {plan.pp} layer counts summing to the "
                                              f"layers ({model.layers}), got {':'.join(map(str, plan.stages))}")
    if plan.stages and plan.vp > 1 and any(n < plan.vp - (i in (0, plan.pp - 1)) for i, n in enumerate(plan.stages)):
        raise ConfigError("--plan", "stages", f"with vp = {plan.vp} every stage needs a layer per chunk "
                                              f"(the first and last stages: vp - 1)")
    if plan.stage_recompute and len(plan.stage_recompute) != plan.pp:
        raise ConfigError("--plan", "stage_recompute", f"must give one mode per stage (pp = {plan.pp}), "
                                                       f"got {len(plan.stage_recompute)}")
    _check_block(model, plan)
    if not runs_op_recompute(model) and "op" in (plan.recompute, *plan.stage_recompute):
        raise ConfigError("--plan", "recompute", "op (torchtitan's per-op policy) is modelled for sequential "
                                                 "dense layers with standard attention projections; use none, "
                                                 f"selective or full for {model.name}")
    dp = devices // width
    if plan.zero and plan.dp_shard > 0 and dp % plan.dp_shard and plan.dp_shard % dp:
        raise ConfigError("--plan", "dp_shard", f"must divide the data-parallel ranks (dp = {dp}) or be a "
                                                f"multiple of them (every rank), got {plan.dp_shard}; allowed: "
                                                f"{divisors(dp)}, a multiple of {dp}, all or node")
    if (plan.optimizer == "adam-deepspeed" and plan.zero and plan.dp_shard
            and (plan.dp_shard == DP_SHARD_NODE or plan.dp_shard % dp)):
        raise ConfigError("--plan", "dp_shard", f"must be all with optimizer=adam-deepspeed (DeepSpeed 0.9.5's "
                          f"BF16_Optimizer and its ZeRO-1 to 3 shard over every data-parallel rank; its "
                          f"hybrid sharding, MiCS, a ZeRO-3 engine of its own, is not modelled), got "
                          f"{dp_shard_text(plan.dp_shard)} of dp = {dp}; allowed: all, or a multiple of {dp}")
    _check_experts(model, plan, dp)
    if global_batch % (dp * plan.mbs):
        raise ConfigError("--global-batch", None, f"must be a multiple of dp*mbs = {dp}*{plan.mbs} "
                                                  f"= {dp * plan.mbs}, got {global_batch}")
    if plan.pipe_schedule == "dualpipe":
        _check_dualpipe(plan, global_batch // (dp * plan.mbs))
    if plan.offload:
        modes = plan.stage_modes()[0]
        why = ""
        if set(modes) != {"full"}:
            why = (f"keeps on the host what a full recompute would re-run: needs recompute=full in every stage, "
                   f"got {':'.join(modes)}")
        elif model.mla:
            why = (f"is MaxText's policy for the q, k and v projections; {model.name}'s multi-head latent "
                   f"attention has none of them")
        if why:
            raise ConfigError("--plan", "offload", f"offload={plan.offload} {why}; allowed: no offload here")


def _check_hybrid(model: Model, plan: Plan) -> None:
    """What a hybrid Mamba-2 model's plan may not do: split a Mamba-2 head or group over tp
    (Megatron-Core's MambaMixer asserts that tp divides both), and what is not modelled for it."""
    if model.mamba_heads % plan.tp or model.mamba_groups % plan.tp:
        raise ConfigError("--plan", "tp", f"must divide the Mamba-2 heads ({model.mamba_heads}) and groups "
                          f"({model.mamba_groups}) of {model.name}; allowed: "
                          + divisors(math.gcd(model.mamba_heads, model.mamba_groups)))
    for bad, key, why in (
            (plan.cp > 1, "cp", "Megatron-Core's context parallelism of the Mamba-2 layers (an all-to-all of "
                                "their heads around the scan) is not modelled; allowed: 1"),
            (plan.vp > 1, "vp", "NeMo 2.5's hybrid models run no interleaved schedule (its SSM config "
                                "asserts it); allowed: 1"),
            (bool(plan.recompute_modules), "recompute", "Megatron-Core's selective recompute modules are not "
                                                        "modelled for a hybrid; allowed: no modules (recompute none, "
                                                        "selective, block or full)"),
            (bool(plan.offload), "offload", "activation offload is not modelled for a hybrid; allowed: no offload"),
            (plan.pipe_schedule == "dualpipe", "pipe_schedule", "DualPipe is not modelled for a hybrid; "
                                                                "allowed: 1f1b")):
        if bad:
            raise ConfigError("--plan", key, f"{model.name} is a hybrid of Mamba-2 and attention layers: {why}")


def _check_gdn(model: Model, plan: Plan) -> None:
    """What a plan of a model with Gated DeltaNet layers may not do: split a key or value head over
    tp (Megatron-Core's GatedDeltaNet splits both head counts by tp), or run context parallelism,
    which its GatedDeltaNet does not support ("TODO: support CP")."""
    k, v = model.linear_key_heads, model.linear_value_heads
    if k % plan.tp or v % plan.tp:
        raise ConfigError("--plan", "tp", f"must divide the Gated DeltaNet key heads ({k}) and value heads ({v}) "
                          f"of {model.name}; allowed: " + divisors(math.gcd(k, v)))
    if plan.cp > 1:
        raise ConfigError("--plan", "cp", f"{model.name} has Gated DeltaNet layers, which Megatron-Core 0.16 runs "
                                          f"without context parallelism; allowed: 1")
    if plan.offload or plan.pipe_schedule == "dualpipe":
        raise ConfigError("--plan", "offload" if plan.offload else "pipe_schedule",
                          f"{model.name} has Gated DeltaNet layers: offload and DualPipe are not modelled with them; "
                          f"allowed: no offload and pipe_schedule 1f1b")


def check_offload(chip: Chip, plan: Plan) -> None:
    """Raise :class:`ConfigError` when ``plan`` offloads activations and ``chip`` has no host link."""
    if plan.offload and not chip.host_bandwidth_bytes_per_s:
        raise ConfigError("--plan", "offload", f"offload={plan.offload} sends activations over the host link, "
                          f"which {chip.name}'s chip file does not give (host_bandwidth_bytes_per_s); "
                          f"allowed: no offload on this chip")


def _check_dualpipe(plan: Plan, micro_batches: int) -> None:
    why = dualpipe.schedule_error(plan.pp, micro_batches)
    if why is None and plan.vp > 1:
        why = f"runs its own two chunks a rank, not interleaved ones: needs vp=1, got vp={plan.vp}"
    if why is None and plan.zero >= 3:
        why = "is modelled with the weights held through the step: needs zero 0-2 (FSDP's gathers under its " \
              "paired chunks are not modelled)"
    if why is None and plan.pipe_p2p != "batched":
        why = "posts its sends and receives together (batch_isend_irecv): needs pipe_p2p=batched"
    if why is None and plan.offload:
        why = ("is not modelled with activation offload (the host copies each in-flight micro-batch keeps are "
               "counted as 1F1B holds them): needs no offload")
    if why:
        raise ConfigError("--plan", "pipe_schedule", f"dualpipe {why}; allowed: 1f1b here")


def optimizer_error(model: Model, optimizer: str, fp8_params: bool, allowed: str) -> str | None:
    """Why ``model`` cannot run ``optimizer``, ending in what is allowed (``allowed``: the
    caller's words for another optimizer); None when it can. Megatron-Core's precision-aware
    optimizer is modelled for 16-bit bf16 weights (its 16-bit remainders of them): not for fp16's
    loss-scaled weights, nor for fp8 weights (Transformer Engine's fp8 Adam kernel, not modelled)."""
    if optimizer not in PRECISION_AWARE:
        return None
    if model.precision == "fp16":
        return (f"{optimizer} (Megatron-Core's precision-aware optimizer) is modelled for bf16 weights, whose "
                f"fp32 masters it keeps as 16-bit remainders; {model.name} trains in fp16: allowed: {allowed}")
    if fp8_params:
        return (f"{optimizer} (Megatron-Core's precision-aware optimizer) with fp8 weights updates them in "
                f"Transformer Engine's fp8 Adam kernel, which is not modelled: allowed: {allowed}, or fp8 "
                f"weights off")
    return None


def fp8_params_error(model: Model, off: str) -> str | None:
    """Why ``model`` cannot hold fp8 weights (``fp8_params``), ending in what is allowed (``off``:
    the caller's word for turning it off); None when it can."""
    if model.precision != "fp8":
        return (f"holds an fp8 run's linear weights in fp8; {model.name} trains in {model.precision}: "
                f"allowed: {off}, or precision fp8")
    if not model.fp8_fused:
        return ("is Transformer Engine's fp8 weights under Megatron-Core (fp8_casts fused); with fp8_casts "
                f"{model.fp8_casts} (a cast in each linear; torchao's float8 all-gather, torchtitan's "
                f"enable_fsdp_float8_all_gather) it is not modelled: allowed: {off}, or fp8_casts fused")
    return None


def _check_block(model: Model, plan: Plan) -> None:
    """``recompute_layers``: one count, or one per stage; a ``block`` stage re-runs at least one of
    its layers whole and at most all of them, and only a block stage has a count."""
    recs, per = plan.stage_modes()
    ks = plan.recompute_layers
    if "block" not in recs:
        if any(ks):
            raise ConfigError("--plan", "recompute_layers", "counts the layers a recompute=block stage re-runs "
                                                            "whole; no stage is block")
        return
    if len(ks) not in (1, plan.pp):
        raise ConfigError("--plan", "recompute_layers", f"a block stage needs its count of layers re-run whole: "
                                                        f"one count, or one per stage (pp = {plan.pp}), got "
                                                        f"{':'.join(map(str, ks)) or 'none'}")
    counts = stage_split(model, plan)
    for i, (r, n, k) in enumerate(zip(recs, counts, per, strict=True)):
        if r == "block" and not 1 <= k <= n:
            raise ConfigError("--plan", "recompute_layers", f"stage {i} (block, {n} layers) must re-run 1 to {n} "
                                                            f"of its layers whole, got {k}")
        if r != "block" and k:
            raise ConfigError("--plan", "recompute_layers", f"stage {i} is {r}, not block: its count must be 0, "
                                                            f"got {k}")


def _check_experts(model: Model, plan: Plan, dp: int) -> None:
    """ep and etp: a mixture of experts only; ep divides the experts, etp the expert FFN width, and
    etp x ep the tp x cp x dp ranks of a stage (Megatron-Core's expert layout)."""
    if not model.moe:
        if plan.ep > 1 or plan.etp > 1 or plan.ep_overlap or plan.shared_overlap:
            key = ("ep" if plan.ep > 1 else "etp" if plan.etp > 1 else "ep_overlap" if plan.ep_overlap
                   else "shared_overlap")
            raise ConfigError("--plan", key, f"{model.name} has no experts; allowed: "
                                             f"{0 if key.endswith('overlap') else 1}")
        return
    if plan.ep_overlap:
        _check_ep_overlap(model, plan)
    if plan.shared_overlap and (why := shared_overlap_conflict(plan, model.shared_experts)):
        raise ConfigError("--plan", "shared_overlap", f"needs {why} (Megatron-Core's "
                                                      "--moe-shared-expert-overlap); allowed: 0 here")
    ranks = plan.tp * plan.cp * dp
    if model.experts % plan.ep or ranks % (plan.ep * plan.etp):
        raise ConfigError("--plan", "ep", f"must divide the experts ({model.experts}) and tp*cp*dp/etp "
                                          f"({ranks}/{plan.etp}); allowed: "
                                          f"{divisors(math.gcd(model.experts, ranks // math.gcd(ranks, plan.etp)))}")
    if model.expert_ffn % plan.etp or ranks % plan.etp:
        raise ConfigError("--plan", "etp", f"must divide the expert FFN width ({model.expert_ffn}) and "
                                           f"tp*cp*dp ({ranks}); allowed: "
                                           f"{divisors(math.gcd(model.expert_ffn, ranks))}")


def _check_ep_overlap(model: Model, plan: Plan) -> None:
    """What Megatron-Core 0.16 requires of ``--overlap-moe-expert-parallel-comm``
    (transformer_config.py ``__post_init__``): expert parallelism, an interleaved pipeline when
    pp > 1, no full or block recompute, a 16-bit (or fp8) model. DualPipe pairs its own chunks
    (``overlaped_forward_backward``), so under ``pipe_schedule`` dualpipe the pipeline need not be
    interleaved; the rest is kept."""
    why = ("ep > 1" if plan.ep == 1
           else "vp > 1 when pp > 1" if plan.pp > 1 and plan.vp == 1 and plan.pipe_schedule != "dualpipe"
           else "no full or block recompute" if {"full", "block"} & set(plan.stage_modes()[0])
           else "a bf16, fp16 or fp8 model" if model.precision == "fp32" else "")
    if why:
        raise ConfigError("--plan", "ep_overlap", f"needs {why} (Megatron-Core's "
                                                  "--overlap-moe-expert-parallel-comm); allowed: 0 here")
