"""Operator graphs: one transformer layer's forward and backward DAG, plus the embedding,
logits/loss and optimizer work, for a micro-batch and a tensor-parallel width.

Each :class:`Op` carries its shape, FLOPs, HBM bytes, the unit kind it runs on and, for
communication, its :class:`Collective`. FLOPs are the arithmetic the hardware performs
(fused causal attention skips masked blocks: see ``work_fraction``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from .plan import is_full, offloaded_of, recompute_modules_of
from .workload import Model


@dataclass(frozen=True)
class Collective:
    """A collective over one parallel group; ``bytes`` is the full (unsharded) buffer."""

    kind: str    # all_reduce | reduce_scatter | all_gather | send | all_to_all
    group: str   # tp | dp | pp | ep | etp
    bytes: float
    # the backward's collective of the same bytes; "": the mirror of ``kind`` (none for an
    # all-reduce of partial sums, whose gradient is the same on every rank)
    backward: str = ""


# Dropless (real, auxiliary-loss) routing: the busiest expert-parallel rank receives this many
# times the mean tokens, and so sets the expert GEMMs' and the all-to-all's time. An estimate, not
# a fit: Megatron-MoE-ModelZoo's paired forced-balance / dropless runs of the same layout (S21 in
# phaze/data/reference: Qwen3-235B 295 vs 237, 335 vs 277, 368 vs 320, 389 vs 357 TFLOP/s per GPU;
# Mixtral-8x22B 465 vs 445) lose 4-24 % of throughput to it with the expert part 40-70 % of a layer.
# So S21's dropless rows are in sample for it. Uniform independent routing would give about 1.01
# (docs/design.md); the rest is correlated routing, which no bundled public measurement gives.
DROPLESS_LOAD = 1.3


@dataclass(frozen=True)
class ExpertLayout:
    """How a mixture of experts' expert layers run on one device: ``ep`` expert-parallel ranks
    (``etp`` apart), ``etp`` expert-tensor-parallel ranks sharing each expert's FFN width, and
    ``load``, the busiest rank's tokens over the mean (1: balanced). ``nodes`` > 1: the ep ranks
    span that many nodes and the dispatcher sends each token once per node it is routed to, then
    forwards it inside the node (DeepEP's internode kernels); 1: one flat all-to-all.
    ``deepep``: DeepEP's dispatcher (a token once to each rank its experts are on, permuted on the
    receiving rank); False: Megatron-Core's all-to-all dispatcher (a copy per expert, the received
    copies sorted by local expert)."""

    ep: int = 1
    etp: int = 1
    load: float = 1.0
    nodes: int = 1
    overlap: bool = False   # the all-to-alls run under another micro-batch's compute (1F1B overlap)
    shared_overlap: bool = False   # the shared experts run beside the all-to-alls (their own stream)
    deepep: bool = False

    def node_share(self, experts: int, top_k: int) -> float:
        """Probability that a token's top-k experts (distinct, uniform) include one of a given
        node's experts/nodes: the share of the nodes each token is sent to once."""
        if self.nodes <= 1:
            return 1.0
        return 1.0 - math.comb(experts - experts // self.nodes, top_k) / math.comb(experts, top_k)

    def nodes_per_token(self, experts: int, top_k: int, groups: int = 0, group_topk: int = 0) -> float:
        """Expected nodes a token's top-k experts fall on (the copies DeepEP sends over the
        network). ``groups``/``group_topk``: group-limited routing (:func:`grouped_nodes_per_token`)."""
        if groups and self.nodes > 1:
            return grouped_nodes_per_token(experts, top_k, self.nodes, groups, group_topk)
        return self.nodes * self.node_share(experts, top_k)


@lru_cache(maxsize=1024)
def grouped_nodes_per_token(experts: int, top_k: int, nodes: int, groups: int, group_topk: int) -> float:
    """Expected nodes a token reaches under group-limited routing (Megatron-Core's
    ``group_limited_topk``, DeepSeek-V3's node-limited routing): the experts form ``groups`` equal
    contiguous groups, the token's ``top_k`` experts come from ``group_topk`` of them, and the ep
    ranks' nodes hold ``experts / nodes`` contiguous experts each. Assumption: the selected groups
    are a uniform draw, and the top-k a uniform draw of distinct experts inside them (the scores
    are not modelled). A node is missed when no pick falls on its experts in the selected groups;
    the chance is summed over the ways the selected groups overlap the node (a count over the
    groups the node touches, the others chosen freely). With one group per node and group_topk
    4 of 8 nodes (DeepSeek-V3 on ep 64), 3.63 nodes per token, against 5.29 without the limit."""
    size, per_node = experts // groups, experts // nodes
    pool = group_topk * size                      # the experts a token may pick from
    total = math.comb(groups, group_topk)
    expected = 0.0
    for j in range(nodes):
        lo, hi = j * per_node, (j + 1) * per_node
        touched = [min(hi, (g + 1) * size) - max(lo, g * size) for g in range(lo // size, (hi - 1) // size + 1)]
        free = groups - len(touched)
        ways = {(0, 0): 1}                        # (groups chosen among the touched, their experts here)
        for o in touched:
            for (t, c), w in list(ways.items()):
                if t < group_topk:
                    ways[t + 1, c + o] = ways.get((t + 1, c + o), 0) + w
        missed = sum(w * math.comb(free, group_topk - t) * math.comb(pool - c, top_k)
                     for (t, c), w in ways.items() if group_topk - t <= free)
        expected += 1.0 - missed / (total * math.comb(pool, top_k))
    return expected


@dataclass(frozen=True)
class Op:
    name: str
    unit: str                      # tensor | vector | tensor+vector (fused) | link
    phase: str                     # fwd | bwd | opt
    flops: float = 0.0
    bytes_read: float = 0.0
    bytes_written: float = 0.0
    gemm: tuple[int, int, int, int] | None = None   # (batch, M, K, N) of M x K . K x N
    elements: float = 0.0          # vector ops: elements processed
    collective: Collective | None = None
    deps: tuple[str, ...] = ()
    core_attention: bool = False   # recomputed under selective recompute
    work_fraction: float = 1.0     # share of ``flops`` actually executed (causal skipping)
    weighted: bool = False         # a GEMM with a weight operand (linear layer, its gradients)
    special: float = 0.0           # transcendental evaluations (exp, tanh) on special-function units
    vector_flops: float = 0.0      # fused ops: the element-wise FLOPs beside the GEMM ones
    operand_reuse: int = 0         # rows sharing each operand read from local SRAM (0: the tile)
    value_width: int = 0           # fused attention: d_v, the width of the product (O = P.V) whose output
                                   # columns the arrays tile (the scores' columns are keys, never short)
    hidden_by: str = ""            # a collective Megatron issues asynchronously under this GEMM (``tp_async``)
    ring: tuple[int, ...] = ()     # fused attention under context parallelism: the ring steps this op
                                   # runs; several run side by side (``gemm`` batch and FLOPs are theirs together)
    grad: str = ""                 # a forward op's backward kernel when not its unit's rule (GRADS)

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


# what the backward runs for a forward op whose gradient is not its unit's rule (Op.grad; "" for
# those): ``none``, no kernel (a bias add or a permute passes its gradient through, a cast's or a
# constant's is none); ``softmax``, autograd's for an op of PyTorch's unfused softmax chain;
# ``rotary``, the inverse rotation by the same kernel; ``scale``, a product with a constant: the
# gradient times it; ``repeat``, copied heads' gradients summed back; ``softcap``, autograd's three
# kernels of a tanh soft-cap; ``gate``, mamba_ssm's gate backward in its chunk scan
GRADS = ("", "none", "softmax", "rotary", "scale", "repeat", "softcap", "gate")

# the Mamba-2 mixer's forward ops its fused scan's backward re-runs before its gradients
SSD_BACKWARD_RERUNS = ("mamba_conv", "ssd_dt", "ssd_cb", "ssd_states", "ssd_state_passing")


def offloaded_bytes(model: Model, mbs: int, tp: int, recompute: str) -> float:
    """Bytes one layer sends to the host's memory in the forward pass, and brings back for the
    backward, per micro-batch on one of ``tp`` devices, under a graph ``recompute`` that offloads
    (:func:`phaze.plan.offloaded_of`; 0 otherwise): ``qkv_proj``, the q, k and v projections'
    16-bit outputs (the heads' share of ``tp``)."""
    if offloaded_of(recompute) != "qkv_proj":
        return 0.0
    width = model.q_dim // tp + 2 * kv_width(model, tp)
    return float(model.bytes_per_element * mbs * model.seq_len * width)


def collective_groups(tp: int, moe: ExpertLayout | None) -> dict:
    """Collective groups of a layer: (size, rank stride); expert ranks are etp-major, then ep
    (``ep_node``: one ep rank per node, the ranks a DeepEP network transfer joins)."""
    if moe is None:
        return {"tp": (tp, 1)}
    return {"tp": (tp, 1), "ep": (moe.ep, moe.etp), "etp": (moe.etp, 1),
            "ep_node": (moe.nodes, moe.etp * (moe.ep // moe.nodes))}


@dataclass(frozen=True)
class LayerGraph:
    """Forward and backward DAGs of one transformer layer on one device."""

    fwd: tuple[Op, ...]
    bwd: tuple[Op, ...]

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.fwd + self.bwd


class _Builder:
    """Appends ops as a chain by default; ``deps`` overrides."""

    def __init__(self, phase: str):
        self.phase, self.ops, self.last = phase, [], ()

    def add(self, name, unit, deps=None, **kw) -> str:
        deps = self.last if deps is None else tuple(deps)
        self.ops.append(Op(name=name, unit=unit, phase=self.phase, deps=deps, **kw))
        self.last = (name,)
        return name


def _gemm(b: _Builder, name, batch, M, K, N, p, weights: bool, deps=None, linear: bool | None = None,
          **kw) -> str:
    """A GEMM; ``weights`` says whether one operand is a weight read once; ``linear`` whether it
    belongs to a linear layer (forward or gradient; default: ``weights``)."""
    flops = 2.0 * batch * M * K * N
    read = p * batch * (M * K + K * N) if not weights else p * (batch * M * K + K * N)
    return b.add(name, "tensor", deps, flops=flops, gemm=(batch, M, K, N), bytes_read=read,
                 bytes_written=p * batch * M * N, weighted=weights if linear is None else linear, **kw)


def _vector(b: _Builder, name, elements, p, reads=1.0, writes=1.0, flops_per_element=1.0,
            deps=None, special_per_element=0.0, **kw) -> str:
    return b.add(name, "vector", deps, flops=flops_per_element * elements, elements=elements,
                 bytes_read=reads * p * elements, bytes_written=writes * p * elements,
                 special=special_per_element * elements, **kw)


def _coll(b: _Builder, name, kind, group, nbytes, deps=None, hidden_by: str = "", backward: str = "") -> str:
    return b.add(name, "link", deps, collective=Collective(kind, group, nbytes, backward), hidden_by=hidden_by)


def _tp_reduce(b: _Builder, name: str, nbytes: float, sp: bool) -> str:
    """A tensor-parallel reduction of partial sums: a reduce-scatter under sequence parallelism,
    else an all-reduce, named ``name`` + its kind."""
    kind = "reduce_scatter" if sp else "all_reduce"
    return _coll(b, f"{name}.{kind}", kind, "tp", nbytes)


def kv_width(model: Model, tp: int) -> int:
    """Width of the key (and of the value) projection on one of ``tp`` ranks: kv_dim / tp, or one
    whole head when tp exceeds the KV heads (Megatron replicates each KV head on tp / kv_heads
    ranks)."""
    return model.head_dim * max(1, model.kv_heads // tp)


def attention_work_fraction(model: Model) -> float:
    """Share of the full (queries x keys) score matrix a fused kernel computes over the whole
    sequence ``seq_len * context_parallel``: causal, 1/2; with a sliding window of w < S keys,
    query i sees min(i, w) keys: (w S - w^2 / 2) / S^2 = (w/S)(1 - w/(2S)); in chunks of c < S
    tokens (Llama 4), each of the n = S // c whole chunks and the remainder r causal on its own:
    (n c^2 + r^2) / (2 S^2); not causal, 1. When only a share of the layers is windowed or
    chunked (GPT-OSS, Llama 4), the layers' mean."""
    if not model.causal:
        return 1.0
    S = model.seq_len * model.context_parallel
    w, c = model.sliding_window, model.attention_chunk
    if 0 < w < S:
        local = (w / S) * (1.0 - w / (2.0 * S))
    elif 0 < c < S:
        n, r = divmod(S, c)
        local = (n * c * c + r * r) / (2.0 * S * S)
    else:
        return 0.5
    share = model.window_layer_share
    return share * local + (1.0 - share) * 0.5


def ring_steps(model: Model, work: float) -> tuple[int, float]:
    """(kernels, share of one local s x s score block each computes) of a context-parallel
    shard's fused attention, whose local queries meet all ``work * (cp s)^2`` scores of the
    sequence divided over cp ranks: ``work * cp`` blocks. Ring attention with causal load
    balancing (Megatron / torchtitan: 2cp chunks, rank i holds chunks i and 2cp-1-i) runs cp steps,
    each over half a block (the diagonal step causally, the others on one half of the queries or
    keys); a sliding window (or chunks) in every layer only needs the steps whose blocks it reaches.
    Hierarchical (``a2a+p2p``): after the all-to-all inside a group of ``a`` ranks a rank holds
    ``a s`` queries of a-th of the heads, and the ring runs over the cp / a groups, each step over
    an (a s) x (a s) block: the same scores in a-th of the steps."""
    cp, s = model.context_parallel, model.seq_len
    if cp == 1:
        return 1, work
    a = model.context_parallel_a2a      # 1 but under a2a+p2p
    groups, rows = cp // a, s * a
    steps = groups
    reach = model.local_attention     # a chunk reaches back at most its length, as a window does
    if model.causal and 0 < reach < s * cp and model.window_layer_share == 1.0:
        steps = min(groups, -(-reach // rows) + 1)
    return steps, min(1.0, work * groups / steps)


def norm_fed_linears(model: Model) -> tuple[str, ...]:
    """The linears whose input is a norm's output that no other operator reads: qkv (unless MLA's
    two down projections read the layer's norm) and a dense FFN's up projection (an MoE layer's
    router reads its norm's output too). Under Transformer Engine's fp8 only their fp8 copy of
    that input is kept."""
    return tuple(n for n, on in (("qkv", not model.mla), ("ffn_up", not model.moe), ("mamba_in", model.hybrid),
                                 ("gdn_in", model.gdn_layers > 0)) if on)


def fp8_fused_inputs(model: Model, tp: int, sp: bool) -> tuple[frozenset, frozenset]:
    """Transformer Engine's fused fp8 casts (``fp8_casts`` fused, Megatron-Core's layer spec):
    the linears whose input the norm before them writes in fp8 (:func:`norm_fed_linears`, and
    MLA's up-projections behind their latents' norms:
    TELayerNormColumnParallelLinear in megatron-core 0.16.1 gpt_layer_specs.py when qk_layernorm),
    and the row-parallel ones that cast their input row-wise only (under sequence parallelism).
    Both empty for a 16-bit model or separate casts."""
    if not model.fp8_fused:
        return frozenset(), frozenset()
    mla_ups = (("q_up", model.q_lora_rank > 0), ("kv_up", True)) if model.mla else ()
    norm_fed = frozenset(norm_fed_linears(model)) | {n for n, on in mla_ups if on}
    rowwise = frozenset(n for n, on in (("attn_out", True), ("ffn_down", not model.moe), ("mamba_out", model.hybrid))
                        if on and tp > 1 and sp)
    return norm_fed, rowwise


def _ring_name(k: int) -> str:
    """The fused attention op of ring step ``k`` (step 0: the only one without cp)."""
    return "flash_attention" + (f".ring{k}" if k else "")


# the linear layers (a weight operand): their backward is a data and a weight gradient
_LINEAR = ("qkv", "attn_out", "ffn_up", "ffn_down", "q_down", "q_up", "kv_down", "kv_up", "router",
           "expert_up", "expert_down", "shared_up", "shared_down", "mamba_in", "mamba_out", "gdn_in", "gdn_out")
# the column-parallel linears whose input sequence parallelism gathers over tp
_COLUMN_PARALLEL = ("qkv", "ffn_up", "shared_up", "mamba_in", "gdn_in")
# the row-parallel linears whose output is reduced over tp (their bias is added after it)
_ROW_PARALLEL = ("attn_out", "ffn_down", "shared_down", "mamba_out", "gdn_out")


# The kernels a rotary embedding runs on each query or key tensor (ROTARY_KERNELS), as (name,
# elements of the tensor it reads and writes in the compute precision, and in fp32, FLOPs), per
# element of the rotated part; ``rotary`` and ``rotary.pass_cat`` pass over the whole head (a
# partial rotation copies the rest). The backward turns the gradient back by the same kernels (a
# rotation's gradient is the inverse rotation: the same passes, and no saved tensor read).
_ROTARY = {
    # Transformer Engine's fused_apply_rotary_pos_emb: one kernel
    "fused": (("rotary", (1, 0), (1, 0), 3.0),),
    # torchtitan's apply_rotary_emb: x.float() viewed as complex, times freqs_cis, view_as_real,
    # type_as(x) (its fp32 freqs_cis, one row per position shared by every head, not counted)
    "complex": (("rotary.upcast", (1, 0), (0, 1), 0.0), ("rotary.rotate", (0, 1), (0, 1), 3.0),
                ("rotary.downcast", (0, 1), (1, 0), 0.0)),
    # megatron-core's _apply_rotary_pos_emb_bshd: t * cos_ + _rotate_half(t) * sin_ (the negated
    # second half, a cat, two multiplies, an add), then torch.cat((t, t_pass))
    "separate": (("rotary.neg", (0.5, 0), (0.5, 0), 0.5), ("rotary.cat", (1, 0), (1, 0), 0.0),
                 ("rotary.cos_mul", (1, 0), (1, 0), 1.0), ("rotary.sin_mul", (1, 0), (1, 0), 1.0),
                 ("rotary.add", (2, 0), (1, 0), 1.0), ("rotary.pass_cat", (1, 0), (1, 0), 0.0)),
}
# separate's tables, made again at each call: cos_ = (torch.cos(freqs) * mscale).to(dtype) and
# sin_ likewise, on the fp32 [s, rotated width] angles (elements read and written, as above)
_ROTARY_TABLES = (("cos", (0, 1), (0, 1)), ("cos_scale", (0, 1), (0, 1)), ("cos_cast", (0, 1), (1, 0)),
                  ("sin", (0, 1), (0, 1)), ("sin_scale", (0, 1), (0, 1)), ("sin_cast", (0, 1), (1, 0)))


def rotary_kernels(model: Model) -> str:
    """How the model's rotary embedding runs (:data:`phaze.workload.ROTARY_KERNELS`), or "" without one."""
    return (model.rotary_kernels or "fused") if model.rotated_width else ""


def copies_kv(model: Model, tp: int) -> bool:
    """Whether the attention reads key/value heads copied to one per query head
    (``kv_repeat`` copied and fewer key/value heads than query heads on a rank)."""
    return model.kv_repeat == "copied" and model.head_dim * (model.heads // tp) > kv_width(model, tp)


def megatron_softmax_fused(model: Model, mbs: int, tp: int) -> bool:
    """Whether an unfused attention's softmax runs as one kernel: always unless ``softmax_kernel``
    is ``megatron``, whose scaled masked softmax kernel runs only where its shape rule holds
    (:func:`megatron_softmax_off`)."""
    return not megatron_softmax_off(model, mbs, tp)


def megatron_softmax_off(model: Model, mbs: int, tp: int) -> str:
    """Why Megatron's scaled masked softmax kernel cannot run this layer's scores ("" where it
    can, or where ``softmax_kernel`` is not ``megatron``). Its rule (megatron-core 0.3.0 to 0.16.1
    fusions/fused_softmax.py ``is_kernel_available``): 16-bit scores, 16 < keys <= 4096, queries
    and keys multiples of 4, and the micro-batch times the rank's heads a multiple of 4 and of the
    kernel's rows per thread block, 4 beyond 128 keys and 8 up to 128 (its
    ``get_batch_per_block``: 128 threads a block, one warp of up to 32 lanes a row, two rows a warp
    up to 128 keys; Transformer Engine 2.8 pytorch softmax.py carries the same formula); a padding
    mask (an encoder) asks the queries, not the rows, to divide by the rows per block.
    Assumption: Megatron-LM 2021-22's, Megatron-DeepSpeed's and apex's (NeMo 1.x) copies of the
    rule are this one (not at hand)."""
    if model.softmax_kernel != "megatron":
        return ""
    sq, sk = model.seq_len, model.seq_len * model.context_parallel
    rows = mbs * (model.heads // tp)
    pow2 = 1 << (sk - 1).bit_length()
    per_block = (128 // min(pow2, 32)) * (2 if pow2 <= 128 else 1)
    if model.bytes_per_element != 2:
        return "its kernel takes 16-bit scores only"
    if not 16 < sk <= 4096:
        return f"{sk} keys, outside its kernel's 17 to 4,096"
    if sq % 4 or sk % 4:
        return f"{sk} keys, not a multiple of 4"
    # a causal mask's rows fill the blocks (per_block is 4 or 8: a multiple of 4 either way)
    need = per_block if model.architecture == "decoder" else 4
    if rows % need:
        return f"micro-batch {mbs} x {model.heads // tp} heads a rank = {rows} rows, not a multiple of {need}"
    if model.architecture != "decoder" and sq % per_block:
        return f"{sq} queries, not a multiple of {per_block}"
    return ""


def kv_heads_read(model: Model, tp: int) -> int:
    """Key (and value) heads the attention reads, keeps and exchanges on one of ``tp`` ranks: this
    rank's own (:func:`kv_width`), or one per query head when they are copied (:func:`copies_kv`)."""
    return model.heads // tp if copies_kv(model, tp) else kv_width(model, tp) // model.head_dim


def separate_biases(model: Model) -> frozenset:
    """The linears whose biases cost kernels of their own (``bias_kernels`` separate, Megatron's
    layers and PyTorch's autograd): every bias gradient is a reduction of the output gradient over
    the tokens, and the qkv projection adds its bias after its GEMM (Megatron's other biases ride
    the element-wise kernels after their GEMMs: bias-GeLU, bias-dropout-add). Empty when the
    biases are GEMM epilogues (``fused``: Transformer Engine's cuBLASLt bias and bias-gradient
    epilogues; XLA's fusion) or the model has none."""
    return model.biased_linears if model.bias_kernels == "separate" else frozenset()


def reruns_needed(model: Model, compiled: bool) -> bool:
    """Whether a full recompute re-runs only what the backward reads: the model says so
    (``recompute_rerun`` needed), or leaves it open and runs as one compiled program, whose
    compiler drops the recomputation nothing reads (XLA; JAX's remat already does)."""
    return model.recompute_rerun == "needed" or (compiled and not model.recompute_rerun)


@lru_cache(maxsize=4096)
def layer_graph(model: Model, mbs: int, tp: int = 1, sp: bool = False,
                attention: str = "flash", recompute: str = "none", moe: ExpertLayout | None = None,
                compiled: bool = False) -> LayerGraph:
    """The forward and backward operator DAGs of one layer on one of ``tp`` devices (for a
    mixture of experts, an MoE layer laid out by ``moe``; default: one rank, balanced).
    ``compiled``: the chip runs one compiled program (:func:`reruns_needed`).

    ``sp`` (sequence parallelism) shards norms, dropouts and residuals over ``tp`` and turns each
    all-reduce into a reduce-scatter plus all-gather. ``recompute`` adds the re-run forward ops to
    the backward graph (``full``: the whole layer, or only what the backward reads of it when
    :func:`reruns_needed`; ``selective``: core attention only; ``op``: torchtitan's per-op
    policy, every other linear and the element-wise ops).
    """
    h, s, b, t = model.hidden, model.seq_len, mbs, tp
    kind = model.layer_kind
    if kind is None:
        raise ValueError(f"{model.name}: a hybrid pattern of several kinds has no one layer graph; "
                         f"take each kind's (phaze.stage.layer_mix)")
    p = model.bytes_per_element
    T = b * s                           # tokens in the micro-batch
    Tn = T // t if sp else T            # tokens each device holds outside the TP regions
    kv_t = kv_width(model, t)
    qkv_n = model.q_dim // t * (2 if model.attention_output_gate else 1) + 2 * kv_t   # the gate: a second query width
    a_t, d, dv = model.heads // t, model.head_dim, model.v_head_dim
    # what a fused attention kernel reads per token: queries, keys and the values at their own
    # width (MLA's are narrower than its keys)
    copied = copies_kv(model, t)
    qkv_read = model.q_dim // t + kv_heads_read(model, t) * (d + dv)
    ffn_out = model.ffn_hidden * (2 if model.gated else 1) // t
    f_t = model.ffn_hidden // t
    fused = attention in ("flash", "flash2")
    cap = 1 if model.attention_softcap else 0   # a soft-capped score: one tanh and 2 FLOPs more (Gemma 2)
    cp = model.context_parallel
    sk = s * cp                         # keys each query sees: the cp ring brings every K/V block
    work = attention_work_fraction(model) if fused else 1.0
    # operands of the fused products are streamed from local SRAM once per this many query rows
    # (FlashAttention-2: 16, the height of an mma.sync fragment); 0: reuse of a full output tile
    reuse = 16 if attention == "flash2" else 0

    fp8 = model.precision == "fp8"
    # Transformer Engine's modules in Megatron-Core's layer spec (fp8_casts=fused): a norm fused
    # into the linear after it (LayerNormLinear) writes its output in fp8, which sequence
    # parallelism gathers in fp8, and the column-wise copy for the weight gradient is transposed
    # in the backward. The row-parallel linears under sequence parallelism cast their input
    # row-wise only (the transpose waits for the backward), and cast their output gradient
    # before gathering it in fp8. Everything else (MoE, MLA) is a TE Linear with its own cast.
    norm_fed, rowwise8 = fp8_fused_inputs(model, t, sp)
    biased = separate_biases(model)
    ln1_write = 1 / p if "qkv" in norm_fed else 1.0   # bytes of the norm's output, in units of p
    ln2_write = 1 / p if "ffn_up" in norm_fed else 1.0
    # the forward gathers that move fp8
    gathered8 = {g for g, n in (("ln1.all_gather", "qkv"), ("ln2.all_gather", "ffn_up")) if n in norm_fed}

    def linear(fb: _Builder, name: str, M: int, K: int, N: int, gemm: bool = True) -> None:
        """A linear layer's GEMM; in fp8 training its input is first scaled and cast to fp8 in
        both layouts (row-wise for this GEMM, column-wise for the weight gradient), unless the
        norm before it writes fp8 (``norm_fed``) or only the row-wise layout is cast now
        (``rowwise8``). Under Megatron-Core (``fp8_casts`` fused) the weights are cast once per
        step and the casts kept across micro-batches (:func:`phaze.stage.caches_fp8_weights`);
        with separate casts (torchao's float8 linears, a ``te.Linear`` not told which micro-batch
        is the first) each forward casts them again (:func:`weight_cast`). ``gemm`` False: the
        cast only (a re-run that needs the cast input for the weight gradient but not the
        product)."""
        base = name.split(".")[-1]
        if fp8 and base not in norm_fed:
            _vector(fb, name + ".fp8_cast", M * K, p, reads=1, writes=(1 if base in rowwise8 else 2) / p,
                    flops_per_element=2, grad="none")
        if not gemm:
            return
        weight_cast(fb, name, K * N)
        _gemm(fb, name, 1, M, K, N, p, weights=True)
        if base == "qkv" and base in biased:   # Megatron's ColumnParallelLinear: output + bias
            _vector(fb, name + ".bias", M * N, p, flops_per_element=1, grad="none")

    def grouped(fb: _Builder, name: str, batch: int, M: int, K: int, N: int) -> None:
        """The experts' grouped GEMM; in fp8 each expert's input is cast in both layouts first
        (Transformer Engine's GroupedLinear: fp8_multi_cast_transpose_fused)."""
        if fp8:
            _vector(fb, name + ".fp8_cast", batch * M * K, p, reads=1, writes=2 / p, flops_per_element=2, grad="none")
        weight_cast(fb, name, batch * K * N)
        _gemm(fb, name, batch, M, K, N, p, weights=True)

    def weight_cast(fb: _Builder, name: str, elements: int) -> None:
        """With separate casts, a linear's 16-bit weights cast to fp8 for this forward, both
        layouts: read 2 bytes, write 1 + 1 (Transformer Engine's cast-transpose, whose delayed
        scaling takes the amax in the same pass; torchao's tensorwise cast reads the weight twice,
        for its amax and for the cast, and writes one layout, whose transposed view the backward
        reads: the same 4 bytes a weight within one). Its backward is nothing."""
        if fp8 and not model.fp8_fused:
            _vector(fb, name + ".weight.fp8_cast", elements, p, reads=1, writes=2 / p, flops_per_element=2,
                    grad="none")

    def forward(fb: _Builder, prefix: str = "", tail: bool = True, qkv: bool = True) -> None:
        """The layer's forward ops. ``tail`` False: without the ops whose results the backward
        never reads (a pre-norm layer's last projections, their tensor-parallel reductions, the
        experts' weighted sum and the residual add), as a re-run that keeps only what the
        backward needs (``recompute_rerun`` needed) skips them. ``qkv`` False: without the q, k,
        v projections' product (their outputs come back from the host, ``offload`` qkv_proj;
        their input, which the weight gradient reads, is still re-made)."""
        n = lambda x: prefix + x  # noqa: E731
        if kind in ("-", "E"):   # a hybrid's MLP or mixture-of-experts layer: its norm, FFN and residual
            _vector(fb, n("ln2"), Tn * h, p, writes=ln2_write, flops_per_element=8)
            (moe_ffn if kind == "E" else dense_ffn)(fb, n, tail)
            if tail:
                _vector(fb, n("ffn_residual"), Tn * h, p, reads=2, flops_per_element=2)
            return
        _vector(fb, n("ln1"), Tn * h, p, writes=ln1_write, flops_per_element=8)
        if t > 1 and sp:
            _coll(fb, n("ln1.all_gather"), "all_gather", "tp", p * ln1_write * T * h)
        if kind == "M":
            mamba_mixer(fb, n, tail)
            return
        if model.linear_attention_interval == -1:   # a Gated DeltaNet layer: its mixer for the attention
            gdn_mixer(fb, n)
            last, out = False, "gdn_out"
        else:
            if model.mla:
                mla_projections(fb, n)
            else:
                linear(fb, n("qkv"), T, h, qkv_n, gemm=qkv)
            heads_prepared(fb, n)
            _attention_core(fb, n)
            if model.attention_output_gate:   # the output times sigmoid(gate) (Qwen3-Next)
                _vector(fb, n("attn_gate"), T * model.o_dim // t, p, reads=2, flops_per_element=4,
                        special_per_element=1)
            if model.parallel_block:
                # the FFN reads the layer's input too; the attention's partial output waits for the
                # FFN's, and the backward never reads it
                linear(fb, n("attn_out"), T, model.o_dim // t, h, gemm=tail)
                if model.parallel_block == "two_norms":
                    _vector(fb, n("ln2"), Tn * h, p, writes=ln2_write, flops_per_element=8)
                dense_ffn(fb, n, tail)
                if tail:
                    _vector(fb, n("ffn_residual"), Tn * h, p, reads=2, flops_per_element=2)
                return
            # a hybrid's attention layer ends here: the backward never reads its output
            last, out = kind == "*", "attn_out"
            linear(fb, n("attn_out"), T, model.o_dim // t, h, gemm=tail or not last)
        if t > 1 and (tail or not last):
            _tp_reduce(fb, n(out), p * T * h, sp)
        if tail or not last:
            if model.sandwich_norm:   # Gemma 2: the reduced output normed before the residual add
                _vector(fb, n("attn_post_norm"), Tn * h, p, flops_per_element=8)
            residual_add(fb, n, "attn")
        if last:
            return
        _vector(fb, n("ln2"), Tn * h, p, writes=ln2_write, flops_per_element=8)
        if model.moe:
            moe_ffn(fb, n, tail)
        else:
            dense_ffn(fb, n, tail)
        if tail:
            if model.sandwich_norm:
                _vector(fb, n("ffn_post_norm"), Tn * h, p, flops_per_element=8)
            residual_add(fb, n, "ffn")

    def residual_add(fb: _Builder, n, branch: str) -> None:
        """A branch's output added to the residual stream; with ``residual_scale`` (Granite:
        ``residual + out * residual_multiplier``) scaled first, a kernel of its own (read and write
        the output once, one FLOP an element), whose backward scales the gradient the same way."""
        if model.residual_scale:
            _vector(fb, n(f"{branch}_out.scale"), Tn * h, p, grad="scale")
        _vector(fb, n(f"{branch}_residual"), Tn * h, p, reads=2, flops_per_element=2)

    rot, rw = rotary_kernels(model), model.rotated_width
    kv_local = kv_t // d                # key/value heads on this rank

    def mamba_mixer(fb: _Builder, n, tail: bool = True) -> None:
        """A Mamba-2 mixer (Megatron-Core 0.16 MambaMixer, its training path: the norm fused
        into the input projection, mamba_ssm's split-conv1d-scan kernel, the group RMSNorm, the
        output projection), on a tp rank's heads and groups: the input projection (z, x, B, C,
        dt), the depthwise causal convolution and SiLU over x, B and C, dt's softplus and
        cumulative decay, then the SSD scan by chunks of Q tokens (Dao and Gu 2024, Sec. 7, its
        four products: C·Bᵀ within a chunk for each group, each chunk's state Bᵀ·X, the output
        from the states before it C·h, and within it (L∘C·Bᵀ)·X, for each head), the states
        passed from chunk to chunk, the skip D·x and the gate by SiLU(z) in the scan's kernel, the group norm, the
        output projection and its reduction, the residual. The chunk's causal decay mask L
        (an exp a head and pair of positions) is computed inside the scan's kernel and not
        costed."""
        H, G, N, P, Q = (model.mamba_heads // t, model.mamba_groups // t, model.mamba_state,
                         model.mamba_head_dim, model.mamba_chunk)
        d_t = H * P
        conv_t = d_t + 2 * G * N
        chunks = b * -(-s // Q)
        linear(fb, n("mamba_in"), T, h, 2 * d_t + 2 * G * N + H)
        _vector(fb, n("mamba_conv"), T * conv_t, p, flops_per_element=2 * model.mamba_conv + 4,
                special_per_element=1)
        _vector(fb, n("ssd_dt"), T * H, p, reads=1 + 4 / p, writes=4 / p, flops_per_element=8,
                special_per_element=2)
        _gemm(fb, n("ssd_cb"), chunks * G, Q, N, Q, p, weights=False)
        _gemm(fb, n("ssd_states"), chunks * H, N, Q, P, p, weights=False)
        _vector(fb, n("ssd_state_passing"), chunks * H * P * N, p, reads=4 / p, writes=4 / p,
                flops_per_element=2)
        _gemm(fb, n("ssd_y_off"), chunks * H, Q, N, P, p, weights=False)
        _gemm(fb, n("ssd_y_diag"), chunks * H, Q, Q, P, p, weights=False)
        # the gate by SiLU(z) inside the chunk scan's kernel, with the skip D·x (Megatron-Core 0.16
        # _ssm_training calls mamba_split_conv1d_scan_combined without rmsnorm_weight, so mamba_ssm
        # 2.2.4 passes z to _mamba_chunk_scan_combined_fwd): beyond an ungated scan, z read and the
        # gated output written beside the ungated one the backward keeps
        _vector(fb, n("ssd_gate"), T * d_t, p, reads=1, writes=1, flops_per_element=6, special_per_element=1,
                grad="gate")
        _vector(fb, n("mamba_norm"), T * d_t, p, flops_per_element=8)
        linear(fb, n("mamba_out"), T, d_t, h, gemm=tail)
        if t > 1 and tail:
            _tp_reduce(fb, n("mamba_out"), p * T * h, sp)
        if tail:
            _vector(fb, n("mamba_residual"), Tn * h, p, reads=2, flops_per_element=2)

    def gdn_mixer(fb: _Builder, n) -> None:
        """A Gated DeltaNet mixer (Megatron-Core 0.16 ssm/gated_delta_net.py, its training path
        through fla's chunk_gated_delta_rule), on a tp rank's heads: the input projection (q, k, v,
        the gate z, b and a; the norm fused in), the depthwise causal convolution and SiLU over q,
        k and v, the L2 norms of q and k, the decay g and the step beta, q and k repeated to the
        value heads, then the chunked delta rule by chunks of C tokens for each value head (Yang et
        al. 2024, Gated Delta Networks, its chunkwise form: β·K·Kᵀ, the WY factors A·(β·K) and
        A·(β·V), the state update through W·h and Kᵀ·(U − W·h), the output Q·h and within the
        chunk (Q·Kᵀ∘mask)·V'), the gated RMSNorm and the output projection. A is the inverse of
        the unit lower-triangular I + β·K·Kᵀ∘decay: forward substitution, Σ i² ≈ C³/3 multiply-adds
        a chunk and head (transformers' torch_chunk_gated_delta_rule loop; fla-core 0.6's
        chunk_gated_delta_rule_fwd_kkt_solve_kernel fuses it into the β·K·Kᵀ kernel, so its FLOPs
        and no traffic of its own)."""
        Hk, Hv = model.linear_key_heads // t, model.linear_value_heads // t
        dk, dv, C = model.linear_key_head_dim, model.linear_value_head_dim, model.linear_chunk
        qk_t, v_t = Hk * dk, Hv * dv
        chunks = b * -(-s // C)
        linear(fb, n("gdn_in"), T, h, model.gdn_in_width // t)
        _vector(fb, n("gdn_conv"), T * (2 * qk_t + v_t), p, flops_per_element=2 * model.linear_conv + 4,
                special_per_element=1)
        _vector(fb, n("gdn_l2norm"), T * 2 * qk_t, p, flops_per_element=4)
        _vector(fb, n("gdn_gates"), T * 2 * Hv, p, reads=1, writes=4 / p, flops_per_element=6,
                special_per_element=2)
        if Hv > Hk:   # repeat_interleave of q and k to the value heads
            _vector(fb, n("gdn_repeat"), T * 2 * Hv * dk, p, reads=Hk / Hv, flops_per_element=0)
        _gemm(fb, n("gdn_kkt"), chunks * Hv, C, dk, C, p, weights=False)
        _vector(fb, n("gdn_solve"), chunks * Hv * C * C, p, reads=0, writes=0, flops_per_element=2 * C / 3)
        for name, M, K, N in (("gdn_w", C, C, dk), ("gdn_u", C, C, dv), ("gdn_wh", C, dk, dv),
                              ("gdn_state", dk, C, dv), ("gdn_qh", C, dk, dv), ("gdn_qk", C, dk, C),
                              ("gdn_intra", C, C, dv)):
            _gemm(fb, n(name), chunks * Hv, M, K, N, p, weights=False)
        _vector(fb, n("gdn_gate_norm"), T * v_t, p, reads=2, flops_per_element=12, special_per_element=1)
        linear(fb, n("gdn_out"), T, v_t, h)

    def heads_prepared(fb: _Builder, n) -> None:
        """What runs between the projections and the attention: the per-head norms of the queries
        and keys (``qk_norm``), their rotary embedding (:data:`_ROTARY`; MLA rotates its queries'
        rope part and its one shared rope key), Llama 4's L2 norm after it (``qk_l2_norm``), the
        queries' position scale (``query_scale_share``) and, with ``kv_repeat`` copied, the key
        and value heads copied to one per query head (torchtitan's repeat_kv: expand, then
        reshape)."""
        if model.qk_norm:
            if model.qk_norm_width == "projection" and t > 1:
                # a norm over the whole projection, whose heads tp splits: each token's sums of
                # squares of q and of k (fp32) all-reduced, and in the backward each token's two
                # sums of the gradient times the normed input
                _coll(fb, n("qk.norm.all_reduce"), "all_reduce", "tp", 2 * 4 * T, backward="all_reduce")
            _vector(fb, n("q.norm"), T * a_t * d, p, flops_per_element=8)
            _vector(fb, n("k.norm"), T * kv_t, p, flops_per_element=8)
        if rot and model.rope_layer_share > 0:
            heads = {"q": a_t, "k": 1 if model.mla else kv_local}
            share = model.rope_layer_share      # the mean layer's: NoPE layers rotate nothing
            for x, count in heads.items():
                rotated = T * count * rw * share
                whole = rotated if model.mla else T * count * d * share
                if rot == "separate":
                    for tab, (rp, r4), (wp, w4) in _ROTARY_TABLES:
                        _vector(fb, n(f"{x}.rotary.{tab}"), s * rw * share, p, reads=rp + r4 * 4 / p,
                                writes=wp + w4 * 4 / p, flops_per_element=0 if tab.endswith("cast") else 1,
                                special_per_element=1 if tab in ("cos", "sin") else 0, grad="none")
                for name, (rp, r4), (wp, w4), f in _ROTARY[rot]:
                    e = whole if name in ("rotary", "rotary.pass_cat") else rotated
                    _vector(fb, n(f"{x}.{name}"), e, p, reads=rp + r4 * 4 / p, writes=wp + w4 * 4 / p,
                            flops_per_element=f * rotated / e, grad="rotary")
        if model.qk_l2_norm and model.rope_layer_share > 0:
            # Llama 4's weightless L2 norm of each rotated query and key head (x * rsqrt(mean(x²) + eps)):
            # a norm's kernel in the mean layer's share of rotary layers, as the rotation's
            share = model.rope_layer_share
            _vector(fb, n("q.l2_norm"), T * a_t * d * share, p, flops_per_element=4)
            _vector(fb, n("k.l2_norm"), T * kv_t * share, p, flops_per_element=4)
        if model.query_scale_share:
            # the queries times a factor of their position (Llama 4's NoPE layers' temperature, Mistral
            # 4's and Ministral 3's llama_4_scaling): a product kernel in that share of the layers
            _vector(fb, n("q.scale"), T * a_t * d * model.query_scale_share, p, grad="scale")
        if copied:
            for x, width in (("k", d), ("v", dv)):
                _vector(fb, n(f"{x}.repeat"), T * a_t * width, p, reads=kv_local / a_t, flops_per_element=0,
                        grad="repeat")

    def activation(fb: _Builder, name: str, elements: float) -> None:
        """The FFN's element-wise activation: a gated one (SwiGLU, GeGLU) reads its two inputs;
        GELU (tanh form, 8 FLOPs), GeGLU (GELU and the product, 9) and SwiGLU (SiLU and the
        product, 6) take one transcendental per element, ReLU none."""
        flops = {"swiglu": 6, "geglu": 9}.get(model.activation, 8)
        _vector(fb, name, elements, p, reads=2 if model.gated else 1, flops_per_element=flops,
                special_per_element=0 if model.activation == "relu" else 1)

    def dense_ffn(fb: _Builder, n, tail: bool = True) -> None:
        """The dense FFN; in a parallel block its output and the attention's, partial sums on each
        tp rank, are added first (``block_sum``: in the backward, the sum of the two branches'
        input gradients) and reduced once. A shared norm's gathered output is the FFN's input too."""
        if t > 1 and sp and model.parallel_block != "shared_norm":
            _coll(fb, n("ln2.all_gather"), "all_gather", "tp", p * ln2_write * T * h)
        linear(fb, n("ffn_up"), T, h, ffn_out)
        activation(fb, n(model.activation), T * f_t)
        linear(fb, n("ffn_down"), T, f_t, h, gemm=tail)
        if model.parallel_block and tail:
            _vector(fb, n("block_sum"), T * h, p, reads=2, flops_per_element=1)
        if t > 1 and tail:
            _tp_reduce(fb, n("ffn_down"), p * T * h, sp)

    def mla_projections(fb: _Builder, n) -> None:
        """Multi-head latent attention's projections (DeepSeek-V3): the down-projections to the
        query and key/value latents are replicated on the tp ranks (Megatron-Core's MLA), their
        norms, then the up-projections to this rank's heads."""
        r_q, r_kv, rope = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
        nope = d - rope
        if r_q:
            linear(fb, n("q_down"), T, h, r_q)
            _vector(fb, n("q_norm"), T * r_q, p, flops_per_element=4, writes=1 / p if "q_up" in norm_fed else 1.0)
            linear(fb, n("q_up"), T, r_q, a_t * d)
        else:
            linear(fb, n("q_up"), T, h, a_t * d)
        linear(fb, n("kv_down"), T, h, r_kv + rope)
        _vector(fb, n("kv_norm"), T * r_kv, p, flops_per_element=4, writes=1 / p if "kv_up" in norm_fed else 1.0)
        linear(fb, n("kv_up"), T, r_kv, a_t * (nope + model.v_head_dim))

    def moe_ffn(fb: _Builder, n, tail: bool = True) -> None:
        """A mixture of experts as Megatron-Core 0.16.1 runs it (``transformer/moe/``): each rank
        routes its T/tp tokens (router GEMM, top-k softmax). Its all-to-all dispatcher permutes
        the top_k copies by expert, sends them to the experts' ranks (all-to-all over ep), gathers
        them over etp, sorts them by local expert when a rank holds several
        (``sort_chunks_by_idxs``), runs its experts/ep local experts as one grouped GEMM (``load``
        x the mean tokens on the busiest rank), sorts them back, reduce-scatters over etp, sends
        the results back and un-permutes them (weighted sum). DeepEP's (``deepep``: the flex
        dispatcher's ``_DeepepManager``) sends each token once to each rank (or, across
        nodes, node) its experts are on, and permutes and un-permutes on the receiving rank.
        Shared experts are a tensor-parallel dense FFN beside it."""
        lay = moe or ExpertLayout()
        E, k = model.experts, model.top_k
        deepep = lay.deepep

        def dispatch(fb: _Builder, what: str) -> None:
            """The token all-to-all over ep: flat (one copy per expert, or with DeepEP per rank),
            or once per destination node over the network (group ``ep_node``; DeepEP forwards the
            tokens inside each node over NVLink while the network transfer runs, so only the
            network stage, the slower, is costed)."""
            if lay.nodes <= 1:
                copies = Tm * ranks if deepep else sent
                _coll(fb, n(f"{what}.all_to_all"), "all_to_all", "ep", p * lay.load * copies * h)
                return
            once = p * lay.load * Tm * h * lay.nodes_per_token(E, k, model.router_groups, model.router_group_topk)
            _coll(fb, n(f"{what}.internode"), "all_to_all", "ep_node", once)

        Tm = T // t                                    # tokens each rank routes
        local = max(1, E // lay.ep)
        sent = Tm * k                                  # token copies each rank dispatches
        recv = lay.load * lay.etp * sent               # tokens the busiest rank's experts see
        per_expert = max(1, math.ceil(recv / local))
        ef = model.expert_ffn // lay.etp
        gated = model.gated
        # DeepEP: the ranks a token's experts are on (one copy each), the tokens the busiest rank
        # receives (its permute's input, its un-permute's output)
        ranks = (replace(lay, nodes=lay.ep).nodes_per_token(E, k, model.router_groups, model.router_group_topk)
                 if deepep and lay.ep > 1 else float(k))
        held = lay.load * lay.etp * Tm * ranks
        linear(fb, n("router"), Tm, h, E)
        _vector(fb, n("router_topk"), Tm * E, p, flops_per_element=6, special_per_element=1)
        if not deepep:
            _vector(fb, n("permute"), sent * h, p, flops_per_element=0)
        if lay.ep > 1:
            dispatch(fb, "dispatch")
        if lay.etp > 1:
            _coll(fb, n("dispatch.all_gather"), "all_gather", "etp", p * (held if deepep else recv) * h)
        if deepep:
            _vector(fb, n("permute"), recv * h, p, reads=held / recv, flops_per_element=0)
        sort = not deepep and local > 1
        if sort:   # the received chunks (by source rank, then expert) sorted by local expert
            _vector(fb, n("sort_chunks"), recv * h, p, flops_per_element=0, grad="scale")
        grouped(fb, n("expert_up"), local, per_expert, h, ef * (2 if gated else 1))
        activation(fb, n("expert_" + model.activation), local * per_expert * ef)
        grouped(fb, n("expert_down"), local, per_expert, ef, h)
        if sort:
            _vector(fb, n("unsort_chunks"), recv * h, p, flops_per_element=0, grad="scale")
        # the combined expert outputs are read back (the gradient of the routing weights), their
        # weighted sum is not
        if deepep and tail:
            _vector(fb, n("unpermute"), recv * h, p, writes=held / recv, flops_per_element=2)
        if lay.etp > 1:
            _coll(fb, n("combine.reduce_scatter"), "reduce_scatter", "etp", p * (held if deepep else recv) * h)
        if lay.ep > 1:
            dispatch(fb, "combine")
        if not deepep and tail:
            _vector(fb, n("unpermute"), sent * h, p, writes=1.0 / k, flops_per_element=2)
        if model.shared_experts:
            sf = model.shared_experts * model.shared_ffn // t
            if t > 1:
                _coll(fb, n("shared.all_gather"), "all_gather", "tp", p * T * h)
            linear(fb, n("shared_up"), T, h, sf * (2 if gated else 1))
            activation(fb, n("shared_" + model.activation), T * sf)
            linear(fb, n("shared_down"), T, sf, h, gemm=tail)
            if t > 1 and tail:
                _coll(fb, n("shared.reduce_scatter"), "reduce_scatter", "tp", p * T * h)
            if model.shared_expert_gate and tail:   # sigmoid(x·w), one logit a token, times the output
                _vector(fb, n("shared_gate"), Tn * h, p, reads=2, flops_per_element=3, special_per_element=1 / h)
        if t > 1 and not sp and tail:   # the layer's output is replicated on the tp ranks again
            _coll(fb, n("moe.all_gather"), "all_gather", "tp", p * T * h)

    def _attention_core(fb: _Builder, n) -> None:
        if fused:
            flops = 2.0 * b * a_t * s * s * (d + dv)
            # fused: S = Q.K^T (query/key width d) and O = P.V (value width dv: MLA's differs) per
            # query tile, accumulating over the keys (K = s). Each key step streams a block of
            # keys and values (d + dv wide) against the resident query tile, so the tile model's
            # N is d + dv: one product that moves the keys and values, not the queries or the
            # probabilities (FlashAttention-2, Dao 2023, Algorithm 1; phaze.cost._gemm_geometry's
            # ``fused``). The online softmax takes one exp and ~5 FLOPs per score (a soft-cap, Gemma
            # 2's, one tanh and 2 more: FlashAttention 2.6's softcap). Under context parallelism
            # one kernel per ring step of local queries against one s x s block of keys (ring_steps)
            scores = b * a_t * s * s
            if cp > 1 and model.context_parallel_comm in ("all_gather", "a2a"):
                # no ring: Transformer Engine's all-gather runs the local queries against the
                # gathered keys (its two halves side by side on two streams: one op), and Ulysses
                # the whole sequence's queries and keys for a cp-th of the heads: cp blocks either way
                heads, rows = (a_t // cp, s * cp) if model.context_parallel_comm == "a2a" else (a_t, s)
                kv_read = (qkv_read - model.q_dim // t) * (cp if model.context_parallel_comm == "all_gather" else 1)
                fb.add(n(_ring_name(0)), "tensor+vector", flops=cp * flops, work_fraction=work,
                       gemm=(b * heads, rows, sk, d + dv), elements=cp * scores, special=(1 + cap) * cp * scores,
                       vector_flops=(5 + 2 * cap) * cp * scores, bytes_read=p * T * (a_t * d + kv_read),
                       bytes_written=p * T * a_t * dv, core_attention=True, operand_reuse=reuse,
                       value_width=dv)
                return
            steps, step_work = ring_steps(model, work)
            # a2a+p2p: each step a block a times as long for an a-th of the heads (ring_steps)
            g = model.context_parallel_a2a
            # the framework's fused kernel (Transformer Engine's ring attention) alternates its
            # forward steps between two CUDA streams, so that two steps' kernels share the SMs
            # (against each half block's wave quantisation); the flash-attn library's ring and
            # PyTorch's context parallel run them one after another
            side = 2 if attention == "flash" and model.context_parallel_comm in ("p2p", "a2a+p2p") and steps > 1 else 1
            for k in range(0, steps, side):
                ring = tuple(range(k, min(steps, k + side))) if steps > 1 else ()
                m = max(1, len(ring))
                fb.add(n(_ring_name(k)), "tensor+vector", flops=m * g * flops,
                       work_fraction=step_work, gemm=(m * b * a_t // g, s * g, s * g, d + dv), elements=m * g * scores,
                       special=(1 + cap) * m * g * scores, vector_flops=(5 + 2 * cap) * m * g * scores,
                       bytes_read=m * p * T * qkv_read,
                       bytes_written=m * p * T * a_t * dv, core_attention=True, operand_reuse=reuse, value_width=dv,
                       ring=ring)
            return
        _gemm(fb, n("scores"), b * a_t, s, d, sk, p, weights=False, core_attention=True)
        scores = b * a_t * s * sk
        if model.position_embedding == "alibi":
            # ALiBi's bias is the scores product's input: baddbmm with beta 1 copies the bias,
            # broadcast over the queries, into the output (a write a score) and the GEMM reads it
            # back (Hugging Face transformers 4.44 modeling_bloom: alibi.baddbmm(q, k, beta=1);
            # assumption: the BigScience Megatron-DeepSpeed fork that trained BLOOM, not on PyPI,
            # passes it to torch.baddbmm so too). The bias is a constant: no backward.
            _vector(fb, n("scores.alibi"), scores, p, core_attention=True, grad="none")
        if model.attention_softcap:
            # Gemma 2's soft-cap as NeMo 2.5.0 runs it in its unfused core attention (gemma2.py
            # logit_softcapping: scale * torch.tanh(scores / scale)): three kernels, each reading and
            # writing every score; tanh keeps its output for the backward
            _vector(fb, n("scores.softcap"), scores, p, reads=3, writes=3, flops_per_element=3,
                    special_per_element=1, core_attention=True, grad="softcap")
        if megatron_softmax_fused(model, b, t):
            _vector(fb, n("softmax"), scores, p, flops_per_element=5, core_attention=True,
                    special_per_element=1)
        else:
            # PyTorch's chain in fp32 (FusedScaleMaskSoftmax.forward_torch_softmax): upcast, scale
            # by the layer number, masked_fill_ (the [1, 1, s, s] mask, read once, not counted),
            # softmax, downcast; each op a kernel of its own (its backward: grad softmax)
            w = 4 / p   # (name, reads, writes in units of p, FLOPs an element)
            chain = [("softmax.scale", w, w, 1), ("softmax.mask", w, w, 0), ("softmax.fp32", w, w, 5)]
            if p < 4:   # 16-bit scores: upcast before, downcast after
                chain = [("softmax.float", 1, w, 0)] + chain + [("softmax.half", w, 1, 0)]
            for name, reads, writes, flops in chain:
                _vector(fb, n(name), scores, p, reads=reads, writes=writes, flops_per_element=flops,
                        core_attention=True, special_per_element=1 if name == "softmax.fp32" else 0,
                        grad="softmax")
        if model.dropout:
            _vector(fb, n("attn_dropout"), b * a_t * s * sk, p, writes=1.5, core_attention=True)
        _gemm(fb, n("context"), b * a_t, s, sk, dv, p, weights=False, core_attention=True)
        # [b * heads, s, dv] -> [s, b, heads * dv] for the output projection: permute().contiguous()
        _vector(fb, n("context.permute"), T * a_t * dv, p, flops_per_element=0, core_attention=True,
                grad="none")

    fb = _Builder("fwd")
    forward(fb)

    def op_recompute(fb: _Builder) -> None:
        """torchtitan's per-op selective checkpointing (``selective_ac_option = "op"``): the
        attention kernel's output and every odd-numbered matmul of the block (in call order q, k,
        v, o, then gate, up, down or up, down) are saved; the even-numbered ones (k, o, and up
        for SwiGLU or down otherwise) and every element-wise op are re-run, as are the sequence-
        parallel gathers their inputs need (reduce-scatter outputs are saved)."""
        n = lambda x: "recompute." + x  # noqa: E731
        _vector(fb, n("ln1"), Tn * h, p, writes=ln1_write, flops_per_element=8)
        if t > 1 and sp:
            _coll(fb, n("ln1.all_gather"), "all_gather", "tp", p * ln1_write * T * h)
        linear(fb, n("qkv"), T, h, kv_t)
        heads_prepared(fb, n)
        linear(fb, n("attn_out"), T, model.o_dim // t, h)
        residual_add(fb, n, "attn")
        _vector(fb, n("ln2"), Tn * h, p, writes=ln2_write, flops_per_element=8)
        if t > 1 and sp:
            _coll(fb, n("ln2.all_gather"), "all_gather", "tp", p * ln2_write * T * h)
        if model.gated:
            linear(fb, n("ffn_up"), T, h, f_t)
            activation(fb, n(model.activation), T * f_t)
        else:
            activation(fb, n(model.activation), T * f_t)
            linear(fb, n("ffn_down"), T, f_t, h)
        residual_add(fb, n, "ffn")

    def module_rerun(bb: _Builder, mods) -> None:
        """Megatron-Core's selective recompute (``--recompute-modules``): the forward ops of each
        module in ``mods`` re-run in the backward pass. ``core_attn`` the core attention, fused
        kernel or not (its checkpoint re-runs it whatever the kernel); ``layernorm`` the norms that
        are modules of their own in its Transformer Engine layer spec (an MLA layer's input norm, an
        MoE layer's pre-MLP norm; gpt_layer_specs.py); ``mla_up_proj`` MLA's up projections, the
        latents' norms fused into them; ``mlp`` a dense layer's FFN with the norm fused into its
        first linear; ``moe`` the whole MoE layer, its all-to-alls included; ``moe_act`` the
        experts' activation; ``shared_experts`` the shared experts' FFN."""
        probe = _Builder("fwd")
        (moe_ffn if model.moe else dense_ffn)(probe, lambda x: x)
        ffn = {o.name for o in probe.ops}
        wanted = set()
        if "layernorm" in mods:
            wanted |= ({"ln1"} if model.mla else set()) | ({"ln2"} if model.moe else set())
        if "mla_up_proj" in mods and model.mla:   # its checkpoint applies the rotary embedding too,
            probe = _Builder("fwd")                 # and the latents' norms fused into the up projections
            heads_prepared(probe, lambda x: x)
            wanted |= {"q_norm", "q_up", "kv_norm", "kv_up"} | {o.name for o in probe.ops}
        if "mlp" in mods and not model.moe:
            wanted |= ffn | {"ln2"}
        if "moe" in mods and model.moe:
            wanted |= ffn
        if "moe_act" in mods and model.moe:
            wanted.add("expert_" + model.activation)
        if "shared_experts" in mods and model.moe:
            wanted |= {x for x in ffn if x.startswith("shared")}
        rerun = _Builder("bwd")
        forward(rerun, "recompute.")
        for op in rerun.ops:
            base = op.name.removeprefix("recompute.").removesuffix(".fp8_cast").removesuffix(".bias")
            if base in wanted or ("core_attn" in mods and op.core_attention):
                bb.ops.append(replace(op, deps=bb.last))
                bb.last = (op.name,)

    bb = _Builder("bwd")
    # a fused attention's backward runs five products per tile: S = Q.K^T again, dV = P^T.dO and
    # dP = dO.V^T (value width), dQ = dS.K and dK = dS^T.Q (query/key width): 2.5 forwards when
    # the widths agree
    bwd_passes = (3 * d + 2 * dv) / (d + dv)
    if is_full(recompute):
        # a post-norm layer's last norm reads the residual sum, so nothing of its forward is dead
        # (nor a sandwich's: its norm after the FFN reads the down projection's output)
        forward(bb, "recompute.", tail=not reruns_needed(model, compiled) or model.norm_position != "pre"
                or model.sandwich_norm,
                qkv=offloaded_of(recompute) != "qkv_proj")
    elif recompute == "op":
        op_recompute(bb)
    elif recompute == "selective" and not fused and kind in ("", "*"):   # a layer with attention
        _attention_core(bb, lambda x: "recompute." + x)
    elif recompute_modules_of(recompute):
        module_rerun(bb, recompute_modules_of(recompute))
    grad = bb.last

    column = ""   # the column-parallel linear whose backward was built last (its input was gathered)
    for op in reversed(fb.ops):
        if op.name == "ssd_gate":
            # mamba_ssm's split-conv1d-scan backward first re-runs, from the saved z, x, B, C and dt,
            # the convolution, dt's cumulative decay, C·Bᵀ, the chunk states and their passing
            # (mamba_ssm 2.2.4 ssd_combined.py: MambaSplitConv1dScanCombinedFn.backward and
            # _mamba_chunk_scan_combined_bwd), whatever the layer's recompute
            for fo in fb.ops:
                if fo.name in SSD_BACKWARD_RERUNS:
                    bb.ops.append(replace(fo, name=f"{fo.name}.rerun", phase="bwd", deps=grad))
                    grad = bb.last = (f"{fo.name}.rerun",)
        # a bias add passes its gradient through (its reduction comes with the linear's backward);
        # a permute's gradient is a strided view the batched GEMMs read as it is; ALiBi's bias is
        # a constant
        if op.grad == "none":
            continue
        gathered_for, column = column, ""
        if op.unit == "link":
            c = op.collective
            mirror = {"all_reduce": None, "reduce_scatter": "all_gather", "all_gather": "reduce_scatter",
                      "all_to_all": "all_to_all"}
            if c.backward or mirror[c.kind]:
                # the input gradient's reduce-scatter runs under that linear's weight-gradient GEMM
                under = f"{gathered_for}.wgrad" if c.kind == "all_gather" and c.group == "tp" and gathered_for else ""
                nbytes = p * c.bytes if op.name in gathered8 else c.bytes   # its gradient is 16-bit
                row = op.name.split(".")[0]
                if row in rowwise8:   # TE casts the output gradient, then gathers it in fp8
                    grad = (_vector(bb, f"{row}.grad_fp8_cast", Tn * h, p, reads=1, writes=1 / p,
                                    flops_per_element=2, deps=grad),)
                    nbytes = c.bytes / p
                grad = (_coll(bb, f"{op.name}.bwd", c.backward or mirror[c.kind], c.group, nbytes, deps=grad,
                              hidden_by=under),)
            continue
        if op.grad == "softmax":
            # autograd's: each gradient in its input's precision from its output's, the softmax's
            # also reading its saved fp32 output
            saved = op.bytes_written if op.name == "softmax.fp32" else 0.0
            grad = (bb.add(f"{op.name}.bwd", "vector", grad, flops=op.flops, elements=op.elements,
                           bytes_read=op.bytes_written + saved, bytes_written=op.bytes_read,
                           special=op.special, core_attention=True),)
            continue
        if op.grad in ("rotary", "scale", "repeat"):
            # one kernel like the forward's: the inverse rotation by the same kernels (the tables
            # are not differentiated: none), which reads and writes as the forward did; a product
            # with a constant, the gradient times it; the copies' gradients summed back over each
            # group of query heads (a FLOP an element); the last two read what the forward wrote
            # and write what it read
            swap = op.grad != "rotary"
            grad = (bb.add(f"{op.name}.bwd", "vector", grad, elements=op.elements,
                           flops=op.elements if op.grad == "repeat" else op.flops,
                           bytes_read=op.bytes_written if swap else op.bytes_read,
                           bytes_written=op.bytes_read if swap else op.bytes_written),)
            continue
        if op.grad == "softcap":
            # autograd's three kernels: the product's and the division's scale the gradient, tanh's
            # reads its saved output too (1 - tanh²)
            grad = (_vector(bb, "scores.softcap.bwd", op.elements, p, reads=4, writes=3, flops_per_element=4,
                            deps=grad, core_attention=True),)
            continue
        if op.grad == "gate":
            # mamba_ssm's _chunk_scan_bwd_dz: reads the output's gradient, the saved ungated output
            # and z, writes z's gradient and the ungated output's, which the scan's backward reads
            grad = (_vector(bb, "ssd_gate.bwd", op.elements, p, reads=3, writes=2,
                            flops_per_element=op.flops / op.elements, deps=grad,
                            special_per_element=op.special / op.elements),)
            continue
        if op.unit == "vector":
            grad = (_vector(bb, f"{op.name}.bwd", op.elements, p, reads=2 * op.bytes_read / (p * op.elements),
                            flops_per_element=op.flops / op.elements, deps=grad,
                            special_per_element=op.special / op.elements,
                            core_attention=op.core_attention),)
            continue
        if op.unit == "tensor+vector":     # fused attention backward: recomputes the scores
            # recomputes P = exp(S - L) (one exp per score) and dS = P * (dP - D); Transformer
            # Engine's ring runs the backward steps one after another on one stream
            m = max(1, len(op.ring))
            bt, M, K, N = op.gemm
            for j in op.ring[::-1] if op.ring else (None,):
                name = op.name if j is None else _ring_name(j)
                grad = (bb.add(f"{name}.bwd", "tensor+vector", grad, flops=bwd_passes * op.flops / m,
                               work_fraction=op.work_fraction, gemm=(bt // m, M, K, N),
                               elements=op.elements / m, special=(1 + cap) * op.elements / m,
                               vector_flops=(8 + 3 * cap) * op.elements / m, operand_reuse=op.operand_reuse,
                               value_width=op.value_width,
                               bytes_read=(op.bytes_read + 2 * op.bytes_written) / m,
                               bytes_written=op.bytes_read / m, core_attention=True,
                               ring=() if j is None else (j,)),)
            continue
        batch, M, K, N = op.gemm
        weighted = op.name.split(".")[-1] in _LINEAR
        if weighted:
            input_gathered = t > 1 and sp and op.name in _COLUMN_PARALLEL
            wdeps = grad
            if op.name in rowwise8:   # the gathered fp8 gradient and the saved fp8 input, transposed
                wdeps = tuple(_vector(bb, f"{op.name}.{what}", x, p, reads=1 / p, writes=1 / p,
                                      flops_per_element=0, deps=grad)
                              for what, x in (("grad_fp8_transpose", M * N), ("fp8_transpose", M * K)))
            elif fp8:   # the output gradient is cast to fp8 (both layouts) before dgrad and wgrad
                grad = wdeps = (_vector(bb, f"{op.name}.grad_fp8_cast", batch * M * N, p, reads=1, writes=2 / p,
                                        flops_per_element=2, deps=grad),)
            if op.name.split(".")[-1] in biased:   # the bias gradient: the output gradient summed over tokens
                rows = Tn * h if op.name in _ROW_PARALLEL else batch * M * N   # added after the tp reduction
                _vector(bb, f"{op.name}.bias_grad", rows, p, writes=0, flops_per_element=1, deps=grad)
            dgrad = _gemm(bb, f"{op.name}.dgrad", batch, M, N, K, p, weights=True, deps=grad)
            gather = (1 if op.name in norm_fed else p) * T * h   # the norm's output: fp8 when it wrote fp8
            if input_gathered:   # Megatron-SP re-gathers the sharded input for the weight gradient
                wdeps = wdeps + (_coll(bb, f"{op.name}.input_all_gather", "all_gather", "tp",
                                       gather, deps=grad, hidden_by=f"{op.name}.dgrad"),)
            if op.name in norm_fed:   # the norm wrote fp8 row-wise only: transpose it now
                wdeps = (_vector(bb, f"{op.name}.fp8_transpose", M * K, p, reads=1 / p, writes=1 / p,
                                 flops_per_element=0, deps=wdeps),)
            _gemm(bb, f"{op.name}.wgrad", batch, K, M, N, p, weights=False, deps=wdeps, linear=True)
            grad = (dgrad,)
            column = op.name if op.name in _COLUMN_PARALLEL else ""
            if t > 1 and not sp and op.name in ("qkv", "ffn_up", "mamba_in", "gdn_in"):
                grad = (_coll(bb, f"{op.name}.dgrad.all_reduce", "all_reduce", "tp", p * T * h,
                              deps=grad, hidden_by=f"{op.name}.wgrad"),)
        else:                    # attention batched GEMMs: both operands are activations
            g1 = _gemm(bb, f"{op.name}.dgrad_a", batch, M, N, K, p, weights=False, deps=grad,
                       core_attention=op.core_attention)
            g2 = _gemm(bb, f"{op.name}.dgrad_b", batch, K, M, N, p, weights=False, deps=grad,
                       core_attention=op.core_attention)
            grad = (g1, g2)
            if op.name == "scores":
                # baddbmm's derivative scales both gradients by its alpha (1/sqrt(d)) in kernels of
                # their own; the q, k, v split from the projection's output is undone by a concat
                grad = tuple(_vector(bb, f"{g}.scale", x, p, flops_per_element=1, deps=(g,), core_attention=True)
                             for g, x in ((g1, batch * M * K), (g2, batch * K * N)))
                grad = (_vector(bb, "qkv.split.bwd", T * qkv_n, p, flops_per_element=0,
                                deps=grad + ("context.dgrad_b",)),)
    return LayerGraph(fwd=tuple(fb.ops), bwd=tuple(bb.ops))


@lru_cache(maxsize=1024)
def edge_graph(model: Model, mbs: int, tp: int = 1, sp: bool = False,
               loss: str = "torch") -> dict[str, tuple[Op, ...]]:
    """Work outside the repeated layers, per micro-batch: ``embedding`` (first stage, forward and
    backward) and ``head`` (final norm, logits GEMM, loss; last stage). ``loss``: the cross
    entropy's kernels (:class:`phaze.plan.Plan`)."""
    h, s, b, t = model.hidden, model.seq_len, mbs, tp
    p = model.bytes_per_element
    T = b * s
    Tn = T // t if sp else T
    V = model.vocab
    Vt = -(-V // t)
    e = model.embedding_projection_dim or h

    emb = _Builder("fwd")
    _vector(emb, "embedding.lookup", T * e, p, flops_per_element=1)
    if e != h:
        _gemm(emb, "embedding.project_in", 1, T, e, h, p, weights=True)
    if t > 1:
        _tp_reduce(emb, "embedding", p * T * h, sp)
    if model.embedding_scale:   # Gemma's times sqrt(h), Granite's embedding_multiplier: a kernel of its own
        _vector(emb, "embedding.scale", Tn * h, p)
    if model.embedding_norm:
        _vector(emb, "embedding.norm", Tn * h, p, flops_per_element=8)
    fwd_emb = list(emb.ops)
    emb_b = _Builder("bwd")
    if model.embedding_norm:
        _vector(emb_b, "embedding.norm.bwd", Tn * h, p, reads=2, flops_per_element=8)
    if model.embedding_scale:
        _vector(emb_b, "embedding.scale.bwd", Tn * h, p)
    if t > 1 and sp:
        _coll(emb_b, "embedding.all_gather.bwd", "all_gather", "tp", p * T * h)
    if e != h:
        _gemm(emb_b, "embedding.project_in.wgrad", 1, e, T, h, p, weights=False, linear=True)
    _vector(emb_b, "embedding.grad_accumulate", T * e, p, reads=2, flops_per_element=1)

    head = _Builder("fwd")
    head_b = _Builder("bwd")
    if model.norm_position == "pre":
        _vector(head, "final_norm", Tn * h, p, flops_per_element=8)
    if model.head_scale:   # MiniCPM3's hidden_states / logits_scaling before its head: a kernel of its own
        _vector(head, "head.scale", Tn * h, p)
    if t > 1 and sp:
        _coll(head, "head.all_gather", "all_gather", "tp", p * T * h)
    if model.architecture == "encoder":
        _gemm(head, "mlm_transform", 1, T, h, h, p, weights=True)
        _vector(head, "mlm_norm", T * h, p, flops_per_element=10)
    if e != h:
        _gemm(head, "head.project_out", 1, T, h, e, p, weights=True)
    _logits_and_loss(head, head_b, "", T, e, Vt, p, t, loss, model.logit_softcap, model.logit_scale)
    if e != h:
        _gemm(head_b, "head.project_out.dgrad", 1, T, e, h, p, weights=True)
        _gemm(head_b, "head.project_out.wgrad", 1, h, T, e, p, weights=False, deps=("logits.dgrad",),
              linear=True)
        head_b.last = ("head.project_out.dgrad",)
    if model.architecture == "encoder":
        _vector(head_b, "mlm_norm.bwd", T * h, p, reads=2, flops_per_element=10)
        _gemm(head_b, "mlm_transform.dgrad", 1, T, h, h, p, weights=True)
        _gemm(head_b, "mlm_transform.wgrad", 1, h, T, h, p, weights=False, deps=("mlm_norm.bwd",),
              linear=True)
        head_b.last = ("mlm_transform.dgrad",)
    if t > 1:
        _tp_reduce(head_b, "head.dgrad", p * T * h, sp)
    if model.head_scale:
        _vector(head_b, "head.scale.bwd", Tn * h, p)
    if model.norm_position == "pre":
        _vector(head_b, "final_norm.bwd", Tn * h, p, reads=2, flops_per_element=8)
    for k in range(model.mtp_layers):
        _mtp_module(head, head_b, f"mtp{k}.", T, Tn, h, e, Vt, p, t, sp, loss)
    return {"embedding": tuple(fwd_emb) + tuple(emb_b.ops), "head": tuple(head.ops) + tuple(head_b.ops)}


def _logits_and_loss(fwd: _Builder, bwd: _Builder, prefix: str, T, e, Vt, p, t, loss: str,
                     softcap: float = 0.0, scale: bool = False) -> None:
    """The output head's logits GEMM and cross entropy on one of ``t`` ranks (its vocabulary
    slice ``Vt``), forward into ``fwd`` and backward into ``bwd``; ops named ``prefix`` + ....
    ``softcap``: the logits soft-capped first (Gemma 2: NeMo 2.5.0's Gemma2OutputLayer runs
    ``scale * torch.tanh(logits / scale)``, three kernels each way, tanh's output kept).
    ``scale``: the logits times a constant first, a kernel of its own each way (Cohere's
    ``logits * logit_scale``, Granite's ``logits / logits_scaling``)."""
    _gemm(fwd, prefix + "logits", 1, T, e, Vt, p, weights=True)
    if scale:
        _vector(fwd, prefix + "logits.scale", T * Vt, p)
    if softcap:
        _vector(fwd, prefix + "logits.softcap", T * Vt, p, reads=3, writes=3, flops_per_element=3,
                special_per_element=1)
    # loss in fp32 as frameworks compute it: upcast the logits, log-softmax, gather (fwd);
    # softmax minus one-hot, downcast (bwd); bytes per logit, forward (read, written) and backward.
    # - torch: upcast (p + 4), log-softmax (4 + 4); backward softmax minus one-hot, multiply in
    #   place and downcast (read 8, write 4 + p).
    # - megatron: Megatron-LM's _VocabParallelCrossEntropy (mpu/cross_entropy.py, 2021-22; the GPT
    #   model calls it on output.float()), Megatron-Core's unfused one the same passes, each its
    #   own pass over the fp32 logits: upcast (read p, write 4), max (read 4), subtract in place
    #   (4 + 4), exp in place (4 + 4), sum (4), divide in place for the saved softmax (4 + 4); its
    #   backward is torch's.
    # - fused: Megatron-Core's fused_vocab_parallel_cross_entropy (megatron-core 0.16.1
    #   fusions/fused_cross_entropy.py), the same steps in three functions compiled by jit_fuser
    #   (torch.compile from PyTorch 2.2), each a pass: the upcast logits returned with their max
    #   (read p, write 4), the subtraction, exp and sum written back in place (4 + 4), the division
    #   in place for the saved softmax (4 + 4); backward one pass that writes the mutated softmax
    #   back and returns the 16-bit gradient (read 4, write 4 + p).
    # - te: Transformer Engine's parallel_cross_entropy (TE 2.8 pytorch/triton/cross_entropy.py):
    #   an online-softmax kernel reads the 16-bit logits for each row's max and sum, a second reads
    #   them again and writes the gradient over them in place (2p read, p written: nothing in
    #   fp32); its backward multiplies that gradient by the per-token loss gradient in place (p + p).
    reads, writes, bwd_reads, bwd_writes = {
        "megatron": (p + 20, 16, 8, 4 + p), "fused": (p + 8, 12, 4, 4 + p),
        "te": (2 * p, p, p, p)}.get(loss, (p + 4 + 4, 4 + 4, 8, 4 + p))
    _vector(fwd, prefix + "cross_entropy", T * Vt, p, reads=reads / p, writes=writes / p,
            flops_per_element=6, special_per_element=2 if loss == "te" else 1)
    if t > 1 and loss == "te":   # each rank's max, sum and target logit (fp32) gathered from all
        _coll(fwd, prefix + "cross_entropy.all_gather", "all_gather", "tp", 3 * 4 * T * t)
    elif t > 1:                  # the max, then the target logit and the sum, reduced
        _coll(fwd, prefix + "cross_entropy.all_reduce", "all_reduce", "tp", 3 * 4 * T)
    _vector(bwd, prefix + "cross_entropy.bwd", T * Vt, p, reads=bwd_reads / p, writes=bwd_writes / p,
            flops_per_element=2)
    grad = prefix + "cross_entropy.bwd"
    if softcap:
        grad = _vector(bwd, prefix + "logits.softcap.bwd", T * Vt, p, reads=4, writes=3, flops_per_element=4)
    if scale:
        grad = _vector(bwd, prefix + "logits.scale.bwd", T * Vt, p)
    _gemm(bwd, prefix + "logits.dgrad", 1, T, Vt, e, p, weights=True)
    _gemm(bwd, prefix + "logits.wgrad", 1, e, T, Vt, p, weights=False, deps=(grad,),
          linear=True)
    bwd.last = (prefix + "logits.dgrad",)


def _mtp_module(fwd: _Builder, bwd: _Builder, prefix: str, T, Tn, h, e, Vt, p, t, sp, loss: str) -> None:
    """One multi-token prediction module outside its transformer layer (which the last stage
    runs as one more layer), as Megatron-Core 0.16 runs it (transformer/multi_token_prediction.py,
    ``MultiTokenPredictionLayer``; models/gpt/gpt_model.py): the shared embedding of the tokens
    one further on (the same vocab-parallel lookup and reduction as the first stage's), ``enorm``
    and ``hnorm``, their concatenation, ``eh_proj`` (a column-parallel 2h -> h GEMM, its input
    gathered over the sequence under sp, its output gathered over tp, then split again), after the
    layer ``final_layernorm``, and the shared head's logits and loss on its own copy of the
    micro-batch (``mtp_loss_scaling_factor`` only scales its gradient)."""
    assert e == h, "multi-token prediction with a factorised embedding is refused where the model is read"
    _vector(fwd, prefix + "embedding.lookup", T * h, p, flops_per_element=1)
    if t > 1:
        _tp_reduce(fwd, prefix + "embedding", p * T * h, sp)
    _vector(fwd, prefix + "enorm", Tn * h, p, flops_per_element=8)
    _vector(fwd, prefix + "hnorm", Tn * h, p, flops_per_element=8)
    _vector(fwd, prefix + "concat", Tn * 2 * h, p, flops_per_element=0)
    if t > 1 and sp:
        _coll(fwd, prefix + "eh_proj.all_gather", "all_gather", "tp", p * T * 2 * h)
    _gemm(fwd, prefix + "eh_proj", 1, T, 2 * h, h // t, p, weights=True)
    if t > 1:   # gather_from_tensor_model_parallel_region: the output's columns from every rank
        _coll(fwd, prefix + "eh_proj.gather", "all_gather", "tp", p * T * h)
    # ... the transformer layer (a layer of the last stage) ...
    _vector(fwd, prefix + "final_norm", Tn * h, p, flops_per_element=8)
    if t > 1 and sp:
        _coll(fwd, prefix + "head.all_gather", "all_gather", "tp", p * T * h)
    _logits_and_loss(fwd, bwd, prefix, T, e, Vt, p, t, loss)
    if t > 1:
        _tp_reduce(bwd, prefix + "head.dgrad", p * T * h, sp)
    _vector(bwd, prefix + "final_norm.bwd", Tn * h, p, reads=2, flops_per_element=8)
    # ... the transformer layer's backward ...
    if t > 1 and sp:   # the split's backward gathers the sequence; the gather's backward splits
        _coll(bwd, prefix + "eh_proj.scatter.bwd", "all_gather", "tp", p * T * h)
    grad = bwd.last
    _gemm(bwd, prefix + "eh_proj.dgrad", 1, T, h // t, 2 * h, p, weights=True)
    _gemm(bwd, prefix + "eh_proj.wgrad", 1, h // t, T, 2 * h, p, weights=False, deps=grad, linear=True)
    bwd.last = (prefix + "eh_proj.dgrad",)
    if t > 1:
        _tp_reduce(bwd, prefix + "eh_proj.dgrad", p * T * 2 * h, sp)
    _vector(bwd, prefix + "split.bwd", Tn * 2 * h, p, flops_per_element=0)
    _vector(bwd, prefix + "enorm.bwd", Tn * h, p, reads=2, flops_per_element=8)
    _vector(bwd, prefix + "hnorm.bwd", Tn * h, p, reads=2, flops_per_element=8)
    if t > 1 and sp:
        _coll(bwd, prefix + "embedding.all_gather.bwd", "all_gather", "tp", p * T * h)
    _vector(bwd, prefix + "embedding.grad_accumulate", T * h, p, reads=2, flops_per_element=1)


def optimizer_op(params_on_device: float, optimizer: str = "adam", precision: str = "bf16",
                 grad_bytes: float = 4.0, zero: int = 0) -> Op:
    """The element-wise optimizer update over the parameters a device updates.

    ``adam``, one fused kernel with fp32 master weights, reads master, m, v (4 bytes each) and the
    16-bit gradient and writes master, m, v and the 16-bit weight: 14 + 14 bytes per parameter.
    ``adam-megatron`` is Megatron's mixed-precision optimizer around apex's FusedAdam, one pass
    each (megatron/optimizer/optimizer.py, clip_grads.py): the gradients' norm for clipping
    (read 4), Adam on the fp32 main gradient (read 16, write 12), the fp32 weights copied to the
    16-bit model (read 4, write 2); bf16 runs accumulate the main gradients in fp32 (Megatron
    forces it), fp16 runs first copy the 16-bit ones to fp32 (read 2, write 4) and unscale them
    with an inf check (read 4, write 4): 38 bytes per parameter in bf16, 52 in fp16. A bf16 run
    whose main gradients are 16-bit (``grad_bytes`` 2: Megatron-Core's ``--grad-reduce-in-bf16``,
    NeMo's ``grad_reduce_in_fp32`` False) copies them to fp32 first as fp16 does (megatron-core
    0.16.1 distrib_optimizer.py ``_copy_model_grads_to_main_grads``: ``.float()``, read 2, write
    4): 44 bytes. A norm above the clip threshold would add one more scaling pass; it is not
    counted.
    ``adam-megatron-pa``: Megatron-Core's precision-aware optimizer (``--use-precision-aware-optimizer``,
    megatron-core 0.16.1 optimizer/distrib_optimizer.py) hands its shard to Transformer Engine's
    FusedAdam, which reads the gradient buffer as it is (``decoupled_grad``: ``grad_bytes``, 4 in
    fp32, 2 in bf16) and keeps the fp32 master weights as the 16-bit remainders of the bf16 ones
    (``store_param_remainders``, on by default from TE 2.1; TE 2.4 optimizers/fused_adam.py
    ``multi_tensor_adam_param_remainder``): the norm (read g), then one kernel that reads the
    gradient, the bf16 weight, the remainder and m, v (g + 2 + 2 + 4 + 4) and writes all but the
    gradient (12), the 16-bit weight included, so no copy follows: 2g + 12 read, 12 written.
    ``adam-megatron-pa-bf16`` also holds m and v in bf16 (``--exp-avg-dtype`` and
    ``--exp-avg-sq-dtype bf16``, NeMo's DeepSeek-V3 recipe): the same kernel on fp32 copies of
    them, made and written back tensor by tensor (:func:`bf16_moment_passes`).
    ``adam-deepspeed``: the flat passes of DeepSpeed's mixed-precision wrappers around its
    FusedAdam (DeepSpeed 0.9.5 runtime/fp16/fused_optimizer.py, runtime/bf16_optimizer.py); their
    per-tensor passes are :func:`deepspeed_tensor_passes`. fp16 (FP16_Optimizer): the 32-bit
    gradients flattened (read 4, write 4), their norm (read 4), unscaled (read 4, write 4), Adam
    (read 16, write 12): 28 + 20 bytes; bf16 (BF16_Optimizer): Adam, the fp32 weights copied to
    the bf16 ones (read 4, write 2), the fp32 gradients zeroed (write 4): 20 + 18; its ZeRO
    optimizer (``zero`` 2, or 1 in fp16; runtime/zero/stage_1_and_2.py ``step``), on the rank's
    partition: the 16-bit gradients flattened (read 2, write 2) and cast to fp32 (read 2, write
    4), in fp16 unscaled (read 4, write 4), Adam (read 16, write 12), the fp32 partition copied to
    the 16-bit one (read 4, write 2): 28 + 24 in fp16, 24 + 20 in bf16; its ZeRO-3 optimizer
    (``zero`` 3, runtime/zero/stage3.py ``step``), in either precision: the flat 16-bit gradient
    partition checked for inf and nan (``has_overflow``: read 2 twice), the partition's gradients
    flattened (read 2, write 2) and cast to fp32 (read 2, write 4), unscaled (read 4, write 4),
    Adam (read 16, write 12), the fp32 partition copied to the 16-bit one (read 4, write 2):
    32 + 24. SGD
    (momentum-free, as in the original Phaze) reads weight and gradient and writes the weight:
    4 + 2.
    """
    if optimizer == "adam-deepspeed":
        read, write, flops = (28.0, 20.0, 16.0) if precision == "fp16" else (20.0, 18.0, 12.0)
        if runs_deepspeed_zero(optimizer, precision, zero):   # its ZeRO optimizer
            read, write = (28.0, 24.0) if precision == "fp16" else (24.0, 20.0)
        elif zero >= 3:   # its ZeRO-3 optimizer: the check, the casts and the unscale in bf16 too
            read, write, flops = 32.0, 24.0, 16.0
    elif optimizer in ("adam-megatron-pa", "adam-megatron-pa-bf16"):
        read, write, flops = 2.0 * grad_bytes + 12.0, 12.0, 14.0
    elif optimizer == "adam-megatron":
        if precision == "fp16":   # copy to fp32 main gradients, then unscale with an inf check
            read, write, flops = 30.0, 22.0, 15.0
        else:
            read, write, flops = 24.0, 14.0, 14.0
            if grad_bytes < 4:   # 16-bit main gradients, copied to fp32 for the norm and Adam
                read, write = read + grad_bytes, write + 4.0
    else:
        read, write, flops = (14.0, 14.0, 12.0) if optimizer == "adam" else (4.0, 2.0, 2.0)
    n = float(params_on_device)
    return Op(name=f"optimizer.{optimizer}", unit="vector", phase="opt", flops=flops * n,
              elements=n, bytes_read=read * n, bytes_written=write * n)


@dataclass(frozen=True)
class TensorPasses:
    """Kernels an eager optimizer runs once per parameter tensor, and their bytes per parameter.
    ``synced``: each tensor's kernels end in a copy of a scalar to the host, which waits for it
    (``.item()``), so nothing overlaps them."""

    launches: int = 0
    read: float = 0.0
    write: float = 0.0
    synced: bool = False


def bf16_moment_passes() -> TensorPasses:
    """Transformer Engine's FusedAdam with bf16 moments (``optimizer=adam-megatron-pa-bf16``), per
    parameter tensor of the shard (TE 2.4 optimizers/fused_adam.py): before its kernel each moment
    is copied to fp32 (``get_unscaled_state``: ``.float()``, read 2, write 4), after it written
    back (``_apply_scale``: ``copy_(unscaled.bfloat16())``, a cast, read 4, write 2, and the copy,
    read 2, write 2). Six kernels, 16 bytes read and 16 written; the fp32 copies of every tensor
    are held until the write-back (:func:`phaze.memory.optimizer_step_bytes_per_param`)."""
    return TensorPasses(6, 16.0, 16.0)


def deepspeed_tensor_passes(precision: str) -> tuple[TensorPasses, TensorPasses, TensorPasses]:
    """DeepSpeed's per-tensor work under ``optimizer=adam-deepspeed`` (DeepSpeed 0.9.5), as
    (each micro-batch's gradient accumulation, the step's synchronised check, the step's other
    per-tensor copies), bytes per parameter.

    fp16 (FP16_Optimizer; its ZeRO optimizer is :func:`deepspeed_zero_passes`): from the
    second micro-batch on, autograd adds each 16-bit gradient into ``.grad`` (one kernel: read 4,
    write 2; the first micro-batch's gradient is kept as it is); the step checks every gradient
    for overflow, ``float(x.float().sum())`` (runtime/utils.py, CheckOverflow._has_inf_or_nan: a
    copy to fp32, a sum, the host waits for the scalar), then copies each to fp32 before
    flattening (``p.grad.to(fp32)``: read 2, write 4) and each updated weight back
    (``p.data.copy_``: read 4, write 2). bf16 (BF16_Optimizer): after every micro-batch's
    backward each gradient is converted and added to its fp32 copy (update_hp_grads: ``.to``
    read 2 write 4, ``add_`` read 8 write 4); the step takes each fp32 gradient's norm with
    ``.item()`` (get_global_norm_of_tensors: read 4, synchronised)."""
    if precision == "fp16":
        return (TensorPasses(1, 4.0, 2.0), TensorPasses(2, 6.0, 4.0, synced=True),
                TensorPasses(2, 6.0, 6.0))
    return TensorPasses(2, 10.0, 8.0), TensorPasses(1, 4.0, 0.0, synced=True), TensorPasses()


# DeepSpeed's engine all-reduces a bucket of gradients once it holds more than this many elements
# (DeepSpeed 0.9.5 runtime/engine.py MEMORY_OPT_ALLREDUCE_SIZE, allreduce_no_retain); its ZeRO
# optimizer's bucket buffer has as many (runtime/zero/config.py reduce_bucket_size, 5e8)
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000


def runs_deepspeed_zero(optimizer: str, precision: str, zero: int) -> bool:
    """Whether ``optimizer=adam-deepspeed`` runs DeepSpeed's ZeRO optimizer (DeepSpeed 0.9.5
    runtime/zero/stage_1_and_2.py): at stage 2, or at stage 1 in fp16 (bf16 at stage 1 runs
    BF16_Optimizer; stage 3 is refused)."""
    return optimizer == "adam-deepspeed" and (zero == 2 or (precision == "fp16" and zero == 1))


def deepspeed_zero_passes(precision: str) -> tuple[TensorPasses, ...]:
    """DeepSpeed's ZeRO optimizer at stage 1 (fp16) or 2 (``optimizer=adam-deepspeed``; DeepSpeed
    0.9.5 runtime/zero/stage_1_and_2.py with its defaults: contiguous gradients,
    ``reduce_scatter``, no ``overlap_comm``), tensor by tensor, bytes a parameter, as
    (each gradient copied into the bucket buffer, every tensor of the stage
    (``reduce_independent_p_g_buckets_and_remove_grads``: read 2, write 2); each gradient of the
    rank's partition copied out of it (``copy_grads_in_partition``: read 2, write 2); the
    partition's overflow check (``_has_inf_or_nan``, as FP16_Optimizer's: ``float(x.float().sum())``,
    synchronised, in bf16 too); in fp16 its norm (``get_grad_norm_direct``: ``g.double().norm(2)``
    then ``.item()``: read 2, write 8, then read 8, synchronised; bf16 takes none); at stage 2
    each micro-batch's partition after the first added into the first's (the epilogue's
    ``accumulated_grad.add_``: read 4, write 2)). The flat passes are :func:`optimizer_op`'s."""
    norm = TensorPasses(2, 10.0, 8.0, synced=True) if precision == "fp16" else TensorPasses()
    return (TensorPasses(1, 2.0, 2.0), TensorPasses(1, 2.0, 2.0), TensorPasses(2, 6.0, 4.0, synced=True),
            norm, TensorPasses(1, 4.0, 2.0))


def deepspeed_zero3_passes(wire_fp32: bool) -> tuple[TensorPasses, ...]:
    """DeepSpeed's ZeRO-3 optimizer (``optimizer=adam-deepspeed`` with ``zero`` 3; DeepSpeed 0.9.5
    runtime/zero/stage3.py with its defaults: contiguous gradients, ``reduce_scatter``,
    ``overlap_comm`` on, as its config turns it on at stage 3), tensor by tensor, bytes a
    parameter, as (every micro-batch, each gradient of the stage copied into the bucket buffer
    (``__add_grad_to_ipg_bucket``: read 2, write 2); with an fp32 wire (``reduce_fp32``,
    ``communication_data_type``) each cast to it (``__avg_scatter_grads``: read 2, write 4); each
    gradient of the rank's partition copied into the 16-bit partition buffer on the first
    micro-batch (``partition_grads``: read 2, write 2) and added into it on the others (read 4,
    write 2), cast back from an fp32 wire first (read 4, write 2); the step's norm of each
    gradient of the partition (``get_grad_norm_direct``: ``g.double().norm(2)``: read 2, write 8,
    then read 8; only their sum is copied to the host)). The bucket's flat passes
    (``reduce_scatter_coalesced``: ``torch.cat`` and ``div_``) and the step's flat passes are
    :meth:`phaze.stage.StageCosts._deepspeed_zero3_passes` and :func:`optimizer_op`'s."""
    none = TensorPasses()
    cast, back = (TensorPasses(1, 2.0, 4.0), TensorPasses(1, 4.0, 2.0)) if wire_fp32 else (none, none)
    return (TensorPasses(1, 2.0, 2.0), cast, TensorPasses(1, 2.0, 2.0), TensorPasses(1, 4.0, 2.0), back,
            TensorPasses(2, 10.0, 8.0))


def deepspeed_reduce_passes(precision: str, wire_bytes: float) -> tuple[float, float, TensorPasses]:
    """The passes around DeepSpeed's data-parallel all-reduce under ``optimizer=adam-deepspeed``
    (DeepSpeed 0.9.5 runtime/engine.py ``buffered_allreduce_fallback``, ``allreduce_and_copy``,
    ``allreduce_bucket``), as (bytes a parameter streamed in a few kernels; more of them when the
    device's gradients fit in one bucket, :data:`DEEPSPEED_BUCKET_ELEMENTS`; the per-tensor
    copies back). ``wire_bytes``: a gradient's bytes on the wire (``communication_data_type``,
    by default the run's 16-bit type).

    Each bucket of gradients is flattened (``torch.cat``, unless it holds one tensor), cast to the
    wire type if it differs, multiplied by 1/dp after the all-reduce (``postscale_gradients``, on
    by default), cast back, and copied back tensor by tensor (a one-tensor bucket's view is its
    own storage: no copy). fp16 (FP16_Optimizer, ZeRO 0): the module's 16-bit gradients, many
    tensors a bucket. bf16 (BF16_Optimizer; its pipeline engine's ``_bf16_reduce_grads``): the
    fp32 gradients, flat, one tensor per parameter group; Megatron-DeepSpeed's two groups (with
    and without weight decay) share a bucket when the first is at most a bucket's size (each
    group's copy back one kernel), and the few norms and biases of the second are not counted.
    DeepSpeed's ZeRO optimizer (fp16 at stage 1, any at stage 2) reduces its own way:
    :func:`deepspeed_zero_passes`."""
    grad = 2.0 if precision == "fp16" else 4.0
    scale = 2 * wire_bytes + (2 * (grad + wire_bytes) if wire_bytes != grad else 0.0)   # 1/dp, casts
    if precision == "fp16":          # cat, scale; each gradient copied back
        return 2 * grad + scale, 0.0, TensorPasses(1, grad, grad)
    return scale, 4 * grad, TensorPasses()   # one bucket: the cat and the two copies back too


def tensor_flops(ops) -> float:
    """Total tensor-unit FLOPs of ``ops`` (GEMMs and fused attention, full causal count)."""
    return sum(o.flops for o in ops if o.unit in ("tensor", "tensor+vector"))
