"""Operator graphs: FLOPs against published closed forms, DAG structure, tensor-parallel splits."""
import pytest

from phaze.graph import edge_graph, layer_graph, tensor_flops
from phaze.plan import Plan
from phaze.step import _hardware_flops_per_sample, model_flops_per_sample
from phaze.workload import load_model, narayanan_flops_per_step


@pytest.fixture(scope="module")
def gpt3():
    return load_model("gpt3-175b")


def test_gpt3_flops_per_step_match_narayanan(gpt3):
    B = 1536
    ours = model_flops_per_sample(gpt3) * B
    assert ours == pytest.approx(narayanan_flops_per_step(gpt3, B), rel=0.01)


def test_gpt3_full_recompute_flops_match_narayanan(gpt3):
    B = 1536
    ours = _hardware_flops_per_sample(gpt3, Plan(recompute="full")) * B
    assert ours == pytest.approx(narayanan_flops_per_step(gpt3, B, full_recompute=True), rel=0.01)


def test_narayanan_formula_by_hand():
    # eq. (3) of Narayanan et al. for a tiny made-up model, expanded by hand
    from phaze.workload import Model
    m = Model(name="t", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=1000, seq_len=128)
    B, s, l, h, V = 3, 128, 2, 64, 1000
    by_hand = 72 * B * s * l * h * h + 12 * B * s * s * l * h + 6 * B * s * h * V
    assert narayanan_flops_per_step(m, B) == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize("attention", ["standard", "flash"])
@pytest.mark.parametrize("sp", [False, True])
def test_backward_is_twice_forward_and_tp_splits_flops(gpt3, attention, sp):
    g1 = layer_graph(gpt3, 2, 1, False, "standard", "none")
    f1 = tensor_flops(g1.fwd)
    assert tensor_flops(g1.bwd) == pytest.approx(2 * f1)
    for t in (2, 4, 8):
        gt = layer_graph(gpt3, 2, t, sp, "standard", "none")
        assert tensor_flops(gt.fwd) * t == pytest.approx(f1)
    gf = layer_graph(gpt3, 2, 8, sp, attention, "none")
    # a layer's forward GEMM FLOPs by hand: 24*T*h^2 + 4*T*s*h, split over 8
    T, h, s = 2 * 2048, 12288, 2048
    assert tensor_flops(gf.fwd) * 8 == pytest.approx(24 * T * h * h + 4 * T * s * h)


def test_dag_deps_point_backwards_and_names_unique(gpt3):
    for sp in (False, True):
        for rc in ("none", "selective", "op", "full"):
            g = layer_graph(gpt3, 1, 4, sp, "standard", rc)
            for phase in (g.fwd, g.bwd):
                seen = set()
                for op in phase:
                    assert op.name not in seen
                    assert set(op.deps) <= seen, (op.name, op.deps)
                    seen.add(op.name)


def test_every_weighted_gemm_has_dgrad_and_wgrad(gpt3):
    g = layer_graph(gpt3, 1, 1, False, "standard", "none")
    names = {o.name for o in g.bwd}
    for w in ("qkv", "attn_out", "ffn_up", "ffn_down"):
        assert f"{w}.dgrad" in names and f"{w}.wgrad" in names


def test_tensor_parallel_collectives(gpt3):
    b, s, h, p = 1, 2048, 12288, 2
    g = layer_graph(gpt3, b, 8, False, "standard", "none")
    fwd = [o.collective for o in g.fwd if o.collective]
    bwd = [o.collective for o in g.bwd if o.collective]
    assert [c.kind for c in fwd] == ["all_reduce", "all_reduce"]
    assert [c.kind for c in bwd] == ["all_reduce", "all_reduce"]
    assert all(c.bytes == p * b * s * h for c in fwd + bwd)
    g = layer_graph(gpt3, b, 8, True, "standard", "none")
    kinds = sorted(o.collective.kind for o in g.fwd if o.collective)
    assert kinds == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
    assert not [o for o in layer_graph(gpt3, b, 1, False).ops if o.collective]


def test_recompute_adds_forward_work(gpt3):
    base = tensor_flops(layer_graph(gpt3, 1, 1, False, "standard", "none").bwd)
    fwd = tensor_flops(layer_graph(gpt3, 1, 1, False, "standard", "none").fwd)
    full = tensor_flops(layer_graph(gpt3, 1, 1, False, "standard", "full").bwd)
    sel = tensor_flops(layer_graph(gpt3, 1, 1, False, "standard", "selective").bwd)
    assert full == pytest.approx(base + fwd)
    s, h = 2048, 12288
    assert sel == pytest.approx(base + 4 * s * s * h)  # scores + context re-run


def test_gqa_and_swiglu_shapes():
    m = load_model("llama2-70b")
    g = layer_graph(m, 1, 8, True, "flash", "none")
    qkv = next(o for o in g.fwd if o.name == "qkv")
    assert qkv.gemm[3] == (8192 + 2 * 8 * 128) // 8
    up = next(o for o in g.fwd if o.name == "ffn_up")
    assert up.gemm[3] == 2 * 28672 // 8


def test_logits_flops(gpt3):
    e = edge_graph(gpt3, 1, 1, False)
    T, h, V = 2048, 12288, 50257
    assert tensor_flops(e["head"]) == pytest.approx(3 * 2 * T * h * V)


@pytest.mark.parametrize("tp, sp", [(1, False), (8, True)])
def test_per_op_recompute_reruns_k_o_and_up_of_swiglu_by_hand(tp, sp):
    """torchtitan's per-op policy: of the matmuls q, k, v, o, gate, up, down the even-numbered
    (k, o, up) are re-run, with every element-wise op; attention and the other matmuls are saved."""
    m = load_model("llama3-8b")   # h 4096, 32 heads, 8 kv heads of 128, SwiGLU ffn 14336
    T, h, kv, f = 8192, 4096, 1024, 14336
    none = layer_graph(m, 1, tp, sp, "flash2", "none")
    op = layer_graph(m, 1, tp, sp, "flash2", "op")
    rerun = [o for o in op.bwd if o.name.startswith("recompute.")]
    assert tensor_flops(op.bwd) - tensor_flops(none.bwd) == pytest.approx(2 * T * h * (kv + h + f) / tp)
    assert not any(o.core_attention for o in rerun)
    assert {o.name for o in rerun if o.unit == "vector"} == {
        "recompute." + x for x in ("ln1", "attn_residual", "ln2", "swiglu", "ffn_residual")}
    gathers = [o.collective.kind for o in rerun if o.collective]
    assert gathers == (["all_gather", "all_gather"] if sp else [])


def test_per_op_recompute_of_an_ungated_ffn_reruns_the_down_projection(gpt3):
    none = layer_graph(gpt3, 1, 1, False, "flash", "none")
    op = layer_graph(gpt3, 1, 1, False, "flash", "op")
    T, h = 2048, 12288                              # q, k, v, o, up (4h), down: k, o and down re-run
    assert tensor_flops(op.bwd) - tensor_flops(none.bwd) == pytest.approx(2 * T * h * (h + h + 4 * h))
    full = layer_graph(gpt3, 1, 1, False, "flash", "full")
    assert tensor_flops(none.bwd) < tensor_flops(op.bwd) < tensor_flops(full.bwd)
