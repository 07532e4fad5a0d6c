"""A disk store of fitted parameter sets. ``phaze calibrate`` and ``phaze validate`` keep each fit
as it finishes, so an interrupted run resumes where it stopped and a fit already made is not run
again (a full ``phaze validate`` runs dozens of them).

A fit is keyed by everything it depends on: the cases it is fitted on (each as phaze expressed
its row: model, chip, plan, measured step), their weights, the fitted names with their bounds and
priors, phaze's code and the versions of numpy and scipy. A record that does not match its key,
or is damaged, is fitted again and overwritten. Records live in the ``fits`` folder of the
schedule cache (:func:`phaze.schedule.cache_dir`: ``$PHAZE_CACHE_DIR``, default
``~/.cache/phaze/schedules``); ``PHAZE_CACHE_DIR=off`` turns both off.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, fields
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from .calibrate import BOUNDS, PRIOR_WEIGHT
from .cost import Efficiency
from .schedule import cache_dir, prune_disk_cache, write_record

FORMAT = 1
MAX_FILES = 2000     # about 1 KB each; a full ``phaze validate`` writes about 45
_counts = {"reused": 0, "fitted": 0}


@lru_cache(maxsize=1)
def code_version() -> str:
    """A hash of every module of the package: a fit made by other code is never served."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def fits_dir() -> Path | None:
    """Where fits are kept (None: the cache is off)."""
    d = cache_dir()
    return None if d is None else d / "fits"


def fit_key(cases, weights, names) -> str:
    """The key of a fit of ``names`` on ``cases`` weighted by ``weights``."""
    spec = {"format": FORMAT, "code": code_version(), "numpy": _version("numpy"), "scipy": _version("scipy"),
            "names": list(names), "bounds": {n: list(BOUNDS[n]) for n in names}, "prior_weight": PRIOR_WEIGHT,
            "cases": [repr(c) for c in cases], "weights": [float(w).hex() for w in weights]}
    return hashlib.sha256(json.dumps(spec, separators=(",", ":")).encode()).hexdigest()[:40]


def load(key: str) -> Efficiency | None:
    """The fit stored under ``key``, or None (none, damaged or another key's)."""
    d = fits_dir()
    if d is None:
        return None
    try:
        rec = json.loads((d / f"{key}.json").read_text())
        values = rec["parameters"]
        if rec.get("key") != key or set(values) != {f.name for f in fields(Efficiency)}:
            return None
        if not all(isinstance(x, float) and math.isfinite(x) for x in values.values()):
            return None
        eff = Efficiency(**values)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    _counts["reused"] += 1
    return eff


def save(key: str, eff: Efficiency, report: dict) -> None:
    """Keep ``eff`` under ``key`` (best effort: a read-only or full disk only loses the reuse)."""
    d = fits_dir()
    if d is None:
        return
    rec = {"key": key, "parameters": {k: float(x) for k, x in asdict(eff).items()},
           "rows": report.get("rows"), "evaluations": report.get("evaluations")}
    try:
        prune_disk_cache(d, MAX_FILES)
        write_record(d, key, rec)
    except OSError:
        pass


def note_fitted() -> None:
    """Count one fit run (where it ran: the caller's process counts its workers' fits)."""
    _counts["fitted"] += 1


def counts() -> dict[str, int]:
    """Fits reused from the store and fits run, since the process started."""
    return dict(_counts)
