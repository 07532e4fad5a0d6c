"""Benchmark: the exact search against brute force, and the heuristic samplers against both.

For each space, the grid is evaluated once with ``phaze sweep`` (the brute force; kept in
``results/<space>-sweep/`` and reused on a rerun). Then:

- ``--sampler exact`` runs for real (every design it evaluates is evaluated, in a fresh study):
  designs evaluated against the designs within the budgets, wall time, its certificate, and
  whether its answer equals the grid's (best design, or the whole front);
- the lone-best space also with two objectives, throughput and power (and a 600 W budget), and
  with two HBM bandwidths (432 designs) at 600 W and at 250 W (below many designs' power: they
  are throttled);
- TPE, random and NSGA-II run 20 seeds each against the sweep's table (the value of a design is
  exactly what evaluating it again gives), with a budget of 10 % of the designs within the budgets
  known before evaluation. The budget counts evaluations of in-budget designs; proposals over
  the area budget and repeats are counted apart and cost nothing.

Single objective: best found / grid best, and the runs that find the grid's best. Two objectives:
hypervolume of the feasible front found / the grid front's (reference: 0 tokens/s and the largest
feasible area).

Run: python tests/bench/bench_exact.py [--seeds 20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from phaze.exact import certificate, prepare
from phaze.report import pareto_mask, trials_frame
from phaze.search import _key, _optuna, make_sampler, open_study, search, sweep, template_choices
from phaze.space import load_sweep

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# (config, objectives replacing the config's or None, a power budget added in watts or None)
SPACES = [(ROOT / "search" / "quickstart.yaml", None, None), (HERE / "lone_best.yaml", None, None),
          (HERE / "lone_best.yaml", ("throughput", "power"), 600.0), (HERE / "search_quality.yaml", None, None),
          (HERE / "lone_best_432.yaml", ("throughput", "power"), 600.0),
          (HERE / "lone_best_432.yaml", ("throughput", "power"), 250.0),   # below many designs' power
          (HERE / "moe_space.yaml", None, None),                           # a mixture of experts
          (HERE / "long_context_space.yaml", None, None),                  # context parallelism
          (HERE / "schedules_space.yaml", None, None),                     # DualPipe and offload
          (HERE / "schedules_space.yaml", ("throughput", "power"), 700.0)]


def hypervolume_2d(points: np.ndarray, ref: tuple[float, float]) -> float:
    """Area dominated by ``points`` (throughput up, area down) and bounded by ``ref``."""
    pts = sorted((a, t) for t, a in points if t > ref[0] and a < ref[1])
    hv, best_t = 0.0, ref[0]
    for k, (a, t) in enumerate(pts):
        best_t = max(best_t, t)
        nxt = pts[k + 1][0] if k + 1 < len(pts) else ref[1]
        hv += (best_t - ref[0]) * (nxt - a)
    return hv


def table_of(cfg) -> tuple[dict, float]:
    """Brute force: design key -> (objective values, feasible) for every design within the budgets
    known before evaluation (from the sweep's study), and the sweep's wall time."""
    t = time.perf_counter()
    res = sweep(cfg, progress=True, write=False)
    wall = time.perf_counter() - t
    study = open_study(cfg, res.storage, res.study_name, create=False, heartbeat=False)
    frame = trials_frame(study, cfg.objectives)
    done = frame[(frame["state"] == "COMPLETE") & frame["evaluated"].astype(bool)]
    params = [c for c in done.columns if c.startswith("param:")]
    table = {}
    for _, r in done.iterrows():
        key = tuple(sorted((c[6:], r[c]) for c in params))
        table[key] = (tuple(float(r[o]) for o in cfg.objectives), bool(r["feasible"]))
    return table, wall


def run_sampler(cfg, table: dict, budget: int, seed: int) -> tuple[list, int, int]:
    """One heuristic run against the table: (evaluated (values, feasible), over-budget proposals,
    repeat proposals)."""
    optuna = _optuna()
    cfg = replace(cfg, seed=seed)
    study = optuna.create_study(directions=cfg.directions, sampler=make_sampler(cfg))
    seen, over, repeats, proposals = {}, set(), 0, 0
    study.enqueue_trial(template_choices(cfg))
    while len(seen) < budget and proposals < 50 * budget:
        trial = study.ask()
        proposals += 1
        key = _key({d.param: d.suggest(trial) for d in cfg.searched})
        if key in seen or key in over:
            repeats += 1
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        if key not in table:          # over a budget known before evaluation: free, infeasible
            over.add(key)
            trial.set_constraint("budget", 1.0)
            worst = [0.0 if d == "maximize" else 1e12 for d in cfg.directions]
            study.tell(trial, worst[0] if len(worst) == 1 else worst)
            continue
        values, feasible = table[key]
        seen[key] = (values, feasible)
        trial.set_constraint("budget", 0.0 if feasible else 1.0)
        study.tell(trial, values[0] if len(values) == 1 else list(values))
    return list(seen.values()), len(over), repeats


def run_exact(cfg) -> tuple[dict, object, float]:
    with tempfile.TemporaryDirectory() as d:
        url = f"sqlite:///{Path(d) / 'study.db'}"
        c = replace(cfg, sampler="exact", trials=10 ** 9)
        t = time.perf_counter()
        res = search(c, storage=url, progress=False, write=False)
        wall = time.perf_counter() - t
        study = open_study(c, url, res.study_name, create=False, heartbeat=False)
        cert, _ = certificate(c, study)
        found = {}
        for tr in study.get_trials(deepcopy=False):
            if tr.state.name == "COMPLETE" and tr.user_attrs.get("evaluated"):
                found[_key(tr.params)] = (tuple(tr.values), bool(tr.user_attrs.get("feasible")))
    return found, cert, wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--only", default=None, help="one space (its config's file stem)")
    args = ap.parse_args()
    ok = True
    for path, objectives, budget in SPACES:
        if args.only and path.stem != args.only:
            continue
        cfg = load_sweep(path)
        if objectives:
            cfg = replace(cfg, name=f"{cfg.name}-{'-'.join(objectives)}" + (f"-{budget:.0f}w" if budget != 600 else ""),
                          objectives=objectives, constraints=(*cfg.constraints, ("power_w", budget)))
        table, sweep_wall = table_of(cfg)
        sp = prepare(cfg)
        in_budget = int(sp.ok.sum())
        assert len(table) == in_budget, (len(table), in_budget)
        feas = {k: v for k, (v, f) in table.items() if f}
        single = len(cfg.objectives) == 1
        print(f"\n## {cfg.name}: {cfg.grid_size()} designs, {in_budget} within the budgets known before evaluation, "
              f"{len(feas)} feasible; objectives {', '.join(cfg.objectives)}; brute force (sweep) {sweep_wall:.0f} s "
              f"(0 when reused)")
        found, cert, wall = run_exact(cfg)
        if single:
            best = max(v[0] for v in feas.values())
            got = max((v[0] for v, f in found.values() if f), default=0.0)
            same = abs(got / best - 1) < 1e-9
            ref = None
        else:
            arr = np.array(list(feas.values()))
            grid_front = {tuple(np.round(r, 6)) for r in arr[pareto_mask(arr, cfg.directions)]}
            fa = np.array([v for v, f in found.values() if f])
            same = {tuple(np.round(r, 6)) for r in fa[pareto_mask(fa, cfg.directions)]} == grid_front
            ref = (0.0, float(arr[:, 1].max()) * 1.0001)
            grid_hv = hypervolume_2d(arr[pareto_mask(arr, cfg.directions)], ref)
            print(f"the grid's front: {len(grid_front)} designs")
        ok &= same and cert.proven
        print(f"exact: {cert.evaluated} evaluated of {in_budget} ({100 * cert.evaluated / in_budget:.1f} %), "
              f"pruned level 0 {cert.pruned_level0}, dominance {cert.pruned_dominance}, level 1 {cert.pruned_level1}; "
              f"{'proven' if cert.proven else 'NOT proven'}; answer equals the grid's: {same}; {wall:.1f} s")
        budget = max(1, round(0.10 * in_budget))
        print(f"\n| sampler ({args.seeds} seeds, {budget} evaluations = 10 % of {in_budget} in budget) | "
              + ("runs finding the grid's best | best found / grid's best (mean, min)" if single else
                 "hypervolume / grid front's (mean, min)")
              + " | over-budget proposals (mean) | repeat proposals (mean) |")
        print("|---|---|---|---|" + ("---|" if single else ""))
        for sampler in ("tpe", "random", "nsga2"):
            s = replace(cfg, sampler=sampler)
            scores, hits, overs, reps = [], 0, [], []
            for seed in range(args.seeds):
                got, over, rep = run_sampler(s, table, budget, seed)
                overs.append(over)
                reps.append(rep)
                pts = np.array([v for v, f in got if f])
                if single:
                    b = pts[:, 0].max() if len(pts) else 0.0
                    scores.append(b / best)
                    hits += abs(b / best - 1) < 1e-9
                else:
                    hv = hypervolume_2d(pts[pareto_mask(pts, cfg.directions)], ref) if len(pts) else 0.0
                    scores.append(hv / grid_hv)
            cols = ([f"{hits} of {args.seeds}"] if single else []) + [
                f"{100 * statistics.mean(scores):.1f} %, {100 * min(scores):.1f} %"]
            print(f"| {sampler} | " + " | ".join(cols) + f" | {statistics.mean(overs):.1f} | "
                  f"{statistics.mean(reps):.1f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
