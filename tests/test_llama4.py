"""Llama 4 (Scout, Maverick): MoE layers interleaved with dense ones (``moe_layer_interval``) and
chunked attention (``attention_chunk``). Parameter counts and FLOPs by hand from the Hugging Face
configs and transformers' modeling code, the attention work against a brute-force count of the
score pairs, Hugging Face configs, validation rows and refusals."""
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from phaze.catalogue import load_model
from phaze.cli import main
from phaze.configio import ConfigError
from phaze.graph import attention_work_fraction, layer_graph, ring_steps
from phaze.hf_config import model_from_hf_config
from phaze.runs import Case, row_to_case
from phaze.step import model_flops_per_sample
from phaze.workload import Model

H, A, KV, D, F_EXPERT, F_DENSE, V = 5120, 40, 8, 128, 8192, 16384, 202048
ATTN = H * A * D + 2 * H * KV * D + A * D * H        # q, k, v, o: no biases
EXPERT = 3 * H * F_EXPERT                            # gate, up, down
DENSE_FFN = 3 * H * F_DENSE
NORMS = 2 * H


def scout_config() -> dict:
    """The text part of meta-llama/Llama-4-Scout-17B-16E's config.json (the fields phaze reads),
    nested as the multimodal checkpoint nests it."""
    return {"model_type": "llama4", "torch_dtype": "bfloat16", "text_config": {
        "model_type": "llama4_text", "hidden_size": H, "num_hidden_layers": 48, "num_attention_heads": A,
        "num_key_value_heads": KV, "head_dim": D, "intermediate_size": F_EXPERT,
        "intermediate_size_mlp": F_DENSE, "num_local_experts": 16, "num_experts_per_tok": 1,
        "interleave_moe_layer_step": 1, "vocab_size": V, "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "rope_theta": 500000.0, "attention_chunk_size": 8192,
        "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(48)], "use_qk_norm": True,
        "max_position_embeddings": 10485760}}


def maverick_config() -> dict:
    cfg = scout_config()
    cfg["text_config"].update(num_local_experts=128, interleave_moe_layer_step=2, use_qk_norm=False,
                              max_position_embeddings=1048576)
    return cfg


def test_scout_params_by_hand():
    """48 MoE layers of 16 routed experts and one shared expert (transformers' Llama4TextMoe),
    a 16-way router, untied 202,048-token embedding and head, a final norm."""
    m = load_model("llama4-scout")
    layer = ATTN + H * 16 + 16 * EXPERT + EXPERT + NORMS
    total = 48 * layer + 2 * V * H + H
    assert m.params == total == 107_769_861_120
    assert m.active_params == total - 48 * 15 * EXPERT
    assert (m.moe_layers, m.dense_ffn_layers) == (48, 0)


def test_maverick_interleaves_dense_and_moe_layers_by_hand():
    """Layers 1, 3, ..., 47 are MoE (128 routed + 1 shared expert), the other 24 dense with an
    FFN of intermediate_size_mlp (16,384): 400.7B, the published 400B with the vision encoder."""
    m = load_model("llama4-maverick")
    moe = ATTN + H * 128 + 128 * EXPERT + EXPERT + NORMS
    dense = ATTN + DENSE_FFN + NORMS
    total = 24 * moe + 24 * dense + 2 * V * H + H
    assert (m.moe_layers, m.dense_ffn_layers) == (24, 24)
    assert m.params == total
    assert m.active_params == total - 24 * 127 * EXPERT
    assert m.layer_params == pytest.approx((moe + dense) / 2)
    assert m.expert_layer_params == pytest.approx(24 * 128 * EXPERT / 48)


def test_maverick_flops_count_each_kind_of_layer():
    """Model FLOPs of one sequence by hand: forward 2 s per weight of each matmul a token meets
    (a dense layer's FFN, or an MoE layer's router, one routed and the shared expert), the
    attention's two products non-causal (4 s^2 q per layer, the MFU convention) and the head,
    all times 3 for the backward."""
    m = load_model("llama4-maverick")
    s = m.seq_len
    moe = ATTN + H * 128 + 2 * EXPERT
    dense = ATTN + DENSE_FFN
    per_layer_attention = 4 * s * s * A * D
    forward = 2 * s * (24 * moe + 24 * dense) + 48 * per_layer_attention + 2 * s * H * V
    assert model_flops_per_sample(m) == pytest.approx(3 * forward, rel=1e-9)
    # every layer MoE: 24 more MoE layers in place of the dense ones
    all_moe = replace(m, moe_layer_interval=1)
    assert model_flops_per_sample(all_moe) - model_flops_per_sample(m) == pytest.approx(
        3 * 2 * s * 24 * (moe - dense), rel=1e-9)


def _brute_force_work(S: int, chunk: int = 0, window: int = 0) -> float:
    """Score pairs a causal kernel computes over S x S, the diagonal counted half (as the
    triangle's 1/2 does): within a chunk, or within a window of earlier keys."""
    pairs = 0.0
    for i in range(S):
        for j in range(i + 1):
            if chunk and i // chunk != j // chunk:
                continue
            if window and i - j >= window:
                continue
            pairs += 0.5 if i == j else 1.0
    return pairs / (S * S)


@pytest.mark.parametrize("S,chunk", [(16, 4), (17, 4), (30, 7), (12, 12), (12, 20)])
def test_chunked_attention_work_against_brute_force(S, chunk):
    m = Model(name="c", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=100, seq_len=S,
              position_embedding="rotary", attention_chunk=chunk)
    assert attention_work_fraction(m) == pytest.approx(_brute_force_work(S, chunk=chunk))
    # three layers of four chunked, the fourth causal over the whole sequence
    mixed = replace(m, window_layer_share=0.75)
    assert attention_work_fraction(mixed) == pytest.approx(
        0.75 * _brute_force_work(S, chunk=chunk) + 0.25 * _brute_force_work(S))
    # the window's formula still matches its own brute force (the windowed pairs, diagonal half)
    w = replace(m, attention_chunk=0, sliding_window=chunk)
    if chunk < S:
        exact = _brute_force_work(S, window=chunk)
        assert attention_work_fraction(w) == pytest.approx(exact, abs=0.5 / S)


def test_chunks_less_work_than_a_window_of_their_length():
    """A query of a chunk sees on average half a chunk of keys, one of a window the whole window:
    at 8 chunks of a 64K sequence, chunked work is about half the windowed."""
    m = Model(name="c", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=100, seq_len=65536,
              position_embedding="rotary", attention_chunk=8192)
    chunked = attention_work_fraction(m)
    windowed = attention_work_fraction(replace(m, attention_chunk=0, sliding_window=8192))
    assert chunked == pytest.approx(8192 / (2 * 65536))
    assert 0.5 < chunked / windowed < 0.55


def test_a_context_parallel_ring_runs_only_the_steps_a_chunk_reaches():
    """cp 8 shards of 2,048 tokens, chunks of 4,096 in every layer: a query reaches at most
    4,095 keys back, within its own shard and the two before it (ceil(4096 / 2048) + 1 = 3
    steps), as a window of that length does; a share of global layers runs them all."""
    m = Model(name="c", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=100, seq_len=2048,
              position_embedding="rotary", attention_chunk=4096, context_parallel=8)
    steps, _ = ring_steps(m, attention_work_fraction(m))
    assert steps == 3 == ring_steps(replace(m, attention_chunk=0, sliding_window=4096),
                                    attention_work_fraction(m))[0]
    assert ring_steps(replace(m, window_layer_share=0.75), 0.2)[0] == 8


def test_hugging_face_configs_give_the_shipped_workloads():
    shipped = {"scout": load_model("llama4-scout"), "maverick": load_model("llama4-maverick")}
    for key, cfg in (("scout", scout_config()), ("maverick", maverick_config())):
        m = model_from_hf_config(cfg, "config.json", name=shipped[key].name)
        want = shipped[key]
        assert replace(m, notes=()) == replace(want, notes=()), key
        assert any("chunked attention in chunks of 8192 tokens in 75% of the layers" in n for n in m.notes)
        assert m.rope_layer_share == 0.75 and not any("rotary" in n for n in m.notes)
    assert (shipped["scout"].qk_l2_norm, shipped["maverick"].qk_l2_norm) == (True, False)


def test_the_nope_layers_query_scale_and_its_bounds(tmp_path, capsys):
    """Llama 4's attn_temperature_tuning (true by default) scales the queries of its 12 NoPE layers of
    48: a product kernel over T x 40 x 128 at the mean layer's quarter, its backward the same; a
    config that turns it off has none; a workload's share outside [0, 1] is one line."""
    m = load_model("llama4-scout")
    ops = {o.name: o for o in (*layer_graph(m, 1).fwd, *layer_graph(m, 1).bwd)}
    T = m.seq_len
    assert ops["q.scale"].elements == ops["q.scale.bwd"].elements == 0.25 * T * 40 * 128
    off = scout_config()
    off["text_config"]["attn_temperature_tuning"] = False
    assert model_from_hf_config(off).query_scale_share == 0.0
    base = yaml.safe_load((Path(__file__).resolve().parent.parent / "workloads" / "llama4-scout.yaml").read_text())
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({**base, "query_scale_share": 1.5}))
    with pytest.raises(ConfigError, match="query_scale_share"):
        load_model(path)
    assert main(["evaluate", "--workload", "llama4-scout", "--arch", "h100-sxm", "--devices", "64",
                 "--global-batch", "64", "--plan", "tp=4,ep=8,mbs=1,recompute=full", "--allow-oom"]) == 0
    assert "the queries of 25% of the layers times a factor of their position" in capsys.readouterr().out


def test_scouts_l2_norms_run_in_its_rotary_layers():
    """Scout's weightless L2 norms of each query and key head (use_qk_norm: Llama4TextL2Norm after the
    rotary embedding, in the 36 RoPE layers of 48): two norm kernels over q (40 heads of 128) and k
    (8 of 128) at the mean layer's three quarters, one read and one write of each element; no
    weights (the parameter count is the same without them)."""
    m = load_model("llama4-scout")
    T = m.seq_len
    ops = {o.name: o for o in layer_graph(m, 1).fwd}
    assert (ops["q.l2_norm"].elements, ops["k.l2_norm"].elements) == (0.75 * T * 40 * 128, 0.75 * T * 8 * 128)
    assert ops["q.l2_norm"].bytes == 2 * 2 * ops["q.l2_norm"].elements
    assert m.params == replace(m, qk_l2_norm=False).params
    bwd = {o.name for o in layer_graph(m, 1).bwd}
    assert {"q.l2_norm.bwd", "k.l2_norm.bwd"} <= bwd
    assert "q.l2_norm" not in {o.name for o in layer_graph(load_model("llama4-maverick"), 1).fwd}
    assert "q.l2_norm" not in {o.name for o in layer_graph(replace(m, rope_layer_share=0.0), 1).fwd}


def test_other_moe_layer_patterns_from_hugging_face():
    """Qwen3-MoE's decoder_sparse_step (every N-th layer MoE) gives the interval; an irregular
    mlp_only_layers list is costed by its count, and a note says so."""
    base = {"model_type": "qwen3_moe", "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 1024, "moe_intermediate_size": 256,
            "num_experts": 16, "num_experts_per_tok": 2, "vocab_size": 1000, "max_position_embeddings": 4096}
    m = model_from_hf_config({**base, "decoder_sparse_step": 2})
    assert (m.moe_layer_interval, m.moe_layers) == (2, 4)
    assert not any("costed by count" in n for n in m.notes)
    m = model_from_hf_config({**base, "mlp_only_layers": [0, 1, 2, 3]})     # MoE in layers 4-7
    assert m.moe_layers == 4 and any("costed by count" in n for n in m.notes)
    assert model_from_hf_config(base).moe_layer_interval == 1


def test_workload_errors_name_the_field(tmp_path):
    base = yaml.safe_load((Path(__file__).resolve().parent.parent / "workloads" / "llama4-maverick.yaml")
                          .read_text())
    cases = [({"moe_layer_interval": 0}, "moe_layer_interval"),
             ({"moe_layer_interval": 49}, "moe_layer_interval"),
             ({"experts": 0, "top_k": 0, "shared_experts": 0}, "experts"),
             ({"sliding_window": 4096}, "attention_chunk"),
             ({"rope_layer_share": 1.5}, "rope_layer_share"),
             ({"rope_layer_share": 0.5, "position_embedding": "learned", "max_positions": 8192}, "rope_layer_share")]
    for i, (change, field) in enumerate(cases):
        path = tmp_path / f"w{i}.yaml"
        path.write_text(yaml.safe_dump({**base, **change}))
        with pytest.raises(ConfigError, match=field):
            load_model(path)


def test_validation_rows_naming_llama4_take_its_layers():
    """A row naming a Llama 4 model by NeMo's recipe name gets the shipped workload (its dense
    layers, shared expert, chunks and vocabulary); the row's shape columns keep them."""
    from test_validate import synthetic
    row = synthetic(model="Llama4-E128", layers="48", hidden="5120", heads="40", ffn_hidden="8192",
                    gpu="H100-SXM5-80GB", gpu_count="512", global_batch="1024", seq_len="8192", tp="4",
                    ep="128", micro_batch="1")
    c = row_to_case(row)
    assert isinstance(c, Case), getattr(c, "reason", c)
    m = c.model
    assert (m.moe_layers, m.dense_ffn_layers, m.ffn_hidden, m.expert_ffn, m.shared_experts) == (24, 24, 16384, 8192, 1)
    assert (m.attention_chunk, m.window_layer_share, m.vocab, m.kv_heads) == (8192, 0.75, V, KV)
    scout = row_to_case(synthetic(model="Llama 4 Scout", gpu="H100-SXM5-80GB", gpu_count="64",
                                    layers="", hidden="", heads="", global_batch="64", seq_len="8192",
                                    tp="4", ep="16"))
    assert isinstance(scout, Case), getattr(scout, "reason", scout)
    assert (scout.model.experts, scout.model.moe_layers) == (16, 48)


@pytest.mark.parametrize("kernels", ["fused", "complex", "separate"])
def test_nope_layers_rotate_nothing(kernels):
    """Every fourth layer has no rotary embedding (rope_layer_share 0.75): the mean layer's rotary
    kernels, forward and backward, move and compute three quarters of what they do when every layer
    rotates (each a hand count: T·heads·128 rotated elements for q, T·kv·128 for k), as do the L2
    norms of the rotated heads; nothing else changes."""
    m = replace(load_model("llama4-scout"), rotary_kernels=kernels)
    full = replace(m, rope_layer_share=1.0)
    T = m.seq_len

    def ops(model):
        g = layer_graph(model, 1, 1, False, "flash", "none", None)
        return {o.name: o for o in (*g.fwd, *g.bwd)}
    nope, every = ops(m), ops(full)
    assert nope.keys() == every.keys()
    rotary = [k for k in every if ".rotary" in f".{k}" or ".l2_norm" in k]   # and the L2 norms after it
    assert rotary
    for k in rotary:
        a, b = nope[k], every[k]
        assert (a.elements, a.flops, a.bytes_read, a.bytes_written) == pytest.approx(
            (0.75 * b.elements, 0.75 * b.flops, 0.75 * b.bytes_read, 0.75 * b.bytes_written), rel=1e-12), k
    for k in set(every) - set(rotary):
        assert nope[k] == every[k], k
    q = "q.rotary" if kernels == "fused" else ("q.rotary.rotate" if kernels == "complex" else "q.rotary.cos_mul")
    assert nope[q].elements == 0.75 * T * A * D
    k_op = q.replace("q.", "k.", 1)
    assert nope[k_op].elements == 0.75 * T * KV * D



def test_the_printout_says_which_layers_rotate(capsys):
    assert main(["evaluate", "--workload", "llama4-scout", "--arch", "h100-sxm", "--devices", "64",
                 "--global-batch", "64", "--plan", "tp=4,ep=8,mbs=1,recompute=full", "--allow-oom"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "position embedding" in x)
    assert "a rotary embedding in 75% of the layers, none in the others" in line
