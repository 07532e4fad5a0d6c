"""Is `phaze place`'s best plan at least as good as what practitioners ran? Every expressed
published run outside the held-out sources, on its own chip, devices, global batch and model:
`place` searches its default layout space (tp, pp, vp, micro-batch, cp, ep, recompute, ZeRO) with
the run's own settings that are not layout (attention kernel, overlaps, optimizer, routing, ...),
and its best plan's predicted step must be no longer than the run's plan's, under the same model
and shipped calibration. ``--space around`` widens the space to hold the run's plan (its layout's
values added to the searched ones): there a slower best is a hole in the search; in the default
space, a layout the defaults leave out. Runs whose own plan does not fit in phaze's memory model
are counted apart: `place` is not asked to match a plan it considers infeasible.

    python tests/bench/bench_place_vs_runs.py [--space around] [--only S21] [--resume]

Writes results/placement/place_vs_runs.csv (one row a run, as it is compared) and
place_vs_runs.txt (the summary the README quotes); ``--space around`` place_vs_runs_around.*.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from phaze import validate as v
from phaze.calibrate import load_default_params, params_for
from phaze.placement import SEARCH_ZERO, PlacementOptions, all_mbs_values, cp_values, expert_widths, place
from phaze.plan import SEARCHED_RECOMPUTE, Plan
from phaze.runs import Case, default_runs_paths, read_runs, row_to_case

SLACK = 1e-9     # relative: a step equal to the run's within rounding counts as equal


def options_around(case, plan: Plan, widen: bool = True) -> PlacementOptions:
    """The default search space with every setting that is not layout as ``plan`` has it; with
    ``widen``, every searched layout value with the plan's own added (a space that holds the plan;
    the micro-batches: every one some layout searches by default, and the plan's), else the default
    layout values alone (what ``phaze place`` searches with those settings)."""
    model, base = case.model, PlacementOptions()
    mbs = tuple(sorted(set(all_mbs_values(case.devices, case.global_batch, base)) | {plan.mbs})) if widen else ()

    def widened(values, own):
        return tuple(sorted(set(values) | ({own} if widen else set())))

    return PlacementOptions(
        tp=widened(base.tp, plan.tp), mbs=mbs,
        recompute=tuple(dict.fromkeys((*SEARCHED_RECOMPUTE, *((plan.recompute, *plan.stage_recompute) if widen
                                                              else ())))),
        pp=(), vp=(), zero=SEARCH_ZERO if plan.zero in (0, 1) else (plan.zero,),   # FSDP: the framework's
        attention=plan.attention, sp=bool(plan.sp) if plan.tp > 1 else True, optimizer=plan.optimizer,
        memory_reserve=plan.memory_reserve, reduce_fp32=plan.reduce_fp32,
        ep=widened(expert_widths(model, base), plan.ep) if model.moe else (),
        cp=widened(cp_values(model, base), plan.cp), etp=(plan.etp,) if model.moe and widen else (),
        routing=(plan.routing,) if plan.routing else (), dispatcher=(plan.dispatcher,) if plan.dispatcher else (),
        ep_overlap=(plan.ep_overlap,) if model.moe else (), tp_async=plan.tp_async, tp_overlap=plan.tp_overlap,
        dp_overlap=plan.dp_overlap, loss=plan.loss, grad_accum_fusion=plan.grad_accum_fusion,
        fsdp_pp=plan.fsdp_pp, fp8_params=plan.fp8_params, pipe_p2p=plan.pipe_p2p,
        pipe_schedule=plan.pipe_schedule, offload=plan.offload, shared_overlap=plan.shared_overlap,
        dp_shard=plan.dp_shard, cp_comm=plan.cp_comm, recompute_modules=plan.recompute_modules)


FIELDS = ("run_id", "source", "status", "run_step_s", "place_step_s", "throughput_gain_pct", "run_plan", "place_plan")
OUT = Path(__file__).resolve().parents[2] / "results" / "placement"


def compare(case, params, widen: bool = True) -> dict:
    """One run: its own plan's step and place's best over the space around it (:func:`options_around`)."""
    eff = params_for(case.chip, params)
    plan, own = v.scored_result(case, eff)
    row = {"run_id": case.run_id, "source": case.source, "run_step_s": f"{own.step_time_s:.6g}",
           "run_plan": plan.label(), "status": "run plan does not fit", "place_step_s": "",
           "throughput_gain_pct": "", "place_plan": ""}
    if not own.fits:
        return row
    found = place(case.model, case.chip, case.devices, case.global_batch,
                  options_around(case, plan, widen), eff, top=1)
    best = found.best.result.step_time_s if found.best else float("inf")
    status = ("faster" if best < own.step_time_s * (1 - SLACK) else
              "same" if best <= own.step_time_s * (1 + SLACK) else "slower")
    return dict(row, status=status, place_step_s=f"{best:.6g}",
                throughput_gain_pct=f"{100 * (own.step_time_s / best - 1):+.2f}",
                place_plan=found.best.plan.label() if found.best else "none")


def summary(rows: list[dict]) -> str:
    """The figures the README quotes, from the per-run rows."""
    scored = [r for r in rows if r["status"] != "run plan does not fit"]
    gains = sorted(float(r["throughput_gain_pct"]) for r in scored)
    count = {k: sum(r["status"] == k for r in scored) for k in ("faster", "same", "slower")}
    lines = [f"{len(rows)} expressed published runs outside the held-out sources; "
             f"{len(rows) - len(scored)} whose own plan does not fit in phaze's memory model left out",
             f"place's best against the run's own plan, {len(scored)} runs: faster {count['faster']}, "
             f"the same {count['same']}, slower {count['slower']}"]
    if gains:
        lines.append(f"throughput gain of place's best: median {gains[len(gains) // 2]:+.1f} %, "
                     f"largest {gains[-1]:+.1f} %")
    lines += [f"  slower: {r['run_id']} {r['throughput_gain_pct']} %: run {r['run_plan']}; place {r['place_plan']}"
              for r in scored if r["status"] == "slower"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="a source id prefix (S21); writes nothing under results/")
    ap.add_argument("--resume", action="store_true", help="keep the rows of an interrupted run and go on")
    ap.add_argument("--space", choices=("default", "around"), default="default",
                    help="default: the default layout values with the run's other settings; around: widened to "
                         "hold the run's plan (written to place_vs_runs_around.*)")
    args = ap.parse_args(argv)
    params = load_default_params()
    items = []
    for path in default_runs_paths():
        items += [row_to_case(r, dataset=path.stem) for r in read_runs(path)]
    cases = [c for c in v.split_held_out(items)[0] if isinstance(c, Case) and c.source.startswith(args.only)]
    stem = "place_vs_runs" + ("_around" if args.space == "around" else "")
    out = OUT / f"{stem}.csv"
    done = {}
    if args.resume and out.exists() and not args.only:
        with out.open(newline="") as fh:
            done = {r["run_id"]: r for r in csv.DictReader(fh)}
    rows = []
    write = not args.only
    if write:
        OUT.mkdir(parents=True, exist_ok=True)
    fh = out.open("w", newline="") if write else None
    writer = csv.DictWriter(fh, FIELDS, lineterminator="\n") if fh else None
    if writer:
        writer.writeheader()
    start = time.perf_counter()
    try:
        for k, case in enumerate(cases, 1):
            row = done.get(case.run_id) or compare(case, params, args.space == "around")
            rows.append(row)
            if writer:
                writer.writerow(row)
                fh.flush()
            print(f"[{k}/{len(cases)}] {case.run_id}: {row['status']} {row['throughput_gain_pct']}",
                  file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print(f"interrupted: {len(rows)} runs kept in {out.relative_to(OUT.parents[1])}; --resume goes on",
              file=sys.stderr)
        return 130
    finally:
        if fh:
            fh.close()
    text = summary(rows)
    if write:
        (OUT / f"{stem}.txt").write_text(text)
    print(text + f"({time.perf_counter() - start:.0f} s)")
    return 1 if any(r["status"] == "slower" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
