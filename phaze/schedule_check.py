"""Independent checker for operator schedules (the README's "Scheduling a layer on the chip's units").

Shares no code with the solver in :mod:`phaze.schedule`: it recomputes every op's duration from
:func:`phaze.cost.op_time` for the units the schedule says it ran on, derives what each op holds
from the chip's sharing rule, and sweeps the event times of every resource. An empty list means
the schedule is valid.
"""
from __future__ import annotations

import math
from dataclasses import replace

from .cost import IDEAL, Efficiency, op_time

_REL = 1e-9          # float tolerance, relative to the makespan


def check_schedule(schedule, ops, chip, precision: str, eff: Efficiency = IDEAL, *, groups: dict,
                   bytes_per_element: int) -> list[str]:
    """Problems with ``schedule`` for the phase ``ops`` on ``chip`` (empty list: valid).

    Checks: every op scheduled exactly once and nothing else; the unit kind and units each op
    ran on are allowed by the chip's sharing rule; each duration equals ``op_time`` for those
    units (within one tick); precedence (start >= end of every dep in the phase); the capacity
    of the tensor units, vector units and link (or, on a sequential chip, of the whole chip) at
    every event time; makespan = max end."""
    problems: list[str] = []
    entries = _entries(schedule, [o.name for o in ops], problems)
    nt, nv = chip.tensor.count, chip.vector.count
    sequential = (chip.unit_sharing or ("sequential" if chip.kind == "gpu" else "concurrent")) == "sequential"
    tick = float(getattr(schedule, "tick_s", 0.0) or 0.0)
    kw = dict(groups=groups, bytes_per_element=bytes_per_element)
    holds: dict[str, dict[str, float]] = {}
    for op in ops:
        e = entries.get(op.name)
        if e is None:
            continue
        if e.unit != op.unit:
            problems.append(f"{op.name}: scheduled as unit {e.unit!r}, the op runs on {op.unit!r}")
        kt, kv = e.tensor_units, e.vector_units
        want_t = op.unit in ("tensor", "tensor+vector")
        want_v = op.unit in ("vector", "tensor+vector")
        if sequential:
            if (kt, kv) != (nt if want_t else 0, nv if want_v else 0):
                problems.append(f"{op.name}: runs on {kt} tensor / {kv} vector units; a sequential "
                                f"chip runs every op on all of them")
        else:
            if want_t != (kt > 0) or want_v != (kv > 0):
                problems.append(f"{op.name}: a {op.unit} op cannot hold {kt} tensor / {kv} vector units")
            if kt < 0 or kt > nt or kt != int(kt):
                problems.append(f"{op.name}: {kt} tensor units (chip has {nt})")
            if kv < 0 or kv > nv or (op.unit == "vector" and kv != int(kv)):
                problems.append(f"{op.name}: {kv} vector units (chip has {nv})")
            if op.unit == "tensor+vector" and kt > 0 and abs(kv / nv - kt / nt) > 1e-9:
                problems.append(f"{op.name}: fused op holds {kt}/{nt} tensor but {kv}/{nv} vector units")
        # the duration the cost model gives for those units
        try:
            expect = _expected_time(op, chip, precision, eff, kw, kt, kv, sequential)
        except Exception as exc:  # noqa: BLE001 - a bad unit count makes the cost model fail
            problems.append(f"{op.name}: cannot cost it on {kt} tensor / {kv} vector units ({exc})")
            expect = e.duration_s
        if abs(e.duration_s - expect) > tick + _REL * max(expect, e.duration_s):
            problems.append(f"{op.name}: duration {e.duration_s:.9g} s, op_time gives {expect:.9g} s "
                            f"on {kt} tensor / {kv} vector units")
        if sequential:
            holds[op.name] = {"chip": 1.0}
        else:
            holds[op.name] = {"tensor": float(kt) if want_t else 0.0,
                              "vector": float(kv) if want_v else 0.0,
                              "link": 1.0 if op.unit == "link" else 0.0}
    capacities = {"chip": 1.0} if sequential else {"tensor": float(nt), "vector": float(nv), "link": 1.0}
    deps = {o.name: [d for d in o.deps if d in entries] for o in ops}
    problems += _timing(schedule, entries, deps, holds, capacities)
    return problems


def check_task_schedule(schedule, tasks, capacities: dict) -> list[str]:
    """Problems with ``schedule`` for abstract tasks (``phaze.schedule.Task``: name, modes with
    duration and demand, deps) on ``capacities``: every task once, its duration and demand those
    of the mode it names, precedence, capacity at every event time, makespan = max end."""
    problems: list[str] = []
    entries = _entries(schedule, [t.name for t in tasks], problems)
    holds = {}
    tick = float(getattr(schedule, "tick_s", 0.0) or 0.0)
    for t in tasks:
        e = entries.get(t.name)
        if e is None:
            continue
        if not 0 <= e.mode < len(t.modes):
            problems.append(f"{t.name}: mode {e.mode} does not exist ({len(t.modes)} modes)")
            continue
        mode = t.modes[e.mode]
        if abs(e.duration_s - mode.duration_s) > tick + _REL * mode.duration_s:
            problems.append(f"{t.name}: duration {e.duration_s:.9g}, mode {e.mode} takes {mode.duration_s:.9g}")
        holds[t.name] = {r: float(k) for r, k in mode.demand}
        for r in holds[t.name]:
            if r not in capacities:
                problems.append(f"{t.name}: holds {r!r}, which has no capacity")
    deps = {t.name: [d for d in t.deps if d in entries] for t in tasks}
    problems += _timing(schedule, entries, deps, holds, {r: float(c) for r, c in capacities.items()})
    return problems


def _entries(schedule, names, problems) -> dict:
    seen: dict = {}
    wanted = set(names)
    for e in schedule.ops:
        if e.name in seen:
            problems.append(f"{e.name}: scheduled more than once")
        elif e.name not in wanted:
            problems.append(f"{e.name}: not an op of this phase")
        else:
            seen[e.name] = e
        if not (math.isfinite(e.start_s) and math.isfinite(e.duration_s)) or e.start_s < 0 or e.duration_s < 0:
            problems.append(f"{e.name}: bad start {e.start_s!r} or duration {e.duration_s!r}")
    for n in names:
        if n not in seen:
            problems.append(f"{n}: not scheduled")
    return seen


def _expected_time(op, chip, precision, eff, kw, kt, kv, sequential) -> float:
    nt, nv = chip.tensor.count, chip.vector.count
    if op.unit == "link" or sequential:
        return op_time(op, chip, precision, eff, **kw)
    if op.unit == "tensor":
        return op_time(op, chip, precision, eff, units=int(kt), **kw)
    if op.unit == "vector":
        return op_time(op, chip, precision, eff, units=kv, **kw)
    # fused: op_time(units=k) puts the GEMMs on k tensor units and the softmax on k vector units;
    # the softmax time is its work over the units, so scaling that work by kt / kv puts it on kv
    if kt == nt and kv == nv:
        return op_time(op, chip, precision, eff, **kw)
    f = kt / kv
    return op_time(replace(op, vector_flops=op.vector_flops * f, special=op.special * f), chip, precision, eff,
                   units=int(kt), **kw)


def _timing(schedule, entries, deps, holds, capacities) -> list[str]:
    problems = []
    ends = {n: e.start_s + e.duration_s for n, e in entries.items()}
    makespan = max(ends.values(), default=0.0)
    eps = _REL * max(makespan, 1e-300)
    for n, ds in deps.items():
        if n not in entries:
            continue
        for d in ds:
            if entries[n].start_s < ends[d] - eps:
                problems.append(f"{n}: starts at {entries[n].start_s:.9g} s, before its dep {d} ends "
                                f"({ends[d]:.9g} s)")
    # capacity: usage only rises when an op starts, so check at every start time (ops ending
    # by then, within float tolerance, no longer count)
    for r, cap in capacities.items():
        users = [(entries[n].start_s, ends[n], h.get(r, 0.0)) for n, h in holds.items()
                 if h.get(r, 0.0) > 0 and n in entries and ends[n] - entries[n].start_s > eps]
        for t, _, _ in users:
            used = sum(k for s, e, k in users if s <= t + eps and e > t + eps)
            if used > cap + 1e-9 * cap:
                who = sorted(n for n, h in holds.items() if h.get(r, 0) > 0 and n in entries
                             and entries[n].start_s <= t + eps and ends[n] > t + eps)
                problems.append(f"{r}: {used:g} units in use at {t:.9g} s, capacity {cap:g} "
                                f"({', '.join(who)})")
                break
    if abs(schedule.makespan_s - makespan) > eps + 1e-15:
        problems.append(f"makespan {schedule.makespan_s:.9g} s, but the last op ends at {makespan:.9g} s")
    if schedule.lower_bound_s > schedule.makespan_s * (1 + 1e-12):
        problems.append(f"lower bound {schedule.lower_bound_s:.9g} s above the makespan")
    return problems
