"""The GPU measurements in results/kernels/ against the code that reads them and the docs that
quote them (tests/kernel_tables.py): each test fails when the model's operators, the data or the
page move apart."""
import csv
import statistics
from pathlib import Path

import kernel_tables as kt
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_cases_csv_is_what_the_code_writes():
    # the kernels the GPU timed are the operators the current graphs have: a renamed or reshaped
    # operator makes the shipped list stale, and the comparison would match the wrong kernels
    assert kt.CASES_CSV.read_text() == kt.cases_csv()


@pytest.mark.parametrize("gpu", sorted(kt.GPUS))
def test_every_measured_kernel_is_a_current_operator_of_the_same_shape(gpu):
    headers, rows = kt.read_measured(gpu)
    assert f"# measured on NVIDIA {kt.GPUS[gpu].label}" in "\n".join(headers)   # the right chip's file
    cases = {(r["case"], r["op"]): r for r in csv.DictReader(kt.CASES_CSV.open())}
    assert len(rows) == len(cases) == 301
    for r in rows:
        c = cases[(r["case"], r["op"])]
        assert {k: r[k] for k in kt.FIELDS} == c   # same shape, layout, backend as timed
    errs = kt.kernel_errors(gpu)
    # every kernel timed, none failed; the element-wise calls that launched more than one kernel
    # (none in this measurement) are the only ones left out
    assert all(r["measured_s"] for r in rows)
    assert len(errs) == len([r for r in rows if r["kind"] != "launch"]) == 298
    assert all(t > 0 and p > 0 for _, t, p in errs)


@pytest.mark.parametrize("gpu", sorted(kt.GPUS))
def test_a_gemm_prediction_by_hand(gpu):
    # the 8,192-square bf16 product: phaze's time is whole 128 x 256 tiles in whole waves over
    # 132 units (2,048 tiles: 16 waves), each K = 8,192 steps plus the fitted prologue, at
    # tensor_fraction x the 1.83 GHz clock x 32 x 64 MACs a cycle: the comparison's own figure
    # (the same on both GPUs: the same SMs and clock; only their memory differs)
    chip, eff = kt._chip(gpu)
    waves, passes = 16, 16 * (128 * 256) / (32 * 64)
    by_hand = passes * (8192 + eff.tile_overhead_k) / (1.83e9 * eff.tensor_fraction)
    row = {"case": "sweep", "op": "8192x8192x8192", "m": "8192", "k": "8192", "n": "8192"}
    assert kt.predicted([row], gpu)[("sweep", "8192x8192x8192")] == pytest.approx(by_hand, rel=1e-9)
    assert waves == -(-(8192 // 128) * (8192 // 256) // 132)


@pytest.mark.parametrize("gpu", sorted(kt.GPUS))
def test_step_profiles_hold_one_layer_of_kernels_per_layer(gpu):
    # a layer launches the same attention kernels in the shallower and the deeper run:
    # FlashAttention-2's forward, backward, dO.O and dQ conversion (4 a layer), cuDNN's likewise
    for stem, *_, recompute, (lo, hi) in kt.STEPS:
        counts = []
        for layers in (lo, hi):
            text = (kt.GPUS[gpu].folder / f"step_{stem}_{layers}.csv").read_text()
            assert f"NVIDIA {kt.GPUS[gpu].label}" in text.splitlines()[0]
            rows = list(csv.DictReader(x for x in text.splitlines() if not x.startswith("#")))
            counts.append(sum(kt._step_kind(r["name"]) == "attention" for r in rows))
        # a full recompute runs each layer's forward kernel twice
        assert counts[1] - counts[0] == (5 if recompute == "full" else 4) * (hi - lo)
        wall, kinds = kt.step_layer(stem, gpu)
        # the kernels fill the layer: 85-102 % of its wall time (a difference of two medians)
        assert 0.85 * wall < sum(kinds.values()) < 1.02 * wall


def test_the_rotary_kernels_are_torchtitans_by_count():
    # per layer: q and k each cast up and down in the forward and the backward (8), multiplied as
    # complex numbers forward and backward (4); K and V copied forward and summed backward (4);
    # the Llama layer has no biases, whose gradients would be such sums too
    for gpu in kt.GPUS:
        for label, pattern, _ in kt.ROTARY_KERNELS:
            n, t = kt._layer_kernels("flash", pattern, gpu)
            assert n == (8 if label == "fp32 casts" else 4) and t > 0
    assert "| fp32 casts | 8 |" in kt.rotary_table()
    n, every, share = kt.rotary_share()
    doc = " ".join((ROOT / "docs" / "frameworks.md").read_text().split())
    assert f"these kernels are {n} of its {every} and {100 * share:.1f} % of its time" in doc
    page = " ".join((ROOT / "docs" / "rounds.md").read_text().split())   # the round that modelled them
    assert (f"spends {100 * share:.1f} % of its time in these kernels; phaze now gives them "
            f"{100 * kt.rotary_coverage():.0f} % of that") in page


def test_the_validation_page_quotes_the_tables():
    page = (ROOT / "docs" / "validation.md").read_text()
    for table in (kt.kernel_table(), kt.sustained_table(), kt.attention_rates(), kt.step_table(),
                  kt.kernel_fit_table(), kt.rotary_table()):
        assert table in page
    assert kt.launch_line() in page
    assert kt.published_line() in " ".join(page.split())
    median, _, _, pairs = kt.fragment_share()
    assert f"the kernels above ask for {median:.2f}, the median of the sweep's {pairs} pairs" in " ".join(page.split())


def test_the_readme_quotes_the_layer_and_the_tensor_share():
    readme = " ".join((ROOT / "README.md").read_text().split())
    quoted = {}
    for gpu in kt.GPUS:
        for stem, _, workload, seq, mbs, kernel, recompute, _ in kt.STEPS:
            if stem in ("flash", "mpt64k"):   # the two layers the README quotes
                wall, _ = kt.step_layer(stem, gpu)
                total, _ = kt.phaze_layer(workload, seq, mbs, kernel, recompute, gpu)
                quoted[gpu, stem] = f"{100 * (total / wall - 1):+.0f} %"
        _, rate, _, _ = kt.sustained(kt.GPUS[gpu].folder / "sustained.txt")
        quoted[gpu] = f"{rate / (kt.load_chip(ROOT / kt.GPUS[gpu].chip).peak_flops('bf16') / 1e12):.3f}"
    assert (f"is {quoted['h200', 'flash']} too long, and an MPT-1B layer at 65,536 tokens "
            f"{quoted['h200', 'mpt64k']}") in readme
    assert f"{quoted['h100', 'flash']} and {quoted['h100', 'mpt64k'][:-2]} %." in readme
    assert f"{quoted['h200']} of the datasheet on the H200, {quoted['h100']} on the H100" in readme
    assert f"fitted {kt.load_default_params()[kt.PARAMS].tensor_fraction:.3f}" in readme


def test_the_validation_page_quotes_the_h100_and_both_chips():
    page = (ROOT / "docs" / "validation.md").read_text()
    h100 = page[page.index("## Measured on an H100"):page.index("## The fitted parameters")]
    for table in (kt.kernel_table("h100"), kt.sustained_table("h100"), kt.step_table("h100"),
                  kt.kernel_fit_table("h100"), kt.chip_table()):
        assert table in h100
    flat = " ".join(h100.split())
    assert kt.launch_line("h100") in flat and kt.published_line(gpu="h100") in flat
    # the prose's figures: the share held, and the two chips' layers measured and by phaze
    _, rate, _, _ = kt.sustained(kt.GPUS["h100"].folder / "sustained.txt")
    share = rate / (kt.load_chip(ROOT / kt.GPUS["h100"].chip).peak_flops("bf16") / 1e12)
    assert f"The tensor share held under the power limit is {share:.3f} here" in flat
    measured, ours = [], []
    for stem, _, workload, seq, mbs, kernel, recompute, _ in kt.STEPS:
        measured.append(kt.step_layer(stem, "h100")[0] / kt.step_layer(stem, "h200")[0])
        ours.append(kt.phaze_layer(workload, seq, mbs, kernel, recompute, "h100")[0]
                    / kt.phaze_layer(workload, seq, mbs, kernel, recompute, "h200")[0])
    assert f"({min(measured):.3f}-{max(measured):.3f})" in flat
    assert f"gives the H100 {100 * (min(ours) - 1):.1f}-{100 * (max(ours) - 1):.1f} % more time" in flat


def test_the_power_page_quotes_the_held_clocks():
    # docs/power.md's limit: the SM clock each GPU held its bf16 and fp8 products at, under 700 W
    page = " ".join((ROOT / "docs" / "power.md").read_text().split())
    clocks = {}
    for gpu in ("h100", "h200"):
        for name in ("sustained.txt", "sustained_fp8.txt"):
            _, _, (c0, c1), (_, w1) = kt.sustained(kt.GPUS[gpu].folder / name)
            assert w1 > 680   # at the power limit, not below it
            clocks[gpu, name] = f"{c0:,}-{c1:,}"
    h100, h200 = (clocks[g, "sustained.txt"] for g in ("h100", "h200"))
    h100_fp8, h200_fp8 = (clocks[g, "sustained_fp8.txt"] for g in ("h100", "h200"))
    m100, m200 = (kt.held_clock_mhz(kt.GPUS[g].folder / "sustained.txt") for g in ("h100", "h200"))
    quoted = 1830       # the clock both chip files quote their peaks at
    assert (f"held its dense bf16 products at a median {m100:,.0f} MHz ({h100}) at 700 W, {m100 / quoted:.3f} of "
            f"1,830 (`HELD_CLOCK_SHARE`, measured; its fp8 ones at {h100_fp8} MHz; an H200, the same die, held "
            f"{m200:,.0f} MHz ({h200}), {m200 / quoted:.3f}, and {h200_fp8} for fp8") in page


def test_the_h100_section_quotes_the_norms():
    # the element-wise bullet: the norms' mean error on each GPU and the GPT-3 175B sequence-parallel
    # norm (256 rows of 12,288) measured and by phaze on each
    flat = " ".join((ROOT / "docs" / "validation.md").read_text().split())
    norm, gpt3 = {}, {}
    for gpu in ("h100", "h200"):
        errs = kt.kernel_errors(gpu)
        norm[gpu] = statistics.mean((p - t) / t for r, t, p in errs if r["kind"] == "norm")
        (r, t, p), = [x for x in errs if x[0]["op"] == "ln1" and x[0]["case"].startswith("gpt3-175b")]
        assert (int(r["rows"]), int(r["cols"])) == (256, 12288)
        gpt3[gpu] = (t, p)
    assert f"The norms are furthest ({100 * norm['h100']:.0f} % here, {100 * norm['h200']:.0f} % on the H200)" \
        in flat.replace("−", "-")
    assert (f"{1e6 * gpt3['h100'][0]:.0f} us measured on the H100, {1e6 * gpt3['h200'][0]:.0f} on the H200, "
            f"where phaze gives {1e6 * gpt3['h100'][1]:.1f} and {1e6 * gpt3['h200'][1]:.1f}") in flat
