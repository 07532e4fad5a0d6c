"""phaze's operator times against kernels measured on two GPUs: an H200, which phaze was never
calibrated on, and the H100 SXM whose published steps the H100 fit comes from.

The measurements in ``results/kernels/<gpu>/`` and what they are: ``tests/kernel_tables.py``.
Two halves, so that the GPU machine needs only PyTorch:

    python tests/bench/bench_kernels.py --cases results/kernels/cases.csv   # the kernels to time
    bash tests/bench/measure_gpu.sh DIR                                      # on the GPU: all four
    python tests/bench/measure_kernels.py results/kernels/cases.csv OUT.csv  #   measurements, or
    python tests/bench/measure_sustained.py [--dtype fp8] > OUT.txt          #   one at a time
    python tests/bench/measure_step.py OUT.csv --layers 4 --warm-seconds 10  #   (4, 8; --attention cudnn)
    python tests/bench/bench_kernels.py [--gpu h100] [--detail]              # the comparison

Prints the tables docs/validation.md carries (``tests/test_kernel_tables.py`` holds the two equal):
the H200's, the H100's and the two set side by side.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import kernel_tables as kt  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, help="write the kernels to time to this CSV and stop")
    ap.add_argument("--gpu", choices=sorted(kt.GPUS), help="this GPU's tables alone (default: both)")
    ap.add_argument("--detail", action="store_true", help="one line per kernel timed alone")
    ap.add_argument("--pinned", metavar="NAME=VALUE,...",
                    help="refit the H100 rows with these parameters held (e.g. the kernels' attention: "
                         "attention_fraction=0.956,tile_overhead_k=444) and print both fits' in-sample error")
    a = ap.parse_args()
    if a.pinned:
        print(kt.pinned_fit({k: float(x) for k, x in (kv.split("=") for kv in a.pinned.split(","))}))
        sys.exit(0)
    if a.cases:
        a.cases.write_text(kt.cases_csv())
        print(f"{len(kt.case_rows())} kernels -> {a.cases}")
        sys.exit(0)
    for gpu in [a.gpu] if a.gpu else sorted(kt.GPUS, reverse=True):
        headers, _ = kt.read_measured(gpu)
        print(f"## {kt.GPUS[gpu].label}", "\n".join(headers), sep="\n")
        print(kt.kernel_table(gpu), kt.attention_rates(gpu), kt.kernel_fit_table(gpu), kt.launch_line(gpu),
              kt.sustained_table(gpu), kt.step_table(gpu), kt.rotary_table("flash", gpu), kt.published_line(gpu=gpu),
              sep="\n\n", end="\n\n")
        if a.detail:
            for r, t, p in kt.kernel_errors(gpu):
                print(f"{r['case']:84s} {r['op']:22s} {t * 1e6:10.1f} us {p * 1e6:10.1f} us "
                      f"{100 * (p / t - 1):+7.1f} %")
    if not a.gpu:
        print("## the same layers on both", kt.chip_table(), sep="\n\n")
