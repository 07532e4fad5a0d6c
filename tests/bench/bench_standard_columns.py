"""What a user who gives only the standard columns gets: the bundled runs with every explicit
column blanked (the reference README's standard columns only), then with the ``framework``
column kept, scored with the shipped calibration (in-sample: those parameters were fitted on the
full columns of these rows; the held-out source is left out as everywhere).

    python tests/bench/bench_standard_columns.py
"""
from __future__ import annotations

from phaze import validate as v
from phaze.calibrate import load_default_params
from phaze.runs import EXPLICIT_COLUMNS, default_runs_paths, read_runs, row_to_case


def score(keep: tuple[str, ...]) -> dict:
    items = []
    for path in default_runs_paths():
        for row in read_runs(path):
            blank = {k: "" for k in EXPLICIT_COLUMNS if k not in keep}
            items.append(row_to_case(dict(row, **blank), dataset=path.stem))
    items = v.split_held_out(items)[0]
    return v.summarize(v.predict_all(items, load_default_params()))


def main() -> None:
    print("in-sample (shipped calibration); standard columns only, then with one explicit column kept")
    for name, keep in (("standard columns only", ()), ("standard + framework", ("framework",)),
                       ("all explicit columns", EXPLICIT_COLUMNS)):
        s = score(keep)
        o, m = s["overall"], s.get("source_mean", {})
        print(f"  {name:<24} {o['expressed']:>4} of {o['total']} expressed  MAPE {o['mape_pct']:5.1f} %  "
              f"bias {o['bias_pct']:+5.1f} %  per-source mean {m.get('mape_pct', 0):5.1f} %")


if __name__ == "__main__":
    main()
