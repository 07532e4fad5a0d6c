"""Sweep configs, the chip builder, the Pareto set and the search as a user runs it.

The end-to-end studies use a GPU template (kernels run one after another, so no CP-SAT solve)
and a small model, so that each design evaluates in a fraction of a second.
"""
from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import SMALL_SWEEP
from hypothesis import given, settings
from hypothesis import strategies as st

from phaze.arch import load_chip
from phaze.area import silicon
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.report import pareto_mask
from phaze.search import _optuna, make_storage, search, set_user_attrs, sweep
from phaze.space import build_chip, chip_values, load_sweep

ROOT = Path(__file__).resolve().parent.parent

SMALL = SMALL_SWEEP


def write(tmp_path: Path, cfg: dict, name: str = "sweep.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg))
    return p


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phaze.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


# --- the config ------------------------------------------------------------------------------------
def test_ranges_expand_as_written(tmp_path):
    cfg = dict(SMALL, space={"tensor_units": {"low": 3, "high": 40, "log2": True},
                             "hbm_gib": {"low": 16, "high": 40, "step": 8},
                             "tensor_rows": 32, "tensor_cols": "tensor_rows * 2"})
    c = load_sweep(write(tmp_path, cfg))
    dims = {d.key: d for d in c.dimensions}
    assert dims["tensor_units"].values == (4.0, 8.0, 16.0, 32.0)
    assert dims["tensor_units"].choices == (2, 3, 4, 5)          # the sampler sees exponents
    assert dims["hbm_gib"].values == (16.0, 24.0, 32.0, 40.0)
    assert dims["tensor_rows"].fixed
    lists = load_sweep(write(tmp_path, dict(SMALL, space={"vector_units": [4, 1, 2], "hbm_gib": [16, 48, 80]}),
                             "lists.yaml"))
    ld = {d.key: d for d in lists.dimensions}
    assert ld["vector_units"].log2 and ld["vector_units"].choices == (0, 1, 2)   # ordered for the sampler
    assert not ld["hbm_gib"].log2 and ld["hbm_gib"].choices == (16.0, 48.0, 80.0)
    assert c.grid_size() == 16
    v = c.values({"log2_tensor_units": 3, "hbm_gib": 24.0})
    assert v["tensor_units"] == 8 and v["tensor_cols"] == 64 and v["hbm_gib"] == 24


def test_template_round_trips_through_the_builder():
    """A chip rebuilt from its own parameters has the same peak, memory and links."""
    for name in ("tpuv4", "a100-80gb", "h100-sxm"):
        base = load_chip(name)
        c = build_chip(base, chip_values(base))
        assert c.implied_peak_flops_per_s == pytest.approx(base.implied_peak_flops_per_s)
        assert c.peak_flops("bf16") == pytest.approx(base.peak_flops("bf16"))
        assert c.hbm_bytes == pytest.approx(base.hbm_bytes)
        assert c.shared_buffer_bandwidth_bytes_per_s == pytest.approx(base.shared_buffer_bandwidth_bytes_per_s)
        assert [lv.bandwidth_bytes_per_s for lv in c.links] == pytest.approx(
            [lv.bandwidth_bytes_per_s for lv in base.links])


def test_builder_scales_what_follows_from_the_units():
    base = load_chip("tpuv4")
    c = build_chip(base, {"tensor_units": 16, "tensor_rows": 64, "clock_ghz": 2.1,
                          "link_bandwidth_gb_per_s": 100})
    # 16 x 64 x 128 MACs at 2.1 GHz, 2 FLOP each
    assert c.implied_peak_flops_per_s == pytest.approx(2 * 16 * 64 * 128 * 2.1e9)
    # the shared buffer feeds each array row the same bytes per clock as on the template
    per_row = base.shared_buffer_bandwidth_bytes_per_s / (8 * 128 * 1.05e9)
    assert c.shared_buffer_bandwidth_bytes_per_s == pytest.approx(per_row * 16 * 64 * 2.1e9)
    assert c.links[0].bandwidth_bytes_per_s == pytest.approx(100e9)
    assert c.area_mm2 is None and c.tdp_w is None


BAD = [
    ({"space": {"tensor_unit": [1, 2]}}, "space.tensor_unit", "unknown parameter"),
    ({"space": {"tensor_units": []}}, "space.tensor_units", "empty list"),
    ({"space": {"tensor_units": {"low": 64, "high": 8, "log2": True}}}, "space.tensor_units", "reversed range"),
    ({"space": {"tensor_units": {"low": 5, "high": 7, "log2": True}}}, "space.tensor_units", "empty range"),
    ({"space": {"tensor_units": {"low": 1, "high": 8}}}, "space.tensor_units", "needs 'step'"),
    ({"space": {"tensor_units": 8}}, "space", "nothing to search"),
    ({"space": {"tensor_units": [8, 16], "tensor_rows": "tensor_colz"}}, "space.tensor_rows", "unknown parameter"),
    ({"objectives": ["throughput", "speed"]}, "objectives", "unknown objective"),
    ({"constraints": {"area_mm": 600}}, "constraints.area_mm", "unknown constraint"),
    ({"sampler": "annealing"}, "sampler", "must be one of"),
    ({"workloads": [{"workload": "mpt-125m", "devices": -8, "global_batch": 16}]}, "workloads[0].devices",
     "positive integer"),
]


@pytest.mark.parametrize("change,field,words", BAD)
def test_bad_sweep_configs_name_the_field(tmp_path, change, field, words):
    with pytest.raises(ConfigError) as e:
        load_sweep(write(tmp_path, dict(SMALL, **change)))
    assert e.value.field == field and words in e.value.message


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    """The CLI as a user meets it: unreachable budget, storage and --trials 0."""
    cases = [
        (["search", str(write(tmp_path, dict(SMALL, constraints={"area_mm2": 1}), "budget.yaml"))],
         "constraints.area_mm2"),
        (["search", str(write(tmp_path, SMALL)), "--storage", "nosuchdb://x/y"], "--storage"),
        (["search", str(write(tmp_path, SMALL)), "--trials", "0"], "--trials"),
        (["search", str(tmp_path / "missing.yaml")], "file not found"),
        (["search", str(write(tmp_path, dict(SMALL, objectives=["fast"]), "objective.yaml"))], "objectives"),
    ]
    for args, words in cases:
        r = run_cli(tmp_path, *args)
        assert r.returncode == 2, (args, r.stderr)
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert words in r.stderr and "Traceback" not in r.stderr


# --- the Pareto set ----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=25),
       st.sampled_from([("maximize", "minimize"), ("maximize", "maximize"), ("minimize", "minimize")]))
def test_pareto_mask_matches_brute_force(points, directions):
    v = np.array(points, dtype=float)
    sign = np.array([1 if d == "maximize" else -1 for d in directions])

    def dominated(i):
        return any(all(sign * v[j] >= sign * v[i]) and any(sign * v[j] > sign * v[i])
                   for j in range(len(v)) if j != i)
    assert list(pareto_mask(v, directions)) == [not dominated(i) for i in range(len(v))]


# --- studies ----------------------------------------------------------------------------------------
def test_a_recalibrated_phaze_does_not_resume_an_old_study(tmp_path, monkeypatch):
    """The fingerprint holds the calibrated parameters: trials scored by other parameters are not
    mixed into a resumed study; resuming with the same ones is allowed."""
    from phaze import space
    from phaze.calibrate import load_default_params
    cfg = load_sweep(write(tmp_path, SMALL))
    before = cfg.fingerprint()
    assert before == load_sweep(write(tmp_path, SMALL)).fingerprint()
    shipped = load_default_params()
    changed = {fam: replace(e, tensor_fraction=e.tensor_fraction * 0.9) for fam, e in shipped.items()}
    monkeypatch.setattr(space, "load_default_params", lambda: changed)   # as space reads it
    assert cfg.fingerprint() != before


def test_search_resumes_to_exactly_n_distinct_trials(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_sweep(write(tmp_path, SMALL))
    first = search(replace(cfg, trials=3), progress=False)
    assert first.complete == 3
    res = search(cfg, progress=False)                 # the same command, a larger total
    assert res.complete == 4
    again = search(cfg, progress=False)               # nothing left to do
    assert again.complete == 4
    trials = pd.read_csv(res.out_dir / "trials.csv")
    done = trials[trials["state"] == "COMPLETE"]
    assert len(done) == 4
    keys = [tuple(r) for r in done[[c for c in done.columns if c.startswith("param:")]].to_numpy()]
    assert len(set(keys)) == len(keys)               # no design evaluated twice
    assert str(res.out_dir) == str(Path("results") / "tiny")
    # the template (A100-80GB snapped into the space) was the first trial
    first_row = trials.sort_values("trial").iloc[0]
    assert first_row["chip:tensor_units"] == 108 and first_row["chip:hbm_gib"] == 80
    assert first_row["template"] == "A100-SXM4-80GB"


def test_a_retry_queued_after_the_last_trial_is_settled_as_surplus(tmp_path, monkeypatch):
    """Optuna fails a dead worker's trial and queues its retry in two steps; when the other
    workers fill the total in between, the retry would stay WAITING for ever. The worker that
    finds the total reached prunes it as surplus, so every trial ends saying why."""
    import optuna

    from phaze.search import open_study
    monkeypatch.chdir(tmp_path)
    cfg = load_sweep(write(tmp_path, SMALL))
    res = search(replace(cfg, trials=3), progress=False)
    study = open_study(cfg, res.storage, res.study_name, create=False)
    study.enqueue_trial({"tensor_units": 27, "hbm_gib": 40}, skip_if_exists=False)   # the late retry
    again = search(replace(cfg, trials=3), progress=False)
    assert again.complete == 3
    states = optuna.trial.TrialState
    trials = open_study(cfg, res.storage, res.study_name, create=False).get_trials(deepcopy=False)
    assert not [t for t in trials if t.state == states.WAITING]
    late = trials[-1]
    assert late.state == states.PRUNED and late.user_attrs.get("surplus")


def test_pareto_csv_is_the_non_dominated_feasible_set_of_trials_csv(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_sweep(write(tmp_path, SMALL))
    areas = sorted(silicon(build_chip(cfg.base, cfg.values(dict(zip(cfg.grid(), c, strict=True))))).area_mm2
                   for c in itertools.product(*cfg.grid().values()))
    distinct = sorted(set(areas))
    budget = (distinct[len(distinct) // 2 - 1] + distinct[len(distinct) // 2]) / 2   # some are over it
    within = sum(a <= budget for a in areas)
    assert 0 < within < len(areas)
    cfg = load_sweep(write(tmp_path, dict(SMALL, constraints={"area_mm2": budget}, trials=6)))
    res = sweep(cfg, progress=False)
    trials = pd.read_csv(res.out_dir / "trials.csv")
    front = pd.read_csv(res.out_dir / "pareto.csv")
    ok = trials[(trials["state"] == "COMPLETE") & trials["feasible"]]
    obj = ok[["throughput", "area"]].to_numpy()
    expected = set()
    for i, (t, a) in enumerate(obj):
        if not any((t2 >= t and a2 <= a) and (t2 > t or a2 < a) for t2, a2 in obj):
            expected.add(int(ok.iloc[i]["trial"]))
    assert set(front["trial"]) == expected and expected
    # every infeasible design says why, and the sweep did not evaluate those over the area budget
    bad = trials[(trials["state"] == "COMPLETE") & ~trials["feasible"]]
    assert all(isinstance(r, str) and r for r in bad["reason"])
    assert len(trials) == within and (trials["area_mm2"] <= budget).all()
    report = (res.out_dir / "report.md").read_text()
    assert "not evaluated by the sweep" in report
    for f in ("trials.csv", "pareto.csv", "baselines.csv", "report.md"):
        assert "/tmp" not in (res.out_dir / f).read_text() and str(tmp_path) not in (res.out_dir / f).read_text()


def test_sweep_orders_largest_area_first_and_covers_the_grid(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_sweep(write(tmp_path, SMALL))
    res = sweep(cfg, progress=False)
    trials = pd.read_csv(res.out_dir / "trials.csv").sort_values("trial")
    assert len(trials) == cfg.grid_size() == 6
    assert list(trials["area_mm2"]) == sorted(trials["area_mm2"], reverse=True)
    combos = set(itertools.product([27, 54, 108], [40, 80]))
    assert {(r["param:tensor_units"], r["param:hbm_gib"]) for _, r in trials.iterrows()} == combos
    assert {(r["chip:tensor_units"], r["chip:hbm_gib"]) for _, r in trials.iterrows()} == combos
    # more tensor units at the same memory never lowers the throughput on this small model
    for hbm in (40, 80):
        t = trials[trials["chip:hbm_gib"] == hbm].sort_values("chip:tensor_units")["throughput"]
        assert list(t) == sorted(t)


def test_infeasible_trials_carry_their_reason(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = dict(SMALL, workloads=[{"workload": "gpt3-175b", "devices": 8, "global_batch": 8,
                                  "placement": {"tp": [8], "mbs": [1], "pp": [1], "recompute": ["full"]}}],
               trials=2, objectives=["throughput"])
    res = search(load_sweep(write(tmp_path, cfg)), progress=False)
    trials = pd.read_csv(res.out_dir / "trials.csv")
    done = trials[trials["state"] == "COMPLETE"]
    assert not done["feasible"].any()
    name = load_model("gpt3-175b").name
    assert all(f"{name}: nothing fits" in r and "GiB per device" in r for r in done["reason"])
    assert all(k == f"no plan fits {name}" for k in done["reason_kinds"])


def test_shipped_sweep_configs_load_and_the_paper_budget_is_its_tpuv4_like_point():
    configs = {p.stem: load_sweep(p) for p in sorted((ROOT / "search").glob("*.yaml"))}
    assert {"quickstart", "phaze-paper", "llm-2026"} <= set(configs)
    paper = configs["phaze-paper"]
    assert [w.model.name for w in paper.workloads] == [load_model(n).name for n in
                                                       ("bert-large", "gpt2-xl", "opt-350m", "llama2-7b", "gpt3-175b")]
    assert all(w.devices == 1024 and w.global_batch == 4096 for w in paper.workloads)
    point = {"tensor_units": 8, "tensor_rows": 128, "tensor_cols": 128, "vector_units": 2, "vector_lanes": 128,
             "local_sram_kib": 128 * 128 / 64, "shared_buffer_mib": 128, "hbm_gib": 32, "clock_ghz": 1.05}
    area = silicon(build_chip(paper.base, point)).area_mm2
    budget = dict(paper.constraints)
    assert budget["area_mm2"] == pytest.approx(area, abs=0.5) and budget["area_mm2"] >= area
    assert budget["min_area_mm2"] == pytest.approx(0.3 * area, abs=0.5)
    # the paper's space: 13 x 8 x 8 x 13 x 7 x 3 powers-of-two points
    assert paper.grid_size() == 13 * 8 * 8 * 13 * 7 * 3
    llm = configs["llm-2026"]
    assert llm.objectives == ("throughput", "power", "cost")
    assert {w.devices for w in llm.workloads} == {1024, 4096, 16384}
    # docs/search.md's table counts each shipped space; llm-2026's clocks stop at the top of the V-f curve
    rows = {line.split("|")[1].strip(): line for line in (ROOT / "docs" / "search.md").read_text().splitlines()
            if line.startswith("| `search/")}
    for name, cfg in configs.items():
        assert rows[f"`search/{name}.yaml`"].endswith(f"| {cfg.grid_size():,} designs |")


def test_the_same_seed_gives_the_same_trials(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_sweep(write(tmp_path, dict(SMALL, sampler="tpe", trials=5, objectives=["throughput"])))
    runs = []
    for name in ("first", "second"):
        res = search(cfg, study_name=name, progress=False)
        t = pd.read_csv(res.out_dir / "trials.csv").sort_values("trial")
        runs.append([tuple(r) for r in t[[c for c in t.columns if c.startswith("param:")]].to_numpy()])
    assert runs[0] == runs[1] and len(set(runs[0])) == 5


@pytest.mark.parametrize("sampler", ["tpe", "random", "nsga2"])
def test_samplers_never_repropose_a_design(tmp_path, sampler):
    """Every sampler of phaze search proposes each design of the space at most once, whatever its
    values: on a 12-design space, 12 asks give the 12 designs (before the wrapper, TPE repeated
    evaluated designs in up to 45 % of its proposals)."""
    from phaze.search import _key, _optuna, make_sampler
    optuna = _optuna()
    cfg = load_sweep(write(tmp_path, dict(SMALL, space={"tensor_units": [27, 54, 108], "hbm_gib": [40, 80],
                                                        "vector_units": [1, 2]}, sampler=sampler,
                                          objectives=["throughput"])))
    study = optuna.create_study(direction="maximize", sampler=make_sampler(cfg))
    keys = []
    for k in range(cfg.grid_size()):
        t = study.ask()
        keys.append(_key({d.param: d.suggest(t) for d in cfg.searched}))
        study.tell(t, float(k % 3))          # flat values: a sampler left alone repeats itself
    assert len(set(keys)) == cfg.grid_size() == 12


def test_trials_csv_says_which_designs_were_evaluated(tmp_path):
    """A design over the area budget is recorded unevaluated: `evaluated` false, no throughput or
    power (never a 0 that could read as a result), its area given; the report counts only the
    evaluated designs."""
    from phaze.search import _key, open_study
    probe = load_sweep(write(tmp_path, SMALL, "probe.yaml"))
    areas = sorted(silicon(build_chip(probe.base, probe.values(dict(zip(probe.grid(), c, strict=True))),
                                      probe.process_node_nm)).area_mm2
                   for c in itertools.product(*probe.grid().values()))
    budget = (areas[1] + areas[2]) / 2
    n_over = sum(a > budget for a in areas)
    assert 0 < n_over < 6
    cfg = load_sweep(write(tmp_path, dict(SMALL, constraints={"area_mm2": budget},
                                          objectives=["throughput"], sampler="grid", trials=6)))
    url = f"sqlite:///{tmp_path / 'tiny' / 'study.db'}"
    res = search(cfg, storage=url, progress=False)
    t = pd.read_csv(res.out_dir / "trials.csv")
    done = t[t["state"] == "COMPLETE"]
    over = done[~done["evaluated"]]
    assert len(over) == n_over and len(done) == 6
    assert over["throughput"].isna().all() and over["power_w"].isna().all()
    assert (over["area_mm2"] > budget).all()
    report = (res.out_dir / "report.md").read_text()
    assert (f"{6 - n_over} designs evaluated (" in report
            and f"{n_over} more proposed over a budget and not evaluated" in report)
    study = open_study(cfg, url, "tiny", create=False, heartbeat=False)
    assert len({_key(tr.params) for tr in study.trials}) == 6


def test_each_study_writes_into_its_own_folder():
    from phaze.search import study_dir
    assert study_dir("sqlite:///results/a/study.db", "a") == Path("results/a")
    assert study_dir("sqlite:///results/shared.db", "a") == Path("results/a")
    assert study_dir("sqlite:///results/shared.db", "b") == Path("results/b")
    assert study_dir("journal:///x/log.jsonl", "c") == Path("x/c")
    assert study_dir("postgresql://u@h/db", "d") == Path("results/d")


def test_report_names_the_real_storage_and_how_designs_were_chosen(tmp_path):
    from phaze.report import sampler_phrase, storage_hint, study_meta
    from phaze.search import open_study, sweep
    cfg = load_sweep(write(tmp_path, dict(SMALL, objectives=["throughput"])))
    url = f"sqlite:///{tmp_path / 'store' / 'many.db'}"
    res = sweep(cfg, storage=url, study_name="mine", progress=False, write=False)
    study = open_study(cfg, url, res.study_name, create=False, heartbeat=False)
    assert storage_hint(study) in (f"sqlite:///{(tmp_path / 'store' / 'many.db').relative_to(Path.cwd())}"
                                   if (tmp_path).is_relative_to(Path.cwd()) else "sqlite:///many.db",)
    phrase = sampler_phrase(study_meta(study))
    assert "phaze sweep" in phrase and "random" not in phrase.lower()


def test_no_figures_writes_the_tables_and_report_md_and_phaze_report_draws_the_rest(tmp_path, monkeypatch, capsys):
    """``--no-figures`` (a fleet's workers): the tables and report.md, no report.html and no
    figure, and the summary says how to get them; ``phaze report`` then draws them, and its
    tables are the search's."""
    from phaze.cli import main
    monkeypatch.chdir(tmp_path)
    config = write(tmp_path, dict(SMALL, trials=2))
    assert main(["search", str(config), "--quiet", "--no-figures"]) == 0
    out = tmp_path / "results" / "tiny"
    assert {"trials.csv", "pareto.csv", "baselines.csv", "report.md"} <= {p.name for p in out.iterdir()}
    assert not list(out.glob("*.png")) and not (out / "report.html").exists()
    assert "(report.html and figures: phaze report results/tiny, or the next run)" in capsys.readouterr().out
    trials = (out / "trials.csv").read_text()
    assert main(["report", "results/tiny"]) == 0
    assert (out / "report.html").exists() and list(out.glob("*.png")) and (out / "trials.csv").read_text() == trials


# --- interruptions ---------------------------------------------------------------------------------
# a TPU-like template: every design needs CP-SAT solves, after which OR-Tools used to leave Ctrl-C
# to the default handler (death by the signal: the trial left RUNNING, a partial report)
INTERRUPTED = {
    "name": "intr", "base": "tpuv4",
    "workloads": [{"workload": "bert-large", "devices": 8, "global_batch": 64,
                   "placement": {"tp": [1, 2], "pp": [1], "recompute": ["none"]}}],
    "space": {"tensor_units": [4, 8, 16, 32, 64], "tensor_rows": [64, 128], "tensor_cols": "tensor_rows",
              "vector_units": [1, 2, 4]},
    "objectives": ["throughput"], "sampler": "tpe", "trials": 10, "seed": 1, "baselines": [],
}


def test_a_ctrl_c_while_the_files_are_written_waits_for_them(tmp_path, monkeypatch):
    """A Ctrl-C whose handler runs after the search loop has stopped (Ctrl-C ends the CP-SAT solve
    in hand, which can stop the loop before Python runs the handler) or a second Ctrl-C lands
    while the study's files are written: they are written whole, then the search ends as
    interrupted. Before, the handler's KeyboardInterrupt cut the writing short and ended the
    command as a bare 'phaze: interrupted' (seen once in .ci/run)."""
    import os
    import signal
    import time

    from phaze import search as S
    real, seen = S.write_study_files, []

    def ctrl_c_then_write(*args, **kw):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)            # the handler runs here, between bytecodes
        seen.append(kw.get("figures"))
        return real(*args, **kw)
    monkeypatch.setattr(S, "write_study_files", ctrl_c_then_write)
    cfg = load_sweep(write(tmp_path, SMALL))
    url = f"sqlite:///{tmp_path / 'late.db'}"
    before = signal.signal(signal.SIGINT, signal.default_int_handler)   # whatever an earlier test left
    with pytest.raises(S.SearchInterrupted) as stop:
        search(cfg, storage=url, study_name="late", progress=False)
    assert stop.value.result.complete == SMALL["trials"] and seen == [True]
    trials = pd.read_csv(stop.value.result.out_dir / "trials.csv")
    assert len(trials) >= SMALL["trials"] and (stop.value.result.out_dir / "report.md").exists()
    assert signal.signal(signal.SIGINT, before) is signal.default_int_handler     # restored


@pytest.mark.parametrize("ctrl_c", [False, True])
def test_a_trial_another_worker_finished_first_is_no_traceback(tmp_path, monkeypatch, ctrl_c):
    """Two workers can take one queued trial (SQLite); when the other finishes it while this one
    evaluates, this one's tell finds it finished: Optuna's check raises ValueError here, and the
    storage UpdateFinishedTrialError when the other finishes it between that check and the write
    (a worker's traceback, seen once in .ci/run under Ctrl-C with --jobs 3). Without a Ctrl-C the
    worker carries on to the study's total; with one that ended the trial, the interruption is not
    lost (before, the worker carried on after it): KeyboardInterrupt."""
    import optuna

    from phaze import search as S
    cfg = load_sweep(write(tmp_path, SMALL))
    study = S.open_study(cfg, f"sqlite:///{tmp_path / 'race.db'}", "race")
    real, first = S.record, []

    def finished_elsewhere(trial, *args):
        if not first:
            first.append(trial.number)
            study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
            if ctrl_c:
                raise KeyboardInterrupt
        return real(trial, *args)
    monkeypatch.setattr(S, "record", finished_elsewhere)
    if ctrl_c:
        with pytest.raises(KeyboardInterrupt):
            S.drive(study, cfg)
    else:
        S.drive(study, cfg)
        assert sum(t.state.name == "COMPLETE" for t in study.get_trials()) == cfg.trials
    assert study.get_trials()[first[0]].state.name == "FAIL"


def _states(url: str, name: str) -> list[str]:
    import optuna
    return [t.state.name for t in optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)]


def _interrupted(argv, cwd, env, url: str, name: str):
    """Run ``argv``, send SIGINT once its study holds two complete trials; (process, stdout,
    stderr, seconds from the signal to the exit)."""
    import signal
    import time
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            if _states(url, name).count("COMPLETE") >= 2:
                break
        except Exception:            # the study is not there yet
            pass
        assert p.poll() is None, p.communicate()
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = p.communicate(timeout=60)
    return p, out, err, time.monotonic() - sent


@pytest.mark.parametrize("jobs", [1, 3])
def test_ctrl_c_prints_the_best_so_far_exits_130_and_the_same_command_resumes(tmp_path, jobs):
    import os
    config = write(tmp_path, INTERRUPTED)
    env = dict(os.environ, PHAZE_CACHE_DIR=str(tmp_path / "cache"))      # solves, not cache hits
    argv = [sys.executable, "-m", "phaze.cli", "search", str(config), "--quiet", "--jobs", str(jobs)]
    url = f"sqlite:///{tmp_path / 'results' / 'intr' / 'study.db'}"
    p, out, err, waited = _interrupted(argv, tmp_path, env, url, "intr")
    assert p.returncode == 130, err
    assert waited < 5, waited            # 0.3 s (one process), 0.8 s (--jobs 3) on an idle machine
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "interrupted" in err and "the same command resumes" in err
    assert "designs evaluated" in out and "  trial " in out                   # the best designs so far
    states = _states(url, "intr")
    assert "RUNNING" not in states and states.count("COMPLETE") >= 2
    assert (tmp_path / "results" / "intr" / "trials.csv").exists()
    again = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert _states(url, "intr").count("COMPLETE") == INTERRUPTED["trials"]


def test_ctrl_c_stops_a_sweep_like_a_search_and_the_same_command_resumes(tmp_path):
    """``phaze sweep`` under Ctrl-C, as ``phaze search``: exit 130 with the best designs so far and
    the resume line, no traceback, the tables written; before, a bare 'phaze: interrupted'."""
    import os
    # 16 designs: with 12, a one-core CI machine once finished them all before the signal landed
    config = write(tmp_path, dict(INTERRUPTED, space={**INTERRUPTED["space"], "tensor_units": [4, 8, 16, 32],
                                                       "vector_units": [1, 2]}))
    env = dict(os.environ, PHAZE_CACHE_DIR=str(tmp_path / "cache"))      # solves, not cache hits
    argv = [sys.executable, "-m", "phaze.cli", "sweep", str(config), "--quiet"]
    url = f"sqlite:///{tmp_path / 'results' / 'intr-sweep' / 'study.db'}"
    p, out, err, _ = _interrupted(argv, tmp_path, env, url, "intr-sweep")
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "sweep interrupted" in err and "the same command resumes" in err
    assert "designs evaluated" in out and "  trial " in out                   # the best designs so far
    states = _states(url, "intr-sweep")
    assert "RUNNING" not in states and 2 <= states.count("COMPLETE") < 16
    assert (tmp_path / "results" / "intr-sweep" / "trials.csv").exists()
    again = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert _states(url, "intr-sweep").count("COMPLETE") == 16


@pytest.mark.parametrize("url", ["sqlite:///{d}/s.db", "journal:///{d}/s.log"])
def test_a_trials_attributes_are_written_at_once_and_read_back_the_same(tmp_path, url):
    """set_user_attrs writes a trial's attributes in one transaction on a database (one call
    each elsewhere): read back from the storage, and from the trial in hand, they equal what the
    one-at-a-time path writes."""
    optuna = _optuna()
    study = optuna.create_study(storage=make_storage(url.format(d=tmp_path), heartbeat=False),
                                study_name="attrs")
    attrs = {"chip": {"tensor_units": 8.0}, "feasible": True, "reason": "", "workloads": [{"a": 1.5}],
             "clock_hz": None, "throttled": [], "eval_time_s": 0.25}
    one, both = study.ask(), study.ask()
    for k, value in attrs.items():
        one.set_user_attr(k, value)
    set_user_attrs(both, attrs)
    set_user_attrs(both, {"reason": "over the area budget"})        # an upsert: the last write wins
    stored = {t.number: t.user_attrs for t in study.get_trials(deepcopy=False)}
    assert stored[one.number] == attrs
    assert stored[both.number] == dict(attrs, reason="over the area budget") == both.user_attrs


@pytest.mark.parametrize("written", [("fingerprint",), ("config",), ()])
def test_a_study_whose_creator_was_killed_before_it_was_whole_resumes(tmp_path, written):
    """A kill between the creating process's writes leaves a study with some of its attributes (the
    fingerprint without the config, with the old order of writes; the config alone; nothing): the
    next sweep completes it and writes its report, which reads the config."""
    cfg = load_sweep(write(tmp_path, SMALL))
    url = f"sqlite:///{tmp_path}/study.db"
    optuna = _optuna()
    study = optuna.create_study(study_name="tiny-sweep", storage=make_storage(url, heartbeat=False),
                                directions=cfg.directions)
    if "fingerprint" in written:
        study.set_user_attr("fingerprint", cfg.fingerprint())
    if "config" in written:
        study.set_user_attr("config", {"sampler": "sweep"})
    res = sweep(cfg, storage=url, limit=2, write=True)
    attrs = optuna.load_study(study_name="tiny-sweep", storage=make_storage(url, heartbeat=False)).user_attrs
    assert attrs["fingerprint"] == cfg.fingerprint()
    assert attrs["config"]["objectives"] == list(cfg.objectives) and attrs["config"]["sampler"] == "sweep"
    assert res.complete == 2 and (tmp_path / "tiny-sweep" / "report.md").is_file()
