"""OLMo 2, OLMo 3, OLMoE, GLM-4.5 and SmolLM3 read from their Hugging Face configs as transformers
5.25.0 builds them (models/olmo2, olmo3, olmoe, glm4_moe, smollm3), a type's class defaults filling
what a config leaves out, and q/k norms over the whole projection; parameter counts by hand."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.graph import layer_graph
from phaze.hf_config import model_from_hf_config

ROOT = Path(__file__).resolve().parent.parent

OLMO2_7B = dict(model_type="olmo2", vocab_size=100352, hidden_size=4096, intermediate_size=11008,
                num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                max_position_embeddings=4096, rope_theta=500000, rms_norm_eps=1e-6)


def test_olmo2_7b_by_hand():
    """OLMo 2 7B (allenai/OLMo-2-1124-7B's shapes): per layer q, k, v, o of 4096², a SwiGLU FFN of
    11,008, the norms after the attention and the FFN (4,096 each) and the q and k norms over the
    whole 4,096-wide projections; a final norm and untied 100,352-row tables: 7,298,617,344, the
    "7.3B" AI2 publishes (as remembered)."""
    m = model_from_hf_config(OLMO2_7B)
    h, f, V = 4096, 11008, 100352
    layer = 4 * h * h + 3 * h * f + 2 * h + 2 * h
    assert m.params == 32 * layer + h + 2 * V * h == 7_298_617_344
    assert (m.qk_norm, m.qk_norm_width, m.activation, m.norm, m.tied_embeddings) == \
        (True, "projection", "swiglu", "rmsnorm", False)
    assert any("pre-norms they replace" in n for n in m.notes)
    # the same model with per-head norms would count two head widths a layer instead
    assert m.params - replace(m, qk_norm_width="head").params == 32 * (2 * h - 2 * 128)


def test_olmoe_by_hand_and_its_class_defaults():
    """OLMoE-1B-7B (allenai/OLMoE-1B-7B-0924's shapes) with its expert counts left out: the class
    defaults, 64 experts of which 8 a token (OlmoeConfig), each a SwiGLU of intermediate_size
    1,024; per layer attention 4 x 2048², q and k norms over 2,048, a 64 x 2,048 router, two
    norms: 6,919,161,856 in all and 1,282,017,280 a token, the published 6.9B and 1.3B (as
    remembered)."""
    m = model_from_hf_config(dict(model_type="olmoe", vocab_size=50304, hidden_size=2048, intermediate_size=1024,
                                  num_hidden_layers=16, num_attention_heads=16, max_position_embeddings=4096))
    h, f, E, k = 2048, 1024, 64, 8
    attn, norms, router = 4 * h * h + 2 * h, 2 * h, E * h
    total = 16 * (attn + norms + router + E * 3 * h * f) + h + 2 * 50304 * h
    assert (m.experts, m.top_k, m.expert_ffn_hidden, m.shared_experts) == (E, k, f, 0)
    assert m.params == total == 6_919_161_856
    assert m.active_params == total - 16 * (E - k) * 3 * h * f == 1_282_017_280
    assert model_from_hf_config(dict(model_type="olmoe", vocab_size=50304, hidden_size=2048, num_hidden_layers=2,
                                     num_attention_heads=16, clip_qkv=8.0)).notes[-1].startswith("OLMo: clip_qkv")


def test_olmo3_windows_three_layers_of_four():
    """OLMo 3: OLMo 2's layer with a 4,096-token window in three of every four layers (Olmo3Config's
    default layer_types), or in those its layer_types mark."""
    cfg = {**OLMO2_7B, "model_type": "olmo3", "max_position_embeddings": 65536}
    m = model_from_hf_config(cfg)
    assert (m.sliding_window, m.window_layer_share, m.qk_norm_width) == (4096, 0.75, "projection")
    kinds = ["sliding_attention"] * 16 + ["full_attention"] * 16
    m = model_from_hf_config({**cfg, "sliding_window": 1024, "layer_types": kinds})
    assert (m.sliding_window, m.window_layer_share) == (1024, 0.5)


def test_glm45_air_by_hand():
    """GLM-4.5-Air's shapes, as Glm4MoeConfig's defaults give them (hidden 4,096, 96 heads of 128,
    8 KV heads, the first layer dense of 10,944, then 128 routed experts of 1,408 of which 8 a
    token and one shared, a sigmoid router of 128 x 4,096, one multi-token-prediction layer, half
    of each head rotated), attention_bias on q, k and v only: 106,852,245,504 in the main model,
    106.9B against the published 106B; 12.18B active a token beside the embeddings, the published
    12B (as remembered)."""
    m = model_from_hf_config(dict(model_type="glm4_moe", vocab_size=151552, hidden_size=4096, num_hidden_layers=46,
                                  num_attention_heads=96, head_dim=128, attention_bias=True,
                                  max_position_embeddings=131072))
    h, q, kv, V = 4096, 96 * 128, 8 * 128, 151552
    attn = h * q + q + 2 * (h * kv + kv) + q * h
    moe = attn + 2 * h + 128 * 3 * h * 1408 + 3 * h * 1408 + 128 * h
    dense = attn + 2 * h + 3 * h * 10944
    assert (m.experts, m.top_k, m.shared_experts, m.dense_layers, m.mtp_layers) == (128, 8, 1, 1, 1)
    assert (m.rotary_dim, m.qkv_bias, m.bias, m.qk_norm, m.router_groups) == (64, True, False, False, 0)
    assert m.params == 45 * moe + dense + h + 2 * V * h == 106_852_245_504
    active = m.active_params - 2 * V * h
    assert active == m.params - 2 * V * h - 45 * 120 * 3 * h * 1408
    assert round(active / 1e9, 2) == 12.18
    qk = model_from_hf_config(dict(model_type="glm4_moe", vocab_size=151552, hidden_size=4096, num_hidden_layers=4,
                                   num_attention_heads=96, head_dim=128, use_qk_norm=True, partial_rotary_factor=1.0))
    assert (qk.qk_norm, qk.qk_norm_width, qk.rotary_dim) == (True, "head", 0)


def test_class_defaults_fill_what_a_config_leaves_out():
    """A key a config leaves out is read as its type's configuration class sets it, and a key
    given as null stays null: Gemma's GELU (GeGLU), Mistral's 4,096-token window, Gemma 2's
    soft-caps, Mixtral's 8 experts of which 2, Qwen3's 128-wide heads."""
    base = dict(vocab_size=1000, hidden_size=1024, num_hidden_layers=2, num_attention_heads=16)
    assert model_from_hf_config({**base, "model_type": "gemma"}).activation == "geglu"
    assert model_from_hf_config({**base, "model_type": "mistral"}).sliding_window == 4096
    assert model_from_hf_config({**base, "model_type": "mistral", "sliding_window": None}).sliding_window == 0
    g2 = model_from_hf_config({**base, "model_type": "gemma2"})
    assert (g2.attention_softcap, g2.logit_softcap, g2.head_dim, g2.kv_heads) == (50.0, 30.0, 256, 4)
    mx = model_from_hf_config({**base, "model_type": "mixtral"})
    assert (mx.experts, mx.top_k, mx.ffn_hidden, mx.kv_heads) == (8, 2, 14336, 8)
    assert model_from_hf_config({**base, "model_type": "qwen3"}).head_dim == 128


def test_projection_norms_all_reduce_their_sums_under_tensor_parallelism():
    """Under tp 2 a norm over the whole projection needs each token's sums of squares of q and of
    k from both ranks: one fp32 all-reduce of 2 x 4 bytes a token in the forward and one in the
    backward (the gradient's sums); per-head norms and tp 1 need none."""
    m = replace(load_model("qwen3-8b"), qk_norm_width="projection")
    T = m.seq_len
    g = layer_graph(m, 1, 2, True, "flash", "none")
    fwd = {o.name: o for o in g.fwd}
    bwd = {o.name: o for o in g.bwd}
    c = fwd["qk.norm.all_reduce"].collective
    assert (c.kind, c.group, c.bytes) == ("all_reduce", "tp", 8 * T)
    b = bwd["qk.norm.all_reduce.bwd"].collective
    assert (b.kind, b.group, b.bytes) == ("all_reduce", "tp", 8 * T)
    for graph in (layer_graph(load_model("qwen3-8b"), 1, 2, True), layer_graph(m, 1, 1)):
        assert not [o.name for o in graph.ops if o.name.startswith("qk.norm.all_reduce")]


def test_qk_norm_width_is_checked(tmp_path):
    """``qk_norm_width: projection`` needs q/k norms and an attention without MLA; another width
    is refused naming the key."""
    path = tmp_path / "w.yaml"
    text = "name: t\nlayers: 2\nhidden: 64\nheads: 4\nffn_hidden: 128\nvocab: 100\nseq_len: 32\n"
    path.write_text(text + "qk_norm: true\nqk_norm_width: projection\n")
    assert load_model(path).qk_norm_params == 64 + 64
    for extra, why in (("qk_norm_width: projection\n", "qk_norm_width.*needs qk_norm"),
                       ("qk_norm: true\nqk_norm_width: full\n", "qk_norm_width")):
        path.write_text(text + extra)
        with pytest.raises(ConfigError, match=why):
            load_model(path)


def test_the_printout_says_the_norms_are_over_the_projection(tmp_path, capsys):
    """``phaze evaluate`` on an OLMo 2 config.json lists the projection-wide norms among what it
    assumed from the workload, with the reordered norms' note."""
    import json

    from phaze.cli import main
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**OLMO2_7B, "num_hidden_layers": 4}))
    assert main(["evaluate", "--workload", str(path), "--arch", "h100-sxm", "--devices", "8",
                 "--global-batch", "8", "--seq-len", "1024", "--plan", "tp=2"]) == 0
    out = capsys.readouterr().out
    assert "normed over the whole projection" in out and "pre-norms they replace" in out


def test_a_json_file_is_named_by_its_own_name_a_config_json_by_its_folder(tmp_path):
    """A repository's ``config.json`` takes its folder's name (``OLMo-2-1124-7B``); another JSON
    file its own (``olmo2-7b.json``), not the folder it happens to sit in."""
    import json
    repo = tmp_path / "OLMo-2-1124-7B"
    repo.mkdir()
    (repo / "config.json").write_text(json.dumps(OLMO2_7B))
    (tmp_path / "olmo2-7b.json").write_text(json.dumps(OLMO2_7B))
    assert load_model(repo / "config.json").name == "OLMo-2-1124-7B"
    assert load_model(tmp_path / "olmo2-7b.json").name == "olmo2-7b"


def test_the_hf_configs_give_the_shipped_workloads():
    """OLMo 2 7B's and OLMoE-1B-7B's Hugging Face shapes read as the shipped files describe them:
    the same parameters and the same fields that cost them."""
    olmoe = dict(model_type="olmoe", vocab_size=50304, hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
                 num_attention_heads=16, max_position_embeddings=4096)
    for cfg, name in ((OLMO2_7B, "olmo2-7b"), (olmoe, "olmoe-1b-7b")):
        hf, shipped = model_from_hf_config(cfg), load_model(name)
        assert (hf.params, hf.active_params) == (shipped.params, shipped.active_params)
        for key in ("qk_norm", "qk_norm_width", "activation", "norm", "tied_embeddings", "kv_heads", "experts",
                    "top_k", "expert_ffn_hidden", "seq_len", "position_embedding", "bias"):
            assert getattr(hf, key) == getattr(shipped, key), (name, key)


def test_smollm3_by_hand_and_its_windows():
    """SmolLM3-3B's shapes (36 layers of 2,048, 16 query and 4 key/value heads, SwiGLU of 11,008, a
    tied 128,256-row table): 3,075,098,624, the published 3.08B (as remembered); every fourth layer
    without a rotary embedding (``rope_layer_share`` 27/36, or as no_rope_layers marks); a window only
    under use_sliding_window, in those NoPE layers (SmolLM3Config) or where layer_types says."""
    cfg = dict(model_type="smollm3", vocab_size=128256, hidden_size=2048, intermediate_size=11008,
               num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=65536)
    m = model_from_hf_config(cfg)
    h, kv, f = 2048, 512, 11008
    assert m.params == 36 * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + h + 128256 * h == 3_075_098_624
    assert (m.tied_embeddings, m.sliding_window, m.activation) == (True, 0, "swiglu")
    assert m.rope_layer_share == 27 / 36 and not any("rotary" in x for x in m.notes)
    marks = [1] * 30 + [0] * 6
    assert model_from_hf_config({**cfg, "no_rope_layers": marks}).rope_layer_share == 30 / 36
    assert model_from_hf_config({**cfg, "no_rope_layer_interval": 6}).rope_layer_share == 30 / 36
    assert model_from_hf_config({**cfg, "no_rope_layers": [1] * 36}).rope_layer_share == 1.0
    assert model_from_hf_config({**cfg, "sliding_window": 4096}).sliding_window == 0
    w = model_from_hf_config({**cfg, "use_sliding_window": True, "sliding_window": 4096})
    assert (w.sliding_window, w.window_layer_share) == (4096, 9 / 36)
    kinds = ["sliding_attention", "full_attention"] * 18
    w = model_from_hf_config({**cfg, "use_sliding_window": True, "sliding_window": 4096, "layer_types": kinds})
    assert w.window_layer_share == 0.5


@pytest.mark.parametrize("h,layers,f,tied,published", [(2048, 16, 8192, True, 1_176_764_416),
                                                       (4096, 32, 11008, False, 6_888_095_744)])
def test_olmo1_norms_have_no_parameters_by_hand(h, layers, f, tied, published):
    """OLMo 1 (``olmo``): Llama's layer under OlmoLayerNorm, a LayerNorm with no weight and no bias
    (norm_affine none): OLMo-1B 1,176,764,416 (tied) and OLMo-7B 6,888,095,744 (untied), the published
    1.18B and 6.89B (as remembered); its clip_qkv clamp is noted, not costed."""
    cfg = dict(model_type="olmo", hidden_size=h, num_hidden_layers=layers, num_attention_heads=h // 128,
               intermediate_size=f, vocab_size=50304, max_position_embeddings=2048, tie_word_embeddings=tied)
    m = model_from_hf_config(cfg)
    assert (m.norm, m.norm_affine, m.norm_params, m.activation) == ("layernorm", "none", 0, "swiglu")
    assert m.params == layers * (4 * h * h + 3 * h * f) + (1 if tied else 2) * 50304 * h == published
    assert any("clip_qkv" in n for n in model_from_hf_config({**cfg, "clip_qkv": 8.0}).notes)


def test_stablelm2_by_hand_and_what_it_refuses():
    """StableLM 2 1.6B (``stablelm``): SwiGLU without biases, q, k and v biases (use_qkv_bias), LayerNorms
    with their biases (nn.LayerNorm: norm_affine weight_bias), a quarter of each 64-wide head rotated,
    an untied 100,352-row table: 1,644,515,328 (published 1.64B); use_parallel_residual makes the block
    parallel behind one norm; its per-head q and k LayerNorms (a kernel a head) are refused."""
    cfg = dict(model_type="stablelm", hidden_size=2048, num_hidden_layers=24, num_attention_heads=32,
               intermediate_size=5632, vocab_size=100352, max_position_embeddings=4096, use_qkv_bias=True)
    m = model_from_hf_config(cfg)
    h, f = 2048, 5632
    assert m.params == 24 * (4 * h * h + 3 * h + 3 * h * f + 2 * 2 * h) + 2 * h + 2 * 100352 * h == 1_644_515_328
    assert (m.norm, m.norm_affine, m.qkv_bias, m.rotary_dim, m.parallel_block) == \
        ("layernorm", "weight_bias", True, 16, "")
    assert model_from_hf_config({**cfg, "use_parallel_residual": True}).parallel_block == "shared_norm"
    with pytest.raises(ConfigError, match="qk_layernorm.*one kernel per head"):
        model_from_hf_config({**cfg, "qk_layernorm": True})


def test_norm_affine_in_a_workload(tmp_path):
    """A workload says what its norms hold: none, a weight, or a LayerNorm's weight and bias; an
    RMSNorm with a bias is refused naming the field."""
    base = yaml.safe_load((ROOT / "workloads" / "llama3-8b.yaml").read_text())
    h, L = base["hidden"], base["layers"]
    counts = {}
    for affine in ("none", "weight"):
        path = tmp_path / f"{affine}.yaml"
        path.write_text(yaml.safe_dump({**base, "norm_affine": affine}))
        counts[affine] = load_model(path).params
    assert counts["weight"] - counts["none"] == (2 * L + 1) * h
    assert counts["weight"] == load_model("llama3-8b").params
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**base, "norm_affine": "weight_bias"}))
    with pytest.raises(ConfigError, match="norm_affine.*weight_bias is a LayerNorm"):
        load_model(path)



def test_glm4_dense_by_hand():
    """GLM-4 (``glm``: GLM-4-9B) is Llama's layer with biases on q, k and v only, 2 key/value heads of 128
    and half of each head rotated (GlmConfig.__post_init__): 40 x (2·4096² + 2·4096·256 + 4096 + 2·256 +
    3·4096·13,696 + 2·4096) + 2·151,552·4096 + 4096 = 9,399,951,360, the published 9.4B; GLM-4-0414
    (``glm4``) adds a norm after the attention and after the MLP (post_self_attn_layernorm,
    post_mlp_layernorm: sandwich_norm), two more weight vectors a layer."""
    cfg = dict(model_type="glm", hidden_size=4096, num_hidden_layers=40, num_attention_heads=32,
               vocab_size=151552, max_position_embeddings=131072)
    m = model_from_hf_config(cfg)
    h, kv, f, V = 4096, 256, 13696, 151552
    layer = 2 * h * h + 2 * h * kv + (h + 2 * kv) + 3 * h * f + 2 * h
    assert m.params == 40 * layer + 2 * V * h + h == 9_399_951_360
    assert (m.qkv_bias, m.rotary_dim, m.kv_heads, m.sandwich_norm, m.norm) == (True, 64, 2, False, "rmsnorm")
    assert not any("output projection" in n for n in m.notes)    # GLM's o_proj has no bias
    m4 = model_from_hf_config({**cfg, "model_type": "glm4"})
    assert m4.sandwich_norm and m4.params - m.params == 40 * 2 * h
    explicit = model_from_hf_config({**cfg, "rope_parameters": {"partial_rotary_factor": 1.0}})
    assert explicit.rotary_dim == 0                               # the whole head: no partial rotation
