"""Per-device memory: weights, gradients, optimizer state and stored activations.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", Sec. 4), generalised to grouped-query attention, any FFN width, SwiGLU,
models without dropout and fused (FlashAttention-style) attention.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .graph import kv_heads_read, kv_width, megatron_softmax_fused, norm_fed_linears
from .plan import is_full, recompute_modules_of
from .workload import Model, gdn_views, hybrid_views

# fp32 master + m + v; Megatron-Core's precision-aware optimizer keeps the master weights as the 16-bit
# remainders of the bf16 ones (2 + 4 + 4), and with bf16 moments 2 + 2 + 2 (phaze.graph.optimizer_op);
# SGD: none
OPTIMIZER_BYTES_PER_PARAM = {"adam": 12.0, "adam-megatron": 12.0, "adam-megatron-pa": 10.0,
                             "adam-megatron-pa-bf16": 6.0, "adam-deepspeed": 12.0, "sgd": 0.0}
GiB = 2.0 ** 30

# Per-device memory the training framework holds outside the model's tensors (the memory reserve).
# GPUs (PyTorch + NCCL): the CUDA context with its loaded kernels (about 0.5 GiB with lazy module
# loading, CUDA >= 11.7), cuBLAS/cuDNN workspaces, NCCL's communicator buffers (NCCL_BUFFSIZE,
# 4 MiB by default, per channel and peer, for each of Megatron's tensor, pipeline and data groups):
# 1.5 GiB together; plus the caching allocator's fragmentation, memory reserved but not allocated,
# 3 % of HBM (PyTorch's expandable segments keep it near this); the memory the driver keeps from
# CUDA (measured: 1.03 % of a lent H100's 80 GiB, 0.85 % of an H200's 141; results/kernels/*/
# properties.txt, total_memory) is taken to be within these (docs/validation.md says why it is not
# added). Whole-program compiled accelerators (XLA) allocate statically: 0.5 GiB for the runtime
# and program, no fragmentation.
GPU_RESERVE_FIXED_BYTES = 1.5 * GiB
GPU_RESERVE_FRACTION = 0.03
ACCELERATOR_RESERVE_FIXED_BYTES = 0.5 * GiB


def memory_reserve_bytes(chip, reserve: float | None = None) -> float:
    """Bytes per device not available to weights, gradients, optimizer state and activations:
    ``reserve`` when given (``--memory-reserve``), else the modelled reserve of the chip's kind."""
    if reserve is not None:
        return float(reserve)
    if chip.unit_sharing == "sequential" or chip.kind == "gpu":
        return GPU_RESERVE_FIXED_BYTES + GPU_RESERVE_FRACTION * chip.hbm_bytes
    return ACCELERATOR_RESERVE_FIXED_BYTES


def activation_bytes_per_layer(model: Model, mbs: int, tp: int = 1, sp: bool = False,
                               recompute: str = "none", attention: str = "standard") -> float:
    """Bytes one layer keeps for its backward pass, per micro-batch, on one device.

    With ``attention="standard"``, dropout, ``ffn_hidden = 4h`` and multi-head attention this is
    exactly Korthikanti's ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` (``/t`` on the first term too with
    sequence parallelism); ``selective`` drops the ``5·a·s/h`` term, ``full`` keeps the layer
    input ``2·s·b·h`` only; ``selective+<modules>`` (Megatron-Core's modules) drops what each
    re-runs (:func:`_modules_saved_bytes`). MLA also keeps its latents.
    """
    s, b, h, t = model.seq_len, mbs, model.hidden, tp
    p = model.bytes_per_element
    sb = s * b
    rep = 1.0 / t if sp else 1.0          # tensors replicated across TP unless sequence-parallel
    if is_full(recompute):      # an offloaded full recompute keeps its offloaded tensors on the host
        return p * sb * h * rep
    if model.hybrid and model.layer_kind is None:   # the mean over a hybrid's kinds of layer
        return sum(w * activation_bytes_per_layer(view, mbs, tp, sp, recompute, attention)
                   for w, view in hybrid_views(model))
    if views := gdn_views(model):   # Gated DeltaNet beside full attention: the mean of the two kinds
        return sum(w * activation_bytes_per_layer(view, mbs, tp, sp, recompute, attention) for w, view in views)
    if recompute == "op":
        return _op_checkpoint_bytes(model, sb, t, rep, attention)
    mask = 1.0 if model.dropout else 0.0  # dropout masks are one byte per element
    # the linears' saved inputs (bytes an element): 16-bit, or with Transformer Engine's modules in
    # fp8 one fp8 layout (TE 1.13 and 2.8 keep the column-wise copy, or the row-wise one under
    # sequence parallelism): the norm-fed ones' (graph.norm_fed_linears), which the norm writes in
    # fp8 under fused casts and a te.Linear casts itself (the norm's 16-bit output freed); the
    # down projection's is the only copy of its input, and the out-projection's sits beside the
    # 16-bit output a fused attention keeps for its own backward
    saved = {n: p for n in ("qkv", "ffn_up", "attn_out", "ffn_down", "mamba_in", "mamba_out", "gdn_in", "gdn_out")}
    if model.fp8_saved_inputs:
        saved.update({n: 1.0 for n in norm_fed_linears(model)}, ffn_down=1.0, mamba_out=1.0, gdn_out=1.0,
                     attn_out=1.0 + (p if attention in ("flash", "flash2") else 0.0))
    kind = model.layer_kind
    if model.linear_attention_interval == -1:
        # a Gated DeltaNet layer: the full-attention layer's bytes (its FFN and any selective
        # recompute modules alike) less its attention's, plus the mixer's (Megatron-Core 0.16
        # gated_delta_net.py on fla-core 0.6.0, both read from PyPI): the norm's and input
        # projection's inputs; the convolution's input (causal_conv1d_fn keeps q, k, v before it);
        # l2norm's outputs and fp32 reciprocal norms (q, k); what chunk_gated_delta_rule keeps (q
        # and k repeated to the value heads, v, the fp32 cumulative g, beta and A, C a token and
        # value head, in the inputs' dtype); the softplus's fp32 input and output; the gate z; the
        # gated norm's input; the output projection's input
        full_layer = replace(model, linear_attention_interval=0)
        whole = activation_bytes_per_layer(full_layer, mbs, tp, sp, recompute, attention)
        qk, v = model.gdn_qk_dim, model.gdn_v_dim
        hk, hv, dk, c = model.linear_key_heads, model.linear_value_heads, model.linear_key_head_dim, model.linear_chunk
        mixer = (p * (2 * qk + v) + p * 2 * qk + 4 * 2 * hk + p * (2 * hv * dk + v) + 4 * hv + p * hv + p * c * hv
                 + 4 * 2 * hv + p * v + p * v + saved["gdn_out"] * v)
        return (whole - _attention_bytes(full_layer, sb, t, rep, recompute, attention, saved, mask, mbs)
                + (p + saved["gdn_in"] + mask) * sb * h * rep + sb * mixer / t)
    if kind == "M":
        # the norm's input and the input projection's (the norm's output); on the tp rank's heads,
        # what mamba_ssm's split-conv1d-scan function saves (z, x, B, C, dt as projected, and the
        # scan's output before the gate, out_x; its chunk states are re-made in the backward), the
        # gated norm's input and fp32 reciprocal deviations (one a group), the output projection's input
        d, width, groups = model.mamba_inner, model.mamba_in_width, model.mamba_groups
        return ((p + saved["mamba_in"]) * sb * h * rep
                + sb * (p * width + 2 * p * d + saved["mamba_out"] * d + 4 * groups) / t)
    # ln1 in, qkv in, mask, ln2 in, ffn in, mask; a parallel block's norms both read the layer's
    # input, and a shared norm's output is the FFN's input too (te.Linear: each keeps its own copy)
    ln2_in = 0.0 if model.parallel_block else p
    own_copies = model.fp8_saved_inputs and not model.fp8_fused
    ffn_in = 0.0 if model.parallel_block == "shared_norm" and not own_copies else saved["ffn_up"]
    replicated = (p + saved["qkv"] + mask + ln2_in + ffn_in + mask) * sb * h * rep
    if model.sandwich_norm:   # the norms after the attention and the FFN keep their inputs (Gemma 2)
        replicated += 2 * p * sb * h * rep
    # K and V as the tp ranks hold them together (a KV head replicated when tp > kv heads); copied
    # to one per query head (kv_repeat copied), the attention keeps the copies
    q, kv, f = model.q_dim, kv_heads_read(model, t) * t * model.head_dim, model.ffn_hidden
    v = kv * model.v_head_dim // model.head_dim          # the values' width (MLA's is narrower)
    act_inputs = 2 if model.gated else 1
    # Q, K, V, out-proj in (heads x value width), act in, down in
    split = sb * (p * (q + kv + v) + saved["attn_out"] * model.o_dim + p * act_inputs * f
                  + saved["ffn_down"] * f) / t
    if model.moe:
        split += moe_activation_bytes(model, sb, t) - sb * (p * act_inputs * f + saved["ffn_down"] * f) / t
    core = _core_bytes(model, sb, t, recompute, attention, mask, mbs)
    if model.mla:
        # MLA's latents: the down projections' outputs (the norms' inputs) and the normed latents
        # (the up projections' inputs: fp8 under Transformer Engine's fp8, whose LayerNormLinear
        # writes them), replicated over tp (Megatron-Core's MLA)
        replicated += (p + _linear_input_bytes(model)) * sb * (model.q_lora_rank + model.kv_lora_rank) * rep
    if model.attention_output_gate:   # the gate's input and the attention's output before the gate
        split += sb * p * (q + model.o_dim) / t
    if kind in ("*", "-", "E"):   # a hybrid's attention, MLP or MoE layer: its half of the transformer layer's
        if kind == "*":
            return _attention_bytes(model, sb, t, rep, recompute, attention, saved, mask, mbs)
        ffn = (moe_activation_bytes(model, sb, t) if kind == "E"
               else sb * (p * act_inputs * f + saved["ffn_down"] * f) / t)
        return (p + saved["ffn_up"] + mask) * sb * h * rep + ffn
    mods = recompute_modules_of(recompute)
    if mods:
        return replicated + split + core - _modules_saved_bytes(model, sb, t, rep, mods, saved, act_inputs)
    return replicated + split + core


def _attention_bytes(model: Model, sb: int, t: int, rep: float, recompute: str, attention: str, saved: dict,
                     mask: float, mbs: int) -> float:
    """The bytes :func:`activation_bytes_per_layer` counts for a layer's attention (its input
    norm's input, the projection's input and mask; Q, K, V and the out-projection's input; the
    fused kernel's statistics or the unfused scores), under ``recompute``."""
    p, h = model.bytes_per_element, model.hidden
    q, kv = model.q_dim, kv_heads_read(model, t) * t * model.head_dim
    v = kv * model.v_head_dim // model.head_dim
    gate = p * (q + model.o_dim) * sb / t if model.attention_output_gate else 0.0
    return ((p + saved["qkv"] + mask) * sb * h * rep + sb * (p * (q + kv + v) + saved["attn_out"] * model.o_dim) / t
            + _core_bytes(model, sb, t, recompute, attention, mask, mbs) + gate)


def _core_bytes(model: Model, sb: int, t: int, recompute: str, attention: str, mask: float, mbs: int) -> float:
    """What the core attention keeps for its backward: nothing under Megatron-Core's checkpointed
    ``core_attn`` (which keeps only its inputs, Q, K and V); a fused kernel its fp32 log-sum-exp a
    row; nothing under selective recompute; otherwise the scores against every key of the sequence (a
    context-parallel shard's too): the softmax's output (fp32 when PyTorch runs it, and then
    without dropout also its 16-bit copy, the product's input), the dropout's mask and output, and
    a soft-capped model's tanh output."""
    p, a = model.bytes_per_element, model.heads
    if "core_attn" in (recompute_modules_of(recompute) or ()):
        return 0.0
    if attention in ("flash", "flash2"):
        return 4.0 * a * sb / t
    if recompute == "selective":
        return 0.0
    probs = p if megatron_softmax_fused(model, mbs, t) else 4.0 + (0.0 if model.dropout else p)
    capped = p if model.attention_softcap else 0.0   # the soft-cap's tanh keeps its output (Gemma 2, NeMo's)
    return ((probs + capped + (mask + p if model.dropout else 0.0)) * a * model.seq_len * model.context_parallel
            * sb / t)


def _modules_saved_bytes(model: Model, sb: int, t: int, rep: float, mods, saved: dict, act_inputs: int) -> float:
    """Bytes per layer that Megatron-Core's selective recompute of ``mods`` does not keep (besides
    the core attention's): ``layernorm`` discards the outputs of the norms that are modules of their
    own in its Transformer Engine layer spec (gpt_layer_specs.py: an MLA layer's input norm, an MoE
    layer's pre-MLP norm; the others are fused into the next linear), which under fp8 frees
    nothing of MLA's input norm (its two down projections keep fp8 copies of their own),
    ``mla_up_proj`` MLA's Q, K and V and the normed latents (its checkpoint, run without
    autograd, keeps only its inputs, the down projections' outputs, and the latents' norms are
    fused into the up projections: multi_latent_attention.py, megatron-core 0.16.1), ``mlp`` a
    dense layer's FFN (its input norm is fused into the first linear), ``moe_act`` the experts'
    activation outputs, ``shared_experts`` the shared experts' inputs to their activation and down
    projection (and, in fp8, their first linear's copy of its input), ``moe`` all of an MoE
    layer's (its input, the pre-MLP norm's output, stays). An MoE model's dense layers weigh by
    their share."""
    p, h = model.bytes_per_element, model.hidden
    w_moe = model.moe_layers / model.layers if model.moe else 0.0
    w_dense = 1.0 - w_moe
    f = model.ffn_hidden
    out = 0.0
    if "layernorm" in mods:
        mla_norm = saved["qkv"] if model.mla and not model.fp8_saved_inputs else 0.0
        out += mla_norm * sb * h * rep + saved["ffn_up"] * sb * h * rep * w_moe
    if "mla_up_proj" in mods and model.mla:
        q, kv = model.q_dim, kv_width(model, t) * t
        out += p * sb * (q + kv + kv * model.v_head_dim // model.head_dim) / t
        out += _linear_input_bytes(model) * sb * (model.q_lora_rank + model.kv_lora_rank) * rep
    if "mlp" in mods:
        down = saved["ffn_down"]   # an MoE model's dense layers too (:func:`_linear_input_bytes`)
        norm_out = 0.0 if model.parallel_block == "shared_norm" else saved["ffn_up"]   # kept for qkv
        out += (norm_out * sb * h * rep + sb * (p * act_inputs * f + down * f) / t) * w_dense
    if model.moe:
        routed, shared, copy = _expert_tensors(model, sb, t)
        if "moe" in mods:
            out += (routed + shared + copy) * w_moe
        else:
            down_in = _linear_input_bytes(model) * sb / t * model.top_k * model.expert_ffn
            # Megatron-Core checkpoints the shared experts' whole module (moe_layer.py, te_checkpoint
            # under fp8): their first linear's fp8 copy goes too
            out += ((down_in if "moe_act" in mods else 0.0)
                    + (shared + copy if "shared_experts" in mods else 0.0)) * w_moe
    return out


def _op_checkpoint_bytes(model: Model, sb: int, t: int, rep: float, attention: str) -> float:
    """Bytes torchtitan's per-op checkpointing keeps for one layer: the layer input, the outputs of
    the saved (odd-numbered) matmuls, q and v, the gate projection (SwiGLU) or the up projection,
    and the down projection's partial sums (SwiGLU), the attention kernel's output and log-sum-exp
    (or the scores, unfused), and with tp the two reduce-scatters' outputs."""
    p, h, a = model.bytes_per_element, model.hidden, model.heads
    q, kv, f = model.q_dim, kv_width(model, t) * t, model.ffn_hidden
    saved = p * sb * h * rep + p * sb * (q + kv + q + f) / t
    if model.gated:
        saved += p * sb * h                     # the down projection's output before its reduction
    if attention in ("flash", "flash2"):
        saved += 4.0 * a * sb / t
    else:
        saved += p * a * model.seq_len * model.context_parallel * sb / t
    if t > 1:
        saved += 2 * p * sb * h * rep
    return saved


def moe_activation_bytes(model: Model, tokens: int, tp: int) -> float:
    """Bytes an MoE layer's FFN keeps for backward on one device (balanced routing), its dense
    layers' FFN averaged in: the router's probabilities (fp32), the ``top_k`` dispatched copies of
    each of its tokens/tp tokens (the experts' input), their activation input and down-projection
    input, and the shared experts' (tensor-parallel) activation and down-projection inputs. With
    Transformer Engine's fp8 (``fp8_casts`` fused or te-linear) the linears keep one fp8 layout of
    their inputs (:func:`_linear_input_bytes`), the shared experts' first linear a copy of the
    router's 16-bit input."""
    gate = 2 if model.gated else 1
    moe = sum(_expert_tensors(model, tokens, tp))
    dense = tokens * (model.bytes_per_element * gate + _linear_input_bytes(model)) * model.ffn_hidden / tp
    return (model.moe_layers * moe + model.dense_ffn_layers * dense) / model.layers


def _expert_tensors(model: Model, tokens: float, tp: int) -> tuple[float, float, float]:
    """Bytes one MoE layer keeps on a device for its experts: (the router's fp32 probabilities and
    the ``top_k`` dispatched copies of its tokens/tp tokens with their activation and
    down-projection inputs; the shared experts' activation and down-projection inputs, and with
    their gate its sigmoid and the output it scales (Megatron-Core's SharedExpertMLP.forward); under
    Transformer Engine's fp8 the shared experts' first linear's fp8 copy of the router's input)."""
    p, h, k = model.bytes_per_element, model.hidden, model.top_k
    gate = 2 if model.gated else 1
    local = tokens / tp
    lin = _linear_input_bytes(model)
    ef, sf = model.expert_ffn, model.shared_experts * model.shared_ffn
    routed = 4 * local * model.experts + local * k * (lin * h + p * gate * ef + lin * ef)
    shared = tokens * (p * gate * sf + lin * sf + (p * (h + 1) if model.shared_expert_gate else 0)) / tp
    copy = tokens * h / tp if sf and model.fp8_saved_inputs else 0.0
    return routed, shared, copy


def _linear_input_bytes(model: Model) -> float:
    """Bytes an element of a linear's input that no other operator keeps (the experts' dispatched
    tokens, an activation's output): 16-bit, or under Transformer Engine's fp8 (``fp8_casts``
    fused or te-linear) the one fp8 layout its GEMMs keep (TE 1.13 and 2.8 ``Linear`` and
    ``GroupedLinear`` save the column-wise copy and free the 16-bit tensor)."""
    return 1.0 if model.fp8_saved_inputs else model.bytes_per_element


def state_bytes_per_param(optimizer: str, zero: int, dp: int, weight_bytes: int = 2,
                          grad_bytes: int = 2) -> float:
    """Weights + gradients + optimizer state per parameter on one device. ``zero`` 1 shards the
    optimizer state over ``dp`` (distributed optimizer), 2 also the gradients, 3 also the
    weights (FSDP)."""
    opt = OPTIMIZER_BYTES_PER_PARAM[optimizer]
    return (weight_bytes / (dp if zero >= 3 else 1) + grad_bytes / (dp if zero >= 2 else 1)
            + opt / (dp if zero >= 1 else 1))


def optimizer_step_bytes_per_param(optimizer: str, precision: str = "bf16", grad_bytes: float = 4.0) -> float:
    """Bytes the optimizer step holds beyond the state, per parameter it updates: Transformer
    Engine's FusedAdam with bf16 moments works on fp32 copies of both, made for every tensor of the
    shard before its kernel and freed after the write-back (:func:`phaze.graph.bf16_moment_passes`);
    Megatron's own optimizer copies 16-bit main gradients (fp16, or ``grad_bytes`` 2) to fp32
    for all of them at once (:func:`phaze.graph.optimizer_op`); DeepSpeed's fp16 wrapper and its
    ZeRO optimizer (16-bit gradients) make flat fp32 gradients (FP16_Optimizer's
    ``grads_groups_flat``, the ZeRO optimizer's ``single_grad_partition``: DeepSpeed 0.9.5
    runtime/fp16/fused_optimizer.py, runtime/zero/stage_1_and_2.py) and free them after Adam; 0
    for the others."""
    if optimizer == "adam-megatron-pa-bf16":
        return 8.0
    if optimizer == "adam-deepspeed" and (precision == "fp16" or grad_bytes < 4):   # not BF16_Optimizer's
        return 4.0
    if optimizer == "adam-megatron" and (precision == "fp16" or grad_bytes < 4):
        return 4.0
    return 0.0


@dataclass(frozen=True)
class StageMemory:
    """Peak bytes on one device of a pipeline stage, by kind."""

    stage: int
    layers: int
    weights_and_optimizer_bytes: float
    activation_bytes: float
    transient_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_and_optimizer_bytes + self.activation_bytes + self.transient_bytes
