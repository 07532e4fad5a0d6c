"""Context parallelism across nodes: Llama-3 8B at 128K tokens on H100s (tp 8, full recompute,
the NeMo preset, 8 sequences per step, dp 1), cp 4 to 32, so that tp x cp spans 4 to 32 nodes.
Prints each step time, its breakdown, and how much it falls from the cp before. Shipped
calibration.

    python tests/bench/bench_context_parallel.py

docs/validation.md quotes its output.
"""
from __future__ import annotations

from phaze import validate as v
from phaze.api import with_system
from phaze.arch import load_chip
from phaze.framework import FRAMEWORKS, plan_with
from phaze.plan import Plan
from phaze.step import evaluate
from phaze.workload import load_model


def main() -> None:
    model = load_model("llama3-8b", 131072)
    chip = with_system(load_chip("h100-sxm"), "dgx-h100-superpod")
    fw = FRAMEWORKS["nemo"]
    chip = chip.with_execution(fw.execution)
    eff = v.params_for(chip, v.load_default_params())
    print("Llama-3 8B, 131,072 tokens, 8 sequences per step, H100 (dgx-h100-superpod), nemo preset, "
          "tp 8, recompute full")
    print(f"  {'cp':>3} {'devices':>7} {'step s':>8} {'compute s':>10} {'exposed comm s':>15} {'falls by':>9}")
    before = None
    for cp in (4, 8, 16, 32):
        plan = plan_with(fw, Plan(tp=8, cp=cp, mbs=1, recompute="full"), {"recompute"}, model.precision)[0]
        r = evaluate(model, chip, 8 * cp, 8, plan, eff)
        b = r.breakdown_s
        fall = f"{before / r.step_time_s:8.2f}x" if before else f"{'':>9}"
        print(f"  {cp:>3} {8 * cp:>7} {r.step_time_s:8.3f} {b['compute_s']:10.3f} "
              f"{b['communication_exposed_s']:15.3f} {fall}")
        before = r.step_time_s


if __name__ == "__main__":
    main()
