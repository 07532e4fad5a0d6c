"""Gemma 2's additions (Gemma Team 2024, arXiv:2408.00118, Sec. 2): norms after the attention and the
FFN as well as before them (``sandwich_norm``), and tanh soft-capping of the attention scores and of
the final logits, as NeMo 2.5.0 runs them (nemo/collections/llm/gpt/model/gemma2.py); by hand."""
from __future__ import annotations

from dataclasses import replace

import pytest

from phaze.arch import load_chip
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.graph import edge_graph, layer_graph
from phaze.hf_config import model_from_hf_config
from phaze.memory import activation_bytes_per_layer
from phaze.plan import Plan
from phaze.plan_check import check_plan
from phaze.stage import stage_costs

GEMMA2 = {"gemma2-2b": (26, 2304, 8, 4, 256, 9216, 2_024_517_888),
          "gemma2-9b": (42, 3584, 16, 8, 256, 14336, 8_324_201_984),
          "gemma2-27b": (46, 4608, 32, 16, 128, 36864, 26_047_480_320)}


@pytest.mark.parametrize("name", sorted(GEMMA2))
def test_gemma2_parameters_by_hand(name):
    """Four RMSNorms a layer (before and after the attention and the FFN) and a final one, GeGLU
    (three FFN matrices), no biases, a tied 256,000-row table: the non-embedding count is exactly
    the report's Table 2."""
    L, h, heads, kv, d, f, non_embedding = GEMMA2[name]
    m = load_model(name)
    layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * f + 4 * h
    assert (m.layer_norms, m.sandwich_norm, m.attention_softcap, m.logit_softcap) == (4, True, 50.0, 30.0)
    assert (m.sliding_window, m.window_layer_share, m.activation, m.tied_embeddings) == (4096, 0.5, "geglu", True)
    assert L * layer + h == non_embedding
    assert m.params == non_embedding + 256000 * h


def _ops(ops):
    return {o.name: o for o in ops}


def test_sandwich_norms_run_after_each_reduction_and_keep_their_inputs():
    """Under tp 2 with sequence parallelism, each post-norm reads the reduce-scattered output (a
    tp-th of the tokens), writes its normed copy and keeps its input for the backward: 2 x 16-bit x
    tokens x hidden / tp more a layer. A full recompute re-runs them; under XLA's needed-only
    re-run the down projection is re-run too (the post-norm's backward reads its output)."""
    base = replace(load_model("gemma2-9b"), sandwich_norm=False)
    m = load_model("gemma2-9b")
    T, h, t = 8192, 3584, 2
    fwd = [o.name for o in layer_graph(m, 1, t, True, "flash", "none").fwd]
    assert fwd[fwd.index("attn_out.reduce_scatter") + 1] == "attn_post_norm"
    assert fwd[fwd.index("ffn_down.reduce_scatter"):fwd.index("ffn_residual") + 1] == \
        ["ffn_down.reduce_scatter", "ffn_post_norm", "ffn_residual"]
    post = _ops(layer_graph(m, 1, t, True, "flash", "none").fwd)["ffn_post_norm"]
    assert (post.elements, post.bytes_read, post.bytes_written) == (T * h / t, 2 * T * h / t, 2 * T * h / t)
    assert "attn_post_norm" not in [o.name for o in layer_graph(base, 1, t, True, "flash", "none").fwd]
    extra = activation_bytes_per_layer(m, 1, t, True, "none", "flash") - \
        activation_bytes_per_layer(base, 1, t, True, "none", "flash")
    assert extra == 2 * 2 * T * h / t
    full = [o.name for o in layer_graph(m, 1, t, True, "flash", "full").bwd]
    assert {"recompute.attn_post_norm", "recompute.ffn_post_norm"} <= set(full)
    needed = [o.name for o in layer_graph(m, 1, t, True, "flash", "full", compiled=True).bwd]
    plain = [o.name for o in layer_graph(base, 1, t, True, "flash", "full", compiled=True).bwd]
    assert "recompute.ffn_down" in needed and "recompute.ffn_down" not in plain
    assert m.params - base.params == 42 * 2 * h


def test_attention_softcap_fused_and_unfused():
    """A fused kernel caps each score in its tiles (FlashAttention 2.6's softcap): one tanh and 2
    FLOPs more a score forward, one tanh and 3 backward. NeMo's unfused attention runs
    scale * tanh(scores / scale), three kernels reading and writing every 16-bit score, and
    autograd's three back (4 reads, 3 writes a score); tanh keeps its output, 2 bytes a score a
    layer, unless the core attention is recomputed."""
    m = load_model("gemma2-2b")
    plain = replace(m, attention_softcap=0.0)
    T, a = 8192, 8
    f, g = layer_graph(m, 1, 1, False, "flash", "none"), layer_graph(plain, 1, 1, False, "flash", "none")
    att, ref = _ops(f.fwd)["flash_attention"], _ops(g.fwd)["flash_attention"]
    assert (att.special, att.vector_flops) == (2 * ref.special, 7 / 5 * ref.vector_flops)
    batt, bref = _ops(f.bwd)["flash_attention.bwd"], _ops(g.bwd)["flash_attention.bwd"]
    assert (batt.special, batt.vector_flops) == (2 * bref.special, 11 / 8 * bref.vector_flops)
    assert att.flops == ref.flops and batt.flops == bref.flops
    u = layer_graph(m, 1, 1, False, "standard", "none")
    scores = a * T * T
    cap, back = _ops(u.fwd)["scores.softcap"], _ops(u.bwd)["scores.softcap.bwd"]
    assert (cap.elements, cap.bytes_read, cap.bytes_written, cap.special) == (scores, 6 * scores, 6 * scores, scores)
    assert (back.bytes_read, back.bytes_written) == (8 * scores, 6 * scores)
    names = [o.name for o in u.fwd]
    assert names.index("scores") < names.index("scores.softcap") < names.index("softmax")
    assert "scores.softcap" not in _ops(layer_graph(plain, 1, 1, False, "standard", "none").fwd)
    kept = activation_bytes_per_layer(m, 1, 1, False, "none", "standard") - \
        activation_bytes_per_layer(plain, 1, 1, False, "none", "standard")
    assert kept == 2 * scores
    assert activation_bytes_per_layer(m, 1, 1, False, "selective", "standard") == \
        activation_bytes_per_layer(plain, 1, 1, False, "selective", "standard")
    assert "recompute.scores.softcap" in [o.name for o in layer_graph(m, 1, 1, False, "standard", "selective").bwd]


def test_logit_softcap_runs_before_the_loss_and_keeps_the_tanh():
    """The final logits capped before the cross entropy: three kernels forward over the rank's
    16-bit logits (read and write 3 each), three back (read 4, write 3), the weight gradient after
    them; the last stage holds the tanh's 16-bit output beside the loss's logits."""
    m = load_model("gemma2-2b")
    T, Vt = 8192, 256000 // 2
    head = _ops(edge_graph(m, 1, 2, True, "te")["head"])
    cap, back = head["logits.softcap"], head["logits.softcap.bwd"]
    assert (cap.bytes_read, cap.bytes_written, back.bytes_read, back.bytes_written) == \
        (6 * T * Vt, 6 * T * Vt, 8 * T * Vt, 6 * T * Vt)
    assert head["logits.wgrad"].deps == ("logits.softcap.bwd",)
    chip = load_chip("h100-sxm")
    capped = stage_costs(m, chip, 8, 8, Plan(tp=2, mbs=1, loss="te")).logits_bytes()
    plain = stage_costs(replace(m, logit_softcap=0.0), chip, 8, 8, Plan(tp=2, mbs=1, loss="te")).logits_bytes()
    assert (capped, plain) == (2 * 2 * T * Vt, 2 * T * Vt)


def test_what_sandwich_norms_are_not_modelled_with_is_refused(tmp_path):
    """torchtitan's per-op recompute (which the post-norms would change) is refused for a sandwich
    model, and so are sandwich norms with MLA, a parallel block or Mamba-2 layers, and soft-capped
    logits with multi-token prediction; with experts (AfMoE) they are costed."""
    m = load_model("gemma2-2b")
    with pytest.raises(ConfigError, match="recompute.*op"):
        check_plan(m, 8, 8, Plan(recompute="op"))
    path = tmp_path / "w.yaml"
    text = ("name: t\nlayers: 2\nhidden: 64\nheads: 4\nffn_hidden: 128\nvocab: 100\nseq_len: 32\n"
            "position_embedding: rotary\nsandwich_norm: true\n")
    for extra, why in (("parallel_block: two_norms\n", "sandwich_norm.*a parallel block"),
                       ("hybrid_pattern: M*\n", "sandwich_norm.*hybrid layers"),
                       ("sandwich_norm: false\nmtp_layers: 1\nlogit_softcap: 30\n", "mtp_layers.*logit_softcap")):
        path.write_text(text.replace("sandwich_norm: true\n", "") + extra if "sandwich_norm" in extra else text + extra)
        with pytest.raises(ConfigError, match=why):
            load_model(path)
    path.write_text(text + "experts: 4\ntop_k: 2\n")
    assert load_model(path).sandwich_norm and load_model(path).moe


def test_hf_gemma2_and_gemma3_configs():
    """transformers 5.25.0's Gemma2Config defaults (google/gemma-2-2b) read as the shipped Gemma 2
    2B; a Gemma 3 checkpoint's text model: per-head q and k norms, sandwich norms, no soft-cap,
    a 1,024-token window in five of every six layers."""
    g2 = model_from_hf_config(dict(
        model_type="gemma2", vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=8192, sliding_window=4096, final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0))
    ref = load_model("gemma2-2b")
    assert g2.params == ref.params
    for key in ("sandwich_norm", "attention_softcap", "logit_softcap", "sliding_window", "window_layer_share",
                "activation", "tied_embeddings", "kv_heads", "head_dim"):
        assert getattr(g2, key) == getattr(ref, key), key
    g3 = model_from_hf_config({"model_type": "gemma3", "text_config": dict(
        model_type="gemma3_text", vocab_size=262208, hidden_size=2560, intermediate_size=10240,
        num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        hidden_activation="gelu_pytorch_tanh", sliding_window=1024, max_position_embeddings=131072)})
    assert (g3.qk_norm, g3.sandwich_norm, g3.attention_softcap, g3.logit_softcap) == (True, True, 0.0, 0.0)
    assert (g3.sliding_window, g3.window_layer_share) == (1024, 29 / 34)


def test_the_printout_says_what_the_workload_adds(capsys):
    """``phaze evaluate`` lists the norms and soft-caps among what it assumed from the workload."""
    from phaze.cli import main
    assert main(["evaluate", "--workload", "gemma2-2b", "--arch", "h100-sxm", "--devices", "8",
                 "--global-batch", "8", "--seq-len", "1024", "--plan", "tp=2"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "norms and caps" in x)
    assert "after the attention and after the FFN" in line and "scores soft-capped at 50" in line
    assert "logits soft-capped at 30" in line
