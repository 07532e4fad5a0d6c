"""What a CUDA GPU says of itself, and its HBM's streaming bandwidth, PyTorch alone.

    python tests/bench/measure_properties.py > OUT.txt

PyTorch's device properties (SMs, L2, shared memory per SM, memory bus width and clock; the
device's UUID left out), ``nvidia-smi -q``'s clocks, power limits and memory, and two streaming
kernels over 2 GiB timed with CUDA events (a copy, read and write; an fp32 sum, read only): the
sources of the measured figures in ``arch_configs/h200-sxm.yaml`` and ``h100-sxm.yaml``.
"""
from __future__ import annotations

import subprocess

import torch


def main() -> None:
    p = torch.cuda.get_device_properties(0)
    for k in sorted(dir(p)):
        if not k.startswith("_") and k != "uuid":
            print(f"{k} {getattr(p, k)}")
    smi = subprocess.run(["nvidia-smi", "-q", "-d", "CLOCK,POWER,MEMORY"], capture_output=True, text=True).stdout
    print("\n".join(line for line in smi.splitlines() if "Timestamp" not in line))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def seconds(fn, reps: int = 20) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    x = torch.empty(2 ** 31, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = seconds(lambda: y.copy_(x))
    print(f"copy 2 GiB: {t * 1e3:.3f} ms, {2 * 2 ** 31 / t / 1e12:.3f} TB/s read+write")
    z = torch.ones(2 ** 29, dtype=torch.float32, device="cuda")
    t = seconds(lambda: z.sum())
    print(f"sum 2 GiB fp32: {t * 1e3:.3f} ms, {2 ** 31 / t / 1e12:.3f} TB/s read")


if __name__ == "__main__":
    main()
