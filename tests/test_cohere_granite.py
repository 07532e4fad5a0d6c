"""Cohere (Command R, R+, R7B) and IBM Granite read from their Hugging Face configs, and the products
with a constant that run as kernels of their own: counted by hand against transformers 5.25.0
(models/cohere, cohere2, granite: modeling_*.py, configuration_*.py) and the published sizes."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.graph import edge_graph, layer_graph
from phaze.hf_config import model_from_hf_config

ROOT = Path(__file__).resolve().parent.parent

COMMAND_R = dict(model_type="cohere", hidden_size=8192, num_hidden_layers=40, num_attention_heads=64,
                 vocab_size=256000, max_position_embeddings=8192, logit_scale=0.0625)
COMMAND_R_PLUS = dict(model_type="cohere", hidden_size=12288, num_hidden_layers=64, num_attention_heads=96,
                      num_key_value_heads=8, intermediate_size=33792, vocab_size=256000,
                      max_position_embeddings=8192, use_qk_norm=True, logit_scale=0.8333333333333334)
COMMAND_R7B = dict(model_type="cohere2", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, intermediate_size=14336, vocab_size=256000, max_position_embeddings=8192)
GRANITE_8B = dict(model_type="granite", hidden_size=4096, num_hidden_layers=40, num_attention_heads=32,
                  num_key_value_heads=8, intermediate_size=12800, vocab_size=49155, max_position_embeddings=4096,
                  tie_word_embeddings=True, embedding_multiplier=12.0, logits_scaling=16.0,
                  residual_multiplier=0.22, attention_multiplier=0.0078125)


def test_command_r_by_hand():
    """CohereForCausalLM: a parallel block behind one weight-only LayerNorm (CohereLayerNorm), SwiGLU
    (gate, up, down), no biases, a table tied to the head (the configuration's default), the logits
    times logit_scale: 40 x (4·8192² + 3·8192·22,528 + 8192) + 256,000·8192 + 8192 = 34,980,831,232,
    the published 35B (c4ai-command-r-v01)."""
    m = model_from_hf_config(COMMAND_R)
    h, f, L, V = 8192, 22528, 40, 256000
    assert m.params == L * (4 * h * h + 3 * h * f + h) + V * h + h == 34_980_831_232
    assert (m.parallel_block, m.norm, m.bias, m.activation, m.tied_embeddings, m.kv_heads) == \
        ("shared_norm", "layernorm", False, "swiglu", True, 64)
    assert (m.logit_scale, m.embedding_scale, m.residual_scale, m.qk_norm) == (True, False, False, False)


def test_command_r_plus_norms_each_head_with_its_own_weights():
    """Command R+ (use_qk_norm): CohereLayerNorm over each head's 128 values with a weight per head,
    (96 + 8) x 128 weights a layer beside the 104B: 103,810,674,688, the published 104B."""
    m = model_from_hf_config(COMMAND_R_PLUS)
    h, f, L, V, d = 12288, 33792, 64, 256000, 128
    attn = 2 * h * 96 * d + 2 * h * 8 * d
    assert m.params == L * (attn + 3 * h * f + h + (96 + 8) * d) + V * h + h == 103_810_674_688
    assert (m.qk_norm, m.qk_norm_per_head, m.qk_norm_width, m.qk_norm_params) == (True, True, "head", 104 * d)


def test_command_r7b_windows_three_layers_of_four_and_rotates_only_those():
    """Cohere2: layer_types by default three windowed layers (4,096 keys) to one full; only the
    windowed ones apply the rotary embedding (Cohere2Attention); 8,028,033,024 parameters."""
    m = model_from_hf_config(COMMAND_R7B)
    h, f, L, V, kv = 4096, 14336, 32, 256000, 1024
    assert m.params == L * (2 * h * h + 2 * h * kv + 3 * h * f + h) + V * h + h == 8_028_033_024
    assert (m.sliding_window, m.window_layer_share, m.rope_layer_share) == (4096, 0.75, 0.75)
    kinds = ["sliding_attention", "full_attention"] * 16
    m2 = model_from_hf_config({**COMMAND_R7B, "layer_types": kinds})
    assert (m2.window_layer_share, m2.rope_layer_share) == (0.5, 0.5)
    m3 = model_from_hf_config({**COMMAND_R7B, "sliding_window": None})    # no window: no layer rotates
    assert (m3.sliding_window, m3.rope_layer_share) == (0, 0.0)
    assert not any(".rotary" in o.name for o in layer_graph(m3, 1, 1, False, "flash", "none").fwd)


def test_granite_by_hand_and_its_three_constants():
    """Granite 3.0 8B: Llama's layer, a tied 49,155-row table: 8,170,848,256 (published 8.1B); its
    embedding_multiplier, residual_multiplier and logits_scaling each a kernel of its own
    (GraniteModel.forward, GraniteDecoderLayer.forward, GraniteForCausalLM.forward); the attention
    multiplier is the softmax's scale, no work."""
    m = model_from_hf_config(GRANITE_8B)
    h, f, L, V, kv = 4096, 12800, 40, 49155, 1024
    assert m.params == L * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + V * h + h == 8_170_848_256
    assert (m.embedding_scale, m.residual_scale, m.logit_scale, m.parallel_block, m.norm) == \
        (True, True, True, "", "rmsnorm")


@pytest.mark.parametrize("tp,sp", [(1, False), (4, True)])
def test_each_constant_is_one_pass_each_way_by_hand(tp, sp):
    """Each product with a constant reads and writes its tensor once (p bytes an element each way) and
    takes one FLOP an element, forward and backward: the embedding's output and each residual branch
    over the rank's tokens (T/tp under sequence parallelism) and width, the logits over its vocabulary
    slice; nothing else in the graph changes."""
    m = model_from_hf_config(GRANITE_8B)
    plain = replace(m, embedding_scale=False, residual_scale=False, logit_scale=False)
    mbs, p, h, V = 2, m.bytes_per_element, m.hidden, m.vocab
    T = mbs * m.seq_len
    Tn = T // tp if sp else T
    Vt = -(-V // tp)

    def ops(model):
        g = layer_graph(model, mbs, tp, sp, "flash", "none")
        e = edge_graph(model, mbs, tp, sp)
        return {o.name: o for o in (*g.fwd, *g.bwd, *e["embedding"], *e["head"])}
    scaled, base = ops(m), ops(plain)
    added = {k for k in scaled if k not in base}
    assert added == {"attn_out.scale", "attn_out.scale.bwd", "ffn_out.scale", "ffn_out.scale.bwd",
                     "embedding.scale", "embedding.scale.bwd", "logits.scale", "logits.scale.bwd"}
    for name, elements in (("attn_out.scale", Tn * h), ("ffn_out.scale", Tn * h), ("embedding.scale", Tn * h),
                           ("logits.scale", T * Vt)):
        for k in (name, name + ".bwd"):
            o = scaled[k]
            assert (o.unit, o.elements, o.flops, o.bytes_read, o.bytes_written) == \
                ("vector", elements, elements, p * elements, p * elements), k
    for k in base:
        a, b = scaled[k], base[k]
        assert (a.unit, a.flops, a.bytes_read, a.bytes_written, a.elements) == \
            (b.unit, b.flops, b.bytes_read, b.bytes_written, b.elements), k
    # the loss's gradient goes through the scale before the logits' weight gradient
    assert scaled["logits.wgrad"].deps == ("logits.scale.bwd",)


def test_a_workload_refuses_what_the_constants_are_not_modelled_with(tmp_path):
    base = yaml.safe_load((ROOT / "workloads" / "llama3-8b.yaml").read_text())
    for change, field in (({"residual_scale": True, "parallel_block": "shared_norm"}, "residual_scale"),
                          ({"logit_scale": True, "mtp_layers": 1}, "mtp_layers"),
                          ({"logit_scale": "yes please"}, "logit_scale"),
                          ({"head_scale": True, "mtp_layers": 1}, "mtp_layers"),
                          ({"head_scale": 2}, "head_scale"),
                          ({"qk_norm_per_head": True}, "qk_norm_per_head")):
        path = tmp_path / "w.yaml"
        path.write_text(yaml.safe_dump({**base, **change}))
        with pytest.raises(ConfigError, match=field):
            load_model(path)
    path.write_text(yaml.safe_dump({**base, "residual_scale": True, "logit_scale": True, "embedding_scale": True,
                                    "head_scale": True}))
    m = load_model(path)
    assert (m.residual_scale, m.logit_scale, m.embedding_scale, m.head_scale) == (True, True, True, True)


def test_granite_moe_by_hand():
    """Granite 3.0 3B-A800M (``granitemoe``): Granite's constants and layer with Mixtral's routed SwiGLU
    experts (40 of width 512, 8 a token, a 40-way router without bias): 3,298,793,472 parameters,
    807,370,752 active in the layers (the published 3B and 800M active); ``granitemoeshared`` adds a
    shared SwiGLU expert of shared_intermediate_size."""
    cfg = dict(model_type="granitemoe", hidden_size=1536, num_hidden_layers=32, num_attention_heads=24,
               num_key_value_heads=8, intermediate_size=512, num_local_experts=40, num_experts_per_tok=8,
               vocab_size=49155, max_position_embeddings=4096, tie_word_embeddings=True)
    m = model_from_hf_config(cfg)
    h, f, E, k, kv = 1536, 512, 40, 8, 512
    attn, expert, router, norms = 2 * h * h + 2 * h * kv, 3 * h * f, E * h, 2 * h
    assert m.params == 32 * (attn + E * expert + router + norms) + 49155 * h + h == 3_298_793_472
    assert m.active_params - 49155 * h - h == 32 * (attn + k * expert + router + norms) == 807_370_752
    assert (m.experts, m.top_k, m.shared_experts, m.residual_scale, m.logit_scale) == (E, k, 0, True, True)
    shared = model_from_hf_config({**cfg, "model_type": "granitemoeshared", "shared_intermediate_size": 1024})
    assert (shared.shared_experts, shared.shared_expert_ffn_hidden) == (1, 1024)
    assert shared.params - m.params == 32 * 3 * h * 1024
