"""Hugging Face ``config.json`` files as phaze workloads: the fields each model family writes,
read into a :class:`phaze.workload.Model`, with a note for each choice the file leaves open and one
clear line for a field phaze cannot express.
"""
from __future__ import annotations

import math

from .configio import MAX_INT, ConfigError
from .workload import (
    Model,
    check_model,
    hybrid_error,
    local_attention_phrase,
)

# a Hugging Face config's activation (hidden_act, hidden_activation or activation_function), by
# whether its type's FFN is gated (_HF_GATED) or not
_GELUS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_python", "gelu_accurate")
# (relu2, squared ReLU, costed as ReLU, as the Nemotron workloads are: the same two matrices and
# one element-wise op)
_ACTIVATIONS = {**dict.fromkeys(_GELUS, "gelu"), "relu": "relu", "relu2": "relu"}
_GATED = {**dict.fromkeys(_GELUS, "geglu"), "silu": "swiglu", "swish": "swiglu", "swiglu": "swiglu"}


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
