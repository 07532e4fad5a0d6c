"""The shared token table's gradient sum: when the last of several pipeline stages keeps its own copy
of the table (a tied head, multi-token prediction), the first and last stages all-reduce the two
copies' gradients once a step, exposed. By hand, where it is absent, and in the energy model."""
from dataclasses import replace

import pytest

from phaze.area import _step_activity
from phaze.catalogue import load_model
from phaze.cost import IDEAL, collective_time
from phaze.plan import Plan
from phaze.stage import stage_costs
from phaze.step import evaluate


@pytest.fixture(scope="module")
def gpt3():
    """GPT-3 175B: its head tied to the 50,257 x 12,288 token table."""
    return load_model("gpt3-175b")


def test_first_and_last_stages_sum_the_table_by_hand(gpt3, dgx):
    """tp 8, pp 4, dp 2 on 64 H100s: the first and last stages all-reduce the table's tp shard of
    fp32 main gradients between two ranks 3 x 8 x 2 = 48 apart (other nodes: InfiniBand), the
    middle stages nothing; in 16 bits it is half the bytes."""
    plan = Plan(tp=8, pp=4, zero=1, reduce_fp32=True)
    costs = stage_costs(gpt3, dgx, 64, 64, plan, IDEAL)
    nbytes = 4 * gpt3.vocab * gpt3.hidden / 8
    assert costs.table_sync_bytes(0) == costs.table_sync_bytes(3) == pytest.approx(nbytes, rel=1e-12)
    assert costs.table_sync_bytes(1) == costs.table_sync_bytes(2) == 0.0
    expect = collective_time("all_reduce", nbytes, 2, dgx, 8 * 2 * 3, IDEAL)
    assert costs.table_sync_s(0) == pytest.approx(expect, rel=1e-12) and costs.table_sync_s(1) == 0.0
    assert expect > collective_time("all_reduce", nbytes, 2, dgx, 1, IDEAL)    # over InfiniBand, not NVLink
    half = stage_costs(gpt3, dgx, 64, 64, replace(plan, reduce_fp32=False), IDEAL)
    assert half.table_sync_bytes(0) == pytest.approx(nbytes / 2, rel=1e-12)
    # exposed after the stage's data-parallel reduction: the tail grows by it on stages 0 and 3 only
    # (an untied head holds the same parameters on the last stage, so its reduction is the same)
    base = stage_costs(replace(gpt3, tied_embeddings=False), dgx, 64, 64, plan, IDEAL)
    for i in range(4):
        assert costs.tail(i, 24, "full")[0] == pytest.approx(base.tail(i, 24, "full")[0] + costs.table_sync_s(i),
                                                           rel=1e-9)


def test_no_sum_without_a_shared_copy(gpt3, llama, dgx):
    """One stage holds the table once; an untied head (Llama 3) shares nothing."""
    assert stage_costs(gpt3, dgx, 64, 64, Plan(tp=8, zero=1), IDEAL).table_sync_s(0) == 0.0
    costs = stage_costs(llama, dgx, 64, 64, Plan(tp=8, pp=4, zero=1), IDEAL)
    assert all(costs.table_sync_s(i) == 0.0 for i in range(4))


def test_the_step_pays_it_once(gpt3, dgx):
    """The step adds the largest stage tail: with the sum on the first and last stages, the step
    grows by at most one sum and by no more than the tail of those stages grew."""
    plan = Plan(tp=8, pp=4, zero=1, dp_overlap=False, recompute="full")
    tied = evaluate(gpt3, dgx, 64, 64, plan)
    untied = evaluate(replace(gpt3, tied_embeddings=False), dgx, 64, 64, plan)
    sync = stage_costs(gpt3, dgx, 64, 64, plan, IDEAL).table_sync_s(0)
    # an untied head adds the head's own weights to the last stage: compare the exposed communication
    assert tied.breakdown_s["communication_exposed_s"] - untied.breakdown_s["communication_exposed_s"] == \
        pytest.approx(sync, rel=1e-6)


def test_energy_counts_the_sum_by_hand(gpt3, dgx):
    """phaze.area: each of the two stages sends the table's gradient bytes once (a two-rank ring
    all-reduce sends 2 x (2 - 1) / 2 of them), averaged over the pp stages."""
    plan = Plan(tp=8, pp=4, zero=1)
    tied = _step_activity(gpt3, dgx, 64, 64, plan)
    untied = _step_activity(replace(gpt3, tied_embeddings=False), dgx, 64, 64, plan)
    nbytes = stage_costs(gpt3, dgx, 64, 64, plan, IDEAL).table_sync_bytes(0)
    assert tied.link_bytes - untied.link_bytes == pytest.approx(2 * nbytes / 4, rel=1e-9)
