"""Command line: ``phaze evaluate ...``. Thin: parse, call the library, print."""
from __future__ import annotations

import argparse
import json
import sys

from .api import as_chip, as_model, as_plan
from .configio import ConfigError
from .step import StepResult, evaluate

GiB = 2.0 ** 30


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit status 2, no usage dump
        self.exit(2, f"phaze: error: {message} (see '{self.prog} --help')\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def format_result(r: StepResult) -> str:
    pct = lambda x: f"{100 * x:5.1f} %"  # noqa: E731
    lines = [
        f"{r.workload} on {r.devices} x {r.chip}, global batch {r.global_batch}",
        f"  plan               {r.plan}, dp={r.dp}, {r.micro_batches} micro-batches per step",
        f"  step time          {r.step_time_s:.3f} s",
        f"  throughput         {r.samples_per_s:,.2f} samples/s   {r.tokens_per_s:,.0f} tokens/s",
        f"  MFU                {pct(r.mfu)}   (HFU {pct(r.hfu).strip()}, model "
        f"{r.model_flops_per_step / 1e15:,.1f} PFLOP per step)",
        f"  memory per device  {r.memory_per_device_bytes / GiB:.1f} GiB of {r.hbm_bytes / GiB:.1f} GiB"
        f" (stage {r.binding_stage}): {'fits' if r.fits else 'DOES NOT FIT'}",
        "  where the time goes:",
    ]
    names = {"compute_s": "compute (tensor units)", "memory_bound_s": "memory-bound ops",
             "communication_exposed_s": "exposed communication",
             "pipeline_bubble_s": "pipeline bubble", "optimizer_s": "optimizer step"}
    for key, value in r.breakdown_s.items():
        lines.append(f"    {names[key]:<24} {value:9.3f} s  {pct(value / r.step_time_s)}")
    m = r.stage_memory[r.binding_stage]
    lines.append(f"  memory on stage {m.stage}: weights+grads+optimizer "
                 f"{m.weights_and_optimizer_bytes / GiB:.1f} GiB, activations "
                 f"{m.activation_bytes / GiB:.1f} GiB, transient {m.transient_bytes / GiB:.1f} GiB")
    return "\n".join(lines)


def cmd_evaluate(args) -> int:
    model = as_model(args.workload, args.seq_len)
    chip = as_chip(args.arch)
    plan = as_plan(args.plan)
    result = evaluate(model, chip, args.devices, args.global_batch, plan)
    if not result.fits and not args.allow_oom:
        m = result.stage_memory[result.binding_stage]
        raise ConfigError("--plan", None, f"does not fit: needs {m.total_bytes / GiB:.1f} GiB per device "
                          f"on stage {m.stage}, {chip.name} has {chip.hbm_bytes / GiB:.1f} GiB; allowed: "
                          f"plans that fit (try recompute=full, a larger tp or pp, a smaller mbs, "
                          f"zero=1) or --allow-oom to print the result anyway")
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(format_result(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="phaze", description="Co-design a training accelerator and how LLMs train on it.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    ev = sub.add_parser("evaluate", help="step time, throughput, MFU and memory of one plan")
    ev.add_argument("--workload", required=True, help="shipped name (gpt3-175b), a YAML, or a HF config.json")
    ev.add_argument("--arch", required=True, help="shipped chip name (a100-80gb) or a YAML path")
    ev.add_argument("--devices", required=True, type=_positive_int, help="number of devices")
    ev.add_argument("--global-batch", required=True, type=_positive_int, help="sequences per step")
    ev.add_argument("--plan", default="", help="e.g. tp=8,pp=16,mbs=1,recompute=full "
                    "(keys: tp pp mbs recompute sp vp cp zero attention optimizer dp_overlap)")
    ev.add_argument("--seq-len", type=_positive_int, default=None, help="override the sequence length")
    ev.add_argument("--format", choices=("text", "json"), default="text")
    ev.add_argument("--allow-oom", action="store_true", help="print the result even if it does not fit")
    ev.set_defaults(func=cmd_evaluate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"phaze: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("phaze: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
