"""Arcee's AFM and NVIDIA's Nemotron checkpoints read from their Hugging Face configs as transformers
5.25.0 builds them (models/arcee, models/nemotron: Llama's layer with an ungated squared-ReLU MLP);
parameter counts by hand."""
from __future__ import annotations

import pytest

from phaze.configio import ConfigError
from phaze.graph import layer_graph
from phaze.workload import load_model, model_from_hf_config

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
