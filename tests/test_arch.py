"""Chip configs against the datasheet table, and the chip schema's validation.

The reference figures come from phaze/data/reference/device_specs.csv (copied from public
datasheets), never from our own YAML. Capacities are binary (the shipped YAMLs document that
NVIDIA's "80 GB" HBM is 80 GiB, "50 MB" L2 is 50 MiB, "228 KB" shared memory is 228 KiB);
bandwidths and FLOP rates are decimal.
"""
from __future__ import annotations

import copy
import csv
import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from phaze.arch import load_chip
from phaze.configio import ConfigError

ROOT = Path(__file__).resolve().parents[1]
ARCH_DIR = ROOT / "arch_configs"
SPECS_CSV = ROOT / "phaze" / "data" / "reference" / "device_specs.csv"

SHIPPED = sorted(p.stem for p in ARCH_DIR.glob("*.yaml"))
# shipped chip name -> row of device_specs.csv
CSV_ROW = {
    "a100-80gb": "A100-SXM4-80GB",
    "a100-40gb": "A100-SXM4-40GB",
    "h100-sxm": "H100-SXM5-80GB",
    "tpuv4": "TPUv4",
}
GPUS = ["a100-80gb", "a100-40gb", "h100-sxm"]
GiB, MiB, KiB = 2**30, 2**20, 2**10


def _specs() -> dict[str, dict[str, str]]:
    with SPECS_CSV.open(newline="") as fh:
        return {row["gpu"]: row for row in csv.DictReader(fh)}


SPECS = _specs()


def _num(text: str) -> float | None:
    """Leading number of a CSV cell ('1830 (tensor-core peak basis)...' -> 1830); None if none."""
    m = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)", text or "")
    return float(m.group(1)) if m else None


def spec(chip: str, column: str) -> float:
    value = _num(SPECS[CSV_ROW[chip]][column])
    assert value is not None, f"device_specs.csv has no number for {chip} {column}"
    return value


# ---- shipped chips against the datasheets ----

def test_expected_chips_are_shipped():
    assert set(CSV_ROW) <= set(SHIPPED)
    assert set(CSV_ROW.values()) <= set(SPECS)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_chip_loads(name):
    chip = load_chip(name)
    assert chip.tensor.macs_per_cycle > 0
    assert chip.links and chip.links[-1].devices == 0
    # loading by path gives the same chip as loading by name
    assert load_chip(ARCH_DIR / f"{name}.yaml") == chip


@pytest.mark.parametrize("name", sorted(CSV_ROW))
def test_implied_16bit_peak_matches_datasheet(name):
    chip = load_chip(name)
    datasheet = spec(name, "tensor_tflops_bf16_dense") * 1e12
    assert chip.implied_peak_flops_per_s == pytest.approx(datasheet, rel=0.01)
    assert chip.peak_flops("bf16") == pytest.approx(datasheet, rel=0.01)
    assert chip.peak_flops("fp16") == pytest.approx(datasheet, rel=0.01)


@pytest.mark.parametrize("name", sorted(CSV_ROW))
def test_hbm_matches_datasheet(name):
    chip = load_chip(name)
    assert chip.hbm_bytes == spec(name, "hbm_gb") * GiB
    # the CSV rounds to 3-4 significant digits
    assert chip.hbm_bandwidth_bytes_per_s == pytest.approx(spec(name, "hbm_tb_s") * 1e12, rel=2e-3)


@pytest.mark.parametrize("name", GPUS)
def test_gpu_units_match_datasheet(name):
    chip = load_chip(name)
    assert chip.kind == "gpu"
    assert chip.tensor.count == spec(name, "sms")
    assert chip.vector.count == spec(name, "sms")
    # the FP32 datasheet figure is quoted at the max boost clock (H100: 1980 MHz), phaze's clock is
    # the tensor-peak one: compare at the datasheet's clock
    boost = {"h100-sxm": 1980e6}.get(name, chip.clock_hz)
    assert chip.vector_flops_per_s * boost / chip.clock_hz == pytest.approx(
        spec(name, "fp32_tflops") * 1e12, rel=0.03)
    assert chip.clock_hz == pytest.approx(spec(name, "clock_mhz") * 1e6, rel=1e-3)
    assert chip.shared_buffer_bytes == spec(name, "l2_mb") * MiB
    assert chip.local_sram_bytes == spec(name, "smem_per_sm_kb") * KiB
    assert chip.tdp_w == spec(name, "tdp_w")
    nvlink = chip.links[0]
    assert nvlink.devices == 8
    # the CSV gives NVLink bidirectional; the schema is per direction
    assert 2 * nvlink.bandwidth_bytes_per_s == spec(name, "nvlink_gb_s_per_gpu_bidirectional") * 1e9


def test_tpuv4_units_match_docs():
    chip = load_chip("tpuv4")
    assert chip.kind == "accelerator"
    cores, mxus, rows, cols = map(int, re.findall(r"\d+", SPECS["TPUv4"]["sms"]))
    assert (chip.tensor.count, chip.tensor.rows, chip.tensor.cols) == (cores * mxus, rows, cols)
    assert chip.tensor.fill_drain
    assert chip.tdp_w == spec("tpuv4", "tdp_w")


@pytest.mark.parametrize("name, cores, mxus, tflops, hbm_gib, hbm_gb_s, ici_gbit_s", [
    ("tpuv5e", 1, 4, 197, 16, 819, 1600),      # Cloud TPU docs, TPU v5e specifications
    ("tpuv5p", 2, 4, 459, 95, 2765, 4800),     # Cloud TPU docs, TPU v5p specifications
])
def test_tpuv5_units_match_docs(name, cores, mxus, tflops, hbm_gib, hbm_gb_s, ici_gbit_s):
    """The Cloud docs give no clock: the file's clock is the one at which the MXUs reach the bf16
    peak (cores x 4 MXUs x 128 x 128 MACs x 2 FLOP per cycle)."""
    chip = load_chip(name)
    assert (chip.kind, chip.execution, chip.tensor.count, chip.tensor.rows) == ("accelerator", "xla", cores * mxus, 128)
    assert chip.tensor.count * 128 * 128 * 2 * chip.clock_hz == pytest.approx(tflops * 1e12, rel=1e-4)
    assert dict(chip.peak_flops_per_s)["bf16"] == tflops * 1e12
    assert chip.hbm_bytes == hbm_gib * GiB and chip.hbm_bandwidth_bytes_per_s == hbm_gb_s * 1e9
    assert chip.links[0].bandwidth_bytes_per_s == ici_gbit_s * 1e9 / 8
    assert chip.tdp_w is None and chip.area_mm2 is None    # not published: no power limit, no area


def test_v100_units_match_its_datasheet():
    """V100-SXM2 (V100 datasheet and whitepaper; no device_specs.csv row): 80 SMs x 512 FP16 MAC
    per clock x 2 x 1.53 GHz = 125.3 TFLOP/s tensor (datasheet 125), 80 x 64 lanes x 2 x 1.53 GHz =
    15.7 TFLOP/s FP32 (datasheet 15.7), 32 GiB of HBM2 at 900 GB/s, 6 NVLink2 links, 300 W."""
    chip = load_chip("v100-sxm2-32gb")
    assert chip.implied_peak_flops_per_s == pytest.approx(125e12, rel=0.005)
    assert chip.vector.count * chip.vector.lanes * 2 * chip.clock_hz == pytest.approx(15.7e12, rel=0.005)
    assert (chip.hbm_bytes, chip.hbm_bandwidth_bytes_per_s) == (32 * GiB, 900e9)
    assert (chip.link_phys, chip.tdp_w, chip.area_mm2) == (6, 300, 815)
    with pytest.raises(ConfigError, match="fp8"):
        chip.peak_flops("fp8")


def test_h100_fp8_peak_matches_datasheet():
    chip = load_chip("h100-sxm")
    assert chip.peak_flops("fp8") == pytest.approx(spec("h100-sxm", "tensor_tflops_fp8_dense") * 1e12,
                                                   rel=1e-4)


def test_h200_matches_its_datasheet():
    """H200 SXM datasheet: BF16 1,979, FP8 3,958 and TF32 989 TFLOPS with sparsity (half dense),
    141 GB HBM3e at 4.8 TB/s, up to 700 W, NVLink 900 GB/s; DGX H200: 8 GPUs, 400 Gb/s each."""
    chip, h100 = load_chip("h200-sxm"), load_chip("h100-sxm")
    assert chip.peak_flops("bf16") == pytest.approx(1979e12 / 2, rel=1e-3)
    assert chip.implied_peak_flops_per_s == pytest.approx(1979e12 / 2, rel=1e-3)
    assert chip.peak_flops("fp8") == pytest.approx(3958e12 / 2, rel=1e-3)
    assert chip.peak_flops("fp32") == pytest.approx(989e12 / 2, rel=1e-3)
    assert (chip.hbm_bytes, chip.hbm_bandwidth_bytes_per_s, chip.tdp_w) == (141 * GiB, 4.8e12, 700)
    assert [(lk.devices, 2 * lk.bandwidth_bytes_per_s) for lk in chip.links] == [(8, 900e9), (0, 100e9)]
    # the same GH100 silicon as H100 SXM, and calibrated with it
    assert (chip.tensor, chip.vector, chip.clock_hz, chip.family) == (h100.tensor, h100.vector, h100.clock_hz, "H100")
    assert chip.local_sram_bytes == h100.local_sram_bytes
    # measured on a lent H200 (tests/bench/measure_properties.py): 132 SMs, 228 KiB of shared
    # memory per SM and 60 MiB of L2, where H100 SXM enables 50 MB of the same die's 60
    measured = _measured_properties("h200")
    assert chip.tensor.count == int(measured["multi_processor_count"])
    assert chip.local_sram_bytes == int(measured["shared_memory_per_multiprocessor"])
    assert chip.shared_buffer_bytes == int(measured["L2_cache_size"])
    assert chip.shared_buffer_bytes == h100.shared_buffer_bytes * h100.die_memory_ratio


@pytest.mark.parametrize("name, gpus, bf16_sparse, fp8_sparse, tf32_sparse, fp32, hbm_gib, hbm_b_s, nvlink, tdp", [
    # HGX platform page, HGX B200 column (per 8 GPUs, sparse tensor rates) and the DGX B200
    # datasheet (1,440 GB and 64 TB/s of HBM3e, 14.4 TB/s of NVLink over 8 GPUs); up to 1,000 W
    ("b200", 8, 36e15, 72e15, 18e15, 600e12, 1440 / 8, 64e12, 14.4e12, 1000),
    # GB200 NVL72 product page (per 72 GPUs: 13.4 TB and 576 TB/s of HBM3e, 130 TB/s of NVLink);
    # the TDP is the file's assumption (the superchip's 2,700 W less its Grace), not a datasheet's
    ("gb200", 72, 360e15, 720e15, 180e15, 5760e12, 13.4e3 / 72, 576e12, 130e12, 1200),
])
def test_blackwell_chips_match_their_datasheets(name, gpus, bf16_sparse, fp8_sparse, tf32_sparse, fp32,
                                                hbm_gib, hbm_b_s, nvlink, tdp):
    chip = load_chip(name)
    dense = bf16_sparse / gpus / 2
    assert chip.peak_flops("bf16") == pytest.approx(dense, rel=1e-3)
    # the assumed SMs x MACs per SM x clock give the datasheet's peak, which the cost model reads
    assert chip.implied_peak_flops_per_s == pytest.approx(dense, rel=1e-3)
    assert chip.peak_flops("fp8") == pytest.approx(fp8_sparse / gpus / 2, rel=1e-3)
    assert chip.peak_flops("fp32") == pytest.approx(tf32_sparse / gpus / 2, rel=1e-3)
    # the FP32 figure is quoted at a higher clock than the tensor peak (as H100's at its boost)
    v = chip.vector
    assert 1.0 < fp32 / gpus / (v.count * v.lanes * v.flops_per_lane_per_cycle * chip.clock_hz) < 1.1
    assert chip.hbm_bytes == pytest.approx(hbm_gib * GiB, rel=0.01)
    assert chip.hbm_bandwidth_bytes_per_s == pytest.approx(hbm_b_s / gpus, rel=1e-3)
    assert 2 * chip.links[0].bandwidth_bytes_per_s == pytest.approx(nvlink / gpus, rel=0.01)
    assert chip.links[0].devices == gpus and chip.tdp_w == tdp
    assert (chip.dies, chip.family, chip.execution, chip.area_mm2) == (2, "B200", "eager", None)
    # the same silicon: every unit as B200's
    b200 = load_chip("b200")
    assert (chip.tensor, chip.vector, chip.shared_buffer_bytes) == (b200.tensor, b200.vector, b200.shared_buffer_bytes)


def _measured_properties(gpu: str) -> dict[str, str]:
    """What a lent GPU said of itself (tests/bench/measure_properties.py), name -> value."""
    text = (ROOT / "results" / "kernels" / gpu / "properties.txt").read_text()
    return dict(line.split(" ", 1) for line in text.splitlines()
                if line and not line.startswith("#") and " " in line)


def test_h100_sxm_file_is_what_a_lent_h100_reports():
    # measured on a lent H100 SXM (tests/bench/measure_properties.py): its SMs, shared memory per
    # SM and L2 are the whitepaper's and the programming guide's that the chip file cites, and its
    # bus width times its memory clock (double data rate) is the product page's 3.35 TB/s
    chip, measured = load_chip("h100-sxm"), _measured_properties("h100")
    assert measured["name"] == "NVIDIA H100 80GB HBM3"
    assert chip.tensor.count == chip.vector.count == int(measured["multi_processor_count"]) == 132
    assert chip.local_sram_bytes == int(measured["shared_memory_per_multiprocessor"])
    assert chip.shared_buffer_bytes == int(measured["L2_cache_size"]) == 50 * 2**20
    bus = int(measured["memory_bus_width"]) / 8 * 2 * int(measured["memory_clock_rate"]) * 1e3
    assert bus == pytest.approx(chip.hbm_bandwidth_bytes_per_s, rel=1e-3)
    assert int(measured["clock_rate"]) * 1e3 > chip.clock_hz   # boost above the tensor-peak clock
    # CUDA sees 79.18 GiB of the 80: the shortfall docs/cli.md quotes for the memory reserve, beside
    # the H200's (139.80 of its file's 141 GiB)
    short = {g: 1 - int(_measured_properties(g)["total_memory"]) / load_chip(f"{g}-sxm").hbm_bytes
             for g in ("h100", "h200")}
    cli = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    assert (f"({100 * short['h100']:.2f} % of a lent H100's 80 GiB, {100 * short['h200']:.2f} % of an H200's "
            f"141, measured)") in cli


def test_h200_silicon_is_the_six_stack_gh100():
    """Six HBM3e stacks follow from the capacity alone (141 GiB over 24 GiB stacks), and the die
    is H100 SXM's: the same GH100, whose six memory sites and 60 MiB of L2 H100 SXM enables five
    and 50 MB of (its ``die_memory_ratio`` 1.2) and the H200 all (1.0, its L2 measured)."""
    from phaze.area import hbm_stacks, silicon
    chip = load_chip("h200-sxm")
    assert hbm_stacks(replace(chip, hbm_stacks=0)) == 6
    assert silicon(chip).area_mm2 == pytest.approx(silicon(load_chip("h100-sxm")).area_mm2)
    assert silicon(chip).area_mm2 == pytest.approx(814, rel=0.02)


@pytest.mark.parametrize("name", ["a100-80gb", "a100-40gb", "tpuv4"])
def test_no_fp8_where_datasheet_has_none(name):
    assert _num(SPECS[CSV_ROW[name]]["tensor_tflops_fp8_dense"]) is None
    with pytest.raises(ConfigError, match="fp8"):
        load_chip(name).peak_flops("fp8")


# ---- bad chip files ----

GOOD = {
    "name": "test-chip",
    "kind": "accelerator",
    "clock_hz": 1.0e9,
    "tensor_units": {"count": 4, "rows": 128, "cols": 128},
    "vector_units": {"count": 4, "lanes": 128},
    "local_sram_bytes": 4.0e6,
    "shared_buffer_bytes": 64.0e6,
    "shared_buffer_bandwidth_bytes_per_s": 2.0e12,
    "hbm_bytes": 32.0e9,
    "hbm_bandwidth_bytes_per_s": 1.0e12,
    "peak_flops_per_s": {"bf16": 131.0e12},
    "links": [
        {"name": "board", "devices": 4, "bandwidth_bytes_per_s": 100.0e9, "latency_s": 1.0e-6},
        {"name": "net", "devices": 0, "bandwidth_bytes_per_s": 25.0e9, "latency_s": 5.0e-6},
    ],
}


def _write(tmp_path, data) -> Path:
    path = tmp_path / "chip.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_good_fixture_loads(tmp_path):
    chip = load_chip(_write(tmp_path, GOOD))
    assert chip.implied_peak_flops_per_s == 2 * 4 * 128 * 128 * 1.0e9


def _drop_tensor(d):
    del d["tensor_units"]


def _zero_tensor_count(d):
    d["tensor_units"]["count"] = 0


def _negative_hbm_bw(d):
    d["hbm_bandwidth_bytes_per_s"] = -1.0e12


def _unknown_key(d):
    d["hbm_bandwith_bytes_per_s"] = 1.0e12


def _unknown_precision(d):
    d["peak_flops_per_s"]["fp4"] = 1.0e15


def _zero_devices_not_last(d):
    d["links"][0]["devices"] = 0


def _levels_not_increasing(d):
    d["links"].insert(1, {"name": "rack", "devices": 4, "bandwidth_bytes_per_s": 50.0e9,
                          "latency_s": 2.0e-6})
    d["links"][2]["devices"] = 16


def _levels_decreasing(d):
    d["links"].insert(1, {"name": "rack", "devices": 2, "bandwidth_bytes_per_s": 50.0e9,
                          "latency_s": 2.0e-6})


def _links_not_list(d):
    d["links"] = d["links"][0]


def _negative_register_file(d):
    d["register_file_bytes"] = -262144


def _node_past_the_tables(d):
    d["process_node_nm"] = 28       # area.py's tables stop at 16 nm: no extrapolation without a source


@pytest.mark.parametrize("mutate, field", [
    (_drop_tensor, "tensor_units"),
    (_zero_tensor_count, "tensor_units.count"),
    (_negative_hbm_bw, "hbm_bandwidth_bytes_per_s"),
    (_unknown_key, "hbm_bandwith_bytes_per_s"),
    (_unknown_precision, "peak_flops_per_s.fp4"),
    (_zero_devices_not_last, "links[0].devices"),
    (_levels_not_increasing, "links[1].devices"),
    (_levels_decreasing, "links[1].devices"),
    (_links_not_list, "links"),
    (_negative_register_file, "register_file_bytes"),
    (_node_past_the_tables, "process_node_nm"),
])
def test_bad_chip_yaml_names_path_and_field(tmp_path, mutate, field):
    data = copy.deepcopy(GOOD)
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_chip(path)
    message = str(info.value)
    assert str(path) in message
    assert f"field '{field}'" in message
    assert info.value.field == field


def test_unknown_arch_lists_shipped_names():
    with pytest.raises(ConfigError) as info:
        load_chip("no-such-chip")
    message = str(info.value)
    assert "no-such-chip" in message
    for name in SHIPPED:
        assert name in message


@pytest.mark.parametrize("typed, meant", [("h100", "h100-sxm"), ("tpu4", "tpuv4"), ("a100-80", "a100-80gb")])
def test_unknown_arch_suggests_the_nearest(typed, meant):
    with pytest.raises(ConfigError) as info:
        load_chip(typed)
    assert "did you mean" in str(info.value) and repr(meant) in str(info.value).split("shipped:")[0]


def test_name_lookup_lives_in_configio():
    """Issue 23: arch and system find shipped names through configio, not through workload."""
    import ast
    for module in ("arch", "system"):
        tree = ast.parse((Path(__file__).parents[1] / "phaze" / f"{module}.py").read_text())
        imported = {(node.module, a.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    for a in node.names}
        assert ("configio", "resolve_config") in imported and ("workload", "resolve_config") not in imported


def test_the_accepted_nodes_are_the_ones_every_node_table_gives():
    """A chip file's or sweep's node must lie where every one of area.py's node tables has a public
    figure (phaze.arch.NODE_RANGE_NM): the range's ends are each table's first and last node."""
    from phaze import area
    from phaze.arch import NODE_RANGE_NM
    tables = (area.LOGIC_MTR_PER_MM2, area.SRAM_BITCELL_UM2, area.WAFER_USD, area.DEFECTS_PER_CM2, area.NODE_SPEED)
    assert all((min(t), max(t)) == NODE_RANGE_NM for t in tables)
    assert all(NODE_RANGE_NM[0] <= load_chip(n).process_node_nm <= NODE_RANGE_NM[1] for n in SHIPPED)
