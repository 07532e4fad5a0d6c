"""Operator cost model: the time of one operator on a chip.

Pure functions of (operator shape, chip, efficiency). A GEMM is a tile-level roofline: whole
output tiles in whole waves over the tensor units, against the bytes each memory level must move
given its capacity. Element-wise ops are the slower of lane throughput and HBM bandwidth.
Collectives use ring formulas over the link hierarchy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache

from .arch import Chip
from .graph import Collective, Op


@dataclass(frozen=True)
class Efficiency:
    """Named, physical efficiency factors (1.0 / 0.0 = the ideal datasheet machine).

    They are the only free parameters of the cost model; ``phaze calibrate`` fits them per chip
    on published runs. Each scales one physical resource, never one model or row.
    """

    tensor_fraction: float = 1.0     # sustained share of tensor peak (clock under load, issue)
    hbm_fraction: float = 1.0        # achievable share of HBM bandwidth for streaming kernels
    link_fraction: float = 1.0       # achieved bus bandwidth / link peak for collectives
    attention_fraction: float = 1.0  # fused-attention kernel throughput relative to GEMM peak
    kernel_overhead_s: float = 0.0   # fixed cost per kernel (launch, synchronisation)
    overlap_slowdown: float = 0.0    # share of communication hidden behind compute that still
                                     # costs time (collective kernels take SMs and HBM bandwidth)
    tile_overhead_k: float = 0.0     # per output tile, extra K-steps of prologue and epilogue
                                     # (first loads, write-back): small-K GEMMs run below peak;
                                     # per query tile of fused attention, extra key steps (load
                                     # Q, rescale and write O): short sequences run below peak
    host_overhead_s: float = 0.0     # host time to issue one kernel (eager framework dispatch);
                                     # a kernel shorter than it leaves the device waiting

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


IDEAL = Efficiency()


def kernel_overhead(chip: Chip, eff: Efficiency) -> float:
    """Fixed cost of one kernel under the chip's execution model (:data:`phaze.arch.EXECUTION`):
    a launch under ``eager`` and ``cuda-graphs``, none in an XLA-compiled program."""
    return 0.0 if chip.compiled else eff.kernel_overhead_s


def host_overhead(chip: Chip, eff: Efficiency) -> float:
    """Host time to issue one kernel: only an ``eager`` host dispatches each kernel."""
    return eff.host_overhead_s if chip.execution == "eager" else 0.0


def _ceil(a: float, b: float) -> int:
    return -(-int(a) // int(b))


def tile_candidates(chip: Chip, bytes_per_element: int) -> tuple[tuple[int, int], ...]:
    """Output tiles a unit can hold: the configured tile and its halvings (as a library picks
    smaller tiles for small problems) down to the array size, or, when no tile is configured,
    every power-of-two multiple of the array that fits the local SRAM double-buffered with
    a ``rows``-deep K slice and a 4-byte accumulator per output."""
    tu = chip.tensor
    R, C = tu.rows, tu.cols
    out = []
    if tu.tile_m and tu.tile_n:
        tm = tu.tile_m
        while tm >= R:
            tn = tu.tile_n
            while tn >= C:
                out.append((tm, tn))
                tn //= 2
            tm //= 2
        return tuple(out) or ((R, C),)
    p = bytes_per_element
    tm = R
    while True:
        tn = C
        fit_any = False
        while 2 * (tm + tn) * R * p + 4 * tm * tn <= chip.local_sram_bytes:
            out.append((tm, tn))
            fit_any = True
            tn *= 2
        if not fit_any:
            break
        tm *= 2
    return tuple(out) or ((R, C),)


def gemm_tiles(chip: Chip, bytes_per_element: int, N: int, fused: bool) -> tuple[tuple[int, int], ...]:
    """The output tiles :func:`gemm_time` tries: :func:`tile_candidates`, or for a fused
    attention kernel, each of their heights by the whole width N (a query tile's keys and values
    go through one unit: the kernel splits the queries over the units, never the head)."""
    tiles = tile_candidates(chip, bytes_per_element)
    if not fused:
        return tiles
    return tuple((tm, N) for tm in sorted({tm for tm, _ in tiles}, reverse=True))


def fused_columns(N: int, value_width: int, cols: int) -> int:
    """Array columns a fused attention tile of width N = d + d_v occupies: the scores' product
    writes a key block (as wide as the arrays, never short) while contracting d, the values'
    product writes d_v columns, rounded up to the arrays' width (a leftover column computes
    nothing); without ``value_width``, N rounded up."""
    if not value_width:
        return _ceil(N, cols) * cols
    return N - value_width + _ceil(value_width, cols) * cols


def _buffer_block(chip: Chip, p: int) -> int:
    """Side of the square output block whose A and B strips the shared buffer keeps resident."""
    return max(1, int(math.sqrt(chip.shared_buffer_bytes / (3.0 * p))))


@lru_cache(maxsize=1 << 16)
def _gemm_geometry(batch: int, M: int, K: int, N: int, chip: Chip, n_units: int, p: int,
                   work_fraction: float, fused: bool, reuse: int = 0, value_width: int = 0
                   ) -> tuple[tuple[tuple[float, float, float, float], ...], float]:
    """Efficiency-independent part of a GEMM: per candidate tile (array passes per unit over all
    waves, cycles of those passes, bytes from the shared buffer, seconds to feed the arrays from
    local SRAM), and the HBM bytes. Fused attention: ``value_width`` (d_v, :func:`fused_columns`)."""
    tu = chip.tensor
    per_tile = []
    for tm, tn in gemm_tiles(chip, p, N, fused):
        tiles = batch * _ceil(M, tm) * _ceil(N, tn) * work_fraction
        waves = math.ceil(tiles / n_units)
        width = fused_columns(tn, value_width, tu.cols) if fused else tn
        passes = waves * (tm * width) / (tu.rows * tu.cols)
        cycles = passes * K + waves * ((tu.rows + tu.cols) if tu.fill_drain else 0)
        # shared buffer -> units: every tile streams its A strip and B strip; outputs written once.
        # Fused (attention): the A operand (the query tile, then the probabilities) stays in the
        # unit; each tile streams its B strip (keys and values) and loads and stores its own
        # tm x tn block once (the queries in, the output out)
        if fused:
            onchip = p * tiles * (K * tn + tm * tn) * n_units / tu.count
        else:
            onchip = p * (tiles * K * (tm + tn) + batch * M * N) * n_units / tu.count
        # local SRAM -> array: each operand element read once per `reuse` rows (default: per tile)
        per_mac = p / reuse if reuse else p * (1.0 / tm + 1.0 / tn)
        local = 0.0
        if chip.local_sram_bandwidth_bytes_per_cycle:
            macs_per_unit = waves * tm * tn * K
            local = macs_per_unit * per_mac / (chip.local_sram_bandwidth_bytes_per_cycle * chip.clock_hz)
        per_tile.append((passes, cycles, onchip, local))
    if fused:
        return tuple(per_tile), 0.0
    blk = _buffer_block(chip, p)
    half = chip.shared_buffer_bytes / 2
    a_reads = 1 if M * K * p <= half else _ceil(N, blk)
    b_reads = 1 if K * N * p <= half else _ceil(M, blk)
    return tuple(per_tile), p * batch * (M * K * a_reads + K * N * b_reads + M * N)


def gemm_time(batch: int, M: int, K: int, N: int, chip: Chip, precision: str = "bf16",
              eff: Efficiency = IDEAL, units: int | None = None, work_fraction: float = 1.0,
              bytes_per_element: int = 2, fused: bool = False, reuse: int = 0,
              value_width: int = 0) -> float:
    """Seconds for ``batch`` products (M x K) . (K x N) on ``units`` tensor units (default all).

    ``fused`` is a product whose output never leaves the unit (fused attention's scores): no
    output traffic, and HBM traffic is left to the caller. ``reuse``: rows sharing each operand
    element read from local SRAM (0: the whole output tile); ``value_width``: a fused attention's
    d_v (:func:`fused_columns`)."""
    per_tile, hbm = _gemm_geometry(batch, M, K, N, chip, units or chip.tensor.count,
                                   bytes_per_element, work_fraction, fused, reuse, value_width)
    scale = chip.peak_flops(precision) / chip.implied_peak_flops_per_s
    rate = chip.clock_hz * scale * eff.tensor_fraction
    bw = chip.shared_buffer_bandwidth_bytes_per_s
    # a tile's prologue and epilogue (first loads, write-back) run before and after its main
    # loop, whatever bounds the loop (tensor units, L2 or local-SRAM feed)
    k0 = eff.tile_overhead_k
    best = min(max(cycles / rate, onchip / bw, local) + passes * k0 / rate
               for passes, cycles, onchip, local in per_tile)
    memory = hbm / (chip.hbm_bandwidth_bytes_per_s * eff.hbm_fraction)
    return max(best, memory) + kernel_overhead(chip, eff)


def vector_time(elements: float, flops: float, nbytes: float, chip: Chip, eff: Efficiency = IDEAL,
                units: int | None = None, special: float = 0.0) -> float:
    """Seconds for an element-wise or reduction op: lane and special-function throughput vs HBM
    traffic."""
    share = (units or chip.vector.count) / chip.vector.count
    compute = (flops / chip.vector_flops_per_s + special / chip.special_per_s) / share
    memory = nbytes / (chip.hbm_bandwidth_bytes_per_s * eff.hbm_fraction)
    return max(compute, memory) + kernel_overhead(chip, eff)


def _levels(chip: Chip, n: int, stride: int) -> list[tuple[int, float, float]]:
    """Split a group of ``n`` devices (ranks ``stride`` apart) over the link levels: for each
    level, how many members the group has inside one domain of that level, its bandwidth and
    latency. Members are counted inside the lowest level that holds them."""
    out, placed = [], 1
    for level in chip.links:
        span = level.devices or math.inf
        inside = n if span == math.inf else max(1, min(n, int(span // stride)))
        k = max(1, inside // placed)
        if k > 1:
            out.append((k, level.bandwidth_bytes_per_s, level.latency_s))
        placed *= k
        if placed >= n:
            break
    return out


def collective_time(kind: str, nbytes: float, n: int, chip: Chip, stride: int = 1,
                    eff: Efficiency = IDEAL) -> float:
    """Seconds for a collective of ``nbytes`` (the full buffer) over ``n`` devices spaced
    ``stride`` ranks apart. Hierarchical rings: each level reduces the data by its member
    count before the next; one level gives the textbook ring formula
    ``2(n-1)/n * bytes/beta + 2(n-1)*alpha`` for all-reduce, half of it for reduce-scatter
    or all-gather, and ``bytes/beta + alpha`` for a send; each adds the chip's fixed start-up
    time of one collective kernel (``collective_latency_s``)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return chip.collective_latency_s + _collective_transfer(kind, nbytes, n, chip, stride, eff)


def _collective_transfer(kind: str, nbytes: float, n: int, chip: Chip, stride: int,
                         eff: Efficiency) -> float:
    """:func:`collective_time` without the fixed start-up."""
    if kind == "send":
        levels = _levels(chip, 2, stride)
        _, beta, alpha = levels[-1] if levels else (1, chip.links[-1].bandwidth_bytes_per_s,
                                                    chip.links[-1].latency_s)
        return nbytes / (beta * eff.link_fraction) + alpha
    if kind == "all_to_all":
        # ``nbytes`` is what each device scatters, 1/n to every member (itself included). The
        # peers first reached at a level (inside its domain, outside the level below) get their
        # share over that level's links; the levels run concurrently: the slowest one decides.
        worst, below = 0.0, 1
        for k, beta, alpha in _levels(chip, n, stride):
            peers = below * k - below
            worst = max(worst, peers / n * nbytes / (beta * eff.link_fraction) + peers * alpha)
            below *= k
        return worst
    passes = 2 if kind == "all_reduce" else 1
    total, data = 0.0, float(nbytes)
    for k, beta, alpha in _levels(chip, n, stride):
        total += passes * ((k - 1) / k * data / (beta * eff.link_fraction) + (k - 1) * alpha)
        data /= k
    return total


def op_time(op: Op, chip: Chip, precision: str, eff: Efficiency = IDEAL, *, tp: int = 1,
            groups: dict | None = None,
            bytes_per_element: int = 2, units: int | None = None,
            vector_units: float | None = None) -> float:
    """Seconds for one operator; ``groups`` maps a collective group name to (size, stride).
    ``units``: tensor units for tensor ops, vector units for vector ops (default all); a fused op
    runs on ``units`` tensor units and ``vector_units`` vector units (default: the same share of
    the vector pool).

    The host issues kernels one after another, ``host_overhead_s`` each: a kernel that runs
    shorter than that leaves the device waiting, so an op takes at least the host time."""
    return max(_device_time(op, chip, precision, eff, tp, groups, bytes_per_element, units,
                            vector_units), host_overhead(chip, eff))


def _device_time(op: Op, chip: Chip, precision: str, eff: Efficiency, tp: int, groups: dict | None,
                 bytes_per_element: int, units: int | None, vector_units: float | None) -> float:
    """Seconds one operator keeps the device busy (see :func:`op_time`)."""
    if op.unit == "link":
        c: Collective = op.collective
        size, stride = (groups or {}).get(c.group, (tp, 1))
        return collective_time(c.kind, c.bytes, size, chip, stride, eff)
    if op.unit == "vector":
        return vector_time(op.elements, op.flops, op.bytes, chip, eff, units, op.special)
    batch, M, K, N = op.gemm
    if precision == "fp8":
        if op.weighted:
            bytes_per_element = 1   # fp8 operands of the linear layers
        else:
            precision = "bf16"      # fp8 training quantises the linear layers; attention stays 16-bit
    if op.unit == "tensor+vector":
        # the fused kernel reaches `attention_fraction` of its own roofline: the slower of the
        # tensor units and the local-SRAM operand feed, plus each query tile's prologue and
        # epilogue (load Q, rescale and write O, the log-sum-exp: `tile_overhead_k` key steps,
        # as a GEMM tile's), amortised over the tile's loop over the keys, so its efficiency
        # rises with the sequence. Every query tile pays it once, however many keys causal
        # masking leaves it (on average a `work_fraction` share of the s keys the tile model
        # counts), so per executed key step it weighs 1 / work_fraction more.
        roof = Efficiency(tensor_fraction=eff.tensor_fraction, hbm_fraction=eff.hbm_fraction,
                          tile_overhead_k=eff.tile_overhead_k / op.work_fraction)
        passes = op.flops / (2.0 * batch * M * K * N)
        t = passes * gemm_time(batch, M, K, N, chip, precision, roof, units, op.work_fraction,
                               bytes_per_element, fused=True, reuse=op.operand_reuse,
                               value_width=op.value_width)
        t = t / eff.attention_fraction + kernel_overhead(chip, eff)
        # the softmax runs between the two products of each tile, on the vector and special units
        if vector_units is None and units is not None:
            vector_units = units * chip.vector.count / chip.tensor.count
        w = op.work_fraction
        softmax = vector_time(0, w * op.vector_flops, 0, chip, IDEAL, vector_units, w * op.special)
        return max(t + softmax, vector_time(0, 0, op.bytes, chip, eff, vector_units))
    return gemm_time(batch, M, K, N, chip, precision, eff, units, op.work_fraction, bytes_per_element)
