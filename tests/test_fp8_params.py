"""fp8 weights (``fp8_params``: Megatron-Core's ``--fp8-param-gather``, NeMo's fp8 plugins) against
16-bit weights whose fp8 casts Transformer Engine keeps through the step, and the weights' own
cast (once a step under Megatron-Core, every forward with separate casts): the memory, the weight
gathers, the casts and the energy model's bytes by hand, the invariants where nothing changes, the
presets, the refusals and the validation column."""
import json
from dataclasses import replace

import numpy as np
import pytest
import yaml
from test_space import placement_options
from test_validate import ROOT, one_line_error, phaze_cli, rows, synthetic

from phaze.area import _step_activity
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.cost import IDEAL, collective_time
from phaze.framework import FRAMEWORKS, plan_settings, plan_with
from phaze.graph import layer_graph
from phaze.placement import PlacementOptions, place
from phaze.plan import Plan, parse_plan
from phaze.plan_check import check_plan
from phaze.runs import Skipped, row_to_case
from phaze.stage import fp8_linear_params, shard_ranks, stage_costs
from phaze.step import evaluate


@pytest.fixture(scope="module")
def fp8_llama(llama):
    """Llama-3 8B trained in fp8 with Transformer Engine's fused casts (Megatron-Core's layer spec)."""
    return replace(llama, precision="fp8", fp8_casts="fused")


# Llama-3 8B by hand: attention 4096 x (4096 + 2 x 1024) + 4096 x 4096 = 41,943,040, the SwiGLU FFN
# 3 x 4096 x 14336 = 176,160,768; two RMSNorms of 4096 apart
LINEAR_PER_LAYER = 41_943_040 + 176_160_768


def test_parse_label_and_refusals(llama, fp8_llama):
    plan = parse_plan("tp=2,zero=1,fp8_params=1")
    assert plan.fp8_params and parse_plan(plan.label()) == plan and "fp8_params=1" in plan.label()
    assert "fp8_params" not in Plan(tp=2).label()
    with pytest.raises(ConfigError, match="fp8_params.*true or false"):
        parse_plan("fp8_params=sometimes")
    check_plan(fp8_llama, 8, 8, plan)
    with pytest.raises(ConfigError, match="fp8_params.*bf16.*allowed: fp8_params=0"):
        check_plan(llama, 8, 8, plan)


def test_linear_weights_by_hand(llama):
    assert fp8_linear_params(llama, 1) == LINEAR_PER_LAYER
    assert llama.layer_params - fp8_linear_params(llama, 1) == 2 * 4096


def test_cached_casts_cost_two_bytes_a_linear_weight_by_hand(fp8_llama, dgx):
    """One device, tp 1, pp 1: 16-bit weights plus their cached fp8 casts, both layouts (1 + 1 byte),
    against fp8 weights with their transpose (1 + 1 byte, counted as the 16-bit weight's 2): the
    difference is 2 bytes of each layer's linear weights, the embedding and head apart."""
    plan = Plan(zero=1)
    cached = stage_costs(fp8_llama, dgx, 8, 8, plan, IDEAL).memory(0, 32, "full")
    held = stage_costs(fp8_llama, dgx, 8, 8, replace(plan, fp8_params=True), IDEAL).memory(0, 32, "full")
    assert cached.weights_and_optimizer_bytes - held.weights_and_optimizer_bytes == 2 * 32 * LINEAR_PER_LAYER
    assert (cached.activation_bytes, cached.transient_bytes) == (held.activation_bytes, held.transient_bytes)
    # tp 2 shards them: half a device's
    c2 = stage_costs(fp8_llama, dgx, 8, 8, Plan(tp=2, zero=1), IDEAL).memory(0, 32, "full")
    h2 = stage_costs(fp8_llama, dgx, 8, 8, Plan(tp=2, zero=1, fp8_params=True), IDEAL).memory(0, 32, "full")
    assert c2.weights_and_optimizer_bytes - h2.weights_and_optimizer_bytes == 32 * LINEAR_PER_LAYER


def test_memory_table_matches_memory(fp8_llama, dgx):
    costs = stage_costs(fp8_llama, dgx, 16, 16, Plan(pp=2, zero=1), IDEAL)
    ns = np.array([10.0, 16.0, 22.0])
    table = costs.memory_table("none", ns)
    for i in range(2):
        for j, n in enumerate(ns):
            assert table[i, j] == costs.memory(i, int(n), "none").total_bytes


@pytest.mark.parametrize("change", [dict(fp8_casts="separate"), dict(precision="bf16")])
def test_no_cache_without_transformer_engine_or_fp8(fp8_llama, dgx, change):
    """torchao and llm-foundry cast the weights for each forward and free the cast; a 16-bit run
    has none: memory as before, whatever the plan says of fp8 weights the model cannot have."""
    model = replace(fp8_llama, **change)
    plan = Plan(zero=1)
    mem = stage_costs(model, dgx, 8, 8, plan, IDEAL).memory(0, 32, "full")
    bf16 = stage_costs(replace(model, precision="bf16", fp8_casts=""), dgx, 8, 8, plan, IDEAL).memory(0, 32, "full")
    assert mem.weights_and_optimizer_bytes == bf16.weights_and_optimizer_bytes


def test_no_cache_under_fsdp(fp8_llama, dgx):
    plan = Plan(tp=2, zero=3, recompute="full")
    a = evaluate(fp8_llama, dgx, 64, 64, plan)
    b = evaluate(fp8_llama, dgx, 64, 64, replace(plan, fp8_params=True))
    assert a.memory_per_device_bytes == b.memory_per_device_bytes
    assert b.step_time_s <= a.step_time_s     # the per-layer gathers carry 1 byte a linear weight


def test_distributed_optimizer_gathers_fp8_by_hand(fp8_llama, dgx):
    """dp 8 over InfiniBand (tp 8, 64 H100s), overlap off: the stage's tail is the reduce-scatter of
    the 16-bit gradients and the weights' all-gather, 2 bytes a parameter or 1 byte a linear weight
    and 2 the rest."""
    base = Plan(tp=8, zero=1, dp_overlap=False)
    n = 32
    for fp8 in (False, True):
        costs = stage_costs(fp8_llama, dgx, 64, 64, replace(base, fp8_params=fp8), IDEAL)
        params = costs.params(0, n)
        group = shard_ranks(base, 64, dgx)
        linear = n * LINEAR_PER_LAYER / 8
        assert costs.fp8_weights(0, n) == pytest.approx(linear)
        gathered = 2 * params - (linear if fp8 else 0.0)
        expect = (collective_time("reduce_scatter", 2 * params, group, dgx, 8, IDEAL)
                  + collective_time("all_gather", gathered, group, dgx, 8, IDEAL))
        assert costs.tail(0, n, "none")[0] == pytest.approx(expect, rel=1e-9)


def test_nemo_presets_hold_fp8_weights():
    assert {n for n, fw in FRAMEWORKS.items() if plan_settings(fw, "fp8")["fp8_params"]} == {"nemo-2024", "nemo",
                                                                                           "megatron-bridge"}
    assert not any(plan_settings(fw, "bf16")["fp8_params"] for fw in FRAMEWORKS.values())
    plan, said = plan_with(FRAMEWORKS["nemo"], Plan(tp=2), precision="fp8")
    assert plan.fp8_params and said["fp8_params"] is True
    plan, said = plan_with(FRAMEWORKS["nemo"], Plan(tp=2), precision="bf16")
    assert not plan.fp8_params and "fp8_params" not in said      # said only where it acts
    plan, _ = plan_with(FRAMEWORKS["nemo"], Plan(tp=2), given={"fp8_params"}, precision="fp8")
    assert not plan.fp8_params                                   # what the user set wins


def test_place_searches_with_fp8_weights(fp8_llama, llama, dgx):
    opts = PlacementOptions(tp=(2,), pp=(1,), mbs=(1,), zero=(1,), recompute=("full",))
    got = place(fp8_llama, dgx, 16, 16, replace(opts, fp8_params=True))
    assert got.best.plan.fp8_params
    with pytest.raises(ConfigError, match="fp8-params.*bf16"):
        place(llama, dgx, 16, 16, replace(opts, fp8_params=True))


def test_cli_refuses_fp8_weights_of_a_16_bit_run(tmp_path):
    one_line_error(phaze_cli(ROOT, "evaluate", "--workload", "llama3-8b", "--arch", "h100-sxm", "--devices", "8",
                             "--global-batch", "8", "--plan", "tp=2,fp8_params=1"), "fp8_params", "bf16")
    one_line_error(phaze_cli(ROOT, "place", "--workload", "llama3-8b", "--arch", "h100-sxm", "--devices", "8",
                             "--global-batch", "8", "--tp", "2", "--fp8-params", "on"), "--fp8-params", "bf16")


def test_sweep_key(tmp_path):
    assert not placement_options(tmp_path, {"tp": [1]}).fp8_params
    with pytest.raises(ConfigError, match="fp8_params.*allowed: false, or precision fp8"):
        placement_options(tmp_path, {"fp8_params": True})     # the small sweep's workload is bf16
    with pytest.raises(ConfigError, match="fp8_params.*true or false"):
        placement_options(tmp_path, {"fp8_params": "yes"})


def test_validation_column():
    row = synthetic(precision="fp8", compute_precision="fp8", framework="megatron-core")
    assert not row_to_case(row).plan.fp8_params
    row["fp8_param_gather"] = "yes"
    assert row_to_case(row).plan.fp8_params
    assert row_to_case(synthetic(precision="fp8", compute_precision="fp8", framework="nemo")).plan.fp8_params
    bad = row_to_case(synthetic(fp8_param_gather="yes"))
    assert isinstance(bad, Skipped) and "fp8_params" in bad.reason
    # the bundled row whose flags say --fp8-param-gather, and no other
    assert [k for k, r in rows().items() if r["fp8_param_gather"]] == ["R1058"]
    assert row_to_case(rows()["R1058"]).plan.fp8_params


def test_the_figures_frameworks_md_quotes(tmp_path):
    """Llama 3 70B in fp8 on 64 H100s under the `nemo` preset, with and without fp8 weights."""
    wl = yaml.safe_load((ROOT / "workloads" / "llama3-70b.yaml").read_text())
    path = tmp_path / "llama3-70b-fp8.yaml"
    path.write_text(yaml.safe_dump(dict(wl, precision="fp8")))
    got = []
    for extra in ("", ",fp8_params=0"):
        out = phaze_cli(ROOT, "evaluate", "--workload", str(path), "--arch", "h100-sxm", "--devices", "64",
                        "--global-batch", "128", "--plan", "tp=4,pp=4,vp=5,mbs=1" + extra, "--framework", "nemo",
                        "--system", "dgx-h100-superpod", "--allow-oom", "--format", "json")
        assert out.returncode == 0, out.stderr
        d = json.loads(out.stdout)
        got.append((d["memory_per_device_bytes"] / 2 ** 30, d["step_time_s"]))
    (mem_on, step_on), (mem_off, step_off) = got
    # every stage holds 20 of the 80 layers: 2 bytes a linear weight more on each, tp 4
    cache = 2 * 20 * fp8_linear_params(load_model(str(path)), 4) / 4
    assert (mem_off - mem_on) * 2 ** 30 == pytest.approx(cache, rel=1e-9)
    assert step_on < step_off      # the distributed optimizer's gather moves 1 byte a linear weight
    doc = " ".join((ROOT / "docs" / "frameworks.md").read_text().split())
    assert (f"needs {mem_on:.1f} GiB a device with fp8 weights and {mem_off:.1f} GiB without, and its step is "
            f"{step_on:.3f} s against {step_off:.3f} s") in doc


def test_separate_casts_cast_the_weights_every_forward(fp8_llama):
    """torchao's float8 linears and a te.Linear without is_first_microbatch cast each linear's
    weights in every forward (a re-run too): one op of K x N elements per linear, reading 2 bytes
    and writing 1 + 1; Megatron-Core's layer spec (fused) casts them once a step (the tail), and a
    16-bit run not at all."""
    sep = replace(fp8_llama, fp8_casts="separate")
    g = layer_graph(sep, 1, 2, True, "flash", "none")
    casts = {o.name: o for o in g.fwd if o.name.endswith(".weight.fp8_cast")}
    h, q, kv, f = 4096, 4096, 1024, 14336
    per_rank = {"qkv.weight.fp8_cast": h * (q + 2 * kv) // 2, "attn_out.weight.fp8_cast": q // 2 * h,
                "ffn_up.weight.fp8_cast": h * 2 * f // 2, "ffn_down.weight.fp8_cast": f // 2 * h}
    assert {n: o.elements for n, o in casts.items()} == per_rank
    assert all(o.bytes_read == 2 * o.elements and o.bytes_written == 2 * o.elements for o in casts.values())
    assert sum(per_rank.values()) * 2 == LINEAR_PER_LAYER
    assert not [o for o in g.bwd if "weight.fp8_cast" in o.name]            # its backward is nothing
    # te.Linear runs the same kernels (it differs in what it keeps: tests/test_memory.py)
    assert layer_graph(replace(sep, fp8_casts="te-linear"), 1, 2, True, "flash", "none") == g
    rerun = layer_graph(sep, 1, 2, True, "flash", "full")
    assert len([o for o in rerun.bwd if o.name.endswith(".weight.fp8_cast")]) == 4   # the re-run casts again
    for model in (fp8_llama, replace(fp8_llama, precision="bf16", fp8_casts="")):
        assert not [o for o in layer_graph(model, 1, 2, True, "flash", "full").fwd if "weight.fp8_cast" in o.name]


def test_megatron_core_casts_the_weights_once_a_step_by_hand(fp8_llama, dgx):
    """The stage tail's memory time: the 16-bit weights cast in both layouts on the first
    micro-batch (read 2, write 2) against, with fp8 weights, the optimizer's fp32 shard cast (read
    4, write 1, 1/dp of them) and the gathered weights' transpose (read 1, write 1)."""
    base = Plan(tp=8, zero=1)
    n = 32
    cached = stage_costs(fp8_llama, dgx, 64, 64, base, IDEAL)
    held = stage_costs(fp8_llama, dgx, 64, 64, replace(base, fp8_params=True), IDEAL)
    w = cached.fp8_weights(0, n)
    bw = dgx.hbm_bandwidth_bytes_per_s * IDEAL.hbm_fraction
    dp = 8
    assert cached.tail(0, n, "none")[1] - held.tail(0, n, "none")[1] == pytest.approx(
        (4 * w - (5 * w / dp + 2 * w)) / bw, rel=1e-9)
    # a 16-bit run's tail has neither
    bf16 = stage_costs(replace(fp8_llama, precision="bf16", fp8_casts=""), dgx, 64, 64, base, IDEAL)
    assert cached.tail(0, n, "none")[1] - bf16.tail(0, n, "none")[1] == pytest.approx(4 * w / bw, rel=1e-9)


def test_fp8_weights_need_transformer_engine(fp8_llama, dgx):
    sep = replace(fp8_llama, fp8_casts="separate")
    with pytest.raises(ConfigError, match="fp8_params.*not modelled.*fp8_casts fused"):
        check_plan(sep, 8, 8, Plan(zero=3, fp8_params=True))
    with pytest.raises(ConfigError, match="fp8-params.*not modelled"):
        place(sep, dgx, 16, 16, PlacementOptions(tp=(2,), pp=(1,), zero=(3,), fp8_params=True))
    bad = row_to_case(synthetic(precision="fp8", compute_precision="fp8", framework="torchtitan",
                                  fp8_param_gather="yes"))
    assert isinstance(bad, Skipped) and "fp8_params" in bad.reason


def test_energy_counts_the_gather_and_the_cast_by_hand(fp8_llama, dgx):
    """The energy model's activity (phaze.area) moves what the step moves: one device of 64 (tp 8,
    dp 8, one stage), one micro-batch. Holding fp8 weights sends (dp-1)/dp of a byte less per linear
    weight in the all-gather (each byte sent read from HBM, each received written: twice in HBM),
    and the step's cast of the weights reads and writes 4 bytes a linear weight against
    5/dp + 2."""
    base = Plan(tp=8, zero=1)
    cached = _step_activity(fp8_llama, dgx, 64, 8, base)
    held = _step_activity(fp8_llama, dgx, 64, 8, replace(base, fp8_params=True))
    w = stage_costs(fp8_llama, dgx, 64, 8, base, IDEAL).fp8_weights(0, 32)
    dp = 8
    sent = (dp - 1) / dp * w
    assert cached.link_bytes - held.link_bytes == pytest.approx(sent, rel=1e-9)
    assert cached.hbm_bytes - held.hbm_bytes == pytest.approx(2 * sent + 4 * w - (5 * w / dp + 2 * w), rel=1e-9)
