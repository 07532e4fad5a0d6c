"""An execution plan: how a training step is laid out over the devices."""
from __future__ import annotations

from dataclasses import dataclass, fields

from .configio import ConfigError

# what one layer re-runs in its backward pass: nothing, the attention core (Megatron's selective),
# torchtitan's per-op policy, or its whole forward
RECOMPUTE = ("none", "selective", "op", "full")
# what a pipeline stage may do: a layer mode, or ``block``: its first ``recompute_layers`` layers
# re-run their whole forward and the others nothing (Megatron's --recompute-granularity full
# --recompute-method block --recompute-num-layers N; llm-foundry's activation_checkpointing_target)
PLAN_RECOMPUTE = RECOMPUTE + ("block",)
# the modes the placement search tries by default (``op`` is torchtitan's policy, chosen explicitly)
SEARCHED_RECOMPUTE = ("none", "selective", "full", "block")
ATTENTION = ("flash", "flash2", "standard")
OPTIMIZERS = ("adam", "adam-megatron", "adam-megatron-pa", "adam-megatron-pa-bf16", "adam-deepspeed", "sgd")
# Megatron's mixed-precision optimizers (its main gradients and their hooks, the zeroed buffer):
# its own passes around FusedAdam, and its precision-aware optimizer (--use-precision-aware-optimizer,
# Transformer Engine's FusedAdam) with fp32 or bf16 moments (phaze.graph.optimizer_op)
MEGATRON_OPTIMIZERS = ("adam-megatron", "adam-megatron-pa", "adam-megatron-pa-bf16")
PRECISION_AWARE = MEGATRON_OPTIMIZERS[1:]
# the cross entropy's kernels (phaze.graph._logits_and_loss): PyTorch's on upcast logits; Megatron's
# vocab-parallel one, a pass a step (Megatron-LM 2021-22, Megatron-Core without fusion); Megatron-Core's
# fused one (--cross-entropy-loss-fusion, its native impl: three compiled functions); Transformer
# Engine's Triton kernels (cross_entropy_fusion_impl te: the gradient written in the forward)
LOSSES = ("torch", "megatron", "fused", "te")
SCHEDULES = ("optimal", "sequential")
ROUTING = ("forced", "dropless", "capacity")
DISPATCHERS = ("alltoall", "deepep")
# how context parallelism exchanges K and V (Plan.cp_comm): Transformer Engine's --cp-comm-type
# p2p / all_gather / a2a / a2a+p2p (Megatron-Core, NeMo), or PyTorch's context parallel (torchtitan)
CP_COMMS = ("p2p", "all_gather", "a2a", "a2a+p2p", "torch")
CP_COMMS_ALLOWED = "one of " + ", ".join(CP_COMMS)
# how FSDP (zero 3) holds a pipeline stage's weights when pp > 1 (Plan.fsdp_pp): gathered for each
# micro-batch's forward and again for its backward, its gradients reduce-scattered each micro-batch;
# or gathered once per step and kept whole, the gradients accumulated whole and reduce-scattered
# once after the stage's last backward (PyTorch's pipelining with FSDP2, torchtitan's default)
FSDP_PP = ("micro_batch", "step")
# how a pipeline's stages pass activations and gradients: ``batched``, a send and a receive at once
# (Megatron's batch_isend_irecv: send_forward_recv_backward and its mirror, two transfers a
# micro-batch); ``blocking``, each send and receive on its own, one after another, with a small
# metadata tensor before each (DeepSpeed's pipeline engine: p2p.send and p2p.recv, a
# PartitionedTensor's meta and data), so that a stage between two others waits through four
# transfers a micro-batch; ``overlapped``, Megatron-Core's overlap_p2p_comm, which only its
# interleaved schedule runs (vp > 1; batched otherwise): each chunk's send and receive posted
# asynchronously after its compute and waited before the chunk that needs them, so the transfer
# runs under the chunk computed in between
PIPE_P2P = ("batched", "blocking", "overlapped")
# the order of a pipeline's forward and backward chunks: ``1f1b``, one forward then one backward
# per micro-batch once the pipeline is full (interleaved over ``vp`` chunks a stage when vp > 1;
# Megatron's, DeepSpeed's, PyTorch's schedules); ``dualpipe``, DeepSeek-V3's bidirectional
# schedule (phaze.dualpipe): micro-batches enter from both ends, every rank holds two stages and
# overlaps a forward chunk with a backward one
PIPE_SCHEDULES = ("1f1b", "dualpipe")
PIPE_SCHEDULES_ALLOWED = "one of " + ", ".join(PIPE_SCHEDULES)
# activations a full recompute keeps in the host's memory instead of re-running them (Plan.offload):
# ``qkv_proj``, the attention's query, key and value projections' outputs (MaxText's
# ``remat_policy: qkv_proj_offloaded``, maxtext 0.2.5 layers/decoders.py: JAX's
# ``save_and_offload_only_these_names`` with query_proj, key_proj and value_proj sent to pinned
# host memory and every other activation recomputed)
OFFLOADS = ("qkv_proj",)


def cp_a2a_groups(cp: int) -> tuple[int, ...]:
    """The all-to-all groups ``a2a+p2p`` can run at ``cp``: those that divide it and leave a ring
    of two or more groups."""
    return tuple(a for a in range(2, cp) if cp % a == 0)


def one_or_several(values) -> object:
    """``values`` (non-empty) without repeats, in order: the one value itself, or a tuple of them
    (a placement option given as one setting or as the settings to search)."""
    values = tuple(dict.fromkeys(values))
    return values[0] if len(values) == 1 else values


def several(raw, parse, allowed: str) -> object:
    """A placement option given as one word or a list (or tuple) of them, each read by ``parse``
    (ValueError with its reason for a bad one), as :func:`one_or_several` returns it; ValueError
    naming what is ``allowed`` for an empty list."""
    items = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not items:
        raise ValueError(f"must be {allowed} or a non-empty list of them, got []")
    try:
        return one_or_several([parse(x) for x in items])
    except ValueError as exc:
        raise ValueError(str(exc) + (" (or a list of them)" if isinstance(raw, (list, tuple)) else "")) from None


OFFLOADS_ALLOWED = "one of none, " + ", ".join(OFFLOADS)


def offload_value(raw) -> str:
    """An activation offload as a flag or a sweep key gives it (``none`` is ""); ValueError with
    :data:`OFFLOADS_ALLOWED` otherwise."""
    word = raw.strip().lower() if isinstance(raw, str) else raw
    if word in OFFLOADS or word == "none":
        return "" if word == "none" else word
    raise ValueError(f"must be {OFFLOADS_ALLOWED}, got {raw!r}")


def pipe_schedule_value(raw) -> str:
    """A ``pipe_schedule`` as a flag or a sweep key gives it (either case); ValueError with
    :data:`PIPE_SCHEDULES_ALLOWED` otherwise."""
    word = raw.strip().lower() if isinstance(raw, str) else raw
    if word in PIPE_SCHEDULES:
        return word
    raise ValueError(f"must be {PIPE_SCHEDULES_ALLOWED}, got {raw!r}")


def cp_comm_value(raw) -> str:
    """A ``cp_comm`` as a plan key, a flag, a sweep key or a CSV cell gives it (either case);
    ValueError with :data:`CP_COMMS_ALLOWED` otherwise."""
    word = raw.strip().lower() if isinstance(raw, str) else raw
    if word in CP_COMMS:
        return word
    raise ValueError(f"must be {CP_COMMS_ALLOWED}, got {raw!r}")


# Megatron-Core's selective recompute modules (--recompute-modules; transformer_config.py, 0.16):
# the core attention, the experts' activation, the norms that are modules of their own, MLA's up
# projections, a dense layer's MLP, the whole MoE layer, the shared experts
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


def ordered_modules(names) -> tuple[str, ...] | None:
    """``names`` in :data:`RECOMPUTE_MODULES` order, or None unless there is at least one and each is
    a known module named once (callers say the error in their own terms)."""
    names = list(names)
    if not names or any(m not in RECOMPUTE_MODULES for m in names) or len(set(names)) != len(names):
        return None
    return tuple(m for m in RECOMPUTE_MODULES if m in names)


def graph_recompute(r: str, modules: tuple[str, ...], offload: str = "") -> str:
    """What one layer's graph re-runs for a stage mode ``r``: a selective recompute of Megatron-Core
    ``modules`` is ``selective+<module>+...``; plain ``selective`` (no modules) is Megatron-LM's
    (the core attention when it is not a fused kernel); a full one with activations ``offload``ed
    to the host is ``full/offload=<what>``; any other mode is itself."""
    if r == "full" and offload:
        return f"full/offload={offload}"
    return "selective+" + "+".join(modules) if r == "selective" and modules else r


def offloaded_of(recompute: str) -> str:
    """What a ``full/offload=...`` graph recompute keeps on the host (:func:`graph_recompute`); ""
    for any other recompute."""
    return recompute.removeprefix("full/offload=") if recompute.startswith("full/offload=") else ""


def is_full(recompute: str) -> bool:
    """Whether a graph recompute re-runs the whole forward (offloaded activations aside)."""
    return recompute == "full" or bool(offloaded_of(recompute))


def recompute_modules_of(recompute: str) -> frozenset[str] | None:
    """The modules of a ``selective+...`` graph recompute (:func:`graph_recompute`); None for any
    other recompute."""
    if not recompute.startswith("selective+"):
        return None
    return frozenset(recompute.split("+")[1:])


def hides_dp_reduction(overlap: bool, flat_only: bool, pp: int, sp: bool) -> bool:
    """Whether a plan's data-parallel gradient reduction runs under the backward: ``overlap``,
    unless the framework hides it only in runs without pipeline and sequence parallelism
    (``flat_only``, NeMo 1.x) and this one has either."""
    return overlap and not (flat_only and (pp > 1 or sp))


def shared_overlap_conflict(plan, shared_experts: int) -> str:
    """What keeps Megatron-Core from running a plan's shared experts (``shared_experts`` of them
    in the model) beside its token all-to-alls (``--moe-shared-expert-overlap``; megatron-core
    0.16.1 transformer_config.py ``__post_init__``: the alltoall dispatcher only, not with
    ``--overlap-moe-expert-parallel-comm``, not with the shared experts recomputed; without
    shared experts there is nothing to overlap), or "" when nothing does."""
    if not shared_experts:
        return "shared experts"
    if plan.dispatcher == "deepep":
        return "the alltoall dispatcher (not DeepEP's)"
    if plan.ep_overlap:
        return "ep_overlap off (the all-to-alls already run under another micro-batch)"
    if "shared_experts" in plan.recompute_modules and "selective" in plan.stage_modes()[0]:
        return "the shared experts kept, not recomputed (recompute_modules without shared_experts)"
    return ""


def is_layer_recompute(recompute: str) -> bool:
    """Whether ``recompute`` is a layer graph's recompute: a :data:`RECOMPUTE` mode or a selective
    recompute of known modules, or a full one with known activations offloaded."""
    mods = recompute_modules_of(recompute)
    return (recompute in RECOMPUTE or offloaded_of(recompute) in OFFLOADS
            or (mods is not None and bool(mods) and mods <= set(RECOMPUTE_MODULES)))


def layer_modes(modes) -> tuple[str, ...]:
    """The layer recompute modes (:data:`RECOMPUTE`, in its order) that stages under ``modes``
    (:data:`PLAN_RECOMPUTE`) run: a ``block`` stage's layers run ``none`` or ``full``."""
    wanted = set(modes) | ({"none", "full"} if "block" in modes else set())
    return tuple(r for r in RECOMPUTE if r in wanted)


DP_SHARD_NODE = -1   # Plan.dp_shard: the data-parallel ranks inside one node or pod slice
DP_SHARD_ALLOWED = "all, node or a positive integer (data-parallel ranks per ZeRO shard group)"


def dp_shard_value(raw) -> int | None:
    """A ``dp_shard`` as a plan key, a flag, a sweep key or a CSV cell gives it: ``all`` -> 0,
    ``node`` -> :data:`DP_SHARD_NODE` (either case), a positive count (text or integer) -> itself;
    None for anything else (each caller says its own error, :data:`DP_SHARD_ALLOWED`)."""
    if isinstance(raw, str):
        word = raw.strip().lower()
        if word in ("all", "node"):
            return 0 if word == "all" else DP_SHARD_NODE
        return int(word) if word.isascii() and word.isdigit() and int(word) > 0 else None
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else None


def dp_shard_text(value: int) -> str:
    """``all``, ``node`` or the count: a ``dp_shard`` as plans and printouts write it."""
    return "node" if value == DP_SHARD_NODE else "all" if not value else str(value)


@dataclass(frozen=True)
class Plan:
    """Tensor (``tp``), pipeline (``pp``) and context (``cp``) parallel widths; data parallelism
    takes the remaining devices. ``vp`` interleaved chunks per pipeline stage; ``zero`` 0-3
    shards optimizer state / gradients / weights over data parallelism (3 = FSDP); ``sp``
    sequence parallelism (default: on whenever ``tp > 1``); ``attention`` is the kernel: ``flash``
    a fused attention written for the chip, ``flash2`` FlashAttention-2 (mma.sync fragments of
    16 query rows, the design of the Ampere generation), ``standard`` unfused (scores in HBM);
    ``dp_overlap`` hides the gradient
    reduction behind the last backward pass; ``tp_overlap`` hides the tensor-parallel collectives
    behind the layer's GEMMs (Megatron's ``--tp-comm-overlap``; not the experts' all-to-alls and
    gathers, which only XLA, on a compiled chip, hides too); ``tp_async`` issues the backward
    tensor-parallel collectives asynchronously, each under one GEMM (Megatron-LM's default since 2022:
    the sequence-parallel input's all-gather under the input-gradient GEMM, the input gradient's
    reduce-scatter or all-reduce under the weight-gradient GEMM; on a GPU, where kernels otherwise
    run one after another); ``reduce_fp32`` reduces
    gradients in fp32 (Megatron's ``--accumulate-allreduce-grads-in-fp32``, FSDP's default
    mixed precision). ``ep`` (expert parallelism) and ``etp`` (expert tensor parallelism) lay out
    a mixture of experts' expert layers as Megatron-Core does: a stage's tp x cp x dp ranks are
    re-folded as etp x ep x edp (edp, the expert data parallelism, takes the rest; etp ranks are
    adjacent, ep ranks ``etp`` apart). ``routing``: ``forced`` balanced tokens (Megatron's
    ``--moe-router-force-load-balancing``), ``dropless`` real routing (the busiest rank gets more
    than the mean), ``capacity`` tokens capped at the model's capacity factor (padded to it); blank:
    ``capacity`` when the model has a capacity factor, else ``dropless``. ``dispatcher``: the
    token all-to-all, ``alltoall`` (one flat all-to-all over ep of a copy per expert, Megatron's
    default) or ``deepep`` (DeepEP: a token sent once to each rank its experts are on, across nodes
    once per destination node, then forwarded inside it, and permuted on the receiving rank);
    ``ep_overlap`` hides the all-to-alls under another micro-batch's compute (Megatron-Core's
    ``--overlap-moe-expert-parallel-comm``, the "1F1B overlap" of its MoE guide);
    ``shared_overlap`` runs the shared experts on a stream of their own beside the token
    all-to-alls (Megatron-Core's ``--moe-shared-expert-overlap``: the dispatch under their first
    linear, the combine under their second, and the mirror in the backward). ``loss``: how
    the cross entropy runs over the logits, ``torch`` (PyTorch's on the fp32-upcast logits: one
    log-softmax pass) or ``megatron`` (Megatron-LM's vocab-parallel cross entropy: upcast, then
    max, subtract, exp, sum and divide, each a pass over the fp32 logits). ``grad_accum_fusion``
    (Megatron's optimizers only, :data:`MEGATRON_OPTIMIZERS`): the weight-gradient GEMMs add into
    the main gradients themselves (Megatron's gradient-accumulation fusion); without it each micro-batch's 16-bit
    gradients are added into them tensor by tensor (the data-parallel wrapper's backward hook).
    ``dp_shard`` (``zero`` 1-3): the data-parallel ranks one ZeRO shard group spans, hybrid
    sharding when fewer than dp (HSDP: the state is sharded inside each group, replicated across
    the groups, whose gradients are all-reduced once per step; FSDP's ``HYBRID_SHARD``,
    torchtitan's ``data_parallel_replicate_degree``, Megatron-Core's
    ``--num-distributed-optimizer-instances``, MaxText's FSDP over a slice's ICI with data
    parallelism over the data-centre network): 0 (``all``) every rank, :data:`DP_SHARD_NODE`
    (``node``) the ranks inside one node or pod slice, N the N adjacent ranks. ``cp_comm``: how
    context parallelism exchanges K and V (:data:`CP_COMMS`): ``p2p`` a ring whose each send
    hides under one step's attention (Transformer Engine's default), ``all_gather`` K and V
    gathered before the attention and their gradients reduce-scattered after it, exposed,
    ``a2a`` Ulysses' all-to-alls of Q, K, V and the output between sequence and head shards,
    exposed, ``a2a+p2p`` Transformer Engine's hierarchical exchange (Megatron-Core's
    ``--hierarchical-context-parallel-sizes``): Ulysses' all-to-alls inside groups of ``cp_a2a``
    adjacent context-parallel ranks, then a ring over the cp / ``cp_a2a`` groups, ``torch``
    PyTorch's context parallel (its default all-gather rotater: the gather under the first step's
    attention, the fp32 K/V gradients passed round the ring). ``fsdp_pp`` (``zero`` 3 with ``pp`` >
    1, :data:`FSDP_PP`): ``micro_batch``, each layer's weights gathered for every micro-batch's
    forward and again for its backward and its gradients reduce-scattered every micro-batch;
    ``step``, a stage's weights gathered once per step and kept whole with their gradients, which
    are reduce-scattered once after the stage's last backward (PyTorch's pipelining schedules
    with FSDP2, torchtitan's default). ``fp8_params`` (an fp8 run): the linear layers' weights are
    held in fp8, with the transposed copy a Hopper backward reads, and gathered in fp8 by the
    distributed optimizer and FSDP (Megatron-Core's ``--fp8-param-gather``, NeMo's fp8 plugins:
    the optimizer casts its fp32 shard to fp8 before the gather); without it they are 16-bit, and
    where Transformer Engine's modules run under Megatron-Core (the model's ``fp8_casts`` fused,
    ZeRO below 3) each step's first micro-batch casts them to fp8 in both layouts and caches the
    casts for the step's other micro-batches, beside the 16-bit weights. ``pipe_p2p``: how the
    pipeline's stages exchange activations and gradients (:data:`PIPE_P2P`). ``pipe_schedule``: the
    order of the pipeline's chunks (:data:`PIPE_SCHEDULES`); ``dualpipe`` overlaps its paired
    chunks' all-to-alls when ``ep_overlap`` is on. ``offload`` (with a full recompute,
    :data:`OFFLOADS`): the activations sent to the host's memory in the forward pass and brought
    back for the backward instead of re-run, over the chip's host link, under the layer's compute."""

    tp: int = 1
    pp: int = 1
    mbs: int = 1
    recompute: str = "none"
    sp: bool | None = None
    vp: int = 1
    cp: int = 1
    zero: int = 0
    attention: str = "flash"
    optimizer: str = "adam"
    dp_overlap: bool = True
    tp_overlap: bool = False
    tp_async: bool = False
    reduce_fp32: bool = False
    schedule: str = "optimal"              # layer time: CP-SAT schedule | sequential sum of ops
    stages: tuple[int, ...] = ()           # layers per pipeline stage (empty: even split)
    stage_recompute: tuple[str, ...] = ()  # recompute per stage (empty: ``recompute`` everywhere)
    recompute_layers: tuple[int, ...] = ()  # layers a ``block`` stage re-runs whole: one count for
                                            # every stage, or one per stage (0 where not block)
    memory_reserve: float | None = None    # bytes per device kept free (None: the chip's modelled reserve)
    ep: int = 1                            # expert parallel width (mixture of experts)
    etp: int = 1                           # expert tensor parallel width
    routing: str = ""                      # forced | dropless | capacity ("": from the model)
    dispatcher: str = ""                   # MoE token dispatch: alltoall | deepep ("": alltoall)
    ep_overlap: bool = False               # MoE all-to-alls overlapped with another micro-batch's compute
    shared_overlap: bool = False           # MoE shared experts beside the token all-to-alls (their own stream)
    loss: str = "torch"                    # cross-entropy kernels: torch | megatron | fused | te (LOSSES)
    recompute_modules: tuple[str, ...] = ()  # what a selective stage re-runs, Megatron-Core's modules
                                             # (RECOMPUTE_MODULES); empty: Megatron-LM's selective
    grad_accum_fusion: bool = True         # weight-gradient GEMMs accumulate into the main gradients
    dp_shard: int = 0                      # data-parallel ranks of a ZeRO shard group: 0 all,
                                           # DP_SHARD_NODE a node's (pod slice's), N adjacent ranks
    cp_comm: str = "p2p"                   # context parallelism's K/V exchange (CP_COMMS)
    cp_a2a: int = 1                        # a2a+p2p: context-parallel ranks of one all-to-all group
    fsdp_pp: str = "micro_batch"           # zero 3 with pp > 1: weights gathered per micro-batch | per step
    fp8_params: bool = False               # an fp8 run's linear weights held and gathered in fp8
    pipe_p2p: str = "batched"              # pipeline sends: batched | blocking | overlapped (PIPE_P2P)
    pipe_schedule: str = "1f1b"            # pipeline chunk order: 1f1b | dualpipe (PIPE_SCHEDULES)
    offload: str = ""                      # full recompute: activations kept on the host (OFFLOADS; "": none)

    def __post_init__(self):
        if self.sp is None:
            object.__setattr__(self, "sp", self.tp > 1)

    @property
    def fsdp_once(self) -> bool:
        """FSDP under pipeline parallelism holding each stage's weights and gradients whole through
        the step (``fsdp_pp`` step): one gather and one reduce-scatter per step, not per micro-batch."""
        return self.zero >= 3 and self.pp > 1 and self.fsdp_pp == "step"

    def dp(self, devices: int) -> int:
        return devices // (self.tp * self.pp * self.cp)

    def edp(self, devices: int) -> int:
        """Expert data parallelism: the devices of a stage left after etp x ep."""
        return devices // (self.pp * self.etp * self.ep)

    def stage_modes(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Each stage's recompute mode and the layers it re-runs whole (``block`` stages; 0 for the
        others): ``recompute_layers`` gives one count for every block stage or one per stage."""
        recs = self.stage_recompute or (self.recompute,) * self.pp
        ks = self.recompute_layers
        if len(ks) == 1:
            ks = tuple(ks[0] if r == "block" else 0 for r in recs)
        elif not ks:
            ks = (0,) * len(recs)
        return recs, ks

    def label(self) -> str:
        return (f"tp={self.tp},pp={self.pp},mbs={self.mbs},recompute={self.recompute}"
                + (",sp=1" if self.sp and self.tp > 1 else "")
                + (f",vp={self.vp}" if self.vp > 1 else "") + (f",cp={self.cp}" if self.cp > 1 else "")
                + (f",cp_comm={self.cp_comm}" if self.cp > 1 and self.cp_comm != "p2p" else "")
                + (f",cp_a2a={self.cp_a2a}" if self.cp > 1 and self.cp_a2a > 1 else "")
                + (f",zero={self.zero}" if self.zero else "") + f",attention={self.attention}"
                + (",tp_overlap=1" if self.tp_overlap else "") + (",tp_async=1" if self.tp_async else "")
                + (f",schedule={self.schedule}" if self.schedule != "optimal" else "")
                + (",stages=" + ":".join(map(str, self.stages)) if self.stages else "")
                + (",stage_recompute=" + ":".join(self.stage_recompute) if self.stage_recompute else "")
                + (",recompute_layers=" + ":".join(map(str, self.recompute_layers)) if self.recompute_layers else "")
                + (f",ep={self.ep}" if self.ep > 1 else "") + (f",etp={self.etp}" if self.etp > 1 else "")
                + (f",routing={self.routing}" if self.routing else "")
                + (f",dispatcher={self.dispatcher}" if self.dispatcher else "")
                + (",ep_overlap=1" if self.ep_overlap else "")
                + (",shared_overlap=1" if self.shared_overlap else "")
                + (",dp_overlap=0" if not self.dp_overlap else "")
                + (f",loss={self.loss}" if self.loss != "torch" else "")
                + (",grad_accum_fusion=0" if not self.grad_accum_fusion and self.optimizer in MEGATRON_OPTIMIZERS
                   else "")
                + (f",dp_shard={dp_shard_text(self.dp_shard)}" if self.dp_shard and self.zero else "")
                + (f",fsdp_pp={self.fsdp_pp}" if self.fsdp_pp != "micro_batch" and self.zero >= 3 and self.pp > 1
                   else "")
                + (",recompute_modules=" + "+".join(self.recompute_modules)
                   if self.recompute_modules and "selective" in self.stage_modes()[0] else "")
                + (",fp8_params=1" if self.fp8_params else "")
                + (f",pipe_p2p={self.pipe_p2p}" if self.pipe_p2p != "batched" and self.pp > 1 else "")
                + (f",pipe_schedule={self.pipe_schedule}" if self.pipe_schedule != "1f1b" else "")
                + (f",offload={self.offload}" if self.offload else ""))


_INT_KEYS = ("tp", "pp", "mbs", "vp", "cp", "ep", "etp", "cp_a2a")
_NOT_KEYS = ("memory_reserve",)      # set by --memory-reserve, not part of a plan's text
PLAN_KEYS = ("tp", "pp", "mbs", "recompute", "sp", "vp", "cp", "zero", "attention", "optimizer", "dp_overlap",
             "tp_overlap", "tp_async", "reduce_fp32", "schedule", "stages", "stage_recompute", "recompute_layers",
             "ep", "etp", "routing",
             "dispatcher", "ep_overlap", "shared_overlap", "loss", "recompute_modules", "grad_accum_fusion",
             "dp_shard", "cp_comm", "cp_a2a", "fsdp_pp", "fp8_params", "pipe_p2p", "pipe_schedule",
             "offload")
BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
              "off": False}   # a switch's words, in --plan and in the flags that take off,on


def parse_plan(text: str, source: str = "--plan") -> Plan:
    """``tp=8,pp=8,mbs=1,recompute=selective`` -> :class:`Plan`."""
    allowed = [f.name for f in fields(Plan) if f.name not in _NOT_KEYS]
    values: dict = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key:
            raise ConfigError(source, key or None, f"expected key=value, got {item!r}")
        if key not in allowed:
            raise ConfigError(source, key, f"unknown key; allowed: {', '.join(allowed)}")
        if key in values:
            raise ConfigError(source, key, "given twice; allowed: each key at most once")
        if key in _INT_KEYS or key == "zero":
            lo = 0 if key == "zero" else 1
            if not (raw.isascii() and raw.isdigit()) or int(raw) < lo or (key == "zero" and int(raw) > 3):
                what = "0, 1, 2 or 3" if key == "zero" else "a positive integer"
                raise ConfigError(source, key, f"must be {what}, got {raw!r}")
            values[key] = int(raw)
        elif key == "dp_shard":
            values[key] = dp_shard_value(raw)
            if values[key] is None:
                raise ConfigError(source, key, f"must be {DP_SHARD_ALLOWED}, got {raw!r}")
        elif key == "stages":
            parts = raw.split(":")
            if not all(x.isascii() and x.isdigit() and int(x) > 0 for x in parts):
                raise ConfigError(source, key, f"must be positive layer counts joined by ':', got {raw!r}")
            values[key] = tuple(int(x) for x in parts)
        elif key == "recompute_layers":
            parts = raw.split(":")
            if not all(x.isascii() and x.isdigit() for x in parts):
                raise ConfigError(source, key, f"must be layer counts (one, or one per stage) joined by ':', "
                                               f"got {raw!r}")
            values[key] = tuple(int(x) for x in parts)
        elif key == "stage_recompute":
            parts = tuple(x.strip().lower() for x in raw.split(":"))
            if not all(x in PLAN_RECOMPUTE for x in parts):
                raise ConfigError(source, key, f"must be {'/'.join(PLAN_RECOMPUTE)} per stage joined by ':', "
                                               f"got {raw!r}")
            values[key] = parts
        elif key == "recompute_modules":
            mods = ordered_modules(x.strip().lower() for x in raw.split("+"))
            if mods is None:
                raise ConfigError(source, key, f"must be distinct modules of {', '.join(RECOMPUTE_MODULES)} "
                                               f"joined by '+', got {raw!r}")
            values[key] = mods
        elif key in ("sp", "dp_overlap", "tp_overlap", "tp_async", "reduce_fp32", "ep_overlap", "shared_overlap",
                     "grad_accum_fusion", "fp8_params"):
            if raw.lower() not in BOOL_WORDS:
                raise ConfigError(source, key, f"must be true or false, got {raw!r}")
            values[key] = BOOL_WORDS[raw.lower()]
        elif key == "cp_comm":
            try:
                values[key] = cp_comm_value(raw)
            except ValueError as exc:
                raise ConfigError(source, key, str(exc)) from None
        else:
            choices = {"recompute": PLAN_RECOMPUTE, "attention": ATTENTION, "optimizer": OPTIMIZERS,
                       "schedule": SCHEDULES, "routing": ROUTING,
                       "dispatcher": DISPATCHERS, "loss": LOSSES, "fsdp_pp": FSDP_PP, "pipe_p2p": PIPE_P2P,
                       "pipe_schedule": PIPE_SCHEDULES, "offload": OFFLOADS}[key]
            if raw.lower() not in choices:
                raise ConfigError(source, key, f"must be one of {', '.join(choices)}, got {raw!r}")
            values[key] = raw.lower()
    plan = Plan(**values)
    if plan.recompute_modules and "selective" not in plan.stage_modes()[0]:
        raise ConfigError(source, "recompute_modules", "says what a selective recompute re-runs: give it with "
                                                      "recompute=selective (or a selective stage)")
    return plan
