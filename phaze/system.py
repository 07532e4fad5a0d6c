"""Clusters: the nodes, NICs and fabric a chip is deployed in, apart from the chip itself.

A :class:`System` says how many devices share a node and its intra-node links, how many NICs of
what speed join the nodes, and the fabric's topology. :func:`apply_system` turns it into the
chip's link levels, so every cost function stays a pure function of the :class:`~phaze.arch.Chip`
(caches keyed on it keep working). Without a system, a chip keeps the links of its own file.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .arch import Chip, LinkLevel
from .configio import ConfigError, Fields, config_dirs, read_mapping, resolve_config

TOPOLOGIES = ("fat-tree", "oversubscribed")


@dataclass(frozen=True)
class System:
    """``devices_per_node`` devices per node over an intra-node level (``None``: the chip's first
    link level), ``nics_per_node`` NICs of ``nic_bandwidth_bytes_per_s`` each per direction
    between nodes. An accelerator pod's slices are nodes too: ``devices_per_node`` chips of one
    slice over its chip-to-chip links, the slices joined by a data-centre network quoted per chip
    (``bandwidth_bits_per_s_per_device`` in the file: one "NIC" per device), so data parallelism
    over slices is costed on it. ``fat-tree``: full bisection across the cluster; ``oversubscribed``: full
    bandwidth within groups of ``leaf_nodes`` nodes, divided by ``oversubscription`` above."""

    name: str
    devices_per_node: int
    nics_per_node: int
    nic_bandwidth_bytes_per_s: float
    inter_node_latency_s: float
    inter_node_name: str = "network"
    intra_node_name: str = ""
    intra_node_bandwidth_bytes_per_s: float | None = None
    intra_node_latency_s: float | None = None
    topology: str = "fat-tree"
    leaf_nodes: int = 0
    oversubscription: float = 1.0

    @property
    def inter_node_bandwidth_bytes_per_s(self) -> float:
        """Per device and direction: the node's NIC bandwidth shared by its devices."""
        return self.nics_per_node * self.nic_bandwidth_bytes_per_s / self.devices_per_node

    def levels(self, chip: Chip) -> tuple[LinkLevel, ...]:
        """The link levels of ``chip`` in this system, lowest first."""
        first = chip.links[0]
        intra = LinkLevel(
            self.intra_node_name or first.name, self.devices_per_node,
            first.bandwidth_bytes_per_s if self.intra_node_bandwidth_bytes_per_s is None
            else self.intra_node_bandwidth_bytes_per_s,
            first.latency_s if self.intra_node_latency_s is None else self.intra_node_latency_s)
        bw, lat = self.inter_node_bandwidth_bytes_per_s, self.inter_node_latency_s
        if self.topology == "fat-tree":
            return intra, LinkLevel(self.inter_node_name, 0, bw, lat)
        return (intra, LinkLevel(f"{self.inter_node_name}-leaf", self.leaf_nodes * self.devices_per_node, bw, lat),
                LinkLevel(f"{self.inter_node_name}-spine", 0, bw / self.oversubscription, lat))

    def describe(self) -> str:
        """One line: nodes, NICs and topology."""
        top = ("full-bisection fat tree" if self.topology == "fat-tree" else
               f"full bandwidth within {self.leaf_nodes} nodes, {self.oversubscription:g}:1 oversubscribed above")
        if self.nics_per_node == self.devices_per_node:
            return (f"{self.devices_per_node} devices per node (or slice), "
                    f"{self.nic_bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s per device "
                    f"({self.inter_node_bandwidth_bytes_per_s / 1e9:g} GB/s per direction), {top}")
        return (f"{self.devices_per_node} devices per node, {self.nics_per_node} x "
                f"{self.nic_bandwidth_bytes_per_s * 8 / 1e9:g} Gb/s NICs per node "
                f"({self.inter_node_bandwidth_bytes_per_s / 1e9:g} GB/s per device and direction), {top}")


def apply_system(chip: Chip, system: System | None) -> Chip:
    """A copy of ``chip`` whose links are the system's levels (``chip`` itself for ``None``)."""
    return chip if system is None else replace(chip, links=system.levels(chip))


def _check_count(value, source: str) -> None:
    """A count of NICs or devices per node: a whole number of at least one, else one clear error."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(source, None, f"must be a positive integer, got {value!r}")


def with_nics(system: System, nics_per_node: int, source: str = "--nics-per-node") -> System:
    """The system with another NIC count per node."""
    _check_count(nics_per_node, source)
    return replace(system, nics_per_node=nics_per_node)


def with_devices_per_node(system: System, devices_per_node: int, source: str = "--devices-per-node") -> System:
    """The system with another node (or pod slice) size. A network quoted per device keeps its
    bandwidth per device (one "NIC" each); a node's NICs are shared by its new device count."""
    _check_count(devices_per_node, source)
    per_device = system.nics_per_node == system.devices_per_node
    return replace(system, devices_per_node=devices_per_node,
                   nics_per_node=devices_per_node if per_device else system.nics_per_node)


def _system_from_yaml(data: dict, source: str) -> System:
    f = Fields(data, source)
    name, per_node = f.str("name"), f.int("devices_per_node")
    intra = f.sub("intra_node", None)
    intra_kw = {}
    if intra is not None:
        intra_kw = dict(intra_node_name=intra.str("name", ""),
                        intra_node_bandwidth_bytes_per_s=intra.number("bandwidth_bytes_per_s", None),
                        intra_node_latency_s=intra.number("latency_s", None, inclusive=True))
        intra.finish()
    inter = f.sub("inter_node")
    per_device = inter.number("bandwidth_bits_per_s_per_device", None)
    if per_device is not None:
        # a data-centre network quoted per chip (slices of an accelerator pod): one "NIC" per device
        if inter._get("nics_per_node", None) is not None or inter._get("nic_bandwidth_bits_per_s", None) is not None:
            raise inter.error("bandwidth_bits_per_s_per_device", "give either it or nics_per_node with "
                              "nic_bandwidth_bits_per_s, not both")
        nics, nic_bw = per_node, per_device / 8.0
    else:
        nics, nic_bw = inter.int("nics_per_node"), inter.number("nic_bandwidth_bits_per_s") / 8.0
    inter_kw = dict(inter_node_name=inter.str("name", "network"), nics_per_node=nics,
                    nic_bandwidth_bytes_per_s=nic_bw, inter_node_latency_s=inter.number("latency_s", inclusive=True))
    inter.finish()
    top = f.sub("topology", None)
    top_kw = {}
    if top is not None:
        kind = top.choice("kind", TOPOLOGIES, "fat-tree")
        top_kw = dict(topology=kind)
        if kind == "oversubscribed":
            top_kw.update(leaf_nodes=top.int("leaf_nodes", minimum=2),
                          oversubscription=top.number("oversubscription", minimum=1.0, inclusive=True))
        top.finish()
    f.finish()
    return System(name=name, devices_per_node=per_node, **intra_kw, **inter_kw, **top_kw)


def system_dirs() -> list[Path]:
    """Where system names are looked up: ./system_configs, then the shipped ones."""
    return config_dirs("system_configs")


def load_system(name_or_path: str | Path) -> System:
    """Load a system by shipped name (``dgx-a100-superpod``) or YAML path."""
    path = resolve_config(str(name_or_path), "system_configs", "system", "--system")
    return _system_from_yaml(read_mapping(path), str(path))


def as_system(system: str | Path | System | None) -> System | None:
    """A system from a name, a path or itself; ``None`` stays ``None`` (the chip file's links)."""
    if system is None or isinstance(system, System):
        return system
    return load_system(system)


def system_note(system: System | None, chip: Chip, devices: int) -> str:
    """The ``system`` line of the printed assumptions."""
    links = ", then ".join(f"{lv.name} ({lv.bandwidth_bytes_per_s / 1e9:g} GB/s per chip and direction"
                           + (f", {lv.devices}-chip groups)" if lv.devices else ", the whole cluster)")
                           for lv in chip.links)
    if system is None:
        return f"the chip file's links (--system sets a cluster): {devices} chips over {links}"
    return f"{system.name}: {devices} chips, {system.describe()}; over {links}"
