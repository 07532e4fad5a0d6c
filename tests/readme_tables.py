"""Tables the README quotes, generated from the code (``python tests/readme_tables.py`` prints
them; ``tests/test_readme.py`` fails when the README and these disagree)."""
from __future__ import annotations

import contextlib
import io
import json

from phaze import cli

GiB = 2.0 ** 30
# (label, phaze place arguments)
PLACEMENTS = [
    ("GPT-3 175B, 1024 × A100-80GB, 1536", ["--workload", "gpt3-175b", "--arch", "a100-80gb", "--devices", "1024",
                                            "--global-batch", "1536"]),
    ("Llama-3 70B, 64 × H100, 128 (8K tokens)", ["--workload", "llama3-70b", "--arch", "h100-sxm", "--devices",
                                                 "64", "--global-batch", "128"]),
    ("Llama-3.1 405B, 16,384 × H100, 2048 (8K tokens)", ["--workload", "llama3-405b", "--arch", "h100-sxm",
                                                         "--devices", "16384", "--global-batch", "2048",
                                                         "--seq-len", "8192"]),
]
RECOMPUTE = {"none": "no recompute", "selective": "selective recompute", "full": "full recompute",
             "op": "per-op recompute"}


def _place(args: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["place", *args, "--format", "json"]) == 0
    return json.loads(out.getvalue())


def _plan_words(label: str) -> str:
    kv = dict(x.split("=", 1) for x in label.split(","))
    words = [f"tp={kv['tp']}", f"pp={kv['pp']}"]
    if "vp" in kv:
        words.append(f"vp={kv['vp']}")
    if "cp" in kv:
        words.append(f"cp={kv['cp']}")
    words.append(f"mbs={kv['mbs']}")
    words.append(RECOMPUTE.get(kv.get("recompute", "none"), kv.get("recompute")))
    if kv.get("zero", "0") != "0":
        words.append(f"ZeRO-{kv['zero']}")
    if "stages" in kv:
        words.append(f"stages {kv['stages']}")
    return ", ".join(words)


def placement_table() -> str:
    rows = ["| workload, cluster, global batch | best plan | step | MFU | HFU | TFLOP/s per device (model) "
            "| power, clock | memory per device | headroom |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, args in PLACEMENTS:
        b = _place(args)["best"]
        p = b["power"]
        clock = (f"{p['clock_hz'] / 1e9:.2f} GHz (throttled)" if p["throttled"] else
                 f"{p['clock_hz'] / 1e9:.2f} GHz")
        rows.append(f"| {label} | {_plan_words(b['plan'])} | {b['step_time_s']:.2f} s | {100 * b['mfu']:.1f} % "
                    f"| {100 * b['hfu']:.1f} % | {b['model_flops_per_s_per_device'] / 1e12:.0f} "
                    f"| {p['energy']['power_w']:.0f} W, {clock} | {b['memory_per_device_bytes'] / GiB:.1f} GiB "
                    f"| {b['headroom_bytes'] / GiB:.1f} GiB |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(placement_table())
