"""Benchmark: 1,000 random bad command lines (tests/test_fuzz.py's generator), in-process.

Counts the endings: a normal answer (status 0), one error line with status 2, or a bad ending
(a traceback, a hang over 10 s, another status, several stderr lines), which it lists.
Run: python tests/bench/bench_fuzz.py [--cases 1000] [--seed 0]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from test_fuzz import files, make_case, run_case  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import random
    root = Path(tempfile.mkdtemp(prefix="phaze-fuzz-"))
    os.environ["PHAZE_CACHE_DIR"] = str(root / "cache")
    os.chdir(root)
    rng = random.Random(args.seed)
    bad = files(root / "files")
    endings, times, failures = Counter(), [], []
    start = time.perf_counter()
    for _ in range(args.cases):
        argv = make_case(rng, root, bad)
        verdict, _, text, dt = run_case(argv)
        times.append(dt)
        endings["ok" if verdict == "ok" else "one-line error" if verdict == "error" else "BAD"] += 1
        if verdict not in ("ok", "error"):
            failures.append((argv, verdict, text[-300:]))
    total = time.perf_counter() - start
    counts = ", ".join(f"{k} {v}" for k, v in endings.items())
    print(f"{args.cases} cases (seed {args.seed}) in {total:.0f} s: {counts}"
          f"; {len(failures)} bad endings; slowest case {max(times):.2f} s, median {statistics.median(times):.3f} s")
    for argv, verdict, text in failures:
        print(f"BAD {verdict}: {argv!r}\n    {text}")


if __name__ == "__main__":
    main()
