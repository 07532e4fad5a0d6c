"""What a study tells an architect, rebuilt from its storage: ``trials.csv``, ``pareto.csv``,
``baselines.csv``, ``report.md``, a self-contained ``report.html`` and every figure as PNG and SVG
in the study's folder (``phaze report``, and the end of ``phaze search`` / ``phaze sweep``).

Everything a report needs is read from the study (its ``config``, ``fingerprint`` and
``baselines`` attributes and the trials' attributes), so a report is rebuilt from the storage
alone, without the sweep config. Every file is written whole (to a temporary name, then renamed),
so an interrupted search leaves the last complete report and a rerun brings it up to date. No
file names a path of the machine that wrote it.
"""
from __future__ import annotations

import math
import os
import sqlite3
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .arch import arch_dirs, load_chip
from .calibrate import calibrated_efficiency
from .catalogue import load_model, workload_dirs
from .configio import ConfigError
from .exact import Certificate
from .lazy import pd
from .plan import graph_recompute, parse_plan
from .schedule import schedule_layer
from .space import SweepConfig, build_chip
from .storage import _optuna, make_storage, study_dir
from .workload import with_seq_len

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
        evaluated = t.state.name == "COMPLETE" and bool(a.get("evaluated", True))
        row["evaluated"] = evaluated
        for i, o in enumerate(objectives):
            # a design skipped before evaluation (over a budget) has no throughput or power
            exact = o in ("area", "cost")
            row[o] = t.values[i] if t.values and (evaluated or exact) else None
        row["feasible"] = bool(a.get("feasible", False)) and t.state.name == "COMPLETE"
        row["reason"] = a.get("reason", "") if t.state.name == "COMPLETE" else (
            f"duplicate of trial {a['duplicate_of']}" if "duplicate_of" in a else t.state.name.lower())
        row["reason_kinds"] = "; ".join(a.get("reason_kinds", []))
        for k in ("area_mm2", "power_w", "cost_usd", "throughput_tokens_per_s", "schedule_status",
                  "schedule_gap", "eval_time_s", "clock_hz"):
            row[k] = a.get(k) if evaluated or k in ("area_mm2", "cost_usd") else None
        row["throttled"] = "; ".join(a.get("throttled") or []) if evaluated else ""
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


BREAKDOWN_LABELS = {"compute_s": "compute (tensor units)", "memory_bound_s": "memory-bound ops",
                    "communication_exposed_s": "exposed communication", "pipeline_bubble_s": "pipeline bubble",
                    "optimizer_s": "optimizer step"}
METRICS = {  # trials.csv column -> (label with unit, better)
    "throughput_tokens_per_s": ("throughput (tokens/s, weighted geometric mean)", "maximize"),
    "area_mm2": ("die area (mm²)", "minimize"),
    "power_w": ("power at load (W)", "minimize"),
    "cost_usd": ("chip cost ($, die and HBM)", "minimize"),
}
MIN_TRIALS_FOR_IMPORTANCE = 5
IMPORTANCE_FLOOR = 0.01      # below this a parameter's importance is noise, not an effect
SMALL_SAMPLE = 30            # fewer feasible designs than this: the importance ranking is only a hint


# --- what the report needs to know about the study -------------------------------------------------
@dataclass(frozen=True)
class StudyMeta:
    """A study's config as the report needs it: from a :class:`SweepConfig` when one is at hand,
    else from the study's own ``config`` attribute (``phaze report`` on a storage)."""

    name: str
    objectives: tuple[str, ...]
    directions: tuple[str, ...]
    constraints: tuple[tuple[str, float], ...]
    workloads: tuple[str, ...]            # model names: the ``<model>:`` columns of trials.csv
    descriptions: tuple[str, ...]         # "BERT-Large on 64 chips, global batch 512 (weight 1)"
    weights: tuple[float, ...]
    base: str                             # the template chip's name
    keys: tuple[str, ...]                 # every chip parameter of the space, in config order
    searched: tuple[str, ...]             # those that vary
    grid_size: int
    sampler: str
    seed: int
    process_node_nm: float | None = None
    link_latency_s: float | None = None


def study_meta(study, cfg: SweepConfig | None = None) -> StudyMeta:
    if isinstance(cfg, StudyMeta):
        return cfg
    if cfg is not None:
        return StudyMeta(
            cfg.name, tuple(cfg.objectives), tuple(cfg.directions), tuple(cfg.constraints),
            tuple(w.model.name for w in cfg.workloads),
            tuple(f"{w.model.name} on {w.devices} chips, global batch {w.global_batch} (weight {w.weight:g})"
                  for w in cfg.workloads),
            tuple(w.weight for w in cfg.workloads), cfg.base.name, tuple(d.key for d in cfg.dimensions),
            tuple(d.key for d in cfg.searched), cfg.grid_size(), cfg.sampler, cfg.seed,
            cfg.process_node_nm, cfg.link_latency_s)
    c = study.user_attrs.get("config") or {}
    labels = list(c.get("workloads") or [])
    models = [str(x).rsplit("@", 1)[0] for x in labels]
    batch = _global_batches(study)
    weights = list(c.get("weights") or [1.0] * len(labels))
    desc = []
    for label, m, w in zip(labels, models, weights, strict=False):
        devices = str(label).rsplit("@", 1)[1] if "@" in str(label) else "?"
        desc.append(f"{m} on {devices} chips" + (f", global batch {batch[m]}" if m in batch else "")
                    + f" (weight {w:g})")
    space = c.get("space") or {}
    searched = tuple(k for k, v in space.items() if isinstance(v, list) and len(v) > 1)
    return StudyMeta(
        str(c.get("name", study.study_name)), tuple(c.get("objectives") or ()),
        tuple(d.name.lower() for d in study.directions),
        tuple((k, float(v)) for k, v in (c.get("constraints") or {}).items()),
        tuple(models), tuple(desc), tuple(float(w) for w in weights), str(c.get("base", "")),
        tuple(space), searched, int(math.prod(len(v) for v in space.values() if isinstance(v, list))),
        str(c.get("sampler", "")), int(c.get("seed", 0)), c.get("process_node_nm"), c.get("link_latency_s"))


def _global_batches(study) -> dict[str, int]:
    out: dict[str, int] = {}
    sources = [b.get("workloads") or [] for b in (study.user_attrs.get("baselines") or {}).values()]
    for t in study.get_trials(deepcopy=False):
        if out or len(sources) > 3:
            break
        sources.append(t.user_attrs.get("workloads") or [])
    for outcomes in sources:
        for o in outcomes:
            out.setdefault(o.get("workload"), o.get("global_batch"))
    return out


# --- opening a study for a report -------------------------------------------------------------------
def _sqlite_studies(db: Path, what: str) -> list[str]:
    """The study names in an SQLite file, or one clear error if it is not an Optuna storage."""
    try:
        with open(db, "rb") as fh:
            head = fh.read(16)
    except OSError as exc:
        raise ConfigError(what, None, f"cannot read {str(db)!r} ({exc.strerror})") from None
    if head != b"SQLite format 3\x00":
        raise ConfigError(what, None, f"not a study: {db.name} is not an SQLite file "
                                      f"(expected the study.db that phaze search writes)")
    journal = db.with_name(db.name + "-journal")
    # a hot rollback journal (its writer died mid-transaction) needs a writable connection,
    # through which SQLite rolls it back; read-only, SQLite refuses to read the file at all
    uri = f"file:{db}" + ("" if journal.exists() else "?mode=ro")
    try:
        con = sqlite3.connect(uri, uri=True)
        try:
            return [r[0] for r in con.execute("SELECT study_name FROM studies ORDER BY study_id")]
        finally:
            con.close()
    except sqlite3.Error as exc:
        if journal.exists():
            raise ConfigError(what, None, f"{db.name} has an unfinished transaction ({journal.name}: its writer "
                                          f"died mid-write) that SQLite cannot roll back ({exc}); allowed: a "
                                          f"folder this user can write, so that the rollback can run") from None
        raise ConfigError(what, None, f"not a study: {db.name} holds no Optuna study tables") from None


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _list_of(check):
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _dict_of(check):
    return lambda v: isinstance(v, dict) and all(isinstance(k, str) and check(x) for k, x in v.items())


_is_str = lambda v: isinstance(v, str)              # noqa: E731
_num_or_none = lambda v: v is None or _is_num(v)    # noqa: E731
# what phaze search and sweep write into a study's attributes: (check, what it should be)
CONFIG_SCHEMA = {
    "name": (_is_str, "a string"),
    "objectives": (_list_of(_is_str), "a list of objective names"),
    "constraints": (_dict_of(_is_num), "a mapping of budget names to numbers"),
    "workloads": (_list_of(_is_str), "a list of workload labels"),
    "weights": (_list_of(_is_num), "a list of numbers"),
    "space": (_dict_of(lambda v: isinstance(v, str) or _list_of(_is_num)(v)), "a mapping of parameters to "
              "lists of numbers or expressions"),
    "base": (_is_str, "a chip name"),
    "sampler": (_is_str, "a sampler name"),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "workload_sources": (_list_of(lambda v: v is None or isinstance(v, str)), "a list of file names"),
    "process_node_nm": (_num_or_none, "a number"),
    "link_latency_s": (_num_or_none, "a number"),
}
STUDY_SCHEMA = {
    "config": (lambda v: isinstance(v, dict), "a mapping"),
    "fingerprint": (_is_str, "a string"),
    "baselines": (_dict_of(lambda b: isinstance(b, dict) and isinstance(b.get("objectives", {}), dict)
                           and isinstance(b.get("chip", {}), dict)), "a mapping of chip names to evaluations"),
    "sweep_skipped": (_dict_of(lambda v: isinstance(v, int)), "a mapping of budget names to counts"),
    "certificate": (lambda v: isinstance(v, dict), "a mapping"),
}


def check_study_attrs(study, what: str) -> None:
    """One clear line for a study attribute of another type than phaze writes (hand-edited or
    damaged), before any table or figure trips over it."""
    attrs = study.user_attrs
    for key, (ok, want) in STUDY_SCHEMA.items():
        if key in attrs and not ok(attrs[key]):
            raise ConfigError(what, f"study attribute {key}", f"{type(attrs[key]).__name__} {_short(attrs[key])}; "
                              f"allowed: {want}, as phaze search writes it")
    config = attrs.get("config") or {}
    for key, (ok, want) in CONFIG_SCHEMA.items():
        if key in config and not ok(config[key]):
            raise ConfigError(what, f"study attribute config.{key}", f"{type(config[key]).__name__} "
                              f"{_short(config[key])}; allowed: {want}, as phaze search writes it")
    if len(config.get("weights") or []) not in (0, len(config.get("workloads") or [])):
        raise ConfigError(what, "study attribute config.weights", "one weight per workload is allowed")


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def load_study(path: str | Path | None = None, storage: str | None = None, name: str | None = None):
    """``(study, folder)`` of a study: from its folder (``results/<study>``, holding ``study.db``),
    its SQLite file, or a storage URL (with ``name`` unless the storage holds one study). Raises
    :class:`ConfigError` with one clear line for a missing path, a path that is not a study, an
    unknown name, a study phaze did not write, and a study without a complete trial."""
    optuna = _optuna()
    what = str(path) if path is not None else "--storage"
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(what, None, "no such study folder or file")
        db = p / "study.db" if p.is_dir() else p
        if not db.is_file():
            raise ConfigError(what, None, "not a study: no study.db in it (phaze search writes "
                                          "results/<study>/study.db)")
        names = _sqlite_studies(db, what)
        url = f"sqlite:///{db}"
    else:
        url = storage
        if url.startswith("sqlite:///"):
            db = Path(url[len("sqlite:///"):])
            if not db.is_file():
                raise ConfigError("--storage", None, f"no such SQLite file {str(db)!r}")
            names = _sqlite_studies(db, "--storage")
        else:
            st = make_storage(url, heartbeat=False)
            names = optuna.get_all_study_names(storage=st)
    if not names:
        raise ConfigError(what, None, "the storage holds no study")
    if name is None:
        folder = Path(path).name if path is not None and Path(path).is_dir() else None
        if len(names) == 1:
            name = names[0]
        elif folder in names:
            name = folder
        else:
            raise ConfigError(what, None, f"holds {len(names)} studies; name one with --study: {', '.join(names)}")
    elif name not in names:
        raise ConfigError("--study", None, f"no study {name!r} in {what}; allowed: {', '.join(names)}")
    study = optuna.load_study(study_name=name, storage=make_storage(url, heartbeat=False))
    if not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        raise ConfigError(what, None, f"study {name!r} has no complete trial yet "
                                      f"({len(study.get_trials(deepcopy=False))} trials in the storage)")
    if "config" not in study.user_attrs:
        raise ConfigError(what, None, f"study {name!r} was not written by phaze search or sweep "
                                      f"(it has no 'config' attribute)")
    check_study_attrs(study, what)
    out = (db.parent if path is not None or url.startswith("sqlite:///") else study_dir(url, name))
    return study, out


# --- the analyses -----------------------------------------------------------------------------------
def feasible_trials(trials: pd.DataFrame) -> pd.DataFrame:
    return trials[(trials["state"] == "COMPLETE") & trials["feasible"].astype(bool)] if len(trials) else trials


def front_2d(trials: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The feasible designs no other beats in both throughput and ``metric`` (area, power, cost),
    ordered by ``metric``."""
    ok = feasible_trials(trials)
    if not len(ok):
        return ok
    v = ok[["throughput_tokens_per_s", metric]].to_numpy(dtype=float)
    return ok[pareto_mask(v, ["maximize", "minimize"])].sort_values([metric, "throughput_tokens_per_s"])


def plan_front(trials: pd.DataFrame, meta: StudyMeta) -> pd.DataFrame:
    """The designs along which plans are compared: the study's Pareto set when it has several
    objectives, else the front of throughput against area; smallest area first."""
    if len(meta.objectives) > 1:
        return pareto_frame(trials, meta.objectives, meta.directions).sort_values("area_mm2")
    return front_2d(trials, "area_mm2")


def infeasible_counts(trials: pd.DataFrame, study=None) -> dict[str, int]:
    """Infeasible complete trials counted by each kind of reason (a trial breaking two budgets
    counts under both), plus the designs a sweep skipped before evaluation."""
    kinds: dict[str, int] = {}
    done = trials[trials["state"] == "COMPLETE"] if len(trials) else trials
    for k in (done[~done["feasible"].astype(bool)]["reason_kinds"] if len(done) else []):
        k = "" if not isinstance(k, str) else k
        for kind in (k or "unknown").split("; "):
            kinds[kind] = kinds.get(kind, 0) + 1
    for k, n in ((study.user_attrs.get("sweep_skipped") or {}) if study is not None else {}).items():
        kinds[f"{k} broken, skipped by the sweep"] = int(n)
    return dict(sorted(kinds.items(), key=lambda x: (-x[1], x[0])))


def _no_effect(done, i: int, param: str) -> bool:
    """True when every pair of trials differing in ``param`` alone has the same value of objective
    ``i`` (and there are two such pairs at least): the parameter demonstrably changes nothing."""
    groups: dict = {}
    for t in done:
        rest = tuple(sorted((k, repr(v)) for k, v in t.params.items() if k != param))
        groups.setdefault(rest, {}).setdefault(repr(t.params.get(param)), t.values[i])
    pairs = [g for g in groups.values() if len(g) > 1]
    return len(pairs) >= 2 and all(max(g.values()) - min(g.values()) <= 1e-9 * max(abs(v) for v in g.values())
                               for g in pairs)


def importances(study, meta: StudyMeta) -> tuple[dict[str, dict[str, float]], str]:
    """Per objective, each searched parameter's importance over the feasible trials (PED-ANOVA:
    how much each parameter decides reaching the best tenth of the designs; normalised to sum to
    1), largest first, ties by name (so the order does not depend on the process), without the
    parameters that have no effect (below :data:`IMPORTANCE_FLOOR`, or equal values for every pair
    of designs differing in it alone). The text is the figure's caption (the sample size, what was
    dropped, a caveat under :data:`SMALL_SAMPLE` designs), or why there is no figure."""
    optuna = _optuna()
    done = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
            if t.user_attrs.get("feasible") and t.values]
    varying = {k for k in {p for t in done for p in t.params} if len({t.params.get(k) for t in done}) > 1}
    if len(done) < MIN_TRIALS_FOR_IMPORTANCE or not varying:
        return {}, (f"too few trials to rank the parameters: {len(done)} feasible designs "
                    f"(at least {MIN_TRIALS_FOR_IMPORTANCE}, differing in some parameter, are needed)")
    out, dropped = {}, set()
    try:
        for i, (o, d) in enumerate(zip(meta.objectives, meta.directions, strict=False)):
            sub = optuna.create_study(direction=d)
            sub.add_trials([optuna.trial.create_trial(params=t.params, distributions=t.distributions,
                                                      value=t.values[i]) for t in done])
            imp = optuna.importance.get_param_importances(
                sub, evaluator=optuna.importance.PedAnovaImportanceEvaluator(), params=sorted(varying))
            keep = {k: float(v) for k, v in imp.items() if v >= IMPORTANCE_FLOOR and not _no_effect(done, i, k)}
            dropped |= set(imp) - set(keep)
            out[o] = {param_label(k): v for k, v in sorted(keep.items(), key=lambda kv: (-round(kv[1], 9), kv[0]))}
    except (RuntimeError, ValueError, ZeroDivisionError) as exc:   # e.g. objective constant over the trials
        return {}, f"parameter importances could not be computed ({exc})"
    if not any(out.values()):
        return {}, f"no parameter has a measurable effect over the {len(done)} feasible designs"
    return out, importance_caption(len(done), sorted(param_label(k) for k in dropped))


def importance_caption(n: int, dropped) -> str:
    """The importance figure's caption: the sample, the parameters left out, a small-sample caveat."""
    text = f"From {n} feasible designs."
    if dropped:
        text += f" No measurable effect (left out): {', '.join(dropped)}."
    if n < SMALL_SAMPLE:
        text += (f" A small sample (under {SMALL_SAMPLE} designs): the ranking is a hint, not a measurement; "
                 "run more trials to confirm it.")
    return text


def param_label(param: str) -> str:
    return f"{param[len('log2_'):]} (log₂)" if param.startswith("log2_") else param


def _find_by_name(name: str, hints, dirs, load):
    """The config called ``name``: the first of ``hints`` (names or paths) that loads with that
    name, else the first YAML in ``dirs`` that does; None when none does."""
    candidates = list(hints) + [f for d in dirs if d.is_dir() for f in sorted(d.glob("*.yaml"))]
    for c in candidates:
        try:
            obj = load(c)
        except ConfigError:
            continue
        if obj.name == name:
            return obj
    return None


def _find_chip(meta: StudyMeta, study):
    """The template chip by its name: a baseline of that name, else a shipped chip."""
    return _find_by_name(meta.base, list(study.user_attrs.get("baselines") or {}), arch_dirs(), load_chip)


def _find_model(name: str, sources: dict | None = None):
    """A workload by its model name: the source the study recorded for it, else a shipped one."""
    hints = [sources[name]] if sources and name in sources else []
    return _find_by_name(name, hints, workload_dirs(), load_model)


def layer_schedules(study, meta: StudyMeta, row: pd.Series, cfg: SweepConfig | None = None) -> tuple[list, list]:
    """For a design (a row of trials.csv) and each workload, the forward and backward schedules of
    one layer under the plan chosen for it, on the chip rebuilt from the trial's ``chip``
    attribute: ``([(workload, plan label, chip name, forward, backward)], [notes])``."""
    trial = study.trials[int(row["trial"])] if int(row["trial"]) < len(study.trials) else None
    if trial is None or trial.number != int(row["trial"]):
        trial = next(t for t in study.get_trials(deepcopy=False) if t.number == int(row["trial"]))
    base = cfg.base if cfg is not None else _find_chip(meta, study)
    if base is None:
        return [], [f"no layer schedule: the template chip {meta.base!r} is not a shipped chip"]
    chip = build_chip(base, trial.user_attrs["chip"], meta.process_node_nm if cfg is None else cfg.process_node_nm,
                      meta.link_latency_s if cfg is None else cfg.link_latency_s, name=f"trial {trial.number}")
    eff = calibrated_efficiency(chip)
    models = {w.model.name: w.model for w in cfg.workloads} if cfg is not None else {}
    sources = (study.user_attrs.get("config") or {}).get("workload_sources")
    out, notes = [], []
    for o in trial.user_attrs.get("workloads") or []:
        if not o.get("feasible", True) or not o.get("plan"):
            continue
        name = o["workload"]
        model = models.get(name)
        if model is None:
            model = _find_model(name, dict(zip(meta.workloads, sources, strict=False)) if sources else None)
            if model is not None and o.get("step_time_s") and o.get("global_batch"):
                seq = round(o["tokens_per_s"] * o["step_time_s"] / o["global_batch"])   # tokens per sequence
                if seq > 0 and seq != model.seq_len:
                    model = with_seq_len(model, seq)
        if model is None:
            notes.append(f"no layer schedule for {name}: not a shipped workload")
            continue
        plan = parse_plan(o["plan"], "plan")
        recompute = plan.stage_recompute[0] if plan.stage_recompute else plan.recompute
        # a block stage: most of its layers re-run nothing
        recompute = "none" if recompute == "block" else graph_recompute(recompute, plan.recompute_modules, plan.offload)
        if model.hybrid and model.layer_kind is None:   # a hybrid's most common kind of layer
            kind = max(model.hybrid_counts, key=model.hybrid_counts.get)
            notes.append(f"{name}: the layer schedule shown is its {kind!r} layers' ({model.hybrid_counts[kind]} "
                         f"of {model.layers})")
            model = replace(model, hybrid_pattern=kind * model.layers)
        fwd, bwd = schedule_layer(model, chip, plan.mbs, plan.tp, bool(plan.sp), plan.attention, recompute, eff)
        out.append((name, o["plan"], chip.name, fwd, bwd))
    return out, notes


# --- the report -------------------------------------------------------------------------------------
def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def _gib(x) -> str:
    return _fmt(x, ".1f") + " GiB"


def _chip_text(r: pd.Series, keys) -> str:
    return ", ".join(f"{k}={_fmt(r.get(f'chip:{k}'))}" for k in keys)


def best_designs_table(best: pd.DataFrame, meta: StudyMeta) -> tuple[list[str], list[list[str]]]:
    """The best-designs table as ``(header, rows)`` of strings (report.md and report.html)."""
    head = ["trial"] + list(meta.searched or meta.keys) + ["area mm²", "power W", "clock GHz", "cost $",
                                                          "tokens/s (geomean)"] + \
        [f"{w} tokens/s" for w in meta.workloads] + [f"{w} plan" for w in meta.workloads]
    rows = []
    for _, r in best.iterrows():
        clock = r.get("clock_hz")
        clock = "–" if clock is None or pd.isna(clock) else f"{clock / 1e9:.2f}" + (
            f" (throttled: {r['throttled']})" if r.get("throttled") else "")
        rows.append([str(r["trial"])] + [_fmt(r.get(f"chip:{k}")) for k in (meta.searched or meta.keys)] +
                    [_fmt(r["area_mm2"], ".0f"), _fmt(r["power_w"], ".0f"), clock, _fmt(r["cost_usd"], ",.0f"),
                     _fmt(r["throughput_tokens_per_s"], ",.0f")] +
                    [_fmt(r.get(f"{w}:tokens_per_s"), ",.0f") for w in meta.workloads] +
                    [str(r.get(f"{w}:plan") or "–") for w in meta.workloads])
    return head, rows


def gains_table(best: pd.DataFrame, baselines: pd.DataFrame, meta: StudyMeta):
    head = ["trial", "baseline", "baseline meets the budgets"] + list(meta.workloads) + ["overall"]
    rows = []
    for _, r in best.iterrows():
        for name, per in gains(r, baselines, list(meta.workloads)).items():
            b = baselines[baselines["baseline"] == name].iloc[0]
            rows.append([str(r["trial"]), str(b["chip_name"]), "yes" if b["feasible"] else "no"] +
                        ["no plan" if per[w] is None else f"{100 * per[w]:+.1f} %" for w in list(meta.workloads)
                         + ["overall"]])
    return head, rows


def baselines_table(baselines: pd.DataFrame):
    head = ["baseline", "area mm²", "power W", "cost $", "tokens/s (geomean)", "meets the budgets"]
    rows = [[str(b["chip_name"]), _fmt(b["area_mm2"], ".0f"), _fmt(b["power_w"], ".0f"), _fmt(b["cost_usd"], ",.0f"),
             _fmt(b["throughput_tokens_per_s"], ",.0f"),
             "yes" if b["feasible"] else "no: " + str(b["reason"])] for _, b in baselines.iterrows()]
    return head, rows


def breakdown_table(row: pd.Series, baselines: pd.DataFrame, meta: StudyMeta):
    """Where each workload's step time goes on the design and on each baseline, and its memory."""
    head = ["workload", "chip", "plan", "step s"] + [BREAKDOWN_LABELS[k] for k in BREAKDOWN] + \
        ["memory per device", "HBM"]
    rows = []
    chips = [(f"trial {row['trial']}", row, row.get("chip:hbm_gib"))] + \
            [(str(b["chip_name"]), b, b.get("chip:hbm_gib")) for _, b in baselines.iterrows()]
    for w in meta.workloads:
        for label, r, hbm in chips:
            step = r.get(f"{w}:step_time_s")
            if step is None or not isinstance(step, (int, float)) or not math.isfinite(step):
                rows.append([w, label, "no plan fits"] + ["–"] * (len(head) - 3))
                continue
            rows.append([w, label, str(r.get(f"{w}:plan")), _fmt(step, ".4g")] +
                        [f"{_fmt(r.get(f'{w}:{k}'), '.3g')} ({100 * (r.get(f'{w}:{k}') or 0) / step:.0f} %)"
                         for k in BREAKDOWN] + [_gib(r.get(f"{w}:memory_per_device_gib")), _gib(hbm)])
    return head, rows


def plans_table(front: pd.DataFrame, meta: StudyMeta):
    head = ["trial", "area mm²", "power W", "cost $", "tokens/s (geomean)"] + [f"{w} plan" for w in meta.workloads]
    rows = [[str(r["trial"]), _fmt(r["area_mm2"], ".0f"), _fmt(r["power_w"], ".0f"), _fmt(r["cost_usd"], ",.0f"),
             _fmt(r["throughput_tokens_per_s"], ",.0f")] + [str(r.get(f"{w}:plan")) for w in meta.workloads]
            for _, r in front.iterrows()]
    return head, rows


def answer(best: pd.DataFrame, baselines: pd.DataFrame, meta: StudyMeta, trials: pd.DataFrame) -> str:
    """One paragraph: the best design and its gain over each baseline, or why there is none."""
    if not len(best):
        done = trials[trials["state"] == "COMPLETE"] if len(trials) else trials
        kinds = infeasible_counts(trials)
        why = ", ".join(f"{k} ({n})" for k, n in kinds.items()) or "no complete trial"
        done = done[done["evaluated"].astype(bool)] if len(done) else done
        return (f"**No feasible design**: all {len(done)} designs evaluated break a budget or fit no plan "
                f"({why}).")
    r = best.iloc[0]
    text = (f"**Best design: trial {r['trial']}** ({_chip_text(r, meta.searched or meta.keys)}): "
            f"{_fmt(r['throughput_tokens_per_s'], ',.0f')} tokens/s (weighted geometric mean) in "
            f"{_fmt(r['area_mm2'], '.0f')} mm², {_fmt(r['power_w'], '.0f')} W, ${_fmt(r['cost_usd'], ',.0f')}")
    per = gains(r, baselines, list(meta.workloads))
    parts = []
    for name, g in per.items():
        b = baselines[baselines["baseline"] == name].iloc[0]
        gain = "no plan" if g["overall"] is None else f"{100 * g['overall']:+.1f} %"
        parts.append(f"{gain} over {b['chip_name']}" + ("" if b["feasible"] else " (which breaks the budgets)"))
    return text + (": " + ", ".join(parts) if parts else "") + "."


def markdown(study, cfg: SweepConfig | StudyMeta | None, trials: pd.DataFrame, baselines: pd.DataFrame,
             figures: dict | None = None, notes: dict | None = None) -> str:
    """The readable report: the answer first (best designs and their gain over the baselines),
    then the front, where the best design's time goes, how the plans change along the front,
    infeasible trials by reason, and the study's bookkeeping. ``figures``: name -> PNG file name
    (beside report.md); ``notes``: name -> a sentence shown instead of a figure not drawn."""
    meta = study_meta(study, cfg)
    figures, notes = figures or {}, notes or {}

    def figure(name: str, alt: str) -> list[str]:
        if name in figures:
            return [f"![{alt}]({figures[name]})", ""]
        return [f"_{notes[name]}_", ""] if name in notes else []

    lines = [f"# phaze search: {study.study_name}", ""]
    complete = trials[trials["state"] == "COMPLETE"] if len(trials) else trials
    best = best_designs(trials, meta) if len(trials) else trials
    lines += [answer(best, baselines, meta, trials), ""]
    lines.append(f"{evaluated_phrase(trials)} of a space of "
                 f"{meta.grid_size:,}; template {meta.base}; objectives: "
                 + ", ".join(f"{o} ({d})" for o, d in zip(meta.objectives, meta.directions, strict=False))
                 + "; budgets: " + (", ".join(f"{k} {v:g}" for k, v in meta.constraints) or "none") + ".")
    lines.append("Workloads: " + ", ".join(meta.descriptions) + ".")
    lines.append("")
    cert = study.user_attrs.get("certificate")
    if cert:
        c = Certificate(**{k: (tuple(v) if k == "objectives" else v) for k, v in cert.items()})
        lines += ["## Certificate of the exact search", ""]
        lines += [f"- {x}" for x in c.lines()] + [""]
        lines += ["Every design not evaluated is listed in `certificate.csv` with the level that pruned it, its "
                  "optimistic throughput bound and the evaluated trial that bounds it.", ""]
    lines += ["## Best designs", ""]
    if not len(best):
        lines += ["No feasible design" + (": every design evaluated is infeasible (reasons below)."
                                          if len(complete) else " yet."), ""]
    else:
        lines += _table(*best_designs_table(best, meta)) + [""]
    if len(baselines):
        lines += ["## Baselines, scored by the same model", ""]
        lines += _table(*baselines_table(baselines)) + [""]
        if len(best):
            lines += ["Gain in throughput of each best design over each baseline (per workload; overall = "
                      "weighted geometric mean), at the study's budgets:", ""]
            lines += _table(*gains_table(best, baselines, meta)) + [""]
    lines += ["## The front: throughput against area, power and cost", ""]
    lines += figure("front", "throughput against area, power and cost")
    lines += ["## Best so far", ""] + figure("history", "best so far against trial number")
    lines += ["## Parameter importances", ""] + figure("importance", "parameter importances")
    if "importance" in figures and notes.get("importance_caption"):
        lines += [f"_{notes['importance_caption']}_", ""]
    if len(best):
        r = best.iloc[0]
        lines += [f"## Where the step time goes (trial {r['trial']})", ""]
        lines += figure("breakdown", "step time breakdown per workload")
        lines += _table(*breakdown_table(r, baselines, meta)) + [""]
        for name in sorted(k for k in figures if k.startswith("gantt")):
            lines += figure(name, f"layer schedule ({name})")
        lines += [f"_{n}_" for n in notes.get("gantt_notes", [])]
        front = plan_front(trials, meta)
        lines += ["## Plans along the front", "",
                  ("The study's Pareto set" if len(meta.objectives) > 1 else
                   "The designs no other beats in both throughput and area") + ", smallest first:", ""]
        lines += figure("plans", "plans along the front")
        lines += _table(*plans_table(front, meta)) + [""]
    if len(complete):
        kinds = infeasible_counts(trials, study)
        lines += ["## Infeasible designs by reason", ""]
        lines += [f"- {k}: {n}" for k, n in kinds.items()] or ["- none"]
        lines += [""] + figure("infeasible", "infeasible designs by reason")
        skipped = study.user_attrs.get("sweep_skipped") or {}
        if skipped:
            lines += [f"(not evaluated by the sweep: {', '.join(f'{k} {n}' for k, n in skipped.items())})", ""]
        statuses = complete["schedule_status"].fillna("").value_counts().to_dict()
        lines += ["## Schedules", "",
                  "Layer schedules of the chosen plans: " + ", ".join(f"{k or 'not evaluated'} {n}"
                                                                     for k, n in statuses.items())
                  + f"; largest gap {100 * float(complete['schedule_gap'].fillna(0).max()):.3f} %.", ""]
    pruned = int((trials["state"] == "PRUNED").sum()) if len(trials) else 0
    lines += ["## Study", "",
              f"{sampler_phrase(meta)}; {len(trials)} trials in the storage: "
              f"{len(complete)} complete, {pruned} pruned unevaluated, "
              f"{int((trials['state'] == 'FAIL').sum()) if len(trials) else 0} failed. "
              f"Browse it with `optuna-dashboard {storage_hint(study)}`.", ""]
    return "\n".join(lines)


def evaluated_phrase(trials: pd.DataFrame) -> str:
    """``N designs evaluated (F feasible; K more proposed over a budget and not evaluated)``:
    only designs that were evaluated count as evaluated."""
    complete = trials[trials["state"] == "COMPLETE"] if len(trials) else trials
    evaluated = int(complete["evaluated"].astype(bool).sum()) if len(complete) else 0
    over = len(complete) - evaluated
    return (f"{evaluated} designs evaluated ({len(feasible_trials(trials))} feasible"
            + (f"; {over} more proposed over a budget and not evaluated" if over else "") + ")")


def sampler_phrase(meta) -> str:
    """How the study chose its designs, for the report's bookkeeping."""
    if meta.sampler == "sweep":
        return "Every design of the grid within the budgets (`phaze sweep`), largest area first"
    if meta.sampler == "exact":
        return "Exact search: designs in order of their optimistic bound (the certificate above)"
    return f"Sampler {meta.sampler}, seed {meta.seed}"


def storage_hint(study) -> str:
    """The study's storage as a URL to browse it with: a SQLite file relative to the working
    folder (or its name alone when outside it: no machine paths in files), a server URL without
    its password."""
    backend = getattr(study._storage, "_backend", study._storage)
    engine = getattr(backend, "engine", None)
    if engine is None:
        return "<the study's storage URL>"
    url = engine.url.render_as_string(hide_password=True)
    for prefix in ("sqlite:///", "sqlite+pysqlite:///"):
        if url.startswith(prefix):
            path = Path(url[len(prefix):])
            try:
                path = path.resolve().relative_to(Path.cwd().resolve())
            except (ValueError, OSError):
                path = Path(path.name)
            return f"sqlite:///{path.as_posix()}"
    return url
