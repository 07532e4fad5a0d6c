"""Activation offload (``Plan.offload``): MaxText's ``qkv_proj_offloaded`` remat policy, a full
recompute whose q, k and v projections' outputs go to the host's memory in the forward pass and
come back for the backward instead of being re-made. Each against a count derived by hand."""
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from phaze.arch import load_chip
from phaze.area import _step_activity as step_activity
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.cost import IDEAL, Efficiency
from phaze.graph import layer_graph, offloaded_bytes
from phaze.memory import activation_bytes_per_layer
from phaze.plan import Plan, graph_recompute, parse_plan
from phaze.step import evaluate
from phaze.workload import Model

# a Llama-like layer: 32 query heads of 128, 8 KV heads
LLAMA = Model(name="llama-like", layers=4, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
              vocab=128256, seq_len=4096, activation="swiglu", position_embedding="rotary",
              norm="rmsnorm", bias=False, dropout=False, tied_embeddings=False)
OFF = graph_recompute("full", (), "qkv_proj")


def test_the_plan_text_round_trips_and_names_the_graph():
    plan = parse_plan("tp=4,mbs=2,recompute=full,offload=qkv_proj")
    assert plan.offload == "qkv_proj" and parse_plan(plan.label()) == plan
    assert OFF == "full/offload=qkv_proj" and graph_recompute("full", (), "") == "full"
    with pytest.raises(ConfigError, match="field 'offload': must be one of qkv_proj"):
        parse_plan("recompute=full,offload=all")


@pytest.mark.parametrize("tp", [1, 4])
def test_the_backward_re_runs_the_full_forward_but_the_qkv_product(tp):
    full = layer_graph(LLAMA, 1, tp, tp > 1, "flash", "full")
    off = layer_graph(LLAMA, 1, tp, tp > 1, "flash", OFF)
    assert [o.name for o in off.fwd] == [o.name for o in full.fwd]
    assert {o.name for o in full.bwd} - {o.name for o in off.bwd} == {"recompute.qkv"}
    assert {o.name for o in off.bwd} <= {o.name for o in full.bwd}
    # the product left out: 2 * tokens * hidden * (q + 2 kv) / tp FLOPs
    gone = 2 * 4096 * 4096 * (4096 + 2 * 1024) / tp
    assert sum(o.flops for o in full.bwd) - sum(o.flops for o in off.bwd) == pytest.approx(gone)


def test_in_fp8_the_input_is_still_cast_for_the_weight_gradient():
    """Under fp8 with separate casts the qkv input's cast is re-made (the weight gradient reads
    it); only the product and this forward's weight cast go."""
    m = replace(LLAMA, precision="fp8", fp8_casts="separate")
    full = {o.name for o in layer_graph(m, 1, 1, False, "flash", "full").bwd}
    off = {o.name for o in layer_graph(m, 1, 1, False, "flash", OFF).bwd}
    assert "recompute.qkv.fp8_cast" in off
    assert full - off == {"recompute.qkv", "recompute.qkv.weight.fp8_cast"}


@pytest.mark.parametrize("tp,mbs", [(1, 1), (4, 2)])
def test_the_bytes_sent_are_the_three_projections_outputs(tp, mbs):
    # 2 bytes x mbs x 4096 tokens x (4096 + 2 x 1024) / tp; nothing without offload
    assert offloaded_bytes(LLAMA, mbs, tp, OFF) == 2 * mbs * 4096 * 6144 / tp
    assert offloaded_bytes(LLAMA, mbs, tp, "full") == 0.0
    # on the device the layer keeps what a full recompute keeps: its input
    assert (activation_bytes_per_layer(LLAMA, mbs, tp, tp > 1, OFF, "flash")
            == activation_bytes_per_layer(LLAMA, mbs, tp, tp > 1, "full", "flash") == 2 * mbs * 4096 * 4096 / tp)


def test_the_host_traffic_shown_under_ample_compute_is_the_overlap_slowdown_of_each_copy():
    """At 64 GB/s a direction one layer's 50 MB copy (mbs 1) takes 0.79 ms, under forward and
    backward phases of several ms: each copy shows only overlap_slowdown of itself, twice a layer
    and micro-batch."""
    chip = load_chip("h100-sxm")
    eff = Efficiency(link_fraction=0.8, overlap_slowdown=0.1)
    plan = Plan(mbs=1, recompute="full", offload="qkv_proj")
    r = evaluate(LLAMA, chip, 8, 64, plan, eff)
    m = 64 // 8
    move = 2 * 4096 * 6144 / (64e9 * 0.8)
    assert r.communication_by_group_s["host_offload_s"] == pytest.approx(m * LLAMA.layers * 2 * 0.1 * move)
    base = evaluate(LLAMA, chip, 8, 64, replace(plan, offload=""), eff)
    assert r.memory_per_device_bytes == base.memory_per_device_bytes
    # the step loses the qkv product's re-run and gains the shown copies (HFU counts what runs)
    assert r.hfu < base.hfu and r.mfu == pytest.approx(base.mfu * base.step_time_s / r.step_time_s)


def test_a_slow_host_link_shows_what_the_compute_cannot_cover():
    chip = replace(load_chip("h100-sxm"), host_bandwidth_bytes_per_s=1e6)     # 1 MB/s: nothing hides it
    eff = Efficiency(link_fraction=1.0, overlap_slowdown=0.0)
    r = evaluate(LLAMA, chip, 8, 8, Plan(recompute="full", offload="qkv_proj"), eff)
    move = 2 * 4096 * 6144 / 1e6
    shown = r.communication_by_group_s["host_offload_s"]
    assert 2 * LLAMA.layers * move * 0.99 < shown < 2 * LLAMA.layers * move   # less each phase's compute


def test_the_energy_counts_each_offloaded_byte_over_a_link_and_through_hbm():
    chip = load_chip("tpuv5e")
    plan = Plan(tp=4, mbs=2, recompute="full", zero=3)
    on, off = (step_activity(LLAMA, chip, 64, 64, replace(plan, offload=o)) for o in ("qkv_proj", ""))
    m = 64 // 16 // 2                                              # micro-batches a step
    host = 2 * offloaded_bytes(LLAMA, 2, 4, OFF) * LLAMA.layers * m  # sent and fetched back
    assert on.link_bytes - off.link_bytes == pytest.approx(host)
    assert on.hbm_bytes - off.hbm_bytes < host      # plus the copy, less the qkv product's re-run


@pytest.mark.parametrize("plan,words", [
    ("recompute=selective,offload=qkv_proj", "needs recompute=full in every stage, got selective"),
    ("pp=2,recompute=full,stage_recompute=full:none,offload=qkv_proj", "got full:none"),
])
def test_offload_without_a_full_recompute_is_refused(plan, words):
    with pytest.raises(ConfigError, match=words):
        evaluate(LLAMA, load_chip("tpuv5e"), 8, 8, parse_plan(plan), IDEAL)


def test_offload_is_refused_for_mla_and_on_a_chip_without_a_host_link():
    with pytest.raises(ConfigError, match="multi-head latent attention"):
        evaluate(load_model("deepseek-v3"), load_chip("h100-sxm"), 2048, 2048,
                 parse_plan("pp=16,ep=64,recompute=full,offload=qkv_proj"), IDEAL)
    with pytest.raises(ConfigError, match="host_bandwidth_bytes_per_s"):
        evaluate(LLAMA, load_chip("tpuv4"), 8, 8, parse_plan("recompute=full,offload=qkv_proj"), IDEAL)


def test_cli_refusal_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "phaze.cli", "evaluate", "--workload", "llama3-8b", "--arch", "tpuv4",
                           "--devices", "8", "--global-batch", "8", "--plan", "recompute=full,offload=qkv_proj"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "offload" in proc.stderr and "TPUv4" in proc.stderr


def test_host_memory_holds_each_layer_of_each_micro_batch_in_flight():
    """Llama-like, tp 4, mbs 2, pp 2 over 4 layers (2 a stage), 8 micro-batches: under 1F1B stage 0
    holds 2 micro-batches' offloaded q, k, v of its 2 layers, stage 1 one's; each layer's a micro-batch
    is 2 B x 2 x 4096 tokens x (4096 + 2 x 1024) / 4 wide."""
    from phaze.step import host_offload_bytes
    plan = parse_plan("tp=4,pp=2,mbs=2,recompute=full,offload=qkv_proj")
    per_layer = 2 * 2 * 4096 * 6144 / 4
    assert host_offload_bytes(LLAMA, 16, 16, plan) == per_layer * 2 * 2   # dp 2, m = 16 / (2 x 2) = 4
    assert host_offload_bytes(LLAMA, 16, 16, parse_plan("tp=4,pp=2,mbs=2,recompute=full")) == 0.0
    chip = load_chip("h100-sxm")
    assert chip.host_memory_bytes == 256 * 2 ** 30            # a DGX H100's 2 TB over 8 GPUs
    assert evaluate(LLAMA, chip, 16, 16, plan, IDEAL).fits
    small = replace(chip, host_memory_bytes=per_layer * 4 - 1)   # one byte short
    assert not evaluate(LLAMA, small, 16, 16, plan, IDEAL).fits
    assert evaluate(LLAMA, replace(chip, host_memory_bytes=0.0), 16, 16, plan, IDEAL).fits   # not given: not checked


def test_cli_says_when_the_host_memory_is_short(tmp_path):
    text = (Path(__file__).resolve().parent.parent / "arch_configs" / "h100-sxm.yaml").read_text()
    chip = tmp_path / "small-host.yaml"
    chip.write_text(re.sub(r"^host_memory_bytes:.*$", "host_memory_bytes: 1.0e+9   # assumption: a test's",
                           text, flags=re.M))
    proc = subprocess.run([sys.executable, "-m", "phaze.cli", "evaluate", "--workload", "llama3-8b", "--arch",
                           str(chip), "--devices", "8", "--global-batch", "8", "--plan",
                           "tp=1,mbs=1,recompute=full,offload=qkv_proj,zero=3"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "host's memory" in proc.stderr
    assert "host_memory_bytes" in proc.stderr
