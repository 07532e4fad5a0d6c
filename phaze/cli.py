"""Command line: ``phaze evaluate ...``. Thin: parse, call the library, print."""
from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import select
import signal
import sqlite3
import stat
import sys
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np

from . import fitstore
from . import validate as val
from .api import SHIPPED_KINDS, as_chip, as_model, as_plan, calibrated_efficiency, shipped
from .area import DEFAULT, silicon
from .calibrate import (
    BOUNDS,
    EXECUTION_KEY,
    PRIOR_WEIGHT,
    fit_key,
    load_default_params,
    load_params,
    params_for,
    params_held_out,
    save_params,
    shipped_params_path,
)
from .configio import ConfigError
from .cost import IDEAL
from .exact import Certificate
from .framework import FRAMEWORKS, PLAN_KEYS, describe, framework, model_with, options_with, plan_with
from .graph import megatron_softmax_off, reruns_needed
from .lazy import tqdm
from .memory import GPU_RESERVE_FRACTION, memory_reserve_bytes
from .placement import (
    MAX_AUTO_MBS,
    MAX_AUTO_VP,
    MAX_PIPELINE_MBS,
    Placement,
    PlacementOptions,
    cp_values,
    dispatcher_values,
    ep_overlap_values,
    expert_widths,
    place,
    routing_values,
    searched_modes,
    tp_problem,
)
from .plan import (
    BOOL_WORDS,
    CP_COMMS,
    CP_COMMS_ALLOWED,
    DISPATCHERS,
    DP_SHARD_ALLOWED,
    FSDP_PP,
    MEGATRON_OPTIMIZERS,
    OFFLOADS_ALLOWED,
    PIPE_SCHEDULES,
    PIPE_SCHEDULES_ALLOWED,
    PLAN_RECOMPUTE,
    RECOMPUTE,
    RECOMPUTE_MODULES,
    ROUTING,
    SEARCHED_RECOMPUTE,
    cp_comm_value,
    dp_shard_text,
    dp_shard_value,
    offload_value,
    one_or_several,
    ordered_modules,
    pipe_schedule_value,
)
from .power import PoweredStep, place_within_limit, within_limit
from .report import baselines_frame, best_designs, gains, load_study, pareto_frame, trials_frame
from .runs import Case, default_runs_paths, display_path, load_items
from .schedule import TIME_LIMIT_S, WORK_LIMIT, schedule_layer, sharing, write_gantt
from .search import SearchInterrupted, interruptible, open_study, search, sweep
from .space import MAX_BATCH, MAX_DEVICES, MAX_NAME, MAX_SEQ_LEN, load_sweep, override, study_name_ok
from .step import COMMUNICATION_GROUPS, StepResult, evaluate, host_offload_bytes
from .storage import mask_password
from .study_files import compare_studies, write_study_files
from .system import apply_system, as_system, system_note, with_devices_per_node, with_nics
from .workload import dense_view, local_attention_phrase

GiB = 2.0 ** 30


_WORKLOAD_HELP = "shipped or published name (gpt3-175b, Llama-2-13B), a YAML, or a HF config.json"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2, no usage dump
        self.exit(2, f"phaze: error: {message} (see '{self.prog} --help')\n")


def _int_at_least(minimum: int, what: str, maximum: int | None = None):
    """An argparse type: an integer of at least ``minimum`` (and at most ``maximum``), else one
    line naming what is allowed."""
    def parse(text: str) -> int:
        try:
            value = int(text) if len(text) < 64 else None
        except ValueError:
            value = None
        if value is None or value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text[:40]!r}")
        return value
    return parse


_positive_int = _int_at_least(1, "a positive integer")
_nonnegative_int = _int_at_least(0, "an integer >= 0")


def _study_name(text: str) -> str:
    """An argparse type: a study name that can name its folder."""
    if not study_name_ok(text):
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_NAME} letters, digits, '-', '_' and '.' (it names "
                                         f"results/<study>), got {text[:40]!r}")
    return text


# sizes past anything built are refused rather than evaluated into a meaningless answer (space.py's caps)
_devices = _int_at_least(1, f"a positive integer up to {MAX_DEVICES:,} (more chips than any cluster built)",
                         MAX_DEVICES)
_batch = _int_at_least(1, f"a positive integer up to {MAX_BATCH:,} sequences", MAX_BATCH)
_seq_len = _int_at_least(1, f"a positive integer up to {MAX_SEQ_LEN:,} tokens", MAX_SEQ_LEN)
_top = _int_at_least(1, "a positive integer up to 1000", 1000)


def _float_in(ok, allowed: str, scale: float = 1.0):
    """An argparse type: a finite number for which ``ok(value)`` holds, times ``scale``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and ok(value)):
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {text[:40]!r}")
        return value * scale
    return parse


_gib = _float_in(lambda x: 0 <= x <= 1e6, "a size in GiB >= 0 (e.g. 4 or 2.5)", GiB)     # returned in bytes
_watts = _float_in(lambda x: 0 < x <= 1e5, "a power in watts > 0 (e.g. 500)")


def params_text(model) -> str:
    """The parameter count as read, so that a user can check a config's reading against the
    published figure: total, and for a mixture of experts those active per token."""
    total = f"{model.params / 1e9:,.2f} B ({model.params:,})"
    if model.moe:
        total = f"{total} total, {model.active_params / 1e9:,.2f} B ({model.active_params:,}) active per token"
    if model.mtp_layers:
        total += (f"; multi-token prediction: {model.mtp_layers} module{'s' if model.mtp_layers > 1 else ''} "
                  f"on the last stage, {model.mtp_params / 1e9:,.2f} B more")
    return total


def memory_place(r: StepResult, stage: int) -> str:
    """Where the ``stage``-th entry of a result's memory sits: a pipeline stage, or under DualPipe
    (its plan's label says so) a rank, which holds two of the pp stages, one entry a rank."""
    if "pipe_schedule=dualpipe" not in r.plan.split(","):
        return f"stage {stage}"
    pp = len(r.stage_memory)
    h = min(stage, pp - 1 - stage)
    return f"rank {stage}, with stages {h} and {pp - 1 - h}"


def format_result(r: StepResult, model=None) -> str:
    """The text of ``phaze evaluate``; with ``model``, its parameter count too."""
    pct = lambda x: f"{100 * x:5.1f} %"  # noqa: E731
    lines = [
        f"{r.workload} on {r.devices} x {r.chip}, global batch {r.global_batch}",
        *([f"  parameters         {params_text(model)}"] if model is not None else []),
        f"  plan               {r.plan}, dp={r.dp}, {r.micro_batches} "
        f"micro-batch{'es' if r.micro_batches != 1 else ''} per step"
        + (f"; ZeRO shard groups of {r.zero_group_ranks} data-parallel ranks, {r.dp // r.zero_group_ranks} "
           "replicas" if 0 < r.zero_group_ranks < r.dp else ""),
        f"  step time          {r.step_time_s:.3f} s",
        f"  throughput         {r.samples_per_s:,.2f} samples/s   {r.tokens_per_s:,.0f} tokens/s (cluster), "
        f"{r.tokens_per_s_per_device:,.0f} tokens/s per device",
        f"  MFU / HFU          {pct(r.mfu)} / {pct(r.hfu).strip()}   (model {r.model_flops_per_step / 1e15:,.1f} "
        f"PFLOP per step)",
        f"  TFLOP/s per device {r.model_flops_per_s_per_device / 1e12:,.1f} model, "
        f"{r.hardware_flops_per_s_per_device / 1e12:,.1f} hardware (recompute included, as HFU counts)",
        f"  memory per device  {r.memory_per_device_bytes / GiB:.1f} GiB of {r.hbm_bytes / GiB:.1f} GiB"
        f" ({memory_place(r, r.binding_stage)}), {r.memory_reserve_bytes / GiB:.1f} GiB reserved: headroom "
        f"{r.headroom_bytes / GiB:.1f} GiB, {'fits' if r.fits else 'DOES NOT FIT'}",
        "  where the time goes:",
    ]
    names = {"compute_s": "compute (tensor units)", "memory_bound_s": "memory-bound ops",
             "communication_exposed_s": "exposed communication",
             "pipeline_bubble_s": "pipeline bubble", "optimizer_s": "optimizer step"}
    for key, value in r.breakdown_s.items():
        lines.append(f"    {names[key]:<24} {value:9.3f} s  {pct(value / r.step_time_s)}")
        if key == "communication_exposed_s":   # by group, those that show
            lines += [f"      {COMMUNICATION_GROUPS[k]:<22} {v:9.3f} s  {pct(v / r.step_time_s)}"
                      for k, v in r.communication_by_group_s.items() if v >= 5e-4]
    m = r.stage_memory[r.binding_stage]
    lines.append(f"  memory on {memory_place(r, m.stage)}: weights+grads+optimizer "
                 f"{m.weights_and_optimizer_bytes / GiB:.1f} GiB, activations "
                 f"{m.activation_bytes / GiB:.1f} GiB, transient {m.transient_bytes / GiB:.1f} GiB")
    return "\n".join(lines)


def format_power(ps: PoweredStep) -> str:
    """The power lines of a plan run within its chip's power limit."""
    e = ps.energy
    limit = (f" of a {ps.power_limit_w:g} W limit" + (" (the TDP)" if ps.power_limit_w == ps.tdp_w else "")
             if ps.power_limit_w else "")
    lines = [f"  power per device   {e.power_w:,.1f} W{limit}; {ps.energy_per_token_j * 1e3:,.3f} mJ per token "
             f"({e.tokens_per_joule:,.2f} tokens/J)",
             f"  clock              {ps.note()}"]
    return "\n".join(lines)


def _within_limit(model, chip, devices, batch, plan, eff, result, args) -> PoweredStep:
    return within_limit(model, chip, devices, batch, plan, eff, getattr(args, "power_limit", None), result)


def efficiency_for(chip, args):
    """Calibrated efficiency for the chip's family (shipped, or ``--params``); ``--ideal`` for
    the datasheet machine."""
    if getattr(args, "ideal", False):
        return IDEAL
    if getattr(args, "params", None):
        return params_for(chip, load_params(args.params))
    return calibrated_efficiency(chip)


def system_for(args):
    """The cluster of ``--system`` (with ``--devices-per-node`` and ``--nics-per-node``), or None:
    the chip file's links."""
    system = as_system(getattr(args, "system", None))
    per_node = getattr(args, "devices_per_node", None)
    if per_node is not None:
        if system is None:
            raise ConfigError("--devices-per-node", None, "needs --system: the cluster whose nodes (or pod "
                                                          "slices) it resizes")
        system = with_devices_per_node(system, per_node)
    nics = getattr(args, "nics_per_node", None)
    if nics is not None:
        if system is None:
            raise ConfigError("--nics-per-node", None, "needs --system: the cluster whose NIC count it sets")
        system = with_nics(system, nics)
    return system


def chip_for(args):
    """``--arch`` in the cluster of ``--system`` (the chip file's links without one)."""
    return apply_system(as_chip(args.arch), system_for(args))


def _plan_keys(text: str) -> set[str]:
    return {item.partition("=")[0].strip() for item in (text or "").split(",") if item.strip()}


def assumptions(model, chip, args, plan=None, given: set[str] = frozenset(), options=None) -> dict:
    """What the answer assumed that the user did not say: the workload's reading, the plan's
    defaults (or the space searched), the chip and system, the memory reserve, the efficiency."""
    out = {}
    seq = [n.removeprefix("sequence length").strip() for n in model.notes if n.startswith("sequence length")]
    out["sequence_length"] = seq[0] if seq else f"{model.seq_len} (the workload's; --seq-len sets it)"
    for note in model.notes:
        if note.startswith(("sliding-window", "chunked attention")):
            if 0 < model.local_attention < model.seq_len:
                note += ("; each query is costed over at most that many earlier keys (fused attention "
                         "stores no scores, so memory is the same)")
            out["attention_window"] = note
        elif not note.startswith("sequence length"):
            out.setdefault("workload", note)
    if model.local_attention and "attention_window" not in out:
        out["attention_window"] = local_attention_phrase(model.sliding_window, model.attention_chunk,
                                                         model.window_layer_share) + " (the workload's)"
    extras = [what for on, what in (
        (model.sandwich_norm, "a norm after the attention and after the FFN as well as before them"),
        (model.qk_norm and model.qk_norm_width == "projection",
         "the queries and keys normed over the whole projection, their sums all-reduced over tensor parallelism"),
        (model.qk_l2_norm, "the rotary layers' query and key heads L2-normed after the rotation (no weights)"),
        (model.query_scale_share, f"the queries of {model.query_scale_share:.0%} of the layers times a factor of "
                                  f"their position, a kernel of its own each way"),
        (model.attention_softcap, f"the attention scores soft-capped at {model.attention_softcap:g}"),
        (model.logit_softcap, f"the final logits soft-capped at {model.logit_softcap:g}"),
        (model.embedding_scale or model.residual_scale or model.logit_scale or model.head_scale,
         " and ".join(what for on, what in ((model.embedding_scale, "the embedding's output"),
                                            (model.residual_scale, "each branch's output before its residual add"),
                                            (model.logit_scale, "the logits"),
                                            (model.head_scale, "the final hidden states")) if on)
         + " times a constant, a kernel of its own each way")) if on]
    if extras:   # Gemma 2's, OLMo's
        out["norms_and_caps"] = "; ".join(extras) + " (the workload's)"
    if model.rotated_width and model.rope_layer_share < 1:   # Llama 4's and SmolLM3's NoPE layers
        out["position_embedding"] = (f"a rotary embedding in {model.rope_layer_share:.0%} of the layers, none in "
                                     f"the others (the workload's)")
    if model.hybrid:
        names = {"M": "Mamba-2", "*": "attention", "-": "MLP", "E": "mixture-of-experts"}
        kinds = ", ".join(f"{n} {names[k]}" for k, n in model.hybrid_counts.items())
        out["layers"] = (f"{kinds} (hybrid_pattern), each kind costed on its own and weighed as the mean layer; "
                         f"the stages share the layers evenly, not the pattern's order")
    if plan is not None and (note := softmax_note(model, plan)):
        out["softmax"] = note
    if plan is not None and plan.offload:
        host = host_offload_bytes(model, args.devices, args.global_batch, plan)
        held = (f"{host / GiB:.1f} GiB a device in the host's memory, of {chip.host_memory_bytes / GiB:.1f} GiB "
                f"a chip (host_memory_bytes)" if chip.host_memory_bytes else
                f"{host / GiB:.1f} GiB a device in the host's memory, not checked: the chip file gives no "
                f"host_memory_bytes")
        out["offload"] = (f"{plan.offload} sent to the host's memory and fetched back over "
                          f"{chip.host_bandwidth_bytes_per_s / 1e9:.1f} GB/s a direction (the chip file's "
                          f"host_bandwidth_bytes_per_s), each copy under its phase's compute; {held}")
    if plan is not None:
        defaults = {"tp": "tp=1", "pp": "pp=1", "mbs": "mbs=1", "recompute": "recompute=none",
                    "sp": "sp on when tp > 1", "vp": "vp=1", "cp": "cp=1", "zero": "zero=0 (no sharding)",
                    "attention": "attention=flash", "optimizer": "optimizer=adam",
                    "dp_overlap": "dp_overlap on", "tp_overlap": "tp_overlap off", "tp_async": "tp_async off",
                    "reduce_fp32": "reduce_fp32 off (16-bit gradients)",
                    "dp_shard": "dp_shard=all (ZeRO shards over every data-parallel rank)",
                    "cp_comm": "cp_comm=p2p (a ring of K/V sends, each under one step's attention)",
                    "fsdp_pp": "fsdp_pp=micro_batch (FSDP gathers each stage's weights for every micro-batch)",
                    "fp8_params": "fp8_params off (16-bit weights, cast to fp8 for the GEMMs)",
                    "pipe_p2p": "pipe_p2p=batched (each pipeline send paired with a receive, Megatron's)",
                    "pipe_schedule": "pipe_schedule=1f1b (one forward, one backward a micro-batch; interleaved "
                                     "when vp > 1)",
                    "grad_accum_fusion": "grad_accum_fusion on (Megatron's weight-gradient GEMMs add into "
                                         "the main gradients)",
                    "loss": "loss=torch (cross entropy on the fp32-upcast logits, one pass)",
                    "shared_overlap": "shared_overlap off (the shared experts in turn with the "
                                      "all-to-alls, Megatron-Core's default)",
                    "stages": "an even split of the layers",
                    "schedule": "schedule=optimal"}
        unset = [v for k, v in defaults.items() if k not in given and not (k == "schedule" and args.schedule)
                 and not (k == "grad_accum_fusion" and plan.optimizer not in MEGATRON_OPTIMIZERS)
                 and not (k == "dp_shard" and not plan.zero) and not (k == "cp_comm" and plan.cp == 1)
                 and not (k == "fsdp_pp" and (plan.zero < 3 or plan.pp == 1))
                 and not (k == "fp8_params" and model.precision != "fp8")
                 and not (k in ("pipe_p2p", "pipe_schedule") and plan.pp == 1)
                 and not (k == "shared_overlap" and not model.shared_experts)]
        if unset:
            out["plan_defaults"] = ", ".join(unset)
        tp = plan.tp
    else:
        o = options
        mbs = (','.join(map(str, o.mbs)) if o.mbs else
               f"every divisor of a replica's batch up to {MAX_AUTO_MBS} ({MAX_PIPELINE_MBS} with a pipeline)")
        ok, bad = [], {}      # the widths that split the model; the others by the reason they cannot
        for t in o.tp:
            why = tp_problem(model, args.devices, t, o).partition(" ")[2]
            (bad.setdefault(why, []) if why else ok).append(str(t))
        tps = ",".join(ok) + (f" (not {'; '.join(','.join(ts) + ': ' + why for why, ts in bad.items())})"
                              if bad else "")
        out["searched"] = (f"tp {tps}; mbs {mbs}; pp "
                           + (','.join(map(str, o.pp)) if o.pp else "every divisor of devices/tp up to the layers")
                           + "; vp " + (','.join(map(str, o.vp)) if o.vp else "1 (a hybrid)" if model.hybrid else
                                        f"every value Megatron accepts for the layers, up to {MAX_AUTO_VP}")
                           + f"; cp {','.join(map(str, cp_values(model, o)))}"
                           + f"; recompute {'/'.join(searched_modes(model, o))} per stage"
                           + (f" (selective: {'+'.join(o.recompute_modules)})"
                              if o.recompute_modules and "selective" in o.recompute else "") + "; "
                           f"zero {','.join(map(str, o.zero_stages))}; attention {o.attention}; optimizer "
                           f"{o.optimizer}; sp {'on when tp > 1' if o.sp else 'off'}; "
                           "dp_overlap " + ("off" if not o.dp_overlap else "on without pp and sp"
                                            if o.dp_overlap_flat else "on") + "; "
                           f"{'fp32' if o.reduce_fp32 else '16-bit'} gradients"
                           + ("; tp_async on" if o.tp_async else "") + ("; tp_overlap on" if o.tp_overlap else "")
                           + (f"; loss {o.loss}" if o.loss != "torch" else "")
                           + ("; grad_accum_fusion off"
                              if not o.grad_accum_fusion and o.optimizer in MEGATRON_OPTIMIZERS else "")
                           + (f"; dp_shard {','.join(map(dp_shard_text, o.dp_shards))}" if o.dp_shards != (0,) else "")
                           + (f"; cp_comm {','.join(o.cp_comms)}" if o.cp_comms != ("p2p",) else "")
                           + (f"; pipe_schedule {','.join(o.pipe_schedules)} (dualpipe: the even split, one "
                              f"recompute mode)" if o.pipe_schedules != ("1f1b",) else "")
                           + (f"; offload {','.join(x or 'none' for x in o.offloads)} (with full recompute)"
                              if o.offloads != ("",) else "")
                           + (f"; fsdp_pp {o.fsdp_pp}" if o.fsdp_pp != "micro_batch" else "")
                           + ("; fp8 weights" if o.fp8_params else ""))
        if model.moe:
            routes = [r or "the model's own (" + ("capacity" if model.capacity_factor else "dropless") + ")"
                      for r in routing_values(model, o)]
            out["searched"] += (f"; ep {','.join(map(str, expert_widths(model, o)))}; etp "
                                + (','.join(map(str, o.etp)) if o.etp else "1 and tp")
                                + f"; routing {', '.join(routes)}"
                                + f"; dispatcher {','.join(d or 'alltoall' for d in dispatcher_values(model, o))}"
                                + "; ep_overlap " + ",".join("on" if x else "off" for x in ep_overlap_values(model, o)))
        tp = max(o.tp)
    out["execution"] = (f"{chip.execution}: " + {
        "eager": "the host dispatches each kernel (host and launch overhead per kernel)",
        "cuda-graphs": "kernels replayed from a CUDA graph (launch overhead per kernel, no host dispatch)",
        "xla": "one compiled program (no per-kernel host or launch overhead)"}[chip.execution]
        + ("; a full recompute re-runs only what the backward reads" if reruns_needed(model, chip.compiled) else "")
        + ("" if getattr(args, "framework", None) else " (the chip's; --framework sets a framework's)"))
    if tp > model.kv_heads and model.attention_layers:   # a Mamba-2-only model has no KV heads
        out["kv_heads"] = (f"tp={tp} is more than the {model.kv_heads} KV heads: each KV head is replicated on "
                           f"{tp // model.kv_heads} tensor-parallel ranks; each rank computes and stores one "
                           f"whole KV head and holds its K/V weights")
    out["chip"] = (f"{chip.name}: {chip.hbm_bytes / GiB:.1f} GiB HBM at {chip.hbm_bandwidth_bytes_per_s / 1e12:.2f} "
                   f"TB/s, {chip.peak_flops(model.precision) / 1e12:.0f} TFLOP/s {model.precision} peak")
    out["system"] = system_note(system_for(args), chip, args.devices)
    reserve_arg = getattr(args, "memory_reserve", None)
    reserve = memory_reserve_bytes(chip, reserve_arg)
    if reserve_arg is not None:
        out["memory_reserve"] = f"{reserve / GiB:.2f} GiB per device (--memory-reserve)"
    elif chip.unit_sharing == "sequential" or chip.kind == "gpu":
        out["memory_reserve"] = (f"{reserve / GiB:.2f} GiB per device, modelled: 1.5 GiB for the CUDA context, "
                                 f"library workspaces and NCCL buffers + {100 * GPU_RESERVE_FRACTION:g} % of "
                                 f"HBM for allocator fragmentation (--memory-reserve sets it)")
    else:
        out["memory_reserve"] = (f"{reserve / GiB:.2f} GiB per device, modelled: the runtime and program of a "
                                 f"statically allocated accelerator (--memory-reserve sets it)")
    if getattr(args, "ideal", False):
        out["efficiency"] = "ideal datasheet machine (--ideal)"
    elif getattr(args, "params", None):
        out["efficiency"] = f"parameters from {args.params}"
    else:
        key = fit_key(chip, load_default_params())
        if key is None:
            which = "none (ideal datasheet machine)"
        elif key == chip.family:
            which = f"the {key} family's fit"
        elif key.startswith(EXECUTION_KEY):
            which = f"the fit of the published runs that run as this chip does ({key}; no {chip.family} family fit)"
        else:
            which = "the fit pooled over every published run ('default')"
        out["efficiency"] = "shipped calibration: " + which
    return out


def softmax_note(model, plan) -> str:
    """The printout's line on a plan whose unfused softmax Megatron's kernel cannot run ("" otherwise)."""
    why = megatron_softmax_off(model, plan.mbs, plan.tp) if plan.attention == "standard" else ""
    return (f"PyTorch's in fp32, five kernels each way, where Megatron's kernel cannot run: {why} "
            "(softmax_kernel megatron)") if why else ""


def _print_assumptions(items: dict) -> None:
    print("  assumed:")
    for key, text in items.items():
        print(f"    {key.replace('_', ' '):<18} {text}")


def fit_hints(plan, devices: int) -> list[str]:
    """The changes to a plan that does not fit that would shrink its memory: only those it has
    not made already (no ``zero=1`` to a plan with it, no ZeRO without data parallelism)."""
    hints = []
    if plan.recompute != "full" or any(r != "full" for r in plan.stage_recompute):
        hints.append("recompute=full")
    if plan.tp * plan.pp * plan.cp < devices:
        hints.append("a larger tp or pp")
    if plan.mbs > 1:
        hints.append("a smaller mbs")
    if plan.zero < 3 and plan.dp(devices) > 1:
        hints.append(f"zero={plan.zero + 1}")
    return hints


def cmd_evaluate(args) -> int:
    model = as_model(args.workload, args.seq_len)
    chip = chip_for(args)
    plan = as_plan(args.plan)
    preset = None
    if args.framework:
        fw = framework(args.framework)
        plan, changes = plan_with(fw, plan, _plan_keys(args.plan), model.precision, model)
        model, set_on_model = model_with(fw, model)
        chip = chip.with_execution(fw.execution)
        preset = describe(fw, changes | set_on_model)
    if args.schedule:
        plan = replace(plan, schedule=args.schedule)
    if args.memory_reserve is not None:
        plan = replace(plan, memory_reserve=args.memory_reserve)
    result = evaluate(model, chip, args.devices, args.global_batch, plan, efficiency_for(chip, args))
    host = host_offload_bytes(model, args.devices, args.global_batch, plan)
    if not result.fits and not args.allow_oom and chip.host_memory_bytes and host > chip.host_memory_bytes:
        raise ConfigError("--plan", "offload", f"does not fit in the host's memory: offloads {host / GiB:.1f} GiB "
                          f"per device, {chip.name}'s host holds {chip.host_memory_bytes / GiB:.1f} GiB a chip (the "
                          f"chip file's host_memory_bytes); allowed: more pipeline stages or a smaller micro-batch, "
                          f"no offload, or --allow-oom to print the result anyway")
    if not result.fits and not args.allow_oom:
        m = result.stage_memory[result.binding_stage]
        hints = fit_hints(plan, args.devices)
        try_text = (f"try {', '.join(hints)}, or 'phaze place' to find one" if hints else
                    "this plan already recomputes, splits and shards all it can: more devices or more HBM")
        what = "does not fit" if args.plan.strip() else (
            f"no plan given, and the default plan ({plan.label()}) does not fit")
        raise ConfigError("--plan", None, f"{what}: needs {m.total_bytes / GiB:.1f} GiB per device "
                          f"on {memory_place(result, m.stage)}, {chip.name} has {chip.hbm_bytes / GiB:.1f} GiB with "
                          f"{result.memory_reserve_bytes / GiB:.1f} GiB reserved; allowed: plans that fit "
                          f"({try_text}) or --allow-oom to print the result anyway")
    ps = _within_limit(model, chip, args.devices, args.global_batch, plan, efficiency_for(chip, args), result, args)
    result = ps.result
    given = _plan_keys(args.plan) | (set(PLAN_KEYS) | set(changes) if preset else set())
    notes = assumptions(model, chip, args, plan, given)
    if preset:
        notes["framework"] = preset
    if args.format == "json":
        if preset:
            notes["framework_source"] = fw.source
        print(json.dumps(dict(result.to_dict(), params=model.params, active_params=model.active_params,
                              mtp_params=model.mtp_params, power=ps.to_dict(), assumptions=notes), indent=2))
    else:
        print(format_result(result, model))
        print(format_power(ps))
        _print_assumptions(notes)
    return 0


def _pct(x) -> str:
    return f"{x:5.1f}%" if x is not None else "    -"


def _stats_line(name: str, st: dict) -> str:
    if not st.get("rows"):
        return f"  {name:<28} {0:>5}"
    return (f"  {name:<28} {st['rows']:>5}  {_pct(st['mape_pct'])}  {_pct(st['median_pct'])}  "
            f"{_pct(st['max_pct'])}  {100 * st['within_10pct_share']:5.0f}%")


def _groups(texts):
    out = {}
    for text in texts:
        name, sep, srcs = text.partition("=")
        if not sep or not name.strip() or not srcs.strip():
            raise ConfigError("--group", None, f"expected NAME=SRC,SRC (source_id prefixes), got {text!r}")
        out[name.strip()] = tuple(x.strip() for x in srcs.split(",") if x.strip())
    return out


def _held_out(args, items) -> tuple[str, ...]:
    """The sources ``--hold-out`` names (default: the frozen split of the bundled sets, none for a
    user's ``--runs``; ``none`` holds nothing out), each checked against the runs."""
    text = args.hold_out
    if text is None:
        return val.HELD_OUT_SOURCES if not args.runs else ()
    if text.strip().lower() in ("", "none"):
        return ()
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    known = sorted({c.source for c in items})
    for name in names:
        if name not in known:
            raise ConfigError("--hold-out", None, f"no run has source_id {name!r}; allowed: none or "
                                                  f"source ids among {', '.join(known)}")
    return names


def _check_output(flag: str, path: str, image: bool = False) -> None:
    """Refuse an output path that cannot be written before any long computation runs."""
    p = Path(path)
    if p.is_dir() or not p.parent.is_dir():
        raise ConfigError(flag, None, f"cannot write {path!r}: "
                          f"{'is a directory' if p.is_dir() else 'its folder does not exist'}")
    if image:
        from matplotlib.backend_bases import FigureCanvasBase  # deferred: matplotlib imports slowly
        formats = FigureCanvasBase.get_supported_filetypes()
        if p.suffix and p.suffix[1:].lower() not in formats:
            raise ConfigError(flag, None, f"unknown image format {p.suffix!r}; allowed: "
                                          f"{', '.join(sorted(formats))}")


def _say_reused() -> None:
    """One stderr line when fits were taken from the disk store (:mod:`phaze.fitstore`)."""
    n = fitstore.counts()
    if n["reused"]:
        print(f"phaze: {n['reused']} of {n['reused'] + n['fitted']} fits reused from an earlier run of the same "
              f"rows and code (PHAZE_CACHE_DIR=off fits anew)", file=sys.stderr)


def cmd_validate(args) -> int:
    groups = _groups(args.group)
    if args.out:
        _check_output("--out", args.out)
    if args.plot:
        _check_output("--plot", args.plot, image=True)
    runs_paths = [args.runs] if args.runs else default_runs_paths()
    params_path = args.params or shipped_params_path()
    params = load_params(args.params) if args.params else load_default_params()
    items = load_items(runs_paths)
    hold = _held_out(args, items)
    items, held_items = val.split_held_out(items, hold)
    cases = [c for c in items if isinstance(c, Case)]
    preds = val.predict_all(items, params)
    summary = {"in_sample": val.summarize(preds)}
    held_preds = val.predict_all(held_items, params) if args.score_held_out else []
    fitted_without = set(params_held_out(params_path)) if Path(params_path).exists() else set()
    summary["held_out"] = {"sources": list(hold), "rows": len(held_items), "scored": bool(held_preds),
                           "parameters_fitted_without_them": set(hold) <= fitted_without}
    if held_preds:
        summary["held_out"].update(val.summarize(held_preds))
        summary["held_out"]["skipped"] = _skipped(held_preds)
    ok = [p for p in preds if p.status == "ok"]
    for name, prefixes in groups.items():
        summary["in_sample"].setdefault("groups", {})[name] = val.error_stats(
            [p.error for p in ok if p.source.startswith(prefixes)])
    loso_preds = []
    if not args.no_loso and cases:
        with tqdm.tqdm(total=val.loso_fits(cases), desc="leave-one-source-out", unit="fit") as bar:
            loso, loso_preds = val.leave_one_source_out(
                cases, progress=lambda what: (bar.set_postfix_str(what, refresh=False), bar.update(1)), jobs=args.jobs)
        for name, prefixes in groups.items():
            loso.setdefault("groups", {})[name] = val.error_stats(
                [p.error for p in loso_preds if p.source.startswith(prefixes)])
        summary["leave_one_source_out"] = loso
    if args.out:
        _write_predictions(args.out, preds + held_preds, loso_preds)
    if args.unseen:
        train, sep, test = args.unseen.partition(":")
        if not sep:
            raise ConfigError("--unseen", None, f"expected TRAIN:TEST chip families, got {args.unseen!r}")
        summary["unseen_gpu"] = dict(val.unseen_gpu(cases, train, test), clean=False, note=(
            "computed with the current cost model, which was changed after that GPU's errors had "
            "been seen; the clean figure (README) uses the model as it was before"))
    _say_reused()
    if args.plot:
        _plot(args.plot, loso_preds or preds, held_out=bool(loso_preds))
    summary["overall"] = summary["in_sample"]["overall"]   # totals: expressed / skipped / total
    summary["skipped"] = _skipped(preds)
    summary["over_memory"] = _over_memory(preds)
    summary["runs"] = [display_path(p) for p in runs_paths]
    summary["params"] = display_path(params_path)
    if args.format == "json":
        print(json.dumps(summary, indent=2))
        return 0

    def line(name: str, st: dict) -> str:
        if not st.get("rows"):
            return f"  {name:<34} {0:>5}"
        return (f"  {name:<34} {st['rows']:>5}  {_pct(st['mape_pct'])}  {st['bias_pct']:+6.1f}%  "
                f"{_pct(st['median_pct'])}  {_pct(st['max_pct'])}  {100 * st['within_10pct_share']:5.0f}%")

    def table(st: dict) -> None:
        print(line("all expressed runs", st["overall"]))
        if st.get("source_mean"):
            m = st["source_mean"]
            print(f"  {'per-source mean (' + str(m['sources']) + ' sources)':<34} {m['rows']:>5}  "
                  f"{_pct(m['mape_pct'])}  {m['bias_pct']:+6.1f}%")
        if st.get("without_largest_source", {}).get("rows"):
            w = st["without_largest_source"]
            print(line(f"without {w['source'][:24]}", w))
        for key in ("groups", "per_dataset", "per_chip", "per_source"):
            for name, sub in st.get(key, {}).items():
                print(line(f"group {name}" if key == "groups" else name, sub))

    o = summary["overall"]
    h = summary["held_out"]
    print(f"phaze validate: {o['expressed']} of {o['total']} runs expressed, {o['skipped']} skipped"
          + (f", {h['rows']} more held out" if h["rows"] else "") + f" ({', '.join(summary['runs'])})")
    print(f"parameters: {summary['params']}")
    print(f"  {'':<34} {'rows':>5}  {'MAPE':>6}  {'bias':>7}  {'median':>6}  {'max':>6}  {'<=10%':>6}")
    if "leave_one_source_out" in summary:
        print("leave-one-source-out (each source predicted by parameters fitted without it):")
        table(summary["leave_one_source_out"])
    print("in-sample (parameters fitted on these same runs; not a measure of accuracy on new runs):")
    table(summary["in_sample"])
    if h["sources"] and not h["scored"]:
        print(f"held out: {h['rows']} rows of {', '.join(h['sources'])} (the frozen split; not fitted on, "
              f"not scored here; --score-held-out scores them once)")
    elif h["scored"]:
        print(("HELD OUT" if h["parameters_fitted_without_them"] else
               "NOT HELD OUT (the parameters were fitted on these rows)") +
              f": {', '.join(h['sources'])}, scored with {summary['params']} "
              f"({h['overall']['expressed']} of {h['overall']['total']} rows expressed):")
        table(h)
        for s in h["skipped"]:
            print(f"  skipped {s['run_id']}: {s['reason']}")
    if summary.get("unseen_gpu", {}).get("overall", {}).get("rows"):
        u = summary["unseen_gpu"]
        print(f"unseen GPU, NOT CLEAN (calibrated on {u['train']} only, predicting {u['test']}; the "
              f"cost model was revised after {u['test']} errors were seen):")
        print(line(f"{u['test']} runs", u["overall"]))
        for name, st in u["per_source"].items():
            print(line(name, st))
    over = summary["over_memory"]
    if over:
        by_source: dict[str, int] = {}
        for x in over:
            by_source[x["source"]] = by_source.get(x["source"], 0) + 1
        print(f"published plans phaze's memory model does not fit: {len(over)} of {o['expressed']} "
              f"({', '.join(f'{k} {n}' for k, n in sorted(by_source.items()))}; a run that ran, so a gap in "
              f"the memory model or in the row's description; scored all the same)")
        for x in over:
            print(f"  {x['run_id']}: {x['memory_gib']:.1f} GiB a device, {x['usable_gib']:.1f} usable")
    reasons: dict[str, int] = {}
    for s in summary["skipped"]:
        print(f"skipped {s['run_id']}: {s['reason']}")
        reasons[s["reason"]] = reasons.get(s["reason"], 0) + 1
    if reasons:
        print("skipped rows by reason:")
        for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            print(f"  {n:>4}  {reason}")
    return 0


def _skipped(preds) -> list[dict]:
    """The rows among ``preds`` that were not expressed, with the reason."""
    return [{"run_id": p.run_id, "reason": p.reason} for p in preds if p.status == "skipped"]


def _over_memory(preds) -> list[dict]:
    """The expressed rows whose scored plan phaze's memory model does not fit (each ran, so the
    model or the row's description misses something), with the memory it needs and has."""
    gib = 2 ** 30
    return [{"run_id": p.run_id, "source": p.source, "memory_gib": p.memory_bytes / gib,
             "usable_gib": p.usable_bytes / gib} for p in preds if p.status == "ok" and p.fits is False]


def _write_predictions(path, preds, loso_preds=()) -> None:
    loso = {p.run_id: p for p in loso_preds}
    try:
        fh = open(path, "w", newline="")
    except OSError as exc:
        raise ConfigError("--out", None, f"cannot write {path!r} ({exc.strerror})") from None
    with fh:
        w = csv.writer(fh)
        w.writerow(["run_id", "dataset", "source_id", "gpu", "chip", "measured_step_s", "predicted_step_s",
                    "error", "loso_predicted_step_s", "loso_error", "status", "reason", "layout_from", "plan",
                    "fit", "loso_fit", "memory_gib", "usable_gib", "fits"])
        for p in preds:
            fmt = lambda x: "" if x is None else f"{x:.9g}"  # noqa: E731
            lp = loso.get(p.run_id)
            w.writerow([p.run_id, p.dataset, p.source, p.gpu, p.chip, fmt(p.measured_step_s),
                        fmt(p.predicted_step_s), fmt(p.error), fmt(lp.predicted_step_s if lp else None),
                        fmt(lp.error if lp else None), p.status, p.reason, p.layout_from, p.plan, p.fit,
                        lp.fit if lp else "", "" if p.memory_bytes is None else f"{p.memory_bytes / 2 ** 30:.2f}",
                        "" if p.usable_bytes is None else f"{p.usable_bytes / 2 ** 30:.2f}",
                        {True: "yes", False: "no", None: ""}[p.fits]])
            fh.flush()


def _plot(path, preds, held_out: bool = False) -> None:
    """Predicted against measured step times, labelled with what kind of figure it is: held out
    (leave-one-source-out) or in-sample."""
    import matplotlib  # deferred: matplotlib imports slowly and only --plot draws
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [p for p in preds if p.status == "ok"]
    if not ok:
        raise ConfigError("--plot", None, "no run could be expressed; nothing to plot")
    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    for gpu in sorted({p.gpu for p in ok}):
        xs = [p.measured_step_s for p in ok if p.gpu == gpu]
        ys = [p.predicted_step_s for p in ok if p.gpu == gpu]
        ax.scatter(xs, ys, s=14, alpha=0.75, label=f"{gpu} ({len(xs)})")
    lo = min(min(p.measured_step_s, p.predicted_step_s) for p in ok) / 1.5
    hi = max(max(p.measured_step_s, p.predicted_step_s) for p in ok) * 1.5
    ax.plot([lo, hi], [lo, hi], color="black", lw=1)
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="grey", alpha=0.2,
                    label="within 10 %")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="measured step time (s)", ylabel="predicted step time (s)",
           title=("phaze vs published runs, leave-one-source-out\n(each source predicted by parameters "
                  "fitted without it)" if held_out else
                  "phaze vs published runs, IN-SAMPLE\n(parameters fitted on these same runs)"))
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=150, metadata={"Software": None})
    except OSError as exc:
        raise ConfigError("--plot", None, f"cannot write {path!r} ({exc.strerror})") from None
    except ValueError as exc:   # an image format matplotlib does not know
        raise ConfigError("--plot", None, f"{exc}") from None
    finally:
        plt.close(fig)


def cmd_calibrate(args) -> int:
    _check_output("--out", args.out)
    runs_paths = [args.runs] if args.runs else default_runs_paths()
    items = load_items(runs_paths)
    hold = _held_out(args, items)
    cases = [c for c in val.split_held_out(items, hold)[0] if isinstance(c, Case)]
    if not cases:
        raise ConfigError(runs_paths[0], None, "no run could be expressed; nothing to calibrate on")
    with tqdm.tqdm(total=len(val.fit_groups(cases)), desc="calibrate", unit="fit") as bar:
        params = val.calibrate_cases(cases, progress=lambda _: bar.update(1), jobs=args.jobs)
    _say_reused()
    fitted = {fam: val.summarize(val.predict_all([c for c in cases if val.in_group(c, fam)],
                                             {"default": e}))["overall"]
              for fam, e in params.items()}
    try:
        save_params(params, args.out, meta={
            "runs": [display_path(p) for p in runs_paths], "rows_used": len(cases),
            "held_out_sources": list(hold),
            "bounds_and_priors": {k: {"low": lo, "high": hi, "prior": pr} for k, (lo, hi, pr) in BOUNDS.items()},
            "prior_weight": PRIOR_WEIGHT, "in_sample_error": fitted})
    except OSError as exc:
        raise ConfigError("--out", None, f"cannot write {args.out!r} ({exc.strerror})") from None
    names = list(BOUNDS)
    print(f"{'fit':<16} " + " ".join(f"{n:>18}" for n in names) + "   rows  in-sample MAPE, bias")
    for fam, e in params.items():
        vals = " ".join(f"{getattr(e, n):>18.4g}" for n in names)
        print(f"{fam:<16} {vals}  {fitted[fam]['rows']:>5} {fitted[fam]['mape_pct']:5.1f}% "
              f"{fitted[fam]['bias_pct']:+5.1f}%")
    print(f"wrote {args.out}")
    return 0


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive integers, got {text!r}")
    return values


def _recompute_list(text: str) -> tuple[str, ...]:
    values = tuple(x.strip().lower() for x in text.split(",") if x.strip())
    if not values or any(v not in PLAN_RECOMPUTE for v in values):
        raise argparse.ArgumentTypeError(f"must be a comma-separated subset of {','.join(PLAN_RECOMPUTE)}, "
                                         f"got {text!r}")
    return values


def _modules_list(text: str) -> tuple[str, ...]:
    mods = ordered_modules(x.strip().lower() for x in text.split("+") if x.strip())
    if mods is None:
        raise argparse.ArgumentTypeError(f"must be distinct modules of {', '.join(RECOMPUTE_MODULES)} joined by "
                                         f"'+', got {text!r}")
    return mods


def _subset_list(allowed: tuple[str, ...]):
    """A flag's parser: a comma-separated subset of ``allowed`` (either case), in the given order."""
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(dict.fromkeys(x.strip().lower() for x in text.split(",") if x.strip()))
        if not values or any(v not in allowed for v in values):
            raise argparse.ArgumentTypeError(f"must be a comma-separated subset of {','.join(allowed)}, "
                                             f"got {text[:40]!r}")
        return values
    return parse


def _switch_list(text: str) -> tuple[bool, ...]:
    values = tuple(dict.fromkeys(BOOL_WORDS.get(x.strip().lower()) for x in text.split(",") if x.strip()))
    if not values or None in values:
        raise argparse.ArgumentTypeError(f"must be off, on or both (0,1), got {text[:40]!r}")
    return values


def _zero_list(text: str) -> tuple[int, ...]:
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    if not values or any(v not in ("0", "1", "2", "3") for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated ZeRO stages from 0,1,2,3, got {text[:40]!r}")
    return tuple(sorted({int(v) for v in values}))


def _one_or_several(parse_one, allowed: str):
    """A flag's parser: one value, or several (comma-separated) to search, in order without
    repeats; ``parse_one`` reads one (None, or ValueError with its reason, for a bad one)."""
    def parse(text: str):
        try:
            values = [parse_one(x) for x in text.split(",") if x.strip()]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not values or None in values:
            raise argparse.ArgumentTypeError(f"must be {allowed}, or several joined by commas, got {text[:40]!r}")
        return one_or_several(values)
    return parse


_cp_comm = _one_or_several(cp_comm_value, CP_COMMS_ALLOWED)     # one exchange, or several to search
_dp_shard = _one_or_several(dp_shard_value, DP_SHARD_ALLOWED)   # one shard grouping, or several
_pipe_schedule = _one_or_several(pipe_schedule_value, PIPE_SCHEDULES_ALLOWED)   # one schedule, or several
_offload = _one_or_several(offload_value, OFFLOADS_ALLOWED)     # one activation offload, or several


class _Ticker:
    """A progress bar on stderr (a terminal only) that appears after ``delay`` seconds and shows
    the elapsed time, and the count when ``update`` is called; for calls that give no progress."""

    def __init__(self, desc: str, total: int | None = None, unit: str = "it", delay: float = 2.0):
        self.bar = tqdm.tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=False, disable=None,
                        file=sys.stderr, dynamic_ncols=True)
        self.delay, self._stop = delay, threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def _tick(self) -> None:
        if self._stop.wait(self.delay):
            return
        while not self._stop.wait(0.5):
            self.bar.refresh()

    def progress(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.n = done

    def __enter__(self):
        if not self.bar.disable:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.bar.close()
        return False


def cmd_place(args) -> int:
    model = as_model(args.workload, args.seq_len)
    chip = chip_for(args)
    baseline_plan = as_plan(args.baseline, "--baseline") if args.baseline else None
    options = PlacementOptions(tp=args.tp, mbs=args.mbs, recompute=args.recompute or SEARCHED_RECOMPUTE,
                               pp=args.pp or (), vp=args.vp or (), zero=args.zero or (0, 1),
                               attention=args.attention or "flash",
                               memory_reserve=args.memory_reserve, reduce_fp32=args.reduce_fp32,
                               ep=args.ep or (), cp=args.cp or (), etp=args.etp or (),
                               routing=args.routing or (), dispatcher=args.dispatcher or (),
                               ep_overlap=args.ep_overlap or (), recompute_modules=args.recompute_modules or (),
                               dp_shard=args.dp_shard or 0, cp_comm=args.cp_comm or "p2p",
                               fsdp_pp=args.fsdp_pp or "micro_batch", fp8_params=args.fp8_params == "on",
                               shared_overlap=args.shared_overlap == "on",
                               pipe_schedule=args.pipe_schedule or "1f1b",
                               offload="" if args.offload is None else args.offload)
    preset = None
    if args.framework:
        fw = framework(args.framework)
        given = {k for k, v in (("attention", args.attention), ("zero", args.zero),
                                ("reduce_fp32", args.reduce_fp32), ("vp", args.vp),
                                ("recompute", args.recompute),
                                ("recompute_modules", args.recompute_modules),
                                ("dp_shard", args.dp_shard is not None), ("cp_comm", args.cp_comm),
                                ("fsdp_pp", args.fsdp_pp), ("fp8_params", args.fp8_params),
                                ("shared_overlap", args.shared_overlap)) if v}
        options, changes = options_with(fw, options, given, model.precision, model)
        model, set_on_model = model_with(fw, model)
        chip = chip.with_execution(options.execution)
        preset = describe(fw, changes | set_on_model)
    eff = efficiency_for(chip, args)
    # the top plans within the power limit (a plan that draws more is throttled: it may fall
    # behind one ranked below it at the nominal clock)
    with _Ticker("phaze place", unit="layout") as ticker:
        res, powered = place_within_limit(model, chip, args.devices, args.global_batch, options, eff, args.top,
                                          getattr(args, "power_limit", None), progress=ticker.progress)
    if res.best is None:
        raise ConfigError(res.infeasible_source or "--arch", None, res.infeasible_reason)
    kind = res.baseline_kind
    if res.baseline is not None and baseline_plan is None:
        b = res.baseline
        bp = powered.get(b.plan) or _within_limit(model, chip, args.devices, args.global_batch, b.plan, eff,
                                                  b.result, args)
        res = replace(res, baseline=Placement(b.plan, bp.result))
    if baseline_plan is not None:
        plan = replace(baseline_plan, memory_reserve=args.memory_reserve)
        try:
            r = evaluate(model, chip, args.devices, args.global_batch, plan, eff)
        except ConfigError as exc:
            if exc.source != "--plan":
                raise
            raise ConfigError("--baseline", exc.field, exc.message) from None
        r = _within_limit(model, chip, args.devices, args.global_batch, plan, eff, r, args).result
        res = replace(res, baseline=Placement(plan, r))
        kind = "given with --baseline"
    baseline, gain = res.baseline, res.gain_over_baseline
    same = baseline is not None and baseline.plan == res.best.plan
    notes = assumptions(model, chip, args, options=options)
    if note := softmax_note(model, res.best.plan):
        notes["softmax"] = "the best plan's: " + note
    if preset:
        notes["framework"] = preset
    best_power = powered[res.best.plan]
    if args.format == "json":
        if preset:
            notes["framework_source"] = fw.source
        out = {"best": dict(res.best.result.to_dict(), plan=res.best.plan.label(), power=best_power.to_dict()),
               "top": [dict(p.result.to_dict(), plan=p.plan.label()) for p in res.top],
               "baseline": dict(baseline.result.to_dict(), plan=baseline.plan.label()) if baseline else None,
               "baseline_kind": kind, "best_is_baseline": same,
               "gain_over_baseline": gain, "layouts_considered": res.layouts_considered,
               "layouts_feasible": res.layouts_feasible, "layouts_solved": res.layouts_solved,
               "solve_time_s": res.solve_time_s, "assumptions": notes}
        print(json.dumps(out, indent=2))
        return 0
    print(f"phaze place: {model.name} on {args.devices} x {chip.name}, global batch {args.global_batch}: "
          f"{res.layouts_feasible} of {res.layouts_considered} layouts fit, solved in {res.solve_time_s:.2f} s")
    print(format_result(res.best.result, model))
    print(format_power(best_power))
    _print_assumptions(notes)
    print(f"  {'rank':<5} {'step (s)':>9} {'tokens/s':>12} {'MFU':>6} {'mem GiB':>8} {'free GiB':>8}  plan")
    for k, p in enumerate(res.top, 1):
        r = p.result
        print(f"  {k:<5} {r.step_time_s:9.3f} {r.tokens_per_s:12,.0f} {100 * r.mfu:5.1f}% "
              f"{r.memory_per_device_bytes / GiB:8.1f} {r.headroom_bytes / GiB:8.1f}  {p.plan.label()}")
    if baseline:
        r = baseline.result
        fit = "" if r.fits else " (does not fit)"
        print(f"  baseline ({kind}): {baseline.plan.label()}: {r.step_time_s:.3f} s{fit}")
        if same:
            print("  the best plan is this baseline itself: no uneven split or per-stage recompute beats it")
        else:
            print(f"  best plan is {100 * gain:+.1f} % throughput over the baseline")
    return 0


def cmd_schedule(args) -> int:
    """``phaze schedule``: the CP-SAT schedule of one layer (forward, backward) on one chip."""
    model = as_model(args.workload, args.seq_len)
    chip = chip_for(args)
    kinds = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}
    if model.hybrid:   # one kind of layer: the one asked for, else the pattern's first
        kind = kinds[args.layer_kind] if args.layer_kind else model.hybrid_pattern[0]
        if kind not in model.hybrid_pattern:
            raise ConfigError("--layer-kind", None, f"{model.name} has no {args.layer_kind} layer; allowed: "
                              + ", ".join(k for k, c in kinds.items() if c in model.hybrid_pattern))
        named = next(k for k, c in kinds.items() if c == kind)
        layer_note = f" of its {model.hybrid_pattern.count(kind)} {named} layers"
        model = replace(model if kind == "E" else dense_view(model), hybrid_pattern=kind * model.layers)
    elif args.layer_kind:
        raise ConfigError("--layer-kind", None, f"is for a hybrid of Mamba-2 and attention layers; {model.name} "
                                                f"has one kind of layer")
    else:
        layer_note = ""
    if args.gantt:
        _check_output("--gantt", args.gantt, image=True)
    if not args.time_limit > 0:
        raise ConfigError("--time-limit", None, f"must be a positive number of seconds, got {args.time_limit}")
    if not args.work_limit > 0:
        raise ConfigError("--work-limit", None, f"must be a positive amount of CP-SAT deterministic time, "
                                                f"got {args.work_limit}")
    sp = args.tp > 1 if args.sp is None else args.sp
    eff = efficiency_for(chip, args)
    with _Ticker("phaze schedule (CP-SAT)"):
        fwd, bwd = schedule_layer(model, chip, args.mbs, args.tp, sp, args.attention, args.recompute, eff,
                                  work_limit=args.work_limit, time_limit_s=args.time_limit)
    head = (f"{model.name} on {chip.name}: one layer{layer_note}, mbs={args.mbs}, tp={args.tp}, "
            f"sp={'on' if sp else 'off'}, "
            f"attention={args.attention}, recompute={args.recompute}; {sharing(chip)} units "
            f"({chip.tensor.count} tensor, {chip.vector.count} vector)")
    if args.gantt:
        try:
            write_gantt(args.gantt, [("forward", fwd), ("backward", bwd)], head)
        except OSError as exc:
            raise ConfigError("--gantt", None, f"cannot write {args.gantt!r} ({exc.strerror})") from None
        except ValueError as exc:
            raise ConfigError("--gantt", None, f"{exc}") from None
    if args.format == "json":
        system = system_for(args)
        print(json.dumps({"workload": model.name, "chip": chip.name, "system": system.name if system else None,
                          "unit_sharing": sharing(chip), "layer_kind": model.layer_kind or None,
                          "mbs": args.mbs, "tp": args.tp, "sp": sp, "attention": args.attention,
                          "recompute": args.recompute, "forward": fwd.to_dict(), "backward": bwd.to_dict()},
                         indent=2))
        return 0

    def t(x):
        return f"{x * 1e3:.4f} ms" if x >= 1e-3 else f"{x * 1e6:.3f} us"
    rows = [("makespan", lambda s: t(s.makespan_s)), ("status", lambda s: s.status),
            ("lower bound", lambda s: t(s.lower_bound_s)), ("gap", lambda s: f"{100 * s.gap:.4f} %"),
            ("ops", lambda s: str(len(s.ops))), ("solve time", lambda s: f"{s.solve_time_s:.3f} s"
                                                  + (" (cached)" if s.cached else "")),
            ("solver work", lambda s: f"{s.work_s:.2f} of {s.work_limit:g}"),
            ("sequential sum", lambda s: t(s.sequential_sum_s)), ("critical path", lambda s: t(s.critical_path_s))]
    for res in ("tensor", "vector", "link", "chip"):
        if res in fwd.utilisation:
            rows.append((f"utilisation {res}", lambda s, r=res: f"{100 * s.utilisation.get(r, 0.0):.1f} %"))
    print(head)
    print(f"  {'':<20} {'forward':>16} {'backward':>16}")
    for name, f in rows:
        print(f"  {name:<20} {f(fwd):>16} {f(bwd):>16}")
    for label, s in (("forward", fwd), ("backward", bwd)):
        if s.note:
            print(f"  {label}: {s.note}")
    if args.gantt:
        print(f"wrote {args.gantt}")
    return 0


SHOWN_BEST = 5        # single objective: the best designs printed
SHOWN_FRONT = 12      # several objectives: the whole front up to this many designs, else this many of it


def knee(front, objectives, directions) -> int | None:
    """The knee of a Pareto front, as a position in ``front``: the design nearest (Euclidean) the
    ideal point once each objective is normalised to the front's own range (0 its worst value on
    the front, 1 its best), i.e. the one that gives up least on all objectives together. An
    objective that does not vary on the front counts as met; ties go to the first. None when empty."""
    if not len(front):
        return None
    values = front[list(objectives)].to_numpy(dtype=float)
    values = np.where(np.array(directions) == "maximize", values, -values)     # larger is better
    low, span = values.min(axis=0), np.ptp(values, axis=0)
    good = np.divide(values - low, span, out=np.ones_like(values), where=span > 0)
    return int(np.argmin(np.linalg.norm(1.0 - good, axis=1)))


def front_shown(n: int, knee_at: int | None, shown: int = SHOWN_FRONT) -> list[int]:
    """Positions of a front of ``n`` designs to print: all of them up to ``shown``, else ``shown``
    spread evenly along it, the knee always among them."""
    if n <= shown:
        return list(range(n))
    picks = set(np.linspace(0, n - 1, shown).round().astype(int).tolist())
    if knee_at is not None and knee_at not in picks:
        picks.remove(min(picks - {0, n - 1}, key=lambda i: abs(i - knee_at)))
        picks.add(knee_at)
    return sorted(picks)


def _design_lines(r, cfg, keys) -> list[str]:
    """One design of the summary: its chip, then per workload the cluster's and one chip's
    tokens/s, MFU and plan (the search's throughput is the clusters' tokens/s)."""
    lines = [f"    area {r['area_mm2']:.0f} mm², power {r['power_w']:.0f} W, cost ${r['cost_usd']:,.0f}"]
    for w in cfg.workloads:
        name = w.model.name
        tps, mfu, plan = r.get(f"{name}:tokens_per_s"), r.get(f"{name}:mfu"), r.get(f"{name}:plan")
        if tps is None or not math.isfinite(tps) or tps <= 0:
            lines.append(f"    {name} on {w.devices} chips: no plan fits")
            continue
        lines.append(f"    {name} on {w.devices} chips, batch {w.global_batch}: {tps:,.0f} tokens/s per cluster, "
                     f"{tps / w.devices:,.0f} tokens/s per chip, MFU {100 * mfu:.1f} %")
        lines.append(f"      plan {plan}")
    if len(cfg.workloads) > 1:
        lines.append(f"    all workloads: {r['throughput_tokens_per_s']:,.0f} tokens/s per cluster (the "
                     f"weighted geometric mean over the workloads, the throughput searched)")
    return lines


def _search_summary(res, cfg, figures: bool = True) -> None:
    """The end of ``phaze search`` / ``sweep``: where the files are and the best designs, each
    with per-workload cluster and per-chip tokens/s, MFU and plan; with several objectives the
    Pareto front (all of it, or how many of it are shown) with its knee marked (see :func:`knee`)."""
    study = open_study(cfg, res.storage, res.study_name, create=False, heartbeat=False)
    trials = trials_frame(study, cfg.objectives)
    base = baselines_frame(study, cfg.objectives)
    if res.note:
        print(f"stopped early: {res.note}")
    done = trials[trials["state"] == "COMPLETE"] if len(trials) else trials
    evaluated = int(done["evaluated"].astype(bool).sum()) if len(done) else 0
    over = len(done) - evaluated
    print(f"phaze {res.study_name}: {evaluated} designs evaluated"
          + (f" ({over} more proposed over a budget, not evaluated)" if over else "")
          + f" in {res.elapsed_s:.0f} s of search (storage {mask_password(res.storage)})")
    cert = study.user_attrs.get("certificate")
    if cert and cfg.sampler == "exact":
        c = Certificate(**{k: (tuple(v) if k == "objectives" else v) for k, v in cert.items()})
        print("certificate of the exact search (report.md, certificate.csv):")
        for line in c.lines():
            print(f"  {line}")
    knee_at = None
    if len(cfg.objectives) == 1:
        best = best_designs(trials, cfg, SHOWN_BEST) if len(trials) else trials
        feasible = int(done["feasible"].astype(bool).sum()) if len(done) else 0
        if len(best):
            print(f"the {len(best)} best of {feasible} feasible designs by {cfg.objectives[0]}:")
    else:
        front = pareto_frame(trials, cfg.objectives, cfg.directions) if len(trials) else trials
        knee_at = knee(front, cfg.objectives, cfg.directions)
        shown = front_shown(len(front), knee_at)
        best = front.iloc[shown]
        knee_at = shown.index(knee_at) if knee_at is not None else None
        if len(front):
            print(f"Pareto front over {' and '.join(cfg.objectives)}: "
                  + (f"all {len(front)} designs" if len(shown) == len(front) else
                     f"{len(shown)} of {len(front)} designs shown, spread along it")
                  + f", best {cfg.objectives[0]} first; the knee (nearest the ideal point, each objective "
                    f"scaled to the front's range) is marked")
    if not len(best):
        print("no feasible design: see the reasons in trials.csv and report.md")
    keys = [d.key for d in cfg.searched]
    for i, (_, r) in enumerate(best.iterrows()):
        chip = ", ".join(f"{k}={r.get(f'chip:{k}'):g}" for k in keys)
        print(f"  trial {r['trial']}{' (knee)' if i == knee_at else ''}: {chip}")
        for line in _design_lines(r, cfg, keys):
            print(line)
        if r.get("throttled"):
            print(f"    throttled to fit the power budget: {r['throttled']} ran at down to "
                  f"{r['clock_hz'] / 1e9:.2f} GHz")
        per = gains(r, base, [w.model.name for w in cfg.workloads])
        if per:
            print("    tokens/s vs " + ", ".join(
                f"{name} " + ("(no plan)" if g["overall"] is None else f"{100 * g['overall']:+.1f} %")
                for name, g in per.items()))
    print(f"wrote {res.out_dir}/trials.csv, pareto.csv, baselines.csv, report.md"
          + (", report.html and figures" if figures
             else f" (report.html and figures: phaze report {res.out_dir}, or the next run)"))


def cmd_search(args) -> int:
    """``phaze search CONFIG``: the Optuna study over the config's chip space."""
    cfg = override(load_sweep(args.config), trials=args.trials, sampler=args.sampler, seed=args.seed)
    try:
        res = search(cfg, storage=args.storage, study_name=args.study, jobs=args.jobs, progress=not args.quiet,
                     grace_period_s=args.grace_period, figures=not args.no_figures)
    except SearchInterrupted as stop:     # Ctrl-C: the best designs so far, and how to go on
        _search_summary(stop.result, cfg, figures=False)
        print(f"phaze: search interrupted with {stop.result.complete} of {cfg.trials} trials complete "
              f"(the trial in hand is marked failed); the same command resumes the study", file=sys.stderr)
        return 130
    _search_summary(res, cfg, figures=not args.no_figures)
    return 0


def cmd_sweep(args) -> int:
    """``phaze sweep CONFIG``: every design of the space, largest area first."""
    cfg = load_sweep(args.config)
    try:
        res = sweep(cfg, storage=args.storage, study_name=args.study, limit=args.limit, progress=not args.quiet,
                    figures=not args.no_figures)
    except SearchInterrupted as stop:     # Ctrl-C: the best designs so far, and how to go on
        _search_summary(stop.result, cfg, figures=False)
        print(f"phaze: sweep interrupted with {stop.result.complete} designs evaluated (the design in hand is "
              f"marked failed); the same command resumes the sweep", file=sys.stderr)
        return 130
    _search_summary(res, cfg, figures=not args.no_figures)
    return 0


# what damaged stored values raise on reading (LookupError: SQLAlchemy's for an enum column holding
# a name outside it, such as a study direction; KeyError and IndexError are LookupErrors)
DAMAGE = (ValueError, TypeError, AttributeError, LookupError, OverflowError, sqlite3.Error)


@contextlib.contextmanager
def _damage_is_one_line(args, paths):
    """A study's stored data that the report cannot read (a value of the wrong type or range, or
    a database, SQLite or Optuna's storage, that fails to read or commit): one line naming the
    study and what failed, instead of a traceback."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as exc:
        if not (isinstance(exc, DAMAGE) or type(exc).__module__.split(".")[0] in ("optuna", "sqlalchemy")):
            raise
        where = mask_password(args.storage) if args.storage else str(paths[0])
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
        raise ConfigError(where, None, f"the study cannot be reported: a stored value is damaged or was edited "
                          f"by hand ({detail}); allowed: a study as phaze wrote it") from None


def cmd_report(args) -> int:
    """``phaze report STUDY [STUDY]``: the report of a study rebuilt from its storage; with two,
    both on one front."""

    paths = list(args.study_dirs)
    names = list(args.study or [])
    if not paths and not args.storage:
        raise ConfigError("phaze report", None, "name a study folder (results/<study>) or --storage URL --study NAME")
    if paths and args.storage:
        raise ConfigError("--storage", None, "give study folders or --storage with --study, not both")
    if len(paths) > 2 or len(names) > 2:
        raise ConfigError("phaze report", None, "at most two studies are compared")
    if paths and len(names) > len(paths):
        raise ConfigError("--study", None, "one --study per study folder at most")
    with _damage_is_one_line(args, paths):
        if paths:
            opened = [load_study(p, name=names[i] if i < len(names) else None) for i, p in enumerate(paths)]
        else:
            opened = [load_study(storage=args.storage, name=n) for n in (names or [None])]
    out = Path(args.out) if args.out else opened[0][1]
    if args.out and out.exists() and not out.is_dir():
        raise ConfigError("--out", None, f"cannot write into {args.out!r}: not a folder")
    with _damage_is_one_line(args, paths):
        try:
            if len(opened) == 1:
                files = write_study_files(opened[0][0], None, out)
            else:
                files = compare_studies([s for s, _ in opened], out)
        except OSError as exc:      # a read-only folder, a path through a file, a full disk
            where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(out) else ""
            raise ConfigError("--out" if args.out else str(out), None,
                              f"cannot write into {str(out)!r}{where}: {exc.strerror or exc}; allowed: a folder "
                              f"this user can write") from None
    print(f"wrote {out}/: " + ", ".join(sorted(p.name for p in files.values())))
    return 0


def cmd_area(args) -> int:
    """``phaze area``: die area, cost and leakage of a chip; with a workload, its step energy,
    average power and tokens per joule under a plan (phaze/area.py)."""
    chip = as_chip(args.arch)
    si = silicon(chip)
    out = {"chip": chip.name, "process_node_nm": chip.process_node_nm, "silicon": si.to_dict(),
           "coefficients": DEFAULT.to_dict(), "energy": None}
    if args.workload:
        model = as_model(args.workload, args.seq_len)
        eff = efficiency_for(chip, args)
        if args.plan:
            plan = as_plan(args.plan)
            result = evaluate(model, chip, args.devices, args.global_batch, plan, eff)
        else:
            res = place(model, chip, args.devices, args.global_batch, PlacementOptions(), eff, 1)
            if res.best is None:
                raise ConfigError("--arch", None, res.infeasible_reason)
            plan, result = res.best.plan, res.best.result
        ps = _within_limit(model, chip, args.devices, args.global_batch, plan, eff, result, args)
        en = ps.energy
        out["energy"] = dict(en.to_dict(), workload=model.name, devices=args.devices,
                             global_batch=args.global_batch, plan=plan.label(), fits=ps.result.fits)
        out["power"] = ps.to_dict()
    if args.format == "json":
        print(json.dumps(out, indent=2, default=float))
        return 0
    dies = f" in {chip.dies} dies of {si.area_mm2 / chip.dies:.1f} mm²" if chip.dies > 1 else ""
    print(f"{chip.name} ({chip.process_node_nm:g} nm): die {si.area_mm2:.1f} mm²{dies}"
          + (f" (published {chip.area_mm2:g} mm²)" if chip.area_mm2 else " (modelled; no published area)"))
    for k, v in si.area_breakdown_mm2.items():
        print(f"    {k:<14} {v:8.1f} mm²  {100 * v / si.area_mm2:5.1f} %")
    print(f"  cost {si.cost_usd:,.0f} USD: " + ", ".join(f"{k} {v:,.0f}" for k, v in si.cost_breakdown_usd.items())
          + f"; {si.dies_per_wafer:.1f} dies per 300 mm wafer, yield {100 * si.die_yield:.1f} %, "
          f"{si.hbm_stacks} HBM stacks")
    print(f"  leakage {si.leakage_w:.1f} W")
    e = out["energy"]
    if e:
        print(f"  {e['workload']} on {e['devices']} chips, global batch {e['global_batch']}, plan {e['plan']}:")
        print(f"    energy per step {e['energy_per_step_j'] / 1e3:,.2f} kJ per device over "
              f"{e['step_time_s']:.3f} s: average power {e['power_w']:.1f} W"
              + (f" (TDP {chip.tdp_w:g} W)" if chip.tdp_w else "") + f", {e['tokens_per_joule']:.3f} tokens/J, "
              f"{1e3 / e['tokens_per_joule']:.3f} mJ per token")
        print(f"    clock {ps.note()}")
        for k, v in e["breakdown_j"].items():
            print(f"    {k:<14} {v / e['step_time_s']:8.1f} W  {100 * v / e['energy_per_step_j']:5.1f} %")
    return 0


def _listed(kind: str, name: str, path: Path) -> dict:
    """One row of ``phaze list``: the file's name and what it describes, in SI-named fields."""
    if kind == "workloads":
        m = as_model(path)
        return {"name": name, "model": m.name, "params": m.params, "active_params": m.active_params,
                "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
                "experts": m.experts, "top_k": m.top_k, "vocab": m.vocab, "seq_len": m.seq_len,
                "precision": m.precision,
                # a hybrid's layers by kind (M Mamba-2, * attention, - MLP, E experts: hybrid_pattern)
                "layer_kinds": " ".join(f"{k}{n}" for k, n in m.hybrid_counts.items()) if m.hybrid else ""}
    if kind == "chips":
        c = as_chip(path)
        return {"name": name, "chip": c.name, "kind": c.kind, "execution": c.execution,
                "peak_bf16_flops": c.peak_flops("bf16"), "hbm_bytes": c.hbm_bytes,
                "hbm_bandwidth_bytes_per_s": c.hbm_bandwidth_bytes_per_s, "clock_hz": c.clock_hz,
                "tdp_w": c.tdp_w or ""}
    s = as_system(path)
    return {"name": name, "system": s.name, "devices_per_node": s.devices_per_node,
            "intra_node": s.intra_node_name,
            "intra_node_bandwidth_bytes_per_s": s.intra_node_bandwidth_bytes_per_s or "",
            "inter_node": s.inter_node_name, "nics_per_node": s.nics_per_node,
            "nic_bandwidth_bytes_per_s": s.nic_bandwidth_bytes_per_s, "topology": s.topology}


def _list_text(kind: str, row: dict) -> str:
    """A row of ``phaze list``'s text table, in the units a reader expects."""
    if kind == "workloads":
        moe = f"{row['experts']} experts, top-{row['top_k']}" if row["experts"] else ""
        active = f" ({row['active_params'] / 1e9:.2f} B active)" if row["experts"] else ""
        heads = (f"{row['layer_kinds']:<16}" if row["layer_kinds"]
                 else f"{row['heads']:>4}/{row['kv_heads']:<4} heads   ")
        return (f"{row['name']:<26} {row['model']:<28} {row['params'] / 1e9:9.2f} B{active:<17} "
                f"{row['layers']:>4} x {row['hidden']:<6} {heads} seq {row['seq_len']:<6} {moe}").rstrip()
    if kind == "chips":
        tdp = f"{row['tdp_w']:g} W" if row["tdp_w"] else "no TDP"
        return (f"{row['name']:<22} {row['chip']:<24} {row['peak_bf16_flops'] / 1e12:7.1f} TFLOP/s bf16  "
                f"{row['hbm_bytes'] / 2 ** 30:6.1f} GiB at {row['hbm_bandwidth_bytes_per_s'] / 1e12:5.2f} TB/s  "
                f"{row['clock_hz'] / 1e9:5.2f} GHz  {tdp:<7} {row['execution']}")
    intra = (f"{row['intra_node'] or 'intra-node'} {row['intra_node_bandwidth_bytes_per_s'] / 1e9:g} GB/s, "
             if row["intra_node_bandwidth_bytes_per_s"] else "")
    return (f"{row['name']:<22} {row['devices_per_node']:>4} devices a node, {intra}{row['nics_per_node']} x "
            f"{row['nic_bandwidth_bytes_per_s'] / 1e9:g} GB/s {row['inter_node']} a node ({row['topology']})")


def cmd_list(args) -> int:
    """``phaze list``: the shipped workloads, chips or systems (and those of ./workloads,
    ./arch_configs, ./system_configs), each with what it describes; csv for a script."""
    rows = [_listed(args.kind, name, path) for name, path in shipped(args.kind).items()]
    if args.format == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]) if rows else ["name"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return 0
    for row in rows:
        print(_list_text(args.kind, row))
    flag = {"workloads": "--workload", "chips": "--arch", "systems": "--system"}[args.kind]
    print(f"{len(rows)} {args.kind}; the name goes to {flag}")
    return 0


def _power_args(p) -> None:
    p.add_argument("--power-limit", type=_watts, default=None, metavar="W",
                   help="the chip's power limit; above it the clock drops until the step fits "
                        "(default: the chip's TDP)")


def _framework_arg(p) -> None:
    p.add_argument("--framework", metavar="NAME",
                   help="a training framework's defaults (" + ", ".join(FRAMEWORKS) + "): "
                   "attention kernel, collective overlap, ZeRO, fp32 reduction, execution model; what you "
                   "set yourself wins")


def _system_args(p) -> None:
    p.add_argument("--system", default=None, metavar="NAME|PATH",
                   help="cluster: shipped system (dgx-a100-superpod, dgx-h100-superpod, cluster-100g, "
                        "tpuv4-multislice, tpuv5e-multislice, tpuv5p-multislice) or a YAML path (default: the "
                        "chip file's links)")
    p.add_argument("--devices-per-node", type=_positive_int, default=None, metavar="N",
                   help="override the system's devices per node (a pod slice's chips); a network quoted per "
                        "device keeps its bandwidth per device")
    p.add_argument("--nics-per-node", type=_positive_int, default=None, metavar="N",
                   help="override the system's NICs per node")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="phaze", description="Co-design a training accelerator and how LLMs train on it.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    ev = sub.add_parser("evaluate", help="step time, throughput, MFU and memory of one plan")
    ev.add_argument("--workload", required=True, help=_WORKLOAD_HELP)
    ev.add_argument("--arch", required=True, help="shipped chip name (a100-80gb) or a YAML path")
    ev.add_argument("--devices", required=True, type=_devices, help="number of devices")
    ev.add_argument("--global-batch", required=True, type=_batch, help="sequences per step")
    ev.add_argument("--plan", default="", help="e.g. tp=8,pp=16,mbs=1,recompute=full; keys: tp, pp, mbs, "
                    "recompute (none/selective/op/full/block), recompute_layers (block: layers re-run whole, one "
                    "count or one per stage), recompute_modules (selective: Megatron-Core modules joined by '+', "
                    "core_attn/moe_act/layernorm/mla_up_proj/mlp/moe/shared_experts), sp, vp, cp, cp_comm "
                    "(p2p/all_gather/a2a/a2a+p2p/torch), cp_a2a (a2a+p2p: ranks of an all-to-all group), "
                    "zero (0-3), "
                    "attention (flash/flash2/standard), "
                    "optimizer (adam/adam-megatron/adam-megatron-pa/adam-megatron-pa-bf16/adam-deepspeed/sgd), "
                    "dp_overlap, tp_overlap, tp_async, reduce_fp32, loss (torch/megatron/fused/te), "
                    "grad_accum_fusion (adam-megatron*), dp_shard (all/node/N, zero 1-3), "
                    "fsdp_pp (micro_batch/step: zero 3 with pp > 1), fp8_params (an fp8 run's weights held "
                    "and gathered in fp8), pipe_p2p (batched/blocking/overlapped: how pipeline stages "
                    "exchange activations), pipe_schedule (1f1b/dualpipe: DeepSeek-V3's bidirectional "
                    "pipeline), offload (qkv_proj: with recompute=full, the q, k, v projections' outputs "
                    "kept on the host), schedule (optimal/sequential), "
                    "stages (24:24:24:24), stage_recompute (full:none:none:none), and for a mixture of "
                    "experts ep, etp, routing (forced/dropless/capacity), dispatcher (alltoall/deepep), "
                    "ep_overlap, shared_overlap (shared experts beside the all-to-alls); "
                    "default tp=1,pp=1,mbs=1")
    ev.add_argument("--seq-len", type=_seq_len, default=None, help="override the sequence length")
    ev.add_argument("--memory-reserve", type=_gib, default=None, metavar="GIB",
                    help="GiB per device kept free for the runtime (default: the chip's modelled reserve)")
    ev.add_argument("--format", choices=("text", "json"), default="text")
    ev.add_argument("--allow-oom", action="store_true", help="print the result even if it does not fit")
    ev.add_argument("--params", help="efficiency parameters from 'phaze calibrate' (default: shipped)")
    ev.add_argument("--ideal", action="store_true", help="ideal datasheet machine: no efficiency losses")
    ev.add_argument("--schedule", choices=("optimal", "sequential"), default=None,
                    help="layer time from the CP-SAT schedule (default) or the sum of the operators")
    _framework_arg(ev)
    _system_args(ev)
    _power_args(ev)
    ev.set_defaults(func=cmd_evaluate)

    va = sub.add_parser("validate", help="compare predicted and published step times")
    va.add_argument("--runs", help="CSV of published runs (default: the bundled reference runs)")
    va.add_argument("--params", help="efficiency parameters (default: the shipped calibration)")
    va.add_argument("--out", help="write one row per run: run_id, measured, predicted, error, status, "
                    "the plan and the fit that scored it")
    va.add_argument("--plot", help="write predicted vs measured (PNG or SVG)")
    va.add_argument("--format", choices=("text", "json"), default="text")
    va.add_argument("--group", action="append", default=[], metavar="NAME=SRC,SRC",
                    help="also report the rows of these sources together (source_id prefixes)")
    va.add_argument("--no-loso", action="store_true", help="skip the leave-one-source-out refits")
    va.add_argument("--hold-out", default=None, metavar="SRC,SRC",
                    help="source ids left out of every fit and table (default: the bundled sets' frozen "
                         "split; 'none' holds nothing out)")
    va.add_argument("--score-held-out", action="store_true",
                    help="score the held-out sources (once, at the end of a round of modelling)")
    va.add_argument("--unseen", default="A100:H100", metavar="TRAIN:TEST",
                    help="calibrate on one chip family, predict another (default A100:H100; '' skips)")
    va.add_argument("--jobs", type=_positive_int, default=1,
                    help="fits run at once, in worker processes (default 1; the results do not depend on it)")
    va.set_defaults(func=cmd_validate)

    pl = sub.add_parser("place", help="the best data/tensor/pipeline layout, micro-batch and recompute")
    pl.add_argument("--workload", required=True, help=_WORKLOAD_HELP)
    pl.add_argument("--arch", required=True, help="shipped chip name or a YAML path")
    pl.add_argument("--devices", required=True, type=_devices, help="number of devices")
    pl.add_argument("--global-batch", required=True, type=_batch, help="sequences per step")
    pl.add_argument("--top", type=_top, default=5, help="runner-up plans to list (default 5)")
    pl.add_argument("--tp", type=_int_list, default=(1, 2, 4, 8), help="tensor-parallel widths (default 1,2,4,8)")
    pl.add_argument("--mbs", type=_int_list, default=(), help="micro-batch sizes (default: every divisor of a "
                    "replica's batch, up to 128 without a pipeline and 8 with one)")
    pl.add_argument("--pp", type=_int_list, default=None, help="pipeline depths (default: every divisor)")
    pl.add_argument("--vp", type=_int_list, default=None,
                    help="interleaved chunks per stage (default: every vp Megatron accepts for the layers, up to 8)")
    pl.add_argument("--cp", type=_int_list, default=None,
                    help="context-parallel widths (default 1; from 16K tokens also every power of two leaving "
                         "4K tokens per rank)")
    pl.add_argument("--recompute", type=_recompute_list, default=None,
                    help="recompute modes each stage may use (default none,selective,full,block; op: "
                         "torchtitan's per-op policy; block: the fewest layers re-run whole that fit, the "
                         "others nothing, Megatron's --recompute-method block)")
    pl.add_argument("--recompute-modules", type=_modules_list, default=None, metavar="M+M",
                    help="what a selective stage re-runs, Megatron-Core's --recompute-modules joined by '+' "
                         "(core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts; default: "
                         "the framework's, else Megatron-LM's selective recompute of an unfused core attention)")
    pl.add_argument("--ep", type=_int_list, default=None,
                    help="expert-parallel widths of a mixture of experts (default: the powers of two dividing "
                         "the experts; 1 for a dense model)")
    pl.add_argument("--etp", type=_int_list, default=None,
                    help="expert tensor-parallel widths of a mixture of experts (default 1 and tp)")
    pl.add_argument("--routing", type=_subset_list(ROUTING), default=None,
                    help="MoE routings to search: forced, dropless, capacity (default: the model's own)")
    pl.add_argument("--dispatcher", type=_subset_list(DISPATCHERS), default=None,
                    help="MoE token dispatchers to search: alltoall, deepep (default: alltoall)")
    pl.add_argument("--ep-overlap", type=_switch_list, default=None, metavar="off,on",
                    help="MoE all-to-all overlap (Megatron-Core's --overlap-moe-expert-parallel-comm) to search: "
                         "off, on or both (default: off)")
    pl.add_argument("--shared-overlap", choices=("on", "off"), default=None,
                    help="a mixture of experts' shared experts beside the token all-to-alls (Megatron-Core's "
                         "--moe-shared-expert-overlap), in the plans that allow it; default off (the nemo "
                         "presets': on)")
    pl.add_argument("--zero", type=_zero_list, default=None,
                    help="ZeRO stages to search (default 0,1: none and the distributed optimizer; 0,1,2,3 all)")
    pl.add_argument("--dp-shard", type=_dp_shard, default=None, metavar="all,node,N",
                    help="data-parallel ranks of a ZeRO shard group (zero 1-3): all (default), node (those inside "
                         "one node or pod slice: hybrid sharding, replicated across nodes) or N; several, "
                         "comma-separated, are searched")
    pl.add_argument("--cp-comm", type=_cp_comm, default=None, metavar=",".join(CP_COMMS),
                    help="how context parallelism exchanges K and V: p2p (default; a ring), all_gather, a2a "
                         "(Ulysses), a2a+p2p (Ulysses in groups, a ring across them: every group size searched) "
                         "or torch (PyTorch's context parallel); several, comma-separated, are searched")
    pl.add_argument("--pipe-schedule", type=_pipe_schedule, default=None, metavar=",".join(PIPE_SCHEDULES),
                    help="pipeline schedules to rank: 1f1b (default; interleaved when vp > 1, every stage split "
                         "searched) and dualpipe (DeepSeek-V3's bidirectional schedule: even pp, no "
                         "interleaving, the even split with one recompute mode for every stage); both, "
                         "comma-separated, are searched")
    pl.add_argument("--offload", type=_offload, default=None, metavar="none,qkv_proj",
                    help="activations a full recompute keeps on the host: none (default) or qkv_proj (MaxText's "
                         "qkv_proj_offloaded: the q, k, v projections' outputs), on a chip file with a host link; "
                         "both, comma-separated, are searched, an offloading plan recomputing every stage in full")
    pl.add_argument("--fsdp-pp", choices=FSDP_PP, default=None,
                    help="how FSDP (zero 3) holds a pipeline stage's weights: micro_batch (default; gathered "
                         "for every micro-batch) or step (gathered once per step and kept whole with the "
                         "gradients, as PyTorch's pipeline schedules run FSDP2; the torchtitan preset's)")
    pl.add_argument("--fp8-params", choices=("on", "off"), default=None,
                    help="an fp8 run: hold the linear weights in fp8 and gather them in fp8 (Megatron-Core's "
                         "--fp8-param-gather; the nemo presets'); default off: 16-bit weights")
    pl.add_argument("--attention", choices=("flash", "flash2", "standard"), default=None,
                    help="attention kernel (default flash)")
    pl.add_argument("--reduce-fp32", action="store_true", help="fp32 gradients and reduction (Megatron's "
                    "--accumulate-allreduce-grads-in-fp32)")
    pl.add_argument("--memory-reserve", type=_gib, default=None, metavar="GIB",
                    help="GiB per device kept free for the runtime (default: the chip's modelled reserve)")
    pl.add_argument("--baseline", help="score this plan as the baseline (default: the best Megatron-style "
                                       "plan: tp over the node, even split, one recompute mode)")
    pl.add_argument("--seq-len", type=_seq_len, default=None, help="override the sequence length")
    pl.add_argument("--format", choices=("text", "json"), default="text")
    pl.add_argument("--params", help="efficiency parameters (default: shipped calibration)")
    pl.add_argument("--ideal", action="store_true", help="ideal datasheet machine")
    _framework_arg(pl)
    _system_args(pl)
    _power_args(pl)
    pl.set_defaults(func=cmd_place)

    ca = sub.add_parser("calibrate", help="fit the efficiency parameters on published runs")
    ca.add_argument("--runs", help="CSV of published runs (default: the bundled reference runs)")
    ca.add_argument("--out", required=True, help="parameter file to write (JSON)")
    ca.add_argument("--hold-out", default=None, metavar="SRC,SRC",
                    help="source ids not fitted on (default: the bundled sets' frozen split; 'none' fits all)")
    ca.add_argument("--jobs", type=_positive_int, default=1,
                    help="fits run at once, in worker processes (default 1; the results do not depend on it)")
    ca.set_defaults(func=cmd_calibrate)
    sc = sub.add_parser("schedule", help="optimal operator schedule of one layer on one chip (CP-SAT)")
    sc.add_argument("--workload", required=True, help=_WORKLOAD_HELP)
    sc.add_argument("--arch", required=True, help="shipped chip name (tpuv4) or a YAML path")
    sc.add_argument("--mbs", type=_positive_int, default=1, help="micro-batch size (default 1)")
    sc.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel width (default 1)")
    sc.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                    help="sequence parallelism (default: on when tp > 1)")
    sc.add_argument("--attention", choices=("flash", "flash2", "standard"), default="flash",
                    help="attention kernel (default flash)")
    sc.add_argument("--recompute", choices=RECOMPUTE, default="none")
    sc.add_argument("--seq-len", type=_seq_len, default=None, help="override the sequence length")
    sc.add_argument("--layer-kind", choices=("mamba", "attention", "mlp", "moe"), default=None,
                    help="a hybrid's kind of layer to schedule (default: its first layer's)")
    sc.add_argument("--work-limit", type=float, default=WORK_LIMIT,
                    help="solver work per phase, in CP-SAT's deterministic time: the same answer on every "
                         f"machine (default {WORK_LIMIT:g}, about 10 s of one slow core)")
    sc.add_argument("--time-limit", type=float, default=TIME_LIMIT_S,
                    help=f"wall seconds per phase, a safety net that the output names when it stops the "
                         f"solver first (default {TIME_LIMIT_S:g})")
    sc.add_argument("--format", choices=("text", "json"), default="text")
    sc.add_argument("--gantt", help="write a Gantt chart of both phases (PNG, SVG, PDF)")
    sc.add_argument("--params", help="efficiency parameters from 'phaze calibrate' (default: shipped)")
    sc.add_argument("--ideal", action="store_true", help="ideal datasheet machine: no efficiency losses")
    _system_args(sc)
    sc.set_defaults(func=cmd_schedule)
    se = sub.add_parser("search", help="search chip designs for training throughput (Optuna study)")
    se.add_argument("config", help="sweep config (search/quickstart.yaml)")
    se.add_argument("--trials", type=_positive_int, default=None,
                    help="complete trials the study should hold (default: the config's)")
    se.add_argument("--sampler", default=None,
                    help="tpe, nsga2, gp, random, grid or exact (the proven best; default: the config's)")
    se.add_argument("--seed", type=_nonnegative_int, default=None, help="sampler seed (default: the config's)")
    se.add_argument("--storage", default=None, help="Optuna storage URL (default sqlite:///results/<study>/study.db)")
    se.add_argument("--study", default=None, type=_study_name, help="study name (default: the config's name)")
    se.add_argument("--jobs", type=_positive_int, default=1, help="worker processes (default 1)")
    se.add_argument("--quiet", action="store_true", help="no progress bar")
    se.add_argument("--grace-period", type=_positive_int, default=30, metavar="S",
                    help="seconds without a heartbeat after which a worker's trial is failed and retried (default 30)")
    se.add_argument("--no-figures", action="store_true",
                    help="write the tables and report.md but not report.html and the figures (a fleet's workers; "
                         "'phaze report' draws them once)")
    se.set_defaults(func=cmd_search)
    sw = sub.add_parser("sweep", help="evaluate every design of a sweep config, largest area first")
    sw.add_argument("config", help="sweep config")
    sw.add_argument("--limit", type=_positive_int, default=None, help="evaluate only the N largest designs")
    sw.add_argument("--storage", default=None, help="Optuna storage URL (default sqlite:///results/<study>/study.db)")
    sw.add_argument("--study", default=None, type=_study_name, help="study name (default: <config name>-sweep)")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    sw.add_argument("--no-figures", action="store_true",
                    help="write the tables and report.md but not report.html and the figures (a fleet's workers; "
                         "'phaze report' draws them once)")
    sw.set_defaults(func=cmd_sweep)
    rp = sub.add_parser("report", help="the plotted report of a study (report.md, report.html, figures)")
    rp.add_argument("study_dirs", nargs="*", metavar="STUDY",
                    help="a study folder (results/<study>) or its study.db; two compare the studies on one front")
    rp.add_argument("--storage", default=None, help="an Optuna storage URL instead of a folder")
    rp.add_argument("--study", action="append", default=None, metavar="NAME", type=_study_name,
                    help="study name in the storage (repeat to compare two)")
    rp.add_argument("--out", default=None, help="folder to write into (default: the (first) study's folder)")
    rp.set_defaults(func=cmd_report)
    ar = sub.add_parser("area", help="die area, cost and power of a chip (area, power and cost model)")
    ar.add_argument("--arch", required=True, help="shipped chip name (tpuv4) or a YAML path")
    ar.add_argument("--workload", default=None, help="also the step energy and power of this workload "
                    "(e.g. gpt3-175b)")
    ar.add_argument("--devices", type=_devices, default=1024, help="devices (default 1024)")
    ar.add_argument("--global-batch", type=_batch, default=1536, help="sequences per step (default 1536)")
    ar.add_argument("--plan", default="", help="execution plan (default: phaze place's best plan)")
    ar.add_argument("--seq-len", type=_positive_int, default=None, help="override the sequence length")
    ar.add_argument("--format", choices=("text", "json"), default="text")
    ar.add_argument("--params", help="efficiency parameters (default: shipped calibration)")
    ar.add_argument("--ideal", action="store_true", help="ideal datasheet machine")
    _power_args(ar)
    ar.set_defaults(func=cmd_area)
    ls = sub.add_parser("list", help="the shipped workloads, chips or systems, with what each describes")
    ls.add_argument("kind", choices=tuple(SHIPPED_KINDS),
                    help="workloads (--workload), chips (--arch) or systems (--system)")
    ls.add_argument("--format", choices=("text", "csv"), default="text",
                    help="text: a table in B, TFLOP/s, GiB, GB/s; csv: the SI fields (default text)")
    ls.set_defaults(func=cmd_list)
    return parser


def _stdout_closed() -> int:
    """The reader of our output went away (``phaze ... | head -1``): one line, status 2, and
    stdout pointed at /dev/null so that the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    print("phaze: error: stdout: closed by the reader before the end of the output (broken pipe)",
          file=sys.stderr)
    return 2


def _reader_left() -> bool:
    """Whether stdout is a pipe whose reader has already gone when the command ends. Output
    that fits in the pipe's buffer is written without error even when the reader then leaves
    (``| head -1`` on a short printout): that output was delivered, and the status stays 0;
    waiting to see whether the reader leaves would cost every ``| grep`` the wait."""
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poll = select.poll()
        poll.register(fd, select.POLLERR)   # a pipe's write end reports POLLERR once no reader is left
        return any(event & (select.POLLERR | select.POLLHUP) for _, event in poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with interruptible():       # Ctrl-C raised in phaze's code only, never lost in a library's
            code = args.func(args)
        sys.stdout.flush()
        if code == 0 and _reader_left():
            return _stdout_closed()
        return code
    except ConfigError as exc:
        print(f"phaze: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        kept = fitstore.counts()["fitted"] if args.func in (cmd_validate, cmd_calibrate) else 0
        resume = (f"; the {kept} fits it finished are kept: the same command resumes"
                  if kept and fitstore.fits_dir() is not None else "")
        print(f"phaze: interrupted{resume}", file=sys.stderr)
        return 130
    finally:
        if argv is None:    # the process ends here: a Ctrl-C now would only cut its exit short
            signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
