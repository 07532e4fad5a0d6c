"""One candidate chip scored on a set of workloads: the pure function a search calls per trial.

For each workload, the placement finds the best execution plan on the chip; the plan runs within
the chip's power limit (the sweep's power budget, else the chip's TDP; :mod:`phaze.power` lowers
the clock until it fits) and the energy model gives its power; the silicon model gives area and
cost. Throughput over workloads is
their weighted geometric mean of tokens per second. Nothing here depends on the search: a
notebook calls :func:`evaluate_chip` directly.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .arch import Chip
from .area import silicon
from .calibrate import load_default_params, params_for
from .cost import Efficiency
from .placement import place
from .plan import graph_recompute, layer_modes
from .power import within_limit
from .schedule import schedule_layer
from .space import CONSTRAINTS, WorkloadSpec, power_budget
from .stage import _shard, expert_layout, layer_mix
from .system import apply_system

STATUS_RANK = {"OPTIMAL": 0, "FEASIBLE": 1, "HEURISTIC": 2}
BUDGET_UNIT = {"mm2": "mm²", "w": "W", "usd": "$"}   # a budget key's suffix as its SI symbol in reasons


@dataclass(frozen=True)
class WorkloadOutcome:
    """The best plan of one workload on the chip, or why there is none."""

    workload: str
    devices: int
    global_batch: int
    feasible: bool
    reason: str = ""
    plan: str = ""
    step_time_s: float = math.inf
    tokens_per_s: float = 0.0
    mfu: float = 0.0
    memory_per_device_bytes: float = 0.0
    breakdown_s: dict = field(default_factory=dict)
    power_w: float = 0.0
    energy_per_step_j: float = 0.0
    tokens_per_joule: float = 0.0
    schedule_status: str = ""      # worst status of the plan's layer schedules
    schedule_gap: float = 0.0      # largest proven gap of those schedules
    layouts_considered: int = 0
    layouts_solved: int = 0          # layouts the placement had to solve (the rest were bounded out)
    solve_time_s: float = 0.0
    clock_hz: float = 0.0            # the clock the plan ran at (below nominal: throttled to the limit)
    nominal_clock_hz: float = 0.0
    nominal_power_w: float = 0.0     # the plan's power at the nominal clock
    power_limit_w: float | None = None

    @property
    def throttled(self) -> bool:
        return self.feasible and self.clock_hz < self.nominal_clock_hz


@dataclass(frozen=True)
class ChipEvaluation:
    chip: str
    area_mm2: float
    cost_usd: float
    power_w: float                  # highest average power over the workloads' best plans
    throughput: float               # weighted geometric mean of tokens/s (0 if a workload fails)
    outcomes: tuple[WorkloadOutcome, ...]
    silicon: dict = field(default_factory=dict)
    evaluated: bool = True          # False: skipped after a budget known before evaluation failed

    @property
    def feasible_plans(self) -> bool:
        return self.evaluated and all(o.feasible for o in self.outcomes)

    def metric(self, name: str) -> float:
        """An objective's value (``throughput``, ``area``, ``throughput_per_w``, ...)."""
        base = {"throughput": self.throughput, "area": self.area_mm2, "power": self.power_w,
                "cost": self.cost_usd}
        if name in base:
            return base[name]
        denom = {"throughput_per_mm2": self.area_mm2, "throughput_per_w": self.power_w,
                 "throughput_per_usd": self.cost_usd}[name]
        return self.throughput / denom if denom > 0 else 0.0

    def violations(self, constraints) -> dict[str, float]:
        """Each budget's violation (<= 0 is met), in the budget's own unit, plus ``plans``: 1 when
        some workload has no plan that fits."""
        out = {}
        for key, bound in constraints:
            metric, sense = CONSTRAINTS[key]
            value = self.metric(metric)
            out[key] = value - bound if sense == "max" else bound - value
        out["plans"] = 0.0 if self.feasible_plans else 1.0
        return out

    def broken(self, constraints):
        """(key, metric, sense, value, bound) of every budget the design breaks."""
        for key, bound in constraints:
            metric, sense = CONSTRAINTS[key]
            v = self.metric(metric)
            if (sense == "max" and v > bound) or (sense == "min" and v < bound):
                yield key, metric, sense, v, bound

    def reasons(self, constraints) -> list[str]:
        """Why the design is infeasible, one phrase per broken budget or workload."""
        out = []
        for key, metric, sense, v, bound in self.broken(constraints):
            unit = BUDGET_UNIT[key.rsplit("_", 1)[-1]]
            out.append(f"{metric} {v:,.1f} {unit} {'over' if sense == 'max' else 'under'} "
                       f"the {'budget' if sense == 'max' else 'minimum'} {bound:,.1f} {unit}")
        return out + [f"{o.workload}: {o.reason}" for o in self.outcomes if not o.feasible]

    def reason_kinds(self, constraints) -> list[str]:
        """The kinds of :meth:`reasons`, for counting: ``area over budget``, ``no plan fits W``."""
        out = [f"{metric} {'over budget' if sense == 'max' else 'under minimum'}"
               for _, metric, sense, _, _ in self.broken(constraints)]
        return out + [f"no plan fits {o.workload}" for o in self.outcomes if not o.feasible]

    def to_dict(self) -> dict:
        return asdict(self)


def weighted_geomean(values, weights) -> float:
    if any(v <= 0 for v in values):
        return 0.0
    return math.exp(sum(w * math.log(v) for v, w in zip(values, weights, strict=True)) / sum(weights))


def _schedule_quality(spec: WorkloadSpec, chip: Chip, plan, eff: Efficiency) -> tuple[str, float]:
    """Worst status and largest gap of the layer schedules the plan uses (cached solves)."""
    if chip.unit_sharing == "sequential" or plan.schedule == "sequential":
        return "OPTIMAL", 0.0
    worst, gap = "OPTIMAL", 0.0
    recs = set(plan.stage_recompute or (plan.recompute,))
    kinds = layer_mix(_shard(spec.model, plan), expert_layout(spec.model, plan, chip))
    for r in layer_modes(recs):
        for _, model, moe in kinds:   # each kind of layer, as the step time schedules it
            for s in schedule_layer(model, chip, plan.mbs, plan.tp, bool(plan.sp), plan.attention,
                                    graph_recompute(r, plan.recompute_modules, plan.offload), eff, moe=moe):
                if STATUS_RANK.get(s.status, 3) > STATUS_RANK.get(worst, 3):
                    worst = s.status
                gap = max(gap, s.gap)
    return worst, gap


def evaluate_workload(spec: WorkloadSpec, chip: Chip, eff: Efficiency,
                      power_limit_w: float | None = None) -> WorkloadOutcome:
    """The best plan of ``spec`` on ``chip``, run within ``power_limit_w`` (None: the chip's TDP,
    if it has one). The plan is chosen at the nominal clock, then throttled (:mod:`phaze.power`)."""
    chip = apply_system(chip, spec.system).with_execution(spec.options.execution)
    head = dict(workload=spec.model.name, devices=spec.devices, global_batch=spec.global_batch)
    res = place(spec.model, chip, spec.devices, spec.global_batch, spec.options, eff, top=1, with_baseline=False)
    if res.best is None:
        return WorkloadOutcome(**head, feasible=False, reason=res.infeasible_reason,
                               layouts_considered=res.layouts_considered, layouts_solved=res.layouts_solved,
                               solve_time_s=res.solve_time_s)
    plan = res.best.plan
    run = within_limit(spec.model, chip, spec.devices, spec.global_batch, plan, eff, power_limit_w, res.best.result)
    r, energy = run.result, run.energy
    status, gap = _schedule_quality(spec, chip, plan, eff)
    return WorkloadOutcome(
        **head, feasible=True, plan=plan.label(), step_time_s=r.step_time_s, tokens_per_s=r.tokens_per_s,
        mfu=r.mfu, memory_per_device_bytes=r.memory_per_device_bytes, breakdown_s=dict(r.breakdown_s),
        power_w=energy.power_w, energy_per_step_j=energy.energy_per_step_j,
        tokens_per_joule=energy.tokens_per_joule, schedule_status=status, schedule_gap=gap,
        layouts_considered=res.layouts_considered, layouts_solved=res.layouts_solved,
        solve_time_s=res.solve_time_s, clock_hz=run.clock_hz, nominal_clock_hz=run.nominal_clock_hz,
        nominal_power_w=run.nominal_power_w, power_limit_w=run.power_limit_w)


def power_limit(chip: Chip, constraints=()) -> float | None:
    """The power limit a candidate runs within: the tightest power budget, else the chip's TDP."""
    budget = power_budget(constraints)
    return chip.tdp_w if budget is None else budget


def evaluate_chip(chip: Chip, workloads: tuple[WorkloadSpec, ...], efficiency: Efficiency | None = None,
                  constraints=(), skip_if_over_budget: bool = True) -> ChipEvaluation:
    """Score ``chip`` on ``workloads``: per workload the best plan, run within the power limit
    (:func:`power_limit`), its power, and the chip's area, cost and throughput. With
    ``skip_if_over_budget``, a chip whose area or cost already breaks a
    budget is not evaluated on the workloads (its throughput and power are reported as 0)."""
    eff = params_for(chip, load_default_params()) if efficiency is None else efficiency
    si = silicon(chip)
    pre = ChipEvaluation(chip.name, si.area_mm2, si.cost_usd, 0.0, 0.0, (), si.to_dict(), evaluated=False)
    static = [(k, b) for k, b in constraints if CONSTRAINTS[k][0] in ("area", "cost")]
    if skip_if_over_budget and any(v > 0 for k, v in pre.violations(static).items() if k != "plans"):
        return pre
    limit = power_limit(chip, constraints)
    outcomes = tuple(evaluate_workload(w, chip, eff, limit) for w in workloads)
    throughput = weighted_geomean([o.tokens_per_s for o in outcomes], [w.weight for w in workloads])
    power = max((o.power_w for o in outcomes if o.feasible), default=0.0)
    return ChipEvaluation(chip.name, si.area_mm2, si.cost_usd, power, throughput, outcomes, si.to_dict())

