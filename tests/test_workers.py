"""Many workers, one study: PostgreSQL (a throwaway server) and the default SQLite file, with
workers killed by SIGKILL in the middle of a search.

The invariants: the study ends with exactly the requested number of COMPLETE trials, no design
is evaluated twice (repeat proposals are pruned unevaluated), the template is enqueued once
however many workers start together, and the report rebuilt from the storage equals the one the
run wrote. Bad storage is one line and exit status 2 within 10 s, and writes nothing.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import sqlalchemy.exc
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from postgres import cluster, find_bin  # noqa: E402

# GPU template (no CP-SAT) and three workloads: about 0.4 s per design on one core (GPT-3 175B on
# 1,024 chips in their place took 0.5 s of the 1 s a design took, with nothing the tests look at)
CONFIG = {
    "name": "workers",
    "base": "a100-80gb",
    "workloads": [{"workload": "gpt2-xl", "devices": 64, "global_batch": 512},
                  {"workload": "llama2-7b", "devices": 64, "global_batch": 256},
                  {"workload": "mpt-1b", "devices": 64, "global_batch": 256}],
    "space": {"tensor_units": [27, 54, 81, 108, 135], "hbm_gib": [40, 80], "clock_ghz": [1.0, 1.2, 1.41]},
    "objectives": ["throughput"],
    "sampler": "random",
    "trials": 14,
    "seed": 5,
}


# the same workloads each on one layout, and no figures (--no-figures): where no worker is killed
# mid-search, the races are over creating the study, enqueueing the template and taking the last
# trials, which quicker designs (about 0.1 s each, not 2 s) make more frequent, not less
ONE_LAYOUT = [dict(w, placement={"tp": [1], "pp": [1], "mbs": [2], "recompute": ["none"]})
              for w in CONFIG["workloads"]]


@pytest.fixture(scope="module")
def pg_url():
    if not (find_bin("initdb") and find_bin("pg_ctl")):
        pytest.skip("PostgreSQL server binaries not found (.ci/run installs Debian's postgresql package)")
    with cluster() as (url, _):
        yield url


def _config(tmp_path: Path, **changes) -> Path:
    p = tmp_path / "workers.yaml"
    p.write_text(yaml.safe_dump(dict(CONFIG, **changes)))
    return p


def _worker(tmp_path: Path, config: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "phaze.cli", "search", str(config), "--quiet",
                             "--grace-period", "3", *extra], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _trials(storage: str, name: str):
    from phaze.search import make_storage, postgres_driver_url
    st = make_storage(storage, heartbeat=False) if storage.startswith("journal:///") else postgres_driver_url(storage)
    return optuna.load_study(study_name=name, storage=st).get_trials(deepcopy=False)


def _wait_complete(storage: str, name: str, n: int, procs, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if sum(t.state.name == "COMPLETE" for t in _trials(storage, name)) >= n:
                return
        except Exception:       # the study (or its file) is not there yet
            pass
        assert any(p.poll() is None for p in procs), "every worker ended early"
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} complete trials after {timeout} s")


def _check_study(storage: str, name: str, total: int) -> None:
    trials = _trials(storage, name)
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(complete) == total
    designs = [tuple(sorted(t.params.items())) for t in complete]
    assert len(set(designs)) == len(designs)                      # no design evaluated twice
    assert sum(t.user_attrs.get("template") is not None for t in complete) == 1
    for t in trials:                                              # what was not completed says why
        assert t.state.name in ("COMPLETE", "PRUNED", "FAIL"), t.state
        if t.state.name == "PRUNED":          # a repeat, or a trial started past --trials
            assert "duplicate_of" in t.user_attrs or t.user_attrs.get("surplus")


def _same_report(tmp_path: Path, storage_args: list[str], written: Path) -> None:
    out = tmp_path / "rebuilt"
    r = subprocess.run([sys.executable, "-m", "phaze.cli", "report", *storage_args, "--out", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for f in ("trials.csv", "pareto.csv", "baselines.csv", "report.md"):
        assert (out / f).read_text() == (written / f).read_text(), f


def test_three_workers_on_postgres_survive_a_kill_9(tmp_path, pg_url):
    config = _config(tmp_path)
    args = ["--storage", pg_url, "--study", "shared"]
    procs = [_worker(tmp_path, config, *args) for _ in range(3)]
    _wait_complete(pg_url, "shared", 4, procs)
    procs[0].send_signal(signal.SIGKILL)                          # a worker dies mid-search
    procs[0].wait(timeout=30)
    procs.append(_worker(tmp_path, config, *args))                # and is replaced
    for p in procs[1:]:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    _check_study(pg_url, "shared", CONFIG["trials"])
    # the last worker to finish wrote results/shared/; the report rebuilt from the storage is the same
    _same_report(tmp_path, args, tmp_path / "results" / "shared")


def test_kill_9_and_resume_on_sqlite(tmp_path):
    config = _config(tmp_path, trials=8)
    first = _worker(tmp_path, config)
    url = f"sqlite:///{tmp_path / 'results' / 'workers' / 'study.db'}"
    _wait_complete(url, "workers", 3, [first])
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    again = _worker(tmp_path, config)                             # the same command resumes
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    _check_study(url, "workers", 8)
    _same_report(tmp_path, ["results/workers"], tmp_path / "results" / "workers")


@pytest.mark.parametrize("journal", [False, True])
def test_a_killed_workers_trial_is_evaluated_by_the_next_worker(tmp_path, journal):
    """kill -9 in the middle of a trial: after the grace period Optuna fails it and queues a copy
    (on the file journal, without heartbeats, phaze does once the trial's process is gone); the
    worker that runs the copy evaluates the design (it used to prune it as a duplicate of the
    dead trial, whose design stayed in its set of seen designs)."""
    config = _config(tmp_path, trials=8)
    url = f"sqlite:///{tmp_path / 'results' / 'workers' / 'study.db'}"
    args = []
    if journal:
        url = f"journal:///{tmp_path / 'journal' / 'study.log'}"
        args = ["--storage", url]
    first = _worker(tmp_path, config, *args)
    _wait_complete(url, "workers", 3, [first])
    end, victim = time.monotonic() + 60, None
    while victim is None and time.monotonic() < end:          # a trial with its design chosen
        first.send_signal(signal.SIGSTOP)     # frozen while we look, so the trial cannot finish first
        try:
            running = [t for t in _trials(url, "workers") if t.state.name == "RUNNING" and len(t.params) == 3]
        except sqlalchemy.exc.OperationalError:   # frozen holding SQLite's write lock: look again
            running = []
        if running:
            first.send_signal(signal.SIGKILL)
            victim = running[0]
        else:
            first.send_signal(signal.SIGCONT)
            time.sleep(0.02)
    first.wait(timeout=30)
    victim = next(t for t in _trials(url, "workers") if t.number == victim.number)
    assert victim.state.name == "RUNNING"                    # killed with its trial in hand
    again = _worker(tmp_path, config, *args)                 # the same command resumes
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    _check_study(url, "workers", 8)
    trials = _trials(url, "workers")
    assert next(t for t in trials if t.number == victim.number).state.name == "FAIL"
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
    assert len(retry) == 1 and retry[0].params == victim.params
    assert retry[0].state.name == "COMPLETE" and retry[0].user_attrs["evaluated"], retry[0].user_attrs


@pytest.mark.parametrize("storage", ["default", "journal", "existing", "postgresql"])
def test_three_processes_started_at_once_all_run_and_make_exactly_n(tmp_path, storage, request):
    """The same search started three times at once, on a new SQLite study, a new file journal
    (no heartbeats: three workers overshot --trials there), PostgreSQL or an existing study: every process
    ends with rc 0 and nothing on stderr, and the study holds exactly --trials complete trials."""
    config = _config(tmp_path, trials=6, workloads=ONE_LAYOUT)
    url = f"sqlite:///{tmp_path / 'results' / 'workers' / 'study.db'}"
    args: list[str] = []
    if storage == "journal":
        url = f"journal:///{tmp_path / 'journal' / 'study.log'}"
        args = ["--storage", url]
    if storage == "postgresql":
        url = request.getfixturevalue("pg_url")
        args = ["--storage", url, "--study", "workers"]
    if storage == "existing":
        first = _worker(tmp_path, config, "--trials", "2", "--no-figures")
        assert first.wait(timeout=300) == 0
    procs = [_worker(tmp_path, config, *args, "--no-figures") for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0 and err == "", err
    _check_study(url, "workers", 6)


def test_template_is_enqueued_once_when_workers_start_together(tmp_path, pg_url):
    config = _config(tmp_path, trials=4, workloads=ONE_LAYOUT)
    args = ["--storage", pg_url, "--study", "together", "--no-figures"]
    procs = [_worker(tmp_path, config, *args) for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    trials = _trials(pg_url, "together")
    assert sum(t.user_attrs.get("template") is not None for t in trials) == 1
    _check_study(pg_url, "together", 4)


@pytest.mark.parametrize("storage,words", [
    ("postgresql://phaze:wrong@127.0.0.1:{port}/phaze", "password authentication failed"),
    ("postgresql://phaze:secret@127.0.0.1:1/phaze", "refused"),
    ("postgresql://phaze@127.0.0.1:{port}/no_such_db", "no_such_db"),
    ("nosuchdb://x/y", "nosuchdb"),
])
def test_bad_storage_is_one_line_exit_2_within_10_s_and_writes_nothing(tmp_path, pg_url, storage, words):
    port = pg_url.rsplit(":", 1)[1].split("/")[0]
    storage = storage.format(port=port)
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "phaze.cli", "search", str(_config(tmp_path)), "--storage", storage],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert time.monotonic() - start < 10
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "--storage" in r.stderr and words in r.stderr
    assert "wrong" not in r.stderr and "secret" not in r.stderr  # no password in the message
    assert sorted(os.listdir(tmp_path)) == ["workers.yaml"]     # nothing written


_SOLVE = """
import sys
from phaze.arch import load_chip
from phaze.schedule import schedule_layer
from phaze.space import build_chip
from phaze.catalogue import load_model
chip = build_chip(load_chip("tpuv4"), {"tensor_units": 16, "tensor_rows": 64, "tensor_cols": 64})
for name in ("bert-large", "llama2-7b", "opt-350m"):
    for tp in (1, 2):
        f, b = schedule_layer(load_model(name), chip, 2, tp, tp > 1, "flash", "none")
        print(name, tp, f.makespan_s, b.makespan_s, f.cached and b.cached)
"""


def test_schedule_cache_is_safe_under_concurrent_writers(tmp_path):
    """Three processes solve the same layers into one cache folder at once; a fourth then reads
    every schedule back from disk, identical, and no torn or temporary file is left."""
    env = dict(os.environ, PHAZE_CACHE_DIR=str(tmp_path / "cache"))
    procs = [subprocess.Popen([sys.executable, "-c", _SOLVE], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    solved = [[line.split()[:4] for line in o.splitlines()] for o in outs]
    assert solved[0] == solved[1] == solved[2] and len(solved[0]) == 6
    after = subprocess.run([sys.executable, "-c", _SOLVE], env=env, capture_output=True, text=True, timeout=300)
    lines = after.stdout.splitlines()
    assert [line.split()[:4] for line in lines] == solved[0]
    assert all(line.split()[4] == "True" for line in lines)          # every one from the disk cache
    files = list((tmp_path / "cache").iterdir())
    assert files and all(f.suffix == ".json" and not f.name.startswith(".") for f in files)
    for f in files:
        json.loads(f.read_text())


def test_a_trial_killed_before_its_first_heartbeat_does_not_stall_the_study(tmp_path, monkeypatch):
    """Optuna never calls a RUNNING trial without any heartbeat stale; a worker killed in that
    window must not leave the others waiting for ever."""
    from conftest import SMALL_SWEEP

    from phaze.search import make_storage, search
    from phaze.space import load_sweep
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "small.yaml"
    p.write_text(yaml.safe_dump(dict(SMALL_SWEEP, trials=2, objectives=["throughput"], baselines=[])))
    cfg = load_sweep(p)
    search(cfg, progress=False, write=False, grace_period_s=2)
    url = f"sqlite:///{tmp_path / 'results' / 'tiny' / 'study.db'}"
    orphan = optuna.load_study(study_name="tiny", storage=make_storage(url)).ask()   # no heartbeat, ever
    start = time.monotonic()
    res = search(replace(cfg, trials=3), progress=False, write=False,
                 grace_period_s=2)
    assert res.complete == 3 and time.monotonic() - start < 60
    states = {t.number: t.state.name for t in _trials(url, "tiny")}
    assert states[orphan.number] == "FAIL"


def test_exact_search_with_postgresql_workers_proves_the_same_answer(tmp_path, pg_url):
    """Two worker processes run the exact search on one PostgreSQL study: they share the level-1
    bounds through the study, evaluate no design twice, and the certificate rebuilt from the
    storage proves the same best design as one process on SQLite."""
    from phaze.exact import certificate
    from phaze.search import open_study
    from phaze.space import load_sweep
    config = _config(tmp_path, sampler="exact", trials=1000, workloads=CONFIG["workloads"][:2],
                     constraints={"power_w": 520.0})       # the power bounds take part too
    procs = [_worker(tmp_path, config, "--storage", pg_url, "--study", "exact-pg") for _ in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    alone = subprocess.run([sys.executable, "-m", "phaze.cli", "search", str(config), "--quiet", "--study", "alone"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr
    cfg = load_sweep(config)
    from phaze.search import postgres_driver_url
    pg = open_study(cfg, postgres_driver_url(pg_url), "exact-pg", create=False, heartbeat=False)
    one = open_study(cfg, f"sqlite:///{tmp_path / 'results' / 'alone' / 'study.db'}", "alone", create=False,
                     heartbeat=False)
    c_pg, _ = certificate(cfg, pg)
    c_one, _ = certificate(cfg, one)
    assert c_pg.proven and c_one.proven
    assert c_pg.best_value == pytest.approx(c_one.best_value, rel=1e-12)
    done = [t for t in pg.get_trials() if t.state.name == "COMPLETE"]
    assert len({tuple(sorted(t.params.items())) for t in done}) == len(done)


@pytest.mark.parametrize("case,words", [
    ("read-only", "readonly"),
    ("not a journal", "not an Optuna journal"),
    ("journal on /dev/null", "not a regular file"),
    ("memory", "in-memory"),
    ("long name", "too long"),
    ("password with @", "%40"),
])
def test_storage_faults_are_one_line_and_exit_2(tmp_path, case, words):
    """Storage that cannot hold the study: one line naming --storage, rc 2, no traceback, and no
    part of a password. A read-only study is opened through SQLite's read-only mode (tests may
    run as root, where a chmod would not stop the writes)."""
    config = _config(tmp_path)
    long_name = "a" * 300
    storage = {
        "read-only": f"sqlite:///file:{tmp_path / 'ro.db'}?mode=ro&uri=true",
        "not a journal": f"journal:///{tmp_path / 'notes.txt'}",
        "journal on /dev/null": "journal:////dev/null",
        "memory": "sqlite:///:memory:",
        "long name": f"sqlite:///{tmp_path / long_name}.db",
        "password with @": "postgresql://u:pa@ss@127.0.0.1:1/db",
    }[case]
    if case == "read-only":      # an existing study: phaze must write to resume it
        optuna.create_study(study_name="workers", storage=f"sqlite:///{tmp_path / 'ro.db'}")
    (tmp_path / "notes.txt").write_text("not a journal\n")
    r = subprocess.run([sys.executable, "-m", "phaze.cli", "search", str(config), "--quiet", "--storage", storage],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "--storage" in r.stderr and words in r.stderr
    assert "pa@" not in r.stderr and "ss@" not in r.stderr
