"""Step-time composition: pipeline, data parallelism, memory per stage, invariants."""
from dataclasses import replace

import numpy as np
import pytest

from phaze.arch import LinkLevel, load_chip
from phaze.calibrate import calibrated_efficiency
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.cost import Efficiency, op_time
from phaze.graph import edge_graph, layer_graph
from phaze.memory import activation_bytes_per_layer, state_bytes_per_param
from phaze.plan import Plan, parse_plan
from phaze.plan_check import stage_layers
from phaze.stage import inflight_micro_batches, layer_time, mode_costs, stage_costs
from phaze.step import COMMUNICATION_GROUPS, critical_weight, evaluate, layout_of
from phaze.workload import narayanan_flops_per_step


@pytest.fixture(scope="module")
def gpt3():
    return load_model("gpt3-175b")


@pytest.fixture(scope="module")
def a100():
    return load_chip("a100-80gb")


@pytest.mark.parametrize("layers,pp", [(96, 16), (105, 35), (10, 4), (7, 7), (80, 3), (5, 1)])
def test_stage_layers(layers, pp):
    c = stage_layers(layers, pp)
    assert len(c) == pp and sum(c) == layers and max(c) - min(c) <= 1
    if pp > 2 and 0 < layers % pp <= pp - 2:
        assert c[0] == c[-1] == min(c)   # first and last stages carry embedding / loss


def test_breakdown_sums_to_step_time(gpt3, a100):
    for text in ("tp=8,pp=16,recompute=full", "tp=8,pp=8,mbs=2,recompute=selective,vp=2",
                 "tp=4,pp=16,zero=1", "tp=8,pp=16,zero=3,recompute=full"):
        r = evaluate(gpt3, a100, 1024, 1536, parse_plan(text))
        assert sum(r.breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-12)
        assert r.samples_per_s == pytest.approx(1536 / r.step_time_s)


def test_pipeline_time_by_hand(gpt3, a100):
    """96 layers over 16 stages, 1F1B: m * t_stage + bubble; without embedding and head every
    stage is equal and the bubble is (p-1) * t_stage."""
    plan = Plan(tp=8, pp=16, mbs=1, recompute="full", dp_overlap=True)
    r = evaluate(gpt3, a100, 1024, 1536, plan)
    f, b = layer_time(gpt3, a100, 1, 8, True, "flash", "full")
    m = r.micro_batches
    assert m == 1536 // 8
    inner = 6 * (f.total + b.total)
    # the slowest stage includes embedding or head; all others are 'inner' plus sends
    assert r.breakdown_s["pipeline_bubble_s"] >= 14 * inner
    assert r.step_time_s >= m * inner + 15 * inner


def test_more_micro_batches_shrink_bubble_share(gpt3, a100):
    small = evaluate(gpt3, a100, 1024, 512, Plan(tp=8, pp=16, recompute="full"))
    large = evaluate(gpt3, a100, 1024, 4096, Plan(tp=8, pp=16, recompute="full"))
    share = lambda r: r.breakdown_s["pipeline_bubble_s"] / r.step_time_s  # noqa: E731
    assert share(large) < share(small)
    assert large.mfu > small.mfu


def test_interleaving_shrinks_bubble(gpt3, a100):
    one = evaluate(gpt3, a100, 1024, 1536, Plan(tp=8, pp=16, recompute="full"))
    two = evaluate(gpt3, a100, 1024, 1536, Plan(tp=8, pp=16, vp=2, recompute="full"))
    assert two.breakdown_s["pipeline_bubble_s"] == pytest.approx(one.breakdown_s["pipeline_bubble_s"] / 2, rel=0.05)


def test_stage_memory_hand_count(gpt3, a100):
    plan = Plan(tp=8, pp=16, mbs=1, recompute="selective", attention="standard")
    r = evaluate(gpt3, a100, 1024, 1536, plan)
    act = activation_bytes_per_layer(gpt3, 1, 8, True, "selective", "standard")
    per_param = state_bytes_per_param("adam", 0, 8)
    assert per_param == 16
    for m in r.stage_memory:
        assert m.layers == 6
        assert m.activation_bytes == pytest.approx(6 * act * (16 - m.stage))   # p - i in flight
    mid = r.stage_memory[5]
    assert mid.weights_and_optimizer_bytes == pytest.approx(16 * 6 * gpt3.layer_params / 8)
    first = r.stage_memory[0]
    assert first.weights_and_optimizer_bytes == pytest.approx(
        16 * (6 * gpt3.layer_params + gpt3.embedding_params) / 8)
    assert r.memory_per_device_bytes == max(m.total_bytes for m in r.stage_memory)


def test_distributed_optimizer_and_fsdp_cut_state(gpt3, a100):
    base = evaluate(gpt3, a100, 1024, 1536, Plan(tp=8, pp=16, recompute="full"))
    z1 = evaluate(gpt3, a100, 1024, 1536, Plan(tp=8, pp=16, recompute="full", zero=1))
    ratio = z1.stage_memory[5].weights_and_optimizer_bytes / base.stage_memory[5].weights_and_optimizer_bytes
    assert ratio == pytest.approx((2 + 2 + 12 / 8) / 16)


def test_more_hbm_or_bandwidth_never_hurts(gpt3, a100):
    plan = Plan(tp=8, pp=16, recompute="full")
    r = evaluate(gpt3, a100, 1024, 1536, plan)
    faster = replace(a100, hbm_bandwidth_bytes_per_s=2 * a100.hbm_bandwidth_bytes_per_s)
    assert evaluate(gpt3, faster, 1024, 1536, plan).step_time_s <= r.step_time_s
    links = tuple(replace(l, bandwidth_bytes_per_s=2 * l.bandwidth_bytes_per_s) for l in a100.links)
    assert evaluate(gpt3, replace(a100, links=links), 1024, 1536, plan).step_time_s <= r.step_time_s


def test_data_parallel_scaling_keeps_per_device_memory(gpt3, a100):
    plan = Plan(tp=8, pp=16, recompute="full")
    r1 = evaluate(gpt3, a100, 512, 768, plan)
    r2 = evaluate(gpt3, a100, 1024, 1536, plan)
    assert r1.micro_batches == r2.micro_batches
    assert r1.memory_per_device_bytes == pytest.approx(r2.memory_per_device_bytes)
    # twice the devices and twice the batch: about the same step time (more DP communication only)
    assert r2.step_time_s == pytest.approx(r1.step_time_s, rel=0.05)
    assert r2.step_time_s >= r1.step_time_s * (1 - 1e-12)


def test_mfu_definition(gpt3, a100):
    # MFU and HFU against Narayanan et al.'s closed-form FLOP counts (eq. 3, GPT with h_ffn = 4h)
    # over the A100 datasheet's 312 TFLOP/s: an independent count, not phaze's own
    r = evaluate(gpt3, a100, 1024, 1536, Plan(tp=8, pp=16, recompute="full"))
    model_flops = narayanan_flops_per_step(gpt3, 1536)
    hardware_flops = narayanan_flops_per_step(gpt3, 1536, full_recompute=True)
    assert r.mfu == pytest.approx(model_flops / (r.step_time_s * 1024 * 312e12), rel=0.01)
    assert r.hfu == pytest.approx(hardware_flops / (r.step_time_s * 1024 * 312e12), rel=0.01)
    assert 0 < r.mfu < 1


def test_schedule_is_the_sequential_sum_on_gpus_and_never_slower_on_accelerators(gpt3, a100, tmp_path,
                                                                                 monkeypatch):
    monkeypatch.setenv("PHAZE_CACHE_DIR", str(tmp_path))
    plan = Plan(tp=8, pp=16, recompute="selective")
    opt = evaluate(gpt3, a100, 1024, 1536, plan)
    seq = evaluate(gpt3, a100, 1024, 1536, replace(plan, schedule="sequential"))
    assert opt.step_time_s == seq.step_time_s          # GPUs run kernels one after another
    tpu = load_chip("tpuv4")
    plan = Plan(tp=8, pp=16, mbs=1)
    opt = evaluate(gpt3, tpu, 1024, 1536, plan)
    seq = evaluate(gpt3, tpu, 1024, 1536, replace(plan, schedule="sequential"))
    assert opt.step_time_s < seq.step_time_s            # concurrent units overlap some ops
    assert sum(opt.breakdown_s.values()) == pytest.approx(opt.step_time_s, rel=1e-12)


@pytest.mark.parametrize("layers,pp,vp,want", [(5, 2, 2, (2, 3)), (30, 4, 2, (7, 8, 8, 7)), (96, 8, 3, (12,) * 8),
                                               (126, 16, 2, (7,) + (8,) * 14 + (7,)),
                                               (94, 8, 12, (11,) + (12,) * 6 + (11,))])
def test_uneven_interleaved_split_by_hand(layers, pp, vp, want):
    """pp*vp chunks differing by at most one, the shorter first and last (5 = 1,2,1,1: stage 0
    holds chunks 0 and 2, stage 1 chunks 1 and 3; 30 = 3,4,4,4,4,4,4,3 over 8 chunks)."""
    assert stage_layers(layers, pp, vp) == want


def test_uneven_interleaved_pipeline_by_hand(a100):
    """5 layers, pp = 2, vp = 2 (Megatron's uneven chunks): step = (m - 1/2) T_max + (T0 + T1)/2
    + the largest tail, T_i the stage's time per micro-batch over its 2 and 3 layers."""
    model = load_model("mpt-125m")
    model = replace(model, layers=5)
    plan = Plan(pp=2, vp=2, recompute="none")
    r = evaluate(model, a100, 4, 16, plan)
    costs = stage_costs(model, a100, 4, 16, layout_of(plan))
    m = 16 // 2
    assert costs.micro_batches == m
    t0, t1 = costs.time(0, 2, "none").total, costs.time(1, 3, "none").total
    tail = max(sum(costs.tail(0, 2, "none")), sum(costs.tail(1, 3, "none")))
    assert [s.layers for s in r.stage_memory] == [2, 3]
    assert r.step_time_s == pytest.approx((m - 0.5) * max(t0, t1) + (t0 + t1) / 2 + tail, rel=1e-12)


@pytest.mark.parametrize("m,pp,v,want", [(8, 4, 2, 7.5), (4, 4, 2, 3.5), (2, 4, 2, 2.5), (1, 4, 2, 2.0),
                                         (1, 4, 1, 0.0), (2, 4, 4, 3.25)])
def test_critical_weight_by_hand(m, pp, v, want):
    """m - 1/v, plus (v - 1)(pp - m)/v when fewer micro-batches than stages: at m = 1 and equal
    stages T, 2T + 4T/2 = 4T (one micro-batch through all pp*v chunks)."""
    assert critical_weight(m, pp, v) == pytest.approx(want)


def test_interleaved_in_flight_activations_by_hand():
    """Megatron's interleaved warm-up: 2(pp - i - 1) + (v - 1)pp chunk forwards plus one, in
    whole stages (/v): pp = 4, v = 2: 11/2, 9/2, 7/2, 5/2; capped at m v chunks."""

    assert list(inflight_micro_batches(4, 2, 100, np.arange(4))) == [5.5, 4.5, 3.5, 2.5]
    assert list(inflight_micro_batches(4, 2, 2, np.arange(4))) == [2.0, 2.0, 2.0, 2.0]
    assert list(inflight_micro_batches(4, 1, 3, np.arange(4))) == [3, 3, 2, 1]


def test_pipeline_sends_cross_nodes_when_dp_fills_them(a100):
    """Pipeline stages are outermost in the rank order (tp, cp, dp, pp): with tp = 2 and dp = 4
    on 8-GPU nodes the stage neighbours are 8 ranks apart, on the network: per micro-batch
    2 v sends of the activation's 1/tp, p * mbs * s * h / tp bytes each."""
    chip = replace(a100, links=(LinkLevel("node", 8, 1e9, 0.0), LinkLevel("net", 0, 1e6, 0.0)),
                   collective_latency_s=0.0)
    model = load_model("mpt-125m")
    costs = stage_costs(model, chip, 16, 64, Plan(tp=2, pp=2))
    one = 2 * model.seq_len * model.hidden / 2 / 1e6
    assert costs.send_s == pytest.approx(2 * one, rel=1e-9)
    costs = stage_costs(model, chip, 8, 64, Plan(tp=2, pp=2))     # dp = 2: neighbours 4 apart, in the node
    assert costs.send_s == pytest.approx(2 * one / 1000, rel=1e-9)


def test_exposed_communication_by_group_by_hand(a100):
    """The exposed communication splits by parallel group and the parts sum to it: without
    overlap, the tensor-parallel part is every tp collective of the layers and the edges, timed op
    by op, each micro-batch; the pipeline's, its sends; with data parallelism alone, the
    gradient all-reduce is all there is."""
    chip = replace(a100, links=(LinkLevel("node", 8, 1e9, 0.0), LinkLevel("net", 0, 1e6, 0.0)),
                   collective_latency_s=0.0)
    model = load_model("mpt-125m")
    r = evaluate(model, chip, 16, 64, Plan(tp=2, pp=2, tp_async=False))
    g = r.communication_by_group_s
    assert set(g) == set(COMMUNICATION_GROUPS)
    assert sum(g.values()) == pytest.approx(r.breakdown_s["communication_exposed_s"], rel=1e-12)
    m = r.micro_batches
    assert m == 64 // 4
    one = 2 * model.seq_len * model.hidden / 2 / 1e6   # the activation's half over the network
    assert g["pipeline_parallel_s"] == pytest.approx(m * 2 * one, rel=1e-9)

    def tp(ops):
        return sum(op_time(o, chip, model.precision, groups={"tp": (2, 1)}, bytes_per_element=2) for o in ops
                   if o.unit == "link" and o.collective.group == "tp")
    layer = layer_graph(model, 1, 2, True, "flash", "none")
    edges = edge_graph(model, 1, 2, True)
    stage = r.stage_memory[0].layers     # even stages: the first (embedding) and last (head) tie
    per_layer, head, emb = tp(layer.fwd + layer.bwd), tp(edges["head"]), tp(edges["embedding"])
    assert per_layer > 0 and head > 0
    assert g["tensor_parallel_s"] == pytest.approx(m * (stage * per_layer + max(head, emb)), rel=1e-9)
    assert g["expert_parallel_s"] == g["context_parallel_s"] == 0.0
    # the placement's arrays of layer counts carry the same totals without the group parts
    costs = stage_costs(model, chip, 16, 64, Plan(tp=2, pp=2, tp_async=False))
    counts = np.array([1.0, 2.0, 3.0])
    for r in ("none", "full"):
        whole, lean = costs.time(0, counts, r), costs.time(0, counts, r, groups=False)
        assert np.array_equal(whole.total, lean.total) and whole.tp_comm.shape == (3,)
        assert isinstance(lean.tp_comm, float)    # the embedding's, not one a layer count
    only_dp = evaluate(model, chip, 8, 64, Plan(dp_overlap=False))
    g = only_dp.communication_by_group_s
    assert g["data_parallel_s"] == only_dp.breakdown_s["communication_exposed_s"] > 0
    assert sum(g.values()) == g["data_parallel_s"]


@pytest.mark.parametrize("name, chip_name, text", [
    ("mixtral-8x7b", "h100-sxm", "tp=2,pp=2,vp=2,ep=8,tp_overlap=1,recompute=full"),
    ("mixtral-8x7b", "h100-sxm", "tp=2,pp=2,ep=8,ep_overlap=1,pipe_schedule=dualpipe"),
    ("deepseek-v3", "h100-sxm", "tp=2,pp=4,ep=8,shared_overlap=1,cp=2,recompute=full"),
    ("llama3-8b", "h100-sxm", "tp=2,cp=4,cp_comm=a2a,zero=3,tp_async=1"),
    ("llama3-8b", "tpuv4", "tp=4,cp=2,zero=3,tp_overlap=1,recompute=full"),
    ("mixtral-8x7b", "tpuv4", "tp=2,ep=4,tp_overlap=1,recompute=full"),
])
def test_exposed_communication_by_group_sums_to_it(name, chip_name, text):
    """Every overlap (userbuffers, XLA, Megatron's asynchronous collectives, the all-to-alls beside
    a paired chunk or the shared experts, FSDP, the context ring) leaves group parts that are
    non-negative and sum to the exposed communication (the shipped calibration: an ideal chip's
    overlaps hide every collective they cover)."""
    chip = load_chip(chip_name)
    r = evaluate(load_model(name, 4096), chip, 256, 256, parse_plan(text), calibrated_efficiency(chip))
    g = r.communication_by_group_s
    assert sum(g.values()) == pytest.approx(r.breakdown_s["communication_exposed_s"], rel=1e-9)
    assert min(g.values()) >= 0.0 and sum(v > 0 for v in g.values()) >= 2


def test_embedding_and_loss_may_take_a_chunk(a100):
    """pp*vp = layers + 2 (Megatron's --account-for-embedding/loss-in-pipeline-split): 6 layers,
    pp = 2, vp = 4: chunks 0,1,1,1,1,1,1,0, stages of 3 layers; one more chunk is refused."""
    model = replace(load_model("mpt-125m"), layers=6)
    r = evaluate(model, a100, 4, 16, Plan(pp=2, vp=4))
    assert [s.layers for s in r.stage_memory] == [3, 3]
    evaluate(model, a100, 3, 16, Plan(pp=3, vp=2))
    with pytest.raises(ConfigError, match=r"pp\*vp must be <= layers \(6\) \+ 2"):
        evaluate(model, a100, 3, 16, Plan(pp=3, vp=3))


def test_tp_async_hides_each_backward_collective_under_its_gemm():
    """Megatron's asynchronous backward: the sequence-parallel input's all-gather under that
    linear's input-gradient GEMM, the input gradient's reduce-scatter (all-reduce without sp)
    under its weight-gradient GEMM; each saves t - exposed(t, gemm) and nothing else changes."""
    m, c = load_model("gpt3-175b"), load_chip("a100-80gb")
    eff = Efficiency(overlap_slowdown=0.25)
    expected = {True: {"qkv.input_all_gather": "qkv.dgrad", "ln1.all_gather.bwd": "qkv.wgrad",
                       "ffn_up.input_all_gather": "ffn_up.dgrad", "ln2.all_gather.bwd": "ffn_up.wgrad"},
                False: {"qkv.dgrad.all_reduce": "qkv.wgrad", "ffn_up.dgrad.all_reduce": "ffn_up.wgrad"}}
    for sp in (True, False):
        g = layer_graph(m, 1, 8, sp, "flash", "none")
        assert {o.name: o.hidden_by for o in g.bwd if o.hidden_by} == expected[sp]
        assert not any(o.hidden_by for o in g.fwd)
        t = {o.name: op_time(o, c, m.precision, eff, groups={"tp": (8, 1)}, bytes_per_element=2) for o in g.bwd}
        saving = sum(t[a] - (max(0.0, t[a] - t[b]) + 0.25 * min(t[a], t[b])) for a, b in expected[sp].items())
        assert saving > 0
        plan = Plan(tp=8, pp=16, sp=sp)
        off = mode_costs(m, c, 1024, plan, eff, "none")
        on = mode_costs(m, c, 1024, replace(plan, tp_async=True), eff, "none")
        assert off.bwd.total - on.bwd.total == pytest.approx(saving, rel=1e-9)
        assert on.fwd == off.fwd and on.bwd.compute == off.bwd.compute
        # with tp_overlap every collective already runs under the GEMMs: tp_async adds nothing
        both = mode_costs(m, c, 1024, replace(plan, tp_overlap=True, tp_async=True), eff, "none")
        assert both == mode_costs(m, c, 1024, replace(plan, tp_overlap=True), eff, "none")
    # on an accelerator the CP-SAT schedule already overlaps what the graph allows: no change
    tpu = load_chip("tpuv4")
    plan = Plan(tp=8, pp=16)
    assert (mode_costs(m, tpu, 1024, replace(plan, tp_async=True), eff, "none").layer.total
            == mode_costs(m, tpu, 1024, plan, eff, "none").layer.total)
    assert parse_plan("tp=8,tp_async=true").tp_async and "tp_async=1" in replace(plan, tp_async=True).label()


# --- recompute=block: some of a stage's layers re-run whole, the rest nothing -------------------
def test_block_stage_is_the_layers_mix_by_hand(gpt3, a100):
    # Megatron's --recompute-method block --recompute-num-layers 2 on a 6-layer stage: 2 layers at
    # full recompute's time and stored input, 4 at none's, and one layer re-materialised at a time
    base = Plan(tp=8, pp=16, mbs=1, attention="flash")
    block = evaluate(gpt3, a100, 1024, 1536, replace(base, recompute="block", recompute_layers=(2,)))
    costs = stage_costs(gpt3, a100, 1024, 1536, layout_of(base))
    none, full = costs.mode("none"), costs.mode("full")
    # per layer: Korthikanti's count without recompute, the layer input alone under full recompute
    act_none = activation_bytes_per_layer(gpt3, 1, 8, True, "none", "flash")
    act_full = 2 * gpt3.seq_len * gpt3.hidden / 8
    for m in block.stage_memory:
        inflight = 16 - m.stage
        assert m.activation_bytes == pytest.approx((4 * act_none + 2 * act_full) * inflight, rel=1e-12)
        assert m.transient_bytes >= costs.full_act_bytes
    t = costs.time(5, 6, "block", 2).total
    assert t == pytest.approx(4 * none.layer.total + 2 * full.layer.total + costs.send_s, rel=1e-12)
    # between none and full; every layer re-run whole is full itself
    lo = evaluate(gpt3, a100, 1024, 1536, replace(base, recompute="none"))
    hi = evaluate(gpt3, a100, 1024, 1536, replace(base, recompute="full"))
    assert lo.step_time_s < block.step_time_s < hi.step_time_s
    assert hi.memory_per_device_bytes < block.memory_per_device_bytes < lo.memory_per_device_bytes
    assert lo.hfu < block.hfu < hi.hfu     # the re-run forward counts as hardware work
    every = evaluate(gpt3, a100, 1024, 1536, replace(base, recompute="block", recompute_layers=(6,)))
    assert every.step_time_s == pytest.approx(hi.step_time_s, rel=1e-12)
    assert every.memory_per_device_bytes == pytest.approx(hi.memory_per_device_bytes, rel=1e-12)


def test_block_counts_per_stage_and_their_errors(gpt3, a100):
    plan = parse_plan("tp=8,pp=4,stage_recompute=block:block:none:full,recompute_layers=3:1:0:0")
    assert plan.stage_modes() == (("block", "block", "none", "full"), (3, 1, 0, 0))
    assert parse_plan(plan.label()) == plan
    one = parse_plan("tp=8,pp=4,recompute=block,recompute_layers=2")
    assert one.stage_modes() == (("block",) * 4, (2,) * 4)
    evaluate(gpt3, a100, 256, 512, plan)
    for text, words in [("tp=8,pp=4,recompute=block", "one count"),
                        ("tp=8,pp=4,recompute=block,recompute_layers=25", "1 to 24"),
                        ("tp=8,pp=4,recompute=none,recompute_layers=2", "no stage is block"),
                        ("tp=8,pp=4,stage_recompute=block:none:none:none,recompute_layers=1:1:0:0", "not block"),
                        ("tp=8,pp=4,recompute=block,recompute_layers=1:2", "one per stage")]:
        with pytest.raises(ConfigError) as e:
            evaluate(gpt3, a100, 256, 512, parse_plan(text))
        assert e.value.field == "recompute_layers" and words in e.value.message
    with pytest.raises(ConfigError) as e:
        parse_plan("recompute=block,recompute_layers=two")
    assert e.value.field == "recompute_layers"
