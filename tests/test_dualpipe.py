"""DualPipe (phaze.dualpipe, ``pipe_schedule=dualpipe``): the port of ``DualPipe.step`` against the
DeepSeek-V3 report's Table 2 (bubble, parameters, activations), and the step and memory phaze
builds on it against hand derivations."""
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from phaze import dualpipe
from phaze.arch import load_chip
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.cost import IDEAL
from phaze.plan import Plan, parse_plan
from phaze.plan_check import stage_split
from phaze.stage import stage_costs
from phaze.step import evaluate, layout_of

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli import one_line_error, phaze_cli  # noqa: E402

SHAPES = [(2, 4), (2, 10), (4, 8), (4, 14), (8, 16), (8, 22), (16, 32), (16, 120)]


@pytest.mark.parametrize("pp,m", SHAPES)
def test_the_port_runs_every_chunk_once_and_pairs_its_sends(pp, m):
    """Each rank runs a forward and a backward of every micro-batch of both directions (m / 2
    each), every deferred weight gradient once (DualPipe asserts its queue empty), and every send
    meets its receive (the timing run would deadlock otherwise)."""
    for acts in dualpipe.actions(pp, m):
        fwd, bwd, deferred, weights = [0, 0], [0, 0], 0, 0
        for a in acts:
            if a[0] == "F":
                fwd[a[1]] += 1
            elif a[0] == "B":
                bwd[a[1]] += 1
                deferred += a[2]
            elif a[0] == "FB":
                fwd[a[1]] += 1
                bwd[a[2]] += 1
            elif a[0] == "W":
                weights += 1
        assert fwd == bwd == [m // 2, m // 2] and deferred == weights
    sends = {op[1:] for acts in dualpipe.actions(pp, m) for a in acts if a[0] == "wait" for op in a[1]
             if op[0] == "send"}
    recvs = {op[1:] for acts in dualpipe.actions(pp, m) for a in acts if a[0] == "wait" for op in a[1]
             if op[0] == "recv"}
    assert sends == recvs and len(sends) == 2 * (pp - 1) * m   # activation and gradient, per hop
    assert len(dualpipe.finish_times(pp, m, [1.0] * pp, [2.0] * pp, [1.0] * pp)) == pp


@pytest.mark.parametrize("pp,m", SHAPES)
@pytest.mark.parametrize("f", [1.0, 0.37])
def test_the_port_has_the_reports_bubble(pp, m, f):
    """Table 2: DualPipe's bubble is (PP/2 - 1)(F&B + B - 3W). With a chunk's forward and weight
    gradients each half its backward and nothing overlapped (F&B = F + B), the slowest rank
    finishes m (F + B) plus that."""
    b, w = 2 * f, f
    done = dualpipe.finish_times(pp, m, [f] * pp, [b] * pp, [w] * pp)
    assert max(done) == pytest.approx(m * (f + b) + (pp / 2 - 1) * ((f + b) + b - 3 * w))


def test_overlapped_pairs_shorten_the_step_by_less_than_the_overlap():
    """Paired chunks that hide some of their time shorten the step, but the lone chunks of the
    warm-up and cool-down run at the slower times: the step is above m paired chunks."""
    pp, m = 8, 40
    plain = max(dualpipe.finish_times(pp, m, [1.0] * pp, [2.0] * pp, [1.0] * pp))
    paired = max(dualpipe.finish_times(pp, m, [1.0] * pp, [2.0] * pp, [1.0] * pp, [0.8] * pp, [1.6] * pp))
    assert m * 2.4 < paired < plain


@pytest.mark.parametrize("pp,m", SHAPES)
def test_a_rank_holds_the_reports_pp_plus_one_micro_batches(pp, m):
    """Table 2: DualPipe holds PP + 1 micro-batches' activations. The port's peak, by direction,
    bounds every moment of the rank's schedule; stage h (the nearer the input) holds pp - h, as
    1F1B's stage h does, and stage pp - 1 - h the rest, h + 1, as 1F1B's stage pp - 1 - h does."""
    for rank in range(pp):
        peak = dualpipe.peak_inflight(pp, m, rank)
        held = [0, 0]
        for a in dualpipe.actions(pp, m)[rank]:
            if a[0] in ("F", "FB"):
                held[a[1]] += 1
            assert held[0] <= peak[0] and held[1] <= peak[1]
            if a[0] == "B":
                held[a[1]] -= 1
            elif a[0] == "FB":
                held[a[2]] -= 1
        h = min(rank, pp - 1 - rank)
        near = peak[0] if rank < pp // 2 else peak[1]
        assert sum(peak) == pp + 1 and near == pp - h


def test_what_dualpipe_needs():
    assert dualpipe.schedule_error(16, 120) is None
    assert "even number of pipeline stages" in dualpipe.schedule_error(3, 12)
    assert "at least 2 * pp = 16" in dualpipe.schedule_error(8, 14)
    assert "even number of micro-batches" in dualpipe.schedule_error(8, 17)
    m, chip = load_model("gpt3-175b"), load_chip("a100-80gb")
    for plan, said in ((Plan(tp=8, pp=4, vp=2, pipe_schedule="dualpipe"), "vp=1"),
                       (Plan(tp=8, pp=4, zero=3, pipe_schedule="dualpipe"), "zero 0-2"),
                       (Plan(tp=8, pp=4, pipe_p2p="blocking", pipe_schedule="dualpipe"), "pipe_p2p=batched"),
                       (Plan(tp=8, pp=4, pipe_schedule="dualpipe"), "at least 2 * pp = 8")):
        with pytest.raises(ConfigError, match=re.escape(said)):
            evaluate(m, chip, 64, 4 if "2 * pp" in said else 64, plan)
    plan = parse_plan("tp=8,pp=4,pipe_schedule=dualpipe")
    assert plan.pipe_schedule == "dualpipe" and parse_plan(plan.label()) == plan
    with pytest.raises(ConfigError, match="1f1b, dualpipe"):
        parse_plan("pp=4,pipe_schedule=zb")


def test_a_bad_schedule_is_one_line_with_exit_status_2(tmp_path):
    one_line_error(phaze_cli(tmp_path, "evaluate", "--workload", "gpt3-175b", "--arch", "a100-80gb", "--devices",
                             "64", "--global-batch", "4", "--plan", "tp=8,pp=4,pipe_schedule=dualpipe"),
                   "--plan", "'pipe_schedule'", "at least 2 * pp = 8", "allowed: 1f1b")


def _dense(pp: int, schedule: str):
    m, chip = load_model("gpt3-175b"), load_chip("a100-80gb")
    plan = Plan(tp=8, pp=pp, recompute="full", zero=1, pipe_schedule=schedule)
    return m, chip, 8 * pp * 2, 64, plan


def test_two_stages_have_no_bubble():
    """Table 2's bubble vanishes at PP = 2: both ranks run m / 2 micro-batches of each stage, so
    the step is m times the mean of the two stage times plus the rank's tail, both stages' data-
    parallel reduction and optimizer step, with no copy of the tied table to sum with the other
    end (one rank holds both ends: one table, which 1F1B's last stage copies). 1F1B waits a stage
    time more."""
    m, chip, devices, batch, plan = _dense(2, "dualpipe")
    assert m.tied_embeddings
    r = evaluate(m, chip, devices, batch, plan)
    costs = stage_costs(m, chip, devices, batch, layout_of(plan), IDEAL)
    flat = stage_costs(m, chip, devices, batch, layout_of(replace(plan, pipe_schedule="1f1b")), IDEAL)
    n = stage_split(m, plan)
    times = [costs.time(i, n[i], "full").total for i in (0, 1)]
    tails = sum(sum(costs.tail(i, n[i], "full")) for i in (0, 1))
    assert costs.table_sync_s(0) == costs.table_sync_s(1) == 0.0 < flat.table_sync_s(0)
    # the last stage's tail without the copy: its data-parallel reduction and step are 1F1B's less the table's
    assert costs.params(1, n[1]) == pytest.approx(flat.params(1, n[1]) - m.table_params / plan.tp)
    assert sum(costs.tail(1, n[1], "full")) < sum(flat.tail(1, n[1], "full")) - flat.table_sync_s(1)
    assert r.step_time_s == pytest.approx(costs.micro_batches * sum(times) / 2 + tails, rel=1e-12)
    assert r.breakdown_s["pipeline_bubble_s"] == pytest.approx(0.0, abs=1e-12)
    assert evaluate(m, chip, devices, batch, replace(plan, pipe_schedule="1f1b")).breakdown_s["pipeline_bubble_s"] > 0


@pytest.mark.parametrize("pp", [4, 8])
def test_a_rank_holds_two_stages_as_1f1b_holds_them(pp):
    """Table 2: 2x parameters, PP + 1 micro-batches. A DualPipe rank holds the weights, state and
    activations 1F1B's stages h and pp - 1 - h hold (their in-flight counts are DualPipe's), and
    the larger of their transients; the end ranks hold the tied table once (Sec. 3.2.3): 1F1B's
    last stage keeps a copy, its tp shard with the state of every parameter, which DualPipe's
    last stage does not."""
    m, chip, devices, batch, plan = _dense(pp, "dualpipe")
    r = evaluate(m, chip, devices, batch, plan)
    flat = evaluate(m, chip, devices, batch, replace(plan, pipe_schedule="1f1b"))
    state = stage_costs(m, chip, devices, batch, layout_of(plan), IDEAL).state_bytes_per_param
    for rank, held in enumerate(r.stage_memory):
        a, b = flat.stage_memory[rank], flat.stage_memory[pp - 1 - rank]
        shared = state * m.table_params / 8 if rank in (0, pp - 1) else 0.0
        assert held.weights_and_optimizer_bytes == pytest.approx(a.weights_and_optimizer_bytes
                                                                 + b.weights_and_optimizer_bytes - shared)
        assert held.activation_bytes == pytest.approx(a.activation_bytes + b.activation_bytes)
        assert held.transient_bytes == pytest.approx(max(a.transient_bytes, b.transient_bytes))
        assert held.layers == a.layers + b.layers
    assert r.memory_per_device_bytes > flat.memory_per_device_bytes   # twice the parameters


def test_the_all_to_all_overlap_is_dualpipes_own():
    """Under DualPipe ``ep_overlap`` needs no interleaving (its chunks pair themselves) and makes
    the step shorter; under 1F1B Megatron-Core still asks for vp > 1."""
    m, chip = load_model("mixtral-8x7b"), load_chip("h100-sxm")
    plan = Plan(tp=2, pp=4, ep=8, zero=1, recompute="selective", pipe_schedule="dualpipe")
    exposed = evaluate(m, chip, 64, 512, plan)
    overlapped = evaluate(m, chip, 64, 512, replace(plan, ep_overlap=True))
    assert overlapped.step_time_s < exposed.step_time_s
    with pytest.raises(ConfigError, match="vp > 1"):
        evaluate(m, chip, 64, 512, replace(plan, ep_overlap=True, pipe_schedule="1f1b"))


def test_evaluate_names_the_rank_and_its_stages(tmp_path):
    proc = phaze_cli(tmp_path, "evaluate", "--workload", "gpt3-175b", "--arch", "a100-80gb", "--devices", "64",
                     "--global-batch", "64", "--allow-oom", "--plan", "tp=8,pp=4,recompute=full,pipe_schedule=dualpipe")
    assert proc.returncode == 0, proc.stderr
    assert "memory on rank 0, with stages 0 and 3:" in proc.stdout and "(rank 0, with stages 0 and 3)" in proc.stdout
