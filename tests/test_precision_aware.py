"""Megatron-Core's precision-aware optimizer (``optimizer=adam-megatron-pa``, and ``-bf16`` with bf16
moments): the state's bytes, the optimizer kernel's and the bf16 moments' per-tensor passes by
hand, the step's fp32 copies of the moments in the peak, the energy model's bytes, the refusals
and the figures docs/frameworks.md quotes."""
import json
from dataclasses import replace

import numpy as np
import pytest
from test_space import placement_options
from test_validate import ROOT, one_line_error, phaze_cli

from phaze.area import _step_activity
from phaze.configio import ConfigError
from phaze.cost import IDEAL, kernel_overhead
from phaze.graph import bf16_moment_passes, optimizer_op
from phaze.memory import optimizer_step_bytes_per_param
from phaze.placement import PlacementOptions, place
from phaze.plan import Plan, parse_plan
from phaze.plan_check import check_plan
from phaze.stage import shard_ranks, stage_costs, tensor_pass_time
from phaze.step import evaluate

PA, PA16 = "adam-megatron-pa", "adam-megatron-pa-bf16"


def test_parse_label_and_refusals(llama, dgx):
    plan = parse_plan(f"tp=2,zero=1,optimizer={PA16}")
    assert plan.optimizer == PA16
    check_plan(llama, 8, 8, plan)
    # only as the distributed optimizer: zero 0 is refused with data parallelism, and is the same
    # plan as zero 1 without it
    with pytest.raises(ConfigError, match="zero.*distributed optimizer.*allowed: zero 1-3"):
        check_plan(llama, 8, 8, replace(plan, zero=0))
    check_plan(llama, 2, 2, replace(plan, zero=0))
    with pytest.raises(ConfigError, match="optimizer.*fp16.*allowed: optimizer=adam-megatron"):
        check_plan(replace(llama, precision="fp16"), 8, 8, plan)
    fp8 = replace(llama, precision="fp8", fp8_casts="fused")
    check_plan(fp8, 8, 8, plan)     # 16-bit weights cast for the GEMMs: the bf16 path
    with pytest.raises(ConfigError, match="optimizer.*fp8 Adam kernel.*not modelled"):
        check_plan(fp8, 8, 8, replace(plan, fp8_params=True))


def test_optimizer_kernel_bytes_by_hand():
    """Norm (read g) and one kernel: read g + 2 (bf16 weight) + 2 (remainder) + 4 + 4 (m, v), write all
    but the gradient; the fp32-master path reads 24 and writes 14 (norm, Adam, the copy back)."""
    for g in (2.0, 4.0):
        for name in (PA, PA16):
            op = optimizer_op(1.0, name, "bf16", g)
            assert (op.bytes_read, op.bytes_written) == (2 * g + 12, 12)
    old = optimizer_op(1.0, "adam-megatron", "bf16")
    assert (old.bytes_read, old.bytes_written) == (24, 14)
    passes = bf16_moment_passes()   # per moment: .float() 2 -> 4, then .bfloat16() 4 -> 2 and copy_ 2 -> 2
    assert (passes.launches, passes.read, passes.write) == (2 * 3, 2 * (2 + 4 + 2), 2 * (4 + 2 + 2))


def test_megatron_copies_16_bit_main_gradients_to_fp32(llama, dgx):
    """Megatron's own optimizer copies 16-bit main gradients to fp32 (``.float()``: read 2, write 4)
    before the norm and Adam, for every parameter at once: 44 bytes a parameter, and 4 more bytes
    held through the step; fp32 main gradients need no copy, fp16's was counted already."""
    assert (optimizer_op(1.0, "adam-megatron", "bf16", 2.0).bytes_read,
            optimizer_op(1.0, "adam-megatron", "bf16", 2.0).bytes_written) == (24 + 2, 14 + 4)
    assert optimizer_op(1.0, "adam-megatron", "bf16", 4.0).bytes == 38
    assert optimizer_op(1.0, "adam-megatron", "fp16", 2.0).bytes == optimizer_op(1.0, "adam-megatron", "fp16").bytes
    assert [optimizer_step_bytes_per_param(*a) for a in (("adam-megatron", "bf16", 2), ("adam-megatron", "bf16", 4),
                                                         ("adam-megatron", "fp16", 4), ("adam", "bf16", 2))] \
        == [4.0, 0.0, 4.0, 0.0]
    # one device, full recompute: the copies (4 bytes a parameter) outweigh what the backward holds
    costs = stage_costs(llama, dgx, 1, 1, Plan(optimizer="adam-megatron", recompute="full"), IDEAL)
    mem = costs.memory(0, 32, "full")
    assert mem.activation_bytes + mem.transient_bytes == pytest.approx(4 * costs.params(0, 32), rel=1e-12)
    fp32 = stage_costs(llama, dgx, 1, 1, Plan(optimizer="adam-megatron", recompute="full", reduce_fp32=True),
                       IDEAL).memory(0, 32, "full")
    assert fp32.activation_bytes + fp32.transient_bytes < mem.activation_bytes + mem.transient_bytes


def test_state_bytes_by_hand(llama, dgx):
    """tp 1, dp 8, one stage: the 16-bit remainders save 2 bytes of each sharded parameter's 12, bf16
    moments 4 more; nothing else on the device changes (the activations, the 16-bit weights and
    gradients)."""
    mem = {o: stage_costs(llama, dgx, 8, 8, Plan(zero=1, optimizer=o), IDEAL).memory(0, 32, "none")
           for o in ("adam-megatron", PA, PA16)}
    params = stage_costs(llama, dgx, 8, 8, Plan(zero=1), IDEAL).params(0, 32)
    base = mem["adam-megatron"].weights_and_optimizer_bytes
    assert base - mem[PA].weights_and_optimizer_bytes == pytest.approx(2 * params / 8, rel=1e-12)
    assert base - mem[PA16].weights_and_optimizer_bytes == pytest.approx(6 * params / 8, rel=1e-12)
    assert len({(m.activation_bytes, m.transient_bytes) for m in mem.values()}) == 1


def test_step_tail_by_hand(llama, dgx):
    """The stage's optimizer step (tp 8, dp 8, 16-bit gradients): the kernel's bytes over each
    device's shard, the zeroed gradient buffer, one launch; bf16 moments add their six kernels per
    tensor of the shard."""
    chip, eff = dgx, IDEAL
    hbm = chip.hbm_bandwidth_bytes_per_s * eff.hbm_fraction
    for o in (PA, PA16):
        costs = stage_costs(llama, chip, 64, 64, Plan(tp=8, zero=1, optimizer=o), eff)
        params = costs.params(0, 32)
        group = shard_ranks(costs.plan, 64, chip)
        updated = params / group
        assert costs.updated_params(0, 32) == pytest.approx(updated, rel=1e-12)
        expect = (2 * 2 + 12 + 12) * updated / hbm + 2 * params / hbm + kernel_overhead(chip, eff)
        if o == PA16:
            expect += tensor_pass_time(bf16_moment_passes(), costs.tensors(0, 32) / group, updated, chip, eff)
        assert costs.tail(0, 32, "none")[1] == pytest.approx(expect, rel=1e-9)


def test_the_step_copies_of_bf16_moments_can_set_the_peak(llama, dgx):
    """One device (dp 1, zero 0 is the distributed optimizer's plan there), full recompute: the fp32
    copies of both moments, 8 bytes a parameter, outweigh what the backward holds, so the peak is
    the state plus them; with a pipeline each stage's table agrees with memory()."""
    costs = stage_costs(llama, dgx, 1, 1, Plan(optimizer=PA16, recompute="full"), IDEAL)
    mem = costs.memory(0, 32, "full")
    assert mem.activation_bytes + mem.transient_bytes == pytest.approx(8 * costs.params(0, 32), rel=1e-12)
    fp32 = stage_costs(llama, dgx, 1, 1, Plan(optimizer=PA, recompute="full"), IDEAL).memory(0, 32, "full")
    assert fp32.transient_bytes < mem.transient_bytes
    for plan in (Plan(pp=2, zero=1, optimizer=PA16), Plan(pp=2, optimizer=PA16)):   # dp 8, and dp 1
        costs = stage_costs(llama, dgx, 16 if plan.zero else 2, 16, plan, IDEAL)
        ns = np.array([10.0, 16.0, 22.0])
        for r in ("none", "full"):
            table = costs.memory_table(r, ns)
            for i in range(2):
                for j, k in enumerate(ns):
                    assert table[i, j] == costs.memory(i, int(k), r).total_bytes


def test_energy_counts_the_kernel_and_the_passes_by_hand(llama, dgx):
    """phaze.area's activity: per updated parameter the kernel moves 16 bytes less than Megatron's
    passes with 16-bit main gradients (28 against 44, their copy to fp32 included), and bf16
    moments add their copies' 32."""
    base = Plan(tp=8, zero=1)
    act = {o: _step_activity(llama, dgx, 64, 8, replace(base, optimizer=o)) for o in ("adam-megatron", PA, PA16)}
    updated = stage_costs(llama, dgx, 64, 8, base, IDEAL).params(0, 32) / 8
    assert act["adam-megatron"].hbm_bytes - act[PA].hbm_bytes == pytest.approx(16 * updated, rel=1e-9)
    assert act[PA16].hbm_bytes - act[PA].hbm_bytes == pytest.approx(32 * updated, rel=1e-9)


def test_place_and_sweep(llama, dgx, tmp_path):
    opts = PlacementOptions(tp=(2,), pp=(1,), mbs=(1,), zero=(0, 1), recompute=("full",), optimizer=PA)
    got = place(llama, dgx, 16, 16, opts)
    assert got.best.plan.zero == 1 and got.best.plan.optimizer == PA      # zero 0 is refused at dp 8
    with pytest.raises(ConfigError, match="optimizer.*fp16"):
        place(replace(llama, precision="fp16"), dgx, 16, 16, opts)
    assert placement_options(tmp_path, {"optimizer": PA16}).optimizer == PA16
    with pytest.raises(ConfigError, match="optimizer.*one of.*adam-megatron-pa"):
        placement_options(tmp_path, {"optimizer": "adam-te"})


def test_cli_refuses_it_for_fp16():
    one_line_error(phaze_cli(ROOT, "evaluate", "--workload", "gpt-neox-20b", "--arch", "a100-80gb", "--devices",
                             "8", "--global-batch", "8", "--plan", f"tp=8,zero=1,optimizer={PA}"), "optimizer", "fp16")


def test_the_figures_frameworks_md_quotes():
    """Llama 3 70B in bf16 on 64 H100s under the `nemo` preset with each of Megatron's optimizers."""
    got = {}
    for o in ("adam-megatron", PA, PA16):
        out = phaze_cli(ROOT, "evaluate", "--workload", "llama3-70b", "--arch", "h100-sxm", "--devices", "64",
                        "--global-batch", "128", "--plan", f"tp=4,pp=4,vp=5,mbs=1,optimizer={o}", "--framework",
                        "nemo", "--system", "dgx-h100-superpod", "--allow-oom", "--format", "json")
        assert out.returncode == 0, out.stderr
        d = json.loads(out.stdout)
        got[o] = (d["memory_per_device_bytes"] / 2 ** 30, d["step_time_s"])
    (m0, s0), (m1, s1), (m2, s2) = got.values()
    assert m0 > m1 > m2 and s1 < s0 < s2
    doc = " ".join((ROOT / "docs" / "frameworks.md").read_text().split())
    assert (f"needs {m0:.1f} GiB a device with Megatron's own passes, {m1:.1f} GiB with `adam-megatron-pa` and "
            f"{m2:.1f} GiB with `adam-megatron-pa-bf16`; its step takes {s0:.3f}, {s1:.3f} and {s2:.3f} s") in doc


def test_a_step_of_the_remainders_is_faster_and_smaller(llama, dgx):
    """On a whole step (tp 8, dp 8, 16-bit main gradients): the remainders' kernel moves 28 bytes an
    updated parameter against Megatron's 44 (its copy of the gradients to fp32 included), and the
    state holds 2 bytes less of each sharded parameter."""
    a = evaluate(llama, dgx, 64, 64, Plan(tp=8, zero=1, optimizer="adam-megatron"))
    b = evaluate(llama, dgx, 64, 64, Plan(tp=8, zero=1, optimizer=PA))
    updated = stage_costs(llama, dgx, 64, 64, Plan(tp=8, zero=1), IDEAL).params(0, 32) / 8
    assert a.breakdown_s["optimizer_s"] - b.breakdown_s["optimizer_s"] == pytest.approx(
        (44 - 28) * updated / dgx.hbm_bandwidth_bytes_per_s, rel=1e-9)
    assert a.memory_per_device_bytes - b.memory_per_device_bytes == pytest.approx(2 * updated, rel=1e-9)
    assert b.step_time_s < a.step_time_s
