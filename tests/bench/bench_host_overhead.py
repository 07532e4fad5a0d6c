"""What an eager framework's host spends issuing the work of one op, measured, against phaze's prior.

``host_overhead_s`` (an eager chip's host time to issue one op phaze models: Python, the
framework's modules and autograd functions, PyTorch's dispatcher) is barely constrained by the
published runs, so its prior decides small models' step times. Two measurements on the machine
this runs on, eager PyTorch on the CPU, one thread, tensors so small that the arithmetic is a
small part of each op, a GPU's launch call (about 2-5 us of host time) not included:

1. The floor without a framework: GPT layers of plain ``torch.nn`` modules shaped as
   Megatron-LM 2021's (pre-norm, unfused attention with baddbmm, masked fill, softmax, dropout
   0.1, biased linears, GELU; hidden 32 or 64, 16 tokens). One forward and backward step is timed
   and its aten ops counted with a ``TorchDispatchMode``; the ops that only make views or
   allocate launch no kernel and are counted apart: host time per kernel-launching aten op.
2. What phaze's parameter stands for: Megatron-LM's own layer code (read from NeMo 1.11's copy of
   it, ``nemo/collections/nlp/modules/common/megatron/``: transformer.py, fused_bias_gelu.py,
   fused_bias_dropout_add.py, fused_layer_norm.py; apex's fused layer norm and scale-mask-softmax
   are ``autograd.Function``s around one CUDA kernel each, the tensor-parallel regions
   ``autograd.Function``s that do nothing at tp 1, the attention dropout runs inside the CUDA RNG
   tracker's ``fork``), one aten op standing for each CUDA kernel (the TorchScript-fused bias-GeLU
   and bias-dropout-add, whose real calls cost more host time, one op each): the time one layer
   adds to a step (8 layers against 4) over the ops phaze models for that layer (standard
   attention, separate bias kernels, dropout).

PyTorch is not a phaze dependency; without it this prints why and exits 0.

    python tests/bench/bench_host_overhead.py
"""
from __future__ import annotations

import platform
import statistics
import time

from phaze.calibrate import BOUNDS, load_default_params

NO_KERNEL = ("aten.empty", "aten.empty_like", "aten.lift_fresh", "aten.detach", "aten._unsafe_view")


def count(step) -> tuple[int, int]:
    """(aten ops, kernel-launching aten ops) of one call of ``step``."""
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

    with Count() as c:
        step()
    return c.ops, c.kernels


def timed(step, steps: int = 200) -> tuple[float, int, int]:
    """(median seconds of one call of ``step`` over five runs of ``steps`` calls, after 20 to warm
    up; aten ops and kernel-launching aten ops of one call)."""
    for _ in range(20):
        step()
    ops, kernels = count(step)
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(steps):
            step()
        runs.append((time.perf_counter() - t) / steps)
    return statistics.median(runs), ops, kernels


def measure(layers: int, hidden: int, heads: int = 4, tokens: int = 16, steps: int = 200):
    """Seconds per forward-backward step, aten ops per step, kernel-launching ops per step."""
    import torch
    import torch.nn.functional as F
    from torch import nn

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
    return timed(lambda: model(x).sum().backward(), steps)


def megatron_stack(layers: int, hidden: int, heads: int):
    """Megatron-LM's GPT layer at tensor-parallel size 1, as its code is structured (see the
    module docstring); each CUDA kernel is one aten op."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch import nn

    class Region(torch.autograd.Function):     # _CopyToModelParallelRegion / _ReduceFrom...: tp 1
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    class LayerNormFn(torch.autograd.Function):   # apex FusedLayerNormAffineFunction
        @staticmethod
        def forward(ctx, x, w, b, shape, eps):
            ctx.shape, ctx.eps = shape, eps
            x, w, b = x.contiguous(), w.contiguous(), b.contiguous()
            out, mean, rstd = torch.native_layer_norm(x, shape, w, b, eps)
            ctx.save_for_backward(x, w, b, mean, rstd)
            return out

        @staticmethod
        def backward(ctx, g):
            x, w, b, mean, rstd = ctx.saved_tensors
            gx, gw, gb = torch.ops.aten.native_layer_norm_backward(
                g.contiguous(), x, ctx.shape, mean, rstd, w, b, [True, True, True])
            return gx, gw, gb, None, None

    class SoftmaxFn(torch.autograd.Function):     # ScaledUpperTriangMaskedSoftmax: one kernel each way
        @staticmethod
        def forward(ctx, x, scale):
            scale_t = torch.tensor([scale])
            probs = torch.softmax(x, -1)
            ctx.save_for_backward(probs, scale_t)
            return probs

        @staticmethod
        def backward(ctx, g):
            probs, _ = ctx.saved_tensors
            return torch._softmax_backward_data(g, probs, -1, probs.dtype), None

    class GeLUFn(torch.autograd.Function):        # GeLUFunction around the fused bias-GeLU
        @staticmethod
        def forward(ctx, x, bias):
            ctx.save_for_backward(x, bias)
            return torch.add(x, bias)

        @staticmethod
        def backward(ctx, g):
            x, _ = ctx.saved_tensors
            tmp = torch.mul(g, x)
            return tmp, tmp

    rng = {"model-parallel-rng": torch.zeros(16, dtype=torch.uint8)}   # a CUDA generator's state

    @contextlib.contextmanager
    def fork(name="model-parallel-rng"):        # CudaRNGStatesTracker.fork
        orig = rng[name].clone()
        try:
            yield
        finally:
            rng[name] = rng[name].clone()
            del orig

    class BiasDropoutAdd(torch.autograd.Function):
        """The TorchScript-fused bias-dropout-add: one kernel forward; backward one kernel for
        the input's gradient, the residual's passed through, the bias's summed by autograd."""
        @staticmethod
        def forward(ctx, x, bias, residual):
            return torch.add(x, residual)

        @staticmethod
        def backward(ctx, g):
            gx = torch.mul(g, 1.0 / 0.9)
            return gx, gx, g

    def bias_dropout_add(x, bias, residual, prob):
        return BiasDropoutAdd.apply(x, bias, residual)

    class LayerNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.shape, self.eps = (hidden,), 1e-5
            self.weight, self.bias = nn.Parameter(torch.ones(hidden)), nn.Parameter(torch.zeros(hidden))

        def forward(self, x):
            return LayerNormFn.apply(x, self.weight, self.bias, self.shape, self.eps)

    class Linear(nn.Module):   # Column/RowParallelLinear; skip_bias_add returns the bias unapplied
        def __init__(self, n_in, n_out, skip_bias_add):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(n_out, n_in) * 0.02)
            self.bias = nn.Parameter(torch.zeros(n_out))
            self.skip_bias_add = skip_bias_add

        def forward(self, x):
            out = Region.apply(F.linear(Region.apply(x), self.weight,
                                        None if self.skip_bias_add else self.bias))
            return out, (self.bias if self.skip_bias_add else None)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = LayerNorm(), LayerNorm()
            self.query_key_value = Linear(hidden, 3 * hidden, False)
            self.dense = Linear(hidden, hidden, True)
            self.dense_h_to_4h = Linear(hidden, 4 * hidden, True)
            self.dense_4h_to_h = Linear(4 * hidden, hidden, True)
            self.attention_dropout = nn.Dropout(0.1)
            self.norm_factor = (hidden // heads) ** 0.5

        def attention(self, x):                 # ParallelAttention.forward
            mixed, _ = self.query_key_value(x)
            mixed = mixed.view(*(mixed.size()[:-1] + (heads, 3 * (hidden // heads))))
            q, k, v = torch.split(mixed, hidden // heads, dim=-1)
            size = (q.size(1), q.size(2), q.size(0), k.size(0))
            q = q.reshape(size[2], size[0] * size[1], -1)
            k = k.reshape(size[3], size[0] * size[1], -1)
            scores = torch.empty(size[0] * size[1], size[2], size[3], dtype=q.dtype)
            scores = torch.baddbmm(scores, q.transpose(0, 1), k.transpose(0, 1).transpose(1, 2),
                                   beta=0.0, alpha=1.0 / self.norm_factor)
            b, n, sq, sk = scores.view(*size).size()        # FusedScaleMaskSoftmax.forward
            probs = SoftmaxFn.apply(scores.view(-1, sq, sk), 1.0).view(b, n, sq, sk)
            with fork():
                probs = self.attention_dropout(probs)
            size = (v.size(1), v.size(2), q.size(0), v.size(3))
            v = v.reshape(v.size(0), size[0] * size[1], -1)
            ctx = torch.bmm(probs.view(size[0] * size[1], size[2], -1), v.transpose(0, 1))
            ctx = ctx.view(*size).permute(2, 0, 1, 3).contiguous()
            return self.dense(ctx.view(*(ctx.size()[:-2] + (hidden,))))

        def forward(self, x):                   # ParallelTransformerLayer.forward
            out, bias = self.attention(self.input_layernorm(x))
            with torch.enable_grad():
                x = bias_dropout_add(out, bias.expand_as(x), x, 0.1)
            h, bias = self.dense_h_to_4h(self.post_attention_layernorm(x))
            out, bias2 = self.dense_4h_to_h(GeLUFn.apply(h, bias))
            with torch.enable_grad():
                return bias_dropout_add(out, bias2.expand_as(x), x, 0.1)

    return nn.Sequential(*[Layer() for _ in range(layers)])


def modelled_ops(hidden: int, heads: int) -> int:
    """The forward and backward ops phaze models for one layer of :func:`megatron_stack`."""
    from phaze.graph import layer_graph
    from phaze.workload import Model
    model = Model("megatron-2021", 1, hidden, heads, 4 * hidden, 1024, 32, precision="fp16",
                  bias_kernels="separate")
    g = layer_graph(model, 1, 1, False, "standard", "none")
    return len(g.fwd) + len(g.bwd)


def measure_megatron(hidden: int, heads: int = 4, tokens: int = 32, steps: int = 200):
    """(seconds, kernel-launching aten ops) one layer of :func:`megatron_stack` adds to a
    forward-backward step (8 layers against 4), each step's gradients fresh (``set_to_none``, as a
    step's first micro-batch: phaze costs the accumulation of later ones apart)."""
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    per, kernels = {}, {}
    for layers in (4, 8):
        model = megatron_stack(layers, hidden, heads)
        x = torch.randn(tokens, 1, hidden, requires_grad=True)

        def step(model=model, x=x):
            model.zero_grad(set_to_none=True)
            model(x).sum().backward()
        per[layers], _, kernels[layers] = timed(step, steps)
    return (per[8] - per[4]) / 4, (kernels[8] - kernels[4]) // 4


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
    print("\nMegatron-LM's layer code (one aten op per CUDA kernel), 32 tokens, 4 heads, one thread")
    print(f"{'hidden':>6} {'per layer':>10} {'kernels':>7} {'modelled ops':>12} {'per modelled op':>15}")
    per_op = []
    for hidden in (32, 64):
        layer, kernels = measure_megatron(hidden)
        n = modelled_ops(hidden, 4)
        per_op.append(layer / n)
        print(f"{hidden:>6} {layer * 1e6:>7.0f} us {kernels:>7} {n:>12} {layer / n * 1e6:>12.1f} us")
    print(f"measured host time per modelled op of Megatron-LM's layer code: {min(per_op) * 1e6:.1f} to "
          f"{max(per_op) * 1e6:.1f} us (the fused TorchScript calls as one cheap op each, a GPU's "
          f"launch call not)")
    eager = (load_default_params() or {}).get("execution:eager")
    print(f"measured host time per kernel-launching op: {min(per_kernel) * 1e6:.1f} to "
          f"{max(per_kernel) * 1e6:.1f} us (its tiny CPU arithmetic included, a GPU's launch call not)")
    low, high, prior = BOUNDS["host_overhead_s"]
    print(f"phaze: host_overhead_s prior {prior * 1e6:g} us, bounds {low * 1e6:g}-{high * 1e6:g} us"
          + (f", shipped execution:eager fit {eager.host_overhead_s * 1e6:.2f} us" if eager else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
