"""Optimal operator schedule of one layer phase on one chip.

One phase (a layer's forward ops, or its backward ops) is a DAG. Each op picks one *mode* (how
many tensor / vector units it runs on; the cost model gives its time on that many) and a start
time; tensor units, vector units and the chip's links are cumulative resources; the objective is
the makespan. :func:`solve` does it for abstract tasks, :func:`schedule_ops` for a phase's ops on
a chip, :func:`schedule_layer` for a layer (forward, backward).

Formulation (CP-SAT, OR-Tools): one optional fixed-size interval per (op, mode) sharing the op's
start variable, exactly one mode per op, ``AddCumulative`` per resource (``AddNoOverlap`` when
every holder takes the whole resource), ``start >= end`` of each dep, makespan ``>=`` the end of
every sink, minimise the makespan. What makes it prove optimality in well under a second on one
core (all exact: each keeps at least one optimal schedule):

- mode dominance: a mode goes when another one is no longer and holds no more units of every
  resource that an op able to run beside this one (neither ancestor nor descendant) may use;
- decomposition: an op that every other op precedes or follows runs alone (fastest mode) and
  splits the phase into segments solved independently, one after another (a forward chain, or a
  recompute prefix, needs no solver at all);
- a list schedule (ops in topological order, each in its fastest mode at the earliest feasible
  time) is the upper bound of every domain (not a solution hint); earliest / latest starts come
  from the longest paths; when it meets the lower bound it is optimal and no model is built;
- lower bounds on the makespan: the critical path (fastest modes) and, per resource, the least
  energy (duration x units) of the ops that cannot start before ``h`` and leave ``q`` of
  dependent work after them, over ``[h, makespan - q]`` (``h = q = 0``: total work / capacity);
- active starts: some optimal schedule starts every op at 0 or when a dep or an op sharing one
  of its resources ends, so each start is tied to one such end (the search picks whom an op
  follows instead of a time value: the key to fine time ticks);
- precedence energy: on each resource the ops between two ops, before one, or after one fit
  their mode-dependent energy into the time between them;
- identical interchangeable ops start in order (symmetry);
- propagation-only search (no LP), timetable edge finding and the overload checker in the
  cumulative constraints; ``num_workers=1`` (deterministic) by default; no CP-SAT presolve and no
  solution hint: with them ortools 9.15 proved wrong optima on three small instances (its
  symmetry detection, its probing, a hint), which ``tests/test_schedule.py`` keeps. A segment not
  proven within its work limit is solved again with the presolve for a quarter of that work more
  (``PRESOLVE_SHARE``): a shorter schedule it finds is checked (deps, capacities) and kept, its
  bound never is (the first solve's stands, and proves the schedule optimal only when they meet).

Time: integer ticks of ``tick_s = 2**e`` seconds, per segment (below), the power of two that puts the
sum of the segment's ops' fastest durations in [2**20, 2**21) ticks (``Schedule.tick_s`` reports the
phase's, the coarsest); a segment met again in another phase (the backward after a full-recompute
prefix) is the same problem and its proven optimum is reused (``_segments``); a tick is ~1e-6 of
the segment and the horizon stays below 2**21 ticks. Durations are rounded UP to whole ticks
(exact in floating point: the tick is a power of two), so a tick schedule is valid in real time.
The reported schedule is re-timed in seconds:
the solver's modes, its start order as the priority of a serial schedule-generation pass with
the real durations; no op starts later than in the tick solution, so the real makespan is at
most the tick one. The lower bound in seconds is the largest of the analytic bounds and, per
segment, the solver's proven tick bound ``B`` less ``n + 1`` ticks of rounding slack when some
duration is not a whole number of ticks (shifting the k-th op of any real schedule by k ticks
makes a valid tick schedule, so ``(B - n - 1) * tick`` bounds the real optimum); a proven
optimum therefore shows a gap of at most ~(n + 1) * 1e-6.

Chip sharing (``Chip.unit_sharing``): ``sequential`` chips (GPUs: every kernel runs over all
SMs, one after another, and the vector units are the same SMs) give every op one mode, the whole
chip, holding one shared resource of capacity 1, so the optimum is the sequential sum of the op
times as :func:`phaze.stage.layer_time` adds them. ``concurrent`` chips (accelerators) have
independent tensor and vector pools and a link (capacity 1) for collectives: tensor ops run on
``k`` of the ``n_t`` tensor units, ``k`` in ``round(n_t * share)`` for the shares
:data:`DEFAULT_SHARES` (all, half, a quarter, an eighth); vector ops likewise on the vector
units; fused attention holds the same share of both (the vector pool is counted in slots of a
fraction of a unit so that share is whole, :func:`vector_slots`); collectives hold the link.
HBM bandwidth is not a scheduled resource: concurrent ops each get the bandwidth the cost model
gives them alone.

Results are cached per key (every task's name, deps and modes, the capacities) in memory and on
disk: one small JSON file per key under ``$PHAZE_CACHE_DIR`` (default ``~/.cache/phaze/schedules``;
``off`` disables it), written atomically. Each entry carries a checksum of its schedule and is
checked against a schema before it is trusted: a corrupt or hand-edited entry is ignored, solved
again and rewritten.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

from .arch import Chip
from .configio import ConfigError, divisors
from .cost import IDEAL, Efficiency, op_time
from .graph import Op, collective_groups, layer_graph
from .plan import ATTENTION, RECOMPUTE, RECOMPUTE_MODULES, is_layer_recompute

DEFAULT_SHARES = (1.0, 0.5, 0.25, 0.125)   # shares of a unit pool an op may run on
TICK_RESOLUTION_EXP = 20                    # fastest-mode sum of a phase spans [2**20, 2**21) ticks
FORMULATION = 2                             # bump when results change meaning (invalidates caches)
STATUSES = ("OPTIMAL", "FEASIBLE", "HEURISTIC")
SOLVER_PARAMETERS = {                       # CP-SAT parameters besides limits, workers, seed
    "use_timetable_edge_finding_in_cumulative": True,
    "use_overload_checker_in_cumulative": True,
    "linearization_level": 0,               # propagation only: the LP costs more than it prunes here
    # no presolve for a proof: ortools 9.15's proved wrong optima on three small instances
    # (tests/test_schedule.py, test_cpsat_does_not_mis_prove_small_instances), through its symmetry
    # detection, its probing or a solution hint, and called a feasible one infeasible; a segment
    # not proven within its work is solved again with it, for a schedule only (_solve_segment)
    "cp_model_presolve": False,
}
PRESOLVE_SHARE = 0.25   # the work that second solve may do beyond the limit, as a share of the segment's
# A phase's solve stops at a budget of CP-SAT's deterministic time (its own count of work done, the
# same on every machine and under any load), so one instance gets the same schedule, status and bound
# everywhere; a limit of wall time once made a proof depend on the machine's load. On one core of the
# 2-core development machine a unit took 4.2 to 5.6 s on the hardest shipped layers (the backward of
# Llama 4 Scout, proven at 1.63 units, and of Qwen3-Next and DeepSeek-V3 on TPUv4, which stop at the
# limit 7.8 % and 3.1 % from their bounds): 2 units cost about what the former 10 s limit did there.
WORK_LIMIT = 2.0
# A wall-time limit stays as a safety net (a solve it stops reports so: a machine-dependent answer);
# at 60 s it binds only on a machine six times slower than that one.
TIME_LIMIT_S = 60.0
_MEMORY_CACHE_SIZE = 4096
DISK_CACHE_MAX_FILES = 20000    # the disk cache keeps the most recently written schedules (PHAZE_CACHE_MAX_FILES)
_DISK_PRUNE_EVERY = 256         # writes between two checks of the disk cache's size
_SHORTCUTS = True          # tests turn off dominance, decomposition and the list-schedule exit


# --- data ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mode:
    """One way to run a task: its duration and the units it holds on each scheduling resource
    for that whole time. ``tensor_units`` / ``vector_units`` say what the op runs on (reporting,
    checking); ``demand`` is what the scheduler reserves."""

    duration_s: float
    demand: tuple[tuple[str, int], ...]
    tensor_units: int = 0
    vector_units: float = 0     # fused ops may hold a fraction of a vector unit


@dataclass(frozen=True)
class Task:
    """An abstract scheduling task; ``deps`` naming tasks outside the list are ignored."""

    name: str
    modes: tuple[Mode, ...]
    deps: tuple[str, ...] = ()
    unit: str = ""


@dataclass(frozen=True)
class ScheduledOp:
    name: str
    unit: str                 # tensor | vector | tensor+vector | link (or the task's unit)
    mode: int                 # index into the task's modes
    tensor_units: int
    vector_units: float
    start_s: float
    duration_s: float
    demand: tuple[tuple[str, int], ...] = ()

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class Schedule:
    """The schedule of one phase. ``status``: OPTIMAL (proven, in the tick model), FEASIBLE (the
    solver's best at its work limit) or HEURISTIC (the list schedule: the solver found nothing
    within it). ``gap`` = (makespan - lower bound) / makespan. ``utilisation``: busy unit-seconds /
    (capacity x makespan) per resource. ``work_s``: CP-SAT's deterministic time spent, the re-solve
    with its presolve included (``work_limit`` the budget of the first solves); ``note`` says when
    the wall-time limit stopped a solve first."""

    makespan_s: float
    status: str
    lower_bound_s: float
    gap: float
    solve_time_s: float
    ops: tuple[ScheduledOp, ...]
    utilisation: dict
    sequential_sum_s: float      # every op in its fastest mode, one after another
    critical_path_s: float       # longest dependency chain, fastest modes
    work_bound_s: float          # max over resources of total work / capacity
    capacities: dict
    tick_s: float
    time_limit_s: float
    work_limit: float = WORK_LIMIT
    work_s: float = 0.0
    note: str = ""
    cached: bool = False

    def op(self, name: str) -> ScheduledOp:
        for e in self.ops:
            if e.name == name:
                return e
        raise KeyError(name)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ops"] = [dict(asdict(e), demand=[list(x) for x in e.demand]) for e in self.ops]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Schedule:
        d = dict(d)
        d["ops"] = tuple(ScheduledOp(**dict(e, demand=tuple((str(r), int(k)) for r, k in e["demand"])))
                         for e in d["ops"])
        s = cls(**d)
        if s.status not in STATUSES or not isinstance(s.utilisation, dict):
            raise ValueError("bad schedule record")
        return s


# --- list scheduling (serial schedule generation) ---------------------------------------------
def _sgs(order, dur, dem, deps, capacities) -> dict:
    """Serial schedule generation: take ops in ``order`` and start each at the earliest time at
    which its deps have ended and its resources are free for its whole duration, given the ops
    placed before it (gaps may be filled). ``dur``, ``dem``, ``deps`` are indexed by op id (lists
    or dicts); works on ints (ticks) and floats (seconds). Returns {op: start}."""
    start = {}
    placed: dict[str, list] = {r: [] for r in capacities}   # (start, end, demand)
    for i in order:
        est = max((start[j] + dur[j] for j in deps[i]), default=0)
        d = dur[i]
        need = [(r, k) for r, k in dem[i].items() if k > 0]
        if d <= 0 or not need:
            start[i] = est
            continue
        live = {r: [iv for iv in placed[r] if iv[1] > est] for r, _ in need}
        t = None
        for c in sorted({est} | {iv[1] for r, _ in need for iv in live[r]}):
            ok = True
            for r, k in need:
                ivs = [iv for iv in live[r] if iv[0] < c + d and iv[1] > c]
                if not ivs:
                    continue
                for p in [c] + [iv[0] for iv in ivs if iv[0] > c]:
                    if sum(iv[2] for iv in ivs if iv[0] <= p < iv[1]) + k > capacities[r]:
                        ok = False
                        break
                if not ok:
                    break
            if ok:
                t = c
                break
        start[i] = t
        for r, k in need:
            placed[r].append((t, t + d, k))
    return start


def _topo_order(n: int, deps: Sequence[Sequence[int]]) -> list[int]:
    succ = [[] for _ in range(n)]
    indeg = [len(d) for d in deps]
    for i, ds in enumerate(deps):
        for j in ds:
            succ[j].append(i)
    ready = [i for i in range(n) if indeg[i] == 0]
    out = []
    while ready:
        ready.sort()
        i = ready.pop(0)
        out.append(i)
        for k in succ[i]:
            indeg[k] -= 1
            if indeg[k] == 0:
                ready.append(k)
    if len(out) != n:
        raise ValueError("the task dependencies contain a cycle")
    return out


# --- caching ------------------------------------------------------------------------------------
def _code_version() -> str:
    """A hash of the code a cached schedule depends on (scheduler, cost model, graphs): the
    cache key includes it, so a schedule from other code is never served."""
    h = hashlib.sha256(str(FORMULATION).encode())
    for name in ("schedule.py", "cost.py", "graph.py"):
        try:
            h.update((Path(__file__).parent / name).read_bytes())
        except OSError:
            h.update(name.encode())
    return h.hexdigest()[:16]


CODE_VERSION = _code_version()
_writes = [0]


def prune_disk_cache(d: Path, cap: int | None = None) -> None:
    """Keep at most ``cap`` records in ``d`` (default ``PHAZE_CACHE_MAX_FILES``, else
    :data:`DISK_CACHE_MAX_FILES`, schedules): drop the least recently written ones, down to 90 %
    of the cap."""
    try:
        cap = int(os.environ.get("PHAZE_CACHE_MAX_FILES", DISK_CACHE_MAX_FILES)) if cap is None else cap
        files = list(d.glob("*.json"))
        if len(files) <= cap:
            return
        dated = sorted(files, key=lambda f: f.stat().st_mtime)
        for f in dated[:len(files) - int(cap * 0.9)]:
            try:
                f.unlink()
            except OSError:
                pass
    except (OSError, ValueError):
        pass


_memory: OrderedDict[str, Schedule] = OrderedDict()


def cache_dir() -> Path | None:
    """Where schedules are cached on disk (``$PHAZE_CACHE_DIR``, default
    ``~/.cache/phaze/schedules``); None when ``PHAZE_CACHE_DIR`` is ``off``/``none``/``0``."""
    env = os.environ.get("PHAZE_CACHE_DIR")
    if env is not None and env.strip().lower() in ("off", "none", "0", "false"):
        return None
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "phaze" / "schedules"


def clear_memory_cache() -> None:
    """Forget every schedule, segment, bound and task list held in memory (not the disk cache)."""
    _memory.clear()
    _segments.clear()
    for f in (layer_tasks, layer_bounds, _bounds_of, _modes_of):
        f.cache_clear()


def _key(tasks: Sequence[Task], capacities: dict, unit_counts: dict | None, tick_s: float | None) -> str:
    names = {t.name for t in tasks}
    spec = {
        "v": FORMULATION,
        "code": CODE_VERSION,
        "res": TICK_RESOLUTION_EXP,
        "cap": sorted((str(r), int(k)) for r, k in capacities.items()),
        "units": sorted((str(r), int(k)) for r, k in (unit_counts or {}).items()),
        "tick": None if tick_s is None else float(tick_s).hex(),
        "tasks": [[t.name, t.unit, [d for d in t.deps if d in names],
                   [[float(m.duration_s).hex(), sorted([str(r), int(k)] for r, k in m.demand),
                     m.tensor_units, m.vector_units] for m in t.modes]] for t in tasks],
    }
    return hashlib.sha256(json.dumps(spec, separators=(",", ":")).encode()).hexdigest()[:40]


def _reusable(s: Schedule, work_limit: float, time_limit_s: float) -> bool:
    return s.status == "OPTIMAL" or (s.work_limit >= work_limit and s.time_limit_s >= time_limit_s)


def _checksum(schedule: dict) -> str:
    """SHA-256 of a schedule record's canonical JSON: a changed number no longer matches."""
    return hashlib.sha256(json.dumps(schedule, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _number(x, low: float = 0.0) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= low


_NUMBERS = ("makespan_s", "lower_bound_s", "gap", "solve_time_s", "sequential_sum_s", "critical_path_s",
            "work_bound_s", "tick_s", "time_limit_s", "work_limit", "work_s")


def _schema_ok(d) -> bool:
    """Whether a cached schedule record has every field, each of the type and range it must have
    (finite non-negative times, known status, ops with names, units, modes and demands)."""
    if not isinstance(d, dict) or not all(_number(d.get(k)) for k in _NUMBERS):
        return False
    if d.get("status") not in STATUSES or not isinstance(d.get("note", ""), str):
        return False
    if not isinstance(d.get("utilisation"), dict) or not isinstance(d.get("capacities"), dict):
        return False
    if not all(_number(v) for v in (*d["utilisation"].values(), *d["capacities"].values())):
        return False
    ops = d.get("ops")
    if not isinstance(ops, list):
        return False
    for e in ops:
        if not (isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("unit"), str)
                and isinstance(e.get("mode"), int) and isinstance(e.get("tensor_units"), int)
                and all(_number(e.get(k)) for k in ("vector_units", "start_s", "duration_s"))
                and isinstance(e.get("demand"), list)
                and all(isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], int)
                        for x in e["demand"])):
            return False
    return True


def _cache_get(key: str, work_limit: float, time_limit_s: float) -> Schedule | None:
    s = _memory.get(key)
    if s is not None and _reusable(s, work_limit, time_limit_s):
        _memory.move_to_end(key)
        return replace(s, cached=True)
    d = cache_dir()
    if d is None:
        return None
    path = d / f"{key}.json"
    try:
        rec = json.loads(path.read_text())
        if rec.get("key") != key or rec.get("formulation") != FORMULATION or rec.get("code") != CODE_VERSION:
            return None
        if not _schema_ok(rec.get("schedule")) or rec.get("sha256") != _checksum(rec["schedule"]):
            return None  # hand-edited or damaged: solve again (and overwrite)
        s = Schedule.from_dict(rec["schedule"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None      # missing or corrupt: recompute (and overwrite)
    if not _reusable(s, work_limit, time_limit_s):
        return None
    _memory_put(key, replace(s, cached=False))
    return replace(s, cached=True)


def _memory_put(key: str, s: Schedule) -> None:
    _memory[key] = s
    _memory.move_to_end(key)
    while len(_memory) > _MEMORY_CACHE_SIZE:
        _memory.popitem(last=False)


def _cache_put(key: str, s: Schedule) -> None:
    _memory_put(key, s)
    d = cache_dir()
    if d is None:
        return
    schedule = s.to_dict()
    rec = {"key": key, "formulation": FORMULATION, "code": CODE_VERSION, "schedule": schedule,
           "sha256": _checksum(schedule)}
    try:
        if _writes[0] % _DISK_PRUNE_EVERY == 0:
            prune_disk_cache(d)
        _writes[0] += 1
        write_record(d, key, rec)
    except OSError:
        pass    # the disk cache is best effort


def write_record(d: Path, key: str, rec: dict) -> None:
    """Write ``rec`` as ``d/<key>.json`` atomically (a reader, another worker, never sees half a
    file); OSError when it cannot."""
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{key}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(rec, fh, separators=(",", ":"))
        os.replace(tmp, d / f"{key}.json")
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# --- the solver ---------------------------------------------------------------------------------
def solve(tasks: Sequence[Task], capacities: dict, *, work_limit: float = WORK_LIMIT,
          time_limit_s: float = TIME_LIMIT_S, num_workers: int = 1, tick_s: float | None = None,
          cache: bool = False, unit_counts: dict | None = None) -> Schedule:
    """Minimum-makespan schedule of abstract ``tasks`` on cumulative ``capacities``
    (resource -> units). ``unit_counts`` (e.g. ``{"tensor": 8, "vector": 2}``) adds the
    utilisation of physical unit pools measured by the modes' ``tensor_units`` / ``vector_units``
    (``link``: time of link tasks). Never raises on a time-out: the best schedule found is
    returned, flagged; raises ValueError on malformed tasks (cycle, duplicate name, no mode that
    fits the capacities). ``work_limit``: CP-SAT deterministic time for the phase (:data:`WORK_LIMIT`);
    ``time_limit_s``: wall time, a safety net. With one worker (the default) the answer is the same
    on every machine unless the wall time stops it first (its note says so)."""
    if cache:
        key = _key(tasks, capacities, unit_counts, tick_s)
        hit = _cache_get(key, work_limit, time_limit_s)
        if hit is not None:
            return hit
    s = _solve(tasks, capacities, work_limit, time_limit_s, num_workers, tick_s, unit_counts)
    if cache:
        _cache_put(key, s)
    return s


class _Prepared:
    """What :func:`_solve` and :func:`bounds` share: the tasks indexed, modes that fit and are not
    dominated, fastest modes, and the phase cut into pieces (cut ops and segments)."""

    __slots__ = ("n", "order", "deps", "succ", "modes", "dem", "dur", "fast", "fd", "seq_sum", "tick_s",
                 "cuts", "segments", "fixed_tick")


def _prepare(tasks, capacities, tick_s) -> _Prepared:
    capacities = {str(r): int(k) for r, k in capacities.items()}
    n = len(tasks)
    index = {}
    for i, t in enumerate(tasks):
        if t.name in index:
            raise ValueError(f"duplicate task name {t.name!r}")
        index[t.name] = i
    deps = [sorted({index[d] for d in t.deps if d in index}) for t in tasks]
    order = _topo_order(n, deps)
    succ = [[] for _ in range(n)]
    for i, ds in enumerate(deps):
        for j in ds:
            succ[j].append(i)

    desc = [0] * n                   # bitmasks of descendants / ancestors
    for i in reversed(order):
        for k in succ[i]:
            desc[i] |= desc[k] | (1 << k)
    anc = [0] * n
    for i in order:
        for j in deps[i]:
            anc[i] |= anc[j] | (1 << j)

    # modes: drop those that do not fit the capacities
    modes: list[list[int]] = []      # per task: indices into task.modes
    dem: list[list[dict]] = []
    for t in tasks:
        ok = []
        for m, mode in enumerate(t.modes):
            dm = {r: int(k) for r, k in mode.demand if int(k) > 0}
            if any(r not in capacities or k > capacities[r] for r, k in dm.items()):
                continue
            if not (mode.duration_s >= 0 and math.isfinite(mode.duration_s)):
                raise ValueError(f"task {t.name!r}: bad duration {mode.duration_s!r}")
            ok.append((m, dm))
        if not ok:
            raise ValueError(f"task {t.name!r}: no mode fits the capacities {capacities}")
        modes.append([m for m, _ in ok])
        dem.append([dm for _, dm in ok])
    # ... and dominated ones: mode a of op i goes when another mode is no longer and holds no
    # more units of every resource that some op able to run beside i (neither ancestor nor
    # descendant) may use: switching i to it keeps any schedule valid and no longer
    uses = [set().union(*[set(x) for x in dem[i]]) for i in range(n)]
    for i in range(n if _SHORTCUTS else 0):
        if len(modes[i]) == 1:
            continue
        free = ~(anc[i] | desc[i] | (1 << i))
        contested = set().union(*[uses[j] for j in range(n) if (free >> j) & 1])
        ds = [tasks[i].modes[m].duration_s for m in modes[i]]
        proj = [tuple(dem[i][a].get(r, 0) for r in sorted(contested)) for a in range(len(modes[i]))]
        rank = [(ds[a], proj[a], sum(dem[i][a].values()), a) for a in range(len(modes[i]))]
        keep = [a for a in range(len(modes[i]))
                if not any(b != a and ds[b] <= ds[a] and all(x <= y for x, y in zip(proj[b], proj[a], strict=False))
                           and (ds[b] < ds[a] or proj[b] != proj[a] or rank[b] < rank[a])
                           for b in range(len(modes[i])))]
        modes[i] = [modes[i][a] for a in keep]
        dem[i] = [dem[i][a] for a in keep]
    dur = [[tasks[i].modes[m].duration_s for m in modes[i]] for i in range(n)]
    fast = [min(range(len(modes[i])), key=lambda a: (dur[i][a], sum(dem[i][a].values()), a))
            for i in range(n)]
    fd = [dur[i][fast[i]] for i in range(n)]

    P = _Prepared()
    P.fixed_tick = tick_s
    P.seq_sum = sum(fd)
    P.tick_s = _tick_for(P.seq_sum) if tick_s is None else tick_s

    # cut ops (every other op is an ancestor or a descendant) run alone in their fastest mode
    # and split the phase into segments that are scheduled independently, one after another
    everyone = (1 << n) - 1
    cuts = [i for i in order if (anc[i] | desc[i] | (1 << i)) == everyone and _SHORTCUTS]
    cutset = set(cuts)
    segments, prev = [], 0
    for c in cuts + [None]:
        upto = anc[c] if c is not None else everyone
        seg = [i for i in order if (upto >> i) & 1 and (prev >> i) & 1 == 0 and i not in cutset]
        if c is not None:
            prev |= anc[c] | (1 << c)
        if seg:
            segments.append(seg)
    P.n, P.order, P.deps, P.succ, P.modes, P.dem, P.dur, P.fast, P.fd = (n, order, deps, succ, modes, dem,
                                                                      dur, fast, fd)
    P.cuts, P.segments = cuts, segments
    return P


def _tick_for(total_s: float) -> float:
    """The power of two that puts ``total_s`` in [2**20, 2**21) ticks."""
    if total_s > 0:
        _, e = math.frexp(total_s)
        return math.ldexp(1.0, e - 1 - TICK_RESOLUTION_EXP)
    return 1.0


def _segment_tick(P: _Prepared, seg) -> float:
    """A segment's own tick (resolution relative to the segment, so that the same segment met in
    another phase, e.g. a backward with and without a recompute prefix, is the same problem)."""
    if P.fixed_tick is not None:
        return P.fixed_tick
    return _tick_for(sum(P.fd[i] for i in seg))


def bounds(tasks: Sequence[Task], capacities: dict, *, tick_s: float | None = None) -> tuple[float, float]:
    """(lower, upper) bounds of the makespan :func:`solve` returns, without CP-SAT: the lower one
    from the critical path and the per-resource energy bounds, the upper one from the list
    schedule (ops in topological order, fastest mode, earliest feasible start) of each segment.
    ``lower <= optimum <= solve(...).makespan_s <= upper``."""
    capacities = {str(r): int(k) for r, k in capacities.items()}
    P = _prepare(tasks, capacities, tick_s)
    lower_s = upper_s = 0.0
    for piece in _pieces(P.order, P.cuts, P.segments):
        if isinstance(piece, int):
            lower_s += P.fd[piece]
            upper_s += P.fd[piece]
            continue
        tk = _segment_tick(P, piece)
        D = {i: [math.ceil(d / tk) for d in P.dur[i]] for i in piece}
        pre = _segment_prep(piece, P.deps, P.succ, D, P.dur, P.dem, P.fast, capacities)
        lower_s += pre["lb_s"]
        upper_s += pre["ub"] * tk
    # the solver's makespan adds the same durations in another order: allow for the rounding
    return max([lower_s] + _phase_lower_bounds(P, capacities)) * (1 - 1e-9), upper_s * (1 + 1e-9)


def _phase_lower_bounds(P: _Prepared, capacities) -> list[float]:
    return [_longest_path(P.order, P.deps, P.fd)] + _energy_bounds(P.order, P.deps, P.succ, P.fd, P.dur, P.dem,
                                                                    capacities, False)


_segments: OrderedDict[str, tuple] = OrderedDict()   # proven segment optima, by content


def _segment_key(P: _Prepared, seg, tk: float, capacities) -> str:
    pos = {i: k for k, i in enumerate(seg)}
    spec = [float(tk).hex(), sorted(capacities.items()),
            [[[float(d).hex() for d in P.dur[i]], [sorted(x.items()) for x in P.dem[i]],
              sorted(pos[j] for j in P.deps[i] if j in pos)] for i in seg]]
    return hashlib.sha256(json.dumps(spec, separators=(",", ":")).encode()).hexdigest()


def _solve(tasks, capacities, work_limit, time_limit_s, num_workers, tick_s, unit_counts) -> Schedule:
    t0 = time.perf_counter()
    capacities = {str(r): int(k) for r, k in capacities.items()}
    P = _prepare(tasks, capacities, tick_s)
    n, order, deps, succ, modes, dem, dur, fast, fd = (P.n, P.order, P.deps, P.succ, P.modes, P.dem, P.dur,
                                                       P.fast, P.fd)
    seq_sum, tick_s = P.seq_sum, P.tick_s
    budget = _Budget(deadline=t0 + max(0.0, time_limit_s), work_left=max(0.0, work_limit))
    chosen, start_at = fast[:], [0.0] * n     # the solver's modes and starts (seconds)
    lower_s, statuses, notes, offset = 0.0, [], [], 0.0
    exact = True
    # segments and cuts alternate in topological order; lay them out one after another
    for piece in _pieces(order, P.cuts, P.segments):
        if isinstance(piece, int):
            start_at[piece] = offset
            offset += fd[piece]
            lower_s += fd[piece]
            continue
        tk = _segment_tick(P, piece)
        D = {i: [math.ceil(d / tk) for d in dur[i]] for i in piece}
        seg_exact = all(D[i][a] * tk == dur[i][a] for i in piece for a in range(len(D[i])))
        exact = exact and seg_exact
        key = _segment_key(P, piece, tk, capacities) if _SHORTCUTS else None
        hit = _segments.get(key) if key else None
        if hit is not None:
            _segments.move_to_end(key)
            st, md_l, starts_l, b, lo_s, note = hit
            md = dict(zip(piece, md_l, strict=False))
            starts = dict(zip(piece, starts_l, strict=False))
        else:
            st, md, starts, b, lo_s, note = _solve_segment(piece, deps, succ, D, dur, dem, fast, capacities,
                                                           budget, num_workers)
            if key and st == "OPTIMAL":
                _segments[key] = (st, [md[i] for i in piece], [starts[i] for i in piece], b, lo_s, note)
                while len(_segments) > _MEMORY_CACHE_SIZE:
                    _segments.popitem(last=False)
        statuses.append(st)
        if note:
            notes.append(note)
        for i in piece:
            chosen[i] = md[i]
            start_at[i] = offset + starts[i] * tk
        offset = max(start_at[i] + D[i][chosen[i]] * tk for i in piece)
        # the proven tick bound, less the rounding slack (see the module docstring)
        lower_s += max(lo_s, (b - (0 if seg_exact else len(piece) + 1)) * tk)
    if all(x == "OPTIMAL" for x in statuses):
        status = "OPTIMAL"
    elif any(x in ("OPTIMAL", "FEASIBLE") for x in statuses):
        status = "FEASIBLE"
    else:
        status = "HEURISTIC"
    note = "; ".join(sorted(set(notes)))
    phase_bounds = _phase_lower_bounds(P, capacities)
    cp_s = phase_bounds[0]
    work_s = {r: sum(min(dur[i][a] * dem[i][a].get(r, 0) for a in range(len(modes[i]))) for i in range(n)) / c
              for r, c in capacities.items() if c > 0}
    work_bound_s = max(work_s.values(), default=0.0)
    energy_s = max([lower_s] + phase_bounds)

    # re-time in real seconds: solver's modes, its start order as the priority
    pos = {i: k for k, i in enumerate(order)}
    prio = sorted(range(n), key=lambda i: (start_at[i], pos[i]))
    rd = [dur[i][chosen[i]] for i in range(n)]
    rs = _sgs(prio, rd, [dem[i][chosen[i]] for i in range(n)], deps, capacities)
    makespan = max((rs[i] + rd[i] for i in range(n)), default=0.0)
    lower = min(energy_s, makespan)
    if (status == "OPTIMAL" and exact) or makespan - lower <= 1e-12 * makespan:   # equal but for rounding
        lower = makespan
    gap = (makespan - lower) / makespan if makespan > 0 else 0.0

    entries = []
    for i in range(n):
        mode = tasks[i].modes[modes[i][chosen[i]]]
        entries.append(ScheduledOp(name=tasks[i].name, unit=tasks[i].unit, mode=modes[i][chosen[i]],
                                   tensor_units=mode.tensor_units, vector_units=mode.vector_units,
                                   start_s=rs[i], duration_s=rd[i],
                                   demand=tuple(sorted(dem[i][chosen[i]].items()))))
    util = {}
    for r, c in capacities.items():
        busy = sum(e.duration_s * dict(e.demand).get(r, 0) for e in entries)
        util[r] = busy / (c * makespan) if makespan > 0 and c > 0 else 0.0
    for r, c in (unit_counts or {}).items():
        if r in util or c <= 0:
            continue
        if r == "tensor":
            busy = sum(e.duration_s * e.tensor_units for e in entries)
        elif r == "vector":
            busy = sum(e.duration_s * e.vector_units for e in entries)
        else:
            busy = sum(e.duration_s for e in entries if e.unit == r)
        util[r] = busy / (c * makespan) if makespan > 0 else 0.0
    return Schedule(makespan_s=makespan, status=status, lower_bound_s=lower, gap=gap,
                    solve_time_s=time.perf_counter() - t0, ops=tuple(entries), utilisation=util,
                    sequential_sum_s=seq_sum, critical_path_s=cp_s, work_bound_s=work_bound_s,
                    capacities=dict(capacities), tick_s=tick_s, time_limit_s=float(time_limit_s),
                    work_limit=float(work_limit), work_s=budget.used, note=note)


def _pieces(order, cuts, segments):
    """Cut ops and segments in the order they run."""
    first = {seg[0]: seg for seg in segments}
    cutset = set(cuts)
    for i in order:
        if i in cutset:
            yield i
        elif i in first:
            yield first[i]


def _segment_prep(seg, deps, succ, D, dur, dem, fast, capacities) -> dict:
    """The bounds of a segment without a solver: the lower bound in ticks (``lb``) and in seconds
    (``lb_s``), and the list schedule (topological order, fastest mode, earliest feasible start)
    with its makespan in ticks (``ub``)."""
    inside = set(seg)
    sdeps = {i: [j for j in deps[i] if j in inside] for i in seg}
    ssucc = {i: [k for k in succ[i] if k in inside] for i in seg}
    fD = {i: D[i][fast[i]] for i in seg}
    head, tail = {}, {}
    for i in seg:
        head[i] = max((head[j] + fD[j] for j in sdeps[i]), default=0)
    for i in reversed(seg):
        tail[i] = fD[i] + max((tail[k] for k in ssucc[i]), default=0)
    lb = max([head[i] + fD[i] for i in seg]
             + _energy_bounds(seg, sdeps, ssucc, fD, D, dem, capacities, True))
    fd = {i: dur[i][fast[i]] for i in seg}
    lb_s = max([_longest_path(seg, sdeps, fd)]
               + _energy_bounds(seg, sdeps, ssucc, fd, dur, dem, capacities, False))
    mode = {i: fast[i] for i in seg}
    start = _sgs(seg, {i: D[i][mode[i]] for i in seg}, {i: dem[i][mode[i]] for i in seg}, sdeps, capacities)
    ub = max(start[i] + D[i][mode[i]] for i in seg)
    return dict(sdeps=sdeps, ssucc=ssucc, head=head, tail=tail, lb=lb, lb_s=lb_s, mode=mode, start=start, ub=ub)


class _Budget:
    """What a phase's segments have left to solve with: CP-SAT deterministic time (the limit that
    decides) and a wall-clock deadline (the safety net); ``used``: the deterministic time spent."""

    def __init__(self, deadline: float, work_left: float):
        self.deadline, self.work_left, self.used = deadline, work_left, 0.0

    def spend(self, work: float) -> None:
        self.used += work
        self.work_left = max(0.0, self.work_left - work)


def _solve_segment(seg, deps, succ, D, dur, dem, fast, capacities, budget, num_workers):
    """Schedule the ops ``seg`` (closed under the precedence between two cuts) in ticks.
    Returns (status, mode per op, start per op, proven tick bound, lower bound in seconds,
    note); starts are relative to the segment's start."""
    pre = _segment_prep(seg, deps, succ, D, dur, dem, fast, capacities)
    lb, lb_s, ub, mode, start = pre["lb"], pre["lb_s"], pre["ub"], pre["mode"], pre["start"]
    if ub <= lb and _SHORTCUTS:
        return "OPTIMAL", mode, start, lb, lb_s, ""
    left = budget.deadline - time.perf_counter()
    work = budget.work_left
    if work <= 0:
        return "HEURISTIC", mode, start, lb, lb_s, "no work left to solve; list schedule"
    if left <= 0:
        return "HEURISTIC", mode, start, lb, lb_s, "wall-time limit reached; list schedule"
    args = (seg, pre["sdeps"], pre["ssucc"], D, dem, capacities, pre["head"], pre["tail"], lb, ub)
    res, walled = _cpsat(*args, work, left, num_workers, budget)
    if res[0] != "OPTIMAL":
        # not proven within the work: CP-SAT with its presolve, which proves more but has proved wrong
        # optima (SOLVER_PARAMETERS), may find a shorter schedule in a quarter of that work more;
        # it is checked and taken, its bound never is
        alt, walled2 = _cpsat(*args, PRESOLVE_SHARE * work, PRESOLVE_SHARE * left, num_workers, budget,
                              presolve=True)
        walled = walled or walled2
        if alt[1] is not None and _valid_ticks(seg, pre["sdeps"], D, dem, capacities, alt[1], alt[2]):
            span = _span(seg, D, alt[1], alt[2])
            if res[1] is None or span < _span(seg, D, res[1], res[2]):
                bound = lb if res[3] is None else res[3]
                res = ("OPTIMAL" if span <= bound else "FEASIBLE", alt[1], alt[2], bound)
    wall = "the wall-time limit stopped CP-SAT before its work limit (another machine may stop elsewhere)"
    if res[0] in ("OPTIMAL", "FEASIBLE"):
        return res + (lb_s, wall if walled and res[0] != "OPTIMAL" else "")
    return ("HEURISTIC", mode, start, lb, lb_s,
            f"CP-SAT returned {res[0]}; list schedule" + (f"; {wall}" if walled else ""))


def _span(seg, D, modes, starts) -> int:
    """Makespan in ticks of a tick schedule of the ops ``seg``."""
    return max(starts[i] + D[i][modes[i]] for i in seg)


def _valid_ticks(seg, deps, D, dem, capacities, modes, starts) -> bool:
    """Whether a tick schedule starts no op before its deps end and holds no resource beyond its
    capacity (a check on a schedule CP-SAT found with its presolve)."""
    if any(starts[i] < 0 or any(starts[i] < starts[j] + D[j][modes[j]] for j in deps[i]) for i in seg):
        return False
    events = sorted((t, k, r) for i in seg for r, n in dem[i][modes[i]].items()
                    for t, k in ((starts[i], n), (starts[i] + D[i][modes[i]], -n)))
    use = dict.fromkeys(capacities, 0)
    for _, k, r in events:          # at one tick the ends (k < 0) come before the starts
        use[r] += k
        if use[r] > capacities[r]:
            return False
    return True


def _energy_bounds(order, deps, succ, fast, dur, dem, capacities, integral) -> list:
    """Lower bounds on the makespan, one per resource ``r`` of capacity ``cap`` > 0: the ops that
    cannot start before ``h`` and leave at least ``q`` of dependent work after they end must fit
    their least energy on ``r`` (duration x units, over their modes) into [h, makespan - q]; the
    best over all (h, q). Ops are the ids in ``order`` (topological); the other arguments are
    indexed by id; ``integral``: energies in whole ticks, rounded up per unit."""
    head, after = {}, {}
    for i in order:
        head[i] = max((head[j] + fast[j] for j in deps[i]), default=0)
    for i in reversed(order):
        after[i] = max((after[k] + fast[k] for k in succ[i]), default=0)
    out = []
    for r, cap in capacities.items():
        if cap <= 0:
            continue
        items = []
        for i in order:
            e = min(d * x.get(r, 0) for d, x in zip(dur[i], dem[i], strict=False))
            if e > 0:
                items.append((head[i], after[i], e))
        items.sort(key=lambda it: -it[1])      # stable: equal tails keep their order
        best = 0
        for h in sorted({it[0] for it in items}):
            energy = 0
            for start, q, e in items:      # the ops from h on, the longest tail first
                if start < h:
                    continue
                energy += e
                need = -(-energy // cap) if integral else energy / cap
                best = max(best, h + need + q)
        out.append(best)
    return out


def _longest_path(order, deps, d) -> float:
    fin = {}
    for i in order:
        fin[i] = max((fin[j] for j in deps[i]), default=0) + d[i]
    return max(fin.values(), default=0)


def _active_starts(m, seg, deps, succ, dem, starts, ends):
    """Active schedules suffice (every op starts at 0 or when some op ends: a dep, or one that
    held a resource it needs, since a later start could shift left), so each start is tied to
    one such end: the search then picks which op an op follows rather than a time value."""
    desc = {}
    for i in reversed(seg):
        desc[i] = set().union(*[desc[k] | {k} for k in succ[i]])
    uses = {i: set().union(*[set(x) for x in dem[i]]) for i in seg}
    for i in seg:
        cands = set(deps[i]) | {j for j in seg if j != i and j not in desc[i] and uses[i] & uses[j]}
        lits = []
        if not deps[i]:
            z = m.new_bool_var("")
            m.add(starts[i] == 0).only_enforce_if(z)
            lits.append(z)
        for j in sorted(cands):
            z = m.new_bool_var("")
            m.add(starts[i] == ends[j]).only_enforce_if(z)
            lits.append(z)
        m.add_bool_or(lits)


def _precedence_energy(m, seg, deps, succ, D, dem, capacities, starts, ends, bools, mk):
    """Redundant energy constraints along the precedence: an op's ancestors run before it
    starts and its descendants after it ends, so on each resource their energy (duration x
    units of the chosen modes) fits in [0, start] and [end, makespan]."""
    anc, desc = {}, {}
    for i in seg:
        anc[i] = set().union(*[anc[j] | {j} for j in deps[i]])
    for i in reversed(seg):
        desc[i] = set().union(*[desc[k] | {k} for k in succ[i]])
    for r, cap in capacities.items():
        energy = {}
        for j in seg:
            e = [D[j][a] * dem[j][a].get(r, 0) for a in range(len(D[j]))]
            if max(e) <= 0:
                continue
            energy[j] = e[0] if bools[j] is None else sum(x * b for x, b in zip(e, bools[j], strict=False))
        for i in seg:
            before = [energy[j] for j in anc[i] if j in energy]
            if len(before) > 1:
                m.add(cap * starts[i] >= sum(before))
            after = [energy[j] for j in desc[i] if j in energy]
            if len(after) > 1:
                m.add(cap * (mk - ends[i]) >= sum(after))
            for u in anc[i]:
                between = [energy[j] for j in (desc[u] & anc[i]) if j in energy]
                if len(between) > 1:
                    m.add(cap * (starts[i] - ends[u]) >= sum(between))


_ACTIVE: set = set()                 # CP-SAT solvers running now, which a Ctrl-C may stop
_STOPPED = threading.Event()         # set when stop_solves() ended a solve in progress


def stop_solves() -> None:
    """End every CP-SAT solve in progress at once (Ctrl-C: a solve may run for its whole time
    limit, and Python handles the signal only once it returns); the stopped solve raises
    KeyboardInterrupt instead of returning (or caching) an interrupted schedule. Thread-safe."""
    active = list(_ACTIVE)
    if active:
        _STOPPED.set()
    for solver in active:
        solver.stop_search()


def _cpsat(seg, deps, succ, D, dem, capacities, head, tail, lb, ub, work, time_left, num_workers, budget,
           presolve=False):
    """CP-SAT on the ops ``seg`` in ticks, within ``work`` deterministic time (charged to
    ``budget``) and ``time_left`` wall seconds. Returns ((status, {op: mode}, {op: start},
    proven lower bound), whether the wall time stopped it); status is CP-SAT's name (UNKNOWN, ...)
    and the rest None when no solution was found. ``presolve``: with CP-SAT's presolve (its answer
    is then not proven)."""
    from ortools.sat.python import cp_model  # deferred: 0.24 s to import, and only a solve needs it
    m = cp_model.CpModel()
    starts, ends, bools = {}, {}, {}
    per_res: dict[str, list] = {r: [] for r in capacities}
    for i in seg:
        lo, hi = head[i], ub - tail[i]
        s = starts[i] = m.new_int_var(lo, hi, "")
        if len(D[i]) == 1:
            iv = m.new_fixed_size_interval_var(s, D[i][0], "")
            ends[i] = s + D[i][0]
            bools[i] = None
            for r, k in dem[i][0].items():
                per_res[r].append((iv, k))
            continue
        bs = bools[i] = [m.new_bool_var("") for _ in D[i]]
        m.add_exactly_one(bs)
        e = ends[i] = m.new_int_var(lo + min(D[i]), hi + max(D[i]), "")
        m.add(e == s + sum(d * b for d, b in zip(D[i], bs, strict=False)))
        for a, b in enumerate(bs):
            iv = m.new_optional_fixed_size_interval_var(s, D[i][a], b, "")
            for r, k in dem[i][a].items():
                per_res[r].append((iv, k))
    for i in seg:
        for j in deps[i]:
            m.add(starts[i] >= ends[j])
    mk = m.new_int_var(lb, ub, "makespan")
    for i in seg:
        if not succ[i]:
            m.add(mk >= ends[i])
    for r, items in per_res.items():
        cap = capacities[r]
        if sum(k for _, k in items) <= cap:
            continue
        if all(k == cap for _, k in items):
            m.add_no_overlap([iv for iv, _ in items])
        else:
            m.add_cumulative([iv for iv, _ in items], [k for _, k in items], cap)
    # symmetry: interchangeable ops (same modes, same deps, same successors) start in order
    groups: dict = {}
    for i in seg:
        sig = (tuple(D[i]), tuple(tuple(sorted(x.items())) for x in dem[i]), tuple(sorted(deps[i])),
               tuple(sorted(succ[i])))
        groups.setdefault(sig, []).append(i)
    for g in groups.values():
        for a, b in zip(g, g[1:], strict=False):
            m.add(starts[a] <= starts[b])
    _active_starts(m, seg, deps, succ, dem, starts, ends)
    _precedence_energy(m, seg, deps, succ, D, dem, capacities, starts, ends, bools, mk)
    m.minimize(mk)
    # no solution hint: given the list schedule as one (feasible, complete but for the active-start
    # literals) ortools 9.15 proved wrong optima (SOLVER_PARAMETERS); ub bounds every domain instead

    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = max(1e-3, work)
    solver.parameters.max_time_in_seconds = max(1e-3, time_left)
    solver.parameters.num_workers = max(1, int(num_workers))
    solver.parameters.random_seed = 0
    solver.parameters.catch_sigint_signal = False    # Ctrl-C stays Python's KeyboardInterrupt
    for k, v in SOLVER_PARAMETERS.items():
        if isinstance(v, str):      # an enum value by name
            v = getattr(type(getattr(solver.parameters, k)), v)
        setattr(solver.parameters, k, v)
    solver.parameters.cp_model_presolve = presolve
    _ACTIVE.add(solver)
    try:
        st = solver.solve(m)
    finally:
        _ACTIVE.discard(solver)
    if _STOPPED.is_set():       # Ctrl-C ended the solve: its result is not the solver's answer
        _STOPPED.clear()
        raise KeyboardInterrupt
    used = solver.response_proto.deterministic_time
    budget.spend(used)
    # stopped by the wall clock: neither proven nor out of its work (a stop at the work limit has spent
    # all of it, ortools 9.15), since no other limit is set; CP-SAT's reported wall time is no test:
    # on a loaded machine it stopped with UNKNOWN, no work done and a wall time short of its limit
    walled = st in (cp_model.FEASIBLE, cp_model.UNKNOWN) and used < 0.99 * max(1e-3, work)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return (solver.status_name(st), None, None, None), walled
    modes = {i: 0 if bools[i] is None else next(a for a, b in enumerate(bools[i]) if solver.boolean_value(b))
             for i in seg}
    st_ticks = {i: solver.value(starts[i]) for i in seg}
    bound = max(int(math.ceil(solver.best_objective_bound - 1e-9)), lb)
    return ("OPTIMAL" if st == cp_model.OPTIMAL else "FEASIBLE", modes, st_ticks, bound), walled


# --- ops on a chip --------------------------------------------------------------------------------
def unit_choices(n: int, shares: Iterable[float] = DEFAULT_SHARES) -> tuple[int, ...]:
    """Distinct unit counts ``round(n * share)`` (at least 1), largest first."""
    return tuple(sorted({max(1, min(n, int(math.floor(n * s + 0.5)))) for s in shares}, reverse=True))


def sharing(chip: Chip) -> str:
    s = chip.unit_sharing or ("sequential" if chip.kind == "gpu" else "concurrent")
    if s not in ("sequential", "concurrent"):
        raise ConfigError(chip.name, "unit_sharing", f"must be sequential or concurrent, got {s!r}")
    return s


def vector_slots(chip: Chip) -> int:
    """Scheduling slots per vector unit on a concurrent chip: fused ops hold the same share of
    the vector units as of the tensor units (TPUv4: 1 of 8 MXUs with a quarter of one of its
    2 VPUs), so the vector pool is counted in slots of ``1 / g`` unit, ``g = n_t / gcd(n_t,
    n_v)``, which makes every such share a whole number of slots."""
    return chip.tensor.count // math.gcd(chip.tensor.count, chip.vector.count)


def chip_capacities(chip: Chip) -> dict:
    """Scheduling resources of a chip: one shared ``chip`` resource for sequential chips;
    ``tensor`` units, ``vector`` unit slots (:func:`vector_slots`) and a ``link`` for
    concurrent ones."""
    if sharing(chip) == "sequential":
        return {"chip": 1}
    return {"tensor": chip.tensor.count, "vector": chip.vector.count * vector_slots(chip), "link": 1}




def fused_time(op: Op, chip: Chip, precision: str, eff: Efficiency, *, groups: dict, bytes_per_element: int,
               tensor_units: int, vector_units: float) -> float:
    """Seconds of a fused (tensor+vector) op on ``tensor_units`` tensor units and
    ``vector_units`` (possibly fractional) vector units."""
    return op_time(op, chip, precision, eff, groups=groups, bytes_per_element=bytes_per_element,
                   units=tensor_units, vector_units=vector_units)


def op_modes(op: Op, chip: Chip, precision: str, eff: Efficiency = IDEAL, *, groups: dict,
             bytes_per_element: int, shares: Iterable[float] | None = None) -> tuple[Mode, ...]:
    """The modes of one op on ``chip`` (see the module docstring for the sharing rules)."""
    kw = dict(groups=groups, bytes_per_element=bytes_per_element)
    nt, nv = chip.tensor.count, chip.vector.count
    shares = tuple(DEFAULT_SHARES if shares is None else shares)
    if any(not (0 < x <= 1) for x in shares) or not shares:
        raise ValueError(f"unit shares must be in (0, 1], got {shares}")
    if sharing(chip) == "sequential":
        t = op_time(op, chip, precision, eff, **kw)
        return (Mode(t, (("chip", 1),), nt if op.unit in ("tensor", "tensor+vector") else 0,
                     nv if op.unit in ("vector", "tensor+vector") else 0),)
    g = vector_slots(chip)
    if op.unit == "link":
        return (Mode(op_time(op, chip, precision, eff, **kw), (("link", 1),)),)
    if op.unit == "tensor":
        return tuple(Mode(op_time(op, chip, precision, eff, units=None if k == nt else k, **kw),
                          (("tensor", k),), k, 0) for k in unit_choices(nt, shares))
    if op.unit == "vector":
        return tuple(Mode(op_time(op, chip, precision, eff, units=None if k == nv else k, **kw),
                          (("vector", k * g),), 0, k) for k in unit_choices(nv, shares))
    if op.unit == "tensor+vector":
        out = []
        for kt in unit_choices(nt, shares):
            slots = kt * nv * g // nt          # the same share of the vector units
            kv = nv if kt == nt else slots / g
            out.append(Mode(fused_time(op, chip, precision, eff, tensor_units=kt, vector_units=kv, **kw),
                            (("tensor", kt), ("vector", slots)), kt, kv))
        return tuple(out)
    raise ValueError(f"op {op.name!r}: unknown unit {op.unit!r}")


def op_tasks(ops: Sequence[Op], chip: Chip, precision: str, eff: Efficiency = IDEAL, *, groups: dict,
             bytes_per_element: int, shares: Iterable[float] | None = None) -> tuple[Task, ...]:
    names = {o.name for o in ops}
    g = tuple(sorted(groups.items()))
    sh = None if shares is None else tuple(shares)
    return tuple(Task(o.name, _modes_of(replace(o, name="", deps=(), phase="", core_attention=False), chip,
                                        precision, eff, g, bytes_per_element, sh),
                      tuple(d for d in o.deps if d in names), o.unit) for o in ops)


@lru_cache(maxsize=1 << 15)
def _modes_of(op: Op, chip: Chip, precision: str, eff: Efficiency, groups: tuple, bytes_per_element: int,
              shares: tuple | None) -> tuple[Mode, ...]:
    """:func:`op_modes` once per distinct op shape (a recomputed forward op costs what the
    forward op costs; the names and deps do not enter the cost)."""
    return op_modes(op, chip, precision, eff, groups=dict(groups), bytes_per_element=bytes_per_element,
                    shares=shares)


def schedule_ops(ops: Sequence[Op], chip: Chip, precision: str, eff: Efficiency = IDEAL, *, groups: dict,
                 bytes_per_element: int, work_limit: float = WORK_LIMIT, time_limit_s: float = TIME_LIMIT_S,
                 modes: Iterable[float] | None = None, num_workers: int = 1, cache: bool = True) -> Schedule:
    """Minimum-makespan schedule of one phase's ops on one chip.

    ``modes``: the shares of a unit pool an op may run on (default ``DEFAULT_SHARES``: all,
    half, a quarter, an eighth of the units, rounded); ignored on sequential chips.
    ``groups`` / ``bytes_per_element`` / ``precision`` go to :func:`phaze.cost.op_time`."""
    tasks = op_tasks(ops, chip, precision, eff, groups=groups, bytes_per_element=bytes_per_element,
                     shares=modes)
    units = {"tensor": chip.tensor.count, "vector": chip.vector.count, "link": 1}
    return solve(tasks, chip_capacities(chip), work_limit=work_limit, time_limit_s=time_limit_s,
                 num_workers=num_workers, cache=cache, unit_counts=units)


def check_layer_args(model, mbs: int, tp: int, sp: bool, attention: str, recompute: str) -> None:
    """Raise :class:`ConfigError` (naming the CLI flag) for a layer that cannot be built."""
    if mbs < 1:
        raise ConfigError("--mbs", None, f"must be a positive integer, got {mbs}")
    if tp < 1:
        raise ConfigError("--tp", None, f"must be a positive integer, got {tp}")
    kind = model.layer_kind   # a hybrid's one kind of layer (M, *, -, E), or '' for a transformer layer
    if kind is None:
        raise ConfigError("--workload", None, f"{model.name} is a hybrid of several kinds of layer: schedule "
                                              f"one kind (phaze schedule --layer-kind)")
    if kind == "M" and (model.mamba_heads % tp or model.mamba_groups % tp):
        g = math.gcd(model.mamba_heads, model.mamba_groups)
        raise ConfigError("--tp", None, f"must divide the Mamba-2 heads ({model.mamba_heads}) and groups "
                          f"({model.mamba_groups}) of {model.name}; allowed: "
                          f"{divisors(g)}")
    widths = {"": (model.heads, model.ffn_hidden), "*": (model.heads,), "-": (model.ffn_hidden,),
              "E": (model.ffn_hidden,), "M": ()}[kind]
    if any(w % tp for w in widths):
        g = math.gcd(*widths, 0)
        raise ConfigError("--tp", None, f"must divide the heads ({model.heads}) and FFN width "
                          f"({model.ffn_hidden}) of {model.name}; allowed: "
                          f"{divisors(g)}")
    if kind in ("", "*") and model.kv_heads % tp and tp % model.kv_heads:
        raise ConfigError("--tp", None, f"must divide or be a multiple of the kv heads "
                                        f"({model.kv_heads}), got {tp}")
    if sp and tp > 1 and model.seq_len % tp:
        raise ConfigError("--sp", None, f"sequence parallelism needs tp ({tp}) to divide the "
                                        f"sequence length ({model.seq_len})")
    if attention not in ATTENTION:
        raise ConfigError("--attention", None, f"must be one of {', '.join(ATTENTION)}, got {attention!r}")
    if not is_layer_recompute(recompute):
        raise ConfigError("--recompute", None, f"must be one of {', '.join(RECOMPUTE)}, or selective+ Megatron-Core "
                                               f"modules ({'+'.join(RECOMPUTE_MODULES)}), got {recompute!r}")


@lru_cache(maxsize=1024)
def layer_tasks(model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str, recompute: str,
                eff: Efficiency = IDEAL, modes: tuple | None = None, moe=None
                ) -> tuple[tuple[Task, ...], tuple[Task, ...]]:
    """(forward, backward incl. recompute) tasks of one layer on ``chip``: the cost model run once
    per (layer, chip) for the bounds and the solve alike; ``moe``: the expert layers' layout."""
    check_layer_args(model, mbs, tp, sp, attention, recompute)
    g = layer_graph(model, mbs, tp, sp, attention, recompute, moe, chip.compiled)
    kw = dict(groups=collective_groups(tp, moe), bytes_per_element=model.bytes_per_element, shares=modes)
    return op_tasks(g.fwd, chip, model.precision, eff, **kw), op_tasks(g.bwd, chip, model.precision, eff, **kw)


_UNITS_OF = lambda chip: {"tensor": chip.tensor.count, "vector": chip.vector.count, "link": 1}  # noqa: E731


def schedule_layer(model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str, recompute: str,
                   eff: Efficiency = IDEAL, *, work_limit: float = WORK_LIMIT, time_limit_s: float = TIME_LIMIT_S,
                   modes: Iterable[float] | None = None, num_workers: int = 1, cache: bool = True,
                   moe=None) -> tuple[Schedule, Schedule]:
    """(forward, backward incl. recompute) schedules of one layer for one micro-batch, with the
    ops, groups and precision of :func:`phaze.stage.layer_time`."""
    fwd, bwd = layer_tasks(model, chip, mbs, tp, sp, attention, recompute, eff,
                           None if modes is None else tuple(modes), moe)
    kw = dict(work_limit=work_limit, time_limit_s=time_limit_s, num_workers=num_workers, cache=cache,
              unit_counts=_UNITS_OF(chip))
    caps = chip_capacities(chip)
    return solve(fwd, caps, **kw), solve(bwd, caps, **kw)


@lru_cache(maxsize=4096)
def layer_bounds(model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str, recompute: str,
                 eff: Efficiency = IDEAL, moe=None) -> tuple[tuple[float, float], tuple[float, float]]:
    """((lower, upper) of the forward makespan, (lower, upper) of the backward one) of
    :func:`schedule_layer`'s schedules, without a solver (:func:`bounds`). Cheap: what the
    placement search uses to decide which layers are worth solving."""
    fwd, bwd = layer_tasks(model, chip, mbs, tp, sp, attention, recompute, eff, None, moe)
    caps = tuple(sorted(chip_capacities(chip).items()))
    return _bounds_of(fwd, caps), _bounds_of(bwd, caps)


@lru_cache(maxsize=4096)
def _bounds_of(tasks: tuple[Task, ...], caps: tuple) -> tuple[float, float]:
    """:func:`bounds`, once per distinct phase (a layer's forward is the same under every
    recompute mode, and so is its backward without and with selective recompute of a fused
    attention)."""
    return bounds(tasks, dict(caps))


# --- Gantt chart ----------------------------------------------------------------------------------
_ROWS = (("tensor units", "tensor", ("tensor", "tensor+vector")),
         ("vector units", "vector", ("vector", "tensor+vector")),
         ("links", "link", ("link",)))


def _lanes(sched: Schedule):
    """Per row: (capacity, [(entry, [lane indices])]); lanes assigned greedily, lowest first."""
    out = []
    for _, res, kinds in _ROWS:
        sequential = res not in sched.capacities
        cap = 1 if sequential else int(sched.capacities[res])
        busy = [float("-inf")] * max(cap, 1)
        items = []
        for e in sorted(sched.ops, key=lambda e: (e.start_s, e.name)):
            if e.unit not in kinds or e.duration_s <= 0:
                continue
            k = cap if sequential else int(dict(e.demand).get(res, 0))
            if k <= 0:
                continue
            eps = 1e-12 * max(sched.makespan_s, 1e-30)
            free = [u for u in range(len(busy)) if busy[u] <= e.start_s + eps]
            lanes = free[:k] if len(free) >= k else list(range(k))
            for u in lanes:
                busy[u] = e.end_s
            items.append((e, lanes))
        out.append((cap, items))
    return out


_KIND_SUFFIXES = (".grad_fp8_cast", ".fp8_cast", ".grad_fp8_transpose", ".fp8_transpose",
                  ".input_all_gather", ".dgrad.all_reduce", ".dgrad_a", ".dgrad_b",
                  ".dgrad", ".wgrad", ".bwd", ".bias_grad", ".bias", ".scale", ".split", ".permute")


def op_kind(name: str) -> str:
    """The forward operator an op belongs to (``qkv`` for ``qkv.wgrad`` and ``recompute.qkv``):
    one colour per kind across the forward and backward phases."""
    name = name.removeprefix("recompute.")
    changed = True
    while changed:
        changed = False
        for suffix in _KIND_SUFFIXES:
            if name.endswith(suffix):
                name, changed = name[: -len(suffix)], True
    return name


# every setting the drawing reads, so that it does not depend on what the process drew before
GANTT_RC = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "legend.fontsize": 10,
            "svg.hashsalt": "phaze", "svg.fonttype": "none"}


def bar_kind(name: str, unit: str) -> str:
    """The colour key of a Gantt bar: the operator kind (:func:`op_kind`) for compute, but a
    collective keeps its own name (``qkv.input_all_gather``, ``qkv.dgrad.all_reduce``), so a
    backward link bar does not take the colour of the GEMM it serves; a collective's backward
    (``ln1.all_gather.bwd``) and recompute share the forward collective's colour."""
    if unit != "link":
        return op_kind(name)
    return name.removeprefix("recompute.").removesuffix(".bwd")


def pool_sizes(sched: Schedule, unit_counts: dict | None = None) -> dict[str, int]:
    """Units per Gantt row: ``unit_counts`` where given (the chip's tensor and vector units),
    else read from the schedule: the vector pool is scheduled in slots (:func:`vector_slots`),
    and an op holding ``k`` slots for ``v`` vector units says how many slots make a unit."""
    out = {}
    for _, res, _ in _ROWS:
        cap = int(sched.capacities.get(res, 1))
        if unit_counts and res in unit_counts:
            out[res] = int(unit_counts[res])
        elif res == "vector" and res in sched.capacities:
            per = {dict(e.demand).get(res, 0) / e.vector_units for e in sched.ops
                   if e.vector_units and dict(e.demand).get(res)}
            out[res] = round(cap / min(per)) if per else cap
        else:
            out[res] = cap
    return out


def _runs(lanes) -> list[tuple[int, int]]:
    """Contiguous runs ``(first, last)`` of lane indices."""
    runs: list[tuple[int, int]] = []
    for u in sorted(lanes):
        if runs and u == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], u)
        else:
            runs.append((u, u))
    return runs


def write_gantt(path, panels: Sequence[tuple[str, Schedule]], title: str = "",
                unit_counts: dict | None = None) -> None:
    """Draw ``panels`` ((label, schedule), ...) into ``path`` (or each of several paths: one
    drawing for the PNG and the SVG) as Gantt charts, one panel each: a row per unit group
    (tensor units, vector units, links; named with the chip's unit count, ``unit_counts`` or
    :func:`pool_sizes`) with a faint line per scheduling slot, a bar per op over the slots it
    holds (its height is its share of the pool), one colour per operator kind in both phases and
    one per collective (:func:`bar_kind`, legend), labelled with its name and share (``qkv 8/8``),
    or its name alone or shortened (``flash_att…``), wherever the text fits in the drawn bar
    (measured after the layout)."""
    import matplotlib  # deferred, like every figure: the CLI starts fast without it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    colours = matplotlib.colormaps["tab20"].colors
    kinds: list[str] = []
    for _, sched in panels:
        for e in sorted(sched.ops, key=lambda e: (e.start_s, e.name)):
            if bar_kind(e.name, e.unit) not in kinds:
                kinds.append(bar_kind(e.name, e.unit))
    colour = {k: colours[i % len(colours)] for i, k in enumerate(kinds)}
    with matplotlib.rc_context(GANTT_RC):
        fig = Figure(figsize=(13, 2.6 * len(panels) + 1.4))
        FigureCanvasAgg(fig)   # text extents, to fit the labels
        axes = fig.subplots(len(panels), 1, squeeze=False)
        labels = []       # (axes, text, candidate strings, bar box in data coordinates)
        for ax, (label, sched) in zip(axes[:, 0], panels, strict=False):
            scale, unit = (1e3, "ms") if sched.makespan_s >= 1e-3 else (1e6, "µs")
            ax.set_xlim(0, max(sched.makespan_s * scale, 1e-9))
            sizes = pool_sizes(sched, unit_counts)
            caps = []
            for row, ((_row_name, res, _), (cap, items)) in enumerate(zip(_ROWS, _lanes(sched), strict=False)):
                base = len(_ROWS) - 1 - row
                caps.append(sizes[res] if res in sched.capacities else 1)
                if 1 < cap <= 32:
                    for u in range(1, cap):
                        ax.axhline(base + 0.05 + 0.9 * u / cap, color="0.85", linewidth=0.3, zorder=0)
                for e, lanes in items:
                    runs = _runs(lanes)
                    x, w = e.start_s * scale, e.duration_s * scale
                    for lo, hi in runs:
                        ax.add_patch(Rectangle((x, base + 0.05 + 0.9 * lo / cap), w, 0.9 * (hi - lo + 1) / cap,
                                               facecolor=colour[bar_kind(e.name, e.unit)], edgecolor="black",
                                               linewidth=0.4))
                    lo, hi = max(runs, key=lambda r: (r[1] - r[0], -r[0]))
                    y0, y1 = base + 0.05 + 0.9 * lo / cap, base + 0.05 + 0.9 * (hi + 1) / cap
                    share = f"{e.name} {len(lanes)}/{cap}" if cap > 1 else e.name
                    t = ax.text(x + w / 2, (y0 + y1) / 2, share, ha="center", va="center", fontsize=7, clip_on=True)
                    labels.append((ax, t, (share, e.name), (x, y0, x + w, y1)))
            ax.set_ylim(0, len(_ROWS))
            ax.set_yticks([len(_ROWS) - 1 - r + 0.5 for r in range(len(_ROWS))])
            ax.set_yticklabels([f"{r[0]} ({c})" if c > 1 else r[0] for r, c in zip(_ROWS, caps, strict=False)])
            ax.set_xlabel(f"time ({unit})")
            ax.set_title(f"{label}: {sched.makespan_s * scale:.4g} {unit}, {sched.status}"
                         f" (sequential {sched.sequential_sum_s * scale:.4g} {unit})", fontsize=10)
        fig.legend(handles=[Patch(facecolor=colour[k], edgecolor="black", linewidth=0.4, label=k) for k in kinds],
                   loc="lower center", ncol=min(len(kinds), 8), fontsize=7, frameon=False,
                   title="operator (forward and backward; bar height = share of the unit pool)", title_fontsize=7)
        if title:
            fig.suptitle(title, fontsize=11)
        fig.tight_layout(rect=(0, 0.04 + 0.012 * ((len(kinds) + 7) // 8), 1, 1))
        _fit_labels(fig, labels)
        for target in [path] if isinstance(path, (str, os.PathLike)) else path:
            # written beside and renamed: several workers ending one study write the same report files,
            # and one of them may be reading this figure while another draws it
            target = Path(target)
            tmp = target.with_name(f".{target.stem}.tmp{os.getpid()}{target.suffix}")
            try:
                ext = target.suffix.lstrip(".") or "png"
                # no date or software stamp: the same schedule gives a byte-identical file
                fig.savefig(tmp, dpi=150, format=ext, metadata={"Date": None} if ext == "svg" else {"Software": None})
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)


def _text_fits(t, text: str, renderer, room_w: float, room_h: float) -> tuple[bool, float]:
    """Set ``text`` on ``t``: (whether it fits in ``room_w`` x ``room_h`` pixels, its width)."""
    t.set_text(text)
    box = t.get_window_extent(renderer)
    return box.width <= room_w and box.height <= room_h, box.width


def _fit_labels(fig, labels) -> None:
    """Keep each bar's first label that fits inside the bar as drawn: its name and share, its
    name, or its name shortened to the width (estimated from the name's, then checked); drop
    the label where none fits."""
    renderer = fig.canvas.get_renderer()
    for ax, t, (share, name), (x0, y0, x1, y1) in labels:
        (px0, py0), (px1, py1) = ax.transData.transform([(x0, y0), (x1, y1)])
        room = (abs(px1 - px0) - 2, abs(py1 - py0))
        if room[0] < 10 or room[1] < 7:      # no room for even a short label
            t.remove()
            continue
        if _text_fits(t, share, renderer, *room)[0]:
            continue
        ok, width = _text_fits(t, name, renderer, *room)
        if ok:
            continue
        for k in range(min(len(name) - 1, int(len(name) * room[0] / width)), 2, -1):
            if _text_fits(t, name[:k] + "…", renderer, *room)[0]:
                break
        else:
            t.remove()
