"""phaze's operator times against kernels measured on a GPU it was never calibrated on (H200).

The three measurements in ``results/kernels/`` and what they are: ``tests/kernel_tables.py``.
Two halves, so that the GPU machine needs only PyTorch:

    python tests/bench/bench_kernels.py --cases results/kernels/cases.csv   # the kernels to time
    python tests/bench/measure_kernels.py results/kernels/cases.csv OUT.csv  # on the GPU
    python tests/bench/measure_sustained.py [--dtype fp8] > OUT.txt          # on the GPU
    python tests/bench/measure_step.py OUT.csv --layers 4 --warm-seconds 10  # on the GPU (4, 8;
                                                                             #   --attention cudnn)
    python tests/bench/bench_kernels.py [--detail]                           # the comparison

Prints the tables docs/validation.md carries (``tests/test_readme.py`` holds the two equal).
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
    headers, _ = kt.read_measured()
    print("\n".join(headers))
    print(kt.kernel_table(), kt.attention_rates(), kt.kernel_fit_table(), kt.launch_line(), kt.sustained_table(),
          kt.step_table(), kt.rotary_table(), sep="\n\n")
    if a.detail:
        for r, t, p in kt.kernel_errors():
            print(f"{r['case']:84s} {r['op']:22s} {t * 1e6:10.1f} us {p * 1e6:10.1f} us {100 * (p / t - 1):+7.1f} %")
