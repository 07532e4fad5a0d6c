"""The figures of a study's report: matplotlib PNG and SVG files for report.md and the README, and
the same figures as interactive plotly charts in a self-contained ``report.html`` (plotly.js
inlined: the page loads nothing from the network).

Every axis names its unit; baselines keep one marker and colour each across figures and are
labelled where they are drawn.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import html
import math
import multiprocessing
import os
import re
import signal
import textwrap
from pathlib import Path

import numpy as np

from .lazy import pd
from .report import (
    BREAKDOWN,
    BREAKDOWN_LABELS,
    METRICS,
    StudyMeta,
    answer,
    baselines_table,
    best_designs,
    best_designs_table,
    breakdown_table,
    evaluated_phrase,
    feasible_trials,
    front_2d,
    gains_table,
    importances,
    infeasible_counts,
    layer_schedules,
    plan_front,
    plans_table,
    sampler_phrase,
    storage_hint,
)
from .schedule import write_gantt

DPI = 150
FONT = 11
DESIGN, FRONT, BEST, INFEASIBLE = "#4c72b0", "#dd8452", "#f2c01e", "#9a9a9a"
BASELINE_STYLE = [("s", "#2ca02c"), ("^", "#9467bd"), ("D", "#d62728"), ("v", "#8c564b"), ("P", "#e377c2"),
                  ("X", "#17becf")]
PLOTLY_SYMBOL = {"s": "square", "^": "triangle-up", "D": "diamond", "v": "triangle-down", "P": "cross", "X": "x"}
COMPONENT_COLOURS = {"compute_s": "#4c72b0", "memory_bound_s": "#55a868", "communication_exposed_s": "#c44e52",
                     "pipeline_bubble_s": "#8172b2", "optimizer_s": "#ccb974"}
STUDY_COLOURS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
OBJECTIVE_AXIS = {
    "throughput": ("throughput", "tokens/s"), "area": ("die area", "mm²"), "power": ("power at load", "W"),
    "cost": ("chip cost", "$"), "throughput_per_mm2": ("throughput per area", "tokens/s per mm²"),
    "throughput_per_w": ("throughput per watt", "tokens/J"), "throughput_per_usd": ("throughput per dollar",
                                                                                   "tokens/s per $"),
}
CONSTRAINT_METRIC = {"area_mm2": "area_mm2", "min_area_mm2": "area_mm2", "power_w": "power_w",
                     "cost_usd": "cost_usd"}
IMPORTANCE_AXIS = "importance for reaching the best 10 % (PED-ANOVA; all parameters sum to 1)"
UNIT = {"area_mm2": "mm²", "power_w": "W", "cost_usd": "$"}


def _mpl():
    import matplotlib  # deferred: matplotlib imports slowly and only a report draws
    matplotlib.use("Agg")
    matplotlib.rcParams.update({"font.size": FONT, "axes.titlesize": FONT + 1, "axes.labelsize": FONT,
                                "legend.fontsize": FONT - 1, "svg.hashsalt": "phaze", "svg.fonttype": "none"})
    from matplotlib.figure import Figure
    return Figure


def _save(fig, out_dir: Path, name: str) -> dict[str, Path]:
    out = {}
    for ext in ("png", "svg"):
        path = out_dir / f"{name}.{ext}"
        tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}.{ext}")
        fig.savefig(tmp, dpi=DPI, format=ext, metadata={"Date": None} if ext == "svg" else {"Software": None})
        os.replace(tmp, path)
        out[ext] = path
    return out


def _scale(values) -> tuple[float, str]:
    """A factor and prefix that put the largest value between 1 and 1000 (tokens/s -> M tokens/s)."""
    top = max([abs(v) for v in values if v is not None and math.isfinite(v)] or [1.0])
    for f, p in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if top >= f:
            return f, p
    return 1.0, ""


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "workload"


def _baseline_styles(baselines: pd.DataFrame) -> dict[str, tuple[str, str]]:
    return {b["baseline"]: BASELINE_STYLE[i % len(BASELINE_STYLE)] for i, (_, b) in enumerate(baselines.iterrows())}


def _evaluated(trials: pd.DataFrame) -> pd.DataFrame:
    done = trials[trials["state"] == "COMPLETE"] if len(trials) else trials
    return done[done["throughput_tokens_per_s"].fillna(0) > 0] if len(done) else done


def _objective_axis(o: str, values) -> tuple[float, str]:
    what, unit = OBJECTIVE_AXIS.get(o, (o, ""))
    f, p = _scale(values) if unit.startswith("tokens") else (1.0, "")
    return f, f"{what} ({p}{unit})" if unit else what


def _budgets(meta: StudyMeta, metric: str) -> list[float]:
    """The study's bounds on ``metric`` (area, power or cost), so that an axis reaches them."""
    return [bound for key, bound in meta.constraints if CONSTRAINT_METRIC.get(key) == metric]


def _budget_text(key: str, bound: float, metric: str) -> str:
    return f"{'min ' if key.startswith('min') else 'budget '}{bound:,.0f} {UNIT[metric]}"


# --- matplotlib figures -----------------------------------------------------------------------------
def _xlim(xs) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and math.isfinite(x)] or [0.0, 1.0]
    lo, hi = min(xs), max(xs)
    span = (hi - lo) or max(abs(hi), 1.0)
    return max(0.0, lo - 0.06 * span) if lo >= 0 else lo - 0.06 * span, hi + 0.06 * span


def _place_labels(fig, labels) -> None:
    """Each baseline's name beside its marker, at the first of the four corners around it (the
    side with room first) that covers no plotted point, no label placed before and does not
    leave the frame; the corner covering least when none is clear. ``labels``: ``(ax, text, x,
    y, colour, right)`` in data coordinates, placed once the layout is final."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # deferred with matplotlib
    renderer = FigureCanvasAgg(fig).get_renderer()
    placed, px = [], fig.dpi / 72.0
    for ax, text, x, y, colour, right in labels:
        marks = [(np.asarray(c.get_offsets(), dtype=float),
                  np.sqrt(np.resize(c.get_sizes(), len(c.get_offsets()))) / 2)
                 for c in ax.collections if len(c.get_offsets()) and len(c.get_sizes())]
        marks += [(np.column_stack(line.get_data()).astype(float),
                   np.full(len(line.get_xdata()), line.get_markersize() / 2))
                  for line in ax.lines if line.get_marker() not in ("None", "", None)]
        centres = ax.transData.transform(np.concatenate([m for m, _ in marks])) if marks else np.empty((0, 2))
        radii = np.concatenate([r for _, r in marks]) * px if marks else np.empty(0)
        frame = ax.get_window_extent(renderer)
        sides = [(-7, "right"), (7, "left")] if right else [(7, "left"), (-7, "right")]
        best = None
        for dy, va in ((6, "bottom"), (-6, "top")):
            for dx, ha in sides:
                a = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=FONT - 1,
                                color=colour, fontweight="bold", ha=ha, va=va)
                raw = a.get_window_extent(renderer)
                box = raw.expanded(1.1, 1.3)
                # a marker is covered when its disk reaches into the box
                gap_x = np.maximum(0.0, np.maximum(box.x0 - centres[:, 0], centres[:, 0] - box.x1))
                gap_y = np.maximum(0.0, np.maximum(box.y0 - centres[:, 1], centres[:, 1] - box.y1))
                cover = int(np.sum(np.hypot(gap_x, gap_y) < radii)) + sum(box.overlaps(p) for p in placed)
                cover += 100 * (raw.x0 < frame.x0 or raw.x1 > frame.x1 or raw.y0 < frame.y0 or raw.y1 > frame.y1)
                if best is None or cover < best[0]:
                    if best is not None:
                        best[1].remove()
                    best = (cover, a, box)
                else:
                    a.remove()
                if best[0] == 0:
                    break
            if best[0] == 0:
                break
        placed.append(best[2])


def fig_front(trials, baselines, meta: StudyMeta, best: pd.DataFrame):
    """Throughput against area, power and cost: every evaluated design, the front in each plane,
    the best design, the baselines (marked and labelled) and the budgets."""
    Figure = _mpl()
    done = _evaluated(trials)
    ok = feasible_trials(trials)
    bad = done[~done["feasible"].astype(bool)] if len(done) else done
    ys = list(done["throughput_tokens_per_s"]) + list(baselines.get("throughput_tokens_per_s", []))
    f, p = _scale(ys)
    fig = Figure(figsize=(13, 5.0))
    axes = fig.subplots(1, 3, sharey=True)
    styles = _baseline_styles(baselines)
    handles, labels = {}, []
    for ax, metric in zip(axes, ("area_mm2", "power_w", "cost_usd"), strict=True):
        if len(bad):
            handles["infeasible (evaluated)"] = ax.scatter(bad[metric], bad["throughput_tokens_per_s"] / f, marker="x",
                                                           s=22, color=INFEASIBLE, lw=1)
        if len(ok):
            handles["feasible design"] = ax.scatter(ok[metric], ok["throughput_tokens_per_s"] / f, s=22,
                                                    color=DESIGN, alpha=0.6, lw=0)
            fr = front_2d(trials, metric)
            handles["front (no design better in both)"] = ax.plot(
                fr[metric], fr["throughput_tokens_per_s"] / f, "-o", color=FRONT, ms=5, lw=1.6,
                drawstyle="steps-post")[0]
        if len(best):
            b0 = best.iloc[0]
            handles[f"best design (trial {b0['trial']})"] = ax.scatter(
                [b0[metric]], [b0["throughput_tokens_per_s"] / f], marker="*", s=260, color=BEST, edgecolor="black",
                lw=0.8, zorder=5)
        lo, hi = _xlim(list(done[metric]) + [b[metric] for _, b in baselines.iterrows()
                                             if b["throughput_tokens_per_s"]] + _budgets(meta, metric))
        ax.set_xlim(lo, hi)
        for _, b in baselines.iterrows():
            m, c = styles[b["baseline"]]
            if not b["throughput_tokens_per_s"]:
                continue
            h = ax.scatter([b[metric]], [b["throughput_tokens_per_s"] / f], marker=m, s=70, color=c,
                           edgecolor="black", lw=0.7, zorder=6)
            handles[f"{b['chip_name']} (baseline)"] = h
            labels.append((ax, b["chip_name"], b[metric], b["throughput_tokens_per_s"] / f, c,
                           b[metric] > lo + 0.6 * (hi - lo)))
        for key, bound in meta.constraints:
            if CONSTRAINT_METRIC.get(key) == metric:
                # above the frame: the plot area holds the baselines' markers and labels
                handles["budget"] = ax.axvline(bound, color="#c44e52", ls="--", lw=1.2)
                ax.annotate(_budget_text(key, bound, metric), (bound, 1.0), xycoords=("data", "axes fraction"),
                            xytext=(0, 3), textcoords="offset points", fontsize=FONT - 2, color="#c44e52",
                            ha="center", va="bottom", annotation_clip=False)
        ax.set_xlabel(METRICS[metric][0])
        ax.grid(alpha=0.3)
        ax.set_ylim(0, max([y / f for y in ys if y and math.isfinite(y)] or [1.0]) * 1.1)
        if not len(done):
            ax.text(0.5, 0.5, "no design evaluated\nhas a plan that fits", transform=ax.transAxes, ha="center",
                    va="center", color="#666666")
    axes[0].set_ylabel(f"throughput ({p}tokens/s, weighted geo. mean)")
    fig.suptitle(f"{meta.name}: throughput against area, power and cost", fontsize=FONT + 2)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(4, len(handles)),
                   frameon=False)
    rows = math.ceil(len(handles) / 4)
    fig.tight_layout(rect=(0, 0.06 * rows + 0.02, 1, 1))
    _place_labels(fig, labels)
    return fig


def fig_history(trials, baselines, meta: StudyMeta):
    """Each objective's value per trial and the best feasible value so far."""
    Figure = _mpl()
    n = len(meta.objectives)
    fig = Figure(figsize=(11.5, 3.8 * n))
    axes = np.atleast_1d(fig.subplots(n, 1, squeeze=False)[:, 0])
    done = _evaluated(trials).sort_values("trial")
    styles = _baseline_styles(baselines)
    for ax, o, d in zip(axes, meta.objectives, meta.directions, strict=False):
        vals = list(done[o]) + [v for v in baselines.get(o, []) if v]
        f, label = _objective_axis(o, vals)
        ok = done[done["feasible"].astype(bool)]
        bad = done[~done["feasible"].astype(bool)]
        ax.scatter(bad["trial"], bad[o] / f, marker="x", s=20, color=INFEASIBLE, label="infeasible (evaluated)")
        ax.scatter(ok["trial"], ok[o] / f, s=20, color=DESIGN, alpha=0.7, lw=0, label="feasible design")
        if len(ok):
            run = ok[o].cummax() if d == "maximize" else ok[o].cummin()
            last = trials["trial"].max()
            ax.step(list(ok["trial"]) + [last], list(run / f) + [run.iloc[-1] / f], where="post", color=FRONT,
                    lw=2, label="best feasible so far")
        for _, b in baselines.iterrows():
            v = b.get(o)
            if v and math.isfinite(v):
                m, c = styles[b["baseline"]]
                ax.axhline(v / f, color=c, ls=":", lw=1.4)
                ax.annotate(f"{b['chip_name']}" + ("" if b["feasible"] else " (over budget)"), (1.0, v / f),
                            xycoords=("axes fraction", "data"), xytext=(-4, 3), textcoords="offset points",
                            ha="right", fontsize=FONT - 1, color=c, fontweight="bold")
        top = max([v / f for v in vals if v is not None and math.isfinite(v)] or [1.0])
        ax.set_ylim(top=top * 1.08)
        ax.set_xlabel("trial number")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    how = {"sweep": "every design, largest area first", "exact": "exact search, best bound first"}
    axes[0].set_title(f"{meta.name}: best so far against trial number "
                      f"({how.get(meta.sampler, meta.sampler + ' sampler')})")
    fig.tight_layout()
    return fig


def fig_importance(imp: dict, meta: StudyMeta, caption: str = ""):
    """Each parameter's importance per objective, captioned with the sample it comes from."""
    Figure = _mpl()
    n = len(imp)
    k = max(len(v) for v in imp.values())
    foot = 0.3 * len(textwrap.wrap(caption, 110))
    fig = Figure(figsize=(8, (0.45 * k + 1.3) * n + foot))
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    for ax, (o, vals) in zip(axes, imp.items(), strict=False):
        names = list(vals)[::-1]
        ax.barh(names, [vals[x] for x in names], color=DESIGN)
        for y, x in enumerate(names):
            ax.annotate(f"{vals[x]:.2f}", (vals[x], y), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=FONT - 1)
        ax.set_xlim(0, max(vals.values(), default=0.0) * 1.15 + 1e-9)
        ax.set_xlabel(IMPORTANCE_AXIS)
        ax.set_title(f"what decides {o} (over the feasible designs)")
        ax.grid(axis="x", alpha=0.3)
    if caption:
        fig.text(0.01, 0.01, "\n".join(textwrap.wrap(caption, 110)), fontsize=FONT - 2, color="#444444",
                 va="bottom", ha="left")
    fig.tight_layout(rect=(0, foot / fig.get_figheight(), 1, 1))
    return fig


def _workload_title(meta: StudyMeta, w: str) -> str:
    """``BERT-Large on 64 chips, global batch 512``: the workload with its cluster and batch."""
    desc = dict(zip(meta.workloads, meta.descriptions, strict=False)).get(w, w)
    return desc.split(" (weight")[0] if len(meta.workloads) == 1 else desc


def _time_unit(values) -> tuple[float, str]:
    top = max([v for v in values if v and math.isfinite(v)] or [1.0])
    return (1.0, "s") if top >= 1.0 else (1e3, "ms") if top >= 1e-3 else (1e6, "µs")


def _breakdown_rows(row, baselines, w):
    out = [(f"trial {row['trial']} (best)", row, row.get("chip:hbm_gib"))]
    out += [(str(b["chip_name"]), b, b.get("chip:hbm_gib")) for _, b in baselines.iterrows()]
    return out


def fig_breakdown(row, baselines, meta: StudyMeta):
    """Per workload, where a step's time goes on the best design and on each baseline, with the
    memory each uses per device."""
    Figure = _mpl()
    n = len(meta.workloads)
    k = 1 + len(baselines)
    fig = Figure(figsize=(11, (0.55 * k + 1.4) * n + 0.6))
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    for ax, w in zip(axes, meta.workloads, strict=False):
        chips = _breakdown_rows(row, baselines, w)
        steps = [r.get(f"{w}:step_time_s") for _, r, _ in chips]
        f, unit = _time_unit(steps)
        labels = []
        for y, (label, r, hbm) in enumerate(chips[::-1]):
            labels.append(label)
            step = r.get(f"{w}:step_time_s")
            if step is None or not math.isfinite(step):
                ax.annotate("no plan fits", (0, y), xytext=(4, 0), textcoords="offset points", va="center")
                continue
            left = 0.0
            for c in BREAKDOWN:
                v = (r.get(f"{w}:{c}") or 0.0) * f
                ax.barh(y, v, left=left, color=COMPONENT_COLOURS[c], label=BREAKDOWN_LABELS[c] if y == 0 else None,
                        edgecolor="white", lw=0.5)
                left += v
            mem = r.get(f"{w}:memory_per_device_gib")
            ax.annotate(f"{step * f:.3g} {unit}; {mem:.1f} of {hbm:.0f} GiB HBM", (left, y), xytext=(4, 0),
                        textcoords="offset points", va="center", fontsize=FONT - 1)
        ax.set_yticks(range(len(labels)), labels)
        finite = [s * f for s in steps if s is not None and math.isfinite(s)]
        ax.set_xlim(0, (max(finite) if finite else 1.0) * 1.38)
        ax.set_xlabel(f"time per training step ({unit})")
        ax.set_title(f"{_workload_title(meta, w)}: where the step time goes, and memory per device")
        ax.grid(axis="x", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, frameon=False, fontsize=FONT - 1)
    fig.tight_layout(rect=(0, 0.5 / fig.get_figheight() + 0.02, 1, 1))
    return fig


def _plan_parts(plan) -> dict:
    out = {}
    for item in str(plan or "").split(","):
        k, _, v = item.partition("=")
        out[k.strip()] = v.strip()
    return out


# (plan key, legend, marker, colour, offset factor on the log axis, dash): equal widths stay visible
PLAN_LINES = (("tp", "tensor-parallel width", "o", "#4c72b0", 0.94, "-"),
              ("pp", "pipeline stages", "s", "#dd8452", 1.0, "--"),
              ("mbs", "micro-batch (sequences)", "^", "#55a868", 1.06, ":"))


def _same_plan(front: pd.DataFrame, w: str) -> str:
    """A sentence when workload ``w`` has one plan on every design of the front, else ''."""
    plans = {str(r.get(f"{w}:plan")) for _, r in front.iterrows()}
    if len(front) > 1 and len(plans) == 1:
        return f"The plan is the same on all {len(front)} designs of the front:\n{plans.pop()}"
    return ""


def fig_plans(front: pd.DataFrame, meta: StudyMeta):
    """Per workload, the tensor- and pipeline-parallel widths and the micro-batch of the plan
    chosen on each design along the front, against the design's die area; the recompute mode
    (and interleaving, ZeRO) written where it changes."""
    Figure = _mpl()
    n = len(meta.workloads)
    fig = Figure(figsize=(11.5, 3.6 * n + 0.4))
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    x = front["area_mm2"].to_numpy(dtype=float)
    lo, hi = _xlim(list(x))
    for ax, w in zip(axes, meta.workloads, strict=False):
        parts = [_plan_parts(r.get(f"{w}:plan")) for _, r in front.iterrows()]
        top = 1
        for key, label, marker, colour, dy, dash in PLAN_LINES:
            ys = [int(pp.get(key) or 1) for pp in parts]
            top = max(top, *ys)
            ax.plot(x, [y * dy for y in ys], marker=marker, color=colour, lw=1.4, ms=7, drawstyle="steps-post",
                    ls=dash, label=label)
        same = _same_plan(front, w)
        if same:
            ax.text(0.5, 0.5, same, transform=ax.transAxes, ha="center", va="center", fontsize=FONT - 1,
                    color="#444444", bbox=dict(facecolor="white", edgecolor="#bbbbbb", alpha=0.9))
        last = None
        for i, pp in enumerate(parts):
            extra = f"recompute {pp.get('recompute', '')}"
            extra += f", vp={pp['vp']}" if "vp" in pp else ""
            extra += f", zero={pp['zero']}" if "zero" in pp else ""
            if extra != last:
                ax.annotate(extra, (x[i], 1.0), xycoords=("data", "axes fraction"), xytext=(0, -4),
                            textcoords="offset points", ha="left", va="top", fontsize=FONT - 2, rotation=0)
                ax.axvline(x[i], color="#bbbbbb", lw=0.8, ls=":")
                last = extra
        ax.set_yscale("log", base=2)
        ax.set_ylim(0.7, top * 4)
        k = int(math.log2(top)) + 1
        ax.set_yticks([2 ** i for i in range(k)], [str(2 ** i) for i in range(k)])
        ax.set_xlim(lo, hi)
        ax.set_ylabel("width or size (count, log₂)")
        ax.set_xlabel("die area of the design on the front (mm²)")
        ax.set_title(f"{w}: the best plan along the front ({len(front)} designs)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def fig_infeasible(kinds: dict, meta: StudyMeta):
    Figure = _mpl()
    fig = Figure(figsize=(8, 0.5 * len(kinds) + 1.4))
    ax = fig.subplots()
    names = list(kinds)[::-1]
    ax.barh(names, [kinds[k] for k in names], color=INFEASIBLE)
    for y, k in enumerate(names):
        ax.annotate(str(kinds[k]), (kinds[k], y), xytext=(3, 0), textcoords="offset points", va="center")
    ax.set_xlim(0, max(kinds.values()) * 1.15)
    ax.xaxis.get_major_locator().set_params(integer=True)    # counts: no tick at 2.5
    ax.set_xlabel("designs (count; a design breaking two budgets counts under both)")
    ax.set_title(f"{meta.name}: infeasible designs by reason")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def _draw(name: str, what: str, args: tuple, out_dir: Path) -> dict[str, Path]:
    """Draw one figure (``what``: a key of :data:`DRAW`, or ``gantt``) as ``name``.png and .svg."""
    _mpl()   # the same settings in every process, whichever figures it drew before
    if what == "gantt":
        paths = {ext: out_dir / f"{name}.{ext}" for ext in ("png", "svg")}
        write_gantt(list(paths.values()), *args)
        return paths
    return _save(DRAW[what](*args), out_dir, name)


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _drawer_init(parent: int) -> None:
    """A drawing process leaves Ctrl-C to its parent and dies with it: a parent killed by
    SIGKILL must not leave drawers behind that hold its output pipes open."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:      # the parent died before the line above
        os._exit(1)


def _draw_all(jobs: list, out_dir: Path, workers: int | None) -> dict[str, dict]:
    """Draw ``jobs`` ((name, what, args), ...): in forked processes, one per core up to
    ``workers`` (default: every core), since a figure's drawing is pure Python that one core
    runs at a time; in this process with one worker, in a daemon process (it may not start
    children), where fork is unavailable, or when the processes cannot start. Each figure
    depends on its inputs alone, so the files are the same either way."""
    workers = min(len(jobs), workers or _cores())
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods() and \
            not multiprocessing.current_process().daemon:
        try:
            # concurrent.futures loads its process pool (and multiprocessing's pipes) on first use
            pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"),
                                                          initializer=_drawer_init, initargs=(os.getpid(),))
        except OSError:                         # no process to spare: draw them here
            pool = None
        if pool is not None:
            try:
                futures = {name: pool.submit(_draw, name, what, args, out_dir) for name, what, args in jobs}
                files = {name: f.result() for name, f in futures.items()}
                pool.shutdown()
                return files
            except (OSError, concurrent.futures.BrokenExecutor):   # BrokenProcessPool's base
                _stop(pool)
            except BaseException:               # Ctrl-C: stop the drawers at once, then go on ending
                _stop(pool)
                raise
    return {name: _draw(name, what, args, out_dir) for name, what, args in jobs}


def _stop(pool) -> None:
    """End a drawing pool now: its processes are killed, not waited for."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        with contextlib.suppress(OSError, ValueError):
            proc.kill()


def write_figures(study, meta: StudyMeta, trials, baselines, out_dir: Path, cfg=None, workers: int | None = None):
    """Draw every figure of the report into ``out_dir`` as PNG and SVG: ``({name: {"png", "svg",
    ...}}, {name: note})``, a note where a figure cannot be drawn. What needs the study (the
    importances, the layer schedules) is computed here; the figures are drawn in parallel
    (:func:`_draw_all`, ``workers`` processes at most)."""
    out_dir = Path(out_dir)
    jobs: list = []
    extra: dict = {}
    notes: dict = {"gantt_notes": []}
    best = best_designs(trials, meta)
    if len(_evaluated(trials)) or len(baselines):
        jobs += [("front", "front", (trials, baselines, meta, best)), ("history", "history", (trials, baselines, meta))]
    imp, why = importances(study, meta)
    if imp:
        jobs.append(("importance", "importance", (imp, meta, why)))
        extra["importance"] = {"data": imp}
        notes["importance_caption"] = why
    else:
        notes["importance"] = why
    if len(best):
        row = best.iloc[0]
        jobs.append(("breakdown", "breakdown", (row, baselines, meta)))
        scheds, notes["gantt_notes"] = layer_schedules(study, meta, row, cfg)
        for w, plan, _chip, fwd, bwd in scheds:
            name = f"gantt-{_slug(w)}"
            title = f"{w}: one layer on trial {row['trial']} (template {meta.base}), plan {plan}"
            jobs.append((name, "gantt", ([("forward", fwd), ("backward", bwd)], title)))
            extra[name] = {"workload": w}
        front = plan_front(trials, meta)
        if len(front):
            jobs.append(("plans", "plans", (front, meta)))
    kinds = infeasible_counts(trials, study)
    if kinds:
        jobs.append(("infeasible", "infeasible", (kinds, meta)))
    else:
        notes["infeasible"] = "No infeasible design."
    files = _draw_all(jobs, out_dir, workers)
    drawn = {name: dict(files[name], **extra.get(name, {})) for name, _, _ in jobs}
    return drawn, notes


DRAW = {"front": fig_front, "history": fig_history, "importance": fig_importance, "breakdown": fig_breakdown,
        "plans": fig_plans, "infeasible": fig_infeasible}


# --- the HTML report --------------------------------------------------------------------------------
def _hover(r: pd.Series, meta: StudyMeta) -> str:
    lines = [f"<b>trial {r['trial']}</b>" + ("" if r.get("feasible") else " (infeasible)")]
    lines += [f"{k} = {r.get(f'chip:{k}'):g}" for k in (meta.searched or meta.keys) if f"chip:{k}" in r]
    lines += [f"throughput {r['throughput_tokens_per_s']:,.0f} tokens/s", f"area {r['area_mm2']:,.1f} mm²",
              f"power {r['power_w']:,.1f} W", f"cost ${r['cost_usd']:,.0f}"]
    lines += [f"{w}: {r.get(f'{w}:plan')}" for w in meta.workloads if isinstance(r.get(f"{w}:plan"), str)]
    if not r.get("feasible") and isinstance(r.get("reason"), str):
        lines.append(html.escape(r["reason"]))
    return "<br>".join(lines)


def _plotly_front(trials, baselines, meta, best, studies=None):
    import plotly.graph_objects as go  # deferred: plotly imports slowly, only report.html needs it
    from plotly.subplots import make_subplots
    metrics = ("area_mm2", "power_w", "cost_usd")
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.04)
    styles = _baseline_styles(baselines)
    groups = studies or [(meta.name, trials, meta, DESIGN)]
    for col, metric in enumerate(metrics, 1):
        first = col == 1
        for label, tr, m, colour in groups:
            done = _evaluated(tr)
            ok = done[done["feasible"].astype(bool)]
            bad = done[~done["feasible"].astype(bool)]
            if len(bad) and studies is None:
                fig.add_trace(go.Scatter(x=bad[metric], y=bad["throughput_tokens_per_s"], mode="markers",
                                         marker=dict(symbol="x", color=INFEASIBLE, size=7), name="infeasible",
                                         legendgroup="bad", showlegend=first, hovertext=[_hover(r, m) for _, r in
                                                                                        bad.iterrows()],
                                         hoverinfo="text"), 1, col)
            fig.add_trace(go.Scatter(x=ok[metric], y=ok["throughput_tokens_per_s"], mode="markers",
                                     marker=dict(color=colour, size=7, opacity=0.6),
                                     name=f"{label}: feasible" if studies else "feasible design",
                                     legendgroup=f"ok{label}", showlegend=first,
                                     hovertext=[_hover(r, m) for _, r in ok.iterrows()], hoverinfo="text"), 1, col)
            fr = front_2d(tr, metric)
            fig.add_trace(go.Scatter(x=fr[metric], y=fr["throughput_tokens_per_s"], mode="lines+markers",
                                     line=dict(color=FRONT if studies is None else colour, shape="hv", width=2),
                                     name=f"{label}: front" if studies else "front", legendgroup=f"fr{label}",
                                     showlegend=first, hovertext=[_hover(r, m) for _, r in fr.iterrows()],
                                     hoverinfo="text"), 1, col)
        if studies is None and len(best):
            b0 = best.iloc[0]
            fig.add_trace(go.Scatter(x=[b0[metric]], y=[b0["throughput_tokens_per_s"]], mode="markers",
                                     marker=dict(symbol="star", size=18, color=BEST, line=dict(width=1, color="black")),
                                     name=f"best design (trial {b0['trial']})", legendgroup="best", showlegend=first,
                                     hovertext=[_hover(b0, meta)], hoverinfo="text"), 1, col)
        xs = [x for _, tr, _, _ in groups for x in _evaluated(tr)[metric]] + \
             [x[metric] for _, x in baselines.iterrows() if x["throughput_tokens_per_s"]] + _budgets(meta, metric)
        lo, hi = _xlim(xs)
        fig.update_xaxes(range=[lo, hi], row=1, col=col)
        for _, b in baselines.iterrows():
            if not b["throughput_tokens_per_s"]:
                continue
            mk, c = styles[b["baseline"]]
            where = "top left" if b[metric] > lo + 0.6 * (hi - lo) else "top right"
            text = (f"<b>{b['chip_name']}</b> (baseline{'' if b['feasible'] else ', breaks the budgets'})<br>"
                    f"throughput {b['throughput_tokens_per_s']:,.0f} tokens/s<br>area {b['area_mm2']:,.1f} mm²<br>"
                    f"power {b['power_w']:,.1f} W<br>cost ${b['cost_usd']:,.0f}")
            fig.add_trace(go.Scatter(x=[b[metric]], y=[b["throughput_tokens_per_s"]], mode="markers+text",
                                     marker=dict(symbol=PLOTLY_SYMBOL[mk], size=12, color=c,
                                                 line=dict(width=1, color="black")),
                                     text=[b["chip_name"]], textposition=where, textfont=dict(color=c),
                                     name=f"{b['chip_name']} (baseline)", legendgroup=b["baseline"],
                                     showlegend=first, hovertext=[text], hoverinfo="text"), 1, col)
        for key, bound in meta.constraints:
            if CONSTRAINT_METRIC.get(key) == metric:
                fig.add_vline(x=bound, line=dict(color="#c44e52", dash="dash"), row=1, col=col)
                fig.add_annotation(x=bound, y=1.0, yref="paper", yanchor="bottom", showarrow=False,
                                   text=_budget_text(key, bound, metric), font=dict(color="#c44e52", size=11),
                                   xref=f"x{'' if col == 1 else col}")
        fig.update_xaxes(title_text=METRICS[metric][0], row=1, col=col)
    fig.update_yaxes(title_text="throughput (tokens/s, weighted geo. mean)", row=1, col=1, rangemode="tozero")
    fig.update_layout(height=520, margin=dict(l=60, r=20, t=30, b=60), legend=dict(orientation="h", y=-0.2))
    return fig


def _plotly_history(groups, baselines, objectives_directions):
    import plotly.graph_objects as go  # deferred: plotly imports slowly, only report.html needs it
    fig = go.Figure()
    o, d = objectives_directions
    for label, tr, colour in groups:
        done = _evaluated(tr).sort_values("trial")
        ok = done[done["feasible"].astype(bool)]
        bad = done[~done["feasible"].astype(bool)]
        if len(groups) == 1 and len(bad):
            fig.add_trace(go.Scatter(x=bad["trial"], y=bad[o], mode="markers", marker=dict(symbol="x",
                                     color=INFEASIBLE, size=7), name="infeasible (evaluated)",
                                     hovertemplate="trial %{x} (infeasible)<br>%{y:,.4g}<extra></extra>"))
        fig.add_trace(go.Scatter(x=ok["trial"], y=ok[o], mode="markers", marker=dict(color=colour, size=6,
                                 opacity=0.6), name=f"{label}: feasible design",
                                 hovertemplate="trial %{x}<br>%{y:,.4g}<extra></extra>"))
        if len(ok):
            run = ok[o].cummax() if d == "maximize" else ok[o].cummin()
            fig.add_trace(go.Scatter(x=ok["trial"], y=run, mode="lines", line=dict(shape="hv", width=2.5,
                                     color=FRONT if len(groups) == 1 else colour),
                                     name=f"{label}: best feasible so far"))
    styles = _baseline_styles(baselines)
    for _, b in baselines.iterrows():
        v = b.get(o)
        if v and math.isfinite(v):
            fig.add_hline(y=v, line=dict(color=styles[b["baseline"]][1], dash="dot"),
                          annotation_text=b["chip_name"] + ("" if b["feasible"] else " (over budget)"),
                          annotation_position="top right")
    f, label = _objective_axis(o, [1.0])
    fig.update_layout(height=420, xaxis_title="trial number", yaxis_title=label.replace("(", "(", 1),
                      margin=dict(l=60, r=20, t=30, b=50), legend=dict(orientation="h", y=-0.2))
    return fig


def _plotly_importance(imp: dict):
    import plotly.graph_objects as go  # deferred: plotly imports slowly, only report.html needs it
    from plotly.subplots import make_subplots
    fig = make_subplots(rows=len(imp), cols=1, subplot_titles=[f"what decides {o}" for o in imp])
    for i, (_o, vals) in enumerate(imp.items(), 1):
        names = list(vals)[::-1]
        fig.add_trace(go.Bar(x=[vals[n] for n in names], y=names, orientation="h", marker_color=DESIGN,
                             showlegend=False, hovertemplate="%{y}: %{x:.3f}<extra></extra>"), i, 1)
        fig.update_xaxes(title_text=IMPORTANCE_AXIS, row=i, col=1)
    fig.update_layout(height=140 + 40 * sum(len(v) for v in imp.values()), margin=dict(l=60, r=20, t=40, b=50))
    return fig


def _plotly_breakdown(row, baselines, meta):
    import plotly.graph_objects as go  # deferred: plotly imports slowly, only report.html needs it
    from plotly.subplots import make_subplots
    n = len(meta.workloads)
    fig = make_subplots(rows=n, cols=1, subplot_titles=[f"{_workload_title(meta, w)}: where the step time goes"
                                                        for w in meta.workloads])
    for i, w in enumerate(meta.workloads, 1):
        chips = _breakdown_rows(row, baselines, w)
        names = [c[0] for c in chips]
        for c in BREAKDOWN:
            fig.add_trace(go.Bar(y=names, x=[(r.get(f"{w}:{c}") or 0.0) for _, r, _ in chips], orientation="h",
                                 name=BREAKDOWN_LABELS[c], marker_color=COMPONENT_COLOURS[c], legendgroup=c,
                                 showlegend=i == 1,
                                 customdata=[[r.get(f"{w}:plan"), r.get(f"{w}:memory_per_device_gib") or 0.0,
                                              hbm or 0.0] for _, r, hbm in chips],
                                 hovertemplate="%{y}: %{x:.4g} s<br>plan %{customdata[0]}<br>memory per device "
                                               "%{customdata[1]:.1f} of %{customdata[2]:.0f} GiB<extra>"
                                               + BREAKDOWN_LABELS[c] + "</extra>"), i, 1)
        fig.update_xaxes(title_text="time per training step (s)", row=i, col=1)
        fig.update_yaxes(autorange="reversed", row=i, col=1)
    fig.update_layout(barmode="stack", height=120 + n * (80 + 35 * len(chips)),
                      margin=dict(l=60, r=20, t=40, b=50), legend=dict(orientation="h", y=-0.15))
    return fig


def _plotly_plans(front, meta):
    import plotly.graph_objects as go  # deferred: plotly imports slowly, only report.html needs it
    from plotly.subplots import make_subplots
    n = len(meta.workloads)
    fig = make_subplots(rows=n, cols=1, subplot_titles=[f"{w}: the best plan along the front" for w in meta.workloads])
    ticks = [f"t{r['trial']}, {r['area_mm2']:.0f} mm²" for _, r in front.iterrows()]
    symbol = {"o": "circle", "s": "square", "^": "triangle-up"}
    for i, w in enumerate(meta.workloads, 1):
        parts = [_plan_parts(r.get(f"{w}:plan")) for _, r in front.iterrows()]
        plans = [str(r.get(f"{w}:plan")) for _, r in front.iterrows()]
        top = 1
        for key, label, marker, colour, dy, dash in PLAN_LINES:
            ys = [int(p.get(key) or 1) for p in parts]
            top = max(top, *ys)
            fig.add_trace(go.Scatter(x=ticks, y=[y * dy for y in ys], mode="lines+markers", name=label,
                                     line=dict(color=colour, dash={"-": "solid", "--": "dash", ":": "dot"}[dash]),
                                     marker=dict(symbol=symbol[marker], size=8), legendgroup=key, showlegend=i == 1,
                                     customdata=[[y, p] for y, p in zip(ys, plans, strict=True)],
                                     hovertemplate="%{x}<br>" + label
                                     + " %{customdata[0]}<br>%{customdata[1]}<extra></extra>"), i, 1)
        k = int(math.log2(top)) + 1
        # powers of two only: plotly's own log ticks add minor labels (a stray 9)
        fig.update_yaxes(type="log", title_text="width or size (count, log₂)", row=i, col=1,
                         tickvals=[2 ** j for j in range(k)], ticktext=[str(2 ** j) for j in range(k)],
                         range=[math.log10(0.7), math.log10(top * 4)])
        fig.update_xaxes(title_text="design on the front (trial, die area), smallest first", row=i, col=1)
        same = _same_plan(front, w)
        if same:
            fig.add_annotation(text=same.replace("\n", "<br>"), xref=f"x{'' if i == 1 else i} domain",
                               yref=f"y{'' if i == 1 else i} domain", x=0.5, y=0.5, showarrow=False,
                               bgcolor="white", bordercolor="#bbbbbb")
    fig.update_layout(height=140 + 320 * n, margin=dict(l=60, r=20, t=40, b=50), legend=dict(orientation="h", y=-0.1))
    return fig


def _plotly_infeasible(kinds: dict):
    import plotly.graph_objects as go  # deferred: plotly imports slowly, only report.html needs it
    names = list(kinds)[::-1]
    fig = go.Figure(go.Bar(x=[kinds[k] for k in names], y=names, orientation="h", marker_color=INFEASIBLE,
                           hovertemplate="%{y}: %{x}<extra></extra>"))
    fig.update_xaxes(tick0=0, dtick=max(1, math.ceil(max(kinds.values()) / 8)), tickformat="d")   # counts
    fig.update_layout(height=120 + 40 * len(kinds), xaxis_title="designs (count)",
                      margin=dict(l=60, r=20, t=20, b=50))
    return fig


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px auto; max-width: 1280px;
       color: #222; line-height: 1.45; padding: 0 16px; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.88em; margin: 0.6em 0; max-width: 100%; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; overflow-wrap: anywhere; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
.answer { font-size: 1.1em; background: #f6f8fb; border-left: 4px solid #4c72b0; padding: 8px 12px; }
figure.plot { margin: 0.6em 0; } figure.plot svg { max-width: 100%; height: auto; }
.note { color: #666; font-style: italic; }
"""


def _html_table(head, rows, table_id: str) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table id="{table_id}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _plotly_div(fig, name: str) -> str:
    import plotly.io as pio  # deferred: plotly imports slowly
    div = pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"plotly-{name}",
                      config={"displaylogo": False, "responsive": True})
    return f'<figure class="plot" data-plot="{name}">{div}</figure>'


def _inline_svg(path: Path, name: str) -> str:
    text = Path(path).read_text()
    text = text[text.index("<svg"):]
    return f'<figure class="plot" data-plot="{name}">{text}</figure>'


def _page(title: str, body: list[str]) -> str:
    from plotly.offline import get_plotlyjs  # deferred: plotly imports slowly
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style>"
            f"<script type=\"text/javascript\">{get_plotlyjs()}</script></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _md_inline(text: str) -> str:
    """The answer paragraph's **bold** as HTML."""
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))


def write_html(study, meta: StudyMeta, trials, baselines, out_dir: Path, drawn: dict, notes: dict) -> Path:
    """``report.html``: the report with interactive plots (hover for a design's parameters and
    plans), self-contained: plotly.js and the Gantt charts are inlined."""
    best = best_designs(trials, meta)
    complete = trials[trials["state"] == "COMPLETE"]
    b = [f"<h1>phaze search: {html.escape(study.study_name)}</h1>",
         f'<p class="answer" id="answer">{_md_inline(answer(best, baselines, meta, trials))}</p>',
         f"<p>{evaluated_phrase(trials)} of a space of {meta.grid_size:,}; "
         f"template {html.escape(meta.base)}; objectives: "
         + html.escape(", ".join(f"{o} ({d})" for o, d in zip(meta.objectives, meta.directions, strict=False)))
         + "; budgets: " + html.escape(", ".join(f"{k} {v:g}" for k, v in meta.constraints) or "none")
         + ". Workloads: " + html.escape(", ".join(meta.descriptions)) + ".</p>",
         "<h2>Best designs</h2>"]
    if len(best):
        b.append(_html_table(*best_designs_table(best, meta), "best-designs"))
    else:
        b.append('<p id="best-designs" class="note">No feasible design'
                 + (": every design evaluated is infeasible (reasons below).</p>" if len(complete) else " yet.</p>"))
    if len(baselines):
        b += ["<h2>Baselines, scored by the same model</h2>", _html_table(*baselines_table(baselines), "baselines")]
        if len(best):
            b += ["<p>Gain in throughput of each best design over each baseline (per workload; overall = weighted "
                  "geometric mean), at the study's budgets:</p>", _html_table(*gains_table(best, baselines, meta),
                                                                             "gains")]
    b.append("<h2>The front: throughput against area, power and cost</h2>")
    if "front" in drawn:
        b += ["<p>Hover over a point for its parameters, area, power, cost and plans.</p>",
              _plotly_div(_plotly_front(trials, baselines, meta, best), "front")]
    if "history" in drawn:
        b.append("<h2>Best so far</h2>")
        for o, d in zip(meta.objectives, meta.directions, strict=False):
            div = _plotly_div(_plotly_history([(meta.name, trials, DESIGN)], baselines, (o, d)), "history")
            b.append(div if o == meta.objectives[0] else div.replace('data-plot="history"', f'data-plot="history-{o}"'))
    b.append("<h2>Parameter importances</h2>")
    if "importance" in drawn:
        b += [_plotly_div(_plotly_importance(drawn["importance"]["data"]), "importance"),
              f'<p class="note" id="importance-caption">{html.escape(notes.get("importance_caption", ""))}</p>']
    else:
        b.append(f'<p class="note">{html.escape(notes.get("importance", ""))}</p>')
    if len(best):
        r = best.iloc[0]
        b += [f"<h2>Where the step time goes (trial {r['trial']})</h2>",
              _plotly_div(_plotly_breakdown(r, baselines, meta), "breakdown"),
              _html_table(*breakdown_table(r, baselines, meta), "breakdown-table")]
        for name in sorted(k for k in drawn if k.startswith("gantt")):
            b += [f"<h3>{html.escape(drawn[name]['workload'])}: one layer's schedule on the chip's units</h3>",
                  _inline_svg(drawn[name]["svg"], name)]
        b += [f'<p class="note">{html.escape(n)}</p>' for n in notes.get("gantt_notes", [])]
        front = plan_front(trials, meta)
        b += ["<h2>Plans along the front</h2>",
              "<p>" + ("The study's Pareto set" if len(meta.objectives) > 1 else
                       "The designs no other beats in both throughput and area") + ", smallest first.</p>"]
        if "plans" in drawn:
            b.append(_plotly_div(_plotly_plans(front, meta), "plans"))
        b.append(_html_table(*plans_table(front, meta), "plans-table"))
    b.append("<h2>Infeasible designs by reason</h2>")
    kinds = infeasible_counts(trials, study)
    if kinds:
        b += [_html_table(["reason", "designs"], [[k, str(n)] for k, n in kinds.items()], "infeasible-table"),
              _plotly_div(_plotly_infeasible(kinds), "infeasible")]
    else:
        b.append('<p class="note">No infeasible design.</p>')
    pruned = int((trials["state"] == "PRUNED").sum())
    b += ["<h2>Study</h2>",
          f"<p>{html.escape(sampler_phrase(meta))}; {len(trials)} trials in the storage: "
          f"{len(complete)} complete, {pruned} pruned unevaluated, "
          f"{int((trials['state'] == 'FAIL').sum())} failed. Every trial is in <code>trials.csv</code>, the front "
          f"in <code>pareto.csv</code>; browse the study with <code>optuna-dashboard "
          f"{html.escape(storage_hint(study))}</code>.</p>"]
    path = Path(out_dir) / "report.html"
    tmp = path.with_name(f".report.html.tmp{os.getpid()}")
    tmp.write_text(_page(f"phaze search: {study.study_name}", b))
    os.replace(tmp, path)
    return path


# --- comparing studies ------------------------------------------------------------------------------
def fig_compare_front(groups, baselines, meta):
    Figure = _mpl()
    fig = Figure(figsize=(13, 5.0))
    axes = fig.subplots(1, 3, sharey=True)
    ys = [v for _, tr, _, _ in groups for v in _evaluated(tr)["throughput_tokens_per_s"]]
    f, p = _scale(ys + list(baselines.get("throughput_tokens_per_s", [])))
    styles = _baseline_styles(baselines)
    handles, labels = {}, []
    for ax, metric in zip(axes, ("area_mm2", "power_w", "cost_usd"), strict=True):
        for (label, tr, _m, colour), marker, ls in zip(groups, ("o", "s", "^", "D"), ("-", "--", ":", "-."),
                                                       strict=False):
            ok = feasible_trials(tr)
            ax.scatter(ok[metric], ok["throughput_tokens_per_s"] / f, s=20, color=colour, alpha=0.35, lw=0,
                       marker=marker)
            fr = front_2d(tr, metric)
            handles[f"{label}: front ({len(ok)} feasible designs)"] = ax.plot(
                fr[metric], fr["throughput_tokens_per_s"] / f, ls=ls, marker=marker, color=colour, ms=6, lw=2,
                drawstyle="steps-post")[0]
        for _, b in baselines.iterrows():
            if not b["throughput_tokens_per_s"]:
                continue
            m, c = styles[b["baseline"]]
            handles[f"{b['chip_name']} (baseline)"] = ax.scatter([b[metric]], [b["throughput_tokens_per_s"] / f],
                                                                 marker=m, s=70, color=c, edgecolor="black", zorder=6)
            lo, hi = _xlim([v for _, tr, _, _ in groups for v in _evaluated(tr)[metric]]
                           + [x[metric] for _, x in baselines.iterrows() if x["throughput_tokens_per_s"]])
            ax.set_xlim(lo, hi)
            labels.append((ax, b["chip_name"], b[metric], b["throughput_tokens_per_s"] / f, c,
                           b[metric] > lo + 0.6 * (hi - lo)))
        ax.set_xlabel(METRICS[metric][0])
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel(f"throughput ({p}tokens/s, weighted geo. mean)")
    fig.suptitle(" vs ".join(g[0] for g in groups) + ": fronts of throughput against area, power and cost",
                 fontsize=FONT + 2)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(3, len(handles)), frameon=False)
    fig.tight_layout(rect=(0, 0.06 * math.ceil(len(handles) / 3) + 0.02, 1, 1))
    _place_labels(fig, labels)
    return fig


def fig_compare_history(groups):
    Figure = _mpl()
    fig = Figure(figsize=(9, 4.2))
    ax = fig.add_subplot()
    ys = [v for _, tr, _, _ in groups for v in _evaluated(tr)["throughput_tokens_per_s"]]
    f, p = _scale(ys)
    for (label, tr, _m, colour), ls in zip(groups, ("-", "--", ":", "-."), strict=False):
        ok = feasible_trials(tr).sort_values("trial")
        if len(ok):
            ax.step(ok["trial"], ok["throughput_tokens_per_s"].cummax() / f, where="post", color=colour, lw=2.2,
                    ls=ls, label=f"{label}: best feasible so far")
            ax.scatter(ok["trial"], ok["throughput_tokens_per_s"] / f, s=14, color=colour, alpha=0.35, lw=0)
    ax.set_xlabel("trial number")
    ax.set_ylabel(f"throughput ({p}tokens/s, weighted geo. mean)")
    ax.set_title("best feasible throughput so far")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    return fig


def write_compare(data, out_dir: Path) -> dict[str, Path]:
    """``data``: ``[(study, meta, trials, baselines)]``. Writes compare.md, compare.html and the
    compare-front / compare-history figures."""
    names = [s.study_name for s, *_ in data]
    if len(set(names)) < len(names):
        names = [f"{n} ({i + 1})" for i, n in enumerate(names)]
    groups = [(n, tr, m, STUDY_COLOURS[i % len(STUDY_COLOURS)]) for i, (n, (_s, m, tr, _b)) in
              enumerate(zip(names, data, strict=True))]
    baselines = data[0][3]
    meta = data[0][1]
    files = {}
    for name, fig in (("compare-front", fig_compare_front(groups, baselines, meta)),
                      ("compare-history", fig_compare_history(groups))):
        for ext, path in _save(fig, out_dir, name).items():
            files[f"{name}.{ext}"] = path
    head = ["study", "sampler", "seed", "budgets", "complete trials", "feasible", "best trial", "tokens/s (geomean)",
            "area mm²", "power W", "cost $"]
    rows = []
    for n, (_study, m, tr, _b) in zip(names, data, strict=True):
        done = tr[tr["state"] == "COMPLETE"]
        ok = feasible_trials(tr)
        top = ok.sort_values("throughput_tokens_per_s", ascending=False).head(1)
        r = top.iloc[0] if len(top) else None
        rows.append([n, m.sampler, str(m.seed), ", ".join(f"{k} {v:g}" for k, v in m.constraints) or "none",
                     str(len(done)), str(len(ok))] + (
                    [str(r["trial"]), f"{r['throughput_tokens_per_s']:,.0f}", f"{r['area_mm2']:.0f}",
                     f"{r['power_w']:.0f}", f"{r['cost_usd']:,.0f}"] if r is not None else ["–"] * 5))
    md = [f"# phaze report: {' vs '.join(names)}", "",
          "Each study's highest-throughput feasible design, and their fronts on one plot (baselines of "
          f"{names[0]}).", ""]
    md += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", "![fronts](compare-front.png)", "", "![best so far](compare-history.png)", ""]
    files["compare.md"] = out_dir / "compare.md"
    files["compare.md"].write_text("\n".join(md))
    hist = _plotly_history([(g[0], g[1], g[3]) for g in groups], baselines[:0], ("throughput_tokens_per_s",
                                                                                  "maximize"))
    hist.update_layout(yaxis_title="throughput (tokens/s, weighted geo. mean)")
    body = [f"<h1>phaze report: {html.escape(' vs '.join(names))}</h1>", _html_table(head, rows, "compare-table"),
            "<h2>Fronts</h2>",
            _plotly_div(_plotly_front(None, baselines, meta, pd.DataFrame(), studies=groups), "compare-front"),
            "<h2>Best so far</h2>", _plotly_div(hist, "compare-history")]
    files["compare.html"] = out_dir / "compare.html"
    files["compare.html"].write_text(_page(" vs ".join(names), body))
    return files
