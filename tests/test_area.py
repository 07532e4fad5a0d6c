"""Area, power and cost model (phaze/area.py) against hand-derived formulas and the reference chips.

Published figures: V100 815 mm^2 / 300 W, A100 826 mm^2 / 400 W, H100 814 mm^2 / 700 W (NVIDIA
whitepapers), TPUv4
< 600 mm^2 (TPUv4 paper, ISCA 2023) / 170 W mean, 192 W max measured (Google Cloud docs). Every
prediction of a reference chip here uses coefficients fitted without it (leave one chip out).
"""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from phaze import cli
from phaze.api import as_chip, as_model
from phaze.area import (
    DEFAULT,
    REFERENCE,
    SHIPPED_FIT,
    Coefficients,
    die_yield,
    dies_per_wafer,
    fit_coefficients,
    good_die_cost,
    hbm_stacks,
    leave_one_out,
    silicon,
    step_energy,
)
from phaze.configio import ConfigError
from phaze.cost import IDEAL
from phaze.plan import Plan, parse_plan
from phaze.space import load_sweep
from phaze.step import evaluate

# ---- cost: hand-derived formulas -----------------------------------------------------------------

def test_dies_per_wafer_by_hand():
    # 300 mm wafer, 827 mm^2: pi*150^2/827 - pi*300/sqrt(2*827) = 85.47 - 23.17 = 62.29
    assert dies_per_wafer(827.0) == pytest.approx(62.29, abs=0.01)
    # 100 mm^2: 706.86 - 66.64 = 640.2
    assert dies_per_wafer(100.0) == pytest.approx(640.2, abs=0.1)


def test_negative_binomial_yield_by_hand():
    # 8.27 cm^2 x 0.15 /cm^2 = 1.2405 defects; (1 + 1.2405/3)^-3 = 1.41350^-3 = 0.3541
    assert die_yield(827.0, 0.15) == pytest.approx(0.3541, abs=1e-4)
    assert die_yield(1e-6, 0.15) == pytest.approx(1.0, abs=1e-6)
    assert die_yield(400.0, 0.15) > die_yield(800.0, 0.15)


def test_827mm2_7nm_die_costs_about_420_usd():
    """The cost anchor of docs/design.md: an 827 mm^2 7 nm die yields ~35 % and costs ~$420 per good die
    ($9346 wafer / (62.29 dies x 0.3541) = $423.7)."""
    usd, dpw, y = good_die_cost(827.0, 7)
    assert y == pytest.approx(0.354, abs=0.002)
    assert usd == pytest.approx(423.7, abs=1.0)
    assert 400 <= usd <= 440


def test_hbm_cost_and_stacks():
    a100 = as_chip("a100-80gb")
    s = silicon(a100)
    # 80 GiB = 85.9 GB at $7/GB
    assert s.cost_breakdown_usd["hbm"] == pytest.approx(85.899 * 7, rel=1e-3)
    assert s.cost_usd == pytest.approx(sum(s.cost_breakdown_usd.values()))
    assert s.hbm_stacks == 5
    # derived without the floor: 80 GiB / 16 GiB HBM2e stacks = 5; TPUv4 32 GiB / 8 GiB HBM2 = 4
    assert hbm_stacks(replace(a100, hbm_stacks=0)) == 5
    assert hbm_stacks(replace(as_chip("tpuv4"), hbm_stacks=0)) == 4
    # twice the capacity needs twice the HBM2e stacks
    assert hbm_stacks(replace(a100, hbm_stacks=0, hbm_bytes=2 * a100.hbm_bytes)) == 10


# ---- fitted coefficients ------------------------------------------------------------------------

def test_shipped_coefficients_are_the_a100_h100_fit():
    fit = fit_coefficients(("a100-80gb", "h100-sxm"))
    assert DEFAULT.fitted_on == ("a100-80gb", "h100-sxm")
    for name in ("control_mm2_per_unit", "control_um2_per_mac", "leakage_w_per_mm2",
                 "switching_fj_per_transistor_cycle"):
        assert getattr(DEFAULT, name) == pytest.approx(getattr(fit, name), rel=1e-3, abs=1e-9), name
    # the area fit solves the two published dies exactly
    assert silicon(as_chip("a100-80gb"), fit).area_mm2 == pytest.approx(826.0, rel=1e-6)
    assert silicon(as_chip("h100-sxm"), fit).area_mm2 == pytest.approx(814.0, rel=1e-6)


def test_fit_refuses_more_than_two_chips():
    with pytest.raises(ConfigError):
        fit_coefficients(tuple(REFERENCE))


@pytest.fixture(scope="module")
def loo():
    return leave_one_out()


@pytest.mark.parametrize("name", ["v100-sxm2-32gb", "a100-80gb", "h100-sxm"])
def test_leave_one_chip_out_area_within_15pct(loo, name):
    """Held out, a GPU's area comes from the two other GPU generations (both area terms fitted on
    two exact dies; TPUv4's "< 600 mm^2" is a bound, never a fitting target). Measured: V100
    +13.6 %, A100 -5.9 %, H100 +13.3 % (issue 20 asks for 15 %; with A100 and H100 alone, one
    exact area, it was -27 % and +41 %)."""
    r = loo[name]
    assert name not in r["coefficients"]["fitted_on"]
    assert len(set(r["coefficients"]["fitted_on"]) - {"tpuv4"}) == 2
    assert abs(r["area_error"]) <= 0.15, r


def test_register_files_and_l1_are_sourced_parts():
    """A100 by hand: 108 SMs enabled of 128 built (die_units_ratio 1.1852), 256 KiB of registers and
    192 KiB of L1/shared memory per SM at 1.3 mm^2/MiB (7 nm): 32 MiB -> 41.6 mm^2 and 24 MiB ->
    31.2 mm^2. The fitted control lump is what is left of the 826 mm^2."""
    parts = silicon(as_chip("a100-80gb")).area_breakdown_mm2
    assert parts["register_files"] == pytest.approx(41.6, rel=1e-3)
    assert parts["sram_local"] == pytest.approx(31.2, rel=1e-3)
    assert sum(parts.values()) == pytest.approx(826.0, rel=1e-5)
    # TPUv4 publishes no register file: none is counted, and its VMEM is its local SRAM
    assert silicon(as_chip("tpuv4")).area_breakdown_mm2["register_files"] == 0.0


def test_leave_one_chip_out_tpuv4_area_is_a_bound(loo):
    """TPUv4's die is published only as < 600 mm^2: predicted from the two GPUs it must be below
    that, and above 480 mm^2 (its sourced blocks, MXUs, 160 MiB of SRAM and 4 HBM PHYs, already take
    ~300 mm^2); a prediction under the bound scores 0 error."""
    r = loo["tpuv4"]
    assert r["coefficients"]["fitted_on"] == SHIPPED_FIT
    assert 480 <= r["area_mm2"] < 600 and r["area_error"] == 0.0, r


@pytest.mark.parametrize("name", list(REFERENCE))
def test_leave_one_chip_out_full_load_power_within_18pct(loo, name):
    """The held-out chip's full-load power (units busy every cycle) against its TDP (V100 300 W,
    A100 400 W, H100 700 W) or TPUv4's measured maximum (192 W): V100 +17 %, A100 +2 %, H100
    +1 %, TPUv4 +16 %."""
    r = loo[name]
    lo, hi = r["published_power_w"]
    assert abs(r["full_load_power_w"] / hi - 1) <= 0.18, r
    assert r["leakage_w"] > 0 and r["leakage_share"] >= 0.05, r


def test_leave_one_chip_out_tpuv4_training_power_within_10pct(loo):
    """TPUv4 measured 170 W mean in training (Jouppi et al., ISCA 2023); held out, GPT-3 175B on
    1024 chips draws 185 W (+9 %) and stays below the full load. (The windows in these tests sit
    just above the measured errors, so that any drift shows.)"""
    r = loo["tpuv4"]
    assert abs(r["power_w"] / 170.0 - 1) <= 0.10, r
    assert r["power_w"] <= r["full_load_power_w"]


def test_shipped_fit_puts_leakage_on_its_floor():
    """Leakage is at least LEAKAGE_SHARE_MIN of each fitted chip's full-load power (the H100 sets
    the floor) and the fitted chips' full load is within 7 % of their TDP (least squares: A100 +6 %,
    H100 -2 %)."""
    from phaze.area import LEAKAGE_SHARE_MIN, full_load_power_w
    for name, tdp in (("a100-80gb", 400.0), ("h100-sxm", 700.0)):
        chip = as_chip(name)
        si = silicon(chip)
        assert si.leakage_w >= LEAKAGE_SHARE_MIN * tdp * (1 - 1e-4)
        assert full_load_power_w(chip) == pytest.approx(tdp, rel=0.07)


# ---- step energy ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def a100_run():
    model, chip = as_model("gpt3-175b"), as_chip("a100-80gb")
    plan = parse_plan("tp=8,pp=16,mbs=1,recompute=full")
    return model, chip, plan, evaluate(model, chip, 1024, 1536, plan, IDEAL)


def test_step_energy_is_consistent(a100_run):
    model, chip, plan, r = a100_run
    e = step_energy(model, chip, 1024, 1536, plan, IDEAL, r)
    assert e.energy_per_step_j == pytest.approx(sum(e.breakdown_j.values()))
    assert e.power_w == pytest.approx(e.energy_per_step_j / r.step_time_s)
    assert e.tokens_per_joule == pytest.approx(1536 * 2048 / (1024 * e.energy_per_step_j))
    assert set(e.breakdown_j) >= {"tensor", "vector", "local_sram", "shared_buffer", "hbm", "link",
                                  "leakage"}
    assert all(v >= 0 for v in e.breakdown_j.values())
    # without a precomputed result it evaluates the plan itself: same answer
    assert step_energy(model, chip, 1024, 1536, plan, IDEAL).energy_per_step_j == pytest.approx(
        e.energy_per_step_j)
    json.dumps(e.to_dict())


def test_tensor_energy_counts_the_hardware_flops():
    """With unfused attention (no causal skipping) the tensor FLOPs behind the energy are exactly
    the hardware FLOPs of HFU: hfu x step time x peak per device."""
    model, chip = as_model("gpt3-175b"), as_chip("a100-80gb")
    plan = Plan(tp=8, pp=16, mbs=1, recompute="full", attention="standard")
    r = evaluate(model, chip, 1024, 1536, plan, IDEAL)
    e = step_energy(model, chip, 1024, 1536, plan, IDEAL, r)
    from phaze.area import energy_coefficients
    flops = e.breakdown_j["tensor"] / energy_coefficients(chip)["tensor"]
    assert flops == pytest.approx(r.hfu * r.step_time_s * chip.peak_flops("fp16"), rel=0.01)


# ---- monotonicity of what a search changes --------------------------------------------------------

GROW = {
    "tensor units": lambda c: c.with_units(tensor_count=2 * c.tensor.count),
    "array size": lambda c: c.with_units(tensor_rows=2 * c.tensor.rows),
    "vector lanes": lambda c: c.with_units(vector_lanes=2 * c.vector.lanes),
    "local SRAM": lambda c: replace(c, local_sram_bytes=2 * c.local_sram_bytes),
    "register files": lambda c: replace(c, register_file_bytes=2 * c.register_file_bytes + 2 ** 18),
    "L1": lambda c: replace(c, l1_bytes=2 * max(c.l1_bytes, c.local_sram_bytes)),
    "shared buffer": lambda c: replace(c, shared_buffer_bytes=2 * c.shared_buffer_bytes),
    "HBM capacity": lambda c: replace(c, hbm_bytes=3 * c.hbm_bytes),
    "HBM bandwidth": lambda c: replace(c, hbm_bandwidth_bytes_per_s=3 * c.hbm_bandwidth_bytes_per_s),
}


@pytest.mark.parametrize("template", ["tpuv4", "a100-80gb", "h100-sxm"])
@pytest.mark.parametrize("what", list(GROW))
def test_more_hardware_more_area_and_cost(template, what):
    base = as_chip(template)
    big = GROW[what](base)
    a, b = silicon(base), silicon(big)
    assert b.area_mm2 > a.area_mm2
    assert b.cost_usd > a.cost_usd


@pytest.mark.parametrize("template", ["tpuv4", "a100-80gb"])
def test_hbm_growth_adds_stacks_and_area(template):
    base = as_chip(template)
    big = replace(base, hbm_bytes=3 * base.hbm_bytes)
    assert silicon(big).hbm_stacks > silicon(base).hbm_stacks
    assert silicon(big).area_mm2 > silicon(base).area_mm2


def test_smaller_node_smaller_die():
    base = as_chip("a100-80gb")
    assert silicon(replace(base, process_node_nm=5)).area_mm2 < silicon(base).area_mm2
    assert silicon(replace(base, process_node_nm=10)).area_mm2 > silicon(base).area_mm2


@pytest.mark.parametrize("clock", [1.0e9, 1.41e9, 2.0e9])
def test_higher_clock_more_power(clock):
    model = as_model("gpt2-xl")
    base = as_chip("a100-80gb")
    plan = Plan(tp=1, pp=1, mbs=4)

    def power(c):
        return step_energy(model, c, 8, 64, plan, IDEAL).power_w
    assert power(replace(base, clock_hz=clock * 1.25)) > power(replace(base, clock_hz=clock))


def test_a_package_of_two_dies_prices_each_die_on_its_own():
    """B200 is two dies in one package: its modelled area splits evenly and each half is yielded
    and priced as a die of its own, which costs less than one die of the whole area (yield falls
    with area); HBM is the package's. A study's fingerprint names the dies only when more than one."""
    b200 = as_chip("b200")
    one = replace(b200, dies=1)
    two, whole = silicon(b200), silicon(one)
    assert two.area_mm2 == pytest.approx(whole.area_mm2)
    half_usd, dpw, y = good_die_cost(two.area_mm2 / 2, b200.process_node_nm)
    assert two.cost_breakdown_usd["die"] == pytest.approx(2 * half_usd)
    assert (two.dies_per_wafer, two.die_yield) == (pytest.approx(dpw), pytest.approx(y))
    assert two.cost_breakdown_usd["die"] < whole.cost_breakdown_usd["die"]
    assert two.cost_breakdown_usd["hbm"] == whole.cost_breakdown_usd["hbm"]
    assert "dies" not in repr(one) and "dies" not in repr(b200) and b200 != one
    sweep = load_sweep(Path(__file__).resolve().parents[1] / "search" / "quickstart.yaml")
    assert replace(sweep, base=replace(sweep.base, dies=2)).fingerprint() != sweep.fingerprint()


def test_silicon_is_cached_and_hashable():
    c = as_chip("tpuv4")
    assert silicon(c) is silicon(c)
    coef = Coefficients(1.0, 100.0, 0.1, 0.01)
    assert silicon(c, coef).leakage_w == pytest.approx(0.1 * silicon(c, coef).area_mm2)
    assert math.isfinite(silicon(c, coef).cost_usd)


# ---- command line ---------------------------------------------------------------------------------

def test_cli_area_json(capsys):
    assert cli.main(["area", "--arch", "tpuv4", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    s = out["silicon"]
    assert out["chip"] == "TPUv4"
    assert s["area_mm2"] == pytest.approx(sum(s["area_breakdown_mm2"].values()))
    assert 480 <= s["area_mm2"] <= 720
    assert s["cost_usd"] == pytest.approx(sum(s["cost_breakdown_usd"].values()))
    assert s["hbm_stacks"] == 4 and 0 < s["die_yield"] < 1 and s["dies_per_wafer"] > 0
    assert out["energy"] is None


def test_cli_area_with_workload(capsys):
    assert cli.main(["area", "--arch", "a100-80gb", "--workload", "gpt3-175b", "--plan",
                     "tp=8,pp=16,mbs=1,recompute=full", "--format", "json"]) == 0
    e = json.loads(capsys.readouterr().out)["energy"]
    assert 300 <= e["power_w"] <= 500
    assert e["tokens_per_joule"] == pytest.approx(1536 * 2048 / (1024 * e["energy_per_step_j"]))


def test_cli_area_says_whether_the_die_area_is_published(capsys):
    assert cli.main(["area", "--arch", "tpuv4"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("(published 600 mm²)")
    assert cli.main(["area", "--arch", "tpuv5e"]) == 0      # Google publishes no TPU v5e die area
    assert capsys.readouterr().out.splitlines()[0].endswith("mm² (modelled; no published area)")


def test_cli_area_bad_arch_exits_2(capsys):
    assert cli.main(["area", "--arch", "no-such-chip"]) == 2
    assert "no-such-chip" in capsys.readouterr().err

