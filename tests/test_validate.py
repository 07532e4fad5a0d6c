"""Validation against published runs (``phaze.validate``, ``phaze.calibrate``, ``phaze validate``).

What is pinned here is the bookkeeping, never the physics: how each source's published metric
becomes seconds per step (checked against arithmetic written out by hand), how a CSV row becomes a
model and a plan, the error statistics, that a fit recovers parameters it generated itself, the
parameter file, and the CLI contract (bad input: one stderr line, exit 2, no traceback). No test
depends on a fitted parameter value or on an exact predicted step time.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from phaze import validate as v
from phaze.calibrate import BOUNDS, fit, load_params, save_params
from phaze.configio import ConfigError
from phaze.cost import Efficiency
from phaze.workload import Model

ROOT = Path(__file__).resolve().parent.parent
RUNS_CSV = ROOT / "phaze" / "data" / "reference" / "training_runs.csv"


# --- helpers ------------------------------------------------------------------------------------
_ROWS: dict | None = None


def rows() -> dict[str, dict]:
    """The bundled rows by run_id (read once)."""
    global _ROWS
    if _ROWS is None:
        _ROWS = {r["run_id"]: r for r in v.read_runs(RUNS_CSV)}
    return _ROWS


def row(rid: str, /, **changes) -> dict:
    r = dict(rows()[rid])
    r.update(changes)
    return r


def case(rid: str, /, **changes) -> v.Case:
    c = v.row_to_case(row(rid, **changes))
    assert isinstance(c, v.Case), getattr(c, "reason", c)
    return c


def synthetic(**changes) -> dict:
    """A small hand-made row: 4-layer GPT on 8 A100s, tp=2, blank fields left to the rules."""
    r = {k: "" for k in v.REQUIRED_COLUMNS}
    r.update(run_id="X0001", source_id="S99_test", gpu="A100-SXM4-80GB", gpu_count="8",
             model="toy-gpt", layers="4", hidden="1024", heads="16", seq_len="2048",
             global_batch="16", tp="2", pp="1", precision="bf16", measured_metric="step_time_s",
             measured_value="1.0", notes="")
    r.update(changes)
    return r


def synthetic_case(**changes) -> v.Case:
    c = v.row_to_case(synthetic(**changes))
    assert isinstance(c, v.Case), getattr(c, "reason", c)
    return c


def write_csv(path: Path, records: list[dict], fieldnames=None) -> Path:
    fieldnames = fieldnames or list(next(iter(rows().values())).keys())
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fieldnames, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow(r)
    return path


def phaze_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phaze.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The project's error contract: exit 2, exactly one stderr line, no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def ok_cli(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    return proc


# --- 1. metric -> seconds per step, per source convention (hand arithmetic) ---------------------
def test_s01_tflops_per_gpu_uses_narayanan_96_formula():
    # R0000: GPT-1.7B on 32 A100, B=512, s=2048, l=24, h=2304, V=51200, full recompute, 137 TFLOP/s
    c = case("R0000")
    assert (c.devices, c.global_batch, c.plan.recompute, c.model.vocab) == (32, 512, "full", 51200)
    B, s, l, h, V = 512, 2048, 24, 2304, 51200
    flops = 96 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (16 * l * h))
    expected = flops / (137e12 * 32)
    assert c.measured_step_s == pytest.approx(expected, rel=1e-9)
    assert 3.4 < expected < 3.6        # the arithmetic above, once more: ~3.53 s per step


def test_s02_mfu_uses_model_flops_and_default_vocab():
    # R0015: GPT-3 175B on 64 A100, B=64, s=2048, l=96, h=12288, MFU 0.514 vs 312 TFLOP/s.
    r = rows()["R0015"]
    assert "vocab" not in r["notes"].lower()          # so the documented default applies
    c = case("R0015")
    assert c.model.vocab == v.DEFAULT_VOCAB == 51200
    B, s, l, h, V = 64, 2048, 96, 12288, 51200
    flops = 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h))
    expected = flops / (0.514 * 312e12 * 64)
    assert c.measured_step_s == pytest.approx(expected, rel=1e-9)


def test_mfu_follows_a_vocab_stated_in_the_notes():
    c = case("R0015", notes=rows()["R0015"]["notes"] + " vocab 50257.")
    assert c.model.vocab == 50257
    B, s, l, h, V = 64, 2048, 96, 12288, 50257
    flops = 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert c.measured_step_s == pytest.approx(flops / (0.514 * 312e12 * 64), rel=1e-9)


def test_mfu_peak_from_notes_or_chip_default():
    # no "vs NNN TFLOP" in the notes: the chip's 16-bit peak (A100: 312 TFLOP/s) is used
    c = case("R0015", notes="")
    B, s, l, h, V = 64, 2048, 96, 12288, 51200
    flops = 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert c.measured_step_s == pytest.approx(flops / (0.514 * 312e12 * 64), rel=1e-9)
    # a stated peak wins
    c = case("R0015", notes="MFU vs 400 TFLOP/s")
    assert c.measured_step_s == pytest.approx(flops / (0.514 * 400e12 * 64), rel=1e-9)


def test_s02_step_time_is_taken_as_is():
    c = case("R0010")
    assert rows()["R0010"]["measured_metric"] == "step_time_s"
    assert c.measured_step_s == 1.42


def test_s04_tokens_per_s_per_gpu():
    # R0033: MPT-70b on 512 H100, B=4096 sequences of 2048 tokens, 1007 tokens/s per GPU
    c = case("R0033")
    assert c.measured_step_s == pytest.approx(4096 * 2048 / (1007 * 512), rel=1e-12)


def test_s13_tokens_per_s_total_with_layout_from_notes():
    # R0416: layout columns blank; the notes quote "tp1 pp1 mbs2 gbs2048 full recompute"
    r = rows()["R0416"]
    assert r["tp"] == r["pp"] == r["global_batch"] == ""
    assert "tp1 pp1 mbs2 gbs2048" in r["notes"]
    c = case("R0416")
    assert c.layout_from == "notes"
    assert (c.plan.tp, c.plan.pp, c.plan.mbs, c.global_batch) == (1, 1, 2, 2048)
    assert c.plan.recompute == "full"
    assert c.measured_step_s == pytest.approx(2048 * 2048 / 40345.0, rel=1e-12)
    # the row's own layout, when given, wins over the notes
    c = case("R0416", tp="2", pp="1", global_batch="64", micro_batch="1")
    assert c.layout_from == "row" and (c.plan.tp, c.global_batch) == (2, 64)


def test_s03_tflops_per_gpu_megatron_core_model_flops():
    # R0024: GPT-1.7B on 48 H100, B=192, s=4096, l=24, h=2048, ffn blank (4h), vocab 131072
    c = case("R0024")
    assert (c.model.ffn_hidden, c.model.vocab, c.model.seq_len) == (4 * 2048, 131072, 4096)
    B, s, l, h, V, N = 192, 4096, 24, 2048, 131072, 48
    flops = 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert c.measured_step_s == pytest.approx(flops / (408.8e12 * N), rel=1e-9)


def test_llmfoundry_convention_on_a_hand_made_model():
    m = Model(name="toy", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=1000, seq_len=128)
    # parameters by hand: per layer qkv 3h^2+3h, proj h^2+h, ffn 2hf+f+h, two layernorms 4h
    h, f, l, V, s = 64, 256, 2, 1000, 128
    per_layer = (3 * h * h + 3 * h) + (h * h + h) + (2 * h * f + f + h) + 4 * h
    n_params = l * per_layer + V * h + s * h + 2 * h     # + token/position embeddings, final norm
    assert m.params == n_params == 172288
    B, gpus, tflops = 32, 4, 100.0
    expected = B * (6 * n_params * s + 12 * l * h * s * s) / (tflops * 1e12 * gpus)
    got = v.measured_step_time("tflops_per_gpu", tflops, m, gpus, B, "llmfoundry", "none", 312e12)
    assert got == pytest.approx(expected, rel=1e-12)
    got = v.measured_step_time("mfu", 0.4, m, gpus, B, "llmfoundry", "full", 312e12)
    assert got == pytest.approx(B * (6 * n_params * s + 12 * l * h * s * s) / (0.4 * 312e12 * gpus),
                                rel=1e-12)


def test_narayanan_convention_without_full_recompute_counts_three_passes():
    m = Model(name="toy", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=1000, seq_len=128)
    B, s, l, h, V = 8, 128, 2, 64, 1000
    got = v.measured_step_time("tflops_per_gpu", 50.0, m, 2, B, "narayanan96", "selective", 312e12)
    flops = 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert got == pytest.approx(flops / (50e12 * 2), rel=1e-12)


def test_throughput_metrics_and_unknown_metric():
    m = Model(name="toy", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=1000, seq_len=128)
    assert v.measured_step_time("step_time_s", 2.5, m, 8, 16, "model", "none", 1.0) == 2.5
    assert v.measured_step_time("tokens_per_s_total", 1024.0, m, 8, 16, "model", "none", 1.0) == \
        pytest.approx(16 * 128 / 1024.0)
    assert v.measured_step_time("tokens_per_s_per_gpu", 64.0, m, 8, 16, "model", "none", 1.0) == \
        pytest.approx(16 * 128 / (64.0 * 8))
    with pytest.raises(ValueError, match="flops_per_watt"):
        v.measured_step_time("flops_per_watt", 1.0, m, 8, 16, "model", "none", 1.0)


def test_source_conventions():
    assert v.source_convention("S01_narayanan2021", "") == "narayanan96"
    assert v.source_convention("S04_llmfoundry_mpt", "") == "llmfoundry"
    assert v.source_convention("S02_korthikanti2022", "") == "model"
    assert v.source_convention("S03_megatron_core_h100", "") == "model"
    # a source that quotes a formula in its notes gets that formula
    assert v.source_convention("S42_other", "FLOPs = 96*B*s*l*h^2*(...)") == "narayanan96"
    assert v.source_convention("S42_other", "MFU counts 6 * N * s + attention") == "llmfoundry"


# --- 2. row expression rules ---------------------------------------------------------------------
def test_blank_ffn_is_four_hidden_and_ungated():
    c = synthetic_case(ffn_hidden="")
    assert c.model.ffn_hidden == 4 * 1024 and c.model.activation == "gelu"
    assert case("R0024").model.ffn_hidden == 4 * 2048          # real row, ffn column blank


def test_ffn_not_a_multiple_of_hidden_is_swiglu():
    c = synthetic_case(ffn_hidden="2816")                       # 2816 = 2.75 * 1024
    assert c.model.activation == "swiglu"
    assert synthetic_case(ffn_hidden="3072").model.activation == "gelu"     # 3 * 1024
    c = case("R0255")                                           # Llama-2 70B: 28672 / 8192 = 3.5
    assert c.model.activation == "swiglu" and c.model.ffn_hidden == 28672


def test_kv_heads_from_notes():
    assert synthetic_case(notes="kv_groups=4").model.kv_heads == 4
    assert synthetic_case(notes="").model.kv_heads == 16
    c = case("R0255")                                           # notes: kv_groups=8, 64 heads
    assert (c.model.heads, c.model.kv_heads) == (64, 8)
    c = case("R0249")                                           # notes: kv_groups=MHA
    assert c.model.kv_heads == c.model.heads == 32
    s = v.row_to_case(synthetic(notes="kv_groups=5"))          # 5 does not divide 16 heads
    assert isinstance(s, v.Skipped) and "5" in s.reason


@pytest.mark.parametrize("notes, zero", [
    ("FSDP sharding=FULL_SHARD", 3),
    ("FSDP sharding=SHARD_GRAD_OP", 2),
    ("--overlap-param-gather", 1),
    ("distributed optimizer", 1),
    ("", 0),
])
def test_zero_stage_from_framework_flags(notes, zero):
    assert synthetic_case(notes=notes).plan.zero == zero


def test_zero_stage_on_real_rows():
    assert "FULL_SHARD" in rows()["R0033"]["notes"] and case("R0033").plan.zero == 3
    assert "SHARD_GRAD_OP" in rows()["R0045"]["notes"] and case("R0045").plan.zero == 2
    assert case("R0010").plan.zero == 0


def test_tp_comm_overlap_flag():
    assert synthetic_case(notes="flags: --tp-comm-overlap").plan.tp_overlap is True
    assert synthetic_case(notes="").plan.tp_overlap is False
    assert case("R0024").plan.tp_overlap is True                # Megatron-Core overlap flags
    assert case("R0010").plan.tp_overlap is False


def test_fsdp_default_mixed_precision_reduces_in_fp32():
    assert synthetic_case(precision="bf16 (amp_bf16, FSDP mp=DEFAULT)").plan.reduce_fp32 is True
    assert synthetic_case(precision="bf16 (FSDP mp=PURE)").plan.reduce_fp32 is False
    assert synthetic_case(notes="--accumulate-allreduce-grads-in-fp32").plan.reduce_fp32 is True
    assert "mp=DEFAULT" in rows()["R0033"]["precision"] and case("R0033").plan.reduce_fp32 is True
    assert "mp=PURE" in rows()["R0241"]["precision"] and case("R0241").plan.reduce_fp32 is False


def test_interleaving_from_notes_and_column():
    c = synthetic_case(layers="12", tp="1", pp="2", notes="pipeline interleaving=3")
    assert c.plan.vp == 3
    assert "interleaving=3" in rows()["R0013"]["notes"] and rows()["R0013"]["vp"] == ""
    assert case("R0013").plan.vp == 3
    assert case("R0010").plan.vp == 1                           # notes say interleaving=1
    assert case("R0255").plan.vp == 20                          # vp column
    assert synthetic_case(layers="12", tp="1", pp="2", vp="2", notes="interleaving=3").plan.vp == 2


def test_precision_from_the_precision_column():
    assert synthetic_case(precision="fp8 (Transformer Engine)").model.precision == "fp8"
    assert synthetic_case(precision="fp16").model.precision == "fp16"
    assert synthetic_case(precision="not stated").model.precision == "bf16"
    assert case("R0103").model.precision == "fp8"               # "fp8 (amp_fp8 via ...)"
    assert case("R0255").model.precision == "fp8"
    assert case("R0010").model.precision == "fp16"


def test_remaining_defaults():
    c = synthetic_case()
    assert c.plan.mbs == 1 and c.plan.recompute == "none" and c.plan.cp == 1
    assert c.plan.sp is True                                    # blank, tp > 1
    assert synthetic_case(tp="1", global_batch="32").plan.sp is False
    assert synthetic_case(sequence_parallel="no").plan.sp is False
    assert synthetic_case(recompute="selective").plan.recompute == "selective"
    assert c.model.vocab == v.DEFAULT_VOCAB
    assert synthetic_case(notes="vocab 32000").model.vocab == 32000
    assert c.source == "S99_test" and c.layout_from == "row" and c.devices == 8


# --- 3. coverage of the bundled CSV ------------------------------------------------------------
def test_most_bundled_rows_are_expressed_and_skips_say_why():
    items = [v.row_to_case(r, {}) for r in rows().values()]
    assert len(items) == len(rows()) >= 200
    cases = [c for c in items if isinstance(c, v.Case)]
    skipped = [c for c in items if isinstance(c, v.Skipped)]
    assert len(cases) + len(skipped) == len(items)
    assert len(cases) >= 0.9 * len(items), [s.reason for s in skipped]
    for s in skipped:
        assert s.reason.strip(), s
    for c in cases:
        assert math.isfinite(c.measured_step_s) and c.measured_step_s > 0, c.run_id
    # every source of the README is represented among the expressed rows
    assert {c.source[:3] for c in cases} >= {"S01", "S02", "S03", "S04", "S05", "S13"}


# --- 4. malformed input ------------------------------------------------------------------------
def test_read_runs_missing_column(tmp_path):
    header = [k for k in v.REQUIRED_COLUMNS if k != "measured_value"]
    path = write_csv(tmp_path / "bad.csv", [synthetic()], fieldnames=header)
    with pytest.raises(ConfigError) as exc:
        v.read_runs(path)
    assert exc.value.field == "measured_value" and "measured_value" in str(exc.value)


def test_read_runs_unreadable_paths(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        v.read_runs(tmp_path / "nothere.csv")
    with pytest.raises(ConfigError):            # a directory is not a CSV (used to leak IsADirectoryError)
        v.read_runs(tmp_path)
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00\x9c\x80" * 50)
    with pytest.raises(ConfigError):
        v.read_runs(tmp_path / "bin.csv")


def test_cli_missing_column(tmp_path):
    header = [k for k in v.REQUIRED_COLUMNS if k != "gpu_count"]
    path = write_csv(tmp_path / "bad.csv", [synthetic()], fieldnames=header)
    proc = phaze_cli(tmp_path, "validate", "--runs", str(path), "--no-loso", "--unseen", "")
    one_line_error(proc, "bad.csv", "gpu_count")


BAD_ROWS = [  # (changes, words the skip reason must contain)
    (dict(run_id="B1", gpu_count="eight"), ("gpu_count", "eight")),
    (dict(run_id="B2", measured_value="fast"), ("measured_value", "fast")),
    (dict(run_id="B3", measured_metric="flops_per_watt"), ("measured_metric", "flops_per_watt")),
    (dict(run_id="B4", gpu="TPU-v9"), ("TPU-v9",)),
    (dict(run_id="B5", measured_value="-5"), ("measured_value",)),
    (dict(run_id="B6", gpu_count="-8"), ("gpu_count",)),
    (dict(run_id="B7", measured_value=""), ("measured_value",)),
    (dict(run_id="B8", layers="2.5"), ("layers",)),
]


@pytest.mark.parametrize("changes, words", BAD_ROWS, ids=[c["run_id"] for c, _ in BAD_ROWS])
def test_bad_row_is_skipped_with_reason(changes, words):
    s = v.row_to_case(row("R0033", **changes))
    assert isinstance(s, v.Skipped)
    assert s.run_id == changes["run_id"] and s.source == "S04_llmfoundry_mpt"
    for w in words:
        assert w in s.reason, (w, s.reason)


def test_cli_bad_rows_are_skipped_and_the_rest_predicted(tmp_path):
    good = [rows()[i] for i in ("R0000", "R0010", "R0033")]
    bad = [row("R0033", **changes) for changes, _ in BAD_ROWS]
    path = write_csv(tmp_path / "mixed.csv", good + bad)
    proc = ok_cli(phaze_cli(tmp_path, "validate", "--runs", str(path), "--no-loso", "--unseen", "",
                            "--format", "json", "--out", str(tmp_path / "out.csv")))
    summary = json.loads(proc.stdout)
    assert summary["overall"]["expressed"] == 3
    assert summary["overall"]["skipped"] == len(BAD_ROWS)
    assert summary["overall"]["total"] == 3 + len(BAD_ROWS)
    reasons = {s["run_id"]: s["reason"] for s in summary["skipped"]}
    for changes, words in BAD_ROWS:
        for w in words:
            assert w in reasons[changes["run_id"]]
    with open(tmp_path / "out.csv", newline="") as fh:
        out = {r["run_id"]: r for r in csv.DictReader(fh)}
    assert {r for r in out if out[r]["status"] == "ok"} == {"R0000", "R0010", "R0033"}
    for r in ("R0000", "R0010", "R0033"):
        assert float(out[r]["predicted_step_s"]) > 0


def test_cli_nonexistent_runs(tmp_path):
    proc = phaze_cli(tmp_path, "validate", "--runs", str(tmp_path / "nothere.csv"),
                     "--no-loso", "--unseen", "")
    one_line_error(proc, "nothere.csv", "not found")
    one_line_error(phaze_cli(tmp_path, "calibrate", "--runs", "nothere.csv", "--out", "p.json"),
                   "nothere.csv")
    one_line_error(phaze_cli(tmp_path, "validate", "--runs", str(tmp_path), "--no-loso",
                             "--unseen", ""), str(tmp_path))


@pytest.mark.parametrize("text, needles", [
    ("this is not json", ("params.json", "JSON")),
    ('{"fitted": {"A100": {"tensor_fraction": 0.7}}}', ("params.json", "'parameters'")),
    ('{"parameters": {"A100": {"tensor_fractoin": 0.7}}}', ("params.json", "parameters.A100.tensor_fractoin")),
    ('{"parameters": {"A100": {"tensor_fraction": -0.7}}}', ("params.json", "parameters.A100.tensor_fraction")),
    ('{"parameters": {"A100": [0.7]}}', ("params.json", "parameters.A100")),
])
def test_cli_bad_params_file(tmp_path, text, needles):
    (tmp_path / "params.json").write_text(text)
    small = write_csv(tmp_path / "one.csv", [rows()["R0010"]])
    proc = phaze_cli(tmp_path, "validate", "--runs", str(small), "--params", "params.json",
                     "--no-loso", "--unseen", "")
    one_line_error(proc, *needles)
    with pytest.raises(ConfigError):
        load_params(tmp_path / "params.json")


def test_params_file_with_zero_fraction_is_rejected(tmp_path):
    (tmp_path / "params.json").write_text('{"parameters": {"A100": {"tensor_fraction": 0}}}')
    with pytest.raises(ConfigError, match="tensor_fraction"):
        load_params(tmp_path / "params.json")


def test_cli_unwritable_outputs(tmp_path):
    small = write_csv(tmp_path / "one.csv", [rows()["R0010"]])
    base = ["validate", "--runs", str(small), "--no-loso", "--unseen", ""]
    one_line_error(phaze_cli(tmp_path, *base, "--out", "nodir/out.csv"), "--out", "nodir/out.csv")
    one_line_error(phaze_cli(tmp_path, *base, "--out", str(tmp_path)), "--out")
    one_line_error(phaze_cli(tmp_path, *base, "--plot", "nodir/p.png"), "--plot", "nodir/p.png")
    one_line_error(phaze_cli(tmp_path, *base, "--plot", "p.notanimage"), "--plot", "png")
    one_line_error(phaze_cli(tmp_path, "calibrate", "--runs", str(small), "--out", "nodir/p.json"),
                   "--out", "nodir/p.json")


def test_cli_nothing_expressed(tmp_path):
    path = write_csv(tmp_path / "skip.csv", [rows()["R0022"]])      # layout not published
    proc = ok_cli(phaze_cli(tmp_path, "validate", "--runs", str(path), "--no-loso", "--format", "json"))
    summary = json.loads(proc.stdout)
    assert summary["overall"] == {"rows": 0, "expressed": 0, "skipped": 1, "total": 1}
    assert summary["skipped"][0]["run_id"] == "R0022" and summary["skipped"][0]["reason"]
    one_line_error(phaze_cli(tmp_path, "validate", "--runs", str(path), "--no-loso", "--unseen", "",
                             "--plot", "p.png"), "--plot")
    one_line_error(phaze_cli(tmp_path, "calibrate", "--runs", str(path), "--out", "p.json"),
                   "skip.csv", "no run")
    header_only = write_csv(tmp_path / "empty.csv", [])
    proc = ok_cli(phaze_cli(tmp_path, "validate", "--runs", str(header_only), "--no-loso", "--unseen", ""))
    assert "0 of 0 runs expressed" in proc.stdout


# --- 5. error statistics -----------------------------------------------------------------------
def test_error_stats_odd_count():
    st = v.error_stats([0.05, -0.20, 0.10, -0.01, 0.30])
    # |e| sorted: 0.01 0.05 0.10 0.20 0.30; sum 0.66
    assert st["rows"] == 5
    assert st["mape_pct"] == pytest.approx(100 * 0.66 / 5)        # 13.2 %
    assert st["median_pct"] == pytest.approx(10.0)
    assert st["max_pct"] == pytest.approx(30.0)
    assert st["within_10pct_share"] == pytest.approx(3 / 5)       # 0.01, 0.05 and 0.10 (inclusive)


def test_error_stats_even_count_and_empty():
    st = v.error_stats([0.02, -0.04, 0.08, -0.5])
    assert st["rows"] == 4
    assert st["mape_pct"] == pytest.approx(100 * 0.64 / 4)        # 16 %
    assert st["median_pct"] == pytest.approx(100 * (0.04 + 0.08) / 2)   # 6 %
    assert st["max_pct"] == pytest.approx(50.0)
    assert st["within_10pct_share"] == pytest.approx(3 / 4)
    assert v.error_stats([]) == {"rows": 0}
    one = v.error_stats([-0.3])
    assert one["median_pct"] == pytest.approx(30.0) and one["within_10pct_share"] == 0


def test_summarize_groups_by_gpu_and_source():
    P = v.Prediction
    preds = [
        P("a", "S01", "A100", 1.0, 1.1, 0.10, "ok"),
        P("b", "S01", "A100", 1.0, 0.8, -0.20, "ok"),
        P("c", "S04", "H100", 2.0, 2.1, 0.05, "ok"),
        P("d", "S04", "A100", 1.0, 1.4, 0.40, "ok"),
        P("e", "S04", "H100", None, None, None, "skipped", "unknown GPU"),
    ]
    s = v.summarize(preds)
    o = s["overall"]
    assert (o["expressed"], o["skipped"], o["total"], o["rows"]) == (4, 1, 5, 4)
    assert o["mape_pct"] == pytest.approx(100 * (0.10 + 0.20 + 0.05 + 0.40) / 4)
    assert o["median_pct"] == pytest.approx(100 * (0.10 + 0.20) / 2)
    assert o["max_pct"] == pytest.approx(40.0)
    assert o["within_10pct_share"] == pytest.approx(2 / 4)
    assert set(s["per_gpu"]) == {"A100", "H100"} and set(s["per_source"]) == {"S01", "S04"}
    assert s["per_gpu"]["A100"]["rows"] == 3 and s["per_gpu"]["H100"]["rows"] == 1
    assert s["per_gpu"]["A100"]["mape_pct"] == pytest.approx(100 * 0.70 / 3)
    assert s["per_source"]["S04"]["rows"] == 2
    assert s["per_source"]["S04"]["median_pct"] == pytest.approx(100 * (0.05 + 0.40) / 2)


def test_predict_all_error_sign_and_skips():
    c = case("R0010")
    slow = dataclasses.replace(c, measured_step_s=1e6)        # far slower than any prediction
    fast = dataclasses.replace(c, measured_step_s=1e-9)
    skip = v.Skipped("Z1", "S99", "TPU", "unknown GPU")
    p_slow, p_fast, p_skip = v.predict_all([slow, fast, skip], None)
    assert p_slow.status == "ok" and p_slow.predicted_step_s > 0
    assert p_slow.error == pytest.approx((p_slow.predicted_step_s - 1e6) / 1e6)
    assert p_slow.error < 0 < p_fast.error
    assert p_fast.predicted_step_s == pytest.approx(p_slow.predicted_step_s)
    assert (p_skip.status, p_skip.reason, p_skip.error) == ("skipped", "unknown GPU", None)


def test_case_weights_balance_sources():
    cs = [SimpleNamespace(source="A", layout_from="row")] * 3 + \
         [SimpleNamespace(source="B", layout_from="row"), SimpleNamespace(source="B", layout_from="notes")]
    assert v.case_weights(cs) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1 / 2, 0.5 / 2])


# --- 6. the fit recovers parameters it generated -----------------------------------------------
FIT_ROWS = ("R0000", "R0001", "R0002", "R0003",                        # S01, A100-80GB
            "R0033", "R0061", "R0085", "R0113", "R0137", "R0163", "R0192", "R0220")  # S04, all GPUs


@pytest.mark.parametrize("tensor, hbm", [(0.7, 0.6), (0.9, 0.45)])
def test_fit_recovers_known_parameters(tensor, hbm):
    truth = Efficiency(tensor_fraction=tensor, hbm_fraction=hbm)     # the rest at their defaults
    cases = [case(i) for i in FIT_ROWS]
    assert {c.source[:3] for c in cases} == {"S01", "S04"}
    synth = [dataclasses.replace(c, measured_step_s=v.predict_case(c, truth)) for c in cases]
    eff, report = fit(synth, v.predict_case, names=("tensor_fraction", "hbm_fraction"))
    assert eff.tensor_fraction == pytest.approx(tensor, rel=0.04)
    assert eff.hbm_fraction == pytest.approx(hbm, rel=0.04)
    # the parameters not fitted stay where they were
    assert (eff.link_fraction, eff.kernel_overhead_s) == (truth.link_fraction, truth.kernel_overhead_s)
    assert report["rows"] == len(FIT_ROWS) and report["rms_log_error"] < 0.02


def test_fit_without_cases_returns_priors():
    eff, report = fit([], v.predict_case, names=("tensor_fraction",))
    assert eff.tensor_fraction == BOUNDS["tensor_fraction"][2] and report["rows"] == 0


# --- 7. parameter files --------------------------------------------------------------------------
def test_save_load_round_trip(tmp_path):
    params = {"A100": Efficiency(tensor_fraction=0.71, hbm_fraction=0.62, link_fraction=0.55,
                                 attention_fraction=0.43, kernel_overhead_s=3.5e-6,
                                 overlap_slowdown=0.125, tile_overhead_k=96.0),
              "default": Efficiency(tensor_fraction=0.8)}
    path = tmp_path / "p.json"
    save_params(params, path, meta={"runs": "x.csv", "rows_used": 7})
    data = json.loads(path.read_text())
    assert data["rows_used"] == 7 and set(data["parameters"]) == {"A100", "default"}
    assert load_params(path) == params
    # params_for: family, else default, else ideal
    a100 = SimpleNamespace(family="A100")
    assert v.params_for(a100, params) == params["A100"]
    assert v.params_for(SimpleNamespace(family="H100"), params) == params["default"]
    assert v.params_for(a100, None) == Efficiency()


# --- 8. the CLI end to end ---------------------------------------------------------------------
SMALL = ("R0000", "R0010", "R0015", "R0024", "R0033", "R0255", "R0416", "R0022")  # R0022 skips


@pytest.fixture
def small_csv(tmp_path) -> Path:
    return write_csv(tmp_path / "small.csv", [rows()[i] for i in SMALL])


def test_cli_validate_end_to_end(tmp_path, small_csv):
    out, plot = tmp_path / "out.csv", tmp_path / "p.png"
    proc = ok_cli(phaze_cli(tmp_path, "validate", "--runs", str(small_csv), "--out", str(out),
                            "--plot", str(plot), "--no-loso", "--unseen", ""))
    assert proc.stdout.startswith("phaze validate: 7 of 8 runs expressed, 1 skipped")
    assert "skipped R0022:" in proc.stdout
    with open(out, newline="") as fh:
        reader = csv.DictReader(fh)
        assert {"run_id", "measured_step_s", "predicted_step_s", "error", "status"} <= set(reader.fieldnames)
        got = list(reader)
    assert [r["run_id"] for r in got] == list(SMALL)
    for r in got:
        if r["run_id"] == "R0022":
            assert r["status"] == "skipped" and r["reason"] and r["predicted_step_s"] == ""
            continue
        assert r["status"] == "ok"
        measured, predicted = float(r["measured_step_s"]), float(r["predicted_step_s"])
        assert measured == pytest.approx(case(r["run_id"]).measured_step_s, rel=1e-5)
        assert predicted > 0
        assert float(r["error"]) == pytest.approx((predicted - measured) / measured, rel=1e-4, abs=1e-6)
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    proc = ok_cli(phaze_cli(tmp_path, "validate", "--runs", str(small_csv), "--no-loso",
                            "--format", "json", "--group", "megatron=S01,S02,S03"))
    summary = json.loads(proc.stdout)
    n_ok = sum(r["status"] == "ok" for r in got)
    assert summary["overall"]["expressed"] == n_ok == 7
    assert summary["overall"]["total"] == len(SMALL) and summary["overall"]["rows"] == n_ok
    assert summary["groups"]["megatron"]["rows"] == 4          # R0000, R0010, R0015, R0024
    assert set(summary["per_gpu"]) == {"A100-SXM4-80GB", "H100-SXM5-80GB"}
    assert summary["unseen_gpu"]["train"] == "A100" and summary["unseen_gpu"]["test"] == "H100"
    assert summary["unseen_gpu"]["overall"]["rows"] == 3       # R0024, R0033, R0255
    assert [s["run_id"] for s in summary["skipped"]] == ["R0022"]


def test_cli_calibrate_writes_a_loadable_file(tmp_path, small_csv):
    proc = ok_cli(phaze_cli(tmp_path, "calibrate", "--runs", str(small_csv), "--out", "params.json"))
    assert "wrote params.json" in proc.stdout
    params = load_params(tmp_path / "params.json")
    assert set(params) == {"A100", "H100", "default"}
    for eff in params.values():
        for name, (lo, hi, _) in BOUNDS.items():
            assert lo <= getattr(eff, name) <= hi, name
    data = json.loads((tmp_path / "params.json").read_text())
    assert data["rows_used"] == 7
    # and the file is accepted back by validate
    proc = ok_cli(phaze_cli(tmp_path, "validate", "--runs", str(small_csv), "--params", "params.json",
                            "--no-loso", "--unseen", "", "--format", "json"))
    assert json.loads(proc.stdout)["params"] == "params.json"


@pytest.mark.parametrize("gpu,chip", [
    ("A100-SXM4-80GB", "a100-80gb"), ("A100 80GB", "a100-80gb"), ("a100_sxm4_40gb", "a100-40gb"),
    ("A100-SXM4-40GB", "a100-40gb"), ("H100-SXM5-80GB", "h100-sxm"), ("H100 SXM", "h100-sxm"),
    ("H100 80GB HBM3", "h100-sxm"), ("H100 PCIe", None), ("H200 SXM", None), ("A100 PCIe 40GB", None),
    ("V100", None)])
def test_gpu_names(gpu, chip):
    from phaze.validate import chip_for_gpu
    assert chip_for_gpu(gpu) == chip


@pytest.mark.parametrize("text,mode", [("full", "full"), ("uniform", "full"), ("block", "full"),
                                       ("True", "full"), ("selective", "selective"), ("no", "none"),
                                       ("", "none")])
def test_recompute_spellings(text, mode):
    from phaze.validate import default_runs_path, read_runs, row_to_case
    row = dict(next(r for r in read_runs(default_runs_path()) if r["run_id"] == "R0010"))
    row["recompute"] = text
    assert row_to_case(row).plan.recompute == mode


@pytest.mark.parametrize("note,zero,recompute,vocab", [
    ("DeepSpeed ZeRO stage 1, vocab_size=50257", 1, "none", 50257),
    ("ZeRO-3 offload off; activation_checkpointing=True", 3, "full", 51200),
    ("FSDP HYBRID_SHARD; full recompute; padded_vocab_size 128256", 3, "full", 128256),
    ("selective activation recompute, distributed optimizer", 1, "selective", 51200),
])
def test_notes_rules_for_blank_columns(note, zero, recompute, vocab):
    from phaze.validate import default_runs_path, read_runs, row_to_case
    row = dict(next(r for r in read_runs(default_runs_path()) if r["run_id"] == "R0010"))
    row["notes"], row["recompute"] = note, ""
    case = row_to_case(row)
    assert (case.plan.zero, case.plan.recompute, case.model.vocab) == (zero, recompute, vocab)
