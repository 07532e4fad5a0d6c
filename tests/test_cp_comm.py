"""Context parallelism's K/V exchange (``cp_comm``): Transformer Engine's p2p ring, all-gather and
all-to-all (Ulysses), and PyTorch's context parallel. Each mode's exposed time and bytes by hand,
the invariants between them, their memory, the preset, the column and the refusals."""
from dataclasses import replace

import pytest

from phaze.arch import LinkLevel, load_chip
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.cost import IDEAL
from phaze.framework import FRAMEWORKS, plan_settings
from phaze.graph import layer_graph
from phaze.plan import CP_COMMS, Plan, parse_plan
from phaze.plan_check import check_plan
from phaze.stage import _cp_exposed, _shard, cp_sent_bytes, cp_transient_bytes, stage_costs
from phaze.step import evaluate
from phaze.workload import Model

LLAMA8B = Model(name="llama8b-like", layers=4, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                vocab=128256, seq_len=2048, activation="swiglu", position_embedding="rotary",
                norm="rmsnorm", bias=False, dropout=False, tied_embeddings=False)
MiB = 2.0 ** 20
# per rank at cp = 2 (1,024 tokens, tp 1, 16-bit): K and V 2 x 1024 x 1024 x 2 bytes, Q and the
# output 1024 x 4096 x 2 bytes each
KV2, Q2, O2 = 4 * MiB, 8 * MiB, 8 * MiB


def slow_a100(beta: float = 1e6):
    """An A100 whose every link moves ``beta`` bytes a second with no latency: the attention
    (milliseconds) hides a negligible share of any exchange (seconds)."""
    chip = load_chip("a100-80gb")
    return replace(chip, links=(LinkLevel("node", 8, beta, 0.0), LinkLevel("net", 0, beta, 0.0)))


def test_parse_label_and_refusals():
    assert Plan().cp_comm == "p2p" and CP_COMMS == ("p2p", "all_gather", "a2a", "a2a+p2p", "torch")
    for mode in CP_COMMS:
        plan = parse_plan(f"cp=4,cp_comm={mode}" + (",cp_a2a=2" if mode == "a2a+p2p" else ""))
        assert plan.cp_comm == mode and parse_plan(plan.label()) == replace(plan, recompute="none")
    assert "cp_comm" not in Plan(cp=2).label() and "cp_comm" not in Plan(cp_comm="a2a").label()
    assert parse_plan("cp=2,cp_comm=A2A").cp_comm == "a2a"
    assert Plan(cp=4, cp_comm="a2a+p2p", cp_a2a=2).label().endswith("cp=4,cp_comm=a2a+p2p,cp_a2a=2,attention=flash")
    with pytest.raises(ConfigError, match="cp_comm.*must be one of p2p, all_gather, a2a, a2a\\+p2p, torch, got 'ring'"):
        parse_plan("cp=4,cp_comm=ring")


def test_a2a_needs_the_heads_of_a_rank_to_split_over_cp():
    """Ulysses gives each cp rank heads/cp of a tp rank's heads: 32 query and 8 kv heads split
    over cp 8, not 16; at tp 8 one kv head is left per rank, which splits over nothing."""
    check_plan(replace(LLAMA8B, seq_len=8192), 8, 8, Plan(cp=8, cp_comm="a2a"))
    with pytest.raises(ConfigError, match="cp \\(16\\) must divide the query heads \\(32\\) and kv heads \\(8\\)"):
        check_plan(replace(LLAMA8B, seq_len=8192), 16, 16, Plan(cp=16, cp_comm="a2a"))
    with pytest.raises(ConfigError, match="query heads \\(4\\) and kv heads \\(1\\)"):
        check_plan(replace(LLAMA8B, seq_len=8192), 16, 16, Plan(tp=8, cp=2, cp_comm="a2a"))
    # the ring modes split the sequence, not the heads
    for mode in ("p2p", "all_gather", "torch"):
        check_plan(replace(LLAMA8B, seq_len=8192), 16, 16, Plan(cp=16, cp_comm=mode))


@pytest.mark.parametrize("recompute,rerun", [("none", 0), ("full", 1)])
def test_exposed_time_of_each_mode_by_hand(recompute, rerun):
    """cp = 2 inside a node at 1 MB/s, attention hiding nothing:
    - p2p: one step, K/V forward, K/V and dK/dV backward (3 KV), K/V again in a re-run;
    - all_gather: K and V each gathered (half of 2 x their size) forward and backward, dK and dV
      reduce-scattered: the same 3 KV, and a gather more in a re-run;
    - a2a: each all-to-all moves half of what a rank holds: Q, K, V and the output forward,
      dO and dQ, dK, dV backward, (Q + KV + O) / 2 each way, the forward again in a re-run;
    - torch: one gather of K and V forward, one backward, the fp32 dK, dV (2 KV) sent twice (after
      the first step, under the second; after the loop, exposed), a gather more in a re-run."""
    chip = slow_a100()
    beta = 1e6
    want = {"p2p": (3 + rerun) * KV2, "all_gather": (3 + rerun) * KV2,
            "a2a": (2 + rerun) * (Q2 + KV2 + O2) / 2, "torch": (1 + 1 + 2 * 2 + rerun) * KV2}
    for mode, nbytes in want.items():
        got = _cp_exposed(LLAMA8B, chip, Plan(cp=2, cp_comm=mode), IDEAL, recompute)
        assert got == pytest.approx(nbytes / beta, rel=1e-3), mode


def test_all_gather_moves_what_the_ring_moves_at_any_cp():
    """A ring all-gather of cp blocks sends (cp - 1) blocks a rank, as the ring's cp - 1 steps do:
    with nothing hidden, all_gather and p2p expose the same time (cp 4: 9 KV), and the bytes the
    power model counts are the same too."""
    chip = slow_a100()
    model = replace(LLAMA8B, seq_len=4096)
    p2p = _cp_exposed(model, chip, Plan(cp=4), IDEAL, "none")
    gathered = _cp_exposed(model, chip, Plan(cp=4, cp_comm="all_gather"), IDEAL, "none")
    assert p2p == pytest.approx(gathered, rel=1e-4) and p2p == pytest.approx(9 * KV2 / 1e6, rel=1e-3)
    assert cp_sent_bytes(model, Plan(cp=4), "none") == cp_sent_bytes(model, Plan(cp=4, cp_comm="all_gather"),
                                                                     "none") == 9 * KV2


def test_bytes_sent_by_hand():
    """What the power model counts a layer and micro-batch (cp = 2): p2p 3 KV, all_gather 3 KV,
    a2a Q + KV + O, torch 2 KV gathered and 2 x 2 KV of fp32 gradients; a re-run adds the
    forward's exchange; cp = 1 sends nothing."""
    sent = {m: cp_sent_bytes(LLAMA8B, Plan(cp=2, cp_comm=m), "none") for m in CP_COMMS if m != "a2a+p2p"}
    assert sent == {"p2p": 3 * KV2, "all_gather": 3 * KV2, "a2a": Q2 + KV2 + O2, "torch": 6 * KV2}
    assert cp_sent_bytes(LLAMA8B, Plan(cp=2, cp_comm="a2a"), "full") == pytest.approx((Q2 + KV2 + O2) * 3 / 2)
    assert cp_sent_bytes(LLAMA8B, Plan(cp=2, cp_comm="torch"), "full") == 7 * KV2
    assert cp_sent_bytes(LLAMA8B, Plan(cp_comm="torch"), "full") == 0.0


def test_hierarchical_bytes_by_hand():
    """a2a+p2p at cp 4 in groups of 2 (a rank: 512 tokens, K and V 2 MiB, Q and the output 4 MiB
    each): half of Ulysses' forward and backward tensors leave the rank inside its group (Q, K, V,
    O, then dO, dQ, dK, dV: 2 x 10 MiB / 2), then one ring step to the other group (K and V
    forward, K, V, dK, dV backward: 3 x 2 MiB): 16 MiB, between Ulysses' 15 and the ring's 18."""
    Q4, KV4, O4 = 4 * MiB, 2 * MiB, 4 * MiB
    hier = cp_sent_bytes(LLAMA8B, Plan(cp=4, cp_comm="a2a+p2p", cp_a2a=2), "none")
    assert hier == (Q4 + KV4 + O4) + 3 * KV4 == 16 * MiB
    assert cp_sent_bytes(LLAMA8B, Plan(cp=4, cp_comm="a2a"), "none") == 15 * MiB
    assert cp_sent_bytes(LLAMA8B, Plan(cp=4), "none") == 18 * MiB
    # a re-run of the attention repeats the forward's exchanges: half of Q, K, V, O and one K/V step
    full = cp_sent_bytes(LLAMA8B, Plan(cp=4, cp_comm="a2a+p2p", cp_a2a=2), "full")
    assert full == 16 * MiB + (Q4 + KV4 + O4) / 2 + KV4


def test_hierarchical_exposure_on_slow_links():
    """On links too slow for any attention to hide (slow_a100), a2a+p2p's exposed time is Ulysses'
    over its group of cp_a2a plus the ring's over the cp / cp_a2a groups, each costed as the
    plain modes cost them: the all-to-alls of a2a at cp = cp_a2a, the ring steps of p2p."""
    model = replace(LLAMA8B, seq_len=8192)
    chip, eff = slow_a100(), IDEAL
    hier = Plan(cp=8, cp_comm="a2a+p2p", cp_a2a=2)
    got = _cp_exposed(model, chip, hier, eff, "none")
    # Ulysses over 2 ranks of 1024 tokens: each all-to-all sends half of its tensor to the other
    kv, q, o = 2 * 1024 * 1024 * 2, 1024 * 4096 * 2, 1024 * 4096 * 2
    a2a = 2 * (q + kv + o) / 2 / 1e6
    ring = (4 - 1) * 3 * kv / 1e6      # three sends a step, forward K/V, backward K/V and dK/dV
    assert got == pytest.approx(a2a + ring, rel=0.02)
    check_plan(model, 8, 8, hier)
    for a, words in ((8, "allowed: 2, 4"), (3, "allowed: 2, 4")):
        with pytest.raises(ConfigError, match=f"cp_a2a.*{words}"):
            check_plan(model, 8, 8, Plan(cp=8, cp_comm="a2a+p2p", cp_a2a=a))
    with pytest.raises(ConfigError, match="cp_a2a.*is the all-to-all group of cp_comm=a2a\\+p2p"):
        check_plan(model, 8, 8, Plan(cp=8, cp_a2a=2))
    with pytest.raises(ConfigError, match="cp_a2a \\(4\\) must divide the query heads \\(8\\) and kv heads \\(2\\)"):
        check_plan(model, 32, 8, Plan(tp=4, cp=8, cp_comm="a2a+p2p", cp_a2a=4))


def test_hierarchical_kernels_and_scores():
    """a2a+p2p at cp 8 in groups of 4: two ring steps, each of the group's 4 x 1024 queries against
    4 x 1024 keys for a quarter of the heads, two at a time on two streams (one op), with the
    ring's scores."""
    model = replace(LLAMA8B, seq_len=8192)
    ring = _shard(model, Plan(cp=8))
    hier = _shard(model, Plan(cp=8, cp_comm="a2a+p2p", cp_a2a=4))
    core = lambda m: [o for o in layer_graph(m, 1, 1, False, "flash", "none").fwd if o.core_attention]  # noqa: E731
    ops = core(hier)
    assert [o.gemm for o in ops] == [(2 * 32 // 4, 4096, 4096, 256)] and ops[0].ring == (0, 1)
    assert sum(o.elements * o.work_fraction for o in ops) == pytest.approx(
        sum(o.elements * o.work_fraction for o in core(ring)))


def test_mla_values_are_narrower_than_its_keys():
    """DeepSeek-V3's MLA attends with 128 heads of 192-wide keys (128 + 64 rotary) and 128-wide
    values: at tp 8, cp 2 and 4,096 tokens a rank holds 2,048 tokens x 16 heads x (192 + 128) x 2
    bytes of K and V, not 2 x 192; the ring sends it 3 times (forward, backward, dK/dV)."""
    ds = load_model("deepseek-v3", 4096)
    assert (ds.head_dim, ds.v_head_dim, ds.heads, ds.kv_heads) == (192, 128, 128, 128)
    kv = 2048 * 16 * (192 + 128) * 2
    assert cp_sent_bytes(ds, Plan(tp=8, cp=2), "none") == 3 * kv
    assert cp_transient_bytes(ds, Plan(tp=8, cp=2, cp_comm="all_gather")) == 2 * kv


def test_power_model_counts_the_exchange():
    """The power model's link traffic: 4 layers x 4 micro-batches (global batch 8 over dp 2) of
    each mode's bytes; the modes differ from p2p by exactly that."""
    from phaze.area import _step_activity
    chip = load_chip("h100-sxm")
    model = replace(LLAMA8B, seq_len=4096)
    ring = Plan(tp=2, cp=2)
    base = _step_activity(model, chip, 8, 8, ring).link_bytes
    for mode in CP_COMMS:
        plan = replace(ring, cp_comm=mode)
        if mode == "a2a+p2p":   # groups of 2 need cp 4: 4 layers x 8 micro-batches (dp 1)
            ring4 = Plan(tp=2, cp=4)
            plan = replace(ring4, cp_comm=mode, cp_a2a=2)
            got = (_step_activity(model, chip, 8, 8, plan).link_bytes
                   - _step_activity(model, chip, 8, 8, ring4).link_bytes)
            want = 32 * (cp_sent_bytes(model, plan, "none") - cp_sent_bytes(model, ring4, "none"))
            assert got == pytest.approx(want, abs=1.0) and want < 0
            continue
        got = _step_activity(model, chip, 8, 8, plan).link_bytes - base
        want = 16 * (cp_sent_bytes(model, plan, "none") - cp_sent_bytes(model, ring, "none"))
        assert got == pytest.approx(want, abs=1.0), mode
    # p2p's own, at tp 2 (4 of the 8 kv heads on a rank): 3 x K and V of 2,048 tokens x 512
    assert cp_sent_bytes(model, ring, "none") == 3 * 2 * 2 * 2048 * 512


def test_hiding_orders_the_modes_across_nodes():
    """Llama-3 70B at 64K tokens, tp 8, cp 16 over InfiniBand: the ring hides its sends under the
    steps, PyTorch's gather only under the first step, Transformer Engine's all-gather under
    nothing: their exposed exchanges keep that order."""
    from phaze.calibrate import calibrated_efficiency
    model = load_model("llama3-70b", 65536)
    chip = load_chip("h100-sxm")
    eff = calibrated_efficiency(chip)
    plan = Plan(tp=8, cp=16)
    got = [_cp_exposed(model, chip, replace(plan, cp_comm=m), eff, "full") for m in ("p2p", "torch", "all_gather")]
    assert 0 < got[0] < got[1] < got[2]


def test_kernels_of_each_mode():
    """The attention a rank runs (cp 4, 32 heads, 2,048 local tokens): the ring's cp steps of half
    an s x s block (Transformer Engine's forward two at a time); all_gather's local queries
    against the 8,192 gathered keys in one op; Ulysses' 8 heads over the whole sequence. The
    same scores in every mode."""
    from phaze.stage import _shard
    model = replace(LLAMA8B, seq_len=8192)

    def core(mode, attention="flash"):
        g = layer_graph(_shard(model, Plan(cp=4, cp_comm=mode)), 1, 1, False, attention, "none")
        return [o for o in g.fwd if o.core_attention]

    ring, gathered, ulysses, torch = core("p2p"), core("all_gather"), core("a2a"), core("torch", "flash")
    # N: the keys' and values' widths, 128 + 128 (the block each key step streams)
    assert [o.gemm for o in ring] == [(2 * 32, 2048, 2048, 256)] * 2
    assert [o.gemm for o in torch] == [(32, 2048, 2048, 256)] * 4    # one step at a time
    assert [o.gemm for o in gathered] == [(32, 2048, 8192, 256)]
    assert [o.gemm for o in ulysses] == [(8, 8192, 8192, 256)]
    scores = {mode: sum(o.elements * o.work_fraction for o in ops)
              for mode, ops in (("p2p", ring), ("all_gather", gathered), ("a2a", ulysses), ("torch", torch))}
    assert set(scores.values()) == {32 * 2048 * 8192 / 2}


def test_gathered_kv_held_while_the_layer_runs():
    """all_gather holds the whole sequence's K and V (cp x the rank's KV); torch also its fp32
    dQ, dK, dV accumulators and the received dK, dV ((Q + 2 KV) x 2); both memory paths agree."""
    import numpy as np
    model = LLAMA8B
    chip = load_chip("h100-sxm")
    assert cp_transient_bytes(model, Plan(cp=2)) == cp_transient_bytes(model, Plan(cp=2, cp_comm="a2a")) == 0
    assert cp_transient_bytes(model, Plan(cp=2, cp_comm="all_gather")) == 2 * KV2
    assert cp_transient_bytes(model, Plan(cp=2, cp_comm="torch")) == 2 * KV2 + (Q2 + 2 * KV2) * 2
    assert cp_transient_bytes(model, Plan(cp_comm="torch")) == 0
    base = stage_costs(model, chip, 4, 4, Plan(cp=2), IDEAL)
    for mode in ("all_gather", "torch"):
        costs = stage_costs(model, chip, 4, 4, Plan(cp=2, cp_comm=mode), IDEAL)
        extra = cp_transient_bytes(model, Plan(cp=2, cp_comm=mode))
        assert costs.memory(0, 4, "none").total_bytes - base.memory(0, 4, "none").total_bytes == pytest.approx(extra)
        assert costs.memory_table("none", np.array([4]))[0, 0] == costs.memory(0, 4, "none").total_bytes


def test_presets_name_their_frameworks_exchange():
    """torchtitan runs PyTorch's context parallel, MaxText gathers K and V (its
    context_parallel_strategy default), the Megatron family TE's ring."""
    assert plan_settings(FRAMEWORKS["torchtitan"])["cp_comm"] == "torch"
    assert plan_settings(FRAMEWORKS["maxtext"])["cp_comm"] == "all_gather"
    assert all(f.cp_comm == "p2p" for n, f in FRAMEWORKS.items() if n not in ("torchtitan", "maxtext"))
    assert plan_settings(None)["cp_comm"] == "p2p"


def test_the_row_column_takes_the_preset_unless_it_says():
    from test_validate import synthetic, synthetic_case

    from phaze.runs import Case, row_to_case
    assert synthetic_case(framework="torchtitan", cp="2").plan.cp_comm == "torch"
    assert synthetic_case(framework="torchtitan", cp="2", cp_comm="p2p").plan.cp_comm == "p2p"
    assert synthetic_case(framework="MaxText (JAX/XLA)", cp="2").plan.cp_comm == "all_gather"
    assert synthetic_case(cp="2", cp_comm="all_gather").plan.cp_comm == "all_gather"
    assert synthetic_case(cp="2").plan.cp_comm == "p2p"
    plan = synthetic_case(cp="4", cp_comm="a2a+p2p", cp_a2a="2").plan
    assert (plan.cp_comm, plan.cp_a2a) == ("a2a+p2p", 2)
    r = row_to_case(synthetic(cp="4", cp_comm="a2a+p2p"))
    assert not isinstance(r, Case) and "cp_a2a" in r.reason and "allowed: 2" in r.reason
    r = row_to_case(synthetic(cp="2", cp_comm="ring"))
    assert not isinstance(r, Case) and "column 'cp_comm' must be one of p2p, all_gather, a2a, a2a+p2p" in r.reason


@pytest.mark.parametrize("value, expect", [("all_gather", "all_gather"), ("A2A", "a2a"), (None, "p2p")])
def test_sweep_placement_takes_cp_comm(tmp_path, value, expect):
    from test_space import placement_options
    placement = {} if value is None else {"cp_comm": value}
    assert placement_options(tmp_path, placement).cp_comm == expect
    # the torchtitan preset runs PyTorch's unless the config says otherwise
    got = placement_options(tmp_path, dict(placement, framework="torchtitan")).cp_comm
    assert got == ("torch" if value is None else expect)
    with pytest.raises(ConfigError) as e:
        placement_options(tmp_path, {"cp_comm": "ring"})
    assert e.value.field == "workloads[0].placement.cp_comm"
    assert "p2p, all_gather, a2a, a2a+p2p, torch" in e.value.message
    assert placement_options(tmp_path, {"cp_comm": "a2a+p2p"}).cp_comm == "a2a+p2p"


def test_place_keeps_the_exchange_it_is_given():
    """``place`` costs every context-parallel layout with the given exchange and drops those
    Ulysses cannot split (cp 16 over 8 kv heads); its plans say the exchange."""
    from phaze.placement import PlacementOptions, place
    model = replace(LLAMA8B, seq_len=32768)
    chip = load_chip("h100-sxm")
    for mode in CP_COMMS:
        got = place(model, chip, 16, 16, PlacementOptions(tp=(1,), cp=(4, 16), mbs=(1,), cp_comm=mode), top=10,
                    with_baseline=False)
        cps = {p.plan.cp for p in got.top}
        assert got.top and all(p.plan.cp_comm == mode for p in got.top), mode
        assert cps == ({4} if mode == "a2a" else {4, 16}), (mode, cps)


def test_place_searches_several_exchanges_exactly():
    """Given several exchanges, ``place`` returns the best plans of them all: brute force, the
    best of one search per exchange. Llama-3 8B at 128K tokens on four H100 nodes under the nemo
    preset at tp 2, cp 16 (tp x cp over four nodes), where the hierarchical exchange wins (Ulysses
    inside a node's 4 x 2 GPUs, a ring across the four nodes) and the gather comes next; then a
    wider space (tp 1-2, cp 1-16, pp and ZeRO searched), whose top 12 are the 12 best of the
    single searches' top 12s and whose cp = 1 layouts are one plan each, not five."""
    from phaze.api import calibrated_efficiency, with_system
    from phaze.framework import options_with
    from phaze.placement import PlacementOptions, layouts, place
    chip = with_system(load_chip("h100-sxm"), "dgx-h100-superpod").with_execution("eager")
    eff = calibrated_efficiency(chip)

    def search(model, devices, batch, comm, **kw):
        options = options_with(FRAMEWORKS["nemo"], PlacementOptions(cp_comm=comm, mbs=(1,), recompute=("full",),
                                                                    **kw), {"cp_comm"})[0]
        return place(model, chip, devices, batch, options, eff, top=12, with_baseline=False)

    for model, devices, batch, kw in ((load_model("llama3-8b", 131072), 32, 8, dict(tp=(2,), cp=(16,))),
                                      (replace(LLAMA8B, seq_len=131072), 16, 4, dict(tp=(1, 2), cp=(1, 4, 16)))):
        both, alone = search(model, devices, batch, CP_COMMS, **kw), {m: search(model, devices, batch, m, **kw)
                                                                     for m in CP_COMMS}
        best = min((r.best for r in alone.values() if r.best), key=lambda p: p.result.step_time_s)
        assert both.best.result.step_time_s == best.result.step_time_s and both.best.plan == best.plan
        # by label: a cp = 1 plan is the same plan whatever exchange it was given
        union = {p.plan.label(): p.result.step_time_s for r in alone.values() for p in r.top}
        joint = {p.plan.label(): p.result.step_time_s for p in both.top}
        assert all(union[k] == t for k, t in joint.items())
        assert sorted(joint.values()) == sorted(union.values())[:len(joint)]
        if model.layers == 32:
            assert (best.plan.tp, best.plan.cp, best.plan.cp_comm, best.plan.cp_a2a) == (2, 16, "a2a+p2p", 4)
            assert min((r for m, r in alone.items() if m != "a2a+p2p" and r.best),
                       key=lambda r: r.best.result.step_time_s).best.plan.cp_comm == "all_gather"
        else:
            # the joint top 12 are the union's 12 best plans, of several exchanges
            assert len(joint) == 12 and set(joint) == set(sorted(union, key=union.get)[:12])
            assert len({p.plan.cp_comm for p in both.top if p.plan.cp > 1}) >= 3
            plans = list(layouts(model, devices, batch, PlacementOptions(cp_comm=CP_COMMS, **kw)))
            assert {p.cp_comm for p in plans if p.cp == 1} == {"p2p"}
            assert {p.cp_comm for p in plans if p.cp == 16} == set(CP_COMMS) - {"a2a"}   # a2a: 8 kv heads
            # a2a+p2p: every group that splits the 8 kv heads and leaves a ring of two or more
            assert {p.cp_a2a for p in plans if p.cp == 16 and p.cp_comm == "a2a+p2p"} == {2, 4, 8}
            assert {p.cp_a2a for p in plans if p.cp == 4 and p.cp_comm == "a2a+p2p"} == {2}
            assert {p.cp_comm for p in plans if p.cp == 4} == set(CP_COMMS)


def test_several_exchanges_from_the_flag_and_the_sweep(tmp_path):
    from test_space import placement_options

    from phaze.cli import _cp_comm
    assert _cp_comm("p2p") == "p2p" and _cp_comm("P2P,all_gather,p2p") == ("p2p", "all_gather")
    assert _cp_comm("p2p,a2a+p2p") == ("p2p", "a2a+p2p")
    with pytest.raises(Exception, match="or several joined by commas"):
        _cp_comm(",")
    assert placement_options(tmp_path, {"cp_comm": ["torch", "a2a"]}).cp_comms == ("torch", "a2a")
    assert placement_options(tmp_path, {"cp_comm": ["torch"]}).cp_comm == "torch"
    with pytest.raises(ConfigError, match="must be one of p2p, .*, torch.* \\(or a list of them\\)"):
        placement_options(tmp_path, {"cp_comm": ["p2p", "ring"]})
    with pytest.raises(ConfigError, match="a non-empty list"):
        placement_options(tmp_path, {"cp_comm": []})


def test_the_printout_says_the_exchange():
    from phaze.cli import format_result
    model = replace(LLAMA8B, seq_len=8192)
    chip = load_chip("h100-sxm")
    text = format_result(evaluate(model, chip, 4, 2, Plan(cp=2, cp_comm="all_gather")))
    assert "cp=2,cp_comm=all_gather,attention=flash, dp=2, 1 micro-batch per step" in text
    text = format_result(evaluate(model, chip, 4, 4, Plan(cp=2)))
    assert "cp=2,attention=flash, dp=2, 2 micro-batches per step" in text
