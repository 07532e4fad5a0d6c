"""Benchmark: what the block stages' longer counts change (placement exactness, 2026-12-03).

The placement DP gives a block stage the fewest layers re-run whole that fit, and more (also from
none where the stage fits without recompute) where a longer backward hides enough more of an
exposed gradient reduction to pay (``phaze.placement._longer_blocks``). On random placements
(GPT-3 175B, GPT-2 XL, Llama-2 7B on A100, H100 and TPU v4 with 25-100 % of their memory, 16-512
devices, one to four micro-batches per replica, recompute none / full / block), every layout
solved exactly, this prints how many layouts' optimum improves over the fewest counts alone, and
by how much; never worse.

Run: python tests/bench/bench_block_counts.py [--cases 3000] [--seed 0]   (about 4 min)
"""
from __future__ import annotations

import argparse
import random
from dataclasses import replace
from unittest import mock

from phaze import placement
from phaze.api import calibrated_efficiency
from phaze.arch import load_chip
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.placement import PlacementOptions, place


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    layouts = better = worse = cases = 0
    gains = []
    while cases < args.cases:
        model = load_model(rng.choice(["gpt3-175b", "gpt2-xl", "llama2-7b"]))
        chip = load_chip(rng.choice(["a100-80gb", "h100-sxm", "tpuv4"]))
        eff = calibrated_efficiency(chip)
        tp, pp = rng.choice([1, 2, 4, 8]), rng.choice([2, 4, 8])
        dp = rng.choice([2, 4, 8, 16])
        devices, batch = tp * pp * dp, dp * rng.choice([1, 2, 3, 4])
        chip = replace(chip, hbm_bytes=chip.hbm_bytes * rng.choice([0.25, 0.5, 0.75, 1.0]))
        options = PlacementOptions(tp=(tp,), pp=(pp,), mbs=(1,), recompute=("none", "full", "block"),
                                   exhaustive=True)
        try:
            with mock.patch.object(placement, "_longer_blocks", lambda *a, **k: []):
                fewest = place(model, chip, devices, batch, options, eff, top=10 ** 6, with_baseline=False)
            now = place(model, chip, devices, batch, options, eff, top=10 ** 6, with_baseline=False)
        except ConfigError:
            continue
        cases += 1
        before = {(p.plan.vp, p.plan.zero): p.result.step_time_s for p in fewest.top}
        for p in now.top:
            old = before[(p.plan.vp, p.plan.zero)]
            layouts += 1
            if p.result.step_time_s < old * (1 - 1e-12):
                better += 1
                gains.append(1 - p.result.step_time_s / old)
            worse += p.result.step_time_s > old * (1 + 1e-12)
    print(f"{cases} placements, {layouts} layouts solved exactly: {better} faster with the longer block "
          f"counts ({100 * better / max(layouts, 1):.2f} %), {worse} slower"
          + (f"; gain median {100 * sorted(gains)[len(gains) // 2]:.3f} %, largest {100 * max(gains):.3f} %"
             if gains else ""))


if __name__ == "__main__":
    main()
