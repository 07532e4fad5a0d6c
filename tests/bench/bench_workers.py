"""Benchmark: trials per minute with 1, 2 and 4 worker processes on one study.

For each config (search/quickstart.yaml, search/phaze-paper.yaml) and each worker count J, a new
study (PostgreSQL in a throwaway cluster when the server binaries are there, else SQLite) is run
with `phaze search --jobs J --trials T` and an empty schedule cache; the rate is T over the time
from the first trial's start to the last trial's end, read from the storage (process start-up,
baselines and the report are left out). The samplers' proposals differ with J (one seed per
worker), so each J evaluates different designs of the same space.
Run: python tests/bench/bench_workers.py [TRIALS]
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))
from postgres import cluster, find_bin  # noqa: E402


def rate(config: str, jobs: int, trials: int, storage: str, tmp: Path) -> float:
    cfg = yaml.safe_load((ROOT / "search" / f"{config}.yaml").read_text())
    cfg["baselines"] = []
    path = tmp / f"{config}-{jobs}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    study = f"{config}-{jobs}"
    env = dict(os.environ, PHAZE_CACHE_DIR=str(tmp / f"cache-{study}"))
    subprocess.run([sys.executable, "-m", "phaze.cli", "search", str(path), "--storage", storage, "--study", study,
                    "--jobs", str(jobs), "--trials", str(trials), "--quiet"], cwd=tmp, env=env, check=True,
                   capture_output=True)
    from phaze.search import postgres_driver_url
    done = [t for t in optuna.load_study(study_name=study, storage=postgres_driver_url(storage)).trials
            if t.state.name == "COMPLETE"]
    span = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds()
    return 60.0 * len(done) / span


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if find_bin("initdb"):
            ctx = cluster()
            url, _ = ctx.__enter__()
        else:
            ctx, url = None, f"sqlite:///{tmp / 'bench.db'}"
        try:
            print(f"storage: {'PostgreSQL' if ctx else 'SQLite'}; {trials} trials per run; {os.cpu_count()} cores")
            print("| config | 1 worker | 2 workers | 4 workers |")
            print("|---|---|---|---|")
            for config in ("quickstart", "phaze-paper"):
                rates = [rate(config, j, trials, url, tmp) for j in (1, 2, 4)]
                cells = [f"{r:.1f} /min ({r / rates[0]:.2f}x)" for r in rates]
                print(f"| {config} | " + " | ".join(cells) + " |", flush=True)
        finally:
            if ctx:
                ctx.__exit__(None, None, None)


if __name__ == "__main__":
    main()
