"""What each setting of the Megatron-LM 2021-22 preset costs a small model: the preset's step time
on 8 A100s (80 GB, data parallel, fp16 as that era trained), and how much longer it is than the
same plan with that one setting at phaze's default (``loss=torch``, the gradient reduction under
the last backward, the fused ``adam`` update), then with all three. Shipped calibration.

    python tests/bench/bench_framework_effects.py

docs/frameworks.md quotes its output.
"""
from __future__ import annotations

from dataclasses import replace

from phaze import validate as v
from phaze.arch import load_chip
from phaze.framework import FRAMEWORKS, plan_with
from phaze.plan import Plan
from phaze.step import evaluate
from phaze.workload import load_model

MODELS = ("mpt-125m", "opt-350m", "gpt2-xl")
DEFAULTS = {"loss": {"loss": "torch"}, "reduction after backward": {"dp_overlap": True},
            "optimizer passes": {"optimizer": "adam"}}


def main() -> None:
    chip = load_chip("a100-80gb")
    eff = v.params_for(chip, v.load_default_params())
    fw = FRAMEWORKS["megatron-lm"]
    print("megatron-lm preset on 8 x A100 80 GB, fp16, 1,024 tokens, micro-batch 8, global batch 64; "
          "% longer than with the one setting at phaze's default")
    print(f"  {'model':<10} {'step s':>8}  " + "  ".join(f"{k:>24}" for k in DEFAULTS) + f"  {'all three':>10}")
    for name in MODELS:
        model = replace(load_model(name, 1024), precision="fp16")
        plan = plan_with(fw, Plan(mbs=8), precision="fp16")[0]
        t = evaluate(model, chip, 8, 64, plan, eff).step_time_s
        cells = []
        for change in DEFAULTS.values():
            base = evaluate(model, chip, 8, 64, replace(plan, **change), eff).step_time_s
            cells.append(f"{100 * (t / base - 1):23.1f}%")
        every = {k: x for change in DEFAULTS.values() for k, x in change.items()}
        base = evaluate(model, chip, 8, 64, replace(plan, **every), eff).step_time_s
        print(f"  {name:<10} {t:8.3f}  " + "  ".join(cells) + f"  {100 * (t / base - 1):9.1f}%")


if __name__ == "__main__":
    main()
