"""Benchmark: trials per minute of `phaze search` on search/phaze-paper.yaml.

Cold: a new process, an empty schedule cache (a fresh PHAZE_CACHE_DIR). Warm: a second study with
the same seed (so the same designs) in a new process that finds the first run's schedules on
disk. One worker process each; the baselines are scored before the clock starts.
Run: python tests/bench/bench_search_speed.py [TRIALS]
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = """
import sys, time
from dataclasses import replace
from phaze.space import load_sweep
from phaze.search import search
cfg = replace(load_sweep(sys.argv[1]), trials=int(sys.argv[2]), baselines=())
t = time.perf_counter()
res = search(cfg, storage=sys.argv[3], study_name=sys.argv[4], progress=False, write=False)
import optuna
study = optuna.load_study(study_name=sys.argv[4], storage=sys.argv[3])
evaluated = sum(bool(tr.user_attrs.get("evaluated")) for tr in study.trials if tr.state.name == "COMPLETE")
print(res.complete, evaluated, time.perf_counter() - t)
"""


def run(trials: int, storage: str, study: str, env: dict) -> tuple[int, int, float]:
    out = subprocess.run([sys.executable, "-c", CODE, str(ROOT / "search" / "phaze-paper.yaml"), str(trials),
                          storage, study], env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    done, evaluated, seconds = out.stdout.split()
    return int(done), int(evaluated), float(seconds)


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PHAZE_CACHE_DIR=str(Path(tmp) / "cache"))
        storage = f"sqlite:///{tmp}/speed.db"
        for label, study in (("cold", "cold"), ("warm", "warm")):
            done, evaluated, seconds = run(trials, storage, study, env)
            print(f"{label}: {done} trials ({evaluated} inside the area band, scored on the five workloads) "
                  f"in {seconds:.1f} s = {60 * done / seconds:.1f} trials per minute, "
                  f"{seconds / max(1, evaluated):.2f} s per evaluated design")


if __name__ == "__main__":
    main()
