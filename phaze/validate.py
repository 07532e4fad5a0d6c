"""Validation against published training runs (shared/DESIGN.md section 8).

Each CSV row becomes a case: the row's model, its chip, its own layout. phaze predicts seconds
per step; the row's measured metric is converted to seconds per step with its source's FLOP
convention. Rows phaze cannot express are kept with status ``skipped`` and the reason.

Fields a row leaves blank are filled by documented rules (never by model name or row id):
``ffn_hidden`` = 4·hidden; a FFN width that is not a whole multiple of hidden is gated (SwiGLU);
``vocab`` from the notes ("vocab 51200") or :data:`DEFAULT_VOCAB`; kv heads from the notes
("kv_groups=8"); micro-batch 1; recompute none; sequence parallelism on when tp > 1; FSDP /
distributed optimizer / communication overlap from the framework flags the notes quote.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .arch import Chip, load_chip
from .configio import ConfigError
from .cost import IDEAL, Efficiency
from .plan import Plan
from .step import check_plan, evaluate, model_flops_per_sample
from .workload import Model

REQUIRED_COLUMNS = (
    "run_id", "source_id", "gpu", "gpu_count", "model", "layers", "hidden", "heads", "ffn_hidden",
    "seq_len", "global_batch", "micro_batch", "tp", "pp", "dp", "cp", "vp", "sequence_parallel",
    "recompute", "precision", "measured_metric", "measured_value", "notes")
METRICS = ("tflops_per_gpu", "mfu", "tokens_per_s_per_gpu", "tokens_per_s_total", "step_time_s")
DEFAULT_VOCAB = 51200   # GPT-2 BPE padded to a multiple of 1024 (Megatron's default); see module doc
SHIPPED_GPUS = ("a100-40gb", "a100-80gb", "h100-sxm")
_TRUE = ("yes", "true", "1", "on", "y")
_FALSE = ("no", "false", "0", "off", "n")
_RECOMPUTE = {"full": "full", "uniform": "full", "block": "full", "selective": "selective",
              "none": "none", **{t: "full" for t in _TRUE}, **{f: "none" for f in _FALSE}}


def chip_for_gpu(gpu: str) -> str | None:
    """The shipped chip config for a `gpu` column (A100 SXM 40/80 GB, H100 SXM), or None for a
    GPU phaze does not describe (PCIe and NVL variants, H200, B200, ...)."""
    g = re.sub(r"[\s_]+", "-", gpu.strip().lower())
    if any(x in g for x in ("pcie", "nvl", "h200", "gh200", "b200", "h800", "a800")):
        return None
    if "h100" in g:
        return "h100-sxm"
    if "a100" in g:
        return "a100-40gb" if "40" in g.replace("a100", "") else "a100-80gb"
    return None
DEFAULT_PEAK_16BIT = {"a100-80gb": 312e12, "a100-40gb": 312e12, "h100-sxm": 989.4e12}


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
    layout_from: str = "row"    # row | notes (the notes quote an unconfirmed layout)


@dataclass(frozen=True)
class Skipped:
    run_id: str
    source: str
    gpu: str
    reason: str


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
    return value


def _int(row: dict, key: str, default: int | None = None) -> int | None:
    v = _num(row, key)
    if v is None:
        return default
    if v <= 0 or not float(v).is_integer():
        raise ValueError(f"column {key!r} must be a positive integer, got {row[key]!r}")
    return int(v)


def source_convention(source: str, notes: str) -> str:
    """How a source counts FLOPs for ``tflops_per_gpu`` and ``mfu``:
    ``narayanan96`` (S01: 96·B·s·l·h²(1 + s/6h + V/16lh), recompute pass counted),
    ``llmfoundry`` (6·N·s + 12·l·h·s² per sequence), or ``model`` (Megatron/NeMo model FLOPs:
    the GEMMs of forward and backward, non-causal attention, no recompute)."""
    s = source.lower()
    if s.startswith("s01") or "96*b*s*l*h^2" in notes.replace(" ", "").lower():
        return "narayanan96"
    if s.startswith("s04") or "6*n*s" in notes.replace(" ", "").lower():
        return "llmfoundry"
    return "model"


def convention_flops_per_step(model: Model, global_batch: int, convention: str,
                              recompute: str) -> float:
    B, s, l, h, V = global_batch, model.seq_len, model.layers, model.hidden, model.vocab
    if convention == "narayanan96":
        if recompute == "full":
            return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    if convention == "llmfoundry":
        return B * (6 * model.params * s + 12 * l * h * s * s)
    return model_flops_per_sample(model) * B


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


def _search(pattern: str, text: str, cast=int):
    m = re.search(pattern, text, re.IGNORECASE)
    return cast(m.group(1)) if m else None


def row_to_case(row: dict, chips: dict[str, Chip] | None = None) -> Case | Skipped:
    """Express one CSV row, or say why it cannot be expressed. ``chips`` caches loaded chip
    configs by shipped name (and may pre-set them)."""
    run_id, source, gpu = (row.get("run_id") or "?").strip(), (row.get("source_id") or "?").strip(), \
        (row.get("gpu") or "").strip()
    try:
        return _row_to_case(row, run_id, source, gpu, {} if chips is None else chips)
    except (ValueError, ConfigError) as exc:
        return Skipped(run_id, source, gpu, str(exc))


def _row_to_case(row, run_id, source, gpu, chips) -> Case:
    notes = row.get("notes") or ""
    chip_name = chip_for_gpu(gpu)
    if chip_name is None:
        raise ValueError(f"unknown GPU {gpu!r}; phaze models A100 SXM 40/80 GB and H100 SXM")
    if chip_name not in chips:
        chips[chip_name] = load_chip(chip_name)
    chip = chips[chip_name]
    metric = (row.get("measured_metric") or "").strip()
    if metric not in METRICS:
        raise ValueError(f"unknown measured_metric {metric!r}; allowed: {', '.join(METRICS)}")
    value = _num(row, "measured_value")
    if value is None or value <= 0:
        raise ValueError("measured_value missing or not positive")
    devices = _int(row, "gpu_count")
    layers, hidden, heads, seq = (_int(row, k) for k in ("layers", "hidden", "heads", "seq_len"))
    if None in (devices, layers, hidden, heads, seq):
        raise ValueError("gpu_count, layers, hidden, heads and seq_len are required")
    ffn = _int(row, "ffn_hidden", 4 * hidden)
    kv = _search(r"kv_groups\s*=\s*(\d+)", notes) or heads
    vocab = _search(r"vocab(?:ulary)?(?:[\s_-]*size)?\s*[=:]?\s*(\d{4,7})", notes) or DEFAULT_VOCAB
    precision_text = (row.get("precision") or "").lower()
    precision = next((p for p in ("fp8", "bf16", "fp16") if p in precision_text), "bf16")
    # FlashAttention named in the notes is the flash-attn library (FlashAttention-2 since 2023);
    # frameworks' own fused attention (cuDNN / Transformer Engine) otherwise; fp16 runs of the
    # Megatron papers predate both and materialise the scores
    if "flashattention" in notes.lower().replace("-", "").replace(" ", ""):
        attention = "flash2"
    else:
        attention = "flash" if precision != "fp16" else "standard"
    gated = ffn % hidden != 0
    model = Model(
        name=(row.get("model") or run_id).strip(), layers=layers, hidden=hidden, heads=heads,
        kv_heads=kv, ffn_hidden=ffn, vocab=vocab, seq_len=seq,
        activation="swiglu" if gated else "gelu",
        position_embedding="rotary" if gated else "learned", max_positions=0 if gated else seq,
        tied_embeddings=not gated, norm="rmsnorm" if gated else "layernorm", bias=not gated,
        dropout=attention == "standard", precision=precision)
    if heads % kv:
        raise ValueError(f"kv groups {kv} do not divide heads {heads}")

    layout_from = "row"
    tp, pp, mbs, cp, vp = (_int(row, k) for k in ("tp", "pp", "micro_batch", "cp", "vp"))
    batch = _int(row, "global_batch")
    recompute = (row.get("recompute") or "").strip().lower() or None
    sp_text = (row.get("sequence_parallel") or "").strip().lower()
    quoted = re.search(r"\btp\s*(\d+)\s+pp\s*(\d+)\s+mbs\s*(\d+)\s+gbs\s*(\d+)", notes, re.IGNORECASE)
    if tp is None and pp is None and quoted:
        tp, pp = int(quoted.group(1)), int(quoted.group(2))
        mbs = mbs or int(quoted.group(3))
        batch = batch or int(quoted.group(4))
        layout_from = "notes"
        if recompute is None:
            low = notes.lower()
            recompute = "full" if "full recompute" in low else "selective" if "selective" in low else None
        if not sp_text and "sequence parallel" in notes.lower():
            sp_text = "yes"
    if tp is None or pp is None or batch is None:
        raise ValueError("parallel layout not published (tp, pp or global_batch missing)")
    if recompute is None:   # the column is blank: the framework flags the notes quote, if any
        low = notes.lower()
        if re.search(r"activation[_ -]checkpointing\s*=\s*true|full (activation )?recompute", low):
            recompute = "full"
        elif "selective" in low and "recompute" in low:
            recompute = "selective"
    vp = vp or _search(r"interleaving\s*=\s*(\d+)", notes) or 1
    cp = cp or 1
    mbs = mbs or 1
    recompute = _RECOMPUTE.get(recompute or "none", "none")
    sp = True if sp_text in _TRUE else False if sp_text in _FALSE else tp > 1
    low = notes.lower()
    zero = _search(r"zero[\s_-]*(?:stage)?[\s_-]*([0-3])\b", low) or 0
    if "full_shard" in low or "hybrid_shard" in low or ("fsdp" in low and "shard_grad_op" not in low):
        zero = 3
    elif "shard_grad_op" in low:
        zero = 2
    elif not zero and ("overlap-param-gather" in low or "distributed optimizer" in low
                       or "distributed-optimizer" in low):
        zero = 1
    plan = Plan(tp=tp, pp=pp, mbs=mbs, recompute=recompute, sp=sp, vp=vp, cp=cp, zero=zero,
                attention=attention, tp_overlap="tp-comm-overlap" in low,
                reduce_fp32="mp=default" in precision_text or "allreduce-grads-in-fp32" in low)
    dp_col = _int(row, "dp")
    if dp_col is not None and dp_col * tp * pp * cp != devices:
        raise ValueError(f"dp*tp*pp*cp = {dp_col * tp * pp * cp} != gpu_count {devices}")
    check_plan(model, devices, batch, plan)
    peak = _search(r"vs (?:peak )?(\d{3,4}(?:\.\d+)?) tflop", notes, float)
    peak = peak * 1e12 if peak else DEFAULT_PEAK_16BIT[chip_name]
    step = measured_step_time(metric, value, model, devices, batch,
                              source_convention(source, notes), recompute, peak)
    return Case(run_id, source, gpu, chip, model, devices, batch, plan, step, layout_from)


def read_runs(path: str | Path) -> list[dict]:
    """Read a runs CSV; a missing column is one clear error."""
    path = Path(path)
    try:
        with path.open(newline="") as fh:
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


def default_runs_path() -> Path:
    return Path(__file__).resolve().parent / "data" / "reference" / "training_runs.csv"


@dataclass(frozen=True)
class Prediction:
    run_id: str
    source: str
    gpu: str
    measured_step_s: float | None
    predicted_step_s: float | None
    error: float | None          # (predicted - measured) / measured
    status: str                  # ok | skipped
    reason: str = ""
    layout_from: str = ""


def predict_case(case: Case, eff: Efficiency = IDEAL) -> float:
    return evaluate(case.model, case.chip, case.devices, case.global_batch, case.plan, eff).step_time_s


# --- calibration, summaries, the full validation ------------------------------------------------
def case_weights(cases) -> list[float]:
    """Each source weighs the same in a fit (one benchmark suite with many rows must not decide the
    parameters alone); rows whose layout comes from unconfirmed notes weigh half."""
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.source] = counts.get(c.source, 0) + 1
    return [(0.5 if c.layout_from == "notes" else 1.0) / counts[c.source] for c in cases]


def fit_cases(cases) -> Efficiency:
    """One efficiency set fitted on ``cases`` with :func:`case_weights`."""
    from .calibrate import fit
    return fit(cases, predict_case, weights=case_weights(cases))[0]


def calibrate_cases(cases, progress=None) -> dict[str, Efficiency]:
    """Fit efficiency parameters per chip family, plus ``default`` pooled over all families (used
    for chips no published run covers, such as a proposed accelerator)."""
    families = sorted({c.chip.family for c in cases})
    groups = [(fam, [c for c in cases if c.chip.family == fam]) for fam in families]
    groups.append(("default", list(cases)))
    params = {}
    for fam, group in groups:
        params[fam] = fit_cases(group)
        if progress:
            progress(fam)
    return params


def params_for(chip: Chip, params: dict[str, Efficiency] | None) -> Efficiency:
    if not params:
        return IDEAL
    return params.get(chip.family) or params.get("default") or IDEAL


def predict_all(items, params: dict[str, Efficiency] | None) -> list[Prediction]:
    out = []
    for c in items:
        if isinstance(c, Skipped):
            out.append(Prediction(c.run_id, c.source, c.gpu, None, None, None, "skipped", c.reason))
            continue
        pred = predict_case(c, params_for(c.chip, params))
        out.append(Prediction(c.run_id, c.source, c.gpu, c.measured_step_s, pred,
                              (pred - c.measured_step_s) / c.measured_step_s, "ok", "", c.layout_from))
    return out


def error_stats(errors) -> dict:
    """MAPE, median, max and share within 10 % of a list of relative errors (as percentages)."""
    a = sorted(abs(e) for e in errors)
    if not a:
        return {"rows": 0}
    n = len(a)
    median = a[n // 2] if n % 2 else 0.5 * (a[n // 2 - 1] + a[n // 2])
    return {"rows": n, "mape_pct": 100 * sum(a) / n, "median_pct": 100 * median,
            "max_pct": 100 * a[-1], "within_10pct_share": sum(x <= 0.10 for x in a) / n}


def summarize(preds: list[Prediction]) -> dict:
    ok = [p for p in preds if p.status == "ok"]
    out = {"overall": dict(error_stats([p.error for p in ok]), expressed=len(ok),
                           skipped=len(preds) - len(ok), total=len(preds)),
           "per_gpu": {}, "per_source": {}}
    for key, attr in (("per_gpu", "gpu"), ("per_source", "source")):
        for name in sorted({getattr(p, attr) for p in ok}):
            out[key][name] = error_stats([p.error for p in ok if getattr(p, attr) == name])
    return out


def leave_one_source_out(cases, progress=None) -> tuple[dict, list[Prediction]]:
    """Calibrate without each source in turn and predict that source: the honest error."""
    sources = sorted({c.source for c in cases})
    preds = []
    for s in sources:
        train = [c for c in cases if c.source != s]
        params = calibrate_cases(train)
        preds += predict_all([c for c in cases if c.source == s], params)
        if progress:
            progress(s)
    return summarize(preds), preds


def unseen_gpu(cases, train_family: str = "A100", test_family: str = "H100") -> dict:
    """Calibrate on one chip family only, predict another from its datasheet alone."""
    train = [c for c in cases if c.chip.family == train_family]
    test = [c for c in cases if c.chip.family == test_family]
    if not train or not test:
        return {"rows": 0}
    preds = predict_all(test, {test_family: fit_cases(train)})
    return dict(summarize(preds), train=train_family, test=test_family)


def shipped_params_path() -> Path:
    return Path(__file__).resolve().parent / "data" / "calibration.json"


@lru_cache(maxsize=1)
def load_default_params() -> dict[str, Efficiency] | None:
    """The calibration shipped with phaze (``phaze calibrate`` on the bundled runs)."""
    from .calibrate import load_params
    path = shipped_params_path()
    return load_params(path) if path.exists() else None
