from pathlib import Path

import pytest

from phaze.arch import Chip, LinkLevel, TensorUnits, VectorUnits

ROOT = Path(__file__).resolve().parent.parent


def toy_chip(**kw) -> Chip:
    """A small hand-checkable accelerator: 4 tensor units of 4x4, no fill/drain."""
    base = dict(
        name="toy", kind="accelerator", clock_hz=1.0e9,
        tensor=TensorUnits(count=4, rows=4, cols=4, tile_m=4, tile_n=4, fill_drain=False),
        vector=VectorUnits(count=2, lanes=8), local_sram_bytes=64 * 1024,
        shared_buffer_bytes=1 << 30, shared_buffer_bandwidth_bytes_per_s=1e15,
        hbm_bytes=16 << 30, hbm_bandwidth_bytes_per_s=1e15,
        links=(LinkLevel("fast", 4, 100e9, 1e-6), LinkLevel("slow", 0, 10e9, 1e-5)),
        execution="eager",   # its tests count the per-kernel overheads by hand
    )
    base.update(kw)
    return Chip(**base)


@pytest.fixture
def chip():
    return toy_chip()


@pytest.fixture(scope="module")
def llama():
    """Llama-3 8B (tests of ZeRO sharding and FSDP)."""
    from phaze.catalogue import load_model
    return load_model("llama3-8b")


@pytest.fixture(scope="module")
def dgx():
    """H100s in DGX nodes of 8 (NVLink), joined by InfiniBand."""
    from phaze.api import with_system
    from phaze.arch import load_chip
    return with_system(load_chip("h100-sxm"), "dgx-h100-superpod")


# A sweep over a GPU template (kernels run one after another: no CP-SAT solve) and a small model,
# so that each design of a test study evaluates in a fraction of a second.
SMALL_SWEEP = {
    "name": "tiny",
    "base": "a100-80gb",
    "workloads": [{"workload": "mpt-125m", "devices": 8, "global_batch": 16,
                   "placement": {"tp": [1], "mbs": [1, 2], "recompute": ["none"], "pp": [1]}}],
    "space": {"tensor_units": [27, 54, 108], "hbm_gib": [40, 80], "clock_ghz": 1.41},
    "constraints": {"area_mm2": 2000},
    "objectives": ["throughput", "area"],
    "sampler": "random",
    "trials": 4,
    "seed": 3,
    "baselines": ["a100-80gb"],
}


@pytest.fixture(autouse=True, scope="session")
def _every_schedule_checked():
    """The independent checker validates every schedule the tests produce in this process: each
    result of :func:`phaze.schedule.solve` (through which every layer schedule, placement and
    search goes) must satisfy precedence, modes and pool capacities."""
    from phaze import schedule
    from phaze.schedule_check import check_task_schedule
    original = schedule.solve

    def checked(tasks, capacities, **kw):
        s = original(tasks, capacities, **kw)
        problems = check_task_schedule(s, tasks, capacities)
        assert not problems, f"schedule checker: {problems[:3]}"
        return s

    schedule.solve = checked
    yield
    schedule.solve = original


# the files whose tests take longest (worker fleets, exact searches, Ctrl-C runs, reports; see
# `pytest --durations`), run first: pytest-xdist hands tests out in collection order, and a long test
# handed out last keeps one core busy after the other has finished
_LONG_FIRST = ("test_workers.py", "test_exact.py", "test_search.py", "test_report.py", "test_placement.py",
               "test_readme.py", "test_schedule.py")


def pytest_collection_modifyitems(config, items):
    """Order the long files first (:data:`_LONG_FIRST`), each file's tests in their own order."""
    rank = {name: i for i, name in enumerate(_LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
