"""What a full recompute re-runs, measured on the frameworks themselves against phaze's graph.

One pre-norm layer as phaze builds it (one qkv matmul, scores, context, the output projection, one
gate-and-up matmul, SwiGLU, the down projection: six matmuls), checkpointed whole. The matmuls the
backward runs beyond those of the same layer without recompute are counted:

- JAX (``jax.checkpoint``, nothing saved, as MaxText's ``remat_policy: full``): the dot ops of
  the compiled gradient's optimised HLO, layers 1 to 3;
- PyTorch: every matmul dispatched in the backward (a ``TorchDispatchMode``), for
  ``torch.utils.checkpoint`` reentrant (as Megatron's and DeepSpeed's checkpoint functions: the
  forward called again), non-reentrant with its default early stop, and ``checkpoint_wrapper``
  with ``early_stop=False`` (torchtitan's full activation checkpointing).

phaze's column: the recomputed GEMMs of ``layer_graph`` under ``recompute_rerun`` whole and
needed. JAX and PyTorch are not phaze dependencies; a column is printed for each one installed.

    python tests/bench/bench_recompute_rerun.py
"""
from __future__ import annotations

import re
from dataclasses import replace

from phaze.catalogue import load_model
from phaze.graph import layer_graph

H, F, T, HEADS = 256, 512, 128, 4


def phaze_reruns(rerun: str) -> int:
    """Recomputed GEMMs in phaze's backward of one layer of this shape."""
    m = replace(load_model("llama3-8b", T), hidden=H, heads=HEADS, kv_heads=HEADS, head_dim=H // HEADS,
                v_head_dim=H // HEADS, ffn_hidden=F, layers=2, vocab=1000, recompute_rerun=rerun)
    g = layer_graph(m, 1, 1, False, "standard", "full")
    return sum(1 for o in g.bwd if o.name.startswith("recompute.") and o.gemm)


def jax_reruns() -> dict[str, float]:
    import jax
    import jax.numpy as jnp

    def rms(x):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)

    def layer(w, x):
        q, k, v = jnp.split(rms(x) @ w["qkv"], 3, -1)
        h = x + (jax.nn.softmax(q @ k.T / 16.0) @ v) @ w["o"]
        g, u = jnp.split(rms(h) @ w["up"], 2, -1)
        return h + (jax.nn.silu(g) * u) @ w["down"]

    ks = jax.random.split(jax.random.PRNGKey(0), 5)
    w = {"qkv": jax.random.normal(ks[0], (H, 3 * H)), "o": jax.random.normal(ks[1], (H, H)),
         "up": jax.random.normal(ks[2], (H, 2 * F)), "down": jax.random.normal(ks[3], (F, H))}
    x = jax.random.normal(ks[4], (T, H))

    def dots(remat: bool, n: int) -> int:
        f = jax.checkpoint(layer) if remat else layer

        def loss(w, x):
            for _ in range(n):
                x = f(w, x)
            return jnp.sum(x * x)
        hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(w, x).compile().as_text()
        return len(re.findall(r"= \S+ dot\(", hlo))
    per_layer = {(dots(True, n) - dots(False, n)) / n for n in (1, 2, 3)}
    assert len(per_layer) == 1, per_layer
    return {f"JAX {jax.__version__} jax.checkpoint": per_layer.pop()}


def torch_reruns() -> dict[str, float]:
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    w = {k: torch.randn(*s, requires_grad=True)
         for k, s in dict(qkv=(H, 3 * H), o=(H, H), up=(H, 2 * F), down=(F, H)).items()}

    def rms(x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    class Layer(torch.nn.Module):
        def forward(self, x):
            q, k, v = (rms(x) @ w["qkv"]).chunk(3, -1)
            h = x + (torch.softmax(q @ k.T / 16.0, -1) @ v) @ w["o"]
            g, u = (rms(h) @ w["up"]).chunk(2, -1)
            return h + (torch.nn.functional.silu(g) * u) @ w["down"]

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func.__name__.startswith(("mm", "addmm", "bmm"))
            return func(*args, **(kwargs or {}))

    x = torch.randn(T, H, requires_grad=True)
    layer = Layer()
    runs = {"none": lambda: layer(x),
            "torch.utils.checkpoint, reentrant": lambda: checkpoint(layer, x, use_reentrant=True),
            "torch.utils.checkpoint, non-reentrant": lambda: checkpoint(layer, x, use_reentrant=False),
            "checkpoint_wrapper, early_stop=False": lambda: checkpoint_wrapper(layer, early_stop=False)(x)}
    counts = {}
    for name, run in runs.items():
        y = run()
        with Count() as c:
            y.pow(2).sum().backward()
        counts[name] = c.n
    return {f"PyTorch {torch.__version__} {k}": v - counts["none"] for k, v in counts.items() if k != "none"}


def main() -> None:
    print("| what re-runs the forward | matmuls re-run of 6 |")
    print("|---|---|")
    for rerun in ("whole", "needed"):
        print(f"| phaze, recompute_rerun: {rerun} | {phaze_reruns(rerun)} |")
    for measure in (jax_reruns, torch_reruns):
        try:
            found = measure()
        except ImportError as e:
            print(f"| ({e.name} not installed) | |")
            continue
        for name, n in found.items():
            print(f"| {name} | {n:g} |")


if __name__ == "__main__":
    main()
