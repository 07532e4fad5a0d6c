"""Benchmark: `phaze place` for GPT-3 175B on 1024 chips, global batch 1536.

Searches tp in {1,2,4,8}, mbs in {1,2,4,8}, every pipeline depth, the three recompute modes per
stage. The first run fills the layer-time caches; the second is the figure the issue asks for.
Run: python tests/bench/bench_place.py
"""
import time

from phaze.api import calibrated_efficiency
from phaze.arch import load_chip
from phaze.catalogue import load_model
from phaze.placement import PlacementOptions, place
from phaze.plan import parse_plan
from phaze.step import evaluate


def main() -> None:
    model = load_model("gpt3-175b")
    for name in ("tpuv4", "a100-80gb"):
        chip = load_chip(name)
        eff = calibrated_efficiency(chip)
        t = time.perf_counter()
        place(model, chip, 1024, 1536, PlacementOptions(), eff)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        res = place(model, chip, 1024, 1536, PlacementOptions(), eff)
        warm = time.perf_counter() - t
        print(f"{name}: {res.layouts_considered} layouts ({res.layouts_feasible} fit); "
              f"cold {cold:.2f} s, warm (layer times cached) {warm:.2f} s")
        for k, p in enumerate(res.top[:3], 1):
            r = p.result
            print(f"  {k}. {r.step_time_s:7.3f} s  {r.tokens_per_s:10,.0f} tok/s  MFU {100 * r.mfu:4.1f} %  "
                  f"{r.memory_per_device_bytes / 2 ** 30:5.1f} GiB  {p.plan.label()}")
        hand = parse_plan("tp=8,pp=16,mbs=1,recompute=full")
        h = evaluate(model, chip, 1024, 1536, hand, eff)
        gain = h.step_time_s / res.best.result.step_time_s - 1
        print(f"  vs Megatron's hand-picked {hand.label()}: {h.step_time_s:.3f} s"
              f"{'' if h.fits else ' (does not fit)'}; best is {100 * gain:+.1f} % throughput")


if __name__ == "__main__":
    main()
