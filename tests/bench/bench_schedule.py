"""Benchmark: CP-SAT layer schedules (forward and backward) of every shipped workload on TPUv4,
A100-80GB and H100-SXM at micro-batch 1 and the workload's usual tensor-parallel width, with the
shipped calibration and one solver worker: each kind of layer a workload has (a mixture of
experts' dense and MoE layers, a hybrid's Mamba-2, attention and MLP layers: ``layer_mix``) on
its own, as the step costs them. Caching is off (``cache=False``, and PHAZE_CACHE_DIR points to a
fresh temporary folder besides), so that it measures solving: some workloads share their layer
shapes (GPT-3 175B and Megatron 145B) and would otherwise hit the cache. A phase the solver stops
at its work limit unproven (FEASIBLE) is listed with its gap; the benchmark fails (exit 1) only on
a phase with no schedule.

Run: python tests/bench/bench_schedule.py
"""
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

os.environ["PHAZE_CACHE_DIR"] = tempfile.mkdtemp(prefix="phaze-bench-schedule-")

from phaze import schedule as S  # noqa: E402
from phaze.api import calibrated_efficiency  # noqa: E402
from phaze.arch import load_chip  # noqa: E402
from phaze.catalogue import load_model
from phaze.configio import ConfigError  # noqa: E402
from phaze.stage import layer_mix

ROOT = Path(__file__).resolve().parents[2]
CHIPS = ("tpuv4", "a100-80gb", "h100-sxm")


def usual_tp(m) -> int:
    """8 above 20B parameters, 4 above 5B, 2 above 1.5B, else 1; the largest width at or below
    that which divides the heads and the FFN width (and fits the kv heads)."""
    want = 8 if m.params > 20e9 else 4 if m.params > 5e9 else 2 if m.params > 1.5e9 else 1
    for tp in (8, 4, 2, 1):
        if tp <= want and not (m.heads % tp or m.ffn_hidden % tp or (m.kv_heads % tp and tp % m.kv_heads)):
            return tp
    return 1


def main() -> None:
    names = sorted(p.stem for p in (ROOT / "workloads").glob("*.yaml"))
    print(f"{'workload':<20} {'chip':<15} {'tp':>2} {'ops f/b':>7} {'status fwd/bwd':<18} {'gap':>8} "
          f"{'solve s':>8}")
    rows, gpt3 = [], None
    for chip_name in CHIPS:
        chip = load_chip(chip_name)
        eff = calibrated_efficiency(chip)
        for name in names:
            m = load_model(name)
            note = ""
            try:
                chip.peak_flops(m.precision)
            except ConfigError:
                m, note = replace(m, precision="bf16"), f" ({load_model(name).precision} -> bf16)"
            for _, view, moe in layer_mix(m):
                kind = f" [{view.layer_kind or ('MoE' if view.moe else 'dense')}]" if view is not m else ""
                for tp in [w for w in (8, 4, 2, 1) if w <= usual_tp(m)]:   # the widest the kind allows
                    try:
                        S.check_layer_args(view, 1, tp, tp > 1, "flash", "none")
                        break
                    except ConfigError:
                        continue
                t = time.perf_counter()
                fwd, bwd = S.schedule_layer(view, chip, 1, tp, tp > 1, "flash", "none", eff, moe=moe, cache=False)
                wall = time.perf_counter() - t
                gap = max(fwd.gap, bwd.gap)
                rows.append((fwd, bwd, wall))
                print(f"{name + kind:<20} {chip.name:<15} {tp:>2} {len(fwd.ops):>3}/{len(bwd.ops):<3} "
                      f"{fwd.status + '/' + bwd.status:<18} {gap:8.1e} {wall:8.3f}{note}")
                if name == "gpt3-175b" and chip_name == "tpuv4":
                    gpt3 = (tp, wall, fwd, bwd)
    phases = [s for f, b, _ in rows for s in (f, b)]
    optimal = sum(s.status == "OPTIMAL" for s in phases)
    feasible = [s for s in phases if s.status == "FEASIBLE"]
    walls = [w for _, _, w in rows]
    print(f"{len(rows)} cases, {len(phases)} phases: {optimal} OPTIMAL, {len(feasible)} FEASIBLE at the work "
          f"limit (largest gap {max((s.gap for s in feasible), default=0.0):.1e}), "
          f"{len(phases) - optimal - len(feasible)} without a schedule; solve time total {sum(walls):.2f} s, "
          f"max {max(walls):.3f} s per layer (fwd+bwd), one worker")
    tp, wall, fwd, bwd = gpt3
    print(f"GPT-3 175B on TPUv4, tp={tp}, mbs=1: forward+backward solve {wall:.3f} s "
          f"({fwd.status}/{bwd.status}; makespan {fwd.makespan_s * 1e3:.3f} + {bwd.makespan_s * 1e3:.3f} ms "
          f"vs sequential {fwd.sequential_sum_s * 1e3:.3f} + {bwd.sequential_sum_s * 1e3:.3f} ms)")
    if optimal + len(feasible) != len(phases):
        sys.exit(1)


if __name__ == "__main__":
    main()
