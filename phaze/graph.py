"""Operator graphs: one transformer layer's forward and backward DAG, plus the embedding,
logits/loss and optimizer work, for a micro-batch and a tensor-parallel width.

Each :class:`Op` carries its shape, FLOPs, HBM bytes, the unit kind it runs on and, for
communication, its :class:`Collective`. FLOPs are the arithmetic the hardware performs
(fused causal attention skips masked blocks: see ``work_fraction``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .workload import Model


@dataclass(frozen=True)
class Collective:
    """A collective over one parallel group; ``bytes`` is the full (unsharded) buffer."""

    kind: str    # all_reduce | reduce_scatter | all_gather | send
    group: str   # tp | dp | pp
    bytes: float


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

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


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


def _coll(b: _Builder, name, kind, group, nbytes, deps=None) -> str:
    return b.add(name, "link", deps, collective=Collective(kind, group, nbytes))


@lru_cache(maxsize=4096)
def layer_graph(model: Model, mbs: int, tp: int = 1, sp: bool = False,
                attention: str = "flash", recompute: str = "none") -> LayerGraph:
    """The forward and backward operator DAGs of one layer on one of ``tp`` devices.

    ``sp`` (sequence parallelism) shards norms, dropouts and residuals over ``tp`` and turns each
    all-reduce into a reduce-scatter plus all-gather. ``recompute`` adds the re-run forward ops to
    the backward graph (``full``: the whole layer; ``selective``: core attention only).
    """
    h, s, b, t = model.hidden, model.seq_len, mbs, tp
    p = model.bytes_per_element
    T = b * s                           # tokens in the micro-batch
    Tn = T // t if sp else T            # tokens each device holds outside the TP regions
    qkv_n = (model.q_dim + 2 * model.kv_dim) // t
    a_t, d = model.heads // t, model.head_dim
    ffn_out = model.ffn_hidden * (2 if model.activation == "swiglu" else 1) // t
    f_t = model.ffn_hidden // t
    fused = attention in ("flash", "flash2")
    work = 0.5 if (model.causal and fused) else 1.0
    # operands of the fused products are streamed from local SRAM once per this many query rows
    # (FlashAttention-2: 16, the height of an mma.sync fragment); 0: reuse of a full output tile
    reuse = 16 if attention == "flash2" else 0

    fp8 = model.precision == "fp8"

    def linear(fb: _Builder, name: str, M: int, K: int, N: int) -> None:
        """A linear layer's GEMM; in fp8 training its input is first scaled and cast to fp8 in
        both layouts (row-wise for this GEMM, column-wise for the weight gradient). The weights'
        cast is done once per step and cached across micro-batches (Transformer Engine)."""
        if fp8:
            _vector(fb, name + ".fp8_cast", M * K, p, reads=1, writes=2 / p, flops_per_element=2)
        _gemm(fb, name, 1, M, K, N, p, weights=True)

    def forward(fb: _Builder, prefix: str = "") -> None:
        n = lambda x: prefix + x  # noqa: E731
        _vector(fb, n("ln1"), Tn * h, p, flops_per_element=8)
        if t > 1 and sp:
            _coll(fb, n("ln1.all_gather"), "all_gather", "tp", p * T * h)
        linear(fb, n("qkv"), T, h, qkv_n)
        _attention_core(fb, n)
        linear(fb, n("attn_out"), T, a_t * d, h)
        if t > 1:
            _coll(fb, n("attn_out." + ("reduce_scatter" if sp else "all_reduce")),
                  "reduce_scatter" if sp else "all_reduce", "tp", p * T * h)
        _vector(fb, n("attn_residual"), Tn * h, p, reads=2, flops_per_element=2)
        _vector(fb, n("ln2"), Tn * h, p, flops_per_element=8)
        if t > 1 and sp:
            _coll(fb, n("ln2.all_gather"), "all_gather", "tp", p * T * h)
        linear(fb, n("ffn_up"), T, h, ffn_out)
        if model.activation == "swiglu":
            _vector(fb, n("swiglu"), T * f_t, p, reads=2, flops_per_element=6, special_per_element=1)
        else:
            _vector(fb, n(model.activation), T * f_t, p, flops_per_element=8,
                    special_per_element=1 if model.activation == "gelu" else 0)
        linear(fb, n("ffn_down"), T, f_t, h)
        if t > 1:
            _coll(fb, n("ffn_down." + ("reduce_scatter" if sp else "all_reduce")),
                  "reduce_scatter" if sp else "all_reduce", "tp", p * T * h)
        _vector(fb, n("ffn_residual"), Tn * h, p, reads=2, flops_per_element=2)

    def _attention_core(fb: _Builder, n) -> None:
        if fused:
            flops = 4.0 * b * a_t * s * s * d
            # fused: S = Q.K^T and O = P.V per query tile, accumulating over the keys (K = s);
            # the online softmax takes one exp and ~5 FLOPs per score
            scores = b * a_t * s * s
            fb.add(n("flash_attention"), "tensor+vector", flops=flops, work_fraction=work,
                   gemm=(b * a_t, s, s, d), elements=scores, special=scores, vector_flops=5 * scores,
                   bytes_read=p * T * qkv_n, bytes_written=p * T * a_t * d, core_attention=True,
                   operand_reuse=reuse)
            return
        _gemm(fb, n("scores"), b * a_t, s, d, s, p, weights=False, core_attention=True)
        _vector(fb, n("softmax"), b * a_t * s * s, p, flops_per_element=5, core_attention=True,
                special_per_element=1)
        if model.dropout:
            _vector(fb, n("attn_dropout"), b * a_t * s * s, p, writes=1.5, core_attention=True)
        _gemm(fb, n("context"), b * a_t, s, s, d, p, weights=False, core_attention=True)

    fb = _Builder("fwd")
    forward(fb)

    bb = _Builder("bwd")
    if recompute == "full":
        forward(bb, "recompute.")
    elif recompute == "selective" and not fused:
        _attention_core(bb, lambda x: "recompute." + x)
    grad = bb.last

    for op in reversed(fb.ops):
        if op.name.endswith(".fp8_cast"):
            continue
        if op.unit == "link":
            c = op.collective
            mirror = {"all_reduce": None, "reduce_scatter": "all_gather", "all_gather": "reduce_scatter"}
            if mirror[c.kind]:
                grad = (_coll(bb, f"{op.name}.bwd", mirror[c.kind], "tp", c.bytes, deps=grad),)
            continue
        if op.unit == "vector":
            grad = (_vector(bb, f"{op.name}.bwd", op.elements, p, reads=2 * op.bytes_read / (p * op.elements),
                            flops_per_element=op.flops / op.elements, deps=grad,
                            special_per_element=op.special / op.elements,
                            core_attention=op.core_attention),)
            continue
        if op.unit == "tensor+vector":     # fused attention backward: recomputes the scores
            # recomputes P = exp(S - L) (one exp per score) and dS = P * (dP - D)
            grad = (bb.add(f"{op.name}.bwd", "tensor+vector", grad, flops=2.5 * op.flops,
                           work_fraction=op.work_fraction, gemm=op.gemm, elements=op.elements,
                           special=op.elements, vector_flops=8 * op.elements,
                           operand_reuse=op.operand_reuse,
                           bytes_read=op.bytes_read + 2 * op.bytes_written,
                           bytes_written=op.bytes_read, core_attention=True),)
            continue
        batch, M, K, N = op.gemm
        weighted = op.name.split(".")[-1] in ("qkv", "attn_out", "ffn_up", "ffn_down")
        if weighted:
            input_gathered = t > 1 and sp and op.name in ("qkv", "ffn_up")
            if fp8:   # the output gradient is cast to fp8 (both layouts) before dgrad and wgrad
                grad = (_vector(bb, f"{op.name}.grad_fp8_cast", M * N, p, reads=1, writes=2 / p,
                                flops_per_element=2, deps=grad),)
            dgrad = _gemm(bb, f"{op.name}.dgrad", 1, M, N, K, p, weights=True, deps=grad)
            wdeps = grad
            if input_gathered:   # Megatron-SP re-gathers the sharded input for the weight gradient
                wdeps = grad + (_coll(bb, f"{op.name}.input_all_gather", "all_gather", "tp",
                                      p * T * h, deps=grad),)
            _gemm(bb, f"{op.name}.wgrad", 1, K, M, N, p, weights=False, deps=wdeps, linear=True)
            grad = (dgrad,)
            if t > 1 and not sp and op.name in ("qkv", "ffn_up"):
                grad = (_coll(bb, f"{op.name}.dgrad.all_reduce", "all_reduce", "tp", p * T * h,
                              deps=grad),)
        else:                    # attention batched GEMMs: both operands are activations
            g1 = _gemm(bb, f"{op.name}.dgrad_a", batch, M, N, K, p, weights=False, deps=grad,
                       core_attention=True)
            g2 = _gemm(bb, f"{op.name}.dgrad_b", batch, K, M, N, p, weights=False, deps=grad,
                       core_attention=True)
            grad = (g1, g2)
    return LayerGraph(fwd=tuple(fb.ops), bwd=tuple(bb.ops))


@lru_cache(maxsize=1024)
def edge_graph(model: Model, mbs: int, tp: int = 1, sp: bool = False) -> dict[str, tuple[Op, ...]]:
    """Work outside the repeated layers, per micro-batch: ``embedding`` (first stage, forward and
    backward) and ``head`` (final norm, logits GEMM, loss; last stage)."""
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
        _coll(emb, "embedding." + ("reduce_scatter" if sp else "all_reduce"),
              "reduce_scatter" if sp else "all_reduce", "tp", p * T * h)
    if model.embedding_norm:
        _vector(emb, "embedding.norm", Tn * h, p, flops_per_element=8)
    fwd_emb = list(emb.ops)
    emb_b = _Builder("bwd")
    if model.embedding_norm:
        _vector(emb_b, "embedding.norm.bwd", Tn * h, p, reads=2, flops_per_element=8)
    if t > 1 and sp:
        _coll(emb_b, "embedding.all_gather.bwd", "all_gather", "tp", p * T * h)
    if e != h:
        _gemm(emb_b, "embedding.project_in.wgrad", 1, e, T, h, p, weights=False, linear=True)
    _vector(emb_b, "embedding.grad_accumulate", T * e, p, reads=2, flops_per_element=1)

    head = _Builder("fwd")
    if model.norm_position == "pre":
        _vector(head, "final_norm", Tn * h, p, flops_per_element=8)
    if t > 1 and sp:
        _coll(head, "head.all_gather", "all_gather", "tp", p * T * h)
    if model.architecture == "encoder":
        _gemm(head, "mlm_transform", 1, T, h, h, p, weights=True)
        _vector(head, "mlm_norm", T * h, p, flops_per_element=10)
    if e != h:
        _gemm(head, "head.project_out", 1, T, h, e, p, weights=True)
    _gemm(head, "logits", 1, T, e, Vt, p, weights=True)
    # loss in fp32 as frameworks compute it: upcast the logits, log-softmax, gather (fwd);
    # softmax minus one-hot, downcast (bwd); bytes per logit, expressed in units of p
    _vector(head, "cross_entropy", T * Vt, p, reads=(p + 4 + 4) / p, writes=(4 + 4) / p,
            flops_per_element=6, special_per_element=1)
    if t > 1:
        _coll(head, "cross_entropy.all_reduce", "all_reduce", "tp", 3 * 4 * T)
    head_b = _Builder("bwd")
    _vector(head_b, "cross_entropy.bwd", T * Vt, p, reads=(4 + 4) / p, writes=(4 + p) / p,
            flops_per_element=2)
    _gemm(head_b, "logits.dgrad", 1, T, Vt, e, p, weights=True)
    _gemm(head_b, "logits.wgrad", 1, e, T, Vt, p, weights=False, deps=("cross_entropy.bwd",), linear=True)
    head_b.last = ("logits.dgrad",)
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
        _coll(head_b, "head.dgrad." + ("reduce_scatter" if sp else "all_reduce"),
              "reduce_scatter" if sp else "all_reduce", "tp", p * T * h)
    if model.norm_position == "pre":
        _vector(head_b, "final_norm.bwd", Tn * h, p, reads=2, flops_per_element=8)
    return {"embedding": tuple(fwd_emb) + tuple(emb_b.ops), "head": tuple(head.ops) + tuple(head_b.ops)}


def optimizer_op(params_on_device: float, optimizer: str = "adam") -> Op:
    """The element-wise optimizer update over the parameters a device updates.

    Adam with fp32 master weights reads master, m, v (4 bytes each) and the 16-bit gradient and
    writes master, m, v and the 16-bit weight: 14 + 14 bytes per parameter. SGD (momentum-free,
    as in the original Phaze) reads weight and gradient and writes the weight: 4 + 2.
    """
    read, write, flops = (14.0, 14.0, 12.0) if optimizer == "adam" else (4.0, 2.0, 2.0)
    n = float(params_on_device)
    return Op(name=f"optimizer.{optimizer}", unit="vector", phase="opt", flops=flops * n,
              elements=n, bytes_read=read * n, bytes_written=write * n)


def tensor_flops(ops) -> float:
    """Total tensor-unit FLOPs of ``ops`` (GEMMs and fused attention, full causal count)."""
    return sum(o.flops for o in ops if o.unit in ("tensor", "tensor+vector"))
