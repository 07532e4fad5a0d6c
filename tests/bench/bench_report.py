"""Benchmark: seconds of ``phaze report`` on a 50-trial study, and where they go.

Builds each study once (the search is not timed), then times ``phaze report`` in a new process,
as a user runs it: cold (an empty schedule cache, so every Gantt chart's layer schedules are
solved again) and warm (the schedules on disk), best of ``REPEATS``. Wall and CPU seconds are
printed (CPU seconds do not move when other processes share the cores). With ``--profile`` the
cold run's top functions by cumulative time (cProfile) follow.
Studies: the quick start (one workload) and the phaze-paper setting (five workloads on 1024 chips:
five Gantt charts and a five-row breakdown). Target: under 5 s for both.
Run: python tests/bench/bench_report.py [TRIALS] [--profile]
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPEATS = 3
BUILD = """
import sys
from dataclasses import replace
from phaze.space import load_sweep
from phaze.search import search
cfg = replace(load_sweep(sys.argv[1]), trials=int(sys.argv[2]))
search(cfg, storage=sys.argv[3], study_name=sys.argv[4], progress=False, write=False)
"""


def timed(args: list[str], env: dict, cwd: str) -> tuple[float, float]:
    """(wall, CPU) seconds of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(args, env=env, cwd=cwd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    trials = int(next((a for a in sys.argv[1:] if a.isdigit()), 50))
    profile = "--profile" in sys.argv
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        for sweep in ("quickstart", "phaze-paper"):
            db = Path(tmp) / f"{sweep}.db"
            build_env = dict(env, PHAZE_CACHE_DIR=str(Path(tmp) / "build-cache"))
            subprocess.run([sys.executable, "-c", BUILD, str(ROOT / "search" / f"{sweep}.yaml"), str(trials),
                            f"sqlite:///{db}", sweep], env=build_env, cwd=tmp, check=True)
            report = [sys.executable, "-m", "phaze.cli", "report", "--storage", f"sqlite:///{db}", "--study", sweep,
                      "--out", str(Path(tmp) / f"{sweep}-report")]
            rows = {}
            for label, cache in (("cold", None), ("warm", str(Path(tmp) / "warm-cache"))):
                runs = []
                for i in range(REPEATS):
                    c = cache or str(Path(tmp) / f"cold-{sweep}-{i}")     # a new, empty cache each cold run
                    runs.append(timed(report, dict(env, PHAZE_CACHE_DIR=c), tmp))
                rows[label] = min(runs)
            print(f"{sweep}, {trials} trials: phaze report cold {rows['cold'][0]:.2f} s wall "
                  f"({rows['cold'][1]:.2f} s CPU), warm {rows['warm'][0]:.2f} s wall ({rows['warm'][1]:.2f} s CPU)")
            if profile:
                out = subprocess.run([sys.executable, "-m", "cProfile", "-s", "cumtime", "-m", "phaze.cli"]
                                     + report[3:], env=dict(env, PHAZE_CACHE_DIR=str(Path(tmp) / "prof-cache")),
                                     cwd=tmp, check=True, capture_output=True, text=True).stdout
                print("\n".join(out.splitlines()[:45]))


if __name__ == "__main__":
    main()
