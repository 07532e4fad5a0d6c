"""Profile a real training step of transformer layers on a CUDA GPU, PyTorch alone.

    python tests/bench/measure_step.py OUT.csv [--layers 4] [--seq 8192] [--shape mpt-1b --mbs 8]

A torchtitan-shaped Llama 3 8B (RMSNorm, rotary embedding by complex multiplication, grouped-query
attention through ``scaled_dot_product_attention`` (PyTorch's FlashAttention-2, or cuDNN's), SwiGLU,
untied 128,256-token output and cross entropy), or with ``--shape mpt-1b`` llm-foundry's MPT-1B
(LayerNorm and linears with biases, a fused q/k/v projection, GELU, learned positions, the output
tied to the 50,368-token table), bf16 weights, eager. It times whole forward and backward steps
(the median of ten, synchronised) and profiles one: every GPU kernel's name, start and duration.
``tests/kernel_tables.py`` sets one layer of them (the 8-layer step less the 4-layer one) beside
phaze's operators.

``--device cpu`` runs a tiny model with no profile: meant as a check of this script, not a
measurement (not yet run: the machine that wrote it has no PyTorch; its GPU runs used ``cuda``).
"""
from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn


class Layer(nn.Module):
    def __init__(self, h: int, heads: int, kv: int, ffn: int, dev: str, dt):
        super().__init__()
        d = h // heads
        self.heads, self.kv, self.d = heads, kv, d
        kw = {"device": dev, "dtype": dt, "bias": False}
        self.wq, self.wk, self.wv = nn.Linear(h, h, **kw), nn.Linear(h, kv * d, **kw), nn.Linear(h, kv * d, **kw)
        self.wo = nn.Linear(h, h, **kw)
        self.w1, self.w3, self.w2 = nn.Linear(h, ffn, **kw), nn.Linear(h, ffn, **kw), nn.Linear(ffn, h, **kw)
        self.n1 = nn.RMSNorm(h, device=dev, dtype=dt)
        self.n2 = nn.RMSNorm(h, device=dev, dtype=dt)

    def forward(self, x, freqs):
        b, s, _ = x.shape
        y = self.n1(x)
        q = self.wq(y).view(b, s, self.heads, self.d)
        k = self.wk(y).view(b, s, self.kv, self.d)
        v = self.wv(y).view(b, s, self.kv, self.d)
        q, k = rotary(q, freqs), rotary(k, freqs)
        # torchtitan's repeat_kv: each key/value head copied to its group of query heads
        rep = self.heads // self.kv
        k = k[:, :, :, None, :].expand(b, s, self.kv, rep, self.d).reshape(b, s, self.heads, self.d)
        v = v[:, :, :, None, :].expand(b, s, self.kv, rep, self.d).reshape(b, s, self.heads, self.d)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        y = self.n2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def rotary(x, freqs):
    """torchtitan's apply_rotary_emb: the pairs as complex numbers, times the rotations."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs[None, :, None, :]).flatten(3).type_as(x)


class MPTLayer(nn.Module):
    """llm-foundry's MPT block as benchmarked (mpt-*.yaml): pre-LayerNorm with biases, one fused
    q/k/v linear, multi-head attention, GELU FFN of four times the width, biased linears."""

    def __init__(self, h: int, heads: int, kv: int, ffn: int, dev: str, dt):
        super().__init__()
        self.heads, self.d = heads, h // heads
        kw = {"device": dev, "dtype": dt}
        self.wqkv, self.wo = nn.Linear(h, 3 * h, **kw), nn.Linear(h, h, **kw)
        self.up, self.down = nn.Linear(h, ffn, **kw), nn.Linear(ffn, h, **kw)
        self.n1, self.n2 = nn.LayerNorm(h, **kw), nn.LayerNorm(h, **kw)

    def forward(self, x, freqs):
        b, s, h = x.shape
        q, k, v = self.wqkv(self.n1(x)).view(b, s, 3, self.heads, self.d).unbind(2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.n2(x)), approximate="tanh"))


class Model(nn.Module):
    def __init__(self, layers, h, heads, kv, ffn, vocab, seq, dev, dt, mpt: bool = False, recompute: bool = False):
        super().__init__()
        self.mpt, self.recompute = mpt, recompute
        self.emb = nn.Embedding(vocab, h, device=dev, dtype=dt)
        block = MPTLayer if mpt else Layer
        self.layers = nn.ModuleList(block(h, heads, kv, ffn, dev, dt) for _ in range(layers))
        if mpt:   # learned positions, a final LayerNorm, the output tied to the token table
            self.pos = nn.Embedding(seq, h, device=dev, dtype=dt)
            self.norm = nn.LayerNorm(h, device=dev, dtype=dt)
        else:
            self.norm = nn.RMSNorm(h, device=dev, dtype=dt)
            self.out = nn.Linear(h, vocab, bias=False, device=dev, dtype=dt)
        d = h // heads
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=dev).float() / d))
        angles = torch.outer(torch.arange(seq, device=dev).float(), inv)
        self.freqs = torch.polar(torch.ones(seq, d // 2, device=dev), angles)

    def forward(self, tokens, labels):
        x = self.emb(tokens)
        if self.mpt:
            x = x + self.pos.weight[None, : tokens.shape[1]]
        for layer in self.layers:
            if self.recompute:   # full recompute: each layer's forward runs again in the backward
                x = torch.utils.checkpoint.checkpoint(layer, x, self.freqs, use_reentrant=False)
            else:
                x = layer(x, self.freqs)
        y = self.norm(x)
        logits = y @ self.emb.weight.t() if self.mpt else self.out(y)
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def smi() -> str:
    """The SM clock and power draw now, as nvidia-smi reads them ("" where it cannot)."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:   # noqa: BLE001 - a reading, never a reason to lose the profile
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--shape", choices=("llama3-8b", "mpt-1b"), default="llama3-8b",
                    help="llama3-8b: torchtitan's Llama; mpt-1b: llm-foundry's MPT-1B (give --seq 2048)")
    ap.add_argument("--mbs", type=int, default=1, help="micro-batch (sequences a step)")
    ap.add_argument("--recompute", action="store_true", help="full recompute: every layer checkpointed")
    ap.add_argument("--attention", choices=("flash", "cudnn"), default="flash",
                    help="SDPA backend: flash (FlashAttention-2, torchtitan's) or cudnn (Transformer Engine's)")
    ap.add_argument("--warm-seconds", type=float, default=0.0,
                    help="run steps this long first, so that the timed ones run at the clock a long run "
                         "settles to under the chip's power limit")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    cuda = a.device == "cuda"
    mpt = a.shape == "mpt-1b"
    if not cuda:
        dims = (2, 64, 4, 4 if mpt else 2, 128, 256, 32)
    elif mpt:
        dims = (a.layers, 2048, 16, 16, 8192, 50368, a.seq)
    else:
        dims = (a.layers, 4096, 32, 8, 14336, 128256, a.seq)
    torch.manual_seed(0)
    model = Model(*dims, a.device, torch.bfloat16, mpt, a.recompute)
    seq, vocab = dims[6], dims[5]
    tokens = torch.randint(0, vocab, (a.mbs, seq), device=a.device)
    labels = torch.randint(0, vocab, (a.mbs, seq), device=a.device)

    def step():
        model.zero_grad(set_to_none=True)
        model(tokens, labels).backward()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    B = torch.nn.attention.SDPBackend
    backend = {"flash": B.FLASH_ATTENTION, "cudnn": B.CUDNN_ATTENTION}[a.attention] if cuda else B.MATH
    ctx = torch.nn.attention.sdpa_kernel([backend])
    with ctx:
        for _ in range(3):
            step()
        sync()
        t_warm = time.perf_counter() + a.warm_seconds
        warm_clock = ""
        while time.perf_counter() < t_warm:
            step()
            if cuda and not warm_clock and time.perf_counter() > t_warm - 1.0:
                warm_clock = smi()   # read while the step's kernels run
            sync()
        walls = []
        for _ in range(10 if cuda else 2):
            t = time.perf_counter()
            step()
            sync()
            walls.append(time.perf_counter() - t)
        print(f"steps: {', '.join(f'{w * 1e3:.2f}' for w in walls)} ms", flush=True)
        rows = []
        if cuda:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                t = time.perf_counter()
                step()
                sync()
                profiled = time.perf_counter() - t
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    tr = e.time_range
                    rows.append({"name": e.name, "start_us": f"{tr.start:.3f}",
                                 "duration_us": f"{tr.end - tr.start:.3f}"})
    wall = statistics.median(walls)
    with open(a.out, "w", newline="") as f:
        f.write(f"# measured with tests/bench/measure_step.py: torch {torch.__version__}, "
                f"{torch.cuda.get_device_name(0) if cuda else 'cpu'}; {a.shape} shapes, {dims[0]} layers, "
                f"sequence {seq}, micro-batch {a.mbs}, bf16, eager, SDPA backend {a.attention}, "
                f"{'full recompute, ' if a.recompute else ''}"
                f"after {a.warm_seconds:g} s of steps\n")
        f.write(f"# step (forward and backward) wall time, median of {len(walls)}: {wall:.6e} s "
                f"(all: {', '.join(f'{w:.4e}' for w in walls)})\n")
        if cuda:
            f.write(f"# the profiled step's wall time (profiler on): {profiled:.6e} s; SM clock and power read "
                    f"during the last second of the warm-up: {warm_clock or '-'}\n")
        w = csv.DictWriter(f, ("name", "start_us", "duration_us"), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    busy = sum(float(r["duration_us"]) for r in rows) * 1e-6
    print(f"step {wall * 1e3:.2f} ms (median of {len(walls)}); {len(rows)} kernels, "
          f"busy {busy * 1e3:.2f} ms -> {a.out}")


if __name__ == "__main__":
    main()
