"""Published training runs read as cases, the input of validation (:mod:`phaze.validate`).

Each CSV row becomes a case: the row's model, its chip, its own layout, and its measured metric
converted to seconds per step with its source's FLOP convention. Rows phaze cannot express are
kept as skipped, with the reason.

Only structured columns are read; the free-text ``notes`` column never reaches the model. The
project's copy of the reference CSVs carries explicit columns (:data:`EXPLICIT_COLUMNS`: chip,
attention kernel, ZeRO/FSDP stage, vocabulary, kv heads, precision, ...), each filled from the
row's source (``phaze/data/reference/README.md``). A CSV without them (or with a blank) gets the
documented defaults, never a value guessed from the row id. A ``framework`` column naming a
preset (:mod:`phaze.framework`: attention kernel, tp_async, tp overlap, ZeRO stage, fp32 reduction,
dropout, selective policy, execution model, vocabulary padding, interleaving of a pipelined row
without vp) fills the blanks first; a ``model`` naming a shipped dense workload of the row's
shape brings its vocabulary, kv heads, activation and norm. Otherwise:
``ffn_hidden`` = 4·hidden; an FFN width that is not a whole multiple of hidden is gated (SwiGLU);
``vocab`` :data:`DEFAULT_VOCAB`; kv heads = heads; a row whose micro-batch is not stated is
scored with the fastest of :data:`SEARCHED_MICRO_BATCHES` that fits, as a tuned run would use,
and marked ``searched`` (it weighs half in fits); a row without tp or pp (and without the dp
that would give it) takes the tp, pp and cp of the best Megatron-style plan
:func:`phaze.placement.place` finds for it within what it states, also ``searched`` (a row
without its global batch is skipped: the step's size is unknown); a pipelined row without vp
whose framework is not a preset is scored so over the vp values Megatron accepts, and one whose ZeRO stage and
framework are both blank over ZeRO 0 and 1 (the distributed optimizer costs no time); recompute:
the least of none, the framework's selective policy, block (where the framework has it) and full
with which a plan the row allows fits (``selective`` is Megatron's core-attention recompute unless
``selective_recompute`` says ``op``; block re-runs the fewest layers of each stage whole that fit),
``searched`` when not none, and each other plan the row allows competes with the least recompute
with which it fits (a tuned run recomputes more where that lets a faster interleaving or
micro-batch fit), except where the measured FLOPs count the recompute (``narayanan96``,
``narayanan24k``); a row
that says block without ``recompute_layers``: the fewest that fit, ``searched``; sequence
parallelism on when tp > 1 unless the preset says off; ZeRO stage 0; attention ``flash`` (the
framework's fused kernel); no dropout; no fp32 reduction; no tensor-parallel overlap and no
asynchronous backward collectives; model-FLOP convention; MFU over the chip's 16-bit peak.
A row without a shape that names a shipped workload is resolved to it.

Mixture of experts: a row whose ``model`` names a shipped MoE workload is an MoE case with that
workload's experts, even when the row gives its own shape (its ``ffn_hidden`` is then the
per-expert FFN); a row with ``num_experts`` and ``moe_top_k`` is an MoE of its own shape. ``ep``,
``etp``, ``moe_routing``, ``moe_dispatcher``, ``moe_a2a_overlap`` and the other MoE columns come
from the row; without ``ep``, the widest ep inside one node that divides the experts and
tp·cp·dp/etp (:func:`_expert_plan`), and the case is marked ``unconfirmed`` (it weighs half in
fits); routing defaults to ``dropless`` (``capacity`` with a capacity factor), the dispatcher to
``alltoall``. A row naming a catalogued MoE model phaze does not ship (``moe_models.csv``), or a
state-space or hybrid model (``unmodelled_models.csv``), is skipped with the reason, and so is a
row whose ``params_b`` is over :data:`PARAMS_GUARD` times the dense model its shape gives (parts
the row does not describe).
"""
from __future__ import annotations

import csv
import dataclasses
import itertools
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .arch import EXECUTION, Chip, load_chip
from .calibrate import calibrated_efficiency
from .catalogue import PEFT_REASON, catalogue, find_workload, load_model, name_keys, peft_error
from .configio import ConfigError
from .framework import Framework, model_with, options_with, padded_vocab, plan_settings, resolve_framework
from .placement import PlacementOptions, place, vp_values
from .plan import (
    DP_SHARD_ALLOWED,
    FSDP_PP,
    LOSSES,
    OFFLOADS,
    PIPE_SCHEDULES,
    RECOMPUTE_MODULES,
    Plan,
    cp_comm_value,
    dp_shard_value,
    hides_dp_reduction,
    ordered_modules,
    shared_overlap_conflict,
)
from .plan_check import check_offload, check_plan, stage_split
from .step import evaluate, model_flops_per_sample
from .system import apply_system, load_system, with_devices_per_node
from .workload import (
    ACTIVATIONS,
    GATED_ACTIVATIONS,
    KV_REPEATS,
    PARALLEL_BLOCKS,
    ROTARY_KERNELS,
    SOFTMAX_KERNELS,
    Model,
    mtp_error,
    parallel_block_error,
    router_groups_error,
    with_seq_len,
)

REQUIRED_COLUMNS = (
    "run_id", "source_id", "gpu", "gpu_count", "model", "layers", "hidden", "heads", "ffn_hidden",
    "seq_len", "global_batch", "micro_batch", "tp", "pp", "dp", "cp", "vp", "sequence_parallel",
    "recompute", "precision", "measured_metric", "measured_value")
# optional, structured columns (the project's copies carry all of them; blank = not stated)
EXPLICIT_COLUMNS = (
    "chip", "framework", "system", "attention_kernel", "zero_stage", "vocab", "kv_heads", "head_dim",
    "activation", "dropout", "compute_precision", "grad_reduce_fp32", "tp_comm_overlap",
    "flop_convention", "mfu_peak_tflops", "num_experts", "moe_top_k", "unconfirmed", "system_config",
    "ep", "etp", "moe_ffn_hidden", "shared_experts", "shared_expert_ffn_hidden", "moe_capacity_factor",
    "moe_routing", "moe_dispatcher", "moe_a2a_overlap", "tp_async", "selective_recompute", "packed_documents",
    "execution", "recompute_layers", "moe_router_groups", "moe_router_group_topk", "devices_per_node",
    "grad_accum_fusion", "dp_shard", "cp_comm", "cp_a2a", "mtp_layers", "parallel_block", "fsdp_pp",
    "fp8_param_gather", "rotary_kernels", "kv_repeat", "softmax_kernel", "pipeline_schedule",
    "moe_shared_expert_overlap", "cross_entropy", "offload", "peft")
# standard columns that are optional: the nominal size, read only by the guard on unmodelled parts;
# the source's title and locator, read only for the framework they name when the row names none
# (:func:`row_framework`)
OPTIONAL_COLUMNS = ("params_b", "source_title", "source_locator")
# every column the model may read; ``notes`` (free text) is not among them
MODEL_COLUMNS = REQUIRED_COLUMNS + EXPLICIT_COLUMNS + OPTIONAL_COLUMNS
# a row whose params_b exceeds the dense model its shape gives by this factor has parts the row
# does not describe (experts, another architecture): it is skipped unless it resolved to experts
PARAMS_GUARD = 1.5
METRICS = ("tflops_per_gpu", "mfu", "tokens_per_s_per_gpu", "tokens_per_s_total", "step_time_s")
CONVENTIONS = ("model", "narayanan96", "6n_12lqs", "model_causal", "narayanan24k")
RECOMPUTE_CONVENTIONS = ("narayanan96", "narayanan24k")   # those that count a recompute's FLOPs
# a row that does not state its micro-batch: these are tried, the fastest that fits counts
SEARCHED_MICRO_BATCHES = (1, 2, 4, 8)
DEFAULT_VOCAB = 51200   # GPT-2 BPE padded to a multiple of 1024 (Megatron's default); see module doc
_TRUE = ("yes", "true", "1", "on", "y")
_FALSE = ("no", "false", "0", "off", "n")
# the names people give the attention kernels and ZeRO stages, reduced to letters and digits
# (``FlashAttention-2``, ``flash_attn``, ``ZeRO-1``, ``FULL_SHARD``) -> the column's own values; an
# unversioned "FlashAttention" is not among them (the framework's fused kernel or the flash-attn
# library's: the column's two values) and is refused with the rest
ATTENTION_NAMES = {"flash": "flash", "flash2": "flash2", "standard": "standard",
                   "flashattention2": "flash2", "flashattn2": "flash2", "fa2": "flash2", "flashattn": "flash2",
                   "fused": "flash", "te": "flash", "cudnn": "flash", "transformerengine": "flash",
                   "unfused": "standard", "none": "standard", "math": "standard", "eager": "standard"}
ZERO_NAMES = {"ddp": 0, "none": 0, "no": 0, "distributedoptimizer": 1, "distopt": 1,
              "shardgradop": 2, "fsdp": 3, "fsdp1": 3, "fsdp2": 3, "fullshard": 3}
_RECOMPUTE = {"full": "full", "uniform": "full", "block": "block", "selective": "selective",
              "none": "none", **{t: "full" for t in _TRUE}, **{f: "none" for f in _FALSE}}
# GPU names of the reference data and their usual spellings -> shipped chip file. Exact names
# only: a GPU that is not listed (PCIe, NVL, a power-limited variant, ...) is skipped with
# the reason unless the row names its chip file in the ``chip`` column.
GPU_CHIPS = {
    "a100-sxm4-80gb": "a100-80gb", "a100-sxm-80gb": "a100-80gb", "a100-80gb": "a100-80gb",
    "a100-80gb-sxm": "a100-80gb",
    "a100-sxm4-40gb": "a100-40gb", "a100-sxm-40gb": "a100-40gb", "a100-40gb": "a100-40gb",
    "a100-40gb-sxm": "a100-40gb",
    "h100-sxm5-80gb": "h100-sxm", "h100-sxm": "h100-sxm", "h100-sxm5": "h100-sxm",
    "h100-80gb-hbm3": "h100-sxm", "h100-sxm-80gb": "h100-sxm", "h100-sxm5-80gb-hbm3": "h100-sxm",
    "h100-hbm2e-96gb-500w": "h100-hbm2e-96gb-500w",
    "h200-sxm-141gb": "h200-sxm", "h200-sxm": "h200-sxm", "h200-141gb": "h200-sxm",
    "h200-sxm5-141gb": "h200-sxm",
    "tpuv4": "tpuv4", "tpu-v4": "tpuv4",
    "tpuv5e": "tpuv5e", "tpu-v5e": "tpuv5e", "tpuv5p": "tpuv5p", "tpu-v5p": "tpuv5p",
    "v100-sxm2-32gb": "v100-sxm2-32gb", "tesla-v100-sxm2-32gb": "v100-sxm2-32gb", "v100-32gb-sxm2": "v100-sxm2-32gb",
    "b200": "b200", "b200-180gb": "b200", "b200-sxm": "b200", "b200-sxm-180gb": "b200", "b200-sxm6-180gb": "b200",
    "hgx-b200": "b200", "dgx-b200": "b200",
    # NVIDIA's systems by their one GPU (the DGX H100 and H200 and HGX datasheets: eight SXM5 parts; DGX
    # A100 by its total memory, 320 GB of 40 GB parts or 640 GB of 80 GB ones)
    "dgx-h100": "h100-sxm", "hgx-h100": "h100-sxm", "dgx-h200": "h200-sxm", "hgx-h200": "h200-sxm",
    "dgx-a100-640gb": "a100-80gb", "dgx-a100-320gb": "a100-40gb", "dgx-a100-80gb": "a100-80gb",
    "dgx-a100-40gb": "a100-40gb",
    "gb200": "gb200", "gb200-186gb": "gb200", "gb200-nvl72": "gb200", "gb200-nvl72-186gb": "gb200",
}
# the names the drivers report, which a run's log quotes: nvidia-smi's and CUDA's (``NVIDIA
# A100-SXM4-80GB``, ``NVIDIA H100 80GB HBM3``, ``Tesla V100-SXM2-32GB``, ``NVIDIA H200``, the
# SXM part, where the NVL one is ``NVIDIA H200 NVL``) and Cloud TPU's (``TPU v5 lite``, its
# ``v5litepod`` slices: TPU v5e): the vendor's prefix is dropped before the lookup
_VENDOR = re.compile(r"^(?:nvidia|tesla|google|cloud)-")
GPU_CHIPS.update({"h200": "h200-sxm", "tpu-v5-lite": "tpuv5e", "tpu-v5-litepod": "tpuv5e", "v5litepod": "tpuv5e"})


def chip_for_gpu(gpu: str) -> str | None:
    """The shipped chip file for a `gpu` column, by exact (normalised) name, or None. A vendor's
    prefix (``NVIDIA``, ``Tesla``, ``Google``, ``Cloud``) is dropped first; a bare ``H200`` is
    only read as the SXM part with NVIDIA's prefix, as its driver names it."""
    key = re.sub(r"[\s_]+", "-", gpu.strip().lower())
    bare = key
    while _VENDOR.match(bare):
        bare = _VENDOR.sub("", bare, count=1)
    if bare == "h200" and bare == key:   # "H200" alone leaves the part open (SXM or NVL)
        return None
    return GPU_CHIPS.get(bare)


@dataclass(frozen=True)
class Case:
    """One published run, expressed for phaze."""

    run_id: str
    source: str
    gpu: str
    chip: Chip
    model: Model
    devices: int
    global_batch: int
    plan: Plan
    measured_step_s: float
    layout_from: str = "row"    # row | unconfirmed (quoted defaults) | searched (a field chosen by phaze)
    chip_file: str = ""
    dataset: str = ""
    alternatives: tuple[Plan, ...] = ()   # other plans the row allows (an unstated field); the fastest that fits counts


@dataclass(frozen=True)
class Skipped:
    run_id: str
    source: str
    gpu: str
    reason: str
    chip_file: str = ""
    dataset: str = ""


MAX_CELL = 1e15   # the largest magnitude a numeric column may hold (tokens a second total stay below 1e8)


def _num(row: dict, key: str) -> float | None:
    raw = (row.get(key) or "").strip()
    if raw == "" or raw.lower() in ("nan", "n/a", "na", "none"):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"column {key!r} is not a number: {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"column {key!r} is not finite: {raw!r}")
    if abs(value) > MAX_CELL:   # no column comes near; beyond, products of widths leave the floats
        raise ValueError(f"column {key!r} is out of range: {raw!r}; allowed: at most {MAX_CELL:.0e} in magnitude")
    return value


def _int(row: dict, key: str, default: int | None = None) -> int | None:
    v = _num(row, key)
    if v is None:
        return default
    if v <= 0 or not float(v).is_integer():
        raise ValueError(f"column {key!r} must be a positive integer, got {row[key]!r}")
    return int(v)


def _whole(row: dict, key: str) -> int | None:
    """A column holding a whole number >= 0 (0 allowed, unlike :func:`_int`); None when blank."""
    v = _num(row, key)
    if v is not None and (v < 0 or not float(v).is_integer()):
        raise ValueError(f"column {key!r} must be a whole number >= 0, got {row[key]!r}")
    return None if v is None else int(v)


def _text(row: dict, key: str) -> str:
    return (row.get(key) or "").strip()


def _flag(row: dict, key: str, default: bool = False) -> bool:
    raw = _text(row, key).lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"column {key!r} must be yes or no, got {row[key]!r}")


def _dp_shard(row: dict, default: int) -> int:
    """The ``dp_shard`` column (:func:`phaze.plan.dp_shard_value`); blank: ``default`` (the
    framework's)."""
    raw = _text(row, "dp_shard")
    if not raw:
        return default
    value = dp_shard_value(raw)
    if value is None:
        raise ValueError(f"column 'dp_shard' must be {DP_SHARD_ALLOWED}, got {row['dp_shard']!r}")
    return value


def _cp_comm(row: dict, default: str) -> str:
    """The ``cp_comm`` column (:func:`phaze.plan.cp_comm_value`); blank: ``default`` (the
    framework's)."""
    raw = _text(row, "cp_comm")
    if not raw:
        return default
    try:
        return cp_comm_value(raw)
    except ValueError as exc:
        raise ValueError(f"column 'cp_comm' {exc}") from None


def nemo_hybrid_flops_per_sample(model: Model) -> float:
    """Model FLOPs of one sequence of a hybrid as NeMo 2.5 counts them (nemo/utils/flops_formulas.py
    ``_hybrid_model_flops``, the ``nemotronh`` formula of its FLOPs callback): per attention layer
    6·s·h·(h + 2·h·groups/heads + s + h) (the causal half of the two products), per Mamba-2 layer
    6·s·h·(2·d_inner + 2·G·N + heads) + 6·s·d_inner·N + 6·s·d_inner·h (its scan counted in part,
    "because the chunk size is not known"), per MLP layer 6·s·h·ffn·3 (a gated unit assumed, so
    a squared-ReLU MLP counts half again its work), and 6·s·h·V for the logits. The source's
    convention, not phaze's count (:func:`phaze.step.model_flops_per_sample`)."""
    s, h, V = model.seq_len, model.hidden, model.vocab
    d, n = model.mamba_inner, model.hybrid_counts
    attention = 6 * s * h * (h + 2 * h * model.kv_heads / model.heads + s + h)
    mamba = (6 * s * h * model.mamba_in_width + 6 * s * d * model.mamba_state + 6 * s * d * h)
    mlp = 6 * s * h * model.ffn_hidden * 3
    return n.get("*", 0) * attention + n.get("M", 0) * mamba + n.get("-", 0) * mlp + 6 * s * h * V


# the 16-bit types as a precision column names them anywhere in its text (``mixed fp16``,
# ``AMP (bfloat16)``, PyTorch Lightning's ``16-mixed`` and ``bf16-mixed``), an underscore a separator
_SIXTEEN = {"bf16": r"(?<![a-z0-9])(?:bf16|bfloat16)(?![a-z0-9])",
            "fp16": r"(?<![a-z0-9])(?:fp16|float16|half|16-mixed|16-true)(?![a-z0-9])"}


def sixteen_bit(text: str) -> str:
    """The 16-bit type a free-text precision names (fp16 or bf16), the first where it names both;
    "" where it names neither."""
    found = [(m.start(), kind) for kind, pattern in _SIXTEEN.items()
             for m in [re.search(pattern, text.lower())] if m]
    return min(found)[1] if found else ""


# the compute_precision column's other spellings of its types
_PRECISION_NAMES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float8": "fp8", "float32": "fp32"}


def _spelling(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _zero_stage(row: dict) -> float | None:
    """The ``zero_stage`` column: 0-3, also as people write it (``ZeRO-1``, ``stage 2``, ``FSDP``
    and ``FULL_SHARD`` 3, ``SHARD_GRAD_OP`` 2, ``distributed optimizer`` 1, ``DDP`` 0); None when blank."""
    raw = _text(row, "zero_stage")
    base = raw.split("(")[0]     # a note after the value: "ZeRO-3 (FSDP)"
    stage = re.fullmatch(r"(?:zero)?(?:stage)?([0-3])", _spelling(base))
    if not raw or not stage and re.fullmatch(r"[\d.eE+-]+", raw):
        return _num(row, "zero_stage")
    value = int(stage.group(1)) if stage else ZERO_NAMES.get(_spelling(base))
    if value is None:
        raise ValueError(f"column 'zero_stage' must be 0, 1, 2 or 3 (also ZeRO-1, stage 2, FSDP or FULL_SHARD 3, "
                         f"SHARD_GRAD_OP 2, distributed optimizer 1, DDP 0), got {raw!r}")
    return float(value)


def _attention_kernel(row: dict, default: str) -> str:
    """The ``attention_kernel`` column: flash, flash2 or standard, also as people name the kernels
    (:data:`ATTENTION_NAMES`); blank: ``default``."""
    raw = _text(row, "attention_kernel")
    if not raw:
        return default
    value = ATTENTION_NAMES.get(_spelling(raw))
    if value is None:
        raise ValueError(f"column 'attention_kernel' must be flash (the framework's fused kernel: also fused, TE, "
                         f"cuDNN), flash2 (the flash-attn library: also FlashAttention-2, FA2, flash_attn) or "
                         f"standard (also unfused, math), got {raw!r}")
    return value


def _choice(row: dict, key: str, allowed: tuple[str, ...], default: str) -> str:
    raw = _text(row, key).lower()
    if not raw:
        return default
    if raw not in allowed:
        raise ValueError(f"column {key!r} must be one of {', '.join(allowed)}, got {row[key]!r}")
    return raw


def convention_flops_per_step(model: Model, global_batch: int, convention: str,
                              recompute: str) -> float:
    """FLOPs of one step as a source counts them: ``narayanan96`` (Megatron SC'21:
    96·B·s·l·h²(1 + s/6h + V/16lh) with full recompute, 72·... without), ``6n_12lqs``
    (llm-foundry, MaxText: 6·N·s + 12·l·q·s² per sequence, N all parameters, q = heads·head_dim),
    ``narayanan24k`` (Megatron-DeepSpeed's throughput log, megatron/utils.py
    ``throughput_calculator``: 24·k·B·s·l·h²(1 + s/6h + V/16lh), k = 4 with any activation
    recompute, 3 without, the vocabulary term left at 16 either way; assumption: as remembered,
    the file not at hand), ``model`` (Megatron/NeMo model FLOPs: the GEMMs of forward and backward, non-causal
    attention, no recompute) or ``model_causal`` (the same with the attention's two products
    counted at half, as causal: NeMo 2.5's FLOPsMeasurementCallback, nemo/utils/flops_formulas.py
    causal_self_attn = True in every family; 2.4 and before count them in full)."""
    B, s, l, h, V = global_batch, model.seq_len, model.layers, model.hidden, model.vocab
    if model.hybrid and convention == "model_causal":
        if model.moe:
            raise ValueError(f"flop_convention model_causal is NeMo 2.5's nemotronh formula, which counts no "
                             f"mixture-of-experts layers ({model.name} has {model.moe_layers}); allowed: model")
        return nemo_hybrid_flops_per_sample(model) * B
    if model.hybrid and convention != "model":
        raise ValueError(f"flop_convention {convention} counts a transformer's layers; for a hybrid of Mamba-2 "
                         f"and attention layers ({model.name}) allowed: model, model_causal")
    if convention == "narayanan96":
        # assumption: a block recompute counts as full (the log's recompute factor reads the
        # flag that turns whole-layer recompute on, not how many layers re-run)
        if recompute in ("full", "block"):
            return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    if convention == "narayanan24k":
        k = 3 if recompute in ("none", "") else 4
        return 24 * k * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    if convention == "6n_12lqs":
        return B * (6 * model.params * s + 12 * l * model.q_dim * s * s)
    if convention == "model":
        return model_flops_per_sample(model) * B
    if convention == "model_causal":   # less half of QK^T and PV, forward and backward (3 x 2 s^2 width)
        products = 3 * 2 * s * s * (model.q_dim + model.o_dim) * (l + model.mtp_layers)
        return (model_flops_per_sample(model) - products / 2) * B
    raise ValueError(f"unknown flop_convention {convention!r}; allowed: {', '.join(CONVENTIONS)}")


def measured_step_time(metric: str, value: float, model: Model, devices: int, global_batch: int,
                       convention: str, recompute: str, peak_flops: float) -> float:
    """Convert a published metric to seconds per step (one global batch)."""
    tokens = global_batch * model.seq_len
    if metric == "step_time_s":
        return value
    if metric == "tokens_per_s_total":
        return tokens / value
    if metric == "tokens_per_s_per_gpu":
        return tokens / (value * devices)
    flops = convention_flops_per_step(model, global_batch, convention, recompute)
    if metric == "tflops_per_gpu":
        return flops / (value * 1e12 * devices)
    if metric == "mfu":
        return flops / (value * peak_flops * devices)
    raise ValueError(f"unknown measured_metric {metric!r}; allowed: {', '.join(METRICS)}")


def _catalogued(rows: dict[str, dict], name: str) -> dict | None:
    """The row of a catalogue (:func:`phaze.catalogue.catalogue`) a published model name names (by
    :func:`phaze.catalogue.name_keys`)."""
    return next((rows[k] for k in name_keys(name) if k in rows), None)


@lru_cache(maxsize=1)
def moe_models() -> dict[str, dict]:
    """Published mixture-of-experts models (``phaze/data/moe_models.csv``), by name key."""
    return catalogue("moe_models.csv")


def resolve_workload(model_name: str) -> Model | None:
    """The shipped workload a row's ``model`` names (:func:`phaze.catalogue.find_workload`: its
    name, file or an alias, in any spelling :func:`phaze.catalogue.name_keys` reads; or a catalogued
    MoE model's name), or None."""
    path = find_workload(model_name)
    if path is None:
        known = _catalogued(moe_models(), model_name)
        path = find_workload(known["model"]) if known else None
    return load_model(path) if path else None


# the columns phaze chooses itself where a row leaves them blank (a row that publishes tp or pp
# alone has the other from dp): a quoted default of one of them that the row's published values
# contradict is dropped and searched (:func:`row_to_case`)
SEARCHED_WHEN_BLANK = ("tp", "pp", "micro_batch", "vp", "recompute", "recompute_layers", "zero_stage")


def row_to_case(row: dict, chips: dict[str, Chip] | None = None, dataset: str = "") -> Case | Skipped:
    """Express one CSV row, or say why it cannot be expressed. ``chips`` caches loaded chip
    configs by file name. Only :data:`MODEL_COLUMNS` are read: never the free-text notes."""
    row = {k: row.get(k) for k in MODEL_COLUMNS}
    run_id, source, gpu = (row.get("run_id") or "?").strip(), (row.get("source_id") or "?").strip(), \
        (row.get("gpu") or "").strip()
    chip_name = _text(row, "chip") or chip_for_gpu(gpu) or ""
    chips = {} if chips is None else chips
    try:
        return _row_to_case(row, run_id, source, gpu, chip_name, chips, dataset)
    except (ValueError, ConfigError) as exc:
        reason = str(exc)
    quoted = [k for k in re.split(r"[\s,;]+", _text(row, "unconfirmed")) if k in SEARCHED_WHEN_BLANK and _text(row, k)]
    if quoted:
        # the quoted defaults contradict what the row publishes, so the run did not use them all:
        # they are searched, as for a row that does not publish them
        try:
            case = _row_to_case({**row, **dict.fromkeys(quoted, "")}, run_id, source, gpu, chip_name, chips, dataset)
            return dataclasses.replace(case, layout_from="searched")
        except (ValueError, ConfigError) as exc:
            reason += f"; with its quoted defaults ({', '.join(quoted)}) searched: {exc}"
    return Skipped(run_id, source, gpu, reason, chip_name, dataset)


@lru_cache(maxsize=1)
def unmodelled_models() -> dict[str, dict]:
    """Published models phaze cannot express from a row (``phaze/data/unmodelled_models.csv``:
    state-space and hybrid models it ships no workload for), by normalised name."""
    return catalogue("unmodelled_models.csv")


def _moe_reason(row: dict) -> str | None:
    """Why a mixture-of-experts row cannot be expressed: it names a catalogued MoE model that phaze
    does not ship (its architecture is not modelled), or gives experts without a top-k."""
    name = _text(row, "model")
    shipped = resolve_workload(name) if name else None
    known = _catalogued(moe_models(), name)
    if known and not (shipped and shipped.moe):
        why = known.get("not_modelled") or "no shipped workload describes it"
        return (f"mixture of experts {known['model']} ({known['experts']} experts, top-{known['top_k']}, "
                f"{known['total_params_b']}B total / {known['active_params_b']}B active) is not modelled: {why}")
    experts = _int(row, "num_experts")
    if experts and experts > 1 and not _int(row, "moe_top_k") and not (shipped and shipped.moe):
        return f"mixture of experts ({experts} experts) without moe_top_k: the routed work is unknown"
    return None


def row_framework(row: dict) -> Framework | None:
    """The preset a row runs under: its ``framework`` column's; a row that leaves the column blank
    takes the framework its ``source_title``, else its ``source_locator``, names in the same
    spellings (``NVIDIA/Megatron-LM README ... (2022-05-19)``, ``pytorch/torchtitan
    docs/performance.md``), as the standard columns every row carries; a column naming a framework
    phaze has no preset for stays without one. (The notes are never read.)"""
    text = _text(row, "framework")
    if text:
        return resolve_framework(text)
    for column in ("source_title", "source_locator"):
        fw = resolve_framework(_text(row, column))
        if fw:
            return fw
    return None


def _row_to_case(row, run_id, source, gpu, chip_name, chips, dataset) -> Case:
    other = _catalogued(unmodelled_models(), _text(row, "model"))
    if other:
        raise ValueError(f"{other['model']} ({other['params_b']}B) is not expressed: {other['not_modelled']}")
    moe = _moe_reason(row)
    if moe:
        raise ValueError(moe)
    peft = _text(row, "peft").lower()
    if peft not in ("", "none", "full"):
        raise ValueError(f"column 'peft' {peft}: parameter-efficient fine-tuning ({PEFT_REASON}) is not modelled; "
                         f"allowed: blank, none or full (full training)")
    named_peft = peft_error(_text(row, "model"))
    if named_peft and not peft:
        raise ValueError(f"model {named_peft}")
    if _flag(row, "packed_documents"):
        raise ValueError("each sequence packs several documents that attend only within themselves "
                         "(packed fine-tuning data); their lengths are not given, so the attention work "
                         "is unknown (phaze costs one causal sequence)")
    if not chip_name:
        raise ValueError(f"no chip file for GPU {gpu!r}: name one in the 'chip' column or add it "
                         f"to arch_configs/ (shipped GPU names: {', '.join(sorted(set(GPU_CHIPS.values())))})")
    if chip_name not in chips:
        chips[chip_name] = load_chip(chip_name)
    chip = chips[chip_name]
    system_name = _text(row, "system_config")
    per_node = _int(row, "devices_per_node")
    if per_node is not None and not system_name:
        raise ValueError(f"column 'devices_per_node' resizes the nodes (or pod slices) of the row's "
                         f"system_config, got {row['devices_per_node']!r} without one")
    if system_name:     # the row's cluster: the chip with that system's links, cached by (chip, system[, size])
        key = (chip_name, system_name) if per_node is None else (chip_name, system_name, per_node)
        if key not in chips:
            try:
                system = load_system(system_name)
                if per_node is not None:
                    system = with_devices_per_node(system, per_node, "devices_per_node")
                chips[key] = apply_system(chip, system)
            except ConfigError as exc:
                raise ValueError(f"column 'system_config': {exc.message if exc.source == '--system' else exc}"
                                 ) from None
        chip = chips[key]
    fw = row_framework(row)
    # how the run issued its work (its column, else its framework's), not the chip's default; after
    # the cache, which holds each chip and system once whatever the rows' frameworks
    chip = chip.with_execution(_choice(row, "execution", EXECUTION, fw.execution if fw else ""))
    metric = _text(row, "measured_metric")
    if metric not in METRICS:
        raise ValueError(f"unknown measured_metric {metric!r}; allowed: {', '.join(METRICS)}")
    value = _num(row, "measured_value")
    if value is None or value <= 0:
        raise ValueError("measured_value missing or not positive")
    devices = _int(row, "gpu_count")
    if devices is None:
        raise ValueError("gpu_count is required")
    seq = _int(row, "seq_len")
    if seq is None:
        raise ValueError("seq_len not stated")
    named = _PRECISION_NAMES.get(_text(row, "compute_precision").lower())
    precision = named or _choice(row, "compute_precision", ("fp16", "bf16", "fp8", "mxfp8", "fp32", "tf32"), "")
    if not precision:   # the precision column: fp8 when it names float8 linears, else the 16-bit type
        # it names first (its leading word, where that is one), else fp32 where it names only 32 bits,
        # else what the framework's runs train in (phaze's bf16 without one)
        text = _text(row, "precision").lower()
        if re.search(r"\b(?:mx|nv)?(?:fp4|float4)\b", text):
            raise ValueError(f"precision {_text(row, 'precision')!r}: 4-bit training (fp4, nvfp4, mxfp4) is "
                             f"not modelled; phaze models fp16, bf16 and fp8 (compute_precision names one)")
        # 32-bit training (fp32, TF32 matmuls) when the column names it and no 16-bit type (a run that
        # keeps fp32 master weights beside bf16 compute names both, read by sixteen_bit first) nor
        # mixed precision
        wide = re.search(r"\b(fp32|tf32|float32)\b", text) and not re.search(r"\b(amp\w*|mixed)\b", text)
        precision = ("fp8" if re.search(r"\b(?:mx)?(fp8|float8)", text) else sixteen_bit(text) or
                     ("fp32" if wide else (fw.precision if fw else "") or "bf16"))
    # Blackwell's MXFP8 (32-element blocks, each with its own scale) is fp8 to phaze as the blockwise
    # and per-tensor recipes are: the same fp8 products at the chip's fp8 rate and a cast per operand
    precision = {"mxfp8": "fp8", "tf32": "fp32"}.get(precision, precision)   # TF32: fp32 weights, TF32 matmuls
    model = _row_model(row, seq, precision, fw)
    nominal = _num(row, "params_b")
    if nominal and not model.moe and nominal * 1e9 > PARAMS_GUARD * model.params:
        raise ValueError(f"params_b {nominal:g} B but the shape gives a dense {model.params / 1e9:.1f} B: "
                         f"experts or an architecture the row does not describe")

    unconfirmed = _text(row, "unconfirmed")
    tp, pp, mbs, cp, vp = (_int(row, k) for k in ("tp", "pp", "micro_batch", "cp", "vp"))
    batch = _int(row, "global_batch")
    if batch is None:
        raise ValueError("global_batch not published: the step's size is unknown")
    recompute_text = _text(row, "recompute").lower()
    if recompute_text not in _RECOMPUTE:   # its leading word where a note follows ("full (uniform)")
        lead = re.split(r"[\s(,;:]+", recompute_text, maxsplit=1)[0]
        recompute_text = lead if lead in _RECOMPUTE or lead == "offload" else recompute_text
    recompute_stated = bool(recompute_text)
    offload = _text(row, "offload").lower()
    if recompute_text == "offload":
        # a full recompute that keeps the tensors the ``offload`` column names on the host
        if not offload:
            raise ValueError("recompute = offload: column 'offload' must name what the run keeps on the host "
                             f"({', '.join(OFFLOADS)}); it is blank")
        recompute_text = "full"
    if offload and offload not in OFFLOADS:
        raise ValueError(f"column 'offload' must be one of {', '.join(OFFLOADS)}, got {row['offload']!r}")
    if offload and recompute_text != "full":
        raise ValueError(f"column 'offload' names what a full recompute keeps on the host: it needs recompute "
                         f"offload or full, got {row['recompute']!r}")
    recompute = _RECOMPUTE.get(recompute_text or "none")
    if recompute is None:
        raise ValueError(f"column 'recompute' must be none, selective, block or full, got {row['recompute']!r}")
    block_layers = _int(row, "recompute_layers")      # a block row's layers re-run whole per stage
    if block_layers is not None and (recompute != "block" or block_layers < 1):
        raise ValueError(f"column 'recompute_layers' counts the layers each stage of a recompute = block run "
                         f"re-runs whole (at least 1), got {row['recompute_layers']!r} with recompute "
                         f"{row['recompute']!r}")
    dp_col = _int(row, "dp")
    if dp_col and (tp is None) != (pp is None):   # the other one follows from dp: not searched
        rest, rem = divmod(devices, dp_col * (cp or 1) * (tp or pp))
        if rem == 0:
            tp, pp = (tp, rest) if tp else (rest, pp)
    layout_searched = tp is None or pp is None
    searched_ep = None
    if layout_searched:
        # a block row's layout is searched as for full recompute (its count is set for the layout
        # after); a mixture of experts' ep with it where the row does not give it
        tp, pp, cp, searched_ep = _searched_layout(model, chip, devices, batch, fw, tp, pp, cp, mbs,
                                                   ({"block": "full"}.get(recompute, recompute))
                                                   if recompute_stated else "", _zero_stage(row), dp_col,
                                                   _int(row, "ep"), _int(row, "etp", 1))
    selective, modules = _selective_policy(row, fw)
    if recompute == "selective":
        recompute = selective   # torchtitan's per-op policy, or Megatron's selective recompute
    if fw and fw.vocab_multiple and not _int(row, "vocab"):   # the framework pads the vocabulary
        model = dataclasses.replace(model, vocab=padded_vocab(model.vocab, fw.vocab_multiple * tp))
    sp_text = _text(row, "sequence_parallel").lower()
    sp = (True if sp_text in _TRUE else False if sp_text in _FALSE else
          (fw.sp if fw and fw.sp is not None else True)) and tp > 1
    zero = _zero_stage(row)
    zero_stated = zero is not None or fw is not None
    preset = plan_settings(fw, precision)   # what the framework (or phaze) sets where a column is blank
    zero = preset["zero"] if zero is None else zero
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"column 'zero_stage' must be 0, 1, 2 or 3, got {row['zero_stage']!r}")
    schedule, vp = _pipeline_schedule(row, fw, pp, vp)
    plan = Plan(tp=tp, pp=pp, mbs=mbs or 1, recompute=recompute, sp=sp, vp=vp or 1, cp=cp or 1,
                zero=int(zero), recompute_layers=(block_layers or 1,) if recompute == "block" else (),
                attention=_attention_kernel(row, preset["attention"]),
                tp_overlap=_flag(row, "tp_comm_overlap", preset["tp_overlap"]),
                tp_async=_flag(row, "tp_async", preset["tp_async"]),
                dp_overlap=hides_dp_reduction(preset["dp_overlap"], fw is not None and fw.dp_overlap_flat, pp, sp),
                loss=_choice(row, "cross_entropy", LOSSES, preset["loss"]), optimizer=preset["optimizer"],
                reduce_fp32=_flag(row, "grad_reduce_fp32", preset["reduce_fp32"]), recompute_modules=modules,
                grad_accum_fusion=_flag(row, "grad_accum_fusion", preset["grad_accum_fusion"]),
                dp_shard=_dp_shard(row, preset["dp_shard"]), cp_comm=_cp_comm(row, preset["cp_comm"]),
                cp_a2a=_int(row, "cp_a2a", 1), fsdp_pp=_choice(row, "fsdp_pp", FSDP_PP, preset["fsdp_pp"]),
                fp8_params=_flag(row, "fp8_param_gather", preset["fp8_params"]), pipe_p2p=preset["pipe_p2p"],
                pipe_schedule="dualpipe" if schedule == "dualpipe" else "1f1b", offload=offload)
    if dp_col is not None and dp_col * tp * pp * (cp or 1) != devices:
        raise ValueError(f"dp*tp*pp*cp = {dp_col * tp * pp * (cp or 1)} != gpu_count {devices}")
    check_plan(model, devices, batch, plan)
    check_offload(chip, plan)
    layout_from = "searched" if layout_searched else "unconfirmed" if unconfirmed else "row"
    alternatives: tuple[Plan, ...] = ()
    searched = {}
    if mbs is None:   # it sets the kernels' sizes (and the bubble): the one a tuned run would use
        searched["mbs"] = SEARCHED_MICRO_BATCHES
    # the framework's recipes interleave, or the framework is not known: its schedule is not
    # published, so the best vp it accepts (vp 1 included), as a tuned run would use; a row that
    # says interleaved without its vp (nor a framework default): the best vp above 1
    if vp is None and pp > 1 and (fw is None or fw.interleave or schedule == "interleaved"):
        searched["vp"] = tuple(v for v in vp_values(model, pp, PlacementOptions())
                               if v > 1 or schedule != "interleaved")
        if not searched["vp"]:
            raise ValueError(f"column 'pipeline_schedule' interleaved, but no vp above 1 splits the "
                             f"{model.layers} layers over pp = {pp}")
        if schedule == "interleaved":
            plan = dataclasses.replace(plan, vp=searched["vp"][0])
    if not zero_stated and plan.dp(devices) > 1:   # the distributed optimizer costs no time: a tuned run's choice
        searched["zero"] = (0, 1)
    if searched:
        grid = [dataclasses.replace(plan, **dict(zip(searched, combo, strict=True)))
                for combo in itertools.product(*searched.values())]
        alternatives = tuple(_valid_plans(model, devices, batch, [g for g in grid if g != plan]))
        layout_from = "searched"
    if model.moe:
        plan, assumed = _expert_plan(row, model, chip, devices, plan, searched_ep)
        # the row's moe_shared_expert_overlap; blank: the framework's, where the plan allows it
        conflict = shared_overlap_conflict(plan, model.shared_experts)
        overlap = _flag(row, "moe_shared_expert_overlap", preset["shared_overlap"] and not conflict)
        if overlap and conflict:
            raise ValueError(f"column 'moe_shared_expert_overlap' yes needs {conflict}")
        plan = dataclasses.replace(plan, shared_overlap=overlap)
        layout_from = "unconfirmed" if assumed and layout_from == "row" else layout_from
        check_plan(model, devices, batch, plan)
        alternatives = tuple(dataclasses.replace(a, ep=plan.ep, etp=plan.etp, routing=plan.routing,
                                                 dispatcher=plan.dispatcher, ep_overlap=plan.ep_overlap,
                                                 shared_overlap=plan.shared_overlap)
                             for a in alternatives)
    if recompute == "block" and block_layers is None:   # the count not published: the fewest that fit
        fits = _fits(model, chip, devices, batch)
        plans = [_fewest_block_layers(model, devices, batch, p, fits) for p in (plan, *alternatives)]
        plan, alternatives, layout_from = plans[0], tuple(plans[1:]), "searched"
    # blank: the framework's own throughput log counts TFLOP/s per GPU its way (an MFU is a
    # paper's or a report's figure: model FLOPs unless the row says otherwise)
    convention = _choice(row, "flop_convention", CONVENTIONS,
                         (fw.flop_convention if fw and metric == "tflops_per_gpu" else "") or "model")
    if not recompute_stated:   # not stated: the least recompute with which a plan the row allows fits
        # (more, where it buys a faster plan, unless the measured FLOPs count the recompute)
        more = not (metric in ("tflops_per_gpu", "mfu") and convention in RECOMPUTE_CONVENTIONS)
        plan, alternatives, recompute, chosen = _least_recompute(model, chip, devices, batch, plan, alternatives,
                                                                 fw, selective, more)
        layout_from = "searched" if chosen else layout_from
    peak = _num(row, "mfu_peak_tflops")
    # blank: the datasheet's dense 16-bit peak as the chip file lists it
    listed = dict(chip.peak_flops_per_s)
    peak = peak * 1e12 if peak else (listed.get("bf16") or listed.get("fp16") or chip.peak_flops("bf16"))
    step = measured_step_time(metric, value, model, devices, batch, convention, recompute, peak)
    if not (math.isfinite(step) and step > 0):
        raise ValueError(f"measured_value {value:g} ({metric}) gives a step time of {step:g} s; "
                         f"allowed: a value whose step time is a positive finite number")
    return Case(run_id, source, gpu, chip, model, devices, batch, plan, step, layout_from, chip_name, dataset,
                alternatives)


def _pipeline_schedule(row: dict, fw: Framework | None, pp: int, vp: int | None) -> tuple[str, int | None]:
    """(the ``pipeline_schedule`` column, the row's vp) where the column pins the vp down:
    ``1f1b`` is not interleaved (vp 1); ``interleaved`` is (vp > 1: the row's, else the
    framework's default, :attr:`phaze.framework.Framework.interleave_vp`, else searched as a tuned
    run would choose it); ``dualpipe`` runs its own chunks (vp 1); blank leaves vp to the row and
    the framework."""
    schedule = _choice(row, "pipeline_schedule", ("1f1b", "interleaved") + PIPE_SCHEDULES[1:], "")
    if schedule and pp == 1:
        raise ValueError(f"column 'pipeline_schedule' {schedule} needs pp > 1")
    if schedule == "interleaved":
        if fw is not None and not fw.interleaving:
            raise ValueError(f"column 'pipeline_schedule' interleaved: {fw.name} has no interleaved pipeline schedule")
        if vp == 1:
            raise ValueError("column 'pipeline_schedule' interleaved, but vp is 1")
        return schedule, vp or (fw.interleave_vp if fw is not None and fw.interleave_vp else None)
    if schedule in ("1f1b", "dualpipe"):
        if vp and vp > 1:
            raise ValueError(f"column 'pipeline_schedule' {schedule} runs no interleaved chunks, but vp is {vp}")
        return schedule, 1
    return schedule, vp


def _searched_layout(model: Model, chip: Chip, devices: int, batch: int, fw: Framework | None, tp, pp, cp, mbs,
                     recompute: str, zero, dp, ep=None, etp: int = 1) -> tuple[int, int, int, int]:
    """(tp, pp, cp, ep) of a row that does not publish its layout: those of the best Megatron-style
    plan (an even split, one recompute mode) :func:`phaze.placement.place` finds for it with the
    shipped calibration, within what the row does state (a ``dp``, a mixture of experts' ``ep``
    and ``etp`` too) and its framework offers, as a tuned run would be laid out. A mixture of
    experts is searched with Megatron's default dispatch (the all-to-all, not overlapped) and
    the model's routing; the row's own dispatch settings apply to the plan after."""
    base = PlacementOptions()
    options = dataclasses.replace(base, tp=(tp,) if tp else base.tp, pp=(pp,) if pp else (),
                                  cp=(cp,) if cp else (), mbs=(mbs,) if mbs else SEARCHED_MICRO_BATCHES,
                                  recompute=(recompute,) if recompute else base.recompute,
                                  zero=int(zero) if zero is not None else base.zero,
                                  ep=(ep,) if ep else base.ep, etp=(etp,) if model.moe else base.etp)
    if fw:
        given = {"zero"} if zero is not None else set()
        options = options_with(fw, options, given | ({"recompute"} if recompute else set()), model.precision,
                               model)[0]
    spaces = [options]
    if dp:   # tp * pp * cp = devices / dp: one tp at a time, its pp following
        spaces = [dataclasses.replace(options, tp=(t,), pp=(devices // (dp * t * c),), cp=(c,))
                  for t in options.tp for c in (options.cp or (1,)) if devices % (dp * t * c) == 0]
    eff, best, why = calibrated_efficiency(chip), None, "no tp, pp and cp give the stated dp"
    for space in spaces:
        try:
            found = place(model, chip, devices, batch, space, eff, top=1)
        except ConfigError as exc:
            why = exc.message
            continue
        pick = found.baseline or found.best
        if pick is None:
            why = found.infeasible_reason
        elif best is None or pick.result.step_time_s < best.result.step_time_s:
            best = pick
    if best is None:
        raise ValueError(f"parallel layout not published (tp or pp missing), and no plan fits: {why}")
    return best.plan.tp, best.plan.pp, best.plan.cp, best.plan.ep


def _selective_policy(row: dict, fw: Framework | None) -> tuple[str, tuple[str, ...]]:
    """What the row's selective recompute is: (``selective`` or torchtitan's ``op``, Megatron-Core's
    modules, empty for Megatron-LM's). The ``selective_recompute`` column: ``op``; ``attention``,
    the core attention (under a framework of Megatron-Core's, its ``core_attn`` module, which
    re-runs a fused kernel too); Megatron-Core modules joined by '+'; blank: the framework's."""
    text = _text(row, "selective_recompute").lower()
    default = fw.recompute_modules if fw else ()
    if not text:
        return ("op", ()) if fw and fw.selective == "op" else ("selective", default)
    if text == "op":
        return "op", ()
    if text == "attention":
        return "selective", ("core_attn",) if default else ()
    mods = ordered_modules(x.strip() for x in text.split("+"))
    if mods is None:
        raise ValueError(f"column 'selective_recompute' must be attention, op or distinct Megatron-Core modules "
                         f"joined by '+' ({', '.join(RECOMPUTE_MODULES)}), got {row['selective_recompute']!r}")
    return "selective", mods


def _least_recompute(model: Model, chip: Chip, devices: int, batch: int, plan: Plan,
                     alternatives: tuple[Plan, ...], fw: Framework | None, selective: str = "selective",
                     more: bool = True):
    """(plan, alternatives, recompute, chosen) for a row that does not state its recompute: the
    first of none, the row's selective policy (where its framework has one), block (where it has it:
    the fewest layers of each stage re-run whole, the same count in every stage as Megatron's
    --recompute-num-layers) and full with which the plan or one of its alternatives fits in
    memory, since a run that fits must have recomputed at least that much (``chosen``: anything
    but none); none when nothing fits. With ``more``, each other plan the row allows joins the
    alternatives with the least recompute with which it fits, where that is more: a tuned run
    recomputes more where that lets a faster plan fit (a deeper interleaving, a larger
    micro-batch), and the fastest that fits counts. Without it (the measured FLOPs count the
    recompute, so it must be the least one) they do not. Memory does not depend on the efficiency
    parameters, so the choice is the same for every fit."""
    swap = dataclasses.replace
    modes = (["none"] + ([selective] if not fw or fw.selective_recompute else [])
             + (["block"] if not fw or fw.block_recompute else []) + ["full"])
    fits = _fits(model, chip, devices, batch)

    try:
        least, later, settled = None, [], set()   # settled: the allowed plans that fit with less
        for r in modes:
            plans = [swap(p, recompute=r) for p in (plan, *alternatives)]
            if r == "block":
                plans = [_fewest_block_layers(model, devices, batch, p, fits) for p in plans]
            valid = set(_valid_plans(model, devices, batch, plans))
            fitting = {i for i, p in enumerate(plans) if i not in settled and p in valid and fits(p)}
            if fitting and least is None:
                least = plans[0], tuple(plans[1:]), r, r != "none"
                if not more:
                    break
            else:
                later += [plans[i] for i in sorted(fitting)]
            settled |= fitting
        if least is not None:
            return least[0], least[1] + tuple(later), least[2], least[3]
    except ConfigError:   # the chip cannot run the row (its precision): the prediction says why
        pass
    return plan, alternatives, plan.recompute, False


def _fits(model: Model, chip: Chip, devices: int, batch: int):
    """Whether a plan fits in memory (memory does not depend on the schedule or the efficiencies)."""
    def fits(p: Plan) -> bool:
        return evaluate(model, chip, devices, batch, dataclasses.replace(p, schedule="sequential")).fits
    return fits


def _fewest_block_layers(model: Model, devices: int, batch: int, plan: Plan, fits) -> Plan:
    """``plan`` (recompute block) with the fewest layers re-run whole in each stage with which it
    fits (memory falls as the count grows); every layer of its smallest stage when none does."""
    swap = dataclasses.replace
    try:
        check_plan(model, devices, batch, swap(plan, recompute="none", recompute_layers=()))
    except ConfigError:
        return swap(plan, recompute_layers=(1,))       # invalid whatever the count: the check says why
    most = min(stage_split(model, plan))
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(swap(plan, recompute_layers=(mid,))) else (mid + 1, hi)
    return swap(plan, recompute_layers=(lo,))


def _valid_plans(model: Model, devices: int, batch: int, plans) -> list[Plan]:
    out = []
    for p in plans:
        try:
            check_plan(model, devices, batch, p)
        except ConfigError:
            continue
        out.append(p)
    return out


def _expert_plan(row: dict, model: Model, chip: Chip, devices: int, plan: Plan,
                 searched_ep: int | None = None) -> tuple[Plan, bool]:
    """The row's plan with its expert layout: the ``ep``, ``etp``, ``moe_routing``,
    ``moe_dispatcher`` and ``moe_a2a_overlap`` columns when given (dispatcher blank: ``alltoall``;
    routing blank: ``capacity`` with a capacity factor, else ``dropless``, Megatron's default).
    A row whose layout was searched (:func:`_searched_layout`) takes the searched ep when it gives
    none. Otherwise, without ``ep`` (the second value is then True): the widest ep that divides the experts and
    tp*cp*dp/etp and keeps etp*ep inside one domain of the chip's first link level (a node), as
    Megatron-Core's MoE guide advises (expert all-to-alls on NVLink). Not a search on predicted
    time: memory decides how wide runs go, and a row without its ZeRO stage and recompute modules
    does not pin the memory down."""
    routing = _choice(row, "moe_routing", ("forced", "dropless", "capacity"), "")
    etp = _int(row, "etp", 1)
    plan = dataclasses.replace(plan, etp=etp, routing=routing,
                               dispatcher=_choice(row, "moe_dispatcher", ("alltoall", "deepep"), ""),
                               ep_overlap=_flag(row, "moe_a2a_overlap"))
    ep = _int(row, "ep") or searched_ep
    if ep:
        return dataclasses.replace(plan, ep=ep), False
    ranks = plan.tp * plan.cp * plan.dp(devices)
    node = (chip.links[0].devices if chip.links and chip.links[0].devices else ranks) // etp
    ep = max(e for e in range(1, model.experts + 1)
             if model.experts % e == 0 and ranks % (e * etp) == 0 and (e <= node or e == 1))
    return dataclasses.replace(plan, ep=ep), True


def _row_model(row: dict, seq: int, precision: str, fw: Framework | None = None) -> Model:
    """The row's model; a mixture of experts when the row names a shipped MoE workload or gives
    ``num_experts`` (:func:`_with_experts`). Dropout blank, and an fp8 run's casts: the
    framework's default."""
    model = _row_shape_model(row, seq, precision)
    if not _text(row, "dropout") and fw is not None and model.dropout != fw.dropout:
        model = dataclasses.replace(model, dropout=fw.dropout)
    shipped = resolve_workload(_text(row, "model")) if _text(row, "model") else None
    experts = _int(row, "num_experts")
    if (shipped is not None and shipped.moe) or (experts and experts > 1):
        model = _with_experts(row, model, shipped if shipped is not None and shipped.moe else None)
    # multi-token prediction is the run's choice (Megatron-Core's --mtp-num-layers, off unless
    # given): blank is none, whatever a named workload trains with
    model = dataclasses.replace(model, mtp_layers=_whole(row, "mtp_layers") or 0)
    bad = mtp_error(model)
    if bad:
        raise ValueError(f"column 'mtp_layers': {bad}")
    # the layer's form: blank is the named workload's (a sequential layer otherwise)
    block = _choice(row, "parallel_block", ("sequential",) + PARALLEL_BLOCKS, "")
    if block:
        model = dataclasses.replace(model, parallel_block="" if block == "sequential" else block)
    bad = parallel_block_error(model)
    if bad:
        raise ValueError(f"column 'parallel_block': {bad}")
    # how the rotary embedding, grouped key/value heads and an unfused softmax run: blank is the framework's
    model = dataclasses.replace(model, rotary_kernels=_choice(row, "rotary_kernels", ROTARY_KERNELS, ""),
                                kv_repeat=_choice(row, "kv_repeat", KV_REPEATS, ""),
                                softmax_kernel=_choice(row, "softmax_kernel", SOFTMAX_KERNELS, ""))
    return model if fw is None else model_with(fw, model)[0]


def _with_experts(row: dict, model: Model, shipped: Model | None) -> Model:
    """A mixture of experts: the shipped MoE workload the row names (its experts, router, shared
    experts, dense layers, attention details) with the row's shape, or the row's own shape with its
    expert columns. A row that gives a shape gives the per-expert FFN in ``ffn_hidden`` (or
    ``moe_ffn_hidden``); the dense layers keep the workload's FFN. The expert columns override."""
    shape_given = _int(row, "layers") is not None
    if shipped is not None and shape_given:
        same = (shipped.hidden, shipped.heads) == (model.hidden, model.heads)
        keep = {"kv_heads": _int(row, "kv_heads") or (shipped.kv_heads if same else model.heads),
                "head_dim": _int(row, "head_dim") or (shipped.head_dim if same else model.hidden // model.heads),
                "vocab": _int(row, "vocab") or shipped.vocab}
        mla = {} if same else {"q_lora_rank": 0, "kv_lora_rank": 0, "qk_rope_head_dim": 0}
        expert_ffn = _int(row, "ffn_hidden") or shipped.expert_ffn
        dense = min(shipped.dense_layers, model.layers - 1)
        base = dataclasses.replace(shipped, name=model.name, layers=model.layers, hidden=model.hidden,
                                   heads=model.heads, seq_len=model.seq_len, precision=model.precision,
                                   dropout=model.dropout, expert_ffn_hidden=expert_ffn,
                                   v_head_dim=keep["head_dim"] if not same else shipped.v_head_dim,
                                   ffn_hidden=shipped.ffn_hidden if same else model.ffn_hidden,
                                   dense_layers=dense,
                                   moe_layer_interval=max(1, min(shipped.moe_layer_interval, model.layers - dense)),
                                   **keep, **mla)
    elif shipped is not None:
        base = model
    else:
        base = dataclasses.replace(model, experts=_int(row, "num_experts"), top_k=_int(row, "moe_top_k"))
    changes = {}
    for key, col in (("experts", "num_experts"), ("top_k", "moe_top_k"), ("expert_ffn_hidden", "moe_ffn_hidden"),
                     ("shared_expert_ffn_hidden", "shared_expert_ffn_hidden")):
        if _int(row, col):
            changes[key] = _int(row, col)
    shared = _num(row, "shared_experts")
    if shared is not None:
        changes["shared_experts"] = int(shared)
    capacity = _num(row, "moe_capacity_factor")
    if capacity is not None:
        changes["capacity_factor"] = capacity
    for key, col in (("router_groups", "moe_router_groups"), ("router_group_topk", "moe_router_group_topk")):
        v = _whole(row, col)     # 0: no group-limited routing
        if v is not None:
            changes[key] = v
    out = dataclasses.replace(base, **changes)
    if not 1 <= out.top_k <= out.experts:
        raise ValueError(f"moe_top_k {out.top_k} must be between 1 and the experts ({out.experts})")
    bad, message = router_groups_error(out)
    if bad:
        raise ValueError(f"column 'moe_{bad}': {message.replace('router_', 'moe_router_')}")
    return out


def _row_shape_model(row: dict, seq: int, precision: str) -> Model:
    layers, hidden, heads = (_int(row, k) for k in ("layers", "hidden", "heads"))
    name = _text(row, "model") or _text(row, "run_id")
    if layers is None and hidden is None and heads is None:
        shipped = resolve_workload(name)
        if shipped is None:
            raise ValueError(f"model {name!r} has no shape in the row and no shipped workload of that name")
        model = with_seq_len(shipped, seq)
        changes = {"precision": precision}
        for key, col in (("vocab", "vocab"), ("kv_heads", "kv_heads")):
            if _int(row, col):
                changes[key] = _int(row, col)
        if _text(row, "dropout"):
            changes["dropout"] = _flag(row, "dropout")
        return dataclasses.replace(model, **changes)
    if None in (layers, hidden, heads):
        raise ValueError("layers, hidden and heads are required (or a model name phaze ships)")
    named = resolve_workload(name)
    if named is not None and named.hybrid and (named.layers, named.hidden, named.heads) != (layers, hidden, heads):
        raise ValueError(f"{named.name} is a hybrid of Mamba-2 and attention layers; the row's shape "
                         f"(layers {layers}, hidden {hidden}, heads {heads}) is not the shipped one "
                         f"({named.layers}, {named.hidden}, {named.heads}), so its layer pattern is unknown")
    if named is not None and not named.moe and (named.layers, named.hidden, named.heads) == (layers, hidden, heads):
        # a named workload of this shape brings what the standard columns do not give (vocabulary,
        # kv heads, activation, norm, position embedding); any explicit column still wins
        changes = {"precision": precision, "name": name}
        for key, col in (("vocab", "vocab"), ("kv_heads", "kv_heads"), ("head_dim", "head_dim"),
                         ("ffn_hidden", "ffn_hidden")):
            if _int(row, col):
                changes[key] = _int(row, col)
        if _choice(row, "activation", ACTIVATIONS, ""):
            changes["activation"] = _choice(row, "activation", ACTIVATIONS, "")
        changes["dropout"] = _flag(row, "dropout", named.dropout)
        return dataclasses.replace(with_seq_len(named, seq), **changes)
    ffn = _int(row, "ffn_hidden", 4 * hidden)
    kv = _int(row, "kv_heads") or heads
    head_dim = _int(row, "head_dim") or 0
    if heads % kv:
        raise ValueError(f"kv heads {kv} do not divide heads {heads}")
    if not head_dim and hidden % heads:
        raise ValueError(f"heads {heads} do not divide hidden {hidden} and no head_dim is given")
    activation = _choice(row, "activation", ACTIVATIONS, "")
    gated = activation in GATED_ACTIVATIONS if activation else ffn % hidden != 0
    return Model(
        name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv, head_dim=head_dim,
        ffn_hidden=ffn, vocab=_int(row, "vocab") or DEFAULT_VOCAB, seq_len=seq,
        activation=activation or ("swiglu" if gated else "gelu"),
        position_embedding="rotary" if gated else "learned", max_positions=0 if gated else seq,
        tied_embeddings=not gated, norm="rmsnorm" if gated else "layernorm", bias=not gated,
        dropout=_flag(row, "dropout"), precision=precision)


def read_runs(path: str | Path) -> list[dict]:
    """Read a runs CSV; a missing column is one clear error."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:   # -sig: a spreadsheet's byte-order mark
            reader = csv.DictReader(fh)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ConfigError(path, missing[0], f"required column missing; the CSV needs "
                                                    f"{', '.join(REQUIRED_COLUMNS)}")
            return list(reader)
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except OSError as exc:   # a directory, no permission, ...
        raise ConfigError(path, None, f"cannot read file ({exc.strerror})") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(path, None, f"not a readable CSV ({exc})") from None


def display_path(path: str | Path) -> str:
    """A path as written files and printed output name it: relative to the project (the folder
    holding the package) or to the working folder when inside either, else as given; never the
    absolute path of the machine that wrote it when it can be avoided."""
    p = Path(path)
    full = p.resolve()
    for root in (Path(__file__).resolve().parent.parent, Path.cwd().resolve()):
        try:
            return full.relative_to(root).as_posix()
        except ValueError:
            continue
    return str(path)


def default_runs_paths() -> list[Path]:
    """The bundled reference sets: ``training_runs.csv`` and ``training_runs_2.csv`` (copied from the
    project's reference collection) and ``training_runs_3.csv`` (transcribed by the project)."""
    ref = Path(__file__).resolve().parent / "data" / "reference"
    return [ref / "training_runs.csv", ref / "training_runs_2.csv", ref / "training_runs_3.csv"]


def default_runs_path() -> Path:
    return default_runs_paths()[0]


def load_items(paths, chips: dict | None = None) -> list[Case | Skipped]:
    """Every row of every runs CSV, expressed or skipped; each tagged with its file's stem."""
    chips = {} if chips is None else chips
    items = []
    for path in paths:
        items += [row_to_case(r, chips, Path(path).stem) for r in read_runs(path)]
    return items
