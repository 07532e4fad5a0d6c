"""The disk store of fits (phaze/fitstore.py): a fit made once is served bitwise again, a changed
row or a damaged record is fitted anew, and an interrupted leave-one-source-out resumes with only
the fits it had not finished."""
import dataclasses
import json

import pytest
from test_validate import case, ok_cli, phaze_cli, rows, write_csv

from phaze import fitstore
from phaze import validate as v

ROWS = ("R0000", "R0010", "R0015", "R0016", "R0017")    # S01 (3) and S02 (2): A100s, quick to fit


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("PHAZE_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = v.fit

    def counting(cases, *args, **kw):
        calls.append(tuple(c.run_id for c in cases))
        return real(cases, *args, **kw)

    monkeypatch.setattr(v, "fit", counting)
    return tmp_path / "cache" / "fits", calls


def cases():
    return [case(r) for r in ROWS]


def test_a_fit_is_kept_and_served_bitwise(store):
    fits, calls = store
    first = v.fit_cases(cases())
    assert len(calls) == 1 and len(list(fits.glob("*.json"))) == 1
    again = v.fit_cases(cases())
    assert len(calls) == 1                           # served from the store, not fitted
    assert again == first                            # every field bitwise
    changed = [dataclasses.replace(c, measured_step_s=c.measured_step_s * 1.1) if c.run_id == "R0000" else c
               for c in cases()]
    v.fit_cases(changed)
    assert len(calls) == 2 and len(list(fits.glob("*.json"))) == 2    # another row: another fit


def test_a_damaged_or_foreign_record_is_fitted_anew(store):
    fits, calls = store
    first = v.fit_cases(cases())
    (path,) = fits.glob("*.json")
    for text in ("{not json", json.dumps({"key": "other", "parameters": {}}),
                 path.read_text().replace('"tensor_fraction":', '"tensor_fraction":"x","was":')):
        path.write_text(text)
        assert v.fit_cases(cases()) == first
    assert len(calls) == 4
    assert fitstore.load(path.stem) == first         # the last refit overwrote the record


def test_off_keeps_nothing(store, monkeypatch):
    fits, calls = store
    monkeypatch.setenv("PHAZE_CACHE_DIR", "off")
    assert fitstore.fits_dir() is None
    v.fit_cases(cases())
    v.fit_cases(cases())
    assert len(calls) == 2 and not fits.exists()


def test_an_interrupted_leave_one_source_out_resumes(store, monkeypatch):
    """Ctrl-C after the first of two fits; the second run fits only the other, and its results
    are those of an uninterrupted run without the store."""
    fits, calls = store
    done = []

    def stop_after_one(what):
        done.append(what)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        v.leave_one_source_out(cases(), progress=stop_after_one)
    assert len(calls) == 1 and done == ["S01_narayanan2021: default"]
    summary, preds = v.leave_one_source_out(cases())
    assert len(calls) == 2 and calls[1] != calls[0]
    assert v.loso_fits(cases()) == 2
    monkeypatch.setenv("PHAZE_CACHE_DIR", "off")
    fresh_summary, fresh = v.leave_one_source_out(cases())
    assert [(p.run_id, p.predicted_step_s) for p in preds] == [(p.run_id, p.predicted_step_s) for p in fresh]
    assert summary == fresh_summary


def test_cli_says_what_it_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("PHAZE_CACHE_DIR", str(tmp_path / "cache"))
    runs = write_csv(tmp_path / "runs.csv", [rows()[r] for r in ROWS])
    argv = ("validate", "--runs", str(runs), "--unseen", "", "--hold-out", "none")
    first = ok_cli(phaze_cli(tmp_path, *argv))
    assert "reused" not in first.stderr
    second = ok_cli(phaze_cli(tmp_path, *argv))
    assert "phaze: 2 of 2 fits reused from an earlier run" in second.stderr
    assert second.stdout == first.stdout


def test_fits_in_worker_processes_are_the_same_fits(store, monkeypatch):
    """Three fits on two spawned workers: none runs here, each is kept, each reported once, and
    each is bitwise the fit made here without the store."""
    fits, calls = store
    groups = [cases()[:3], cases()[1:], cases()]
    done = []
    got = v.fit_each(groups, jobs=2, done=done.append)
    assert not calls and sorted(done) == [0, 1, 2] and len(list(fits.glob("*.json"))) == 3
    assert fitstore.counts()["fitted"] >= 3
    monkeypatch.setenv("PHAZE_CACHE_DIR", "off")
    assert got == [v.fit_cases(g) for g in groups]
    assert len(calls) == 3


def test_ctrl_c_ends_the_workers_and_keeps_what_finished(store):
    """Ctrl-C (SIGINT) as the first of six parallel fits is ready: fit_each raises
    KeyboardInterrupt, no worker is left, the fits that finished are in the store, and the same
    call then fits only the others."""
    import multiprocessing
    import os
    import signal

    from phaze.search import interruptible
    fits, _ = store
    groups = [[case(r) for r in ROWS if r != left] for left in ROWS] + [cases()]
    seen = []

    def first_stops(i):
        seen.append(i)
        if len(seen) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt), interruptible():
        v.fit_each(groups, jobs=2, done=first_stops)
    assert not multiprocessing.active_children()
    kept = len(list(fits.glob("*.json")))
    assert 1 <= kept < len(groups)
    before = fitstore.counts()
    v.fit_each(groups, jobs=2)
    after = fitstore.counts()
    assert after["reused"] - before["reused"] == kept
    assert after["fitted"] - before["fitted"] == len(groups) - kept


@pytest.mark.parametrize("off", [False, True])
def test_the_same_cases_twice_are_fitted_once(store, monkeypatch, off):
    """Leave-one-source-out fits a family no held-out source touches once for each such source
    (the bundled sets: 27 different fits among 38); one fit serves them, with the store or without."""
    fits, calls = store
    if off:
        monkeypatch.setenv("PHAZE_CACHE_DIR", "off")
    done = []
    a, b = cases(), cases()[1:]
    got = v.fit_each([a, b, a], done=done.append)
    assert len(calls) == 2 and sorted(done) == [0, 1, 2]
    assert got[0] == got[2] != got[1]
