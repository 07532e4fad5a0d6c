"""What a study tells an architect, rebuilt from its storage: ``trials.csv``, ``pareto.csv``,
``baselines.csv`` and ``report.md`` in the study's folder.

Every file is written whole from the storage (to a temporary name, then renamed), so an
interrupted search leaves the last complete report and a rerun brings it up to date. No file
names a path of the machine that wrote it.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd

from .space import OBJECTIVES, SweepConfig

BREAKDOWN = ("compute_s", "memory_bound_s", "communication_exposed_s", "pipeline_bubble_s", "optimizer_s")


def pareto_mask(values: np.ndarray, directions) -> np.ndarray:
    """True for the rows of ``values`` (n x k) that no other row dominates: at least as good in
    every objective and better in one. ``directions``: ``maximize`` / ``minimize`` per column."""
    v = np.asarray(values, dtype=float).reshape(len(values), -1)
    sign = np.array([1.0 if d == "maximize" else -1.0 for d in directions])
    g = v * sign                       # larger is better in every column
    keep = np.ones(len(g), dtype=bool)
    for i in range(len(g)):
        ge = np.all(g >= g[i], axis=1)
        gt = np.any(g > g[i], axis=1)
        if np.any(ge & gt):
            keep[i] = False
    return keep


def _workload_columns(row: dict, outcomes) -> None:
    for o in outcomes or []:
        w = o["workload"]
        row[f"{w}:plan"] = o.get("plan", "")
        row[f"{w}:tokens_per_s"] = o.get("tokens_per_s", 0.0)
        row[f"{w}:step_time_s"] = o.get("step_time_s")
        row[f"{w}:mfu"] = o.get("mfu", 0.0)
        row[f"{w}:memory_per_device_gib"] = (o.get("memory_per_device_bytes") or 0.0) / 2 ** 30
        row[f"{w}:power_w"] = o.get("power_w", 0.0)
        row[f"{w}:tokens_per_joule"] = o.get("tokens_per_joule", 0.0)
        for k in BREAKDOWN:
            row[f"{w}:{k}"] = (o.get("breakdown_s") or {}).get(k)
        row[f"{w}:schedule_status"] = o.get("schedule_status", "")
        if not o.get("feasible", True):
            row[f"{w}:reason"] = o.get("reason", "")


def trials_frame(study, objectives) -> pd.DataFrame:
    """One row per trial: state, sampler parameters, chip, objectives, feasibility and reason,
    area, power, cost, and per workload the plan, throughput, time breakdown and memory."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        row = {"trial": t.number, "state": t.state.name}
        row.update({f"param:{k}": v for k, v in t.params.items()})
        row.update({f"chip:{k}": v for k, v in (a.get("chip") or {}).items()})
        for i, o in enumerate(objectives):
            row[o] = t.values[i] if t.values else None
        row["feasible"] = bool(a.get("feasible", False)) and t.state.name == "COMPLETE"
        row["reason"] = a.get("reason", "") if t.state.name == "COMPLETE" else (
            f"duplicate of trial {a['duplicate_of']}" if "duplicate_of" in a else t.state.name.lower())
        row["reason_kinds"] = "; ".join(a.get("reason_kinds", []))
        for k in ("area_mm2", "power_w", "cost_usd", "throughput_tokens_per_s", "schedule_status",
                  "schedule_gap", "eval_time_s"):
            row[k] = a.get(k)
        row["template"] = a.get("template", "")
        _workload_columns(row, a.get("workloads"))
        rows.append(row)
    return pd.DataFrame(rows)


def pareto_frame(trials: pd.DataFrame, objectives, directions) -> pd.DataFrame:
    """The non-dominated feasible complete trials, best first objective first."""
    ok = trials[(trials["state"] == "COMPLETE") & trials["feasible"]] if len(trials) else trials
    if not len(ok):
        return ok
    mask = pareto_mask(ok[list(objectives)].to_numpy(dtype=float), directions)
    front = ok[mask]
    return front.sort_values(objectives[0], ascending=directions[0] == "minimize")


def baselines_frame(study, objectives) -> pd.DataFrame:
    rows = []
    for name, a in (study.user_attrs.get("baselines") or {}).items():
        row = {"baseline": name, "chip_name": a.get("chip_name", name)}
        row.update({o: a["objectives"].get(o) for o in objectives})
        for k in ("feasible", "reason", "area_mm2", "power_w", "cost_usd", "throughput_tokens_per_s"):
            row[k] = a.get(k)
        row.update({f"chip:{k}": v for k, v in (a.get("chip") or {}).items()})
        _workload_columns(row, a.get("workloads"))
        rows.append(row)
    return pd.DataFrame(rows)


def best_designs(trials: pd.DataFrame, cfg: SweepConfig, n: int = 5) -> pd.DataFrame:
    """Single objective: the ``n`` best feasible designs. Several: the Pareto front (``n`` of it
    spread along the first objective when larger)."""
    front = pareto_frame(trials, cfg.objectives, cfg.directions)
    if len(cfg.objectives) == 1:
        ok = trials[(trials["state"] == "COMPLETE") & trials["feasible"]] if len(trials) else trials
        # ties (designs the workloads cannot tell apart) go to the smaller, cheaper, cooler one
        return ok.sort_values([cfg.objectives[0], "area_mm2", "cost_usd", "power_w"],
                              ascending=[cfg.directions[0] == "minimize", True, True, True]).head(n)
    if len(front) <= n:
        return front
    idx = np.unique(np.linspace(0, len(front) - 1, n).round().astype(int))
    return front.iloc[idx]


def gains(design: pd.Series, baselines: pd.DataFrame, workloads) -> dict:
    """Per baseline: the design's throughput over the baseline's, per workload and overall
    (weighted geometric mean), minus one; None where the baseline has no plan."""
    out = {}
    for _, b in baselines.iterrows():
        per = {}
        for w in workloads:
            mine, theirs = design.get(f"{w}:tokens_per_s"), b.get(f"{w}:tokens_per_s")
            per[w] = (mine / theirs - 1.0) if theirs and mine and theirs > 0 else None
        total = b.get("throughput_tokens_per_s")
        per["overall"] = (design["throughput_tokens_per_s"] / total - 1.0) if total else None
        out[b["baseline"]] = per
    return out


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fmt(x, spec: str = ".4g") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return format(x, spec) if isinstance(x, (int, float, np.floating, np.integer)) else str(x)


def _workload_names(trials: pd.DataFrame) -> list[str]:
    return [c.split(":")[0] for c in trials.columns if c.endswith(":tokens_per_s")]


def markdown(study, cfg: SweepConfig, trials: pd.DataFrame, baselines: pd.DataFrame) -> str:
    """The readable report: the answer first (best designs and their gain over the baselines),
    then the front, infeasible trials by reason, and the study's bookkeeping."""
    lines = [f"# phaze search: {study.study_name}", ""]
    complete = trials[trials["state"] == "COMPLETE"] if len(trials) else trials
    feasible = complete[complete["feasible"]] if len(complete) else complete
    lines.append(f"{len(complete)} designs evaluated ({len(feasible)} feasible) of a space of "
                 f"{cfg.grid_size():,}; template {cfg.base.name}; objectives: "
                 + ", ".join(f"{o} ({OBJECTIVES[o][0]})" for o in cfg.objectives)
                 + "; budgets: " + (", ".join(f"{k} {v:g}" for k, v in cfg.constraints) or "none") + ".")
    lines.append("Workloads: " + ", ".join(f"{w.model.name} on {w.devices} chips, global batch "
                                            f"{w.global_batch} (weight {w.weight:g})" for w in cfg.workloads) + ".")
    lines.append("")
    workloads = _workload_names(trials) if len(trials) else []
    best = best_designs(trials, cfg) if len(trials) else trials
    lines += ["## Best designs", ""]
    if not len(best):
        lines += ["No feasible design yet.", ""]
    else:
        keys = [d.key for d in cfg.dimensions]
        head = ["trial"] + keys + ["area mm²", "power W", "cost $", "tokens/s (geomean)"] + \
               [f"{w} tokens/s" for w in workloads]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for _, r in best.iterrows():
            cells = [str(r["trial"])] + [_fmt(r.get(f"chip:{k}")) for k in keys] + \
                    [_fmt(r["area_mm2"], ".0f"), _fmt(r["power_w"], ".0f"), _fmt(r["cost_usd"], ",.0f"),
                     _fmt(r["throughput_tokens_per_s"], ",.0f")] + \
                    [_fmt(r.get(f"{w}:tokens_per_s"), ",.0f") for w in workloads]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "Plans chosen:", ""]
        for _, r in best.iterrows():
            plans = "; ".join(f"{w}: {r.get(f'{w}:plan')}" for w in workloads)
            lines.append(f"- trial {r['trial']}: {plans}")
        lines.append("")
    if len(baselines):
        lines += ["## Baselines, scored by the same model", ""]
        head = ["baseline", "area mm²", "power W", "cost $", "tokens/s (geomean)", "meets the budgets"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for _, b in baselines.iterrows():
            lines.append(f"| {b['chip_name']} | {_fmt(b['area_mm2'], '.0f')} | {_fmt(b['power_w'], '.0f')} | "
                         f"{_fmt(b['cost_usd'], ',.0f')} | {_fmt(b['throughput_tokens_per_s'], ',.0f')} | "
                         f"{'yes' if b['feasible'] else 'no: ' + str(b['reason'])} |")
        lines.append("")
        if len(best):
            lines += ["Gain in throughput of each best design over each baseline (per workload; overall = "
                      "weighted geometric mean):", ""]
            head = ["trial", "baseline"] + workloads + ["overall"]
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for _, r in best.iterrows():
                for name, per in gains(r, baselines, workloads).items():
                    cells = [str(r["trial"]), name] + [
                        "no plan" if per[w] is None else f"{100 * per[w]:+.1f} %" for w in workloads + ["overall"]]
                    lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    if len(complete):
        bad = complete[~complete["feasible"]]
        kinds: dict[str, int] = {}
        for k in bad["reason_kinds"]:
            for kind in (k or "unknown").split("; "):
                kinds[kind] = kinds.get(kind, 0) + 1
        lines += ["## Infeasible designs by reason", ""]
        lines += [f"- {k}: {n}" for k, n in sorted(kinds.items(), key=lambda x: -x[1])] or ["- none"]
        skipped = study.user_attrs.get("sweep_skipped") or {}
        lines += [f"- not evaluated by the sweep, {k} broken before evaluation: {n}" for k, n in skipped.items()]
        lines.append("")
        statuses = complete["schedule_status"].fillna("").value_counts().to_dict()
        lines += ["## Schedules", "",
                  "Layer schedules of the chosen plans: " + ", ".join(f"{k or 'not evaluated'} {n}"
                                                                     for k, n in statuses.items())
                  + f"; largest gap {100 * float(complete['schedule_gap'].fillna(0).max()):.3f} %.", ""]
    pruned = int((trials["state"] == "PRUNED").sum()) if len(trials) else 0
    lines += ["## Study", "",
              f"Sampler {cfg.sampler}, seed {cfg.seed}; {len(trials)} trials in the storage: "
              f"{len(complete)} complete, {pruned} repeat proposals pruned unevaluated, "
              f"{int((trials['state'] == 'FAIL').sum()) if len(trials) else 0} failed.", ""]
    return "\n".join(lines)


def write_study_files(study, cfg: SweepConfig, out_dir: Path) -> dict[str, Path]:
    """Write ``trials.csv``, ``pareto.csv``, ``baselines.csv`` and ``report.md`` into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trials = trials_frame(study, cfg.objectives)
    front = pareto_frame(trials, cfg.objectives, cfg.directions) if len(trials) else trials
    base = baselines_frame(study, cfg.objectives)
    files = {"trials": out_dir / "trials.csv", "pareto": out_dir / "pareto.csv",
             "baselines": out_dir / "baselines.csv", "report": out_dir / "report.md"}
    _atomic_write(files["trials"], trials.to_csv(index=False, float_format="%.9g"))
    _atomic_write(files["pareto"], front.to_csv(index=False, float_format="%.9g"))
    _atomic_write(files["baselines"], base.to_csv(index=False, float_format="%.9g"))
    _atomic_write(files["report"], markdown(study, cfg, trials, base))
    return files
