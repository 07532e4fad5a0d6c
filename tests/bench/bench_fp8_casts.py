"""What the fp8 casts cost in phaze's layer graph: the share of one layer's forward and backward
operator time (the sum of its non-communication operators, shipped H100 calibration) spent in
the separate fp8 casts of the linear layers' inputs and output gradients, for Llama-3 8B, 70B and
405B at 8K tokens, micro-batch 1, sequence parallelism on. Transformer Engine fuses most of these
casts into the preceding norm or activation (not modelled yet; docs/validation.md).

    python tests/bench/bench_fp8_casts.py
"""
from __future__ import annotations

from dataclasses import replace

from phaze import validate as v
from phaze.arch import load_chip
from phaze.cost import op_time
from phaze.graph import layer_graph
from phaze.workload import load_model


def main() -> None:
    chip = load_chip("h100-sxm")
    eff = v.params_for(chip, v.load_default_params())
    print("fp8 casts' share of one layer's operator time, H100, 8K tokens, micro-batch 1, sp on")
    for name, tp in (("llama3-8b", 1), ("llama3-70b", 4), ("llama3-405b", 8)):
        model = replace(load_model(name, 8192), precision="fp8")
        g = layer_graph(model, 1, tp, True, "flash", "none")
        cells = []
        for phase, ops in (("forward", g.fwd), ("backward", g.bwd)):
            times = [(o.name, op_time(o, chip, model.precision, eff)) for o in ops if o.unit != "link"]
            cast = sum(t for n, t in times if "fp8_cast" in n)
            cells.append(f"{phase} {100 * cast / sum(t for _, t in times):4.1f} %")
        print(f"  {name:<12} tp {tp}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
