"""``phaze report``: the report agrees with trials.csv, the Pareto set is right, odd studies give a
report or one clear line, no file names a machine path, and report.html works in a real browser.

The small studies use a GPU template (kernels run one after another: no CP-SAT solve) and
MPT-125M on 8 chips, as tests/test_search.py does.
"""
from __future__ import annotations

import html
import re
import sqlite3
import subprocess
import sys
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from phaze.search import search
from phaze.space import load_sweep

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from chromium import find_chromium, visit  # noqa: E402
from conftest import SMALL_SWEEP  # noqa: E402

SMALL = dict(SMALL_SWEEP, constraints={"area_mm2": 800}, trials=6)
FIGURES = ("front", "history", "breakdown", "plans")


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phaze.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def make_study(root: Path, cfg: dict, name: str | None = None):
    """Run a small search in ``root`` (its results/ folder), as ``phaze search`` does."""
    path = root / f"{name or cfg['name']}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    c = load_sweep(path)
    url = f"sqlite:///{root / 'results' / (name or c.name) / 'study.db'}"
    return search(c if name is None else replace(c, name=name), storage=url, study_name=name or c.name,
                  progress=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    res = make_study(root, SMALL)
    return root, res.out_dir


def md_table(text: str, heading: str) -> pd.DataFrame:
    """The first table after ``heading`` in a markdown report."""
    part = text.split(heading, 1)[1]
    rows = [ln for ln in part.splitlines() if ln.startswith("|")]
    block = []
    for ln in part.splitlines()[1:]:
        if ln.startswith("|"):
            block.append(ln)
        elif block:
            break
    assert rows, heading
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in block]
    return pd.DataFrame(cells[2:], columns=cells[0])


class _Tables(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tables, self.current, self.row, self.cell = {}, None, None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.current = a.get("id")
            self.tables[self.current] = []
        elif tag == "tr" and self.current is not None:
            self.row = []
        elif tag in ("td", "th") and self.row is not None:
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.row.append(self.cell)
            self.cell = None
        elif tag == "tr" and self.row is not None:
            self.tables[self.current].append(self.row)
            self.row = None
        elif tag == "table":
            self.current = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def html_tables(path: Path) -> dict[str, list[list[str]]]:
    p = _Tables()
    p.feed(path.read_text())
    return p.tables


# --- the report agrees with trials.csv --------------------------------------------------------------
def test_report_tables_agree_with_trials_csv(tiny):
    root, out = tiny
    r = run_cli(root, "report", str(out.relative_to(root)))
    assert r.returncode == 0, r.stderr
    trials = pd.read_csv(out / "trials.csv")
    text = (out / "report.md").read_text()
    best = md_table(text, "## Best designs")
    by_trial = trials.set_index("trial")
    for _, row in best.iterrows():
        t = by_trial.loc[int(row["trial"])]
        assert t["feasible"] and t["state"] == "COMPLETE"
        assert row["area mm²"] == f"{t['area_mm2']:.0f}"
        assert row["power W"] == f"{t['power_w']:.0f}"
        assert row["cost $"] == f"{t['cost_usd']:,.0f}"
        assert row["tokens/s (geomean)"] == f"{t['throughput_tokens_per_s']:,.0f}"
        assert row["MPT-125M plan"] == t["MPT-125M:plan"]
        assert float(row["tensor_units"]) == t["chip:tensor_units"]
    # several objectives: the best designs are the Pareto set (it has at most 5 designs here)
    front = pd.read_csv(out / "pareto.csv")
    assert sorted(best["trial"].astype(int)) == sorted(front["trial"])
    # the HTML shows the same table, cell for cell
    tables = html_tables(out / "report.html")
    assert tables["best-designs"][0] == list(best.columns)
    assert tables["best-designs"][1:] == best.to_numpy().tolist()
    # where the best design's time goes: the numbers of its row of trials.csv
    first = by_trial.loc[int(best.iloc[0]["trial"])]
    bd = md_table(text, "## Where the step time goes")
    mine = bd[bd["chip"] == f"trial {int(best.iloc[0]['trial'])}"].iloc[0]
    assert float(mine["step s"]) == pytest.approx(first["MPT-125M:step_time_s"], rel=1e-3)
    assert mine["compute (tensor units)"].startswith(f"{first['MPT-125M:compute_s']:.3g} ")
    assert mine["memory per device"] == f"{first['MPT-125M:memory_per_device_gib']:.1f} GiB"
    # infeasible designs by reason: the counts of trials.csv's reason kinds
    done = trials[trials["state"] == "COMPLETE"]
    kinds = done[~done["feasible"]]["reason_kinds"].fillna("").str.split("; ").explode().value_counts()
    listed = dict(re.findall(r"^- (.+): (\d+)$", text.split("## Infeasible designs by reason", 1)[1], re.M))
    assert {k: int(v) for k, v in listed.items()} == {k: int(v) for k, v in kinds.items()}
    assert sum(kinds) > 0                                # the budget of 800 mm² rules some out
    tbl = {r[0]: int(r[1]) for r in tables["infeasible-table"][1:]}
    assert tbl == {k: int(v) for k, v in kinds.items()}
    # every figure, as PNG and SVG, and linked from report.md
    for name in FIGURES + ("infeasible",):
        assert (out / f"{name}.png").stat().st_size > 5000 and (out / f"{name}.svg").exists()
        assert f"]({name}.png)" in text
    assert "too few trials" in text                   # 6 designs: no parameter importances, and it says so


def test_pareto_set_is_non_dominated_and_complete(tiny):
    _, out = tiny
    trials = pd.read_csv(out / "trials.csv")
    front = set(pd.read_csv(out / "pareto.csv")["trial"])
    ok = trials[(trials["state"] == "COMPLETE") & trials["feasible"]]
    v = ok[["throughput", "area"]].to_numpy(dtype=float)
    g = v * np.array([1.0, -1.0])
    for i, t in enumerate(ok["trial"]):
        dominated = any(np.all(g[j] >= g[i]) and np.any(g[j] > g[i]) for j in range(len(g)))
        assert (t in front) == (not dominated), t
    assert front <= set(ok["trial"])


def test_report_from_the_storage_alone_matches_the_search(tiny, tmp_path):
    """``phaze report`` without the YAML writes what the end of ``phaze search`` wrote."""
    root, out = tiny
    from phaze.report import load_study
    from phaze.study_files import write_study_files
    cfg = load_sweep(root / "tiny.yaml")
    study, folder = load_study(out)
    assert folder == out
    write_study_files(study, cfg, tmp_path / "with-config")
    write_study_files(study, None, tmp_path / "from-storage")
    a = (tmp_path / "with-config" / "report.md").read_text()
    b = (tmp_path / "from-storage" / "report.md").read_text()
    assert a == b
    assert (tmp_path / "from-storage" / "gantt-mpt-125m.png").exists()   # chip and model found from the study


def test_study_with_only_infeasible_trials_says_so(tmp_path):
    cfg = dict(SMALL, name="nofit", workloads=[{"workload": "gpt3-175b", "devices": 8, "global_batch": 8,
                                                "placement": {"tp": [8], "mbs": [1], "pp": [1],
                                                              "recompute": ["full"]}}],
               trials=2, objectives=["throughput"])
    res = make_study(tmp_path, cfg)
    r = run_cli(tmp_path, "report", "results/nofit")
    assert r.returncode == 0, r.stderr
    text = (res.out_dir / "report.md").read_text()
    assert "**No feasible design**" in text and "no plan fits GPT-3 175B" in text
    page = (res.out_dir / "report.html").read_text()
    assert "No feasible design" in page and 'id="best-designs"' in page


def test_bad_studies_are_one_line_and_exit_2(tmp_path, tiny):
    import optuna
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.txt").write_text("not a database\n")
    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    (tmp_path / "empty").mkdir()
    optuna.create_study(study_name="empty", storage=f"sqlite:///{tmp_path / 'empty' / 'study.db'}")
    (tmp_path / "foreign").mkdir()
    s = optuna.create_study(study_name="foreign", storage=f"sqlite:///{tmp_path / 'foreign' / 'study.db'}")
    s.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    cases = [(["report", "missing"], "no such study"), (["report", "folder"], "no study.db"),
             (["report", "notes.txt"], "not an SQLite file"), (["report", "other.db"], "no Optuna study"),
             (["report", "empty"], "no complete trial"), (["report", "foreign"], "not written by phaze"),
             (["report"], "name a study folder"), (["report", "--storage", "sqlite:///nowhere.db"], "no such SQLite"),
             (["report", str(tiny[1]), "--study", "nosuch"], "no study 'nosuch'")]
    for args, words in cases:
        r = run_cli(tmp_path, *args)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert not (tmp_path / "nowhere.db").exists()       # a report never creates a storage


def test_two_studies_on_one_front(tiny, tmp_path):
    root, out = tiny
    other = make_study(root, dict(SMALL, constraints={"area_mm2": 2000}, seed=5), name="tiny-wide")
    r = run_cli(root, "report", "results/tiny", "results/tiny-wide", "--out", str(tmp_path / "cmp"))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "cmp" / "compare.md").read_text()
    assert "tiny vs tiny-wide" in text and "area_mm2 800" in text and "area_mm2 2000" in text
    for f in ("compare-front.png", "compare-front.svg", "compare-history.png", "compare.html"):
        assert (tmp_path / "cmp" / f).stat().st_size > 1000
    assert other.out_dir.name == "tiny-wide"


def test_no_file_names_a_machine_path(tiny):
    root, out = tiny
    for f in sorted(out.iterdir()):
        if f.suffix in (".csv", ".md", ".html", ".svg"):
            text = f.read_text()
            assert str(root) not in text and "/tmp/" not in text and "/home/" not in text, f.name
    for f in (ROOT / "results" / "validation" / "summary.txt", ROOT / "phaze" / "data" / "calibration.json"):
        text = f.read_text()
        assert str(ROOT) not in text and not re.search(r"(^|[\s(\"'])/(work|home|tmp|Users)/", text), f


def test_display_path_is_relative_to_the_project():
    from phaze.runs import default_runs_path, display_path
    assert display_path(default_runs_path()) == "phaze/data/reference/training_runs.csv"


def test_optuna_dashboard_serves_the_study(tiny):
    """``optuna-dashboard sqlite:///results/<study>/study.db``: its API answers for a phaze study."""
    dash = pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is in the test extra")
    from wsgiref.util import setup_testing_defaults
    _, out = tiny
    app = dash.wsgi(f"sqlite:///{out / 'study.db'}")

    def get(path):
        env = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
        setup_testing_defaults(env)
        status = []
        body = b"".join(app(env, lambda s, h, *a: status.append(s)))
        return status[0], body
    status, body = get("/api/studies")
    assert status.startswith("200") and b'"tiny"' in body
    status, body = get("/api/studies/1")
    assert status.startswith("200") and b"trials" in body


# --- figures ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def frames(tiny):
    from phaze.report import baselines_frame, load_study, study_meta, trials_frame
    study, _ = load_study(tiny[1])
    meta = study_meta(study)
    return study, meta, trials_frame(study, meta.objectives), baselines_frame(study, meta.objectives)


def test_budget_outside_the_data_is_drawn_and_labelled_above_the_frame(frames):
    from phaze.plots import _plotly_front, fig_front
    from phaze.report import best_designs
    study, meta, trials, baselines = frames
    meta = replace(meta, constraints=(("area_mm2", 9000.0),))     # far right of every design and baseline
    fig = fig_front(trials, baselines, meta, best_designs(trials, meta))
    ax = fig.axes[0]
    assert ax.get_xlim()[1] > 9000
    assert any(list(line.get_xdata()) == [9000.0, 9000.0] for line in ax.lines)
    label = next(t for t in ax.texts if t.get_text().startswith("budget 9,000"))
    assert label.xyann[1] > 0 and label.xy[1] == 1.0                    # above the frame, not among the markers
    pfig = _plotly_front(trials, baselines, meta, best_designs(trials, meta))
    assert pfig.layout.xaxis.range[1] > 9000
    assert any(a.text.startswith("budget 9,000") for a in pfig.layout.annotations)


def test_infeasible_counts_have_integer_ticks_in_png_and_html():
    from phaze.plots import _plotly_infeasible, fig_infeasible
    from phaze.report import StudyMeta
    meta = StudyMeta("t", ("throughput",), ("maximize",), (), (), (), (), "", (), (), 0, "tpe", 0)
    fig = fig_infeasible({"area budget": 3, "no plan fits": 1}, meta)
    fig.canvas.draw()
    ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= 3.45]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert _plotly_infeasible({"a": 3, "b": 1}).layout.xaxis.dtick == 1


def test_html_history_shows_infeasible_designs_and_breakdown_names_cluster_and_batch(frames):
    from phaze.plots import _plotly_breakdown, _plotly_history, fig_breakdown
    study, meta, trials, baselines = frames
    tr = trials.copy()
    done = tr.index[(tr["state"] == "COMPLETE") & tr["evaluated"].astype(bool)]
    tr.loc[done[0], "feasible"] = False
    names = [t.name for t in _plotly_history([("t", tr, "#000")], baselines, ("throughput", "maximize")).data]
    assert "infeasible (evaluated)" in names
    row = trials[trials["feasible"].astype(bool)].iloc[0]
    assert "on 8 chips, global batch 16" in fig_breakdown(row, baselines, meta).axes[0].get_title()
    assert "on 8 chips, global batch 16" in _plotly_breakdown(row, baselines, meta).layout.annotations[0].text


def test_budget_reasons_use_si_symbols(frames):
    """One spelling per unit across tables, hovers and figures: mm² and W, never mm2 or w."""
    study, meta, trials, baselines = frames
    reasons = [r for r in list(trials["reason"]) + list(baselines["reason"]) if "budget" in str(r)]
    assert reasons and all(" mm² " in r + " " and "mm2" not in r for r in reasons if r.startswith("area"))


def test_plans_figure_shows_every_line_and_says_when_the_plan_never_changes(frames):
    from phaze.plots import _plotly_plans, fig_plans
    from phaze.report import plan_front
    study, meta, trials, baselines = frames
    front = plan_front(trials, meta)
    w = meta.workloads[0]
    front = front.assign(**{f"{w}:plan": "tp=1,pp=1,mbs=2,recompute=none"})
    pfig = _plotly_plans(front, meta)
    tp, pp = (next(t for t in pfig.data if t.legendgroup == k) for k in ("tp", "pp"))
    assert list(tp.y) != list(pp.y) and tp.line.dash != pp.line.dash       # equal widths, both visible
    assert list(pfig.layout.yaxis.ticktext) == ["1", "2"]                  # powers of two only: no stray 9
    said = [a.text for a in pfig.layout.annotations if "the same on all" in a.text]
    if len(front) > 1:
        assert said and "tp=1,pp=1,mbs=2" in said[0]
        assert any("the same on all" in t.get_text() for t in fig_plans(front, meta).axes[0].texts)


def test_figures_drawn_in_parallel_are_the_files_drawn_in_one_process(frames, tmp_path):
    from phaze.plots import write_figures
    study, meta, trials, baselines = frames
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    one, _ = write_figures(study, meta, trials, baselines, tmp_path / "one", workers=1)
    many, _ = write_figures(study, meta, trials, baselines, tmp_path / "many", workers=3)
    assert list(one) == list(many) and {"front", "gantt-mpt-125m", "plans"} <= set(one)
    for name, d in one.items():
        for ext in ("png", "svg"):
            assert d[ext].read_bytes() == many[name][ext].read_bytes(), (name, ext)


def test_report_twice_from_one_study_is_byte_identical(tiny, tmp_path):
    """Every file, CSVs and figures, in two processes with different hash seeds."""
    import os
    root, out = tiny
    for seed in ("1", "2"):
        r = subprocess.run([sys.executable, "-m", "phaze.cli", "report", str(out), "--out", str(tmp_path / seed)],
                           capture_output=True, text=True, timeout=600, cwd=root,
                           env=dict(os.environ, PYTHONHASHSEED=seed))
        assert r.returncode == 0, r.stderr
    files = sorted(p.name for p in (tmp_path / "1").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "2").iterdir()) and len(files) > 15
    for name in files:
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes(), name


# --- parameter importances -----------------------------------------------------------------------------
IMPORTANCE_SCRIPT = """
import optuna, sys
from optuna.distributions import IntDistribution
from phaze.report import StudyMeta, importances
optuna.logging.set_verbosity(optuna.logging.ERROR)
study = optuna.create_study(direction="maximize")
d = IntDistribution(0, 3)
for x in range(4):
    for y in range(4):
        for z in range(2):   # z changes nothing: every pair differing in z alone has the same value
            study.add_trial(optuna.trial.create_trial(params=dict(x=x, y=y, z=z), distributions=dict(x=d, y=d, z=d),
                                                      value=float(x + y), user_attrs=dict(feasible=True)))
meta = StudyMeta("t", ("throughput",), ("maximize",), (), (), (), (), "", (), (), 0, "tpe", 0)
imp, caption = importances(study, meta)
print(list(imp["throughput"]), caption)
"""


def test_importance_drops_a_parameter_without_effect_and_orders_ties_by_name(tmp_path):
    """x and y matter equally (ties, listed by name in every process, whatever its hash seed); z,
    whose values give identical throughput, is left out and named in the caption; 32 designs."""
    import os
    seen = set()
    for seed in range(6):
        r = subprocess.run([sys.executable, "-c", IMPORTANCE_SCRIPT], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONHASHSEED=str(seed), PYTHONPATH=str(ROOT)))
        assert r.returncode == 0, r.stderr
        seen.add(r.stdout.strip())
    assert len(seen) == 1, seen
    out = seen.pop()
    assert out.startswith("['x', 'y'] ") and "From 32 feasible designs" in out and "left out): z." in out
    assert "small sample" not in out


def test_importance_caption_warns_of_a_small_sample():
    from phaze.report import importance_caption
    assert "small sample" in importance_caption(12, [])
    text = importance_caption(40, ["hbm_gib"])
    assert "small sample" not in text and "hbm_gib" in text


# --- the browser -------------------------------------------------------------------------------------
def test_quickstart_report_in_headless_chromium(tmp_path):
    """The quick start's report.html in a real browser: no console error, no network request, the
    best-designs table and every plot in the DOM, and a screenshot that is not blank."""
    if find_chromium() is None:
        pytest.skip("chromium not found (Debian: apt-get install chromium; .ci/run installs it)")
    pytest.importorskip("websocket", reason="websocket-client is in the test extra")
    r = run_cli(tmp_path, "search", str(ROOT / "search" / "quickstart.yaml"), "--quiet")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "results" / "quickstart"
    page = out / "report.html"
    v = visit(page)
    assert v.console_errors == []
    assert v.network_requests(page.resolve().as_uri()) == []
    assert v.dom["title"] == "phaze search: quickstart"
    drawn = {f["name"]: f for f in v.dom["figures"]}
    expected = {p.stem for p in out.glob("*.png")}
    assert expected >= set(FIGURES) | {"importance", "infeasible", "gantt-bert-large"}
    assert set(drawn) == expected
    for name, f in drawn.items():
        assert (f["plotly"] and f["points"] > 0) or f["svg"], name
        assert f["height"] > 150, name
    trials = pd.read_csv(out / "trials.csv").set_index("trial")
    assert len(v.dom["bestRows"]) == 5
    top = trials[trials["feasible"]]["throughput"].max()
    assert v.dom["bestRows"][0][v.dom["bestHead"].index("tokens/s (geomean)")] == f"{top:,.0f}"
    assert "over TPUv4" in v.dom["answer"]
    from io import BytesIO

    from PIL import Image
    img = np.asarray(Image.open(BytesIO(v.screenshot_png)).convert("L"), dtype=float)
    assert img.shape[0] >= 1000 and img.shape[1] >= 1000
    assert img.std() > 20 and len(np.unique(img)) > 50 and (img < 128).mean() > 0.01
    assert html.escape("quickstart") in page.read_text()


# --- report errors: one line, exit status 2 ----------------------------------------------------------
def test_an_unwritable_out_is_one_line_and_exit_2(tmp_path, tiny):
    """A folder the report cannot write into: a file, a path through a file, a folder without
    write permission (as root, which ignores permissions, a path under /proc)."""
    import os
    (tmp_path / "afile").write_text("x\n")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    unwritable = "/proc/phaze-report-out" if os.geteuid() == 0 else str(locked / "out")
    for out, words in ((str(tmp_path / "afile"), "not a folder"), (str(tmp_path / "afile" / "sub"), "Not a directory"),
                       (unwritable, "cannot write into")):
        r = run_cli(tmp_path, "report", str(tiny[1]), "--out", out)
        assert r.returncode == 2 and r.stdout == "", (out, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        assert "--out" in r.stderr and words in r.stderr, r.stderr


def _copy_study(tiny, tmp_path: Path) -> Path:
    import shutil
    folder = tmp_path / "copy"
    folder.mkdir()
    shutil.copy(tiny[1] / "study.db", folder / "study.db")
    return folder


@pytest.mark.parametrize("key,value", [("config.objectives", 5), ("config.constraints", [1]), ("config.seed", "x"),
                                       ("config.weights", "abc"), ("baselines", "x"), ("sweep_skipped", [1])])
def test_hand_edited_study_attributes_are_one_line_and_exit_2(tmp_path, tiny, key, value):
    import json
    folder = _copy_study(tiny, tmp_path)
    con = sqlite3.connect(folder / "study.db")
    top, _, sub = key.partition(".")
    row = con.execute("SELECT value_json FROM study_user_attributes WHERE key=?", (top,)).fetchone()
    if sub:
        edited = dict(json.loads(row[0]), **{sub: value})
        con.execute("UPDATE study_user_attributes SET value_json=? WHERE key=?", (json.dumps(edited), top))
    else:
        con.execute("DELETE FROM study_user_attributes WHERE key=?", (top,))
        con.execute("INSERT INTO study_user_attributes (study_id, key, value_json) VALUES (1, ?, ?)",
                    (top, json.dumps(value)))
    con.commit()
    con.close()
    r = run_cli(tmp_path, "report", str(folder), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"study attribute {key}" in r.stderr and "allowed:" in r.stderr


def test_a_study_with_a_hot_rollback_journal_is_rolled_back_and_reported(tmp_path, tiny):
    """Its writer died mid-transaction, leaving study.db-journal: SQLite rolls it back (it needs a
    writable connection; read-only, the study was called 'not a study'), and the report is the
    one of the study before the transaction."""
    folder = _copy_study(tiny, tmp_path)
    writer = ("import os, sqlite3, sys\n"
              "con = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
              "con.execute('PRAGMA cache_size=1')\n"          # spill pages: the journal reaches the disk
              "con.execute('BEGIN')\n"
              "for i in range(50):\n"
              "    con.execute('UPDATE trial_user_attributes SET value_json = value_json')\n"
              "    con.execute('INSERT INTO study_user_attributes (study_id, key, value_json) VALUES (1, ?, ?)',\n"
              "                (f'junk{i}', '\"' + 'x' * 5000 + '\"'))\n"
              "os._exit(0)\n")                                 # dies mid-transaction
    subprocess.run([sys.executable, "-c", writer, str(folder / "study.db")], check=True, timeout=60)
    assert (folder / "study.db-journal").stat().st_size > 0
    r = run_cli(tmp_path, "report", str(folder), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "trials.csv").read_text() == (tiny[1] / "trials.csv").read_text()


def test_baseline_labels_are_placed_clear_of_markers_and_of_each_other():
    """A baseline near the right edge is labelled on its left unless that covers another marker
    (the best design's star): then another corner is taken. Two labels never overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from phaze.plots import _mpl, _place_labels
    fig = _mpl()(figsize=(5, 4))
    ax = fig.subplots()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    ax.scatter([7.2], [8.3], marker="*", s=260)                 # where the left label would go
    ax.scatter([9.0, 9.0], [8.0, 6.9], marker="^", s=70)       # two baselines close together
    _place_labels(fig, [(ax, "BASELINE-ONE", 9.0, 8.0, "k", True), (ax, "BASELINE-TWO", 9.0, 6.9, "k", True)])
    r = FigureCanvasAgg(fig).get_renderer()
    boxes = [t.get_window_extent(r) for t in ax.texts]
    star = ax.transData.transform([[7.2, 8.3]])[0]
    assert len(boxes) == 2 and not boxes[0].overlaps(boxes[1])
    for b in boxes:
        assert not b.padded(6).contains(*star)
        assert ax.get_window_extent(r).contains(b.x0, b.y0) and ax.get_window_extent(r).contains(b.x1, b.y1)


def test_drawing_processes_die_with_a_killed_parent(tmp_path):
    """kill -9 of a process drawing its figures in parallel leaves no drawer behind (one would
    hold the parent's output pipes open, and a caller reading them would wait for ever)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    script = tmp_path / "draw.py"
    script.write_text(
        "import time, sys\n"
        "from pathlib import Path\n"
        "import phaze.plots as P\n"
        "def slow(*a):\n"
        "    time.sleep(60)\n"
        "P.DRAW['slow'] = slow\n"
        "print('ready', flush=True)\n"
        f"P._draw_all([('a', 'slow', ()), ('b', 'slow', ())], Path({str(tmp_path)!r}), 2)\n")
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    children: list[int] = []
    for _ in range(100):                    # the drawers start on the first submit
        time.sleep(0.1)
        children = [int(c) for c in open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()]
        if len(children) == 2:
            break
    assert len(children) == 2
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    end = time.monotonic() + 5
    alive = children
    while alive and time.monotonic() < end:
        time.sleep(0.1)
        alive = [c for c in children if os.path.exists(f"/proc/{c}") and
                 open(f"/proc/{c}/stat").read().split(")")[1].split()[0] != "Z"]
    assert not alive, f"drawers {alive} outlived their parent"
    out, err = p.communicate(timeout=10)    # the pipes close: nobody holds them any more


def test_a_drawer_that_dies_leaves_the_figures_to_this_process(tmp_path, monkeypatch):
    """A drawing process that dies (the kernel's OOM killer, a crash in a native library) breaks
    the pool; the figures are then drawn here, and each one once."""
    import os

    import matplotlib.figure

    import phaze.plots as P
    parent = os.getpid()

    def fragile(label):
        if os.getpid() != parent:
            os._exit(1)
        fig = matplotlib.figure.Figure(figsize=(1, 1))
        fig.add_subplot().set_title(label)
        return fig
    monkeypatch.setitem(P.DRAW, "fragile", fragile)
    files = P._draw_all([("a", "fragile", ("a",)), ("b", "fragile", ("b",))], tmp_path, 2)
    assert set(files) == {"a", "b"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png", "a.svg", "b.png", "b.svg"]


@pytest.mark.parametrize("table,column,junk", [("study_user_attributes", "value_json", "1e999"),
                                               ("trial_user_attributes", "value_json", "1e999"),
                                               ("trial_user_attributes", "value_json", "1.5"),
                                               ("trial_values", "value", "NaN"),
                                               ("trial_params", "param_value", "-1"),
                                               ("study_directions", "direction", "MAXIM8ZE")])
def test_a_damaged_trial_is_one_line_and_exit_2(tmp_path, tiny, table, column, junk):
    """Values of trials damaged or edited by hand (the fuzz benchmark's report surface found
    tracebacks): one line naming the study, exit status 2, or a report when the value is harmless."""
    folder = _copy_study(tiny, tmp_path)
    con = sqlite3.connect(folder / "study.db")
    con.execute(f"UPDATE {table} SET {column} = ?", (junk,))
    con.commit()
    con.close()
    r = run_cli(tmp_path, "report", str(folder), "--out", str(tmp_path / "out"))
    assert r.returncode in (0, 2) and "Traceback" not in r.stderr, r.stderr
    if r.returncode == 2:
        assert len(r.stderr.strip().splitlines()) == 1 and str(folder) in r.stderr, r.stderr


def test_a_study_name_that_cannot_name_a_folder_is_one_line(tmp_path):
    for name in ("x" * 300, "../up", "a/b", ""):
        r = run_cli(tmp_path, "report", "--storage", "sqlite:///nothing.db", "--study", name)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--study" in r.stderr, r.stderr
        assert not (tmp_path / "nothing.db").exists()


def test_a_damaged_database_is_one_line_and_exit_2(tmp_path, tiny, monkeypatch, capsys):
    """A study.db with damaged bytes can fail inside Optuna's storage (the fuzz benchmark found a
    StorageInternalError on commit): one line naming the study, exit status 2."""
    import optuna

    from phaze import cli

    def broken(*args, **kwargs):
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.")
    monkeypatch.setattr(cli, "write_study_files", broken)
    folder = _copy_study(tiny, tmp_path)
    assert cli.main(["report", str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(folder) in err and "StorageInternalError" in err, err
