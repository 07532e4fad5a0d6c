"""Fuzz: random bad command lines end in one line and exit status 2 (or a normal answer), never a
traceback, a hang or another status (issue 14).

Each case mutates a good command line: a number replaced by a bad one, a junk plan, a wrong
name, a directory, an empty or binary file, a mutated cell of a validation CSV, a flag dropped
or given twice. The cases run in-process through ``phaze.cli.main`` with a 10 s alarm each. CI
runs a small count; ``tests/bench/bench_fuzz.py`` runs 1,000.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import random
import signal
import time
import traceback
from pathlib import Path

import pytest

BAD_NUMBERS = ["-1", "0", "-0", "1e30", "nan", "inf", "", " ", "abc", "9" * 40, "1.5", "0x10", "\u0663",
               "1_000", "+", "--", "10000000000000", "2**10", "1,2", "8 8", "\x7f"]
BAD_NAMES = ["nope", "gpt-9000", "../../etc", ".", "/", "a" * 300, "a100-80gb.yaml", "x.json", "\u00e9\u00e9",
             "-", "~"]
PLAN_KEYS = ["tp", "pp", "mbs", "recompute", "sp", "vp", "cp", "zero", "attention", "optimizer", "dp_overlap",
             "tp_overlap", "reduce_fp32", "schedule", "stages", "stage_recompute", "ep", "etp", "routing",
             "dispatcher", "ep_overlap", "cp_comm", "cp_a2a", "dp_shard", "pipe_p2p", "pipe_schedule", "offload",
             "colour", ""]
PLAN_VALUES = ["0", "1", "2", "3", "7", "8", "16", "96", "128", "-1", "full", "none", "flash2", "yes", "maybe",
               "1:2:3", "48:48", "full:none", "", "=", "1e3", "9" * 30, "forced", "capacity", "deepep", "a2a+p2p",
               "node", "dualpipe", "blocking", "qkv_proj"]
GOOD = {
    "evaluate": ["evaluate", "--workload", "gpt3-175b", "--arch", "a100-80gb", "--devices", "1024",
                 "--global-batch", "1536", "--plan", "tp=8,pp=16,mbs=1,recompute=full", "--system",
                 "dgx-a100-superpod"],
    "moe": ["place", "--workload", "mixtral-8x7b", "--arch", "h100-sxm", "--devices", "64", "--global-batch",
            "256", "--tp", "1,2", "--mbs", "1", "--ep", "4,8", "--recompute", "none,full", "--zero", "1",
            "--dispatcher", "alltoall,deepep", "--ep-overlap", "off,on", "--pipe-schedule", "1f1b,dualpipe"],
    "place": ["place", "--workload", "mpt-125m", "--arch", "a100-80gb", "--devices", "64",
              "--global-batch", "256", "--tp", "1,2", "--mbs", "1,2", "--zero", "0,1", "--dp-shard", "all,node",
              "--cp-comm", "p2p,all_gather"],
    "schedule": ["schedule", "--workload", "gpt2-xl", "--arch", "a100-80gb", "--tp", "2"],
    "hybrid": ["place", "--workload", "nemotron-h-8b", "--arch", "h100-sxm", "--devices", "16", "--global-batch",
               "32", "--tp", "1,2", "--mbs", "1", "--seq-len", "1024", "--recompute", "none,selective"],
    "layer": ["schedule", "--workload", "nemotron-h-4b", "--arch", "tpuv4", "--tp", "2", "--seq-len", "512",
              "--layer-kind", "mamba"],
    "area": ["area", "--arch", "a100-80gb", "--workload", "gpt2-xl", "--devices", "64", "--global-batch", "512",
             "--plan", "tp=1,pp=1,mbs=8"],
    "validate": ["validate", "--no-loso", "--unseen", ""],
}
NUMERIC = {"--devices", "--global-batch", "--seq-len", "--top", "--tp", "--mbs", "--pp", "--vp", "--zero",
           "--memory-reserve", "--time-limit", "--work-limit", "--ep", "--nics-per-node", "--devices-per-node"}


def files(root: Path) -> dict[str, Path]:
    """Bad files: empty, binary, a directory, a list, broken YAML, junk JSON, a huge number."""
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, data in [("empty.yaml", b""), ("binary.yaml", bytes(range(256)) * 8), ("list.yaml", b"- 1\n- 2\n"),
                       ("broken.yaml", b"name: x\n  layers: [3\n"), ("junk.json", b"{\"a\": [1, 2,"),
                       ("config.json", b"{\"model_type\": \"llama\", \"hidden_size\": 1e400}"),
                       ("deep.json", b"[" * 5000 + b"]" * 5000), ("nul.yaml", b"name: \x00\x01"),
                       ("bom.yaml", "\ufeffname: x\n".encode()), ("latin1.yaml", "name: caf\xe9\n".encode("latin-1"))]:
        (root / name).write_bytes(data)
        out[name] = root / name
    (root / "folder.yaml").mkdir(exist_ok=True)
    out["folder.yaml"] = root / "folder.yaml"
    return out


def mutated_runs(root: Path, rng: random.Random) -> Path:
    """A few rows of the shipped validation CSV with one cell replaced by junk."""
    from phaze.runs import default_runs_paths
    with open(rng.choice(default_runs_paths()), newline="") as fh:
        rows = list(csv.reader(fh))
    head, body = rows[0], rng.sample(rows[1:], 4)
    r, c = rng.randrange(len(body)), rng.randrange(len(head))
    body[r][c] = rng.choice(BAD_NUMBERS + BAD_NAMES + ["", "1e308", "-5", "A100", "yes", "n/a", "\x00"])
    if rng.random() < 0.2:                      # a short or long row, or a dropped column
        body[r] = body[r][:rng.randrange(len(head))] if rng.random() < 0.5 else body[r] + ["extra"]
    path = root / f"runs-{rng.randrange(10 ** 9)}.csv"
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([head] + body)
    return path


def mutated_hf_config(root: Path, rng: random.Random) -> Path:
    """A small Hugging Face config.json of a random type (read or not), some of its counts, numbers
    and lists set to junk or to plausible values."""
    from phaze.hf_config import _HF_GATED, _HF_LIST_KEYS, _HF_NUMBER_KEYS, _HF_PLAIN, _HF_WHOLE_KEYS
    cfg = {"model_type": rng.choice(list(_HF_GATED + _HF_PLAIN) + ["gemma3", "llama4", "olmo_hybrid", "", 7]),
           "hidden_size": 64, "num_hidden_layers": rng.choice([1, 2, 4]), "num_attention_heads": 4,
           "vocab_size": 100, "intermediate_size": 128}
    junk = [-1, 0, 1, 2, 3, 4, 1.5, 1e400, 1e308, "abc", "", None, True, [1], {"a": 1}]
    nested = [{"kv_n_heads": rng.choice(junk)}, {"alibi": rng.choice(junk), "rope": rng.choice(junk)},
              {"moe_num_experts": rng.choice(junk), "moe_top_k": rng.choice(junk),
               "ffn_hidden_size": rng.choice(junk), "ffn_act_fn": rng.choice(junk + [{"name": "gelu"}])}]
    for key in rng.sample(_HF_WHOLE_KEYS + _HF_NUMBER_KEYS + _HF_LIST_KEYS + ("sliding_window", "layer_types",
                                                                             "use_sliding_window", "hidden_act",
                                                                             "attn_config", "ffn_config",
                                                                             "attention_bias", "mlp_bias"),
                          rng.randint(1, 6)):
        cfg[key] = rng.choice(junk + nested + [["sliding_attention", "full_attention"], [0, 1], "gelu", "relu2",
                                               "LLLG", "LXG"])
    path = root / f"hf-{rng.randrange(10 ** 9)}" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg).replace("Infinity", "1e400"))
    return path


def junk_plan(rng: random.Random) -> str:
    items = []
    for _ in range(rng.randint(1, 4)):
        k, v = rng.choice(PLAN_KEYS), rng.choice(PLAN_VALUES)
        items.append(rng.choice([f"{k}={v}", k, f"={v}", f"{k}=={v}", f" {k} = {v} "]))
    return rng.choice([",", ";", ", ", ",,"]).join(items)


def make_case(rng: random.Random, root: Path, bad: dict[str, Path]) -> list[str]:
    command = rng.choice(list(GOOD))
    argv = list(GOOD[command])
    flags = [i for i, a in enumerate(argv) if a.startswith("--") and i + 1 < len(argv)
             and not argv[i + 1].startswith("--")]
    kind = rng.choice(["number", "name", "file", "plan", "drop", "twice", "unknown", "runs", "extra", "hf"])
    if kind == "hf":
        return ["evaluate", "--workload", str(mutated_hf_config(root, rng)), "--arch", "h100-sxm", "--devices", "8",
                "--global-batch", "8", "--seq-len", "64", "--allow-oom"]
    if kind == "runs" or command == "validate":
        argv = ["validate", "--no-loso", "--unseen", "", "--runs",
                str(mutated_runs(root, rng)) if rng.random() < 0.8 else str(rng.choice(list(bad.values())))]
        if rng.random() < 0.3:
            argv += ["--params", str(rng.choice(list(bad.values())))]
        return argv
    if kind == "number":
        nums = [i for i in flags if argv[i] in NUMERIC] or flags
        i = rng.choice(nums)
        argv[i + 1] = rng.choice(BAD_NUMBERS)
    elif kind == "name":
        i = rng.choice([i for i in flags if argv[i] in ("--workload", "--arch", "--system")] or flags)
        argv[i + 1] = rng.choice(BAD_NAMES)
    elif kind == "file":
        flag = rng.choice(["--workload", "--arch", "--params", "--system"])
        argv += [flag, str(rng.choice(list(bad.values())))]
    elif kind == "plan":
        if "--plan" in argv:
            argv[argv.index("--plan") + 1] = junk_plan(rng)
        else:
            argv += [rng.choice(["--baseline", "--tp", "--recompute", "--zero", "--ep"]), junk_plan(rng)]
    elif kind == "drop":
        i = rng.choice(flags)
        del argv[i:i + 2]
    elif kind == "twice":
        i = rng.choice(flags)
        argv += [argv[i], rng.choice(BAD_NUMBERS + BAD_NAMES)]
    elif kind == "unknown":
        argv.insert(rng.randrange(1, len(argv) + 1), rng.choice(["--bogus", "-x", "--plan=", "--", "---", "-"]))
    else:   # one good flag with a bad value added
        argv += rng.choice([["--seq-len", rng.choice(BAD_NUMBERS)], ["--memory-reserve", rng.choice(BAD_NUMBERS)],
                            ["--format", rng.choice(["xml", "", "JSON"])], ["--gantt", str(root)],
                            ["--out", str(root / "no" / "such.csv")], ["--top", rng.choice(BAD_NUMBERS)],
                            ["--system", rng.choice(BAD_NAMES)], ["--nics-per-node", rng.choice(BAD_NUMBERS)],
                            ["--devices-per-node", rng.choice(BAD_NUMBERS)]])
    return argv


class _Timeout(Exception):
    pass


def run_case(argv: list[str], limit_s: float = 10.0,
             out: io.StringIO | None = None) -> tuple[str, int | None, str, float]:
    """(verdict, exit status, stderr, seconds): verdict 'ok' (status 0), 'error' (one line, status 2)
    or what went wrong. ``out`` receives stdout."""
    from phaze.cli import main
    out, err = out if out is not None else io.StringIO(), io.StringIO()

    def alarm(*_):
        raise _Timeout()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    t = time.perf_counter()
    code, verdict = None, None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except _Timeout:
        verdict = f"hang (over {limit_s:g} s)"
    except BaseException:   # noqa: BLE001 - any escape is what the fuzz test looks for
        verdict = "traceback: " + traceback.format_exc(limit=-3).strip().splitlines()[-1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    dt = time.perf_counter() - t
    text = err.getvalue()
    if verdict is None:
        lines = [x for x in text.splitlines() if x.strip()]
        if "Traceback" in text:
            verdict = "traceback in stderr"
        elif code == 0:
            verdict = "ok"
        elif code == 2 and len(lines) == 1 and lines[0].startswith("phaze: error: "):
            verdict = "error"
        else:
            verdict = f"status {code} with {len(lines)} stderr lines"
    return verdict, code, text, dt


def fuzz(n: int, seed: int, root: Path) -> list[tuple[list[str], str, str]]:
    """Run ``n`` random cases; return the bad endings (argv, verdict, stderr)."""
    rng = random.Random(seed)
    bad = files(root / "files")
    failures = []
    for _ in range(n):
        argv = make_case(rng, root, bad)
        verdict, _, text, _ = run_case(argv)
        if verdict not in ("ok", "error"):
            failures.append((argv, verdict, text[-500:]))
    return failures


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_bad_command_lines(seed, tmp_path, monkeypatch):
    monkeypatch.setenv("PHAZE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    failures = fuzz(15, seed, tmp_path)
    assert not failures, "\n".join(f"{a!r}: {v}\n{t}" for a, v, t in failures)


def test_fuzz_catches_a_bad_ending():
    """The harness itself: an exception escaping, or a second stderr line, is reported."""
    import phaze.cli as cli
    real = cli.cmd_area

    def boom(args):
        raise RuntimeError("injected")
    try:
        cli.cmd_area = boom
        parser_default = cli.build_parser
        verdict, *_ = run_case(["area", "--arch", "a100-80gb"])
    finally:
        cli.cmd_area = real
    assert parser_default is cli.build_parser
    assert verdict.startswith("traceback") or verdict.startswith("status")


# --- sweep configs, storage URLs, report folders, interruptions, the schedule cache (issue 22) --------
TINY_SWEEP = {
    "name": "tiny", "base": "a100-80gb",
    "workloads": [{"workload": "mpt-125m", "devices": 8, "global_batch": 16,
                   "placement": {"tp": [1], "mbs": [1, 2], "recompute": ["none"], "pp": [1]}}],
    "space": {"tensor_units": [27, 54, 108], "tensor_rows": [16, 32], "tensor_cols": "tensor_rows",
              "hbm_gib": {"low": 40, "high": 80, "step": 40}, "clock_ghz": 1.41,
              "local_sram_kib": "max(1, tensor_rows * tensor_cols / 64)"},
    "constraints": {"area_mm2": 2000}, "objectives": ["throughput", "area"],
    "sampler": "random", "trials": 2, "seed": 3,
}
BAD_VALUES = [0, -1, 0.5, 1e-300, 1e308, -1e308, float("inf"), float("nan"), 10 ** 30, 2 ** 64, 4294967296, True,
              None, "", "x", [], {}, [[1]], {"a": 1}, [["throughput"]], "/dev/zero", "/", ".", "a" * 300,
              "9 ** 9 ** 9", "2 ** 10000", "64 / (tensor_rows - 16)", "(-tensor_rows) ** 0.5", "ceil(1e400)",
              " + ".join(["1"] * 50_000), "tensor_rows / 3", "log2(tensor_rows - 16)", "-" * 100 + "1",
              "__import__('os')", "tensor_rows.real", "lambda: 1", "tensor_rows if 1 else 2", "max()",
              "tensor_rows ** 60", "1e308 * 10", "0 ** -1", "tensor_rows // 0.0", "min(*[1])",
              {"low": 1, "high": 2, "step": 1e-9}, {"low": 1, "high": 1e308, "log2": True},
              {"low": 0, "high": 8, "step": 1}, {"low": 1, "high": 8}, {"low": 8, "high": 1, "step": 1},
              {"low": 1, "high": 1.00000001, "step": 1e-10}, {"population_size": 1}, {"n_startup_trials": -1},
              {"bogus": 1}, {"population_size": "x"}, {"seed": 1}, "nsga2", "grid", "exact", "gp", "tpe"]
SAMPLER_OPTIONS = [{"population_size": 1}, {"population_size": 2.5}, {"population_size": 10 ** 9},
                   {"n_startup_trials": -1}, {"n_startup_trials": "x"}, {"mutation_prob": 2}, {"bogus": 1},
                   {"crossover": "x"}, {"seed": 5}, {"n_ei_candidates": 0}, {"multivariate": "yes"}, {}]


def _paths(node, prefix=()):
    """Every (path, value) of a nested config, containers included."""
    yield prefix, node
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        yield from _paths(v, (*prefix, k))


def laughs(levels: int = 9) -> str:
    """A billion-laughs YAML fragment (600 bytes that expand to 9**levels strings)."""
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nname: *a{levels - 1}\n"


def mutated_sweep(root: Path, rng: random.Random) -> Path:
    """The tiny sweep config with one to three mutations: a value replaced, a key dropped or
    added, the sampler and its options changed, or the text itself damaged."""
    import copy

    import yaml
    cfg = copy.deepcopy(TINY_SWEEP)
    text = None
    for _ in range(rng.choice([1, 1, 2, 3])):
        kind = rng.choice(["value", "value", "value", "drop", "add", "sampler", "text"])
        paths = [p for p, _ in _paths(cfg) if p]
        path = rng.choice(paths)
        parent = cfg
        for k in path[:-1]:
            parent = parent[k]
        if kind == "value":
            parent[path[-1]] = copy.deepcopy(rng.choice(BAD_VALUES))
        elif kind == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        elif kind == "add" and isinstance(parent, dict):
            parent[rng.choice(["bogus", "space", "tensor_unit", "log2", "step", "system", "weight"])] = \
                copy.deepcopy(rng.choice(BAD_VALUES))
        elif kind == "sampler":
            cfg["sampler"] = rng.choice(["nsga2", "tpe", "random", "grid", "exact", "gp"])
            cfg["sampler_options"] = dict(rng.choice(SAMPLER_OPTIONS))
        elif kind == "text":
            text = rng.choice(["laughs", "recursive", "truncate", "byte", "tab"])
    out = yaml.safe_dump(cfg, width=10 ** 9, allow_unicode=True)
    if text == "laughs":
        out = laughs() + "\n".join(line for line in out.splitlines() if not line.startswith("name:")) + "\n"
    elif text == "recursive":
        out = out.replace("objectives:", "objectives: &r [*r]\nx:", 1)
    elif text == "truncate":
        out = out[:rng.randrange(len(out))]
    elif text == "byte":
        i = rng.randrange(len(out))
        out = out[:i] + rng.choice(["\x00", "\t", ":", "{", "&", "*", "!!python/object:os.system", "\ufeff"]) + out[i:]
    elif text == "tab":
        out = out.replace("  ", "\t", 1)
    path = root / f"sweep-{rng.randrange(10 ** 9)}.yaml"
    path.write_text(out)
    return path


def check_sweep(path: Path) -> str:
    """What a search does with a config before its first trial, in-process and fast: read it,
    make its sampler, check its budgets, build every corner of its space. 'ok', 'error' (a
    ConfigError) or the exception that escaped."""
    from phaze.configio import ConfigError
    from phaze.search import check_budgets, make_sampler
    from phaze.space import build_chip, load_sweep
    try:
        cfg = load_sweep(path)
        make_sampler(cfg)
        check_budgets(cfg)
        for corner in ({d.param: d.choices[0] for d in cfg.searched}, {d.param: d.choices[-1] for d in cfg.searched}):
            build_chip(cfg.base, cfg.values(corner), cfg.process_node_nm, cfg.link_latency_s)
    except ConfigError:
        return "error"
    except Exception as exc:   # noqa: BLE001 - any escape is what the fuzz test looks for
        return f"traceback: {type(exc).__name__}: {str(exc)[:200]}"
    return "ok"


@pytest.mark.parametrize("seed", range(2))
def test_fuzz_sweep_configs(seed, tmp_path):
    """Mutated sweep configs are read, sampled and built without an escaping exception (the
    bench runs each through ``phaze search``)."""
    rng = random.Random(seed)
    failures = []
    for _ in range(40):
        path = mutated_sweep(tmp_path, rng)
        signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(_Timeout()))
        signal.setitimer(signal.ITIMER_REAL, 10.0)
        try:
            verdict = check_sweep(path)
        except _Timeout:
            verdict = "hang (over 10 s)"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
        if verdict not in ("ok", "error"):
            failures.append((path.read_text()[:300], verdict))
    assert not failures, "\n".join(f"{v}\n{t}" for t, v in failures)
