"""Count the kernels Megatron-Core's unfused router launches (``moe_router_fusion`` off, its
default), forward and backward, on the CPU: every aten op that is not a view or metadata, under a
``TorchDispatchMode``, for three routers (Qwen3-MoE's softmax top-k with the auxiliary loss,
DeepSeek-V3's sigmoid with expert bias, groups and the sequence auxiliary loss, gpt-oss's without a
loss), the gating GEMM's own ops (its GEMMs and the casts of the fallback Transformer Engine would
fuse) counted apart.

Needs PyTorch and megatron-core 0.16.1 (``pip install torch megatron-core==0.16.1``); no GPU: the
router's hard-coded ``torch.cuda.current_device()`` is pointed at the CPU, and megatron-core's
fallback without Transformer Engine (whose ``te_general_gemm`` it leaves undefined) is set to
``None``. One process, world size 1 (gloo), so the auxiliary loss's token-count all-reduce over
tp x cp is not an op here. ``python tests/bench/measure_router_ops.py [--out FILE]``.

Not part of the model yet: phaze costs the router as its GEMM and one top-k softmax kernel each
way (docs/design.md); these counts are what a model of the unfused router would add."""
from __future__ import annotations

import argparse
import collections
import os
import sys
import warnings

FREE = {"view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
        "select", "slice", "alias", "detach", "as_strided", "split", "split_with_sizes", "unbind", "lift_fresh",
        "empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "is_same_size",
        "_reshape_alias", "expand_as", "view_as", "_local_scalar_dense", "set_"}

ROUTERS = (
    ("Qwen3-MoE (softmax top 8 of 128, aux_loss)", dict()),
    ("DeepSeek-V3 (sigmoid, expert bias, 8 groups top 4, seq_aux_loss, top 8 of 256)",
     dict(moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
          moe_router_load_balancing_type="seq_aux_loss", moe_router_num_groups=8, moe_router_group_topk=4,
          num_moe_experts=256, moe_router_topk_scaling_factor=2.5, moe_router_dtype="fp32")),
    ("gpt-oss (softmax top 4 of 128, no loss)", dict(moe_router_load_balancing_type="none", moe_router_topk=4)),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    import megatron.core.transformer.moe.moe_utils as mu
    import torch  # deferred: optional, heavy
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.cuda.current_device = lambda: "cpu"
    mu.te_general_gemm = None
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name not in FREE:
                self.ops[name] += 1
            return func(*args, **(kwargs or {}))

    def fwd_bwd(fn, *inputs):
        out = fn(*inputs)
        probs = out[0] if isinstance(out, tuple) else out
        grad = torch.ones_like(probs)
        with Count() as f:
            out = fn(*inputs)
        probs = out[0] if isinstance(out, tuple) else out
        with Count() as b:
            torch.autograd.backward(probs, grad_tensors=grad)
        return f.ops, b.ops

    lines = ["Megatron-Core 0.16.1's unfused router, kernels (aten ops) a layer and micro-batch, "
             "4,096 tokens, hidden 2,048",
             "router | forward | backward | of them the gating GEMM's (forward, backward) | "
             "the rest (forward, backward)"]
    for label, kw in ROUTERS:
        cfg = dict(num_layers=2, hidden_size=2048, num_attention_heads=32, num_moe_experts=128, moe_router_topk=8,
                   moe_ffn_hidden_size=768, params_dtype=torch.bfloat16, bf16=True, add_bias_linear=False,
                   moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3)
        cfg.update(kw)
        config = TransformerConfig(**cfg)
        router = TopKRouter(config, pg_collection=ProcessGroupCollection.use_mpu_process_groups()).to(torch.bfloat16)
        router.train()
        x = torch.randn(4096, 1, config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
        f, b = fwd_bwd(router, x)
        gf, gb = fwd_bwd(router.gating, x)
        nf, nb, ngf, ngb = sum(f.values()), sum(b.values()), sum(gf.values()), sum(gb.values())
        lines.append(f"{label} | {nf} | {nb} | {ngf}, {ngb} | {nf - ngf}, {nb - ngb}")
        lines.append(f"  forward: {dict(sorted(f.items()))}")
        lines.append(f"  backward: {dict(sorted(b.items()))}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
