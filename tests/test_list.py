"""``phaze list`` and :func:`phaze.shipped`: the names ``--workload``, ``--arch`` and ``--system``
take, each with what it describes, the local folders' files first."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

import phaze
from phaze.arch import load_chip
from phaze.catalogue import load_model
from phaze.cli import main
from phaze.configio import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def _csv(capsys, *argv) -> list[dict]:
    assert main(["list", *argv, "--format", "csv"]) == 0
    return list(csv.DictReader(io.StringIO(capsys.readouterr().out)))


def test_every_shipped_workload_is_listed_with_its_counts(capsys, monkeypatch, tmp_path):
    """One row a file of workloads/, by its file name, with the parameters, active parameters and
    shape its YAML gives (counted by the model, not copied from the file)."""
    monkeypatch.chdir(tmp_path)   # no ./workloads here
    rows = _csv(capsys, "workloads")
    assert [r["name"] for r in rows] == sorted(p.stem for p in (ROOT / "workloads").glob("*.yaml"))
    by = {r["name"]: r for r in rows}
    ds = load_model("deepseek-v3")
    assert (int(by["deepseek-v3"]["params"]), int(by["deepseek-v3"]["active_params"])) == \
        (ds.params, ds.active_params)
    assert (by["deepseek-v3"]["experts"], by["deepseek-v3"]["top_k"], by["llama3-8b"]["kv_heads"]) == ("256", "8", "8")
    assert by["nemotron-h-8b"]["layer_kinds"] == "M24 *4 -24" and by["llama3-8b"]["layer_kinds"] == ""
    assert main(["list", "workloads"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"{len(rows)} workloads; the name goes to --workload"
    assert any(line.startswith("deepseek-v3 ") and "256 experts, top-8" in line for line in out)


def test_chips_and_systems_are_listed_in_si_fields(capsys, monkeypatch, tmp_path):
    """Chips with their peak bf16 FLOP/s, HBM bytes and bandwidth as the chip files give them;
    systems with their node size and links."""
    monkeypatch.chdir(tmp_path)
    chips = {r["name"]: r for r in _csv(capsys, "chips")}
    h100 = load_chip("h100-sxm")
    assert float(chips["h100-sxm"]["peak_bf16_flops"]) == h100.peak_flops("bf16")
    assert float(chips["h100-sxm"]["hbm_bytes"]) == h100.hbm_bytes and chips["tpuv4"]["execution"] == "xla"
    systems = {r["name"]: r for r in _csv(capsys, "systems")}
    assert systems["dgx-h100-superpod"]["devices_per_node"] == "8"
    assert float(systems["dgx-h100-superpod"]["nic_bandwidth_bytes_per_s"]) == 50e9


def test_a_local_file_is_listed_and_hides_a_shipped_one_of_its_name(capsys, monkeypatch, tmp_path):
    """``./workloads/x.yaml`` is listed as the name ``--workload x`` reads, and one named like a
    shipped workload is the one listed (and read) in its place."""
    (tmp_path / "workloads").mkdir()
    text = "name: Mine\nlayers: 2\nhidden: 64\nheads: 4\nffn_hidden: 128\nvocab: 100\nseq_len: 32\n"
    (tmp_path / "workloads" / "mine.yaml").write_text(text)
    (tmp_path / "workloads" / "llama3-8b.yaml").write_text(text.replace("Mine", "Not Llama"))
    monkeypatch.chdir(tmp_path)
    assert phaze.shipped("workloads")["mine"] == tmp_path / "workloads" / "mine.yaml"
    by = {r["name"]: r for r in _csv(capsys, "workloads")}
    assert by["mine"]["model"] == "Mine" and by["llama3-8b"]["model"] == "Not Llama"


def test_an_unknown_kind_is_refused():
    """The library names its parameter; the command line its choices, exit 2."""
    with pytest.raises(ConfigError, match="kind.*workloads, chips, systems"):
        phaze.shipped("models")
    with pytest.raises(SystemExit) as exc:
        main(["list", "models"])
    assert exc.value.code == 2
