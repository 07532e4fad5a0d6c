"""phaze's operator times against what two GPUs measured: an H200, which phaze was never
calibrated on, and an H100 SXM, the chip whose published training steps fit the H100 family.

phaze's parameters are fitted on whole training steps of A100s, H100s and TPU v4s, never on a
kernel; an H200 (``arch_configs/h200-sxm.yaml``: the H100's SMs with 4.8 TB/s of HBM3e) takes the
H100 fit. Each GPU's measurements are in ``results/kernels/<gpu>/``, none used to fit anything:

- ``kernels.csv``: each operator of real layers timed alone in PyTorch (``tests/bench/measure_kernels.py``
  on the kernels ``results/kernels/cases.csv`` lists, which :func:`case_rows` writes);
- ``sustained.txt``, ``sustained_fp8.txt``: square bf16 and fp8 products held for 15 s, the clock
  and power read each second (``tests/bench/measure_sustained.py``);
- ``step_*.csv``: every kernel of a training step of two depths (4 and 8 layers: Llama 3 8B with
  either attention kernel, MPT-1B; 2 and 4: MPT-1B at 65,536 tokens, with and without full
  recompute) after 6-10 s of steps (``tests/bench/measure_step.py``); their difference is the
  layers between them;
- ``properties.txt`` (``tests/bench/measure_properties.py``): what the chip says of itself, the
  chip file's source for its SMs, shared memory and L2.

``tests/bench/measure_gpu.sh`` runs all four on a GPU in one call (the H100's, 276 s);
``tests/bench/bench_kernels.py`` prints the tables; ``tests/test_kernel_tables.py`` holds the
docs to them.
"""
from __future__ import annotations

import csv
import re
import statistics
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from phaze.arch import load_chip
from phaze.calibrate import load_default_params
from phaze.catalogue import load_model
from phaze.cost import gemm_time, op_time
from phaze.framework import FRAMEWORKS, model_with
from phaze.graph import ExpertLayout, layer_graph

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "results" / "kernels"
CASES_CSV = DATA / "cases.csv"
PARAMS = "H100"   # the chips' family: the fit phaze scores both with


@dataclass(frozen=True)
class Gpu:
    """A measured GPU: its label, the folder of its measurements and phaze's chip file for it."""
    label: str
    folder: Path
    chip: str


GPUS = {"h200": Gpu("H200", DATA / "h200", "arch_configs/h200-sxm.yaml"),
        "h100": Gpu("H100", DATA / "h100", "arch_configs/h100-sxm.yaml")}

# (workload, sequence, micro-batch, tp, attention kernel, precision, expert parallelism[, overrides])
CASES = (
    ("llama2-7b", 4096, 1, 1, "flash", "bf16", 0),
    ("llama2-7b", 4096, 1, 1, "flash2", "bf16", 0),
    ("llama3-70b", 8192, 1, 8, "flash", "bf16", 0),
    ("llama3-70b", 8192, 1, 8, "flash", "fp8", 0),
    ("gpt3-175b", 2048, 1, 8, "flash", "bf16", 0),
    ("megatron-gpt-1.7b", 2048, 4, 1, "standard", "bf16", 0),
    ("gpt2-xl", 1024, 8, 1, "standard", "bf16", 0),
    ("mpt-125m", 2048, 8, 1, "flash2", "bf16", 0),
    ("mpt-1b", 2048, 4, 1, "flash2", "bf16", 0),
    ("qwen3-30b-a3b", 4096, 1, 1, "flash", "bf16", 8),
    ("deepseek-v3", 4096, 1, 1, "flash", "bf16", 8),
)
# fused attention alone, both kernels, by sequence and head width: 16,384 tokens of 2,048-wide
# heads a micro-batch (llama2-7b's layer with its heads reshaped)
ATTENTION_SWEEP = tuple(
    ("llama2-7b", s, 16384 // s, 1, att, "bf16", 0, (("heads", 2048 // d), ("head_dim", d)))
    for att in ("flash", "flash2") for d in (64, 128) for s in (512, 1024, 2048, 4096, 8192, 16384))
# square and token-by-width products outside any layer (weighted, bf16): the tile model's shape curve
SWEEP = tuple((n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192, 16384)) + tuple(
    (4096, k, n) for k, n in ((1024, 1024), (4096, 256), (4096, 768), (768, 4096), (128, 4096)))
# forward element-wise ops timed (the backward's are fused differently by each framework)
VECTOR = {"ln1": "norm", "ln2": "norm", "attn_residual": "add", "ffn_residual": "add",
          "gelu": "gelu", "softmax": "softmax", "attn_dropout": "dropout", "context.permute": "permute"}
FIELDS = ("case", "op", "kind", "batch", "m", "k", "n", "dtype", "layout", "heads", "kv_heads",
          "seq", "head_dim", "value_dim", "causal", "backend", "rows", "cols", "norm")
ELEMENTWISE = ("norm", "add", "gelu", "softmax", "dropout", "permute")


def case_name(c) -> str:
    name, seq, mbs, tp, att, prec, ep, *over = c
    extra = "".join(f"|{k}={v}" for k, v in (over[0] if over else ()))
    return f"{name}|seq={seq}|mbs={mbs}|tp={tp}|attention={att}|precision={prec}|ep={ep}{extra}"


def case_graph(c):
    """(model, layer graph) of a case: one layer on one of tp ranks, no recompute."""
    name, seq, mbs, tp, att, prec, ep, *over = c
    m = load_model(name, seq)
    if prec != m.precision:
        m = replace(m, precision=prec)
    if over:
        o = dict(over[0])
        o.setdefault("kv_heads", o.get("heads", m.kv_heads))
        o.setdefault("v_head_dim", o.get("head_dim", m.v_head_dim))
        m = replace(m, **o)
    return m, layer_graph(m, mbs, tp, tp > 1, att, "none", ExpertLayout(ep=ep) if ep else None, False)


def _layout(name: str) -> str:
    """How the operands lie in memory for the PyTorch stand-in: a linear's forward reads its
    weight transposed (``nt``), its weight gradient its input transposed (``tn``)."""
    if name.endswith(".wgrad"):
        return "tn"
    if name.endswith(("dgrad", "dgrad_a", "dgrad_b", "context")):
        return "nn"
    return "nt"


def case_rows() -> list[dict]:
    """One row per kernel to time (``cases.csv``)."""
    rows = []
    for c in CASES + ATTENTION_SWEEP:
        m, g = case_graph(c)
        _, seq, mbs, tp, att, prec, *_ = c
        sweep = c in ATTENTION_SWEEP
        for op in g.fwd + g.bwd:
            if sweep and op.unit != "tensor+vector":
                continue
            row = dict.fromkeys(FIELDS, "")
            row.update(case=case_name(c), op=op.name)
            if op.unit == "tensor":
                b, M, K, N = op.gemm
                fp8 = prec == "fp8" and op.weighted and b == 1
                row.update(kind="gemm", batch=b, m=M, k=K, n=N, dtype="fp8" if fp8 else "bf16",
                           layout=_layout(op.name))
            elif op.unit == "tensor+vector":
                row.update(kind="attention_bwd" if op.name.endswith(".bwd") else "attention_fwd",
                           batch=mbs, heads=m.heads // tp, kv_heads=max(1, m.kv_heads // tp),
                           seq=seq, head_dim=m.head_dim, value_dim=m.v_head_dim,
                           causal=int(m.architecture == "decoder"),
                           backend="cudnn" if att == "flash" else "flash")
            elif op.unit == "vector" and op.name in VECTOR:
                kind = VECTOR[op.name]
                cols = {"softmax": seq, "dropout": seq, "permute": m.head_dim,
                        "gelu": m.ffn_hidden // tp}.get(kind, m.hidden)
                row.update(kind=kind, rows=int(op.elements) // cols, cols=cols, norm=m.norm,
                           heads=m.heads // tp, batch=mbs, seq=seq)
            else:
                continue
            rows.append(row)
    for M, K, N in SWEEP:
        row = dict.fromkeys(FIELDS, "")
        row.update(case="sweep", op=f"{M}x{K}x{N}", kind="gemm", batch=1, m=M, k=K, n=N,
                   dtype="bf16", layout="nt")
        rows.append(row)
    for op in ("eager_tiny_add", "graph_tiny_add", "eager_linear_step"):
        row = dict.fromkeys(FIELDS, "")
        row.update(case="launch", op=op, kind="launch")
        rows.append(row)
    return rows


def cases_csv() -> str:
    """``cases.csv`` as :func:`case_rows` writes it."""
    lines = [",".join(FIELDS)]
    for r in case_rows():
        lines.append(",".join(str(r[f]) for f in FIELDS))
    return "\n".join(lines) + "\n"


def _chip(gpu: str = "h200"):
    """The GPU as phaze's kernels see it: issued from CUDA graphs (no host dispatch: the events
    time the GPU alone), and the H100 fit without its fixed cost per kernel (compared apart)."""
    chip = replace(load_chip(ROOT / GPUS[gpu].chip), execution="cuda-graphs")
    return chip, replace(load_default_params()[PARAMS], kernel_overhead_s=0.0)


def _operators() -> dict[str, tuple]:
    """case name -> (model, its operators by name), for every case timed."""
    out = {}
    for c in CASES + ATTENTION_SWEEP:
        m, g = case_graph(c)
        out[case_name(c)] = (m, {op.name: op for op in g.fwd + g.bwd})
    return out


def _seconds(r: dict, chip, eff, operators: dict) -> float:
    """phaze's device seconds for one measured row (a swept product, or a case's operator)."""
    if r["case"] == "sweep":
        return gemm_time(1, int(r["m"]), int(r["k"]), int(r["n"]), chip, "bf16", eff)
    m, ops = operators[r["case"]]
    return op_time(ops[r["op"]], chip, m.precision, eff, bytes_per_element=m.bytes_per_element)


def predicted(rows: list[dict], gpu: str = "h200") -> dict[tuple[str, str], float]:
    """phaze's device seconds for each measured (case, op) on ``gpu``, from the current model."""
    chip, eff = _chip(gpu)
    operators = _operators()
    return {(r["case"], r["op"]): _seconds(r, chip, eff, operators) for r in rows}


def read_measured(gpu: str = "h200") -> tuple[list[str], list[dict]]:
    """(the ``#`` header lines, the rows) of a GPU's kernels timed alone."""
    lines = (GPUS[gpu].folder / "kernels.csv").read_text().splitlines()
    return ([ln for ln in lines if ln.startswith("#")],
            list(csv.DictReader(ln for ln in lines if not ln.startswith("#"))))


def kernel_class(r: dict) -> str:
    k = r["kind"]
    if k == "gemm":
        if r["case"] == "sweep":
            return "GEMM, shape sweep"
        return ("GEMM fp8" if r["dtype"] == "fp8" else "GEMM bf16") + (", batched" if int(r["batch"]) > 1 else "")
    if k.startswith("attention"):
        kernel = "cuDNN" if r["backend"] == "cudnn" else "FlashAttention-2"
        return f"attention {'backward' if k.endswith('bwd') else 'forward'}, {kernel}"
    return "element-wise (one kernel)" if k in ELEMENTWISE else k


def kernel_errors(gpu: str = "h200") -> list[tuple[dict, float, float]]:
    """(row, measured s, phaze s) for each timed kernel that stands for one phaze operator (an
    element-wise call that launched more than one kernel is left out)."""
    _, rows = read_measured(gpu)
    timed = [r for r in rows if r["measured_s"] and r["kind"] != "launch"
             and (r["kind"] not in ELEMENTWISE or r["kernels"] == "1")]
    pred = predicted(timed, gpu)
    return [(r, float(r["measured_s"]), pred[(r["case"], r["op"])]) for r in timed]


def _stats(errors: list[float]) -> str:
    return (f"{len(errors)} | {100 * statistics.mean(abs(e) for e in errors):.1f} % | "
            f"{100 * statistics.mean(errors):+.1f} % | {100 * statistics.median(errors):+.1f} %")


def kernel_table(gpu: str = "h200") -> str:
    """phaze's operator time against each kernel timed alone, by kind of kernel: MAPE, signed
    bias and median error of (phaze - measured) / measured."""
    groups: dict[str, list[float]] = {}
    for r, t, p in kernel_errors(gpu):
        groups.setdefault(kernel_class(r), []).append((p - t) / t)
    out = ["| kernels | n | MAPE | bias | median |", "|---|---|---|---|---|"]
    every = []
    for k in sorted(groups):
        every += groups[k]
        out.append(f"| {k} | {_stats(groups[k])} |")
    out.append(f"| all | {_stats(every)} |")
    return "\n".join(out)


def attention_rates(gpu: str = "h200") -> str:
    """Fused attention's executed TFLOP/s (the causal half) by sequence, both kernels, head width
    128, measured alone and as phaze gives it, forward and backward."""
    rates: dict[tuple, float] = {}
    for r, t, p in kernel_errors(gpu):
        if "|heads=" not in r["case"] or r["head_dim"] != "128":
            continue
        b, h, s, d = int(r["batch"]), int(r["heads"]), int(r["seq"]), int(r["head_dim"])
        bwd = r["kind"].endswith("bwd")
        flops = 2.0 * b * h * s * s * 2 * d * 0.5 * (2.5 if bwd else 1.0)
        for who, sec in (("measured", t), ("phaze", p)):
            rates[(r["backend"], bwd, who, s)] = flops / sec / 1e12
    seqs = sorted({k[3] for k in rates})
    out = ["| head width 128, causal | " + " | ".join(f"{s:,}" for s in seqs) + " |",
           "|---" * (len(seqs) + 1) + "|"]
    for backend, label in (("cudnn", "cuDNN"), ("flash", "FlashAttention-2")):
        for bwd in (False, True):
            for who in ("measured", "phaze"):
                cells = " | ".join(f"{rates[(backend, bwd, who, s)]:.0f}" for s in seqs)
                out.append(f"| {label} {'backward' if bwd else 'forward'}, {who} | {cells} |")
    return "\n".join(out)


def fragment_share(gpu: str = "h200") -> tuple[float, float, float, int]:
    """What FlashAttention-2 reaches of what phaze's tile model gives it, beside cuDNN's kernel:
    for each pair of the attention sweep (head width, sequence, forward or backward), the measured
    time ratio cuDNN / FlashAttention-2 over phaze's ratio ``flash`` / ``flash2``. (median, least,
    most, pairs)."""
    pairs: dict[tuple, dict] = {}
    for r, t, p in kernel_errors(gpu):
        if "|heads=" in r["case"]:
            pairs.setdefault((r["head_dim"], r["seq"], r["kind"]), {})[r["backend"]] = (t, p)
    shares = [(v["cudnn"][0] / v["flash"][0]) / (v["cudnn"][1] / v["flash"][1]) for v in pairs.values()]
    return statistics.median(shares), min(shares), max(shares), len(shares)


def launch_line(gpu: str = "h200") -> str:
    _, rows = read_measured(gpu)
    got = {r["op"]: float(r["measured_s"]) for r in rows if r["kind"] == "launch" and r["measured_s"]}
    eff = load_default_params()[PARAMS]
    return (f"one-element adds issued eagerly: {got['eager_tiny_add'] * 1e6:.1f} us each (host-bound); "
            f"replayed from a CUDA graph: {got['graph_tiny_add'] * 1e6:.2f} us each; a 64-wide MLP's "
            f"eager training step: {got['eager_linear_step'] * 1e6:.1f} us per kernel. phaze's {PARAMS} fit: "
            f"kernel_overhead_s {eff.kernel_overhead_s * 1e6:.1f} us, host_overhead_s "
            f"{eff.host_overhead_s * 1e6:.1f} us")


def _held_seconds(path: Path) -> tuple[int, list[tuple[float, int, float]]]:
    """(seconds logged, (TFLOP/s, SM clock, power) of each second after the first, before which
    the power limit does not act) of a ``measure_sustained.py`` log."""
    pat = re.compile(r"second\s+(\d+):\s+([\d.]+) TFLOP/s.*: (\d+) MHz, ([\d.]+) W")
    secs = [m.groups() for m in map(pat.search, path.read_text().splitlines()) if m]
    return len(secs), [(float(r), int(c), float(w)) for n, r, c, w in secs if int(n) > 1]


def sustained(path: Path) -> tuple[int, float, tuple[int, int], tuple[float, float]]:
    """(seconds, median TFLOP/s, SM clock range, power range) of a ``measure_sustained.py`` log,
    the first second (before the power limit acts) left out of the median and the ranges."""
    n, held = _held_seconds(path)
    return (n, statistics.median(x[0] for x in held), (min(x[1] for x in held), max(x[1] for x in held)),
            (min(x[2] for x in held), max(x[2] for x in held)))


def held_clock_mhz(path: Path) -> float:
    """The median SM clock of a ``measure_sustained.py`` log, the first second left out."""
    return statistics.median(c for _, c, _ in _held_seconds(path)[1])


def sustained_table(gpu: str = "h200") -> str:
    """Square 8,192 products back to back for 15 s, bf16 and fp8 (``_scaled_mm``), against the
    datasheet peaks, phaze's fitted tensor_fraction (one share of either peak) and phaze's rate
    for the same product (the share, whole tiles in whole waves and the fitted per-tile
    prologue; no launch cost: back to back, launches hide)."""
    chip, eff = _chip(gpu)
    n = 8192
    out = ["| 8,192-square products, 15 s | TFLOP/s held | share of the datasheet peak | SM clock | power | "
           f"phaze's tensor_fraction ({PARAMS} fit) | phaze's rate for this product |", "|---|---|---|---|---|---|---|"]
    for precision, name in (("bf16", "sustained.txt"), ("fp8", "sustained_fp8.txt")):
        _, rate, (c0, c1), (w0, w1) = sustained(GPUS[gpu].folder / name)
        peak = chip.peak_flops(precision) / 1e12
        ours = 2.0 * n ** 3 / gemm_time(1, n, n, n, chip, precision, eff,
                                        bytes_per_element=1 if precision == "fp8" else 2)
        out.append(f"| {precision} | {rate:.0f} | {rate / peak:.3f} of {peak:.1f} | {c0:,}-{c1:,} MHz | "
                   f"{w0:.0f}-{w1:.0f} W | {eff.tensor_fraction:.3f} | {ours / 1e12:.0f} TFLOP/s "
                   f"({100 * (rate * 1e12 / ours - 1):+.0f} % held) |")
    return "\n".join(out)


def _step_kind(name: str) -> str:
    n = name.lower()
    if "flash" in n or "sdpa" in n or "cudnn" in n:
        return "attention"
    if re.search(r"gemm|nvjet|cutlass|xmma|cublas", n):
        return "GEMMs"
    return "other"


@cache
def _profile(path: Path) -> tuple[float, tuple[tuple[str, float], ...]]:
    """(wall seconds per step, every kernel's (name, seconds)) of a ``measure_step.py`` profile."""
    text = path.read_text()
    wall = float(re.search(r"median of \d+: ([\d.e+-]+) s", text).group(1))
    rows = csv.DictReader(ln for ln in text.splitlines() if not ln.startswith("#"))
    return wall, tuple((r["name"], float(r["duration_us"]) * 1e-6) for r in rows)


def step_profile(path: Path) -> tuple[float, dict[str, float]]:
    """(wall seconds per step, kernel seconds by kind) of a ``measure_step.py`` profile."""
    wall, kernels = _profile(path)
    kinds: dict[str, float] = {"GEMMs": 0.0, "attention": 0.0, "other": 0.0}
    for name, seconds in kernels:
        kinds[_step_kind(name)] += seconds
    return wall, kinds


# the profiled steps: (file stem, what ran, workload, sequence, micro-batch, phaze's attention
# kernel, phaze's recompute, the two layer counts profiled)
STEPS = (("flash", "Llama 3 8B, 8,192 tokens, FlashAttention-2", "llama3-8b", 8192, 1, "flash2", "none", (4, 8)),
         ("cudnn", "Llama 3 8B, 8,192 tokens, cuDNN attention", "llama3-8b", 8192, 1, "flash", "none", (4, 8)),
         ("mpt", "MPT-1B, 8 x 2,048 tokens, FlashAttention-2", "mpt-1b", 2048, 8, "flash2", "none", (4, 8)),
         ("mpt64k", "MPT-1B, 65,536 tokens, FlashAttention-2", "mpt-1b", 65536, 1, "flash2", "none", (2, 4)),
         ("mpt64kr", "the same, full recompute", "mpt-1b", 65536, 1, "flash2", "full", (2, 4)))

# the framework each profiled model's code follows (tests/bench/measure_step.py): the Llama layer
# is torchtitan's (complex rotary embedding, key/value heads copied), MPT llm-foundry's
SHAPED_AFTER = {"llama3-8b": "torchtitan", "mpt-1b": "llm-foundry"}


def step_layer(stem: str, gpu: str = "h200") -> tuple[float, dict[str, float]]:
    """One layer's wall and kernel seconds: the deeper step less the shallower one, over the
    layers between them."""
    lo, hi = next(s[-1] for s in STEPS if s[0] == stem)
    w4, k4 = step_profile(GPUS[gpu].folder / f"step_{stem}_{lo}.csv")
    w8, k8 = step_profile(GPUS[gpu].folder / f"step_{stem}_{hi}.csv")
    return (w8 - w4) / (hi - lo), {k: (k8[k] - k4[k]) / (hi - lo) for k in k4}


def phaze_layer(workload: str, seq: int, mbs: int, attention: str,
                recompute: str = "none", gpu: str = "h200") -> tuple[float, dict[str, float]]:
    """phaze's seconds for one layer's forward and backward on ``gpu``, eager, with the H100
    fit and the model settings of the framework the profiled code follows: the sum of its
    operators, by kind."""
    kinds = {"GEMMs": 0.0, "attention": 0.0, "other": 0.0}
    for op, seconds in _layer_ops(workload, seq, mbs, attention, recompute, gpu):
        kinds[{"tensor": "GEMMs", "tensor+vector": "attention"}.get(op.unit, "other")] += seconds
    return sum(kinds.values()), kinds


def _layer_ops(workload: str, seq: int, mbs: int, attention: str, recompute: str = "none",
               gpu: str = "h200") -> list:
    """(operator, phaze's seconds on ``gpu`` with the H100 fit) of one layer's forward and
    backward, with the model settings of the framework the profiled code follows."""
    chip, eff = load_chip(ROOT / GPUS[gpu].chip), load_default_params()[PARAMS]
    m, _ = model_with(FRAMEWORKS[SHAPED_AFTER[workload]], load_model(workload, seq))
    g = layer_graph(m, mbs, 1, False, attention, recompute)
    return [(op, op_time(op, chip, m.precision, eff)) for op in g.fwd + g.bwd]


def step_table(gpu: str = "h200") -> str:
    """One layer's forward and backward on ``gpu``: its kernels in a real step (eager PyTorch,
    one GPU) against phaze's operators, in ms."""
    out = ["| one layer, ms | GEMMs | attention | other kernels | all kernels | step |",
           "|---|---|---|---|---|---|"]
    for stem, label, workload, seq, mbs, kernel, recompute, _ in STEPS:
        wall, k = step_layer(stem, gpu)
        out.append(f"| measured, {label} | {1e3 * k['GEMMs']:.2f} | {1e3 * k['attention']:.2f} | "
                   f"{1e3 * k['other']:.2f} | {1e3 * sum(k.values()):.2f} | {1e3 * wall:.2f} |")
        total, p = phaze_layer(workload, seq, mbs, kernel, recompute, gpu)
        plan = f"attention={kernel}" + (f",recompute={recompute}" if recompute != "none" else "")
        out.append(f"| phaze, `{plan}` | {1e3 * p['GEMMs']:.2f} | {1e3 * p['attention']:.2f} | "
                   f"{1e3 * p['other']:.2f} | {1e3 * total:.2f} | {1e3 * total:.2f} "
                   f"({100 * (total / wall - 1):+.0f} %) |")
    return "\n".join(out)


def chip_table(fast: str = "h200", slow: str = "h100") -> str:
    """The same layers on two GPUs of one die with different memory (the H200's 4.8 TB/s of HBM3e,
    the H100's 3.35 of HBM3): each profiled layer's measured step on each and phaze's, and the
    ratio slow / fast of each, in ms. What phaze's cost model says more memory bandwidth buys,
    against what it bought."""
    a, b = GPUS[slow].label, GPUS[fast].label
    out = [f"| one layer, ms | measured, {a} | measured, {b} | {a} / {b} | phaze, {a} | phaze, {b} | {a} / {b} |",
           "|---|---|---|---|---|---|---|"]
    for stem, label, workload, seq, mbs, kernel, recompute, _ in STEPS:
        m = [step_layer(stem, g)[0] for g in (slow, fast)]
        p = [phaze_layer(workload, seq, mbs, kernel, recompute, g)[0] for g in (slow, fast)]
        out.append(f"| {label} | {1e3 * m[0]:.2f} | {1e3 * m[1]:.2f} | {m[0] / m[1]:.3f} | "
                   f"{1e3 * p[0]:.2f} | {1e3 * p[1]:.2f} | {p[0] / p[1]:.3f} |")
    return "\n".join(out)


# torchtitan's rotary embedding and key/value copies in the profiled Llama layer, by kernel name
# (PyTorch's element-wise kernels), against phaze's operators of the same work: the casts to and
# from fp32 (q and k, forward and backward), the complex products, the copies and their sums
ROTARY_KERNELS = (
    ("fp32 casts", r"direct_copy_kernel_cuda.*lambda\(float\)|bfloat16_copy_kernel_cuda",
     ("rotary.upcast", "rotary.downcast")),
    ("complex products", r"MulFunctor<c10::complex<float>", ("rotary.rotate",)),
    ("key/value copies and their sums",
     r"direct_copy_kernel_cuda.*lambda\(c10::BFloat16\)|reduce_kernel.*sum_functor<c10::BFloat16", (".repeat",)),
)


def _layer_kernels(stem: str, pattern: str, gpu: str = "h200") -> tuple[float, float]:
    """(kernels, seconds) per layer of the profile's kernels whose name matches ``pattern``."""
    lo, hi = next(s[-1] for s in STEPS if s[0] == stem)
    out = []
    for layers in (lo, hi):
        profile = _profile(GPUS[gpu].folder / f"step_{stem}_{layers}.csv")[1]
        found = [t for name, t in profile if re.search(pattern, name)]
        out.append((len(found), sum(found)))
    return (out[1][0] - out[0][0]) / (hi - lo), (out[1][1] - out[0][1]) / (hi - lo)


def rotary_share(stem: str = "flash", gpu: str = "h200") -> tuple[int, int, float]:
    """(kernels, all kernels, share of the layer's wall time) of the rotary embedding and
    key/value copies in one profiled layer."""
    found = [_layer_kernels(stem, pattern, gpu) for _, pattern, _ in ROTARY_KERNELS]
    everything = _layer_kernels(stem, r"^(?!Memset)", gpu)   # kernels, not the memsets
    wall, _ = step_layer(stem, gpu)
    return round(sum(n for n, _ in found)), round(everything[0]), sum(t for _, t in found) / wall


def _rotary_rows(stem: str = "flash", gpu: str = "h200") -> list[tuple[str, float, float, int, float]]:
    """Per group of :data:`ROTARY_KERNELS`: (label, kernels measured, seconds measured, phaze's
    operators, phaze's seconds) for one layer of the profile ``stem``."""
    _, _, workload, seq, mbs, kernel, recompute, _ = next(s for s in STEPS if s[0] == stem)
    ops = _layer_ops(workload, seq, mbs, kernel, recompute, gpu)
    rows = []
    for label, pattern, names in ROTARY_KERNELS:
        mine = [t for op, t in ops if any(x in op.name for x in names)]
        rows.append((label, *_layer_kernels(stem, pattern, gpu), len(mine), sum(mine)))
    return rows


def rotary_coverage(stem: str = "flash", gpu: str = "h200") -> float:
    """phaze's seconds for the rotary embedding and key/value copies of the profiled layer over
    the measured kernels' (:data:`ROTARY_KERNELS`)."""
    rows = _rotary_rows(stem, gpu)
    return sum(r[4] for r in rows) / sum(r[2] for r in rows)


def rotary_table(stem: str = "flash", gpu: str = "h200") -> str:
    """The profiled Llama layer's rotary embedding and key/value copies against phaze's, in us."""
    out = ["| one layer, torchtitan's code | kernels measured | us measured | operators, phaze | us, phaze |",
           "|---|---|---|---|---|"]
    for label, n, t, count, ours in _rotary_rows(stem, gpu):
        out.append(f"| {label} | {n:.0f} | {1e6 * t:.0f} | {count} | "
                   f"{1e6 * ours:.0f} ({100 * (ours / t - 1):+.0f} %) |")
    return "\n".join(out)


def published_line(run_id: str = "R0083", stem: str = "mpt64kr", gpu: str = "h200") -> str:
    """A published run of the same layers set beside the profiled step: its measured seconds per
    sequence and layer on one GPU (the step over the sequences each GPU runs, over the layers; the
    token table, head and optimizer counted in, a small share at long sequences) against one layer
    of the profile, and phaze's leave-one-source-out error on the run."""
    from phaze.runs import default_runs_paths
    runs = {r["run_id"]: r for p in default_runs_paths() for r in csv.DictReader(p.open())}
    pred = {r["run_id"]: r for r in csv.DictReader((ROOT / "results" / "validation" / "predictions.csv").open())}
    run, p = runs[run_id], pred[run_id]
    per_gpu = float(run["global_batch"]) / float(run["gpu_count"])
    published = float(p["measured_step_s"]) / per_gpu / float(run["layers"])
    wall, _ = step_layer(stem, gpu)
    return (f"{run_id} ({run['source_id']}: {run['model']}, {run['seq_len']} tokens, {run['gpu_count']} "
            f"{run['gpu']}, recompute {run['recompute']}): {float(p['measured_step_s']):.2f} s a step of "
            f"{per_gpu:.0f} sequences a GPU, {1e3 * published:.0f} ms a sequence and layer, "
            f"{published / wall:.2f} times this GPU's {1e3 * wall:.0f} ms; phaze, leave one source out: "
            f"{100 * float(p['loso_error']):+.1f} %")


def pinned_fit(pinned: dict[str, float], family: str = PARAMS) -> str:
    """What the published steps say of kernel-level values: the family's rows (the calibration's,
    held-out sources left out) refitted with ``pinned`` parameters held, in-sample MAPE and bias
    against the shipped fit's. A diagnostic: slow (a minute), not a docs table."""
    from phaze import validate as v
    from phaze.calibrate import BOUNDS, fit
    from phaze.runs import Case, default_runs_paths, load_items
    cases = [c for c in v.split_held_out(load_items(default_runs_paths()))[0] if isinstance(c, Case)]
    rows = [c for c in cases if v.in_group(c, family)]
    shipped = load_default_params()[family]
    start = replace(shipped, **pinned)
    eff, _ = fit(rows, v.predict_case, names=[n for n in BOUNDS if n not in pinned], start=start,
                 weights=v.case_weights(rows))
    out = []
    for label, e in (("shipped fit", shipped), ("pinned " + ", ".join(f"{k}={x:g}" for k, x in pinned.items()), eff)):
        s = v.summarize(v.predict_all(rows, {"default": e}))["overall"]
        vals = ", ".join(f"{n} {getattr(e, n):.4g}" for n in BOUNDS)
        out.append(f"{family} rows ({s['rows']}), {label}: in-sample {s['mape_pct']:.1f} % / "
                   f"{s['bias_pct']:+.1f} %; {vals}")
    return "\n".join(out)


def kernel_fit(gpu: str = "h200") -> list[tuple[str, dict[str, float], str]]:
    """The parameters the kernels timed alone ask for, within calibrate's bounds (log least
    squares): tensor_fraction and tile_overhead_k on the bf16 GEMMs, then, with that
    tensor_fraction, attention_fraction and tile_overhead_k on each attention kernel (forward and
    backward). (label, values, MAPE / bias after the fit) each. At the idle chip's boost clock."""
    import numpy as np
    from scipy.optimize import least_squares

    from phaze.calibrate import BOUNDS
    chip, base = _chip(gpu)
    operators = _operators()
    errs = kernel_errors(gpu)

    def one(rows, names, start):
        t = np.array([x[1] for x in rows])

        def res(x):
            e = replace(start, **dict(zip(names, x, strict=True)))
            return np.log(np.array([_seconds(r, chip, e, operators) for r, _, _ in rows]) / t)
        lo, hi = [BOUNDS[n][0] for n in names], [BOUNDS[n][1] for n in names]
        x = least_squares(res, [getattr(start, n) for n in names], bounds=(lo, hi)).x
        e = replace(start, **dict(zip(names, x, strict=True)))
        err = np.exp(res(x)) - 1
        score = f"{100 * np.mean(abs(err)):.1f} % / {100 * np.mean(err):+.1f} %"
        return e, {n: float(getattr(e, n)) for n in names}, score

    gemms = [x for x in errs if x[0]["kind"] == "gemm" and x[0]["dtype"] == "bf16"]
    e, vals, score = one(gemms, ("tensor_fraction", "tile_overhead_k"), base)
    out = [(f"bf16 GEMMs ({len(gemms)})", vals, score)]
    for backend, label in (("cudnn", "cuDNN attention"), ("flash", "FlashAttention-2")):
        att = [x for x in errs if x[0]["kind"].startswith("attention") and x[0]["backend"] == backend]
        _, vals, score = one(att, ("attention_fraction", "tile_overhead_k"), e)
        out.append((f"{label} ({len(att)})", vals, score))
    return out


def kernel_fit_table(gpu: str = "h200") -> str:
    out = ["| kernels timed alone | tensor_fraction | attention_fraction | tile_overhead_k | MAPE / bias after |",
           "|---|---|---|---|---|"]
    for label, vals, score in kernel_fit(gpu):
        cells = " | ".join(f"{vals[n]:.3g}" if n in vals else "" for n in
                           ("tensor_fraction", "attention_fraction", "tile_overhead_k"))
        out.append(f"| {label} | {cells} | {score} |")
    eff = load_default_params()[PARAMS]
    out.append(f"| published steps ({PARAMS} fit) | {eff.tensor_fraction:.3g} | {eff.attention_fraction:.3g} | "
               f"{eff.tile_overhead_k:.3g} | |")
    return "\n".join(out)


if __name__ == "__main__":
    print(kernel_table(), attention_rates(), kernel_fit_table(), launch_line(), sustained_table(), step_table(),
          sep="\n\n")
