"""Parallel blocks (GPT-J, GPT-NeoX, PaLM, Falcon): attention and FFN side by side on the layer's
input, their partial outputs reduced over tensor parallelism once. Parameter counts against the
published ones, collectives, FLOPs and saved activations by hand, Hugging Face configs, refusals."""
from dataclasses import replace

import pytest
import yaml
from conftest import toy_chip

from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.graph import layer_graph, tensor_flops
from phaze.hf_config import model_from_hf_config
from phaze.memory import activation_bytes_per_layer
from phaze.plan import Plan
from phaze.plan_check import check_plan
from phaze.runs import Case, Skipped, row_to_case
from phaze.step import evaluate
from phaze.workload import Model

BLOCKS = ("", "shared_norm", "two_norms")


def gpt(block: str = "", **kw) -> Model:
    base = dict(name="g", layers=4, hidden=256, heads=8, ffn_hidden=1024, vocab=1000, seq_len=128,
                dropout=False, parallel_block=block)
    return Model(**{**base, **kw})


def test_gpt_neox_20b_is_its_published_count_by_hand():
    """Black et al. 2022 Table 1 and the model card: 20,554,567,680. By hand: a layer's qkv
    (6144 x 18432 + bias), output (6144^2 + bias), FFN (2 x 6144 x 24576 + biases) and two
    LayerNorms of weight and bias; untied 50,432-token embedding and head; the final norm."""
    m = load_model("gpt-neox-20b")
    h, f, V = 6144, 24576, 50432
    layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    assert m.params == 44 * layer + 2 * V * h + 2 * h == 20_554_567_680
    assert m.parallel_block == "two_norms"


def test_palm_540b_has_one_bias_free_norm_per_layer_by_hand():
    """Chowdhery et al. 2022 Table 1, 540.35B: 48 query heads and one key/value head of 256, a
    SwiGLU FFN of 4 x 18432, one LayerNorm without bias per layer (the shared norm), the final
    norm, one shared 256,000 x 18432 embedding."""
    m = load_model("palm-540b")
    h, f, q, kv = 18432, 4 * 18432, 48 * 256, 256
    layer = h * (q + 2 * kv) + q * h + 3 * h * f + h
    assert m.params == 118 * layer + 256_000 * h + h
    assert m.params == pytest.approx(540.35e9, rel=2e-5)
    assert m.layer_params == replace(m, parallel_block="").layer_params - h   # the second norm's weight
    assert m.layer_tensors() == replace(m, parallel_block="").layer_tensors() - 1


def test_bloom_counts_its_embedding_norm_to_the_published_count():
    m = load_model("bloom-176b")
    assert m.params == 176_247_271_424                              # the model card's count, exactly
    assert m.params - replace(m, embedding_norm=False).params == 2 * 14336   # weight and bias


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("tp,sp", [(1, False), (4, False), (4, True)])
def test_flops_are_the_sequential_layers(block, tp, sp):
    base = layer_graph(gpt(), 2, tp, sp, "flash", "full")
    g = layer_graph(gpt(block), 2, tp, sp, "flash", "full")
    assert tensor_flops(g.fwd) == pytest.approx(tensor_flops(base.fwd))
    assert tensor_flops(g.bwd) == pytest.approx(tensor_flops(base.bwd))


def _colls(ops):
    return [(o.name, o.collective.kind) for o in ops if o.collective]


def test_one_reduction_forward_and_one_gradient_gather_backward_by_hand():
    """tp 4, sequence parallel. Sequential: two gathers and two reduce-scatters each way, and the
    two column linears' inputs re-gathered for their weight gradients (10). A shared norm: its
    output gathered once, the summed partial outputs reduce-scattered once; backward, one gather of
    the output gradient, the two re-gathers, one reduce-scatter of the input gradient (6). Two
    norms: each norm's output gathered and its gradient reduce-scattered (8)."""
    T, h, p = 2 * 128, 256, 2
    g = layer_graph(gpt("shared_norm"), 2, 4, True, "flash", "none")
    assert _colls(g.fwd) == [("ln1.all_gather", "all_gather"), ("ffn_down.reduce_scatter", "reduce_scatter")]
    assert _colls(g.bwd) == [("ffn_down.reduce_scatter.bwd", "all_gather"),
                             ("ffn_up.input_all_gather", "all_gather"),
                             ("qkv.input_all_gather", "all_gather"),
                             ("ln1.all_gather.bwd", "reduce_scatter")]
    assert all(o.collective.bytes == p * T * h for o in g.ops if o.collective)
    g2 = layer_graph(gpt("two_norms"), 2, 4, True, "flash", "none")
    assert _colls(g2.fwd) == [("ln1.all_gather", "all_gather"), ("ln2.all_gather", "all_gather"),
                              ("ffn_down.reduce_scatter", "reduce_scatter")]
    assert [k for _, k in _colls(g2.bwd)] == ["all_gather", "all_gather", "reduce_scatter", "all_gather",
                                              "reduce_scatter"]
    seq = layer_graph(gpt(), 2, 4, True, "flash", "none")
    moved = [sum(o.collective.bytes for o in x.ops if o.collective) for x in (seq, g2, g)]
    assert moved == [10 * p * T * h, 8 * p * T * h, 6 * p * T * h]


def test_without_sequence_parallelism_each_column_linear_reduces_its_input_gradient():
    """GPT-NeoX's layers (Megatron's ColumnParallelLinear in each branch): the forward reduces
    once, the backward all-reduces the qkv and up projections' input gradients one by one."""
    g = layer_graph(gpt("two_norms"), 1, 4, False, "flash", "none")
    assert _colls(g.fwd) == [("ffn_down.all_reduce", "all_reduce")]
    assert _colls(g.bwd) == [("ffn_up.dgrad.all_reduce", "all_reduce"), ("qkv.dgrad.all_reduce", "all_reduce")]


def test_partial_outputs_are_added_before_the_reduction():
    T, h = 128, 256
    for tp, sp in ((1, False), (4, True)):
        ops = {o.name: o for o in layer_graph(gpt("shared_norm"), 1, tp, sp, "flash", "none").fwd}
        assert "attn_residual" not in ops and "ln2" not in ops
        s = ops["block_sum"]
        assert s.elements == T * h and s.bytes_read == 2 * 2 * T * h   # both tp-wide partial outputs
        assert ops["ffn_residual"].elements == T * h // (tp if sp else 1)
        names = list(ops)
        assert names.index("attn_out") < names.index("ffn_up") < names.index("block_sum") < names.index("ffn_residual")


def test_a_rerun_of_what_the_backward_reads_skips_both_output_projections():
    """Neither branch's output is read by the backward: a re-run that keeps only what it needs
    (XLA, JAX's remat) casts nothing and skips both output projections, their sum, its reduction
    and the residual; the sequential layer keeps its output projection (the second norm reads
    the sum)."""
    m = replace(gpt("shared_norm"), recompute_rerun="needed")
    rerun = {o.name for o in layer_graph(m, 1, 4, True, "flash", "full").bwd if o.name.startswith("recompute.")}
    whole = {o.name for o in layer_graph(replace(m, recompute_rerun="whole"), 1, 4, True, "flash", "full").bwd
             if o.name.startswith("recompute.")}
    assert whole - rerun == {"recompute." + n for n in ("attn_out", "ffn_down", "block_sum",
                                                        "ffn_down.reduce_scatter", "ffn_residual")}


@pytest.mark.parametrize("sp,tp", [(False, 1), (True, 4)])
def test_saved_activations_by_hand(sp, tp):
    """Korthikanti's replicated terms, per token and hidden unit: ln1 in, qkv in, ln2 in, FFN in
    (plus the dropout masks, none here). Two norms read the same input (ln2 in is gone); one shared
    norm's output is the FFN's input too (FFN in is gone)."""
    s, b, h, p = 128, 2, 256, 2
    rep = 1 / tp if sp else 1
    args = (2, tp, sp, "none", "flash")
    seq = activation_bytes_per_layer(gpt(), *args)
    assert seq - activation_bytes_per_layer(gpt("two_norms"), *args) == pytest.approx(p * s * b * h * rep)
    assert seq - activation_bytes_per_layer(gpt("shared_norm"), *args) == pytest.approx(2 * p * s * b * h * rep)
    for block in BLOCKS:   # a full recompute keeps the layer input either way
        assert activation_bytes_per_layer(gpt(block), 2, tp, sp, "full", "flash") == p * s * b * h * rep


def test_one_fewer_tensor_parallel_reduction_is_faster_at_tp_8():
    m = load_model("palm-62b")
    chip = toy_chip()
    plan = Plan(tp=8, pp=1, mbs=1, recompute="full", sp=True)
    par = evaluate(m, chip, 64, 64, plan)
    seq = evaluate(replace(m, parallel_block=""), chip, 64, 64, plan)
    assert par.step_time_s < seq.step_time_s


def test_hf_configs_give_their_block_kv_heads_and_biases():
    falcon7 = dict(model_type="falcon", hidden_size=4544, num_attention_heads=71, num_hidden_layers=32,
                   vocab_size=65024, multi_query=True, parallel_attn=True, bias=False, alibi=False)
    m = model_from_hf_config(falcon7)
    assert (m.kv_heads, m.parallel_block, m.bias, m.position_embedding) == (1, "shared_norm", False, "rotary")
    # tiiuae/falcon-7b's 6,921,720,704 parameters, its LayerNorms' biases (33 x 4544) with them
    # (until 2026-12-07 not counted, and noted)
    assert m.params == 6_921_720_704 and m.norm_affine == "weight_bias"
    falcon40 = dict(falcon7, hidden_size=8192, num_attention_heads=128, num_hidden_layers=60,
                    new_decoder_architecture=True, num_kv_heads=8)
    m = model_from_hf_config(falcon40)
    assert (m.kv_heads, m.parallel_block) == (8, "two_norms")
    assert model_from_hf_config(dict(falcon40, num_ln_in_parallel_attn=1)).parallel_block == "shared_norm"
    assert model_from_hf_config(dict(falcon7, parallel_attn=False)).parallel_block == ""
    assert model_from_hf_config(dict(falcon7, multi_query=False)).kv_heads == 71
    neox = dict(model_type="gpt_neox", hidden_size=6144, intermediate_size=24576, num_attention_heads=64,
                num_hidden_layers=44, vocab_size=50432, max_position_embeddings=2048, hidden_act="gelu_fast",
                use_parallel_residual=True, tie_word_embeddings=False)
    m = model_from_hf_config(neox)
    assert m.parallel_block == "two_norms" and m.params == load_model("gpt-neox-20b").params
    assert model_from_hf_config(dict(neox, use_parallel_residual=False)).parallel_block == ""
    # partial rotations: GPT-NeoX-20B's rotary_pct 0.25 of its 96-wide heads, as its file says;
    # GPT-J's rotary_dim 64 of 256; a factor of 1 (or none) rotates the whole head
    shipped = load_model("gpt-neox-20b").rotated_width
    assert model_from_hf_config(dict(neox, rotary_pct=0.25)).rotated_width == shipped == 24
    assert model_from_hf_config(dict(neox, partial_rotary_factor=1.0)).rotated_width == 96
    gptj = dict(model_type="gptj", n_embd=4096, n_head=16, n_layer=28, vocab_size=50400, n_positions=2048)
    assert model_from_hf_config(gptj).parallel_block == "shared_norm"
    assert model_from_hf_config(dict(gptj, rotary_dim=64)).rotated_width == 64
    bloom = dict(model_type="bloom", hidden_size=14336, n_head=112, n_layer=70, vocab_size=250880)
    m = model_from_hf_config(bloom)
    assert m.embedding_norm and m.position_embedding == "alibi"
    assert m.params == load_model("bloom-176b").params


def test_refused_where_not_modelled(tmp_path):
    path = tmp_path / "w.yaml"
    base = dict(name="w", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=100, seq_len=32,
                parallel_block="shared_norm")
    for extra, what in ((dict(experts=4, top_k=2), "mixture of experts"), (dict(norm_position="post"), "post-norm"),
                        (dict(architecture="encoder"), "encoder")):
        path.write_text(yaml.safe_dump({**base, **extra}))
        with pytest.raises(ConfigError, match=f"parallel_block.*{what}"):
            load_model(path)
    path.write_text(yaml.safe_dump({**base, "parallel_block": "yes"}))
    with pytest.raises(ConfigError, match="parallel_block"):
        load_model(path)
    with pytest.raises(ConfigError, match="recompute.*op"):
        check_plan(gpt("two_norms"), 8, 8, Plan(tp=2, recompute="op"))


def test_validation_rows_name_their_block():
    from test_validate import synthetic
    # a row naming PaLM with only the standard columns brings its multi-query heads, vocabulary,
    # SwiGLU and parallel block
    row = synthetic(model="PaLM 540B", layers="118", hidden="18432", heads="48", ffn_hidden="73728",
                    gpu="", gpu_count="6144", global_batch="2048", tp="12", sequence_parallel="no")
    row["chip"] = "tpuv4"
    c = row_to_case(row)
    assert isinstance(c, Case), getattr(c, "reason", c)
    assert (c.model.kv_heads, c.model.vocab, c.model.activation, c.model.parallel_block) == (
        1, 256000, "swiglu", "shared_norm")
    row["parallel_block"] = "sequential"
    assert row_to_case(row).model.parallel_block == ""
    row2 = synthetic(parallel_block="two_norms")
    assert row_to_case(row2).model.parallel_block == "two_norms"
    bad = row_to_case(synthetic(parallel_block="parallel"))
    assert isinstance(bad, Skipped) and "parallel_block" in bad.reason
    moe = row_to_case(synthetic(parallel_block="shared_norm", num_experts="8", moe_top_k="2", ep="2"))
    assert isinstance(moe, Skipped) and "parallel_block" in moe.reason and "mixture of experts" in moe.reason


def test_a_placement_searches_no_per_op_recompute_it_cannot_run():
    """torchtitan's preset turns selective recompute into its per-op policy, which is modelled for
    sequential layers only: a placement of a parallel block (or of experts) searches none, full
    and block instead of failing on the plan it would pick."""
    from phaze.placement import PlacementOptions, place, searched_modes
    options = PlacementOptions(tp=(1,), pp=(1,), mbs=(1,), zero=(0,), recompute=("none", "op", "full"))
    assert searched_modes(gpt(), options) == ("none", "op", "full")
    assert searched_modes(gpt("shared_norm"), options) == ("none", "full")
    assert searched_modes(load_model("mixtral-8x7b"), options) == ("none", "full")
    m = gpt("two_norms")
    chip = toy_chip()
    need = evaluate(m, chip, 2, 2, Plan(recompute="none")).memory_per_device_bytes
    full = evaluate(m, chip, 2, 2, Plan(recompute="full")).memory_per_device_bytes
    from phaze.memory import memory_reserve_bytes
    tight = replace(chip, hbm_bytes=memory_reserve_bytes(chip) + (need + full) / 2)   # only full fits
    res = place(m, tight, 2, 2, options)
    assert res.best.plan.recompute == "full"
