"""The Python API (phaze.evaluate / phaze.place) and the memory model's reserve (issue 14)."""
from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

import phaze
from phaze.arch import load_chip
from phaze.catalogue import load_model
from phaze.hf_config import model_from_hf_config
from phaze.memory import GPU_RESERVE_FIXED_BYTES, GPU_RESERVE_FRACTION, memory_reserve_bytes
from phaze.placement import PlacementOptions, place
from phaze.plan import Plan
from phaze.step import evaluate
from phaze.workload import Model

GiB = 2.0 ** 30
GOOD_PLAN = "tp=8,pp=16,mbs=1,recompute=full"


@pytest.fixture(scope="module")
def gpt3_place():
    return phaze.place("gpt3-175b", "a100-80gb", 1024, 1536)


@pytest.fixture(scope="module")
def llama_place():
    return phaze.place("llama3-70b", "h100-sxm", 64, 128)


# --- the reserve: every chosen plan leaves it free ---------------------------------------------
@pytest.mark.parametrize("which", ["gpt3_place", "llama_place"])
def test_chosen_plans_leave_the_modelled_reserve_free(request, which):
    res = request.getfixturevalue(which)
    chip = load_chip("a100-80gb" if which == "gpt3_place" else "h100-sxm")
    reserve = GPU_RESERVE_FIXED_BYTES + GPU_RESERVE_FRACTION * chip.hbm_bytes
    assert reserve > 3 * GiB
    assert res.best is not None and len(res.top) == 5
    for p in res.top + ((res.baseline,) if res.baseline else ()):
        r = p.result
        assert r.memory_reserve_bytes == pytest.approx(reserve)
        assert r.memory_per_device_bytes + reserve <= chip.hbm_bytes
        assert r.headroom_bytes == pytest.approx(chip.hbm_bytes - reserve - r.memory_per_device_bytes)
        assert r.headroom_bytes >= 0 and r.fits


def test_reserve_changes_what_fits():
    """A plan that fits in bare HBM but not with the reserve is refused, and --memory-reserve 0 restores it."""
    model, chip = load_model("llama3-70b"), load_chip("h100-sxm")
    bare = place(model, chip, 64, 128, PlacementOptions(memory_reserve=0.0), phaze.Efficiency(), top=20)
    tight = [p for p in bare.top if p.result.memory_per_device_bytes + memory_reserve_bytes(chip) > chip.hbm_bytes]
    assert tight, "some plan of the bare search uses the reserve's memory"
    plan = replace(tight[0].plan, memory_reserve=None)
    assert not evaluate(model, chip, 64, 128, plan, phaze.Efficiency()).fits
    assert evaluate(model, chip, 64, 128, replace(plan, memory_reserve=0.0), phaze.Efficiency()).fits


def test_fp32_gradients_take_four_bytes():
    """Megatron's table: bf16 weights with fp32 gradients take 18 bytes per parameter with Adam,
    6 + 12/d with the distributed optimizer."""
    model, chip = load_model("gpt3-175b"), load_chip("a100-80gb")
    for zero, want in ((0, 18.0), (1, 6.0 + 12.0 / 8)):
        plan = Plan(tp=8, pp=16, recompute="full", zero=zero, reduce_fp32=True)
        r = evaluate(model, chip, 1024, 1536, plan)
        m = r.stage_memory[1]
        params = m.layers * model.layer_params / 8
        assert m.weights_and_optimizer_bytes == pytest.approx(want * params, rel=1e-12)
        r16 = evaluate(model, chip, 1024, 1536, replace(plan, reduce_fp32=False))
        assert r16.stage_memory[1].weights_and_optimizer_bytes == pytest.approx((want - 2) * params, rel=1e-12)


def test_place_searches_zero_stages(gpt3_place):
    zeros = {p.plan.zero for p in gpt3_place.top}
    assert 1 in zeros                       # the distributed optimizer is searched by default
    only0 = phaze.place("gpt3-175b", "a100-80gb", 1024, 1536, zero=0)
    assert {p.plan.zero for p in only0.top} == {0}
    assert gpt3_place.best.result.step_time_s <= only0.best.result.step_time_s


@pytest.mark.parametrize("seed", range(3))
def test_zero_search_bounded_equals_exhaustive(seed, monkeypatch, tmp_path):
    """Grouping the ZeRO variants of a layout under one bound keeps the search exact."""
    from phaze import schedule as S
    from phaze.api import calibrated_efficiency
    from phaze.space import build_chip
    monkeypatch.setenv("PHAZE_CACHE_DIR", str(tmp_path))
    rng = random.Random(77 + seed)
    chip = build_chip(load_chip("tpuv4"), {"tensor_units": 2 ** rng.randint(1, 4), "tensor_rows": 64,
                                           "tensor_cols": 64, "hbm_gib": rng.choice([8, 16])})
    model = Model(name=f"z{seed}", layers=rng.choice([8, 12]), hidden=4096, heads=32, ffn_hidden=11008,
                  vocab=32000, seq_len=1024, precision="bf16")
    options = PlacementOptions(tp=(1, 2, 4), mbs=(1, 2), zero=(0, 1, 2, 3))
    eff = calibrated_efficiency(chip)
    S.clear_memory_cache()
    got = place(model, chip, 32, 128, options, eff, top=3)
    S.clear_memory_cache()
    want = place(model, chip, 32, 128, replace(options, exhaustive=True), eff, top=3)
    assert [p.plan for p in got.top] == [p.plan for p in want.top]
    assert [p.result.step_time_s for p in got.top] == [p.result.step_time_s for p in want.top]
    assert got.baseline == want.baseline


# --- the API reads well ------------------------------------------------------------------------
def test_results_hold_plain_python_numbers(gpt3_place):
    r = phaze.evaluate("gpt3-175b", "a100-80gb", 1024, 1536, GOOD_PLAN)
    for value in (r.step_time_s, r.mfu, r.hfu, r.tokens_per_s, r.memory_per_device_bytes, r.headroom_bytes,
                  *r.breakdown_s.values()):
        assert type(value) is float
    assert "np.float64" not in repr(r.to_dict())
    d = gpt3_place.to_dict()
    json.dumps(d)
    assert "np.float64" not in repr(d) and type(d["gain_over_baseline"]) is float


def test_reprs_and_frame(gpt3_place):
    r = gpt3_place.best.result
    text = repr(r)
    assert text.startswith("StepResult(GPT-3 175B on 1024 x A100-SXM4-80GB") and "headroom" in text
    assert "<table>" in r._repr_html_() and "headroom" in r._repr_html_()
    assert repr(gpt3_place).startswith("PlacementResult(best tp=")
    assert "<table" in gpt3_place._repr_html_()
    frame = gpt3_place.to_frame()
    assert list(frame["rank"])[:5] == [1, 2, 3, 4, 5] and list(frame["rank"])[-1] == "baseline"
    assert frame.loc[0, "step_time_s"] == gpt3_place.best.result.step_time_s
    assert (frame["headroom_gib"] >= 0).all()


def test_place_keywords_without_options():
    res = phaze.place("gpt3-175b", "a100-80gb", 1024, 1536, tp=8, mbs=[1, 2], zero=(0, 1), vp=[1, 2], top=3)
    assert all(p.plan.tp == 8 and p.plan.mbs in (1, 2) and p.plan.vp in (1, 2) for p in res.top)
    with pytest.raises(phaze.ConfigError, match="unknown keyword"):
        phaze.place("gpt3-175b", "a100-80gb", 1024, 1536, colour="blue")
    # the words of a flag are read as the flag reads them: "none" is no offload, a bad one is named
    both = phaze.place("llama2-7b", "a100-80gb", 64, 256, tp=2, mbs=1, pp=[1, 2], recompute=["none", "full"],
                       pipe_schedule=["1f1b", "DualPipe"], offload=["none", "qkv_proj"], top=40)
    assert {p.plan.pipe_schedule for p in both.top} == {"1f1b", "dualpipe"}
    assert {p.plan.offload for p in both.top} == {"", "qkv_proj"}
    for key, value in (("pipe_schedule", "gpipe"), ("offload", []), ("cp_comm", ["p2p", "ring"])):
        with pytest.raises(phaze.ConfigError) as e:
            phaze.place("gpt3-175b", "a100-80gb", 1024, 1536, **{key: value})
        assert e.value.source == key


@pytest.mark.parametrize("call, source", [
    (lambda: phaze.evaluate("gpt3-175b", "a100-80gb", 1024, 1540, GOOD_PLAN), "global_batch"),
    (lambda: phaze.evaluate("gpt3-175b", "a100-80gb", 0, 8), "devices"),
    (lambda: phaze.evaluate("gpt3-175b", "a100-80gb", 10 ** 12, 10 ** 12), "devices"),
    (lambda: phaze.place("gpt3-175b", "a100-80gb", 1024, 10 ** 30), "global_batch"),
    (lambda: phaze.evaluate("gpt3-175b", "a100-80gb", 8, 8, "tp=8,speed=3"), "plan"),
    (lambda: phaze.evaluate("gpt-9000", "a100-80gb", 8, 8), "workload"),
    (lambda: phaze.place("gpt3-175b", "a100-80gb", 1024, 1537), "global_batch"),
    (lambda: phaze.place("gpt3-175b", "a100-80gb", 1024, 1536, pp=128), "pp"),
    (lambda: phaze.place("gpt3-175b", "a100-80gb", 8, 8, memory_reserve_gib=79), "arch"),
])
def test_api_errors_name_parameters_not_flags(call, source):
    try:
        res = call()
    except phaze.ConfigError as exc:
        assert exc.source == source
        assert "--" not in str(exc), str(exc)
        return
    assert res.best is None and res.infeasible_reason and res.infeasible_source == source
    assert "--" not in res.infeasible_reason, res.infeasible_reason


# --- workloads as published --------------------------------------------------------------------
def test_qwen2_qkv_bias_matches_the_published_count():
    cfg = dict(model_type="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, max_position_embeddings=131072,
               tie_word_embeddings=False, rms_norm_eps=1e-6, hidden_act="silu", rope_theta=1e6,
               use_sliding_window=False, sliding_window=131072)
    m = model_from_hf_config(cfg)
    assert m.params == 7_615_616_512            # Qwen/Qwen2-7B, the published tensor-size sum
    assert m.qkv_bias and not m.bias and m.sliding_window == 0
    assert any("131072 capped at 8192" in n for n in m.notes)
