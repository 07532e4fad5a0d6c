"""CP-SAT operator scheduler (README, "Scheduling a layer on the chip's units"): optimum against
brute force on tiny DAGs, an independent checker (and faults it must catch), bounds on every shipped workload,
GPUs reduce to the sequential sum, time limits never raise, the disk cache."""
from __future__ import annotations

import itertools
import json
import math
import random
import threading
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaze import schedule as S
from phaze.arch import load_chip
from phaze.catalogue import load_model
from phaze.cli import main as cli_main
from phaze.configio import ConfigError
from phaze.cost import Efficiency, op_time
from phaze.graph import collective_groups, layer_graph
from phaze.schedule import Mode, Task, schedule_layer, schedule_ops, solve
from phaze.schedule_check import check_schedule, check_task_schedule
from phaze.stage import layer_mix, layer_time

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = sorted(p.stem for p in (ROOT / "workloads").glob("*.yaml"))
# backward layers the solver does not prove optimal within the default work limit (DeepSeek-V3's
# MLA projections, router, routed and shared experts: 22 forward ops, their backward about three
# times as many; Qwen3-Next's Gated DeltaNet layer, whose backward the solve without CP-SAT's
# presolve bounds within 8 %); their schedules are still checked, bounded and within 10 % of the
# lower bound
NOT_PROVEN = ("deepseek-v3", "qwen3-next-80b-a3b", "llama4-scout")
# a non-ideal machine (kernel overheads make fewer units relatively cheaper: a harder instance)
EFF = Efficiency(tensor_fraction=0.7, hbm_fraction=0.75, link_fraction=0.8, attention_fraction=0.45,
                 kernel_overhead_s=6e-6, tile_overhead_k=64)


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch):
    """Every test solves afresh unless it opts into a cache directory."""
    monkeypatch.setenv("PHAZE_CACHE_DIR", "off")
    S.clear_memory_cache()
    yield
    S.clear_memory_cache()


@cache
def chip(name):
    return load_chip(name)


def model_for(name, c):
    """The shipped workload; a precision the chip has no tensor peak for (GPT-2 XL's fp32
    checkpoint on TPUv4) trains in bf16."""
    m = load_model(name)
    try:
        c.peak_flops(m.precision)
    except ConfigError:
        m = replace(m, precision="bf16")
    return m


def phase_ops(m, mbs=1, tp=1, sp=False, attention="flash", recompute="none"):
    g = layer_graph(m, mbs, tp, sp, attention, recompute)
    return g.fwd, g.bwd


# --- brute force (independent of the solver) ------------------------------------------------------
def brute_force(tasks, caps) -> int:
    """Minimum makespan over every mode assignment and every topological order, each order
    turned into its earliest-start serial schedule (which generates every active schedule, and
    some active schedule is optimal). Integer durations; time is stepped one unit at a time."""
    n = len(tasks)
    idx = {t.name: i for i, t in enumerate(tasks)}
    deps = [[idx[d] for d in t.deps if d in idx] for t in tasks]
    horizon = int(sum(max(m.duration_s for m in t.modes) for t in tasks)) + 1
    best = [math.inf]
    for assign in itertools.product(*[range(len(t.modes)) for t in tasks]):
        dur = [int(tasks[i].modes[a].duration_s) for i, a in enumerate(assign)]
        dem = [dict(tasks[i].modes[a].demand) for i, a in enumerate(assign)]
        if sum(dur) == 0:
            best[0] = 0
            continue
        usage = {r: [0] * horizon for r in caps}
        end = [None] * n

        def dfs(done: int, makespan: int, end=end, usage=usage, dur=dur, dem=dem) -> None:
            if makespan >= best[0]:
                return
            if done == (1 << n) - 1:
                best[0] = makespan
                return
            for i in range(n):
                if (done >> i) & 1 or any(end[j] is None for j in deps[i]):
                    continue
                t = max([end[j] for j in deps[i]], default=0)
                while any(usage[r][u] + k > caps[r] for r, k in dem[i].items() for u in range(t, t + dur[i])):
                    t += 1
                for r, k in dem[i].items():
                    for u in range(t, t + dur[i]):
                        usage[r][u] += k
                end[i] = t + dur[i]
                dfs(done | (1 << i), max(makespan, end[i]))
                end[i] = None
                for r, k in dem[i].items():
                    for u in range(t, t + dur[i]):
                        usage[r][u] -= k
        dfs(0, 0)
    return best[0]


def linear_extensions(n, deps) -> int:
    ways = {0: 1}
    for mask in range(1 << n):
        if mask not in ways:
            continue
        for i in range(n):
            if not (mask >> i) & 1 and all((mask >> j) & 1 for j in deps[i]):
                ways[mask | (1 << i)] = ways.get(mask | (1 << i), 0) + ways[mask]
    return ways[(1 << n) - 1]


BUDGET = 20000     # mode assignments x topological orders a brute-force instance may have


@st.composite
def instances(draw):
    caps = {"tensor": draw(st.integers(2, 4)), "vector": draw(st.integers(1, 2)), "link": 1}
    n = draw(st.integers(1, 8))
    deps = [[j for j in range(i) if draw(st.integers(0, 3)) == 0] for i in range(n)]
    tasks = []
    for i in range(n):
        if i and draw(st.integers(0, 4)) == 0:      # a twin of the previous task (symmetry)
            deps[i] = list(deps[i - 1])
            tasks.append([f"t{i}", list(tasks[-1][1]), deps[i], tasks[-1][3]])
            continue
        kind = draw(st.sampled_from(("tensor", "vector", "tensor+vector", "link")))
        modes = []
        for _ in range(draw(st.integers(2, 3))):
            d = draw(st.integers(1, 6))
            if kind == "link":
                dem = (("link", 1),)
            elif kind == "tensor+vector":
                dem = (("tensor", draw(st.integers(1, caps["tensor"]))),
                       ("vector", draw(st.integers(1, caps["vector"]))))
            else:
                dem = ((kind, draw(st.integers(1, caps[kind]))),)
            modes.append(Mode(float(d), dem))
        tasks.append([f"t{i}", modes, deps[i], kind])
    # keep the enumeration small: chain consecutive tasks until it fits the budget
    size = lambda: math.prod(len(t[1]) for t in tasks) * linear_extensions(n, deps)  # noqa: E731
    i = 0
    while size() > BUDGET and i < n - 1:
        if i not in deps[i + 1]:
            deps[i + 1].append(i)
        i += 1
    while size() > BUDGET:      # still too many mode combinations: drop a mode
        k = max(range(n), key=lambda j: len(tasks[j][1]))
        tasks[k][1].pop()
    return [Task(name, tuple(modes), tuple(f"t{j}" for j in deps[i]), kind)
            for i, (name, modes, _, kind) in enumerate(tasks)], caps


@settings(max_examples=120, deadline=None)
@given(instances())
def test_optimum_equals_brute_force(inst):
    tasks, caps = inst
    best = brute_force(tasks, caps)
    # as shipped, and the CP-SAT model alone (no mode dominance, no decomposition at ops every
    # other op precedes or follows, no exit when the list schedule meets the lower bound)
    for shortcuts in (True, False):
        S._SHORTCUTS = shortcuts
        try:
            s = solve(tasks, caps, time_limit_s=20)
        finally:
            S._SHORTCUTS = True
        assert check_task_schedule(s, tasks, caps) == []
        assert s.status == "OPTIMAL"
        assert s.makespan_s == best, shortcuts
        assert s.lower_bound_s == s.makespan_s and s.gap == 0.0   # integer durations: exact ticks


@settings(max_examples=80, deadline=None)
@given(instances(), st.booleans())
def test_bounds_bracket_the_optimum(inst, fractional):
    """The solver-free bounds the placement search prunes with: lower <= CP-SAT optimum (brute
    force) <= the solver's makespan <= list schedule, also with durations off the tick grid."""
    tasks, caps = inst
    if fractional:       # durations that are not whole ticks: rounding slack in both bounds
        tasks = [replace(t, modes=tuple(replace(m, duration_s=m.duration_s * 0.3170731) for m in t.modes))
                 for t in tasks]
    lower, upper = S.bounds(tasks, caps)
    s = solve(tasks, caps, time_limit_s=20)
    assert s.status == "OPTIMAL"
    assert lower <= s.makespan_s * (1 + 1e-12) and s.makespan_s <= upper * (1 + 1e-12)
    if not fractional:
        best = brute_force(tasks, caps)
        assert lower <= best <= s.makespan_s <= upper


@pytest.mark.parametrize("name", ["gpt3-175b", "llama2-7b", "bert-large"])
def test_layer_bounds_bracket_the_layer_schedules(name):
    c = chip("tpuv4")
    m = model_for(name, c)
    for tp, mbs, rec in ((1, 1, "none"), (8, 2, "full"), (4, 1, "selective")):
        if m.heads % tp:
            continue
        (fl, fh), (bl, bh) = S.layer_bounds(m, c, mbs, tp, tp > 1, "flash", rec, EFF)
        f, b = schedule_layer(m, c, mbs, tp, tp > 1, "flash", rec, EFF)
        assert fl <= f.makespan_s <= fh and bl <= b.makespan_s <= bh
        assert f.lower_bound_s >= fl * (1 - 1e-12) or f.status != "OPTIMAL"


def test_a_shared_backward_segment_is_solved_once(monkeypatch):
    """Full recompute's backward is the forward chain, then the same backward segment as without
    recompute: the second phase reuses the first one's solved segment. On a compiled chip the
    re-run chain stops where the backward stops reading (no down projection, no residual)."""
    c = chip("tpuv4")
    m = replace(model_for("gpt3-175b", c), recompute_rerun="whole")
    calls = []
    real = S._cpsat
    monkeypatch.setattr(S, "_cpsat", lambda *a, **k: calls.append(1) or real(*a, **k))
    _, none = schedule_layer(m, c, 1, 8, True, "flash", "none", EFF)
    n_none = len(calls)
    _, full = schedule_layer(m, c, 1, 8, True, "flash", "full", EFF)
    assert len(calls) == n_none and full.status == none.status == "OPTIMAL"
    f, _ = schedule_layer(m, c, 1, 8, True, "flash", "none", EFF)
    assert full.makespan_s == pytest.approx(f.makespan_s + none.makespan_s, rel=1e-9)
    _, needed = schedule_layer(replace(m, recompute_rerun=""), c, 1, 8, True, "flash", "full", EFF)
    assert needed.status == "OPTIMAL" and none.makespan_s < needed.makespan_s < full.makespan_s


def test_brute_force_on_a_hand_instance():
    # two units; A (2 units, 2s or 1 unit, 4s) and B (1 unit, 3s), then C after both (1 unit, 1s).
    # Best: A on 1 unit beside B: max(4, 3) + 1 = 5; A on 2 units then B: 2 + 3 + 1 = 6.
    tasks = [Task("A", (Mode(2.0, (("tensor", 2),)), Mode(4.0, (("tensor", 1),)))),
             Task("B", (Mode(3.0, (("tensor", 1),)),)),
             Task("C", (Mode(1.0, (("tensor", 1),)),), ("A", "B", "not-in-phase"))]
    caps = {"tensor": 2}
    assert brute_force(tasks, caps) == 5
    s = solve(tasks, caps)
    assert (s.status, s.makespan_s) == ("OPTIMAL", 5.0)
    assert s.op("A").demand == (("tensor", 1),) and s.op("C").start_s == 4.0
    assert check_task_schedule(s, tasks, caps) == []


def test_twins_with_different_successors_are_not_symmetric():
    # a and b are alike, but only b has a successor: b must go first (b, then a beside c)
    tasks = [Task("a", (Mode(2.0, (("tensor", 1),)),)), Task("b", (Mode(2.0, (("tensor", 1),)),)),
             Task("c", (Mode(5.0, (("vector", 1),)),), ("b",))]
    caps = {"tensor": 1, "vector": 1}
    assert brute_force(tasks, caps) == 7
    s = solve(tasks, caps)
    assert (s.status, s.makespan_s) == ("OPTIMAL", 7.0)
    assert check_task_schedule(s, tasks, caps) == []


# --- the checker catches faults --------------------------------------------------------------------
def _tpu_bwd():
    c = chip("tpuv4")
    m = model_for("gpt3-175b", c)
    _, bwd = phase_ops(m, tp=8, sp=True)
    kw = dict(groups={"tp": (8, 1)}, bytes_per_element=m.bytes_per_element)
    return c, m, bwd, kw, schedule_ops(bwd, c, m.precision, EFF, **kw)


def _with(s, name, **changes):
    return replace(s, ops=tuple(replace(e, **changes) if e.name == name else e for e in s.ops))


def test_checker_detects_injected_faults():
    c, m, bwd, kw, s = _tpu_bwd()
    check = lambda x: check_schedule(x, bwd, c, m.precision, EFF, **kw)  # noqa: E731
    assert check(s) == []
    # precedence: the data gradient starts before the op it depends on has finished
    dg = s.op("ffn_down.dgrad")
    dep = s.op(next(o for o in bwd if o.name == "ffn_down.dgrad").deps[0])
    bad = check(_with(s, "ffn_down.dgrad", start_s=dep.start_s))
    assert any("before its dep" in p for p in bad), bad
    # capacity: the weight gradient on all tensor units at the same time as the data gradient
    wg = s.op("ffn_down.wgrad")
    bad = check(_with(_with(s, "ffn_down.wgrad", start_s=dg.start_s, tensor_units=8,
                            duration_s=op_time(next(o for o in bwd if o.name == "ffn_down.wgrad"),
                                               c, m.precision, EFF, **kw)),
                      "ffn_down.dgrad", tensor_units=8,
                      duration_s=op_time(next(o for o in bwd if o.name == "ffn_down.dgrad"),
                                         c, m.precision, EFF, **kw)))
    assert any(p.startswith("tensor:") for p in bad), bad
    # wrong duration
    bad = check(_with(s, wg.name, duration_s=wg.duration_s * 0.8))
    assert any("op_time gives" in p for p in bad), bad
    # units a concurrent chip does not have, and a unit kind the op does not run on
    assert any("tensor units" in p for p in check(_with(s, wg.name, tensor_units=9)))
    assert any("cannot hold" in p for p in check(_with(s, wg.name, vector_units=1)))
    # missing, duplicated, unknown ops; a makespan that is not the last end
    assert any("not scheduled" in p for p in check(replace(s, ops=s.ops[1:])))
    assert any("more than once" in p for p in check(replace(s, ops=s.ops + s.ops[:1])))
    assert any("not an op" in p for p in check(replace(s, ops=s.ops + (replace(s.ops[0], name="x"),))))
    assert any("makespan" in p for p in check(replace(s, makespan_s=s.makespan_s * 1.01)))


def test_task_checker_detects_faults():
    tasks = [Task("a", (Mode(2.0, (("r", 1),)),)), Task("b", (Mode(3.0, (("r", 1),)),), ("a",)),
             Task("c", (Mode(1.0, (("r", 2),)), Mode(2.0, (("r", 1),))))]
    caps = {"r": 2}
    s = solve(tasks, caps)
    assert check_task_schedule(s, tasks, caps) == []
    assert any("before its dep" in p for p in check_task_schedule(_with(s, "b", start_s=0.0), tasks, caps))
    over = _with(_with(s, "c", start_s=0.0, mode=0, duration_s=1.0), "a", start_s=0.0)
    assert any(p.startswith("r:") for p in check_task_schedule(over, tasks, caps))
    assert any("takes" in p for p in check_task_schedule(_with(s, "a", duration_s=1.0), tasks, caps))


# --- every shipped workload on TPUv4 ---------------------------------------------------------------
def _min_work(ops, c, m, kw):
    """Least busy unit-seconds per resource over each op's modes / capacity (computed here)."""
    caps = S.chip_capacities(c)
    work = dict.fromkeys(caps, 0.0)
    for t in S.op_tasks(ops, c, m.precision, EFF, **kw):
        for r in caps:
            work[r] += min(md.duration_s * dict(md.demand).get(r, 0) for md in t.modes)
    return {r: w / caps[r] for r, w in work.items()}


# one hybrid of each structure: NVIDIA's other Nemotron-H and Nano sizes have the same three kinds of layer;
# DeepSeek-V2 and V2-Lite have DeepSeek-V3's (MLA, a dense first layer, shared and routed experts; the
# Lite's uncompressed query is one more GEMM) and would add 20 s of CP-SAT to the suite
SCHEDULED = [w for w in WORKLOADS
             if not w.startswith(("nemotron-h-", "nemotron-nano-", "deepseek-v2"))] + ["nemotron-h-8b"]


@pytest.mark.parametrize("name", SCHEDULED)
def test_shipped_workloads_on_tpuv4(name):
    """Each kind of layer the workload has (an MoE model's dense layers, a hybrid's Mamba-2,
    attention and MLP layers) is scheduled on its own, and its makespan is that kind's layer time."""
    c = chip("tpuv4")
    for _, m, moe in layer_mix(model_for(name, c)):
        _check_tpuv4_schedule(name, c, m, moe)


def _check_tpuv4_schedule(name, c, m, moe):
    kw = dict(groups=collective_groups(1, moe), bytes_per_element=m.bytes_per_element)
    seq = layer_time(m, c, 1, 1, False, "flash", "none", EFF, moe=moe)
    g = layer_graph(m, 1, 1, False, "flash", "none", moe)
    # the default work limit, the same answer on every machine and under any load (a wall-time limit
    # had left Llama 4 Scout's backward FEASIBLE at a 0.4 % gap on a loaded CI machine); the three
    # never proven stop at it, Qwen3-Next's backward at a 7.8 % gap, DeepSeek-V3's at 3.1 % and Llama 4
    # Scout's at 0.40 % (proven at 1.63 units until its L2 norms of q and k were costed, 2026-12-07)
    scheduled = schedule_layer(m, c, 1, 1, False, "flash", "none", EFF, moe=moe)
    for ops, s, phase in zip((g.fwd, g.bwd), scheduled, seq, strict=False):
        assert check_schedule(s, ops, c, m.precision, EFF, **kw) == []
        if name in NOT_PROVEN and phase is seq[1]:
            assert s.status in ("OPTIMAL", "FEASIBLE") and s.gap < 0.1, (name, s.status, s.gap)
        else:
            assert s.status == "OPTIMAL", (name, s.status, s.gap, s.note)
            assert s.gap < 1e-4
        assert s.makespan_s <= phase.total * (1 + 1e-9)           # never worse than one at a time
        assert s.makespan_s <= s.sequential_sum_s * (1 + 1e-12)
        assert s.makespan_s >= s.critical_path_s * (1 - 1e-12)
        for r, w in _min_work(ops, c, m, kw).items():
            assert s.makespan_s >= w * (1 - 1e-12), r
        assert s.lower_bound_s <= s.makespan_s
        assert all(0.0 <= u <= 1.0 + 1e-12 for u in s.utilisation.values())


def test_concurrency_pays_on_tpuv4_backward():
    # the weight gradients overlap the vector ops and the collectives: strictly below the sum
    c = chip("tpuv4")
    m = model_for("gpt3-175b", c)
    fwd, bwd = schedule_layer(m, c, 1, 8, True, "flash", "none", EFF)
    assert bwd.makespan_s < 0.95 * bwd.sequential_sum_s
    assert fwd.makespan_s <= fwd.sequential_sum_s


# --- GPUs: one kernel at a time ----------------------------------------------------------------------
@pytest.mark.parametrize("name, tp, attention, recompute", [
    ("gpt3-175b", 8, "flash", "full"), ("llama3-70b", 8, "standard", "selective"),
    ("bert-large", 1, "standard", "none"), ("mpt-7b", 2, "flash", "none")])
def test_gpu_makespan_is_the_sequential_sum(name, tp, attention, recompute):
    c = chip("a100-80gb")
    assert c.unit_sharing == "sequential"
    m = model_for(name, c)
    fwd, bwd = schedule_layer(m, c, 1, tp, tp > 1, attention, recompute, EFF)
    seq = layer_time(m, c, 1, tp, tp > 1, attention, recompute, EFF)
    kw = dict(groups={"tp": (tp, 1)}, bytes_per_element=m.bytes_per_element)
    for ops, s, p in zip(phase_ops(m, 1, tp, tp > 1, attention, recompute), (fwd, bwd), seq, strict=False):
        assert s.makespan_s == pytest.approx(p.total, rel=1e-6)
        assert s.status == "OPTIMAL" and s.gap == 0.0
        assert s.utilisation["chip"] == pytest.approx(1.0)
        assert all(e.tensor_units in (0, c.tensor.count) for e in s.ops)
        assert check_schedule(s, ops, c, m.precision, EFF, **kw) == []


def test_unit_sharing_resolution_and_yaml(tmp_path):
    import yaml
    assert chip("tpuv4").unit_sharing == "concurrent"
    assert chip("h100-sxm").unit_sharing == "sequential"
    data = yaml.safe_load((ROOT / "arch_configs" / "a100-80gb.yaml").read_text())
    data["unit_sharing"] = "concurrent"
    path = tmp_path / "a100-concurrent.yaml"
    path.write_text(yaml.safe_dump(data))
    c = load_chip(path)
    assert c.unit_sharing == "concurrent"
    m = model_for("llama3-8b", c)
    fwd, bwd = schedule_layer(m, c, 1, 1, False, "flash", "none", EFF)
    assert bwd.makespan_s <= bwd.sequential_sum_s
    data["unit_sharing"] = "overlapped"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="unit_sharing"):
        load_chip(path)


# --- modes ---------------------------------------------------------------------------------------
def test_unit_choices():
    assert S.unit_choices(8) == (8, 4, 2, 1)
    assert S.unit_choices(2) == (2, 1)
    assert S.unit_choices(6) == (6, 3, 2, 1)
    assert S.unit_choices(1) == (1,)
    assert S.unit_choices(108, (1.0, 0.5)) == (108, 54)


def test_fused_modes_hold_the_same_share_and_match_op_time():
    c = chip("tpuv4")
    m = model_for("gpt3-175b", c)
    op = next(o for o in phase_ops(m)[0] if o.unit == "tensor+vector")
    kw = dict(groups={"tp": (1, 1)}, bytes_per_element=2)
    modes = S.op_modes(op, c, m.precision, EFF, **kw)
    assert [(md.tensor_units, md.vector_units) for md in modes] == [(8, 2), (4, 1.0), (2, 0.5), (1, 0.25)]
    g = S.vector_slots(c)
    assert [dict(md.demand)["vector"] for md in modes] == [2 * g, g, g // 2, g // 4]
    for md in modes:   # k of n units: never slower than n/k times the whole chip (whole-wave shares)
        assert md.duration_s <= modes[0].duration_s * modes[0].tensor_units / md.tensor_units * (1 + 1e-9)
    for a, b in zip(modes, modes[1:], strict=False):     # fewer units are never faster
        assert b.duration_s >= a.duration_s * (1 - 1e-12)


# --- time limits never raise -------------------------------------------------------------------------
def _big_instance(n=60, seed=3):
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        d = rng.uniform(1.0, 9.0)
        deps = tuple(f"t{j}" for j in rng.sample(range(i), min(i, rng.randint(0, 2))))
        tasks.append(Task(f"t{i}", tuple(Mode(d * 8 / k * rng.uniform(0.9, 1.1), (("tensor", k),))
                                         for k in (8, 4, 2, 1)), deps))
    return tasks, {"tensor": 8}


@pytest.mark.parametrize("limit", [1e-9, 0.05])
def test_time_limit_returns_a_flagged_schedule(limit):
    """The wall-time limit, the safety net, stops the solver before its work limit: the schedule
    says so (its answer may differ on another machine)."""
    tasks, caps = _big_instance()
    s = solve(tasks, caps, work_limit=1e3, time_limit_s=limit)
    assert s.status in ("FEASIBLE", "HEURISTIC"), s.status
    assert 0.0 < s.gap < 1.0 and s.lower_bound_s < s.makespan_s
    assert check_task_schedule(s, tasks, caps) == []
    assert "wall-time limit" in s.note
    if limit < 1e-3:
        assert s.status == "HEURISTIC"


def test_a_wall_time_stop_is_flagged_when_cpsat_reports_less_time(monkeypatch):
    """On a loaded machine CP-SAT stopped by its wall-time limit reported a wall time short of
    it (CI, 2026-12-07: UNKNOWN at 0.0015 units of work, the note without the limit; under load it
    even stopped before the limit by the clock around the call): a stop short of its work is the
    wall-time limit's, so the note names the limit whatever CP-SAT reports."""
    from ortools.sat.python import cp_model

    class ShortClock(cp_model.CpSolver):
        @property
        def wall_time(self) -> float:
            return 0.0

    monkeypatch.setattr(cp_model, "CpSolver", ShortClock)
    tasks, caps = _big_instance()
    s = solve(tasks, caps, work_limit=1e3, time_limit_s=0.05)
    assert s.status in ("FEASIBLE", "HEURISTIC"), s.status
    assert check_task_schedule(s, tasks, caps) == []
    assert "wall-time limit" in s.note, s.note


@pytest.mark.parametrize("work", [1e-9, 0.05])
def test_work_limit_returns_a_flagged_schedule(work):
    """The work limit stops the solver with the best schedule it has and its bound, never an
    exception, and the schedule says how much work it spent (no wall-time note)."""
    tasks, caps = _big_instance()
    s = solve(tasks, caps, work_limit=work)
    assert s.status in ("FEASIBLE", "HEURISTIC"), s.status
    assert 0.0 < s.gap < 1.0 and s.lower_bound_s < s.makespan_s
    assert check_task_schedule(s, tasks, caps) == []
    assert "wall-time" not in s.note and s.work_limit == work
    # the first solve and the re-solve with the presolve, each at least 1e-3 (CP-SAT checks its limit
    # between steps, so a little over)
    assert 0 < s.work_s <= (1 + S.PRESOLVE_SHARE) * max(work, 1e-3) * 1.1 + 2e-3


def test_an_unproven_schedule_is_the_same_however_fast_the_solver_runs():
    """Stopped by its work limit, a solve not proven gives the same schedule, bound and status
    whether the machine is idle or busy (here: a second solve beside a thread that keeps a core
    busy with Python), which a wall-time limit did not."""
    c = chip("tpuv4")
    _, m, moe = layer_mix(model_for("deepseek-v3", c))[0]
    tasks = S.layer_tasks(m, c, 1, 1, False, "flash", "none", EFF, None, moe)[1]     # its backward
    caps = S.chip_capacities(c)
    first = solve(tasks, caps, work_limit=0.1, cache=False)
    assert first.status == "FEASIBLE" and first.gap > 0.01 and first.work_s >= 0.1
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(10_000))
    busy = [threading.Thread(target=spin) for _ in range(2)]
    for b in busy:
        b.start()
    try:
        again = solve(tasks, caps, work_limit=0.1, cache=False)
    finally:
        stop.set()
        for b in busy:
            b.join()
    key = lambda s: (s.status, s.makespan_s, s.lower_bound_s, s.work_s,   # noqa: E731
                     [(e.name, e.mode, e.start_s) for e in s.ops])
    assert key(again) == key(first)


# --- caching -------------------------------------------------------------------------------------------
def test_disk_cache_is_reused_and_corrupt_files_recomputed(tmp_path, monkeypatch):
    monkeypatch.setenv("PHAZE_CACHE_DIR", str(tmp_path))
    c, m, bwd, kw, first = _tpu_bwd()
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and not first.cached
    assert json.loads(files[0].read_text())["schedule"]["status"] == first.status

    def boom(*a, **k):
        raise AssertionError("solved again instead of reading the cache")
    real = S._solve
    monkeypatch.setattr(S, "_solve", boom)
    S.clear_memory_cache()                              # another process: only the file is left
    again = schedule_ops(bwd, c, m.precision, EFF, **kw)
    assert again.cached and again.makespan_s == first.makespan_s and again.ops == first.ops
    assert schedule_ops(bwd, c, m.precision, EFF, **kw).cached        # now from memory

    files[0].write_text('{"key": "truncated')            # corrupt: ignored and recomputed
    S.clear_memory_cache()
    monkeypatch.setattr(S, "_solve", real)
    fresh = schedule_ops(bwd, c, m.precision, EFF, **kw)
    assert not fresh.cached and fresh.makespan_s == first.makespan_s
    assert json.loads(files[0].read_text())["key"] == files[0].stem      # rewritten whole
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("corrupt", ["wrong type", "changed number, old checksum", "no checksum"])
def test_a_tampered_cache_entry_is_ignored_resolved_and_rewritten(tmp_path, monkeypatch, corrupt):
    """A cached makespan of the wrong type must not give a traceback, and a wrong number must not
    silently change results: the entry is checked (schema and checksum), solved again, rewritten."""
    monkeypatch.setenv("PHAZE_CACHE_DIR", str(tmp_path))
    c, m, bwd, kw, first = _tpu_bwd()
    (path,) = tmp_path.glob("*.json")
    rec = json.loads(path.read_text())
    if corrupt == "wrong type":
        rec["schedule"]["makespan_s"] = "fast"
        rec["sha256"] = S._checksum(rec["schedule"])       # even with a checksum that matches
    elif corrupt == "changed number, old checksum":
        rec["schedule"]["makespan_s"] *= 0.5
    else:
        rec.pop("sha256", None)
    path.write_text(json.dumps(rec))
    S.clear_memory_cache()
    again = schedule_ops(bwd, c, m.precision, EFF, **kw)
    assert not again.cached and again.makespan_s == first.makespan_s and again.ops == first.ops
    fixed = json.loads(path.read_text())
    assert fixed["schedule"]["makespan_s"] == first.makespan_s and fixed["sha256"] == S._checksum(fixed["schedule"])


def test_cache_key_separates_chips_and_shapes(tmp_path, monkeypatch):
    monkeypatch.setenv("PHAZE_CACHE_DIR", str(tmp_path))
    c = chip("tpuv4")
    m = model_for("bert-large", c)
    a = schedule_layer(m, c, 1, 1, False, "flash", "none", EFF)
    b = schedule_layer(m, c.with_units(tensor_count=4), 1, 1, False, "flash", "none", EFF)
    d = schedule_layer(m, c, 2, 1, False, "flash", "none", EFF)
    assert len({x[1].makespan_s for x in (a, b, d)}) == 3
    assert len(list(tmp_path.glob("*.json"))) == 6


# --- CLI -----------------------------------------------------------------------------------------------
def test_cli_schedule_text_json_and_gantt(tmp_path, capsys):
    png = tmp_path / "gantt.png"
    assert cli_main(["schedule", "--workload", "gpt3-175b", "--arch", "tpuv4", "--tp", "8",
                     "--gantt", str(png), "--ideal"]) == 0
    out = capsys.readouterr().out
    for word in ("forward", "backward", "makespan", "OPTIMAL", "lower bound", "gap", "ops", "solve time",
                 "utilisation tensor", "sequential sum", "critical path"):
        assert word in out
    assert png.stat().st_size > 10_000
    assert cli_main(["schedule", "--workload", "bert-large", "--arch", "a100-80gb", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["unit_sharing"] == "sequential"
    assert d["backward"]["makespan_s"] == pytest.approx(d["backward"]["sequential_sum_s"], rel=1e-6)


@pytest.mark.parametrize("argv, needle", [
    (["--workload", "no-such-model", "--arch", "tpuv4"], "no-such-model"),
    (["--workload", "gpt3-175b", "--arch", "tpuv4", "--tp", "5"], "--tp"),
    (["--workload", "gpt3-175b", "--arch", "tpuv4", "--tp", "0"], "--tp"),
    (["--workload", "gpt3-175b", "--arch", "tpuv4", "--time-limit", "0"], "--time-limit"),
    (["--workload", "gpt3-175b", "--arch", "tpuv4", "--work-limit", "nan"], "--work-limit"),
    (["--workload", "gpt3-175b", "--arch", "tpuv4", "--work-limit", "-1"], "--work-limit"),
    (["--workload", "gpt3-175b", "--arch", "tpuv4", "--attention", "sparse"], "--attention"),
    (["--workload", "gpt3-175b", "--arch", "tpuv4", "--gantt", "/no/such/dir/g.png"], "--gantt"),
])
def test_cli_schedule_bad_input_is_one_line_exit_2(argv, needle, capsys):
    try:
        code = cli_main(["schedule", *argv])
    except SystemExit as exc:      # argparse errors exit from inside the parser
        code = exc.code
    err = capsys.readouterr()
    assert code == 2 and err.out == ""
    assert len(err.err.strip().splitlines()) == 1 and needle in err.err and "Traceback" not in err.err


def test_gantt_pool_label_is_the_chips_unit_count_and_links_have_their_own_colour(tmp_path):
    """TPUv4 has 2 vector units, scheduled as 8 slots: the row says 2. A backward collective does
    not take the colour of the GEMM it serves. The same schedule gives a byte-identical SVG."""
    import subprocess
    import sys

    from phaze.arch import load_chip
    from phaze.schedule import bar_kind, op_kind
    chip = load_chip("tpuv4")
    out = [tmp_path / "a.svg", tmp_path / "b.svg"]
    for path in out:
        r = subprocess.run([sys.executable, "-m", "phaze.cli", "schedule", "--workload", "gpt3-175b", "--arch",
                            "tpuv4", "--tp", "8", "--gantt", str(path)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    svg = out[0].read_text()
    assert f"vector units ({chip.vector.count})" in svg and f"tensor units ({chip.tensor.count})" in svg
    assert chip.vector.count != chip.tensor.count and f"vector units ({chip.tensor.count})" not in svg
    assert out[0].read_bytes() == out[1].read_bytes()
    assert bar_kind("qkv.input_all_gather", "link") != bar_kind("qkv", "tensor") == op_kind("qkv.dgrad")
    assert bar_kind("ln1.all_gather.bwd", "link") == bar_kind("recompute.ln1.all_gather", "link") == "ln1.all_gather"
    assert "qkv.input_all_gather" in svg        # in the legend


def test_ctrl_c_stops_a_long_cp_sat_solve_at_once():
    """Python handles SIGINT only between bytecodes, so a CP-SAT solve used to run to its time limit
    (here 20 s) before Ctrl-C took effect: under phaze.search.interruptible the solve is stopped
    and raises KeyboardInterrupt within a second, and nothing is cached."""
    import os
    import signal
    import threading
    import time

    from phaze.search import interruptible
    rng = random.Random(0)
    tasks = []
    for i in range(80):          # no proof of optimality within 20 s
        modes = tuple(Mode(rng.uniform(1, 10) / k, (("a", k), ("b", rng.randint(1, 3)))) for k in (1, 2, 4))
        tasks.append(Task(f"t{i}", modes, tuple(f"t{j}" for j in rng.sample(range(i), min(i, rng.randint(0, 2))))))
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        with interruptible():
            solve(tasks, {"a": 4, "b": 4}, work_limit=1e3, time_limit_s=20)
    assert time.monotonic() - start < 3
    assert not S._STOPPED.is_set() and not S._ACTIVE


def _modes(unit, *ds):
    """Modes of ``ds`` seconds each holding one unit of ``unit`` (a tuple: several at once)."""
    demand = tuple((u, 1) for u in ((unit,) if isinstance(unit, str) else unit))
    return tuple(Mode(duration_s=d, demand=demand, tensor_units=0, vector_units=0) for d in ds)


def _task(name, unit, durations, deps=()):
    kind = unit if isinstance(unit, str) else "+".join(unit)
    return Task(name, _modes(unit, *durations), tuple(deps), kind)


TV = ("tensor", "vector")


@pytest.mark.parametrize("tasks,best", [
    # t1, then t2 and t3 beside t0, then t4: 6 s
    ([_task("t0", "link", (3.0, 2.0, 3.0)), _task("t1", "link", (3.0, 2.0, 3.0)),
      _task("t2", "tensor", (1.0, 1.0), ("t1",)), _task("t3", "tensor", (1.0, 1.0), ("t1",)),
      _task("t4", "link", (2.0, 3.0), ("t1", "t2", "t3"))], 6.0),
    # t4 on the link while t0 and t1 run, then t2 and t3 at 4 s each: 12 s
    ([_task("t0", "tensor", (1.0, 1.0)), _task("t1", TV, (1.0, 1.0), ("t0",)),
      _task("t2", "link", (4.0, 6.0, 5.0), ("t1",)), _task("t3", "link", (4.0, 6.0, 5.0), ("t2",)),
      _task("t4", "link", (4.0, 6.0, 5.0)), _task("t5", "tensor", (1.0, 1.0))], 12.0),
    # t3 on the link while t0 runs, then t1, then t2 beside t5: 7 s
    ([_task("t0", "tensor", (1.0, 1.0)), _task("t1", "link", (3.0, 3.0, 4.0), ("t0",)),
      _task("t2", "link", (2.0, 2.0, 3.0), ("t1",)), _task("t3", "link", (2.0, 2.0, 3.0)),
      _task("t4", "tensor", (1.0, 2.0)), _task("t5", "tensor", (1.0, 1.0), ("t0", "t1"))], 7.0),
])
def test_cpsat_does_not_mis_prove_small_instances(tasks, best):
    """Found by test_optimum_equals_brute_force and longer runs of it: ortools 9.15 with its
    presolve, on the CP-SAT model alone (no shortcuts), answered OPTIMAL at 7, 13 and 8 s with a
    lower bound to match (the first two given the list schedule as a solution hint, the third
    without one); each is right without the presolve's symmetry detection or probing."""
    caps = {"tensor": 2, "vector": 1, "link": 1}
    assert brute_force(tasks, caps) == best
    for shortcuts in (True, False):
        S._SHORTCUTS = shortcuts
        try:
            s = solve(tasks, caps, time_limit_s=20, cache=False)
        finally:
            S._SHORTCUTS = True
        assert s.status == "OPTIMAL" and s.makespan_s == best and s.lower_bound_s == best, shortcuts


def test_a_schedule_found_with_the_presolve_is_checked_and_keeps_the_proven_bound(monkeypatch):
    """A segment the solve without the presolve does not prove is solved again with it: its
    schedule is kept when valid and shorter, with the first solve's bound; an invalid one (an op
    before its dep) is dropped. The instance: t1 after t0 on the tensor units, t2 beside them, 6 s."""
    tasks = [_task("t0", "tensor", (2.0, 3.0)), _task("t1", "tensor", (2.0, 3.0), ("t0",)),
             _task("t2", "link", (4.0, 6.0))]
    caps = {"tensor": 1, "vector": 1, "link": 1}
    real, seen = S._cpsat, []

    def unproven(seg, deps, succ, D, dem, capacities, head, tail, lb, ub, *rest, presolve=False):
        res, walled = real(seg, deps, succ, D, dem, capacities, head, tail, lb, ub, *rest, presolve=presolve)
        seen.append(presolve)
        if presolve:
            return res, walled
        worse = {i: s + 1 for i, s in res[2].items()}     # every op a tick later: valid, not optimal
        return ("FEASIBLE", res[1], worse, lb), walled

    monkeypatch.setattr(S, "_SHORTCUTS", False)
    monkeypatch.setattr(S, "_cpsat", unproven)
    s = solve(tasks, caps, time_limit_s=20, cache=False)
    assert seen == [False, True] and s.makespan_s == 4.0 and check_task_schedule(s, tasks, caps) == []
    assert s.status == "OPTIMAL" and s.lower_bound_s == 4.0     # the first solve's bound: 4 s, met

    def invalid(*a, presolve=False, **k):
        res, walled = real(*a, presolve=presolve, **k)
        if presolve:                                          # t1 at t0's start: before its dep ends
            return (res[0], res[1], {i: 0 for i in res[2]}, res[3]), walled
        return ("FEASIBLE", res[1], {i: s + 1 for i, s in res[2].items()}, res[3]), walled

    monkeypatch.setattr(S, "_cpsat", invalid)
    s = solve(tasks, caps, time_limit_s=20, cache=False)
    # the first solve's schedule, a tick over its bound; the invalid one, shorter than the bound, would
    # have been called OPTIMAL
    assert s.status == "FEASIBLE" and check_task_schedule(s, tasks, caps) == []
