"""Tables the README and the docs quote, generated from the code (``python tests/readme_tables.py``
prints them; ``tests/test_readme.py`` fails when the pages and these disagree)."""
from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace

from phaze import cli
from phaze.api import with_system
from phaze.arch import load_chip
from phaze.calibrate import load_default_params, params_for
from phaze.catalogue import load_model
from phaze.framework import FRAMEWORKS, plan_with
from phaze.plan import Plan
from phaze.step import evaluate

GiB = 2.0 ** 30
# (label, phaze place arguments)
PLACEMENTS = [
    ("GPT-3 175B, 1024 × A100-80GB, 1536", ["--workload", "gpt3-175b", "--arch", "a100-80gb", "--devices", "1024",
                                            "--global-batch", "1536"]),
    ("Llama-3 70B, 64 × H100, 128 (8K tokens)", ["--workload", "llama3-70b", "--arch", "h100-sxm", "--devices",
                                                 "64", "--global-batch", "128"]),
    ("Llama-3.1 405B, 16,384 × H100, 2048 (8K tokens)", ["--workload", "llama3-405b", "--arch", "h100-sxm",
                                                         "--devices", "16384", "--global-batch", "2048",
                                                         "--seq-len", "8192"]),
]
RECOMPUTE = {"none": "no recompute", "selective": "selective recompute", "full": "full recompute",
             "op": "per-op recompute", "block": "block recompute"}


def _place(args: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["place", *args, "--format", "json"]) == 0
    return json.loads(out.getvalue())


def _plan_words(label: str) -> str:
    kv = dict(x.split("=", 1) for x in label.split(","))
    words = [f"tp={kv['tp']}", f"pp={kv['pp']}"]
    if "vp" in kv:
        words.append(f"vp={kv['vp']}")
    if "cp" in kv:
        words.append(f"cp={kv['cp']}")
    words.append(f"mbs={kv['mbs']}")
    if "stage_recompute" in kv:
        words.append(f"recompute by stage {kv['stage_recompute']}")
    else:
        words.append(RECOMPUTE.get(kv.get("recompute", "none"), kv.get("recompute")))
    if "recompute_layers" in kv:     # a block stage's layers re-run whole
        n = kv["recompute_layers"]
        words.append(f"{n} layer{'' if n == '1' else 's'} re-run whole")
    if kv.get("zero", "0") != "0":
        words.append(f"ZeRO-{kv['zero']}")
    if "stages" in kv:
        words.append(f"stages {kv['stages']}")
    return ", ".join(words)


def placement_table() -> str:
    rows = ["| workload, cluster, global batch | best plan | step | MFU | HFU | TFLOP/s per device (model) "
            "| power, clock | memory per device | headroom |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, args in PLACEMENTS:
        b = _place(args)["best"]
        p = b["power"]
        clock = (f"{p['clock_hz'] / 1e9:.2f} GHz (throttled)" if p["throttled"] else
                 f"{p['clock_hz'] / 1e9:.2f} GHz")
        rows.append(f"| {label} | {_plan_words(b['plan'])} | {b['step_time_s']:.2f} s | {100 * b['mfu']:.1f} % "
                    f"| {100 * b['hfu']:.1f} % | {b['model_flops_per_s_per_device'] / 1e12:.0f} "
                    f"| {p['energy']['power_w']:.0f} W, {clock} | {b['memory_per_device_bytes'] / GiB:.1f} GiB "
                    f"| {b['headroom_bytes'] / GiB:.1f} GiB |")
    return "\n".join(rows)


# the Megatron-LM 2021-22 preset's settings, each against phaze's default (docs/frameworks.md)
FRAMEWORK_MODELS = (("mpt-125m", "MPT-125M"), ("opt-350m", "OPT-350M"), ("gpt2-xl", "GPT-2 XL"))
FRAMEWORK_DEFAULTS = (("loss=megatron", {"loss": "torch"}), ("reduction after the backward", {"dp_overlap": True}),
                      ("optimizer passes and gradient hook", {"optimizer": "adam"}))


def framework_effects_table() -> str:
    """The Megatron-LM preset on 8 A100s (80 GB, data parallel, fp16), 1,024 tokens, micro-batch 8,
    global batch 64: its step, and how much longer it is than the same plan with one setting (then
    all three) at phaze's default. Shipped calibration."""
    chip = load_chip("a100-80gb")
    eff = params_for(chip, load_default_params())
    rows = ["| model | step | " + " | ".join(k for k, _ in FRAMEWORK_DEFAULTS) + " | all three |",
            "|---|---|---|---|---|---|"]
    every = {k: x for _, change in FRAMEWORK_DEFAULTS for k, x in change.items()}
    for name, label in FRAMEWORK_MODELS:
        model = replace(load_model(name, 1024), precision="fp16")
        plan = plan_with(FRAMEWORKS["megatron-lm"], Plan(mbs=8), precision="fp16")[0]
        t = evaluate(model, chip, 8, 64, plan, eff).step_time_s
        longer = [100 * (t / evaluate(model, chip, 8, 64, replace(plan, **change), eff).step_time_s - 1)
                  for change in [c for _, c in FRAMEWORK_DEFAULTS] + [every]]
        rows.append(f"| {label} | {t:.3f} s | " + " | ".join(f"+{x:.1f} %" for x in longer) + " |")
    return "\n".join(rows)


def context_parallel_table() -> str:
    """Llama-3 8B at 128K tokens on H100s (dgx-h100-superpod), nemo preset, tp 8, full recompute,
    8 sequences per step (dp 1), cp 4 to 32: each step and how much it falls from the cp before.
    Shipped calibration."""
    model = load_model("llama3-8b", 131072)
    fw = FRAMEWORKS["nemo"]
    chip = with_system(load_chip("h100-sxm"), "dgx-h100-superpod").with_execution(fw.execution)
    eff = params_for(chip, load_default_params())
    rows = ["| cp | devices | step | compute | exposed communication | falls by |", "|---|---|---|---|---|---|"]
    before = None
    for cp in (4, 8, 16, 32):
        plan = plan_with(fw, Plan(tp=8, cp=cp, mbs=1, recompute="full"), {"recompute"}, model.precision)[0]
        r = evaluate(model, chip, 8 * cp, 8, plan, eff)
        fall = f"{before / r.step_time_s:.2f}×" if before else ""
        rows.append(f"| {cp} | {8 * cp} | {r.step_time_s:.2f} s | {r.breakdown_s['compute_s']:.2f} s "
                    f"| {r.breakdown_s['communication_exposed_s']:.2f} s | {fall} |")
        before = r.step_time_s
    return "\n".join(rows)


def cp_comm_table() -> str:
    """Llama-3 8B at 128K tokens on H100s (dgx-h100-superpod), nemo preset, tp 1, full recompute, 8
    sequences per step (dp 1), cp 2 to 16 under each ``cp_comm``: the step and its exposed
    communication. Ulysses (a2a) needs cp to divide the 8 kv heads; a2a+p2p runs groups of cp / 2
    (at most 8, one node) and a ring of two or more. Shipped calibration."""
    from phaze.configio import ConfigError
    from phaze.plan import CP_COMMS

    model = load_model("llama3-8b", 131072)
    fw = FRAMEWORKS["nemo"]
    chip = with_system(load_chip("h100-sxm"), "dgx-h100-superpod").with_execution(fw.execution)
    eff = params_for(chip, load_default_params())
    rows = ["| cp | " + " | ".join(CP_COMMS) + " |", "|---" * (len(CP_COMMS) + 1) + "|"]
    for cp in (2, 4, 8, 16):
        cells = []
        for mode in CP_COMMS:
            # a2a+p2p: the largest all-to-all group inside a node that leaves a ring (cp / 2, at most 8)
            group = min(cp // 2, 8) if mode == "a2a+p2p" else 1
            plan = plan_with(fw, Plan(cp=cp, mbs=1, recompute="full", cp_comm=mode, cp_a2a=group),
                             {"recompute", "cp_comm"}, model.precision)[0]
            try:
                r = evaluate(model, chip, cp, 8, plan, eff)
            except ConfigError:
                cells.append("refused (8 kv heads)" if mode == "a2a" else "refused (no ring of groups)")
                continue
            cells.append(f"{r.step_time_s:.2f} s ({r.breakdown_s['communication_exposed_s']:.2f} s exposed)"
                         + (f", groups of {group}" if group > 1 else ""))
        rows.append(f"| {cp} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


FP8_CASES = (("llama3-8b", 1, 1, 8), ("llama3-70b", 4, 4, 64), ("llama3-405b", 8, 8, 512))


def fp8_casts_table() -> str:
    """fp8 casts on H100 at 8K tokens, micro-batch 1, for Llama-3 8B, 70B and 405B with separate
    and fused casts: the share of one layer's forward and backward operator time (non-communication
    ops, sequence parallelism on) in casts and transposes, and the NeMo preset's step time with
    global batch 512 (full recompute at pp 8), its weights 16-bit in both (fp8 weights are
    Megatron-Core's: the casts alone differ). Shipped calibration."""
    from phaze.cost import op_time
    from phaze.graph import layer_graph

    fw = FRAMEWORKS["nemo"]
    chip = load_chip("h100-sxm").with_execution(fw.execution)
    eff = params_for(chip, load_default_params())
    rows = ["| model | GPUs, tp, pp | casts | forward in casts | backward in casts | step | fused against separate |",
            "|---|---|---|---|---|---|---|"]
    for name, tp, pp, devices in FP8_CASES:
        steps = {}
        for casts in ("separate", "fused"):
            model = replace(load_model(name, 8192), precision="fp8", fp8_casts=casts)
            g = layer_graph(model, 1, tp, True, "flash", "none")
            shares = []
            for ops in (g.fwd, g.bwd):
                times = [(o.name, op_time(o, chip, model.precision, eff)) for o in ops if o.unit != "link"]
                cast = sum(t for n, t in times if "fp8_cast" in n or "fp8_transpose" in n)
                shares.append(f"{100 * cast / sum(t for _, t in times):.1f} %")
            plan = plan_with(fw, Plan(tp=tp, pp=pp, mbs=1, recompute="none" if pp < 8 else "full"),
                             {"recompute", "fp8_params"}, "fp8")[0]
            steps[casts] = evaluate(model, chip, devices, 512, plan, eff).step_time_s
            change = f"{100 * (steps['fused'] / steps['separate'] - 1):+.1f} %".replace("-", "−") \
                if casts == "fused" else ""
            rows.append(f"| {name} | {devices}, {tp}, {pp} | {casts} | {shares[0]} | {shares[1]} "
                        f"| {steps[casts]:.2f} s | {change} |")
    return "\n".join(rows)


EAGER_MODELS = (("opt-350m", "OPT-350M"), ("gpt2-xl", "GPT-2 XL"))
UNFUSED_ATTENTION_OPS = (".permute", "dgrad_a.scale", "dgrad_b.scale", "qkv.split.bwd")


def eager_kernels_table() -> str:
    """The Megatron-DeepSpeed preset on 8 A100s (80 GB, data parallel, fp16), 1,024 tokens,
    global batch 64, micro-batch 1 and 8: its step, how much longer it is than with the biases
    in GEMM epilogues (``bias_kernels: fused``) and than with Megatron's optimizer passes
    (``adam-megatron``) in place of DeepSpeed's per-tensor wrappers, and the share of the step
    in the unfused attention's permute, alpha scales and q, k, v concat, and how much longer it is
    than with Megatron's softmax kernel where the kernel's shape rule leaves it to PyTorch
    (``softmax_kernel: megatron`` against ``fused``). Shipped calibration."""
    from phaze.cost import op_time
    from phaze.framework import model_with
    from phaze.graph import layer_graph
    chip = load_chip("a100-80gb")
    eff = params_for(chip, load_default_params())
    fw = FRAMEWORKS["megatron-deepspeed"]
    rows = ["| model | micro-batch | step | bias kernels | DeepSpeed's per-tensor work | unfused attention's "
            "permute, scales, concat | PyTorch's softmax |", "|---|---|---|---|---|---|---|"]
    for name, label in EAGER_MODELS:
        model = model_with(fw, replace(load_model(name, 1024), precision="fp16"))[0]
        for mbs in (1, 8):
            plan = plan_with(fw, Plan(mbs=mbs), precision="fp16")[0]
            r = evaluate(model, chip, 8, 64, plan, eff)
            fused = evaluate(replace(model, bias_kernels="fused"), chip, 8, 64, plan, eff).step_time_s
            megatron = evaluate(model, chip, 8, 64, replace(plan, optimizer="adam-megatron"), eff).step_time_s
            g = layer_graph(model, mbs, 1, False, plan.attention, plan.recompute)
            extra = sum(op_time(o, chip, model.precision, eff) for o in g.fwd + g.bwd
                        if o.name.endswith(UNFUSED_ATTENTION_OPS))
            share = extra * model.layers * r.micro_batches / r.step_time_s
            t = r.step_time_s
            kernel = evaluate(replace(model, softmax_kernel="fused"), chip, 8, 64, plan, eff).step_time_s
            torch_softmax = (f"+{100 * (t / kernel - 1):.1f} % ({model.heads * mbs} rows)" if t > kernel
                             else "none (the kernel's shapes)")
            rows.append(f"| {label} | {mbs} | {t:.3f} s | +{100 * (t / fused - 1):.1f} % "
                        f"| +{100 * (t / megatron - 1):.1f} % | {100 * share:.1f} % | {torch_softmax} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(placement_table())
    print()
    print(framework_effects_table())
    print()
    print(context_parallel_table())
    print()
    print(cp_comm_table())
    print()
    print(fp8_casts_table())
    print()
    print(eager_kernels_table())
