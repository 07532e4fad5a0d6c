"""Benchmark of the operator cost model's systematic trends (issue 13): fit the efficiency
parameters per chip family (A100, H100) on the bundled reference runs, then print the in-sample
error by sequence length, micro-batch, tensor-parallel width, model size and precision for the
llm-foundry (S04) and torchtitan (S20) sources, plus overall MAPE and signed bias.

    .venv/bin/python tests/bench/bench_cost_trends.py [--loso]

``--loso`` also runs leave-one-source-out (slow: one calibration per source).
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import asdict

from phaze.runs import Case, default_runs_paths, load_items
from phaze.validate import error_stats, fit_cases, leave_one_source_out, predict_case


def _size(params: float) -> str:
    for cut, name in ((0.5e9, "<0.5B"), (2e9, "0.5-2B"), (10e9, "2-10B"), (40e9, "10-40B")):
        if params < cut:
            return name
    return ">=40B"


def _table(title: str, rows) -> None:
    groups = defaultdict(list)
    for key, err in rows:
        groups[key].append(err)
    print(f"  {title}")
    for key in sorted(groups, key=lambda k: (str(type(k)), k)):
        st = error_stats(groups[key])
        print(f"    {str(key):>10}: n={st['rows']:3d}  mape {st['mape_pct']:5.1f} %  bias {st['bias_pct']:+6.1f} %")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loso", action="store_true", help="also leave-one-source-out")
    args = ap.parse_args()
    cases = [c for c in load_items(default_runs_paths()) if isinstance(c, Case)]
    t0 = time.time()
    params = {}
    for fam in ("A100", "H100"):
        group = [c for c in cases if c.chip.family == fam]
        params[fam] = fit_cases(group)
        print(f"{fam}: {len(group)} rows, fitted in {time.time() - t0:.0f} s")
        for k, v in asdict(params[fam]).items():
            print(f"    {k:>20} = {v:.4g}")
    errs = {}
    for c in cases:
        if c.chip.family in params:
            pred = predict_case(c, params[c.chip.family])
            errs[c.run_id] = (c, (pred - c.measured_step_s) / c.measured_step_s)
    print("in-sample overall:", {k: round(v, 2) for k, v in error_stats([e for _, e in errs.values()]).items()})
    for fam in params:
        st = error_stats([e for c, e in errs.values() if c.chip.family == fam])
        print(f"  {fam}: mape {st['mape_pct']:.1f} %  bias {st['bias_pct']:+.1f} %")
    _table("per source", [(c.source[:12], e) for c, e in errs.values()])
    for src in ("S04", "S20"):
        sel = [(c, e) for c, e in errs.values() if c.source.startswith(src)]
        print(f"{src}: {len(sel)} rows")
        _table("seq_len", [(c.model.seq_len, e) for c, e in sel])
        _table("micro-batch", [(c.plan.mbs, e) for c, e in sel])
        _table("tp", [(c.plan.tp, e) for c, e in sel])
        _table("model size", [(_size(c.model.params), e) for c, e in sel])
        _table("precision", [(c.model.precision, e) for c, e in sel])
    if args.loso:
        t0 = time.time()
        summary, preds = leave_one_source_out(cases)
        o = summary["overall"]
        print(f"LOSO ({time.time() - t0:.0f} s): mape {o['mape_pct']:.1f} %  bias {o['bias_pct']:+.1f} %  "
              f"median {o['median_pct']:.1f} %")
        for s, st in summary["per_source"].items():
            print(f"    {s[:24]:>24}: n={st['rows']:3d}  mape {st['mape_pct']:5.1f} %  bias {st['bias_pct']:+6.1f} %")
        by_id = {c.run_id: c for c in cases}
        s04 = [(by_id[p.run_id], p.error) for p in preds if p.source.startswith("S04")]
        _table("LOSO S04 seq_len", [(c.model.seq_len, e) for c, e in s04])
        _table("LOSO S04 model size", [(_size(c.model.params), e) for c, e in s04])


if __name__ == "__main__":
    main()
