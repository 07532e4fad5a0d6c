"""The power limit (phaze/power.py): DVFS until the step fits, checked against its own definition."""
import json
from dataclasses import replace

import pytest

from phaze import cli
from phaze.api import as_chip, as_model, as_plan, calibrated_efficiency
from phaze.area import silicon, step_energy
from phaze.placement import PlacementOptions, place
from phaze.power import (
    CLOCK_BIN,
    MIN_CLOCK_RATIO,
    V_FLOOR,
    at_clock,
    throttled_power_floor,
    voltage_ratio,
    within_limit,
)
from phaze.step import evaluate

CHIPS = ("v100-sxm2-32gb", "a100-80gb", "a100-40gb", "h100-sxm", "h100-hbm2e-96gb-500w", "h200-sxm", "tpuv4")
# one small, one mid-size, one large dense workload and a mixture of experts, at sizes that fit
WORKLOADS = (("llama2-7b", 256, 1024), ("mpt-30b", 256, 512), ("gpt3-175b", 1024, 1536),
             ("mixtral-8x7b", 64, 256))


def test_voltage_follows_the_clock_down_to_its_floor():
    assert voltage_ratio(1.0) == 1.0 and voltage_ratio(0.85) == pytest.approx(0.85)
    assert voltage_ratio(0.5) == V_FLOOR and voltage_ratio(0.3) == V_FLOOR


@pytest.mark.parametrize("chip_name", CHIPS)
def test_shipped_chips_stay_within_their_tdp(chip_name):
    """Every shipped chip with its TDP, on each workload's best plan (tp and mbs narrowed to keep
    the test fast): the power at load is at most the TDP, leakage is above zero, and a plan
    whose power at the nominal clock is over the TDP is throttled and says so."""
    chip = as_chip(chip_name)
    assert chip.tdp_w and silicon(chip).leakage_w > 0
    eff = calibrated_efficiency(chip)
    for name, devices, batch in WORKLOADS:
        model = as_model(name)
        res = place(model, chip, devices, batch, PlacementOptions(tp=(2, 8), mbs=(1,), vp=(1, 2)), eff, top=1)
        if res.best is None:
            continue
        ps = within_limit(model, chip, devices, batch, res.best.plan, eff, result=res.best.result)
        assert ps.fits_limit and ps.energy.power_w <= chip.tdp_w * (1 + 1e-9), (name, ps.note())
        assert ps.power_limit_w == chip.tdp_w
        if ps.nominal_power_w > chip.tdp_w:
            assert ps.throttled and "throttled" in ps.note()
            assert ps.result.step_time_s > res.best.result.step_time_s
        else:
            assert not ps.throttled and ps.result == res.best.result


@pytest.fixture(scope="module")
def h100_run():
    model, chip = as_model("llama2-7b"), as_chip("h100-sxm")
    plan = as_plan("tp=1,pp=1,mbs=2,zero=1")
    eff = calibrated_efficiency(chip)
    return model, chip, plan, eff, evaluate(model, chip, 256, 1024, plan, eff)


@pytest.mark.parametrize("limit", [350.0, 450.0, 500.0, 560.0])
def test_throttle_takes_the_highest_clock_bin_that_fits(h100_run, limit):
    """The chosen bin fits and the next one up does not (the bisection is exact on the bins);
    the throttled power is at least the floor the exact search relies on; compute slows."""
    model, chip, plan, eff, r1 = h100_run
    ps = within_limit(model, chip, 256, 1024, plan, eff, limit_w=limit, result=r1)
    assert ps.throttled and ps.fits_limit and ps.energy.power_w <= limit
    s = ps.clock_hz / chip.clock_hz
    assert s >= MIN_CLOCK_RATIO - 1e-9
    up = s + CLOCK_BIN
    c = at_clock(chip, up)
    r = evaluate(model, c, 256, 1024, plan, eff)
    assert step_energy(model, c, 256, 1024, plan, eff, r, voltage_ratio=voltage_ratio(up)).power_w > limit
    assert ps.energy.power_w >= throttled_power_floor() * limit
    assert ps.result.step_time_s > r1.step_time_s
    # compute slows (its HBM-bound share does not), the step never by more than the clock ratio
    b1, b = r1.breakdown_s, ps.result.breakdown_s
    assert b1["compute_s"] < b["compute_s"] <= b1["compute_s"] / s * (1 + 1e-9)
    assert ps.result.step_time_s <= r1.step_time_s / s * (1 + 1e-9)
    assert ps.result.clock_hz == pytest.approx(ps.clock_hz)


def test_power_falls_with_the_clock(h100_run):
    model, chip, plan, eff, _ = h100_run
    powers = []
    for s in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5):
        c = at_clock(chip, s)
        r = evaluate(model, c, 256, 1024, plan, eff)
        powers.append(step_energy(model, c, 256, 1024, plan, eff, r, voltage_ratio=voltage_ratio(s)).power_w)
    assert powers == sorted(powers, reverse=True)


def test_no_limit_no_throttle(h100_run):
    model, chip, plan, eff, r1 = h100_run
    ps = within_limit(model, replace(chip, tdp_w=None), 256, 1024, plan, eff, result=r1)
    assert not ps.throttled and ps.power_limit_w is None and ps.result == r1


def test_a_limit_below_leakage_cannot_be_met(h100_run):
    model, chip, plan, eff, r1 = h100_run
    ps = within_limit(model, chip, 256, 1024, plan, eff, limit_w=silicon(chip).leakage_w * V_FLOOR * 0.5, result=r1)
    assert not ps.fits_limit and "even at" in ps.note()


def test_cli_evaluate_says_the_plan_was_throttled(capsys):
    args = ["evaluate", "--workload", "llama2-7b", "--arch", "h100-sxm", "--devices", "256", "--global-batch",
            "1024", "--plan", "tp=1,pp=1,mbs=2,zero=1"]
    assert cli.main(args + ["--power-limit", "500"]) == 0
    out = capsys.readouterr().out
    assert "throttled to" in out and "500 W limit" in out and "mJ per token" in out
    assert cli.main(args + ["--power-limit", "500", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["power"]["throttled"] and d["power"]["clock_hz"] < d["power"]["nominal_clock_hz"]
    assert d["power"]["energy"]["power_w"] <= 500 and d["clock_hz"] == d["power"]["clock_hz"]
    assert d["hardware_flops_per_s_per_device"] >= d["model_flops_per_s_per_device"] > 0
    with pytest.raises(SystemExit) as exc:
        cli.main(args + ["--power-limit", "0"])
    assert exc.value.code == 2 and "--power-limit" in capsys.readouterr().err


def test_cli_evaluate_says_when_a_chip_has_no_power_limit(capsys):
    # Google publishes no TPU v5e TDP: its file has none, so nothing throttles it, and the printout
    # says why instead of naming a limit
    args = ["evaluate", "--workload", "llama2-7b", "--arch", "tpuv5e", "--devices", "256", "--global-batch",
            "256", "--plan", "tp=1,pp=1,mbs=1,zero=3,recompute=full"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    power = next(line for line in out.splitlines() if line.strip().startswith("power per device"))
    assert " W; " in power and "limit" not in power
    assert "(no power limit: the chip file gives no TDP)" in out
    assert cli.main(args + ["--power-limit", "50"]) == 0        # a limit the user sets still holds
    out = capsys.readouterr().out
    assert "of a 50 W limit" in out and "throttled to" in out
