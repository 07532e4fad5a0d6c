"""Benchmark: `phaze evaluate` wall time (cold process) and evaluations per second (library).

Run: python tests/bench/bench_evaluate.py
"""
import subprocess
import sys
import time

from phaze import evaluate, load_chip, load_model
from phaze.graph import edge_graph, layer_graph
from phaze.plan import Plan
from phaze.stage import edge_time, layer_time, mode_costs, stage_costs
from phaze.step import evaluate as _evaluate

CMD = [sys.executable, "-m", "phaze.cli", "evaluate", "--workload", "gpt3-175b", "--arch", "a100-80gb",
       "--devices", "1024", "--global-batch", "1536", "--plan", "tp=8,pp=16,mbs=1,recompute=full"]


def main() -> None:
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run(CMD, check=True, capture_output=True)
        runs.append(time.perf_counter() - t)
    print(f"phaze evaluate GPT-3 175B, 1024 x A100-80GB, tp=8 pp=16 full recompute: "
          f"best {min(runs):.2f} s, worst {max(runs):.2f} s (cold process, 3 runs)")

    model, chip = load_model("gpt3-175b"), load_chip("a100-80gb")
    plans = [Plan(tp=tp, pp=pp, mbs=mbs, recompute=rc) for tp in (1, 2, 4, 8) for pp in (8, 16, 32)
             for mbs in (1, 2, 4) for rc in ("none", "selective", "full")]
    for f in (_evaluate, stage_costs, mode_costs, layer_time, edge_time, layer_graph, edge_graph):
        f.cache_clear()
    t = time.perf_counter()
    for p in plans:
        evaluate(model, chip, 1024, 1536, p)
    cold = time.perf_counter() - t
    print(f"{len(plans)} distinct plans, empty caches: {cold:.3f} s "
          f"({len(plans) / cold * 60:,.0f} evaluations per minute)")
    # a search varies the chip: a new chip hits no cache
    t = time.perf_counter()
    n = 0
    for count in range(64, 192, 4):
        c = chip.with_units(tensor_count=count)
        evaluate(model, c, 1024, 1536, Plan(tp=8, pp=16, recompute="full"))
        n += 1
    dt = time.perf_counter() - t
    print(f"{n} new chips, one plan each: {dt:.3f} s ({n / dt * 60:,.0f} chip evaluations per minute)")


if __name__ == "__main__":
    main()
