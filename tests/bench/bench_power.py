"""Benchmark: every shipped workload on every shipped chip with a TDP stays within that TDP.

For each chip with a published TDP and each shipped workload (1024 chips, global batch 1024, the
workload's own sequence length), the best plan of a narrowed placement space (tp 1, 2, 4, 8; mbs
1, 2; vp 1, 2, 4) runs within the chip's power limit (phaze/power.py). Prints per chip: plans
placed, plans throttled, the largest power at the nominal clock, the largest power run, the lowest
clock; and fails (exit 1) if any plan draws more than its chip's TDP.

Run: python tests/bench/bench_power.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from phaze.api import as_chip, as_model, calibrated_efficiency
from phaze.placement import PlacementOptions, place
from phaze.power import within_limit

ROOT = Path(__file__).resolve().parents[2]
CHIPS = ("v100-sxm2-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h100-hbm2e-96gb-500w", "h200-sxm", "b200", "gb200",
         "tpuv4")
DEVICES, BATCH = 1024, 1024
OPTIONS = PlacementOptions(tp=(1, 2, 4, 8), mbs=(1, 2), vp=(1, 2, 4))


def main() -> int:
    workloads = sorted(p.stem for p in (ROOT / "workloads").glob("*.yaml"))
    bad = 0
    for name in CHIPS:
        chip = as_chip(name)
        eff = calibrated_efficiency(chip)
        t = time.perf_counter()
        placed = throttled = 0
        worst_nominal = worst_run = 0.0
        lowest = 1.0
        for w in workloads:
            model = as_model(w)
            res = place(model, chip, DEVICES, BATCH, OPTIONS, eff, top=1)
            if res.best is None:
                continue
            ps = within_limit(model, chip, DEVICES, BATCH, res.best.plan, eff, result=res.best.result)
            placed += 1
            throttled += ps.throttled
            worst_nominal = max(worst_nominal, ps.nominal_power_w)
            worst_run = max(worst_run, ps.energy.power_w)
            lowest = min(lowest, ps.clock_hz / ps.nominal_clock_hz)
            if not ps.fits_limit or ps.energy.power_w > chip.tdp_w * (1 + 1e-9):
                bad += 1
                print(f"  OVER: {w} on {name}: {ps.note()}")
        print(f"{name} (TDP {chip.tdp_w:g} W): {placed} of {len(workloads)} workloads placed, {throttled} throttled; "
              f"largest power at the nominal clock {worst_nominal:.0f} W, largest run {worst_run:.0f} W, "
              f"lowest clock {100 * lowest:.0f} % of nominal ({time.perf_counter() - t:.0f} s)", flush=True)
    print(f"plans over their chip's TDP: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
