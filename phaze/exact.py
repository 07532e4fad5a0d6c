"""The exact search: every design of the space decided, most promising first, with a certificate.

:class:`ExactSampler` is an Optuna sampler (``sampler: exact``, ``phaze search --sampler exact``)
that proposes designs in order of their optimistic bound (:mod:`phaze.bounds`) and never one that
provably cannot improve the answer:

- every point of the grid gets its exact area and cost (over-budget points are never proposed)
  and the closed-form throughput bound (level 0), all at once;
- an evaluated design bounds every design it dominates (more units, bandwidth or memory is never
  slower);
- before a design is proposed, its level-1 bound (the placement's layout bounds) is computed and
  stored on the study, so every worker shares it;
- with one objective, designs are taken best bound first (branch and bound) and the search ends
  when no remaining bound beats the incumbent; with several, a design is proposed unless its
  optimistic point is weakly dominated by an evaluated feasible design, and the search ends when
  every design is decided.

Everything lives in the Optuna study (evaluations as trials, level-1 bounds as study system
attributes), so resuming, ``--jobs`` and PostgreSQL workers work as for any sampler: each worker
rebuilds the queue from the storage and skips designs in flight elsewhere.
:func:`certificate` says, from the storage alone, how every design of the space was decided.
"""
from __future__ import annotations

import heapq
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from functools import lru_cache

import numpy as np

from .area import silicon, v_floor
from .bounds import chip_bound, chip_power_bounds, dominance_keys, dominated_by, grid, grid_bounds
from .calibrate import load_default_params, params_for
from .power import lowest_leakage_w, throttled_power_floor
from .space import CONSTRAINTS, SweepConfig, build_chip, design_key, power_budget

BOUND_ATTR = "exact_bound1:"       # study system attribute prefix: level-1 bound of grid point i
CLAIM_ATTR = "exact_claim:"        # [time, worker] of the worker bounding grid point i
CLAIM_STALE_S = 120.0              # a claim older than this is a dead worker's: bound it again
CLAIM_POLL_S = 0.25
_REL = 1e-9                        # relative tolerance of bound comparisons (rounding of sums)


def _efficiency(chip):
    """The efficiency a candidate is scored with (the shipped calibration, as the search's)."""
    return params_for(chip, load_default_params())


@dataclass
class Space:
    """A config's grid with everything known before evaluation."""

    cfg: SweepConfig
    grid: object
    area: np.ndarray
    cost: np.ndarray
    leakage: np.ndarray
    over: dict                     # budget key -> mask of points over it (known before evaluation)
    ok: np.ndarray                 # within every budget known before evaluation
    ub0: np.ndarray                # level-0 throughput bound
    mono: np.ndarray
    other: np.ndarray
    leakage_low: np.ndarray        # leakage at the lowest clock a throttle reaches (phaze.power)
    power_floor: np.ndarray        # a throttled plan's power over its limit is at least this
    index: dict = field(default_factory=dict)

    def chip(self, i: int):
        v = {k: float(a[i]) for k, a in self.grid.values.items()}
        return build_chip(self.cfg.base, v, self.cfg.process_node_nm, self.cfg.link_latency_s)

    def key_of(self, params: dict):
        return self.index.get(design_key(params))


@lru_cache(maxsize=4)
def _space(cfg: SweepConfig) -> Space:
    return prepare(cfg)


def prepare(cfg: SweepConfig) -> Space:
    """Area, cost and leakage of every point (the silicon model, point by point: it is exact),
    the budgets known before evaluation, and the level-0 bounds (vectorised)."""
    g = grid(cfg)
    n = g.size
    area, cost, leak, low, floor = np.empty(n), np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    keys = list(g.values)
    cols = [g.values[k] for k in keys]
    for i in range(n):
        chip = build_chip(cfg.base, {k: float(c[i]) for k, c in zip(keys, cols, strict=True)},
                          cfg.process_node_nm, cfg.link_latency_s)
        si = silicon(chip)
        area[i], cost[i], leak[i] = si.area_mm2, si.cost_usd, si.leakage_w
        low[i] = lowest_leakage_w(chip)
        floor[i] = throttled_power_floor(chip.clock_hz / chip.reference_clock_hz, v_floor(chip))
    over = {}
    static = {"area": area, "cost": cost, "power": low}   # power: over even at the lowest voltage
    for key, bound in cfg.constraints:
        metric, sense = CONSTRAINTS[key]
        x = static[metric]
        over[key] = x > bound if sense == "max" else (x < bound if metric != "power" else np.zeros(n, bool))
    ok = np.ones(n, dtype=bool)
    for m in over.values():
        ok &= ~m
    ub0 = grid_bounds(cfg, g, _efficiency)
    mono, other = dominance_keys(cfg, g)
    index = {design_key(g.point(i)): i for i in range(n)} if n <= 2_000_000 else {}
    return Space(cfg, g, area, cost, leak, over, ok, ub0, mono, other, low, floor, index)


# --- objectives --------------------------------------------------------------------------------------
def optimistic(space: Space, i: np.ndarray | int, tput_bound, power_bound=None) -> np.ndarray:
    """The optimistic objective vector(s) of points ``i`` given a throughput bound and a power
    bound (default: the leakage), each objective oriented so that larger is better (minimised
    ones negated)."""
    cfg = space.cfg
    a, c = space.area[i], space.cost[i]
    pw = space.leakage[i] if power_bound is None else power_bound
    out = []
    for o in cfg.objectives:
        x = {"throughput": tput_bound, "area": -a, "cost": -c, "power": -pw,
             "throughput_per_mm2": tput_bound / a, "throughput_per_usd": tput_bound / c,
             "throughput_per_w": np.where(pw > 0, tput_bound / np.maximum(pw, 1e-300), np.inf)}[o]
        out.append(np.asarray(x, dtype=float))
    return np.stack(out, axis=-1)


def _oriented(cfg: SweepConfig, values) -> np.ndarray:
    return np.array([v if d == "maximize" else -v for v, d in zip(values, cfg.directions, strict=True)])


def _dominating(point: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Mask of the ``rows`` that are at least ``point`` in every (oriented) objective, up to
    rounding (an infinite bound is dominated by nothing)."""
    with np.errstate(invalid="ignore"):
        tol = _REL * np.maximum(np.abs(point), 1e-300)
        return np.all(rows >= point - tol, axis=1)


def _weakly_dominated(point: np.ndarray, front: np.ndarray) -> bool:
    """Whether some row of ``front`` weakly dominates ``point``."""
    return bool(len(front)) and bool(np.any(_dominating(point, front)))


# --- the state a worker rebuilds from the storage ----------------------------------------------------
@dataclass
class _State:
    evaluated: dict = field(default_factory=dict)    # point -> (trial number, throughput, feasible, oriented values)
    inflight: set = field(default_factory=set)
    bound1: dict = field(default_factory=dict)       # point -> level-1 throughput bound
    dom: np.ndarray | None = None                    # tightest throughput bound from dominance
    dom_by: np.ndarray | None = None                 # the trial number giving it
    seen_trials: set = field(default_factory=set)
    claims: dict = field(default_factory=dict)       # point -> [time, worker] of a level-1 bound in progress
    power1: dict = field(default_factory=dict)       # point -> level-1 power bound (when power matters)
    segment: dict = field(default_factory=dict)      # point -> (throughput lb, leakage, power per throughput)


class ExactSampler:
    """An Optuna sampler proposing the designs of ``cfg``'s grid in bound order; it never proposes
    a design that provably cannot improve the answer; :meth:`peek` gives None when none is left
    (the driver then stops the study)."""

    def __init__(self, cfg: SweepConfig):
        self.cfg = cfg
        self.single = len(cfg.objectives) == 1
        self._space: Space | None = None
        self._state = _State()
        self._heap: list | None = None
        self._next: int | None = None
        self._picked: dict[int, int] = {}
        self._proposed: set[int] = set()     # designs this worker proposed, until evaluated
        self.on_bound = None         # called with (level-1 bounds computed, designs in budget)
        self._token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.power_budget = power_budget(cfg.constraints)
        budgeted = self.power_budget is not None
        self.needs_power = budgeted or any(o in ("power", "throughput_per_w") for o in cfg.objectives)
        objs = set(cfg.objectives)
        # the throughput-power segment holds at the nominal clock only: not under a power budget
        self._segment_ok = ({"throughput", "power"} <= objs and objs <= {"throughput", "power", "area", "cost"}
                            and not budgeted)

    # Optuna's sampler interface (a BaseSampler subclass is built lazily: optuna imports slowly)
    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def before_trial(self, study, trial):
        pass

    def after_trial(self, study, trial, state, values):
        pass

    def reseed_rng(self):
        pass

    def sample_independent(self, study, trial, param_name, param_distribution):
        i = self._picked.get(trial.number)
        if i is None:
            i = self._next if self._next is not None else self.next_design(study)
            self._next = None
            self._picked[trial.number] = -1 if i is None else i
            i = 0 if i is None else i      # nothing left: the objective prunes this filler trial
        i = max(i, 0)
        return self.space.grid.choices[param_name][i].item()

    def is_filler(self, number: int) -> bool:
        """Whether trial ``number`` was proposed with nothing left to propose."""
        return self._picked.get(number) == -1

    # the queue
    @property
    def space(self) -> Space:
        if self._space is None:
            self._space = _space(self.cfg)
        return self._space

    def sync(self, study) -> None:
        """Read what the storage knows: evaluated designs, designs in flight, level-1 bounds."""
        import optuna  # deferred: optuna imports slowly and the CLI's other commands do not need it
        states = optuna.trial.TrialState
        sp, st = self.space, self._state
        if st.dom is None:
            st.dom = np.full(sp.grid.size, np.inf)
            st.dom_by = np.full(sp.grid.size, -1)
        st.inflight = set()
        for t in study.get_trials(deepcopy=False, states=(states.COMPLETE, states.RUNNING)):
            if len(t.params) != len(sp.grid.params):
                continue
            i = sp.key_of(t.params)
            if i is None:
                continue
            if t.state == states.RUNNING:
                st.inflight.add(i)
                continue
            if t.number in st.seen_trials or not t.user_attrs.get("evaluated", True):
                continue
            st.seen_trials.add(t.number)
            throttled = bool(t.user_attrs.get("throttled"))
            tput = float(t.user_attrs.get("throughput_tokens_per_s") or 0.0)
            feasible = bool(t.user_attrs.get("feasible"))
            prev = st.evaluated.get(i)
            if prev is None or t.number < prev[0]:
                st.evaluated[i] = (t.number, tput, feasible, _oriented(self.cfg, t.values))
            if throttled:       # a throttled design bounds nothing: a smaller one may need no throttling
                continue
            # every design this one dominates is at most as fast (at the nominal clock it ran at;
            # a dominated design draws less power, and throttling only slows it)
            mask = dominated_by(sp.mono, sp.other, i)
            better = mask & (tput < st.dom)
            st.dom[better] = tput
            st.dom_by[better] = t.number
        for k, v in study._storage.get_study_system_attrs(study._study_id).items():
            if k.startswith(BOUND_ATTR):
                j = int(k[len(BOUND_ATTR):])
                if isinstance(v, list):          # [throughput bound, power bound, PowerBounds' others]
                    st.bound1[j], st.power1[j] = float(v[0]), float(v[1])
                    if len(v) == 5:
                        st.segment[j] = (float(v[2]), float(v[3]), float(v[4]))
                else:
                    st.bound1[j] = float(v)
            elif k.startswith(CLAIM_ATTR):
                st.claims[int(k[len(CLAIM_ATTR):])] = v

    def _front(self) -> np.ndarray:
        pts = [v for (_, _, feas, v) in self._state.evaluated.values() if feas]
        return np.array(pts) if pts else np.zeros((0, len(self.cfg.objectives)))

    def bound(self, i: int) -> float:
        """The tightest throughput bound known for point ``i``."""
        st, sp = self._state, self.space
        b = min(float(sp.ub0[i]), float(st.dom[i]))
        if i in st.bound1:
            b = min(b, st.bound1[i])
        return b

    def power_bound(self, i: int, level1: bool = True) -> float:
        """The tightest lower bound of point ``i``'s power known (its leakage before level 1). Under
        a power budget a design over it is throttled (:mod:`phaze.power`) and then draws at least
        :func:`~phaze.power.throttled_power_floor` of the budget, and its leakage at the lowest
        voltage."""
        leak = float(self.space.leakage[i])
        b = max(leak, self._state.power1.get(i, 0.0)) if level1 else leak
        if self.power_budget is not None:
            b = min(b, max(float(self.space.leakage_low[i]), float(self.space.power_floor[i]) * self.power_budget))
        return b

    def over_power(self, i: int, level1: bool = True) -> bool:
        """Whether point ``i`` cannot meet the power budget even throttled to the lowest clock:
        its leakage at the lowest voltage already breaks it."""
        return (self.power_budget is not None
                and float(self.space.leakage_low[i]) > self.power_budget * (1 + _REL))

    def can_win(self, i: int, tput_bound: float, front: np.ndarray, level1: bool = True) -> bool:
        """Whether point ``i`` may still improve the answer: its bounds within the power budget
        and not beaten by the incumbent (one objective) or weakly dominated by the front."""
        pw = self.power_bound(i, level1)
        if self.over_power(i, level1):
            return False
        point = optimistic(self.space, i, tput_bound, pw)
        if self.single:
            if not len(front):
                return True
            best = front[:, 0].max()
            return bool(point[0] > best + _REL * abs(best))
        if level1 and self._segment_ok and i in self._state.segment:
            return not self._segment_dominated(i, tput_bound, pw, front)
        return not _weakly_dominated(point, front)

    def _segment_dominated(self, i: int, tput_bound: float, pw: float, front: np.ndarray) -> bool:
        """Whether every outcome point ``i`` may have is weakly dominated by the front: its
        throughput X in [lower bound, ``tput_bound``] and its power at least max(``pw``, leakage +
        per-throughput x X) (:class:`phaze.bounds.PowerBounds`), area and cost exact. The front's
        designs no larger in area and cost form a staircase of the least power for at least each
        throughput; it must lie under the power bound across the whole throughput range."""
        x_lo, leak, per = self._state.segment[i]
        x_hi = tput_bound
        x_lo = min(x_lo, x_hi)
        cols = {o: k for k, o in enumerate(self.cfg.objectives)}
        pts = front
        for o in ("area", "cost"):      # oriented: larger is better, i.e. -area
            if o in cols:
                mine = -(self.space.area[i] if o == "area" else self.space.cost[i])
                pts = pts[pts[:, cols[o]] >= mine - _REL * abs(mine)]
        if not len(pts):
            return False
        tput, power = pts[:, cols["throughput"]], -pts[:, cols["power"]]
        if tput.max() < x_hi * (1 - _REL):
            return False
        order = np.argsort(-tput)
        tput, power = tput[order], power[order]
        least = np.minimum.accumulate(power)           # least power among the k highest throughputs
        below = np.append(tput[1:], -np.inf)           # where each step of the staircase begins
        for k in range(len(tput)):
            start = max(x_lo, below[k])
            if start > x_hi or tput[k] < x_lo:
                continue
            bound = max(pw, leak + per * start)
            if least[k] > bound * (1 + _REL):
                return False
        return True

    def _order_key(self, i: int, tput_bound: float) -> tuple:
        if self.single:     # best bound first; among equals the largest design (it dominates the others)
            return (-float(optimistic(self.space, i, tput_bound, self.power_bound(i))[0]),
                    -float(self.space.area[i]), i)
        exact = [o for o in self.cfg.objectives if o in ("area", "cost")]
        first = self.space.area[i] if exact[:1] == ["area"] else (self.space.cost[i] if exact else -tput_bound)
        return (float(first), -tput_bound, i)

    def _build_heap(self) -> None:
        sp = self.space
        todo = np.flatnonzero(sp.ok)
        self._heap = [self._order_key(int(i), float(sp.ub0[i])) for i in todo]
        heapq.heapify(self._heap)

    def next_design(self, study) -> int | None:
        """The next design to evaluate, or None when every design is decided or in flight on
        another worker. Level-1 bounds are computed here (and stored on the study) for the designs
        that reach the head of the queue; a design another worker is bounding is set aside until
        its bound arrives, and one in flight elsewhere until its trial ends (it may end unevaluated:
        a filler trial, a failed or interrupted one)."""
        while True:
            self.sync(study)
            if self._heap is None:
                self._build_heap()
            st, sp = self._state, self.space
            for i in sorted(self._proposed - st.inflight):   # its trial ended: evaluated, or not
                self._proposed.discard(i)                     # (a duplicate pruned on both workers,
                if i not in st.evaluated:                     # a failed trial): queue it again
                    heapq.heappush(self._heap, self._order_key(i, self.bound(i)))
            front = self._front()
            aside, flying, found = [], [], None
            while self._heap:
                head = self._heap[0]
                i = head[-1]
                if i in st.evaluated:
                    heapq.heappop(self._heap)
                    continue
                if i in st.inflight:
                    flying.append(heapq.heappop(self._heap))
                    continue
                b = self.bound(i)
                if self._order_key(i, b) > head:      # a tighter bound is known: requeue (best first)
                    heapq.heapreplace(self._heap, self._order_key(i, b))
                    continue
                if self.over_power(i):           # its power bound breaks the budget: pruned alone
                    heapq.heappop(self._heap)
                    continue
                if not self.can_win(i, b, front):
                    if self.single:
                        self._heap = []      # best first: nothing after it can win either
                        break
                    heapq.heappop(self._heap)
                    continue
                if i not in st.bound1:
                    if self._claimed_elsewhere(i):
                        aside.append(heapq.heappop(self._heap))
                        continue
                    store = study._storage
                    store.set_study_system_attr(study._study_id, f"{CLAIM_ATTR}{i}", [time.time(), self._token])
                    chip = sp.chip(i)
                    if self.needs_power:
                        pb = chip_power_bounds(chip, self.cfg.workloads, _efficiency(chip))
                        b1, st.power1[i] = pb.throughput_ub, pb.power_lb
                        st.segment[i] = (pb.throughput_lb, pb.leakage_w, pb.per_throughput)
                        value = [b1, pb.power_lb, *st.segment[i]]
                    else:
                        b1 = value = chip_bound(chip, self.cfg.workloads, _efficiency(chip))
                    st.bound1[i] = b1
                    store.set_study_system_attr(study._study_id, f"{BOUND_ATTR}{i}", value)
                    if self.on_bound:
                        self.on_bound(len(st.bound1), int(sp.ok.sum()))
                    self.sync(study)
                    front = self._front()
                    continue
                found = heapq.heappop(self._heap)[-1]
                break
            for item in aside + flying:
                heapq.heappush(self._heap, item)
            if found is not None:
                self._proposed.add(found)
                return found
            if not aside:
                break
            time.sleep(CLAIM_POLL_S)     # other workers are bounding what is left: wait for them
        # designs in flight elsewhere stay queued: the driver waits for their trials, then asks again
        return None

    def _claimed_elsewhere(self, i: int) -> bool:
        """Whether another worker started bounding point ``i`` recently (it will store the bound)."""
        c = self._state.claims.get(i)
        return bool(c) and c[1] != self._token and time.time() - c[0] < CLAIM_STALE_S

    def peek(self, study) -> int | None:
        """Decide the next design now (so the driver can stop the study when there is none)."""
        if self._next is None:
            self._next = self.next_design(study)
        return self._next


def make_exact_sampler(cfg: SweepConfig):
    """An :class:`ExactSampler` that is also an ``optuna.samplers.BaseSampler``."""
    import optuna  # deferred: optuna imports slowly
    base = optuna.samplers.BaseSampler
    cls = type("ExactSampler", (ExactSampler, base), {})
    return cls(cfg)


# --- the certificate -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Certificate:
    """How every design of the space was decided."""

    designs: int
    over_budget: dict
    evaluated: int
    pruned_level0: int
    pruned_dominance: int
    pruned_level1: int
    remaining: int
    proven: bool
    best_trial: int | None
    best_value: float | None
    largest_remaining_bound: float | None
    gap: float | None            # single objective: remaining bound / best - 1 (0 when proven)
    objectives: tuple = ()

    def lines(self) -> list[str]:
        over = ", ".join(f"{k} {n:,}" for k, n in self.over_budget.items()) or "none"
        out = [f"designs in the space: {self.designs:,}",
               f"over a budget known before evaluation: {sum(self.over_budget.values()):,} ({over})",
               f"pruned by the closed-form bound (level 0): {self.pruned_level0:,}",
               f"pruned by an evaluated design that dominates them: {self.pruned_dominance:,}",
               f"pruned by the placement's layout bounds (level 1): {self.pruned_level1:,}",
               f"evaluated: {self.evaluated:,}"]
        if self.proven:
            what = "the best design" if len(self.objectives) == 1 else "the Pareto front"
            out.append(f"proven optimal: every other design is bounded by {what} found")
        elif not self.remaining:
            out.append("no design of the space is feasible: each was evaluated, or its bounds show that no plan "
                       "fits it")
        else:
            gap = "" if self.gap is None else f", a proven gap of {100 * self.gap:.2f} %"
            out.append(f"not proven: {self.remaining:,} designs undecided; the largest remaining throughput "
                       f"bound is {self.largest_remaining_bound:,.6g}{gap}")
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def certificate(cfg: SweepConfig, study) -> tuple[Certificate, list[dict]]:
    """The certificate of ``study`` (from its storage alone) and one record per design decided
    without evaluation: its choices, the level that pruned it, its bound and the trial that
    bounds it."""
    s = ExactSampler(cfg)
    s.sync(study)
    sp, st = s.space, s._state
    front = s._front()
    n = sp.grid.size
    evaluated = set(st.evaluated)
    over = {k: int(m.sum()) for k, m in sp.over.items()}
    best_trial = best_value = None
    feas = [(num, v) for (num, _, ok, v) in st.evaluated.values() if ok]
    if s.single and feas:
        best_trial, best_o = max(feas, key=lambda x: (x[1][0], -x[0]))
        best_value = float(best_o[0] if cfg.directions[0] == "maximize" else -best_o[0])
    counts = {0: 0, "dom": 0, 1: 0}
    remaining, largest, records = 0, None, []
    for i in np.flatnonzero(sp.ok):
        i = int(i)
        if i in evaluated:
            continue
        level, by = None, best_trial
        b0 = float(sp.ub0[i])
        if not s.can_win(i, b0, front, level1=False):
            level = 0
        elif not s.can_win(i, float(st.dom[i]), front, level1=False):
            level, by = "dom", int(st.dom_by[i])
        elif i in st.bound1 and not s.can_win(i, s.bound(i), front):
            level = 1
        if level is None:
            remaining += 1
            b = s.bound(i)
            largest = b if largest is None else max(largest, b)
            continue
        counts[level] += 1
        if not s.single:
            by = _dominator(s, i, s.bound(i), front, st)
        records.append({"point": i, **sp.grid.point(i), "level": {0: "0", "dom": "dominance", 1: "1"}[level],
                        "throughput_bound": s.bound(i), "area_mm2": float(sp.area[i]), "bounded_by_trial": by})
    gap = None
    if s.single and best_value and cfg.objectives[0] == "throughput":
        gap = 0.0 if not remaining else max(0.0, largest / best_value - 1.0)
    cert = Certificate(n, over, len(evaluated & set(np.flatnonzero(sp.ok).tolist())), counts[0], counts["dom"],
                       counts[1], remaining, remaining == 0 and bool(feas), best_trial, best_value, largest, gap,
                       tuple(cfg.objectives))
    return cert, records


def _dominator(s: ExactSampler, i: int, b: float, front: np.ndarray, st: _State) -> int | None:
    """The earliest evaluated feasible trial that weakly dominates point ``i``'s optimistic point
    (None when only the segment check of throughput and power prunes it)."""
    point = optimistic(s.space, i, b, s.power_bound(i))
    feasible = sorted((num, v) for num, _, ok, v in st.evaluated.values() if ok)
    if not feasible:
        return None
    hit = np.flatnonzero(_dominating(point, np.array([v for _, v in feasible])))
    return feasible[hit[0]][0] if len(hit) else None


__all__ = ["Certificate", "ExactSampler", "certificate", "make_exact_sampler", "prepare"]
