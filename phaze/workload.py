"""Transformer workloads: the model description, its parameter count and its FLOP formulas.

A workload is read from ``workloads/<name>.yaml`` (or any YAML path) or from a Hugging Face
``config.json`` (:mod:`phaze.hf_config`), found by name by :mod:`phaze.catalogue`. Everything
downstream (operator graphs, memory, step time) derives from the frozen :class:`Model`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from .configio import ConfigError, Fields

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
    # one-kind view phaze.stage.layer_mix takes of the linear layers)
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
def model_from_yaml(data: dict, source: str) -> Model:
    """The model a workload YAML's mapping describes (``source`` names the file in errors)."""
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


def local_attention_phrase(window: int, chunk: int, share: float) -> str:
    """How a sliding window of ``window`` tokens (else chunks of ``chunk``) in ``share`` of the
    layers reads in a note or a printout."""
    kind = (f"sliding-window attention over {window} tokens" if window else
            f"chunked attention in chunks of {chunk} tokens")
    return kind + (f" in {share:.0%} of the layers (the others attend to every earlier token)" if share < 1 else "")


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
