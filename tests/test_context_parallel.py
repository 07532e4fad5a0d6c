"""Context parallelism (ring attention), sliding-window attention and KV-head replication, each
against a count derived by hand."""
from dataclasses import replace

import pytest

from phaze.arch import LinkLevel, load_chip
from phaze.cost import IDEAL, op_time
from phaze.graph import attention_work_fraction, layer_graph
from phaze.memory import activation_bytes_per_layer
from phaze.plan import Plan
from phaze.stage import _cp_exposed, _shard, tp_layer_params
from phaze.step import evaluate
from phaze.workload import Model

LLAMA8B = Model(name="llama8b-like", layers=4, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                vocab=128256, seq_len=8192, activation="swiglu", position_embedding="rotary",
                norm="rmsnorm", bias=False, dropout=False, tied_embeddings=False)
LLAMA70B = replace(LLAMA8B, name="llama70b-like", hidden=8192, heads=64, ffn_hidden=28672)


def attention_flops(model: Model, attention: str = "flash", tp: int = 1) -> float:
    """Executed forward FLOPs of the attention core (causal skipping applied)."""
    g = layer_graph(model, 1, tp, False, attention, "none")
    return sum(o.flops * o.work_fraction for o in g.fwd if o.core_attention)


def test_cp1_attention_by_hand():
    # 4 b a s^2 d, half of it causal: 4 * 32 * 8192^2 * 128 / 2
    assert attention_flops(LLAMA8B) == pytest.approx(2 * 32 * 8192 ** 2 * 128)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_cp_attention_per_device_is_one_cp_th_not_one_cp_squared(cp):
    """A shard's s/cp queries meet all s keys: (s/cp) * s / 2 scores, 1/cp of the layer's
    attention (the old seq/cp model gave 1/cp^2)."""
    full = 2 * 32 * 8192 ** 2 * 128
    shard = _shard(LLAMA8B, Plan(cp=cp))
    assert shard.seq_len == 8192 // cp and shard.context_parallel == cp
    assert attention_flops(shard) == pytest.approx(full / cp)
    # the linear layers see s/cp tokens: the QKV GEMM has s/cp rows
    qkv = next(o for o in layer_graph(shard, 1).fwd if o.name == "qkv")
    assert qkv.gemm[1] == 8192 // cp


def test_ring_attention_runs_cp_half_blocks():
    """Load-balanced ring: cp kernels over (s/cp) x (s/cp) blocks, each half computed (the
    diagonal causally, the others on half the queries or keys); backward mirrors each."""
    shard = _shard(LLAMA8B, Plan(cp=4))
    g = layer_graph(shard, 1, 1, False, "flash2", "none")
    fwd = [o for o in g.fwd if o.core_attention]
    bwd = [o for o in g.bwd if o.core_attention]
    assert len(fwd) == len(bwd) == 4   # N: a key's and a value's width, 128 + 128
    assert all(o.gemm == (32, 2048, 2048, 256) and o.work_fraction == 0.5 for o in fwd)
    assert [o.ring for o in fwd] == [(0,), (1,), (2,), (3,)]


def test_transformer_engine_ring_runs_two_forward_steps_side_by_side():
    """Transformer Engine's ring attention (``flash``) alternates its forward steps between two
    CUDA streams: steps 0+1 and 2+3 as one op of both blocks' tiles; its backward runs the four
    steps one by one, each a half block as before. The FLOPs are unchanged."""
    shard = _shard(LLAMA8B, Plan(cp=4))
    g = layer_graph(shard, 1, 1, False, "flash", "none")
    fwd = [o for o in g.fwd if o.core_attention]
    bwd = [o for o in g.bwd if o.core_attention]
    assert [o.ring for o in fwd] == [(0, 1), (2, 3)]
    assert all(o.gemm == (64, 2048, 2048, 256) and o.work_fraction == 0.5 for o in fwd)
    assert sorted(o.ring for o in bwd) == [(0,), (1,), (2,), (3,)]
    assert all(o.gemm == (32, 2048, 2048, 256) for o in bwd)
    assert attention_flops(shard) == pytest.approx(attention_flops(shard, "flash2"))
    assert sum(o.flops for o in bwd) == pytest.approx(2.5 * sum(o.flops for o in fwd))


def _pair_and_step(model: Model, tp: int, cp: int):
    shard = _shard(model, Plan(tp=tp, cp=cp))
    pair = next(o for o in layer_graph(shard, 1, tp, True, "flash", "none").fwd if o.core_attention)
    one = next(o for o in layer_graph(shard, 1, tp, True, "flash2", "none").fwd if o.core_attention)
    return pair, replace(one, operand_reuse=pair.operand_reuse)   # the same kernel, one step


def test_two_streams_fill_the_sms_that_one_half_block_leaves_idle():
    """tp = 8 (4 heads per rank), cp = 4 of 8192 tokens: one step's half block has 4 heads x
    2048 / 128 query rows / 2 = 32 query tiles of 128 rows for the H100's 132 SMs. Two steps side
    by side share the idle SMs: faster than one after the other, never faster than one step."""
    h100 = load_chip("h100-sxm")
    pair, one = _pair_and_step(LLAMA8B, 8, 4)
    assert pair.ring == (0, 1) and pair.gemm == (8, 2048, 2048, 256)
    assert one.gemm == (4, 2048, 2048, 256) and one.flops == pair.flops / 2
    t_pair, t_one = op_time(pair, h100, "bf16", IDEAL), op_time(one, h100, "bf16", IDEAL)
    assert t_one < t_pair < 0.95 * 2 * t_one


def test_two_streams_gain_nothing_when_a_step_fills_whole_waves():
    """tp = 1 (32 heads), cp = 2 of 65536 tokens: a step's half block has 32 x 32768 / 128 / 2 =
    4096 query tiles of 128 rows, 31.03 waves over 132 SMs: two steps side by side take as long
    as two one after the other, to under 1 %."""
    h100 = load_chip("h100-sxm")
    pair, one = _pair_and_step(replace(LLAMA8B, seq_len=65536), 1, 2)
    t_pair, t_one = op_time(pair, h100, "bf16", IDEAL), op_time(one, h100, "bf16", IDEAL)
    assert t_pair == pytest.approx(2 * t_one, rel=0.01)


def test_standard_attention_under_cp_scores_every_key():
    shard = _shard(LLAMA8B, Plan(cp=2))
    ops = {o.name: o for o in layer_graph(shard, 1, 1, False, "standard", "none").fwd}
    assert ops["scores"].gemm == (32, 4096, 128, 8192)      # Q_local . K^T over all 8192 keys
    assert ops["context"].gemm == (32, 4096, 8192, 128)
    # stored scores: 2 bytes x a x (s/cp) x s per micro-batch
    base = activation_bytes_per_layer(replace(shard, context_parallel=1), 1, 1, False, "none", "standard")
    full = activation_bytes_per_layer(shard, 1, 1, False, "none", "standard")
    assert full - base == pytest.approx(2 * 32 * 4096 * (8192 - 4096))


def test_sliding_window_attention_by_hand():
    """Window 4096 at s = 32768: query i sees min(i, 4096) keys, (w s - w^2/2) / s^2 =
    (1/8)(1 - 1/16) = 15/128 of the score matrix against 1/2 causal: a ratio of 15/64."""
    long = replace(LLAMA8B, seq_len=32768)
    windowed = replace(long, sliding_window=4096)
    assert attention_work_fraction(windowed) == pytest.approx(15 / 128)
    assert attention_flops(windowed) / attention_flops(long) == pytest.approx(15 / 64)
    # a window at least the sequence changes nothing
    assert attention_flops(replace(long, sliding_window=32768)) == attention_flops(long)
    # under cp = 2 each device does half of it
    assert attention_flops(_shard(windowed, Plan(cp=2))) == pytest.approx(attention_flops(windowed) / 2)


def test_sliding_window_speeds_up_a_step():
    a100 = load_chip("a100-80gb")
    long = replace(LLAMA8B, seq_len=32768)
    plan = Plan(recompute="full")
    full = evaluate(long, a100, 8, 8, plan).step_time_s
    windowed = evaluate(replace(long, sliding_window=4096), a100, 8, 8, plan).step_time_s
    assert windowed < full


def test_kv_heads_replicated_when_tp_exceeds_them():
    """tp = 16 over 8 KV heads: each rank holds 64/16 = 4 query heads and one whole KV head,
    QKV width 4 * 128 + 2 * 128 = 768 (not (8192 + 2 * 1024) / 16 = 640)."""
    qkv = next(o for o in layer_graph(LLAMA70B, 1, 16, True).fwd if o.name == "qkv")
    assert qkv.gemm[3] == 768
    qkv8 = next(o for o in layer_graph(LLAMA70B, 1, 8, True).fwd if o.name == "qkv")
    assert qkv8.gemm[3] == (8192 + 2 * 1024) // 8
    # the 16 ranks hold 16 K and 16 V heads of 128 x 8192 weights: 2 * 8192 * (2048 - 1024) more
    assert tp_layer_params(LLAMA70B, 16) - LLAMA70B.layer_params == 2 * 8192 * 1024
    assert tp_layer_params(LLAMA70B, 8) == LLAMA70B.layer_params
    # stored K and V: 2 x 128 per token on each rank
    s, p = 8192, 2
    want = (4 * p * s * 8192 / 16                                  # ln1, qkv, ln2, ffn inputs (sp)
            + p * s * (8192 + 2 * 2048 + 8192 + 2 * 28672 + 28672) / 16  # Q, K, V, out, act, down
            + 4.0 * 64 * s / 16)                                    # fp32 log-sum-exp
    assert activation_bytes_per_layer(LLAMA70B, 1, 16, True, "none", "flash") == pytest.approx(want)


def _slow_links(chip, node: int, intra: float, inter: float):
    return replace(chip, links=(LinkLevel("node", node, intra, 0.0), LinkLevel("net", 0, inter, 0.0)))


@pytest.mark.parametrize("recompute,passes", [("none", 3), ("full", 4)])
def test_ring_exchange_by_hand(recompute, passes):
    """On links so slow that attention hides almost nothing: cp - 1 steps, each sending the
    local K and V (2 x 2 bytes x s/cp x 1024) forward, K/V plus dK/dV backward, K/V again in
    full recompute's re-run forward; within the node (cp = 2) at the node's bandwidth."""
    a100 = _slow_links(load_chip("a100-80gb"), 8, 1e6, 0.5e6)
    model = replace(LLAMA8B, seq_len=2048)
    kv = 2 * 2 * 1024 * 1024
    got = _cp_exposed(model, a100, Plan(cp=2), IDEAL, recompute)
    assert got == pytest.approx(passes * kv / 1e6, rel=1e-3)


def test_ring_crosses_nodes_when_tp_cp_exceeds_the_node():
    """cp ranks sit at stride tp: cp = 16 over 8-GPU nodes runs its ring at the network's
    bandwidth, 15 steps."""
    a100 = _slow_links(load_chip("a100-80gb"), 8, 1e6, 0.5e6)
    model = replace(LLAMA8B, seq_len=16384)
    kv = 2 * 2 * 1024 * 1024
    got = _cp_exposed(model, a100, Plan(cp=16), IDEAL, "none")
    assert got == pytest.approx(15 * 3 * kv / 0.5e6, rel=1e-3)
    # tp = 2, cp = 4 fills one node: node bandwidth
    got = _cp_exposed(replace(model, seq_len=4096, kv_heads=16), a100, Plan(tp=2, cp=4), IDEAL, "none")
    assert got == pytest.approx(3 * 3 * kv / 1e6, rel=1e-3)


def test_core_attn_recompute_re_exchanges_the_ring_as_full_recompute_does():
    """Megatron-Core's core_attn checkpoint re-runs the ring attention's forward, K/V exchange
    included: the same exposed exchange as a full recompute's re-run; Megatron-LM's selective with
    a fused kernel re-runs nothing and exchanges nothing more."""
    chip = load_chip("h100-sxm")
    plan = Plan(tp=8, cp=4)
    full = _cp_exposed(LLAMA8B, chip, plan, IDEAL, "full")
    legacy = _cp_exposed(LLAMA8B, chip, plan, IDEAL, "selective")
    core = _cp_exposed(LLAMA8B, chip, plan, IDEAL, "selective+core_attn")
    assert core == full and legacy == _cp_exposed(LLAMA8B, chip, plan, IDEAL, "none") < core
