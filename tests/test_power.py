"""The power limit (phaze/power.py): DVFS until the step fits, checked against its own definition."""
import itertools
import json
from dataclasses import replace
from pathlib import Path

import kernel_tables as kt
import pytest

from phaze import cli
from phaze.api import as_chip, as_model, as_plan, calibrated_efficiency
from phaze.area import silicon, step_energy
from phaze.placement import PlacementOptions, place
from phaze.power import (
    CLOCK_BIN,
    HELD_CLOCK_SHARE,
    MIN_CLOCK_RATIO,
    V_FLOOR,
    V_FLOOR_OF_TOP,
    at_clock,
    place_within_limit,
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
    assert voltage_ratio(1.0, V_FLOOR) == 1.0 and voltage_ratio(0.95, V_FLOOR) == pytest.approx(0.95)
    assert all(voltage_ratio(r, V_FLOOR) == V_FLOOR for r in (0.85, 0.5, 0.3))


def test_the_nominal_clock_is_the_clock_the_h100_held_at_its_tdp():
    """The voltage floor over the nominal point is the assumed floor over the top of the V-f curve
    divided by the measured share of the quoted peak clock a lent H100 SXM held its bf16 products
    at under 700 W (the median of the seconds after the first): 1,395 of 1,830 MHz."""
    n, _, _, (watts, _) = kt.sustained(kt.GPUS["h100"].folder / "sustained.txt")
    assert n == 15 and watts > 0.99 * as_chip("h100-sxm").tdp_w
    assert HELD_CLOCK_SHARE == kt.held_clock_mhz(kt.GPUS["h100"].folder / "sustained.txt") / (
        as_chip("h100-sxm").clock_hz / 1e6)
    assert V_FLOOR_OF_TOP == 0.70 and V_FLOOR == pytest.approx(0.70 * 1830 / 1395, rel=1e-12) and V_FLOOR < 1


def test_the_h200_file_says_the_clock_the_h200_held_and_throttles_on_its_own_floor():
    """The H200's chip file carries its own measured held share (1,485 of 1,830 MHz, the median of
    the seconds after the first), so its floor is 0.70 / 0.8115 = 0.863 of its nominal voltage,
    where every other chip takes the H100's 0.918; its top, 1.83 / 0.8115 = 2.255 GHz."""
    from phaze.area import core_voltage_ratio, held_share, top_clock_hz, v_floor
    h200, h100 = as_chip("h200-sxm"), as_chip("h100-sxm")
    mhz = kt.held_clock_mhz(kt.GPUS["h200"].folder / "sustained.txt")
    assert mhz == 1485 and h200.held_clock_share == pytest.approx(mhz / (h200.clock_hz / 1e6), abs=5e-5)
    assert held_share(h100) == HELD_CLOCK_SHARE and v_floor(h100) == V_FLOOR
    assert v_floor(h200) == pytest.approx(0.70 / 0.8115) == pytest.approx(0.8626, abs=1e-4)
    assert top_clock_hz(h200) == pytest.approx(2.2551e9, rel=1e-4)
    # throttled to 88 % of the clock: the H100 is on its floor, the H200 still on the line
    assert core_voltage_ratio(at_clock(h100, 0.88)) == V_FLOOR
    assert core_voltage_ratio(at_clock(h200, 0.88)) == pytest.approx(0.88)
    assert silicon(at_clock(h200, 0.88)).leakage_w == pytest.approx(0.88 * silicon(h200).leakage_w)


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
    assert step_energy(model, c, 256, 1024, plan, eff, r).power_w > limit
    assert ps.energy.power_w >= throttled_power_floor(1.0, V_FLOOR) * limit
    assert ps.result.step_time_s > r1.step_time_s
    # compute slows (its HBM-bound share does not), the step never by more than the clock ratio
    b1, b = r1.breakdown_s, ps.result.breakdown_s
    assert b1["compute_s"] < b["compute_s"] <= b1["compute_s"] / s * (1 + 1e-9)
    assert ps.result.step_time_s <= r1.step_time_s / s * (1 + 1e-9)
    assert ps.result.clock_hz == pytest.approx(ps.clock_hz)
    # MFU and HFU against the nominal clock's peak: the same FLOPs over a longer step
    assert ps.result.mfu == pytest.approx(r1.mfu * r1.step_time_s / ps.result.step_time_s, rel=1e-12)
    assert ps.result.hfu == pytest.approx(r1.hfu * r1.step_time_s / ps.result.step_time_s, rel=1e-12)


def test_power_falls_with_the_clock(h100_run):
    model, chip, plan, eff, _ = h100_run
    powers = []
    for s in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5):
        c = at_clock(chip, s)
        r = evaluate(model, c, 256, 1024, plan, eff)
        powers.append(step_energy(model, c, 256, 1024, plan, eff, r).power_w)
    assert powers == sorted(powers, reverse=True)


def test_one_clock_bin_cuts_the_power_by_at_most_the_floor(h100_run):
    """The exact search's floor, brute force over every pair of adjacent bins on the H100 run and
    a memory-heavier plan: one bin down never cuts the power below throttled_power_floor(1.0, V_FLOOR) of the
    bin above; the floor is the lowest bin's, where the voltage no longer falls."""
    model, chip, _, eff, _ = h100_run
    assert throttled_power_floor(1.0, V_FLOOR) == pytest.approx((MIN_CLOCK_RATIO / (MIN_CLOCK_RATIO + CLOCK_BIN)) ** 2)
    largest = 1.0
    for plan in (as_plan("tp=1,pp=1,mbs=2,zero=1"), as_plan("tp=8,pp=1,mbs=1,zero=1")):
        powers = []
        for k in range(round((1 - MIN_CLOCK_RATIO) / CLOCK_BIN) + 1):
            s = 1.0 - k * CLOCK_BIN
            c = at_clock(chip, s)
            r = evaluate(model, c, 256, 1024, plan, eff)
            powers.append(step_energy(model, c, 256, 1024, plan, eff, r).power_w)
        cuts = [lo / hi for hi, lo in itertools.pairwise(powers)]
        assert max(cuts) < 1 and min(cuts) >= throttled_power_floor(1.0, V_FLOOR) * (1 - 1e-12)
        largest = min(largest, *cuts)
    page = " ".join((Path(__file__).resolve().parent.parent / "docs" / "power.md").read_text().split())
    assert (f"`(0.30/0.31)² = {throttled_power_floor(1.0, V_FLOOR):.3f}`" in page
            and f"two H100 plans (the largest cut there: {largest:.3f})" in page)


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


def test_the_power_page_quotes_the_throttle_with_and_without_the_held_point(h100_run, monkeypatch):
    """docs/power.md's figures for Llama-2 7B on the H100 under four limits: the clock and the
    step's growth with the floor over the held point, and with the floor the nominal clock had
    before it (0.70 of the nominal voltage)."""
    import phaze.area as area
    model, chip, plan, eff, r1 = h100_run
    page = " ".join((Path(__file__).resolve().parent.parent / "docs" / "power.md").read_text().split())

    def run(limit):
        ps = within_limit(model, chip, 256, 1024, plan, eff, limit_w=limit, result=r1)
        return round(100 * ps.clock_hz / chip.clock_hz), ps.result.step_time_s / r1.step_time_s, ps.nominal_power_w

    now = {w: run(w) for w in (350, 450, 500, 560, 600)}
    monkeypatch.setattr(area, "HELD_CLOCK_SHARE", 1.0)     # the floor 0.70 of the nominal voltage
    area.silicon.cache_clear()      # its leakage is at the core voltage: cached under the other floor
    try:
        before = {w: run(w) for w in (350, 450, 500, 560, 600)}
    finally:
        area.silicon.cache_clear()
    assert f"zero=1`, {now[350][2]:.0f} W at the nominal clock)" in page
    assert now[560][0] == before[560][0] and now[600][0] == before[600][0]
    assert f"({now[560][0]} and {now[600][0]} %, above the floor)" in page
    assert (f"at 500 W {now[500][0]} % ({before[500][0]} % before), at 450 W {now[450][0]} % ({before[450][0]} %), "
            f"at 350 W {now[350][0]} % ({before[350][0]} %), a step {now[350][1]:.2f} times as long "
            f"({before[350][1]:.2f} before)") in page


def test_the_fastest_plan_within_the_limit_is_found_not_the_nominal_best_throttled():
    """Brute force: every layout's plan (a placement listing them all) run within a 350 W limit on
    the H100; place_within_limit returns the fastest and the three fastest, in order. Here the
    nominal clock's best plan draws more and, throttled, falls behind another layout's plan."""
    model, chip = as_model("mpt-30b"), as_chip("h100-sxm")
    eff, opts, limit = calibrated_efficiency(chip), PlacementOptions(tp=(1, 2, 4, 8), mbs=(1, 2), vp=(1, 2)), 350.0
    every = place(model, chip, 256, 512, opts, eff, top=10 ** 6, with_baseline=False)
    runs = sorted((within_limit(model, chip, 256, 512, p.plan, eff, limit, p.result).result.step_time_s, i, p.plan)
                  for i, p in enumerate(every.top))
    assert len(runs) > 100 and runs[0][1] != 0          # the nominal best is not the fastest within the limit
    nominal_best = next(t for t, i, _ in runs if i == 0)
    page = " ".join((Path(__file__).resolve().parent.parent / "docs" / "power.md").read_text().split())
    assert f"is {100 * (nominal_best / runs[0][0] - 1):.1f} % slower than the fastest within the limit" in page
    for top in (1, 3):
        res, powered = place_within_limit(model, chip, 256, 512, opts, eff, top, limit, with_baseline=False)
        assert [p.plan for p in res.top] == [plan for _, _, plan in runs[:top]] == list(powered)
        assert [p.result.step_time_s for p in res.top] == [t for t, _, _ in runs[:top]]
        assert res.best == res.top[0] and all(ps.energy.power_w <= limit for ps in powered.values())
    # within the TDP the nominal best runs unthrottled and is the answer at once
    res, powered = place_within_limit(model, chip, 256, 512, opts, eff, 1, None, with_baseline=False)
    assert res.best.plan == every.top[0].plan and not powered[res.best.plan].throttled


def test_a_plan_that_meets_the_limit_ranks_before_one_that_cannot():
    """At 170 W most MPT-30B plans on the H100 are over the limit even at the lowest clock, and
    such a plan's step there is shorter than any plan's that meets the limit: the fastest plans
    that meet it are listed, in order (brute force over every layout)."""
    model, chip = as_model("mpt-30b"), as_chip("h100-sxm")
    eff, opts, limit = calibrated_efficiency(chip), PlacementOptions(tp=(1, 2, 4, 8), mbs=(1, 2), vp=(1, 2)), 170.0
    every = place(model, chip, 256, 512, opts, eff, top=10 ** 6, with_baseline=False)
    runs = [(within_limit(model, chip, 256, 512, p.plan, eff, limit, p.result), i, p.plan)
            for i, p in enumerate(every.top)]
    meet = sorted((ps.result.step_time_s, i, plan) for ps, i, plan in runs if ps.fits_limit)
    over = [ps.result.step_time_s for ps, _, _ in runs if not ps.fits_limit]
    assert len(meet) >= 3 and over and min(over) < meet[0][0]
    res, powered = place_within_limit(model, chip, 256, 512, opts, eff, 3, limit, with_baseline=False)
    assert [p.plan for p in res.top] == [plan for _, _, plan in meet[:3]]
    assert all(ps.fits_limit and ps.energy.power_w <= limit for ps in powered.values())


def test_no_plan_can_meet_a_limit_under_the_leakage():
    """A limit under the die's leakage at the lowest voltage: no plan meets it, so the nominal
    clock's first plans are run, and none says it meets the limit."""
    model, chip = as_model("mpt-30b"), as_chip("h100-sxm")
    eff, opts = calibrated_efficiency(chip), PlacementOptions(tp=(1, 2, 4, 8), mbs=(1, 2), vp=(1, 2))
    limit = silicon(chip).leakage_w * V_FLOOR * 0.9
    nominal = place(model, chip, 256, 512, opts, eff, top=2, with_baseline=False)
    res, powered = place_within_limit(model, chip, 256, 512, opts, eff, 2, limit, with_baseline=False)
    assert set(powered) == {p.plan for p in nominal.top} and not any(ps.fits_limit for ps in powered.values())
    assert [p.result.step_time_s for p in res.top] == sorted(ps.result.step_time_s for ps in powered.values())


def test_place_and_the_api_list_the_fastest_plans_within_the_limit(capsys):
    """`phaze place --power-limit` and `phaze.place(power_limit_w=...)` give the same three plans
    and steps, the fastest within the limit (the previous test's brute force), throttled."""
    import phaze
    api = phaze.place("mpt-30b", "h100-sxm", 256, 512, tp=[1, 2, 4, 8], mbs=[1, 2], vp=[1, 2], top=3,
                      power_limit_w=350)
    assert cli.main(["place", "--workload", "mpt-30b", "--arch", "h100-sxm", "--devices", "256", "--global-batch",
                     "512", "--tp", "1,2,4,8", "--mbs", "1,2", "--vp", "1,2", "--top", "3", "--power-limit", "350",
                     "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [t["plan"] for t in d["top"]] == [p.plan.label() for p in api.top] and len(api.top) == 3
    assert [t["step_time_s"] for t in d["top"]] == [p.result.step_time_s for p in api.top]
    assert api.best.result.clock_hz < as_chip("h100-sxm").clock_hz
    nominal = phaze.place("mpt-30b", "h100-sxm", 256, 512, tp=[1, 2, 4, 8], mbs=[1, 2], vp=[1, 2], top=1)
    assert nominal.best.plan != api.best.plan and nominal.best.result.clock_hz == as_chip("h100-sxm").clock_hz
    with pytest.raises(phaze.ConfigError, match="power_limit_w"):
        phaze.place("mpt-30b", "h100-sxm", 256, 512, power_limit_w=0)


def test_a_candidate_clocked_past_its_template_pays_for_the_clock_in_voltage():
    """Hand derivation on the linear V-f line: a TPUv4-template candidate at twice the template's
    clock runs at twice its voltage, so each core operation costs four times the energy, the
    clocked logic eight times the power (twice the cycles at four times the energy) and leakage
    twice; HBM and links keep theirs. At half the clock the voltage is on its floor (0.918). A
    shipped chip, and the template itself, run at their reference clock."""
    from phaze.area import core_voltage_ratio, energy_coefficients, logic_power_w
    from phaze.space import build_chip
    base = as_chip("tpuv4")
    assert base.reference_clock_hz == base.clock_hz and core_voltage_ratio(base) == 1.0
    fast = build_chip(base, {"clock_ghz": 2 * base.clock_hz / 1e9})
    slow = build_chip(base, {"clock_ghz": 0.5 * base.clock_hz / 1e9})
    same = build_chip(base, {"clock_ghz": base.clock_hz / 1e9})
    assert fast.reference_clock_hz == slow.reference_clock_hz == base.clock_hz
    assert core_voltage_ratio(fast) == pytest.approx(2.0) and core_voltage_ratio(slow) == V_FLOOR
    k0, k2, kh = energy_coefficients(same), energy_coefficients(fast), energy_coefficients(slow)
    for part in ("tensor", "vector", "local_sram", "shared_buffer"):
        assert k2[part] == pytest.approx(4 * k0[part]) and kh[part] == pytest.approx(V_FLOOR ** 2 * k0[part])
    for part in ("hbm", "link"):
        assert k2[part] == k0[part] == kh[part]
    assert logic_power_w(fast) == pytest.approx(8 * logic_power_w(same))
    assert silicon(fast).leakage_w == pytest.approx(2 * silicon(same).leakage_w)
    assert silicon(slow).leakage_w == pytest.approx(V_FLOOR * silicon(same).leakage_w)
    # throttled, the voltage follows the running clock against the reference: 1.9 of it at 95 %
    assert core_voltage_ratio(at_clock(fast, 0.95)) == pytest.approx(1.9)


def test_a_candidate_on_a_newer_node_meets_the_foundrys_speed_and_power_claims():
    """TSMC's N5 against N7: 15 % faster at the same power, or 30 % less power at the same speed. By
    hand, a TPUv4-template candidate moved from 7 to 5 nm: its reference clock is 1.15 times the
    template's, so at the template's clock its voltage sits on the floor (1 / 1.15 = 0.870 < 0.918)
    and each core operation costs sqrt(96 / 138) x 0.918^2 = 0.703 of the 7 nm one; at 1.15 times
    the clock, the template's voltage, the core's switching power is sqrt(96 / 138) x 1.15 = 0.959
    of it. The top of its curve moves too: 1.05 x 1.15 x 1,830 / 1,395 = 1.584 GHz."""
    import math

    from phaze.area import energy_coefficients, node_speed, top_clock_hz
    from phaze.space import build_chip
    base = as_chip("tpuv4")
    assert base.process_node_nm == 7 and build_chip(base, {}).reference_clock_hz == base.clock_hz
    at5 = build_chip(base, {}, 5)
    fast5 = build_chip(base, {"clock_ghz": 1.05 * 1.15}, 5)
    assert at5.reference_clock_hz == pytest.approx(1.05e9 * 1.15) == fast5.reference_clock_hz
    k7, k5, kf = (energy_coefficients(c)["tensor"] for c in (base, at5, fast5))
    assert k5 / k7 == pytest.approx(math.sqrt(96 / 138) * (0.70 * 1830 / 1395) ** 2) == pytest.approx(0.703, abs=5e-4)
    assert kf * fast5.clock_hz / (k7 * base.clock_hz) == pytest.approx(0.959, abs=5e-4)
    assert top_clock_hz(at5) == pytest.approx(1.5841e9, rel=1e-4)
    page = " ".join((Path(__file__).resolve().parent.parent / "docs" / "search.md").read_text().split())
    assert (f"({top_clock_hz(base) / 1e9:.3f} GHz for TPUv4 at 7 nm, {top_clock_hz(at5) / 1e9:.3f} at 5 nm;"
            in page)
    # the chain of the foundry's steps: N10 over 16FF+ 15 %, N7 over N10 20 %, N4P and N3E over N5 11 and 18 %
    assert [round(node_speed(a) / node_speed(b), 6) for a, b in ((10, 16), (7, 10), (5, 7), (4, 5), (3, 5))] == \
        [1.15, 1.2, 1.15, 1.11, 1.18]


def test_the_floor_holds_on_a_candidate_clocked_past_its_template():
    """throttled_power_floor for a chip at 1.9 times its reference clock, by hand and by brute
    force over every pair of adjacent bins. By hand: the voltage follows the clock down to
    0.918 / 1.9 = 0.483 of it, so the lowest pair of bins both on the line is 0.49 and 0.50, where
    the clock and the voltage each fall by 0.49 / 0.50: (0.98)^4; below, on the floor, a pair cuts
    only (s / s')^2 (at the lowest, (0.30 / 0.31)^2 = 0.937)."""
    from phaze.space import build_chip
    model, base = as_model("llama2-7b"), as_chip("h100-sxm")
    chip = build_chip(base, {"clock_ghz": 1.9 * base.clock_hz / 1e9})
    eff, plan = calibrated_efficiency(base), as_plan("tp=1,pp=1,mbs=2,zero=1")
    floor = throttled_power_floor(1.9, V_FLOOR)
    assert floor < throttled_power_floor(1.0, V_FLOOR) and floor == pytest.approx((0.49 / 0.50) ** 4, rel=1e-12)
    powers = []
    for k in range(71):
        c = at_clock(chip, 1.0 - k * CLOCK_BIN)
        powers.append(step_energy(model, c, 256, 1024, plan, eff, evaluate(model, c, 256, 1024, plan, eff)).power_w)
    cuts = [lo / hi for hi, lo in itertools.pairwise(powers)]
    assert min(cuts) >= floor * (1 - 1e-12) and max(cuts) < 1


def test_the_power_page_quotes_llm_2026s_clocks():
    """docs/power.md's example: Llama-3 8B on 1,024 llm-2026 candidates at 1.0, 1.25 and 1.5 GHz and
    at the template's 1.05, the power at the nominal clock with the reference clock moved to the
    sweep's 5 nm, with the template's 7 nm one (before the node moved it) and with the candidate's
    own (a clock that sets no voltage); none is throttled under the 1 kW budget, and the config's
    clocks stop below the top of the curve."""
    from phaze.area import top_clock_hz
    from phaze.calibrate import load_default_params, params_for
    from phaze.space import build_chip, load_sweep
    root = Path(__file__).resolve().parent.parent
    cfg = load_sweep(root / "search" / "llm-2026.yaml")
    spec, plan = cfg.workloads[0], as_plan("tp=1,pp=1,mbs=1,zero=1,recompute=full")
    assert spec.model.name.startswith("Llama-3") and spec.devices == 1024 and dict(cfg.constraints)["power_w"] == 1000
    assert cfg.process_node_nm == 5 and cfg.base.process_node_nm == 7
    values = dict(tensor_units=16, tensor_rows=128, vector_units=4, local_sram_kib=2048, shared_buffer_mib=64,
                  hbm_gib=96, hbm_bandwidth_gb_per_s=4000, link_bandwidth_gb_per_s=400)
    watts = {}
    for ghz in (1.0, 1.05, 1.25, 1.5):
        chip = build_chip(cfg.base, dict(values, clock_ghz=ghz), cfg.process_node_nm)
        eff = params_for(chip, load_default_params())
        runs = [within_limit(spec.model, c, spec.devices, spec.global_batch, plan, eff, 1000.0)
                for c in (chip, replace(chip, reference_clock_hz=cfg.base.clock_hz),
                          replace(chip, reference_clock_hz=chip.clock_hz))]
        assert not any(r.throttled for r in runs)
        watts[ghz] = [f"{r.nominal_power_w:,.0f}" for r in runs]
    page = " ".join((root / "docs" / "power.md").read_text().split())
    now, template, none = ([watts[g][k] for g in (1.0, 1.25, 1.5)] for k in range(3))
    assert (f"{now[0]}, {now[1]} and {now[2]} W at 1.0, 1.25 and 1.5 GHz, against {template[0]}, {template[1]} and "
            f"{template[2]} W with the template's 7 nm reference clock") in page
    assert f"and {none[0]}, {none[1]} and {none[2]} W when a clock set no voltage" in page
    assert f"At the template's own 1.05 GHz the 5 nm candidate draws {watts[1.05][0]} W, against {watts[1.05][1]} W" \
        in page
    top = top_clock_hz(build_chip(cfg.base, {}, cfg.process_node_nm)) / 1e9
    clocks = next(d.values for d in cfg.dimensions if d.key == "clock_ghz")
    assert max(clocks) <= top < max(clocks) + 0.25 and f"tops out at {top:.3f} GHz" in page
