"""A study's files: ``trials.csv``, ``pareto.csv``, ``baselines.csv``, ``report.md``, and
``report.html`` with its figures (or two studies compared on one front), rebuilt from the storage.
The tables and text come from :mod:`phaze.report`, the figures from :mod:`phaze.plots`.
"""
from __future__ import annotations

from pathlib import Path

from .plots import write_compare, write_figures, write_html
from .report import _atomic_write, baselines_frame, markdown, pareto_frame, study_meta, trials_frame
from .space import SweepConfig


def write_study_files(study, cfg: SweepConfig | None = None, out_dir: Path | None = None,
                      figures: bool = True) -> dict[str, Path]:
    """Write ``trials.csv``, ``pareto.csv``, ``baselines.csv``, ``report.md`` and, with
    ``figures``, ``report.html`` and every figure (PNG and SVG) into ``out_dir`` (default: the
    study's folder). ``cfg`` is optional: without it the study's own attributes say what it is."""
    meta = study_meta(study, cfg)
    out_dir = Path(out_dir) if out_dir is not None else Path("results") / study.study_name
    out_dir.mkdir(parents=True, exist_ok=True)
    trials = trials_frame(study, meta.objectives)
    front = pareto_frame(trials, meta.objectives, meta.directions) if len(trials) else trials
    base = baselines_frame(study, meta.objectives)
    files = {"trials": out_dir / "trials.csv", "pareto": out_dir / "pareto.csv",
             "baselines": out_dir / "baselines.csv", "report": out_dir / "report.md"}
    _atomic_write(files["trials"], trials.to_csv(index=False, float_format="%.9g"))
    _atomic_write(files["pareto"], front.to_csv(index=False, float_format="%.9g"))
    _atomic_write(files["baselines"], base.to_csv(index=False, float_format="%.9g"))
    figs, notes = {}, {}
    if figures and len(trials):
        drawn, notes = write_figures(study, meta, trials, base, out_dir, cfg)
        figs = {k: v["png"].name for k, v in drawn.items()}
        for k, v in drawn.items():
            files[f"{k}.png"], files[f"{k}.svg"] = v["png"], v["svg"]
        files["html"] = write_html(study, meta, trials, base, out_dir, drawn, notes)
    _atomic_write(files["report"], markdown(study, meta, trials, base, figs, notes))
    return files


def compare_studies(studies: list, out_dir: Path) -> dict[str, Path]:
    """Two (or more) studies on one front: ``compare.md``, ``compare.html`` and the figures
    ``compare-front`` and ``compare-history`` (PNG and SVG) in ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = []
    for study in studies:
        meta = study_meta(study)
        trials = trials_frame(study, meta.objectives)
        data.append((study, meta, trials, baselines_frame(study, meta.objectives)))
    return write_compare(data, out_dir)
