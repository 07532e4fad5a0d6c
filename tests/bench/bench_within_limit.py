"""Benchmark: how much a search's candidate understates a design its power budget throttles.

A search's candidate runs each workload's best plan at the nominal clock within the power limit
(throttled when over it: ``candidate.evaluate_workload``); the fastest plan within the limit
(``power.place_within_limit``, what ``phaze place`` lists) may be another layout's, one that draws
less. The exact search's power bounds rely on the first (docs/power.md). For every design within
the budgets known before evaluation of two spaces under a power budget, this prints: the designs
throttled, those whose workloads have a faster plan within the limit and by how much (the
throughput's weighted geometric mean), and whether the best design changes.

Run: python tests/bench/bench_within_limit.py
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import tqdm

from phaze.calibrate import load_default_params, params_for
from phaze.candidate import evaluate_chip, power_limit, weighted_geomean
from phaze.exact import prepare
from phaze.power import place_within_limit
from phaze.space import load_sweep
from phaze.system import apply_system

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# (config, the power budget added in watts): the exact-search benchmark's 250 W space, and the quick
# start's space at half its budget (its designs draw 68-252 W at the nominal clock)
SPACES = ((HERE / "lone_best_432.yaml", 250.0), (ROOT / "search" / "quickstart.yaml", 150.0))


def main() -> int:
    params = load_default_params()
    for path, budget in SPACES:
        cfg = load_sweep(path)
        cfg = replace(cfg, constraints=(*[(k, b) for k, b in cfg.constraints if k != "power_w"], ("power_w", budget)))
        t0 = time.perf_counter()
        rows = []           # (chip, candidate's throughput, the fastest within the limit's)
        sp = prepare(cfg)     # the designs within the budgets known before evaluation, as a sweep takes them
        chips = [sp.chip(int(i)) for i in np.flatnonzero(sp.ok)]
        for chip in tqdm.tqdm(chips, desc=f"{cfg.name} at {budget:.0f} W", unit="design", file=sys.stderr):
            ev = evaluate_chip(chip, cfg.workloads, constraints=cfg.constraints)
            if not ev.feasible_plans:
                continue
            if not any(o.throttled for o in ev.outcomes):
                rows.append((chip, ev.throughput, ev.throughput, False))
                continue
            eff, limit, tps = params_for(chip, params), power_limit(chip, cfg.constraints), []
            for spec in cfg.workloads:
                c = apply_system(chip, spec.system).with_execution(spec.options.execution)
                res, _ = place_within_limit(spec.model, c, spec.devices, spec.global_batch, spec.options, eff, 1,
                                            limit, with_baseline=False)
                tps.append(res.best.result.tokens_per_s)
            rows.append((chip, ev.throughput, weighted_geomean(tps, [w.weight for w in cfg.workloads]), True))
        throttled = [r for r in rows if r[3]]
        gains = [r[2] / r[1] - 1 for r in throttled]
        better = [g for g in gains if g > 1e-9]
        worse = [g for g in gains if g < -1e-9]
        best_search = max(rows, key=lambda r: r[1])
        best_limit = max(rows, key=lambda r: r[2])
        print(f"\n## {cfg.name} at {budget:.0f} W: {len(rows)} feasible designs, {len(throttled)} throttled "
              f"({time.perf_counter() - t0:.0f} s)")
        print(f"faster within the limit than the candidate's plan: {len(better)} of {len(throttled)}"
              + (f"; by {100 * min(better):.2f}-{100 * max(better):.2f} % (median "
                 f"{100 * statistics.median(better):.2f} %)" if better else ""))
        print(f"the candidate's plan faster (must be none): {len(worse)}")
        print(f"best design, as the search scores it: {best_search[0].name} {best_search[1]:,.0f} tokens/s; "
              f"with the fastest plans within the limit: {best_limit[0].name} {best_limit[2]:,.0f} tokens/s "
              f"({'the same design' if best_search[0] == best_limit[0] else 'another design'})")
        if worse:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
