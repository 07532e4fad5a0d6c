"""Transformer workloads: the model description, its parameter count and its FLOP formulas.

A workload is read from ``workloads/<name>.yaml`` (or any YAML path) or from a Hugging Face
``config.json``. Everything downstream (operator graphs, memory, step time) derives from the
frozen :class:`Model`.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from .configio import MAX_INT, ConfigError, Fields, config_dirs, read_mapping, resolve_config

PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
# the FFN's activation: ``gelu`` and ``relu`` (squared ReLU costed as ReLU) between two linears;
# ``swiglu`` (SiLU) and ``geglu`` (GeLU, Gemma's) gate it: the first linear makes a gate and a
# value, the activation of the gate times the value (Shazeer 2020, "GLU Variants Improve
# Transformer")
ACTIVATIONS = ("gelu", "relu", "swiglu", "geglu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
# fp8 training's casts: ``fused``, Transformer Engine's modules as Megatron-Core lays out a layer
# (delayed scaling lets the norm before qkv and the up-projection write fp8, gathered in fp8 under
# sequence parallelism; transposes for the weight gradients in the backward); ``separate``, a cast
# kernel per linear input and output gradient, both layouts at once, the 16-bit input kept for the
# backward (torchao 0.18's Float8Linear: matmul_with_hp_or_float8_args saves input_hp);
# ``te-linear``, the same kernels in Transformer Engine's te.Linear, which keeps the fp8 copy of
# its input instead and frees the 16-bit one (TE 1.13 and 2.8 module/linear.py; llm-foundry)
FP8_CASTS = ("fused", "separate", "te-linear")
# where a biased model's biases cost time: ``fused``, in the GEMMs' epilogues (Transformer Engine's
# cuBLASLt bias and bias-gradient epilogues, XLA); ``separate``, kernels of their own (Megatron's
# tensor-parallel layers and PyTorch autograd: each bias gradient is a reduction over the tokens)
BIAS_KERNELS = ("fused", "separate")
# how a rotary embedding turns the queries and keys, in each direction: ``fused``, one kernel per
# tensor reading and writing it in 16 bits (Transformer Engine's fused RoPE, flash-attn's rotary
# kernel, a compiler's fusion); ``complex``, the pairs as fp32 complex numbers times the rotations
# (torchtitan's apply_rotary_emb: upcast, multiply, downcast, three kernels per tensor);
# ``separate``, Megatron's unfused rotate-half formula in 16 bits (megatron-core's
# _apply_rotary_pos_emb_bshd: neg, cat, two multiplies, add and a cat per tensor, and the cos and
# sin tables made again each call)
ROTARY_KERNELS = ("fused", "complex", "separate")
# how grouped-query attention reads its key and value heads: ``grouped``, each once for its group
# of query heads (FlashAttention's and Transformer Engine's kernels, SDPA's enable_gqa);
# ``copied``, first copied to one per query head (torchtitan 0.1 and 0.2's repeat_kv), whose
# gradients the backward sums back over each group
KV_REPEATS = ("grouped", "copied")
# how an unfused ("standard") attention's softmax runs: ``fused``, one kernel reading and writing
# the scores in 16 bits whatever their shape; ``megatron``, Megatron's scaled masked softmax
# kernel where its shape rule lets it run (:func:`phaze.graph.megatron_softmax_fused`), else
# PyTorch's chain in fp32 (upcast, the layer-number scaling, masked fill, softmax, downcast):
# Megatron-LM's FusedScaleMaskSoftmax with query-key layer scaling on, its default
SOFTMAX_KERNELS = ("fused", "megatron")
# what a full recompute re-runs: ``whole``, the layer's forward to its end (Megatron's and
# DeepSpeed's checkpoint functions call it again); ``needed``, only the ops whose results the
# backward reads (JAX's remat and XLA: a pre-norm layer's last projection and residual add are
# not re-run). A workload that leaves it blank gets its chip's execution model's: needed for one
# compiled program (xla), whole otherwise
RECOMPUTE_RERUN = ("whole", "needed")
# a parallel block (GPT-J, GPT-NeoX, PaLM, Falcon): attention and FFN both read the layer's input,
# x + attn(norm(x)) + ffn(norm'(x)), their partial outputs added before one tensor-parallel
# reduction (GPT-NeoX's gpt_j_residual: "we can do a single allreduce after we add mlp / attn
# outputs"); ``shared_norm``: one norm feeds both (GPT-J, PaLM, Falcon-7B); ``two_norms``: each has
# its own (GPT-NeoX, Falcon-40B/180B); "" a sequential layer
PARALLEL_BLOCKS = ("shared_norm", "two_norms")
# the width of the q and k norms (Model.qk_norm_width)
QK_NORM_WIDTHS = ("head", "projection")
# a norm's parameters: none (OLMo 1's LayerNorm), a weight, or a weight and a bias; "" follows the
# model: a weight, and a LayerNorm's bias when its linears have biases
NORM_AFFINES = ("none", "weight", "weight_bias")
HYBRID_KINDS = ("M", "*", "-", "E")   # a Mamba-2 mixer, attention, an MLP, a mixture of experts
                                      # (Megatron-Core's Symbols)
BYTES_PER_ELEMENT = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class Model:
    """One transformer language model, as the shapes that decide its cost."""

    name: str
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    architecture: str = "decoder"        # decoder (causal LM) | encoder (BERT-style MLM)
    kv_heads: int = 0                    # 0 means = heads (multi-head attention)
    head_dim: int = 0                    # 0 means = hidden / heads
    activation: str = "gelu"             # gelu | relu | swiglu | geglu (ACTIVATIONS)
    position_embedding: str = "learned"  # learned | rotary | alibi
    max_positions: int = 0               # learned table size; 0 means = seq_len
    tied_embeddings: bool = True
    norm: str = "layernorm"              # layernorm | rmsnorm
    norm_affine: str = ""                # NORM_AFFINES; "": a weight, and a LayerNorm's bias with ``bias``
    norm_position: str = "pre"           # pre (final norm after the stack) | post
    bias: bool = True                    # biases in linear layers and LayerNorm
    dropout: bool = True                 # attention and residual dropout present
    embedding_norm: bool = False         # a norm right after the embeddings (BERT)
    embedding_projection_dim: int = 0    # OPT-350M style factorised embedding; 0 = none
    token_types: int = 0                 # BERT segment embeddings
    precision: str = "bf16"
    fp8_casts: str = ""                  # fp8 only, where the casts to fp8 run (FP8_CASTS): fused into
                                         # the norms (Transformer Engine's LayerNormLinear) | separate
                                         # | te-linear (separate, the fp8 input kept);
                                         # "": the framework's, else fused
    bias_kernels: str = ""               # a biased model's bias adds and gradients (BIAS_KERNELS): in
                                         # the GEMM epilogues | separate kernels; "": the framework's,
                                         # else fused
    rotary_kernels: str = ""             # a rotary model's rotations (ROTARY_KERNELS); "": the
                                         # framework's, else fused
    kv_repeat: str = ""                  # grouped-query attention's key/value heads (KV_REPEATS); "":
                                         # the framework's, else grouped
    softmax_kernel: str = ""             # an unfused attention's softmax (SOFTMAX_KERNELS); "": the
                                         # framework's, else fused
    recompute_rerun: str = ""            # what a full recompute re-runs (RECOMPUTE_RERUN): the whole
                                         # forward | what the backward reads; "": needed on a chip
                                         # that runs one compiled program (xla), else whole
    qkv_bias: bool = False               # biases on the q, k, v projections only (Qwen2) when ``bias`` is off
    sliding_window: int = 0              # attention window (Mistral); 0 = every earlier token
    attention_chunk: int = 0             # chunked attention (Llama 4): the sequence cut into chunks of
                                         # this many tokens, each query seeing the earlier keys of its
                                         # own chunk; 0 = none
    window_layer_share: float = 1.0      # share of the layers that use the window or the chunks (GPT-OSS
                                         # alternates windowed and full layers: 0.5; Llama 4 chunks 3 of 4);
                                         # the others see every key
    context_parallel: int = 1            # a context-parallel shard: ``seq_len`` local queries of a
                                         # sequence this many times longer (set by the plan's cp)
    context_parallel_comm: str = "p2p"   # how the shard's attention meets the other keys (the plan's
                                         # cp_comm): a ring of steps (p2p, torch), one kernel over the
                                         # gathered keys (all_gather) or over whole sequences (a2a);
                                         # a2a+p2p: a ring of groups of context_parallel_a2a ranks
    context_parallel_a2a: int = 1        # a2a+p2p: ranks of one all-to-all group (the plan's cp_a2a; else 1)
    qk_norm: bool = False                # RMSNorm on each query and key head (Qwen3): 2 x head_dim weights
    # the q and k norms' width (QK_NORM_WIDTHS): each head's (Qwen3, Gemma 3: head_dim weights shared
    # by the heads) | the whole projection's (OLMo 2, OLMoE: q_dim and kv_dim weights; under tensor
    # parallelism its sums of squares are all-reduced over the ranks that split the heads)
    qk_norm_width: str = "head"
    rotary_dim: int = 0                  # rotated width of each query and key head (GPT-NeoX: a quarter);
                                         # 0 = all of it (MLA: its qk_rope_head_dim)
    rope_layer_share: float = 1.0        # share of the attention layers that rotate their queries and
                                         # keys; the others have no position embedding (NoPE: Llama 4's
                                         # and SmolLM3's every fourth layer)
    attention_sinks: bool = False        # one learned sink logit per head (GPT-OSS)
    # multi-head latent attention (DeepSeek-V2/V3); kv_lora_rank 0 = ordinary attention. With MLA,
    # ``head_dim`` is the query/key head width (qk_nope_head_dim + qk_rope_head_dim)
    q_lora_rank: int = 0                 # low-rank query compression (0: full-rank query projection)
    kv_lora_rank: int = 0                # compressed key/value latent width
    qk_rope_head_dim: int = 0            # decoupled rotary part of each query/key head
    v_head_dim: int = 0                  # value head width; 0 means = head_dim
    # mixture of experts; experts 0 = dense. ``ffn_hidden`` is then the FFN of the dense layers
    experts: int = 0                     # routed experts per MoE layer
    top_k: int = 0                       # routed experts per token
    expert_ffn_hidden: int = 0           # FFN width of one routed expert; 0 means = ffn_hidden
    shared_experts: int = 0              # experts every token passes through (DeepSeek)
    shared_expert_ffn_hidden: int = 0    # FFN width of one shared expert; 0 means = expert_ffn_hidden
    shared_expert_gate: bool = False     # the shared experts' output times sigmoid(x·w), one weight
                                         # vector (Qwen3-Next; Megatron-Core --moe-shared-expert-gate)
    dense_layers: int = 0                # the first layers keep a dense FFN (DeepSeek-V3: 3)
    moe_layer_interval: int = 1          # after those, every this-many-th layer is MoE and the others
                                         # dense (Llama 4 Maverick: 2; Hugging Face's
                                         # interleave_moe_layer_step, Megatron-Core's --moe-layer-freq)
    expert_bias: bool = False            # biases on the experts' and router's linear layers (GPT-OSS)
    capacity_factor: float = 0.0         # expert capacity / mean tokens per expert; 0 = dropless
    # group-limited routing (DeepSeek-V3's node-limited routing; Megatron-Core's
    # --moe-router-num-groups / --moe-router-group-topk): the experts in ``router_groups`` equal
    # contiguous groups, each token's top-k taken from its best ``router_group_topk`` groups; 0: none
    router_groups: int = 0
    router_group_topk: int = 0
    # multi-token prediction (DeepSeek-V3 Sec. 2.2, Megatron-Core's --mtp-num-layers): modules after
    # the last layer, each the shared embedding of the next token, two norms, a 2h -> h projection,
    # one more transformer layer, a norm, the shared head and its own loss; 0: none
    mtp_layers: int = 0
    parallel_block: str = ""             # attention and FFN side by side (PARALLEL_BLOCKS); "" sequential
    # hybrid state-space models (Megatron-Core's MambaModel, NeMo's Nemotron-H): one character a
    # layer, each layer one mixer with its pre-norm and residual: M a Mamba-2 mixer, * attention,
    # - an MLP (Megatron-Core's hybrid_override_pattern); "": every layer attention and FFN
    hybrid_pattern: str = ""
    mamba_state: int = 128               # Mamba-2's state size N (mamba_state_dim)
    mamba_head_dim: int = 64             # Mamba-2's head width P (mamba_head_dim)
    mamba_heads: int = 0                 # Mamba-2 heads (mamba_num_heads); 0 means = 2 x hidden / mamba_head_dim
    mamba_groups: int = 8                # groups sharing B and C (mamba_num_groups)
    mamba_conv: int = 4                  # the causal depthwise convolution's width (d_conv)
    mamba_chunk: int = 128               # the SSD scan's chunk length Q (MambaMixer chunk_size)
    # Gated DeltaNet linear attention (Qwen3-Next; Megatron-Core 0.16 ssm/gated_delta_net.py): of
    # every ``linear_attention_interval`` layers N, N - 1 run a Gated DeltaNet mixer and the last
    # full attention (Megatron-Core's linear_attention_freq); 0 or 1: none; -1: every layer (the
    # one-kind view phaze.step.layer_mix takes of the linear layers)
    linear_attention_interval: int = 0
    linear_key_heads: int = 16           # linear_num_key_heads
    linear_value_heads: int = 32         # linear_num_value_heads
    linear_key_head_dim: int = 128       # linear_key_head_dim
    linear_value_head_dim: int = 128     # linear_value_head_dim
    linear_conv: int = 4                 # linear_conv_kernel_dim
    linear_chunk: int = 64               # fla's chunk_gated_delta_rule chunk length
    attention_output_gate: bool = False  # a sigmoid gate on the attention's output (Qwen3-Next), its
                                         # width from a query projection twice as wide
    # Gemma 2's additions (Gemma Team 2024, arXiv:2408.00118, Sec. 2): a norm after the attention's
    # and after the FFN's output as well as before them (four a layer), and tanh soft-capping,
    # c·tanh(x/c), of the attention scores and of the final logits; 0 = none
    sandwich_norm: bool = False
    attention_softcap: float = 0.0
    logit_softcap: float = 0.0
    # products with a constant that run as kernels of their own (Hugging Face's eager modules), each
    # reading and writing its tensor once, forward and backward: the embedding's output (Gemma's
    # times sqrt(hidden), Granite's embedding_multiplier), each branch's output before its residual
    # add (Granite's residual_multiplier), the logits before the loss (Cohere's logit_scale,
    # Granite's logits_scaling), the final hidden states before the output head (MiniCPM3's
    # hidden_states / logits_scaling)
    embedding_scale: bool = False
    residual_scale: bool = False
    logit_scale: bool = False
    head_scale: bool = False
    qk_norm_per_head: bool = False       # the q and k norms hold a weight vector per head (Cohere), not one
    # a weightless L2 norm of each query and key head in the layers with a rotary embedding (Llama 4
    # Scout: use_qk_norm, Llama4TextL2Norm in transformers and Meta's llama-models, applied where the
    # layer rotates; Megatron-Core's L2Norm layer spec runs it in every layer, a quarter more of a
    # small kernel for Scout, not costed)
    qk_l2_norm: bool = False
    # share of the attention layers whose queries are multiplied by a factor of their position in a
    # kernel of their own, after the rotary embedding (Llama 4's attn_temperature_tuning in its NoPE
    # layers; Mistral 4's and Ministral 3's llama_4_scaling_beta in every layer); the factors, one a
    # token, are not costed
    query_scale_share: float = 0.0
    notes: tuple[str, ...] = field(default=(), compare=False)  # what was assumed in reading it

    def __post_init__(self):
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.max_positions == 0 and self.position_embedding == "learned":
            object.__setattr__(self, "max_positions", self.seq_len)
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if self.mamba_heads == 0:
            object.__setattr__(self, "mamba_heads", 2 * self.hidden // self.mamba_head_dim)

    # --- derived shapes -------------------------------------------------------------------
    @property
    def causal(self) -> bool:
        return self.architecture == "decoder"

    @property
    def q_dim(self) -> int:
        """Width of the query projection (heads x head_dim)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection."""
        return self.kv_heads * self.head_dim

    @property
    def o_dim(self) -> int:
        """Width of the attention output (heads x value head width), the out-projection's input."""
        return self.heads * self.v_head_dim

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def hybrid(self) -> bool:
        """Layers of more than the transformer's one kind (:attr:`hybrid_pattern`)."""
        return bool(self.hybrid_pattern)

    @property
    def layer_kind(self) -> str:
        """The one kind of every layer: '' a transformer layer (attention and FFN), else the
        pattern's character ('M', '*' or '-'); a pattern of several kinds has none (None)."""
        kinds = set(self.hybrid_pattern)
        return (kinds.pop() if len(kinds) == 1 else None) if kinds else ""

    @property
    def hybrid_counts(self) -> dict[str, int]:
        """Layers of each kind of a hybrid pattern, in the order M, *, - (those present)."""
        return {k: self.hybrid_pattern.count(k) for k in HYBRID_KINDS if k in self.hybrid_pattern}

    @property
    def attention_layers(self) -> int:
        """Layers with attention: all of a transformer's, a hybrid's '*' layers."""
        return self.hybrid_pattern.count("*") if self.hybrid else self.layers

    @property
    def has_ffn(self) -> bool:
        """Whether any layer has an FFN (dense or experts): every transformer, a hybrid with '-' or
        'E' layers (tensor parallelism must then split the FFN width)."""
        return not self.hybrid or bool({"-", "E"} & set(self.hybrid_pattern))

    @property
    def gdn_layers(self) -> int:
        """Layers running a Gated DeltaNet mixer (:attr:`linear_attention_interval`)."""
        n = self.linear_attention_interval
        return self.layers if n == -1 else self.layers - self.layers // n if n >= 2 else 0

    @property
    def gdn_qk_dim(self) -> int:
        """The Gated DeltaNet mixer's query (and key) width: key heads x their width."""
        return self.linear_key_heads * self.linear_key_head_dim

    @property
    def gdn_v_dim(self) -> int:
        """The Gated DeltaNet mixer's value (and gate, and output) width."""
        return self.linear_value_heads * self.linear_value_head_dim

    @property
    def gdn_in_width(self) -> int:
        """The Gated DeltaNet input projection's output: q, k, v, the gate z, b and a."""
        return 2 * self.gdn_qk_dim + 2 * self.gdn_v_dim + 2 * self.linear_value_heads

    @property
    def gdn_params(self) -> int:
        """Parameters of one Gated DeltaNet mixer (Megatron-Core's GatedDeltaNet): the input
        projection, the depthwise convolution over q, k and v (no bias), dt_bias and A_log (one a
        value head), the gated norm's weight (one value head wide) and the output projection."""
        qk, v = self.gdn_qk_dim, self.gdn_v_dim
        return (self.hidden * self.gdn_in_width + (2 * qk + v) * self.linear_conv + 2 * self.linear_value_heads
                + self.linear_value_head_dim + v * self.hidden)

    @property
    def mamba_inner(self) -> int:
        """Mamba-2's inner width d_inner (heads x head width): x, z and the output's."""
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_in_width(self) -> int:
        """Mamba-2's input projection's output: z, x, B, C and dt (2·d_inner + 2·G·N + heads)."""
        return 2 * self.mamba_inner + 2 * self.mamba_groups * self.mamba_state + self.mamba_heads

    @property
    def mamba_conv_width(self) -> int:
        """Channels of the depthwise convolution: x, B and C (d_inner + 2·G·N)."""
        return self.mamba_inner + 2 * self.mamba_groups * self.mamba_state

    @property
    def moe_layers(self) -> int:
        """Layers whose FFN is a mixture of experts: after the ``dense_layers``, the last of each
        ``moe_layer_interval`` layers (Hugging Face's Llama 4 and Qwen3-MoE; Megatron-Core's
        integer --moe-layer-freq takes the first, the same count when the interval divides the
        layers; the cost model needs only the count); a hybrid's 'E' layers."""
        if self.hybrid:
            return self.hybrid_pattern.count("E") if self.moe else 0
        return (self.layers - self.dense_layers) // self.moe_layer_interval if self.moe else 0

    @property
    def dense_ffn_layers(self) -> int:
        """Layers whose FFN is dense (all of a dense model's)."""
        return self.layers - self.moe_layers

    @property
    def fp8_fused(self) -> bool:
        """An fp8 run under Transformer Engine's modules in Megatron-Core's layer spec (``fp8_casts``
        fused, or unset): its norms write fp8 for the linears after them, and it casts the weights
        once a step and keeps the casts."""
        return self.precision == "fp8" and self.fp8_casts not in ("separate", "te-linear")

    @property
    def fp8_saved_inputs(self) -> bool:
        """An fp8 run whose linears keep an fp8 copy of their input for the backward, not the
        16-bit tensor (Transformer Engine's modules: ``fp8_casts`` fused or te-linear)."""
        return self.precision == "fp8" and self.fp8_casts != "separate"

    @property
    def local_attention(self) -> int:
        """Keys a query of a windowed or chunked layer reaches back at most (0: every earlier key)."""
        return self.sliding_window or self.attention_chunk

    @property
    def expert_ffn(self) -> int:
        return self.expert_ffn_hidden or self.ffn_hidden

    @property
    def shared_ffn(self) -> int:
        return self.shared_expert_ffn_hidden or self.expert_ffn

    @property
    def bytes_per_element(self) -> int:
        """Bytes of one activation or weight element in the compute precision (fp8 keeps
        activations that cross kernels in 16-bit, as Transformer Engine does)."""
        return 2 if self.precision == "fp8" else BYTES_PER_ELEMENT[self.precision]

    @property
    def gated(self) -> bool:
        """A gated FFN (SwiGLU, GeGLU): the first linear makes a gate and a value, multiplied."""
        return self.activation in GATED_ACTIVATIONS

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.gated else 2

    # --- parameter counts -----------------------------------------------------------------
    @property
    def norm_tensors(self) -> int:
        """Parameter tensors of one norm (:attr:`norm_affine`; by default a weight, and a LayerNorm's
        bias when the model has biases)."""
        if self.norm_affine:
            return NORM_AFFINES.index(self.norm_affine)
        return 2 if self.norm == "layernorm" and self.bias else 1

    @property
    def norm_params(self) -> int:
        return self.hidden * self.norm_tensors

    @property
    def layer_norms(self) -> int:
        """Norms in one layer: one before the attention, one before the FFN, unless a parallel
        block's single norm feeds both; a sandwich (Gemma 2) one after each as well."""
        if self.sandwich_norm:
            return 4
        return 1 if self.parallel_block == "shared_norm" else 2

    @property
    def qk_norm_params(self) -> int:
        """Weights of one layer's q and k norms (:attr:`qk_norm_width`): two head widths, or the
        query and key projections' widths."""
        if not self.qk_norm:
            return 0
        if self.qk_norm_width == "projection" or self.qk_norm_per_head:
            return self.q_dim + self.kv_dim
        return 2 * self.head_dim

    @property
    def attention_params(self) -> int:
        """Parameters of one layer's attention; with Gated DeltaNet layers, the mean over the
        layers of the Gated DeltaNet mixers' and the full attention's."""
        if self.gdn_layers:
            full = replace(self, linear_attention_interval=0).attention_params
            return (self.gdn_layers * self.gdn_params + (self.layers - self.gdn_layers) * full) / self.layers
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        extra = (self.qk_norm_params + (self.heads if self.attention_sinks else 0)
                 + (q * h if self.attention_output_gate else 0))
        if self.mla:
            return self.mla_params + extra
        weights = h * (q + 2 * kv) + q * h
        if self.bias:
            return weights + q + 2 * kv + h + extra
        return weights + ((q + 2 * kv) if self.qkv_bias else 0) + extra

    @property
    def mla_params(self) -> int:
        """Multi-head latent attention (DeepSeek-V3): query down/up projections with a norm between
        (or a full-rank query projection), the joint key/value latent plus the shared rotary key,
        its norm, the key/value up-projection and the output projection."""
        h, a, qk, v = self.hidden, self.heads, self.head_dim, self.v_head_dim
        nope = qk - self.qk_rope_head_dim
        r_q, r_kv = self.q_lora_rank, self.kv_lora_rank
        query = (h * r_q + r_q + r_q * a * qk) if r_q else h * a * qk
        return query + h * (r_kv + self.qk_rope_head_dim) + r_kv + r_kv * a * (nope + v) + a * v * h

    def _ffn(self, f: int, bias: bool) -> int:
        return self.ffn_matrices * self.hidden * f + (((self.ffn_matrices - 1) * f + self.hidden) if bias else 0)

    @property
    def ffn_params(self) -> int:
        """Parameters of a dense layer's FFN."""
        return self._ffn(self.ffn_hidden, self.bias)

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (a gated or plain FFN of ``expert_ffn`` width)."""
        return self._ffn(self.expert_ffn, self.bias or self.expert_bias)

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts + (self.experts if self.bias or self.expert_bias else 0)

    @property
    def shared_expert_params(self) -> int:
        """Parameters of the shared experts of one MoE layer (and their gate's weight vector)."""
        return (self.shared_experts * self._ffn(self.shared_ffn, self.bias or self.expert_bias)
                + (self.hidden if self.shared_expert_gate else 0))

    @property
    def mamba_params(self) -> int:
        """Parameters of one Mamba-2 mixer (Megatron-Core's MambaMixer): the input projection, the
        depthwise convolution with its bias, A_log, D and dt_bias (one each a head), the gated
        RMSNorm's weight and the output projection; no other bias."""
        d = self.mamba_inner
        return (self.hidden * self.mamba_in_width + self.mamba_conv_width * (self.mamba_conv + 1)
                + 3 * self.mamba_heads + d + d * self.hidden)

    @property
    def kind_params(self) -> dict[str, int]:
        """Parameters of one layer of each hybrid kind, its pre-norm included (E: the router, the
        routed and shared experts)."""
        return {"M": self.mamba_params + self.norm_params, "*": self.attention_params + self.norm_params,
                "-": self.ffn_params + self.norm_params, "E": self.moe_ffn_params + self.norm_params}

    @property
    def moe_ffn_params(self) -> int:
        """Parameters of one MoE layer's FFN: the router, the routed and the shared experts (0 for a
        dense model)."""
        if not self.moe:
            return 0
        return self.router_params + self.experts * self.expert_params + self.shared_expert_params

    @property
    def dense_layer_params(self) -> int:
        """Parameters of one dense transformer layer (attention, FFN, its norms); a hybrid's, the
        mean over its kinds."""
        if self.hybrid:
            kinds = self.kind_params
            return sum(n * kinds[k] for k, n in self.hybrid_counts.items()) / self.layers
        return self.attention_params + self.ffn_params + self.layer_norms * self.norm_params

    @property
    def moe_layer_params(self) -> int:
        """Parameters of one MoE layer (attention, router, routed and shared experts, two norms; a
        hybrid's 'E' layer, the experts and one norm)."""
        if self.hybrid:
            return self.kind_params["E"]
        return self.attention_params + self.moe_ffn_params + self.layer_norms * self.norm_params

    @property
    def layer_params(self) -> float:
        """Parameters of one transformer layer (attention, FFN, two norms); for a mixture of
        experts, the mean over its dense and MoE layers."""
        if not self.moe or self.hybrid:     # a hybrid's: the mean over its kinds, 'E' included
            return self.dense_layer_params
        return (self.dense_ffn_layers * self.dense_layer_params + self.moe_layers * self.moe_layer_params) / self.layers

    @property
    def expert_layer_params(self) -> float:
        """Routed-expert parameters per layer (mean over the layers): the part sharded over expert
        parallelism and reduced over the expert data-parallel group; the rest of a layer is dense."""
        return self.moe_layers * self.experts * self.expert_params / self.layers if self.moe else 0.0

    @property
    def table_params(self) -> int:
        """Parameters of the token table (vocabulary x embedding width): the embedding's, and a
        tied head's or a pipeline's last-stage copy."""
        return self.vocab * (self.embedding_projection_dim or self.hidden)

    @property
    def embedding_params(self) -> int:
        """Token (+ position, segment, projection) embeddings and the embedding norm."""
        h = self.hidden
        e = self.embedding_projection_dim or h
        n = self.table_params
        if e != h:
            n += 2 * e * h  # project_in and project_out, no bias (OPT)
        if self.position_embedding == "learned":
            n += self.max_positions * h
        n += self.token_types * h
        if self.embedding_norm:
            n += self.norm_params
        return n

    @property
    def head_params(self) -> int:
        """Final norm, untied LM head, and the encoder's pooler and MLM transform."""
        h = self.hidden
        n = self.norm_params if self.norm_position == "pre" else 0
        if not self.tied_embeddings:
            n += self.table_params
        if self.architecture == "encoder":
            n += (h * h + h)                      # pooler
            n += (h * h + h) + self.norm_params   # MLM transform dense + norm
            n += self.vocab                       # MLM output bias
        return n

    @property
    def rotated_width(self) -> int:
        """The rotated width of each query and key head: 0 without a rotary embedding; MLA rotates
        its decoupled ``qk_rope_head_dim`` only."""
        if self.position_embedding != "rotary":
            return 0
        return self.qk_rope_head_dim if self.mla else min(self.rotary_dim or self.head_dim, self.head_dim)

    @property
    def biased_linears(self) -> frozenset:
        """The linear layers (as the layer graph names them) that carry a bias: every one with
        ``bias``, the q, k, v projection with ``qkv_bias``, the router and experts with
        ``expert_bias``."""
        names = set()
        if self.bias:
            names |= {"qkv", "attn_out", "ffn_up", "ffn_down", "q_down", "q_up", "kv_down", "kv_up"}
        if self.bias or self.qkv_bias:
            names.add("qkv")
        if self.bias or self.expert_bias:
            names |= {"router", "expert_up", "expert_down", "shared_up", "shared_down"}
        return frozenset(names)

    # --- parameter tensors (the per-tensor kernels of an eager optimizer) ---------------------
    def layer_tensors(self, experts: float | None = None, hooked: bool = False) -> float:
        """Parameter tensors of one layer as Megatron lays them out (one fused qkv weight, one
        gated FFN weight), with ``experts`` routed experts held (default all); for a mixture of
        experts the mean over its dense and MoE layers. ``hooked``: only those whose gradient
        a weight-gradient GEMM does not add into the main gradients under gradient-accumulation
        fusion (norms, biases and the router, a plain matmul in Megatron-Core)."""
        def linear(biased: bool) -> int:
            return (1 if biased else 0) + (0 if hooked else 1)
        norm = self.norm_tensors
        if self.hybrid:   # M: norm, in_proj, conv weight and bias, A_log, D, dt_bias, gated norm, out_proj
            kinds = {"M": norm + 6 + 2 * linear(False),
                     "*": norm + 2 * linear(self.bias or self.qkv_bias), "-": norm + 2 * linear(self.bias),
                     "E": norm + self._moe_tensors(experts, linear)}
            return sum(n * kinds[k] for k, n in self.hybrid_counts.items()) / self.layers
        n = self.layer_norms * norm + (2 if self.qk_norm else 0) + (1 if self.attention_sinks else 0)
        if self.mla:   # q down (or full), q norm, q up, kv down, kv norm, kv up, output
            n += ((2 * linear(self.bias) + norm) if self.q_lora_rank else linear(self.bias))
            n += 2 * linear(self.bias) + norm + linear(self.bias)
        else:
            n += linear(self.bias or self.qkv_bias) + linear(self.bias)
        dense = 2 * linear(self.bias)
        if not self.moe:
            return n + dense
        moe = self._moe_tensors(experts, linear)
        return n + (self.dense_ffn_layers * dense + self.moe_layers * moe) / self.layers

    def _moe_tensors(self, experts: float | None, linear) -> float:
        """An MoE FFN's tensors for :meth:`layer_tensors`: the router, ``experts`` routed experts
        (default all), the shared experts and their gate."""
        if not self.moe:
            return 0.0
        b = self.bias or self.expert_bias
        held = self.experts if experts is None else experts
        router = 2 if b else 1
        return (router + held * 2 * linear(b) + (2 * linear(b) if self.shared_experts else 0)
                + (1 if self.shared_expert_gate else 0))   # the gate's weight: a plain matmul, hooked

    @property
    def embedding_tensors(self) -> int:
        """Parameter tensors of the embedding stage's tables, projections and norm."""
        e = self.embedding_projection_dim or self.hidden
        return (1 + (2 if e != self.hidden else 0) + (1 if self.position_embedding == "learned" else 0)
                + (1 if self.token_types else 0)
                + (self.norm_tensors if self.embedding_norm else 0))

    @property
    def head_tensors(self) -> int:
        """Parameter tensors of the final norm, an untied head and an encoder's pooler and MLM head."""
        norm = self.norm_tensors
        n = (norm if self.norm_position == "pre" else 0) + (0 if self.tied_embeddings else 1)
        if self.architecture == "encoder":
            n += 2 + 2 + norm + 1
        return n

    @property
    def mtp_module_params(self) -> int:
        """Parameters of one multi-token prediction module beside its transformer layer and the
        shared embedding and head: the 2h -> h projection (no bias) and three norms (Megatron-Core
        ``MultiTokenPredictionLayer``: enorm, hnorm, final_layernorm)."""
        return 2 * self.hidden * self.hidden + 3 * self.norm_params

    @property
    def mtp_params(self) -> int:
        """Parameters the multi-token prediction modules add (each a layer of the repeated kind,
        a mixture of experts' when the model has experts, and :attr:`mtp_module_params`); not in
        :attr:`params`, as published counts leave them out (DeepSeek-V3's 671B)."""
        layer = self.moe_layer_params if self.moe else self.dense_layer_params
        return self.mtp_layers * (layer + self.mtp_module_params)

    @property
    def params(self) -> int:
        """Total trainable parameters of the main model (multi-token prediction:
        :attr:`mtp_params`)."""
        layers = self.dense_ffn_layers * self.dense_layer_params + self.moe_layers * self.moe_layer_params
        if self.hybrid:
            kinds = self.kind_params
            layers = sum(n * kinds[k] for k, n in self.hybrid_counts.items())
        # a whole count (Gated DeltaNet layers' attention is a mean over the layers, a float)
        return round(layers + self.embedding_params + self.head_params)

    @property
    def active_params(self) -> int:
        """Parameters one token's forward pass uses: ``params`` with only ``top_k`` of the routed
        experts of each MoE layer (both embedding tables counted, as Mistral and Qwen count them)."""
        if not self.moe:
            return self.params
        return round(self.params - self.moe_layers * (self.experts - self.top_k) * self.expert_params)


# --- closed-form FLOP counts (used as independent checks on the operator graphs) -------------
def narayanan_flops_per_step(model: Model, global_batch: int, full_recompute: bool = False) -> float:
    """FLOPs of one training step by Narayanan et al. (SC'21), eq. (3): GPT with h_ffn = 4h,
    non-causal attention; ``full_recompute`` adds the second forward pass."""
    B, s, l, h, V = global_batch, model.seq_len, model.layers, model.hidden, model.vocab
    if full_recompute:
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


# --- loading --------------------------------------------------------------------------------
# a Hugging Face config's activation (hidden_act, hidden_activation or activation_function), by
# whether its type's FFN is gated (_HF_GATED) or not
_GELUS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_python", "gelu_accurate")
# (relu2, squared ReLU, costed as ReLU, as the Nemotron workloads are: the same two matrices and
# one element-wise op)
_ACTIVATIONS = {**dict.fromkeys(_GELUS, "gelu"), "relu": "relu", "relu2": "relu"}
_GATED = {**dict.fromkeys(_GELUS, "geglu"), "silu": "swiglu", "swish": "swiglu", "swiglu": "swiglu"}


def _model_from_yaml(data: dict, source: str) -> Model:
    f = Fields(data, source)
    name = f.str("name")
    architecture = f.choice("architecture", ("decoder", "encoder"), "decoder")
    layers, hidden, heads = f.int("layers"), f.int("hidden"), f.int("heads")
    kv_heads = f.int("kv_heads", heads)
    head_dim = f.int("head_dim", 0, minimum=0)
    if not head_dim and hidden % heads:
        raise f.error("heads", f"must divide hidden ({hidden}) unless head_dim is given, got {heads}")
    if heads % kv_heads:
        raise f.error("kv_heads", f"must divide heads ({heads}), got {kv_heads}")
    position = f.choice("position_embedding", ("learned", "rotary", "alibi", "none"), "learned")
    model = Model(
        name=name, architecture=architecture, layers=layers, hidden=hidden, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim,
        ffn_hidden=f.int("ffn_hidden"),
        activation=f.choice("activation", ACTIVATIONS, "gelu"),
        vocab=f.int("vocab"), seq_len=f.int("seq_len"),
        position_embedding=position,
        max_positions=f.int("max_positions", 0, minimum=0),
        tied_embeddings=f.bool("tied_embeddings", True),
        norm=f.choice("norm", ("layernorm", "rmsnorm"), "layernorm"),
        norm_position=f.choice("norm_position", ("pre", "post"), "pre"),
        norm_affine=f.choice("norm_affine", NORM_AFFINES, ""),
        bias=f.bool("bias", True),
        qkv_bias=f.bool("qkv_bias", False),
        dropout=f.bool("dropout", True),
        embedding_norm=f.bool("embedding_norm", architecture == "encoder"),
        embedding_projection_dim=f.int("embedding_projection_dim", 0, minimum=0),
        token_types=f.int("token_types", 0, minimum=0),
        precision=f.choice("precision", PRECISIONS, "bf16"),
        fp8_casts=f.choice("fp8_casts", FP8_CASTS, ""),
        bias_kernels=f.choice("bias_kernels", BIAS_KERNELS, ""),
        rotary_kernels=f.choice("rotary_kernels", ROTARY_KERNELS, ""),
        kv_repeat=f.choice("kv_repeat", KV_REPEATS, ""),
        softmax_kernel=f.choice("softmax_kernel", SOFTMAX_KERNELS, ""),
        recompute_rerun=f.choice("recompute_rerun", RECOMPUTE_RERUN, ""),
        qk_norm=f.bool("qk_norm", False),
        qk_norm_width=f.choice("qk_norm_width", QK_NORM_WIDTHS, "head"),
        rotary_dim=f.int("rotary_dim", 0, minimum=0),
        rope_layer_share=f.number("rope_layer_share", 1.0, minimum=0.0, maximum=1.0, inclusive=True),
        attention_sinks=f.bool("attention_sinks", False),
        sliding_window=f.int("sliding_window", 0, minimum=0),
        attention_chunk=f.int("attention_chunk", 0, minimum=0),
        window_layer_share=f.number("window_layer_share", 1.0, minimum=0.0, maximum=1.0, inclusive=True),
        q_lora_rank=f.int("q_lora_rank", 0, minimum=0),
        kv_lora_rank=f.int("kv_lora_rank", 0, minimum=0),
        qk_rope_head_dim=f.int("qk_rope_head_dim", 0, minimum=0),
        v_head_dim=f.int("v_head_dim", 0, minimum=0),
        experts=f.int("experts", 0, minimum=0),
        top_k=f.int("top_k", 0, minimum=0),
        expert_ffn_hidden=f.int("expert_ffn_hidden", 0, minimum=0),
        shared_experts=f.int("shared_experts", 0, minimum=0),
        shared_expert_ffn_hidden=f.int("shared_expert_ffn_hidden", 0, minimum=0),
        shared_expert_gate=f.bool("shared_expert_gate", False),
        dense_layers=f.int("dense_layers", 0, minimum=0),
        moe_layer_interval=f.int("moe_layer_interval", 1, minimum=1),
        expert_bias=f.bool("expert_bias", False),
        capacity_factor=f.number("capacity_factor", 0.0, minimum=0.0, inclusive=True),
        router_groups=f.int("router_groups", 0, minimum=0),
        router_group_topk=f.int("router_group_topk", 0, minimum=0),
        mtp_layers=f.int("mtp_layers", 0, minimum=0),
        parallel_block=f.choice("parallel_block", PARALLEL_BLOCKS, ""),
        hybrid_pattern=f.str("hybrid_pattern", ""),
        mamba_state=f.int("mamba_state", 128),
        mamba_head_dim=f.int("mamba_head_dim", 64),
        mamba_heads=f.int("mamba_heads", 0, minimum=0),
        mamba_groups=f.int("mamba_groups", 8),
        mamba_conv=f.int("mamba_conv", 4),
        mamba_chunk=f.int("mamba_chunk", 128),
        linear_attention_interval=f.int("linear_attention_interval", 0, minimum=0),
        linear_key_heads=f.int("linear_key_heads", 16),
        linear_value_heads=f.int("linear_value_heads", 32),
        linear_key_head_dim=f.int("linear_key_head_dim", 128),
        linear_value_head_dim=f.int("linear_value_head_dim", 128),
        linear_conv=f.int("linear_conv", 4),
        linear_chunk=f.int("linear_chunk", 64),
        attention_output_gate=f.bool("attention_output_gate", False),
        sandwich_norm=f.bool("sandwich_norm", False),
        attention_softcap=f.number("attention_softcap", 0.0, minimum=0.0, inclusive=True),
        logit_softcap=f.number("logit_softcap", 0.0, minimum=0.0, inclusive=True),
        embedding_scale=f.bool("embedding_scale", False),
        residual_scale=f.bool("residual_scale", False),
        logit_scale=f.bool("logit_scale", False),
        head_scale=f.bool("head_scale", False),
        qk_norm_per_head=f.bool("qk_norm_per_head", False),
        qk_l2_norm=f.bool("qk_l2_norm", False),
        query_scale_share=f.number("query_scale_share", 0.0, minimum=0.0, maximum=1.0, inclusive=True),
    )
    f.str("source", None)           # provenance note, free text
    f.int("published_params", None)  # the published count the tests compare against
    f.int("published_active_params", None)  # published parameters active per token (MoE)
    f.finish()
    return check_model(model, source)


def check_model(model: Model, source: str) -> Model:
    """``model`` if phaze can cost what it combines, else one line naming the workload key that cannot
    be (a workload file's, or for a Hugging Face config, the key phaze read its value into)."""
    _check_moe(model, source)
    if model.norm_affine == "weight_bias" and model.norm != "layernorm":
        raise ConfigError(source, "norm_affine", f"weight_bias is a LayerNorm's; an RMSNorm has a weight, got "
                                                 f"norm {model.norm}; allowed: none, weight")
    if model.qk_l2_norm and (model.mla or not model.rotated_width):
        raise ConfigError(source, "qk_l2_norm", "needs a rotary embedding (it norms the rotated layers' heads), "
                                                "without MLA; allowed otherwise: false")
    if model.qk_norm_per_head and (not model.qk_norm or model.mla):
        raise ConfigError(source, "qk_norm_per_head", "needs qk_norm, without MLA; allowed otherwise: false")
    if model.qk_norm_width != "head" and (not model.qk_norm or model.mla):
        raise ConfigError(source, "qk_norm_width", f"{model.qk_norm_width!r} needs qk_norm, without MLA; "
                                                   f"allowed otherwise: head")
    if model.sliding_window and model.attention_chunk:
        raise ConfigError(source, "attention_chunk", f"a layer's attention is windowed or chunked, not both; "
                                                     f"got sliding_window {model.sliding_window} as well")
    bad = mtp_error(model)
    if bad:
        raise ConfigError(source, "mtp_layers", bad)
    bad = parallel_block_error(model)
    if bad:
        raise ConfigError(source, "parallel_block", bad)
    bad = sandwich_error(model)
    if bad:
        raise ConfigError(source, "sandwich_norm", bad)
    bad = residual_scale_error(model)
    if bad:
        raise ConfigError(source, "residual_scale", bad)
    bad, message = hybrid_error(model)
    if bad:
        raise ConfigError(source, bad, message)
    if model.position_embedding == "learned" and model.max_positions < model.seq_len:
        raise ConfigError(source, "seq_len", f"must be <= max_positions ({model.max_positions}) "
                                             f"with learned positions, got {model.seq_len}")
    if model.rotary_dim and (model.rotary_dim > model.head_dim or model.rotary_dim % 2):
        raise ConfigError(source, "rotary_dim", f"must be an even width up to head_dim ({model.head_dim}), "
                                                f"got {model.rotary_dim}")
    if model.rope_layer_share < 1 and model.position_embedding != "rotary":
        raise ConfigError(source, "rope_layer_share", f"is the share of the layers with a rotary embedding; "
                                                      f"allowed below 1 only with position_embedding rotary, "
                                                      f"got {model.position_embedding}")
    return model


def mtp_error(model: Model) -> str:
    """Why ``model``'s multi-token prediction cannot be costed ('' when it can)."""
    if not model.mtp_layers:
        return ""
    if model.mtp_layers > model.layers:
        return (f"must be at most the model's layers ({model.layers}): each multi-token prediction module "
                f"is a layer of its own (DeepSeek-V3 trains one), got {model.mtp_layers}; allowed: 0-{model.layers}")
    if not model.causal:
        return f"needs a decoder (multi-token prediction predicts later tokens), got architecture {model.architecture}"
    if model.embedding_projection_dim and model.embedding_projection_dim != model.hidden:
        return ("not modelled with a factorised embedding (embedding_projection_dim): Megatron-Core's "
                "modules share an embedding of the hidden width")
    if model.logit_softcap:
        return "not modelled with soft-capped logits (logit_softcap): no model trains both; allowed: 0"
    if model.logit_scale or model.head_scale:
        key = "logit_scale" if model.logit_scale else "head_scale"
        return f"not modelled with a scaled head ({key}): no model trains both; allowed: false"
    return ""


def residual_scale_error(model: Model) -> str:
    """Why ``model``'s scaled residual branches cannot be costed ('' when they can): they are
    modelled for a pre-norm decoder's sequential layers (Granite)."""
    what = model.residual_scale and _first_feature(model, "parallel_block", "hybrid", "post", "encoder")
    return (f"not modelled with {what}: a branch scaled before its residual add is costed for a pre-norm "
            f"decoder's sequential layers (Granite); allowed: false") if what else ""


def _first_feature(model: Model, *names: str) -> str:
    """The first of the features ``names`` that ``model`` has, in words ('' for none): what a
    layer addition modelled only for a pre-norm decoder's dense layers is refused with."""
    features = {"moe": (model.moe, "a mixture of experts"), "mla": (model.mla, "multi-head latent attention"),
                "parallel_block": (model.parallel_block, "a parallel block"),
                "hybrid": (model.hybrid, "hybrid layers"), "gdn": (model.gdn_layers, "Gated DeltaNet layers"),
                "post": (model.norm_position == "post", "post-norm layers"),
                "encoder": (not model.causal, "an encoder"), "mtp": (model.mtp_layers, "multi-token prediction")}
    return next((what for on, what in map(features.__getitem__, names) if on), "")


def parallel_block_error(model: Model) -> str:
    """Why ``model``'s parallel block cannot be costed ('' when it can): it is modelled for a
    pre-norm decoder's dense layers with ordinary attention projections."""
    what = model.parallel_block and _first_feature(model, "moe", "mla", "post", "encoder", "mtp")
    return (f"not modelled with {what}: a parallel block is costed for a pre-norm decoder's dense layers (GPT-J, "
            f"GPT-NeoX, PaLM, Falcon); allowed: blank (a sequential layer)") if what else ""


def sandwich_error(model: Model) -> str:
    """Why ``model``'s norms after the attention and the FFN cannot be costed ('' when they can):
    they are modelled for a pre-norm decoder's sequential layers, dense or with experts (Gemma 2 and
    3; AfMoE), with ordinary attention."""
    what = model.sandwich_norm and _first_feature(model, "mla", "parallel_block", "hybrid", "gdn", "post", "mtp")
    return (f"not modelled with {what}: norms after the attention and the FFN are costed for a pre-norm decoder's "
            f"sequential layers with ordinary attention (Gemma 2 and 3, AfMoE); allowed: false") if what else ""


def hybrid_views(model: Model) -> tuple[tuple[float, Model], ...]:
    """A hybrid's layers of each kind as a model of that kind alone (its pattern that kind
    repeated), with the kind's share of the layers; a kind other than 'E' without the experts."""
    return tuple((n / model.layers, replace(model if k == "E" else dense_view(model), hybrid_pattern=k * model.layers))
                 for k, n in model.hybrid_counts.items())


def dense_view(model: Model) -> Model:
    """A mixture of experts' dense layers (DeepSeek-V3's first three, every other one of Llama 4
    Maverick's, a hybrid's layers other than 'E') as a dense model."""
    return replace(model, experts=0, top_k=0, shared_experts=0, dense_layers=0, expert_ffn_hidden=0,
                   shared_expert_ffn_hidden=0, moe_layer_interval=1)


def gdn_views(model: Model) -> tuple[tuple[float, Model], ...]:
    """A model with Gated DeltaNet layers beside full attention as its two kinds alone (every
    layer Gated DeltaNet, every layer full attention), each with its share of the layers; ()
    for a model of one kind."""
    if not model.gdn_layers or model.linear_attention_interval == -1:
        return ()
    w = model.gdn_layers / model.layers
    return ((w, replace(model, linear_attention_interval=-1)), (1 - w, replace(model, linear_attention_interval=0)))


def hybrid_error(model: Model) -> tuple[str, str]:
    """(field, what is allowed) when ``model``'s hybrid layers cannot be costed, else ("", ""): a
    pattern of M, * , - and E as long as the layers (experts exactly when there are E layers),
    Mamba-2 heads that the groups divide, in a pre-norm decoder without MLA, a parallel block or
    multi-token prediction (Megatron-Core's MambaModel has none of them)."""
    pattern = model.hybrid_pattern
    if not pattern:
        return "", ""
    odd = sorted(set(pattern) - set(HYBRID_KINDS))
    if odd:
        return "hybrid_pattern", (f"one character a layer: M (Mamba-2), * (attention), - (MLP) or E (mixture of "
                                  f"experts); got {''.join(odd)!r}")
    if len(pattern) != model.layers:
        return "hybrid_pattern", f"must have one character a layer ({model.layers}), got {len(pattern)}"
    if ("E" in pattern) != model.moe:
        return ("experts", "must be > 0 with E (mixture-of-experts) layers in hybrid_pattern, and 0 without them "
                           f"(got {model.experts} experts and {pattern.count('E')} E layers)")
    what = ("dense_layers or moe_layer_interval (its E layers are the MoE ones)"
            if model.dense_layers or model.moe_layer_interval != 1
            else _first_feature(model, "mla", "parallel_block", "mtp", "post", "encoder"))
    if what:
        return "hybrid_pattern", (f"not modelled with {what}: a hybrid is costed as Megatron-Core's "
                                  f"MambaModel, a pre-norm decoder of Mamba-2, attention, MLP and MoE layers")
    for name in ("mamba_state", "mamba_head_dim", "mamba_groups", "mamba_conv", "mamba_chunk"):
        if getattr(model, name) < 1:
            return name, f"must be >= 1, got {getattr(model, name)}"
    if model.mamba_heads % model.mamba_groups:
        return "mamba_groups", f"must divide the Mamba-2 heads ({model.mamba_heads}), got {model.mamba_groups}"
    return "", ""


def _check_moe(model: Model, source: str) -> None:
    """One clear error for an inconsistent mixture of experts."""
    if not model.moe:
        if (model.top_k or model.shared_experts or model.router_groups or model.router_group_topk
                or model.moe_layer_interval != 1):
            raise ConfigError(source, "experts", "must be > 0 when top_k, shared_experts, router groups "
                                                 "or moe_layer_interval are given")
        return
    if model.shared_expert_gate and not model.shared_experts:
        raise ConfigError(source, "shared_expert_gate", "must be false without shared_experts (it gates their output)")
    if not 1 <= model.top_k <= model.experts:
        raise ConfigError(source, "top_k", f"must be between 1 and experts ({model.experts}), got {model.top_k}")
    if model.dense_layers >= model.layers:
        raise ConfigError(source, "dense_layers", f"must be < layers ({model.layers}), got {model.dense_layers}")
    if model.moe_layer_interval > model.layers - model.dense_layers:
        raise ConfigError(source, "moe_layer_interval", f"must be at most the layers after the dense ones "
                                                        f"({model.layers - model.dense_layers}), got "
                                                        f"{model.moe_layer_interval}")
    bad, message = router_groups_error(model)
    if bad:
        raise ConfigError(source, bad, message)


def router_groups_error(model: Model) -> tuple[str, str]:
    """(field, what is allowed) for inconsistent group-limited routing, else ("", "") (Megatron-Core's
    checks: the groups divide the experts, the selected groups are at most the groups and hold the
    top-k experts)."""
    g, gk = model.router_groups, model.router_group_topk
    if not g and not gk:
        return "", ""
    if not g or not gk:
        return ("router_groups" if not g else "router_group_topk",
                "router_groups and router_group_topk are given together (or neither)")
    if model.experts % g:
        return "router_groups", f"must divide the experts ({model.experts}), got {g}"
    if gk > g:
        return "router_group_topk", f"must be at most router_groups ({g}), got {gk}"
    if gk * (model.experts // g) < model.top_k:
        return "router_group_topk", (f"the {gk} selected groups of {model.experts // g} experts must hold "
                                     f"top_k ({model.top_k}) experts, got {gk}")
    return "", ""


def _first(cfg: dict, *keys, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


# Hugging Face model types whose layers are not attention and FFN (transformers 4.57.1 model
# types; nemotron_h is NVIDIA's remote code): refused with the reason rather than read as a
# transformer of their width and depth
_HF_NOT_MODELLED = {
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba"), "Mamba state-space layers and no attention"),
    **dict.fromkeys(("jamba", "zamba", "zamba2", "bamba", "falcon_h1", "granitemoehybrid", "nemotron_h"),
                    "a hybrid of Mamba state-space and attention layers"),
    "minimax": "lightning (linear) attention in most layers",
    **dict.fromkeys(("deepseek_v32", "glm_moe_dsa", "mistral_large4", "mistral_large4_text"),
                    "DeepSeek Sparse Attention (an indexer picks the keys each query attends to)"),
    "deepseek_v4": "compressed sparse and heavily compressed attention with hyper-connections",
    "glm5_next": "linear attention beside indexed sparse attention, with hyper-connections",
    **dict.fromkeys(("kimi_linear", "bailing_hybrid"), "delta-rule linear attention with a forget gate in most layers"),
    "longcat_flash": "zero-computation experts and two attention blocks a layer",
    "jetmoe": "a mixture of attention heads (its attention's projections routed as experts)",
    "lfm2_moe": "short convolution layers beside attention",
    **dict.fromkeys(("gemma3n", "gemma3n_text", "gemma4", "gemma4_text"),
                    "per-layer input embeddings and layers that reuse another layer's keys and values"),
    "rwkv": "RWKV recurrent layers and no attention",
    "recurrent_gemma": "RG-LRU recurrent layers beside local attention",
    "lfm2": "short convolution layers beside attention",
    "xlstm": "xLSTM recurrent layers and no attention",
}

_HF_MOE_TYPES = ("mixtral", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss", "llama4_text", "qwen3_next",
                 "qwen2_moe", "olmoe", "glm4_moe", "granitemoe", "granitemoeshared", "dbrx", "phimoe", "ernie4_5_moe",
                 "hunyuan_v1_moe", "dots1", "minimax_m2", "mistral4", "afmoe")
# the transformer types phaze reads, each as transformers 5.25.0 builds it (models/<type>/
# modeling_<type>.py); any other is refused, never read as the nearest one. Gated FFNs (a
# gate_proj beside the up_proj, or one gate_up_proj: SwiGLU under silu, GeGLU under a GELU) ...
_HF_GATED = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next", "gemma", "gemma2",
             "gemma3_text", "phi3", "deepseek_v2", "deepseek_v3", "gpt_oss", "llama4_text", "olmo2", "olmo3", "olmoe",
             "glm4_moe", "smollm3", "cohere", "cohere2", "granite", "granitemoe", "granitemoeshared", "olmo",
             "stablelm", "glm", "glm4", "ministral", "seed_oss", "ernie4_5", "dbrx", "helium", "hunyuan_v1_dense",
             "exaone4", "phimoe", "minicpm3", "ernie4_5_moe", "hunyuan_v1_moe", "dots1", "minimax_m2", "qwen3_5_text",
             "qwen3_5_moe_text", "mistral4", "ministral3", "olmo_hybrid", "afmoe")
# Qwen3.5's text models are Qwen3-Next's layers (Gated DeltaNet and gated full attention; dense or
# with its experts), read as qwen3_next once their own class defaults are in (Qwen3_5TextConfig,
# Qwen3_5MoeTextConfig)
_HF_AS_QWEN3_NEXT = ("qwen3_5_text", "qwen3_5_moe_text")
# ... and two linears around the activation
_HF_PLAIN = ("gpt2", "opt", "bert", "roberta", "mpt", "bloom", "falcon", "gpt_neox", "gptj", "phi", "codegen",
             "gpt_bigcode", "starcoder2", "arcee", "nemotron")
# plain types built as Llama's layer with an ungated MLP (up_proj, the activation, down_proj): its
# rotary attention and its bias switches, attention_bias on q, k, v and the output projection,
# mlp_bias on the MLP's two (Arcee's AFM: RMSNorms; Nemotron-3 and -4: LayerNorm1p with biases,
# rotary over half of each head by default)
_HF_LLAMA_PLAIN = ("arcee", "nemotron")
# where a sliding window applies (transformers 5.25.0): Mistral, Mixtral, Phi-3 and StarCoder2 in
# every layer whenever ``sliding_window`` is set; Qwen2, Qwen3, Qwen3-MoE and Qwen2-MoE only under
# ``use_sliding_window`` (Qwen2 and Qwen3 from layer ``max_window_layers`` on, Qwen2-MoE every
# other layer before it, or as ``layer_types`` marks them); GPT-OSS, Gemma 2, Gemma 3, OLMo 3,
# Command R7B and Ministral in the layers ``layer_types`` marks (by default every other one, Gemma 3
# five of every six: its sliding_window_pattern, 6; OLMo 3 and Command R7B three of every four;
# Ministral every one); SmolLM3 only under ``use_sliding_window``,
# in its layers without rotary embedding or as ``layer_types`` marks; the other types have no window
_HF_WINDOW_ALL = ("mistral", "mixtral", "phi3", "starcoder2", "phimoe", "ministral3")
_HF_WINDOW_OPT_IN = ("qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "smollm3")
_HF_WINDOW_FROM = ("dots1",)   # from max_window_layers on without an opt-in (Dots1Config's layer_types)
_HF_WINDOW_TYPED = ("gpt_oss", "gemma2", "gemma3_text", "olmo3", "cohere2",   # by layer_types, else their default
                    "ministral", "exaone4", "afmoe")
# each type's configuration-class defaults of the keys this reader takes (transformers 5.25.0
# models/<type>/configuration_<type>.py, its annotated class attributes; GLM-4.5's num_mtp_layers
# under the name its attribute_map reads): a key the config leaves out is read as transformers builds
# it, not as the nearest model's. Null and false defaults are left out (the reader's own)
_HF_TYPE_DEFAULTS: dict[str, dict] = {
    "llama": {"intermediate_size": 11008, "hidden_act": "silu"},
    "mistral": {"intermediate_size": 14336, "num_key_value_heads": 8, "hidden_act": "silu", "sliding_window": 4096},
    "mixtral": {"intermediate_size": 14336, "num_key_value_heads": 8, "hidden_act": "silu", "num_experts_per_tok": 2,
                "num_local_experts": 8},
    "qwen2": {"intermediate_size": 22016, "num_key_value_heads": 32, "hidden_act": "silu", "sliding_window": 4096},
    "qwen2_moe": {"intermediate_size": 5632, "num_key_value_heads": 16, "hidden_act": "silu", "sliding_window": 4096,
                  "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                  "num_experts_per_tok": 4, "num_experts": 60, "qkv_bias": True},
    "qwen3": {"intermediate_size": 22016, "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu",
              "sliding_window": 4096},
    "qwen3_moe": {"intermediate_size": 6144, "num_key_value_heads": 4, "hidden_act": "silu", "sliding_window": 4096,
                  "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8,
                  "num_experts": 128},
    "qwen3_5_text": {"intermediate_size": 12288, "num_key_value_heads": 4, "hidden_act": "silu", "head_dim": 256,
                     "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                     "linear_num_key_heads": 16, "linear_num_value_heads": 32, "max_position_embeddings": 32768},
    "qwen3_5_moe_text": {"num_key_value_heads": 2, "hidden_act": "silu", "head_dim": 256, "linear_conv_kernel_dim": 4,
                         "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                         "linear_num_value_heads": 32, "moe_intermediate_size": 512,
                         "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256},
    "qwen3_next": {"intermediate_size": 5632, "num_key_value_heads": 2, "hidden_act": "silu", "head_dim": 256,
                   "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                   "linear_num_key_heads": 16, "linear_num_value_heads": 32, "decoder_sparse_step": 1,
                   "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10,
                   "num_experts": 512},
    "gemma": {"intermediate_size": 24576, "num_key_value_heads": 16, "head_dim": 256,
              "hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": True},
    "gemma2": {"intermediate_size": 9216, "num_key_value_heads": 4, "head_dim": 256,
               "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "sliding_window": 4096,
               "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0},
    "gemma3_text": {"intermediate_size": 9216, "num_key_value_heads": 4, "head_dim": 256,
                    "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "sliding_window": 4096},
    "phi3": {"intermediate_size": 8192, "hidden_act": "silu"},
    "cohere": {"intermediate_size": 22528, "hidden_act": "silu", "tie_word_embeddings": True},
    "cohere2": {"intermediate_size": 22528, "hidden_act": "silu", "tie_word_embeddings": True,
                "sliding_window": 4096},
    "granite": {"intermediate_size": 11008, "hidden_act": "silu"},
    "granitemoe": {"intermediate_size": 11008, "hidden_act": "silu", "num_local_experts": 8, "num_experts_per_tok": 2},
    "granitemoeshared": {"intermediate_size": 11008, "hidden_act": "silu", "num_local_experts": 8,
                         "num_experts_per_tok": 2},
    "olmo": {"intermediate_size": 11008, "hidden_act": "silu"},
    "stablelm": {"intermediate_size": 6912, "num_key_value_heads": 32, "hidden_act": "silu"},
    "ernie4_5": {"intermediate_size": 3072, "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
                 "tie_word_embeddings": True},
    "ministral": {"intermediate_size": 14336, "num_key_value_heads": 8, "hidden_act": "silu",
                  "sliding_window": 4096},
    "seed_oss": {"intermediate_size": 27648, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
                 "attention_bias": True, "attention_dropout": 0.1},
    "glm": {"intermediate_size": 13696, "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
            "attention_bias": True},
    "glm4": {"intermediate_size": 13696, "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
             "attention_bias": True},
    "deepseek_v2": {"intermediate_size": 11008, "hidden_act": "silu", "first_k_dense_replace": 0, "kv_lora_rank": 512,
                    "q_lora_rank": 1536, "n_routed_experts": 64, "n_shared_experts": 2, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "moe_intermediate_size": 1407},
    "deepseek_v3": {"intermediate_size": 18432, "moe_intermediate_size": 2048, "num_key_value_heads": 128,
                    "n_shared_experts": 1, "n_routed_experts": 256, "kv_lora_rank": 512, "q_lora_rank": 1536,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8, "topk_group": 4,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "hidden_act": "silu"},
    "gpt_oss": {"num_local_experts": 128, "intermediate_size": 2880, "head_dim": 64, "num_key_value_heads": 8,
                "sliding_window": 128, "hidden_act": "silu", "num_experts_per_tok": 4, "attention_bias": True},
    "llama4_text": {"intermediate_size": 8192, "intermediate_size_mlp": 16384, "num_key_value_heads": 8,
                    "head_dim": 128, "hidden_act": "silu", "num_experts_per_tok": 1, "num_local_experts": 16,
                    "interleave_moe_layer_step": 1, "use_qk_norm": True, "attention_chunk_size": 8192},
    "arcee": {"intermediate_size": 18432, "hidden_act": "relu2", "max_position_embeddings": 4096},
    "helium": {"intermediate_size": 7040, "num_key_value_heads": 20, "head_dim": 128, "hidden_act": "silu",
               "max_position_embeddings": 4096},
    "hunyuan_v1_dense": {"intermediate_size": 11008, "hidden_act": "silu"},
    "exaone4": {"intermediate_size": 16384, "num_key_value_heads": 32, "hidden_act": "silu", "sliding_window": 4096,
                "sliding_window_pattern": 4},
    "minicpm3": {"intermediate_size": 6400, "hidden_act": "silu", "max_position_embeddings": 32768,
                 "tie_word_embeddings": True, "kv_lora_rank": 256, "q_lora_rank": 768, "qk_nope_head_dim": 64,
                 "qk_rope_head_dim": 32},
    "ernie4_5_moe": {"intermediate_size": 12288, "num_key_value_heads": 4, "hidden_act": "silu",
                     "max_position_embeddings": 131072, "tie_word_embeddings": True, "moe_intermediate_size": 1536,
                     "moe_k": 6, "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
                     "moe_layer_end_index": -1, "moe_layer_interval": 1},
    "hunyuan_v1_moe": {"intermediate_size": 11008, "hidden_act": "silu", "num_experts": 1, "moe_topk": 1},
    "dots1": {"intermediate_size": 10944, "moe_intermediate_size": 1408, "num_key_value_heads": 32,
              "hidden_act": "silu", "sliding_window": 4096, "max_window_layers": 62},
    "minimax_m2": {"intermediate_size": 1536, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
                   "max_position_embeddings": 196608, "num_experts_per_tok": 8, "num_local_experts": 256},
    "mistral4": {"intermediate_size": 12288, "moe_intermediate_size": 2048, "num_key_value_heads": 32,
                 "n_shared_experts": 1, "n_routed_experts": 128, "kv_lora_rank": 256, "q_lora_rank": 1024,
                 "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 64, "num_experts_per_tok": 4,
                 "hidden_act": "silu", "max_position_embeddings": 1048576},
    "afmoe": {"intermediate_size": 6144, "moe_intermediate_size": 1408, "num_dense_layers": 1, "head_dim": 128,
              "hidden_act": "silu", "max_position_embeddings": 16384, "num_experts": 64, "num_experts_per_tok": 6,
              "num_shared_experts": 2, "global_attn_every_n_layers": 4, "sliding_window": 1024},
    "olmo_hybrid": {"intermediate_size": 11008, "hidden_act": "silu", "max_position_embeddings": 65536},
    "ministral3": {"intermediate_size": 14336, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
                   "max_position_embeddings": 262144},
    "phimoe": {"intermediate_size": 6400, "num_key_value_heads": 8, "hidden_act": "silu",
               "max_position_embeddings": 131072, "num_experts_per_tok": 2, "num_local_experts": 16},
    "nemotron": {"intermediate_size": 24576, "hidden_act": "relu2", "max_position_embeddings": 4096},
    "gpt2": {"activation_function": "gelu_new", "tie_word_embeddings": True},
    "opt": {"activation_function": "relu", "tie_word_embeddings": True},
    "bert": {"intermediate_size": 3072, "hidden_act": "gelu", "tie_word_embeddings": True},
    "roberta": {"intermediate_size": 3072, "hidden_act": "gelu", "tie_word_embeddings": True},
    "mpt": {"tie_word_embeddings": True},
    "bloom": {"tie_word_embeddings": True},
    "falcon": {"multi_query": True, "parallel_attn": True, "tie_word_embeddings": True},
    "gpt_neox": {"intermediate_size": 24576, "hidden_act": "gelu", "use_parallel_residual": True,
                 "attention_bias": True},
    "gptj": {"rotary_dim": 64, "activation_function": "gelu_new"},
    "phi": {"intermediate_size": 8192, "hidden_act": "gelu_new"},
    "codegen": {"rotary_dim": 64, "activation_function": "gelu_new"},
    "gpt_bigcode": {"activation_function": "gelu_pytorch_tanh", "multi_query": True, "tie_word_embeddings": True},
    "starcoder2": {"intermediate_size": 12288, "num_key_value_heads": 2, "hidden_act": "gelu_pytorch_tanh",
                   "use_bias": True, "tie_word_embeddings": True},
    "olmo2": {"intermediate_size": 11008, "hidden_act": "silu"},
    "olmo3": {"intermediate_size": 11008, "hidden_act": "silu", "sliding_window": 4096},
    "olmoe": {"intermediate_size": 2048, "hidden_act": "silu", "num_experts_per_tok": 8, "num_experts": 64},
    "smollm3": {"intermediate_size": 11008, "num_key_value_heads": 4, "hidden_act": "silu", "no_rope_layer_interval": 4,
                "tie_word_embeddings": True},
    "glm4_moe": {"intermediate_size": 10944, "num_key_value_heads": 8, "hidden_act": "silu",
                 "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1,
                 "n_routed_experts": 128, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
                 "num_nextn_predict_layers": 1},
}


def _hf_moe_fields(cfg: dict, mtype: str, ffn: int, layers: int, notes: list, source: str) -> dict:
    """Mixture-of-experts, MLA, q/k-norm, chunked-attention and NoPE fields of a Hugging Face config
    (Mixtral, Qwen3, Qwen3-MoE, DeepSeek-V3, GPT-OSS, Llama 4, OLMo 2 and OLMoE, GLM-4.5, Granite-MoE,
    Cohere, SmolLM3) of ``layers`` layers; what is simplified goes to ``notes``."""
    out: dict = {}
    # per-head q and k RMSNorms (Hunyuan's after the rotary embedding, the others' before: the same work)
    if mtype in ("qwen3", "qwen3_moe", "qwen3_next", "gemma3_text", "hunyuan_v1_dense", "exaone4", "hunyuan_v1_moe",
                 "dots1", "afmoe") or (
            mtype == "glm4_moe" and cfg.get("use_qk_norm")):
        out["qk_norm"] = True
    if mtype in ("olmo2", "olmo3", "olmoe", "minimax_m2", "olmo_hybrid"):   # one RMSNorm over the whole q and k
        out.update(qk_norm=True, qk_norm_width="projection")
    if mtype == "cohere" and cfg.get("use_qk_norm"):   # CohereLayerNorm over each head, a weight per head
        out.update(qk_norm=True, qk_norm_per_head=True)
    if mtype in ("gemma2", "gemma3_text"):   # a norm after the attention and the FFN, soft-caps
        out.update(sandwich_norm=True, attention_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
                   logit_softcap=float(cfg.get("final_logit_softcapping") or 0.0))
    if mtype == "glm4":   # GLM-4-0414: post_self_attn_layernorm and post_mlp_layernorm before the residual adds
        out["sandwich_norm"] = True
    if mtype == "afmoe":   # AfMoE: a norm before and after the attention and the FFN, the attention's output
        out.update(sandwich_norm=True, attention_output_gate=True)   # times sigmoid(gate_proj(x))
    experts = _first(cfg, "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", default=0) or 0
    if mtype in _HF_MOE_TYPES and experts:
        out.update(experts=int(experts),
                   top_k=int(_first(cfg, "num_experts_per_tok", "experts_per_token", "moe_k", default=1)),
                   expert_ffn_hidden=int(_first(cfg, "moe_intermediate_size", default=ffn)),
                   shared_experts=int(cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0),
                   dense_layers=int(cfg.get("first_k_dense_replace") or cfg.get("num_dense_layers") or 0))
        if mtype == "llama4_text":   # transformers' Llama4TextMoe: one shared expert as wide as the routed
            out.update(shared_experts=1, ffn_hidden=int(cfg.get("intermediate_size_mlp") or ffn))  # ones
        out.update(_hf_moe_pattern(cfg, layers, out["dense_layers"], notes))
    if mtype == "qwen3_next":   # Gated DeltaNet in (N-1) of every N layers, gated full attention in the rest
        out.update(linear_attention_interval=_hf_linear_interval(cfg, layers, notes, source),
                   linear_key_heads=int(cfg.get("linear_num_key_heads") or 16),
                   linear_value_heads=int(cfg.get("linear_num_value_heads") or 32),
                   linear_key_head_dim=int(cfg.get("linear_key_head_dim") or 128),
                   linear_value_head_dim=int(cfg.get("linear_value_head_dim") or 128),
                   linear_conv=int(cfg.get("linear_conv_kernel_dim") or 4), attention_output_gate=True)
    if mtype == "olmo_hybrid":   # OLMo Hybrid: Qwen3-Next's Gated DeltaNet mixer (q, k, v, a, b and its gate in
        # projections of their own, the same work) in 3 of every 4 layers, OLMo 3's attention in the
        # rest, every layer's SwiGLU dense; OlmoHybridConfig's linear widths from the attention's
        heads = cfg["num_attention_heads"]
        kh = int(cfg.get("linear_num_key_heads") or heads)
        kd = int(cfg.get("linear_key_head_dim") or int(0.75 * cfg["hidden_size"] / kh))
        out.update(linear_attention_interval=_hf_linear_interval(cfg, layers, notes, source),
                   linear_key_heads=kh, linear_value_heads=int(cfg.get("linear_num_value_heads") or heads),
                   linear_key_head_dim=kd, linear_value_head_dim=int(cfg.get("linear_value_head_dim") or 2 * kd),
                   linear_conv=int(cfg.get("linear_conv_kernel_dim") or 4))
    if mtype == "granitemoeshared" and experts and cfg.get("shared_intermediate_size"):   # GraniteMoeSharedMLP
        out.update(shared_experts=1, shared_expert_ffn_hidden=int(cfg["shared_intermediate_size"]))
    if mtype in ("qwen3_next", "qwen2_moe") and experts and cfg.get("shared_expert_intermediate_size"):
        out.update(shared_experts=1, shared_expert_ffn_hidden=int(cfg["shared_expert_intermediate_size"]),
                   shared_expert_gate=True)   # transformers' Qwen3Next- and Qwen2MoeSparseMoeBlock.shared_expert_gate
    if mtype in ("deepseek_v2", "deepseek_v3", "minicpm3", "mistral4"):   # MLA (Mistral 4: DeepSeek-V3's layer);
        # DeepSeek-V2's softmax gate costs as V3's sigmoid; MiniCPM3's value heads as wide as the hidden
        # width's share when not given (its __post_init__)
        v = cfg.get("v_head_dim") or (cfg["hidden_size"] // cfg["num_attention_heads"] if mtype == "minicpm3" else 0)
        if not cfg.get("kv_lora_rank"):
            raise ConfigError(source, "kv_lora_rank", f"must be a whole number of at least 1 for {mtype} (its "
                                                      f"latent attention), got {cfg.get('kv_lora_rank')!r}")
        out.update(q_lora_rank=int(cfg.get("q_lora_rank") or 0), kv_lora_rank=int(cfg.get("kv_lora_rank") or 0),
                   qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0),
                   head_dim=int(cfg.get("qk_nope_head_dim") or 0) + int(cfg.get("qk_rope_head_dim") or 0),
                   v_head_dim=int(v))
    if mtype == "ernie4_5_moe":
        out["mtp_layers"] = int(cfg.get("num_nextn_predict_layers") or cfg.get("num_mtp_layers") or 0)
    if mtype in ("deepseek_v2", "deepseek_v3", "glm4_moe", "dots1", "mistral4"):   # node-limited routing, MTP
        if experts and int(cfg.get("n_group") or 1) > 1 and cfg.get("topk_group"):
            out.update(router_groups=int(cfg["n_group"]), router_group_topk=int(cfg["topk_group"]))
        out["mtp_layers"] = int(cfg.get("num_nextn_predict_layers") or 0)
    if mtype == "llama4_text":
        out.update(_hf_chunks(cfg, layers))
        if cfg.get("use_qk_norm", True):   # Llama4TextAttention: an L2 norm of q and k in its RoPE layers
            out["qk_l2_norm"] = True
        if cfg.get("attn_temperature_tuning", True) and layers > 0:   # and its NoPE layers' query scales
            nope = 1 - _hf_rope_layers(cfg, layers) / layers
            if nope > 0:
                out["query_scale_share"] = nope
    if mtype in ("mistral4", "ministral3"):   # llama_4_scaling_beta's query scale in every layer
        out["query_scale_share"] = 1.0
    if mtype in ("llama4_text", "smollm3") and layers > 0:     # NoPE layers: no rotary embedding
        rope = _hf_rope_layers(cfg, layers)
        if rope < layers:
            out["rope_layer_share"] = rope / layers
    if mtype == "gpt_oss":
        out.update(expert_bias=True, attention_sinks=True)
        notes.append("GPT-OSS: the SwiGLU clamp and the attention sinks add no GEMM work")
    return out


# the keys a Hugging Face config gives as counts (whole numbers, at least 0), as other numbers, and
# as lists of layer indices or flags: each, when not null, must be one, or the reader refuses it
_HF_WHOLE_KEYS = (
    "intermediate_size", "n_inner", "ffn_dim", "d_ff", "num_key_value_heads", "num_kv_heads", "head_dim",
    "max_position_embeddings", "n_positions", "max_seq_len", "word_embed_proj_dim", "type_vocab_size", "rotary_dim",
    "max_window_layers", "num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
    "experts_per_token", "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace",
    "intermediate_size_mlp", "shared_expert_intermediate_size", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "q_lora_rank", "kv_lora_rank",
    "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "n_group", "topk_group", "num_nextn_predict_layers",
    "sliding_window_pattern", "interleave_moe_layer_step", "decoder_sparse_step", "moe_layer_freq",
    "full_attention_interval", "attention_chunk_size", "no_rope_layer_interval", "shared_intermediate_size",
    "num_dense_layers", "num_shared_experts", "global_attn_every_n_layers")
_HF_NUMBER_KEYS = ("attn_logit_softcapping", "final_logit_softcapping", "expansion_ratio", "rotary_pct",
                   "partial_rotary_factor")
_HF_LIST_KEYS = ("moe_layers", "mlp_only_layers", "no_rope_layers")


def _hf_rope_layers(cfg: dict, layers: int) -> int:
    """Layers with a rotary embedding in a SmolLM3 or Llama 4 config: those ``no_rope_layers`` marks
    1, else all but every ``no_rope_layer_interval``-th (SmolLM3Config.__post_init__,
    Llama4TextConfig.__post_init__; each layer's ``use_rope`` is its mark)."""
    marks = cfg.get("no_rope_layers")
    if isinstance(marks, list) and marks:
        return sum(1 for k in marks[:layers] if k)
    every = int(cfg.get("no_rope_layer_interval") or 4)
    return sum(1 for i in range(layers) if (i + 1) % every)


def _check_hf_numbers(cfg: dict, source: str) -> None:
    """Refuse, naming the key, a count or number of a Hugging Face config that is not one
    (:data:`_HF_WHOLE_KEYS`, :data:`_HF_NUMBER_KEYS`, :data:`_HF_LIST_KEYS`)."""
    def number(value) -> bool:   # at most MAX_INT: a larger one is no model's (1e308 overflowed int() later)
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and 0 <= value <= MAX_INT)
    for key in _HF_WHOLE_KEYS + _HF_NUMBER_KEYS:
        value = cfg.get(key)
        if value is not None and not (number(value) and (key in _HF_NUMBER_KEYS or float(value).is_integer())):
            kind = "a number" if key in _HF_NUMBER_KEYS else "a whole number"
            raise ConfigError(source, key, f"must be {kind} of at least 0 and at most {MAX_INT:.0e} (or null), "
                                           f"got {value!r}")
    for key in _HF_LIST_KEYS:
        value = cfg.get(key)
        if value is not None and not (isinstance(value, list) and all(number(i) and float(i).is_integer()
                                                                      for i in value)):
            raise ConfigError(source, key, f"must be a list of layer indices or flags (whole numbers), got {value!r}")
    kinds = cfg.get("layer_types")
    if kinds is not None and not (isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)):
        raise ConfigError(source, "layer_types", f"must be a list of each layer's kind (names), got {kinds!r}")


def _hf_exaone4_pattern(cfg: dict, source: str) -> dict:
    """An EXAONE 4 config whose ``sliding_window_pattern`` is a string of L (local, windowed) and G
    (global) repeated over the layers, as its checkpoints write it: read as the ``layer_types`` it
    marks when the config gives none (transformers 5.25.0's __post_init__ takes only a count)."""
    pattern = cfg["sliding_window_pattern"]
    if not pattern or set(pattern) - {"L", "G"}:
        raise ConfigError(source, "sliding_window_pattern", f"must be a whole number or a string of L (windowed) "
                                                            f"and G (global) layers, got {pattern!r}")
    layers = cfg.get("num_hidden_layers")
    out = {k: v for k, v in cfg.items() if k != "sliding_window_pattern"}
    if cfg.get("layer_types") is None and isinstance(layers, int) and not isinstance(layers, bool) and layers > 0:
        out["layer_types"] = ["sliding_attention" if pattern[i % len(pattern)] == "L" else "full_attention"
                              for i in range(layers)]
    return out


def _hf_window(cfg: dict, mtype: str, layers: int) -> tuple[int, float]:
    """(sliding window, share of the layers it applies to) of a Hugging Face config, as
    transformers 5.25.0 applies ``sliding_window`` (:data:`_HF_WINDOW_ALL`,
    :data:`_HF_WINDOW_OPT_IN`, GPT-OSS's ``layer_types``); (0, 1.0) without one."""
    window = cfg.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return 0, 1.0
    if mtype in _HF_WINDOW_ALL:
        return window, 1.0
    if mtype in _HF_WINDOW_OPT_IN and not cfg.get("use_sliding_window"):
        return 0, 1.0
    if mtype not in _HF_WINDOW_OPT_IN + _HF_WINDOW_TYPED + _HF_WINDOW_FROM:
        return 0, 1.0
    sliding = _hf_sliding_layers(cfg, mtype, layers)
    return (window, sliding / layers) if sliding and layers else (0, 1.0)


def _hf_sliding_layers(cfg: dict, mtype: str, layers: int) -> int:
    """How many of a Hugging Face config's ``layers`` are marked local (``sliding_attention``): as
    ``layer_types`` marks them, else by its type's default pattern (AfMoE's rotate, window or not)."""
    kinds = cfg.get("layer_types")
    start = cfg.get("max_window_layers")
    start = start if isinstance(start, int) and start >= 0 else 28   # Qwen's configuration default
    if isinstance(kinds, list) and kinds:
        sliding = sum(k == "sliding_attention" for k in kinds)
    elif mtype in _HF_WINDOW_TYPED:
        every = {"gemma3_text": int(cfg.get("sliding_window_pattern") or 6), "olmo3": 4,
                 "cohere2": int(cfg.get("sliding_window_pattern") or 4),
                 "exaone4": int(cfg.get("sliding_window_pattern") or 4),
                 "afmoe": int(cfg.get("global_attn_every_n_layers") or 4)}.get(mtype, 2)
        sliding = layers if mtype == "ministral" else sum(1 for i in range(layers) if (i + 1) % every)
    elif mtype == "smollm3":   # its layers without a rotary embedding
        sliding = layers - _hf_rope_layers(cfg, layers)
    elif mtype == "qwen3_moe":
        sliding = layers
    elif mtype == "qwen2_moe":
        sliding = sum(1 for i in range(layers) if (i + 1) % 2 and i < start)
    else:
        sliding = layers - min(layers, start)
    return sliding


def _hf_count(d: dict, key: str, source: str, low: int = 0, default=None, where: str = "") -> int:
    """The count ``key`` of a Hugging Face config (or of its nested config ``where``; ``default``
    when left out), refused naming it unless a whole number of at least ``low``."""
    value = d.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        allowed = "a positive whole number" if low == 1 else f"a whole number of at least {low}"
        raise ConfigError(source, f"{where}.{key}" if where else key, f"must be {allowed}, got {value!r}")
    return value


def _hf_ernie_moe(cfg: dict, source: str) -> dict:
    """An ERNIE 4.5 MoE config in the keys the expert reader takes: its MoE layers, those from
    ``moe_layer_start_index`` to ``moe_layer_end_index`` (-1: the last) that are the last of every
    ``moe_layer_interval`` (Ernie4_5_MoeDecoderLayer), as ``moe_layers`` after the dense ones before
    the first; its experts' counts under the common names; its shared MLP as wide as
    ``moe_num_shared_experts`` experts (Ernie4_5_MoeSparseMoeBlock), as that many shared experts (the
    same work); none: a dense model."""
    layers = cfg.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or layers <= 0:
        return cfg   # refused by the common check
    start, end = _hf_count(cfg, "moe_layer_start_index", source), _hf_count(cfg, "moe_layer_end_index", source, -1)
    every = _hf_count(cfg, "moe_layer_interval", source, 1)
    end = layers - 1 if end == -1 else end
    moe = [i for i in range(layers) if (i + 1) % every == 0 and start <= i <= end]
    experts, k = _hf_count(cfg, "moe_num_experts", source), _hf_count(cfg, "moe_k", source)
    shared = _hf_count(cfg, "moe_num_shared_experts", source)
    _hf_count(cfg, "moe_intermediate_size", source)   # the experts' width given (a null is not the dense one)
    if not moe or not experts:
        return {**cfg, "moe_num_experts": 0}
    # the dense layers before the pattern: as many as puts the first MoE layer last of its interval
    return {**cfg, "num_experts": experts, "num_experts_per_tok": k, "first_k_dense_replace": start - start % every,
            "moe_layers": moe, "n_shared_experts": shared}


def _hf_hunyuan_moe(cfg: dict, source: str) -> dict:
    """A Hunyuan MoE config in the keys the expert reader takes: ``moe_topk`` (one count, or one a
    layer, which must agree: phaze costs one top-k for every MoE layer) and its shared MLP, as wide as
    each expert (``intermediate_size``; HunYuanMoEV1Moe.shared_mlp): one shared expert."""
    k = cfg.get("moe_topk")
    if isinstance(k, list):
        if not k or len(set(map(str, k))) > 1:
            raise ConfigError(source, "moe_topk", f"must be one count, or the same count for every layer (phaze "
                                                  f"costs one top-k for every MoE layer), got {k!r}")
        k = k[0]
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ConfigError(source, "moe_topk", f"must be a whole number of at least 1, got {k!r}")
    # transformers builds every expert as wide as intermediate_size; a checkpoint's per-layer
    # moe_intermediate_size list is not read
    out = {key: v for key, v in cfg.items() if key != "moe_intermediate_size"}
    return {**out, "num_experts_per_tok": k, "n_shared_experts": 1}


def _hf_moe_pattern(cfg: dict, layers: int, dense: int, notes: list) -> dict:
    """``moe_layer_interval`` of a Hugging Face MoE config whose MoE layers, after the first
    ``dense``, are the last of every N (Llama 4's ``interleave_moe_layer_step`` or ``moe_layers``,
    Qwen3-MoE's ``decoder_sparse_step`` and ``mlp_only_layers``, DeepSeek's ``moe_layer_freq``);
    another pattern is costed by count, as the nearest interval after as many dense layers as leave
    its MoE layers' number (``dense_layers``), and a note says so."""
    step = int(_first(cfg, "interleave_moe_layer_step", "decoder_sparse_step", "moe_layer_freq", default=1) or 1)
    listed = cfg.get("moe_layers")
    if isinstance(listed, list) and listed:
        moe = sorted(int(i) for i in listed)
    else:
        skip = {int(i) for i in cfg.get("mlp_only_layers") or []}
        moe = [i for i in range(dense, layers) if (i + 1 - dense) % max(step, 1) == 0 and i not in skip]
    if not moe or layers <= dense:
        return {}
    # the nearest interval, and as many dense layers first as leave exactly the listed MoE layers
    interval = max(1, round((layers - dense) / len(moe)))
    if layers - len(moe) * interval < 0:
        interval = 1
    first = layers - len(moe) * interval
    regular = [i for i in range(first, layers) if (i + 1 - first) % interval == 0]
    out = {"moe_layer_interval": interval} if interval > 1 else {}
    if first != dense:
        out["dense_layers"] = first
    if moe != regular:
        notes.append(f"MoE layers {moe} costed by count as every {interval} layer(s) after the first {first}")
    return out


def _hf_linear_interval(cfg: dict, layers: int, notes: list, source: str) -> int:
    """Qwen3-Next's N (every N-th layer full attention, the others Gated DeltaNet): its
    ``full_attention_interval``, or from ``layer_types`` as transformers 4.57 reads them; another
    pattern of kinds is costed by count, and a note says so."""
    interval = int(cfg.get("full_attention_interval") or 4)
    kinds = cfg.get("layer_types")
    if not isinstance(kinds, list) or not kinds:
        return interval
    full = [i for i, k in enumerate(kinds) if k == "full_attention"]
    if not full or any(k not in ("full_attention", "linear_attention") for k in kinds):
        raise ConfigError(source, "layer_types", "must name full_attention and linear_attention layers, at least "
                                                   "one full_attention")
    interval = max(2, round(layers / len(full)))
    if full != [i for i in range(layers) if (i + 1) % interval == 0]:
        notes.append(f"full attention layers {full} costed by count as every {interval} layer(s)")
    return interval


def _hf_chunks(cfg: dict, layers: int) -> dict:
    """Llama 4's chunked attention: ``attention_chunk_size`` in the layers its ``layer_types``
    (or ``no_rope_layers``: 1 for a RoPE layer, which chunks) mark, as transformers 4.57 builds
    them (every ``no_rope_layer_interval``-th layer global)."""
    chunk = int(cfg.get("attention_chunk_size") or 0)
    if chunk <= 0 or layers <= 0:
        return {}
    kinds = cfg.get("layer_types")
    chunked = sum(k == "chunked_attention" for k in kinds) if kinds else _hf_rope_layers(cfg, layers)
    return {"attention_chunk": chunk, "window_layer_share": chunked / layers} if chunked else {}


def local_attention_phrase(window: int, chunk: int, share: float) -> str:
    """How a sliding window of ``window`` tokens (else chunks of ``chunk``) in ``share`` of the
    layers reads in a note or a printout."""
    kind = (f"sliding-window attention over {window} tokens" if window else
            f"chunked attention in chunks of {chunk} tokens")
    return kind + (f" in {share:.0%} of the layers (the others attend to every earlier token)" if share < 1 else "")


def _hf_hybrid(cfg: dict, mtype: str, source: str, name: str | None) -> Model:
    """A Mamba-2 model from a Hugging Face config: NVIDIA's Nemotron-H remote code (``nemotron_h``:
    hybrid_override_pattern, mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups,
    conv_kernel, chunk_size; its MLP's relu2, squared ReLU, costed as relu; Nemotron 3's E layers
    with n_routed_experts, num_experts_per_tok, moe_intermediate_size, one shared expert of
    moe_shared_expert_intermediate_size and n_group/topk_group) or transformers' ``mamba2``
    (Mamba-2 layers only: num_heads, head_dim, state_size)."""
    def whole(key, *keys, default=None):
        value = _first(cfg, key, *keys, default=default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(source, key, f"must be a positive integer, got {value!r}")
        return value
    hidden, layers, vocab = whole("hidden_size"), whole("num_hidden_layers"), whole("vocab_size")
    if mtype == "nemotron_h":
        pattern = str(cfg.get("hybrid_override_pattern") or "")
        heads = whole("num_attention_heads")
        extra = dict(kv_heads=whole("num_key_value_heads", default=heads),
                     head_dim=whole("head_dim", "attention_head_dim", default=hidden // heads),
                     ffn_hidden=whole("intermediate_size"), mamba_heads=whole("mamba_num_heads"),
                     mamba_head_dim=whole("mamba_head_dim"))
        act = str(cfg.get("mlp_hidden_act", "relu2")).lower()
        if act not in ("relu2", "relu"):
            raise ConfigError(source, "mlp_hidden_act", f"must be relu2 or relu (Nemotron-H's MLP), got {act!r}")
        if "E" in pattern:     # Nemotron 3's mixture-of-experts layers (Megatron-Bridge's names)
            shared = _first(cfg, "moe_shared_expert_intermediate_size", default=0) or 0
            groups = _first(cfg, "n_group", default=0) or 0
            extra.update(experts=whole("n_routed_experts"), top_k=whole("num_experts_per_tok"),
                         expert_ffn_hidden=whole("moe_intermediate_size"),
                         shared_experts=1 if shared else 0, shared_expert_ffn_hidden=shared if shared else 0,
                         router_groups=groups if groups > 1 else 0,
                         router_group_topk=whole("topk_group") if groups > 1 else 0)
    else:
        pattern, heads = "M" * layers, 1
        extra = dict(ffn_hidden=hidden, mamba_heads=whole("num_heads"), mamba_head_dim=whole("head_dim"))
    max_pos = cfg.get("max_position_embeddings")
    seq = min(max_pos, 8192) if isinstance(max_pos, int) and max_pos > 0 else 4096
    dtype = str(cfg.get("torch_dtype", "bfloat16"))
    model = Model(name=name or str(cfg.get("_name_or_path") or mtype), layers=layers, hidden=hidden, heads=heads,
                  vocab=vocab, seq_len=seq, activation="relu", position_embedding="none",
                  tied_embeddings=bool(cfg.get("tie_word_embeddings", mtype == "mamba2")), norm="rmsnorm",
                  bias=False, dropout=False, precision={"float16": "fp16"}.get(dtype, "bf16"),
                  hybrid_pattern=pattern, mamba_state=whole("ssm_state_size", "state_size"),
                  mamba_groups=whole("n_groups", default=1), mamba_conv=whole("conv_kernel", default=4),
                  mamba_chunk=whole("chunk_size", default=256),
                  notes=(f"sequence length {seq}: the config's context (at most 8192); --seq-len sets it",
                         "a hybrid of Mamba-2, attention, MLP and MoE layers (hybrid_pattern), its MLPs' squared "
                         "ReLU costed as relu" if mtype == "nemotron_h" else "Mamba-2 layers only (hybrid_pattern)"),
                  **extra)
    bad, message = hybrid_error(model)
    if bad:
        raise ConfigError(source, {"hybrid_pattern": "hybrid_override_pattern"}.get(bad, bad), message)
    return model


def _hf_nested(cfg: dict, key: str, source: str) -> dict:
    """A nested config (MPT's and DBRX's ``attn_config``, DBRX's ``ffn_config``): a mapping, or {}."""
    d = cfg.get(key) or {}
    if not isinstance(d, dict):
        raise ConfigError(source, key, f"must be a mapping (a nested config), got {d!r}")
    return d


def _hf_dbrx_flat(cfg: dict, attn: dict, source: str) -> dict:
    """DBRX's nested configs as the flat keys the reader takes: from ``ffn_config`` (DbrxFFNConfig)
    its experts' width, count and top-k and the activation its GLU experts run, from ``attn_config``
    (DbrxAttentionConfig) its key/value heads (one by default); each class's defaults where a key
    is left out."""
    ffn = _hf_nested(cfg, "ffn_config", source)
    act = ffn.get("ffn_act_fn") or {"name": "silu"}
    def count(d, where, key, default):
        return _hf_count(d, key, source, 1, default, where)
    return {**cfg, "intermediate_size": count(ffn, "ffn_config", "ffn_hidden_size", 3584),
            "num_local_experts": count(ffn, "ffn_config", "moe_num_experts", 4),
            "num_experts_per_tok": count(ffn, "ffn_config", "moe_top_k", 1),
            "num_key_value_heads": count(attn, "attn_config", "kv_n_heads", 1),
            "hidden_act": act.get("name", "silu") if isinstance(act, dict) else act}


def model_from_hf_config(cfg: dict, source: str = "config.json", name: str | None = None) -> Model:
    """Build a :class:`Model` from a Hugging Face ``config.json`` dictionary (GPT-2, OPT, BERT,
    Llama/Mistral, MPT, GPT-NeoX and similar)."""
    mtype = str(cfg.get("model_type", "")).lower()
    if isinstance(cfg.get("text_config"), dict) and mtype in ("llama4", "gemma3", "qwen3_5", "qwen3_5_moe", "mistral3"):
        # a multimodal checkpoint: its language model (the vision encoder is not trained here); Mistral 3's
        # of the type its text_config names (Mistral3Config: mistral by default)
        text = cfg["text_config"]
        cfg = {"torch_dtype": cfg.get("torch_dtype"), **text}
        mtype = str(text.get("model_type") or "mistral").lower() if mtype == "mistral3" else mtype + "_text"
    type_name = mtype
    if mtype in ("nemotron_h", "mamba2"):
        return _hf_hybrid(cfg, mtype, source, name)
    if mtype in _HF_NOT_MODELLED:
        raise ConfigError(source, "model_type", f"{mtype!r} has {_HF_NOT_MODELLED[mtype]}, which phaze does not "
                                                f"model; allowed: transformers (attention and FFN layers), "
                                                f"nemotron_h and mamba2 (Mamba-2 layers)")
    if mtype not in _HF_GATED + _HF_PLAIN:
        known = ", ".join(sorted(_HF_GATED + _HF_PLAIN + ("mamba2", "nemotron_h")))
        raise ConfigError(source, "model_type", f"{'got ' + repr(mtype) if mtype else 'missing'}: phaze reads only "
                                                f"the types whose norms, biases, gating and experts it knows: "
                                                f"{known}; a workload YAML describes any other model")
    attn_cfg = _hf_nested(cfg, "attn_config", source)     # MPT's and DBRX's nested attention settings
    if mtype == "dbrx":
        cfg = _hf_dbrx_flat(cfg, attn_cfg, source)
    if mtype == "exaone4" and isinstance(cfg.get("sliding_window_pattern"), str):
        cfg = _hf_exaone4_pattern(cfg, source)
    cfg = {**_HF_TYPE_DEFAULTS.get(mtype, {}), **cfg}
    qwen35 = mtype in _HF_AS_QWEN3_NEXT
    if qwen35:
        mtype = "qwen3_next"
    if mtype == "ernie4_5_moe":
        cfg = _hf_ernie_moe(cfg, source)
    if mtype == "hunyuan_v1_moe":
        cfg = _hf_hunyuan_moe(cfg, source)
    _check_hf_numbers(cfg, source)
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
    layers = _first(cfg, "num_hidden_layers", "n_layer", "n_layers", "num_layers")
    heads = _first(cfg, "num_attention_heads", "n_head", "n_heads")
    for key, value in (("hidden_size", hidden), ("num_hidden_layers", layers),
                       ("num_attention_heads", heads), ("vocab_size", cfg.get("vocab_size"))):
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(source, key, f"must be a positive integer, got {value!r}")
    kv_n = attn_cfg.get("kv_n_heads")     # MPT's: null falls back to the heads
    if kv_n is not None:
        _hf_count(attn_cfg, "kv_n_heads", source, 1, where="attn_config")
    kv_heads = _first(cfg, "num_key_value_heads", default=None) or kv_n or heads
    if mtype == "falcon":   # transformers' FalconAttention: the new decoder's KV heads, else multi-query
        if cfg.get("new_decoder_architecture"):
            kv_heads = cfg.get("num_kv_heads") or heads
        elif cfg.get("multi_query", True):
            kv_heads = 1
    if mtype == "gpt_bigcode" and cfg.get("multi_query", True):   # StarCoder's and SantaCoder's one KV head
        kv_heads = 1
    ffn = _first(cfg, "intermediate_size", "n_inner", "ffn_dim", "d_ff")
    if ffn is None and cfg.get("expansion_ratio"):
        ffn = int(cfg["expansion_ratio"] * hidden)
    ffn = ffn or 4 * hidden
    key = next((k for k in ("hidden_activation", "hidden_act", "activation_function") if cfg.get(k) is not None),
               "hidden_act")
    gated = mtype in _HF_GATED
    act = str(cfg.get(key, "silu" if gated else "gelu")).lower()   # GPT-OSS names none: its experts' SwiGLU
    activation = (_GATED if gated else _ACTIVATIONS).get(act)
    if activation is None:
        raise ConfigError(source, key, f"must be one of {', '.join(_GATED if gated else _ACTIVATIONS)} for "
                                       f"{mtype!r} ({'a gated' if gated else 'an ungated'} FFN), got {act!r}")
    max_pos = _first(cfg, "max_position_embeddings", "n_positions", "max_seq_len", default=2048)
    alibi = bool(attn_cfg.get("alibi")) or mtype in ("bloom",) or (mtype == "falcon" and bool(cfg.get("alibi")))
    # every gated type is rotary (transformers 5.25.0), and so are these plain ones
    rotary = not alibi and (gated or mtype in ("gpt_neox", "gptj", "falcon", "phi", "codegen", "starcoder2")
                            + _HF_LLAMA_PLAIN
                            or "rope_theta" in cfg or isinstance(cfg.get("rope_parameters"), dict)
                            or bool(attn_cfg.get("rope")))  # MPT: RoPE in attn_config
    if mtype == "olmo_hybrid":   # its released checkpoints have no rotary embedding (OlmoHybridModel.rotary_emb:
        rope = cfg.get("rope_parameters")   # only with a rope_theta)
        rotary = cfg.get("rope_theta") is not None or (isinstance(rope, dict) and rope.get("rope_theta") is not None)
        position = "rotary" if rotary else "none"
    elif mtype == "mpt" and not alibi and not rotary:
        position = "learned"
    else:
        position = "rotary" if rotary else ("alibi" if alibi else "learned")
    encoder = mtype in ("bert", "roberta")
    # every gated type's norms are RMSNorms but Cohere's and DBRX's (LayerNorms: a weight, no bias), OLMo's
    # (OlmoLayerNorm: neither) and StableLM's (nn.LayerNorm), no other type's
    norm = ("rmsnorm" if (gated and mtype not in ("cohere", "cohere2", "olmo", "stablelm", "dbrx", "phimoe"))
            or mtype == "arcee" else "layernorm")
    # a LayerNorm's bias kept whatever the linears' (Falcon's and StarCoder2's bias switches, StableLM's
    # nn.LayerNorm), or no parameters at all (OLMo's)
    norm_affine = ("weight_bias" if mtype in ("falcon", "starcoder2", "stablelm", "nemotron", "phimoe")
                   else ("none" if mtype == "olmo" else ""))
    bias = not gated and not cfg.get("no_bias", False)
    if mtype in _HF_LLAMA_PLAIN:   # biases on every linear (both switches), else on the attention's alone
        bias = bool(cfg.get("attention_bias")) and bool(cfg.get("mlp_bias"))
        if cfg.get("mlp_bias") and not bias:
            raise ConfigError(source, "mlp_bias", "must be false without attention_bias: biases on the MLP's "
                                                  "projections alone are not modelled")
    if mtype == "falcon":   # Falcon's ``bias`` switches its linears' biases (its LayerNorms keep theirs)
        bias = bool(cfg.get("bias", False))
    if mtype == "starcoder2":   # StarCoder2's ``use_bias`` switches its linears' (its LayerNorms keep theirs)
        bias = bool(cfg.get("use_bias", True))
    proj = cfg.get("word_embed_proj_dim") or 0
    post = (mtype == "opt" and cfg.get("do_layer_norm_before") is False) or encoder
    dtype = str(cfg.get("torch_dtype", "bfloat16"))
    precision = {"float16": "fp16", "bfloat16": "bf16", "float32": "bf16"}.get(dtype, "bf16")
    # training length defaults to the context length, capped at 8192 (long-context checkpoints
    # are pre-trained shorter); --seq-len overrides
    notes = []
    if isinstance(max_pos, int) and max_pos > 0:
        seq = min(max_pos, 8192)
        notes.append(f"sequence length {seq}: the config's context of {max_pos}"
                     + (" capped at 8192 (long-context checkpoints pre-train shorter)" if max_pos > 8192 else "")
                     + "; --seq-len sets it")
    else:
        seq = 2048
        notes.append("sequence length 2048: the config gives no context length; --seq-len sets it")
    # a gated type's attention_bias puts biases on q, k, v and the output projection (transformers'
    # LlamaAttention and its kin, GPT-OSS's); Qwen2 always has q, k and v biases, never others
    attn_bias = (gated or mtype in _HF_LLAMA_PLAIN) and not bias and bool(cfg.get("attention_bias"))
    if attn_bias and mtype in ("deepseek_v2", "deepseek_v3", "minicpm3", "mistral4"):
        raise ConfigError(source, "attention_bias", f"must be false for {mtype}: biases on MLA's projections "
                                                    "are not modelled")
    if gated and cfg.get("mlp_bias"):
        raise ConfigError(source, "mlp_bias", "must be false: biases on a gated FFN's projections are not modelled")
    if mtype == "ernie4_5" and cfg.get("use_bias"):   # on every linear, the gated FFN's too
        raise ConfigError(source, "use_bias", "must be false: biases on a gated FFN's projections are not modelled")
    qkv_bias = (mtype == "qwen2" or (mtype == "qwen2_moe" and bool(cfg.get("qkv_bias", True))) or attn_bias
                or (mtype == "stablelm" and bool(cfg.get("use_qkv_bias"))))
    if mtype == "stablelm" and cfg.get("qk_layernorm"):
        raise ConfigError(source, "qk_layernorm", "must be false: StableLM's q and k LayerNorms run one kernel per "
                                                  "head (StableLmLayerNormPerHead), which phaze does not cost")
    if qkv_bias:
        which = {"qwen2": "Qwen2", "qwen2_moe": "Qwen2-MoE", "glm4_moe": "GLM-4.5's attention_bias",
                 "glm": "GLM-4's attention_bias", "glm4": "GLM-4's attention_bias",
                 "seed_oss": "Seed-OSS's attention_bias" + (f"; its output projection's bias, {hidden} a layer, "
                                                             "is not counted" if cfg.get("attention_out_bias") else ""),
                 "stablelm": "StableLM's use_qkv_bias",
                 "helium": "Helium's attention_bias, never on its output projection"}.get(mtype) or (
            f"{'GPT-OSS' if mtype == 'gpt_oss' else 'attention_bias'}; its output projection's bias, {hidden} "
            f"per layer, is not counted")
        notes.append(f"q/k/v projections with biases ({which}), no other linear biases")
    extra = _hf_moe_fields(cfg, mtype, ffn, layers, notes, source)
    block = _hf_parallel_block(cfg, mtype)
    if block:
        notes.append("a parallel block: attention and FFN read the layer's input side by side ("
                     + ("one norm feeds both" if block == "shared_norm" else "each behind its own norm")
                     + "), their outputs reduced over tensor parallelism together")
    if mtype == "gptj":
        notes.append("GPT-J: its attention projections' missing biases are counted as its FFN's are")
    if act == "relu2":
        notes.append("squared ReLU (relu2) costed as ReLU: the same two matrices, one element-wise op")
    if qwen35:
        notes.append("Qwen3.5: Qwen3-Next's layers; its Gated DeltaNet's four input projections (qkv, z, b, a) "
                     "costed as Qwen3-Next's one of their summed width (the same FLOPs, three kernels fewer)")
    if mtype == "phimoe":
        notes.append("Phi-MoE: its SparseMixer router costed as a top-k softmax router"
                     + (f"; its head's bias ({cfg['vocab_size']} values) is not counted" if cfg.get("lm_head_bias")
                        else ""))
    outputs_normed = {"olmo2": "OLMo 2: its", "olmo3": "OLMo 2: its", "exaone4": "EXAONE 4: its",
                      "olmo_hybrid": "OLMo Hybrid: its attention layers'"}.get(mtype)
    if outputs_normed:
        notes.append(f"{outputs_normed} norms on the attention's and the FFN's outputs, before the residual adds, "
                     f"costed as the pre-norms they replace (as many, of the same shape, each keeping its input)")
    if mtype in ("olmo", "olmoe") and cfg.get("clip_qkv"):
        notes.append(f"OLMo: clip_qkv's clamp of q, k and v to ±{cfg['clip_qkv']} is not costed")
    if mtype == "dbrx" and attn_cfg.get("clip_qkv"):
        notes.append(f"DBRX: clip_qkv's clamp of q, k and v to ±{attn_cfg['clip_qkv']} is not costed")
    granite = mtype in ("granite", "granitemoe", "granitemoeshared")
    if mtype in ("gemma", "gemma2", "gemma3_text") or granite:   # hidden * sqrt(h), embedding_multiplier
        extra["embedding_scale"] = True
    if mtype in ("cohere", "cohere2") or granite:    # logits * logit_scale, logits / logits_scaling
        extra["logit_scale"] = True
    if granite:                                      # residual + out * residual_multiplier
        extra["residual_scale"] = True
    if mtype == "minicpm3":   # embeddings * scale_emb, residual + out * scale_depth / sqrt(layers), the final
        extra.update(embedding_scale=True, residual_scale=True, head_scale=True)   # hidden / logits_scaling
    window, share = _hf_window(cfg, mtype, layers)
    if window and share < 1:
        extra["window_layer_share"] = share
    if mtype == "cohere2" and (not window or share < 1):   # only its windowed layers rotate (Cohere2Attention)
        extra["rope_layer_share"] = share if window else 0.0
    if mtype == "afmoe":   # only its local (sliding_attention) layers rotate, window or not (AfmoeAttention)
        local = _hf_sliding_layers(cfg, mtype, layers) / layers
        if local < 1:
            extra["rope_layer_share"] = local
        if cfg.get("mup_enabled"):   # muP's input scaling: the embeddings times sqrt(hidden)
            extra["embedding_scale"] = True
    if mtype == "exaone4" and window and share < 1:   # with a window only its windowed layers rotate
        extra["rope_layer_share"] = share             # (Exaone4Attention); without one every layer does
    if window or extra.get("attention_chunk"):
        notes.append(local_attention_phrase(window, extra.get("attention_chunk", 0),
                                            extra.get("window_layer_share", 1.0))
                     + " (in effect when the sequence is longer)")
    # a partial rotation: GPT-NeoX's rotary_pct, Phi's and StableLM's partial_rotary_factor, GPT-J's
    # and CodeGen's rotary_dim (its rotated width itself)
    rot_dim = 0
    if position == "rotary":
        width = extra.get("head_dim", 0) or cfg.get("head_dim") or hidden // heads
        rope = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
        # GLM's and Nemotron's configurations set a half by default, StableLM's and Qwen3-Next's (and so
        # Qwen3.5's) a quarter (their __post_init__)
        default = {"glm": 0.5, "glm4": 0.5, "glm4_moe": 0.5, "stablelm": 0.25, "nemotron": 0.5,
                   "qwen3_next": 0.25}.get(mtype, 1.0)
        share = _first(cfg, "rotary_pct", "partial_rotary_factor", default=rope.get("partial_rotary_factor", default))
        rot_dim = cfg.get("rotary_dim") if isinstance(cfg.get("rotary_dim"), int) else int(width * share) // 2 * 2
        rot_dim = rot_dim if 0 < rot_dim < width else 0
        if rot_dim:
            notes.append(f"rotary embedding on {rot_dim} of each head's {width} dimensions")
    model = Model(
        name=name or cfg.get("_name_or_path") or type_name or "hf-model",
        architecture="encoder" if encoder else "decoder",
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=extra.pop("head_dim", 0) or cfg.get("head_dim") or 0, ffn_hidden=extra.pop("ffn_hidden", ffn),
        activation=activation,
        vocab=cfg["vocab_size"], seq_len=seq, position_embedding=position,
        max_positions=(max_pos + (2 if mtype == "opt" else 0)) if position == "learned" else 0,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        norm=norm, norm_affine=norm_affine, norm_position="post" if post else "pre", bias=bias,
        dropout=bool(_first(cfg, "attention_probs_dropout_prob", "attn_pdrop", "dropout",
                            "attention_dropout", default=0.0)),
        embedding_norm=encoder or mtype == "bloom", embedding_projection_dim=proj if proj and proj != hidden else 0,
        token_types=cfg.get("type_vocab_size", 0) if encoder else 0, precision=precision,
        qkv_bias=qkv_bias, sliding_window=window, parallel_block=block, rotary_dim=rot_dim, notes=tuple(notes),
        **extra,
    )
    return check_model(model, source)


def _hf_parallel_block(cfg: dict, mtype: str) -> str:
    """A Hugging Face model's parallel block (:data:`PARALLEL_BLOCKS`), '' for a sequential layer:
    GPT-NeoX's ``use_parallel_residual`` (two norms, default on), GPT-J, Phi and CodeGen (one
    norm), Falcon's ``parallel_attn`` (one norm) or new decoder (``num_ln_in_parallel_attn``
    norms, two by default)."""
    if mtype == "gpt_neox":
        return "two_norms" if cfg.get("use_parallel_residual", True) else ""
    if mtype in ("gptj", "phi", "codegen", "cohere", "cohere2") or (mtype == "stablelm"
                                                                   and cfg.get("use_parallel_residual")):
        return "shared_norm"
    if mtype == "falcon":
        if cfg.get("new_decoder_architecture"):
            return "shared_norm" if cfg.get("num_ln_in_parallel_attn") == 1 else "two_norms"
        return "shared_norm" if cfg.get("parallel_attn", True) else ""
    return ""


def workload_dirs() -> list[Path]:
    """Where workload names are looked up: ./workloads, then the shipped ones."""
    return config_dirs("workloads")


# words after a published model's name that name a fine-tuned or repackaged variant of the same
# network (Llama-2-13b-chat-hf, Meta-Llama-3-8B-Instruct, Nemotron-4-340B-Base, Google's
# instruction-tuned gemma-2-9b-it): same shapes
VARIANT_WORDS = ("hf", "base", "instruct", "chat", "sft", "it")
# a trailing context length (NeMo 2.5.0's recipes llama3_8b_16k, llama3_8b_128k, mixtral_8x7b_64k,
# nemotron4_15b_64k: the same network trained at 16K to 128K tokens, which a row gives in seq_len)
CONTEXT_WORD = re.compile(r"\d+k")


# words that name a parameter-efficient fine-tuning method in a published model name (NeMo's
# performance tables write ``LLAMA3-70B (LoRA)``): adapters trained on frozen weights, a step
# without the base model's weight gradients, their reduction or its optimizer, which phaze does not
# model; such a name is refused (:func:`peft_error`) rather than read as full training of the network
PEFT_WORDS = ("lora", "qlora", "dora", "peft", "ptuning", "prefixtuning", "adapter", "adapters")
# what such a step is, which phaze does not cost (a name's refusal and validate's ``peft`` column's)
PEFT_REASON = ("adapters trained on frozen weights, with no weight gradients, gradient reduction or optimizer "
               "state for the base model")


def peft_error(name: str) -> str:
    """Why a published model name cannot be costed as full training: a word of it, in a qualifier in
    parentheses or not, that names a parameter-efficient method (:data:`PEFT_WORDS`); "" otherwise."""
    words = re.split(r"[^a-z0-9]+", name.strip().rpartition("/")[2].lower())
    found = next((w for w in words if w in PEFT_WORDS), "")
    if not found:
        return ""
    return (f"{name!r} names parameter-efficient fine-tuning ({found}): {PEFT_REASON}, are not modelled "
            f"(phaze costs full training of every weight)")


def name_key(name: str) -> str:
    """A published model name reduced for matching: lower case, letters, digits and dots only
    (``LLAMA2-70B``, ``Llama-2-70B`` and ``Llama 2 70B`` are one key)."""
    return re.sub(r"[^a-z0-9.]", "", name.lower())


def name_keys(name: str) -> tuple[str, ...]:
    """The keys a published name may match, most specific first: the name itself; without a
    Hugging Face organisation (``meta-llama/``); without a trailing qualifier in parentheses (NeMo's
    performance tables write ``LLAMA2-70B (SFT)`` for a fine-tuning run of Llama 2 70B); without
    trailing :data:`VARIANT_WORDS` or context length (:data:`CONTEXT_WORD`). Each drops only what
    names the run or the checkpoint, not the network."""
    text = name.strip().rpartition("/")[2]
    forms = [name, text]
    bare = re.sub(r"(\s*\([^()]*\))+$", "", text).strip()
    forms.append(bare)
    words = re.split(r"[-_\s]+", bare)
    while len(words) > 1 and (words[-1].lower() in VARIANT_WORDS or CONTEXT_WORD.fullmatch(words[-1].lower())):
        words.pop()
        forms.append("-".join(words))
    return tuple(dict.fromkeys(k for k in map(name_key, forms) if k))


@lru_cache(maxsize=4)
def _published_names(dirs: tuple[Path, ...]) -> dict[str, Path]:
    """Name key -> workload file: each workload's file stem and model name in ``dirs`` (the first
    wins: ./workloads, then the shipped ones) and the spellings of ``phaze/data/model_aliases.csv``
    (each with its source)."""
    out: dict[str, Path] = {}
    for d in reversed(dirs):
        for path in sorted(d.glob("*.yaml")) if d.is_dir() else ():
            try:
                model_name = str(read_mapping(path).get("name") or path.stem)
            except ConfigError:
                continue
            out[name_key(path.stem)] = out[name_key(model_name)] = path
    for key, row in catalogue("model_aliases.csv").items():
        target = out.get(name_key(row["model"]))
        if target:
            out.setdefault(key, target)
    return out


def catalogue_rows(filename: str) -> list[dict]:
    """The rows of a catalogue of published models in ``phaze/data`` (``model``, ``aliases``
    joined by ';', ``source``, ...)."""
    with (Path(__file__).resolve().parent / "data" / filename).open(newline="") as fh:
        return list(csv.DictReader(fh))


def catalogue(filename: str) -> dict[str, dict]:
    """:func:`catalogue_rows` by the name key of each row's model and of each of its aliases."""
    return {name_key(name): row for row in catalogue_rows(filename)
            for name in [row["model"], *row["aliases"].split(";")] if name.strip()}


def workload_aliases() -> dict[str, str]:
    """Each spelling of ``phaze/data/model_aliases.csv``, in lower case -> the stem of the shipped
    workload it names: names ``--workload`` takes as they are and offers when one is mistyped."""
    return dict(_aliases(tuple(workload_dirs())))


@lru_cache(maxsize=4)
def _aliases(dirs: tuple[Path, ...]) -> dict[str, str]:
    names = _published_names(dirs)
    out = {}
    for row in catalogue_rows("model_aliases.csv"):
        target = names.get(name_key(row["model"]))
        for alias in row["aliases"].split(";") if target else ():
            if alias.strip():
                out[alias.strip().lower()] = target.stem
    return out


def find_workload(name: str) -> Path | None:
    """The workload file a published model name names (by :func:`name_keys`), or None."""
    names = _published_names(tuple(workload_dirs()))
    return next((names[k] for k in name_keys(name) if k in names), None)


def workload_path(name_or_path: str | Path) -> Path:
    """The file of a workload name (shipped, or a published name in ``phaze/data/model_aliases.csv``,
    in any of the spellings :func:`name_keys` reads) or path."""
    try:
        return resolve_config(str(name_or_path), "workloads", "workload", "--workload", workload_aliases())
    except ConfigError:
        peft = peft_error(name_or_path) if isinstance(name_or_path, str) else ""
        if peft:
            raise ConfigError("--workload", None, peft) from None
        found = find_workload(str(name_or_path)) if isinstance(name_or_path, str) else None
        if found is None:
            raise
        return found


def load_model(name_or_path: str | Path, seq_len: int | None = None) -> Model:
    """Load a workload by shipped name, YAML path or Hugging Face ``config.json`` path."""
    path = workload_path(name_or_path)
    data = read_mapping(path)
    if path.suffix == ".json":
        # a repository's config.json is named by its folder, another JSON file by its own name
        stem = path.stem if path.stem != "config" else ""
        model = model_from_hf_config(data, str(path), name=stem or path.parent.name or "config")
    else:
        model = _model_from_yaml(data, str(path))
    named = named_context(name_or_path, path, model) if seq_len is None and isinstance(name_or_path, str) else None
    if named is not None:
        return with_seq_len(model, named, f"named by {name_or_path!r}")
    if seq_len is not None:
        model = with_seq_len(model, seq_len)
    return model


def named_context(name: str, path: Path, model: Model) -> int | None:
    """The sequence length a published name found by dropping its trailing context length
    (:data:`CONTEXT_WORD`: NeMo's ``llama3_8b_16k`` trains Llama 3 8B at 16,384 tokens) says, in
    tokens (K = 1,024); None when the name is the file's or the model's own, or has no such word."""
    word = re.split(r"[-_\s]+", name.strip().rpartition("/")[2])[-1].lower()
    if not CONTEXT_WORD.fullmatch(word) or name_key(name) in (name_key(path.stem), name_key(model.name)):
        return None
    return int(word[:-1]) * 1024


def with_seq_len(model: Model, seq_len: int, why: str = "set by --seq-len") -> Model:
    """The model trained at another sequence length; a learned position table grows to match
    (as llm-foundry's benchmark configs size it to ``max_seq_len``)."""
    if seq_len == model.seq_len:
        return model
    grow = model.position_embedding == "learned" and model.max_positions < seq_len
    notes = tuple(n for n in model.notes if not n.startswith("sequence length")) + (
        f"sequence length {seq_len} ({why})",)
    return replace(model, seq_len=seq_len, notes=notes,
                   max_positions=seq_len if grow else model.max_positions)


def published_params(name_or_path: str | Path) -> int | None:
    """The published parameter count recorded in a shipped workload file, if any."""
    path = workload_path(name_or_path)
    return read_mapping(path).get("published_params")
