"""The mean layer of a model with more than one kind of layer (an MoE model's dense layers): on a
chip whose units run concurrently each kind is scheduled on its own and the schedules weighed by
the kinds' shares, as on a GPU the operator sums are; so are the layer's activity (energy) and its
schedules' quality.

The oracle: the same model built twice with one kind of layer only (every FFN a mixture of
experts; every FFN dense), whose per-layer figures weighed by the published layer counts
(Llama 4 Maverick: 24 dense and 24 MoE layers) must give the mixed model's.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from phaze.arch import load_chip
from phaze.area import layer_activity
from phaze.catalogue import load_model
from phaze.stage import layer_mix, layer_time, layer_time_bounds
from phaze.step import dense_view

ARGS = (1, 4, True, "flash", "none")   # mbs, tp, sp, attention, recompute


@pytest.fixture(scope="module")
def kinds():
    mixed = load_model("llama4-maverick", 512)
    assert (mixed.dense_ffn_layers, mixed.moe_layers) == (24, 24)   # Llama 4 model card: every other layer MoE
    moe_only = replace(mixed, dense_layers=0, moe_layer_interval=1)
    return mixed, moe_only, dense_view(mixed)


def test_layer_mix_weights(kinds):
    mixed, moe_only, dense = kinds
    (w1, m1, _), (w2, m2, lm2) = layer_mix(mixed)
    assert (w1, w2) == (0.5, 0.5) and m1 == moe_only and m2 == dense and lm2 is None
    assert layer_mix(moe_only) == ((1.0, moe_only, None),)


@pytest.mark.parametrize("chip_name", ["tpuv4", "h100-sxm"])
def test_layer_time_weighs_each_kind(kinds, chip_name):
    """tpuv4 runs its units concurrently (each kind's CP-SAT schedule); the H100 sequentially (sums)."""
    mixed, moe_only, dense = kinds
    chip = load_chip(chip_name)
    got = layer_time(mixed, chip, *ARGS)
    each = [layer_time(m, chip, *ARGS) for m in (moe_only, dense)]
    for phase in (0, 1):
        want = 0.5 * each[0][phase].total + 0.5 * each[1][phase].total
        assert got[phase].total == pytest.approx(want, rel=1e-9)
    # the kinds differ by far more than the tolerance, so a mean of one kind alone fails
    assert each[0][0].total > 1.5 * each[1][0].total


def test_layer_time_bounds_weigh_each_kind(kinds):
    mixed, moe_only, dense = kinds
    chip = load_chip("tpuv4")
    (lo_f, lo_b), (hi_f, hi_b) = layer_time_bounds(mixed, chip, *ARGS)
    parts = [layer_time_bounds(m, chip, *ARGS) for m in (moe_only, dense)]
    for got, j, k in ((lo_f, 0, 0), (lo_b, 0, 1), (hi_f, 1, 0), (hi_b, 1, 1)):
        assert got.total == pytest.approx(0.5 * parts[0][j][k].total + 0.5 * parts[1][j][k].total, rel=1e-9)
    fwd, bwd = layer_time(mixed, chip, *ARGS)
    assert lo_f.total <= fwd.total * (1 + 1e-9) and fwd.total <= hi_f.total * (1 + 1e-9)
    assert lo_b.total <= bwd.total * (1 + 1e-9) and bwd.total <= hi_b.total * (1 + 1e-9)


def test_layer_activity_weighs_each_kind(kinds):
    mixed, moe_only, dense = kinds
    chip = load_chip("tpuv4")
    got = layer_activity(mixed, chip, *ARGS)
    a, b = (layer_activity(m, chip, *ARGS) for m in (moe_only, dense))
    for field in ("tensor_flops", "vector_flops", "hbm_bytes", "link_bytes"):
        assert getattr(got, field) == pytest.approx(0.5 * getattr(a, field) + 0.5 * getattr(b, field), rel=1e-12)
    assert a.hbm_bytes > 1.5 * b.hbm_bytes   # 128 experts' weights against one FFN's
