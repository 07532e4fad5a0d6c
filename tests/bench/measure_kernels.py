"""Time the kernels of a cases CSV (``bench_kernels.py --cases``) on a CUDA GPU, PyTorch alone.

    python tests/bench/measure_kernels.py results/kernels/cases.csv OUT.csv [--device cpu]

Each kernel is timed as Triton's ``do_bench`` does: the L2 flushed (a 256 MiB buffer zeroed)
before every repetition, CUDA events around the kernel alone, the median of the repetitions.
GEMMs are ``torch.matmul`` (cuBLAS) in the layout the row names, fp8 ones ``torch._scaled_mm``
(e4m3, per-tensor scales); fused attention is ``scaled_dot_product_attention`` under one backend
(``cudnn``: cuDNN's fused attention, as Transformer Engine runs it; ``flash``: PyTorch's
FlashAttention-2), its backward timed alone (the forward run before the flush). Element-wise
rows are PyTorch's own kernels; each row says how many kernels its call launched (a profiler
count), since only a one-kernel call stands for phaze's one operator. ``launch`` rows: eager
dispatch of a one-element add (host-bound wall time per kernel), the same kernels replayed from
a CUDA graph (device time per kernel), and a small MLP's training step (wall time per kernel).

``--device cpu`` runs every path with wall-clock timers on tiny shapes: meant as a check of this
script where no GPU is, not a measurement (not yet run: the machine that wrote it has no PyTorch,
and its GPU runs used ``cuda``). Not a phaze dependency; the GPU machine needs only PyTorch.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

EXTRA = ("measured_s", "min_s", "reps", "kernels", "note")


class Timer:
    """CUDA events on a GPU, wall clock (after a synchronise) on the CPU."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.flush = torch.empty(256 * 2**20 if self.cuda else 2**20, dtype=torch.int8, device=device)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def run(self, fn, setup=None, budget_s: float = 0.08, max_reps: int = 100) -> tuple[float, float, int]:
        """Median and least seconds of ``fn`` over repetitions, each after ``setup`` (untimed)
        and an L2 flush."""
        for _ in range(2):   # warm-up: plans, autotuning, allocator
            if setup:
                setup()
            fn()
        self.sync()
        t0 = time.perf_counter()
        if setup:
            setup()
        fn()
        self.sync()
        est = max(time.perf_counter() - t0, 1e-6)
        reps = int(max(5, min(max_reps, budget_s / est)))
        times = []
        if self.cuda:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
            for s, e in ev:
                if setup:
                    setup()
                self.flush.zero_()
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) / 1e3 for s, e in ev]
        else:
            for _ in range(reps):
                if setup:
                    setup()
                self.flush.zero_()
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
        return statistics.median(times), min(times), reps


def kernel_count(fn, device: str) -> int | str:
    """Kernels one call launches (PyTorch's profiler), or "" where it cannot tell."""
    if device != "cuda":
        return ""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:   # noqa: BLE001 - a count is a nicety, never a reason to stop
        return ""


def _int(r: dict, k: str) -> int:
    return int(r[k]) if r[k] else 0


def _shrink(n: int, device: str, to: int = 64) -> int:
    return n if device == "cuda" else max(16, min(n, to))


def gemm(r: dict, timer: Timer, device: str):
    M, K, N = (_shrink(_int(r, k), device) for k in ("m", "k", "n"))
    b = _int(r, "batch") if device == "cuda" else min(_int(r, "batch"), 2)
    dt = torch.bfloat16
    if r["dtype"] == "fp8":
        if device != "cuda":
            return None, "fp8 needs a GPU"
        a = torch.randn(M, K, device=device).to(torch.float8_e4m3fn)
        w = torch.randn(N, K, device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        fn = lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=dt)  # noqa: E731
        fast = timer.run(lambda: torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=dt,
                                                  use_fast_accum=True))
        return timer.run(fn), f"split accumulation (fast accumulation: {fast[0]:.4e} s)"
    shape = (lambda x, y: (b, x, y)) if b > 1 else (lambda x, y: (x, y))
    lay = r["layout"]
    a = torch.randn(*shape(K, M), device=device, dtype=dt).transpose(-1, -2) if lay == "tn" else \
        torch.randn(*shape(M, K), device=device, dtype=dt)
    w = torch.randn(*shape(N, K), device=device, dtype=dt).transpose(-1, -2) if lay == "nt" else \
        torch.randn(*shape(K, N), device=device, dtype=dt)
    return timer.run(lambda: torch.matmul(a, w)), ""


def attention(r: dict, timer: Timer, device: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, H, Hk = _int(r, "batch"), _int(r, "heads"), _int(r, "kv_heads")
    s, d, dv = _shrink(_int(r, "seq"), device, 128), _int(r, "head_dim"), _int(r, "value_dim")
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[r["backend"]]
    if device != "cuda":
        backend, H, Hk = SDPBackend.MATH, min(H, 4), min(Hk, 4)
    dt = torch.bfloat16
    notes = []

    def make(hk: int, vdim: int):
        q = torch.randn(b, H, s, d, device=device, dtype=dt, requires_grad=True)
        k = torch.randn(b, hk, s, d, device=device, dtype=dt, requires_grad=True)
        v = torch.randn(b, hk, s, vdim, device=device, dtype=dt, requires_grad=True)
        return q, k, v

    tries = [(Hk, dv, True, "")]
    if Hk != H:
        tries.append((H, dv, False, "keys and values repeated to every head (no GQA in this backend)"))
    if dv != d:
        tries.append((H, d, False, f"values padded {dv}->{d} (backend needs d_v = d)"))
    for hk, vdim, gqa, note in tries:
        kw = {"is_causal": bool(int(r["causal"]))}
        if gqa and hk != H:
            kw["enable_gqa"] = True
        try:
            with sdpa_kernel([backend]):
                res, n = _sdpa(*make(hk, vdim), kw, r["kind"] == "attention_bwd", timer, device)
            if note:
                notes.append(note)
            return res, "; ".join(notes), n
        except Exception as e:   # noqa: BLE001 - recorded in the row, the next fallback tried
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:150]}" if str(e) else type(e).__name__
            notes.append(f"{'GQA' if gqa and hk != H else 'layout'} failed ({why})")
    return None, "; ".join(notes), ""


def _sdpa(q, k, v, kw: dict, backward: bool, timer: Timer, device: str):
    """Time one attention call (or its backward alone) and count its kernels."""
    def fwd():
        return F.scaled_dot_product_attention(q, k, v, **kw)

    if not backward:
        return timer.run(fwd), kernel_count(fwd, device)
    g = torch.randn_like(fwd())
    state = {}

    def setup():
        q.grad = k.grad = v.grad = None
        state["o"] = fwd()

    def bwd():
        state["o"].backward(g)

    res = timer.run(bwd, setup)
    setup()
    return res, kernel_count(bwd, device)


def vector(r: dict, timer: Timer, device: str):
    rows, cols = _int(r, "rows"), _int(r, "cols")
    if device != "cuda":
        rows, cols = min(rows, 64), min(cols, 64)
    dt = torch.bfloat16
    x = torch.randn(rows, cols, device=device, dtype=dt)
    kind = r["kind"]
    if kind == "norm":
        w = torch.ones(cols, device=device, dtype=dt)
        bias = torch.zeros(cols, device=device, dtype=dt)
        fn = (lambda: F.layer_norm(x, (cols,), w, bias)) if r["norm"] == "layernorm" else \
             (lambda: F.rms_norm(x, (cols,), w, 1e-5))
    elif kind == "add":
        y = torch.randn_like(x)
        fn = lambda: torch.add(x, y)  # noqa: E731
    elif kind == "gelu":
        fn = lambda: F.gelu(x, approximate="tanh")  # noqa: E731
    elif kind == "softmax":
        fn = lambda: torch.softmax(x, -1)  # noqa: E731
    elif kind == "dropout":
        fn = lambda: F.dropout(x, 0.1, training=True)  # noqa: E731
    elif kind == "permute":
        b, heads = _int(r, "batch"), _int(r, "heads")
        s = rows // (b * heads) if device == "cuda" else rows
        x4 = x.view(b, heads, s, cols) if device == "cuda" else x.view(1, 1, rows, cols)
        fn = lambda: x4.permute(2, 0, 1, 3).contiguous()  # noqa: E731
    else:
        return None, f"unknown kind {kind}", ""
    return timer.run(fn), "", kernel_count(fn, device)


def launch(r: dict, timer: Timer, device: str):
    n = 5000 if device == "cuda" else 200
    x = torch.zeros(1, device=device)
    if r["op"] == "eager_tiny_add":
        for _ in range(100):
            x.add_(1)
        timer.sync()
        t = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        timer.sync()
        per = (time.perf_counter() - t) / n
        return (per, per, n), "wall time per kernel, eager, one thread", 1
    if r["op"] == "graph_tiny_add":
        if device != "cuda":
            return None, "CUDA graphs need a GPU", ""
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                x.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        k = 1000
        with torch.cuda.graph(g):
            for _ in range(k):
                x.add_(1)
        g.replay()
        torch.cuda.synchronize()
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        for _ in range(10):
            g.replay()
        en.record()
        torch.cuda.synchronize()
        per = st.elapsed_time(en) / 1e3 / (10 * k)
        return (per, per, 10 * k), "device time per kernel, CUDA-graph replay", 1
    if r["op"] == "eager_linear_step":
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64)).to(device)
        inp = torch.randn(16, 64, device=device)

        def step():
            net.zero_grad(set_to_none=True)
            net(inp).sum().backward()

        for _ in range(20):
            step()
        kernels = kernel_count(step, device) or 0
        steps = 500 if device == "cuda" else 20
        timer.sync()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        timer.sync()
        wall = (time.perf_counter() - t) / steps
        per = wall / kernels if kernels else wall
        note = f"wall time per kernel of a 64-wide MLP's training step ({kernels} kernels, {wall * 1e6:.1f} us a step)"
        return (per, per, steps), note, kernels
    return None, f"unknown launch row {r['op']}", ""


def header(device: str) -> list[str]:
    lines = [f"# measured {datetime.date.today().isoformat()} with tests/bench/measure_kernels.py: "
             f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
             f"cuDNN {torch.backends.cudnn.version() if device == 'cuda' else '-'}, Python {sys.version.split()[0]}"]
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        lines.append(f"# measured on {p.name}: {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB")
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,power.limit",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
            lines.append(f"# measured under driver, max SM clock, max memory clock, power limit: {q}")
        except Exception:   # noqa: BLE001
            pass
    else:
        lines.append("# measured on the CPU: a check of the script, not a measurement")
    return lines


def write(path: str, lines: list[str], fields: list[str], rows: list[dict], done: dict, key) -> None:
    with open(path, "w", newline="") as f:
        f.write("\n".join(lines) + "\n")
        w = csv.DictWriter(f, fields + list(EXTRA), lineterminator="\n")
        w.writeheader()
        for r in rows:
            k = key(r) if r["kind"] != "launch" else (r["op"],)
            if k in done:
                w.writerow({**r, **done[k]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases")
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--limit", type=int, default=0, help="time only the first N distinct kernels")
    a = ap.parse_args()
    with open(a.cases, newline="") as f:
        rows = list(csv.DictReader(f))
    fields = list(rows[0].keys())
    key = lambda r: tuple(r[k] for k in fields if k not in ("case", "op"))  # noqa: E731
    done: dict[tuple, dict] = {}
    timer = Timer(a.device)
    lines = header(a.device)
    t_start = time.perf_counter()
    distinct = {}
    for r in rows:
        distinct.setdefault(key(r) if r["kind"] != "launch" else (r["op"],), r)
    todo = list(distinct.items())[: a.limit or None]
    for i, (k, r) in enumerate(todo):
        kind = r["kind"]
        n = ""
        try:
            if kind == "gemm":
                res, note = gemm(r, timer, a.device)
            elif kind.startswith("attention"):
                res, note, n = attention(r, timer, a.device)
            elif kind == "launch":
                res, note, n = launch(r, timer, a.device)
            else:
                res, note, n = vector(r, timer, a.device)
        except Exception as e:   # noqa: BLE001 - a failed kernel is a row that says why
            res, note = None, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
        if res is not None:
            med, lo, reps = res
            done[k] = {"measured_s": f"{med:.4e}", "min_s": f"{lo:.4e}", "reps": reps, "kernels": n, "note": note}
        else:
            done[k] = {"measured_s": "", "min_s": "", "reps": 0, "kernels": n, "note": note}
        print(f"[{i + 1}/{len(todo)} {time.perf_counter() - t_start:6.1f} s] {r['case'][:48]:48s} {r['op']:28s} "
              f"{done[k]['measured_s']:>11s} {note}", flush=True)
        if a.device == "cuda":
            torch.cuda.empty_cache()
        write(a.out, lines, fields, rows, done, key)   # after each kernel: a stopped run keeps its rows
    if a.device == "cuda":
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
            lines.append(f"# measured, then read at the run's end: SM clock, memory clock, power, temperature: {q}")
            write(a.out, lines, fields, rows, done, key)
        except Exception:   # noqa: BLE001
            pass
    print(f"{len(done)} kernels timed in {time.perf_counter() - t_start:.0f} s -> {a.out}")


if __name__ == "__main__":
    main()
