"""Benchmark: the paper's question answered exactly, and TPE measured against the certified answer.

``search/phaze-paper.yaml`` (227,136 designs, five workloads on 1024 chips) is searched with
``--sampler exact``: the proven best design within the area band, then (``--front``) the proven
front of throughput against area. Each prints its certificate, its wall time and the share of
the designs it evaluated. ``--tpe STUDY_DIR`` reads a finished TPE study of the same config (e.g.
``results/phaze-paper``) and prints its best as a share of the certified optimum.

Run: python tests/bench/bench_paper_exact.py [--front] [--tpe results/phaze-paper]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from phaze.exact import certificate, prepare
from phaze.search import default_storage, open_study, search
from phaze.space import load_sweep

ROOT = Path(__file__).resolve().parent.parent.parent


def run(cfg, name: str):
    url = default_storage(cfg, name)
    t = time.perf_counter()
    res = search(cfg, storage=url, study_name=name, progress=True)
    wall = time.perf_counter() - t
    study = open_study(cfg, url, res.study_name, create=False, heartbeat=False)
    cert, _ = certificate(cfg, study)
    sp = prepare(cfg)
    print(f"\n{name}: {wall:.0f} s wall (whole call, {res.elapsed_s:.0f} s in the search); "
          f"{cert.evaluated} evaluated = {100 * cert.evaluated / cert.designs:.4f} % of the space, "
          f"{100 * cert.evaluated / int(sp.ok.sum()):.3f} % of the {int(sp.ok.sum()):,} designs in the area band")
    for line in cert.lines():
        print("  " + line)
    return study, cert


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--front", action="store_true", help="also the front of throughput against area")
    ap.add_argument("--tpe", default=None, help="a finished TPE study folder of the same config")
    args = ap.parse_args()
    cfg = replace(load_sweep(ROOT / "search" / "phaze-paper.yaml"), sampler="exact", trials=10 ** 9)
    study, cert = run(cfg, "phaze-paper-exact")
    best = study.best_trial
    print(f"  best: trial {best.number}, {best.user_attrs['chip']}, {best.values[0]:,.0f} tokens/s")
    if args.tpe:
        from phaze.report import load_study
        tpe, _ = load_study(args.tpe)
        ok = [t for t in tpe.get_trials(deepcopy=False) if t.state.name == "COMPLETE" and t.user_attrs.get("feasible")]
        top = max(ok, key=lambda t: t.values[0])
        print(f"TPE ({args.tpe}, {len(ok)} feasible of {len(tpe.trials)} trials): best {top.values[0]:,.0f} tokens/s = "
              f"{100 * top.values[0] / cert.best_value:.2f} % of the certified optimum")
    if args.front:
        run(replace(cfg, objectives=("throughput", "area")), "phaze-paper-exact-front")
    return 0 if cert.proven else 1


if __name__ == "__main__":
    sys.exit(main())
