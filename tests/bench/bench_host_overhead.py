"""What an eager framework's host spends issuing one kernel, measured, against phaze's prior.

``host_overhead_s`` (an eager chip's host time to issue one kernel: Python, the module calls,
autograd and PyTorch's dispatcher) is barely constrained by the published runs, so its prior
decides small models' step times. This measures it on the machine it runs on: a stack of
Megatron-LM 2021-style GPT layers (pre-norm, unfused attention with baddbmm, masked fill, softmax,
dropout 0.1, biased linears, GELU) in eager PyTorch on the CPU, with tensors so small (hidden 32 or
64, 16 tokens) that the arithmetic is a small part of each op. One forward and backward step is
timed and its aten ops counted with a ``TorchDispatchMode``; the ops that only make views
(``OpOverload.is_view``) or allocate launch no kernel and are counted apart. The figure per
kernel-launching op includes the op's tiny CPU arithmetic and excludes what a GPU adds (the CUDA
launch call, about 2-5 us of host time), so it is of the order of, not equal to, what a GPU host
pays. PyTorch is not a phaze dependency; without it this prints why and exits 0.

    python tests/bench/bench_host_overhead.py
"""
from __future__ import annotations

import platform
import statistics
import time

from phaze.calibrate import BOUNDS
from phaze.validate import load_default_params

NO_KERNEL = ("aten.empty", "aten.empty_like", "aten.lift_fresh", "aten.detach")


def measure(layers: int, hidden: int, heads: int = 4, tokens: int = 16, steps: int = 200):
    """Seconds per forward-backward step, aten ops per step, kernel-launching ops per step."""
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = self.kernels = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            if not func.is_view and not str(func).startswith(NO_KERNEL):
                self.kernels += 1
            return func(*args, **(kwargs or {}))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
            self.fc1, self.fc2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x):                       # [s, b, h], as Megatron lays it out
            s, b, h = x.shape
            d = h // heads
            q, k, v = self.qkv(self.ln1(x)).view(s, b * heads, 3 * d).transpose(0, 1).split(d, dim=-1)
            scores = torch.baddbmm(torch.empty(b * heads, s, s), q, k.transpose(1, 2), beta=0.0,
                                   alpha=d ** -0.5)
            mask = torch.ones(s, s, dtype=torch.bool).triu(1)
            probs = F.dropout(torch.softmax(scores.masked_fill(mask, -10000.0), -1), 0.1, True)
            ctx = torch.bmm(probs, v).transpose(0, 1).reshape(s, b, h)
            x = x + F.dropout(self.proj(ctx), 0.1, True)
            return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), 0.1, True)

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(*[Layer() for _ in range(layers)])
    x = torch.randn(tokens, 1, hidden, requires_grad=True)
    for _ in range(20):
        model(x).sum().backward()
    with Count() as count:
        model(x).sum().backward()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(steps):
            model(x).sum().backward()
        runs.append((time.perf_counter() - t) / steps)
    return statistics.median(runs), count.ops, count.kernels


def main() -> int:
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: nothing to measure (pip install torch)")
        return 0
    print(f"PyTorch {torch.__version__}, CPU {platform.processor() or platform.machine()}, one thread")
    print(f"{'layers':>6} {'hidden':>6} {'step':>9} {'aten ops':>8} {'kernels':>7} {'per op':>8} {'per kernel':>10}")
    per_kernel = []
    for hidden in (32, 64):
        for layers in (4, 8):
            step, ops, kernels = measure(layers, hidden)
            per_kernel.append(step / kernels)
            print(f"{layers:>6} {hidden:>6} {step * 1e6:>7.0f} us {ops:>8} {kernels:>7} "
                  f"{step / ops * 1e6:>6.2f} us {step / kernels * 1e6:>8.2f} us")
    eager = (load_default_params() or {}).get("execution:eager")
    print(f"measured host time per kernel-launching op: {min(per_kernel) * 1e6:.1f} to "
          f"{max(per_kernel) * 1e6:.1f} us (its tiny CPU arithmetic included, a GPU's launch call not)")
    low, high, prior = BOUNDS["host_overhead_s"]
    print(f"phaze: host_overhead_s prior {prior * 1e6:g} us, bounds {low * 1e6:g}-{high * 1e6:g} us"
          + (f", shipped execution:eager fit {eager.host_overhead_s * 1e6:.2f} us" if eager else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
