"""Benchmark: how close the samplers get to the exhaustive grid with a tenth of its evaluations.

The grid of ``tests/bench/search_quality.yaml`` (270 designs) is evaluated once with ``phaze
sweep`` (kept in ``results/bench-search-quality-sweep/``; a rerun reuses it). Each sampler then
searches the same space with a budget of 10 % of the grid's designs (repeat proposals are pruned
unevaluated and do not count, as in ``phaze search``), scoring designs from the sweep's table,
which is exactly what evaluating them again would give. Five seeds each.

- single objective (throughput, under the area budget): TPE's best / the grid's best;
- two objectives (throughput up, area down): the hypervolume of the feasible front found /
  the grid front's, reference point (0 tokens/s, the largest feasible area).

Run: python tests/bench/bench_search_quality.py
"""
from __future__ import annotations

import itertools
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from phaze.area import silicon
from phaze.report import pareto_mask, trials_frame
from phaze.search import _key, _optuna, make_sampler, open_study, sweep, template_choices
from phaze.space import build_chip, load_sweep

HERE = Path(__file__).resolve().parent
SEEDS = range(5)


def hypervolume_2d(points: np.ndarray, ref: tuple[float, float]) -> float:
    """Area dominated by ``points`` (throughput up, area down) and bounded by ``ref``."""
    pts = [(t, a) for t, a in points if t > ref[0] and a < ref[1]]
    pts.sort(key=lambda p: p[1])                     # by area, smallest first
    hv, best_t = 0.0, ref[0]
    for i, (t, a) in enumerate(pts):
        best_t = max(best_t, t)
        nxt = pts[i + 1][1] if i + 1 < len(pts) else ref[1]
        hv += (best_t - ref[0]) * (nxt - a)
    return hv


def run(cfg, table: dict, budget: int, seed: int) -> list[tuple]:
    """One sampler run against the table; returns the evaluated (throughput, area, feasible)."""
    optuna = _optuna()
    cfg = replace(cfg, seed=seed)
    study = optuna.create_study(directions=cfg.directions, sampler=make_sampler(cfg))
    seen, skipped, proposals = {}, set(), 0
    study.enqueue_trial(template_choices(cfg))
    while len(seen) < budget and proposals < 20 * budget:
        trial = study.ask()
        proposals += 1
        key = _key({d.param: d.suggest(trial) for d in cfg.searched})
        if key in seen or key in skipped:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        values, violation = table[key]
        trial.set_constraint("area_mm2", violation)
        if violation > 0:          # over the area budget: known before evaluation, costs nothing
            skipped.add(key)
        else:
            seen[key] = (*values, True)
        study.tell(trial, values[0] if len(values) == 1 else list(values))
    return list(seen.values())


def main() -> int:
    cfg = load_sweep(HERE / "search_quality.yaml")
    t = time.perf_counter()
    res = sweep(cfg, progress=True, write=False)
    print(f"grid: {cfg.grid_size()} designs, sweep {time.perf_counter() - t:.0f} s (0 s when reused)")
    study = open_study(cfg, res.storage, res.study_name, create=False, heartbeat=False)
    frame = trials_frame(study, cfg.objectives)
    done = frame[frame["state"] == "COMPLETE"]
    params = [c for c in done.columns if c.startswith("param:")]
    table = {}
    for _, r in done.iterrows():
        key = tuple(sorted((c[6:], r[c]) for c in params))
        table[key] = ((r["throughput"], r["area"]), r["area_mm2"] - dict(cfg.constraints)["area_mm2"])
    skipped = sum((study.user_attrs.get("sweep_skipped") or {}).values())
    # designs the sweep skipped (over the area budget) are infeasible: give them their area
    grid = cfg.grid()
    for combo in itertools.product(*grid.values()):
        choices = dict(zip(grid, combo, strict=True))
        key = _key(choices)
        if key not in table:
            area = silicon(build_chip(cfg.base, cfg.values(choices), cfg.process_node_nm)).area_mm2
            table[key] = ((0.0, area), area - dict(cfg.constraints)["area_mm2"])
    assert len(table) == cfg.grid_size(), (len(table), skipped)
    feas = np.array([v for v, c in table.values() if c <= 0])
    best = feas[:, 0].max()
    ref = (0.0, feas[:, 1].max() * 1.0001)
    grid_hv = hypervolume_2d(feas[pareto_mask(feas, ["maximize", "minimize"])], ref)
    budget = max(1, round(0.10 * cfg.grid_size()))
    print(f"feasible {len(feas)}, grid best {best:,.0f} tokens/s, budget {budget} evaluations per run")

    single = replace(cfg, objectives=("throughput",), sampler="tpe")
    one = {k: ((v[0],), c) for k, (v, c) in table.items()}
    ratios = []
    for seed in SEEDS:
        got = run(single, one, budget, seed)
        ratios.append(max((g[0] for g in got if g[-1]), default=0.0) / best)
    rows = [("single-objective, TPE: best found / grid best", ratios, 0.99)]
    for sampler in ("nsga2", "tpe", "random"):
        s = replace(cfg, sampler=sampler)
        hv = []
        for seed in SEEDS:
            got = np.array([(g[0], g[1]) for g in run(s, table, budget, seed) if g[-1]])
            hv.append(hypervolume_2d(got[pareto_mask(got, ["maximize", "minimize"])], ref) / grid_hv
                      if len(got) else 0.0)
        rows.append((f"two objectives, {sampler}: hypervolume / grid's", hv, 0.95))
    ok = True
    print(f"\n| measure ({len(SEEDS)} seeds, {budget} evaluations = 10 % of {cfg.grid_size()}) "
          f"| mean | min | target |")
    print("|---|---|---|---|")
    for name, vals, target in rows:
        print(f"| {name} | {100 * statistics.mean(vals):.1f} % | {100 * min(vals):.1f} % | "
              f">= {100 * target:.0f} % |")
        if name.startswith(("single", "two objectives, tpe")):      # the defaults of phaze search
            ok &= statistics.mean(vals) >= target
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
