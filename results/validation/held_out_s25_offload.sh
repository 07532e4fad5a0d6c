#!/bin/sh
# The 6 rows of the held-out S25 that were skipped when S25 was scored (MaxText's 128B model on
# TPU v5e, remat_policy=qkv_proj_offloaded), scored once after activation offload was modelled
# (2026-12-06), with the shipped calibration; the other 34 rows of S25 are not scored again.
# Run from the project root: sh results/validation/held_out_s25_offload.sh
set -e
dir=$(mktemp -d)
python - "$dir/offload.csv" <<'PY'
import csv
import sys
with open("phaze/data/reference/training_runs_3.csv", newline="") as f:
    reader = csv.DictReader(f)
    rows = [r for r in reader if r["recompute"] == "offload"]
with open(sys.argv[1], "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=reader.fieldnames, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
PY
phaze validate --runs "$dir/offload.csv" --hold-out S25_maxtext_tpuv5 --score-held-out --no-loso --unseen '' \
    --out results/validation/held_out_s25_offload.csv | sed "s|$dir/offload.csv|the 6 offload rows of phaze/data/reference/training_runs_3.csv|" \
    > results/validation/held_out_s25_offload.txt
rm -rf "$dir"
