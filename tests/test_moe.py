"""Mixture of experts: parameter counts, the MoE layer's operators, the all-to-all, expert
parallelism's plan checks and memory, routing, and MoE rows in validation.

Expected numbers come from outside phaze: published totals and active counts (papers, model cards,
Hugging Face configs), FLOP formulas and an all-to-all time written out by hand.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from phaze.arch import load_chip
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.cost import Efficiency, collective_time, op_time
from phaze.graph import DROPLESS_LOAD, Collective, ExpertLayout, Op, collective_groups, layer_graph, tensor_flops
from phaze.hf_config import model_from_hf_config
from phaze.plan import Plan, parse_plan
from phaze.runs import Case, Skipped, default_runs_paths, read_runs, row_to_case
from phaze.stage import PhaseTime, _layer_costs, _layer_sums, expert_layout, exposed, fsdp_units, stage_costs
from phaze.step import evaluate, layout_of, model_flops_per_sample
from phaze.workload import Model

# (workload, published total, published active, source); the active count of gpt-oss is the model
# card's, which counts the unembedding but not the embedding table
PUBLISHED = [
    ("mixtral-8x7b", 46.7e9, 12.9e9),      # Mistral AI, Mixtral of experts (Dec 2023)
    ("mixtral-8x22b", 141e9, 39e9),        # Mistral AI, Cheaper, Better, Faster, Stronger (Apr 2024)
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),      # Qwen3-30B-A3B model card
    ("qwen3-235b-a22b", 235e9, 22e9),      # arXiv:2505.09388 Table 2
    ("deepseek-v3", 671e9, 37e9),          # arXiv:2412.19437 Sec. 4.2
    ("deepseek-v2", 236e9, 21e9),          # arXiv:2405.04434 Sec. 3.1.2
    ("gpt-oss-120b", 116.83e9, 5.13e9),    # arXiv:2508.10925 Table 1
    ("llama4-maverick", 400e9, 17e9),      # Llama 4 model card (400B with the vision encoder)
]


@pytest.mark.parametrize("name,total,active", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_total_and_active_params(name, total, active):
    m = load_model(name)
    assert m.moe
    assert m.params == pytest.approx(total, rel=0.01)
    got = m.active_params - (m.vocab * m.hidden if name == "gpt-oss-120b" else 0)
    assert got == pytest.approx(active, rel=0.02)


def test_deepseek_v3_params_by_hand():
    """671B written out from arXiv:2412.19437 Sec. 4.2 and the HF config: MLA attention, 3 dense
    layers of FFN 18432, 58 MoE layers of 256 routed + 1 shared expert of 2048, untied 129280 vocab."""
    h, a = 7168, 128
    mla = (h * 1536 + 1536 + 1536 * a * 192 + h * (512 + 64) + 512 + 512 * a * (128 + 128) + a * 128 * h)
    expert = 3 * h * 2048
    norms = 2 * h
    dense = 3 * (mla + 3 * h * 18432 + norms)
    moe = 58 * (mla + h * 256 + 257 * expert + norms)
    total = dense + moe + 2 * 129280 * h + h
    m = load_model("deepseek-v3")
    assert m.params == total
    assert m.active_params == total - 58 * (256 - 8) * expert


@pytest.mark.parametrize("name,L,h,a,q_lora,dense_ffn,E,f,total,active", [
    ("deepseek-v2", 60, 5120, 128, 1536, 12288, 160, 1536, 236e9, 21e9),
    ("deepseek-v2-lite", 27, 2048, 16, 0, 10944, 64, 1408, 15.7e9, 2.4e9)])
def test_deepseek_v2_params_by_hand(name, L, h, a, q_lora, dense_ffn, E, f, total, active):
    """DeepSeek-V2 and V2-Lite written out from arXiv:2405.04434 (Sec. 3.1.2, Appendix B) and
    Megatron-Bridge 0.3.1's providers: MLA (V2 compresses its queries to 1536, the Lite projects
    them whole), one dense layer, the rest MoE with 2 shared and E routed experts, 6 routed a token,
    an untied 102,400-token table. The published totals to 1 %; the active counts (2.4B for the
    Lite) leave out the embedding table, which no token multiplies, to within the figure's rounding."""
    q = (h * q_lora + q_lora + q_lora * a * 192) if q_lora else h * a * 192
    mla = q + h * (512 + 64) + 512 + 512 * a * (128 + 128) + a * 128 * h
    expert, norms = 3 * h * f, 2 * h
    moe = (L - 1) * (mla + h * E + (E + 2) * expert + norms)
    by_hand = mla + 3 * h * dense_ffn + norms + moe + 2 * 102400 * h + h
    m = load_model(name)
    assert m.params == by_hand and m.params == pytest.approx(total, rel=0.01)
    assert m.active_params == by_hand - (L - 1) * (E - 6) * expert
    assert abs(m.active_params - 102400 * h - active) <= 0.025 * active + 0.05e9


def test_hf_configs_give_the_shipped_workloads():
    """The Hugging Face configs of the shipped MoE models (the keys as published) give the same
    parameter count as the workload files."""
    configs = {
        "mixtral-8x7b": dict(model_type="mixtral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=8, intermediate_size=14336, num_local_experts=8,
                             num_experts_per_tok=2, vocab_size=32000, hidden_act="silu", rms_norm_eps=1e-5,
                             tie_word_embeddings=False, max_position_embeddings=32768),
        "qwen3-235b-a22b": dict(model_type="qwen3_moe", hidden_size=4096, num_hidden_layers=94,
                                num_attention_heads=64, num_key_value_heads=4, head_dim=128,
                                intermediate_size=12288, moe_intermediate_size=1536, num_experts=128,
                                num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
                                vocab_size=151936, hidden_act="silu", rms_norm_eps=1e-6,
                                tie_word_embeddings=False, max_position_embeddings=40960),
        "deepseek-v3": dict(model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61,
                            num_attention_heads=128, num_key_value_heads=128, intermediate_size=18432,
                            moe_intermediate_size=2048, n_routed_experts=256, n_shared_experts=1,
                            num_experts_per_tok=8, first_k_dense_replace=3, q_lora_rank=1536,
                            kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                            vocab_size=129280, hidden_act="silu", rms_norm_eps=1e-6,
                            tie_word_embeddings=False, num_nextn_predict_layers=1,
                            max_position_embeddings=163840, n_group=8, topk_group=4),
        "deepseek-v2": dict(model_type="deepseek_v2", hidden_size=5120, num_hidden_layers=60,
                            num_attention_heads=128, num_key_value_heads=128, intermediate_size=12288,
                            moe_intermediate_size=1536, n_routed_experts=160, n_shared_experts=2,
                            num_experts_per_tok=6, first_k_dense_replace=1, moe_layer_freq=1, q_lora_rank=1536,
                            kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                            vocab_size=102400, hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False,
                            max_position_embeddings=163840, n_group=8, topk_group=3,
                            topk_method="group_limited_greedy"),
        "deepseek-v2-lite": dict(model_type="deepseek_v2", hidden_size=2048, num_hidden_layers=27,
                                 num_attention_heads=16, num_key_value_heads=16, intermediate_size=10944,
                                 moe_intermediate_size=1408, n_routed_experts=64, n_shared_experts=2,
                                 num_experts_per_tok=6, first_k_dense_replace=1, moe_layer_freq=1,
                                 q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                                 v_head_dim=128, vocab_size=102400, hidden_act="silu", rms_norm_eps=1e-6,
                                 tie_word_embeddings=False, max_position_embeddings=163840, n_group=1,
                                 topk_group=1, topk_method="greedy"),
        "gpt-oss-120b": dict(model_type="gpt_oss", hidden_size=2880, num_hidden_layers=36, num_attention_heads=64,
                             num_key_value_heads=8, head_dim=64, intermediate_size=2880, num_local_experts=128,
                             experts_per_token=4, vocab_size=201088, sliding_window=128, attention_bias=True,
                             rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=131072),
    }
    for name, cfg in configs.items():
        hf = model_from_hf_config(cfg, name=name)
        shipped = load_model(name)
        assert hf.moe and (hf.experts, hf.top_k) == (shipped.experts, shipped.top_k)
        # gpt-oss from HF also counts the q/k/v biases (5120 per layer) the workload file leaves out
        slack = 36 * 5120 if name == "gpt-oss-120b" else 0
        assert abs(hf.params - shipped.params) <= slack, name
    # multi-token prediction read from num_nextn_predict_layers, as the workload file states it
    assert model_from_hf_config(configs["deepseek-v3"]).mtp_layers == load_model("deepseek-v3").mtp_layers == 1
    no_mtp = {k: v for k, v in configs["deepseek-v3"].items() if k != "num_nextn_predict_layers"}
    assert model_from_hf_config(no_mtp).mtp_layers == 0
    # node-limited routing from the config's n_group / topk_group (DeepSeek-V3's published 8 and 4)
    ds, ds_shipped = model_from_hf_config(configs["deepseek-v3"]), load_model("deepseek-v3")
    assert (ds.router_groups, ds.router_group_topk) == (ds_shipped.router_groups, ds_shipped.router_group_topk)
    for name in ("deepseek-v2", "deepseek-v2-lite"):   # DeepSeek-V2's device-limited 8 and 3; the Lite's none
        v2, v2_shipped = model_from_hf_config(configs[name]), load_model(name)
        assert (v2.router_groups, v2.router_group_topk, v2.q_lora_rank, v2.dense_layers, v2.shared_experts) == \
            (v2_shipped.router_groups, v2_shipped.router_group_topk, v2_shipped.q_lora_rank, v2_shipped.dense_layers, 2)
    assert (ds.router_groups, ds.router_group_topk) == (8, 4)
    # left out, DeepseekV3Config's defaults (8 and 4) hold; one group is no grouping
    plain = {k: v for k, v in configs["deepseek-v3"].items() if k not in ("n_group", "topk_group")}
    assert (model_from_hf_config(plain).router_groups, model_from_hf_config(plain).router_group_topk) == (8, 4)
    assert model_from_hf_config({**plain, "n_group": 1, "topk_group": 1}).router_groups == 0
    oss = model_from_hf_config(configs["gpt-oss-120b"])
    assert (oss.sliding_window, oss.window_layer_share) == (128, 0.5)        # every other layer (no layer_types)
    assert (shipped.sliding_window, shipped.window_layer_share) == (128, 0.5)
    kinds = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"] * 9
    assert model_from_hf_config(dict(configs["gpt-oss-120b"], layer_types=kinds)).window_layer_share == 0.75


def test_alternating_window_costs_the_mean_of_its_layers_by_hand():
    """GPT-OSS: half the layers see at most 128 earlier keys, half every earlier key. At s = 4096
    a windowed layer computes (w/s)(1 - w/(2s)) = (1/32)(1 - 1/64) of the score matrix, a full one
    1/2: the layer graph's attention FLOPs are the mean, 0.5 * (63/2048) + 0.25."""
    from phaze.graph import attention_work_fraction
    m = load_model("gpt-oss-120b")
    assert m.seq_len == 4096
    assert attention_work_fraction(m) == pytest.approx(0.5 * 63 / 2048 + 0.25)
    full = dataclasses.replace(m, sliding_window=0)
    everywhere = dataclasses.replace(m, window_layer_share=1.0)
    assert attention_work_fraction(full) == 0.5 and attention_work_fraction(everywhere) == pytest.approx(63 / 2048)

    def attention(model):
        g = layer_graph(model, 1, 1, False, "flash", "none")
        return sum(o.flops * o.work_fraction for o in g.fwd if o.core_attention)
    assert attention(m) == pytest.approx((attention(full) + attention(everywhere)) / 2)


def test_dense_qwen3_counts_qk_norm():
    """Qwen3-8B (HF Qwen/Qwen3-8B config.json): 8,190,735,360 parameters; q/k norms add 2 x 128 per layer."""
    cfg = dict(model_type="qwen3", hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936,
               hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=40960)
    m = model_from_hf_config(cfg)
    assert m.qk_norm and not m.moe
    assert m.params == 8_190_735_360


TINY = Model(name="tiny-moe", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=128, seq_len=32,
             activation="swiglu", position_embedding="rotary", tied_embeddings=False, norm="rmsnorm",
             bias=False, dropout=False, experts=4, top_k=2, expert_ffn_hidden=32)


def test_router_and_expert_flops_by_hand():
    T, h, E, k, f = 32, 64, 4, 2, 32
    g = layer_graph(TINY, 1, 1, False, "flash", "none")
    fwd = {o.name: o for o in g.fwd}
    assert fwd["router"].flops == 2 * T * h * E
    # SwiGLU experts: up (gate and up, 2f wide) and down, over T*k routed tokens
    assert fwd["expert_up"].flops + fwd["expert_down"].flops == 2 * T * k * h * 2 * f + 2 * T * k * f * h
    assert fwd["expert_up"].gemm == (E, T * k // E, h, 2 * f)
    assert "ffn_up" not in fwd
    # ep = 2: each device holds 2 experts and receives, balanced, as many routed tokens as it
    # sends (the ep ranks hold different data): the same work in fewer, taller GEMMs, sent and
    # received by an all-to-all before and after the experts, mirrored in backward
    g2 = layer_graph(TINY, 1, 1, False, "flash", "none", ExpertLayout(ep=2))
    f2 = {o.name: o for o in g2.fwd}
    assert f2["expert_up"].flops == fwd["expert_up"].flops
    assert f2["expert_up"].gemm == (E // 2, 2 * T * k // E, h, 2 * f)
    a2a = [o for o in g2.ops if o.collective and o.collective.kind == "all_to_all"]
    assert len(a2a) == 4 and all(o.collective.group == "ep" for o in a2a)
    assert f2["dispatch.all_to_all"].collective.bytes == 2 * T * k * h
    # the busiest rank under dropless routing: load x the mean tokens
    g3 = layer_graph(TINY, 1, 1, False, "flash", "none", ExpertLayout(ep=2, load=1.5))
    assert {o.name: o for o in g3.fwd}["expert_up"].gemm[1] == 1.5 * T * k / 2   # over 2 local experts


def test_model_flops_count_top_k_and_router():
    """Megatron's convention: the routed top-k experts count, the idle ones do not. An MoE of
    top-2 experts of width 32 = a dense SwiGLU FFN of width 64 plus the router (3 passes)."""
    dense = dataclasses.replace(TINY, experts=0, top_k=0, expert_ffn_hidden=0, ffn_hidden=64)
    router = 3 * 2 * 32 * 64 * 4
    assert model_flops_per_sample(TINY) - model_flops_per_sample(dense) == TINY.layers * router


def test_all_to_all_two_levels_by_hand():
    """16 ranks on two 8-GPU H100 nodes: 7 peers over NVLink (450 GB/s, 1.9 us), 8 over the
    network (50 GB/s, 4 us), each sent 1/16 of the buffer; the levels run concurrently."""
    chip = load_chip("h100-sxm")
    nbytes = 64e6
    nv = 7 / 16 * nbytes / 450e9 + 7 * 1.9e-6
    ib = 8 / 16 * nbytes / 50e9 + 8 * 4.0e-6
    start = 14e-6   # the chip file's fixed start-up of one NCCL collective
    assert collective_time("all_to_all", nbytes, 16, chip) == pytest.approx(start + max(nv, ib), rel=1e-9)
    # 8 ranks inside one node: NVLink only
    assert collective_time("all_to_all", nbytes, 8, chip) == pytest.approx(start + 7 / 8 * nbytes / 450e9
                                                                           + 7 * 1.9e-6)
    # ep ranks 2 apart (etp = 2): 4 of them per node, 2 nodes
    nv4 = 3 / 8 * nbytes / 450e9 + 3 * 1.9e-6
    ib4 = 4 / 8 * nbytes / 50e9 + 4 * 4.0e-6
    assert collective_time("all_to_all", nbytes, 8, chip, stride=2) == pytest.approx(start + max(nv4, ib4))


def _one_line_error(fn, field):
    with pytest.raises(ConfigError) as exc:
        fn()
    text = str(exc.value)
    assert field in text and "\n" not in text
    return text


def test_ep_etp_validation():
    chip = load_chip("h100-sxm")
    mix = load_model("mixtral-8x7b")
    text = _one_line_error(lambda: evaluate(mix, chip, 64, 64, Plan(tp=2, pp=4, ep=3)), "ep")
    assert "allowed" in text and "8" in text
    _one_line_error(lambda: evaluate(mix, chip, 16, 16, Plan(tp=2, pp=4, ep=8)), "ep")   # 2*2 ranks < 8
    _one_line_error(lambda: evaluate(mix, chip, 64, 64, Plan(tp=2, pp=4, ep=2, etp=3)), "etp")
    gpt = load_model("gpt3-175b")
    _one_line_error(lambda: evaluate(gpt, chip, 64, 64, Plan(tp=8, pp=8, ep=2)), "ep")
    assert parse_plan("tp=2,ep=8,etp=2,routing=forced") == Plan(tp=2, ep=8, etp=2, routing="forced")
    assert parse_plan(Plan(tp=2, ep=8, etp=2, routing="forced").label()) == Plan(tp=2, ep=8, etp=2,
                                                                                  routing="forced")
    _one_line_error(lambda: parse_plan("ep=0"), "ep")
    _one_line_error(lambda: parse_plan("routing=random"), "routing")


def test_expert_weights_shrink_as_one_over_ep():
    chip = load_chip("h100-sxm")
    m = load_model("mixtral-8x22b")
    weights = {}
    for ep in (1, 2, 4, 8):
        c = stage_costs(m, chip, 128, 256, Plan(tp=2, pp=8, ep=ep), )
        weights[ep] = c.params(1, 7)
    # per device: dense part / tp + experts / (ep * etp), not / tp (Megatron-Core re-folds the
    # expert layers' ranks): at ep = 1 every device holds all the experts of its layers
    for ep in (2, 4, 8):
        assert weights[1] - weights[ep] == pytest.approx(7 * m.expert_layer_params * (1 - 1 / ep))
    assert weights[2] - weights[4] == pytest.approx(2 * (weights[4] - weights[8]))
    # the expert data-parallel group shards the experts' optimizer state (distributed optimizer)
    r1 = evaluate(m, chip, 128, 256, Plan(tp=2, pp=8, vp=7, ep=8, zero=1))
    r0 = evaluate(m, chip, 128, 256, Plan(tp=2, pp=8, vp=7, ep=8, zero=0))
    assert r1.memory_per_device_bytes < r0.memory_per_device_bytes


def test_forced_balance_is_faster_than_dropless():
    chip = load_chip("h100-sxm")
    m = load_model("mixtral-8x22b")
    times = {r: evaluate(m, chip, 128, 256, Plan(tp=2, pp=8, vp=7, ep=8, routing=r)).step_time_s
             for r in ("forced", "dropless", "capacity")}
    assert times["forced"] < times["dropless"]
    # capacity factor 1 padded: exactly the balanced load
    assert times["capacity"] == times["forced"]
    cf = dataclasses.replace(m, capacity_factor=1.25)
    assert evaluate(cf, chip, 128, 256, Plan(tp=2, pp=8, vp=7, ep=8)).step_time_s > times["forced"]


def test_dense_model_ignores_the_expert_layout():
    """A dense model's graph and step are the same whatever expert layout or routing is given."""
    gpt = load_model("gpt3-175b")
    assert layer_graph(gpt, 1, 8, True, "flash", "selective", ExpertLayout(4, 2, 1.3)) == \
        layer_graph(gpt, 1, 8, True, "flash", "selective")
    chip = load_chip("a100-80gb")
    base = evaluate(gpt, chip, 1024, 1536, Plan(tp=8, pp=8, recompute="selective"))
    routed = evaluate(gpt, chip, 1024, 1536, Plan(tp=8, pp=8, recompute="selective", routing="forced"))
    assert routed.step_time_s == base.step_time_s
    assert routed.memory_per_device_bytes == base.memory_per_device_bytes


def _rows():
    return {r["run_id"]: r for r in read_runs(default_runs_paths()[1])}


def test_moe_row_becomes_a_case():
    row = _rows()["R1056"]     # Mixtral-8x22B, ep 8, dropless (S21)
    case = row_to_case(row)
    assert isinstance(case, Case), getattr(case, "reason", "")
    assert case.model.moe and case.model.experts == 8 and case.plan.ep == 8
    assert case.plan.routing == "dropless" and case.layout_from == "row"


def test_moe_row_without_explicit_columns_gets_intra_node_ep():
    """The standard columns only: the named workload gives the experts and the attention shape;
    the row's ffn_hidden is the per-expert FFN; ep is the widest inside an 8-GPU node that divides
    the 128 experts and the tp*cp*dp = 2*1*16 ranks, and the case says it is assumed."""
    from phaze.runs import EXPLICIT_COLUMNS
    row = {k: v for k, v in _rows()["R1041"].items() if k not in EXPLICIT_COLUMNS}
    # the source's title names Megatron-Core: its preset's distributed optimizer (ZeRO 1)
    titled = row_to_case(row)
    assert titled.plan.zero == 1 and not {a.zero for a in titled.alternatives} - {1}
    row = dict(row, source_title="", source_locator="")
    searched = row_to_case(row)      # no framework and no ZeRO stage: ZeRO 0 and 1 are searched too
    assert searched.layout_from == "searched" and {a.zero for a in searched.alternatives} == {1}
    case = row_to_case(dict(row, zero_stage="1"))
    assert isinstance(case, Case), getattr(case, "reason", "")
    assert case.model.experts == 128 and case.model.expert_ffn == 1536 and case.model.head_dim == 128
    assert case.model.vocab == 151936
    assert case.layout_from == "unconfirmed" and case.plan.ep == 8 and searched.plan.ep == 8


def test_unshipped_moe_and_oversized_rows_are_skipped():
    shipped = row_to_case(_rows()["R1046"])      # Qwen3-Next-80B-A3B: shipped since its Gated DeltaNet is modelled
    assert isinstance(shipped, Case) and shipped.model.gdn_layers == 36
    row = dict(_rows()["R1056"], model="Some-MoE-80B", params_b="80", num_experts="", moe_top_k="",
               layers="24", hidden="2048", heads="16", ffn_hidden="8192", ep="", vocab="32000")
    guarded = row_to_case(row)
    assert isinstance(guarded, Skipped) and guarded.reason.startswith("params_b 80 B but the shape gives a dense")


def test_collective_kind_is_recorded():
    op = Op(name="x", unit="link", phase="fwd", collective=Collective("all_to_all", "ep", 1.0))
    assert tensor_flops([op]) == 0.0


def test_deepep_sends_each_token_once_per_node():
    """ep = 32 over four 8-GPU nodes, top-8 of 128 experts (32 per node): a token reaches a given
    node unless all 8 picks fall on the other 96 experts, C(96,8)/C(128,8); DeepEP sends it over the
    network once per node reached instead of once per expert."""
    from math import comb
    share = 1 - comb(96, 8) / comb(128, 8)
    assert ExpertLayout(ep=32, nodes=4).node_share(128, 8) == pytest.approx(share)
    from phaze.stage import expert_layout
    qwen = load_model("qwen3-235b-a22b")
    chip = load_chip("h100-sxm")
    lay = expert_layout(qwen, Plan(tp=2, pp=8, ep=32, dispatcher="deepep"), chip)
    assert lay.nodes == 4
    assert expert_layout(qwen, Plan(tp=2, pp=8, ep=32), chip).nodes == 1          # flat all-to-all
    assert expert_layout(qwen, Plan(tp=2, pp=8, ep=8, dispatcher="deepep"), chip).nodes == 1   # one node
    g = layer_graph(qwen, 1, 2, True, "flash", "none", lay)
    fwd = {o.name: o for o in g.fwd}
    T = qwen.seq_len // 2
    assert fwd["dispatch.internode"].collective.bytes == pytest.approx(2 * lay.load * T * qwen.hidden * 4 * share)
    assert fwd["dispatch.internode"].collective.group == "ep_node"
    # fewer bytes over the network: the deepep layer is faster than the flat all-to-all one
    slow = evaluate(qwen, chip, 256, 2048, Plan(tp=2, pp=8, vp=4, ep=32, zero=1, recompute="selective"))
    fast = evaluate(qwen, chip, 256, 2048, Plan(tp=2, pp=8, vp=4, ep=32, zero=1, recompute="selective",
                                                dispatcher="deepep"))
    assert fast.step_time_s < slow.step_time_s
    hidden = evaluate(qwen, chip, 256, 2048, Plan(tp=2, pp=8, vp=4, ep=32, zero=1, recompute="selective",
                                                  dispatcher="deepep", ep_overlap=True))
    assert hidden.step_time_s < fast.step_time_s
    plan = Plan(tp=2, pp=8, vp=4, ep=32, dispatcher="deepep", ep_overlap=True)
    assert parse_plan(plan.label()) == plan


def test_dispatchers_move_the_tokens_as_megatron_core_does_by_hand():
    """Megatron-Core 0.16.1 ``token_dispatcher.py``. Its all-to-all dispatcher with several experts
    on a rank sorts the received copies by local expert after the dispatch and back before the
    combine (``sort_chunks_by_idxs``): a read and a write of the busiest rank's copies each time,
    each mirrored once in the backward; with one expert a rank there is nothing to sort. DeepEP
    (``_DeepepManager``) sends a token once to each rank its experts are on: ep 8 of Qwen3-235B's
    128 experts (16 a rank), top 8, a rank is missed with C(112,8)/C(128,8); the receiving rank
    permutes its tokens to one copy per local expert and un-permutes them back, and nothing is
    permuted before the dispatch."""
    from math import comb
    qwen = load_model("qwen3-235b-a22b")
    T, h, k, p, load = qwen.seq_len // 2, qwen.hidden, qwen.top_k, 2, 1.3   # tp 2, sequence parallel
    sent = T * k
    flat = layer_graph(qwen, 1, 2, True, "flash", "none", ExpertLayout(ep=8, load=load))
    fwd = {o.name: o for o in flat.fwd}
    for name in ("sort_chunks", "unsort_chunks"):
        assert fwd[name].bytes_read == fwd[name].bytes_written == pytest.approx(p * load * sent * h)
        back = [o for o in flat.bwd if o.name == name + ".bwd"]
        assert len(back) == 1 and back[0].bytes == pytest.approx(2 * p * load * sent * h)
    names = [o.name for o in flat.fwd]
    assert names.index("dispatch.all_to_all") < names.index("sort_chunks") < names.index("expert_up")
    assert names.index("expert_down") < names.index("unsort_chunks") < names.index("combine.all_to_all")
    assert fwd["permute"].bytes_read == fwd["dispatch.all_to_all"].collective.bytes / load == p * sent * h
    one = {o.name for o in layer_graph(qwen, 1, 2, True, "flash", "none", ExpertLayout(ep=128)).fwd}
    assert "sort_chunks" not in one and "unsort_chunks" not in one
    ranks = 8 * (1 - comb(112, 8) / comb(128, 8))              # 5.25 ranks a token
    held = load * T * ranks                                     # tokens the busiest rank receives
    deep = layer_graph(qwen, 1, 2, True, "flash", "none", ExpertLayout(ep=8, load=load, deepep=True))
    dfwd = {o.name: o for o in deep.fwd}
    assert "sort_chunks" not in dfwd
    assert dfwd["dispatch.all_to_all"].collective.bytes == pytest.approx(p * held * h)
    assert dfwd["combine.all_to_all"].collective.bytes == pytest.approx(p * held * h)
    assert dfwd["permute"].bytes_read == pytest.approx(p * held * h)
    assert dfwd["permute"].bytes_written == pytest.approx(p * load * sent * h)
    assert dfwd["unpermute"].bytes_read == pytest.approx(p * load * sent * h)
    assert dfwd["unpermute"].bytes_written == pytest.approx(p * held * h)
    names = [o.name for o in deep.fwd]
    assert names.index("dispatch.all_to_all") < names.index("permute") < names.index("expert_up")
    assert names.index("expert_down") < names.index("unpermute") < names.index("combine.all_to_all")
    from phaze.stage import expert_layout
    chip = load_chip("h100-sxm")
    assert not expert_layout(qwen, Plan(tp=2, ep=8), chip).deepep
    assert expert_layout(qwen, Plan(tp=2, ep=8, dispatcher="deepep"), chip).deepep


def test_place_searches_expert_widths_and_names_a_bad_one():
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "phaze.cli", "place", "--workload", "mixtral-8x7b", "--arch", "h100-sxm",
           "--global-batch", "256", "--tp", "1", "--mbs", "1", "--zero", "1", "--recompute", "full"]
    ok = subprocess.run(cmd + ["--devices", "64", "--ep", "4,8", "--format", "json"], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    import json
    plans = [p["plan"] for p in json.loads(ok.stdout)["top"]]
    assert plans and all(",ep=4" in p or ",ep=8" in p for p in plans)
    for devices, ep, words in (("64", "3", "none of 3 divides the experts (8)"),
                               ("4", "8", "must divide the experts (8) and tp*cp*dp/etp (4/1)")):
        bad = subprocess.run(cmd + ["--devices", devices, "--ep", ep], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and bad.stdout == ""
        lines = bad.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("phaze: error: --ep: ") and words in lines[0]


def test_per_op_recompute_is_refused_for_experts_and_latent_attention():
    """torchtitan's per-op policy is modelled for dense layers only: an MoE or MLA model says so."""
    chip = load_chip("h100-sxm")
    for name in ("mixtral-8x7b", "deepseek-v3"):
        model = load_model(name)
        text = _one_line_error(lambda m=model: evaluate(m, chip, 64, 64, Plan(tp=8, recompute="op", ep=8)),
                               "recompute")
        assert "op" in text and "full" in text
    dense = evaluate(load_model("llama3-8b"), chip, 8, 8, Plan(recompute="op"))
    full = evaluate(load_model("llama3-8b"), chip, 8, 8, Plan(recompute="full"))
    none = evaluate(load_model("llama3-8b"), chip, 8, 8, Plan(recompute="none"))
    assert none.step_time_s < dense.step_time_s < full.step_time_s


def _brute_nodes_per_token(experts, top_k, nodes, groups, group_topk):
    """Every selected group set, every top-k of the experts in it, equally likely: the mean of the
    distinct nodes reached."""
    size, per_node = experts // groups, experts // nodes
    total = count = 0
    for chosen in itertools.combinations(range(groups), group_topk):
        pool = [e for g in chosen for e in range(g * size, (g + 1) * size)]
        for picks in itertools.combinations(pool, top_k):
            total += len({e // per_node for e in picks})
            count += 1
    return total / count


@pytest.mark.parametrize("experts,top_k,nodes,groups,group_topk", [
    (8, 2, 4, 4, 2), (8, 2, 2, 4, 2), (8, 3, 4, 2, 1), (12, 3, 3, 4, 2), (12, 2, 4, 6, 3), (16, 4, 8, 4, 3),
    (12, 3, 4, 1, 1)])
def test_node_limited_routing_equals_enumeration(experts, top_k, nodes, groups, group_topk):
    """Expected nodes per token under group-limited routing against enumerating every choice:
    groups per node, nodes per group, groups straddling nodes (12 experts, 3 nodes, 4 groups), and
    no limit (one group: the closed form without groups)."""
    got = ExpertLayout(nodes=nodes).nodes_per_token(experts, top_k, groups, group_topk)
    assert got == pytest.approx(_brute_nodes_per_token(experts, top_k, nodes, groups, group_topk), rel=1e-12)
    if groups == 1:
        assert got == pytest.approx(ExpertLayout(nodes=nodes).nodes_per_token(experts, top_k), rel=1e-12)


def test_deepseek_v3_deepep_sends_to_the_nodes_of_its_four_groups():
    """DeepSeek-V3 on ep 64 (8 nodes of 32 experts, one routing group each): a token's 8 experts
    come from 4 groups of 32, so it reaches each of those nodes unless all 8 picks miss it,
    4 (1 - C(96,8)/C(128,8)) = 3.63 nodes, not 8 (1 - C(224,8)/C(256,8)) = 5.29; DeepEP's network
    bytes fall by that ratio, and a row can switch the limit off (0 and 0) or get an error."""
    from math import comb

    from phaze.stage import expert_layout
    ds = load_model("deepseek-v3")
    chip = load_chip("h100-sxm")
    plan = Plan(tp=1, pp=16, ep=64, dispatcher="deepep")
    lay = expert_layout(ds, plan, chip)
    assert lay.nodes == 8
    limited, free = 4 * (1 - comb(96, 8) / comb(128, 8)), 8 * (1 - comb(224, 8) / comb(256, 8))
    assert lay.nodes_per_token(256, 8, 8, 4) == pytest.approx(limited) and limited == pytest.approx(3.629, abs=1e-3)

    def internode(model):
        return {o.name: o for o in layer_graph(model, 1, 1, False, "flash", "none", lay).fwd}[
            "dispatch.internode"].collective.bytes

    unlimited = replace(ds, router_groups=0, router_group_topk=0)
    assert internode(ds) / internode(unlimited) == pytest.approx(limited / free)
    assert internode(ds) == pytest.approx(2 * lay.load * ds.seq_len * ds.hidden * limited)
    row = dict(_rows()["R1041"], model="DeepSeek-V3", layers="", hidden="", heads="", ffn_hidden="",
               num_experts="", moe_top_k="", moe_ffn_hidden="", shared_experts="", vocab="", kv_heads="",
               params_b="671")
    assert row_to_case(row).model.router_groups == 8
    off = row_to_case(dict(row, moe_router_groups="0", moe_router_group_topk="0"))
    assert isinstance(off, Case) and off.model.router_groups == 0
    for bad, field in ((dict(moe_router_groups="6", moe_router_group_topk="2"), "moe_router_groups"),
                       (dict(moe_router_groups="8", moe_router_group_topk="0"), "moe_router_group_topk"),
                       (dict(moe_router_groups="64", moe_router_group_topk="1"), "moe_router_group_topk")):
        skipped = row_to_case(dict(row, **bad))
        assert isinstance(skipped, Skipped) and f"column '{field}'" in skipped.reason, skipped.reason


def test_mla_attention_core_uses_the_value_width_by_hand():
    """DeepSeek-V3's MLA: queries and keys 192 wide, values 128. The fused kernel's forward is
    S = Q.K^T (2 s^2 192 per head) and O = P.V (2 s^2 128); its backward re-forms S and runs dV,
    dP (value width) and dQ, dK (query/key width): 2 s^2 (3 192 + 2 128). The unfused context
    product is s x s x 128, and the saved V and out-projection input are 128 wide per head, as is
    the V the fused kernel reads."""
    from phaze.memory import activation_bytes_per_layer
    ds = replace(load_model("deepseek-v3", 4096), dense_layers=0)
    a, s = ds.heads, ds.seq_len
    g = layer_graph(ds, 1, 1, False, "flash", "none", ExpertLayout())
    fwd, bwd = ({o.name: o for o in ops} for ops in (g.fwd, g.bwd))
    assert fwd["flash_attention"].flops == 2.0 * a * s * s * (192 + 128)
    assert bwd["flash_attention.bwd"].flops == pytest.approx(2.0 * a * s * s * (3 * 192 + 2 * 128))
    assert fwd["flash_attention"].bytes_written == 2 * s * a * 128
    # it reads Q and K 192 wide and V 128 wide, and its backward reads them and O, dO again
    assert fwd["flash_attention"].bytes_read == 2 * s * a * (192 + 192 + 128)
    assert bwd["flash_attention.bwd"].bytes_read == 2 * s * a * (192 + 192 + 128 + 2 * 128)
    unfused = {o.name: o for o in layer_graph(ds, 1, 1, False, "standard", "none", ExpertLayout()).fwd}
    assert unfused["context"].gemm == (a, s, s, 128) and unfused["scores"].gemm == (a, s, 192, s)
    # as wide as the queries: the V and out-projection inputs grow by 2 bytes x 64 x heads per token each
    wide = replace(ds, v_head_dim=192)
    grow = activation_bytes_per_layer(wide, 1, 1, False, "none", "flash") - activation_bytes_per_layer(
        ds, 1, 1, False, "none", "flash")
    assert grow == pytest.approx(2 * 2 * s * a * 64)
    # equal widths: the backward is 2.5 forwards, to the last bit
    llama = load_model("llama3-8b")
    lg = layer_graph(llama, 1, 1, False, "flash", "none")
    f = {o.name: o for o in lg.fwd}["flash_attention"].flops
    assert {o.name: o for o in lg.bwd}["flash_attention.bwd"].flops == 2.5 * f
    assert f == 4.0 * llama.heads * llama.seq_len ** 2 * llama.head_dim


def test_router_groups_in_a_workload_file_are_checked(tmp_path):
    """One clear error naming the field: the groups divide the experts, come with their top-k,
    hold the top_k experts, and need experts at all."""
    import yaml
    base = dict(name="m", layers=4, hidden=256, heads=4, ffn_hidden=512, vocab=1000, seq_len=128, experts=16,
                top_k=4, expert_ffn_hidden=128)
    for changes, field in ((dict(router_groups=6, router_group_topk=2), "router_groups"),
                           (dict(router_groups=4), "router_group_topk"),
                           (dict(router_groups=8, router_group_topk=1), "router_group_topk"),
                           (dict(router_groups=4, router_group_topk=8), "router_group_topk"),
                           (dict(experts=0, top_k=0, router_groups=4, router_group_topk=2), "experts")):
        path = tmp_path / "m.yaml"
        path.write_text(yaml.safe_dump(dict(base, **changes)))
        with pytest.raises(ConfigError) as exc:
            load_model(str(path))
        assert exc.value.field == field, (changes, str(exc.value))
    path.write_text(yaml.safe_dump(dict(base, router_groups=4, router_group_topk=2)))
    assert (load_model(str(path)).router_groups, load_model(str(path)).router_group_topk) == (4, 2)


def test_ep_overlap_takes_what_megatron_core_requires():
    """Megatron-Core 0.16's --overlap-moe-expert-parallel-comm needs ep > 1, an interleaved
    pipeline when pp > 1 and no full or block recompute (transformer_config.py); a dense model has
    no experts to overlap."""
    from phaze.plan_check import check_plan
    qwen = load_model("qwen3-235b-a22b")
    check_plan(qwen, 256, 2048, Plan(tp=2, pp=8, vp=4, ep=32, recompute="selective", ep_overlap=True))
    check_plan(qwen, 256, 2048, Plan(tp=2, pp=1, ep=32, ep_overlap=True))
    for plan, words in ((Plan(tp=2, pp=8, vp=4, ep=1, ep_overlap=True), "needs ep > 1"),
                        (Plan(tp=2, pp=8, ep=32, ep_overlap=True), "needs vp > 1 when pp > 1"),
                        (Plan(tp=2, pp=8, vp=4, ep=32, recompute="full", ep_overlap=True), "no full or block"),
                        (Plan(tp=2, pp=2, vp=4, ep=32, ep_overlap=True, stages=(47, 47),
                              stage_recompute=("block", "none"), recompute_layers=(2, 0)), "no full or block")):
        with pytest.raises(ConfigError, match=f"ep_overlap.*{words}.*allowed: 0 here"):
            check_plan(qwen, 256, 2048, plan)
    with pytest.raises(ConfigError, match="ep_overlap.*has no experts; allowed: 0"):
        check_plan(load_model("llama3-8b"), 8, 8, Plan(ep_overlap=True))


def test_shared_experts_run_beside_the_all_to_alls_by_hand():
    """Megatron-Core's --moe-shared-expert-overlap (shared_experts.py, token_dispatcher.py): the
    shared experts' first linear and activation run beside the dispatch all-to-all, their second
    linear beside the combine, and in the backward their gradients beside the mirrors; each
    all-to-all shows what does not fit under its cover plus overlap_slowdown of the rest."""
    model, chip = load_model("llama4-scout"), load_chip("h100-sxm")
    eff = Efficiency(tensor_fraction=0.7, hbm_fraction=0.8, link_fraction=0.8, overlap_slowdown=0.25)
    plain, over = Plan(tp=2, ep=16), Plan(tp=2, ep=16, shared_overlap=True)
    lay = expert_layout(model, plain, chip)
    g = layer_graph(model, 1, 2, True, "flash", "none", lay)
    groups = collective_groups(2, lay)
    t = {o.name: op_time(o, chip, model.precision, eff, groups=groups, bytes_per_element=2) for o in g.fwd + g.bwd}
    pairs = (("dispatch.all_to_all", ("shared_up", "shared_swiglu")), ("combine.all_to_all", ("shared_down",)),
             ("combine.all_to_all.bwd", ("shared_down.dgrad", "shared_down.wgrad")),
             ("dispatch.all_to_all.bwd", ("shared_swiglu.bwd", "shared_up.dgrad", "shared_up.wgrad")))
    saved = [t[a] - exposed(t[a], sum(t[n] for n in under), eff) for a, under in pairs]
    assert all(x > 0 for x in saved)
    f0, b0 = _layer_sums(model, chip, 1, 2, True, "flash", "none", eff, lay)
    f1, b1 = _layer_sums(model, chip, 1, 2, True, "flash", "none", eff, expert_layout(model, over, chip))
    assert f0.communication - f1.communication == pytest.approx(saved[0] + saved[1], rel=1e-9)
    assert b0.communication - b1.communication == pytest.approx(saved[2] + saved[3], rel=1e-9)
    assert (f1.compute, f1.memory) == (f0.compute, f0.memory)
    # under full recompute the re-run forward's all-to-alls have the re-run shared experts as cover
    gf = layer_graph(model, 1, 2, True, "flash", "full", lay)
    t = {o.name: op_time(o, chip, model.precision, eff, groups=groups, bytes_per_element=2) for o in gf.bwd}
    again = [(f"recompute.{a}", tuple(f"recompute.{n}" for n in under)) for a, under in pairs[:2]]
    saved = [t[a] - exposed(t[a], sum(t[n] for n in under), eff) for a, under in pairs[2:] + tuple(again)]
    fr0 = _layer_sums(model, chip, 1, 2, True, "flash", "full", eff, lay)[1]
    fr1 = _layer_sums(model, chip, 1, 2, True, "flash", "full", eff, expert_layout(model, over, chip))[1]
    assert fr0.communication - fr1.communication == pytest.approx(sum(saved), rel=1e-9)
    # what Megatron-Core refuses with it: another dispatcher, the 1F1B overlap, the shared experts
    # recomputed; and a model without shared experts, or without experts
    from phaze.plan_check import check_plan
    check_plan(model, 64, 64, Plan(tp=2, ep=16, shared_overlap=True))
    for plan, words in ((Plan(tp=2, ep=16, dispatcher="deepep", shared_overlap=True), "alltoall dispatcher"),
                        (Plan(tp=2, ep=16, ep_overlap=True, shared_overlap=True), "ep_overlap off"),
                        (Plan(tp=2, ep=16, recompute="selective", recompute_modules=("shared_experts",),
                              shared_overlap=True), "not recomputed")):
        with pytest.raises(ConfigError, match=f"shared_overlap.*{words}.*allowed: 0 here"):
            check_plan(model, 64, 64, plan)
    with pytest.raises(ConfigError, match="shared_overlap.*needs shared experts"):
        check_plan(load_model("qwen3-30b-a3b"), 8, 8, Plan(ep=8, shared_overlap=True))
    with pytest.raises(ConfigError, match="shared_overlap.*has no experts; allowed: 0"):
        check_plan(load_model("llama3-8b"), 8, 8, Plan(shared_overlap=True))
    assert parse_plan("ep=8,shared_overlap=1").label().endswith(",ep=8,shared_overlap=1")
    # the figure docs/frameworks.md quotes (shipped calibration, the DGX H100 cluster)
    from pathlib import Path

    from phaze.calibrate import load_default_params, params_for
    from phaze.system import apply_system, load_system
    h100 = apply_system(chip, load_system("dgx-h100-superpod"))
    fitted = params_for(h100, load_default_params())
    steps = [evaluate(model, h100, 64, 256, Plan(tp=2, ep=16, recompute="full", zero=1, shared_overlap=x),
                      fitted).step_time_s for x in (False, True)]
    doc = " ".join((Path(__file__).resolve().parent.parent / "docs" / "frameworks.md").read_text().split())
    assert f"the step is {steps[0]:.3f} s without it and {steps[1]:.3f} s with it" in doc


def test_tp_overlap_hides_only_the_tensor_parallel_collectives_on_a_gpu():
    """Transformer Engine's userbuffers (--tp-comm-overlap) overlap the tensor-parallel all-gathers
    and reduce-scatters of its linear layers with their GEMMs; a mixture of experts' all-to-alls
    run exposed on an eager GPU. XLA schedules every collective asynchronously."""
    model, chip = load_model("qwen3-30b-a3b"), load_chip("h100-sxm")
    eff = Efficiency(tensor_fraction=0.7, hbm_fraction=0.8, link_fraction=0.8, overlap_slowdown=0.25)
    plan = Plan(tp=2, ep=8, tp_overlap=True)
    lay = expert_layout(model, plan, chip)
    fwd, bwd = _layer_sums(model, chip, 1, 2, True, "flash", "none", eff, lay)
    g, groups = layer_graph(model, 1, 2, True, "flash", "none", lay), collective_groups(2, lay)

    def link(ops, group):   # by hand: the named group's collectives, one after another
        return sum(op_time(o, chip, model.precision, eff, groups=groups) for o in ops
                   if o.unit == "link" and o.collective.group == group)
    # the attention's sequence-parallel all-gather and reduce-scatter, not the token all-to-alls
    assert fwd.tp_comm == pytest.approx(link(g.fwd, "tp")) and bwd.tp_comm == pytest.approx(link(g.bwd, "tp"))
    assert fwd.communication == pytest.approx(link(g.fwd, "tp") + link(g.fwd, "ep")) and link(g.fwd, "ep") > 0
    f, b, _ = _layer_costs(model, chip, 16, plan, eff, fwd, bwd)
    for got, t, ops in ((f, fwd, g.fwd), (b, bwd, g.bwd)):
        # by hand: the tp collectives fit under the phase's compute, so each shows a quarter of
        # itself (overlap_slowdown 0.25); the all-to-alls show whole
        assert link(ops, "tp") < t.compute
        assert got.communication == pytest.approx(link(ops, "ep") + 0.25 * link(ops, "tp"))
        # and by group: what shows of each
        assert (got.tp_comm, got.ep_comm) == pytest.approx((0.25 * link(ops, "tp"), link(ops, "ep")))
    xla = replace(chip, execution="xla")
    f, b, _ = _layer_costs(model, xla, 16, plan, eff, fwd, bwd)
    for got, t, ops in ((f, fwd, g.fwd), (b, bwd, g.bwd)):   # XLA: every collective under the compute
        assert link(ops, "tp") + link(ops, "ep") < t.compute
        assert got.communication == pytest.approx(0.25 * (link(ops, "tp") + link(ops, "ep")))
        assert (got.tp_comm, got.ep_comm) == pytest.approx((0.25 * link(ops, "tp"), 0.25 * link(ops, "ep")))


def test_nemo_runs_shared_experts_beside_the_all_to_alls_where_it_can():
    """NeMo 2's DeepSeek and Llama 4 configs set moe_shared_expert_overlap (the only ones with
    shared experts); not under DeepEP (Megatron-Core refuses it), not for a model without them."""
    from phaze.framework import FRAMEWORKS, options_with, plan_with
    from phaze.placement import PlacementOptions, layouts
    nemo, scout = FRAMEWORKS["nemo"], load_model("llama4-scout")
    assert plan_with(nemo, Plan(tp=2, ep=16), precision="bf16", model=scout)[0].shared_overlap
    assert not plan_with(nemo, Plan(tp=2, ep=16, dispatcher="deepep"), precision="bf16", model=scout)[0].shared_overlap
    assert not plan_with(nemo, Plan(tp=2, ep=16), precision="bf16")[0].shared_overlap      # no model given
    qwen = load_model("qwen3-30b-a3b")
    plan, said = plan_with(nemo, Plan(ep=8), precision="bf16", model=qwen)
    assert not plan.shared_overlap and "shared_overlap" not in said
    core = FRAMEWORKS["megatron-core"]
    assert not plan_with(core, Plan(tp=2, ep=16), precision="bf16", model=scout)[0].shared_overlap
    # a row of a NeMo run: on with the all-to-all dispatcher, off with DeepEP's
    row = dict(model="Llama-4-Scout", framework="NeMo 25.07", gpu="H100-SXM5-80GB", gpu_count="64", tp="2", pp="1",
               ep="16", seq_len="8192", global_batch="64", micro_batch="1", measured_metric="step_time_s",
               measured_value="10", recompute="full", precision="bf16")
    assert row_to_case(row).plan.shared_overlap
    assert not row_to_case(dict(row, moe_dispatcher="deepep")).plan.shared_overlap
    # the moe_shared_expert_overlap column: no turns the preset's off, yes turns it on for another
    # framework; yes where Megatron-Core refuses it skips the row with its reason; a bad value names it
    assert not row_to_case(dict(row, moe_shared_expert_overlap="no")).plan.shared_overlap
    core = dict(row, framework="Megatron-Core")
    assert not row_to_case(core).plan.shared_overlap
    assert row_to_case(dict(core, moe_shared_expert_overlap="yes")).plan.shared_overlap
    refused = row_to_case(dict(core, moe_shared_expert_overlap="yes", moe_dispatcher="deepep"))
    assert isinstance(refused, Skipped) and refused.reason == (
        "column 'moe_shared_expert_overlap' yes needs the alltoall dispatcher (not DeepEP's)")
    mixtral = row_to_case(dict(core, model="Mixtral-8x7B", ep="8", moe_shared_expert_overlap="yes"))
    assert mixtral.reason == "column 'moe_shared_expert_overlap' yes needs shared experts"
    bad = row_to_case(dict(core, moe_shared_expert_overlap="maybe"))
    assert isinstance(bad, Skipped) and "column 'moe_shared_expert_overlap' must be yes or no" in bad.reason
    # the placement search: the plans that allow it
    space = PlacementOptions(tp=(2,), pp=(1,), mbs=(1,), ep=(16,), dispatcher=("alltoall", "deepep"),
                             ep_overlap=(False, True))
    options = options_with(nemo, space, model=scout)[0]
    got = {(p.dispatcher, p.ep_overlap): p.shared_overlap for p in layouts(scout, 64, 64, options)}
    assert got == {("", False): True, ("deepep", False): False, ("", True): False, ("deepep", True): False}


def test_place_searches_dispatchers_and_overlap_exactly():
    """Given both dispatchers and both overlap settings, ``place`` returns the best plans of the
    four single searches' (brute force), with the same times; DeepEP inside one node is a plan of
    its own (it sends a token once a rank and permutes on the receiving rank); an overlapped plan
    never runs a full or block stage."""
    from phaze.api import calibrated_efficiency, with_system
    from phaze.placement import PlacementOptions, layouts, place
    mixtral = load_model("mixtral-8x7b")
    chip = with_system(load_chip("h100-sxm"), "dgx-h100-superpod").with_execution("eager")
    eff = calibrated_efficiency(chip)
    kw = dict(tp=(1, 2), mbs=(1,), ep=(8, 16), recompute=("none", "selective", "full"))

    def search(disp, overlap):
        return place(mixtral, chip, 64, 256, PlacementOptions(dispatcher=disp, ep_overlap=overlap, **kw), eff,
                     top=10, with_baseline=False)
    from phaze.stage import expert_layout

    def same(plan):
        return plan.label(), expert_layout(mixtral, plan, chip)
    joint = search(("alltoall", "deepep"), (False, True))
    alone = [search((d,), (o,)) for d in ("alltoall", "deepep") for o in (False, True)]
    union = {same(p.plan): p.result.step_time_s for r in alone for p in r.top}
    got = {same(p.plan): p.result.step_time_s for p in joint.top}
    assert len(got) == 10 and all(union[k] == t for k, t in got.items())
    assert sorted(got.values()) == sorted(union.values())[:10]
    assert joint.best.plan.ep_overlap and joint.best.result.step_time_s < alone[0].best.result.step_time_s
    for r in (joint, *alone):
        assert all(not ({"full", "block"} & set(p.plan.stage_modes()[0])) for p in r.top if p.plan.ep_overlap)
    plans = list(layouts(mixtral, 64, 256, PlacementOptions(dispatcher=("alltoall", "deepep"), **kw), chip))
    assert {p.dispatcher for p in plans if p.ep * p.etp == 8} == {"", "deepep"}    # one node
    assert {p.dispatcher for p in plans if p.ep * p.etp == 16} == {"", "deepep"}   # two nodes


@pytest.mark.parametrize("pp", [(2, 4), (1, 2, 4)])
def test_overlapped_all_to_alls_under_a_pipeline_are_searched_interleaved(pp):
    """Megatron-Core overlaps the all-to-alls under a pipeline only when it is interleaved, so such a
    layout has no vp = 1 sibling to be bounded through: place builds it on its own and returns
    exactly what solving every layout returns (it had skipped them all, as if nothing fit: found by
    tests/bench/bench_place_vs_runs.py on two Megatron-Core Qwen3-235B runs)."""
    from phaze.api import calibrated_efficiency, with_system
    from phaze.placement import PlacementOptions, place
    mixtral = load_model("mixtral-8x7b")
    chip = with_system(load_chip("h100-sxm"), "dgx-h100-superpod")
    eff = calibrated_efficiency(chip)
    options = PlacementOptions(tp=(1, 2), mbs=(1,), pp=pp, vp=(1, 2, 4), ep=(8,), recompute=("none", "selective"),
                               ep_overlap=(True,))
    got = place(mixtral, chip, 64, 256, options, eff, top=4)
    want = place(mixtral, chip, 64, 256, replace(options, exhaustive=True), eff, top=4)
    assert want.best is not None and any(p.plan.pp > 1 and p.plan.vp > 1 for p in want.top)
    assert [p.plan for p in got.top] == [p.plan for p in want.top]
    assert [p.result.step_time_s for p in got.top] == [p.result.step_time_s for p in want.top]
    assert all(p.plan.ep_overlap and (p.plan.pp == 1 or p.plan.vp > 1) for p in got.top)
    # the exact design search's bounds of the chosen plan hold it (they bounded the same layouts)
    from phaze.placement import place_bound, place_step_bounds
    best = got.best.result.step_time_s
    bounds = place_step_bounds(mixtral, chip, 64, 256, options, eff)
    assert bounds.step_lb <= best <= bounds.step_ub
    assert layout_of(got.best.plan) in {layout_of(p) for p in bounds.layouts}
    assert place_bound(mixtral, chip, 64, 256, options, eff) <= best


def test_dispatchers_and_overlap_from_the_flag_and_the_sweep(tmp_path):
    from test_space import placement_options

    from phaze.cli import _subset_list, _switch_list
    from phaze.plan import DISPATCHERS
    _dispatcher_list = _subset_list(DISPATCHERS)
    assert _dispatcher_list("DeepEP,alltoall") == ("deepep", "alltoall")
    assert _switch_list("on,0,off") == (True, False)
    assert _switch_list("false,True") == (False, True)      # the words --plan takes for ep_overlap
    for parse, bad in ((_dispatcher_list, "flex"), (_switch_list, "maybe")):
        with pytest.raises(Exception, match="must be"):
            parse(bad)
    o = placement_options(tmp_path, {"dispatcher": ["deepep", "alltoall"], "ep_overlap": [True, False]})
    assert (o.dispatcher, o.ep_overlap) == (("deepep", "alltoall"), (True, False))
    assert placement_options(tmp_path, {"dispatcher": "deepep", "ep_overlap": True}).dispatcher == ("deepep",)
    for key, bad in (("dispatcher", "flex"), ("dispatcher", []), ("ep_overlap", "yes"), ("ep_overlap", [])):
        with pytest.raises(ConfigError) as e:
            placement_options(tmp_path, {key: bad})
        assert e.value.field == f"workloads[0].placement.{key}" and "non-empty list" in e.value.message
    # the sweep's shared_overlap and place's --shared-overlap
    assert placement_options(tmp_path, {"shared_overlap": True}).shared_overlap
    assert not placement_options(tmp_path, {}).shared_overlap
    with pytest.raises(ConfigError) as e:
        placement_options(tmp_path, {"shared_overlap": "maybe"})
    assert e.value.field == "workloads[0].placement.shared_overlap"
    from phaze.cli import build_parser
    args = build_parser().parse_args(["place", "--workload", "llama4-scout", "--arch", "h100-sxm", "--devices", "64",
                                      "--global-batch", "64", "--shared-overlap", "on"])
    assert args.shared_overlap == "on"


@pytest.mark.parametrize("recompute", ["none", "selective+moe_act", "selective+moe", "selective+shared_experts"])
def test_fp8_experts_keep_one_fp8_layout_of_their_linear_inputs(recompute):
    """Transformer Engine's fp8 GroupedLinear (1.13 and 2.8) keeps one fp8 layout of each expert's
    input and of its down projection's input, and the 16-bit dispatched tokens are freed: 1 byte
    where bf16 keeps 2, on each of the k copies; the shared expert's down projection likewise,
    while its first linear keeps an fp8 copy (h) of the router's 16-bit input. DeepSeek-V3, one
    token a layer: 58 of 61 layers MoE (k = 8, h = 7,168, expert 2,048, shared 2,048), 3 dense
    (f = 18,432, the down projection's input), MLA's normed latents (query 1,536 + key/value 512),
    which the norms fused into the up projections write in fp8, and the out-projection's fp8 copy
    (o = 16,384) beside the fused attention's 16-bit output. moe_act drops the experts' down-projection inputs, moe
    all of the layer's expert tensors (their bytes, and the shared copy, fp8 too), shared_experts
    the shared expert's whole module, its fp8 copy included (Megatron-Core checkpoints it whole)."""
    from phaze.catalogue import load_model
    from phaze.memory import activation_bytes_per_layer
    m = load_model("deepseek-v3", 4096)
    s, h, k, ef, sf, f, o, latents = 4096, 7168, 8, 2048, 2048, 18432, 16384, 1536 + 512
    bf16 = activation_bytes_per_layer(m, 1, 1, False, recompute, "flash")
    fp8 = activation_bytes_per_layer(replace(m, precision="fp8"), 1, 1, False, recompute, "flash")
    moe = {"none": k * (h + ef) + sf - h, "selective+moe_act": k * h + sf - h, "selective+moe": 0,
           "selective+shared_experts": k * (h + ef)}[recompute]
    assert bf16 - fp8 == pytest.approx(s * (58 * moe + 3 * f) / 61 + s * latents - s * o, rel=1e-12)
    assert activation_bytes_per_layer(replace(m, precision="fp8", fp8_casts="separate"), 1, 1, False, recompute,
                                      "flash") == bf16


def test_sampling_alone_does_not_give_the_dropless_load():
    """docs/design.md: with each token's top-k experts drawn independently and uniformly, the
    busiest of 8 expert-parallel ranks receives only about 1 % over the mean (32,768 tokens over
    the ep group), far from DROPLESS_LOAD's 1.3, which the page says is read from S21's rows."""
    rng = np.random.default_rng(0)
    page = " ".join((Path(__file__).resolve().parent.parent / "docs" / "design.md").read_text().split())
    found = []
    for experts, top_k in ((128, 8), (8, 2)):
        loads = []
        for _ in range(20):
            picks = np.argpartition(rng.random((32_768, experts)), top_k, axis=1)[:, :top_k]
            counts = np.bincount(picks.ravel() // (experts // 8), minlength=8)
            loads.append(counts.max() / counts.mean())
        found.append(f"{np.mean(loads):.3f}")
        assert 1.0 < np.mean(loads) < 1.02 < DROPLESS_LOAD
    assert (f"the busiest of 8 ranks gets {found[0]} of the mean on Qwen3-235B (128 experts, top 8) and {found[1]} "
            f"on Mixtral (8 experts, top 2)") in page and f"`phaze.graph.DROPLESS_LOAD` = {DROPLESS_LOAD:g}" in page


def test_fsdp_gathers_a_device_s_experts_over_the_expert_data_parallel_group():
    """FSDP under expert parallelism (torchtitan's experts in their own fully_shard over
    dp_shard_mod_ep, Megatron-Core's FSDP with expert buffers of the expert data-parallel group):
    per layer a device gathers its own 16 of Qwen3-235B's 128 experts (ep 8, etp 1; 3 x 4096 x 1536
    each) over the 256 / (ep 8 x etp 1) = 32 expert data-parallel ranks (stride 8), and the dense
    rest, tp 2's share, over the 128 data-parallel ranks (stride 2). Until 2026-12-07 it gathered
    tp's share of all 128 experts over the data-parallel ranks: four times the expert bytes."""
    m, chip = load_model("qwen3-235b-a22b"), load_chip("h100-sxm")
    expert = 3 * 4096 * 1536
    dense = m.layer_params - 128 * expert              # attention, norms, router: every layer is MoE
    linear = dense - m.layer_norms * m.norm_params
    plan = Plan(tp=2, ep=8, etp=1, zero=3, sp=True, reduce_fp32=True)
    (d, d8, dg, ds), (e, e8, eg, es) = fsdp_units(m, plan, 256, chip)
    assert (d, d8, dg, ds) == pytest.approx((dense / 2, linear / 2, 128, 2))
    assert (e, e8, eg, es) == pytest.approx((16 * expert, 16 * expert, 32, 8))
    # the per-layer traffic, with nothing to hide it: the gather in the forward, the gather and
    # the fp32 gradients' reduce-scatter in the backward, each unit on its own group
    eff = Efficiency(overlap_slowdown=0.0)
    ag = (collective_time("all_gather", 2 * d, 128, chip, 2, eff)
          + collective_time("all_gather", 2 * e, 32, chip, 8, eff))
    rs = (collective_time("reduce_scatter", 4 * d, 128, chip, 2, eff)
          + collective_time("reduce_scatter", 4 * e, 32, chip, 8, eff))
    _, _, total = _layer_costs(m, chip, 256, plan, eff, PhaseTime(), PhaseTime())
    assert total.dp_comm == pytest.approx(2 * ag + rs) and total.communication == pytest.approx(2 * ag + rs)
    # the prefetch holds two layers of what a device gathers
    stage = stage_costs(m, chip, 256, 2048, plan, eff)
    assert stage.gathered_layer_bytes() == pytest.approx(2 * 2 * (d + e))
    # without expert parallelism the experts are in the layer's one FSDP unit (etp = tp: tp's share)
    one = fsdp_units(m, Plan(tp=2, ep=1, etp=2, zero=3, sp=True), 256, chip)
    assert len(one) == 1
    assert one[0] == pytest.approx((m.layer_params / 2, (m.layer_params - m.layer_norms * m.norm_params) / 2, 128, 2))
    # and every parameter of a layer is gathered by exactly one unit: tp x dense + ep x etp x experts
    assert ds * d + es * e / 16 * 128 / 8 == pytest.approx(m.layer_params)
    # each rank its own expert data-parallel group (32 devices, ep 32): its 4 experts are held
    # whole, gathered by no one, and the prefetch buffer holds only the dense unit's two layers
    # (until 2026-12-07 it counted the experts' too, beside their whole state)
    alone = Plan(tp=1, ep=32, etp=1, zero=3)
    (d1, _, g1, _), = fsdp_units(m, alone, 32, chip)
    assert (d1, g1) == (pytest.approx(dense), 32)
    assert stage_costs(m, chip, 32, 256, alone, eff).gathered_layer_bytes() == pytest.approx(2 * 2 * dense)


def test_design_quotes_the_measured_unfused_router_ops():
    """docs/design.md's counts of the unfused router's kernels are the measured ones
    (results/kernels/router/router_ops.txt, tests/bench/measure_router_ops.py): the rest beyond
    the gating GEMM, forward and backward, for each of the three routers."""
    root = Path(__file__).resolve().parents[1]
    rows = [line.split(" | ") for line in (root / "results/kernels/router/router_ops.txt").read_text().splitlines()
            if line.count(" | ") == 4 and not line.startswith("router |")]
    rest = {r[0].split(" (")[0]: tuple(int(x) for x in r[4].split(", ")) for r in rows}
    assert set(rest) == {"Qwen3-MoE", "DeepSeek-V3", "gpt-oss"}
    for r in rows:   # the totals are the gating's plus the rest's
        f, b, (gf, gb) = int(r[1]), int(r[2]), (int(x) for x in r[3].split(", "))
        assert (f - gf, b - gb) == rest[r[0].split(" (")[0]]
    text = " ".join((root / "docs/design.md").read_text().split())
    (qf, qb), (df, db), (nf, nb) = rest["Qwen3-MoE"], rest["DeepSeek-V3"], rest["gpt-oss"]
    assert f"besides its GEMM, {qf} small kernels forward and {qb} backward for Qwen3-MoE's" in text
    assert f"{df} and {db} for DeepSeek-V3's grouped sigmoid router" in text
    assert f"{nf} and {nb} for gpt-oss's without a loss" in text
