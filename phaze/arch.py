"""Chips: tensor units, vector units, on-chip SRAM, HBM and chip-to-chip links.

One schema describes both a proposed accelerator and a GPU (an SM's tensor cores as one tensor
unit, its CUDA cores as one vector unit, shared memory as local SRAM, L2 as the shared buffer),
so both run through the same cost model.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from .configio import ConfigError, Fields, config_dirs, read_mapping, resolve_config
from .workload import PRECISIONS

HBM_GENERATIONS = ("hbm2", "hbm2e", "hbm3", "hbm3e")
# How a chip's work is issued, which sets the per-kernel overheads (phaze.cost.kernel_overhead):
# - eager: a Python host dispatches every kernel (PyTorch eager); a kernel shorter than the host's
#   dispatch time (``host_overhead_s``) leaves the device waiting, and each kernel pays its launch
#   (``kernel_overhead_s``);
# - cuda-graphs: a captured graph's kernels are replayed without the host (NVIDIA, "Getting
#   Started with CUDA Graphs", 2019: the host's per-kernel cost goes, the device-side launch
#   stays), so only ``kernel_overhead_s`` remains;
# - xla: one compiled program runs on the chip's own sequencer (JAX/XLA on TPU: no per-op host
#   dispatch and no kernel launches; XLA fuses chains of ops into one computation): neither
#   overhead applies; a computation's fill and drain are the tile overhead every GEMM pays. Its
#   compiler drops work whose result nothing reads, so a full recompute re-runs only what the
#   backward reads (phaze.graph.reruns_needed; JAX's remat already leaves the rest out).
EXECUTION = ("eager", "cuda-graphs", "xla")

# The process nodes phaze/area.py's tables give public figures for (logic and SRAM density, energy
# per operation, speed, wafer price, defect density): 16 nm to 3 nm. A node outside them would be
# extrapolated with no source, so a chip file or a sweep that names one is refused.
NODE_RANGE_NM = (3.0, 16.0)


def process_node(f: Fields, default: float) -> float:
    """``f``'s ``process_node_nm`` (``default`` when absent), within :data:`NODE_RANGE_NM`."""
    lo, hi = NODE_RANGE_NM
    node = f.number("process_node_nm", default)
    if not lo <= node <= hi:
        raise f.error("process_node_nm", f"must be from {lo:g} to {hi:g} nm, the nodes whose density, energy, "
                                         f"speed and wafer cost phaze/area.py has public figures for; got {node:g}")
    return node


@dataclass(frozen=True)
class TensorUnits:
    """``count`` matrix engines, each ``rows`` x ``cols`` multiply-accumulators per cycle.

    ``tile_m`` x ``tile_n`` is the output tile one unit works on at a time (a GPU's CTA tile);
    0 lets the cost model size it from the local SRAM. ``fill_drain`` charges a systolic array's
    ``rows + cols`` cycles of pipeline fill and drain per tile.
    """

    count: int
    rows: int
    cols: int
    tile_m: int = 0
    tile_n: int = 0
    fill_drain: bool = True

    @property
    def macs_per_cycle(self) -> int:
        return self.count * self.rows * self.cols


@dataclass(frozen=True)
class VectorUnits:
    """``count`` SIMD units of ``lanes`` lanes, each ``flops_per_lane_per_cycle`` (2 for FMA);
    ``special_per_cycle`` transcendental results (exp, tanh, rsqrt) per unit and cycle from the
    special-function units (0: a quarter of the lanes)."""

    count: int
    lanes: int
    flops_per_lane_per_cycle: int = 2
    special_per_cycle: int = 0

    def __post_init__(self):
        if self.special_per_cycle == 0:
            object.__setattr__(self, "special_per_cycle", max(1, self.lanes // 4))


@dataclass(frozen=True)
class LinkLevel:
    """One level of the interconnect: groups of ``devices`` devices (0 = the whole cluster)
    joined with ``bandwidth_bytes_per_s`` per device and direction and ``latency_s`` per hop."""

    name: str
    devices: int
    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class Chip:
    name: str
    kind: str                      # gpu: kernels run one after another over all units | accelerator
    clock_hz: float
    tensor: TensorUnits
    vector: VectorUnits
    local_sram_bytes: float        # per tensor unit
    shared_buffer_bytes: float
    shared_buffer_bandwidth_bytes_per_s: float
    hbm_bytes: float
    hbm_bandwidth_bytes_per_s: float
    links: tuple[LinkLevel, ...]
    peak_flops_per_s: tuple[tuple[str, float], ...] = ()
    collective_latency_s: float = 0.0  # fixed start-up time of one collective kernel, beside
                                       # the per-hop latency of each link level
    process_node_nm: float = 7.0
    area_mm2: float | None = None
    tdp_w: float | None = None
    family: str = ""               # chips sharing silicon and software (calibration group)
    local_sram_bandwidth_bytes_per_cycle: float = 0.0  # per tensor unit; 0: not a bound
    unit_sharing: str = ""         # sequential: kernels run one after another over the whole chip,
                                   # vector units are the tensor units' SMs (GPU) | concurrent:
                                   # independent tensor and vector unit pools; "" = by kind
    # area / power / cost model (phaze/area.py); defaults derive everything from the fields above
    hbm_generation: str = ""       # hbm2 | hbm2e | hbm3 | hbm3e ("" = by process node: hbm2e at >= 7 nm)
    hbm_stacks: int = 0            # HBM stacks in the package (0 = from capacity and bandwidth)
    link_phys: int = 0             # chip-to-chip link PHYs (0 = first link level / 25 GB/s per link)
    die_units_ratio: float = 1.0   # units built on the die / units enabled (harvested for yield)
    die_memory_ratio: float = 1.0  # shared buffer and HBM PHYs built / enabled
    register_file_bytes: float = 0.0  # register file per vector unit (a GPU's SM), area only
    l1_bytes: float = 0.0          # SRAM built per tensor unit, local SRAM and cache together,
                                   # area only (0 = local_sram_bytes)
    execution: str = ""            # how its work is issued (EXECUTION); "" = by kind: gpu eager,
                                   # accelerator xla (a compiled program, as on TPU)
    reference_clock_hz: float = 0.0  # the clock its energies per operation hold at (0 = clock_hz):
                                     # a throttled chip keeps its nominal clock's, a candidate its
                                     # template's; the core voltage follows the clock against it
    held_clock_share: float = 0.0    # the clock it holds at its TDP under full load over its quoted
                                     # peak clock, measured (0: phaze.area.HELD_CLOCK_SHARE, the
                                     # H100's): how far up its V-f curve the nominal point sits
    # the link to its host's memory, bytes per second a direction (0: none given; activation
    # offload is then refused). Not in the repr, and so not in a study's fingerprint: no search
    # trial reads it (a sweep cannot offload), and a chip file that gains it keeps its studies
    host_bandwidth_bytes_per_s: float = field(default=0.0, repr=False)
    # the host's memory a chip may fill with offloaded activations: the host's DRAM over its chips
    # (0: none given; offloaded bytes are then not checked, and the printout says so); not in the repr
    host_memory_bytes: float = field(default=0.0, repr=False)
    # dies in the package that run as this one device (B200: two): the area splits evenly among
    # them and each is priced and yielded as its own die (phaze.area.silicon). Left out of the repr
    # at one (every chip before it), so a study's fingerprint, which quotes its template's repr,
    # stays what it was; phaze.space adds it there when it is more
    dies: int = field(default=1, repr=False)

    def __post_init__(self):
        if not self.reference_clock_hz:
            object.__setattr__(self, "reference_clock_hz", self.clock_hz)
        if not self.family:
            object.__setattr__(self, "family", self.name)
        if not self.unit_sharing:
            object.__setattr__(self, "unit_sharing", "sequential" if self.kind == "gpu" else "concurrent")
        if not self.execution:
            object.__setattr__(self, "execution", "eager" if self.kind == "gpu" else "xla")

    def with_execution(self, execution: str) -> Chip:
        """This chip issuing its work as ``execution`` (a framework's or a run's); "" keeps its own."""
        return replace(self, execution=execution) if execution and execution != self.execution else self

    @property
    def compiled(self) -> bool:
        """Whether it runs one compiled program (``xla``): no per-kernel overheads, and work whose
        result nothing reads is left out (:func:`phaze.graph.reruns_needed`)."""
        return self.execution == "xla"

    @property
    def implied_peak_flops_per_s(self) -> float:
        """16-bit tensor peak implied by the units: 2 FLOP per MAC per cycle."""
        return 2.0 * self.tensor.macs_per_cycle * self.clock_hz

    def peak_flops(self, precision: str) -> float:
        """Dense tensor peak in ``precision``. The units set the 16-bit peak; a listed figure
        sets the ratio of each precision to the listed 16-bit one, so a derived chip (fewer units,
        another clock) keeps the ratios of the chip it came from."""
        table = dict(self.peak_flops_per_s)
        ref = table.get("bf16") or table.get("fp16") or self.implied_peak_flops_per_s
        if precision in table:
            return self.implied_peak_flops_per_s * table[precision] / ref
        if precision in ("fp16", "bf16"):
            return self.implied_peak_flops_per_s
        raise ConfigError(self.name, "peak_flops_per_s", f"chip has no {precision} tensor peak; "
                                     f"listed: {', '.join(table) or 'none (16-bit only)'}")

    @property
    def special_per_s(self) -> float:
        """Transcendental evaluations per second over all vector units."""
        return self.vector.count * self.vector.special_per_cycle * self.clock_hz

    @property
    def vector_flops_per_s(self) -> float:
        v = self.vector
        return v.count * v.lanes * v.flops_per_lane_per_cycle * self.clock_hz

    def with_units(self, **changes) -> Chip:
        """A copy with tensor/vector unit fields changed (``tensor_count=...``, ``vector_lanes=...``)."""
        t = {k[7:]: v for k, v in changes.items() if k.startswith("tensor_")}
        v = {k[7:]: v for k, v in changes.items() if k.startswith("vector_")}
        rest = {k: v for k, v in changes.items() if not k.startswith(("tensor_", "vector_"))}
        return replace(self, tensor=replace(self.tensor, **t), vector=replace(self.vector, **v), **rest)


def _chip_from_yaml(data: dict, source: str) -> Chip:
    f = Fields(data, source)
    t = f.sub("tensor_units")
    tensor = TensorUnits(count=t.int("count"), rows=t.int("rows"), cols=t.int("cols"),
                         tile_m=t.int("tile_m", 0, minimum=0), tile_n=t.int("tile_n", 0, minimum=0),
                         fill_drain=t.bool("fill_drain", True))
    t.finish()
    v = f.sub("vector_units")
    vector = VectorUnits(count=v.int("count"), lanes=v.int("lanes"),
                         flops_per_lane_per_cycle=v.int("flops_per_lane_per_cycle", 2),
                         special_per_cycle=v.int("special_per_cycle", 0, minimum=0))
    v.finish()
    peaks = []
    p = f.sub("peak_flops_per_s", None)
    if p is not None:
        for key in list(p.data):
            if key not in PRECISIONS:
                raise p.error(str(key), f"unknown precision; allowed: {', '.join(PRECISIONS)}")
            peaks.append((key, p.number(key)))
        p.finish()
    links = []
    raw_links = f.list("links")
    for i, item in enumerate(raw_links):
        lf = Fields(item, source, f"links[{i}].") if isinstance(item, dict) else None
        if lf is None:
            raise ConfigError(source, f"links[{i}]", "must be a mapping with name, devices, "
                                                     "bandwidth_bytes_per_s, latency_s")
        links.append(LinkLevel(name=lf.str("name"), devices=lf.int("devices", 0, minimum=0),
                               bandwidth_bytes_per_s=lf.number("bandwidth_bytes_per_s"),
                               latency_s=lf.number("latency_s", 0.0, inclusive=True)))
        lf.finish()
        if links[-1].devices == 0 and i != len(raw_links) - 1:
            raise ConfigError(source, f"links[{i}].devices",
                              "0 (whole cluster) is allowed only on the last level")
    for i in range(1, len(links)):
        if links[i].devices and links[i].devices <= links[i - 1].devices:
            raise ConfigError(source, f"links[{i}].devices",
                              f"must be larger than the level below ({links[i - 1].devices})")
    chip = Chip(
        name=f.str("name"), kind=f.choice("kind", ("gpu", "accelerator")),
        clock_hz=f.number("clock_hz"), tensor=tensor, vector=vector,
        local_sram_bytes=f.number("local_sram_bytes"),
        shared_buffer_bytes=f.number("shared_buffer_bytes"),
        shared_buffer_bandwidth_bytes_per_s=f.number("shared_buffer_bandwidth_bytes_per_s"),
        hbm_bytes=f.number("hbm_bytes"), hbm_bandwidth_bytes_per_s=f.number("hbm_bandwidth_bytes_per_s"),
        links=tuple(links), peak_flops_per_s=tuple(peaks),
        collective_latency_s=f.number("collective_latency_s", 0.0, inclusive=True),
        process_node_nm=process_node(f, 7.0),
        held_clock_share=f.number("held_clock_share", 0.0, maximum=1.0),
        area_mm2=f.number("area_mm2", None), tdp_w=f.number("tdp_w", None),
        family=f.str("family", ""),
        unit_sharing=f.choice("unit_sharing", ("sequential", "concurrent"), ""),
        execution=f.choice("execution", EXECUTION, ""),
        local_sram_bandwidth_bytes_per_cycle=f.number("local_sram_bandwidth_bytes_per_cycle", 0.0,
                                                      inclusive=True),
        hbm_generation=f.choice("hbm_generation", HBM_GENERATIONS, ""),
        hbm_stacks=f.int("hbm_stacks", 0, minimum=0), link_phys=f.int("link_phys", 0, minimum=0),
        die_units_ratio=f.number("die_units_ratio", 1.0, minimum=1.0, inclusive=True),
        die_memory_ratio=f.number("die_memory_ratio", 1.0, minimum=1.0, inclusive=True),
        register_file_bytes=f.number("register_file_bytes", 0.0, inclusive=True),
        l1_bytes=f.number("l1_bytes", 0.0, inclusive=True),
        host_bandwidth_bytes_per_s=f.number("host_bandwidth_bytes_per_s", 0.0, inclusive=True),
        host_memory_bytes=f.number("host_memory_bytes", 0.0, inclusive=True),
        dies=f.int("dies", 1, minimum=1),
    )
    f.finish()
    return chip


def arch_dirs() -> list[Path]:
    """Where chip names are looked up: ./arch_configs, then the shipped ones."""
    return config_dirs("arch_configs")


def load_chip(name_or_path: str | Path) -> Chip:
    """Load a chip by shipped name (``a100-80gb``) or YAML path."""
    path = resolve_config(str(name_or_path), "arch_configs", "arch", "--arch")
    return _chip_from_yaml(read_mapping(path), str(path))
