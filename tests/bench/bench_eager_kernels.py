"""What the eager kernels of the 2021-22 Megatron-DeepSpeed stack cost in phaze: the biases in
kernels of their own (Megatron's tensor-parallel layers and autograd: the qkv bias add, each bias
gradient's reduction over the tokens), DeepSpeed's mixed-precision wrappers working tensor by
tensor (each gradient's overflow check synchronising the host, the copies to fp32 and back, the
16-bit gradients accumulated by autograd) and the unfused attention's permute, alpha scales and
q, k, v concat. OPT-350M and GPT-2 XL on 8 A100s, fp16, 1,024 tokens, global batch 64, micro-batch
1 and 8. Shipped calibration.

    python tests/bench/bench_eager_kernels.py

Prints the table docs/frameworks.md carries (``tests/test_readme.py`` holds the two equal).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from readme_tables import eager_kernels_table  # noqa: E402

if __name__ == "__main__":
    print(eager_kernels_table())
