"""FSDP under pipeline parallelism (``fsdp_pp``): a stage's weights gathered once per step and kept
whole with their gradients, reduce-scattered once after the stage's last backward (PyTorch's
pipelining with FSDP2, torchtitan's default), against gathering for every micro-batch. Memory and
collectives by hand, the invariants that tie it to the distributed optimizer, the DP against brute
force, the preset and the validation column."""
import random
from dataclasses import replace

import pytest
from test_placement import binding_chip, brute_force, tiny_model

from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.cost import IDEAL, collective_time
from phaze.framework import FRAMEWORKS, plan_settings
from phaze.placement import PlacementOptions, place
from phaze.plan import Plan, parse_plan
from phaze.stage import shard_ranks, stage_costs
from phaze.step import evaluate


def test_parse_and_label():
    plan = parse_plan("tp=2,pp=2,zero=3,fsdp_pp=step")
    assert plan.fsdp_pp == "step" and plan.fsdp_once
    assert parse_plan(plan.label()) == plan
    # it says something only about FSDP under a pipeline: the label leaves it out otherwise
    assert "fsdp_pp" not in replace(plan, pp=1).label() and not replace(plan, pp=1).fsdp_once
    assert "fsdp_pp" not in replace(plan, zero=1).label() and not replace(plan, zero=1).fsdp_once
    with pytest.raises(ConfigError, match="fsdp_pp.*micro_batch, step"):
        parse_plan("zero=3,fsdp_pp=once")


def test_memory_holds_the_stage_whole_by_hand(llama, dgx):
    """64 H100s, tp 2, pp 2: dp 16. Per parameter of a stage, gathered per micro-batch: (2 + 2 + 12)
    / 16 bytes and one layer's gathered 16-bit weights; once per step: the 16-bit weights and the
    fp32 gradients whole (FSDP2 accumulates in its reduce dtype) and the 12 bytes of fp32 weights
    and Adam state sharded, as the distributed optimizer holds them."""
    base = Plan(tp=2, pp=2, zero=3, recompute="full", reduce_fp32=True)
    per_mb = stage_costs(llama, dgx, 64, 64, base, IDEAL)
    once = stage_costs(llama, dgx, 64, 64, replace(base, fsdp_pp="step"), IDEAL)
    n = llama.layers // 2
    params = once.params(0, n)
    assert once.memory(0, n, "full").weights_and_optimizer_bytes == pytest.approx(params * (2 + 4 + 12 / 16))
    assert per_mb.memory(0, n, "full").weights_and_optimizer_bytes == pytest.approx(params * (2 + 4 + 12) / 16)
    layer = 2 * 2 * llama.layer_params / 2        # one layer's gathered weights (and its prefetched next), tp 2
    assert (per_mb.memory(0, n, "full").transient_bytes - once.memory(0, n, "full").transient_bytes
            == pytest.approx(layer))
    dist_opt = stage_costs(llama, dgx, 64, 64, replace(base, zero=1), IDEAL)
    assert once.memory(0, n, "full").total_bytes == dist_opt.memory(0, n, "full").total_bytes


def test_one_gather_and_one_reduce_scatter_per_step_by_hand(llama, dgx):
    """Once per step: no FSDP traffic in a layer's time (the layer costs of the distributed
    optimizer's plan), and in the stage's tail the fp32 gradients' reduce-scatter, whole (after
    the last backward), and the 16-bit weights' all-gather under the next step's first forward."""
    base = Plan(tp=2, pp=2, zero=3, recompute="full", reduce_fp32=True, fsdp_pp="step")
    once = stage_costs(llama, dgx, 64, 64, base, IDEAL)
    dist_opt = stage_costs(llama, dgx, 64, 64, replace(base, zero=1), IDEAL)
    per_mb = stage_costs(llama, dgx, 64, 64, replace(base, fsdp_pp="micro_batch"), IDEAL)
    assert once.mode("full").layer == dist_opt.mode("full").layer
    assert once.mode("full").layer.total <= per_mb.mode("full").layer.total   # FSDP traffic hidden or not
    n = llama.layers // 2
    params = once.params(0, n)
    group = shard_ranks(base, 64, dgx)
    scatter = collective_time("reduce_scatter", 4 * params, group, dgx, 2, IDEAL)
    gather = collective_time("all_gather", 2 * params, group, dgx, 2, IDEAL)
    fwd = once.mode("full").fwd.total * n
    comm, _ = once.tail(0, n, "full")
    assert comm == pytest.approx(scatter + max(0.0, gather - fwd), rel=1e-6)
    assert comm >= scatter
    # gathered per micro-batch, the gradients are reduced inside each layer's backward: no tail
    assert per_mb.tail(0, n, "full")[0] == 0


def test_without_a_pipeline_it_changes_nothing(llama, dgx):
    plan = Plan(tp=2, zero=3, recompute="full")
    a = evaluate(llama, dgx, 64, 64, plan)
    b = evaluate(llama, dgx, 64, 64, replace(plan, fsdp_pp="step"))
    assert (a.step_time_s, a.memory_per_device_bytes) == (b.step_time_s, b.memory_per_device_bytes)


def test_torchtitan_gathers_once_and_is_faster_on_many_micro_batches(dgx):
    assert plan_settings(FRAMEWORKS["torchtitan"])["fsdp_pp"] == "step"
    assert all(plan_settings(fw)["fsdp_pp"] == "micro_batch" for n, fw in FRAMEWORKS.items() if n != "torchtitan")
    m = load_model("llama3-70b")
    plan = Plan(tp=8, pp=4, zero=3, recompute="full", reduce_fp32=True)
    per_mb = evaluate(m, dgx, 256, 256, plan)            # dp 8, 32 micro-batches per step
    once = evaluate(m, dgx, 256, 256, replace(plan, fsdp_pp="step"))
    assert once.step_time_s < per_mb.step_time_s
    assert once.memory_per_device_bytes > per_mb.memory_per_device_bytes


@pytest.mark.parametrize("seed", range(4))
def test_dp_equals_brute_force(seed):
    rng = random.Random(seed)
    layers = rng.randint(2, 6)
    model = tiny_model(layers, seed)
    devices = rng.choice([8, 16])
    options = PlacementOptions(tp=(1, 2), mbs=(1, 2), pp=(2, 4) if layers >= 4 else (2,), zero=(3,),
                               fsdp_pp="step", vp=(1,), attention="flash")
    batch = devices * 4
    chip = binding_chip(model, devices, batch, options, rng)
    expect = brute_force(model, chip, devices, batch, options)
    got = place(model, chip, devices, batch, options)
    assert all(p.plan.fsdp_pp == "step" for p in got.top)
    assert got.best.result.step_time_s == pytest.approx(expect.step_time_s, rel=1e-12)


def test_validation_column():
    from test_validate import synthetic

    from phaze.runs import Skipped, row_to_case
    row = synthetic(pp="2", tp="1", zero_stage="3", framework="torchtitan")
    assert row_to_case(row).plan.fsdp_pp == "step"
    row["fsdp_pp"] = "micro_batch"
    assert row_to_case(row).plan.fsdp_pp == "micro_batch"
    row["fsdp_pp"] = "sometimes"
    bad = row_to_case(row)
    assert isinstance(bad, Skipped) and "fsdp_pp" in bad.reason
    assert row_to_case(synthetic(pp="2", tp="1", zero_stage="3")).plan.fsdp_pp == "micro_batch"


def test_sweep_placement_takes_fsdp_pp(tmp_path):
    from test_space import placement_options
    assert placement_options(tmp_path, {}).fsdp_pp == "micro_batch"
    assert placement_options(tmp_path, {"fsdp_pp": "step"}).fsdp_pp == "step"
    assert placement_options(tmp_path, {"framework": "torchtitan"}).fsdp_pp == "step"      # the preset's
    assert placement_options(tmp_path, {"framework": "torchtitan", "fsdp_pp": "micro_batch"}).fsdp_pp == "micro_batch"
    with pytest.raises(ConfigError, match="fsdp_pp"):
        placement_options(tmp_path, {"fsdp_pp": "never"})


def test_the_preset_says_it_only_where_it_acts():
    from phaze.framework import plan_with
    fw = FRAMEWORKS["torchtitan"]
    plan, said = plan_with(fw, Plan(tp=2, pp=2))
    assert plan.fsdp_once and said["fsdp_pp"] == "step"
    plan, said = plan_with(fw, Plan(tp=2))
    assert plan.fsdp_pp == "step" and not plan.fsdp_once and "fsdp_pp" not in said


def test_place_takes_the_flag(capsys):
    """``phaze place --fsdp-pp step`` searches pipelined FSDP plans that gather once per step; the
    torchtitan preset sets it unless the flag says otherwise."""
    import json

    from phaze.cli import main
    args = ["place", "--workload", "llama3-8b", "--arch", "h100-sxm", "--devices", "64", "--global-batch", "64",
            "--zero", "3", "--pp", "2", "--tp", "2", "--mbs", "1", "--format", "json"]
    for extra, expect in (([], "micro_batch"), (["--fsdp-pp", "step"], "step"),
                          (["--framework", "torchtitan"], "step"),
                          (["--framework", "torchtitan", "--fsdp-pp", "micro_batch"], "micro_batch")):
        assert main(args + extra) == 0
        out = json.loads(capsys.readouterr().out)
        assert ("fsdp_pp=step" in out["best"]["plan"]) == (expect == "step"), (extra, out["best"]["plan"])
