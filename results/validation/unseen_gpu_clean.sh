#!/bin/sh
# The clean unseen-GPU figure for training_runs.csv: the cost model as it was at commit e99c245
# (where the A100 -> H100 check first ran; every later cost-model change was made with H100
# errors in view), calibrated on the A100 rows only, predicting the H100 rows.
# Run from the project root: sh results/validation/unseen_gpu_clean.sh > results/validation/unseen_gpu_clean.json
set -e
dir=$(mktemp -d)
git archive e99c245 | tar -x -C "$dir"
cp phaze/data/reference/training_runs.csv "$dir/runs.csv"   # the bundled copy of the published runs
cd "$dir"
python - <<'PY'
import json
from phaze import validate as v
cases = [c for c in (v.row_to_case(r, {}) for r in v.read_runs("runs.csv")) if isinstance(c, v.Case)]
a100 = v.calibrate_cases([c for c in cases if c.chip.family == "A100"])["A100"]
preds = v.predict_all([c for c in cases if c.chip.family == "H100"], {"H100": a100})
def stats(errs):
    return {"rows": len(errs), "mape_pct": round(100 * sum(map(abs, errs)) / len(errs), 2),
            "bias_pct": round(100 * sum(errs) / len(errs), 2)}
by = {}
for p in preds:
    by.setdefault(p.source, []).append(p.error)
print(json.dumps({"model": "e99c245", "train": "A100", "test": "H100",
                  "overall": stats([p.error for p in preds]),
                  "per_source": {s: stats(e) for s, e in sorted(by.items())}}, indent=1))
PY
rm -rf "$dir"
