"""Benchmark: the fuzz of phaze's inputs and faults, counted per surface (issues 14 and 22).

Surfaces (the share of ``--cases`` each gets):
- ``command``: random bad command lines (tests/test_fuzz.py's generator), in-process;
- ``sweep``: mutated sweep configs through ``phaze search --trials 2``, in-process;
- ``storage``: bad or odd ``--storage`` URLs and study names through ``phaze search``;
- ``report``: damaged study folders and bad ``--out`` folders through ``phaze report``;
- ``interrupt``: SIGINT or SIGKILL at a random time during a search or a sweep (a subprocess), then the
  same command again, which must complete the study;
- ``cache``: a corrupted schedule-cache file under ``PHAZE_CACHE_DIR`` before ``phaze schedule``,
  whose answer must equal the one computed without the cache.

A bad ending is a traceback, a hang past the timeout, an exit status other than 0, 2 or 130 (or
a status 2 with more than one stderr line), or a lost result (a search that ends 0 without its
trials.csv, a resumed study short of its trials, a cached answer that differs). It prints the
cases per surface and the bad endings by kind with an example each.
Run: python tests/bench/bench_fuzz.py [--cases 1000] [--seed 0] [--surfaces sweep,cache]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import yaml
from tqdm import tqdm

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from test_fuzz import TINY_SWEEP, files, make_case, mutated_sweep, run_case  # noqa: E402

SHARES = {"command": 0.40, "sweep": 0.30, "storage": 0.10, "report": 0.10, "interrupt": 0.04, "cache": 0.06}


def kind_of(verdict: str) -> str:
    """The kind of a bad ending: its verdict, up to the exception's message for a traceback."""
    return ":".join(verdict.split(":")[:2]) if verdict.startswith("traceback") else verdict


def write_tiny(root: Path, name: str = "tiny.yaml", **changes) -> Path:
    path = root / name
    path.write_text(yaml.safe_dump({**TINY_SWEEP, **changes}))
    return path


def trials_complete(url: str, study: str = "tiny") -> int:
    import optuna
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    s = optuna.load_study(study_name=study, storage=url)
    return sum(t.state == optuna.trial.TrialState.COMPLETE for t in s.get_trials(deepcopy=False))


# --- surfaces: each returns (verdict, what was run) ---------------------------------------------------
def case_command(rng, root, ctx):
    argv = make_case(rng, root, ctx["bad"])
    return run_case(argv)[0], argv


def case_sweep(rng, root, ctx):
    path = mutated_sweep(root, rng)
    out = root / f"study-{rng.randrange(10 ** 9)}"
    argv = ["search", str(path), "--trials", "2", "--quiet", "--storage", f"sqlite:///{out}/study.db"]
    verdict = run_case(argv, limit_s=120)[0]
    if verdict == "ok" and not list(out.glob("*/trials.csv")):
        verdict = "lost result (status 0, no trials.csv)"
    return verdict, argv + [path.read_text()[:200]]


def storage_urls(root: Path) -> list[str]:
    ro = root / "ro" / "study.db"
    text = root / "text.db"
    text.write_text("not a database\n")
    (root / "notjournal.log").write_text("{broken\n")
    return [f"sqlite:///{root}/fresh-{{n}}/study.db", "sqlite:///:memory:", "sqlite://", "sqlite:////dev/null",
            f"sqlite:///{root}/no/such/dir/x.db", f"sqlite:///{text}", f"sqlite:///{ro}",
            f"sqlite:///{root}/{'a' * 300}.db", f"journal:///{root}/j-{{n}}.log", "journal:///dev/null",
            f"journal:///{root}/notjournal.log", f"journal:///{root}", "postgresql://u:pa@ss@127.0.0.1:1/db",
            "postgresql://127.0.0.1:1/x", "mysql://x", "nosuch://x", "", " ", f"sqlite:///{root}",
            "file:///etc/passwd", "sqlite:///x\x00.db", "redis://localhost:1", "sqlite:////proc/phaze.db",
            f"sqlite:///{root}/ü-{{n}}.db", "journal://", "postgresql://", "sqlite:///" + "/" * 50]


def case_storage(rng, root, ctx):
    url = rng.choice(ctx["urls"]).replace("{n}", str(rng.randrange(10 ** 9)))
    argv = ["search", str(ctx["tiny"]), "--trials", "1", "--quiet", "--storage", url]
    if rng.random() < 0.3:
        argv += ["--study", rng.choice(["", "a/b", "x" * 300, "tiny", "ü", " "])]
    verdict, _, text, _ = run_case(argv, limit_s=120)
    if "ss@127" in text:
        verdict = "password printed"
    return verdict, argv


def damage_study(rng, folder: Path) -> str:
    db = folder / "study.db"
    how = rng.choice(["delete", "truncate", "bytes", "text", "journal", "attrs", "attrs", "csv", "file"])
    if how == "delete":
        db.unlink()
    elif how == "truncate":
        data = db.read_bytes()
        db.write_bytes(data[:rng.randrange(len(data))])
    elif how == "bytes":
        data = bytearray(db.read_bytes())
        for _ in range(rng.randint(1, 20)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        db.write_bytes(bytes(data))
    elif how == "text":
        db.write_text("hello\n")
    elif how == "journal":
        (folder / "study.db-journal").write_bytes(bytes(rng.randrange(256) for _ in range(2048)))
    elif how == "attrs":
        con = sqlite3.connect(db)
        table = rng.choice(["study_user_attributes", "trial_user_attributes", "trial_values", "trial_params"])
        col = {"trial_values": "value", "trial_params": "param_value"}.get(table, "value_json")
        junk = rng.choice(['"x"', "null", "[]", "{}", "1e999", "-1", '{"a": [1, {"b": null}]}', "not json", "NaN"])
        with contextlib.suppress(sqlite3.Error):
            con.execute(f"UPDATE {table} SET {col} = ? WHERE rowid IN (SELECT rowid FROM {table} "
                        f"ORDER BY random() LIMIT {rng.randint(1, 5)})", (junk,))
            con.commit()
        con.close()
    elif how == "csv":
        (folder / "trials.csv").write_text("garbage,\n\x00")
    else:
        shutil.rmtree(folder)
        folder.write_text("a file\n")
    return how


def case_report(rng, root, ctx):
    folder = root / f"report-{rng.randrange(10 ** 9)}"
    shutil.copytree(ctx["study"], folder)
    how = damage_study(rng, folder) if rng.random() < 0.8 else "none"
    argv = ["report", str(folder)]
    if rng.random() < 0.3:
        target = root / "a-file"
        target.write_text("x")
        argv += ["--out", rng.choice(["/proc/phaze", str(target), str(target / "sub"), "/", str(root / "new" / "out")])]
        how += " --out"
    verdict = run_case(argv, limit_s=120)[0]
    return verdict, argv + [how]


def case_interrupt(rng, root, ctx):
    folder = root / f"int-{rng.randrange(10 ** 9)}"
    url = f"sqlite:///{folder}/study.db"
    sig = rng.choice([signal.SIGINT, signal.SIGKILL])
    delay = rng.uniform(1.0, 12.0)
    sweep = rng.random() < 0.5     # phaze sweep, the first 4 designs of its grid, or a 4-trial search
    cmd = [sys.executable, "-m", "phaze.cli", *(["sweep", str(ctx["tiny"]), "--limit", "4"] if sweep else
                                                ["search", str(ctx["tiny"]), "--trials", "4"]), "--quiet",
           "--storage", url]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):   # children may hold its pipes
            p.communicate(timeout=10)
        return f"hang (no exit 30 s after {sig.name})", cmd + [f"{delay:.1f} s"]
    what = cmd + [f"{sig.name} at {delay:.1f} s"]
    if "Traceback" in err:
        return f"traceback after {sig.name}", what
    if p.returncode not in (0, 2, 130, -signal.SIGKILL, -signal.SIGINT) or (p.returncode == -signal.SIGINT):
        return f"status {p.returncode} after {sig.name}", what
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0 or "Traceback" in r.stderr:
        last = r.stderr.strip().splitlines()[-1][:200] if r.stderr.strip() else ""
        return f"resume: status {r.returncode}{', traceback: ' + last if 'Traceback' in r.stderr else ''}", what
    n = trials_complete(url, "tiny-sweep" if sweep else "tiny")
    if n != 4:
        return f"lost result (resumed study has {n} complete trials, not 4)", what
    return "ok", what


def corrupt_cache(rng, folder: Path) -> str:
    import json
    path = rng.choice(sorted(folder.glob("*.json")))
    how = rng.choice(["truncate", "bytes", "empty", "field", "field", "field", "list"])
    if how == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[:rng.randrange(len(data))])
    elif how == "bytes":
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data))] = rng.randrange(256)
        path.write_bytes(bytes(data))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "list":
        path.write_text("[1, 2, 3]")
    else:
        rec = json.loads(path.read_text())
        from test_fuzz import _paths
        paths = [p for p, _ in _paths(rec) if p and p[0] == "schedule"]
        p = rng.choice(paths)
        parent = rec
        for k in p[:-1]:
            parent = parent[k]
        old = parent[p[-1]]
        parent[p[-1]] = rng.choice(["x", -1, 0, 1e308, None, [], {}, True,
                                    old * 1.05 if isinstance(old, (int, float)) and not isinstance(old, bool) else "y"])
        how = f"field {'.'.join(map(str, p))}"
        path.write_text(json.dumps(rec))
    return how


def case_cache(rng, root, ctx):
    from phaze.schedule import clear_memory_cache
    folder = root / f"cache-{rng.randrange(10 ** 9)}"
    shutil.copytree(ctx["cache"], folder)
    how = corrupt_cache(rng, folder)
    os.environ["PHAZE_CACHE_DIR"] = str(folder)
    clear_memory_cache()
    out = io.StringIO()
    verdict = run_case(ctx["schedule"], limit_s=120, out=out)[0]
    os.environ["PHAZE_CACHE_DIR"] = str(root / "cache")
    clear_memory_cache()
    if verdict == "ok" and answer(out.getvalue()) != ctx["schedule_out"]:
        verdict = "changed result (a corrupted cache entry was trusted)"
    return verdict, ctx["schedule"] + [how]


def answer(text: str) -> str:
    """What ``phaze schedule`` printed, less its solve times (which a cached answer lacks)."""
    return "\n".join(line for line in text.splitlines() if "solve time" not in line)


SURFACES = {"command": case_command, "sweep": case_sweep, "storage": case_storage, "report": case_report,
            "interrupt": case_interrupt, "cache": case_cache}


def setup(root: Path, surfaces: set[str]) -> dict:
    """What the cases start from: bad files, the tiny config, a study folder, a warm cache."""
    from phaze.schedule import clear_memory_cache
    ctx = {"bad": files(root / "files"), "tiny": write_tiny(root), "urls": storage_urls(root)}
    (root / "ro").mkdir()
    if surfaces & {"report", "storage"}:
        url = f"sqlite:///{root}/base/study.db"
        verdict = run_case(["search", str(ctx["tiny"]), "--trials", "2", "--quiet", "--storage", url], limit_s=300)[0]
        assert verdict == "ok", verdict
        ctx["study"] = root / "base" / "tiny"
        shutil.copy(root / "base" / "study.db", ctx["study"] / "study.db")
        shutil.copy(root / "base" / "study.db", root / "ro" / "study.db")
        (root / "ro" / "study.db").chmod(0o444)
        (root / "ro").chmod(0o555)
    if "cache" in surfaces:
        ctx["schedule"] = ["schedule", "--workload", "mpt-125m", "--arch", "tpuv4", "--tp", "1"]
        os.environ["PHAZE_CACHE_DIR"] = str(root / "pristine")
        clear_memory_cache()
        out = io.StringIO()
        verdict = run_case(ctx["schedule"], limit_s=300, out=out)[0]
        assert verdict == "ok", verdict
        ctx["schedule_out"] = answer(out.getvalue())
        ctx["cache"] = root / "pristine"
        assert list(ctx["cache"].glob("*.json")), "the schedule command wrote no cache file"
        os.environ["PHAZE_CACHE_DIR"] = str(root / "cache")
        clear_memory_cache()
    return ctx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--surfaces", default=",".join(SHARES), help="comma-separated subset of " + ", ".join(SHARES))
    args = ap.parse_args()
    chosen = [s for s in args.surfaces.split(",") if s]
    unknown = set(chosen) - set(SHARES)
    if unknown:
        ap.error(f"--surfaces: unknown {sorted(unknown)}; allowed: {', '.join(SHARES)}")
    total = sum(SHARES[s] for s in chosen)
    counts = {s: round(args.cases * SHARES[s] / total) for s in chosen}
    counts[chosen[0]] += args.cases - sum(counts.values())
    root = Path(tempfile.mkdtemp(prefix="phaze-fuzz-"))
    os.environ["PHAZE_CACHE_DIR"] = str(root / "cache")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE.parent.parent), os.environ.get("PYTHONPATH", "")])
    os.chdir(root)
    ctx = setup(root, set(chosen))
    rng = random.Random(args.seed)
    plan = [s for s in chosen for _ in range(counts[s])]
    rng.shuffle(plan)
    endings, times = defaultdict(Counter), []
    bad: dict[tuple[str, str], list] = defaultdict(list)
    start = time.perf_counter()
    for surface in tqdm(plan, desc="fuzz", unit="case", mininterval=5):
        t = time.perf_counter()
        verdict, what = SURFACES[surface](rng, root, ctx)
        times.append(time.perf_counter() - t)
        endings[surface]["ok" if verdict == "ok" else "one-line error" if verdict == "error" else "BAD"] += 1
        if verdict not in ("ok", "error"):
            bad[(surface, kind_of(verdict))].append((what, verdict))
            tqdm.write(f"BAD {surface}: {verdict}: {' '.join(map(str, what))[:300]}", file=sys.stdout)
            sys.stdout.flush()
    elapsed = time.perf_counter() - start
    n_bad = sum(len(v) for v in bad.values())
    print(f"{len(plan)} cases (seed {args.seed}) in {elapsed:.0f} s; {n_bad} bad endings; "
          f"slowest case {max(times):.1f} s, median {statistics.median(times):.2f} s")
    for s in chosen:
        e = endings[s]
        print(f"  {s:<10} {sum(e.values()):>5} cases: {e['ok']} ok, {e['one-line error']} one-line errors, "
              f"{e['BAD']} bad")
    for (surface, kind), cases in sorted(bad.items(), key=lambda kv: -len(kv[1])):
        what, verdict = cases[0]
        print(f"BAD {surface} x{len(cases)}: {kind}\n    e.g. {verdict}: {what!r}"[:1500])
    os.chdir(HERE)
    if bad:
        print(f"cases' files kept in {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
