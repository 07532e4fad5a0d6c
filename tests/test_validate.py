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
import hashlib
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from phaze import validate as v
from phaze.arch import load_chip
from phaze.calibrate import (
    BOUNDS,
    calibrated_efficiency,
    fit,
    load_default_params,
    load_params,
    params_for,
    save_params,
)
from phaze.catalogue import load_model, name_key
from phaze.configio import ConfigError
from phaze.cost import Efficiency
from phaze.runs import (
    DEFAULT_VOCAB,
    EXPLICIT_COLUMNS,
    MODEL_COLUMNS,
    REQUIRED_COLUMNS,
    SEARCHED_MICRO_BATCHES,
    Case,
    Skipped,
    _valid_plans,
    convention_flops_per_step,
    default_runs_path,
    default_runs_paths,
    load_items,
    measured_step_time,
    read_runs,
    row_framework,
    row_to_case,
    unmodelled_models,
)
from phaze.workload import Model

ROOT = Path(__file__).resolve().parent.parent
RUNS_CSV = ROOT / "phaze" / "data" / "reference" / "training_runs.csv"
RUNS_2_CSV = ROOT / "phaze" / "data" / "reference" / "training_runs_2.csv"
RUNS_3_CSV = ROOT / "phaze" / "data" / "reference" / "training_runs_3.csv"


# --- helpers ------------------------------------------------------------------------------------
_ROWS: dict | None = None


def rows() -> dict[str, dict]:
    """The bundled rows by run_id (read once)."""
    global _ROWS
    if _ROWS is None:
        _ROWS = {r["run_id"]: r for p in (RUNS_CSV, RUNS_2_CSV, RUNS_3_CSV) for r in read_runs(p)}
    return _ROWS


def row(rid: str, /, **changes) -> dict:
    r = dict(rows()[rid])
    r.update(changes)
    return r


def case(rid: str, /, **changes) -> Case:
    c = row_to_case(row(rid, **changes))
    assert isinstance(c, Case), getattr(c, "reason", c)
    return c


def synthetic(**changes) -> dict:
    """A small hand-made row: 4-layer GPT on 8 A100s, tp=2, blank fields left to the rules."""
    r = {k: "" for k in REQUIRED_COLUMNS}
    r.update(run_id="X0001", source_id="S99_test", gpu="A100-SXM4-80GB", gpu_count="8",
             model="toy-gpt", layers="4", hidden="1024", heads="16", seq_len="2048",
             global_batch="16", tp="2", pp="1", precision="bf16", measured_metric="step_time_s",
             measured_value="1.0", notes="")
    r.update(changes)
    return r


def synthetic_case(**changes) -> Case:
    c = row_to_case(synthetic(**changes))
    assert isinstance(c, Case), getattr(c, "reason", c)
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


def test_s02_mfu_uses_model_flops_and_default_vocab():
    # R0015: GPT-3 175B on 64 A100, B=64, s=2048, l=96, h=12288, MFU 0.514 vs 312 TFLOP/s.
    r = rows()["R0015"]
    assert r["vocab"] == ""                           # not stated: the documented default applies
    c = case("R0015")
    assert c.model.vocab == DEFAULT_VOCAB == 51200
    B, s, l, h, V = 64, 2048, 96, 12288, 51200
    flops = 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h))
    expected = flops / (0.514 * 312e12 * 64)
    assert c.measured_step_s == pytest.approx(expected, rel=1e-9)


def test_mfu_follows_the_vocab_column():
    c = case("R0015", vocab="50257")
    assert c.model.vocab == 50257
    B, s, l, h, V = 64, 2048, 96, 12288, 50257
    flops = 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert c.measured_step_s == pytest.approx(flops / (0.514 * 312e12 * 64), rel=1e-9)


def test_mfu_peak_from_column_or_chip_datasheet():
    assert rows()["R0015"]["mfu_peak_tflops"] == "312"
    # blank: the chip file's 16-bit dense peak (A100: 312 TFLOP/s) is used
    c = case("R0015", mfu_peak_tflops="")
    B, s, l, h, V = 64, 2048, 96, 12288, 51200
    flops = 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert c.measured_step_s == pytest.approx(flops / (0.514 * 312e12 * 64), rel=1e-9)
    # a stated peak wins
    c = case("R0015", mfu_peak_tflops="400")
    assert c.measured_step_s == pytest.approx(flops / (0.514 * 400e12 * 64), rel=1e-9)


def test_s02_step_time_is_taken_as_is():
    c = case("R0010")
    assert rows()["R0010"]["measured_metric"] == "step_time_s"
    assert c.measured_step_s == 1.42


def test_s04_tokens_per_s_per_gpu():
    # R0033: MPT-70b on 512 H100, B=4096 sequences of 2048 tokens, 1007 tokens/s per GPU
    c = case("R0033")
    assert c.measured_step_s == pytest.approx(4096 * 2048 / (1007 * 512), rel=1e-12)


def test_s13_tokens_per_s_total_with_unconfirmed_layout():
    # R0416: the source gives no layout; the project copy fills tp, pp, mbs, gbs and recompute from
    # the launcher defaults the row quotes and names them in 'unconfirmed' (half weight in fits)
    r = rows()["R0416"]
    assert (r["tp"], r["pp"], r["micro_batch"], r["global_batch"]) == ("1", "1", "2", "2048")
    assert set(r["unconfirmed"].split()) == {"tp", "pp", "micro_batch", "global_batch", "recompute"}
    c = case("R0416")
    assert c.layout_from == "unconfirmed"
    assert (c.plan.tp, c.plan.pp, c.plan.mbs, c.global_batch) == (1, 1, 2, 2048)
    assert c.plan.recompute == "full"
    assert c.measured_step_s == pytest.approx(2048 * 2048 / 40345.0, rel=1e-12)
    c = case("R0416", unconfirmed="")
    assert c.layout_from == "row"


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
    got = measured_step_time("tflops_per_gpu", tflops, m, gpus, B, "6n_12lqs", "none", 312e12)
    assert got == pytest.approx(expected, rel=1e-12)
    got = measured_step_time("mfu", 0.4, m, gpus, B, "6n_12lqs", "full", 312e12)
    assert got == pytest.approx(B * (6 * n_params * s + 12 * l * h * s * s) / (0.4 * 312e12 * gpus),
                                rel=1e-12)


def test_narayanan_convention_without_full_recompute_counts_three_passes():
    m = Model(name="toy", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=1000, seq_len=128)
    B, s, l, h, V = 8, 128, 2, 64, 1000
    got = measured_step_time("tflops_per_gpu", 50.0, m, 2, B, "narayanan96", "selective", 312e12)
    flops = 72 * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (12 * l * h))
    assert got == pytest.approx(flops / (50e12 * 2), rel=1e-12)


def test_megatron_deepspeed_log_convention_by_hand():
    # Megatron-DeepSpeed's throughput_calculator: 24 * k * B * s * l * h^2 * (1 + s/6h + V/16lh),
    # k 4 with any recompute, 3 without; with a full recompute it is narayanan96 exactly, without
    # one its vocabulary term is 3/4 of narayanan96's (which counts the logits' three passes)
    m = Model(name="toy", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=1000, seq_len=128)
    B, s, l, h, V = 8, 128, 2, 64, 1000
    for recompute, k in (("none", 3), ("full", 4), ("block", 4), ("selective", 4)):
        got = measured_step_time("tflops_per_gpu", 50.0, m, 2, B, "narayanan24k", recompute, 312e12)
        flops = 24 * k * B * s * l * h ** 2 * (1 + s / (6 * h) + V / (16 * l * h))
        assert got == pytest.approx(flops / (50e12 * 2), rel=1e-12)
    full = [measured_step_time("tflops_per_gpu", 50.0, m, 2, B, c, "full", 312e12)
            for c in ("narayanan24k", "narayanan96")]
    assert full[0] == pytest.approx(full[1], rel=1e-12)
    none = [convention_flops_per_step(m, B, c, "none") for c in ("narayanan24k", "narayanan96")]
    assert none[1] - none[0] == pytest.approx(72 * B * s * l * h * h * V / (l * h) * (1 / 12 - 1 / 16), rel=1e-12)
    # the megatron-deepspeed preset's rows count so; the row's own convention wins
    row = synthetic(framework="Megatron-DeepSpeed", measured_metric="tflops_per_gpu", measured_value="100",
                    recompute="none", precision="fp16")
    case = row_to_case(row)
    want = measured_step_time("tflops_per_gpu", 100.0, case.model, 8, 16, "narayanan24k", "none", 312e12)
    assert case.measured_step_s == pytest.approx(want, rel=1e-12)
    own = row_to_case(dict(row, flop_convention="narayanan96"))
    assert own.measured_step_s > case.measured_step_s
    # the figure docs/frameworks.md quotes: GPT-3 125M (12 layers, hidden 768, vocabulary 50,304
    # padded) at 1,024 tokens without recompute
    small = Model(name="gpt3-125m", layers=12, hidden=768, heads=12, ffn_hidden=3072, vocab=50304, seq_len=1024)
    more = (convention_flops_per_step(small, 8, "narayanan96", "none")
            / convention_flops_per_step(small, 8, "narayanan24k", "none"))
    doc = " ".join((ROOT / "docs" / "frameworks.md").read_text().split())
    assert f"125M at 1,024 tokens: {100 * (more - 1):.0f} %" in doc

@pytest.mark.parametrize("name", ["llama3-70b", "gpt3-175b"])
def test_model_conventions_are_nemos_flops_formulas(name):
    """NeMo's FLOPsMeasurementCallback (nemo/utils/flops_formulas.py), written out: 2.3 counts the
    attention's two products in full (``model``), 2.5 at half, as causal (``model_causal``).
    Llama 3: B s l h^2 (12 + 12 g/a + 18 f/h + 12 s/h [x 1/2] + 6 V/(l h)); GPT-3:
    (24 B s h^2 + 4 B s^2 h [x 1/2]) 3 l + 6 B s h V."""
    m = load_model(name)
    B, s, l, h, V, f, a, g = 16, m.seq_len, m.layers, m.hidden, m.vocab, m.ffn_hidden, m.heads, m.kv_heads
    for convention, c in (("model", 1.0), ("model_causal", 0.5)):
        if name == "gpt3-175b":
            nemo = (24 * B * s * h * h + 4 * B * s * s * h * c) * 3 * l + 6 * B * s * h * V
        else:
            nemo = B * s * l * h * h * (12 + 12 * g / a + 18 * f / h + 12 * s / h * c + 6 * V / (l * h))
        assert convention_flops_per_step(m, B, convention, "none") == pytest.approx(nemo, rel=1e-12)
    assert isinstance(row_to_case(synthetic(flop_convention="model_causal", measured_metric="tflops_per_gpu",
                                              measured_value="150")), Case)


def test_throughput_metrics_and_unknown_metric():
    m = Model(name="toy", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=1000, seq_len=128)
    assert measured_step_time("step_time_s", 2.5, m, 8, 16, "model", "none", 1.0) == 2.5
    assert measured_step_time("tokens_per_s_total", 1024.0, m, 8, 16, "model", "none", 1.0) == \
        pytest.approx(16 * 128 / 1024.0)
    assert measured_step_time("tokens_per_s_per_gpu", 64.0, m, 8, 16, "model", "none", 1.0) == \
        pytest.approx(16 * 128 / (64.0 * 8))
    with pytest.raises(ValueError, match="flops_per_watt"):
        measured_step_time("flops_per_watt", 1.0, m, 8, 16, "model", "none", 1.0)


def test_flop_convention_comes_from_its_column_not_the_source_id():
    assert rows()["R0000"]["flop_convention"] == "narayanan96"
    assert rows()["R0033"]["flop_convention"] == "6n_12lqs"
    a = case("R0000")
    b = case("R0000", source_id="S99_other")                 # same row, another source id
    assert a.measured_step_s == b.measured_step_s
    # blank, no framework (neither the column nor the source's title or locator names one): model FLOPs
    c = case("R0000", flop_convention="", framework="", source_title="", source_locator="")
    assert c.measured_step_s == pytest.approx(
        convention_flops_per_step(c.model, 512, "model", "full") / (137e12 * 32), rel=1e-12)
    # blank with Megatron-LM named: its throughput log's own formula (SC'21's); so where only the
    # source's title names it ("... Using Megatron-LM")
    assert case("R0000", flop_convention="").measured_step_s == pytest.approx(a.measured_step_s, rel=1e-12)
    assert case("R0000", flop_convention="", framework="").measured_step_s == pytest.approx(a.measured_step_s,
                                                                                            rel=1e-12)
    s = row_to_case(row("R0000", flop_convention="12*N"))
    assert isinstance(s, Skipped) and "flop_convention" in s.reason


def test_6n_12lqs_counts_attention_width_not_hidden():
    # MaxText-52B (R1065): 32 heads x head_dim 256 = 8192 != hidden 12288
    c = case("R1065")
    assert (c.model.head_dim, c.model.q_dim, c.model.hidden) == (256, 8192, 12288)
    B, s, l, n = 1920, 1024, 32, c.model.params
    flops = B * (6 * n * s + 12 * l * 8192 * s * s)
    assert c.measured_step_s == pytest.approx(flops / (154e12 * 192), rel=1e-12)


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


def test_a_geglu_column_is_gated_with_a_gated_models_defaults():
    """``activation`` geglu (Gemma's FFN) is gated as swiglu is: three FFN matrices, rotary
    positions, RMSNorms and no biases, whatever multiple of the width the FFN is."""
    c = synthetic_case(ffn_hidden="4096", activation="geglu")
    assert (c.model.activation, c.model.ffn_matrices, c.model.norm, c.model.bias, c.model.position_embedding) == \
        ("geglu", 3, "rmsnorm", False, "rotary")
    assert c.model.params == synthetic_case(ffn_hidden="4096", activation="swiglu").model.params


def test_kv_heads_from_column():
    assert synthetic_case(kv_heads="4").model.kv_heads == 4
    assert synthetic_case().model.kv_heads == 16
    c = case("R0255")                                           # kv_heads column 8, 64 heads
    assert (c.model.heads, c.model.kv_heads) == (64, 8)
    c = case("R0249")                                           # MHA
    assert c.model.kv_heads == c.model.heads == 32
    s = row_to_case(synthetic(kv_heads="5"))                 # 5 does not divide 16 heads
    assert isinstance(s, Skipped) and "5" in s.reason


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stage_from_column(stage):
    assert synthetic_case(zero_stage=str(stage)).plan.zero == stage


def test_zero_stage_on_real_rows_and_bad_values():
    assert case("R0033").plan.zero == 3 and case("R0045").plan.zero == 2
    assert case("R0010").plan.zero == 0 and case("R0024").plan.zero == 1
    assert synthetic_case().plan.zero == 0
    s = row_to_case(synthetic(zero_stage="4"))
    assert isinstance(s, Skipped) and "zero_stage" in s.reason


def test_tp_comm_overlap_column():
    assert synthetic_case(tp_comm_overlap="yes").plan.tp_overlap is True
    assert synthetic_case().plan.tp_overlap is False
    assert case("R0024").plan.tp_overlap is True                # Megatron-Core overlap flags
    assert case("R0010").plan.tp_overlap is False
    s = row_to_case(synthetic(tp_comm_overlap="maybe"))
    assert isinstance(s, Skipped) and "tp_comm_overlap" in s.reason


def test_grad_reduce_fp32_column():
    assert synthetic_case(grad_reduce_fp32="yes").plan.reduce_fp32 is True
    assert synthetic_case(precision="bf16 (amp_bf16, FSDP mp=DEFAULT)").plan.reduce_fp32 is False
    assert case("R0033").plan.reduce_fp32 is True              # FSDP mp=DEFAULT
    assert case("R0241").plan.reduce_fp32 is False             # FSDP mp=PURE


def test_attention_kernel_and_dropout_columns_are_independent():
    assert synthetic_case().plan.attention == "flash" and synthetic_case().model.dropout is False
    c = synthetic_case(attention_kernel="standard")
    assert c.plan.attention == "standard" and c.model.dropout is False
    assert synthetic_case(attention_kernel="flash2", dropout="yes").model.dropout is True
    assert case("R0033").plan.attention == "flash2" and case("R0010").plan.attention == "standard"
    # fp16 alone no longer selects unfused attention
    assert synthetic_case(precision="fp16").plan.attention == "flash"


def test_interleaving_from_vp_column():
    assert synthetic_case(layers="12", tp="1", pp="2", micro_batch="1", notes="interleaving=3").plan.vp == 1
    assert case("R0013").plan.vp == 3                           # filled from the source's config
    assert case("R0010").plan.vp == 1
    assert case("R0255").plan.vp == 20
    assert synthetic_case(layers="12", tp="1", pp="2", micro_batch="1", vp="2").plan.vp == 2


def test_precision_from_compute_precision_or_the_precision_column():
    assert synthetic_case(compute_precision="fp8", precision="bf16 + float8 linears").model.precision == "fp8"
    # the standard precision column naming float8 linears is fp8 (its leading word is the master copy's)
    assert synthetic_case(precision="bf16 + float8 linears").model.precision == "fp8"
    assert synthetic_case(precision="bf16 (amp_bf16)").model.precision == "bf16"
    assert case("R1013").model.precision == "fp8"               # torchtitan float8 linears
    assert synthetic_case(precision="fp8 (Transformer Engine)").model.precision == "fp8"
    assert synthetic_case(precision="fp16").model.precision == "fp16"
    assert synthetic_case(precision="not stated").model.precision == "bf16"
    assert case("R0103").model.precision == "fp8"               # "fp8 (amp_fp8 via ...)"
    assert case("R0255").model.precision == "fp8"
    assert case("R0010").model.precision == "fp16"


def test_a_16_bit_type_named_anywhere_in_the_precision_column():
    """Until 2026-12-07 only the column's leading word was read for fp16 or bf16, so "mixed fp16",
    "AMP (float16)" and PyTorch Lightning's "16-mixed" ran in the framework's type, or bf16: a run
    in fp16 costed as bf16, and under `megatron-lm` (fp16 by default) Lightning's "bf16-mixed" as fp16."""
    for text, want in (("mixed fp16", "fp16"), ("AMP (float16)", "fp16"), ("16-mixed", "fp16"),
                       ("fp16-mixed", "fp16"), ("Mixed precision (BF16)", "bf16"), ("bf16-mixed", "bf16"),
                       ("amp_bf16", "bf16"), ("half", "fp16")):
        assert synthetic_case(precision=text).model.precision == want, text
    assert synthetic_case(precision="bf16-mixed", framework="megatron-lm").model.precision == "bf16"
    assert synthetic_case(precision="mixed", framework="megatron-lm").model.precision == "fp16"   # names neither
    for text, want in (("float16", "fp16"), ("bfloat16", "bf16"), ("float32", "fp32")):
        assert synthetic_case(compute_precision=text).model.precision == want, text


def test_zero_stage_and_attention_kernel_as_people_write_them():
    """The two columns' values as sources and people name them (``ZeRO-1``, ``FULL_SHARD``,
    ``FlashAttention-2``) are read; an unknown or ambiguous one ("FlashAttention": the framework's
    kernel or the library's) is refused with the spellings allowed."""
    for text, stage in (("ZeRO-1", 1), ("zero stage 2", 2), ("Stage 3", 3), ("FSDP", 3), ("FULL_SHARD", 3),
                        ("SHARD_GRAD_OP", 2), ("distributed optimizer", 1), ("DDP", 0), ("ZeRO-3 (FSDP2)", 3),
                        ("1", 1), ("2.0", 2)):
        assert synthetic_case(zero_stage=text).plan.zero == stage, text
    for text in ("zero", "ZeRO-4", "HYBRID_SHARD", "4"):
        skipped = row_to_case(synthetic(zero_stage=text))
        assert isinstance(skipped, Skipped) and "column 'zero_stage' must be 0, 1, 2 or 3" in skipped.reason, text
    for text, kernel in (("FlashAttention-2", "flash2"), ("flash_attn", "flash2"), ("FA2", "flash2"),
                         ("Flash Attention 2", "flash2"), ("TE", "flash"), ("cuDNN", "flash"), ("unfused", "standard"),
                         ("flash", "flash"), ("standard", "standard")):
        assert synthetic_case(attention_kernel=text).plan.attention == kernel, text
    skipped = row_to_case(synthetic(attention_kernel="FlashAttention"))
    assert isinstance(skipped, Skipped) and "column 'attention_kernel' must be flash" in skipped.reason


def test_block_scaled_fp8_is_fp8_and_four_bit_training_is_refused():
    """Blackwell's MXFP8 runs fp8 products (phaze's fp8): until 2026-12-07 "mxfp8" in the
    precision column missed the fp8 pattern and fell to the framework's bf16, silently. A 4-bit
    run is not modelled and says so."""
    b200 = dict(gpu="B200", gpu_count="8")
    assert synthetic_case(precision="mxfp8 (Transformer Engine)", **b200).model.precision == "fp8"
    assert synthetic_case(precision="bf16 + MXFP8 linears", **b200).model.precision == "fp8"
    assert synthetic_case(compute_precision="mxfp8", **b200).model.precision == "fp8"
    for text in ("nvfp4", "bf16 + NVFP4 linears", "mxfp4 (TE)", "fp4"):
        skipped = row_to_case(synthetic(precision=text, **b200))
        assert isinstance(skipped, Skipped) and "4-bit training" in skipped.reason, text
    # a 16-bit row whose notes or words merely contain the letters is not caught
    assert synthetic_case(precision="bf16 (fp32 master weights)").model.precision == "bf16"


def test_a_32_bit_run_is_scored_in_32_bits():
    """A run in fp32 (TF32 matmuls on an A100 or H100: the chip file's fp32 peak) is scored in fp32:
    until 2026-12-07 a precision column saying fp32 fell through to the framework's bf16. A column
    naming fp32 beside a 16-bit type (master weights, amp) stays 16-bit."""
    for text in ("fp32", "FP32 (full precision)", "tf32", "float32"):
        assert synthetic_case(precision=text).model.precision == "fp32", text
    assert synthetic_case(compute_precision="tf32").model.precision == "fp32"
    for text in ("fp32 master weights, bf16 compute", "FP32 + AMP", "mixed fp32/fp16"):
        assert synthetic_case(precision=text).model.precision != "fp32", text
    fp32 = synthetic_case(precision="fp32")
    bf16 = synthetic_case(precision="bf16")
    assert v.predict_case(fp32) > v.predict_case(bf16)   # TF32 at half the 16-bit peak, 4-byte elements


def test_a_deepspeed_zero3_row_is_scored():
    """A DeepSpeed row at ZeRO stage 3 takes the megatron-deepspeed preset's optimizer, whose
    ZeRO-3 phaze models since 2026-12-07 (it was refused): it is scored, slower than the same
    row under torch's Adam (DeepSpeed's per-tensor gathers, its copies and its exposed last
    bucket; 16 A100s, so the gradients cross the network)."""
    c = synthetic_case(framework="DeepSpeed 0.9", zero_stage="3", tp="1", gpu_count="16", global_batch="64")
    assert (c.plan.optimizer, c.plan.zero) == ("adam-deepspeed", 3)
    t = v.predict_case(c)
    torch = v.predict_case(dataclasses.replace(c, plan=dataclasses.replace(c.plan, optimizer="adam")))
    assert math.isfinite(t) and t > torch


def test_blackwell_gpu_names_take_their_chip_files():
    """The B200 and GB200 spellings map to the shipped chip files (exact names only)."""
    for gpu, chip in (("B200", "B200-180GB"), ("B200-SXM-180GB", "B200-180GB"), ("DGX B200", "B200-180GB"),
                      ("GB200", "GB200-186GB"), ("GB200 NVL72", "GB200-186GB")):
        assert synthetic_case(gpu=gpu).chip.name == chip, gpu
    assert isinstance(row_to_case(synthetic(gpu="B100")), Skipped)   # another part: not guessed


def test_a_row_without_a_framework_column_takes_the_one_its_source_names():
    """A row of the standard columns alone (no ``framework``) runs under the preset its
    ``source_title``, else its ``source_locator``, names; a stated framework wins, and one phaze has
    no preset for is not replaced. Measured on the visible rows with every column beyond the
    standard ones blanked (in sample: chosen by watching that error, 2026-12-07): 10.7 % without
    the fallback, 7.6 % with it, against 6.5 % with the project's columns."""
    bare = dict(synthetic(), framework="", source_title="PyTorch torchtitan docs/performance.md (FSDP2)",
                source_locator="pytorch/torchtitan docs/performance.md")
    assert row_framework(bare).name == "torchtitan"
    assert synthetic_case(**{k: bare[k] for k in ("framework", "source_title", "source_locator")}).plan.zero == 3
    located = dict(bare, source_title="Korthikanti et al. 2022, Reducing Activation Recomputation",
                   source_locator="NVIDIA/Megatron-LM README.md @2e90a342 (2022-05-19)")
    assert row_framework(located).name == "megatron-lm"
    assert row_framework(dict(bare, source_title="Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B",
                                source_locator="")).name == "megatron-deepspeed"
    assert row_framework(dict(bare, framework="MaxText")).name == "maxtext"            # the column wins
    assert row_framework(dict(bare, framework="PaxML")) is None                        # not replaced
    assert row_framework(dict(bare, source_title="A paper", source_locator="Table 3")) is None
    # every visible row names its framework, so none of their predictions moves
    assert all(r["framework"].strip() for r in rows().values())


def test_a_blank_precision_takes_the_frameworks():
    """Megatron-LM 2021-22's example scripts pass --fp16 (its papers' runs trained so); the other
    presets' runs and a row without a framework get phaze's bf16; a stated precision wins."""
    assert synthetic_case(precision="", framework="Megatron-LM (2021)").model.precision == "fp16"
    assert synthetic_case(precision="not stated", framework="megatron-lm").model.precision == "fp16"
    assert synthetic_case(precision="", framework="Megatron-LM (2024)").model.precision == "bf16"   # megatron-core
    assert synthetic_case(precision="", framework="nemo").model.precision == "bf16"
    assert synthetic_case(precision="").model.precision == "bf16"
    assert synthetic_case(precision="bf16", framework="megatron-lm").model.precision == "bf16"
    assert synthetic_case(compute_precision="bf16", framework="megatron-lm").model.precision == "bf16"


def test_a_named_model_in_a_published_spelling_brings_its_vocabulary_and_kv_heads():
    """NeMo's performance tables name runs ``LLAMA2-13B (SFT)`` and ``Nemotron-340B``: with only the
    standard columns (shape, no vocabulary, no kv heads) the shipped workload of that shape gives
    them; an explicit column still wins, and another shape keeps the defaults."""
    shape13 = dict(layers="40", hidden="5120", heads="40", ffn_hidden="13824", seq_len="4096")
    c = synthetic_case(model="LLAMA2-13B (SFT)", **shape13)
    assert (c.model.vocab, c.model.kv_heads, c.model.activation) == (32000, 40, "swiglu")
    assert synthetic_case(model="LLAMA2-13B (SFT)", vocab="32768", **shape13).model.vocab == 32768
    other = synthetic_case(model="LLAMA2-13B (SFT)", **dict(shape13, layers="4"))
    assert other.model.vocab == DEFAULT_VOCAB
    big = row_to_case(synthetic(model="Nemotron-340B", layers="96", hidden="18432", heads="96",
                                  ffn_hidden="73728", seq_len="4096", gpu_count="1024", tp="8", pp="8",
                                  global_batch="512"))
    assert (big.model.vocab, big.model.kv_heads, big.model.activation) == (256000, 8, "relu")


def test_remaining_defaults():
    c = synthetic_case()
    assert c.plan.mbs == 1 and c.plan.recompute == "none" and c.plan.cp == 1
    assert c.plan.sp is True                                    # blank, tp > 1
    assert synthetic_case(tp="1", global_batch="32").plan.sp is False
    assert synthetic_case(sequence_parallel="no").plan.sp is False
    assert synthetic_case(recompute="selective").plan.recompute == "selective"
    assert c.model.vocab == DEFAULT_VOCAB
    assert synthetic_case(vocab="32000").model.vocab == 32000
    assert synthetic_case(notes="vocab 32000").model.vocab == DEFAULT_VOCAB
    assert c.source == "S99_test" and c.layout_from == "searched" and c.devices == 8   # no micro-batch
    assert synthetic_case(micro_batch="1", zero_stage="0").layout_from == "row"
    # no framework and no ZeRO stage: the distributed optimizer (ZeRO 1) is tried beside stage 0
    assert [a.zero for a in synthetic_case(micro_batch="1").alternatives] == [1]
    # selective is Megatron's core-attention recompute unless the row names torchtitan's per-op policy
    assert synthetic_case(recompute="selective", selective_recompute="attention").plan.recompute == "selective"
    assert synthetic_case(recompute="selective", selective_recompute="op").plan.recompute == "op"
    assert synthetic_case(recompute="full", selective_recompute="op").plan.recompute == "full"
    assert case("R1036").plan.recompute == "op"
    # blank on a torchtitan row: the framework preset's policy (torchtitan's per-op default)
    assert case("R1000").plan.recompute == "op"
    assert case("R1000", framework="", source_title="", source_locator="").plan.recompute == "selective"
    assert case("R1000", framework="").plan.recompute == "op"     # the source's title names torchtitan
    assert isinstance(row_to_case(synthetic(recompute="selective", selective_recompute="layer")), Skipped)


def test_quoted_defaults_that_the_row_contradicts_are_searched():
    """A column filled from a quoted default (listed in ``unconfirmed``) that the row's published
    values contradict was not what the run used: it is searched, as a blank one is. A published
    value is never dropped, and a row the search cannot cure keeps both reasons."""
    # micro-batch 3 does not divide the 4 sequences a replica takes (16 over dp 4): published, skipped
    bad = row_to_case(synthetic(micro_batch="3"))
    assert isinstance(bad, Skipped) and "--global-batch" in bad.reason, bad
    # quoted: searched among the micro-batches that divide it, as without one
    c = synthetic_case(micro_batch="3", unconfirmed="micro_batch")
    assert c.layout_from == "searched" and {p.mbs for p in (c.plan, *c.alternatives)} <= {1, 2, 4}
    blank = synthetic_case(micro_batch="")
    assert (c.plan, c.alternatives) == (blank.plan, blank.alternatives)
    # a quoted default the row does not contradict stays
    kept = synthetic_case(micro_batch="2", unconfirmed="micro_batch")
    assert {p.mbs for p in (kept.plan, *kept.alternatives)} == {2}
    # the contradiction is in a published column: searching the quoted ones cannot cure it
    worse = row_to_case(synthetic(micro_batch="3", dp="3", unconfirmed="micro_batch"))
    assert isinstance(worse, Skipped) and "with its quoted defaults (micro_batch) searched" in worse.reason
    # the NeMo launcher's 5B run of 1,440 sequences on 160 GPUs: its quoted tp 1, pp 1, micro-batch 2
    # leave 4.5 micro-batches a replica
    r0427 = case("R0427")
    assert r0427.layout_from == "searched" and r0427.global_batch == 1440
    assert all(1440 % (p.dp(160) * p.mbs) == 0 for p in (r0427.plan, *r0427.alternatives))


# --- 3. coverage of the bundled CSV ------------------------------------------------------------
def test_most_bundled_rows_are_expressed_and_skips_say_why():
    items = load_items(default_runs_paths())
    assert len(items) == len(rows()) >= 280
    cases = [c for c in items if isinstance(c, Case)]
    skipped = [c for c in items if isinstance(c, Skipped)]
    assert len(cases) + len(skipped) == len(items)
    assert len(cases) >= 0.85 * len(items), [s.reason for s in skipped]
    for s in skipped:
        assert s.reason.strip(), s
    for c in cases:
        assert math.isfinite(c.measured_step_s) and c.measured_step_s > 0, c.run_id
    # every source of the README is represented among the expressed rows
    assert {c.source[:3] for c in cases} >= {"S01", "S02", "S03", "S04", "S05", "S13", "S20", "S24"}
    assert {c.dataset for c in cases} == {"training_runs", "training_runs_2", "training_runs_3"}
    # every row names the chip file it is scored with; the power-limited HBM2e H100 has its own
    assert all(c.chip_file for c in cases)
    assert {c.chip_file for c in cases if c.gpu == "H100-HBM2e-96GB-500W"} == {"h100-hbm2e-96gb-500w"}
    # mixture-of-experts rows are modelled as experts, Qwen3-Next's Gated DeltaNet layers too
    moe = [i for i in items if rows()[i.run_id]["num_experts"]]
    assert len(moe) == 19 and sum(isinstance(i, Case) and i.model.moe for i in moe) >= 18
    assert all(isinstance(i, Case) or i.reason for i in moe)
    assert [i.run_id for i in moe if isinstance(i, Skipped) and "not modelled" in i.reason] == []


def test_explicit_columns_present_in_the_bundled_copies():
    for path in (RUNS_CSV, RUNS_2_CSV, RUNS_3_CSV):
        with open(path, newline="") as fh:
            header = csv.DictReader(fh).fieldnames
        assert set(EXPLICIT_COLUMNS) <= set(header), path


REFERENCE = ROOT / "phaze" / "data" / "reference"


def _checksums() -> dict[str, dict[str, str]]:
    with open(REFERENCE / "checksums.csv", newline="", encoding="utf-8") as fh:
        return {r["file"]: r for r in csv.DictReader(fh)}


def test_bundled_data_match_their_recorded_checksums():
    # runs in any clone: every bundled data file is listed in checksums.csv (recorded with the
    # reference collection's checksum of the file it was copied from, or "none" for a file the
    # project transcribed itself) and has exactly that content, so an edited, truncated or
    # re-encoded CSV fails here
    sums = _checksums()
    assert set(sums) == {p.name for p in REFERENCE.glob("*.csv")} - {"checksums.csv"}
    for name, row in sums.items():
        assert hashlib.sha256((REFERENCE / name).read_bytes()).hexdigest() == row["sha256"], name
        if row["reference_sha256"] == "none":
            assert row["differs_from_reference_by"].startswith("not in the reference collection"), name
            continue
        assert re.fullmatch(r"[0-9a-f]{64}", row["reference_sha256"]) and row["differs_from_reference_by"], name
        assert (row["sha256"] == row["reference_sha256"]) == (row["differs_from_reference_by"] == "nothing"), name


def test_bundled_copies_keep_the_published_values():
    # an extra where the reference collection is checked out beside the project (../shared): its
    # files are the ones checksums.csv was recorded from, and the project's copies equal them except
    # the new columns and the documented fills of blanks (S13 layout, S20 seq_len, S02 vp)
    shared = ROOT.parent / "shared" / "reference"
    if not (shared / "training_runs.csv").exists():
        pytest.skip("the reference collection (../shared/reference) is not beside this checkout")
    for name, row in _checksums().items():
        if row["reference_sha256"] != "none":
            assert hashlib.sha256((shared / name).read_bytes()).hexdigest() == row["reference_sha256"], name
    filled = {"S13": {"tp", "pp", "micro_batch", "global_batch", "recompute", "sequence_parallel"},
              "S20": {"seq_len"}, "S02": {"vp"}}
    for name in ("training_runs.csv", "training_runs_2.csv"):
        ours = {r["run_id"]: r for r in read_runs(REFERENCE / name)}
        theirs = {r["run_id"]: r for r in read_runs(shared / name)}
        assert set(ours) == set(theirs)
        for rid, t in theirs.items():
            for k, value in t.items():
                if value != ours[rid][k]:
                    assert value == "" and k in filled.get(t["source_id"][:3], ()), (rid, k)


def test_activation_offload_is_a_full_recompute_with_the_named_tensors_on_the_host():
    # MaxText's qkv_proj_offloaded (the row's run script): recompute offload, column offload qkv_proj
    assert (rows()["R1088"]["recompute"], rows()["R1088"]["offload"]) == ("offload", "qkv_proj")
    c = case("R1088")
    assert (c.plan.recompute, c.plan.offload) == ("full", "qkv_proj")
    assert case("R1088", recompute="full").plan.offload == "qkv_proj"      # the same plan, said as full
    assert case("R1088", recompute="full", offload="").plan.offload == ""
    # what is offloaded must be named, and only a full recompute offloads
    for changes, words in (({"offload": ""}, "column 'offload' must name"),
                           ({"offload": "everything"}, "column 'offload' must be one of qkv_proj"),
                           ({"recompute": "selective"}, "it needs recompute offload or full")):
        item = row_to_case(row("R1088", **changes))
        assert isinstance(item, Skipped) and words in item.reason, (changes, item)
    # a chip whose file gives no host link cannot offload (TPU v4: none published)
    item = row_to_case(row("R1088", chip="tpuv4", gpu="TPUv4", system_config="tpuv4-multislice"))
    assert isinstance(item, Skipped) and "host_bandwidth_bytes_per_s" in item.reason


# --- 4. malformed input ------------------------------------------------------------------------
def test_read_runs_missing_column(tmp_path):
    header = [k for k in REQUIRED_COLUMNS if k != "measured_value"]
    path = write_csv(tmp_path / "bad.csv", [synthetic()], fieldnames=header)
    with pytest.raises(ConfigError) as exc:
        read_runs(path)
    assert exc.value.field == "measured_value" and "measured_value" in str(exc.value)


def test_read_runs_unreadable_paths(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        read_runs(tmp_path / "nothere.csv")
    with pytest.raises(ConfigError):            # a directory is not a CSV (used to leak IsADirectoryError)
        read_runs(tmp_path)
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00\x9c\x80" * 50)
    with pytest.raises(ConfigError):
        read_runs(tmp_path / "bin.csv")


def test_cli_missing_column(tmp_path):
    header = [k for k in REQUIRED_COLUMNS if k != "gpu_count"]
    path = write_csv(tmp_path / "bad.csv", [synthetic()], fieldnames=header)
    proc = phaze_cli(tmp_path, "validate", "--runs", str(path), "--no-loso", "--unseen", "")
    one_line_error(proc, "bad.csv", "gpu_count")


BAD_ROWS = [  # (changes, words the skip reason must contain)
    (dict(run_id="B1", gpu_count="eight"), ("gpu_count", "eight")),
    (dict(run_id="B2", measured_value="fast"), ("measured_value", "fast")),
    (dict(run_id="B3", measured_metric="flops_per_watt"), ("measured_metric", "flops_per_watt")),
    (dict(run_id="B4", gpu="TPU-v9", chip=""), ("TPU-v9",)),
    (dict(run_id="B5", measured_value="-5"), ("measured_value",)),
    (dict(run_id="B6", gpu_count="-8"), ("gpu_count",)),
    (dict(run_id="B7", measured_value=""), ("measured_value",)),
    (dict(run_id="B8", layers="2.5"), ("layers",)),
    # the fuzz's widths of 1e308: their products once left the floats (a traceback)
    (dict(run_id="B9", hidden="1e308"), ("hidden", "out of range", "1e+15")),
    (dict(run_id="B10", ffn_hidden="1e308"), ("ffn_hidden", "out of range")),
    (dict(run_id="B11", head_dim="1e308"), ("head_dim", "out of range")),
]


@pytest.mark.parametrize("changes, words", BAD_ROWS, ids=[c["run_id"] for c, _ in BAD_ROWS])
def test_bad_row_is_skipped_with_reason(changes, words):
    s = row_to_case(row("R0033", **changes))
    assert isinstance(s, Skipped)
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
    assert st["bias_pct"] == pytest.approx(100 * (0.02 - 0.04 + 0.08 - 0.5) / 4)   # -11 %
    assert v.error_stats([]) == {"rows": 0}
    one = v.error_stats([-0.3])
    assert one["bias_pct"] == pytest.approx(-30.0)
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
    skip = Skipped("Z1", "S99", "TPU", "unknown GPU")
    p_slow, p_fast, p_skip = v.predict_all([slow, fast, skip], None)
    assert p_slow.status == "ok" and p_slow.predicted_step_s > 0
    assert p_slow.error == pytest.approx((p_slow.predicted_step_s - 1e6) / 1e6)
    assert p_slow.error < 0 < p_fast.error
    assert p_fast.predicted_step_s == pytest.approx(p_slow.predicted_step_s)
    assert (p_skip.status, p_skip.reason, p_skip.error) == ("skipped", "unknown GPU", None)


def test_case_weights_balance_sources():
    cs = [SimpleNamespace(source="A", layout_from="row")] * 3 + \
         [SimpleNamespace(source="B", layout_from="row"), SimpleNamespace(source="B", layout_from="unconfirmed")]
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
    # params_for: family, else the execution model's, else default, else ideal
    a100 = SimpleNamespace(family="A100", execution="eager")
    assert params_for(a100, params) == params["A100"]
    assert params_for(SimpleNamespace(family="H100", execution="eager"), params) == params["default"]
    assert params_for(a100, None) == Efficiency()
    xla = Efficiency(tensor_fraction=0.9)
    both = dict(params, **{"execution:xla": xla})
    assert params_for(SimpleNamespace(family="TPUv5p", execution="xla"), both) == xla
    assert params_for(SimpleNamespace(family="H100", execution="eager"), both) == params["default"]
    assert params_for(a100, both) == params["A100"]       # a family's own fit wins


def test_tracked_predictions_name_the_fit_that_scored_each_row():
    # results/validation/predictions.csv: in sample the TPU v4 rows are scored by the TPU runs' fit;
    # held out, no TPU row is left to fit, so the pooled one scores them (and says so)
    with open(ROOT / "results" / "validation" / "predictions.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["status"] == "ok"]
    tpu = [r for r in rows if r["chip"] == "tpuv4"]
    assert tpu and {(r["fit"], r["loso_fit"]) for r in tpu} == {("execution:xla", "default")}
    assert {r["fit"] for r in rows if r["chip"].startswith("a100")} == {"A100"}
    assert {r["fit"] for r in rows if r["chip"].startswith("h100")} == {"H100"}


def test_fit_groups_add_an_execution_model_only_beside_another():
    def c(source, family, execution):
        return SimpleNamespace(source=source, chip=SimpleNamespace(family=family, execution=execution))
    gpu = [c("S1", "A100", "eager"), c("S2", "A100", "eager"), c("S3", "H100", "eager")]
    tpu = [c("S9", "TPUv4", "xla")]
    # one execution model: its fit would be the pooled one, so there is none
    assert v.fit_groups(gpu) == ["A100", "default"]
    # two: each gets one; the TPU family (one source) has none of its own and falls to xla's
    assert v.fit_groups(gpu + tpu) == ["A100", "execution:eager", "execution:xla", "default"]
    assert [x.source for x in gpu + tpu if v.in_group(x, "execution:xla")] == ["S9"]
    assert [x.source for x in gpu + tpu if v.in_group(x, "A100")] == ["S1", "S2"]
    assert len([x for x in gpu + tpu if v.in_group(x, "default")]) == 4


def test_shipped_calibration_scores_a_proposed_accelerator_with_the_tpu_runs_fit():
    # a kind: accelerator chip runs as XLA compiles it; no family fit covers it, so it takes the fit
    # of the rows that run that way (the TPU v4 ones), not the GPU-pooled default
    params = load_default_params()
    assert {"execution:xla", "execution:eager", "default"} <= set(params)
    tpu = load_chip(ROOT / "arch_configs" / "tpuv4.yaml")
    assert tpu.execution == "xla" and tpu.family not in params
    assert params_for(tpu, params) == params["execution:xla"] != params["default"]
    assert calibrated_efficiency(tpu) == params["execution:xla"]


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
        assert {"run_id", "chip", "measured_step_s", "predicted_step_s", "error", "status"} <= \
            set(reader.fieldnames)
        got = list(reader)
    assert {r["run_id"]: r["chip"] for r in got if r["run_id"] in ("R0000", "R0033")} == \
        {"R0000": "a100-80gb", "R0033": "h100-sxm"}
    # each row names the parameter set that scored it (the shipped calibration's family fits here)
    assert {r["run_id"]: r["fit"] for r in got if r["run_id"] in ("R0000", "R0033")} == \
        {"R0000": "A100", "R0033": "H100"}
    assert {r["loso_fit"] for r in got} == {""}        # --no-loso
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
    # R0416, GPT-3 5B at tp 1 and pp 1 on 80 GB A100s without ZeRO, ran but does not fit phaze's
    # memory model: its model state alone, 16-bit weights with fp32 main gradients, master weights
    # and Adam moments (18 bytes a parameter) over its 5.0 B parameters, exceeds the usable memory;
    # the row is scored all the same, flagged in the fits column and in the printout
    fits = {r["run_id"]: r for r in got if r["status"] == "ok"}
    big = fits.pop("R0416")
    assert big["fits"] == "no" and float(big["memory_gib"]) >= 18 * 5.0e9 / 2 ** 30 > float(big["usable_gib"])
    assert big["predicted_step_s"] != ""
    assert all(r["fits"] == "yes" and float(r["memory_gib"]) <= float(r["usable_gib"]) for r in fits.values())
    assert {r["fits"] for r in got if r["status"] == "skipped"} == {""}
    assert ("published plans phaze's memory model does not fit: 1 of 7 (S13_nemo_launcher_a100 1;" in proc.stdout
            and f"  R0416: {float(big['memory_gib']):.1f} GiB a device, {float(big['usable_gib']):.1f} usable"
            in proc.stdout)

    proc = ok_cli(phaze_cli(tmp_path, "validate", "--runs", str(small_csv), "--no-loso",
                            "--format", "json", "--group", "megatron=S01,S02,S03"))
    summary = json.loads(proc.stdout)
    assert [x["run_id"] for x in summary["over_memory"]] == ["R0416"]
    n_ok = sum(r["status"] == "ok" for r in got)
    assert summary["overall"]["expressed"] == n_ok == 7
    assert summary["overall"]["total"] == len(SMALL) and summary["overall"]["rows"] == n_ok
    assert summary["in_sample"]["groups"]["megatron"]["rows"] == 4     # R0000, R0010, R0015, R0024
    assert set(summary["in_sample"]["per_gpu"]) == {"A100-SXM4-80GB", "H100-SXM5-80GB"}
    assert set(summary["in_sample"]["per_chip"]) == {"a100-80gb", "h100-sxm"}
    assert summary["unseen_gpu"]["clean"] is False
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
    ("H100 80GB HBM3", "h100-sxm"), ("H100 PCIe", None), ("H200 SXM", "h200-sxm"), ("H200 NVL", None),
    ("A100 PCIe 40GB", None),
    ("V100", None), ("H100-HBM2e-96GB-500W", "h100-hbm2e-96gb-500w"), ("H100 NVL", None),
    ("H100-SXM5-94GB", None), ("TPUv4", "tpuv4"), ("TPU v4", "tpuv4"), ("TPUv5e", "tpuv5e"), ("TPU v5e", "tpuv5e"),
    ("TPUv5p", "tpuv5p"), ("TPU v5p", "tpuv5p"), ("TPU v5", None), ("V100-SXM2-32GB", "v100-sxm2-32gb"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"), ("V100-SXM2-16GB", None),
    # the names the drivers report (nvidia-smi, CUDA, Cloud TPU), vendor prefix and all
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200-sxm"), ("NVIDIA H200 NVL", None),
    ("H200", None), ("NVIDIA H100 PCIe", None), ("NVIDIA B200", "b200"), ("Google TPU v4", "tpuv4"),
    ("Cloud TPU v5p", "tpuv5p"), ("TPU v5 lite", "tpuv5e"), ("v5litepod", "tpuv5e"), ("NVIDIA", None),
    # NVIDIA's systems, by the one part each holds; a DGX A100 without its memory is either
    ("DGX H100", "h100-sxm"), ("NVIDIA DGX-H100", "h100-sxm"), ("HGX H100", "h100-sxm"), ("DGX H200", "h200-sxm"),
    ("DGX A100 640GB", "a100-80gb"), ("DGX A100 320GB", "a100-40gb"), ("DGX A100 80GB", "a100-80gb"),
    ("DGX A100", None)])
def test_gpu_names(gpu, chip):
    from phaze.runs import chip_for_gpu
    assert chip_for_gpu(gpu) == chip


@pytest.mark.parametrize("text,mode", [("full", "full"), ("uniform", "full"), ("block", "block"),
                                       ("True", "full"), ("selective", "selective"), ("no", "none"),
                                       ("", "selective")])
def test_recompute_spellings(text, mode):
    # blank: not stated, so the least recompute with which the row's plan fits in memory (R0010,
    # GPT-22B on 8 A100s, tp 8, mbs 4, no sp, does not fit without any)
    from phaze.runs import default_runs_path, read_runs, row_to_case
    row = dict(next(r for r in read_runs(default_runs_path()) if r["run_id"] == "R0010"))
    row["recompute"] = text
    assert row_to_case(row).plan.recompute == mode


@pytest.mark.parametrize("text,mode", [("full (uniform)", "full"), ("selective (core_attn)", "selective"),
                                       ("Selective recompute", "selective"), ("full, 1 layer", "full"),
                                       ("none (fits)", "none")])
def test_recompute_read_by_its_leading_word(text, mode):
    """A recompute column with a note after its value is read by its leading word; one whose
    leading word is not a recompute stays refused with the column and what is allowed."""
    from phaze.runs import default_runs_path, read_runs, row_to_case
    row = dict(next(r for r in read_runs(default_runs_path()) if r["run_id"] == "R0010"))
    assert row_to_case(dict(row, recompute=text)).plan.recompute == mode
    for bad in ("activation checkpointing", "partial", "recompute=full"):
        skipped = row_to_case(dict(row, recompute=bad))
        assert "column 'recompute' must be none, selective, block or full" in skipped.reason


def test_blank_recompute_takes_the_fewest_whole_layers_that_fit():
    # R0010 at 4,096 tokens: selective does not fit, so the least recompute is a block re-running
    # the fewest layers whole with which it fits (one fewer does not); a framework without a
    # count of layers (Megatron-DeepSpeed) recomputes every layer
    from phaze.runs import default_runs_path, read_runs, row_to_case
    row = dict(next(r for r in read_runs(default_runs_path()) if r["run_id"] == "R0010"), recompute="",
               seq_len="4096")
    c = row_to_case(row)
    assert c.plan.recompute == "block" and c.layout_from == "searched"
    (k,) = c.plan.recompute_layers

    def fits(p):
        p = dataclasses.replace(p, schedule="sequential")
        return v.evaluate(c.model, c.chip, c.devices, c.global_batch, p).fits
    assert 1 < k < c.model.layers
    assert fits(c.plan) and not fits(dataclasses.replace(c.plan, recompute_layers=(k - 1,)))
    assert not fits(dataclasses.replace(c.plan, recompute="selective", recompute_layers=()))
    assert row_to_case(dict(row, framework="Megatron-DeepSpeed")).plan.recompute == "full"
    # a row that says block: its count when the column gives one, else the same fewest that fit
    said = row_to_case(dict(row, recompute="block"))
    assert said.plan.recompute_layers == (k,) and said.layout_from == "searched"
    given = row_to_case(dict(row, recompute="block", recompute_layers="46"))
    assert given.plan.recompute == "block" and given.plan.recompute_layers == (46,) and given.layout_from == "row"
    for bad in (dict(row, recompute="full", recompute_layers="2"), dict(row, recompute="block", recompute_layers="0")):
        skipped = row_to_case(bad)
        assert isinstance(skipped, Skipped) and "recompute_layers" in skipped.reason


# --- 9. no free text reaches the model; MoE, pipelines, names -----------------------------------
@pytest.mark.parametrize("rid", ["R0000", "R0010", "R0033", "R0255", "R0416", "R1000", "R1013", "R1061"])
def test_notes_never_change_a_case(rid):
    base = case(rid)
    for note in ("", "FlashAttention; ZeRO stage 1; vocab 32000; kv_groups=4; tp-comm-overlap; "
                     "mp=DEFAULT; interleaving=4; tp2 pp2 mbs4 gbs64; FSDP FULL_SHARD; 96*B*s*l*h^2"):
        assert case(rid, notes=note) == base


def test_no_code_path_reads_the_notes_column():
    assert "notes" not in MODEL_COLUMNS
    pattern = re.compile(r"""(\[\s*["']notes["']\s*\]|\.get\(\s*["']notes["'])""")
    offenders = [f"{p.name}:{i}" for p in sorted((ROOT / "phaze").rglob("*.py"))
                 for i, text in enumerate(p.read_text().splitlines(), 1) if pattern.search(text)]
    assert offenders == []


def test_moe_rows_are_modelled_or_skipped_with_the_reason(monkeypatch):
    c = row_to_case(rows()["R1046"])          # Qwen3-Next-80B-A3B: Gated DeltaNet in 36 of 48 layers
    assert isinstance(c, Case) and c.model.gdn_layers == 36 and c.model.mtp_layers == 1
    # a catalogued model whose architecture phaze does not model is skipped with the reason
    entry = dict(model="Some-Linear-MoE-80B", experts="512", top_k="10", total_params_b="80", active_params_b="3",
                 not_modelled="lightning attention in most layers, which phaze does not model")
    monkeypatch.setattr("phaze.runs.moe_models", lambda: {"somelinearmoe80b": entry})
    s = row_to_case(synthetic(model="Some-Linear-MoE-80B"))
    assert isinstance(s, Skipped) and "512 experts" in s.reason and "top-10" in s.reason
    assert "not modelled" in s.reason and "lightning attention" in s.reason
    monkeypatch.undo()
    # a CSV without the num_experts column: a shipped MoE model is recognised by name, its ep assumed
    c = row_to_case(synthetic(model="Mixtral-8x7B", micro_batch="1", zero_stage="0"))
    assert isinstance(c, Case) and (c.model.experts, c.model.top_k) == (8, 2) and c.layout_from == "unconfirmed"
    # gpt-oss-20b is shipped: a row naming it is its mixture of experts
    c = row_to_case(synthetic(model="gpt-oss-20b", layers="", hidden="", heads="", micro_batch="1"))
    assert isinstance(c, Case) and (c.model.experts, c.model.top_k, c.model.layers) == (32, 4, 24)
    # a published MoE model phaze does not ship (a catalogue entry without a workload)
    entry = dict(model="Some-MoE-20B", experts="32", top_k="4", total_params_b="20.9", active_params_b="3.6",
                 not_modelled="")
    monkeypatch.setattr("phaze.runs.moe_models", lambda: {"somemoe20b": entry})
    s = row_to_case(synthetic(model="Some-MoE-20B"))
    assert isinstance(s, Skipped) and "32 experts" in s.reason and "20.9B total" in s.reason
    assert "no shipped workload describes it" in s.reason


def test_state_space_models_without_a_workload_are_skipped_with_the_reason():
    """A row naming a catalogued Mamba-2 model phaze ships no workload for, by any of its
    spellings, is skipped with that reason, whatever shape its columns give: costed as 56
    transformer layers it would be a different model (Nemotron-H, which phaze ships, is
    expressed: tests/test_hybrid.py)."""
    for name in ("Mamba2 Hybrid 8B", "mamba2_hybrid_8b", "Mamba-2-8B"):
        s = row_to_case(synthetic(model=name, layers="56", hidden="4096", heads="32", ffn_hidden="16384"))
        assert isinstance(s, Skipped), name
        assert "is not expressed: phaze ships no workload for it" in s.reason
    hybrid = unmodelled_models()[name_key("Mamba2-Hybrid-8B")]["not_modelled"]
    pattern = "M-M-M--M-M*-M-M-M-M--M*-M-M-M-M-M*--M-M-M-M-M*-M--M-M-M-"   # NeMo NVIDIAMambaHybridConfig8B
    assert (f"{pattern.count('M')} Mamba-2, {pattern.count('*')} attention and {pattern.count('-')} MLP "
            f"layers") in hybrid
    assert isinstance(row_to_case(synthetic(model="Nemotron-4-15B")), Case)   # a transformer


@pytest.mark.parametrize("pp", ["2", "1"])
def test_row_without_micro_batch_is_scored_with_the_fastest_that_fits(pp):
    c = synthetic_case(layers="12", tp="1", pp=pp, zero_stage="0", vp="1")
    dp = c.plan.dp(c.devices)
    tried = [p.mbs for p in (c.plan, *c.alternatives)]
    assert c.layout_from == "searched" and c.plan.mbs == 1
    assert tried == [b for b in SEARCHED_MICRO_BATCHES if (c.global_batch // dp) % b == 0] and len(tried) > 1
    from phaze.step import evaluate
    results = [evaluate(c.model, c.chip, c.devices, c.global_batch, dataclasses.replace(c.plan, mbs=b))
               for b in tried]
    fitting = [r.step_time_s for r in results if r.fits]
    assert fitting and v.predict_case(c) == min(fitting)
    # a stated micro-batch is used as given, with nothing searched
    stated = synthetic_case(layers="12", tp="1", pp=pp, micro_batch="2", zero_stage="0", vp="1")
    assert stated.plan.mbs == 2 and stated.alternatives == () and stated.layout_from == "row"
    # searched rows weigh half in a fit, as unconfirmed ones do
    w = v.case_weights([c, stated])
    assert w[0] == pytest.approx(0.5 * w[1])


@pytest.mark.parametrize("name, layers, hidden", [
    ("Nemotron-4 15B", 32, 6144), ("Nemotron-4-340B", 96, 18432), ("Llama 3.1 8B", 32, 4096),
    ("Llama-3.1-70B", 80, 8192), ("llama-3.1-405b", 126, 16384)])
def test_row_without_shape_resolves_to_a_shipped_workload(name, layers, hidden):
    c = synthetic_case(model=name, layers="", hidden="", heads="", tp="1", global_batch="16",
                       seq_len="4096", precision="bf16")
    assert (c.model.layers, c.model.hidden, c.model.seq_len) == (layers, hidden, 4096)


def test_row_without_shape_and_unknown_name_is_skipped():
    s = row_to_case(synthetic(model="Unknown-9B", layers="", hidden="", heads=""))
    assert isinstance(s, Skipped) and "Unknown-9B" in s.reason and "workload" in s.reason


def test_leave_one_source_out_on_a_small_subset(monkeypatch):
    cs = [case(i) for i in ("R0000", "R0001", "R0010", "R0011", "R0033", "R0061")]
    seen = []
    real = v.fit_each

    def spy(groups, jobs=1, done=None):
        seen.extend({c.source for c in g} for g in groups)
        return real(groups, jobs, done)
    monkeypatch.setattr(v, "fit_each", spy)
    ticks = []
    summary, preds = v.leave_one_source_out(cs, progress=ticks.append)
    sources = {c.source for c in cs}
    assert len(ticks) == v.loso_fits(cs) == len(seen) > len(sources) == 3   # one tick per fit, not per fold
    # each fit leaves one source out (a family fit may miss others too: those not of its chips),
    # and each source is left out of its fold's pooled fit, fitted on all the others
    assert all(trained_on < sources for trained_on in seen)
    assert {frozenset(t) for t in seen if len(sources - t) == 1} == {frozenset(sources - {s}) for s in sources}
    assert sorted(p.run_id for p in preds) == sorted(c.run_id for c in cs)
    assert summary["overall"]["rows"] == len(cs)
    assert set(summary["per_source"]) == sources
    for p in preds:
        assert p.status == "ok" and p.predicted_step_s > 0 and math.isfinite(p.error)


def test_packed_fine_tuning_rows_are_skipped_with_the_reason():
    """Packed documents attend only within themselves: without their lengths the attention work is
    unknown, so such a row is refused rather than costed as one causal sequence."""
    s = row_to_case(synthetic(packed_documents="yes"))
    assert isinstance(s, Skipped) and "packs several documents" in s.reason
    assert isinstance(row_to_case(synthetic(packed_documents="no")), Case)
    for rid in ("R0261", "R0262", "R0263"):
        assert isinstance(row_to_case(rows()[rid]), Skipped)


def test_parameter_efficient_fine_tuning_rows_are_skipped_with_the_reason():
    """A ``peft`` column other than full training, or a model named ``LLAMA3-70B (LoRA)`` with the
    column blank, is skipped: costed as full training it would count every weight's gradient, its
    reduction and its optimizer. An explicit ``full`` wins over the name."""
    for row in (synthetic(peft="lora"), synthetic(peft="QLoRA"), synthetic(model="LLAMA2-13B (LoRA)")):
        s = row_to_case(row)
        assert isinstance(s, Skipped) and "parameter-efficient fine-tuning" in s.reason, row
    assert "allowed: blank, none or full" in row_to_case(synthetic(peft="lora")).reason
    for value in ("", "none", "full", "Full"):
        assert isinstance(row_to_case(synthetic(peft=value)), Case), value
    assert isinstance(row_to_case(synthetic(model="LLAMA2-13B (LoRA)", peft="full")), Case)


@pytest.mark.parametrize("value", ["1e308", "1e-320"])
def test_a_value_whose_step_time_is_not_finite_and_positive_is_skipped(value):
    """A throughput so large that the step time underflows to 0 (refused first as out of any
    column's range) or so small that it overflows is refused with the reason instead of dividing
    by zero later."""
    s = row_to_case(synthetic(measured_metric="tokens_per_s_per_gpu", measured_value=value))
    assert isinstance(s, Skipped)
    assert ("out of range" if value == "1e308" else "positive finite") in s.reason


def test_summary_gives_each_source_one_vote_and_drops_the_largest():
    """The per-source mean weighs every source the same (a source with many rows cannot carry the
    headline), and the figure without the largest source leaves exactly its rows out."""
    from phaze.validate import Prediction, summarize
    preds = [Prediction(f"r{i}", "big", "x", 1.0, 1.1, 0.10, "ok") for i in range(8)]
    preds += [Prediction("s1", "small", "x", 1.0, 0.7, -0.30, "ok"),
              Prediction("s2", "small", "x", 1.0, 1.5, 0.50, "ok"),
              Prediction("s3", "gone", "x", None, None, None, "skipped")]
    s = summarize(preds)
    assert s["overall"]["mape_pct"] == pytest.approx(100 * (8 * 0.1 + 0.3 + 0.5) / 10)
    assert s["source_mean"]["sources"] == 2
    assert s["source_mean"]["mape_pct"] == pytest.approx((10.0 + 40.0) / 2)
    assert s["source_mean"]["bias_pct"] == pytest.approx((10.0 + 10.0) / 2)
    w = s["without_largest_source"]
    assert w["source"] == "big" and w["rows"] == 2 and w["mape_pct"] == pytest.approx(40.0)


@pytest.mark.parametrize("held_out", [True, False])
def test_validation_plot_says_whether_it_is_held_out(tmp_path, monkeypatch, held_out):
    """The predicted-against-measured figure names what it shows: leave-one-source-out predictions,
    or in-sample ones (parameters fitted on the same runs)."""
    import matplotlib.figure

    from phaze import cli
    from phaze.validate import Prediction
    titles = []
    real = matplotlib.figure.Figure.savefig

    def spy(self, *a, **k):
        titles.append(self.axes[0].get_title())
        return real(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    preds = [Prediction("a", "S", "A100", 1.0, 1.1, 0.1, "ok"), Prediction("b", "S", "H100", 2.0, 1.8, -0.1, "ok")]
    cli._plot(str(tmp_path / "p.png"), preds, held_out=held_out)
    assert (tmp_path / "p.png").stat().st_size > 0
    assert ("leave-one-source-out" in titles[0]) == held_out and ("IN-SAMPLE" in titles[0]) == (not held_out)


def test_blank_recompute_may_recompute_more_where_that_buys_a_faster_plan():
    # R0029 (GPT-119B on 1,536 H100s, tp 8, pp 4; micro-batch, vp and recompute not stated): its
    # least recompute is none, but a block recompute lets a larger micro-batch fit, and that plan is
    # faster than every plan that fits without recompute; a tuned run takes it. Oracle: the row's
    # grid (micro-batch x vp) under none, Megatron-Core's selective and full, evaluated apart; the
    # block plan's count is the fewest that fits. A log that counts the recompute's FLOPs
    # (narayanan96) keeps the least recompute: its measured step depends on it.
    from phaze.placement import PlacementOptions, vp_values
    row = dict(next(r for r in read_runs(default_runs_path()) if r["run_id"] == "R0029"))
    c = row_to_case(row)
    eff = calibrated_efficiency(c.chip)
    assert c.plan.recompute == "none" and c.layout_from == "searched"
    plan, step = v.scored_plan(c, eff)
    assert plan.recompute == "block"

    def result(p):
        return v.evaluate(c.model, c.chip, c.devices, c.global_batch, p, eff)
    (k,) = plan.recompute_layers
    assert not result(dataclasses.replace(plan, recompute_layers=(k - 1,))).fits
    grid = [dataclasses.replace(c.plan, mbs=b, vp=u, recompute=r)
            for b in SEARCHED_MICRO_BATCHES for u in vp_values(c.model, c.plan.pp, PlacementOptions())
            for r in ("none", "selective", "full")]
    times = [r.step_time_s for r in map(result, _valid_plans(c.model, c.devices, c.global_batch, grid)) if r.fits]
    assert len(times) > 10 and step < min(times)
    counted = row_to_case(dict(row, flop_convention="narayanan96"))
    assert {p.recompute for p in (counted.plan, *counted.alternatives)} == {"none"}
    assert v.scored_plan(counted, eff)[0].recompute == "none"


def test_pipeline_schedule_column_runs_dualpipe_and_keeps_it_unsearched():
    """``pipeline_schedule`` dualpipe: the row's plan runs DualPipe, whose chunks are its own (vp is
    not searched, as it is for a pipelined row of an interleaving framework); blank is 1F1B; a
    row DualPipe cannot run (too few micro-batches) is skipped with the reason; a bad value names
    the column."""
    base = synthetic(layers="8", tp="1", pp="4", global_batch="64", micro_batch="1", framework="megatron-core")
    assert row_to_case(base).plan.pipe_schedule == "1f1b"
    c = row_to_case(dict(base, pipeline_schedule="DualPipe"))
    assert c.plan.pipe_schedule == "dualpipe" and c.plan.vp == 1 and c.alternatives == ()
    assert row_to_case(dict(base, vp="")).alternatives   # 1F1B: the interleavings are tried
    skipped = row_to_case(dict(base, pipeline_schedule="dualpipe", global_batch="4"))
    assert not isinstance(skipped, Case) and "at least 2 * pp = 8" in skipped.reason
    bad = row_to_case(dict(base, pipeline_schedule="zb"))
    assert "column 'pipeline_schedule' must be one of 1f1b, interleaved, dualpipe, got 'zb'" in bad.reason


def test_a_mixture_of_experts_without_its_layout_is_laid_out_by_the_placement():
    """A mixture-of-experts row that gives neither tp nor pp takes the layout, ep included, of
    the best plan phaze's placement finds for it, as a dense row does (it was skipped before):
    a valid expert layout that fits; a stated ep is kept."""
    from phaze.step import evaluate
    base = synthetic(model="Mixtral-8x7B", layers="", hidden="", heads="", gpu="H100-SXM5-80GB", gpu_count="16",
                     tp="", pp="", global_batch="128", seq_len="4096", framework="megatron-core")
    c = row_to_case(base)
    assert isinstance(c, Case), getattr(c, "reason", c)
    assert c.layout_from == "searched" and c.model.experts == 8
    p = c.plan
    assert p.ep > 1 and 8 % p.ep == 0 and (p.tp * p.cp * p.dp(16)) % (p.ep * p.etp) == 0
    assert evaluate(c.model, c.chip, 16, 128, p, calibrated_efficiency(c.chip)).fits
    given = row_to_case(dict(base, ep="2"))
    assert given.plan.ep == 2 and given.layout_from == "searched"


def test_pipeline_schedule_column_pins_the_interleaving_down():
    """``pipeline_schedule``: ``1f1b`` is not interleaved (vp 1, not searched even under an
    interleaving framework); ``interleaved`` without vp takes the framework's default (torchtitan's
    looped schedules: 2 virtual stages a rank) or the best vp above 1; a vp that contradicts the
    schedule, an interleaved run on one stage or under a framework without the schedule is
    skipped with the reason."""
    base = synthetic(layers="8", tp="1", pp="4", global_batch="64", micro_batch="1", vp="")
    core = dict(base, framework="megatron-core")
    assert {a.vp for a in row_to_case(core).alternatives} | {row_to_case(core).plan.vp} >= {1, 2}
    flat = row_to_case(dict(core, pipeline_schedule="1f1b"))
    assert flat.plan.vp == 1 and flat.alternatives == ()
    inter = row_to_case(dict(core, pipeline_schedule="interleaved"))
    vps = {inter.plan.vp} | {a.vp for a in inter.alternatives}
    assert 1 not in vps and 2 in vps and inter.layout_from == "searched"
    titan = row_to_case(dict(base, framework="torchtitan", pipeline_schedule="Interleaved"))
    assert titan.plan.vp == 2 and all(a.vp == 2 for a in titan.alternatives)
    assert row_to_case(dict(base, framework="torchtitan")).plan.vp == 1   # its default schedule: 1F1B
    assert row_to_case(dict(base, layers="16", framework="torchtitan", pipeline_schedule="interleaved",
                              vp="4")).plan.vp == 4
    for row, said in ((dict(core, pipeline_schedule="1f1b", vp="2"), "runs no interleaved chunks, but vp is 2"),
                      (dict(core, pipeline_schedule="interleaved", vp="1"), "interleaved, but vp is 1"),
                      (dict(core, pipeline_schedule="interleaved", pp="1"), "needs pp > 1"),
                      (dict(base, framework="megatron-deepspeed", pipeline_schedule="interleaved"),
                       "megatron-deepspeed has no interleaved pipeline schedule")):
        assert said in row_to_case(row).reason
