"""Mixture-of-experts types read from their Hugging Face configs as transformers 5.25.0 builds them:
Baidu's ERNIE 4.5 MoE, Tencent's Hunyuan MoE, rednote's dots.llm1, MiniMax-M2, and the Gated DeltaNet
hybrids Qwen3.5 and OLMo Hybrid (models/ernie4_5_moe, hunyuan_v1_moe, dots1, minimax_m2, qwen3_5,
qwen3_5_moe, olmo_hybrid); parameter counts by hand."""
from __future__ import annotations

import pytest

from phaze.configio import ConfigError
from phaze.graph import layer_graph
from phaze.hf_config import model_from_hf_config

ERNIE_21B = dict(model_type="ernie4_5_moe", hidden_size=2560, intermediate_size=12288, num_hidden_layers=28,
                 num_attention_heads=20, num_key_value_heads=4, head_dim=128, vocab_size=103424,
                 moe_intermediate_size=1536, moe_k=6, moe_num_experts=64, moe_num_shared_experts=2,
                 moe_layer_start_index=1, moe_layer_end_index=27, moe_layer_interval=1, tie_word_embeddings=True,
                 num_nextn_predict_layers=1, max_position_embeddings=131072)


def test_ernie45_moe_by_hand():
    """ERNIE-4.5-21B-A3B's shapes (baidu/ERNIE-4.5-21B-A3B-PT, as remembered): a dense first layer
    (SwiGLU of 12,288), then 27 MoE layers of 64 SwiGLU experts of 1,536, 6 a token, beside one
    shared MLP as wide as two experts (3,072) and a 64-way router; attention 20 heads of 128, 4 kv
    heads; a tied 103,424-row table: 21,825,436,160 in all, 3,352,148,480 a token ("21B", "3B
    activated"); its one multi-token prediction module trained as DeepSeek-V3's and GLM-4.5's are."""
    m = model_from_hf_config(ERNIE_21B)
    h, kv, V, E, k, f = 2560, 512, 103424, 64, 6, 1536
    attn = 2 * h * h + 2 * h * kv + 2 * h
    moe = attn + E * 3 * h * f + 3 * h * 2 * f + E * h
    total = attn + 3 * h * 12288 + 27 * moe + V * h + h
    assert m.params == total == 21_825_436_160
    assert m.active_params == total - 27 * (E - k) * 3 * h * f == 3_352_148_480
    assert (m.experts, m.top_k, m.expert_ffn_hidden) == (E, k, f)
    assert (m.shared_experts, m.shared_ffn) == (2, f)   # one shared MLP of two experts' width: the same work
    assert (m.dense_layers, m.moe_layer_interval, m.mtp_layers, m.tied_embeddings) == (1, 1, 1, True)


def test_ernie45_moe_layer_span_and_a_dense_config():
    """MoE layers from moe_layer_start_index to moe_layer_end_index, the last of every
    moe_layer_interval (Ernie4_5_MoeDecoderLayer); a span that ends early is costed by count with
    a note; no experts read as a dense model; a negative start is one line."""
    every2 = model_from_hf_config({**ERNIE_21B, "moe_layer_interval": 2})   # layers 1, 3, ..., 27
    assert (every2.dense_layers, every2.moe_layer_interval, every2.moe_layers) == (0, 2, 14)
    assert not any("costed by count" in n for n in every2.notes)
    late = model_from_hf_config({**ERNIE_21B, "moe_layer_start_index": 3, "moe_layer_interval": 2})   # 3, ..., 27
    assert (late.dense_layers, late.moe_layers) == (2, 13) and not any("costed by count" in n for n in late.notes)
    short = model_from_hf_config({**ERNIE_21B, "moe_layer_end_index": 20})   # MoE 1-20, dense 0 and 21-27
    assert (short.moe_layers, short.dense_layers) == (20, 8) and any("costed by count" in n for n in short.notes)
    dense = model_from_hf_config({**ERNIE_21B, "moe_num_experts": 0})
    h = 2560
    assert not dense.moe and dense.params == 28 * (2 * h * h + 2 * h * 512 + 2 * h + 3 * h * 12288) + 103424 * h + h
    with pytest.raises(ConfigError, match="field 'moe_layer_start_index': must be a whole number of at least 0"):
        model_from_hf_config({**ERNIE_21B, "moe_layer_start_index": -2})


HUNYUAN_A13B = dict(model_type="hunyuan_v1_moe", hidden_size=4096, intermediate_size=3072, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128167, num_experts=64,
                    moe_topk=[8] * 32, moe_intermediate_size=[3072] * 32, tie_word_embeddings=True,
                    max_position_embeddings=32768)


def test_hunyuan_moe_by_hand():
    """Hunyuan-A13B's shapes (tencent/Hunyuan-A13B-Instruct, as remembered): every layer 64 SwiGLU
    experts of 3,072 (transformers builds them from intermediate_size; the checkpoint's per-layer
    moe_intermediate_size list is not read), 8 a token (its per-layer moe_topk, all 8), beside one
    shared MLP as wide, per-head q and k norms; a tied 128,167-row table: 80,393,183,232 in all and
    12,747,448,320 a token ("80B", "13B active")."""
    m = model_from_hf_config(HUNYUAN_A13B)
    h, kv, V, E, k, f = 4096, 1024, 128167, 64, 8, 3072
    layer = 2 * h * h + 2 * h * kv + 2 * 128 + 2 * h + E * 3 * h * f + 3 * h * f + E * h
    assert m.params == 32 * layer + V * h + h == 80_393_183_232
    assert m.active_params == m.params - 32 * (E - k) * 3 * h * f == 12_747_448_320
    assert (m.top_k, m.shared_experts, m.shared_ffn, m.qk_norm) == (k, 1, f, True)
    with pytest.raises(ConfigError, match="field 'moe_topk': must be one count, or the same count for every layer"):
        model_from_hf_config({**HUNYUAN_A13B, "moe_topk": [8] * 31 + [4]})
    assert model_from_hf_config({**HUNYUAN_A13B, "moe_topk": 2}).top_k == 2


def test_dots1_by_hand():
    """dots.llm1's shapes (rednote-hilab/dots.llm1.base, as remembered): DeepSeek-V3's expert layout
    without MLA, a dense first layer of 10,944, then 61 layers of 128 experts of 1,408, 6 a token,
    two shared, per-head q and k norms, 32 kv heads; untied 152,064-row tables: 142,774,373,888 in
    all and 14,016,581,120 a token ("142B", "14B activated"). Its window applies from
    max_window_layers on (Dots1Config's layer_types): at 62 of 62 layers, none."""
    cfg = dict(model_type="dots1", hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408,
               num_hidden_layers=62, num_attention_heads=32, num_key_value_heads=32, vocab_size=152064,
               n_routed_experts=128, n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1,
               max_window_layers=62, sliding_window=4096, max_position_embeddings=32768)
    m = model_from_hf_config(cfg)
    h, V, E, k, f = 4096, 152064, 128, 6, 1408
    attn = 4 * h * h + 2 * 128 + 2 * h
    total = 62 * attn + 3 * h * 10944 + 61 * (E * 3 * h * f + 2 * 3 * h * f + E * h) + 2 * V * h + h
    assert m.params == total == 142_774_373_888
    assert m.active_params == total - 61 * (E - k) * 3 * h * f == 14_016_581_120
    assert (m.dense_layers, m.shared_experts, m.qk_norm, m.sliding_window) == (1, 2, True, 0)
    half = model_from_hf_config({**cfg, "max_window_layers": 31})
    assert (half.sliding_window, half.window_layer_share) == (4096, 0.5)


def test_minimax_m2_by_hand():
    """MiniMax-M2's shapes (MiniMaxAI/MiniMax-M2, as remembered): 62 layers of 256 SwiGLU experts of
    1,536, 8 a token, under a sigmoid router; 48 query heads and 8 kv heads of 128, q and k normed
    over the whole projection (MiniMaxM2Attention's q_norm of 48 x 128), half of each head rotated;
    untied 200,064-row tables: 228,689,748,992 in all and 11,030,537,216 a token ("230B", "10B
    active")."""
    m = model_from_hf_config(dict(model_type="minimax_m2", hidden_size=3072, intermediate_size=1536,
                                  num_hidden_layers=62, num_attention_heads=48, num_key_value_heads=8, head_dim=128,
                                  vocab_size=200064, num_local_experts=256, num_experts_per_tok=8,
                                  rope_parameters=dict(rope_type="default", rope_theta=5000000,
                                                       partial_rotary_factor=0.5),
                                  max_position_embeddings=196608))
    h, q, kv, V, E, k, f = 3072, 6144, 1024, 200064, 256, 8, 1536
    layer = 2 * h * q + 2 * h * kv + (q + kv) + 2 * h + E * 3 * h * f + E * h
    assert m.params == 62 * layer + 2 * V * h + h == 228_689_748_992
    assert m.active_params == m.params - 62 * (E - k) * 3 * h * f == 11_030_537_216
    assert (m.qk_norm, m.qk_norm_width, m.rotary_dim, m.shared_experts) == (True, "projection", 64, 0)


def test_qwen35_moe_by_hand_from_its_multimodal_config():
    """Qwen3.5-35B-A3B's text model from its multimodal config (the vision encoder not trained here),
    with Qwen3_5MoeTextConfig's defaults: Qwen3-Next's layers, three Gated DeltaNet layers of four
    (16 key heads and 32 value heads of 128, a 4-wide convolution, a gated norm) and a gated full
    attention in the fourth (16 heads of 256, 2 kv heads, q and k norms, a quarter of each head
    rotated), 256 experts of 512, 8 a token, one gated shared expert of 512; untied 248,320-row
    tables: 34,660,610,688 in all, 3,454,988,928 a token ("35B-A3B")."""
    m = model_from_hf_config(dict(model_type="qwen3_5_moe", text_config=dict(
        vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16)), name="Qwen3.5-35B-A3B")
    h, V, E, k, f = 2048, 248320, 256, 8, 512
    kd, vd = 16 * 128, 32 * 128
    gdn = h * (2 * kd + vd) + h * vd + 2 * h * 32 + (2 * kd + vd) * 4 + 2 * 32 + 128 + vd * h
    full = h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h + 2 * 256
    moe = E * 3 * h * f + 3 * h * f + h + E * h + 2 * h
    total = 30 * gdn + 10 * full + 40 * moe + 2 * V * h + h
    assert m.params == total == 34_660_610_688
    assert m.active_params == total - 40 * (E - k) * 3 * h * f == 3_454_988_928
    assert (m.gdn_layers, m.rotary_dim, m.experts, m.top_k, m.shared_experts) == (30, 64, E, k, 1)
    assert m.name == "Qwen3.5-35B-A3B" and any(n.startswith("Qwen3.5: Qwen3-Next's layers") for n in m.notes)
    dense = model_from_hf_config(dict(model_type="qwen3_5_text", vocab_size=V, hidden_size=4096, num_hidden_layers=32,
                                      num_attention_heads=16))
    assert (dense.moe, dense.gdn_layers, dense.ffn_hidden, dense.kv_heads) == (False, 24, 12288, 4)
    # Qwen3-Next's own configuration rotates a quarter of each head when the config says nothing
    assert model_from_hf_config(dict(model_type="qwen3_next", hidden_size=2048, num_hidden_layers=48,
                                     num_attention_heads=16, vocab_size=151936)).rotary_dim == 64


def test_olmo_hybrid_by_hand():
    """OLMo Hybrid (OlmoHybridConfig's defaults: 32 layers of 3,840, 30 heads): Gated DeltaNet in the
    layers i % 4 != 3 (24), each with 30 key and 30 value heads of 96 and 192 (0.75 x 3,840 / 30 and
    twice that), q, k, v, a, b and the gate projected apart (Qwen3-Next's one projection's work), a
    4-wide convolution over q, k and v, the decay and step parameters and a gated norm; OLMo 3's
    attention in the other 8 with q and k normed over the whole projection, no output gate and, as
    the released checkpoints, no rotary embedding; every layer a SwiGLU of 11,008; untied
    100,352-row tables: 7,430,870,688."""
    m = model_from_hf_config(dict(model_type="olmo_hybrid", vocab_size=100352, hidden_size=3840,
                                  intermediate_size=11008, num_hidden_layers=32, num_attention_heads=30))
    h, V, kd, vd = 3840, 100352, 30 * 96, 30 * 192
    gdn = 2 * h * kd + h * vd + 2 * h * 30 + h * vd + vd * h + (2 * kd + vd) * 4 + 2 * 30 + 192
    attn = 4 * h * h + 2 * h
    total = 24 * gdn + 8 * attn + 32 * (3 * h * 11008 + 2 * h) + 2 * V * h + h
    assert m.params == total == 7_430_870_688
    assert (m.gdn_layers, m.linear_key_head_dim, m.linear_value_head_dim) == (24, 96, 192)
    assert not m.attention_output_gate
    assert (m.position_embedding, m.qk_norm_width) == ("none", "projection")
    rotary = model_from_hf_config(dict(model_type="olmo_hybrid", vocab_size=V, hidden_size=h, num_hidden_layers=32,
                                       num_attention_heads=30, rope_parameters={"rope_theta": 500000.0}))
    assert rotary.position_embedding == "rotary"


def test_afmoe_by_hand_with_norms_around_its_experts():
    """AfMoE (AfmoeConfig's defaults: 32 layers of 2,048, 16 heads of 128): a norm before and after the
    attention and the FFN, per-head q and k norms, the attention's output times sigmoid(gate_proj(x))
    (a second query width), a dense first layer of 6,144, then 64 experts of 1,408, 6 a token, beside
    a shared MLP of two experts' width; a 1,024-token window in three layers of four, only those
    rotating; untied 200,192-row tables. The post-norms after the experts are costed as after a
    dense FFN: one norm kernel over the layer's output each way, its input kept."""
    m = model_from_hf_config(dict(model_type="afmoe", vocab_size=200192, hidden_size=2048, num_hidden_layers=32,
                                  num_attention_heads=16))
    h, V, E, k, f = 2048, 200192, 64, 6, 1408
    attn = 5 * h * h + 2 * 128 + 4 * h        # q, its gate, k, v, o; q/k norms; four norms
    total = 32 * attn + 3 * h * 6144 + 31 * (E * 3 * h * f + 2 * 3 * h * f + E * h) + 2 * V * h + h
    assert m.params == total
    assert m.active_params == total - 31 * (E - k) * 3 * h * f
    assert (m.sandwich_norm, m.attention_output_gate, m.qk_norm, m.dense_layers, m.shared_experts) == \
        (True, True, True, 1, 2)
    assert (m.sliding_window, m.window_layer_share, m.rope_layer_share) == (1024, 0.75, 0.75)
    names = [o.name for o in layer_graph(m, 1).fwd]
    assert names.index("unpermute") < names.index("ffn_post_norm") < names.index("ffn_residual")
    mup = model_from_hf_config(dict(model_type="afmoe", vocab_size=V, hidden_size=h, num_hidden_layers=32,
                                    num_attention_heads=16, mup_enabled=True))
    assert mup.embedding_scale and not m.embedding_scale
