"""Framework presets, execution models, pod slices over a data-centre network, the frozen
held-out split."""
from __future__ import annotations

import csv
import dataclasses
import json

import numpy as np
import pytest
import yaml
from test_validate import ROOT, ok_cli, one_line_error, phaze_cli, synthetic, synthetic_case, write_csv

from phaze import validate as v
from phaze.arch import load_chip
from phaze.calibrate import calibrated_efficiency, load_default_params, params_for, params_held_out, shipped_params_path
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.cost import IDEAL, Efficiency, collective_time, gemm_time, op_time, vector_time
from phaze.framework import FRAMEWORKS, framework, model_with, options_with, plan_with, resolve_framework
from phaze.graph import Op, megatron_softmax_fused
from phaze.placement import PlacementOptions, layouts, place
from phaze.plan import Plan, parse_plan
from phaze.runs import DEFAULT_VOCAB, Case, Skipped, default_runs_paths, load_items, row_to_case
from phaze.stage import deepspeed_bf16, main_grad_bytes, reduced_grad_bytes, stage_costs
from phaze.step import evaluate, layout_of
from phaze.system import apply_system, load_system

EFF = Efficiency(tensor_fraction=0.8, hbm_fraction=0.8, kernel_overhead_s=5e-6, host_overhead_s=20e-6)


@pytest.mark.parametrize("text, name", [
    ("nemo", "nemo"), ("NeMo 24.07 (Megatron-Core, Transformer Engine)", "nemo-2024"), ("NeMo 25.07", "nemo"),
    ("NeMo 2.1.0", "nemo-2024"), ("nemo_toolkit==2.0.0", "nemo-2024"), ("NeMo, TE 2.1", "nemo"),
    ("NeMo 2.10", "nemo"), ("NVIDIA NeMo (2025)", "nemo"), ("nemo-2024", "nemo-2024"),
    ("Megatron-Core MoE (Megatron-MoE-ModelZoo)", "megatron-core"), ("Megatron-LM (2021)", "megatron-lm"),
    ("Megatron-LM core_r0.9 (2024)", "megatron-core"), ("Megatron-DeepSpeed", "megatron-deepspeed"),
    ("torchtitan (PyTorch FSDP2/TP/PP/CP)", "torchtitan"), ("MaxText (JAX/XLA)", "maxtext"),
    ("llm-foundry / Composer (PyTorch FSDP)", "llm-foundry"), ("LLM-Foundry", "llm-foundry"),
    ("NeMo-Megatron launcher (2022-23)", "nemo-megatron"), ("NeMo (2022)", "nemo-megatron"),
    ("NeMo 2 (2024)", "nemo-2024"), ("nemo_megatron", "nemo-megatron"), ("GPT-NeoX", "megatron-deepspeed"),
    ("EleutherAI gpt-neox library", "megatron-deepspeed"), ("Megatron-Bridge", "megatron-bridge"),
    ("NeMo Megatron-Bridge 0.3.1", "megatron-bridge"), ("Megatron Bridge (NeMo 25.11)", "megatron-bridge"),
    ("megatron_bridge", "megatron-bridge"), ("Megatron-LM core_r0.8.0", "megatron-core")])
def test_framework_names_and_spellings(text, name):
    assert resolve_framework(text).name == name


def test_megatron_bridge_is_megatron_core_with_its_recipes_defaults():
    """Megatron-Bridge 0.3.1's recipes run Megatron-Core as the megatron-core preset does but for
    three shared defaults: TE's cross entropy, an fp8 run's weights in fp8 and the shared experts
    beside the all-to-alls; gradients reduced in fp32, dropless experts, tensor-parallel overlap
    off and batched pipeline sends stay Megatron-Core's (its source names each)."""
    mb, core = FRAMEWORKS["megatron-bridge"], FRAMEWORKS["megatron-core"]
    assert dataclasses.replace(core, name="megatron-bridge", loss="te", fp8_params=True, shared_overlap=True,
                               source=mb.source) == mb
    assert mb.reduces_fp32("bf16") and mb.moe_capacity == 0.0 and not mb.tp_overlap and mb.pipe_p2p == "batched"
    for said in ("grad_reduce_in_fp32", "cross_entropy_fusion_impl", "fp8_param_gather", "moe_shared_expert_overlap",
                 "CommOverlapConfig", "apply_rope_fusion", "moe_router_fusion"):
        assert said in mb.source, said
    plan, changes = plan_with(mb, Plan(tp=2), precision="fp8")
    assert plan.loss == "te" and plan.fp8_params and changes["loss"] == "te"
    assert not plan_with(mb, Plan(tp=2), precision="bf16")[0].fp8_params
    # a row naming it gets it; an explicit column wins
    assert synthetic_case(framework="NeMo Megatron-Bridge 0.3.1").plan.loss == "te"
    assert synthetic_case(framework="Megatron-Bridge", cross_entropy="fused").plan.loss == "fused"


def test_unknown_framework_is_none_or_one_clear_error():
    assert resolve_framework("") is None and resolve_framework("jax-toolbox-x") is None
    with pytest.raises(ConfigError) as e:
        framework("paxml-x", "--framework")
    assert "--framework" in str(e.value) and "megatron-core" in str(e.value)


def test_every_preset_has_a_source_and_a_known_execution_model():
    for fw in FRAMEWORKS.values():
        assert len(fw.source) > 40 and fw.execution in ("eager", "cuda-graphs", "xla")
        assert 10 < len(fw.title) < 160 and fw.source.startswith(fw.title + ": ")   # a title, then the reasons
        assert fw.attention in ("flash", "flash2", "standard") and fw.zero in (0, 1, 2, 3)


def test_plan_with_fills_only_what_the_user_did_not_set():
    fw = FRAMEWORKS["torchtitan"]
    plan, changes = plan_with(fw, Plan(tp=2, recompute="selective", attention="flash"), {"attention"})
    assert plan.attention == "flash"             # given: kept
    assert plan.zero == 3 and plan.reduce_fp32 and plan.recompute == "op"
    assert "attention" not in changes and changes["execution"] == "eager"


def test_maxtexts_selective_policy_reruns_the_flash_kernel():
    """MaxText's remat_policy minimal saves the projections, not the attention context: its flash
    kernel runs again in the backward, which a fused kernel under Megatron-LM's rule would not."""
    from phaze.step import evaluate
    plan, _ = plan_with(FRAMEWORKS["maxtext"], Plan(tp=1, mbs=2, recompute="selective"))
    assert plan.recompute_modules == ("core_attn",) and plan.attention == "flash"
    model, chip = load_model("llama2-7b", 4096), load_chip("tpuv4").with_execution("xla")
    times = {r: evaluate(model, chip, 64, 128, dataclasses.replace(plan, recompute=r)).step_time_s
             for r in ("none", "selective")}
    megatron = evaluate(model, chip, 64, 128, dataclasses.replace(plan, recompute_modules=())).step_time_s
    assert megatron == pytest.approx(times["none"], rel=1e-9)      # a fused kernel: nothing to re-run
    assert times["selective"] > times["none"] * 1.01                # the flash forward again


@pytest.mark.parametrize("name,offered", [("megatron-lm", True), ("megatron-core", True), ("nemo", True),
                                          ("llm-foundry", True), ("megatron-deepspeed", False),
                                          ("torchtitan", False), ("maxtext", False)])
def test_block_recompute_is_searched_only_where_the_framework_has_it(name, offered):
    # a count of layers re-run whole per stage: Megatron's --recompute-method block, llm-foundry's
    # activation_checkpointing_target; not DeepSpeed's interval, torchtitan's AC modes, MaxText's
    # one remat policy over a scanned stack
    o, changes = options_with(FRAMEWORKS[name], PlacementOptions())
    assert ("block" in o.recompute) == offered
    assert "full" in o.recompute and "none" in o.recompute
    given, _ = options_with(FRAMEWORKS[name], PlacementOptions(recompute=("none", "block")), {"recompute"})
    assert given.recompute == ("none", "block")


def test_options_with_fsdp_framework_searches_zero_3_only_unless_given():
    o, _ = options_with(FRAMEWORKS["llm-foundry"], PlacementOptions())
    assert o.zero_stages == (3,) and o.attention == "flash2" and o.reduce_fp32
    o, _ = options_with(FRAMEWORKS["llm-foundry"], PlacementOptions(zero=(0, 1)), {"zero"})
    assert o.zero_stages == (0, 1)
    o, _ = options_with(FRAMEWORKS["nemo"], PlacementOptions())
    assert o.zero_stages == (0, 1) and o.tp_async and o.tp_overlap


# ---- execution models: hand derivations of the per-kernel overheads ---------------------------

def test_execution_model_sets_which_overheads_a_kernel_pays():
    a100 = load_chip("a100-80gb")
    assert a100.execution == "eager" and load_chip("tpuv4").execution == "xla"
    graphs, xla = (dataclasses.replace(a100, execution=e) for e in ("cuda-graphs", "xla"))
    bare = gemm_time(1, 4096, 4096, 4096, a100, "bf16", dataclasses.replace(EFF, kernel_overhead_s=0.0))
    assert gemm_time(1, 4096, 4096, 4096, a100, "bf16", EFF) == pytest.approx(bare + 5e-6)
    assert gemm_time(1, 4096, 4096, 4096, graphs, "bf16", EFF) == pytest.approx(bare + 5e-6)
    assert gemm_time(1, 4096, 4096, 4096, xla, "bf16", EFF) == pytest.approx(bare)
    # a tiny element-wise op: eager waits for the host (20 us), CUDA graphs pay only the launch
    op = Op(name="tiny", unit="vector", phase="fwd", elements=1024.0, flops=1024.0, bytes_read=2048.0,
            bytes_written=2048.0)
    device = vector_time(1024.0, 1024.0, 4096.0, a100, EFF)
    assert device < 20e-6
    assert op_time(op, a100, "bf16", EFF) == pytest.approx(20e-6)
    assert op_time(op, graphs, "bf16", EFF) == pytest.approx(device)
    assert op_time(op, xla, "bf16", EFF) == pytest.approx(device - 5e-6)


def test_framework_execution_reaches_the_placement():
    model = load_model("gpt2-xl", 1024)
    a100 = load_chip("a100-80gb")
    eager = place(model, a100, 8, 64, PlacementOptions(tp=(1,), mbs=(1,), pp=(1,), zero=0), EFF, top=1)
    xla = place(model, a100, 8, 64, PlacementOptions(tp=(1,), mbs=(1,), pp=(1,), zero=0, execution="xla"),
                EFF, top=1)
    assert xla.best.result.step_time_s < eager.best.result.step_time_s


# ---- validation rows: the framework column -----------------------------------------------------

def test_framework_column_expands_and_explicit_columns_win():
    c = synthetic_case(framework="Megatron-LM (2021)")
    assert c.plan.attention == "standard" and not c.plan.tp_async and c.model.dropout
    c = synthetic_case(framework="Megatron-LM (2021)", attention_kernel="flash", dropout="no", tp_async="yes")
    assert c.plan.attention == "flash" and c.plan.tp_async and not c.model.dropout
    c = synthetic_case(framework="torchtitan", recompute="selective")
    assert c.plan.zero == 3 and c.plan.reduce_fp32 and c.plan.recompute == "op" and c.plan.attention == "flash2"
    assert c.chip.execution == "eager"
    c = synthetic_case(framework="maxtext")
    assert c.chip.execution == "xla"
    c = synthetic_case(framework="maxtext", execution="eager")
    assert c.chip.execution == "eager"
    plain = synthetic_case()
    assert (plain.plan.attention, plain.plan.zero, plain.plan.tp_async, plain.chip.execution) == \
        ("flash", 0, False, "eager")


def test_interleaving_framework_scores_a_pipelined_row_without_vp_with_the_best_vp():
    # 4 layers, pp 2: Megatron accepts vp 1 and 2 (pp*vp <= layers + 2 = 6) and 3
    row = dict(tp="1", pp="2", global_batch="16", micro_batch="1")
    one_f_one_b = synthetic_case(framework="torchtitan", **row)    # its recipes' 1F1B: vp 1 as stated
    assert one_f_one_b.alternatives == () and one_f_one_b.layout_from == "row"
    c = synthetic_case(framework="megatron-core", **row)
    assert c.layout_from == "searched" and {a.vp for a in c.alternatives} == {2, 3}
    given = synthetic_case(framework="megatron-core", vp="1", **row)
    assert given.alternatives == ()
    # no known framework: its schedule is not published either, so the best vp it accepts; and
    # its optimizer sharding is not, so ZeRO 0 or 1 (the distributed optimizer), whichever is faster
    plain = synthetic_case(**row)
    assert plain.layout_from == "searched" and plain.plan.zero == 0
    assert {(a.vp, a.zero) for a in plain.alternatives} == {(1, 1), (2, 0), (2, 1), (3, 0), (3, 1)}
    assert synthetic_case(framework="jax-toolbox-x", **row).alternatives == plain.alternatives
    stated = synthetic_case(zero_stage="0", vp="1", **row)
    assert stated.alternatives == () and stated.layout_from == "row"


def test_a_row_without_recompute_recomputes_the_least_that_fits():
    # GPT-3 175B at 4K tokens on 64 A100-80GB, tp 8, pp 8, sp, mbs 1, no ZeRO: without recompute
    # the first stage's activations (8 micro-batches in flight, 12 layers, s x s scores in HBM)
    # take 117 GB; Megatron's selective recompute of the core attention needs 66.6 GB in all
    # (Korthikanti et al. 2022's memory formula), which fits
    row = dict(model="GPT-3-175B", layers="96", hidden="12288", heads="96", gpu_count="64", tp="8", pp="8",
               dp="1", global_batch="64", micro_batch="1", framework="megatron-lm", vp="1", sequence_parallel="yes",
               seq_len="4096", measured_metric="tflops_per_gpu", measured_value="150")
    c = synthetic_case(**row)
    assert (c.plan.recompute, c.layout_from) == ("selective", "searched")
    # the 2021-22 DeepSpeed stack has no selective recompute: whole layers, and Megatron's
    # TFLOP/s count (96 B s l h^2 ...) then includes the re-run forward
    d = synthetic_case(**dict(row, framework="megatron-deepspeed"))
    assert d.plan.recompute == "full"
    B, s, l, h, V = 64, 4096, 96, 12288, d.model.vocab
    assert d.measured_step_s == pytest.approx(96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
                                              / (150e12 * 64), rel=1e-9)
    stated = synthetic_case(**dict(row, recompute="none"))          # stated: kept even if it does not fit
    assert stated.plan.recompute == "none" and stated.layout_from == "row"
    small = synthetic_case(framework="megatron-deepspeed", micro_batch="1")   # the toy fits without: none
    assert small.plan.recompute == "none" and small.layout_from == "row"


def test_megatron_2021_22_stacks_leave_sequence_parallelism_off_unless_stated():
    assert synthetic_case(framework="megatron-deepspeed").plan.sp is False        # tp 2
    assert synthetic_case(framework="megatron-lm").plan.sp is False
    assert synthetic_case(framework="megatron-lm", sequence_parallel="yes").plan.sp is True
    assert synthetic_case(framework="nemo").plan.sp is True and synthetic_case().plan.sp is True
    plan, changes = plan_with(FRAMEWORKS["megatron-deepspeed"], Plan(tp=4))
    assert plan.sp is False and changes["sp"] is False
    plan, changes = plan_with(FRAMEWORKS["megatron-deepspeed"], Plan(tp=4, sp=True), {"sp"})
    assert plan.sp is True and "sp" not in changes
    o, changes = options_with(FRAMEWORKS["megatron-lm"], PlacementOptions())
    assert o.sp is False and changes["sp"] is False
    assert options_with(FRAMEWORKS["nemo"], PlacementOptions())[0].sp is True


def test_megatron_2021_22_stacks_reduce_gradients_after_the_backward_pass():
    # Megatron-LM's local DDP (2021-22) and DeepSpeed's engine all-reduce the gradients after the
    # last backward: nothing hides it. By hand, one 8-GPU NVLink ring, the fp32 gradients of every
    # parameter of a bf16 run (Megatron forces fp32 reduction for bf16): 2 passes x 7/8 x 4P bytes
    # over the link, 2 x 7 hops, one collective start-up.
    assert {n for n, f in FRAMEWORKS.items() if not f.dp_overlap} == {"megatron-lm", "megatron-deepspeed"}
    assert synthetic_case(framework="megatron-deepspeed").plan.dp_overlap is False
    assert synthetic_case(framework="nemo").plan.dp_overlap is True and synthetic_case().plan.dp_overlap is True
    assert plan_with(FRAMEWORKS["megatron-lm"], Plan())[0].dp_overlap is False
    assert plan_with(FRAMEWORKS["megatron-lm"], Plan(), {"dp_overlap"})[0].dp_overlap is True
    assert options_with(FRAMEWORKS["megatron-lm"], PlacementOptions())[0].dp_overlap is False
    from phaze.step import evaluate
    model, chip = load_model("gpt2-xl", 1024), load_chip("a100-80gb")
    plan = plan_with(FRAMEWORKS["megatron-lm"], Plan(mbs=4), precision=model.precision)[0]
    assert model.precision == "bf16" and plan.reduce_fp32
    off = evaluate(model, chip, 8, 32, plan)
    on = evaluate(model, chip, 8, 32, dataclasses.replace(plan, dp_overlap=True))
    nvlink = chip.links[0]
    by_hand = (2 * (7 / 8 * 4 * model.params / nvlink.bandwidth_bytes_per_s + 7 * nvlink.latency_s)
               + chip.collective_latency_s)
    assert off.breakdown_s["communication_exposed_s"] == pytest.approx(by_hand, rel=1e-3)
    assert on.breakdown_s["communication_exposed_s"] < 0.5 * by_hand     # most of it under the backward
    assert off.step_time_s - on.step_time_s == pytest.approx(
        off.breakdown_s["communication_exposed_s"] - on.breakdown_s["communication_exposed_s"], rel=1e-6)


def test_megatron_cross_entropy_makes_its_passes_over_the_fp32_logits():
    # Megatron-LM's vocab-parallel cross entropy on output.float(): upcast (read 2, write 4), max (4),
    # subtract (4 + 4), exp (4 + 4), sum (4), divide (4 + 4) = 22 + 16 bytes per logit, against
    # torch's upcast and log-softmax, 10 + 8; the backward passes are the same. On the ideal machine,
    # memory-bound: 20 bytes per logit more, per micro-batch, at the HBM bandwidth.
    from phaze.step import evaluate
    model, chip = load_model("gpt2-xl", 1024), load_chip("a100-80gb")
    ideal = Efficiency()
    torch = evaluate(model, chip, 1, 4, Plan(mbs=1), ideal)
    megatron = evaluate(model, chip, 1, 4, Plan(mbs=1, loss="megatron"), ideal)
    by_hand = 4 * 20 * 1024 * model.vocab / chip.hbm_bandwidth_bytes_per_s
    assert megatron.step_time_s - torch.step_time_s == pytest.approx(by_hand, rel=1e-3)
    # Megatron-Core too: its fusion is opt-in (ModelParallelConfig.cross_entropy_loss_fusion False)
    assert {n for n, f in FRAMEWORKS.items() if f.loss == "megatron"} == {"megatron-lm", "megatron-deepspeed",
                                                                          "nemo-megatron", "megatron-core"}
    assert synthetic_case(framework="megatron-lm").plan.loss == "megatron"
    assert synthetic_case(framework="Megatron-Core r0.8").plan.loss == "megatron"
    assert synthetic_case(framework="Megatron-LM (2024)").plan.loss == "megatron"
    # a row's cross_entropy column says what its run fused, over the preset's
    assert synthetic_case(framework="Megatron-Core r0.8", cross_entropy="te").plan.loss == "te"
    assert synthetic_case(framework="NeMo 25.07", cross_entropy="Megatron").plan.loss == "megatron"
    assert synthetic_case(cross_entropy="").plan.loss == "torch"      # blank, no framework: phaze's own
    bad = row_to_case(synthetic(cross_entropy="fast"))
    assert isinstance(bad, Skipped) and bad.reason == (
        "column 'cross_entropy' must be one of torch, megatron, fused, te, got 'fast'")
    assert plan_with(FRAMEWORKS["megatron-deepspeed"], Plan())[0].loss == "megatron"
    assert options_with(FRAMEWORKS["megatron-lm"], PlacementOptions())[0].loss == "megatron"
    assert "loss=megatron" in Plan(loss="megatron").label() and "loss" not in Plan().label()


def test_fused_and_transformer_engine_cross_entropy_by_hand():
    # bytes per 16-bit logit, forward + backward:
    # - torch: upcast (2 + 4) and log-softmax (4 + 4); backward read 8, write 4 + 2: 18 + 14 = 32;
    # - fused (Megatron-Core's three compiled functions): upcast with the max (2 + 4), subtract, exp
    #   and sum in place (4 + 4), divide in place (4 + 4); backward softmax read, written back and
    #   downcast (4 + 4 + 2): 22 + 10 = 32, the same bytes as torch;
    # - te (Transformer Engine's Triton kernels): two reads of the 16-bit logits, the gradient written
    #   over them (2 + 2 + 2), backward a multiply in place (2 + 2): 6 + 4 = 10, 22 fewer.
    from phaze.graph import edge_graph
    model, chip = load_model("gpt2-xl", 1024), load_chip("a100-80gb")
    ideal = Efficiency()
    step = {loss: evaluate(model, chip, 1, 4, Plan(mbs=1, loss=loss), ideal).step_time_s
            for loss in ("torch", "fused", "te")}
    by_hand = 4 * 22 * 1024 * model.vocab / chip.hbm_bandwidth_bytes_per_s
    assert step["torch"] - step["te"] == pytest.approx(by_hand, rel=1e-3)
    assert step["fused"] == pytest.approx(step["torch"], rel=1e-9)
    ops = {loss: {o.name: o for o in edge_graph(model, 2, 4, False, loss)["head"]} for loss in ("fused", "te")}
    logits = 2 * 1024 * -(-model.vocab // 4)       # two sequences, a quarter of the vocabulary a rank
    assert ops["fused"]["cross_entropy"].bytes == pytest.approx(22 * logits)
    assert ops["fused"]["cross_entropy.bwd"].bytes == pytest.approx(10 * logits)
    assert ops["te"]["cross_entropy"].bytes == pytest.approx(6 * logits)
    assert ops["te"]["cross_entropy.bwd"].bytes == pytest.approx(4 * logits)
    # tp 4: fused all-reduces each token's max, then its target logit and sum (fp32); TE gathers
    # every rank's max, sum and target logit (3 fp32 a token from each of the 4 ranks)
    fused_ar = ops["fused"]["cross_entropy.all_reduce"].collective
    te_ag = ops["te"]["cross_entropy.all_gather"].collective
    assert (fused_ar.kind, fused_ar.bytes) == ("all_reduce", 12 * 2 * 1024)
    assert (te_ag.kind, te_ag.bytes) == ("all_gather", 12 * 2 * 1024 * 4)
    assert "cross_entropy.all_reduce" not in ops["te"]
    # memory: TE keeps the 16-bit logits (its gradient over them), the others fp32 ones
    costs = {loss: stage_costs(model, chip, 4, 8, Plan(tp=4, mbs=2, loss=loss)) for loss in ("fused", "te")}
    held = 2 * 1024 * model.vocab / 4
    assert costs["fused"].logits_bytes() == pytest.approx(4 * held)
    assert costs["te"].logits_bytes() == pytest.approx(2 * held)
    # NeMo 2's pretraining fuses it: Megatron-Core's compiled functions in 2024 (nemo_toolkit 2.0,
    # 2.1), Transformer Engine's in the 2025 performance scripts
    assert FRAMEWORKS["nemo-2024"].loss == "fused" and FRAMEWORKS["nemo"].loss == "te"
    assert synthetic_case(framework="NeMo 24.07").plan.loss == "fused"
    assert synthetic_case(framework="NeMo 25.07").plan.loss == "te"
    assert parse_plan("loss=te").loss == "te"


def test_the_cross_entropy_figures_frameworks_md_quotes():
    """Llama 3 8B on 8 H100s under the `nemo` preset, its loss (te) against torch's."""
    got = []
    for extra in ("", ",loss=torch"):
        out = phaze_cli(ROOT, "evaluate", "--workload", "llama3-8b", "--arch", "h100-sxm", "--devices", "8",
                        "--global-batch", "128", "--plan", "tp=2,mbs=1,recompute=selective" + extra,
                        "--framework", "nemo", "--format", "json")
        assert out.returncode == 0, out.stderr
        d = json.loads(out.stdout)
        got.append((d["step_time_s"], d["memory_per_device_bytes"] / 2 ** 30))
    (te, te_mem), (torch, torch_mem) = got
    assert te < torch and te_mem < torch_mem
    doc = " ".join((ROOT / "docs" / "frameworks.md").read_text().split())
    assert (f"`nemo` preset's step is {te:.3f} s with `te` and {torch:.3f} s with `torch`, and it needs "
            f"{te_mem:.1f} GiB a device, not {torch_mem:.1f}") in doc


def test_megatron_optimizer_makes_its_passes_around_fused_adam():
    # Megatron's mixed-precision optimizer, one pass each, bytes per parameter: bf16 (fp32 main
    # gradients) norm 4 + FusedAdam 16 + 12 + weights back 4 + 2 = 38; fp16 adds the gradient
    # copy to fp32 (2 + 4) and the unscale with inf check (4 + 4) = 52; the fused update, 28.
    from phaze.graph import optimizer_op
    from phaze.step import evaluate
    assert optimizer_op(1.0, "adam").bytes == 28
    assert optimizer_op(1.0, "adam-megatron", "bf16").bytes == 38
    assert optimizer_op(1.0, "adam-megatron", "fp16").bytes == 52
    megatron = {"megatron-lm", "megatron-core", "nemo-2024", "nemo", "nemo-megatron", "megatron-bridge"}
    assert {n for n, f in FRAMEWORKS.items() if f.optimizer == "adam-megatron"} == megatron
    assert plan_with(FRAMEWORKS["nemo"], Plan())[0].optimizer == "adam-megatron"
    assert plan_with(FRAMEWORKS["nemo"], Plan(), {"optimizer"})[0].optimizer == "adam"
    assert options_with(FRAMEWORKS["megatron-lm"], PlacementOptions())[0].optimizer == "adam-megatron"
    assert synthetic_case(framework="megatron-deepspeed").plan.optimizer == "adam-deepspeed"
    # ZeRO 0 on one device, bf16: the step grows by 10 bytes per parameter at the HBM bandwidth,
    # and 6 more: this plan's main gradients are 16-bit (reduce_fp32 off), copied to fp32 (read 2,
    # write 4) before the norm and Adam
    model, chip = load_model("gpt2-xl", 1024), load_chip("a100-80gb")
    ideal = Efficiency()
    fused = evaluate(model, chip, 1, 4, Plan(mbs=1), ideal)
    passes = evaluate(model, chip, 1, 4, Plan(mbs=1, optimizer="adam-megatron"), ideal)
    assert model.precision == "bf16"
    # ... and the whole 16-bit main-gradient buffer zeroed each step (write 2)
    by_hand = (10 + 6 + 2) * model.params / chip.hbm_bandwidth_bytes_per_s
    assert passes.breakdown_s["optimizer_s"] - fused.breakdown_s["optimizer_s"] == pytest.approx(by_hand, rel=1e-6)
    # each of the 4 micro-batches: the hook adds the embedding tables' gradients (no GEMM computes
    # them) into the main gradients (read 2 + 2, write 2)
    hooked = 4 * 6 * model.embedding_params / chip.hbm_bandwidth_bytes_per_s
    assert passes.step_time_s - fused.step_time_s == pytest.approx(by_hand + hooked, rel=1e-6)


def test_megatron_hook_adds_each_micro_batch_without_gradient_accumulation_fusion():
    # Megatron-LM's local DDP of 2021 (model/distributed.py) and NeMo 1.x's
    # MainParamsOptimizerWrapper register a backward hook that adds each micro-batch's 16-bit
    # gradient into the fp32 main gradient, tensor by tensor (read 2 + 4, write 4); with
    # gradient-accumulation fusion the weight-gradient GEMMs add into it themselves, which leaves
    # the hook the norms, the biases and the embedding tables. 4 micro-batches, one device.
    from phaze.stage import stage_costs
    from phaze.step import evaluate
    model, chip = load_model("gpt2-xl", 1024), load_chip("a100-80gb")
    ideal = Efficiency()
    plan = Plan(mbs=1, optimizer="adam-megatron", reduce_fp32=True)
    fused = evaluate(model, chip, 1, 4, plan, ideal)
    hooked = evaluate(model, chip, 1, 4, dataclasses.replace(plan, grad_accum_fusion=False), ideal)
    by_hand = 4 * 10 * (model.params - model.embedding_params) / chip.hbm_bandwidth_bytes_per_s
    assert hooked.step_time_s - fused.step_time_s == pytest.approx(by_hand, rel=1e-6)
    # one kernel per tensor: GPT-2's 48 layers hold 12 each (qkv, projection, two FFN weights,
    # their four biases, two layer norms' weight and bias), the embedding stage 2 tables and the
    # final norm 2; under fusion the 8 vectors a layer and the tables are left to the hook
    costs = stage_costs(model, chip, 1, 4, plan, ideal)
    assert costs.tensors(0, 48) == 48 * 12 + 2 + 2
    assert costs.tensors(0, 48, hooked=True) == 48 * 8 + 2 + 2
    # Megatron-LM of 2021 and NeMo 1.x hook; Megatron-Core and NeMo 2 fuse; a key that says wins
    assert not plan_with(FRAMEWORKS["megatron-lm"], Plan())[0].grad_accum_fusion
    assert not plan_with(FRAMEWORKS["nemo-megatron"], Plan())[0].grad_accum_fusion
    assert plan_with(FRAMEWORKS["megatron-core"], Plan())[0].grad_accum_fusion
    assert plan_with(FRAMEWORKS["nemo"], Plan())[0].grad_accum_fusion
    assert plan_with(FRAMEWORKS["megatron-lm"], Plan(), {"grad_accum_fusion"})[0].grad_accum_fusion
    assert not options_with(FRAMEWORKS["megatron-lm"], PlacementOptions())[0].grad_accum_fusion
    assert parse_plan("optimizer=adam-megatron,grad_accum_fusion=no").label().endswith(",grad_accum_fusion=0")
    # a row's column: blank takes the preset's, a stated value wins
    assert not synthetic_case(framework="megatron-lm").plan.grad_accum_fusion
    assert synthetic_case(framework="megatron-lm", grad_accum_fusion="yes").plan.grad_accum_fusion
    assert not synthetic_case(framework="megatron-core", grad_accum_fusion="no").plan.grad_accum_fusion


def test_megatron_reduces_bf16_gradients_in_fp32():
    # Megatron's arguments.py forces fp32 gradient accumulation and all-reduce for bf16 (and so
    # for fp8 runs, whose parameters are bf16); fp16 runs reduce in fp16. NeMo's bf16 and fp8
    # mixed-precision plugins set grad_reduce_in_fp32, which its pretraining performance recipes
    # of 2024 leave on (nemo-2024). A stated column or key wins.
    for name in ("megatron-lm", "megatron-core", "nemo-2024"):
        fw = FRAMEWORKS[name]
        assert fw.reduces_fp32("bf16") and fw.reduces_fp32("fp8") and not fw.reduces_fp32("fp16")
        assert plan_with(fw, Plan(), precision="bf16")[0].reduce_fp32 is True
        assert plan_with(fw, Plan(), precision="fp16")[0].reduce_fp32 is False
        assert plan_with(fw, Plan(), {"reduce_fp32"}, "bf16")[0].reduce_fp32 is False
        assert options_with(fw, PlacementOptions(), precision="bf16")[0].reduce_fp32 is True
        assert options_with(fw, PlacementOptions(), precision="fp16")[0].reduce_fp32 is False
    # DeepSpeed's engine reduces in its communication_data_type, by default the run's 16-bit type
    # (engine.py): BF16_Optimizer's fp32 gradients (pipe/engine.py, get_grads_for_reduction) are
    # cast to bf16 for the wire; they stay fp32 in memory (main_grad_bytes)
    ds = FRAMEWORKS["megatron-deepspeed"]
    assert not ds.reduces_fp32("bf16") and not ds.reduces_fp32("fp16")
    assert FRAMEWORKS["torchtitan"].reduces_fp32("fp16")          # FSDP2's reduce_dtype fp32, always
    assert synthetic_case(framework="NeMo 24.07").plan.reduce_fp32 is True
    assert synthetic_case(framework="NeMo 24.07", grad_reduce_fp32="no").plan.reduce_fp32 is False
    # from 2025 (nemo_toolkit 2.2 on) its performance recipes reduce in bf16 (grad_reduce_in_fp32
    # False); a stated column wins
    nemo = FRAMEWORKS["nemo"]
    assert not nemo.reduces_fp32("bf16") and not nemo.reduces_fp32("fp8")
    assert synthetic_case(framework="NeMo 25.07").plan.reduce_fp32 is False
    assert synthetic_case(framework="NeMo 25.07", grad_reduce_fp32="yes").plan.reduce_fp32 is True
    assert dataclasses.replace(nemo, name="nemo-2024", bf16_reduce_fp32=True, loss="fused",
                               source="") == dataclasses.replace(
        FRAMEWORKS["nemo-2024"], source="")      # the two presets differ in nothing else but the loss
    assert synthetic_case(framework="megatron-lm", precision="fp16").plan.reduce_fp32 is False


def test_place_searches_only_what_the_framework_has():
    # DeepSpeed's pipeline engine has no interleaved schedule and its activation checkpointing
    # re-runs whole layers: place searches vp 1 and no selective recompute, unless told to
    o, changes = options_with(FRAMEWORKS["megatron-deepspeed"], PlacementOptions())
    assert o.vp == (1,) and o.recompute == ("none", "full") and changes["vp"] == (1,)
    o, _ = options_with(FRAMEWORKS["megatron-deepspeed"], PlacementOptions(vp=(1, 2), recompute=("selective",)),
                        {"vp", "recompute"})
    assert o.vp == (1, 2) and o.recompute == ("selective",)
    o, changes = options_with(FRAMEWORKS["megatron-lm"], PlacementOptions())    # it had both
    assert o.vp == () and "selective" in o.recompute and "vp" not in changes


def test_named_workload_brings_its_vocabulary_and_kv_heads():
    # a Llama-3-8B row with only the standard shape columns
    r = synthetic(model="Llama-3-8B", layers="32", hidden="4096", heads="32", ffn_hidden="14336",
                  gpu_count="8", tp="8", global_batch="8", seq_len="8192")
    c = row_to_case(r)
    assert (c.model.vocab, c.model.kv_heads, c.model.activation) == (128256, 8, "swiglu")
    c = row_to_case(dict(r, vocab="32000", kv_heads="32"))
    assert (c.model.vocab, c.model.kv_heads) == (32000, 32)
    other = row_to_case(dict(r, layers="16"))      # another shape: not that workload
    assert other.model.vocab == DEFAULT_VOCAB


# ---- pod slices over a data-centre network ------------------------------------------------------

def test_multislice_system_puts_data_parallelism_on_dcn(tmp_path):
    s = load_system("tpuv4-multislice")
    chip = load_chip("tpuv4")
    ici, dcn = s.levels(chip)
    assert ici.devices == 256 and ici.bandwidth_bytes_per_s == chip.links[0].bandwidth_bytes_per_s
    assert dcn.name == "dcn" and dcn.bandwidth_bytes_per_s == pytest.approx(25e9 / 8)
    bad = tmp_path / "s.yaml"
    bad.write_text("name: x\ndevices_per_node: 4\ninter_node:\n  bandwidth_bits_per_s_per_device: 1.0e+9\n"
                   "  nics_per_node: 2\n  latency_s: 1.0e-6\n")
    with pytest.raises(ConfigError) as e:
        load_system(str(bad))
    assert "bandwidth_bits_per_s_per_device" in str(e.value)


def test_dp_over_dcn_by_hand():
    """ZeRO-1 without overlap: reduce-scatter of the 16-bit gradients and all-gather of the
    weights over 512 chips. One 512-chip ICI torus: each moves 511/512 of P*2 bytes over ICI. Two
    256-chip slices: 255/256 of it over ICI, then half of the 1/256 share over DCN."""
    from phaze.step import evaluate
    model = load_model("llama2-7b", 2048)
    chip = load_chip("tpuv4")
    plan = Plan(zero=1, dp_overlap=False)
    one = evaluate(model, chip, 512, 512, plan)
    sliced = evaluate(model, apply_system(chip, load_system("tpuv4-multislice")), 512, 512, plan)
    data, ici, dcn = 2.0 * model.params, chip.links[0].bandwidth_bytes_per_s, 25e9 / 8
    per_collective_one = 511 / 512 * data / ici + 511 * 1e-6
    per_collective_sliced = 255 / 256 * data / ici + 255 * 1e-6 + 0.5 * (data / 256) / dcn + 10e-6
    delta = sliced.breakdown_s["communication_exposed_s"] - one.breakdown_s["communication_exposed_s"]
    assert delta == pytest.approx(2 * (per_collective_sliced - per_collective_one), rel=0.02)
    assert delta > 0.01      # the slow network costs at least 10 ms per step here


# ---- the frozen held-out split -------------------------------------------------------------------

def test_held_out_source_is_neither_fitted_nor_scored_by_default(tmp_path):
    data = json.loads(shipped_params_path().read_text())
    assert set(v.HELD_OUT_SOURCES) <= set(data["held_out_sources"])
    a = [synthetic(run_id=f"A{i}", source_id="S1_a", measured_value=str(1 + i / 10)) for i in range(2)]
    b = [synthetic(run_id=f"B{i}", source_id="S2_b", measured_value="2.0") for i in range(2)]
    runs = write_csv(tmp_path / "runs.csv", a + b)
    out = ok_cli(phaze_cli(tmp_path, "validate", "--runs", str(runs), "--no-loso", "--unseen", "",
                           "--hold-out", "S2_b", "--format", "json"))
    s = json.loads(out.stdout)
    assert s["held_out"] == {"sources": ["S2_b"], "rows": 2, "scored": False,
                             "parameters_fitted_without_them": False}
    assert s["in_sample"]["overall"]["rows"] == 2
    skipped = synthetic(run_id="B9", source_id="S2_b", recompute="offload")
    runs = write_csv(tmp_path / "runs.csv", a + b + [skipped])
    out = ok_cli(phaze_cli(tmp_path, "validate", "--runs", str(runs), "--no-loso", "--unseen", "",
                           "--hold-out", "S2_b", "--score-held-out"))
    assert out.stdout.startswith("phaze validate: 2 of 2 runs expressed, 0 skipped, 3 more held out")
    assert "NOT HELD OUT (the parameters were fitted on these rows)" in out.stdout
    assert "(2 of 3 rows expressed)" in out.stdout and "  skipped B9: recompute = offload" in out.stdout
    line = one_line_error(phaze_cli(tmp_path, "validate", "--runs", str(runs), "--hold-out", "S3_c"),
                          "--hold-out", "S3_c")
    assert "S1_a" in line


def test_calibrate_records_and_skips_the_held_out_source(tmp_path):
    a = [synthetic(run_id=f"A{i}", source_id="S1_a", measured_value=str(0.5 + i / 10)) for i in range(2)]
    b = [synthetic(run_id="B0", source_id="S2_b", measured_value="50.0")]
    runs = write_csv(tmp_path / "runs.csv", a + b)
    ok_cli(phaze_cli(tmp_path, "calibrate", "--runs", str(runs), "--out", "p.json", "--hold-out", "S2_b"))
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["held_out_sources"] == ["S2_b"] and data["rows_used"] == 2
    assert params_held_out(tmp_path / "p.json") == ("S2_b",)


def test_cli_framework_flag(tmp_path):
    one_line_error(phaze_cli(tmp_path, "evaluate", "--workload", "gpt2-xl", "--arch", "a100-80gb", "--devices", "8",
                             "--global-batch", "8", "--framework", "foo"), "--framework", "megatron-core")
    out = ok_cli(phaze_cli(tmp_path, "evaluate", "--workload", "gpt2-xl", "--arch", "a100-80gb", "--devices", "8",
                           "--global-batch", "8", "--plan", "attention=flash", "--framework", "torchtitan",
                           "--format", "json"))
    data = json.loads(out.stdout)
    assert "torchtitan" in data["assumptions"]["framework"] and "zero=3" in data["assumptions"]["framework"]
    assert "attention=" not in data["assumptions"]["framework"]     # the user's attention kept
    # the line ends with what the preset stands for; its whole source rides beside it in JSON
    titan = FRAMEWORKS["torchtitan"]
    assert data["assumptions"]["framework"].endswith(" (pytorch/torchtitan defaults)")
    assert data["assumptions"]["framework_source"] == titan.source and titan.source not in out.stdout.replace(
        data["assumptions"]["framework_source"], "", 1)
    text = ok_cli(phaze_cli(tmp_path, "evaluate", "--workload", "gpt2-xl", "--arch", "a100-80gb", "--devices", "8",
                            "--global-batch", "8", "--framework", "torchtitan")).stdout
    line = next(t for t in text.splitlines() if t.strip().startswith("framework "))
    assert line.endswith("(pytorch/torchtitan defaults)") and "framework source" not in text


def test_rows_sharing_a_chip_and_system_keep_their_own_execution_model():
    # the (chip, system) cache is shared by every row of a file: one row's framework must not
    # leak its execution model into the next row's chip
    chips: dict = {}
    first = row_to_case(synthetic(framework="maxtext", system_config="dgx-a100-superpod"), chips)
    second = row_to_case(synthetic(framework="torchtitan", system_config="dgx-a100-superpod"), chips)
    assert (first.chip.execution, second.chip.execution) == ("xla", "eager")
    assert second.chip.links[-1].name == "infiniband"


def test_llama3_at_16k_gpus_from_an_unknown_stack_is_scored_as_a_tuned_run():
    """Llama 3 405B on 16,384 H100s (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4:
    tp 8, pp 16, 16 sequences per data-parallel rank; 41 % BF16 MFU at 8K tokens, 38 % at 131K
    with cp 16). The paper does not state vp, the micro-batch, the ZeRO stage or the recompute,
    and Meta's stack is not a preset: scored as a tuned run (the best vp and micro-batch, ZeRO 0
    or 1, the least recompute that fits), the step is within 10 % of the published one (+0.4 %
    and +9.4 % with the shipped calibration). With vp 1, as before, it is 67 % and 86 % too
    slow: the pipeline bubble (16 micro-batches over 16 stages) is half the step."""
    common = dict(model="Llama-3.1-405B", layers="", hidden="", heads="", gpu="H100-SXM5-80GB",
                  gpu_count="16384", tp="8", pp="16", precision="bf16", measured_metric="mfu",
                  framework="Meta internal (Llama 3)")
    for extra, mfu, window in ((dict(seq_len="8192", global_batch="2048", dp="128"), 0.41, 0.03),
                               (dict(seq_len="131072", global_batch="128", dp="8", cp="16"), 0.38, 0.10)):
        c = synthetic_case(**common, **extra, measured_value=str(mfu))
        assert c.layout_from == "searched" and c.plan.recompute == "none"
        eff = calibrated_efficiency(c.chip)
        error = v.predict_case(c, eff) / c.measured_step_s - 1
        assert abs(error) < window, (extra, error)
        one_f_one_b = synthetic_case(**common, **extra, vp="1", measured_value=str(mfu))
        assert v.predict_case(one_f_one_b, eff) / c.measured_step_s - 1 > 0.3


def test_a_row_without_its_layout_is_laid_out_as_phaze_would_tune_it():
    """tp and pp not published: those of the best Megatron-style plan the placement finds for
    the row with the shipped calibration (the oracle: place() called directly)."""
    c = synthetic_case(tp="", pp="", micro_batch="1", zero_stage="0", recompute="none")
    found = place(c.model, c.chip, 8, 16, PlacementOptions(mbs=(1,), recompute=("none",), zero=0),
                  calibrated_efficiency(c.chip), top=1)
    assert (c.plan.tp, c.plan.pp, c.plan.cp) == (found.baseline.plan.tp, found.baseline.plan.pp, 1)
    assert c.layout_from == "searched"
    # with dp stated, the missing one follows from it: nothing searched
    d = synthetic_case(tp="4", pp="", dp="2", micro_batch="1", zero_stage="0", recompute="none")
    assert (d.plan.tp, d.plan.pp, d.layout_from) == (4, 1, "row")
    # both missing with dp stated: only layouts with that dp
    e = synthetic_case(tp="", pp="", dp="2", micro_batch="1", zero_stage="0", recompute="none")
    assert e.plan.tp * e.plan.pp == 4 and e.plan.dp(8) == 2
    assert "no tp, pp and cp give the stated dp" in row_to_case(synthetic(tp="", pp="", dp="3")).reason
    # without the global batch the step's size is unknown: skipped with the reason
    assert "global_batch not published" in row_to_case(synthetic(global_batch="")).reason


def test_the_predictions_name_the_plan_a_searched_row_was_scored_with(tmp_path):
    row = synthetic(tp="1", pp="2", global_batch="16", micro_batch="1")      # vp and ZeRO searched
    c = row_to_case(row)
    eff = calibrated_efficiency(c.chip)
    results = {p: v.evaluate(c.model, c.chip, c.devices, c.global_batch, p, eff) for p in (c.plan, *c.alternatives)}
    fastest = min((p for p, r in results.items() if r.fits), key=lambda p: results[p].step_time_s)
    assert v.scored_plan(c, eff) == (fastest, results[fastest].step_time_s)
    path = write_csv(tmp_path / "runs.csv", [row], list(row))
    ok_cli(phaze_cli(tmp_path, "validate", "--runs", str(path), "--no-loso", "--unseen", "", "--hold-out", "none",
                     "--out", "p.csv"))
    with (tmp_path / "p.csv").open() as fh:
        out = next(csv.DictReader(fh))
    assert out["layout_from"] == "searched" and out["plan"] == fastest.label()


def _said(model):
    """``model`` saying its rotary kernels, key/value reads and softmax, which presets set otherwise."""
    return dataclasses.replace(model, rotary_kernels="fused", kv_repeat="grouped", softmax_kernel="fused")


def test_rotary_kernels_and_kv_copies_follow_the_framework_unless_the_model_says():
    # torchtitan's complex product and repeat_kv; Megatron's unfused rotate-half for the 2021-22
    # stacks; Transformer Engine's fused RoPE (Megatron-Core, NeMo), XLA's and flash-attn's fusion
    llama = load_model("llama3-8b", 2048)     # rotary, 32 query heads, 8 key/value heads
    assert (llama.rotary_kernels, llama.kv_repeat) == ("", "")
    separate = {"megatron-lm", "megatron-deepspeed", "nemo-megatron"}
    for name, fw in FRAMEWORKS.items():
        model, changes = model_with(fw, llama)
        want = "complex" if name == "torchtitan" else "separate" if name in separate else "fused"
        assert model.rotary_kernels == changes["rotary_kernels"] == want, name
        assert model.kv_repeat == changes["kv_repeat"] == ("copied" if name == "torchtitan" else "grouped")
    # nothing to say: learned positions and multi-head attention (GPT-2), or the model's own
    gpt = load_model("gpt2-xl", 1024)
    assert {"rotary_kernels", "kv_repeat"}.isdisjoint(model_with(FRAMEWORKS["torchtitan"], gpt)[1])
    own = dataclasses.replace(llama, rotary_kernels="fused", kv_repeat="grouped")
    assert {"rotary_kernels", "kv_repeat"}.isdisjoint(model_with(FRAMEWORKS["torchtitan"], own)[1])
    # a row: a gated model is rotary (its rule), so the preset acts; a GPT row's learned positions not
    row = synthetic_case(framework="torchtitan", activation="swiglu", kv_heads="4").model
    assert (row.rotary_kernels, row.kv_repeat) == ("complex", "copied")
    assert synthetic_case(framework="torchtitan").model.rotary_kernels == ""
    # the row's own columns win over the preset; a value outside the list is the row's error
    own = synthetic_case(framework="torchtitan", activation="swiglu", kv_heads="4", rotary_kernels="fused",
                         kv_repeat="grouped").model
    assert (own.rotary_kernels, own.kv_repeat) == ("fused", "grouped")
    bad = row_to_case(synthetic(framework="torchtitan", activation="swiglu", rotary_kernels="triton"))
    assert isinstance(bad, Skipped) and "rotary_kernels" in bad.reason and "complex" in bad.reason


def test_softmax_kernel_follows_the_framework_unless_the_model_says():
    # Megatron's FusedScaleMaskSoftmax for the 2021-22 Megatron presets (their standard attention);
    # the others keep phaze's one fused kernel
    gpt = load_model("gpt2-xl", 1024)
    assert gpt.softmax_kernel == ""
    megatron = {"megatron-lm", "megatron-deepspeed", "nemo-megatron"}
    for name, fw in FRAMEWORKS.items():
        model, changes = model_with(fw, gpt)
        assert model.softmax_kernel == changes.get("softmax_kernel", "") == ("megatron" if name in megatron else "")
    own = dataclasses.replace(gpt, softmax_kernel="fused")
    assert "softmax_kernel" not in model_with(FRAMEWORKS["megatron-deepspeed"], own)[1]
    # a row: the preset's, or its own column; a value outside the list is the row's error
    assert synthetic_case(framework="Megatron-DeepSpeed").model.softmax_kernel == "megatron"
    assert synthetic_case(framework="Megatron-DeepSpeed", softmax_kernel="fused").model.softmax_kernel == "fused"
    assert synthetic_case(framework="NeMo 24.07").model.softmax_kernel == ""
    bad = row_to_case(synthetic(framework="Megatron-DeepSpeed", softmax_kernel="apex"))
    assert isinstance(bad, Skipped) and "softmax_kernel" in bad.reason and "megatron" in bad.reason
    # a small GPT off the kernel's shapes (25 heads, micro-batch 1) is slower than on them per
    # sequence: PyTorch's fp32 chain moves nine times the kernel's bytes forward
    xl = {"model": "gpt2-xl", "layers": "48", "hidden": "1600", "heads": "25", "seq_len": "1024",
          "gpu_count": "4", "tp": "1", "global_batch": "16", "precision": "fp16"}
    step = {}
    for b, said in ((1, ""), (1, "fused"), (4, ""), (4, "fused")):
        case = synthetic_case(framework="Megatron-DeepSpeed", micro_batch=str(b), softmax_kernel=said, **xl)
        step[b, said] = v.scored_plan(case, params_for(case.chip, None))[1]
    assert step[1, ""] > 1.05 * step[1, "fused"]
    assert step[4, ""] == step[4, "fused"]


def test_every_bundled_standard_row_runs_megatrons_softmax_kernel():
    # docs/frameworks.md says so: softmax_kernel leaves the calibration as it was
    cases = [c for c in load_items(default_runs_paths()) if isinstance(c, Case)]
    standard = [c for c in cases if c.plan.attention == "standard"]
    assert len(standard) >= 30 and {c.model.softmax_kernel for c in standard} == {"megatron"}
    assert all(megatron_softmax_fused(c.model, c.plan.mbs, c.plan.tp) for c in standard)

def test_fp8_casts_follow_the_framework_unless_the_model_says():
    # Transformer Engine's LayerNorm-fused modules for the Megatron-based presets; torchao's
    # Float8Linear (torchtitan) and te.Linear without fused norms (llm-foundry) cast separately,
    # te.Linear keeping the fp8 copy of its input
    fp8 = dataclasses.replace(load_model("llama3-8b", 2048), precision="fp8")
    assert fp8.fp8_casts == ""
    want = {"torchtitan": "separate", "llm-foundry": "te-linear"}
    for name, fw in FRAMEWORKS.items():
        model, changes = model_with(fw, fp8)
        assert model.fp8_casts == changes["fp8_casts"] == want.get(name, "fused")
    bf16 = _said(load_model("llama3-8b", 2048))
    assert model_with(FRAMEWORKS["torchtitan"], bf16) == (bf16, {})            # 16-bit: nothing to say
    said = _said(dataclasses.replace(fp8, fp8_casts="fused"))
    assert model_with(FRAMEWORKS["torchtitan"], said) == (said, {})           # the model's own wins
    # validation rows: the framework column sets it, a mixture of experts included
    assert synthetic_case(precision="fp8", framework="torchtitan").model.fp8_casts == "separate"
    assert synthetic_case(precision="fp8", framework="NeMo 24.07").model.fp8_casts == "fused"
    moe = synthetic_case(precision="fp8", framework="torchtitan", num_experts="8", moe_top_k="2")
    assert moe.model.moe and moe.model.fp8_casts == "separate"


def test_cli_framework_sets_fp8_casts(tmp_path):
    from pathlib import Path

    import yaml
    data = dict(yaml.safe_load((Path(__file__).parents[1] / "workloads" / "gpt2-xl.yaml").read_text()),
                precision="fp8")
    (tmp_path / "fp8.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "fp8-separate.yaml").write_text(yaml.safe_dump(dict(data, fp8_casts="separate")))

    def run(workload, fw):
        out = ok_cli(phaze_cli(tmp_path, "evaluate", "--workload", str(tmp_path / workload), "--arch", "h100-sxm",
                               "--devices", "8", "--global-batch", "64", "--plan", "zero=1,mbs=8", "--framework",
                               fw, "--format", "json"))
        return json.loads(out.stdout)

    # micro-batches of 8 sequences: kernels longer than the host's issue time, so the casts show
    fused, said = run("fp8.yaml", "megatron-core"), run("fp8-separate.yaml", "megatron-core")
    assert "fp8_casts=fused" in fused["assumptions"]["framework"]
    assert "fp8_casts" not in said["assumptions"]["framework"]          # the workload's own wins
    assert said["step_time_s"] > fused["step_time_s"]                   # separate casts cost more
    assert "fp8_casts=separate" in run("fp8.yaml", "torchtitan")["assumptions"]["framework"]


def test_bias_kernels_follow_the_framework_unless_the_model_says():
    # Megatron's tensor-parallel layers and PyTorch's autograd reduce bias gradients in kernels
    # of their own; Transformer Engine (Megatron-Core, NeMo) and XLA fuse them into the GEMMs
    gpt = load_model("gpt2-xl", 1024)
    assert gpt.bias and gpt.bias_kernels == ""
    separate = {"megatron-lm", "megatron-deepspeed", "torchtitan", "llm-foundry", "nemo-megatron"}
    for name, fw in FRAMEWORKS.items():
        model, changes = model_with(fw, gpt)
        assert model.bias_kernels == changes["bias_kernels"] == ("separate" if name in separate else "fused")
    llama = _said(load_model("llama3-8b", 2048))
    assert not llama.bias and model_with(FRAMEWORKS["megatron-lm"], llama) == (llama, {})   # no biases
    said = _said(dataclasses.replace(gpt, bias_kernels="fused"))
    assert model_with(FRAMEWORKS["megatron-lm"], said) == (said, {})                          # the model's own wins
    assert synthetic_case(framework="Megatron-LM (2021)").model.bias_kernels == "separate"
    assert synthetic_case(framework="NeMo 24.07").model.bias_kernels == "fused"


def test_nemo_drops_tokens_at_capacity_one_unless_the_model_or_row_says():
    """NeMo's MoE performance recipes drop tokens at a capacity factor of 1.0, each expert's input
    padded to it (MegatronTokenDropCallback): every expert rank then runs the mean load, where a
    dropless run's busiest rank runs DROPLESS_LOAD times it. Other presets keep the model's own
    routing; a dense model, a model's own capacity and a row's routing or capacity win."""
    from phaze.graph import DROPLESS_LOAD
    from phaze.stage import expert_layout
    from phaze.step import evaluate
    qwen = load_model("qwen3-30b-a3b")
    assert qwen.capacity_factor == 0.0
    for name, fw in FRAMEWORKS.items():
        model, changes = model_with(fw, qwen)
        assert model.capacity_factor == (1.0 if name in ("nemo", "nemo-2024") else 0.0), name
        assert ("capacity_factor" in changes) == (name in ("nemo", "nemo-2024"))
    nemo = FRAMEWORKS["nemo"]
    dense = _said(load_model("llama3-8b"))
    assert model_with(nemo, dense) == (dense, {})
    own = _said(dataclasses.replace(qwen, capacity_factor=1.25))
    assert model_with(nemo, own) == (own, {})
    model = model_with(nemo, qwen)[0]
    plan = Plan(tp=1, pp=1, ep=8)
    assert expert_layout(model, plan).load == 1.0 and expert_layout(qwen, plan).load == DROPLESS_LOAD
    assert expert_layout(model, dataclasses.replace(plan, routing="dropless")).load == DROPLESS_LOAD
    chip = load_chip("h100-sxm")
    assert (evaluate(model, chip, 8, 64, plan, EFF).step_time_s
            < evaluate(qwen, chip, 8, 64, plan, EFF).step_time_s)
    # validation rows: the preset where the row says nothing, the row's columns where it does
    row = dict(model="Qwen3-30B-A3B", layers="", hidden="", heads="", gpu="H100-SXM5-80GB", gpu_count="8",
               seq_len="4096", tp="1", ep="8", micro_batch="1")
    assert synthetic_case(framework="NeMo 25.07", **row).model.capacity_factor == 1.0
    assert synthetic_case(framework="Megatron-Core", **row).model.capacity_factor == 0.0
    assert synthetic_case(framework="NeMo 25.07", moe_capacity_factor="1.25", **row).model.capacity_factor == 1.25
    c = synthetic_case(framework="NeMo 25.07", moe_routing="dropless", **row)
    assert expert_layout(c.model, c.plan).load == DROPLESS_LOAD
    # the figures docs/frameworks.md quotes, with the shipped calibration
    steps = []
    for extra in ("", ",routing=dropless"):
        out = ok_cli(phaze_cli(ROOT, "evaluate", "--workload", "qwen3-235b-a22b", "--arch", "h100-sxm",
                               "--devices", "256", "--global-batch", "2048",
                               "--plan", "tp=2,pp=8,ep=32,vp=4,mbs=1,recompute=selective" + extra,
                               "--framework", "nemo", "--system", "dgx-h100-superpod", "--format", "json")).stdout
        steps.append(json.loads(out)["step_time_s"])
    doc = (ROOT / "docs" / "frameworks.md").read_text()
    assert f"{steps[0]:.1f} s so and {steps[1]:.1f} s dropless" in doc.replace("\n", " ")


def test_full_recompute_reruns_what_the_backward_reads_on_a_compiled_program(tmp_path):
    # no preset sets it: it follows the execution model (XLA drops the recomputation nothing reads)
    llama = _said(load_model("llama3-8b", 2048))
    assert all(model_with(fw, llama) == (llama, {}) for fw in FRAMEWORKS.values())
    out = ok_cli(phaze_cli(tmp_path, "evaluate", "--workload", "llama3-8b", "--arch", "tpuv4", "--devices", "8",
                           "--global-batch", "8", "--seq-len", "2048", "--framework", "maxtext", "--plan",
                           "tp=1,pp=1,mbs=1,recompute=full", "--format", "json"))
    assert "full recompute re-runs only what the backward reads" in json.loads(out.stdout)["assumptions"]["execution"]
    whole = tmp_path / "whole.yaml"   # a workload that says whole is printed so on the same chip
    whole.write_text(yaml.safe_dump(dict(yaml.safe_load((ROOT / "workloads" / "llama3-8b.yaml").read_text()),
                                         recompute_rerun="whole")))
    out = ok_cli(phaze_cli(tmp_path, "evaluate", "--workload", str(whole), "--arch", "tpuv4", "--devices", "8",
                           "--global-batch", "8", "--seq-len", "2048", "--framework", "maxtext", "--plan",
                           "tp=1,pp=1,mbs=1,recompute=full", "--format", "json"))
    assert "re-runs only" not in json.loads(out.stdout)["assumptions"]["execution"]
    # ideal efficiency, one device: a GEMM takes its FLOPs at the peak, an element-wise op its bytes
    # at the HBM bandwidth; the needed re-run saves each layer's down projection (2 T f h FLOPs)
    # and residual add (two 2-byte reads and a write of T h elements)
    from phaze.step import evaluate
    tpu = load_chip("tpuv4")
    assert tpu.execution == "xla"
    step = {(r, ex): evaluate(dataclasses.replace(llama, recompute_rerun=r), tpu.with_execution(ex), 1, 1,
                              Plan(mbs=1, recompute="full")).step_time_s
            for r in ("", "whole", "needed") for ex in ("xla", "eager")}
    T, f, h = 2048, 14336, 4096
    saved = llama.layers * (2 * T * f * h / tpu.peak_flops("bf16") + 3 * 2 * T * h / tpu.hbm_bandwidth_bytes_per_s)
    assert step["whole", "xla"] - step["needed", "xla"] == pytest.approx(saved, rel=1e-3)
    assert step["", "xla"] == step["needed", "xla"] and step["", "eager"] == step["whole", "eager"]
    assert step["whole", "eager"] - step["needed", "eager"] > 0.99 * saved   # plus the kernels' overheads


def test_cli_framework_sets_bias_kernels(tmp_path):
    def run(fw):
        out = ok_cli(phaze_cli(tmp_path, "evaluate", "--workload", "gpt2-xl", "--arch", "a100-80gb", "--devices",
                               "8", "--global-batch", "8", "--framework", fw, "--format", "json"))
        return json.loads(out.stdout)
    lm, core = run("megatron-lm"), run("megatron-core")
    assert "bias_kernels=separate" in lm["assumptions"]["framework"]
    assert "bias_kernels=fused" in core["assumptions"]["framework"]


def test_layer_tensors_by_hand():
    # Megatron's layout: GPT, two LayerNorms (weight, bias), qkv, out, fc1, fc2 (weight, bias): 12;
    # Llama, two RMSNorms, qkv, out, the fused gate-up and down, no biases: 6; Mixtral 8x7B adds a
    # router and 8 experts of two weights each to the 4 of attention and norms: 21 (an ep-4 rank
    # holds 2 experts: 9); embedding and head: GPT-2's word and position tables, its final norm
    # (weight, bias) with the head tied; Llama's table, final norm and untied head
    gpt, llama, mixtral = load_model("gpt2-xl"), load_model("llama3-8b"), load_model("mixtral-8x7b")
    assert (gpt.layer_tensors(), gpt.embedding_tensors, gpt.head_tensors) == (12, 2, 2)
    assert (llama.layer_tensors(), llama.embedding_tensors, llama.head_tensors) == (6, 1, 2)
    assert (mixtral.layer_tensors(), mixtral.layer_tensors(2)) == (21, 9)
    # left to the gradient hook under gradient-accumulation fusion: GPT's 4 biases and 4 norm
    # vectors, Llama's 2 norms, Mixtral's 2 norms and its router (a plain matmul's weight)
    assert (gpt.layer_tensors(hooked=True), llama.layer_tensors(hooked=True)) == (8, 2)
    assert mixtral.layer_tensors(hooked=True) == mixtral.layer_tensors(2, hooked=True) == 3


def _deepspeed(precision: str, optimizer: str = "adam-deepspeed", m: int = 4, zero: int = 0):
    from phaze.step import evaluate
    model = dataclasses.replace(load_model("gpt2-xl", 1024), layers=4, precision=precision)
    eff = Efficiency(host_overhead_s=20e-6, kernel_overhead_s=5e-6)
    return model, evaluate(model, load_chip("a100-80gb"), 1, m, Plan(mbs=1, optimizer=optimizer, zero=zero), eff)


def test_deepspeed_fp16_optimizer_by_hand():
    # DeepSpeed 0.9.5's FP16_Optimizer on one A100 (eager; host 20 us, launch 5 us a kernel), a
    # 4-layer GPT-2 XL: 4 x 12 + 2 + 2 = 52 tensors. The step: each gradient's overflow check is
    # two kernels and a copy to the host, synchronised: 3 x (20 + 5) us a tensor plus 10 bytes a
    # parameter; the copies to fp32 and back, two kernels a tensor issued ahead: the longer of
    # 2 x 20 us and 2 x 5 us + 12 bytes a parameter; the flat passes 48 bytes against Megatron's
    # fp16 52 and its buffer of 16-bit main gradients zeroed (2). Each micro-batch after the
    # first: autograd adds each 16-bit gradient (the longer of 20 us and 5 us + 6 bytes a
    # parameter); Megatron's hook, fused, adds the 4 x 8 vectors' and the 2 tables' and final
    # norm's 36 tensors every micro-batch (the longer of 20 us and 5 us a tensor + 6 bytes a
    # parameter of the tables). Around the engine's gradient all-reduce (one rank, a group of
    # one, still run): the gradients flattened into a bucket (read 2, write 2) and scaled by
    # 1/dp (read 2, write 2), then copied back tensor by tensor (the longer of 20 us and 5 us a
    # tensor + 4 bytes a parameter).
    model, ds = _deepspeed("fp16")
    _, megatron = _deepspeed("fp16", "adam-megatron")
    bw = load_chip("a100-80gb").hbm_bandwidth_bytes_per_s
    n, q, e = 52, model.params, model.embedding_params
    check = n * 3 * 25e-6 + 10 * q / bw
    copies = max(n * 2 * 20e-6, n * 2 * 5e-6 + 12 * q / bw)
    reduce_passes = 8 * q / bw + max(n * 20e-6, n * 5e-6 + 4 * q / bw)
    by_hand = check + copies + (48 - 52 - 2) * q / bw + reduce_passes
    assert ds.breakdown_s["optimizer_s"] - megatron.breakdown_s["optimizer_s"] == pytest.approx(by_hand, rel=1e-9)
    hooked = 4 * max(36 * 20e-6, 36 * 5e-6 + 6 * e / bw)
    accumulate = 3 * max(n * 20e-6, n * 5e-6 + 6 * q / bw) - hooked     # 4 micro-batches, 3 add
    assert ds.breakdown_s["memory_bound_s"] - megatron.breakdown_s["memory_bound_s"] == pytest.approx(accumulate,
                                                                                                      rel=1e-9)
    assert ds.step_time_s - megatron.step_time_s == pytest.approx(by_hand + accumulate, rel=1e-9)


def test_deepspeed_bf16_optimizer_by_hand():
    # BF16_Optimizer: every micro-batch adds each gradient into its fp32 copy (two kernels a
    # tensor, 18 bytes a parameter); the step takes each fp32 gradient's norm with .item() (one
    # kernel and the copy, synchronised, 4 bytes); flat passes 38 bytes, Megatron's bf16 ones 44 (this
    # plan's main gradients are 16-bit: copied to fp32 first, 6 bytes), which zero their main
    # gradients too (2 bytes) and hook 36 tensors. Around the all-reduce, the two flat fp32
    # gradient groups share a bucket (q under 500M): flattened (read 4, write 4), cast to bf16
    # for the wire (4 + 2), scaled by 1/dp (2 + 2), cast back (2 + 4) and copied back into the
    # two groups (4 + 4): 32 bytes a parameter
    model, ds = _deepspeed("bf16")
    _, megatron = _deepspeed("bf16", "adam-megatron")
    bw = load_chip("a100-80gb").hbm_bandwidth_bytes_per_s
    n, q, e = 52, model.params, model.embedding_params
    assert q < 500e6
    assert ds.breakdown_s["optimizer_s"] - megatron.breakdown_s["optimizer_s"] == pytest.approx(
        n * 2 * 25e-6 + (4 - 2 - 6 + 32) * q / bw, rel=1e-9)
    assert ds.breakdown_s["memory_bound_s"] - megatron.breakdown_s["memory_bound_s"] == pytest.approx(
        4 * max(n * 2 * 20e-6, n * 2 * 5e-6 + 18 * q / bw) - 4 * max(36 * 20e-6, 36 * 5e-6 + 6 * e / bw), rel=1e-9)


def test_deepspeed_bf16_all_reduces_in_bf16():
    # BF16_Optimizer on 8 A100s (data parallel, ZeRO-1, nothing hidden): the whole gradients
    # all-reduced, not reduce-scattered, cast to bf16 for the wire (2 bytes a parameter; 4 with
    # reduce_fp32, DeepSpeed's communication_data_type fp32), then the updated bf16 weights
    # all-gathered; Megatron's distributed optimizer reduce-scatters its fp32 main gradients
    model = dataclasses.replace(load_model("gpt2-xl", 1024), layers=4, precision="bf16")
    chip, eff, q = load_chip("a100-80gb"), Efficiency(host_overhead_s=20e-6, kernel_overhead_s=5e-6), model.params
    gather = collective_time("all_gather", 2 * q, 8, chip, 1, eff)
    for optimizer, fp32, kind, wire in (("adam-deepspeed", False, "all_reduce", 2),
                                        ("adam-deepspeed", True, "all_reduce", 4),
                                        ("adam-megatron", True, "reduce_scatter", 4)):
        plan = Plan(mbs=1, optimizer=optimizer, zero=1, dp_overlap=False, reduce_fp32=fp32)
        exposed = evaluate(model, chip, 8, 32, plan, eff).breakdown_s["communication_exposed_s"]
        assert exposed == pytest.approx(collective_time(kind, wire * q, 8, chip, 1, eff) + gather, rel=1e-9)


def test_deepspeed_fp16_zero1_by_hand():
    # DeepSpeed 0.9.5's ZeRO optimizer at stage 1 in fp16 (stage_1_and_2.py, its defaults) on 8
    # A100s, data parallel, a 4-layer GPT-2 XL (n = 52 tensors, q parameters), against
    # FP16_Optimizer (ZeRO 0) on the same devices, nothing hidden (host 20 us, launch 5 us a kernel).
    # Reduction: each gradient copied into the bucket buffer (one kernel a tensor, 4 bytes a
    # parameter, issued ahead), the whole buffer of 500M 16-bit elements divided by dp (2 GB
    # streamed, however few gradients it holds), 16 reduces (8 partitions of each of two
    # parameter groups), costed as a reduce-scatter of 8/7 of the gradients plus 15 more
    # start-ups, then the partition's gradients copied out (n/8 tensors, 4 bytes a parameter).
    # Step, on the partition: each gradient's overflow check (two kernels and a copy to the host:
    # 3 x 25 us a tensor, 10 bytes) and norm in fp64 (3 x 25 us, 18 bytes), both synchronised,
    # the overflow flag and the norm each all-reduced (a scalar), the flat passes 52 bytes an
    # updated parameter (q/8). FP16_Optimizer checks and copies every tensor and makes its flat
    # passes (48 bytes) on all q, around an all-reduce of the 16-bit gradients.
    model = dataclasses.replace(load_model("gpt2-xl", 1024), layers=4, precision="fp16")
    chip, eff = load_chip("a100-80gb"), Efficiency(host_overhead_s=20e-6, kernel_overhead_s=5e-6)
    bw, lat, n, q = chip.hbm_bandwidth_bytes_per_s, chip.collective_latency_s, 52, model.params
    run = {z: evaluate(model, chip, 8, 32, Plan(mbs=1, optimizer="adam-deepspeed", zero=z, dp_overlap=False), eff)
           for z in (0, 1)}

    def ahead(tensors, nbytes):
        return max(tensors * 20e-6, tensors * 5e-6 + nbytes / bw)
    zero1 = (ahead(n, 4 * q) + 2e9 / bw + ahead(n / 8, 4 * q / 8) + n / 8 * 3 * 25e-6 + 10 * q / 8 / bw
             + n / 8 * 3 * 25e-6 + 18 * q / 8 / bw + 52 * q / 8 / bw)
    zero0 = n * 3 * 25e-6 + 10 * q / bw + ahead(2 * n, 12 * q) + 8 * q / bw + ahead(n, 4 * q) + 48 * q / bw
    assert run[1].breakdown_s["optimizer_s"] - run[0].breakdown_s["optimizer_s"] == pytest.approx(zero1 - zero0,
                                                                                                  rel=1e-9)
    reduces = (collective_time("reduce_scatter", 2 * q * 8 / 7, 8, chip, 1, eff) + 15 * lat
               + 2 * collective_time("all_reduce", 4, 8, chip, 1, eff))
    assert run[1].breakdown_s["communication_exposed_s"] == pytest.approx(
        reduces + collective_time("all_gather", 2 * q, 8, chip, 1, eff), rel=1e-9)
    assert run[0].breakdown_s["communication_exposed_s"] == pytest.approx(
        collective_time("all_reduce", 2 * q, 8, chip, 1, eff), rel=1e-9)
    # the bucket buffer (1 GB) is held through the backward of the stage that computes the loss;
    # both wrappers' flat fp32 gradients (4 bytes an updated parameter) after the activations go
    for z in (0, 1):
        plan = Plan(mbs=1, optimizer="adam-deepspeed", zero=z, dp_overlap=False)
        costs = stage_costs(model, chip, 8, 32, layout_of(plan), eff)
        mem = costs.memory(0, 4, "none")
        bare = costs.logits_bytes()
        assert mem.transient_bytes == pytest.approx(max(bare + (1e9 if z else 0.0),
                                                        4 * q / (8 if z else 1) + (1e9 if z else 0.0)
                                                        - mem.activation_bytes), rel=1e-12)
        assert costs.memory_table("none", np.array([4]))[0, 0] == pytest.approx(mem.total_bytes, rel=1e-12)


def test_deepspeed_zero2_reduces_every_micro_batch_by_hand():
    # DeepSpeed 0.9.5's ZeRO optimizer at stage 2 (stage_1_and_2.py; the engine without pipeline)
    # on 8 A100s, data parallel, 4 micro-batches a device, the 4-layer GPT-2 XL of the ZeRO-1 test:
    # the hooks copy every gradient into the bucket buffer and the epilogue reduces it after
    # every backward, not once a step: each micro-batch pays the copies in (n kernels, 4 bytes a
    # parameter), the whole buffer divided (2 GB), the 16 reduces (exposed: no overlap_comm) and
    # the partition copied out (n/8 kernels, 4 bytes an eighth of the parameters); from the second
    # micro-batch on the partition is added into the first's (n/8 kernels, 6 bytes), where at
    # stage 1 autograd adds every 16-bit gradient (n kernels, 6 bytes). The step keeps the
    # partition's check and norm, its scalar all-reduces (fp16: the flag and the norm; bf16: the
    # flag) and the weights' all-gather. bf16 at stage 2 runs this optimizer too, on bf16
    # gradients, without the norm and the unscale (44 flat bytes, not 52).
    chip, eff = load_chip("a100-80gb"), Efficiency(host_overhead_s=20e-6, kernel_overhead_s=5e-6)
    bw, lat, n = chip.hbm_bandwidth_bytes_per_s, chip.collective_latency_s, 52

    def ahead(tensors, nbytes):
        return max(tensors * 20e-6, tensors * 5e-6 + nbytes / bw)
    run = {}
    for precision, z in (("fp16", 1), ("fp16", 2), ("bf16", 2)):
        model = dataclasses.replace(load_model("gpt2-xl", 1024), layers=4, precision=precision)
        plan = Plan(mbs=1, optimizer="adam-deepspeed", zero=z, dp_overlap=False)
        run[precision, z] = evaluate(model, chip, 8, 32, plan, eff).breakdown_s
    q = model.params
    per_mb = ahead(n, 4 * q) + 2e9 / bw + ahead(n / 8, 4 * q / 8)
    assert (run["fp16", 2]["memory_bound_s"] - run["fp16", 1]["memory_bound_s"]) == pytest.approx(
        4 * per_mb + 3 * ahead(n / 8, 6 * q / 8) - 3 * ahead(n, 6 * q), rel=1e-9)
    assert run["fp16", 2]["optimizer_s"] - run["fp16", 1]["optimizer_s"] == pytest.approx(-per_mb, rel=1e-9)
    reduces = collective_time("reduce_scatter", 2 * q * 8 / 7, 8, chip, 1, eff) + 15 * lat
    scalar = collective_time("all_reduce", 4, 8, chip, 1, eff)
    gather = collective_time("all_gather", 2 * q, 8, chip, 1, eff)
    assert run["fp16", 2]["communication_exposed_s"] == pytest.approx(4 * reduces + 2 * scalar + gather, rel=1e-9)
    assert run["bf16", 2]["communication_exposed_s"] == pytest.approx(4 * reduces + scalar + gather, rel=1e-9)
    norm = n / 8 * 3 * 25e-6 + 18 * q / 8 / bw
    assert run["bf16", 2]["optimizer_s"] - run["fp16", 2]["optimizer_s"] == pytest.approx(-norm - 8 * q / 8 / bw,
                                                                                          rel=1e-9)
    # its gradients are the model's 16 bits, whatever the wire; fp32 on the wire casts the whole
    # bucket buffer there and back (12 bytes an element) every micro-batch, and doubles the reduces
    fp16 = dataclasses.replace(model, precision="fp16")
    wide = Plan(mbs=1, optimizer="adam-deepspeed", zero=2, dp_overlap=False, reduce_fp32=True)
    assert (main_grad_bytes(fp16, wide), reduced_grad_bytes(fp16, wide)) == (2, 4)
    fp32 = evaluate(fp16, chip, 8, 32, wide, eff).breakdown_s
    assert fp32["memory_bound_s"] - run["fp16", 2]["memory_bound_s"] == pytest.approx(4 * 12 * 5e8 / bw, rel=1e-9)
    wide_reduces = collective_time("reduce_scatter", 4 * q * 8 / 7, 8, chip, 1, eff) + 15 * lat
    assert fp32["communication_exposed_s"] == pytest.approx(4 * wide_reduces + 2 * scalar + gather, rel=1e-9)


def test_deepspeed_zero3_by_hand():
    # DeepSpeed 0.9.5's ZeRO-3 optimizer (stage3.py, its defaults: contiguous gradients,
    # reduce_scatter, overlap_comm on at stage 3) on 8 A100s, data parallel, 4 micro-batches a
    # device, the 4-layer GPT-2 XL of the ZeRO-1 test (n = 52 tensors, q parameters, one bucket
    # of 500M elements), against torch's Adam under the same per-layer gathers (zero 3).
    # Each micro-batch: every gradient copied into the bucket buffer (n kernels, 4 bytes a
    # parameter), the bucket flattened by reduce_scatter_coalesced and divided by dp (8 bytes a
    # parameter, streamed), the partition copied into the 16-bit partition buffer on the first
    # micro-batch (n/8 kernels, 4 bytes an eighth of the parameters) and added into it on the
    # others (6 bytes); the last bucket, here all of them, reduce-scattered after the backward.
    # The step, on the partition (u = q/8): every gradient's norm in fp64 (2 kernels a tensor,
    # 18 bytes, not synchronised), 56 flat bytes against torch Adam's 28, and the overflow flag
    # and the norm all-reduced (a scalar each), in fp16 and bf16 alike.
    chip = load_chip("a100-80gb")
    bw, n = chip.hbm_bandwidth_bytes_per_s, 52
    eff = Efficiency(host_overhead_s=20e-6, kernel_overhead_s=5e-6)

    def ahead(tensors, nbytes):
        return max(tensors * 20e-6, tensors * 5e-6 + nbytes / bw)
    for precision in ("fp16", "bf16"):
        model = dataclasses.replace(load_model("gpt2-xl", 1024), layers=4, precision=precision)
        q = model.params
        assert q < 5e8
        u = q / 8
        run = {opt: evaluate(model, chip, 8, 256, Plan(mbs=8, optimizer=opt, zero=3), eff).breakdown_s
               for opt in ("adam-deepspeed", "adam")}
        ds, torch = run["adam-deepspeed"], run["adam"]
        accumulate = 4 * (8 * q / bw + ahead(n, 4 * q)) + ahead(n / 8, 4 * u) + 3 * ahead(n / 8, 6 * u)
        assert ds["memory_bound_s"] - torch["memory_bound_s"] == pytest.approx(accumulate, rel=1e-9)
        step = (56 - 28) * u / bw + max(n / 8 * 2 * 20e-6, n / 8 * 2 * 5e-6 + 18 * u / bw)
        assert ds["optimizer_s"] - torch["optimizer_s"] == pytest.approx(step, rel=1e-9)
        # every per-layer gather and reduce-scatter hides under these 8-sequence micro-batches
        last = collective_time("reduce_scatter", 2 * q, 8, chip, 1, eff)
        scalars = 2 * collective_time("all_reduce", 4, 8, chip, 1, eff)
        assert torch["communication_exposed_s"] == 0.0
        assert ds["communication_exposed_s"] == pytest.approx(4 * last + scalars, rel=1e-9)
    # an fp32 wire (communication_data_type fp32, reduce_fp32): each gradient cast to it, the
    # bucket's two passes in fp32 (16 bytes), the partition cast back (6 bytes) before its copy or add
    wide = evaluate(model, chip, 8, 256, Plan(mbs=8, optimizer="adam-deepspeed", zero=3, reduce_fp32=True),
                    eff).breakdown_s
    extra = 4 * (8 * q / bw + ahead(n, 6 * q) + ahead(n / 8, 6 * u))
    assert wide["memory_bound_s"] - ds["memory_bound_s"] == pytest.approx(extra, rel=1e-9)
    assert wide["communication_exposed_s"] == pytest.approx(
        4 * collective_time("reduce_scatter", 4 * q, 8, chip, 1, eff) + scalars, rel=1e-9)
    # the weights are gathered module by module, one all-gather a weight tensor (GPT's qkv, out,
    # fc1 and fc2; its norms and biases stay whole): with nothing to hide them (no per-kernel
    # overheads, 16-token sequences) each layer's gather forward and again backward pays three
    # more start-ups than FSDP's one collective a layer
    tiny = dataclasses.replace(model, seq_len=16)
    assert tiny.layer_tensors() - tiny.layer_tensors(hooked=True) == 4
    bare = Efficiency()
    run = {opt: evaluate(tiny, chip, 8, 32, Plan(mbs=1, optimizer=opt, zero=3), bare).breakdown_s
           for opt in ("adam-deepspeed", "adam")}
    one, two = (collective_time("all_gather", b, 8, chip, 1, bare) for b in (1e6, 2e6))
    starts = 3 * (2 * one - two)   # a collective's start-up and per-step latencies: its time at no bytes
    last = collective_time("reduce_scatter", 2 * q, 8, chip, 1, bare)
    scalars = 2 * collective_time("all_reduce", 4, 8, chip, 1, bare)
    assert run["adam-deepspeed"]["communication_exposed_s"] - run["adam"]["communication_exposed_s"] == \
        pytest.approx(4 * 4 * 2 * starts + 4 * last + scalars, rel=1e-9)
    # memory: 16-bit weights and gradient partitions and the fp32 weights and moments, all over
    # the 8 ranks (16 bytes / 8); two buckets (the buffer and reduce_scatter_coalesced's flat
    # copy, 2 GB) through the backward; the step's flat fp32 gradients (4 bytes an updated
    # parameter) once the activations are freed
    plan = Plan(mbs=1, optimizer="adam-deepspeed", zero=3)
    costs = stage_costs(model, chip, 8, 32, layout_of(plan), eff)
    assert costs.state_bytes_per_param == pytest.approx(16 / 8)
    mem = costs.memory(0, 4, "none")
    bare_transient = costs.logits_bytes() + costs.gathered_layer_bytes()
    assert mem.transient_bytes == pytest.approx(max(bare_transient + 2e9, 4 * u + 2e9 + costs.gathered_layer_bytes()
                                                    + costs.logits_bytes() - mem.activation_bytes), rel=1e-12)
    assert costs.memory_table("none", np.array([4]))[0, 0] == pytest.approx(mem.total_bytes, rel=1e-12)


def test_megatron_deepspeed_preset_runs_deepspeeds_wrappers():
    # fp16: FP16_Optimizer, no ZeRO, 16-bit gradients reduced; bf16: BF16_Optimizer shards the
    # fp32 state over data parallelism (ZeRO-1) and the pipeline engine reduces fp32 gradients
    ds = FRAMEWORKS["megatron-deepspeed"]
    fp16, bf16 = plan_with(ds, Plan(), precision="fp16")[0], plan_with(ds, Plan(), precision="bf16")[0]
    assert (fp16.optimizer, fp16.zero, fp16.reduce_fp32) == ("adam-deepspeed", 0, False)
    assert (bf16.optimizer, bf16.zero, bf16.reduce_fp32) == ("adam-deepspeed", 1, False)
    # BF16_Optimizer keeps fp32 gradients, all-reduced in bf16 (communication_data_type's
    # default); a stated reduce_fp32 puts fp32 on the wire; fp16 keeps and reduces 16-bit ones
    bf16_model = dataclasses.replace(load_model("gpt2-xl", 1024), precision="bf16")
    fp16_model = dataclasses.replace(bf16_model, precision="fp16")
    assert (main_grad_bytes(bf16_model, bf16), reduced_grad_bytes(bf16_model, bf16)) == (4, 2)
    assert reduced_grad_bytes(bf16_model, dataclasses.replace(bf16, reduce_fp32=True)) == 4
    assert (main_grad_bytes(fp16_model, fp16), reduced_grad_bytes(fp16_model, fp16)) == (2, 2)
    assert deepspeed_bf16(bf16_model, bf16) and not deepspeed_bf16(fp16_model, fp16)
    assert not deepspeed_bf16(bf16_model, dataclasses.replace(bf16, optimizer="adam-megatron"))
    assert plan_with(ds, Plan(zero=0), {"zero"}, "bf16")[0].zero == 0                  # a stated stage wins
    assert options_with(ds, PlacementOptions(), precision="bf16")[0].zero == (1,)
    assert options_with(ds, PlacementOptions(), precision="fp16")[0].zero == PlacementOptions().zero
    # its pipeline engine refuses ZeRO-2 and 3: refused with the field and what is allowed; so is
    # a mixture of experts at either (the experts' own reduction is not modelled)
    for z in (2, 3):
        with pytest.raises(ConfigError) as e:
            evaluate(fp16_model, load_chip("a100-80gb"), 8, 32, Plan(pp=2, zero=z, optimizer="adam-deepspeed"))
        assert "pipeline engine" in str(e.value) and "allowed: zero 0-1, or pp 1" in str(e.value)
        with pytest.raises(ConfigError) as e:
            evaluate(load_model("mixtral-8x7b"), load_chip("a100-80gb"), 64, 64,
                     Plan(tp=8, zero=z, optimizer="adam-deepspeed", recompute="full"))
        assert "mixture of experts" in str(e.value) and "allowed: zero 0-1" in str(e.value)
    # its ZeRO-1 and 2 shard over every data-parallel rank: no hybrid sharding
    for shard in ("8", "node"):
        with pytest.raises(ConfigError) as e:
            evaluate(fp16_model, load_chip("a100-80gb"), 16, 32,
                     parse_plan(f"zero=1,dp_shard={shard},optimizer=adam-deepspeed"))
        assert "dp_shard" in str(e.value) and "allowed: all, or a multiple of 16" in str(e.value)
    assert evaluate(fp16_model, load_chip("a100-80gb"), 16, 32,
                    parse_plan("zero=1,dp_shard=16,optimizer=adam-deepspeed")).step_time_s > 0


def _deepspeed_pipeline_period(stages: int, f: float, b: float, c: float, micro_batches: int = 40) -> float:
    """Seconds one more micro-batch adds to DeepSpeed's pipeline: its TrainSchedule (DeepSpeed 0.9.5
    pipe/schedule.py: 2 (m + p - 1) steps, a stage forward on the steps of its own parity, the
    commands of a step in the order the schedule yields them) run with blocking sends and receives
    (p2p.py), each transfer taking ``c`` once both ends reach it, written out here apart from phaze."""
    def program(s, m):
        cmds, prev = [], -1
        for step in range(2 * (m + stages - 1)):
            forward = (step % 2) == (s % 2)
            if forward:
                mb = (step - (step % 2)) // 2 - s // 2
            elif step % 2 == 0:
                mb = step // 2 - stages + (s + 1) // 2
            else:
                mb = (step - 1) // 2 - stages + 1 + s // 2
            valid, prev_valid = 0 <= mb < m, 0 <= prev < m
            if forward:
                cmds += [("send_grad", s - 1)] if prev_valid and s > 0 else []
                cmds += [("recv_act", s - 1)] if valid and s > 0 else []
            else:
                cmds += [("recv_grad", s + 1)] if valid and s < stages - 1 else []
                cmds += [("send_act", s + 1)] if prev_valid and s < stages - 1 else []
            cmds += [("fwd" if forward else "bwd", None)] if valid else []
            prev = mb
        return cmds

    pair = {"send_grad": "recv_grad", "recv_grad": "send_grad", "send_act": "recv_act", "recv_act": "send_act"}

    def run(m):
        progs = [program(s, m) for s in range(stages)]
        pc, t = [0] * stages, [0.0] * stages
        while any(pc[s] < len(progs[s]) for s in range(stages)):
            moved = False
            for s in range(stages):
                while pc[s] < len(progs[s]):
                    op, peer = progs[s][pc[s]]
                    if op in ("fwd", "bwd"):
                        t[s] += f if op == "fwd" else b
                        pc[s] += 1
                    elif pc[peer] < len(progs[peer]) and progs[peer][pc[peer]] == (pair[op], s):
                        t[s] = t[peer] = max(t[s], t[peer]) + c
                        pc[s] += 1
                        pc[peer] += 1
                    else:
                        break
                    moved = True
            assert moved, "deadlock"
        return max(t)
    return run(micro_batches + 1) - run(micro_batches)


def test_deepspeed_pipeline_waits_through_four_transfers_a_micro_batch():
    # the schedule, simulated: a micro-batch costs its forward, backward and four transfers once a
    # stage has neighbours on both sides, two with two stages; without transfers, Megatron's 1F1B
    for stages in (2, 3, 4, 8):
        k = 4 if stages > 2 else 2
        for c in (0.0, 0.05, 0.3):
            assert _deepspeed_pipeline_period(stages, 1.0, 3.0, c) == pytest.approx(4.0 + k * c)
    # phaze's stage costs: a blocking pipeline (the megatron-deepspeed preset's) sends twice what a
    # batched one does between two stages and as much at the ends (tp 1: no metadata); with tp a
    # split tensor's metadata goes first, a small send of its own
    m, chip = load_model("gpt3-175b"), load_chip("a100-80gb")
    from phaze.stage import stage_costs
    for pp in (2, 4):
        batched = stage_costs(m, chip, pp * 8, 64, Plan(pp=pp), IDEAL).send_s
        blocking = stage_costs(m, chip, pp * 8, 64, Plan(pp=pp, pipe_p2p="blocking"), IDEAL).send_s
        assert batched > 0 and blocking == pytest.approx(batched * (2 if pp > 2 else 1))
        tp_batched = stage_costs(m, chip, pp * 8, 64, Plan(tp=8, pp=pp, sp=False), IDEAL).send_s
        tp_blocking = stage_costs(m, chip, pp * 8, 64, Plan(tp=8, pp=pp, sp=False, pipe_p2p="blocking"),
                                  IDEAL).send_s
        meta = collective_time("send", 8 * (7 + 8), 2, chip, 8, IDEAL)
        assert tp_blocking == pytest.approx((2 if pp > 2 else 1) * (tp_batched + 2 * meta))
    assert stage_costs(m, chip, 8, 64, Plan(pipe_p2p="blocking"), IDEAL).send_s == 0.0   # no pipeline
    # the preset sets it, a plan's own wins, the plan text and its label carry it
    ds = FRAMEWORKS["megatron-deepspeed"]
    assert plan_with(ds, Plan(pp=4), precision="fp16")[0].pipe_p2p == "blocking"
    assert plan_with(ds, Plan(pp=4, pipe_p2p="batched"), {"pipe_p2p"}, "fp16")[0].pipe_p2p == "batched"
    assert plan_with(FRAMEWORKS["megatron-lm"], Plan(pp=4))[0].pipe_p2p == "batched"
    assert options_with(ds, PlacementOptions(), precision="fp16")[0].pipe_p2p == "blocking"
    assert synthetic_case(framework="Megatron-DeepSpeed", pp="2", tp="1").plan.pipe_p2p == "blocking"
    assert parse_plan("pp=4,pipe_p2p=blocking").label().endswith(",pipe_p2p=blocking")
    assert "pipe_p2p" not in parse_plan("pipe_p2p=blocking").label()         # nothing to send
    with pytest.raises(ConfigError) as e:
        parse_plan("pp=4,pipe_p2p=async")
    assert "pipe_p2p" in str(e.value) and "batched, blocking" in str(e.value)
    placed = place(m, chip, 64, 64, PlacementOptions(tp=(8,), pp=(4,), mbs=(1,), pipe_p2p="blocking"))
    assert placed.best.plan.pipe_p2p == "blocking" and placed.best.plan.pp == 4
    # the figures docs/frameworks.md quotes: BLOOM-176B's and MT-NLG 530B's plans under the preset
    a100 = apply_system(load_chip("a100-80gb"), load_system("dgx-a100-superpod")).with_execution(ds.execution)
    eff = params_for(a100, load_default_params())
    doc = " ".join((ROOT / "docs" / "frameworks.md").read_text().split())
    for name, devices, batch, layout in (("bloom-176b", 384, 2048, Plan(tp=4, pp=12, mbs=2, recompute="full")),
                                         ("megatron-gpt-530b", 2240, 1920, Plan(tp=8, pp=35, mbs=1, recompute="full"))):
        model = model_with(ds, load_model(name))[0]
        plan = plan_with(ds, layout, {"recompute"}, model.precision)[0]
        assert plan.pipe_p2p == "blocking"
        batched = dataclasses.replace(plan, pipe_p2p="batched")
        slower = (v.evaluate(model, a100, devices, batch, plan, eff).step_time_s
                  / v.evaluate(model, a100, devices, batch, batched, eff).step_time_s)
        assert slower > 1 and f"{100 * (slower - 1):.1f} %" in doc, (name, slower)


def test_overlapped_pipeline_sends_hide_under_the_next_chunk():
    # Megatron-Core's overlap_p2p_comm, interleaved schedule only: each transfer runs under the chunk
    # computed next, at least a chunk's forward; hidden, it costs overlap_slowdown of itself. A
    # chunk of GPT-3 175B (96 layers, pp 4, vp 2: 12 layers) outlasts a transfer by far.
    from phaze.stage import mode_costs, mode_layout, stage_costs
    m, chip = load_model("gpt3-175b"), load_chip("a100-80gb")
    eff = Efficiency(overlap_slowdown=0.25)
    plan = Plan(tp=8, pp=4, vp=2)
    batched = stage_costs(m, chip, 64, 64, plan, eff).send_s
    over = stage_costs(m, chip, 64, 64, dataclasses.replace(plan, pipe_p2p="overlapped"), eff).send_s
    window = 12 * mode_costs(m, chip, 64, mode_layout(plan), eff, "none").fwd.total
    one = batched / (2 * 2)                       # two transfers a chunk, two chunks a micro-batch
    assert one < window and over == pytest.approx(0.25 * batched)
    # a transfer longer than its window shows what does not fit: 1-layer chunks, the stages a node
    # apart on a link run at a twentieth of its rate
    from phaze.system import with_devices_per_node
    small = dataclasses.replace(load_model("gpt2-xl", 1024), layers=8)
    slow = apply_system(chip, with_devices_per_node(load_system("cluster-100g"), 1))
    eff = Efficiency(overlap_slowdown=0.25, link_fraction=0.05)
    plan = Plan(pp=4, vp=2, mbs=8)
    one = stage_costs(small, slow, 4, 64, plan, eff).send_s / 4
    window = mode_costs(small, slow, 4, mode_layout(plan), eff, "none").fwd.total
    over = stage_costs(small, slow, 4, 64, dataclasses.replace(plan, pipe_p2p="overlapped"), eff).send_s
    assert one > window and over == pytest.approx(4 * (one - window + 0.25 * window))
    # without interleaving Megatron-Core cannot overlap: the sends are batched
    assert stage_costs(m, chip, 64, 64, Plan(tp=8, pp=4, pipe_p2p="overlapped"), eff).send_s == pytest.approx(
        stage_costs(m, chip, 64, 64, Plan(tp=8, pp=4), eff).send_s)
    # NeMo 2's comm-overlap callback sets it (interleaved runs only); Megatron-Core's own default does not
    assert FRAMEWORKS["nemo"].pipe_p2p == FRAMEWORKS["nemo-2024"].pipe_p2p == "overlapped"
    assert FRAMEWORKS["megatron-core"].pipe_p2p == "batched"
    assert synthetic_case(framework="NeMo 25.07", pp="2", tp="1").plan.pipe_p2p == "overlapped"
    assert parse_plan("pp=4,vp=2,pipe_p2p=overlapped").pipe_p2p == "overlapped"
    # the figure docs/frameworks.md quotes: Llama 3 70B on 64 H100s under the nemo preset
    got = []
    for extra in ("", ",pipe_p2p=batched"):
        out = phaze_cli(ROOT, "evaluate", "--workload", "llama3-70b", "--arch", "h100-sxm", "--devices", "64",
                        "--global-batch", "128", "--plan", "tp=4,pp=4,vp=5,mbs=1" + extra, "--framework", "nemo",
                        "--system", "dgx-h100-superpod", "--allow-oom", "--format", "json")
        assert out.returncode == 0, out.stderr
        got.append(json.loads(out.stdout)["step_time_s"])
    assert got[0] < got[1]
    doc = " ".join((ROOT / "docs" / "frameworks.md").read_text().split())
    assert f"the step is {got[0]:.3f} s with the sends overlapped and {got[1]:.3f} s batched" in doc


def test_megatron_core_selective_recompute_is_its_modules():
    """Megatron-Core and NeMo re-run --recompute-modules (core_attn by default, a fused kernel
    too); Megatron-LM's selective stays the core attention only where it is not fused. What a plan
    or a row says wins; torchtitan's selective stays its per-op policy."""
    for name in ("megatron-core", "nemo"):
        plan, changes = plan_with(FRAMEWORKS[name], Plan(tp=2, recompute="selective"))
        assert plan.recompute_modules == ("core_attn",) and changes["recompute_modules"] == ("core_attn",)
        assert "recompute_modules" not in plan_with(FRAMEWORKS[name], Plan(tp=2, recompute="full"))[1]
        kept, _ = plan_with(FRAMEWORKS[name], Plan(tp=2, recompute="selective", recompute_modules=("moe",)),
                            {"recompute_modules"})
        assert kept.recompute_modules == ("moe",)
        o, _ = options_with(FRAMEWORKS[name], PlacementOptions())
        assert o.recompute_modules == ("core_attn",)
    assert plan_with(FRAMEWORKS["megatron-lm"], Plan(tp=2, recompute="selective"))[0].recompute_modules == ()
    c = synthetic_case(framework="Megatron-Core", recompute="selective")
    assert (c.plan.recompute, c.plan.recompute_modules) == ("selective", ("core_attn",))
    c = synthetic_case(framework="Megatron-Core", recompute="selective", selective_recompute="moe_act+layernorm")
    assert c.plan.recompute_modules == ("moe_act", "layernorm")
    c = synthetic_case(framework="Megatron-LM (2022)", recompute="selective", selective_recompute="attention")
    assert c.plan.recompute_modules == ()
    bad = row_to_case(synthetic(framework="Megatron-Core", recompute="selective", selective_recompute="norm+act"))
    assert isinstance(bad, Skipped) and "column 'selective_recompute'" in bad.reason
    # the fused kernel's re-run costs time: the same plan with and without its modules
    chip = load_chip("h100-sxm")
    m = load_model("llama3-8b", 8192)
    legacy = v.evaluate(m, chip, 8, 64, Plan(tp=8, recompute="selective"))
    modules = v.evaluate(m, chip, 8, 64, Plan(tp=8, recompute="selective", recompute_modules=("core_attn",)))
    assert modules.step_time_s > legacy.step_time_s
    assert modules.memory_per_device_bytes < legacy.memory_per_device_bytes


def test_nemo_megatron_2022_runs_its_own_megatron_transformer():
    """NeMo 1.11 (2022): unfused attention with dropout, the qkv bias apart, Megatron's loss and
    optimizer passes, no interleaving, sequence parallelism opt-in, fp32 gradients; the 2024 NeMo
    preset differs in each of these."""
    old, new = FRAMEWORKS["nemo-megatron"], FRAMEWORKS["nemo"]
    case = synthetic_case(framework="NeMo-Megatron launcher (2022)")
    assert case.plan.attention == "standard" and case.plan.loss == "megatron" and case.plan.sp is False
    assert case.plan.optimizer == "adam-megatron" and case.plan.reduce_fp32 and case.plan.zero == 0
    assert case.model.dropout and synthetic_case(framework="nemo").model.dropout is False
    assert (old.interleaving, new.interleaving) == (False, True) and old.bias_kernels == "separate"
    o = options_with(old, PlacementOptions())[0]
    assert o.vp == (1,) and o.attention == "standard" and o.sp is False


def test_nemo_megatron_hides_the_gradient_reduction_only_without_pipeline_and_sequence_parallelism():
    """NeMo 1.11's training_step overlaps the data-parallel all-reduce with the backward only
    without pipeline and sequence parallelism; otherwise it all-reduces after the backward.
    A row, ``--plan`` and the placement search each follow the rule; a given dp_overlap wins."""
    fw = FRAMEWORKS["nemo-megatron"]
    assert synthetic_case(framework="nemo-megatron").plan.dp_overlap is True              # tp 2, no sp
    assert synthetic_case(framework="nemo-megatron", sequence_parallel="yes").plan.dp_overlap is False
    assert synthetic_case(framework="nemo-megatron", tp="1", pp="2").plan.dp_overlap is False
    assert synthetic_case(framework="nemo", pp="2").plan.dp_overlap is True
    assert plan_with(fw, Plan(tp=2))[0].dp_overlap is True
    assert plan_with(fw, Plan(tp=2, pp=2))[0].dp_overlap is False
    assert plan_with(fw, Plan(tp=2, sp=True), {"sp"})[0].dp_overlap is False
    assert plan_with(fw, Plan(tp=2, pp=2, dp_overlap=True), {"dp_overlap"})[0].dp_overlap is True
    model = load_model("gpt2-xl", 1024)
    options = options_with(fw, PlacementOptions(tp=(1, 2), pp=(1, 2), sp=True, mbs=(1,)), {"sp"})[0]
    plans = list(layouts(model, 16, 64, options))
    assert {(p.pp > 1 or p.sp) for p in plans} == {True, False}
    assert all(p.dp_overlap is (p.pp == 1 and not p.sp) for p in plans)
    assert options_with(fw, PlacementOptions(), {"dp_overlap"})[0].dp_overlap_flat is False
