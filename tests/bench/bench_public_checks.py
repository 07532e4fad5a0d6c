"""Benchmark: published runs outside the bundled sets, scored with the shipped calibration (no
fitting, not part of any headline). Each row is written here with only what its paper states;
what it does not state is said as an assumption.

- Llama 3 405B on 8,192 and 16,384 H100s (Llama Team 2024, "The Llama 3 Herd of Models",
  arXiv:2407.21783, Table 4: TP 8, CP 1 or 16, PP 16, DP 64 / 128 / 8, sequence 8,192 or 131,072,
  16M tokens per batch; 430, 400 and 380 BF16 TFLOP/s per GPU). Scored with the standard columns
  only, then with ``framework`` torchtitan (PyTorch-native like Meta's stack, but not it).
- PaLM 540B on 6,144 TPU v4 chips in two pods (Chowdhery et al. 2022, arXiv:2204.02311, Sec. 4
  and Table 3: 12-way model parallelism and 256-way fully sharded data parallelism in each pod,
  data parallelism across the two; 46.2 % MFU, 57.8 % HFU with rematerialisation). Assumptions:
  a global batch of 2,048 sequences of 2,048 tokens (the batch grew from 512 to 2,048 during
  training; the paper does not say at which its MFU was measured), full recompute, the
  ``maxtext`` preset as a stand-in for its JAX/Pathways stack.

Run: python tests/bench/bench_public_checks.py
"""
from __future__ import annotations

from dataclasses import replace

from phaze import validate as v
from phaze.arch import load_chip
from phaze.framework import FRAMEWORKS, plan_with
from phaze.plan import Plan
from phaze.power import within_limit
from phaze.system import apply_system, as_system, with_devices_per_node
from phaze.workload import load_model

LLAMA3 = [   # (run, GPUs, cp, dp, sequence, global batch in sequences, TFLOP/s per GPU)
    ("8K GPUs", 8192, 1, 64, 8192, 2048, 430.0),
    ("16K GPUs", 16384, 1, 128, 8192, 2048, 400.0),
    ("16K GPUs, cp 16", 16384, 16, 8, 131072, 128, 380.0),
]


def llama3_row(name, gpus, cp, dp, seq, batch, tflops, framework=""):
    row = {k: "" for k in v.MODEL_COLUMNS}
    row.update(run_id=name, source_id="llama3_table4", gpu="H100-SXM5-80GB", gpu_count=str(gpus),
               model="Llama-3.1-405B", layers="126", hidden="16384", heads="128", ffn_hidden="53248",
               seq_len=str(seq), global_batch=str(batch), tp="8", pp="16", cp=str(cp), dp=str(dp),
               precision="bf16", measured_metric="tflops_per_gpu", measured_value=str(tflops),
               framework=framework)
    return row


def main() -> int:
    params = v.load_default_params()
    print("Llama 3 405B (Table 4), shipped calibration: measured step, predicted, error, plan")
    for framework in ("", "torchtitan"):
        for spec in LLAMA3:
            case = v.row_to_case(llama3_row(*spec, framework=framework))
            if not isinstance(case, v.Case):
                print(f"  {spec[0]:16s} {framework or 'no framework':13s} skipped: {case.reason}")
                continue
            plan, predicted = v.scored_plan(case, v.params_for(case.chip, params))
            err = predicted / case.measured_step_s - 1
            print(f"  {spec[0]:16s} {framework or 'no framework':13s} {case.measured_step_s:7.2f} s "
                  f"{predicted:7.2f} s {100 * err:+6.1f} %  {plan.label()}")
    print("\nPaLM 540B on 6,144 TPU v4 (Table 3: 46.2 % MFU, 57.8 % HFU); assumptions in the docstring")
    model = load_model("palm-540b")
    fw = FRAMEWORKS["maxtext"]
    pods = with_devices_per_node(as_system("tpuv4-multislice"), 3072)    # two slices of a whole pod each
    chip = apply_system(load_chip("tpuv4"), pods).with_execution(fw.execution)
    eff = v.params_for(chip, params)
    plan = plan_with(fw, Plan(tp=12, sp=False, mbs=1, recompute="full", zero=3), {"recompute", "zero", "sp"},
                     model.precision)[0]
    for label, m in (("parallel block (the paper's)", model),
                     ("as sequential layers", replace(model, parallel_block=""))):
        run = within_limit(m, chip, 6144, 2048, plan, eff)      # as phaze evaluate runs it: within the TDP
        r = run.result
        measured_step = r.model_flops_per_step / (6144 * chip.peak_flops("bf16") * 0.462)
        print(f"  {label:30s} step {r.step_time_s:6.2f} s at {run.clock_hz / 1e9:.2f} GHz "
              f"({100 * run.clock_hz / run.nominal_clock_hz:.0f} % of nominal), "
              f"{100 * (r.step_time_s / measured_step - 1):+5.1f} % against the {measured_step:.2f} s of 46.2 % MFU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
