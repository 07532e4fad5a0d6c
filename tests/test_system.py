"""Clusters apart from chips (``phaze.system``): the loader, what a system changes in a chip,
collectives across nodes on a slower fabric, and ``--system`` / ``system=`` / ``system:`` /
``system_config`` through the CLI, the API, sweeps and validation."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

import pytest
import yaml
from conftest import SMALL_SWEEP

import phaze
from phaze import validate as v
from phaze.arch import LinkLevel, load_chip
from phaze.candidate import evaluate_chip
from phaze.configio import ConfigError
from phaze.cost import collective_time
from phaze.runs import EXPLICIT_COLUMNS, REQUIRED_COLUMNS, Skipped, row_to_case
from phaze.space import load_sweep
from phaze.system import System, apply_system, load_system, with_devices_per_node

ROOT = Path(__file__).resolve().parent.parent
NCCL_START = 14e-6   # the A100 chip file's fixed start-up of one NCCL collective (NCCL's LL128 ring base latency)
SHIPPED = ("dgx-a100-superpod", "dgx-h100-superpod", "cluster-100g")
SMALL_RUN = ["--workload", "mpt-125m", "--arch", "a100-80gb", "--devices", "16", "--global-batch", "32"]
DGX = {"name": "test-pod", "devices_per_node": 8,
       "inter_node": {"nics_per_node": 8, "nic_bandwidth_bits_per_s": 200e9, "latency_s": 4e-6}}


def phaze_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phaze.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def write(tmp_path: Path, data: dict, name: str = "system.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


# --- the loader ----------------------------------------------------------------------------------
def test_shipped_systems_load_with_their_published_numbers():
    a, h, g = (load_system(n) for n in SHIPPED)
    assert (a.devices_per_node, a.nics_per_node, a.nic_bandwidth_bytes_per_s) == (8, 8, 200e9 / 8)
    assert a.intra_node_bandwidth_bytes_per_s == 300e9 and a.inter_node_bandwidth_bytes_per_s == 25e9
    assert h.intra_node_bandwidth_bytes_per_s == 450e9 and h.inter_node_bandwidth_bytes_per_s == 50e9
    assert g.intra_node_bandwidth_bytes_per_s is None                 # the chip's own links inside
    assert g.inter_node_bandwidth_bytes_per_s == g.nics_per_node * 100e9 / 8 / 8
    assert {s.topology for s in (a, h, g)} == {"fat-tree"}


BAD = [
    (dict(DGX, devices_per_node=0), "devices_per_node", "positive integer"),
    (dict(DGX, inter_node={"nics_per_node": 8, "latency_s": 4e-6}), "inter_node.nic_bandwidth_bits_per_s",
     "missing"),
    (dict(DGX, inter_node=dict(DGX["inter_node"], nic_bandwidth_bits_per_s=-1)),
     "inter_node.nic_bandwidth_bits_per_s", "> 0"),
    (dict(DGX, topology={"kind": "torus"}), "topology.kind", "fat-tree, oversubscribed"),
    (dict(DGX, topology={"kind": "oversubscribed", "oversubscription": 2}), "topology.leaf_nodes", "missing"),
    (dict(DGX, topology={"kind": "oversubscribed", "leaf_nodes": 4, "oversubscription": 0.5}),
     "topology.oversubscription", ">= 1"),
    (dict(DGX, nics=8), "nics", "unknown key"),
]


@pytest.mark.parametrize("data,field,words", BAD)
def test_bad_system_files_name_file_and_field(tmp_path, data, field, words):
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as e:
        load_system(path)
    assert e.value.source == str(path) and e.value.field == field and words in e.value.message
    assert "\n" not in str(e.value)


def test_unknown_system_lists_the_shipped_ones():
    with pytest.raises(ConfigError) as e:
        load_system("dgx-z100")
    assert e.value.source == "--system" and all(n in e.value.message for n in SHIPPED)


def test_cli_errors_are_one_line_exit_2_fast(tmp_path):
    bad = write(tmp_path, dict(DGX, devices_per_node="eight"))
    cases = [(["--system", "dgx-z100"], "unknown system"),
             (["--system", str(bad)], "devices_per_node"),
             (["--system", str(tmp_path / "missing.yaml")], "file not found"),
             (["--system", ""], "--system"),
             (["--nics-per-node", "2"], "needs --system"),
             (["--devices-per-node", "2"], "needs --system"),
             (["--system", "cluster-100g", "--devices-per-node", "-1"], "--devices-per-node"),
             (["--system", "cluster-100g", "--nics-per-node", "0"], "--nics-per-node")]
    for extra, words in cases:
        t0 = time.monotonic()
        r = phaze_cli(tmp_path, "evaluate", *SMALL_RUN, *extra)
        assert time.monotonic() - t0 < 10
        assert r.returncode == 2 and r.stdout == "", (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert words in r.stderr, (extra, r.stderr)


# --- what a system changes -----------------------------------------------------------------------
@pytest.mark.parametrize("name", SHIPPED)
def test_apply_system_changes_exactly_the_links(name):
    chip, system = load_chip("a100-80gb"), load_system(name)
    got = apply_system(chip, system)
    for f in fields(chip):
        if f.name != "links":
            assert getattr(got, f.name) == getattr(chip, f.name), f.name
    assert got.links == system.levels(chip)
    assert got.links[0].devices == 8 and got.links[-1].devices == 0
    assert got.links[-1].bandwidth_bytes_per_s == system.inter_node_bandwidth_bytes_per_s
    assert apply_system(chip, None) is chip


def test_dgx_superpods_reproduce_the_chip_files():
    """The shipped DGX systems are the clusters the GPU chip files describe: no number moves."""
    assert apply_system(load_chip("a100-80gb"), load_system("dgx-a100-superpod")) == load_chip("a100-80gb")
    assert apply_system(load_chip("h100-sxm"), load_system("dgx-h100-superpod")) == load_chip("h100-sxm")


def test_oversubscribed_fabric_is_an_extra_level(tmp_path):
    s = load_system(write(tmp_path, dict(DGX, topology={"kind": "oversubscribed", "leaf_nodes": 4,
                                                        "oversubscription": 2})))
    chip = apply_system(load_chip("a100-80gb"), s)
    assert [(lv.devices, lv.bandwidth_bytes_per_s) for lv in chip.links] == [(8, 300e9), (32, 25e9), (0, 12.5e9)]
    # 64 GPUs over 2 leaves: the spine carries 1/32 of the buffer at half the leaf bandwidth
    nbytes = 1e9
    want = (NCCL_START + 2 * (7 / 8 * nbytes / 300e9 + 7 * 1.9e-6) + 2 * (3 / 4 * nbytes / 8 / 25e9 + 3 * 4e-6)
            + 2 * (1 / 2 * nbytes / 32 / 12.5e9 + 1 * 4e-6))
    assert collective_time("all_reduce", nbytes, 64, chip) == pytest.approx(want, rel=1e-12)


def test_all_reduce_across_two_nodes_by_hand():
    """16 GPUs on 2 nodes: a ring in each node over NVLink, then the 1/8 shard between the nodes."""
    a100 = load_chip("a100-80gb")
    slow = apply_system(a100, load_system("cluster-100g"))     # 4 x 100 Gb/s per 8 GPUs: 6.25 GB/s
    fast = apply_system(a100, load_system("dgx-a100-superpod"))  # 8 x 200 Gb/s per 8 GPUs: 25 GB/s
    nbytes = 1e9
    nvlink = NCCL_START + 2 * (7 / 8 * nbytes / 300e9 + 7 * 1.9e-6)
    assert collective_time("all_reduce", nbytes, 16, slow) == pytest.approx(
        nvlink + 2 * (1 / 2 * nbytes / 8 / 6.25e9 + 4e-6), rel=1e-12)
    assert collective_time("all_reduce", nbytes, 16, fast) == pytest.approx(
        nvlink + 2 * (1 / 2 * nbytes / 8 / 25e9 + 4e-6), rel=1e-12)
    # one GPU per node (stride 8): all inter-node; bandwidth-bound, the slower fabric is slower by
    # the bandwidth ratio 25 / 6.25 = 4
    t_slow, t_fast = (collective_time("all_reduce", 8e9, 2, c, stride=8) for c in (slow, fast))
    assert t_slow / t_fast == pytest.approx(4.0, rel=1e-4)
    # latency-bound (a few bytes): the same per-hop latency on both fabrics
    assert collective_time("all_reduce", 8, 2, slow, stride=8) == pytest.approx(
        collective_time("all_reduce", 8, 2, fast, stride=8), rel=1e-3)


# --- the CLI and the API -------------------------------------------------------------------------
def test_evaluate_with_a_system_end_to_end(tmp_path):
    plan = ["--plan", "tp=1,pp=1,mbs=2"]
    runs = {s: phaze_cli(tmp_path, "evaluate", *SMALL_RUN, *plan, "--format", "json", *s)
            for s in ((), ("--system", "cluster-100g"), ("--system", "dgx-a100-superpod"),
                      ("--system", "cluster-100g", "--nics-per-node", "1"))}
    out = {}
    for s, r in runs.items():
        assert r.returncode == 0, r.stderr
        out[s] = json.loads(r.stdout)
    default, slow, dgx, slower = out.values()
    assert default["assumptions"]["system"].startswith("the chip file's links")
    assert slow["assumptions"]["system"].startswith("cluster-100g: 16 chips")
    assert "6.25 GB/s" in slow["assumptions"]["system"]
    assert "1 x 100 Gb/s" in slower["assumptions"]["system"]
    assert dgx["step_time_s"] == default["step_time_s"]
    assert default["step_time_s"] < slow["step_time_s"] < slower["step_time_s"]
    text = phaze_cli(tmp_path, "evaluate", *SMALL_RUN, *plan, "--system", "cluster-100g")
    assert text.returncode == 0 and "system             cluster-100g: 16 chips" in text.stdout


def test_devices_per_node_resizes_a_pods_slices(tmp_path):
    """Two 64-chip TPU v5p slices: 25 Gbit/s of DCN per chip kept, data parallelism over DCN."""
    run = ("evaluate", "--workload", "mpt-1b", "--arch", "tpuv5p", "--devices", "128", "--global-batch", "256",
           "--plan", "tp=1,pp=1,mbs=2,zero=3,recompute=full", "--system", "tpuv5p-multislice", "--format", "json")
    one, two = (json.loads(ok.stdout) for ok in (phaze_cli(tmp_path, *run), phaze_cli(tmp_path, *run,
                                                                                     "--devices-per-node", "64")))
    for out, n in ((one, 256), (two, 64)):
        assert out["assumptions"]["system"].startswith(f"tpuv5p-multislice: 128 chips, {n} devices per node (or "
                                                       f"slice), 25 Gb/s")
    assert two["step_time_s"] > one["step_time_s"]      # the second slice's share crosses DCN


def test_place_with_a_system(tmp_path):
    r = phaze_cli(tmp_path, "place", *SMALL_RUN, "--tp", "1", "--mbs", "2", "--recompute", "none",
                  "--pp", "1", "--top", "1", "--format", "json", "--system", "cluster-100g")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["assumptions"]["system"].startswith("cluster-100g")
    api = phaze.place("mpt-125m", "a100-80gb", 16, 32, tp=1, mbs=2, recompute="none", pp=1, top=1,
                      system="cluster-100g")
    assert api.best.result.step_time_s == pytest.approx(out["best"]["step_time_s"], rel=1e-12)
    default = phaze.place("mpt-125m", "a100-80gb", 16, 32, tp=1, mbs=2, recompute="none", pp=1, top=1)
    assert api.best.result.step_time_s > default.best.result.step_time_s


def test_api_evaluate_takes_a_name_a_path_or_a_system(tmp_path):
    args = ("mpt-125m", "a100-80gb", 16, 32, "tp=1,mbs=2")
    by_name = phaze.evaluate(*args, system="cluster-100g").step_time_s
    assert phaze.evaluate(*args, system=ROOT / "system_configs" / "cluster-100g.yaml").step_time_s == by_name
    assert phaze.evaluate(*args, system=load_system("cluster-100g")).step_time_s == by_name
    assert phaze.evaluate(*args).step_time_s < by_name
    with pytest.raises(ConfigError) as e:
        phaze.evaluate(*args, system="nosuch")
    assert e.value.source == "system"


# --- sweeps -----------------------------------------------------------------------------------------
def _sweep(tmp_path, **changes) -> Path:
    cfg = dict(SMALL_SWEEP, **changes)
    cfg["workloads"] = [dict(cfg["workloads"][0], devices=16, global_batch=32)]
    return write(tmp_path, cfg, "sweep.yaml")


def test_a_sweep_with_a_system(tmp_path):
    plain = load_sweep(_sweep(tmp_path))
    cfg = load_sweep(_sweep(tmp_path, system="cluster-100g"))
    assert plain.workloads[0].system is None and cfg.workloads[0].system == load_system("cluster-100g")
    assert cfg.fingerprint() != plain.fingerprint()
    slow = evaluate_chip(cfg.base, cfg.workloads)
    fast = evaluate_chip(plain.base, plain.workloads)
    assert slow.area_mm2 == fast.area_mm2                  # the chip's silicon is the chip's
    assert 0 < slow.throughput < fast.throughput
    # a workload entry names its own system over the sweep's
    raw = yaml.safe_load(_sweep(tmp_path, system="cluster-100g").read_text())
    raw["workloads"][0]["system"] = "dgx-a100-superpod"
    own = load_sweep(write(tmp_path, raw, "own.yaml"))
    assert own.workloads[0].system.name == "dgx-a100-superpod"
    assert evaluate_chip(own.base, own.workloads).throughput == pytest.approx(fast.throughput, rel=1e-12)


@pytest.mark.parametrize("changes,field,words", [
    ({"system": "nosuch"}, "system", "unknown system"),
    ({"system": "dgx-a100-superpod", "space": dict(SMALL_SWEEP["space"], link_bandwidth_gb_per_s=[100, 200])},
     "space.link_bandwidth_gb_per_s", "has no effect"),
])
def test_bad_sweep_systems_name_the_field(tmp_path, changes, field, words):
    with pytest.raises(ConfigError) as e:
        load_sweep(_sweep(tmp_path, **changes))
    assert e.value.field == field and words in e.value.message


# --- validation rows ---------------------------------------------------------------------------------
def _row(**changes) -> dict:
    r = {k: "" for k in REQUIRED_COLUMNS}
    r.update(run_id="X0001", source_id="S99_test", gpu="A100-SXM4-80GB", gpu_count="16", model="toy-gpt",
             layers="4", hidden="1024", heads="16", seq_len="2048", global_batch="32", tp="2", pp="1",
             micro_batch="1", precision="bf16", measured_metric="step_time_s", measured_value="1.0")
    r.update(changes)
    return r


def test_validation_rows_name_their_system():
    assert "system_config" in EXPLICIT_COLUMNS
    chips: dict = {}
    plain = row_to_case(_row(), chips)
    slow = row_to_case(_row(system_config="cluster-100g"), chips)
    again = row_to_case(_row(run_id="X0002", system_config="cluster-100g"), chips)
    assert plain.chip == load_chip("a100-80gb")
    assert slow.chip == apply_system(load_chip("a100-80gb"), load_system("cluster-100g"))
    assert again.chip is slow.chip and ("a100-80gb", "cluster-100g") in chips   # cached by (chip, system)
    assert v.predict_case(slow) > v.predict_case(plain)
    bad = row_to_case(_row(system_config="nosuch"))
    assert isinstance(bad, Skipped) and "system_config" in bad.reason and "unknown system" in bad.reason


def test_a_row_sets_its_slice_size_and_keeps_the_per_chip_network():
    """``devices_per_node`` resizes the row's system: 64-chip TPU v5p slices keep DCN's 25 Gbit/s
    per chip (a network quoted per device), a GPU node's NICs are shared by its new device count."""
    chips: dict = {}
    base = dict(gpu="TPUv5p", chip="tpuv5p", gpu_count="128", system_config="tpuv5p-multislice", tp="4", pp="1")
    c = row_to_case(_row(**base, devices_per_node="64"), chips)
    ici, dcn = c.chip.links
    assert (ici.name, ici.devices, ici.bandwidth_bytes_per_s) == ("ici", 64, 600e9)
    assert dcn.devices == 0 and dcn.bandwidth_bytes_per_s == pytest.approx(25e9 / 8)
    whole = row_to_case(_row(**base), chips)          # the file's 256-chip slices: one slice here
    assert whole.chip.links[0].devices == 256 and ("tpuv5p", "tpuv5p-multislice") in chips
    assert ("tpuv5p", "tpuv5p-multislice", 64) in chips
    assert v.predict_case(c) > v.predict_case(whole)    # the two slices' traffic crosses DCN
    with pytest.raises(ConfigError) as e:
        with_devices_per_node(load_system("cluster-100g"), 0)
    assert e.value.source == "--devices-per-node" and "positive integer" in str(e.value)
    gpu = with_devices_per_node(load_system("cluster-100g"), 4)
    old = load_system("cluster-100g")
    assert gpu.nics_per_node == old.nics_per_node
    assert gpu.inter_node_bandwidth_bytes_per_s == pytest.approx(
        old.inter_node_bandwidth_bytes_per_s * old.devices_per_node / 4)
    for bad, why in (("0", "positive integer"), ("64", "without one")):
        skipped = row_to_case(_row(**dict(base, system_config="" if bad == "64" else base["system_config"]),
                                     devices_per_node=bad))
        assert isinstance(skipped, Skipped) and "devices_per_node" in skipped.reason and why in skipped.reason


def test_intra_node_level_defaults_to_the_chips_first_link_level():
    s = load_system("cluster-100g")
    assert isinstance(s, System) and hash(s) == hash(replace(s))       # frozen: a cache key
    assert s.levels(load_chip("tpuv4"))[0] == LinkLevel("ici", 8, 268.55e9, 1e-6)
    assert s.levels(load_chip("h100-sxm"))[0] == LinkLevel("nvlink", 8, 450e9, 1.9e-6)
