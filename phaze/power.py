"""The power limit a chip obeys: its clock drops until the step's average power fits (DVFS).

A real accelerator never runs above its power limit: its power manager lowers the clock, and the
supply voltage with it, until the power fits. :func:`within_limit` does the same to a plan:

- the limit is the chip's TDP (``tdp_w`` of a shipped chip) or the one given (a sweep's power
  budget, a searched ``tdp_w``);
- the core voltage follows the clock (:func:`phaze.area.core_voltage_ratio`: linear V-f scaling
  down to a floor), so the core's switching energy per operation scales with V^2 and its dynamic
  power with f V^2; HBM and link energies do not change. The nominal clock is the one a chip
  holds at its TDP under full load, not the top of its V-f curve (measured: a chip file's
  ``held_clock_share``, else the H100's ``HELD_CLOCK_SHARE``), so the floor is close: little
  voltage is left to drop;
- the step is evaluated again at that clock (:func:`phaze.step.evaluate` on the chip with the
  lower clock): compute slows, HBM- and link-bound work does not;
- clocks are taken in bins of :data:`CLOCK_BIN` of the nominal one (a GPU's clock table moves in
  steps of about 15 MHz, 1 % of an H100's); the highest bin whose power fits is chosen
  (bisection: power falls with the clock).

The result says the clock the plan ran at, whether it was throttled and the power at the nominal
clock, so a printout can say so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from functools import lru_cache

from .arch import Chip
from .area import (
    HELD_CLOCK_SHARE,
    V_FLOOR,
    V_FLOOR_OF_TOP,
    Energy,
    core_voltage_ratio,
    silicon,
    step_energy,
    v_floor,
    voltage_ratio,
)
from .cost import IDEAL, Efficiency
from .placement import Placement, PlacementOptions, PlacementResult, place
from .plan import Plan
from .step import StepResult, evaluate
from .workload import Model

CLOCK_BIN = 0.01          # clock bins, as a share of the nominal clock (H100: 15 MHz of 1980)
MIN_CLOCK_RATIO = 0.30    # the lowest clock considered; below it the plan cannot meet the limit


@lru_cache(maxsize=256)
def throttled_power_floor(clock_over_reference: float, floor: float) -> float:
    """A throttled plan's power over its limit is at least this, on a chip whose nominal clock is
    ``clock_over_reference`` of its reference clock (:func:`phaze.area.core_voltage_ratio`) and
    whose voltage floor is ``floor`` (:func:`phaze.area.v_floor`). The
    plan runs at the highest bin s whose power fits, so the next bin s' = s + CLOCK_BIN is over
    the limit; and P(s) >= (r v)^2 P(s'), with r = s / s' and v = V(s) / V(s') (v >= r): from s'
    to s the step time grows at most by 1 / r (every duration scales with the clock or not at all),
    the core's energy per operation falls by v^2, the clocked logic's busy cycles at most by r,
    leakage power by v, and HBM and link energies not at all. The smallest factor over the bins:
    at the lowest bin, where the voltage is on its floor (r^2), or where it reaches the floor
    (r^4)."""
    bins = round((1.0 - MIN_CLOCK_RATIO) / CLOCK_BIN)
    worst = 1.0
    for k in range(1, bins + 1):
        s, up = 1.0 - k * CLOCK_BIN, 1.0 - (k - 1) * CLOCK_BIN
        v = voltage_ratio(s * clock_over_reference, floor) / voltage_ratio(up * clock_over_reference, floor)
        worst = min(worst, (s / up * v) ** 2)
    return worst


def lowest_leakage_w(chip: Chip) -> float:
    """``chip``'s leakage at the lowest clock a throttle reaches (:data:`MIN_CLOCK_RATIO`): no plan
    on it draws less under a power limit."""
    ratio = MIN_CLOCK_RATIO * chip.clock_hz / chip.reference_clock_hz
    return silicon(chip).leakage_w * voltage_ratio(ratio, v_floor(chip)) / core_voltage_ratio(chip)


@dataclass(frozen=True)
class PoweredStep:
    """A plan run within a power limit: its step at the clock it ran at, and its energy."""

    result: StepResult
    energy: Energy
    clock_hz: float
    nominal_clock_hz: float
    power_limit_w: float | None
    nominal_power_w: float          # the average power at the nominal clock
    fits_limit: bool = True         # false: over the limit even at MIN_CLOCK_RATIO
    tdp_w: float | None = None      # the chip's published TDP, if any

    @property
    def throttled(self) -> bool:
        return self.clock_hz < self.nominal_clock_hz

    @property
    def energy_per_token_j(self) -> float:
        """Joules per token over the cluster."""
        return 1.0 / self.energy.tokens_per_joule if self.energy.tokens_per_joule > 0 else math.inf

    def note(self) -> str:
        """One line: the clock, the power and the limit."""
        ghz = self.clock_hz / 1e9
        if not self.power_limit_w:      # nothing to fit: never throttled
            return f"at the nominal {ghz:.2f} GHz (no power limit: the chip file gives no TDP)"
        lim = f"{self.power_limit_w:.0f} W"
        if not self.fits_limit:
            return (f"{self.nominal_power_w:.0f} W at the nominal {self.nominal_clock_hz / 1e9:.2f} GHz; over the "
                    f"{lim} limit even at {ghz:.2f} GHz ({self.energy.power_w:.0f} W)")
        if self.throttled:
            return (f"throttled to {ghz:.2f} GHz ({100 * self.clock_hz / self.nominal_clock_hz:.0f} % of the nominal "
                    f"{self.nominal_clock_hz / 1e9:.2f} GHz) to fit the {lim} limit: {self.nominal_power_w:.0f} W at "
                    f"the nominal clock")
        return f"at the nominal {ghz:.2f} GHz, within the {lim} limit"

    def to_dict(self) -> dict:
        """Plain data of the power side (the step result itself: ``result.to_dict()``)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "result"}
        d["energy"] = self.energy.to_dict()
        d["throttled"] = self.throttled
        d["energy_per_token_j"] = self.energy_per_token_j
        return d


def at_clock(chip: Chip, clock_ratio: float) -> Chip:
    """``chip`` at ``clock_ratio`` of its clock (every unit rate follows the clock)."""
    return chip if clock_ratio == 1.0 else replace(chip, clock_hz=chip.clock_hz * clock_ratio)


def within_limit(model: Model, chip: Chip, devices: int, global_batch: int, plan: Plan,
                 eff: Efficiency = IDEAL, limit_w: float | None = None, result: StepResult | None = None,
                 coefficients=None) -> PoweredStep:
    """``plan`` run at the highest clock bin at which its average power is within the limit
    (``limit_w``, else the chip's ``tdp_w``; neither: the nominal clock). ``result``: the step at
    the nominal clock, if already evaluated."""
    limit = limit_w if limit_w is not None else chip.tdp_w
    r1 = result if result is not None else evaluate(model, chip, devices, global_batch, plan, eff)
    e1 = step_energy(model, chip, devices, global_batch, plan, eff, r1, coefficients)
    if limit is None or not r1.fits or e1.power_w <= limit:
        return PoweredStep(r1, e1, chip.clock_hz, chip.clock_hz, limit, e1.power_w, tdp_w=chip.tdp_w)

    def run(k: int):
        s = 1.0 - k * CLOCK_BIN
        c = at_clock(chip, s)
        r = evaluate(model, c, devices, global_batch, plan, eff)
        e = step_energy(model, c, devices, global_batch, plan, eff, r, coefficients)   # at c's core voltage
        # MFU and HFU against the nominal clock's peak, the datasheet's, as a throttled GPU's are quoted
        # (against the lower clock's peak they would rise as the clock falls)
        ratio = c.clock_hz / chip.clock_hz
        return replace(r, mfu=r.mfu * ratio, hfu=r.hfu * ratio), e, c

    hi = round((1.0 - MIN_CLOCK_RATIO) / CLOCK_BIN)     # the lowest bin
    r, e, c = run(hi)
    if e.power_w > limit:
        return PoweredStep(r, e, c.clock_hz, chip.clock_hz, limit, e1.power_w, fits_limit=False, tdp_w=chip.tdp_w)
    best = (r, e, c)
    lo = 0                                              # bin lo is over the limit, bin hi within
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = run(mid)
        if got[1].power_w <= limit:
            hi, best = mid, got
        else:
            lo = mid
    r, e, c = best
    return PoweredStep(r, e, c.clock_hz, chip.clock_hz, limit, e1.power_w, tdp_w=chip.tdp_w)


def place_within_limit(model: Model, chip: Chip, devices: int, global_batch: int,
                       options: PlacementOptions, eff: Efficiency = IDEAL, top: int = 1,
                       limit_w: float | None = None, progress=None,
                       with_baseline: bool = True) -> tuple[PlacementResult, dict[Plan, PoweredStep]]:
    """The ``top`` fastest plans within the power limit (``limit_w``, else the chip's TDP): a
    placement whose ``top`` and ``best`` are those plans with their steps at the clock they run
    at, and each plan's run, fastest first. One plan per layout, each layout's the one its
    placement picks at the nominal clock; the baseline is left at the nominal clock.

    A throttled plan may fall behind one that draws less, so plans run within the limit in the
    order of their step at the nominal clock until the next one's nominal step is no shorter than
    the ``top``-th fastest run that meets the limit (throttling only slows a plan: none after it
    can win); when the placed plans run out first, more are placed. A plan within the limit at the
    nominal clock ends it at once. A plan over the limit even at the lowest clock ranks after
    every plan that meets it; when the die's leakage at the lowest voltage is over the limit, no
    plan meets it, and the ``top`` first placed are run."""
    keep = max(1, top)
    k, spent = keep, 0.0
    runs: dict = {}          # plan -> (nominal rank, PoweredStep)
    limit = limit_w if limit_w is not None else chip.tdp_w
    hopeless = limit is not None and lowest_leakage_w(chip) > limit

    def to_beat() -> float:
        """The ``top``-th fastest run that meets the limit (none yet: infinity)."""
        met = sorted(r.result.step_time_s for _, r in runs.values() if r.fits_limit)
        return met[keep - 1] if len(met) >= keep else math.inf

    while True:
        res = place(model, chip, devices, global_batch, options, eff, top=k, progress=progress,
                    with_baseline=with_baseline)
        spent += res.solve_time_s
        proven = len(res.top) < k        # every layout that fits was placed
        for rank, p in enumerate(res.top):
            if p.result.step_time_s >= to_beat():
                proven = True
                break
            if p.plan not in runs:
                runs[p.plan] = (rank, within_limit(model, chip, devices, global_batch, p.plan, eff, limit_w,
                                                   p.result))
            if hopeless and len(runs) >= keep:
                proven = True
                break
        else:   # every plan not placed is no faster at the nominal clock than the last one placed
            proven = proven or res.top[-1].result.step_time_s >= to_beat()
        if proven:
            break
        k *= 4
    ranked = sorted(runs.items(), key=lambda kv: (not kv[1][1].fits_limit, kv[1][1].result.step_time_s,
                                                  kv[1][0]))[:keep]
    res = replace(res, solve_time_s=spent)
    if not ranked:
        return res, {}
    top_plans = tuple(Placement(plan, ps.result) for plan, (_, ps) in ranked)
    return replace(res, top=top_plans, best=top_plans[0]), {plan: ps for plan, (_, ps) in ranked}


__all__ = ["CLOCK_BIN", "HELD_CLOCK_SHARE", "MIN_CLOCK_RATIO", "V_FLOOR", "V_FLOOR_OF_TOP", "PoweredStep", "at_clock",
           "lowest_leakage_w", "place_within_limit", "throttled_power_floor", "voltage_ratio", "within_limit"]
