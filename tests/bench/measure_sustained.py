"""A GPU's bf16 (or fp8) matrix rate held for seconds, with its clock and power read meanwhile, PyTorch alone.

    python tests/bench/measure_sustained.py [--seconds 20] [--size 8192]

A kernel timed alone (``measure_kernels.py``) runs at the idle chip's boost clock; a training step
keeps every SM busy for seconds and the chip's power limit may lower its clock. This runs square
products back to back and prints, each second, the rate reached and the SM clock and power that
``nvidia-smi`` reads (assumption: its query lands mid-second; it is a sample, not an average).
"""
from __future__ import annotations

import argparse
import subprocess
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16",
                    help="fp8: torch._scaled_mm on e4m3 operands, per-tensor scales, bf16 output")
    a = ap.parse_args()
    n = a.size
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    product = lambda: torch.matmul(x, y)  # noqa: E731
    if a.dtype == "fp8":
        x8, w8 = x.to(torch.float8_e4m3fn), y.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        product = lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
    flops = 2.0 * n ** 3
    per = 50   # ~70 ms of 8192-products queued: the GPU stays busy while nvidia-smi answers
    q = ""
    t_end = time.perf_counter() + a.seconds
    second = 0
    while time.perf_counter() < t_end:
        second += 1
        t0 = time.perf_counter()
        done = 0
        while time.perf_counter() - t0 < 1.0:
            for _ in range(per):
                product()
            done += per
            if done == per * 2:   # a sample of clock and power while the products run
                q = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                                    "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"second {second:3d}: {done * flops / dt / 1e12:7.1f} TFLOP/s; SM clock, power, temperature: {q}",
              flush=True)


if __name__ == "__main__":
    main()
