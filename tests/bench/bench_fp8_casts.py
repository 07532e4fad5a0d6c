"""What fp8 training's casts cost in phaze, with each linear casting its own input (``fp8_casts:
separate``, torchao's dynamic scaling) and with Transformer Engine's modules as Megatron-Core
lays out a layer (``fused``: the norms before qkv and fc1 write fp8, sequence parallelism gathers
fp8, the weight gradients' transposes run in the backward): for Llama-3 8B, 70B and 405B on H100
at 8K tokens, the share of one layer's forward and backward operator time in casts and
transposes, and the NeMo preset's step time in both modes. Shipped calibration.

    python tests/bench/bench_fp8_casts.py

Prints the table docs/validation.md carries (``tests/test_readme.py`` holds the two equal).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from readme_tables import fp8_casts_table  # noqa: E402

if __name__ == "__main__":
    print(fp8_casts_table())
