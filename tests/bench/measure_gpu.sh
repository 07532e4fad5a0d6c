#!/usr/bin/env bash
# Every measurement of a GPU in results/kernels/<gpu>/ in one call on a lent CUDA GPU, PyTorch alone:
#
#     bash tests/bench/measure_gpu.sh DIR [ARCHIVE]
#
# writes DIR/properties.txt, DIR/sustained.txt, DIR/sustained_fp8.txt, DIR/kernels.csv (the
# kernels of results/kernels/cases.csv timed alone) and DIR/step_*.csv (the ten step profiles that
# tests/kernel_tables.py reads), most telling first, and after each one packs DIR into ARCHIVE
# (a .tgz) when given, so that a call cut short at its time limit still returns what it measured.
# The same calls, one at a time, are in tests/bench/bench_kernels.py's docstring. The H100's
# files (2026-12-05, 276 s) came from this script's first version, which named them after the
# chip (h100.csv, sustained_h100.txt, step_flash_h100_4.csv, ...); renamed, and properties.txt
# given a first line saying where it came from; nothing else changed.
set -u
dir=$1 archive=${2:-}
mkdir -p "$dir"
export PYTHONUNBUFFERED=1
b=tests/bench
pack() { [ -n "$archive" ] && tar czf "$archive" -C "$dir" . ; return 0; }
run() { echo "== $(date -u +%T) $*"; "$@" || echo "!! exit $? from: $*"; pack; }
step() {   # label warm-seconds layers... -- measure_step.py options
    local label=$1 warm=$2; shift 2
    local layers=()
    while [ "$1" != "--" ]; do layers+=("$1"); shift; done; shift
    for n in "${layers[@]}"; do
        run python3 $b/measure_step.py "$dir/step_${label}_$n.csv" --layers "$n" --warm-seconds "$warm" "$@"
    done
}
run bash -c "python3 $b/measure_properties.py > '$dir/properties.txt'"
run bash -c "python3 $b/measure_sustained.py --seconds 15 > '$dir/sustained.txt'"
run bash -c "python3 $b/measure_sustained.py --seconds 15 --dtype fp8 > '$dir/sustained_fp8.txt'"
run python3 $b/measure_kernels.py results/kernels/cases.csv "$dir/kernels.csv"
step flash 10 4 8 -- --attention flash
step mpt 10 4 8 -- --shape mpt-1b --seq 2048 --mbs 8
step cudnn 10 4 8 -- --attention cudnn
step mpt64k 8 2 4 -- --shape mpt-1b --seq 65536
step mpt64kr 6 2 4 -- --shape mpt-1b --seq 65536 --recompute
echo "== $(date -u +%T) done"
