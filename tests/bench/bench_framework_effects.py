"""What each setting of the Megatron-LM 2021-22 preset costs a small model: the preset's step time
on 8 A100s (80 GB, data parallel, fp16 as that era trained), and how much longer it is than the
same plan with that one setting at phaze's default (``loss=torch``, the gradient reduction under
the last backward, the fused ``adam`` update), then with all three. Shipped calibration.

    python tests/bench/bench_framework_effects.py

Prints the table docs/frameworks.md carries (``tests/test_readme.py`` holds the two equal).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from readme_tables import framework_effects_table  # noqa: E402

if __name__ == "__main__":
    print(framework_effects_table())
