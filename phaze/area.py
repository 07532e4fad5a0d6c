"""Area, power and cost of a chip.

Three pure, cached functions a search calls thousands of times:

- :func:`silicon`: die area with its breakdown, leakage, HBM stacks, dies per wafer, yield and the
  cost of one good die plus its HBM;
- :func:`step_energy`: the energy one device spends on one training step of a plan (activity
  counts of the layer graphs times an energy per operation and per byte), the average power over
  the step and the tokens per joule;
- :func:`fit_coefficients`: the four fitted parameters, each fitted on two reference chips only.

Every coefficient below names its public source beside it, or says ``assumption:`` and why.
Area at a node other than the tabulated ones is interpolated log-linearly in the node
(``_by_node``; chip files and sweeps are held to the tables' 3-16 nm, ``phaze.arch.NODE_RANGE_NM``,
so nothing is extrapolated without a source); analogue and I/O blocks (HBM and link PHYs) are kept
at their published size at every node (assumption: I/O and analogue circuits barely shrink, which
is why chiplet designs keep I/O dies on older nodes).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

from .arch import Chip, load_chip
from .calibrate import calibrated_efficiency
from .catalogue import load_model
from .configio import ConfigError
from .cost import IDEAL, Efficiency, _gemm_geometry, gemm_tiles
from .graph import ExpertLayout, collective_groups, edge_graph, layer_graph, offloaded_bytes, optimizer_op
from .plan import Plan, graph_recompute, parse_plan
from .plan_check import check_plan, stage_split
from .stage import (
    _mean,
    _shard,
    cp_sent_bytes,
    deepspeed_zero,
    expert_layout,
    expert_shard,
    gathered_bytes,
    layer_mix,
    main_grad_bytes,
    reduced_grad_bytes,
    shard_ranks,
    stage_costs,
    state_zero,
)
from .step import evaluate, layout_of
from .workload import Model

MiB = 2.0 ** 20
GB = 1e9

# ---- area coefficients ------------------------------------------------------------------------
# Logic density, million transistors per mm^2 of a real design. 7 and 5 nm: LLMCompass (Zhang et
# al., ISCA 2024), its area model (96 and 138 MTr/mm^2). 16 and 10 nm: TSMC's published logic
# densities (WikiChip, "16 nm lithography process" 28.9, "10 nm lithography process" 52.5).
# 4 nm: TSMC 4N / N4 are N5-family processes (H100 whitepaper: 4N, customised for NVIDIA); TSMC
# gives N4(P) 6 % more transistor density than N5 (TSMC N4P announcement, 2021): 138 x 1.06.
# 3 nm: N3E claims 1.6x N5 logic density (TSMC N3 announcement): 138 x 1.6 = 221.
LOGIC_MTR_PER_MM2 = {16: 28.9, 10: 52.5, 7: 96.0, 5: 138.0, 4: 146.3, 3: 221.0}
# Transistors of one FP16 multiply-accumulate: about 25k (LLMCompass, ISCA 2024, its area model:
# 260 um^2 at 7 nm, 180 um^2 at 5 nm).
MAC_TRANSISTORS = 25e3
# An FP32 FMA vector lane relative to that MAC: Horowitz (ISSCC 2014, "Computing's energy
# problem", area table at 45 nm): FP32 multiply 7700 um^2 + FP32 add 4184 um^2 = 11884 um^2 vs
# FP16 multiply 1640 um^2 + FP32 accumulate 4184 um^2 = 5824 um^2 for the tensor MAC: 2.04x.
LANE_PER_MAC = (7700.0 + 4184.0) / (1640.0 + 4184.0)
# SRAM, mm^2 per MiB at 7 nm: TSMC's 7 nm 256 Mib SRAM test chip, about 1.3 mm^2/MiB with its
# periphery (ISSCC 2017, Chang et al.). Other nodes scale with the
# high-density bitcell area, um^2 (TSMC, IEDM papers / WikiChip): 16FF+ 0.074, N10 0.042,
# N7 0.027, N5 0.021 (4N: N5 family), N3E 0.021.
# assumption: register files and L1 caches are costed at this density too; their extra ports,
# tags and operand collectors make them larger, so this is a lower bound and the rest stays in
# the fitted control terms.
SRAM_MM2_PER_MIB_7NM = 1.3
SRAM_BITCELL_UM2 = {16: 0.074, 10: 0.042, 7: 0.027, 5: 0.021, 4: 0.021, 3: 0.021}
# HBM PHY and controller per 1024-bit stack: about 10.5 mm^2 for an HBM2e PHY (LLMCompass, ISCA
# 2024). assumption: the controller is a few mm^2 of logic; we take the PHY
# figure for both, and the same for HBM2 and HBM3 (same 1024-bit interface).
HBM_PHY_MM2_PER_STACK = 10.5
# One chip-to-chip link PHY: about 1 mm^2 per NVLink 4 link (LLMCompass, ISCA 2024).
LINK_PHY_MM2 = 1.0
LINK_BANDWIDTH_PER_PHY = 25e9   # bytes/s per direction per NVLink 3/4 link (A100/H100 datasheets)
# Fixed uncore: the host interface, a PCIe Gen 5 x16 PHY at about 0.64 mm^2 per lane (LLMCompass,
# ISCA 2024). Everything else outside the units and memories (crossbars, schedulers, caches' tags,
# media engines) is the fitted control terms.
UNCORE_MM2 = 16 * 0.64

# HBM per stack by generation: capacity (bytes), bandwidth (bytes/s), energy (pJ/bit).
# Capacity: 8-high stacks of 8 Gb (HBM2) / 16 Gb (HBM2e, HBM3) / 24 Gb (HBM3e) dies; 12-high HBM3
# would be 24 GiB.
# Bandwidth: 1024 bits x pin rate: HBM2 2.4 Gb/s (JEDEC JESD235A) = 307 GB/s, HBM2e 3.6 Gb/s
# (JESD235C) = 461 GB/s, HBM3 6.4 Gb/s (JESD238) = 819 GB/s, HBM3e 9.2 Gb/s (Micron's HBM3E
# product page: 24 GB 8-high cubes, pin speed over 9.2 Gb/s, over 1.2 TB/s; no JEDEC rate) = 1178 GB/s.
# Energy: HBM2 3.9 pJ/bit (O'Connor et al., "Fine-Grained DRAM", MICRO 2017, HBM2 baseline).
# assumption: HBM2e, HBM3 and HBM3e keep HBM2's energy per bit (same DRAM core and row activation
# energy, which dominate in O'Connor et al.'s breakdown); no vendor figure is public for them.
HBM = {
    "hbm2": (8 * 2.0 ** 30, 307.2e9, 3.9),
    "hbm2e": (16 * 2.0 ** 30, 460.8e9, 3.9),
    "hbm3": (16 * 2.0 ** 30, 819.2e9, 3.9),
    "hbm3e": (24 * 2.0 ** 30, 1177.6e9, 3.9),
}

# ---- cost coefficients -------------------------------------------------------------------------
# Foundry price of a 300 mm wafer, USD: Khan and Mann, "AI Chips: What They Are and Why They
# Matter", CSET 2020, table of wafer prices: 16/12 nm 3984, 10 nm 5992, 7 nm 9346, 5 nm 16988
# (4 nm: the N5 family). assumption: 3 nm at 20000 (no public figure in that source).
WAFER_USD = {16: 3984.0, 10: 5992.0, 7: 9346.0, 5: 16988.0, 4: 16988.0, 3: 20000.0}
# Defect density, per cm^2, for the negative-binomial yield (1 + A*D0/alpha)^-alpha with
# alpha = 3 (LLMCompass's supply-chain cost model: 0.15 at 7 nm, 0.20 at
# 5 nm). assumption: 16 and 10 nm mature at 0.10, 4 nm as 5 nm, 3 nm 0.25.
DEFECTS_PER_CM2 = {16: 0.10, 10: 0.10, 7: 0.15, 5: 0.20, 4: 0.20, 3: 0.25}
YIELD_ALPHA = 3.0
WAFER_DIAMETER_MM = 300.0
HBM_USD_PER_GB = 7.0   # HBM, USD per GB (1e9 B) of capacity (LLMCompass's cost model)

# ---- energy coefficients -----------------------------------------------------------------------
# At 45 nm, 0.9 V (Horowitz, ISSCC 2014, energy table): FP16 multiply 1.1 pJ, FP32 add 0.9 pJ,
# FP32 multiply 3.7 pJ; a 64-bit read of an 8 KB SRAM 10 pJ, of a 32 KB SRAM 20 pJ, of a 1 MB
# SRAM 100 pJ.
PJ_PER_TENSOR_FLOP_45 = (1.1 + 0.9) / 2     # FP16 multiply + FP32 accumulate, per FLOP
PJ_PER_VECTOR_FLOP_45 = (3.7 + 0.9) / 2     # FP32 FMA, per FLOP
PJ_PER_BYTE_LOCAL_45 = 20.0 / 8             # local SRAM: 32 KB banks
PJ_PER_BYTE_SHARED_45 = 100.0 / 8           # shared buffer: 1 MB banks
# Chip-to-chip SerDes, pJ/bit. assumption: 5 pJ/bit for a long-reach electrical link PHY
# (NVIDIA quotes 1.3 pJ/bit for the short-reach on-package NVLink-C2C, Hot Chips 2022; board
# and cable reach SerDes take several times that). Any link level the chip drives costs this;
# NICs and switches are other devices.
PJ_PER_BIT_LINK = 5.0


def node_energy_factor(node_nm: float) -> float:
    """Energy per operation at ``node_nm`` relative to 45 nm: ``sqrt(D45 / D(node))``.

    First-order CV^2 scaling: switched capacitance scales with gate and wire length, i.e. with
    the linear dimension of a transistor, ``1 / sqrt(logic density)``, while the supply voltage
    has stayed near 0.7-0.9 V since 45 nm (Horowitz, ISSCC 2014, on the end of Dennard scaling).
    Densities from :data:`LOGIC_MTR_PER_MM2`; 45 nm: 3.33 MTr/mm^2 (Intel 45 nm, WikiChip).
    It gives 0.19 at 7 nm and 0.15 at 4 nm. (Node names are not dimensions: N7 -> N5 shrank the
    contacted gate pitch only 57 -> 51 nm, so ``node / 45`` would overstate the gain.)"""
    return math.sqrt(DENSITY_45NM / logic_density(node_nm))


DENSITY_45NM = 3.33


def _by_node(table: dict, node: float, log: bool = True) -> float:
    """Table lookup with log-linear interpolation (or extrapolation) in the node."""
    if node in table:
        return table[node]
    keys = sorted(table)
    lo = max([k for k in keys if k < node], default=keys[0])
    hi = min([k for k in keys if k > node], default=keys[-1])
    if lo == hi:   # outside the table: extrapolate from the two nearest entries
        lo, hi = (keys[0], keys[1]) if node < keys[0] else (keys[-2], keys[-1])
    x = (math.log(node) - math.log(lo)) / (math.log(hi) - math.log(lo))
    a, b = table[lo], table[hi]
    return math.exp(math.log(a) + x * (math.log(b) - math.log(a))) if log else a + x * (b - a)


def logic_density(node_nm: float) -> float:
    """Million transistors per mm^2 at ``node_nm``."""
    return _by_node(LOGIC_MTR_PER_MM2, node_nm)


def sram_mm2_per_mib(node_nm: float) -> float:
    return SRAM_MM2_PER_MIB_7NM * _by_node(SRAM_BITCELL_UM2, node_nm) / SRAM_BITCELL_UM2[7]


# ---- the core's supply voltage ------------------------------------------------------------------
# assumption: the core voltage falls linearly with the clock down to 70 % of its value at the top
# of the V-f curve (a 7-5 nm core runs near 1 V at its top clock and needs about 0.65-0.7 V to keep
# noise margins: the floor below which only the clock, not the voltage, can fall). No vendor
# publishes its V-f table.
V_FLOOR_OF_TOP = 0.70
# measured: the clock a GPU holds at its TDP under full load, over the clock its peak is quoted at.
# A lent H100 SXM held dense bf16 8,192-square products at a median 1,395 MHz (1,365-1,425) of the
# 1,830 MHz its peak is quoted at, at 700 W (results/kernels/h100/sustained.txt; an H200, the same
# die, 1,485 MHz, results/kernels/h200/sustained.txt: its chip file says so, ``held_clock_share``;
# every other chip takes the H100's). A chip's nominal clock stands for this held point: on a
# shipped chip the fitted tensor share stands for the drop (0.674 against the 0.696 of the peak the
# H100 held), and the power fit sets full load at the nominal clock to the TDP, the load at which
# the chip holds it. So the core voltage there is already this share of the top one, and a lower
# clock has only the rest, down to the floor, to take.
HELD_CLOCK_SHARE = 1395 / 1830
V_FLOOR = V_FLOOR_OF_TOP / HELD_CLOCK_SHARE    # 0.918: the floor over the nominal point's voltage


def held_share(chip: Chip) -> float:
    """``chip``'s held clock over its quoted one: its file's measurement, else the H100's."""
    return chip.held_clock_share or HELD_CLOCK_SHARE


def v_floor(chip: Chip) -> float:
    """``chip``'s voltage floor over its nominal point's voltage (:data:`V_FLOOR` for the H100's
    held share; 0.863 for the H200's 1,485 of 1,830 MHz)."""
    return V_FLOOR_OF_TOP / held_share(chip)


def voltage_ratio(clock_over_reference: float, floor: float) -> float:
    """The core supply at ``clock_over_reference`` of a chip's reference clock over the supply
    there, on the linear V-f line: ``max(floor, clock_over_reference)`` (``floor``: the chip's
    :func:`v_floor`, given by each caller: the H200's is not the H100's). Below the reference a
    throttled chip saves little voltage; above it a candidate clocked past its template pays for
    the clock in voltage too, up to the top of the curve (:func:`top_clock_hz`), past which a sweep
    refuses its clock."""
    return max(floor, clock_over_reference)


def core_voltage_ratio(chip: Chip) -> float:
    """:func:`voltage_ratio` at ``chip``'s clock over its reference clock (its nominal one; a
    candidate's template's, moved to the candidate's node by :func:`node_speed`), on its floor."""
    return voltage_ratio(chip.clock_hz / chip.reference_clock_hz, v_floor(chip))


# Logic speed at the same power, relative to N7, chained from TSMC's announcements of each node
# against its predecessor (speed gain at iso-power): N10 over 16FF+ 15 % (TSMC's 10 nm technology
# page: 15 % speed gain or 35 % power reduction), N7 over N10 20 % (its 7 nm page: ~20 % speed,
# ~40 % power), N5 over N7 15 % (its 5 nm page: 15 % speed gain or 30 % power reduction), N4P over
# N5 11 % (TSMC's N4P announcement, 2021, the 4 nm density's source above), N3E over N5 18 % (TSMC's
# 2022 Technology Symposium: 18 % speed, 32 % power, 1.6x density, the 3 nm density's source).
# Nodes between them are interpolated log-linearly, as the densities are (chip files and sweeps
# keep to the tables' 3-16 nm: phaze.arch.NODE_RANGE_NM).
NODE_SPEED = {16: 1 / (1.20 * 1.15), 10: 1 / 1.20, 7: 1.0, 5: 1.15, 4: 1.15 * 1.11, 3: 1.15 * 1.18}


def node_speed(node_nm: float) -> float:
    """The clock a design reaches at ``node_nm`` at the same voltage, relative to N7."""
    return _by_node(NODE_SPEED, node_nm)


def reference_clock_at(chip: Chip, node_nm: float) -> float:
    """``chip``'s reference clock (Hz) with its design moved to ``node_nm``: the same design at
    the same voltage runs :func:`node_speed`'s ratio faster. With :func:`node_energy_factor`'s
    capacitance the core's switching power meets the foundry's two claims for N7 to N5: at the
    template's clock 0.70 of it (TSMC: 30 % less at the same speed), at the template's voltage 15 %
    faster for 0.96 of it (TSMC: 15 % faster at the same power)."""
    return chip.reference_clock_hz * node_speed(node_nm) / node_speed(chip.process_node_nm)


def top_clock_hz(chip: Chip) -> float:
    """The top of ``chip``'s V-f curve: its reference clock (the held point) over its
    :func:`held_share`. No voltage takes silicon past it, so a candidate clocked above it is
    refused rather than priced on an extended line."""
    return chip.reference_clock_hz / held_share(chip)


# ---- fitted parameters -------------------------------------------------------------------------
@dataclass(frozen=True)
class Coefficients:
    """The model's only fitted parameters (everything else is sourced above).

    Area: control, schedulers, load-store units, crossbars and the on-chip network are most of a
    GPU die and have no published per-block figure, so they are ``control_mm2_per_unit`` (per
    tensor/vector unit, at 7 nm) plus ``control_um2_per_mac`` (the operand network that grows
    with the datapath, at 7 nm), both scaled to the chip's node with the logic density. Power:
    ``leakage_w_per_mm2`` (static power per mm^2 of die, fitted with a lower bound of 0) and
    ``switching_fj_per_transistor_cycle``: the energy of clocked logic (clock tree, pipeline
    registers, instruction issue, operand networks) per transistor and busy cycle at 45 nm,
    scaled with :func:`node_energy_factor`: ``P = alpha C V^2 f N`` with ``alpha C V^2`` fitted
    and ``N`` the die's transistors (its area at the node's logic density)."""

    control_mm2_per_unit: float
    control_um2_per_mac: float
    leakage_w_per_mm2: float
    switching_fj_per_transistor_cycle: float
    fitted_on: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


# Fitted by fit_coefficients() on A100-SXM4-80GB and H100-SXM5-80GB (the newest two dies whose area
# is published exactly); V100 and TPUv4 are the held-out checks (leave_one_out). tests/test_area.py
# refits and compares. Leakage sits on its floor (LEAKAGE_SHARE_MIN of the H100's 700 W): the exact
# two-chip solution leaks less.
DEFAULT = Coefficients(control_mm2_per_unit=3.22517, control_um2_per_mac=1176.79,
                       leakage_w_per_mm2=0.085995, switching_fj_per_transistor_cycle=0.0141594,
                       fitted_on=("a100-80gb", "h100-sxm"))
# assumption: leakage is at least this share of a chip's full-load power at 7 and 5 nm. FinFET
# processes cut leakage well below planar 28 nm's, but it stays a tenth or more of a large die's
# power at these nodes; no vendor publishes its chips' split, so this is a floor, not a fit.
LEAKAGE_SHARE_MIN = 0.10


# ---- area and cost -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Silicon:
    area_mm2: float
    area_breakdown_mm2: dict
    cost_usd: float
    cost_breakdown_usd: dict
    leakage_w: float
    hbm_stacks: int
    dies_per_wafer: float
    die_yield: float
    transistors: float             # area x logic density: the switching-energy count

    def to_dict(self) -> dict:
        return asdict(self)


def hbm_generation(chip: Chip) -> str:
    """The chip's HBM generation; unset: HBM2e at 7 nm and above, HBM3 below."""
    return chip.hbm_generation or ("hbm2e" if chip.process_node_nm >= 7 else "hbm3")


def hbm_stacks(chip: Chip) -> int:
    """HBM stacks: the fewest stacks of the chip's generation that give its capacity and
    bandwidth (10 % tolerance: vendors run pins a little above the JEDEC rate, e.g. A100 40GB's
    HBM2 at 2.43 Gb/s), and at least the chip's ``hbm_stacks`` (a floor, so that a candidate
    derived from a chip with more capacity or bandwidth gets more stacks)."""
    cap, bw, _ = HBM[hbm_generation(chip)]
    need = max(1, math.ceil(chip.hbm_bytes / cap - 0.1), math.ceil(chip.hbm_bandwidth_bytes_per_s / bw - 0.1))
    return max(need, chip.hbm_stacks)


def link_phys(chip: Chip) -> int:
    """Link PHYs: the chip's ``link_phys``, or its first link level's bandwidth over 25 GB/s per
    direction per link (NVLink 3/4)."""
    if chip.link_phys:
        return chip.link_phys
    if not chip.links:
        return 0
    return math.ceil(chip.links[0].bandwidth_bytes_per_s / LINK_BANDWIDTH_PER_PHY)


def control_units(chip: Chip) -> int:
    """Units with their own control: a GPU's SM holds its tensor cores and CUDA cores (one unit);
    an accelerator's tensor and vector units are separate pools."""
    if chip.unit_sharing == "sequential":
        return max(chip.tensor.count, chip.vector.count)
    return chip.tensor.count + chip.vector.count


def dies_per_wafer(area_mm2: float, diameter_mm: float = WAFER_DIAMETER_MM) -> float:
    """Gross dies on a round wafer with edge loss: ``pi (d/2)^2 / A - pi d / sqrt(2 A)``
    (the standard formula, e.g. Hennessy and Patterson, Computer Architecture, ch. 1)."""
    return max(0.0, math.pi * (diameter_mm / 2) ** 2 / area_mm2
               - math.pi * diameter_mm / math.sqrt(2.0 * area_mm2))


def die_yield(area_mm2: float, defects_per_cm2: float, alpha: float = YIELD_ALPHA) -> float:
    """Negative-binomial yield ``(1 + A D0 / alpha)^-alpha``."""
    return (1.0 + area_mm2 / 100.0 * defects_per_cm2 / alpha) ** -alpha


def good_die_cost(area_mm2: float, node_nm: float) -> tuple[float, float, float]:
    """(USD per good die, dies per wafer, yield) of a die of ``area_mm2`` at ``node_nm``."""
    dpw = dies_per_wafer(area_mm2)
    y = die_yield(area_mm2, _by_node(DEFECTS_PER_CM2, node_nm, log=False))
    good = dpw * y
    return (_by_node(WAFER_USD, node_nm) / good if good > 0 else math.inf), dpw, y


def _area_parts(chip: Chip) -> tuple[dict, float]:
    """(sourced area breakdown in mm^2, 7 nm-equivalent fitted-term inputs)."""
    n = chip.process_node_nm
    dens = logic_density(n)
    ru, rm = chip.die_units_ratio, chip.die_memory_ratio
    macs = chip.tensor.macs_per_cycle * ru
    lanes = chip.vector.count * chip.vector.lanes * ru
    parts = {
        "macs": macs * MAC_TRANSISTORS / (dens * 1e6),
        "vector": lanes * LANE_PER_MAC * MAC_TRANSISTORS / (dens * 1e6),
        "sram_local": chip.tensor.count * ru * max(chip.l1_bytes, chip.local_sram_bytes) / MiB * sram_mm2_per_mib(n),
        "register_files": chip.vector.count * ru * chip.register_file_bytes / MiB * sram_mm2_per_mib(n),
        "sram_shared": chip.shared_buffer_bytes * rm / MiB * sram_mm2_per_mib(n),
        "hbm_phy": hbm_stacks(chip) * rm * HBM_PHY_MM2_PER_STACK,
        "link_phy": link_phys(chip) * LINK_PHY_MM2,
        "uncore": UNCORE_MM2,
    }
    return parts, macs


def control_area_mm2(chip: Chip, c: Coefficients) -> float:
    """The fitted control area at the chip's node: per unit and per MAC at 7 nm, times the logic
    density ratio."""
    _, macs = _area_parts(chip)
    units = control_units(chip) * chip.die_units_ratio
    scale = LOGIC_MTR_PER_MM2[7] / logic_density(chip.process_node_nm)
    return (units * c.control_mm2_per_unit + macs * c.control_um2_per_mac * 1e-6) * scale


@lru_cache(maxsize=65536)
def silicon(chip: Chip, coefficients: Coefficients | None = None) -> Silicon:
    """Area (with breakdown), cost (die, HBM), leakage (at the core voltage,
    :func:`core_voltage_ratio`: first order, P_leak = V I_leak) and HBM stacks of ``chip``."""
    c = coefficients or DEFAULT
    parts, _ = _area_parts(chip)
    parts["control"] = control_area_mm2(chip, c)
    area = sum(parts.values())
    if not area > 0 or not math.isfinite(area):
        raise ConfigError(chip.name, "area", f"gives a die area of {area!r} mm^2; allowed: a positive size")
    # a package of several dies (``chip.dies``) splits the area evenly; each is yielded and
    # priced on its own (smaller dies yield better: why such chips are split). The link joining
    # them has no published area and is not counted
    die_usd, dpw, y = good_die_cost(area / chip.dies, chip.process_node_nm)
    die_usd *= chip.dies
    hbm_usd = chip.hbm_bytes / GB * HBM_USD_PER_GB
    return Silicon(
        area_mm2=area, area_breakdown_mm2=parts, cost_usd=die_usd + hbm_usd,
        cost_breakdown_usd={"die": die_usd, "hbm": hbm_usd},
        leakage_w=c.leakage_w_per_mm2 * area * core_voltage_ratio(chip),
        hbm_stacks=hbm_stacks(chip), dies_per_wafer=dpw, die_yield=y,
        transistors=area * logic_density(chip.process_node_nm) * 1e6)


# ---- activity counts ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Activity:
    """Work of a set of ops on one device: FLOPs and bytes per memory level and link."""

    tensor_flops: float = 0.0
    vector_flops: float = 0.0
    local_bytes: float = 0.0
    shared_bytes: float = 0.0
    hbm_bytes: float = 0.0
    link_bytes: float = 0.0

    def __add__(self, o: Activity) -> Activity:
        return Activity(*(a + b for a, b in zip(self._t(), o._t(), strict=True)))

    def __mul__(self, k: float) -> Activity:
        return Activity(*(a * k for a in self._t()))

    def _t(self):
        return (self.tensor_flops, self.vector_flops, self.local_bytes, self.shared_bytes,
                self.hbm_bytes, self.link_bytes)


def _sent_bytes(kind: str, nbytes: float, n: int) -> float:
    """Bytes each device sends in a ring collective of the full buffer ``nbytes`` over ``n``."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    if kind == "send":
        return nbytes
    return (2.0 if kind == "all_reduce" else 1.0) * (n - 1) / n * nbytes


def _ops_activity(ops, chip: Chip, precision: str, p: int, groups: dict) -> Activity:
    """Activity of ``ops``. GEMMs: hardware FLOPs (``work_fraction`` applied), HBM bytes from the
    cost model's GEMM geometry, shared-buffer bytes of the tile that moves the fewest (the largest
    tile, the one the roofline picks for large GEMMs) plus the HBM traffic that passes through
    the buffer, local-SRAM bytes of that tile's operand feed. Vector ops: FLOPs plus one per
    transcendental, their bytes through HBM, the shared buffer and local SRAM once each.
    Collectives: the bytes each device sends over its group (``groups``: name to (size, stride),
    :func:`phaze.graph.collective_groups`)."""
    acc = [0.0] * 6
    for op in ops:
        if op.unit == "link":
            acc[5] += _sent_bytes(op.collective.kind, op.collective.bytes, groups[op.collective.group][0])
            continue
        if op.unit == "vector":
            acc[1] += op.flops + op.special
            acc[2] += op.bytes
            acc[3] += op.bytes
            acc[4] += op.bytes
            continue
        batch, M, K, N = op.gemm
        q = 1 if (precision == "fp8" and op.weighted) else p
        fused = op.unit == "tensor+vector"
        w = op.work_fraction
        per_tile, hbm = _gemm_geometry(batch, M, K, N, chip, chip.tensor.count, q, w, fused,
                                       op.operand_reuse, op.value_width)
        passes = op.flops / (2.0 * batch * M * K * N)
        tiles = gemm_tiles(chip, q, N, fused)
        j = min(range(len(per_tile)), key=lambda i: per_tile[i][2])
        tm, tn = tiles[j] if j < len(tiles) else (chip.tensor.rows, chip.tensor.cols)
        per_mac = q / op.operand_reuse if op.operand_reuse else q * (1.0 / tm + 1.0 / tn)
        macs = op.flops * w / 2.0
        if fused:
            hbm = op.bytes
            acc[1] += w * (op.vector_flops + op.special)
        acc[0] += op.flops * w
        acc[2] += macs * per_mac
        acc[3] += passes * per_tile[j][2] + hbm
        acc[4] += hbm
    return Activity(*acc)


@lru_cache(maxsize=16384)
def layer_activity(model: Model, chip: Chip, mbs: int, tp: int, sp: bool, attention: str,
                   recompute: str, moe: ExpertLayout | None = None) -> Activity:
    """One layer, one micro-batch, forward and backward (recompute included), on one device
    (a mixture of experts laid out by ``moe``: its all-to-alls' bytes, its experts' GEMMs), the
    mean layer of :func:`phaze.stage.layer_mix` (an MoE model's dense layers, a hybrid's kinds,
    weighed in)."""
    def kind(m: Model, lm: ExpertLayout | None) -> Activity:
        g = layer_graph(m, mbs, tp, sp, attention, recompute, lm, chip.compiled)
        return _ops_activity(g.ops, chip, m.precision, m.bytes_per_element, collective_groups(tp, lm))
    return _mean([(w, kind(m, lm)) for w, m, lm in layer_mix(model, moe)])


@lru_cache(maxsize=4096)
def edge_activity(model: Model, chip: Chip, mbs: int, tp: int, sp: bool,
                  loss: str = "torch") -> tuple[Activity, Activity]:
    """(embedding, head) per micro-batch, forward and backward."""
    e = edge_graph(model, mbs, tp, sp, loss)
    p = model.bytes_per_element
    groups = collective_groups(tp, None)
    return (_ops_activity(e["embedding"], chip, model.precision, p, groups),
            _ops_activity(e["head"], chip, model.precision, p, groups))


@lru_cache(maxsize=16384)
def _step_activity(model: Model, chip: Chip, devices: int, global_batch: int, plan: Plan) -> Activity:
    """Average activity of one device over one step (cluster total / devices)."""
    check_plan(model, devices, global_batch, plan)
    costs = stage_costs(model, chip, devices, global_batch, layout_of(plan), IDEAL)
    pp, tp, m = plan.pp, plan.tp, costs.micro_batches
    counts = stage_split(model, plan)
    recs, ks = plan.stage_modes()
    shard = _shard(model, plan)
    p = model.bytes_per_element
    emb, head = edge_activity(shard, chip, plan.mbs, tp, plan.sp, plan.loss)
    shard_dp = shard_ranks(plan, devices, chip)
    group = shard_dp * plan.cp    # a ZeRO shard group (every data-parallel rank unless hybrid)
    replicas = plan.dp(devices) // shard_dp
    edp, e_replicas = expert_shard(plan, devices, chip)   # the routed experts' own group
    moe = expert_layout(model, plan, chip, mean=True)   # every rank's mean tokens, not the busiest's
    grad_bytes = main_grad_bytes(model, plan)
    zero_optimizer = deepspeed_zero(model, plan)   # DeepSpeed's: a reduce a partition, at stage 2 every micro-batch

    def reduction(share, fp8_share, ranks, copies):
        """Bytes a device sends reducing ``share`` of its parameters' gradients over a shard group
        of ``ranks`` (``copies`` replicas of it), and gathering their weights (or FSDP's per-layer
        gathers)."""
        gathered = gathered_bytes(model, plan, p * share, fp8_share)   # fp8 weights: 1 byte a linear weight
        if state_zero(plan) >= 3:   # the gradients' wire type (DeepSpeed's communication_data_type)
            sent = m * _sent_bytes("all_gather", 2 * gathered, ranks) \
                + m * _sent_bytes("reduce_scatter", reduced_grad_bytes(model, plan) * share, ranks)
        elif plan.zero >= 1:   # DeepSpeed's ZeRO reduces, one a partition: n/(n - 1) times the bytes,
            spread = ranks / (ranks - 1) if zero_optimizer and ranks > 1 else 1.0
            times = m if zero_optimizer and plan.zero >= 2 else 1   # every micro-batch at stage 2
            sent = times * _sent_bytes("reduce_scatter", grad_bytes * share * spread, ranks) \
                + _sent_bytes("all_gather", gathered, ranks)
        else:
            sent = _sent_bytes("all_reduce", grad_bytes * share, ranks)
        if copies > 1:   # hybrid sharding (ZeRO 1-3): each shard's gradients over the replicas
            sent += _sent_bytes("all_reduce", grad_bytes * share / ranks, copies)
        return sent

    total = Activity()
    for i, (n, r, k) in enumerate(zip(counts, recs, ks, strict=True)):
        params = costs.params(i, n)
        updated = costs.updated_params(i, n)   # its ZeRO shard; the experts' over their own group
        runs = costs.layers_on(i, n)   # the layers the device runs: the last stage's multi-token prediction's too
        experts = costs.expert_params(runs) if model.moe else 0.0
        fp8_weights = costs.fp8_weights(i, n) if plan.fp8_params else 0.0
        cast = costs.weight_cast_bytes(i, n, updated / params) or 0.0   # the step's one cast of the weights to fp8
        rec = graph_recompute(r, plan.recompute_modules, plan.offload)    # what the stage's layers re-run
        if r == "block":     # k layers re-run whole, the others nothing
            per_mb = (layer_activity(shard, chip, plan.mbs, tp, plan.sp, plan.attention, "none", moe) * (runs - k)
                      + layer_activity(shard, chip, plan.mbs, tp, plan.sp, plan.attention, "full", moe) * k)
        else:
            per_mb = layer_activity(shard, chip, plan.mbs, tp, plan.sp, plan.attention, rec, moe) * runs
        # activations offloaded to the host and fetched back, per micro-batch: read from HBM and
        # written back into it, over the host link (priced as the chip's other off-chip links)
        host = 2 * offloaded_bytes(shard, plan.mbs, tp, rec) * runs
        if host:
            per_mb = per_mb + Activity(shared_bytes=host, hbm_bytes=host, link_bytes=host)
        if i == 0:
            per_mb = per_mb + emb
        if i == pp - 1:
            per_mb = per_mb + head
        stage = per_mb * m
        # data-parallel gradient reduction (and the distributed optimizer's weight all-gather, or
        # FSDP's per-layer gathers); each byte sent is read from HBM and one received is written.
        # The routed experts' over the expert data-parallel group, as the step's time has them.
        fp8_experts = fp8_weights * experts / params
        sent = reduction(params - experts, fp8_weights - fp8_experts, group, replicas)
        if experts:
            sent += reduction(experts, fp8_experts, edp, e_replicas)
        table = costs.table_sync_bytes(i)
        if table:   # the shared token table's gradients, summed by the first and last stages
            sent += _sent_bytes("all_reduce", table, 2)
        if plan.cp > 1:   # context parallelism's K/V exchange, per layer and micro-batch
            if r == "block":
                per_layer = (cp_sent_bytes(model, plan, "none", chip.compiled) * (runs - k)
                             + cp_sent_bytes(model, plan, "full", chip.compiled) * k)
            else:
                per_layer = cp_sent_bytes(model, plan, rec, chip.compiled) * runs
            sent += m * per_layer
        if pp > 1:   # activations forward and gradients backward, per micro-batch and chunk
            sent += 2 * plan.vp * m * p * plan.mbs * shard.seq_len * model.hidden / tp * (pp - 1) / pp
        opt = optimizer_op(updated, plan.optimizer, model.precision, grad_bytes, plan.zero)
        # the optimizer's kernels, its per-tensor passes and the weights' cast, and every
        # micro-batch's gradient accumulation (their bytes, as the step's time has them)
        step_bytes = opt.bytes + cast + costs.step_pass_bytes(i, n) + m * costs.accumulation_bytes(i, n)
        total = total + stage + Activity(vector_flops=opt.flops, local_bytes=step_bytes,
                                         shared_bytes=step_bytes + 2 * sent,
                                         hbm_bytes=step_bytes + 2 * sent, link_bytes=sent)
    return total * (1.0 / pp)


# ---- energy ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Energy:
    energy_per_step_j: float
    breakdown_j: dict
    power_w: float
    tokens_per_joule: float
    step_time_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def energy_coefficients(chip: Chip) -> dict:
    """Joules per FLOP / byte at the chip's node and core voltage (the core's parts scale with the
    square of :func:`core_voltage_ratio`; HBM, by generation, and the links, by SerDes, have their
    own supplies)."""
    f = node_energy_factor(chip.process_node_nm) * core_voltage_ratio(chip) ** 2
    return {
        "tensor": PJ_PER_TENSOR_FLOP_45 * f * 1e-12,
        "vector": PJ_PER_VECTOR_FLOP_45 * f * 1e-12,
        "local_sram": PJ_PER_BYTE_LOCAL_45 * f * 1e-12,
        "shared_buffer": PJ_PER_BYTE_SHARED_45 * f * 1e-12,
        "hbm": HBM[hbm_generation(chip)][2] * 8e-12,
        "link": PJ_PER_BIT_LINK * 8e-12,
    }


def logic_power_w(chip: Chip, coefficients: Coefficients | None = None) -> float:
    """The clocked logic's switching power while the units are busy (the fitted
    ``switching_fj_per_transistor_cycle`` times the die's transistors and the clock, at the
    square of :func:`core_voltage_ratio`)."""
    c = coefficients or DEFAULT
    return (c.switching_fj_per_transistor_cycle * 1e-15 * node_energy_factor(chip.process_node_nm)
            * core_voltage_ratio(chip) ** 2 * silicon(chip, c).transistors * chip.clock_hz)


def _busy_s(result) -> float:
    """Seconds of the step the units compute (not waiting in the bubble or on communication)."""
    b = result.breakdown_s
    return float(b["compute_s"] + b["memory_bound_s"] + b["optimizer_s"])


def activity_energy_j(a: Activity, k: dict) -> dict:
    """The dynamic energy of ``a``'s work by part (joules): FLOPs and bytes times the energy per
    FLOP and per byte of :func:`energy_coefficients`."""
    return {"tensor": a.tensor_flops * k["tensor"],
            "vector": a.vector_flops * k["vector"],
            "local_sram": a.local_bytes * k["local_sram"],
            "shared_buffer": a.shared_bytes * k["shared_buffer"],
            "hbm": a.hbm_bytes * k["hbm"],
            "link": a.link_bytes * k["link"]}


def step_energy(model: Model, chip: Chip, devices: int, global_batch: int, plan: Plan,
                eff: Efficiency = IDEAL, result=None, coefficients: Coefficients | None = None) -> Energy:
    """Energy one device spends on one training step of ``plan`` (the average device: the
    cluster's energy / devices), its average power and the cluster's tokens per joule.

    Dynamic energy: activity counts (:func:`_step_activity`) times the energy per FLOP and per
    byte of :func:`energy_coefficients`, plus the clocked logic's switching energy (the fitted
    ``switching_fj_per_transistor_cycle`` times the die's transistors and the cycles the units
    compute); leakage: the silicon's leakage power over the whole step.
    The traffic is the one the step's time costs: every collective (a mixture of experts'
    all-to-alls over ep and its experts' gradients over their own data-parallel group), the
    optimizer's per-tensor passes and each micro-batch's gradient accumulation.
    Simplifications: every GEMM counts its fewest-bytes tile; the data-parallel reduction reads
    and writes HBM once per byte sent; fp8 FLOPs cost as 16-bit ones; a mixture of experts counts
    its mean rank's tokens (a dropless router's busiest rank sets the time, but the others see
    fewer), and DeepEP's forwarding inside a node is not counted; the gradient accumulation's
    adds count their bytes, not their one FLOP a parameter.
    The core's switching energies and leakage are at the chip's core voltage
    (:func:`core_voltage_ratio`: a chip run below its nominal clock, :mod:`phaze.power`, saves
    some); HBM and the link PHYs have their own supplies."""
    if result is None:
        result = evaluate(model, chip, devices, global_batch, plan, eff)
    c = coefficients or DEFAULT
    si = silicon(chip, c)
    a = _step_activity(model, chip, devices, global_batch, plan)
    k = energy_coefficients(chip)
    t = result.step_time_s
    logic = logic_power_w(chip, c) * _busy_s(result)
    parts = dict(activity_energy_j(a, k), logic=logic, leakage=si.leakage_w * t)
    e = sum(parts.values())
    tokens = global_batch * model.seq_len
    return Energy(energy_per_step_j=e, breakdown_j=parts, power_w=e / t,
                  tokens_per_joule=tokens / (devices * e), step_time_s=t)


def full_load_power_w(chip: Chip, coefficients: Coefficients | None = None) -> float:
    """The power of ``chip`` with its units busy every cycle at its clock: leakage, the clocked
    logic's switching and the tensor units' FLOPs at peak. A chip's TDP is rated for this load,
    so the fit sets it to the TDP; a training step, which also waits in bubbles and on links,
    draws less (:func:`step_energy`)."""
    c = coefficients or DEFAULT
    return (silicon(chip, c).leakage_w + logic_power_w(chip, c)
            + chip.implied_peak_flops_per_s * energy_coefficients(chip)["tensor"])


# ---- fitting on the reference chips ------------------------------------------------------------
# Published die area (mm^2) and power at full load (W, low and high) of the reference chips, with
# their sources in the chip files: V100 815 mm^2, 300 W TDP (V100 whitepaper); A100 826 mm^2, 400 W
# TDP (A100 whitepaper / datasheet); H100 814 mm^2, 700 W TDP (H100 whitepaper); TPUv4 < 600 mm^2
# (TPUv4 paper: a one-sided bound, never a fitting target), measured 170 W mean and 192 W max
# (Jouppi et al., ISCA 2023).
REFERENCE = {
    "v100-sxm2-32gb": (815.0, 300.0, 300.0),
    "a100-80gb": (826.0, 400.0, 400.0),
    "h100-sxm": (814.0, 700.0, 700.0),
    "tpuv4": (600.0, 170.0, 192.0),
}
# The shipped fit's pair; a held-out one of them is replaced by the other exact-area die (V100).
SHIPPED_FIT = ("a100-80gb", "h100-sxm")
AREA_UPPER_BOUND_ONLY = {"tpuv4"}     # published as "< 600 mm^2"
# A training step at load, for the per-run power figures: GPT-3 175B on 1024 chips, global batch
# 1536 (Narayanan et al., SC'21, Table 1: 1024 A100s at batch 1536), a plan that fits all four.
POWER_RUN = ("gpt3-175b", 1024, 1536, "tp=8,pp=16,mbs=1,recompute=full")


def _run(name: str):
    """(model, chip, plan, efficiency, result) of the full-load run on a shipped chip."""
    workload, devices, batch, plan = POWER_RUN
    model, chip, plan = load_model(workload), load_chip(name), parse_plan(plan)
    eff = calibrated_efficiency(chip)
    return model, chip, plan, eff, evaluate(model, chip, devices, batch, plan, eff)


@lru_cache(maxsize=64)
def fit_coefficients(names: tuple[str, ...] = ("a100-80gb", "h100-sxm")) -> Coefficients:
    """Fit the four :class:`Coefficients` on exactly two reference chips (never all three): the
    two area terms solve the two published areas exactly (with one exact area, a chip whose
    published area is only an upper bound being the other, the control area per MAC alone solves
    it); then leakage and switching energy solve
    the two chips' full-load power (:func:`full_load_power_w`) = their TDP (the top of the
    published range), with leakage at least :data:`LEAKAGE_SHARE_MIN` of it (when the exact
    solution leaks less, leakage sits on the floor and the switching term is fitted by least
    squares)."""
    names = tuple(names)
    if len(names) != 2 or not set(names) <= set(REFERENCE):
        raise ConfigError("fit_coefficients", "names", f"two of {', '.join(REFERENCE)}; got {names}")
    zero = Coefficients(0.0, 0.0, 0.0, 0.0)
    chips = [load_chip(n) for n in names]
    rows, rhs = [], []
    for n, chip in zip(names, chips, strict=True):
        if n in AREA_UPPER_BOUND_ONLY:
            continue
        base = silicon(chip, zero)
        rows.append((control_area_mm2(chip, Coefficients(1.0, 0.0, 0.0, 0.0)),
                     control_area_mm2(chip, Coefficients(0.0, 1.0, 0.0, 0.0))))
        rhs.append(REFERENCE[n][0] - base.area_mm2)
    if len(rows) == 2:
        u, k = (float(x) for x in _solve2(rows, rhs))
    else:        # one exact area: the lump per MAC alone (a bound is never a fitting target)
        u, k = 0.0, float(rhs[0] / rows[0][1])
    area_only = Coefficients(u, k, 0.0, 0.0)
    rows, rhs, areas, targets = [], [], [], []
    for n, chip in zip(names, chips, strict=True):
        ops = full_load_power_w(chip, area_only)
        area = silicon(chip, area_only).area_mm2
        switch = full_load_power_w(chip, Coefficients(u, k, 0.0, 1.0)) - ops
        rows.append((area, switch))
        rhs.append(REFERENCE[n][2] - ops)
        areas.append(area)
        targets.append(REFERENCE[n][2])
    leak, fj = _solve2(rows, rhs)
    floor = max(LEAKAGE_SHARE_MIN * t / a for t, a in zip(targets, areas, strict=True))
    if leak < floor:       # leakage on its floor: the switching term by least squares (watts)
        leak = floor
        fj = sum(r[1] * (y - leak * r[0]) for r, y in zip(rows, rhs, strict=True)) / sum(r[1] ** 2 for r in rows)
    return Coefficients(u, k, float(leak), float(fj), fitted_on=names)


def _solve2(rows, rhs) -> tuple[float, float]:
    (a, b), (c, d) = rows
    det = a * d - b * c
    if abs(det) < 1e-12 * max(abs(a * d), abs(b * c), 1e-300):
        raise ConfigError("fit_coefficients", None, "the two reference chips do not separate the "
                                                    "two parameters")
    return (rhs[0] * d - b * rhs[1]) / det, (a * rhs[1] - c * rhs[0]) / det


def loo_pair(held: str) -> tuple[str, str]:
    """The two reference chips a held-out chip is predicted from: the shipped pair (A100, H100),
    with V100 standing in for a held-out member, so that every fit has two exact areas and the
    held-out chip is never among them."""
    if held not in SHIPPED_FIT:
        return SHIPPED_FIT
    return tuple(n for n in REFERENCE if n not in AREA_UPPER_BOUND_ONLY and n != held)[:2]


def leave_one_out() -> dict:
    """Each reference chip predicted with the coefficients fitted on two others
    (:func:`loo_pair`): area, the full-load power (against the TDP, or the measured maximum for
    TPUv4), the power of a training step (:data:`POWER_RUN`, at most the full load) and cost. A
    published area that is only an upper bound (TPUv4) scores 0 error when the prediction is
    below it."""
    out = {}
    for held in REFERENCE:
        coef = fit_coefficients(loo_pair(held))
        model, chip, plan, eff, r = _run(held)
        workload, devices, batch, _ = POWER_RUN
        si = silicon(chip, coef)
        en = step_energy(model, chip, devices, batch, plan, eff, r, coef)
        full = full_load_power_w(chip, coef)
        area, lo, hi = REFERENCE[held]
        err = si.area_mm2 / area - 1
        if held in AREA_UPPER_BOUND_ONLY:
            err = max(0.0, err)
        out[held] = {"published_area_mm2": area, "area_mm2": si.area_mm2, "area_upper_bound_only":
                     held in AREA_UPPER_BOUND_ONLY, "area_error": err, "published_power_w": (lo, hi),
                     "full_load_power_w": full, "power_error": full / hi - 1, "power_w": en.power_w,
                     "leakage_w": si.leakage_w, "leakage_share": si.leakage_w / full if full > 0 else 0.0,
                     "control_share": si.area_breakdown_mm2["control"] / si.area_mm2,
                     "cost_usd": si.cost_usd, "coefficients": coef.to_dict()}
    return out


def loo_markdown() -> str:
    """The README's table of :func:`leave_one_out` (a test holds the README to it)."""
    names = {"v100-sxm2-32gb": "V100-SXM2", "a100-80gb": "A100-80GB", "h100-sxm": "H100-SXM", "tpuv4": "TPUv4"}
    rows = ["| chip | published die | predicted, fitted without it | error | fitted lump (share of die) "
            "| published power | full load, fitted without it | error | a GPT-3 175B step | leakage | cost |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for key, r in leave_one_out().items():
        lo, hi = r["published_power_w"]
        die = f"< {r['published_area_mm2']:.0f} mm²" if r["area_upper_bound_only"] else \
            f"{r['published_area_mm2']:.0f} mm²"
        err = "below the bound" if r["area_upper_bound_only"] and r["area_error"] == 0 else \
            f"{100 * r['area_error']:+.1f} %"
        power = f"{lo:.0f}–{hi:.0f} W measured" if lo != hi else f"{hi:.0f} W TDP"
        rows.append(f"| {names[key]} | {die} | {r['area_mm2']:.0f} mm² | {err} | {100 * r['control_share']:.0f} % "
                    f"| {power} | {r['full_load_power_w']:.0f} W | {100 * r['power_error']:+.1f} % "
                    f"| {r['power_w']:.0f} W | {r['leakage_w']:.0f} W ({100 * r['leakage_share']:.0f} %) "
                    f"| ${r['cost_usd']:,.0f} |")
    return "\n".join(rows)
