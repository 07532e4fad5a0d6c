"""Context parallelism across nodes: Llama-3 8B at 128K tokens on H100s (tp 8, full recompute,
the NeMo preset, 8 sequences per step, dp 1), cp 4 to 32, so that tp x cp spans 4 to 32 nodes.
Prints each step time, its breakdown, and how much it falls from the cp before. Shipped
calibration.

    python tests/bench/bench_context_parallel.py

Then the same model at tp 1, cp 2 to 16, under each of the five ``cp_comm`` modes. Prints the
tables docs/validation.md and docs/frameworks.md carry (``tests/test_readme.py`` holds them equal).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from readme_tables import context_parallel_table, cp_comm_table  # noqa: E402

if __name__ == "__main__":
    print(context_parallel_table())
    print()
    print(cp_comm_table())
