"""Sweep-config validation: every value is checked after evaluation, expressions cost what their
size allows, ranges are never built past what a search uses, and every bad config is one line
with exit status 2 (issue 22: a fuzz of 500 mutated configs found 54 tracebacks or hangs)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import SMALL_SWEEP

from phaze.configio import ConfigError
from phaze.space import ExpressionError, evaluate, load_sweep

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, cfg: dict, name: str = "sweep.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg, width=10 ** 9))
    return p


def placement_options(tmp_path: Path, placement: dict):
    """The placement options :func:`load_sweep` makes of the small sweep with its workload's
    ``placement`` replaced (a ConfigError where the sweep refuses it)."""
    wl = dict(SMALL_SWEEP["workloads"][0], placement=placement)
    return load_sweep(write(tmp_path, dict(SMALL_SWEEP, workloads=[wl]))).workloads[0].options


def space(**dims) -> dict:
    return {"space": {"tensor_units": [27, 54, 108], "tensor_rows": [64, 128], **dims}}


# (change to SMALL_SWEEP, field named, words of the message): each ended in a traceback, a
# MemoryError, a hang or a value the cost model could not take before
BAD = [
    (space(local_sram_kib="64 / (tensor_rows - 64)"), "space.local_sram_kib", "tensor_rows = 64: division by zero"),
    (space(local_sram_kib="(-tensor_rows) ** 0.5"), "space.local_sram_kib", "not a real number"),
    (space(local_sram_kib="ceil(1e400)"), "space.local_sram_kib", "allowed: finite numbers"),
    (space(local_sram_kib="2 ** 10000"), "space.local_sram_kib", "allowed: at most 64"),
    (space(local_sram_kib="9 ** 9 ** 9"), "space.local_sram_kib", "allowed: at most 64"),
    (space(local_sram_kib=" + ".join(["1"] * 50_000)), "space.local_sram_kib", "allowed: at most 500"),
    (space(local_sram_kib="-" * 60 + "1"), "space.local_sram_kib", "nested at most"),
    (space(local_sram_kib="log2(tensor_rows - 64)"), "space.local_sram_kib", "log2(0)"),
    (space(local_sram_kib="tensor_rows ** 60"), "space.local_sram_kib", "must be a number from"),
    (space(vector_lanes="tensor_rows - tensor_rows"), "space.vector_lanes", "got 0.0"),
    (space(vector_units="tensor_rows / 3"), "space.vector_units", "whole number"),
    (space(hbm_gib=[40, 1e308]), "space.hbm_gib[1]", "from 0.001 to"),
    (space(clock_ghz=1e-300), "space.clock_ghz", "from 0.001 to"),
    (space(tensor_cols=1e30), "space.tensor_cols", "whole number from 1 to 16,384"),
    (space(clock_ghz={"low": 1, "high": 2, "step": 1e-9}), "space.clock_ghz.step", "at most 10,000 values"),
    (space(clock_ghz={"low": 1, "high": 1.00000001, "step": 1e-10}), "space.clock_ghz.step", "resolution"),
    (space(tensor_cols={"low": 1, "high": 9, "step": 2.5}), "space.tensor_cols.step", "whole number"),
    (space(hbm_gib={"low": 1, "high": 1e300, "log2": True}), "space.hbm_gib.high", "from 0.001 to"),
    # past the top of the V-f curve: the A100's 1.41 GHz over 1,395 / 1,830 is 1.8497 GHz at its 7 nm;
    # at 16 nm its held clock falls to 1.41 / (1.20 x 1.15) = 1.022 GHz and the top to 1.340
    (space(clock_ghz=[1.41, 1.9]), "space.clock_ghz", "1.9 GHz is past the top of A100-SXM4-80GB's V-f curve at "
     "7 nm, 1.850 GHz"),
    (space(clock_ghz="tensor_units / 20"), "space.clock_ghz", "5.4 GHz is past the top"),
    (dict(space(clock_ghz=1.41), process_node_nm=16), "space.clock_ghz",
     "at 16 nm, 1.340 GHz (its held clock there, 1.022 GHz"),
    ({"process_node_nm": 16, "space": {"tensor_units": [27, 54]}}, "process_node_nm",
     "the template's 1.41 GHz clock is past the top"),
    ({"objectives": [["throughput"]]}, "objectives", "unknown objective"),
    ({"objectives": [{"a": 1}]}, "objectives", "unknown objective"),
    ({"seed": 4294967296}, "seed", "up to 4,294,967,295"),
    ({"trials": 10 ** 30}, "trials", "up to"),
    ({"process_node_nm": 1e-300}, "process_node_nm", "must be from 3 to 16 nm"),
    ({"process_node_nm": 28}, "process_node_nm", "phaze/area.py has public figures for; got 28"),
    ({"link_latency_s": 1e308}, "link_latency_s", "<= 1"),
    ({"constraints": {"area_mm2": 1e308}}, "constraints.area_mm2", "<= 1e+12"),
    ({"workloads": [dict(SMALL_SWEEP["workloads"][0], devices=10 ** 30)]}, "workloads[0].devices", "up to"),
    ({"workloads": [dict(SMALL_SWEEP["workloads"][0], weight=1e308)]}, "workloads[0].weight", "<= 1e+06"),
    ({"workloads": [dict(SMALL_SWEEP["workloads"][0], placement={"tp": [10 ** 30]})]},
     "workloads[0].placement.tp", "up to"),
    ({"workloads": [dict(SMALL_SWEEP["workloads"][0], placement={"recompute": [["full"]]})]},
     "workloads[0].placement.recompute", "subset of"),
    ({"workloads": [dict(SMALL_SWEEP["workloads"][0], placement={"recompute_modules": "norm+act"})]},
     "workloads[0].placement.recompute_modules", "distinct modules of"),
    ({"workloads": [dict(SMALL_SWEEP["workloads"][0], placement={"recompute_modules": ["moe", "moe"]})]},
     "workloads[0].placement.recompute_modules", "distinct modules of"),
]


def test_placement_takes_recompute_modules_and_the_framework_does_not_override_them(tmp_path):
    options = placement_options(tmp_path, {"recompute_modules": "moe_act+layernorm", "framework": "megatron-core"})
    assert options.recompute_modules == ("moe_act", "layernorm")
    assert placement_options(tmp_path, {"framework": "megatron-core"}).recompute_modules == ("core_attn",)


@pytest.mark.parametrize("change,field,words", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_bad_values_name_the_field_and_what_is_allowed(tmp_path, change, field, words):
    t = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        load_sweep(write(tmp_path, dict(SMALL_SWEEP, **change)))
    assert e.value.field == field and words in e.value.message, str(e.value)
    assert len(str(e.value)) < 400, "an error quotes at most a line of the input"
    assert time.perf_counter() - t < 5


def test_expressions_keep_their_values_and_bound_their_cost():
    env = {"tensor_rows": 128.0, "tensor_cols": 64.0}
    assert evaluate("max(1, tensor_rows * tensor_cols / 64)", env) == 128.0
    assert evaluate("8 * tensor_rows", env) == 1024.0
    assert evaluate("2 ** log2(tensor_rows) // 3 + ceil(0.5) - floor(1.5) + min(3, 2, 1)", env) == 43.0
    assert evaluate("-(-tensor_cols) ** 2", env) == -4096.0
    t = time.perf_counter()
    for text in ("9 ** 9 ** 9", "2 ** 1023 * 2 ** 1023 * 4", "(2 ** 64) ** 64 ** 0.5 * 1e300"):
        with pytest.raises(ExpressionError):
            evaluate(text, env)
    assert time.perf_counter() - t < 0.5


def test_every_expression_value_is_checked_on_the_points_it_reads(tmp_path):
    """A division by zero at one corner of a large space is found when the config is read, and
    the error names the values where it fails."""
    cfg = dict(SMALL_SWEEP, space={"tensor_units": {"low": 1, "high": 4096, "step": 1},
                                   "vector_units": {"low": 1, "high": 4096, "step": 1},
                                   "local_sram_kib": "1024 + 1 / (tensor_units * vector_units - 4096 * 4096)",
                                   "vector_lanes": "tensor_units * 0.1 * 10"})   # 0.1 * 10 == 1 up to rounding
    with pytest.raises(ConfigError) as e:
        load_sweep(write(tmp_path, cfg))
    assert e.value.field == "space.local_sram_kib"
    assert "tensor_units = 4096, vector_units = 4096: division by zero" in e.value.message


def laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + f"\nname: *a{levels - 1}\n"


def run_cli(cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phaze.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def test_bad_configs_are_one_line_and_exit_2_through_the_cli(tmp_path):
    """As a user meets them: a billion-laughs YAML of 600 bytes, a recursive alias, a device file
    as the base chip, NSGA-II with a population of one, a seed past NumPy's range, a clock past
    the top of the template's V-f curve."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(laughs() + yaml.safe_dump({k: v for k, v in SMALL_SWEEP.items() if k != "name"}))
    assert len(bomb.read_bytes()) < 1000
    recursive = tmp_path / "recursive.yaml"
    recursive.write_text("name: &a [*a]\n")
    cases = [
        ([str(bomb)], "aliases expand to more than"),
        ([str(recursive)], "recursive alias"),
        ([str(write(tmp_path, dict(SMALL_SWEEP, base="/dev/zero"), "zero.yaml"))], "not a regular file"),
        ([str(write(tmp_path, dict(SMALL_SWEEP, sampler="nsga2", sampler_options={"population_size": 1}),
                    "nsga.yaml"))], "population_size"),
        # a wrong type fails before the study, not when TPE first compares it
        ([str(write(tmp_path, dict(SMALL_SWEEP, sampler="tpe", sampler_options={"n_startup_trials": "x"}),
                    "tpe.yaml"))], "field 'sampler_options.n_startup_trials': must be an int, got 'x'"),
        ([str(write(tmp_path, dict(SMALL_SWEEP, sampler="tpe", sampler_options={"seed": 5}), "seed.yaml"))],
         "field 'sampler_options.seed': is the config's seed"),
        ([str(write(tmp_path, dict(SMALL_SWEEP, sampler="nsga2", sampler_options={"crossover": "x"}), "x.yaml"))],
         "not an option phaze can pass to NSGAIISampler; allowed: population_size, mutation_prob, crossover_prob"),
        ([str(write(tmp_path, SMALL_SWEEP)), "--seed", "4294967296"], "--seed"),
        ([str(write(tmp_path, dict(SMALL_SWEEP, space=space(local_sram_kib="9 ** 9 ** 9")["space"]),
                    "tower.yaml"))], "space.local_sram_kib"),
        # a clock no voltage reaches: refused when read, not priced on an extended V-f line
        ([str(write(tmp_path, dict(SMALL_SWEEP, space=space(clock_ghz=2.0)["space"]), "clock.yaml"))],
         "field 'space.clock_ghz': 2 GHz is past the top of A100-SXM4-80GB's V-f curve"),
    ]
    for args, words in cases:
        r = run_cli(tmp_path, "search", *args, "--storage", f"sqlite:///{tmp_path / 'study.db'}")
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
        assert words in r.stderr and len(r.stderr) < 400, r.stderr[-2000:]


@pytest.mark.parametrize("change,field,words", [
    ({"base": "h100"}, "'base'", "did you mean 'h100-hbm2e-96gb-500w' or 'h100-sxm'"),
    ({"baselines": ["tpuv4", "a100"]}, "'baselines[1]'", "did you mean 'a100-40gb' or 'a100-80gb'"),
    ({"workloads": [dict(SMALL_SWEEP["workloads"][0], workload="llama3.1-405bx")]}, "'workloads[0].workload'",
     "did you mean 'llama3.1-405b'"),
])
def test_an_unknown_name_in_a_sweep_config_names_its_file_and_field(tmp_path, change, field, words):
    """Not the command-line flag (``--arch``) that the loader would name: the user wrote no flag."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(dict(SMALL_SWEEP, **change)))
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    text = str(err.value)
    assert str(path) in text and f"field {field}" in text and words in text and "--" not in text, text


@pytest.mark.parametrize("value, expect", [("node", -1), ("all", 0), ("Node", -1), (16, 16), (None, 0)])
def test_placement_takes_dp_shard(tmp_path, value, expect):
    placement = {} if value is None else {"dp_shard": value}
    assert placement_options(tmp_path, placement).dp_shard == expect
    # the maxtext preset shards within a slice unless the config says otherwise
    got = placement_options(tmp_path, dict(placement, framework="maxtext")).dp_shard
    assert got == (-1 if value is None else expect)


@pytest.mark.parametrize("value", ["half", 0, -2, True, 2.5])
def test_bad_dp_shard_names_the_field(tmp_path, value):
    with pytest.raises(ConfigError) as e:
        placement_options(tmp_path, {"dp_shard": value})
    assert e.value.field == "workloads[0].placement.dp_shard"
    assert "all, node or a positive integer" in e.value.message


@pytest.mark.parametrize("key, value, expect", [
    ("pipe_schedule", None, ("1f1b",)), ("pipe_schedule", "DualPipe", ("dualpipe",)),
    ("pipe_schedule", ["1f1b", "dualpipe", "1f1b"], ("1f1b", "dualpipe")),
    ("offload", None, ("",)), ("offload", "qkv_proj", ("qkv_proj",)),
    ("offload", ["none", "QKV_proj"], ("", "qkv_proj"))])
def test_placement_takes_a_schedule_and_an_offload_or_lists_of_them(tmp_path, key, value, expect):
    options = placement_options(tmp_path, {} if value is None else {key: value})
    assert (options.pipe_schedules if key == "pipe_schedule" else options.offloads) == expect


@pytest.mark.parametrize("key, value, allowed", [
    ("pipe_schedule", "gpipe", "one of 1f1b, dualpipe"), ("pipe_schedule", [], "one of 1f1b, dualpipe"),
    ("pipe_schedule", ["1f1b", 3], "one of 1f1b, dualpipe"), ("offload", "everything", "one of none, qkv_proj"),
    ("offload", [], "one of none, qkv_proj"), ("offload", [True], "one of none, qkv_proj")])
def test_a_bad_schedule_or_offload_names_the_field(tmp_path, key, value, allowed):
    with pytest.raises(ConfigError) as e:
        placement_options(tmp_path, {key: value})
    assert e.value.field == f"workloads[0].placement.{key}" and allowed in e.value.message


def test_offload_on_a_base_chip_without_a_host_link_is_refused_at_load(tmp_path):
    wl = dict(SMALL_SWEEP["workloads"][0], placement={"offload": ["none", "qkv_proj"]})
    with pytest.raises(ConfigError) as e:
        load_sweep(write(tmp_path, dict(SMALL_SWEEP, base="tpuv4", workloads=[wl])))
    assert e.value.field == "workloads[0].placement.offload" and "tpuv4" in e.value.message.lower()


@pytest.mark.parametrize("recompute, refused", [(["none"], True), (["none", "selective"], True), (["block"], False),
                                                (["none", "full"], False)])
def test_offload_without_full_recompute_is_refused_at_load_with_its_field(tmp_path, recompute, refused):
    """An offload runs beside a full recompute: a config whose recompute modes have no full (block
    brings it) is refused when it is read, naming the file's field (the search used to stop at its
    first trial naming place's flag, --offload)."""
    wl = dict(SMALL_SWEEP["workloads"][0], placement={"offload": ["none", "qkv_proj"], "recompute": recompute})
    path = write(tmp_path, dict(SMALL_SWEEP, base="a100-80gb", workloads=[wl]))
    if not refused:
        assert load_sweep(path).workloads[0].options.offloads == ("", "qkv_proj")
        return
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    assert e.value.source == str(path) and e.value.field == "workloads[0].placement.offload"
    assert "allowed: none, or add full" in e.value.message


@pytest.mark.parametrize("value, expect", [(None, (0, 1)), (3, (3,)), ([3, 0, 3], (0, 3)),
                                           ([0, 1, 2, 3], (0, 1, 2, 3))])
def test_placement_zero_is_a_stage_or_a_list_of_them(tmp_path, value, expect):
    """``placement.zero`` takes what ``--zero`` takes: one stage, or a list of them to search (a
    list was refused as 'must be an integer')."""
    options = placement_options(tmp_path, {} if value is None else {"zero": value})
    assert options.zero_stages == expect


@pytest.mark.parametrize("value", [4, -1, True, [], [0, 5], "1", 1.5])
def test_a_bad_zero_names_the_field_and_what_is_allowed(tmp_path, value):
    with pytest.raises(ConfigError) as e:
        placement_options(tmp_path, {"zero": value})
    assert e.value.field == "workloads[0].placement.zero"
    assert "must be 0, 1, 2 or 3 or a non-empty list of them" in e.value.message
