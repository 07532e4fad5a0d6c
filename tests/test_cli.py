"""``phaze evaluate`` as a user runs it: from an unrelated directory, through ``python -m``.

Project rule under test: bad input (malformed YAML, a negative size, a plan that does not fit
the model or the cluster, ...) gives exactly ONE stderr line naming the file or flag, the field
and what is allowed, exit status 2, nothing on stdout and never a traceback.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import phaze

ROOT = Path(__file__).resolve().parent.parent
GiB = 2.0 ** 30

GPT3 = ["--workload", "gpt3-175b", "--arch", "a100-80gb"]
GOOD_PLAN = "tp=8,pp=16,mbs=1,recompute=full"
GOOD = ["evaluate", *GPT3, "--devices", "1024", "--global-batch", "1536", "--plan", GOOD_PLAN]

# A valid workload written out in full, so these tests do not depend on the shipped files
# (GPT-3 175B, Brown et al. 2020, Table 2.1).
WORKLOAD = {
    "name": "test-gpt", "architecture": "decoder", "layers": 96, "hidden": 12288, "heads": 96,
    "ffn_hidden": 49152, "activation": "gelu", "vocab": 50257, "seq_len": 2048,
    "position_embedding": "learned", "tied_embeddings": True, "precision": "fp16",
}


def phaze_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phaze.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Assert the project's error contract and return the line."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.strip()
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    return line


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def evaluate_workload(tmp_path: Path, workload: Path) -> subprocess.CompletedProcess:
    return phaze_cli(tmp_path, "evaluate", "--workload", str(workload), "--arch", "a100-80gb",
                     "--devices", "1024", "--global-batch", "1536", "--plan", GOOD_PLAN)


def evaluate_chip(tmp_path: Path, chip: Path) -> subprocess.CompletedProcess:
    return phaze_cli(tmp_path, "evaluate", "--workload", "gpt3-175b", "--arch", str(chip),
                     "--devices", "1024", "--global-batch", "1536", "--plan", GOOD_PLAN)


# --- workload files --------------------------------------------------------------------------
def test_valid_workload_copy_runs(tmp_path):
    """Control: the unmodified workload runs, so each failure below is due to its one change."""
    proc = evaluate_workload(tmp_path, write_yaml(tmp_path / "w.yaml", WORKLOAD))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "test-gpt" in proc.stdout


@pytest.mark.parametrize("change, field, allowed", [
    ({"layers": None}, "layers", "missing (required)"),
    ({"hidden": -1024}, "hidden", "positive integer"),
    ({"heads": 0}, "heads", "positive integer"),
    ({"colour": "blue"}, "colour", "unknown key; allowed keys here: activation"),
    ({"precision": "fp4"}, "precision", "fp32, fp16, bf16, fp8"),
    ({"fp8_casts": "maybe"}, "fp8_casts", "fused, separate, te-linear"),
    ({"bias_kernels": "epilogue"}, "bias_kernels", "fused, separate"),
    ({"recompute_rerun": "some"}, "recompute_rerun", "whole, needed"),
    ({"rotary_kernels": "triton"}, "rotary_kernels", "fused, complex, separate"),
    ({"kv_repeat": "expand"}, "kv_repeat", "grouped, copied"),
    ({"softmax_kernel": "apex"}, "softmax_kernel", "fused, megatron"),
    ({"rotary_dim": 4096}, "rotary_dim", "even width up to head_dim"),
    ({"rotary_dim": 31}, "rotary_dim", "even width up to head_dim"),
    ({"hidden": 12288.5}, "hidden", "positive integer"),
    ({"hidden": "big"}, "hidden", "positive integer"),
], ids=["missing-layers", "negative-hidden", "zero-heads", "unknown-key", "bad-precision", "bad-fp8-casts",
        "bad-bias-kernels", "bad-recompute-rerun", "bad-rotary-kernels", "bad-kv-repeat", "bad-softmax-kernel",
        "wide-rotary-dim",
        "odd-rotary-dim", "fractional-hidden", "string-hidden"])
def test_bad_workload_field(tmp_path, change, field, allowed):
    data = {k: v for k, v in {**WORKLOAD, **change}.items() if v is not None}
    path = write_yaml(tmp_path / "w.yaml", data)
    one_line_error(evaluate_workload(tmp_path, path), str(path), f"field '{field}'", allowed)


def test_evaluate_says_when_megatrons_softmax_kernel_cannot_run(tmp_path):
    # GPT-2 XL's 25 heads: micro-batch 1 is 25 rows, off the kernel's multiples of 4; 4 is on them
    args = ("evaluate", "--workload", "gpt2-xl", "--arch", "a100-80gb", "--devices", "4", "--global-batch", "16",
            "--seq-len", "1024", "--framework", "megatron-deepspeed")
    off = phaze_cli(tmp_path, *args, "--plan", "tp=1,mbs=1")
    on = phaze_cli(tmp_path, *args, "--plan", "tp=1,mbs=4")
    assert off.returncode == on.returncode == 0, off.stderr + on.stderr
    line = [x for x in off.stdout.splitlines() if x.strip().startswith("softmax ")]
    assert len(line) == 1 and "25 rows, not a multiple of 4" in line[0] and "fp32" in line[0]
    assert "softmax_kernel=megatron" in off.stdout
    assert not [x for x in on.stdout.splitlines() if x.strip().startswith("softmax ")]
    flash = phaze_cli(tmp_path, *args, "--plan", "tp=1,mbs=1,attention=flash")
    assert not [x for x in flash.stdout.splitlines() if x.strip().startswith("softmax ")]
    # place says it of the best plan it lists
    where = ("place", "--workload", "gpt2-xl", "--arch", "a100-80gb", "--devices", "4", "--global-batch", "16",
             "--seq-len", "1024", "--framework", "megatron-deepspeed", "--tp", "1", "--pp", "1")
    forced, free = phaze_cli(tmp_path, *where, "--mbs", "1"), phaze_cli(tmp_path, *where, "--mbs", "1,4")
    assert forced.returncode == free.returncode == 0, forced.stderr + free.stderr
    line = [x for x in forced.stdout.splitlines() if x.strip().startswith("softmax ")]
    assert len(line) == 1 and "the best plan's" in line[0] and "25 rows, not a multiple of 4" in line[0]
    assert "mbs=4" in free.stdout.split("plan", 1)[1].splitlines()[0]      # the kernel's shapes win
    assert not [x for x in free.stdout.splitlines() if x.strip().startswith("softmax ")]

@pytest.mark.parametrize("text", ["name: x\nlayers: [96\n", "name: x\n  layers: 3\n: :\n"],
                         ids=["unclosed-list", "bad-indent"])
def test_malformed_workload_yaml(tmp_path, text):
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    one_line_error(evaluate_workload(tmp_path, path), str(path), "not valid YAML", "line")


@pytest.mark.parametrize("text", ["", "- 1\n- 2\n"], ids=["empty", "list"])
def test_workload_not_a_mapping(tmp_path, text):
    path = tmp_path / "w.yaml"
    path.write_text(text)
    one_line_error(evaluate_workload(tmp_path, path), str(path), "must be a mapping")


def test_workload_file_missing(tmp_path):
    path = tmp_path / "nope.yaml"
    one_line_error(evaluate_workload(tmp_path, path), str(path), "file not found")


def test_unknown_shipped_workload(tmp_path):
    proc = phaze_cli(tmp_path, "evaluate", "--workload", "gpt-9000", "--arch", "a100-80gb",
                     "--devices", "8", "--global-batch", "8")
    one_line_error(proc, "--workload", "'gpt-9000'", "shipped:", "gpt3-175b")


def test_bad_hf_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_embd": 1600, "n_layer": 48,
                                "n_head": 0, "vocab_size": 50257}))
    one_line_error(evaluate_workload(tmp_path, path), str(path), "field 'num_attention_heads'",
                   "positive integer")


# --- chip files ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def a100() -> dict:
    return yaml.safe_load((ROOT / "arch_configs" / "a100-80gb.yaml").read_text())


def test_valid_chip_copy_runs(tmp_path, a100):
    proc = evaluate_chip(tmp_path, write_yaml(tmp_path / "chip.yaml", a100))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


@pytest.mark.parametrize("key, value, field, allowed", [
    ("hbm_bytes", None, "hbm_bytes", "missing (required)"),
    ("hbm_bandwidth_bytes_per_s", -2.039e12, "hbm_bandwidth_bytes_per_s", "must be a number > 0"),
    ("colour", "blue", "colour", "unknown key; allowed keys here:"),
], ids=["missing-hbm", "negative-bandwidth", "unknown-key"])
def test_bad_chip_field(tmp_path, a100, key, value, field, allowed):
    data = dict(a100)
    if value is None:
        del data[key]
    else:
        data[key] = value
    path = write_yaml(tmp_path / "chip.yaml", data)
    one_line_error(evaluate_chip(tmp_path, path), str(path), f"field '{field}'", allowed)


def test_bad_chip_nested_field(tmp_path, a100):
    data = dict(a100, tensor_units=dict(a100["tensor_units"], rows=-32))
    path = write_yaml(tmp_path / "chip.yaml", data)
    one_line_error(evaluate_chip(tmp_path, path), str(path), "field 'tensor_units.rows'",
                   "positive integer")


def test_unknown_shipped_chip(tmp_path):
    proc = phaze_cli(tmp_path, "evaluate", "--workload", "gpt3-175b", "--arch", "tpu-v9",
                     "--devices", "8", "--global-batch", "8")
    one_line_error(proc, "--arch", "'tpu-v9'", "shipped:", "a100-80gb")


# --- plans -----------------------------------------------------------------------------------
@pytest.mark.parametrize("devices, batch, plan, needles", [
    (1024, 1536, "tp=7", ["--plan", "field 'tp'", "must divide the heads (96)",
                          "allowed: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96"]),
    (1000, 1536, "tp=8,pp=16", ["--plan", "field 'tp*pp*cp'", "8*16*1 = 128", "devices (1000)"]),
    (1024, 1536, "tp=8,speed=11", ["--plan", "field 'speed'", "unknown key",
                                   "allowed: tp, pp, mbs, recompute"]),
    (1024, 1536, "recompute=sometimes", ["--plan", "field 'recompute'", "none, selective, op, full",
                                         "'sometimes'"]),
    (1024, 1536, "tp=8,pp=16,mbs=0", ["--plan", "field 'mbs'", "positive integer", "'0'"]),
    (1024, 1540, "tp=8,pp=16", ["--global-batch", "multiple of dp*mbs = 8*1 = 8", "1540"]),
    (1024, 1536, "tp=8,vp=2", ["--plan", "field 'vp'", "pp > 1"]),
    (1024, 1536, "zero=4", ["--plan", "field 'zero'", "0, 1, 2 or 3"]),
    (1024, 1536, "sp=maybe", ["--plan", "field 'sp'", "true or false"]),
    (1024, 1536, "tp", ["--plan", "field 'tp'", "expected key=value"]),
    (1024, 1536, "=8", ["--plan", "expected key=value", "'=8'"]),
    (1024, 1536, "tp=\u00b2", ["--plan", "field 'tp'", "positive integer"]),
    (1024, 1536, "tp=8,pp=16,tp=4", ["--plan", "field 'tp'", "given twice"]),
], ids=["tp-not-dividing-heads", "width-not-dividing-devices", "unknown-key", "bad-recompute",
        "zero-mbs", "batch-not-multiple", "vp-without-pp", "zero-out-of-range", "bad-bool",
        "no-value", "no-key", "unicode-digit", "duplicate-key"])
def test_bad_plan(tmp_path, devices, batch, plan, needles):
    proc = phaze_cli(tmp_path, "evaluate", *GPT3, "--devices", str(devices),
                     "--global-batch", str(batch), "--plan", plan)
    one_line_error(proc, *needles)


OOM = ["evaluate", *GPT3, "--devices", "8", "--global-batch", "8", "--plan", "tp=8"]


def test_model_that_does_not_fit(tmp_path):
    line = one_line_error(phaze_cli(tmp_path, *OOM), "--plan", "does not fit", "GiB",
                          "A100-SXM4-80GB has 80.0 GiB", "--allow-oom")
    needed = float(re.search(r"needs ([\d.]+) GiB per device", line).group(1))
    assert needed > 80.0
    # the figure matches what --allow-oom reports
    proc = phaze_cli(tmp_path, *OOM, "--allow-oom", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert not r["fits"]
    assert needed == pytest.approx(r["memory_per_device_bytes"] / GiB, abs=0.051)


def test_allow_oom_prints_result(tmp_path):
    proc = phaze_cli(tmp_path, *OOM, "--allow-oom")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "DOES NOT FIT" in proc.stdout
    assert "step time" in proc.stdout


# --- argparse-level errors -------------------------------------------------------------------
@pytest.mark.parametrize("args, needles", [
    (["evaluate", *GPT3, "--devices", "-3", "--global-batch", "8"],
     ["--devices", "positive integer", "'-3'"]),
    (["evaluate", *GPT3, "--devices", "1.5", "--global-batch", "8"], ["--devices", "'1.5'"]),
    (["evaluate", *GPT3, "--devices", "8", "--global-batch", "0"], ["--global-batch", "'0'"]),
    (["evaluate", "--workload", "gpt3-175b", "--devices", "8", "--global-batch", "8"],
     ["required", "--arch"]),
    (["evaluate", *GPT3, "--devices", "8", "--global-batch", "8", "--format", "xml"],
     ["--format", "text", "json"]),
    (["evaluate", *GPT3, "--devices", "8", "--global-batch", "8", "--bogus"],
     ["--bogus", "'phaze --help'"]),
    ([], ["required", "command", "'phaze --help'"]),
], ids=["negative-devices", "fractional-devices", "zero-batch", "missing-arch", "bad-format",
        "unknown-option", "no-command"])
def test_argparse_errors(tmp_path, args, needles):
    line = one_line_error(phaze_cli(tmp_path, *args), *needles)
    assert "phaze phaze" not in line


# --- a good run ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_json(tmp_path_factory) -> dict:
    proc = phaze_cli(tmp_path_factory.mktemp("run"), *GOOD, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return json.loads(proc.stdout)


def test_json_invariants(cli_json):
    r = cli_json
    B, s, l, h, V = 1536, 2048, 96, 12288, 50257
    assert r["devices"] == 1024 and r["global_batch"] == B
    assert r["dp"] == 1024 // (8 * 16)                     # 8
    assert r["micro_batches"] == B // (r["dp"] * 1)         # 192
    assert r["dp"] == 8 and r["micro_batches"] == 192
    assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * s, rel=1e-12)
    assert r["samples_per_s"] == pytest.approx(B / r["step_time_s"], rel=1e-12)
    assert sum(r["breakdown_s"].values()) == pytest.approx(r["step_time_s"], rel=1e-9)
    assert all(v >= 0 for v in r["breakdown_s"].values())
    # MFU against the chip's 16-bit peak: the library takes it from the tensor units
    # (108 SMs x 1024 MAC x 2 FLOP x 1.41 GHz = 311.87 TFLOP/s), 0.04 % under the 312 of the
    # datasheet; exact against the former, within 0.1 % against the latter
    peak = 108 * 1024 * 2 * 1.41e9
    assert phaze.load_chip("a100-80gb").peak_flops("fp16") == pytest.approx(peak, rel=1e-12)
    assert r["mfu"] == pytest.approx(r["model_flops_per_step"] / (r["step_time_s"] * 1024 * peak),
                                     rel=1e-12)
    assert r["mfu"] == pytest.approx(r["model_flops_per_step"] / (r["step_time_s"] * 1024 * 312e12),
                                     rel=1e-3)
    narayanan = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    assert r["model_flops_per_step"] == pytest.approx(narayanan, rel=0.01)
    assert 0 < r["mfu"] < r["hfu"] <= 1          # full recompute: hardware does more than the model
    assert r["fits"] is True
    assert len(r["stage_memory"]) == 16
    assert r["memory_per_device_bytes"] == max(m["total_bytes"] for m in r["stage_memory"])
    assert r["memory_per_device_bytes"] <= r["hbm_bytes"] == 80 * GiB
    assert sum(m["layers"] for m in r["stage_memory"]) == l


def test_python_api_matches_cli(cli_json):
    r = phaze.evaluate("gpt3-175b", "a100-80gb", 1024, 1536, GOOD_PLAN)
    assert r.step_time_s == pytest.approx(cli_json["step_time_s"], rel=1e-12)
    assert r.to_dict()["breakdown_s"] == pytest.approx(cli_json["breakdown_s"], rel=1e-12)


def test_python_api_raises_config_error():
    with pytest.raises(phaze.ConfigError) as info:
        phaze.evaluate("gpt3-175b", "a100-80gb", 1024, 1536, "tp=7")
    assert info.value.source == "plan" and info.value.field == "tp"     # the parameter, not a CLI flag
    assert "allowed" in str(info.value) and "--" not in str(info.value)


def test_text_format(tmp_path, cli_json):
    proc = phaze_cli(tmp_path, *GOOD)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    out = proc.stdout
    assert re.search(rf"step time\s+{cli_json['step_time_s']:.3f} s", out)
    labels = {"compute_s": "compute (tensor units)", "memory_bound_s": "memory-bound ops",
              "communication_exposed_s": "exposed communication",
              "pipeline_bubble_s": "pipeline bubble", "optimizer_s": "optimizer step"}
    assert set(labels) == set(cli_json["breakdown_s"])
    for key, label in labels.items():
        value = cli_json["breakdown_s"][key]
        assert re.search(rf"{re.escape(label)}\s+{value:.3f} s", out), (label, out)
    # the exposed communication by group, under its line: the tensor-parallel collectives, the
    # pipeline's sends and the gradients' reduction of this plan
    groups = cli_json["communication_by_group_s"]
    assert sum(groups.values()) == pytest.approx(cli_json["breakdown_s"]["communication_exposed_s"], rel=1e-9)
    shown = {"tensor_parallel_s": "tensor-parallel", "pipeline_parallel_s": "pipeline sends",
             "data_parallel_s": "data-parallel"}
    assert {k for k, v in groups.items() if v > 0} == set(shown)
    block = out.split("exposed communication")[1].split("pipeline bubble")[0]
    for key, label in shown.items():
        assert re.search(rf"\n      {re.escape(label)}\s+{groups[key]:.3f} s", block), (label, block)
    assert "fits" in out and "DOES NOT FIT" not in out


# --- issue 14: no hangs, no tracebacks, errors that name the real flag ------------------------
PLACE = ["place", *GPT3, "--devices", "1024", "--global-batch", "1536"]


def timed_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Every bad command line answers within 10 s (the process start included)."""
    import time
    t = time.perf_counter()
    proc = phaze_cli(cwd, *args)
    assert time.perf_counter() - t < 10, args
    return proc


@pytest.mark.parametrize("args, needles", [
    (["place", *GPT3, "--devices", "1000000000000", "--global-batch", "1536"],
     ["--devices", "up to 16,777,216"]),
    (["evaluate", *GPT3, "--devices", "1000000000000", "--global-batch", "1000000000000"],
     ["--devices", "up to 16,777,216"]),
    (["evaluate", *GPT3, "--devices", "8", "--global-batch", "1" + "0" * 30], ["--global-batch", "up to"]),
    (["place", *GPT3, "--devices", "1024", "--global-batch", "1" + "0" * 30], ["--global-batch", "up to"]),
    (["evaluate", *GPT3, "--devices", "8", "--global-batch", "8", "--seq-len", "1" + "0" * 12],
     ["--seq-len", "up to"]),
    ([*PLACE, "--global-batch", "1537"], ["--global-batch", "1,537", "not a multiple of dp*mbs",
                                          "nearest that work: 1,536 or 1,538"]),
    ([*PLACE, "--pp", "128"], ["--pp", "128 exceeds the layers (96)", "allowed", "64"]),
    ([*PLACE, "--tp", "3"], ["--tp", "3 does not divide the devices (1024)", "allowed: 1, 2, 4, 8"]),
    (["place", *GPT3, "--devices", "1048576", "--global-batch", "1536"],
     ["--global-batch", "nearest that work: 2,048", "at most 786,432 devices"]),
    ([*PLACE, "--baseline", "tp=7"], ["--baseline", "field 'tp'", "must divide the heads"]),
    ([*PLACE, "--baseline", "tp=8,warp=9"], ["--baseline", "field 'warp'", "unknown key"]),
    ([*PLACE, "--zero", "4"], ["--zero", "0,1,2,3"]),
    ([*PLACE, "--dp-shard", "half"], ["--dp-shard", "all, node or a positive integer"]),
    (["evaluate", *GPT3, "--devices", "1024", "--global-batch", "1536", "--plan", "tp=8,pp=16,zero=1,dp_shard=3"],
     ["--plan", "field 'dp_shard'", "must divide the data-parallel ranks (dp = 8)",
      "allowed: 1, 2, 4, 8, a multiple of 8, all or node"]),
    ([*PLACE, "--cp-comm", "ring"], ["--cp-comm", "must be one of p2p, all_gather, a2a, a2a+p2p, torch, got 'ring'"]),
    ([*PLACE, "--cp-comm", "a2a+p2p,p2p,ring"], ["--cp-comm", "must be one of p2p", "got 'ring'"]),
    (["evaluate", *GPT3, "--devices", "1024", "--global-batch", "1536", "--seq-len", "8192", "--plan",
      "tp=8,pp=16,cp=2,cp_comm=a2a+p2p"], ["--plan", "field 'cp_a2a'", "a2a+p2p needs an all-to-all group",
                                          "allowed: none at cp 2: use p2p or a2a"]),
    (["evaluate", *GPT3, "--devices", "1024", "--global-batch", "1536", "--seq-len", "8192", "--plan",
      "tp=8,pp=16,cp=8,cp_comm=a2a"], ["--plan", "field 'cp_comm'", "cp (8) must divide the query heads (12)"]),
    ([*PLACE, "--memory-reserve", "-1"], ["--memory-reserve", "GiB >= 0"]),
    ([*PLACE, "--memory-reserve", "90"], ["--arch", "nothing fits", "reserve", "--memory-reserve"]),
    ([*PLACE, "--pipe-schedule", "1f1b,gpipe"], ["--pipe-schedule", "must be one of 1f1b, dualpipe", "got 'gpipe'"]),
    ([*PLACE, "--pipe-schedule", "dualpipe", "--pp", "1"], ["--pipe-schedule", "no DualPipe plan fits",
                                                            "an even pp", "allowed: 1f1b"]),
    ([*PLACE, "--offload", "none,kv"], ["--offload", "must be one of none, qkv_proj", "got 'kv'"]),
    ([*PLACE, "--offload", "qkv_proj", "--arch", "tpuv4"], ["--offload", "host_bandwidth_bytes_per_s",
                                                            "allowed: none"]),
    (["evaluate", *GPT3, "--devices", "1024", "--global-batch", "1536", "--plan",
      "tp=8,pp=16,recompute=full,offload=qkv_proj,pipe_schedule=dualpipe"],
     ["--plan", "field 'pipe_schedule'", "not modelled with activation offload"]),
    (["place", "--workload", "nemotron-h-4b", "--arch", "h100-sxm", "--devices", "16", "--global-batch", "64",
      "--seq-len", "1024", "--offload", "qkv_proj"], ["--offload", "not modelled for a hybrid", "allowed: no offload"]),
    ([*PLACE, "--arch", "h100-sxm", "--offload", "qkv_proj", "--pipe-schedule", "dualpipe"],
     ["--pipe-schedule", "no DualPipe plan fits", "no offload", "allowed: 1f1b"]),
], ids=["place-1e12-devices", "evaluate-1e12-devices", "evaluate-1e30-batch", "place-1e30-batch",
        "huge-seq-len", "batch-1537", "pp-128", "tp-3", "2^20-devices", "bad-baseline-plan",
        "bad-baseline-key", "zero-4", "bad-dp-shard", "dp-shard-3", "bad-cp-comm", "place-ring-in-list",
        "a2a+p2p-at-cp-2",
        "a2a-heads", "negative-reserve",
        "reserve-larger-than-hbm", "bad-pipe-schedule", "dualpipe-at-pp-1", "bad-offload", "offload-on-tpuv4",
        "dualpipe-with-offload", "offload-on-a-hybrid", "dualpipe-only-with-offload"])
def test_bad_sizes_and_layouts_name_the_flag(tmp_path, args, needles):
    line = one_line_error(timed_cli(tmp_path, *args), *needles)
    assert "no valid layout: no tp in the options" not in line


def test_default_plan_that_does_not_fit_says_it_was_not_given(tmp_path):
    proc = timed_cli(tmp_path, "evaluate", *GPT3, "--devices", "8", "--global-batch", "8")
    one_line_error(proc, "--plan", "no plan given", "default plan (tp=1,pp=1,mbs=1", "phaze place")


@pytest.mark.parametrize("flag", ["--workload", "--arch", "--params"])
@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"\xff\xfe\x00garbage", b""],
                         ids=["binary", "utf16-ish", "empty"])
def test_binary_or_empty_file_is_one_line(tmp_path, flag, content):
    path = tmp_path / "blob.yaml"
    path.write_bytes(content)
    args = {"--workload": "gpt3-175b", "--arch": "a100-80gb"}
    args[flag] = str(path)
    argv = ["evaluate", "--devices", "8", "--global-batch", "8"]
    for k, v in args.items():
        argv += [k, v]
    line = one_line_error(timed_cli(tmp_path, *argv), str(path))
    assert "not a text file" in line or "must be a mapping" in line or "not valid" in line


def test_directory_as_file_is_one_line(tmp_path):
    proc = timed_cli(tmp_path, "evaluate", *GPT3, "--devices", "8", "--global-batch", "8", "--params", str(tmp_path))
    one_line_error(proc, str(tmp_path), "is a directory")


@pytest.mark.parametrize("args", [GOOD, [*PLACE, "--tp", "8", "--mbs", "1"]], ids=["evaluate", "place"])
def test_closed_pipe_is_one_line(tmp_path, args):
    """``phaze ... | head -1``: the reader closes the pipe; phaze ends with one line, status 2."""
    proc = subprocess.Popen([sys.executable, "-m", "phaze.cli", *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()             # the reader is gone before anything is written
    err = proc.stderr.read()
    assert proc.wait(timeout=30) == 2, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert len(err.splitlines()) == 1 and "broken pipe" in err


def _through_pipe(tmp_path, reader: list[str]) -> tuple[int, int, str]:
    """``phaze evaluate ... | <reader>`` through a real pipe, stdout block-buffered as a user's
    shell has it: (phaze's status, the reader's, phaze's stderr)."""
    import os
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    phaze_proc = subprocess.Popen([sys.executable, "-m", "phaze.cli", *GOOD], cwd=tmp_path, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reader_proc = subprocess.Popen(reader, stdin=phaze_proc.stdout, stdout=subprocess.DEVNULL)
    phaze_proc.stdout.close()       # only the reader holds the read end now
    err = phaze_proc.stderr.read()
    return phaze_proc.wait(timeout=60), reader_proc.wait(timeout=60), err


def test_a_reader_that_leaves_unread_through_a_real_pipe_exits_2(tmp_path):
    """docs/cli.md: a reader that leaves before phaze has written (``| true``) cuts the output
    short: one line, status 2, although the output fits in the pipe's buffer."""
    rc, true_rc, err = _through_pipe(tmp_path, ["sh", "-c", "exec 0<&-; sleep 0"])
    assert (rc, true_rc) == (2, 0), err
    assert len(err.splitlines()) == 1 and "broken pipe" in err and "Traceback" not in err, err


def test_head_1_through_a_real_pipe_is_never_a_traceback(tmp_path):
    """``| head -1``: status 2 when head left before phaze finished writing, 0 when the whole
    printout was already in the pipe (delivered); never a traceback or a second line."""
    rc, head_rc, err = _through_pipe(tmp_path, ["head", "-1"])
    assert head_rc == 0 and rc in (0, 2), err
    assert "Traceback" not in err and len(err.splitlines()) == (1 if rc == 2 else 0), err


def test_reader_that_reads_everything_exits_0(tmp_path):
    rc, cat_rc, err = _through_pipe(tmp_path, ["cat"])
    assert (rc, cat_rc, err) == (0, 0, "")


def test_kv_head_replication_is_stated(tmp_path):
    proc = timed_cli(tmp_path, "evaluate", "--workload", "llama3-70b", "--arch", "h100-sxm", "--devices", "64",
                     "--global-batch", "64", "--plan", "tp=16,pp=4,recompute=full", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    note = json.loads(proc.stdout)["assumptions"]["kv_heads"]
    assert "8 KV heads" in note and "replicated on 2" in note


def test_evaluate_states_what_it_assumed(tmp_path):
    proc = timed_cli(tmp_path, *GOOD, "--format", "json")
    a = json.loads(proc.stdout)["assumptions"]
    assert "2048" in a["sequence_length"]
    assert "zero=0" in a["plan_defaults"] and "attention=flash" in a["plan_defaults"]
    assert "tp=1" not in a["plan_defaults"]            # given
    assert "A100-SXM4-80GB" in a["chip"] and "nvlink" in a["system"] and "1024 chips" in a["system"]
    assert "modelled" in a["memory_reserve"] and "calibration" in a["efficiency"]
    text = timed_cli(tmp_path, *GOOD).stdout
    assert "assumed:" in text and "plan defaults" in text and "headroom" in text


def test_hf_config_sequence_length_is_stated(tmp_path):
    cfg = dict(model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768,
               tie_word_embeddings=False, rms_norm_eps=1e-5, hidden_act="silu", sliding_window=4096)
    path = tmp_path / "mistral" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    proc = timed_cli(tmp_path, "evaluate", "--workload", str(path), "--arch", "h100-sxm", "--devices", "8",
                     "--global-batch", "8", "--plan", "tp=8", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    a = json.loads(proc.stdout)["assumptions"]
    assert "32768 capped at 8192" in a["sequence_length"] and "--seq-len" in a["sequence_length"]
    assert "sliding-window attention over 4096" in a["attention_window"]


@pytest.mark.parametrize("fixture, total", [("llama-2-7b", 6_738_415_616), ("gpt2-xl", 1_557_611_200)])  # checkpoints
def test_evaluate_prints_the_parameter_count_of_a_hf_config(tmp_path, fixture, total):
    """The count a user checks a Hugging Face config's reading against (Llama-2-7B: 6.74 B)."""
    config = ROOT / "tests" / "data" / "hf" / fixture / "config.json"
    args = ["evaluate", "--workload", str(config), "--arch", "a100-80gb", "--devices", "8", "--global-batch", "8",
            "--plan", "tp=1", "--allow-oom"]
    text = timed_cli(tmp_path, *args)
    assert text.returncode == 0, text.stderr
    line = text.stdout.splitlines()[1]
    assert line.split() == ["parameters", f"{total / 1e9:.2f}", "B", f"({total:,})"], line
    r = json.loads(timed_cli(tmp_path, *args, "--format", "json").stdout)
    assert r["params"] == r["active_params"] == total


def test_evaluate_prints_total_and_active_parameters_of_a_moe(tmp_path):
    proc = timed_cli(tmp_path, "evaluate", "--workload", "mixtral-8x7b", "--arch", "a100-80gb", "--devices", "8",
                     "--global-batch", "8", "--plan", "tp=8", "--allow-oom")
    line = proc.stdout.splitlines()[1]
    # Mixtral 8x7B: 46.7 B parameters, 12.9 B active per token (arXiv:2401.04088)
    assert re.fullmatch(r"  parameters +46\.70 B \(46,70[\d,]+\) total, 12\.88 B \(12,8[\d,]+\) active per token",
                        line), line


def test_sequence_length_is_not_said_twice(tmp_path):
    config = ROOT / "tests" / "data" / "hf" / "llama-2-7b" / "config.json"
    for extra in ([], ["--seq-len", "8192"]):
        proc = timed_cli(tmp_path, "evaluate", "--workload", str(config), "--arch", "a100-80gb", "--devices", "8",
                         "--global-batch", "8", "--plan", "tp=8", *extra)
        line = next(x for x in proc.stdout.splitlines() if x.strip().startswith("sequence length"))
        assert line.count("sequence length") == 1, line


@pytest.mark.parametrize("plan, offered, not_offered", [
    ("tp=8,zero=1", ["recompute=full"], ["zero=", "larger tp", "smaller mbs"]),     # dp=1: ZeRO shards nothing
    ("tp=8,recompute=full,zero=1", [], ["recompute=full", "zero=", "larger tp", "mbs"]),
    ("tp=2,pp=4,recompute=full,mbs=2", ["a smaller mbs"], ["recompute=full", "zero=", "larger tp"]),
])
def test_does_not_fit_hint_offers_only_changes_that_change_something(tmp_path, plan, offered, not_offered):
    line = one_line_error(timed_cli(tmp_path, "evaluate", *GPT3, "--devices", "8", "--global-batch", "8",
                                    "--plan", plan), "does not fit", "--allow-oom")
    hint = line.split("allowed:")[1]
    for text in offered:
        assert text in hint, line
    for text in not_offered:
        assert text not in hint, line


def test_does_not_fit_hint_offers_the_next_zero_stage(tmp_path):
    line = one_line_error(timed_cli(tmp_path, "evaluate", *GPT3, "--devices", "64", "--global-batch", "64",
                                    "--plan", "tp=8,zero=1"), "does not fit")
    assert "zero=2" in line and "zero=1" not in line.split("allowed:")[1], line


def test_help_lists_every_plan_key_and_option():
    from phaze.cli import build_parser
    from phaze.plan import PLAN_KEYS
    sub = build_parser()._subparsers._group_actions[0].choices
    plan_help = next(a.help for a in sub["evaluate"]._actions if "--plan" in a.option_strings)
    for key in PLAN_KEYS:
        assert key in plan_help, key
    place_actions = {a.option_strings[0]: a for a in sub["place"]._actions if a.option_strings}
    for flag in ("--recompute", "--zero", "--attention", "--memory-reserve", "--tp", "--mbs"):
        assert place_actions[flag].help, flag
    sched = next(a for a in sub["schedule"]._actions if "--attention" in a.option_strings)
    assert "flash2" in sched.choices


def test_place_baseline_is_megatron_style_and_named(tmp_path):
    proc = timed_cli(tmp_path, *PLACE, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "Megatron-style: tp=8" in out["baseline_kind"]
    assert out["baseline"]["plan"].startswith("tp=8,") and "stages=" not in out["baseline"]["plan"]
    assert out["best_is_baseline"] == (out["best"]["plan"] == out["baseline"]["plan"])
    text = timed_cli(tmp_path, *PLACE).stdout
    assert "baseline (Megatron-style" in text and "free GiB" in text


def test_gantt_colours_by_operator_kind(tmp_path):
    """One colour per operator kind across both phases, a legend, shares in the labels."""
    from phaze.schedule import op_kind
    assert {op_kind(n) for n in ("qkv", "qkv.dgrad", "qkv.wgrad", "recompute.qkv", "qkv.fp8_cast",
                                 "qkv.input_all_gather")} == {"qkv"}
    assert op_kind("ffn_down.reduce_scatter.bwd") == "ffn_down.reduce_scatter"
    assert op_kind("flash_attention.bwd") == "flash_attention"
    out = tmp_path / "g.svg"
    proc = timed_cli(tmp_path, "schedule", "--workload", "gpt2-xl", "--arch", "tpuv4", "--tp", "1",
                     "--gantt", str(out))
    assert proc.returncode == 0, proc.stderr
    svg = out.read_text()
    assert "share of the unit pool" in svg and "ffn_up" in svg


def test_validate_reads_a_csv_with_a_byte_order_mark(tmp_path):
    """A spreadsheet's UTF-8 export starts with a BOM; its first column is still run_id."""
    rows = (ROOT / "phaze" / "data" / "reference" / "training_runs.csv").read_text().splitlines()[:4]
    path = tmp_path / "runs.csv"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(rows).encode() + b"\n")
    proc = phaze_cli(tmp_path, "validate", "--runs", str(path), "--no-loso", "--unseen", "", "--hold-out", "none",
                     "--format", "json")
    assert proc.returncode == 0, proc.stderr
    overall = json.loads(proc.stdout)["in_sample"]["overall"]
    assert (overall["expressed"], overall["total"]) == (3, 3)


def test_workload_by_its_published_name_resolves(tmp_path):
    """``--workload llama3.1-405b``: Llama 3.1 405B by its published name (shipped as llama3-405b)."""
    args = ["evaluate", "--arch", "h100-sxm", "--devices", "1024", "--global-batch", "1024", "--plan",
            "tp=8,pp=16,recompute=full", "--allow-oom", "--format", "json"]
    by_alias = timed_cli(tmp_path, *args, "--workload", "llama3.1-405b")
    assert by_alias.returncode == 0, by_alias.stderr
    by_file = json.loads(timed_cli(tmp_path, *args, "--workload", "llama3-405b").stdout)
    assert json.loads(by_alias.stdout)["workload"] == by_file["workload"] == "Llama-3.1-405B"


@pytest.mark.parametrize("flag, typed, meant", [("--arch", "h100", "h100-sxm"),
                                                ("--workload", "gpt3-17b", "gpt3-175b"),
                                                ("--system", "dgx-h100", "dgx-h100-superpod")])
def test_unknown_name_says_did_you_mean(tmp_path, flag, typed, meant):
    args = {"--workload": "gpt3-175b", "--arch": "a100-80gb", flag: typed}
    cmd = ["evaluate", "--devices", "8", "--global-batch", "8"] + [x for k, v in args.items() for x in (k, v)]
    line = one_line_error(timed_cli(tmp_path, *cmd), flag, "did you mean")
    assert f"'{meant}'" in line.split("did you mean")[1].split("shipped:")[0], line


# --- phaze search's summary -------------------------------------------------------------------------
def test_knee_is_the_front_point_nearest_the_ideal_in_normalised_objectives():
    import pandas as pd

    from phaze.cli import knee
    front = pd.DataFrame({"throughput": [10.0, 9.0, 2.0], "area": [100.0, 20.0, 10.0]})
    assert knee(front, ["throughput", "area"], ["maximize", "minimize"]) == 1
    # the same front read with the wrong direction has another knee: the directions are used
    assert knee(front, ["throughput", "area"], ["maximize", "maximize"]) == 0
    # an objective constant on the front is met by every design; the first is taken on a tie
    assert knee(front.assign(area=5.0), ["throughput", "area"], ["maximize", "minimize"]) == 0
    assert knee(front.iloc[:0], ["throughput", "area"], ["maximize", "minimize"]) is None


@pytest.mark.parametrize("n, knee_at", [(5, 2), (12, 11), (40, 7), (40, 38), (13, 6)])
def test_front_shown_is_all_or_a_spread_with_the_knee(n, knee_at):
    from phaze.cli import SHOWN_FRONT, front_shown
    shown = front_shown(n, knee_at)
    assert shown == sorted(set(shown)) and knee_at in shown
    assert shown == list(range(n)) if n <= SHOWN_FRONT else (len(shown) == SHOWN_FRONT and shown[0] == 0
                                                             and shown[-1] == n - 1)


def _tiny_search(tmp_path, **changes) -> tuple[str, Path]:
    from conftest import SMALL_SWEEP
    cfg = dict(SMALL_SWEEP, **changes)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    proc = phaze_cli(tmp_path, "search", "tiny.yaml", "--quiet")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, tmp_path / "results" / cfg["name"]


def _per_workload_lines(out: str, devices: int) -> list[tuple[float, float]]:
    found = re.findall(r"MPT-125M on (\d+) chips, batch 16: ([\d,]+) tokens/s per cluster, ([\d,]+) tokens/s per "
                       r"chip, MFU [\d.]+ %\n +plan tp=\d", out)
    assert found, out
    pairs = [(float(c.replace(",", "")), float(p.replace(",", ""))) for d, c, p in found if int(d) == devices]
    assert len(pairs) == len(found)
    return pairs


def test_search_summary_of_one_objective_labels_cluster_and_chip_throughput(tmp_path):
    out, folder = _tiny_search(tmp_path, objectives=["throughput"])
    assert "geomean" not in out and "geometric mean" not in out      # one workload: nothing averaged
    pairs = _per_workload_lines(out, 8)
    for cluster, chip in pairs:
        assert chip == pytest.approx(cluster / 8, abs=1)
    trials = pd.read_csv(folder / "trials.csv")
    best = trials[trials["feasible"] == True]["MPT-125M:tokens_per_s"].max()  # noqa: E712
    assert pairs[0][0] == pytest.approx(best, abs=1)
    assert re.search(r"the \d+ best of \d+ feasible designs by throughput:", out)
    assert re.search(r"designs evaluated in \d+ s of search", out)


def test_search_summary_of_two_objectives_shows_the_front_and_its_knee(tmp_path):
    out, folder = _tiny_search(tmp_path, trials=6)
    front = pd.read_csv(folder / "pareto.csv")
    assert f"all {len(front)} designs" in out
    shown = re.findall(r"^  trial (\d+)( \(knee\))?:", out, flags=re.M)
    assert sorted(int(t) for t, _ in shown) == sorted(front["trial"])
    assert sum(bool(k) for _, k in shown) == 1
    _per_workload_lines(out, 8)


def test_search_time_counts_the_search_alone(tmp_path, monkeypatch):
    """Baselines and the report take seconds of their own; 'N designs evaluated in T s' is the search's."""
    import time

    from conftest import SMALL_SWEEP

    import phaze.search as search_module
    from phaze.space import load_sweep
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(dict(SMALL_SWEEP, trials=1)))
    slow = 3.0
    score, write = search_module.evaluate_baselines, search_module.write_study_files
    monkeypatch.setattr(search_module, "evaluate_baselines", lambda *a, **k: (time.sleep(slow), score(*a, **k))[1])
    monkeypatch.setattr(search_module, "write_study_files", lambda *a, **k: (time.sleep(slow), write(*a, **k))[1])
    start = time.perf_counter()
    res = search_module.search(load_sweep(tmp_path / "tiny.yaml"), storage=f"sqlite:///{tmp_path}/s.db",
                               progress=False)
    assert time.perf_counter() - start > 2 * slow
    assert res.elapsed_s < slow


def test_search_summary_of_two_workloads_gives_each_and_their_weighted_geomean(tmp_path):
    from conftest import SMALL_SWEEP
    second = {"workload": "mpt-350m", "devices": 16, "global_batch": 32, "weight": 2,
              "placement": {"tp": [1], "mbs": [1, 2], "recompute": ["none"], "pp": [1]}}
    out, _ = _tiny_search(tmp_path, objectives=["throughput"], trials=2,
                          workloads=SMALL_SWEEP["workloads"] + [second])
    first = out.split("  trial ")[1]
    small = re.search(r"MPT-125M on 8 chips, batch 16: ([\d,]+) tokens/s per cluster", first)
    large = re.search(r"MPT-350M on 16 chips, batch 32: ([\d,]+) tokens/s per cluster, ([\d,]+) tokens/s per chip",
                      first)
    both = re.search(r"all workloads: ([\d,]+) tokens/s per cluster \(the weighted geometric mean", first)
    assert small and large and both, out
    num = lambda m, i=1: float(m.group(i).replace(",", ""))  # noqa: E731
    assert num(large, 2) == pytest.approx(num(large) / 16, abs=1)
    assert num(both) == pytest.approx((num(small) * num(large) ** 2) ** (1 / 3), rel=1e-5)
