"""Llama's kin read from their Hugging Face configs as transformers 5.25.0 builds them: Arcee's AFM
and NVIDIA's Nemotron checkpoints (models/arcee, models/nemotron: an ungated squared-ReLU MLP),
Kyutai's Helium, Tencent's Hunyuan dense, LG's EXAONE 4, Microsoft's Phi-MoE, OpenBMB's MiniCPM3,
Mistral 4 and Ministral 3 (models/helium, hunyuan_v1_dense, exaone4, phimoe, minicpm3, mistral4,
ministral3); parameter counts by hand."""
from __future__ import annotations

from dataclasses import replace

import pytest

from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.graph import edge_graph, layer_graph
from phaze.hf_config import model_from_hf_config

AFM = dict(model_type="arcee", hidden_size=2560, intermediate_size=18432, num_hidden_layers=36,
           num_attention_heads=20, num_key_value_heads=4, head_dim=128, hidden_act="relu2", vocab_size=128004,
           max_position_embeddings=65536, rope_theta=10000, tie_word_embeddings=False)
MINITRON = dict(model_type="nemotron", hidden_size=4096, intermediate_size=16384, num_hidden_layers=32,
                num_attention_heads=48, num_key_value_heads=8, head_dim=128, vocab_size=256000,
                max_position_embeddings=4096)


def test_arcee_afm_by_hand():
    """AFM-4.5B's shapes (arcee-ai/AFM-4.5B, as remembered): per layer q and o of 2,560 x 2,560,
    k and v of 2,560 x 512 (4 kv heads of 128), an ungated MLP of 2 x 2,560 x 18,432 and two RMSNorm
    weights; untied 128,004-row tables: 4,619,184,640."""
    m = model_from_hf_config(AFM)
    h, f, kv, V = 2560, 18432, 512, 128004
    layer = 2 * h * h + 2 * h * kv + 2 * h * f + 2 * h
    assert m.params == 36 * layer + h + 2 * V * h == 4_619_184_640
    assert (m.activation, m.gated, m.norm, m.bias, m.qkv_bias, m.position_embedding, m.rotary_dim) == \
        ("relu", False, "rmsnorm", False, False, "rotary", 0)
    assert any(n.startswith("squared ReLU (relu2) costed as ReLU") for n in m.notes)
    # the FFN: two GEMMs and one activation kernel between them, no gate
    g = layer_graph(m, 1)
    names = [o.name for o in g.fwd]
    assert names[names.index("ffn_up"):names.index("ffn_down") + 1] == ["ffn_up", "relu", "ffn_down"]
    assert next(o for o in g.fwd if o.name == "ffn_up").gemm == (1, m.seq_len, h, f)


def test_nemotron_by_hand_and_its_half_rotation():
    """Minitron-8B's shapes (nvidia/Minitron-8B-Base, as remembered): per layer q and o of 4,096 x
    6,144, k and v of 4,096 x 1,024, an ungated MLP of 2 x 4,096 x 16,384, two LayerNorm1p with
    weight and bias; untied 256,000-row tables: 8,271,699,968; NemotronConfig rotates half of each
    128-wide head by default."""
    m = model_from_hf_config(MINITRON)
    h, f, q, kv, V = 4096, 16384, 6144, 1024, 256000
    layer = 2 * h * q + 2 * h * kv + 2 * h * f + 2 * 2 * h
    assert m.params == 32 * layer + 2 * h + 2 * V * h == 8_271_699_968
    assert (m.norm, m.norm_affine, m.rotary_dim, m.activation, m.tied_embeddings) == \
        ("layernorm", "weight_bias", 64, "relu", False)
    assert model_from_hf_config({**MINITRON, "partial_rotary_factor": 1.0}).rotary_dim == 0


def test_nemotron4_15b_config_is_the_shipped_network_with_layernorm_biases():
    """Nemotron-4 15B's shape as a `nemotron` config is the shipped workload but for the LayerNorm1p
    biases transformers builds (the shipped YAML follows Megatron, whose bias terms were off): 65
    norms of 6,144 more."""
    shipped = load_model("nemotron4-15b")
    m = model_from_hf_config(dict(model_type="nemotron", hidden_size=6144, intermediate_size=24576,
                                  num_hidden_layers=32, num_attention_heads=48, num_key_value_heads=8,
                                  vocab_size=256000))
    assert m.params - shipped.params == (2 * 32 + 1) * 6144
    assert (m.rotary_dim, m.kv_heads, m.ffn_hidden, m.activation) == (shipped.rotary_dim, 8, 24576, "relu")


@pytest.mark.parametrize("mtype", ["arcee", "nemotron"])
def test_the_bias_switches_as_llama(mtype):
    """attention_bias and mlp_bias together put a bias on every linear; attention_bias alone on
    q, k and v (the output projection's noted, not counted); mlp_bias alone is refused; the class
    defaults fill a config without an FFN width or activation."""
    cfg = AFM if mtype == "arcee" else MINITRON
    both = model_from_hf_config({**cfg, "attention_bias": True, "mlp_bias": True})
    assert (both.bias, both.qkv_bias) == (True, False)
    attn = model_from_hf_config({**cfg, "attention_bias": True})
    assert (attn.bias, attn.qkv_bias) == (False, True)
    with pytest.raises(ConfigError, match="field 'mlp_bias': must be false without attention_bias"):
        model_from_hf_config({**cfg, "mlp_bias": True})
    bare = {k: v for k, v in cfg.items() if k not in ("intermediate_size", "hidden_act")}
    m = model_from_hf_config(bare)
    assert (m.ffn_hidden, m.activation) == ({"arcee": 18432, "nemotron": 24576}[mtype], "relu")
    with pytest.raises(ConfigError, match="field 'hidden_act': must be one of"):
        model_from_hf_config({**cfg, "hidden_act": "silu"})


def test_helium_by_hand():
    """Helium-1 2B's shapes (kyutai/helium-1-preview-2b, as remembered): Llama's layer, 20 heads of
    128 over 2,560, a SwiGLU of 7,040; attention_bias on q, k and v only (HeliumAttention's o_proj
    never has one); untied 48,000-row tables."""
    m = model_from_hf_config(dict(model_type="helium", hidden_size=2560, intermediate_size=7040, num_hidden_layers=24,
                                  num_attention_heads=20, num_key_value_heads=20, head_dim=128, vocab_size=48000,
                                  attention_bias=True))
    h, f, V = 2560, 7040, 48000
    layer = 4 * h * h + 3 * h * f + 2 * h + 3 * h
    assert m.params == 24 * layer + h + 2 * V * h == 2_172_828_160
    assert (m.qkv_bias, m.bias, m.norm, m.activation) == (True, False, "rmsnorm", "swiglu")
    assert "never on its output projection" in m.notes[-1]


def test_hunyuan_dense_by_hand():
    """Hunyuan-7B's shapes (tencent/Hunyuan-7B, as remembered): per layer q and o of 4,096², k and
    v of 4,096 x 1,024, a SwiGLU of 14,336, two norms and the per-head q and k RMSNorms (128 each,
    after the rotary embedding in HunYuanDenseV1Attention); a tied 128,167-row table."""
    m = model_from_hf_config(dict(model_type="hunyuan_v1_dense", hidden_size=4096, intermediate_size=14336,
                                  num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                  vocab_size=128167, tie_word_embeddings=True))
    h, f, kv, V = 4096, 14336, 1024, 128167
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h + 2 * 128
    assert m.params == 32 * layer + h + V * h == 7_504_568_320
    assert (m.qk_norm, m.qk_norm_width, m.tied_embeddings) == (True, "head", True)
    qn = [o for o in layer_graph(m, 1).fwd if o.name in ("q.norm", "k.norm")]
    assert [o.elements for o in qn] == [m.seq_len * 32 * 128, m.seq_len * 8 * 128]


EXAONE4_32B = dict(model_type="exaone4", hidden_size=5120, intermediate_size=27392, num_hidden_layers=64,
                   num_attention_heads=40, num_key_value_heads=8, head_dim=128, vocab_size=102400,
                   sliding_window=4096, sliding_window_pattern="LLLG", max_position_embeddings=131072)


def test_exaone4_by_hand_its_windows_and_rotation():
    """EXAONE 4.0 32B's shapes (LGAI-EXAONE/EXAONE-4.0-32B, as remembered): per layer q and o of
    5,120², k and v of 5,120 x 1,024, a SwiGLU of 27,392, the norms after the attention and the
    MLP and the per-head q and k norms; untied 102,400-row tables: 32,003,216,384, the published
    "32.0B". Its "LLLG" pattern windows three layers of four (4,096 tokens) and only those rotate
    (Exaone4Attention); without a window every layer is global and rotates."""
    m = model_from_hf_config(EXAONE4_32B)
    h, f, kv, V = 5120, 27392, 1024, 102400
    layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h + 2 * 128
    assert m.params == 64 * layer + h + 2 * V * h == 32_003_216_384
    assert (m.sliding_window, m.window_layer_share, m.rope_layer_share, m.qk_norm) == (4096, 0.75, 0.75, True)
    assert any(n.startswith("EXAONE 4: its norms on the attention's") for n in m.notes)
    # the same read from a count (the class default, 4), from layer_types, or with no window
    count = {**EXAONE4_32B, "sliding_window_pattern": 4}
    assert model_from_hf_config(count).window_layer_share == 0.75
    typed = {**EXAONE4_32B, "layer_types": ["sliding_attention", "full_attention"] * 32}
    assert (model_from_hf_config(typed).window_layer_share, model_from_hf_config(typed).rope_layer_share) == (0.5, 0.5)
    none = model_from_hf_config({**EXAONE4_32B, "sliding_window": None})
    assert (none.sliding_window, none.rope_layer_share) == (0, 1.0)
    with pytest.raises(ConfigError, match="field 'sliding_window_pattern': must be a whole number or a string of L"):
        model_from_hf_config({**EXAONE4_32B, "sliding_window_pattern": "LLXG"})


def test_phimoe_by_hand():
    """Phi-3.5-MoE's shapes (microsoft/Phi-3.5-MoE-instruct, as remembered): Mixtral's layout, 16
    SwiGLU experts of 6,400, 2 a token, under LayerNorms with biases, q, k and v biases (the output
    projection's noted); untied 32,064-row tables: 41,872,990,208 in all and 6,640,836,608 a token,
    Microsoft's "41.9B" and "6.6B active"."""
    m = model_from_hf_config(dict(model_type="phimoe", hidden_size=4096, intermediate_size=6400, num_hidden_layers=32,
                                  num_attention_heads=32, num_key_value_heads=8, vocab_size=32064, attention_bias=True,
                                  lm_head_bias=True, num_local_experts=16, num_experts_per_tok=2,
                                  sliding_window=131072))
    h, f, kv, V, E, k = 4096, 6400, 1024, 32064, 16, 2
    shared = 2 * h * h + 2 * h * kv + (h + 2 * kv) + E * h + 2 * 2 * h
    assert m.params == 32 * (shared + E * 3 * h * f) + 2 * h + 2 * V * h == 41_872_990_208
    assert m.active_params == 32 * (shared + k * 3 * h * f) + 2 * h + 2 * V * h == 6_640_836_608
    assert (m.norm, m.norm_affine, m.experts, m.top_k, m.expert_ffn_hidden) == ("layernorm", "weight_bias", E, k, f)
    assert any("SparseMixer" in n and "head's bias (32064 values)" in n for n in m.notes)


MINICPM3_4B = dict(model_type="minicpm3", hidden_size=2560, intermediate_size=6400, num_hidden_layers=62,
                   num_attention_heads=40, num_key_value_heads=40, vocab_size=73448, max_position_embeddings=32768,
                   qk_nope_head_dim=64, qk_rope_head_dim=32, kv_lora_rank=256, q_lora_rank=768, scale_emb=12,
                   scale_depth=1.4, dim_model_base=256, tie_word_embeddings=True)


def test_minicpm3_by_hand_with_its_three_scales():
    """MiniCPM3-4B (openbmb/MiniCPM3-4B, the class defaults): DeepSeek-V2's latent attention, 40 heads
    of 64 + 32 (the value heads 64 wide, the hidden width's share), queries through a 768-wide
    latent, keys and values through 256 and one shared 32-wide rotary key; a SwiGLU of 6,400; a tied
    73,448-row table: 4,073,875,968. Its embedding times scale_emb, each branch times scale_depth /
    sqrt(layers) and the final hidden states divided by logits_scaling, each a kernel of its own
    each way over T x h (MiniCPM3ForCausalLM divides the hidden states, not the logits)."""
    m = model_from_hf_config(MINICPM3_4B)
    h, f, a, V = 2560, 6400, 40, 73448
    attn = h * 768 + 768 + 768 * a * 96 + h * (256 + 32) + 256 + 256 * a * (64 + 64) + a * 64 * h
    layer = attn + 3 * h * f + 2 * h
    assert m.params == 62 * layer + h + V * h == 4_073_875_968
    assert (m.mla, m.head_dim, m.v_head_dim, m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim) == \
        (True, 96, 64, 768, 256, 32)
    assert (m.embedding_scale, m.residual_scale, m.head_scale, m.logit_scale) == (True, True, True, False)
    T = m.seq_len
    head = {o.name: o for o in edge_graph(m, 1)["head"]}
    for name in ("head.scale", "head.scale.bwd"):
        assert (head[name].elements, head[name].bytes_read, head[name].bytes_written) == (T * h, 2 * T * h, 2 * T * h)
    names = [o.name for o in edge_graph(m, 1)["head"]]
    assert names.index("final_norm") < names.index("head.scale") < names.index("logits")
    assert [o.name for o in layer_graph(m, 1).fwd].count("attn_out.scale") == 1
    # without the scale the head is two kernels lighter; with an unmodelled bias it is refused
    plain = edge_graph(replace(m, head_scale=False), 1)["head"]
    assert len(head) - len(plain) == 2
    with pytest.raises(ConfigError, match="field 'attention_bias': must be false for minicpm3"):
        model_from_hf_config({**MINICPM3_4B, "attention_bias": True})


@pytest.mark.parametrize("mtype", ["minicpm3", "deepseek_v2", "deepseek_v3"])
def test_a_latent_attention_config_without_its_latent_is_one_line(mtype):
    """kv_lora_rank 0 or null would read a latent-attention type as ordinary heads of MLA's widths:
    refused naming the key; a null head width is 0, not a traceback."""
    base = {**MINICPM3_4B, "model_type": mtype}
    refused = f"field 'kv_lora_rank': must be a whole number of at least 1 for {mtype}"
    for bad in (0, None):
        with pytest.raises(ConfigError, match=refused):
            model_from_hf_config({**base, "kv_lora_rank": bad})
    assert model_from_hf_config({**base, "qk_nope_head_dim": None}).head_dim == 32


def test_mistral4_and_ministral3_by_hand_with_their_query_scale():
    """Mistral 4 (Mistral4Config's defaults): DeepSeek-V3's layer, MLA with a 1,024-wide query latent
    and a 256-wide key/value latent, 32 heads of 64 + 64 (values 128), 128 experts of 2,048, 4 a
    token, one shared, a dense-free stack of 36 layers; untied 131,072-row tables: 118,972,826,624.
    Ministral 3 (Ministral3Config's defaults, read from a mistral3 multimodal config): Mistral's
    layer, 32 heads of 128, 8 kv heads, a SwiGLU of 14,336, 34 layers: 8,489,553,920. Both multiply
    every layer's queries by llama_4_scaling's factor of their position: one product kernel over
    the queries each way."""
    m = model_from_hf_config(dict(model_type="mistral4", hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                                  vocab_size=131072))
    h, a, V = 4096, 32, 131072
    mla = h * 1024 + 1024 + 1024 * a * 128 + h * (256 + 64) + 256 + 256 * a * (64 + 128) + a * 128 * h
    layer = mla + 128 * 3 * h * 2048 + 3 * h * 2048 + 128 * h + 2 * h
    assert m.params == 36 * layer + 2 * V * h + h == 118_972_826_624
    assert (m.mla, m.experts, m.top_k, m.shared_experts, m.query_scale_share) == (True, 128, 4, 1, 1.0)
    ops = {o.name: o for o in layer_graph(m, 1).fwd}
    assert ops["q.scale"].elements == m.seq_len * a * 128 and ops["q.scale"].grad == "scale"
    m3 = model_from_hf_config(dict(model_type="mistral3", text_config=dict(
        model_type="ministral3", hidden_size=4096, num_hidden_layers=34, num_attention_heads=32, vocab_size=V)))
    layer3 = 2 * h * h + 2 * h * 1024 + 3 * h * 14336 + 2 * h
    assert m3.params == 34 * layer3 + 2 * V * h + h == 8_489_553_920
    assert (m3.query_scale_share, m3.kv_heads, m3.sliding_window) == (1.0, 8, 0)
    windowed = dict(model_type="ministral3", hidden_size=4096, num_hidden_layers=34, num_attention_heads=32,
                    vocab_size=V, sliding_window=4096)
    assert model_from_hf_config(windowed).sliding_window == 4096   # Mistral's: in every layer
