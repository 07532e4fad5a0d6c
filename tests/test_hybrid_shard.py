"""Hybrid sharding (``dp_shard``): ZeRO state sharded inside groups of data-parallel ranks and
replicated across them (FSDP's HYBRID_SHARD, MaxText's FSDP over a slice's ICI). Hand derivations
of the memory and the collectives, the invariants that tie it to plain ZeRO, and its refusals."""
from dataclasses import replace

import pytest

from phaze.api import with_system
from phaze.arch import load_chip
from phaze.configio import ConfigError
from phaze.cost import IDEAL
from phaze.framework import FRAMEWORKS, plan_settings
from phaze.memory import state_bytes_per_param
from phaze.plan import DP_SHARD_NODE, Plan, parse_plan
from phaze.plan_check import check_plan
from phaze.stage import expert_shard, shard_ranks, stage_costs
from phaze.step import evaluate


def test_parse_and_label_round_trip():
    assert parse_plan("zero=3,dp_shard=node").dp_shard == DP_SHARD_NODE
    assert parse_plan("zero=3,dp_shard=all").dp_shard == 0
    assert parse_plan("zero=1,dp_shard=16").dp_shard == 16
    for text in ("zero=3,dp_shard=node", "tp=2,zero=1,dp_shard=4"):
        plan = parse_plan(text)
        assert parse_plan(plan.label()) == replace(plan, recompute="none")
    # without ZeRO there is nothing to shard: the label does not carry it
    assert "dp_shard" not in Plan(dp_shard=4).label()
    for bad in ("0", "-1", "half", "2.5"):
        with pytest.raises(ConfigError, match="dp_shard.*all, node or a positive integer"):
            parse_plan(f"zero=3,dp_shard={bad}")


def test_shard_ranks_by_hand(llama, dgx):
    # 64 devices at tp 2: dp 32; a node of 8 devices holds 8 / 2 = 4 data-parallel ranks
    assert shard_ranks(Plan(tp=2, zero=3, dp_shard=DP_SHARD_NODE), 64, dgx) == 4
    assert shard_ranks(Plan(tp=2, zero=3, dp_shard=8), 64, dgx) == 8
    assert shard_ranks(Plan(tp=2, zero=3, dp_shard=64), 64, dgx) == 32      # a multiple of dp: every rank
    assert shard_ranks(Plan(tp=2, zero=3), 64, dgx) == 32
    assert shard_ranks(Plan(tp=2, zero=0, dp_shard=8), 64, dgx) == 32        # no ZeRO: every rank
    assert shard_ranks(Plan(tp=8, cp=2, zero=3, dp_shard=DP_SHARD_NODE), 64, dgx) == 1   # tp*cp spans nodes
    # TPU v4's chip file has one level over the whole pod: node is every rank
    assert shard_ranks(Plan(tp=2, zero=3, dp_shard=DP_SHARD_NODE), 64, load_chip("tpuv4")) == 32
    with pytest.raises(ConfigError, match="dp_shard.*must divide the data-parallel ranks \\(dp = 32\\) or be a mul"):
        check_plan(llama, 64, 64, Plan(tp=2, zero=3, dp_shard=3))
    check_plan(llama, 64, 64, Plan(tp=2, zero=3, dp_shard=64))


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_state_memory_shards_over_the_group_only(llama, dgx, zero):
    """Weights + gradients + Adam state per parameter: sharded over the 4 ranks of a node, not 32."""
    plain = evaluate(llama, dgx, 64, 64, Plan(tp=2, zero=zero, recompute="full"))
    hybrid = evaluate(llama, dgx, 64, 64, Plan(tp=2, zero=zero, recompute="full", dp_shard=DP_SHARD_NODE))
    ratio = (hybrid.stage_memory[0].weights_and_optimizer_bytes
             / plain.stage_memory[0].weights_and_optimizer_bytes)
    assert ratio == pytest.approx(state_bytes_per_param("adam", zero, 4) / state_bytes_per_param("adam", zero, 32))
    # by hand, bf16 weights and gradients (2 + 2 bytes) and Adam's 12: zero 1 shards the 12,
    # zero 2 also the gradients, zero 3 everything
    by_hand = {1: (2 + 2 + 12 / 4) / (2 + 2 + 12 / 32), 2: (2 + 14 / 4) / (2 + 14 / 32), 3: 8.0}
    assert ratio == pytest.approx(by_hand[zero])


def test_hybrid_distributed_optimizer_collectives_by_hand(llama, dgx):
    """ZeRO-1 over a node's 4 ranks, 8 replicas: the gradients are reduce-scattered inside the
    node, each quarter all-reduced over the 8 nodes' InfiniBand ring, and the weights all-gathered
    inside the node. Exposed whole (dp_overlap off), on the ideal machine."""
    plan = Plan(tp=2, zero=1, dp_overlap=False, dp_shard=DP_SHARD_NODE)
    costs = stage_costs(llama, dgx, 64, 64, plan, IDEAL)
    params = costs.params(0, llama.layers)
    comm, _ = costs.tail(0, llama.layers, "none")
    nv, ib = dgx.links[0], dgx.links[1]
    ring = lambda k, nbytes, link, passes: passes * ((k - 1) / k * nbytes / link.bandwidth_bytes_per_s  # noqa: E731
                                                     + (k - 1) * link.latency_s)
    g = 2 * params                          # bf16 gradients, 2 bytes each
    inside = (dgx.collective_latency_s + ring(4, g, nv, 1)                 # reduce-scatter over 4
              + dgx.collective_latency_s + ring(4, 2 * params, nv, 1))    # all-gather of the weights
    across = dgx.collective_latency_s + ring(8, g / 4, ib, 2)             # a quarter, all-reduced over 8
    assert comm == pytest.approx(inside + across, rel=1e-9)
    # plain ZeRO-1 moves the whole buffer over both levels instead: more than the hybrid's
    plain = stage_costs(llama, dgx, 64, 64, replace(plan, dp_shard=0), IDEAL).tail(0, llama.layers, "none")[0]
    assert plain > inside


def test_fsdp_hybrid_step_adds_one_all_reduce_per_step(llama, dgx):
    """ZeRO-3 inside a node: the per-layer gathers and reduce-scatters stay on NVLink, and each
    shard's gradients are all-reduced over the replicas once per step (exposed: dp_overlap off)."""
    plan = Plan(tp=2, zero=3, dp_overlap=False, dp_shard=DP_SHARD_NODE)
    costs = stage_costs(llama, dgx, 64, 64, plan, IDEAL)
    params = costs.params(0, llama.layers)
    comm, _ = costs.tail(0, llama.layers, "none")
    ib = dgx.links[1]
    r = 8
    expect = dgx.collective_latency_s + 2 * ((r - 1) / r * 2 * params / 4 / ib.bandwidth_bytes_per_s
                                             + (r - 1) * ib.latency_s)
    assert comm == pytest.approx(expect, rel=1e-9)
    # plain FSDP reduces inside each layer's backward: nothing is left for the step's tail
    assert stage_costs(llama, dgx, 64, 64, replace(plan, dp_shard=0), IDEAL).tail(0, llama.layers, "none")[0] == 0


def test_a_group_of_every_rank_is_plain_zero(llama, dgx):
    for zero in (1, 3):
        base = Plan(tp=2, zero=zero, recompute="full")
        plain = evaluate(llama, dgx, 64, 64, base)
        for shard in (32, DP_SHARD_NODE):
            chip = dgx if shard == 32 else load_chip("tpuv4")   # node = every rank on one level
            r = evaluate(llama, chip, 64, 64, replace(base, dp_shard=shard))
            ref = plain if shard == 32 else evaluate(llama, chip, 64, 64, base)
            assert r.step_time_s == ref.step_time_s
            assert r.memory_per_device_bytes == ref.memory_per_device_bytes
    # and ZeRO 0 ignores it
    assert (evaluate(llama, dgx, 64, 64, Plan(tp=2, dp_shard=4)).step_time_s
            == evaluate(llama, dgx, 64, 64, Plan(tp=2)).step_time_s)


def test_expert_shard_groups_by_hand(dgx):
    """Mixtral at tp 1, ep 8 on 64 devices: dp 64, edp 64 / 8 = 8. Shard groups of a node's 8
    ranks leave 8 replicas; the experts' group of 8 is split into gcd(8, 8) = 8 replicas of 1."""
    plan = Plan(zero=1, ep=8, dp_shard=DP_SHARD_NODE)
    assert shard_ranks(plan, 64, dgx) == 8
    assert expert_shard(plan, 64, dgx) == (1, 8)
    assert expert_shard(replace(plan, dp_shard=0), 64, dgx) == (8, 1)


def test_maxtext_preset_shards_within_a_slice():
    assert plan_settings(FRAMEWORKS["maxtext"])["dp_shard"] == DP_SHARD_NODE
    assert all(plan_settings(fw)["dp_shard"] == 0 for name, fw in FRAMEWORKS.items() if name != "maxtext")
    # two v5e slices of 256 chips, FSDP inside each: the state of 256 ranks, not 512
    chip = with_system(load_chip("tpuv5e"), "tpuv5e-multislice")
    assert shard_ranks(Plan(zero=3, dp_shard=DP_SHARD_NODE), 512, chip) == 256


def test_power_counts_the_bytes_each_device_sends(llama, dgx):
    """The power model's link traffic (phaze.area): plain ZeRO-1 over 32 ranks sends 31/32 of the
    gradients (reduce-scatter) and of the weights (all-gather); hybrid over 4 sends 3/4 of each,
    plus 2 x 7/8 of its quarter of the gradients (all-reduce over 8 replicas)."""
    from phaze.area import _step_activity
    plan = Plan(tp=2, zero=1)
    params = stage_costs(llama, dgx, 64, 64, plan, IDEAL).params(0, llama.layers)
    plain = _step_activity(llama, dgx, 64, 64, plan).link_bytes
    hybrid = _step_activity(llama, dgx, 64, 64, replace(plan, dp_shard=DP_SHARD_NODE)).link_bytes
    g = w = 2 * params
    assert hybrid - plain == pytest.approx(3 / 4 * (g + w) + 2 * 7 / 8 * g / 4 - 31 / 32 * (g + w), rel=1e-9)


def test_the_printout_says_the_groups(llama, dgx):
    from phaze.cli import format_result
    r = evaluate(llama, dgx, 64, 64, Plan(tp=2, zero=1, dp_shard=DP_SHARD_NODE))
    assert r.zero_group_ranks == 4 and r.dp == 32
    assert "dp_shard=node, dp=32, 2 micro-batches per step; ZeRO shard groups of 4 data-parallel ranks, " \
           "8 replicas" in format_result(r)
    plain = evaluate(llama, dgx, 64, 64, Plan(tp=2, zero=1))
    assert plain.zero_group_ranks == 32 and "shard groups" not in format_result(plain)
    assert evaluate(llama, dgx, 64, 64, Plan(tp=2)).zero_group_ranks == 0


def test_the_row_column_takes_the_preset_unless_it_says():
    from test_validate import case, synthetic, synthetic_case

    from phaze.runs import Case, row_to_case
    assert synthetic_case(framework="maxtext").plan.dp_shard == DP_SHARD_NODE
    assert synthetic_case(framework="maxtext", dp_shard="all").plan.dp_shard == 0
    assert synthetic_case(framework="torchtitan", dp_shard="node").plan.dp_shard == DP_SHARD_NODE
    assert synthetic_case(zero_stage="1", dp_shard="2").plan.dp_shard == 2
    assert synthetic_case().plan.dp_shard == 0
    # a bundled S25 multislice row (blank column, maxtext): a slice's 256 chips of 1024
    c = case("R1072")
    assert c.plan.dp_shard == DP_SHARD_NODE and shard_ranks(c.plan, c.devices, c.chip) == 256
    for bad in ("half", "0", "-4"):
        r = row_to_case(synthetic(zero_stage="1", dp_shard=bad))
        assert not isinstance(r, Case) and "column 'dp_shard' must be all, node or a positive integer" \
            in r.reason, r
    # a count that neither divides dp (4) nor is a multiple of it is refused with the plan's reason
    r = row_to_case(synthetic(zero_stage="1", dp_shard="3"))
    assert not isinstance(r, Case) and "dp_shard" in r.reason


def test_place_searches_several_groupings_exactly(llama, dgx):
    """Given several shard groupings, ``place`` returns the best plans of them all: the 10 best
    of the single-grouping searches' top 10s (brute force), with the same times. A grouping that
    gives a layout the same ranks as an earlier one is not a second plan: on one node, ``node``
    is every rank."""
    from phaze.placement import PlacementOptions, layouts, place
    kw = dict(tp=(1, 2, 8), mbs=(1,), recompute=("full",), zero=(0, 1, 3), vp=(1,))

    def search(shard, devices=32):
        return place(llama, dgx, devices, 64, PlacementOptions(dp_shard=shard, **kw), top=10, with_baseline=False)
    both, alone = search((0, DP_SHARD_NODE, 2)), {s: search(s) for s in (0, DP_SHARD_NODE, 2)}
    union = {p.plan.label(): p.result.step_time_s for r in alone.values() for p in r.top}
    joint = {p.plan.label(): p.result.step_time_s for p in both.top}
    assert len(joint) == 10 and all(union[k] == t for k, t in joint.items())
    assert sorted(joint.values()) == sorted(union.values())[:10]
    assert {p.plan.dp_shard for p in both.top if p.plan.zero} == {0, DP_SHARD_NODE, 2}
    # one node: node is every rank, so it adds no layout; 2 is a group of its own
    one = PlacementOptions(dp_shard=(0, DP_SHARD_NODE), **kw)
    assert (list(layouts(llama, 8, 64, one, dgx))
            == list(layouts(llama, 8, 64, PlacementOptions(dp_shard=0, **kw), dgx)))
    two = PlacementOptions(dp_shard=(0, 2), **kw)
    assert {p.dp_shard for p in layouts(llama, 8, 64, two, dgx) if p.zero and p.tp == 1} == {0, 2}
    assert {p.dp_shard for p in layouts(llama, 8, 64, two, dgx) if not p.zero} == {0}


def test_several_groupings_from_the_flag_and_the_sweep(tmp_path):
    from test_space import placement_options

    from phaze.cli import _dp_shard
    assert _dp_shard("node") == DP_SHARD_NODE and _dp_shard("all,Node,8,all") == (0, DP_SHARD_NODE, 8)
    with pytest.raises(Exception, match="or several joined by commas"):
        _dp_shard("all,half")
    assert placement_options(tmp_path, {"dp_shard": ["node", 4]}).dp_shards == (DP_SHARD_NODE, 4)
    assert placement_options(tmp_path, {"dp_shard": ["all"]}).dp_shard == 0
    for bad in ([], ["all", "half"]):
        with pytest.raises(ConfigError, match="or a non-empty list of them"):
            placement_options(tmp_path, {"dp_shard": bad})
