"""Operator cost model: hand-derived cases, ring formulas, roofline bounds, monotonicity."""
import json
import math
from dataclasses import replace

import pytest
from conftest import toy_chip
from hypothesis import given, settings
from hypothesis import strategies as st

from phaze.arch import LinkLevel, TensorUnits, load_chip
from phaze.calibrate import BOUNDS, load_params
from phaze.cost import Efficiency, collective_time, gemm_tiles, gemm_time, op_time, tile_candidates, vector_time
from phaze.graph import Collective, Op


def test_gemm_whole_tiles_and_waves(chip):
    # 4 units of 4x4, fixed 4x4 tiles: a tile of K=64 takes 64 cycles at 1 GHz.
    # Halved tiles are below the array size, so the only candidate is 4x4.
    assert tile_candidates(chip, 2) == ((4, 4),)
    t = lambda M, N: gemm_time(1, M, 64, N, chip)  # noqa: E731
    assert t(8, 8) == pytest.approx(64e-9)          # 4 tiles: one wave
    assert t(8, 12) == pytest.approx(2 * 64e-9)     # 6 tiles: two waves
    assert t(5, 5) == pytest.approx(64e-9)          # padded to 2x2 tiles: one wave
    assert t(16, 16) == pytest.approx(4 * 64e-9)    # 16 tiles: four waves


def test_systolic_fill_and_drain():
    c = toy_chip(tensor=TensorUnits(count=1, rows=4, cols=4, tile_m=4, tile_n=4, fill_drain=True))
    assert gemm_time(1, 4, 100, 4, c) == pytest.approx((100 + 8) * 1e-9)


def test_gemm_memory_bound_by_hbm():
    c = toy_chip(hbm_bandwidth_bytes_per_s=1e9)     # 1 GB/s: everything is memory bound
    M, K, N = 64, 64, 64
    compulsory = 2 * (M * K + K * N + M * N)
    assert gemm_time(1, M, K, N, c) == pytest.approx(compulsory / 1e9)


@pytest.mark.parametrize("name", ["a100-80gb", "h100-sxm", "tpuv4"])
@pytest.mark.parametrize("shape", [(1, 2048, 12288, 4608), (12, 2048, 128, 2048), (1, 8, 4096, 4096),
                                   (1, 16384, 16384, 16384), (1, 1, 1, 1)])
def test_gemm_never_beats_peak_or_bandwidth(name, shape):
    c = load_chip(name)
    b, M, K, N = shape
    t = gemm_time(b, M, K, N, c)
    assert t >= 2.0 * b * M * K * N / c.peak_flops("bf16") * (1 - 1e-12)
    assert t >= 2.0 * (b * M * K + K * N + b * M * N) / c.hbm_bandwidth_bytes_per_s * (1 - 1e-12)


def test_vector_time_roofline(chip):
    flops_rate = chip.vector_flops_per_s   # 2 units x 8 lanes x 2 x 1 GHz = 32 GFLOP/s
    assert flops_rate == 32e9
    assert vector_time(1e6, 1e6, 0, chip) == pytest.approx(1e6 / 32e9)
    assert vector_time(1e6, 0, 1e12, chip) == pytest.approx(1e12 / 1e15)


# --- collectives ------------------------------------------------------------------------------
ONE_LEVEL = toy_chip(links=(LinkLevel("ring", 0, 50e9, 2e-6),))


@pytest.mark.parametrize("n", [2, 3, 8, 64])
@pytest.mark.parametrize("nbytes", [1e3, 1e9])
def test_ring_formulas(n, nbytes):
    beta, alpha = 50e9, 2e-6
    ar = 2 * (n - 1) / n * nbytes / beta + 2 * (n - 1) * alpha
    assert collective_time("all_reduce", nbytes, n, ONE_LEVEL) == pytest.approx(ar)
    half = (n - 1) / n * nbytes / beta + (n - 1) * alpha
    assert collective_time("reduce_scatter", nbytes, n, ONE_LEVEL) == pytest.approx(half)
    assert collective_time("all_gather", nbytes, n, ONE_LEVEL) == pytest.approx(half)
    assert collective_time("send", nbytes, 2, ONE_LEVEL) == pytest.approx(nbytes / beta + alpha)
    assert collective_time("all_reduce", nbytes, 1, ONE_LEVEL) == 0.0


def test_hierarchical_all_reduce(chip):
    # toy chip: 4 devices per fast domain (100 GB/s, 1 us), slow level 10 GB/s, 10 us
    D = 1e9
    # group of 4 consecutive ranks: fast ring only
    assert collective_time("all_reduce", D, 4, chip) == pytest.approx(2 * 3 / 4 * D / 100e9 + 6e-6)
    # group of 8 ranks: 4 inside each domain, 2 domains; slow ring carries D/4
    expect = 2 * 3 / 4 * D / 100e9 + 6e-6 + 2 * 1 / 2 * (D / 4) / 10e9 + 2 * 1e-5
    assert collective_time("all_reduce", D, 8, chip) == pytest.approx(expect)
    # stride 4: every member in its own domain -> one flat slow ring of 3
    assert collective_time("all_reduce", D, 3, chip, stride=4) == pytest.approx(
        2 * 2 / 3 * D / 10e9 + 4 * 1e-5)
    # send between neighbours stays inside the domain; stride 4 crosses it
    assert collective_time("send", D, 2, chip, stride=1) == pytest.approx(D / 100e9 + 1e-6)
    assert collective_time("send", D, 2, chip, stride=4) == pytest.approx(D / 10e9 + 1e-5)


# --- monotonicity: less hardware is never faster -------------------------------------------------
shapes = st.tuples(st.integers(1, 16), st.integers(1, 8192), st.integers(1, 8192), st.integers(1, 8192))
DOWN = [
    ("hbm_bandwidth_bytes_per_s", lambda c, f: replace(c, hbm_bandwidth_bytes_per_s=c.hbm_bandwidth_bytes_per_s * f)),
    ("shared_buffer_bandwidth", lambda c, f: replace(
        c, shared_buffer_bandwidth_bytes_per_s=c.shared_buffer_bandwidth_bytes_per_s * f)),
    ("shared_buffer_bytes", lambda c, f: replace(c, shared_buffer_bytes=c.shared_buffer_bytes * f)),
    ("local_sram_bytes", lambda c, f: replace(c, local_sram_bytes=c.local_sram_bytes * f)),
    ("tensor_count", lambda c, f: c.with_units(tensor_count=max(1, int(c.tensor.count * f)))),
    ("vector_count", lambda c, f: c.with_units(vector_count=max(1, int(c.vector.count * f)))),
    ("vector_lanes", lambda c, f: c.with_units(vector_lanes=max(1, int(c.vector.lanes * f)))),
    ("clock_hz", lambda c, f: replace(c, clock_hz=c.clock_hz * f)),
]


@settings(max_examples=150, deadline=None)
@given(shape=shapes, chip_name=st.sampled_from(["a100-80gb", "h100-sxm", "tpuv4"]),
       which=st.sampled_from(range(len(DOWN))), factor=st.floats(0.05, 0.99))
def test_less_hardware_is_never_faster(shape, chip_name, which, factor):
    c = load_chip(chip_name)
    if which == 7:   # the listed peak overrides the units; scale it with the clock
        c = replace(c, peak_flops_per_s=())
    worse = DOWN[which][1](c, factor)
    b, M, K, N = shape
    assert gemm_time(b, M, K, N, worse) >= gemm_time(b, M, K, N, c) * (1 - 1e-12)
    elements = b * M * N
    assert (vector_time(elements, 5 * elements, 4 * elements, worse)
            >= vector_time(elements, 5 * elements, 4 * elements, c) * (1 - 1e-12))


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 512), stride=st.sampled_from([1, 2, 8, 16]), nbytes=st.floats(1e3, 1e10),
       kind=st.sampled_from(["all_reduce", "reduce_scatter", "all_gather", "send"]),
       level=st.sampled_from([0, 1]), factor=st.floats(0.05, 0.99))
def test_slower_links_are_never_faster(n, stride, nbytes, kind, level, factor):
    c = load_chip("a100-80gb")
    links = list(c.links)
    links[level] = replace(links[level], bandwidth_bytes_per_s=links[level].bandwidth_bytes_per_s * factor)
    worse = replace(c, links=tuple(links))
    assert (collective_time(kind, nbytes, n, worse, stride)
            >= collective_time(kind, nbytes, n, c, stride) * (1 - 1e-12))


def test_bigger_buffers_reduce_hbm_traffic():
    c = load_chip("tpuv4")
    small = replace(c, shared_buffer_bytes=1 << 20, hbm_bandwidth_bytes_per_s=1e11)
    big = replace(small, shared_buffer_bytes=1 << 30)
    assert gemm_time(1, 8192, 8192, 8192, big) < gemm_time(1, 8192, 8192, 8192, small)
    assert math.isfinite(gemm_time(1, 8192, 8192, 8192, small))


# --- per-tile overheads, fused attention, host dispatch -----------------------------------------
def _fused_attention(s: int, d: int = 4, causal: bool = True) -> Op:
    """A fused attention forward by hand: both products (S = Q.K^T, O = P.V), no softmax cost."""
    return Op(name="fa", unit="tensor+vector", phase="fwd", flops=4.0 * s * s * d, gemm=(1, s, s, d),
              work_fraction=0.5 if causal else 1.0)


def test_tile_overhead_adds_to_a_feed_bound_main_loop():
    # 1 B/cycle from local SRAM; a 4x4 tile reads 2 B (p = 2) x (1/4 + 1/4) = 1 B per MAC:
    # 16 x 64 MACs = 1024 cycles of feed vs 64 of compute. The prologue and epilogue (10 K-steps
    # of the one pass) come on top of the feed-bound loop: 1024 + 10 cycles.
    c = toy_chip(local_sram_bandwidth_bytes_per_cycle=1.0)
    assert gemm_time(1, 4, 64, 4, c) == pytest.approx(1024e-9)
    assert gemm_time(1, 4, 64, 4, c, eff=Efficiency(tile_overhead_k=10)) == pytest.approx(1034e-9)


def test_fused_attention_efficiency_rises_with_sequence_length(chip):
    # toy chip, head dim 4: one 4x4 tile per 4 queries; causal: half the s/4 query tiles' work,
    # s/8 tiles in waves of 4 units. s = 64: 2 waves x 64 keys = 128 cycles per product, and
    # every query tile pays k = 32 key steps however many keys it keeps: 2 waves x 32 / (1/2)
    # = 128 cycles. Two products: 2 x (128 + 128) ns = 512 ns, efficiency w*s/(w*s + k) = 1/2.
    # s = 128: 4 waves x 128 = 512 cycles + 4 x 64 = 256: 2 x 768 ns, efficiency 64/96 = 2/3.
    eff = Efficiency(tile_overhead_k=32)
    assert op_time(_fused_attention(64), chip, "bf16", eff) == pytest.approx(512e-9)
    assert op_time(_fused_attention(128), chip, "bf16", eff) == pytest.approx(1536e-9)
    ideal = lambda s: op_time(_fused_attention(s), chip, "bf16")  # noqa: E731
    assert ideal(64) / op_time(_fused_attention(64), chip, "bf16", eff) == pytest.approx(1 / 2)
    assert ideal(128) / op_time(_fused_attention(128), chip, "bf16", eff) == pytest.approx(2 / 3)
    # not causal: every query tile keeps all s keys, the overhead weighs k / s: 64 / (64 + 32)
    full = op_time(_fused_attention(64, causal=False), chip, "bf16", eff)
    assert op_time(_fused_attention(64, causal=False), chip, "bf16") / full == pytest.approx(2 / 3)


def test_fused_attention_streams_only_the_keys_and_values():
    """FlashAttention-2's forward (Dao 2023, Algorithm 1): a query tile stays in the unit while the
    keys and values stream past it. Toy chip at 1 GB/s from the shared buffer, 64 queries against
    64 keys, d = d_v = 4 (N = 8): 16 query tiles of 4 x 8 (a tile's whole width in one unit),
    each streaming its 64 x 8 strip of keys and values and loading and storing its 4 x 8 block
    once, 2 B x 16 x (512 + 32) = 17,408 B: 17.408 us. An ordinary GEMM of that shape (16 x 2
    tiles of 4 x 4) also streams each tile's A strip and writes its output: 2 B x (32 x 64 x 8 +
    64 x 8) = 33,792 B."""
    c = toy_chip(shared_buffer_bandwidth_bytes_per_s=1e9)
    assert gemm_time(1, 64, 64, 8, c, fused=True) == pytest.approx(17.408e-6)
    assert gemm_time(1, 64, 64, 8, c) == pytest.approx(33.792e-6)
    # the fused kernel splits the queries over the units, never the width: 16 tiles of 4 x 8
    assert gemm_tiles(c, 2, 8, True) == ((4, 8),) and gemm_tiles(c, 2, 8, False) == ((4, 4),)


def test_fused_attention_pads_only_the_values_product():
    """Of a fused tile's N = d + d_v columns, the scores' d are a contraction (their output, a
    block of keys, fills the array) and the values' d_v are output columns, rounded up to the
    array's width. Toy chip, 4 x 4 arrays, 16 queries (one wave of 4 tiles), 64 keys, d = d_v = 2:
    2 + 4 = 6 columns, 1.5 passes of 64 cycles: 96 ns. Without d_v the whole N = 4 is one array
    width: 64 ns."""
    c = toy_chip()
    assert gemm_time(1, 16, 64, 4, c, fused=True, value_width=2) == pytest.approx(96e-9)
    assert gemm_time(1, 16, 64, 4, c, fused=True) == pytest.approx(64e-9)


def test_mla_attention_tiles_the_key_and_value_widths():
    """The fused kernel's product is as wide as a key plus a value: 128 + 128 for Llama 3 8B,
    192 + 128 for DeepSeek-V3's MLA (its queries and keys 192 wide, its values 128)."""
    from phaze.catalogue import load_model
    from phaze.graph import layer_graph
    for name, n in (("llama3-8b", 256), ("deepseek-v3", 320)):
        ops = [o for o in layer_graph(load_model(name), 1, 1, False, "flash", "none").fwd if o.core_attention]
        assert [o.gemm[3] for o in ops] == [n]


def test_a_kernel_shorter_than_the_host_time_takes_the_host_time(chip):
    # the 8x8x64 GEMM runs 64 ns on the toy chip (one wave) plus a 1 us launch; the host needs
    # 10 us to issue it, so the device waits: 10 us. A 1 ms host leaves nothing of the kernel.
    gemm = Op(name="g", unit="tensor", phase="fwd", flops=2.0 * 8 * 64 * 8, gemm=(1, 8, 64, 8))
    assert op_time(gemm, chip, "bf16", Efficiency(kernel_overhead_s=1e-6)) == pytest.approx(64e-9 + 1e-6)
    assert op_time(gemm, chip, "bf16", Efficiency(kernel_overhead_s=1e-6, host_overhead_s=10e-6)) \
        == pytest.approx(10e-6)
    # a kernel longer than the host time is unchanged: 1e12 bytes at 1 PB/s = 1 ms
    big = Op(name="v", unit="vector", phase="fwd", elements=1.0, bytes_read=1e12)
    assert op_time(big, chip, "bf16", Efficiency(host_overhead_s=10e-6)) == pytest.approx(1e-3)
    # a collective is issued by the host too: 1 kB all-reduce over 2 devices ~ 2 us of latency
    coll = Op(name="c", unit="link", phase="fwd", collective=Collective("all_reduce", "tp", 1e3))
    assert op_time(coll, chip, "bf16", tp=2) < 10e-6
    assert op_time(coll, chip, "bf16", Efficiency(host_overhead_s=10e-6), tp=2) == pytest.approx(10e-6)


def test_parameter_files_without_the_new_fields_load_their_defaults(tmp_path):
    # a calibration written before host_overhead_s existed
    path = tmp_path / "params.json"
    path.write_text(json.dumps({"parameters": {"A100": {"tensor_fraction": 0.7, "tile_overhead_k": 150.0}}}))
    eff = load_params(path)["A100"]
    assert (eff.tensor_fraction, eff.tile_overhead_k, eff.host_overhead_s) == (0.7, 150.0, 0.0)
    assert all(name in BOUNDS and BOUNDS[name][0] <= BOUNDS[name][2] <= BOUNDS[name][1]
               for name in Efficiency.names())


def test_every_collective_pays_the_chips_fixed_start_up_once():
    """A collective kernel's fixed start-up (NCCL's base latency in the GPU chip files) is added
    once, whatever the kind, the size or the number of link levels it crosses."""
    a100 = load_chip("a100-80gb")
    assert a100.collective_latency_s == pytest.approx(14e-6)
    bare = replace(a100, collective_latency_s=0.0)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send"):
        for n, nbytes in ((8, 4e6), (64, 1e9), (2, 1.0)):
            assert collective_time(kind, nbytes, n, a100) - collective_time(kind, nbytes, n, bare) == \
                pytest.approx(14e-6, rel=1e-9)
    assert collective_time("all_reduce", 0.0, 8, a100) == 0.0 and collective_time("all_reduce", 1e6, 1, a100) == 0.0
    # 8-GPU ring all-reduce of 4 MB: 14 steps of 1.9 us and the start-up, then the bytes
    assert collective_time("all_reduce", 4e6, 8, a100) == pytest.approx(14e-6 + 14 * 1.9e-6 + 2 * 7 / 8 * 4e6 / 300e9)
