"""Benchmark: cold evaluation of new candidate chips (issue 9).

20 random chips (seeded) from a TPUv4-based space: tensor units 2..128 (powers of two), square
arrays of 32..256, 1..8 vector units, 32/64/128 MiB shared buffer, 32 GiB HBM. For each chip,
cold: a fresh ``PHAZE_CACHE_DIR`` and every chip-dependent in-memory cache cleared (workload-only
caches, the operator graphs, stay: a search visits many chips for the same workloads), one core,
``phaze place`` of GPT-3 175B on 1024 chips at global batch 4096, the placement space a sweep
config's workload searches by default (PlacementOptions with the sweep's micro-batches 1, 2, 4, 8).
Then the trials per minute of a five-workload candidate (``phaze.candidate.evaluate_chip``):
BERT-large (512), GPT-2 XL, OPT-350M, Llama-2 7B, GPT-3 175B, each on 1024 chips at 4096.

Run: python tests/bench/bench_candidate.py [--chips 20] [--candidates 5] [--exhaustive]
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

from phaze import schedule as S  # noqa: E402
from phaze.api import calibrated_efficiency  # noqa: E402
from phaze.arch import load_chip  # noqa: E402
from phaze.catalogue import load_model
from phaze.placement import PlacementOptions, place  # noqa: E402
from phaze.space import SWEEP_MICRO_BATCHES, build_chip  # noqa: E402
from phaze.workload import with_seq_len

DEVICES, BATCH = 1024, 4096


def random_chips(n: int, seed: int = 9):
    rng = random.Random(seed)
    base = load_chip("tpuv4")
    out = []
    for _ in range(n):
        side = rng.choice([32, 64, 128, 256])
        values = {"tensor_units": 2 ** rng.randint(1, 7), "tensor_rows": side, "tensor_cols": side,
                  "vector_units": rng.choice([1, 2, 4, 8]), "shared_buffer_mib": rng.choice([32, 64, 128]),
                  "hbm_gib": 32}
        out.append((values, build_chip(base, values)))
    return out


def clear_chip_caches() -> None:
    """Every in-memory cache a new chip could hit (a new chip hits none of them anyway)."""
    import phaze.cost as cost
    import phaze.placement as placement
    import phaze.step as step
    if hasattr(step, "clear_caches"):
        step.clear_caches()
        return
    S.clear_memory_cache()
    for mod in (step, cost, placement):
        for name in dir(mod):
            f = getattr(mod, name)
            if callable(getattr(f, "cache_clear", None)) and name not in ("layer_graph", "edge_graph"):
                f.cache_clear()


def cold(fn):
    """Seconds ``fn`` takes with an empty disk cache (a fresh folder, removed after) and no
    in-memory chip caches, and what it returned."""
    with tempfile.TemporaryDirectory(prefix="phaze-bench-cand-") as cache:
        os.environ["PHAZE_CACHE_DIR"] = cache
        clear_chip_caches()
        t = time.perf_counter()
        out = fn()
        return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chips", type=int, default=20)
    ap.add_argument("--candidates", type=int, default=5, help="chips for the five-workload figure")
    ap.add_argument("--exhaustive", action="store_true", help="solve every layout (no bounding)")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    options = PlacementOptions(mbs=SWEEP_MICRO_BATCHES)
    if args.exhaustive:
        options = PlacementOptions(mbs=SWEEP_MICRO_BATCHES, exhaustive=True)
    gpt3 = load_model("gpt3-175b")
    chips = random_chips(args.chips)
    # warm the workload-only caches (graphs) and imports once, as a search process would
    place(gpt3, load_chip("tpuv4"), DEVICES, BATCH, options, calibrated_efficiency(load_chip("tpuv4")), top=1)

    print(f"{'chip':<28} {'time s':>7} {'layouts':>7} {'solved':>6} {'step s':>8}  best plan")
    times = []
    for values, chip in chips:
        eff = calibrated_efficiency(chip)
        dt, res = cold(lambda c=chip, e=eff: place(gpt3, c, DEVICES, BATCH, options, e, top=1))
        times.append(dt)
        label = (f"{values['tensor_units']}x{values['tensor_rows']}^2 v{values['vector_units']} "
                 f"sb{values['shared_buffer_mib']}")
        best = res.best
        step = best.result.step_time_s if best else float("nan")
        what = best.plan.label()[:90] if best else res.infeasible_reason[:60]
        print(f"{label:<28} {dt:7.2f} {res.layouts_considered:7d} {getattr(res, 'layouts_solved', 0):6d} "
              f"{step:8.3f}  {what}", flush=True)
    print(f"GPT-3 175B, {len(times)} cold chips: median {statistics.median(times):.2f} s, "
          f"worst {max(times):.2f} s, mean {statistics.mean(times):.2f} s")

    if args.candidates:
        from phaze.candidate import evaluate_chip
        from phaze.space import WorkloadSpec
        models = [with_seq_len(load_model("bert-large"), 512), load_model("gpt2-xl"), load_model("opt-350m"),
                  load_model("llama2-7b"), gpt3]
        specs = tuple(WorkloadSpec(m, DEVICES, BATCH, options=options) for m in models)
        per = []
        for values, chip in chips[:args.candidates]:
            dt, ev = cold(lambda c=chip: evaluate_chip(c, specs))
            per.append(dt)
            print(f"  five-workload candidate {values}: {dt:.2f} s, "
                  f"{sum(o.feasible for o in ev.outcomes)}/5 feasible, "
                  f"statuses {[o.schedule_status for o in ev.outcomes]}", flush=True)
        mean = statistics.mean(per)
        print(f"five-workload candidate: mean {mean:.2f} s, worst {max(per):.2f} s "
              f"-> {60 / mean:.1f} trials per minute (one core)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
