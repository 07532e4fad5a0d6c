"""The energy's traffic (phaze/area.py ``_step_activity``) is the traffic the step's time costs:
a mixture of experts' all-to-alls and its experts' gradients over their own data-parallel group,
and the optimizer's per-tensor passes and gradient accumulation. Hand derivations on small cases."""
from __future__ import annotations

from dataclasses import replace

import pytest

from phaze.api import as_chip, as_model
from phaze.area import _step_activity
from phaze.cost import IDEAL
from phaze.plan import Plan
from phaze.stage import main_grad_bytes, stage_costs


@pytest.fixture(scope="module")
def mixtral():
    return as_model("mixtral-8x7b")


@pytest.fixture(scope="module")
def h100():
    return as_chip("h100-sxm")


def test_moe_link_bytes_by_hand(mixtral, h100):
    """Mixtral 8x7B on 16 devices, ep=8, one micro-batch of 4,096 tokens, no ZeRO: each of the 32
    layers sends four all-to-alls (dispatch and combine, forward and backward) of its T x top_k
    token copies, 7/8 of each to other ranks; the dense parameters' gradients are all-reduced over
    the 16 data-parallel ranks (2 x 15/16 of them), the experts' (a quarter of the 8 on each
    device) over the 2 ranks that hold the same experts (2 x 1/2)."""
    m, plan = mixtral, Plan(tp=1, ep=8, mbs=1)
    g = main_grad_bytes(m, plan)
    T, k, h, p = 4096, 2, 4096, 2
    experts = 32 * m.expert_layer_params / 8
    dense = stage_costs(m, h100, 16, 16, plan, IDEAL).params(0, 32) - experts
    a2a = 32 * 4 * 7 / 8 * p * T * k * h
    grads = 2 * 15 / 16 * g * dense + 2 * 1 / 2 * g * experts
    assert _step_activity(m, h100, 16, 16, plan).link_bytes == pytest.approx(a2a + grads, rel=1e-9)


def test_moe_energy_counts_the_mean_rank(mixtral, h100):
    """Dropless routing's busiest rank sets the step's time, but the energy sums every rank: the
    mean rank's tokens, the same FLOPs as a forced-balanced router's."""
    base = Plan(tp=1, ep=8, mbs=1)
    forced = _step_activity(mixtral, h100, 16, 16, replace(base, routing="forced"))
    dropless = _step_activity(mixtral, h100, 16, 16, replace(base, routing="dropless"))
    assert dropless.tensor_flops == pytest.approx(forced.tensor_flops, rel=1e-12)
    assert dropless.link_bytes == pytest.approx(forced.link_bytes, rel=1e-12)


def test_moe_optimizer_updates_its_expert_shard(mixtral, h100):
    """Under ZeRO-1 a device updates 1/16 of the dense parameters and 1/2 of its experts (the
    expert data-parallel group): adam's element-wise step reads and writes those parameters only,
    so ZeRO-1 against none saves its bytes on the rest."""
    from phaze.graph import optimizer_op
    plan = Plan(tp=1, ep=8, mbs=1)
    costs = stage_costs(mixtral, h100, 16, 16, plan, IDEAL)
    experts = 32 * mixtral.expert_layer_params / 8
    dense = costs.params(0, 32) - experts
    g = main_grad_bytes(mixtral, plan)
    per = optimizer_op(1.0, plan.optimizer, mixtral.precision, g).bytes
    plain = _step_activity(mixtral, h100, 16, 16, plan)
    zero1 = _step_activity(mixtral, h100, 16, 16, replace(plan, zero=1))
    saved_opt = per * (dense + experts - dense / 16 - experts / 2)
    # ZeRO-1's reduce-scatter + all-gather send as many bytes as the all-reduce (16-bit gradients
    # and weights), each read from and written to HBM either way
    assert g == mixtral.bytes_per_element
    assert zero1.link_bytes == pytest.approx(plain.link_bytes, rel=1e-9)
    assert plain.hbm_bytes - zero1.hbm_bytes == pytest.approx(saved_opt, rel=1e-9)


def test_energy_counts_megatron_gradient_accumulation():
    """adam-megatron without gradient-accumulation fusion: every micro-batch a hook adds each
    tensor's bf16 gradient into its fp32 main gradient (read 2 + 4, write 4 bytes a parameter);
    with the fusion only the embedding table's (the tensors no GEMM adds into). GPT-2 XL on 8
    devices, 8 micro-batches of 1: 8 x 10 B x (parameters - the table) more HBM bytes."""
    m, chip = as_model("gpt2-xl"), as_chip("a100-80gb")
    plan = Plan(tp=1, mbs=1, optimizer="adam-megatron", reduce_fp32=True)
    assert main_grad_bytes(m, plan) == 4
    fused = _step_activity(m, chip, 8, 64, plan)
    hooked = _step_activity(m, chip, 8, 64, replace(plan, grad_accum_fusion=False))
    params = stage_costs(m, chip, 8, 64, plan, IDEAL).params(0, m.layers)
    assert hooked.hbm_bytes - fused.hbm_bytes == pytest.approx(8 * 10 * (params - m.embedding_params), rel=1e-9)
    assert hooked.link_bytes == fused.link_bytes


def test_energy_counts_megatron_zeroed_buffer():
    """Megatron zeroes its whole main-gradient buffer each step (4 B a parameter, fp32): adam-megatron
    against plain adam with fp32 main gradients writes those bytes more, and reads as its fused
    kernel does (phaze.graph.optimizer_op), plus the fused accumulation of the table."""
    from phaze.graph import optimizer_op
    m, chip = as_model("gpt2-xl"), as_chip("a100-80gb")
    mega = Plan(tp=1, mbs=1, optimizer="adam-megatron", reduce_fp32=True)
    params = stage_costs(m, chip, 8, 64, mega, IDEAL).params(0, m.layers)
    adam = Plan(tp=1, mbs=1, reduce_fp32=True)
    assert main_grad_bytes(m, adam) == 4
    a, b = _step_activity(m, chip, 8, 64, adam), _step_activity(m, chip, 8, 64, mega)
    opt = (optimizer_op(1.0, "adam-megatron", m.precision, 4).bytes - optimizer_op(1.0, "adam", m.precision, 4).bytes)
    assert b.hbm_bytes - a.hbm_bytes == pytest.approx(params * (4 + opt) + 8 * 10 * m.embedding_params, rel=1e-9)


def test_the_energy_bound_stays_below_an_expert_parallel_layout(mixtral, h100):
    """The exact search's closed-form energy bound (phaze.bounds._energy_min) lays the experts out
    on one rank; an ep = 8 plan reads an eighth of their weights. The bound leaves the experts'
    GEMM bytes out, so it stays below the energy model of every layout, ep = 8 included."""
    from phaze.area import activity_energy_j, energy_coefficients
    from phaze.bounds import _energy_min
    from phaze.placement import PlacementOptions
    from phaze.space import WorkloadSpec
    k = energy_coefficients(h100)
    spec = WorkloadSpec(mixtral, 16, 16, options=PlacementOptions(tp=(1,), mbs=(1,), recompute=("none",)))
    bound = _energy_min(spec, k) / 16
    for ep in (1, 8):
        a = _step_activity(mixtral, h100, 16, 16, Plan(tp=1, ep=ep, mbs=1))
        assert bound <= sum(activity_energy_j(a, k).values())
