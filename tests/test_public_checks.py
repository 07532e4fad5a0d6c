"""The figures docs/validation.md quotes from tests/bench/bench_public_checks.py (published runs
outside the bundled sets, scored with the shipped calibration) are the ones the script computes."""
import importlib.util
from pathlib import Path

from phaze.calibrate import load_default_params

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_public_checks",
                                                  ROOT / "tests" / "bench" / "bench_public_checks.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def _signed(x: float, digits: int = 1) -> str:
    """A signed percentage as the docs write it (a true minus sign)."""
    return f"{100 * x:+.{digits}f}".replace("-", "\u2212")


def test_the_figures_validation_md_quotes():
    bench, params = _bench(), load_default_params()
    doc = " ".join((ROOT / "docs" / "validation.md").read_text().split())
    a, b, c = (e for _, e, _ in bench.llama3(params, ""))
    assert f"the standard columns only: {_signed(a)}, {_signed(b)} and {_signed(c)} %" in doc
    a, b, c = (e for _, e, _ in bench.llama3(params, "torchtitan"))
    assert f"but is not it: {_signed(a, 0)}, {_signed(b, 0)} and {_signed(c, 0)} %" in doc
    a, b, c = (e for _, e, _ in bench.mtnlg(params, ""))
    assert f"the standard columns only: {_signed(a)}, {_signed(b)} and {_signed(c)} %;" in doc
    a, b, c = (e for _, e, _ in bench.mtnlg(params, "megatron-deepspeed"))
    assert f"with `framework` megatron-deepspeed: {_signed(a)}, {_signed(b)} and {_signed(c)} %" in doc
    (c, f), (pc, pf) = bench.mtnlg_split(params)
    assert (f"measured c = {1e3 * c:.0f} ms and F = {f:.1f} s, phaze c = {1e3 * pc:.0f} ms and "
            f"F = {pf:.1f} s") in doc
    (step, plain, said), (_, core, said2) = bench.llama1(params), bench.llama1(params, "megatron-core")
    assert said.startswith("tp=8,pp=1,mbs=8,recompute=none,") and said2.startswith("tp=8,pp=4,mbs=4,recompute=none,")
    assert (f"{step:.2f} s a step of 2,048 sequences" in doc and f"{_signed(plain)} % with the standard columns "
            f"only" in doc and f"{_signed(core)} % with `framework` megatron-core" in doc)
    (_, block, clock), (_, seq, clock2) = bench.palm(params)
    assert (f"{_signed(block)} % with its parallel block, {_signed(seq)} % run as sequential layers (both at "
            f"{100 * clock:.0f} % of the nominal clock") in doc and round(100 * clock) == round(100 * clock2)
    measured, rows = bench.deepseek_v3(params)
    (_, exposed, gib, fits, _), (_, overlapped, gib2, _, _), (_, e2, old, fits2, _), (_, o2, old2, _, _) = rows
    assert not fits and not fits2 and gib == gib2 and old == old2 and gib < old
    assert f"{measured:.2f} s a step of 15,360 sequences" in doc
    assert (f"{_signed(exposed)} % with the all-to-alls exposed and {_signed(overlapped)} % with its paired "
            f"chunks overlapping them, and {gib:.1f} GiB a device") in doc
    assert f"binding stage: {_signed(e2)} and {_signed(o2)} % with {old:.1f} GiB" in doc
