"""Operator graphs: FLOPs against published closed forms, DAG structure, tensor-parallel splits."""
from dataclasses import replace as dataclasses_replace

import pytest

from phaze.catalogue import load_model
from phaze.graph import ExpertLayout, edge_graph, layer_graph, tensor_flops
from phaze.plan import Plan
from phaze.step import _hardware_flops_per_sample, model_flops_per_sample
from phaze.workload import narayanan_flops_per_step


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


def test_geglu_is_swiglus_shapes_with_gelus_arithmetic():
    """GeGLU (Gemma's FFN) has SwiGLU's shapes: a gate and a value from the first linear, both read
    by the activation; its element-wise op is a tanh-form GELU (8 FLOPs) and the product (1), where
    SwiGLU's SiLU and product take 6. Every GEMM is the same, in both directions."""
    swiglu = load_model("llama2-7b")
    geglu = dataclasses_replace(swiglu, activation="geglu")
    a, b = layer_graph(swiglu, 1, 2, True, "flash", "full"), layer_graph(geglu, 1, 2, True, "flash", "full")
    for ops_a, ops_b in ((a.fwd, b.fwd), (a.bwd, b.bwd)):
        assert [o.gemm for o in ops_a if o.gemm] == [o.gemm for o in ops_b if o.gemm]
    act_a = next(o for o in a.fwd if o.name == "swiglu")
    act_b = next(o for o in b.fwd if o.name == "geglu")
    assert act_a.elements == act_b.elements == 4096 * 11008 // 2       # 4,096 tokens, tp 2
    assert (act_a.flops, act_b.flops) == (6 * act_a.elements, 9 * act_b.elements)
    assert (act_b.bytes_read, act_b.bytes_written) == (act_a.bytes_read, act_a.bytes_written) \
        == (2 * 2 * act_a.elements, 2 * act_a.elements)     # two 16-bit inputs read, one output written
    assert [o.name for o in b.bwd if "geglu" in o.name] == ["recompute.geglu", "geglu.bwd"]
    assert geglu.params == swiglu.params


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
    # the rotary embedding of q and k too: the attention reads its outputs, which are not saved
    assert {o.name for o in rerun if o.unit == "vector"} == {
        "recompute." + x for x in ("ln1", "q.rotary", "k.rotary", "attn_residual", "ln2", "swiglu", "ffn_residual")}
    gathers = [o.collective.kind for o in rerun if o.collective]
    assert gathers == (["all_gather", "all_gather"] if sp else [])


def test_per_op_recompute_of_an_ungated_ffn_reruns_the_down_projection(gpt3):
    none = layer_graph(gpt3, 1, 1, False, "flash", "none")
    op = layer_graph(gpt3, 1, 1, False, "flash", "op")
    T, h = 2048, 12288                              # q, k, v, o, up (4h), down: k, o and down re-run
    assert tensor_flops(op.bwd) - tensor_flops(none.bwd) == pytest.approx(2 * T * h * (h + h + 4 * h))
    full = layer_graph(gpt3, 1, 1, False, "flash", "full")
    assert tensor_flops(none.bwd) < tensor_flops(op.bwd) < tensor_flops(full.bwd)


def _fp8_model(casts: str):
    """A small dense fp8 model: hidden 256, 4 heads, 2 KV heads, SwiGLU FFN 512, 64 tokens."""
    from dataclasses import replace
    return replace(load_model("llama3-8b", 64), hidden=256, heads=4, kv_heads=2, head_dim=64, ffn_hidden=512,
                   v_head_dim=64, layers=2, vocab=1000, precision="fp8", fp8_casts=casts)


def _ops(g):
    return {o.name: o for o in g.fwd + g.bwd}


@pytest.mark.parametrize("tp", [1, 2])
def test_separate_fp8_casts_cast_every_linear_input_and_gradient_in_both_layouts(tp):
    # each linear: its input cast (read 2 B, write 1 B row-wise + 1 B column-wise per element)
    # before the GEMM, its output gradient cast the same way before dgrad and wgrad; gathers 16-bit
    m = _fp8_model("separate")
    T, h = 64, 256
    g = layer_graph(m, 1, tp, tp > 1, "flash", "none")
    ops = _ops(g)
    shapes = {"qkv": (h, (256 + 2 * 128) // tp), "attn_out": (256 // tp, h), "ffn_up": (h, 2 * 512 // tp),
              "ffn_down": (512 // tp, h)}
    for name, (K, N) in shapes.items():
        fwd, bwd = ops[f"{name}.fp8_cast"], ops[f"{name}.grad_fp8_cast"]
        assert (fwd.elements, fwd.bytes_read, fwd.bytes_written) == (T * K, 2 * T * K, 2 * T * K)
        assert (bwd.elements, bwd.bytes_read, bwd.bytes_written) == (T * N, 2 * T * N, 2 * T * N)
    assert not any("transpose" in n for n in ops)
    assert ops["ln1"].bytes_written == 2 * (T // tp) * h
    if tp > 1:
        assert ops["ln1.all_gather"].collective.bytes == 2 * T * h


def test_fused_fp8_casts_follow_transformer_engine_by_hand():
    # Transformer Engine 1.13 (layernorm_linear.py, linear.py, base.py) under sequence parallelism
    # over tp 2, 64 tokens, hidden 256: the norms before qkv and ffn_up write fp8 (1 B) and their
    # gathers move fp8; those linears have no cast of their own and transpose the gathered input
    # in the backward; the row-parallel linears cast their input row-wise only (1 B written) and,
    # in the backward, cast their local 32-token gradient before gathering it in fp8, then
    # transpose the gathered gradient and the saved input for the weight gradient
    m = _fp8_model("fused")
    T, Tn, h, p = 64, 32, 256, 2
    ops = _ops(layer_graph(m, 1, 2, True, "flash", "none"))
    for ln in ("ln1", "ln2"):
        assert ops[ln].bytes_written == Tn * h
        assert ops[f"{ln}.all_gather"].collective.bytes == T * h
        assert ops[f"{ln}.all_gather.bwd"].collective.bytes == p * T * h   # gradients stay 16-bit
    for name, K in (("qkv", h), ("ffn_up", h)):
        assert f"{name}.fp8_cast" not in ops
        assert ops[f"{name}.input_all_gather"].collective.bytes == T * h
        tr = ops[f"{name}.fp8_transpose"]
        assert (tr.elements, tr.bytes_read, tr.bytes_written) == (T * K, T * K, T * K)
        assert ops[f"{name}.wgrad"].deps == (f"{name}.fp8_transpose",)
        assert ops[f"{name}.grad_fp8_cast"].bytes_written == 2 * ops[f"{name}.grad_fp8_cast"].elements
    for name, K in (("attn_out", 128), ("ffn_down", 256)):
        cast = ops[f"{name}.fp8_cast"]
        assert (cast.elements, cast.bytes_read, cast.bytes_written) == (T * K, p * T * K, T * K)
        grad = ops[f"{name}.grad_fp8_cast"]
        assert (grad.elements, grad.bytes_read, grad.bytes_written) == (Tn * h, p * Tn * h, Tn * h)
        gather = ops[f"{name}.reduce_scatter.bwd"]
        assert gather.collective.bytes == T * h and gather.deps == (f"{name}.grad_fp8_cast",)
        assert ops[f"{name}.reduce_scatter"].collective.bytes == p * T * h
        assert ops[f"{name}.grad_fp8_transpose"].bytes_written == T * h
        assert ops[f"{name}.fp8_transpose"].bytes_written == T * K
        assert set(ops[f"{name}.wgrad"].deps) == {f"{name}.grad_fp8_transpose", f"{name}.fp8_transpose"}


def test_fused_fp8_casts_move_fewer_bytes_than_separate_ones_by_hand():
    # the same layer's cast and transpose traffic, tp 2 with sequence parallelism (bytes per token
    # over hidden 256: qkv 512 wide, attn_out input 128, SwiGLU up 512, down input 256):
    # separate: inputs 4 B x (256 + 128 + 256 + 256), gradients 4 B x (256 + 256 + 512 + 256)
    # fused: norms write 1 B less x 2 x 256 / 2 local tokens' share, no qkv/ffn_up cast; row-parallel
    # inputs 3 B x (128 + 256); qkv and ffn_up transposes 2 B x 256 each; row-parallel gradients
    # 3 B x 256 / 2 cast + 2 B x 256 transposed, inputs 2 B x (128 + 256) transposed; column-
    # parallel gradients 4 B x (256 + 512); separate casts also cast each linear's weights in the
    # forward, 4 B a weight of the rank's (256 x 256 qkv, 128 x 256 attn_out, 256 x 512 ffn_up,
    # 256 x 256 ffn_down), where Megatron-Core's fused casts do it once a step, in the stage tail
    def traffic(casts):
        g = layer_graph(_fp8_model(casts), 1, 2, True, "flash", "none")
        return sum(o.bytes for o in g.fwd + g.bwd if "fp8" in o.name)

    T = 64
    assert traffic("separate") == (T * (4 * (256 + 128 + 256 + 256) + 4 * (256 + 256 + 512 + 256))
                                   + 4 * (256 * 256 + 128 * 256 + 256 * 512 + 256 * 256))
    assert traffic("fused") == T * (3 * (128 + 256) + 2 * 2 * 256 + 2 * (3 * 256 / 2 + 2 * 256)
                                    + 2 * (128 + 256) + 4 * (256 + 512))
    # the norms' fp8 output saves a byte per local element
    ln = lambda casts: _ops(layer_graph(_fp8_model(casts), 1, 2, True, "flash", "none"))["ln1"].bytes  # noqa: E731
    assert ln("separate") - ln("fused") == 32 * 256


def test_fused_fp8_casts_leave_moe_and_16_bit_models_alone():
    from dataclasses import replace
    bf16 = replace(_fp8_model("fused"), precision="bf16")
    assert layer_graph(bf16, 1, 2, True, "flash", "none") == layer_graph(
        replace(bf16, fp8_casts="separate"), 1, 2, True, "flash", "none")
    moe = replace(load_model("mixtral-8x7b", 64), precision="fp8", fp8_casts="fused")
    ops = _ops(layer_graph(moe, 1, 2, True, "flash", "none"))
    # the router and the experts keep their own casts; the norm before the experts writes 16-bit
    assert {"router.fp8_cast", "expert_up.fp8_cast", "expert_down.fp8_cast"} <= set(ops)
    assert ops["ln2"].bytes_written == 2 * ops["ln2"].elements and "qkv.fp8_cast" not in ops
    # every expert's input and output gradient (grouped GEMMs: batch x M x K and batch x M x N)
    for name in ("expert_up", "expert_down"):
        batch, M, K, N = ops[name].gemm
        assert ops[f"{name}.fp8_cast"].elements == batch * M * K
        assert ops[f"{name}.grad_fp8_cast"].elements == batch * M * N


def _gpt(bias_kernels: str, **kw):
    """A small biased GPT layer: hidden 256, 4 heads, GELU FFN 1024, 64 tokens, fp16."""
    from dataclasses import replace
    return replace(load_model("gpt2-xl", 64), hidden=256, heads=4, kv_heads=4, head_dim=64, ffn_hidden=1024, layers=2,
                   vocab=1000, precision="fp16", bias_kernels=bias_kernels, **kw)


@pytest.mark.parametrize("tp, sp", [(1, False), (2, False), (2, True)])
def test_separate_bias_kernels_by_hand(tp, sp):
    # Megatron's tensor-parallel layers (megatron-core 0.2.0 tensor_parallel/layers.py): the qkv
    # projection adds its bias in a kernel of its own (read and write 2 B per output element);
    # each bias gradient is the output gradient summed over the tokens (read 2 B per element):
    # the column-parallel ones over this rank's T x N/tp, the row-parallel ones (their bias added
    # after the tp reduction) over the T x h each rank holds (T/tp x h under SP)
    T, h = 64, 256
    ops = _ops(layer_graph(_gpt("separate"), 1, tp, sp, "flash", "none"))
    add = ops["qkv.bias"]
    assert (add.phase, add.elements, add.bytes_read, add.bytes_written) == ("fwd", T * 3 * h // tp, 2 * T * 3 * h // tp,
                                                                            2 * T * 3 * h // tp)
    Tn = T // tp if sp else T
    rows = {"qkv": T * 3 * h // tp, "attn_out": Tn * h, "ffn_up": T * 4 * h // tp, "ffn_down": Tn * h}
    for name, elements in rows.items():
        g = ops[f"{name}.bias_grad"]
        assert (g.phase, g.elements, g.bytes_read, g.bytes_written) == ("bwd", elements, 2 * elements, 0)
    assert "qkv.bias.bwd" not in ops                 # the bias add passes its gradient through
    assert [n for n in ops if n.endswith(".bias")] == ["qkv.bias"]   # the others ride bias-GeLU, bias-dropout-add
    fused = _ops(layer_graph(_gpt("fused"), 1, tp, sp, "flash", "none"))
    assert not any(".bias" in n for n in fused)      # Transformer Engine's epilogues
    assert set(ops) - set(fused) == {"qkv.bias"} | {f"{n}.bias_grad" for n in rows}
    # a model without biases has nothing to add or reduce; Qwen2's qkv-only biases, just those
    llama = _ops(layer_graph(_gpt("separate", bias=False), 1, tp, sp, "flash", "none"))
    assert not any(".bias" in n for n in llama)
    qwen = _ops(layer_graph(_gpt("separate", bias=False, qkv_bias=True), 1, tp, sp, "flash", "none"))
    assert {n for n in qwen if ".bias" in n} == {"qkv.bias", "qkv.bias_grad"}


def test_separate_bias_kernels_under_full_recompute_rerun_the_add():
    g = _ops(layer_graph(_gpt("separate"), 1, 1, False, "flash", "full"))
    assert g["recompute.qkv.bias"].phase == "bwd" and "recompute.qkv.bias_grad" not in g


def _rerun(model, rerun: str):
    return dataclasses_replace(model, recompute_rerun=rerun)


@pytest.mark.parametrize("tp, sp", [(1, False), (2, False), (2, True)])
def test_full_recompute_of_what_the_backward_reads_skips_the_down_projection_by_hand(tp, sp):
    # JAX's remat (and PyTorch's non-reentrant checkpoint with early stop) re-run only what the
    # backward reads: a pre-norm layer's down projection, its tp reduction and the residual add
    # feed nothing the backward uses (tests/bench/bench_recompute_rerun.py measures both)
    m = load_model("llama3-8b", 256)     # h 4096, SwiGLU ffn 14336
    T, h, f = 256, 4096, 14336
    whole = _ops(layer_graph(_rerun(m, "whole"), 1, tp, sp, "flash", "full"))
    needed = _ops(layer_graph(_rerun(m, "needed"), 1, tp, sp, "flash", "full"))
    reduce = {f"recompute.ffn_down.{'reduce_scatter' if sp else 'all_reduce'}"} if tp > 1 else set()
    assert set(whole) - set(needed) == {"recompute.ffn_down", "recompute.ffn_residual"} | reduce
    assert set(needed) <= set(whole)
    flops = lambda g: sum(o.flops for n, o in g.items() if o.gemm)   # noqa: E731
    assert flops(whole) - flops(needed) == pytest.approx(2 * T * f * h / tp)
    # the output projection stays: its sum with the input is the second norm's input
    assert {"recompute.attn_out", "recompute.attn_residual", "recompute.ln2", "recompute.swiglu"} <= set(needed)
    # the default is the whole forward, and only a full recompute changes
    assert layer_graph(_rerun(m, ""), 1, tp, sp, "flash", "full") == layer_graph(_rerun(m, "whole"), 1, tp, sp,
                                                                                   "flash", "full")
    for r in ("none", "selective", "op"):
        assert layer_graph(_rerun(m, "needed"), 1, tp, sp, "flash", r) == layer_graph(m, 1, tp, sp, "flash", r)


def test_full_recompute_of_what_the_backward_reads_keeps_what_it_needs():
    # fp8: the down projection's input cast is re-run (the weight gradient reads the fp8 copy)
    fp8 = _ops(layer_graph(_rerun(_fp8_model("separate"), "needed"), 1, 1, False, "flash", "full"))
    assert "recompute.ffn_down.fp8_cast" in fp8 and "recompute.ffn_down" not in fp8
    # a post-norm layer's last norm reads the residual sum: nothing is dead
    post = dataclasses_replace(_gpt("fused"), norm_position="post")
    assert layer_graph(_rerun(post, "needed"), 1, 1, False, "flash", "full") == layer_graph(
        _rerun(post, "whole"), 1, 1, False, "flash", "full")
    # experts: the combined expert outputs are read back (the routing weights' gradient); their
    # weighted sum, the shared expert's down projection and its reduction are not
    moe = load_model("deepseek-v3", 64)
    lay = ExpertLayout(ep=8)
    whole = _ops(layer_graph(_rerun(moe, "whole"), 1, 2, True, "flash", "full", lay))
    needed = _ops(layer_graph(_rerun(moe, "needed"), 1, 2, True, "flash", "full", lay))
    assert set(whole) - set(needed) == {"recompute." + n for n in (
        "unpermute", "shared_down", "shared.reduce_scatter", "ffn_residual")}
    assert {"recompute.expert_down", "recompute.combine.all_to_all"} <= set(needed)


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_unfused_attention_kernels_by_hand(tp):
    # Megatron's core attention (NeMo 1.9's copy of megatron/model/transformer.py): the context
    # [b*heads, s, d] is permuted to [s, b, heads*d] and made contiguous (read and write 2 B per
    # element); in the backward, baddbmm's derivative scales dQ and dK by its alpha (1/sqrt(d))
    # in kernels of their own, and the split q, k, v gradients are concatenated (torch.split's
    # backward); the permute's gradient is a strided view the batched GEMMs read as it is
    T, h = 64, 256
    ops = _ops(layer_graph(_gpt("fused"), 1, tp, False, "standard", "none"))
    x = T * h // tp                                   # one of q, k, v or the context, on this rank
    perm = ops["context.permute"]
    assert (perm.phase, perm.elements, perm.bytes_read, perm.bytes_written) == ("fwd", x, 2 * x, 2 * x)
    for g in ("scores.dgrad_a.scale", "scores.dgrad_b.scale"):
        assert (ops[g].elements, ops[g].bytes_read, ops[g].bytes_written) == (x, 2 * x, 2 * x)
    cat = ops["qkv.split.bwd"]
    assert (cat.elements, cat.bytes_read, cat.bytes_written) == (3 * x, 6 * x, 6 * x)
    assert set(cat.deps) == {"scores.dgrad_a.scale", "scores.dgrad_b.scale", "context.dgrad_b"}
    assert "context.permute.bwd" not in ops
    assert ops["qkv.dgrad"].deps == ("qkv.split.bwd",)
    flash = _ops(layer_graph(_gpt("fused"), 1, tp, False, "flash", "none"))
    assert not any(k in n for n in flash for k in ("permute", ".scale", "split"))


@pytest.mark.parametrize("tp", [1, 2])
def test_alibi_bias_is_the_unfused_scores_input_by_hand(tp):
    # BLOOM's attention (Hugging Face's modeling_bloom: alibi.baddbmm(q, k, beta=1)): the bias,
    # broadcast over the queries, is copied into the scores' output (write 2 B a score) and the
    # GEMM reads it back (read 2 B a score): b x heads/tp x s x s scores on this rank, forward only
    # (a constant), again when the forward re-runs; a fused kernel adds it in its tiles, and a
    # learned-position model has none
    b, s, heads = 2, 64, 4
    alibi = _gpt("fused", position_embedding="alibi", max_positions=0)
    ops = _ops(layer_graph(alibi, b, tp, False, "standard", "none"))
    scores = b * heads // tp * s * s
    bias = ops["scores.alibi"]
    assert (bias.phase, bias.elements, bias.bytes_read, bias.bytes_written) == ("fwd", scores, 2 * scores, 2 * scores)
    assert bias.deps == ("scores",) and ops["softmax"].deps == ("scores.alibi",)
    assert not any(n.startswith("scores.alibi.") for n in ops)
    full = _ops(layer_graph(alibi, b, tp, False, "standard", "full"))
    assert full["recompute.scores.alibi"].bytes_written == 2 * scores
    assert not any("alibi" in n for n in _ops(layer_graph(alibi, b, tp, False, "flash", "none")))
    assert not any("alibi" in n for n in _ops(layer_graph(_gpt("fused"), b, tp, False, "standard", "none")))


def _kernel_rule(b, heads, s, precision="fp16", encoder=False):
    """Megatron-Core 0.16.1's is_kernel_available for a self-attention of b x heads rows of s
    keys, written out here independently of phaze.graph (the CUDA header's rows per block: 128
    threads, a warp of min(32, next power of two) lanes a row, two rows a warp up to 128 keys)."""
    pow2 = 1
    while pow2 < s:
        pow2 *= 2
    warp = min(pow2, 32)
    per_block = (128 // warp) * (2 if pow2 <= 128 else 1)
    batches = b * heads
    if precision not in ("fp16", "bf16") or not 16 < s <= 4096 or s % 4 or batches % 4:
        return False
    return (s if encoder else batches) % per_block == 0


def test_megatron_softmax_kernel_rule_against_its_definition():
    from phaze.graph import megatron_softmax_fused
    gpt = _gpt("fused", softmax_kernel="megatron")
    seen = set()
    for heads in (1, 2, 3, 4, 6, 8, 12, 25):
        for b in (1, 2, 3, 4, 8):
            for s in (16, 20, 32, 64, 100, 128, 132, 2048, 4096, 4100, 8192):
                for precision in ("fp16", "bf16", "fp32"):
                    m = dataclasses_replace(gpt, heads=heads, kv_heads=heads, seq_len=s, precision=precision)
                    got = megatron_softmax_fused(m, b, 1)
                    assert got == _kernel_rule(b, heads, s, precision), (heads, b, s, precision)
                    seen.add(got)
    assert seen == {True, False}
    # by hand: GPT-2 XL's 25 heads take the kernel only at micro-batches that are multiples of 4;
    # up to 128 keys a block holds 8 rows (4 x 1 heads short of it), beyond it 4; tp splits the heads
    xl = dataclasses_replace(load_model("gpt2-xl", 1024), softmax_kernel="megatron")
    assert [megatron_softmax_fused(xl, b, 1) for b in (1, 2, 3, 4, 8)] == [False, False, False, True, True]
    for s in (64, 128):                                                   # 4 heads, 8 rows a block
        short = dataclasses_replace(gpt, seq_len=s)
        assert not megatron_softmax_fused(short, 1, 1) and megatron_softmax_fused(short, 2, 1)
        assert not megatron_softmax_fused(short, 2, 2)                     # 2 heads a rank: 4 rows
    longer = dataclasses_replace(gpt, seq_len=132)                         # 4 rows a block
    assert megatron_softmax_fused(longer, 1, 1) and not megatron_softmax_fused(longer, 1, 2)
    # an encoder's padding mask asks the queries, not the rows, to fill the blocks
    bert = dataclasses_replace(load_model("bert-large", 132), softmax_kernel="megatron")   # 16 heads
    assert megatron_softmax_fused(bert, 1, 1)
    assert not megatron_softmax_fused(dataclasses_replace(bert, seq_len=100), 1, 1)
    assert _kernel_rule(1, 16, 132, encoder=True) and not _kernel_rule(1, 16, 100, encoder=True)
    # any other softmax_kernel is one kernel whatever the shape
    assert megatron_softmax_fused(dataclasses_replace(xl, softmax_kernel="fused"), 1, 1)
    assert megatron_softmax_fused(dataclasses_replace(xl, softmax_kernel=""), 1, 1)


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_megatron_softmax_off_its_kernel_runs_pytorchs_fp32_chain_by_hand(precision):
    # 4 heads of 64 tokens at tp 2: 2 rows, short of the kernel's multiple of 8. PyTorch's chain
    # (FusedScaleMaskSoftmax.forward_torch_softmax with the softmax in fp32 and the layer-number
    # scale): upcast 2 + 4 B a score, scale 4 + 4, masked_fill_ 4 + 4, softmax 4 + 4, downcast
    # 4 + 2; backward the mirror, the softmax reading its saved output; an fp32 model casts nothing
    m = dataclasses_replace(_gpt("fused", softmax_kernel="megatron"), precision=precision)
    g = layer_graph(m, 1, 2, False, "standard", "none")
    ops = _ops(g)
    n = 2 * 64 * 64                                     # scores on this rank
    p = 2 if precision == "fp16" else 4
    fwd = [(o.name, o.bytes_read / n, o.bytes_written / n) for o in g.fwd if o.name.startswith("softmax")]
    chain = [("softmax.scale", 4, 4), ("softmax.mask", 4, 4), ("softmax.fp32", 4, 4)]
    if p == 2:
        chain = [("softmax.float", 2, 4)] + chain + [("softmax.half", 4, 2)]
    assert fwd == chain
    bwd = [(o.name, o.bytes_read / n, o.bytes_written / n) for o in g.bwd if o.name.startswith("softmax")]
    want = {"softmax.float": (4, 2), "softmax.scale": (4, 4), "softmax.mask": (4, 4), "softmax.fp32": (8, 4),
            "softmax.half": (2, 4)}
    assert bwd == [(f"{name}.bwd",) + want[name] for name, _, _ in reversed(chain)]
    assert ops["softmax.fp32"].special == n and ops["softmax.fp32.bwd"].special == n
    # the chain sits between the scores and the dropout, each way
    assert ops["attn_dropout"].deps == (chain[-1][0],)
    assert ops["scores.dgrad_a"].deps == (f"{chain[0][0]}.bwd",)
    # on the kernel's shapes (16-bit, micro-batch 2 at tp 1: 8 rows), or under another
    # softmax_kernel, one op each way; fp32 scores never take the kernel
    for graph in (layer_graph(dataclasses_replace(m, precision="fp16"), 2, 1, False, "standard", "none"),
                  layer_graph(dataclasses_replace(m, softmax_kernel="fused"), 1, 2, False, "standard", "none")):
        names = [o.name for o in graph.fwd + graph.bwd if o.name.startswith("softmax")]
        assert names == ["softmax", "softmax.bwd"]
    # selective recompute re-runs the chain with the rest of the core attention
    sel = layer_graph(m, 1, 2, False, "standard", "selective")
    assert [o.name for o in sel.bwd if o.name.startswith("recompute.softmax")] == [f"recompute.{c[0]}" for c in chain]

def test_recompute_rerun_bench_phaze_rows_match_the_docs():
    # the measured JAX and PyTorch rows need those libraries; phaze's own rows are checked here
    import importlib.util
    from pathlib import Path
    root = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location("bench_recompute_rerun", root / "bench" / "bench_recompute_rerun.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    doc = (root.parent / "docs" / "frameworks.md").read_text()
    for rerun, n in (("whole", 6), ("needed", 5)):
        assert bench.phaze_reruns(rerun) == n
        assert f"| phaze, recompute_rerun: {rerun} | {n} |" in doc
    assert "| JAX 0.10.2 jax.checkpoint | 5 |" in doc       # what JAX measured: the down projection dropped


# --- Megatron-Core's selective recompute modules ---------------------------------------------------
def _reruns(model, recompute, tp=1, sp=False, moe=None):
    g = layer_graph(model, 1, tp, sp, "flash", recompute, moe)
    return [o.name.removeprefix("recompute.") for o in g.bwd if o.name.startswith("recompute.")]


def test_core_attn_module_reruns_the_fused_kernel_and_keeps_no_log_sum_exp():
    """Megatron-Core's core_attn checkpoint re-runs the core attention whatever its kernel: a fused
    one's forward, same FLOPs, in the backward; Megatron-LM's selective has nothing to re-run then.
    Memory: the kernel's fp32 log-sum-exp per query row and head (4 a s bytes) is not kept."""
    from phaze.memory import activation_bytes_per_layer
    m = load_model("llama3-8b", 4096)
    g = layer_graph(m, 1, 1, False, "flash", "selective+core_attn")
    fwd = {o.name: o for o in g.fwd}
    assert _reruns(m, "selective+core_attn") == ["flash_attention"]
    assert {o.name: o for o in g.bwd}["recompute.flash_attention"].flops == fwd["flash_attention"].flops
    assert _reruns(m, "selective") == []
    saved = (activation_bytes_per_layer(m, 1, 1, False, "selective", "flash")
             - activation_bytes_per_layer(m, 1, 1, False, "selective+core_attn", "flash"))
    assert saved == 4.0 * m.heads * m.seq_len
    # HFU counts what is re-run (on the unfused graph, non-causal): nothing for Megatron-LM's
    # selective recompute of a fused kernel, one more attention forward (QK and PV) for core_attn
    none = _hardware_flops_per_sample(m, Plan(recompute="none"))
    assert _hardware_flops_per_sample(m, Plan(recompute="selective")) == none
    core = _hardware_flops_per_sample(m, Plan(recompute="selective", recompute_modules=("core_attn",)))
    assert core - none == pytest.approx(m.layers * 4.0 * m.heads * m.seq_len ** 2 * m.head_dim)
    assert _hardware_flops_per_sample(m, Plan(recompute="selective", attention="standard")) == core


def test_layernorm_module_reruns_only_norms_of_their_own():
    """Megatron-Core's Transformer Engine layer spec fuses a dense GQA layer's norms into the next
    linear (TELayerNormColumnParallelLinear): ``layernorm`` re-runs nothing there; an MoE layer's
    pre-MLP norm is a module of its own (the router reads it), and so is an MLA layer's input norm.
    Memory: each re-run norm's output (2 bytes per token and hidden unit) is not kept."""
    from phaze.memory import activation_bytes_per_layer
    llama, qwen = load_model("llama3-8b", 4096), load_model("qwen3-235b-a22b", 4096)
    ds = load_model("deepseek-v3", 4096)
    lay = ExpertLayout(ep=8)
    assert _reruns(llama, "selective+layernorm") == []
    assert _reruns(qwen, "selective+layernorm", moe=lay) == ["ln2"]
    assert _reruns(ds, "selective+layernorm", moe=lay) == ["ln1", "ln2"]
    act = activation_bytes_per_layer
    assert act(llama, 1, 1, False, "selective+layernorm", "flash") == act(llama, 1, 1, False, "selective", "flash")
    s, h = qwen.seq_len, qwen.hidden
    drop = act(qwen, 1, 1, False, "selective", "flash") - act(qwen, 1, 1, False, "selective+layernorm", "flash")
    assert drop == pytest.approx(2 * s * h)
    # DeepSeek-V3: both norms, the pre-MLP one in its 58 MoE layers of 61
    drop = act(ds, 1, 1, False, "selective", "flash") - act(ds, 1, 1, False, "selective+layernorm", "flash")
    assert drop == pytest.approx(2 * s * ds.hidden * (1 + 58 / 61))


def test_expert_modules_by_hand():
    """``moe_act`` re-runs the experts' SwiGLU and drops its output (the down projection's input:
    top_k copies of each token, expert width); ``moe`` re-runs the whole MoE layer, its all-to-alls
    included, and keeps none of its tensors; ``shared_experts`` and ``mla_up_proj`` (DeepSeek-V3)."""
    from phaze.memory import activation_bytes_per_layer as act
    from phaze.memory import moe_activation_bytes
    qwen, ds = load_model("qwen3-235b-a22b", 4096), load_model("deepseek-v3", 4096)
    lay = ExpertLayout(ep=8)
    assert _reruns(qwen, "selective+moe_act", moe=lay) == ["expert_swiglu"]
    s, k, ef = qwen.seq_len, qwen.top_k, qwen.expert_ffn
    base = act(qwen, 1, 1, False, "selective", "flash")
    assert base - act(qwen, 1, 1, False, "selective+moe_act", "flash") == pytest.approx(2 * s * k * ef)
    moe_ops = [o.name for o in layer_graph(qwen, 1, 1, False, "flash", "none", lay).fwd
               if o.name.startswith(("router", "permute", "dispatch", "sort_chunks", "expert", "unsort_chunks",
                                     "combine", "unpermute"))]
    assert _reruns(qwen, "selective+moe", moe=lay) == moe_ops
    assert "dispatch.all_to_all" in moe_ops and "combine.all_to_all" in moe_ops
    assert base - act(qwen, 1, 1, False, "selective+moe", "flash") == pytest.approx(moe_activation_bytes(qwen, s, 1))
    assert _reruns(ds, "selective+shared_experts", moe=lay) == ["shared_up", "shared_swiglu", "shared_down"]
    # the up projections' checkpoint runs the latents' norms fused into them (TE's spec) and
    # applies the rotary embedding too (its rope part of q and k)
    assert _reruns(ds, "selective+mla_up_proj", moe=lay) == ["q_norm", "q_up", "kv_norm", "kv_up", "q.rotary",
                                                            "k.rotary"]
    a = ds.heads
    drop = act(ds, 1, 1, False, "selective", "flash") - act(ds, 1, 1, False, "selective+mla_up_proj", "flash")
    # Q, K, V and the normed latents (1,536 + 512; nothing in the checkpoint keeps them); the down
    # projections' outputs, the checkpoint's inputs, stay
    assert drop == pytest.approx(2 * s * a * (192 + 192 + 128) + 2 * s * (1536 + 512))



def test_mla_latent_norms_are_fused_into_the_up_projections_under_fp8():
    """Megatron-Core's TE spec builds MLA's up projections as TELayerNormColumnParallelLinear
    (megatron-core 0.16.1 gpt_layer_specs.py, qk_layernorm): under fp8 the latents' norms write
    fp8 and the up projections cast nothing; their weight gradients transpose the saved fp8 input
    in the backward. The down projections (TE Linear) cast their own input; in bf16 and with
    separate casts the norms write 16 bits. DeepSeek-V3, one micro-batch of 4,096 tokens."""
    from phaze.memory import activation_bytes_per_layer as act
    ds = load_model("deepseek-v3", 4096)
    s, h, a, rq, rkv = 4096, 7168, 128, 1536, 512
    fp8 = dataclasses_replace(ds, precision="fp8")
    for model, fused in ((fp8, True), (dataclasses_replace(fp8, fp8_casts="separate"), False), (ds, False)):
        g = layer_graph(model, 1, 1, False, "flash", "none")
        fwd, bwd = {o.name: o for o in g.fwd}, {o.name for o in g.bwd}
        for norm, up, r in (("q_norm", "q_up", rq), ("kv_norm", "kv_up", rkv)):
            assert fwd[norm].bytes_written == (1 if fused else 2) * s * r
            assert (f"{up}.fp8_cast" in fwd) == (model.precision == "fp8" and not fused)
            assert (f"{up}.fp8_transpose" in bwd) == fused
        assert ("q_down.fp8_cast" in fwd) == (model.precision == "fp8")
    # memory under fp8: the layernorm module frees nothing of MLA's input norm (the two down
    # projections keep fp8 copies of their own), only the MoE layers' pre-MLP norm (16 bits, the
    # router keeps it); mla_up_proj frees Q, K, V and the fp8 normed latents
    drop = act(fp8, 1, 1, False, "selective", "flash") - act(fp8, 1, 1, False, "selective+layernorm", "flash")
    assert drop == pytest.approx(2 * s * h * 58 / 61)
    drop = act(fp8, 1, 1, False, "selective", "flash") - act(fp8, 1, 1, False, "selective+mla_up_proj", "flash")
    assert drop == pytest.approx(2 * s * a * (192 + 192 + 128) + 1 * s * (rq + rkv))

def test_mlp_module_reruns_a_dense_ffn_with_its_fused_norm():
    from phaze.memory import activation_bytes_per_layer as act
    m = load_model("llama3-8b", 4096)
    assert _reruns(m, "selective+mlp", tp=2, sp=True) == [
        "ln2", "ln2.all_gather", "ffn_up", "swiglu", "ffn_down", "ffn_down.reduce_scatter"]
    s, h, f = m.seq_len, m.hidden, m.ffn_hidden
    # the norm's output, the SwiGLU's two inputs and the down projection's input
    drop = act(m, 1, 1, False, "selective", "flash") - act(m, 1, 1, False, "selective+mlp", "flash")
    assert drop == pytest.approx(2 * s * (h + 2 * f + f))
    qwen = load_model("qwen3-235b-a22b", 4096)
    assert _reruns(qwen, "selective+mlp", moe=ExpertLayout(ep=8)) == []     # no dense layer


def test_recompute_modules_in_a_plan():
    from phaze.configio import ConfigError
    from phaze.plan import parse_plan
    plan = parse_plan("tp=2,pp=2,recompute=selective,recompute_modules=moe+layernorm")
    assert plan.recompute_modules == ("layernorm", "moe") and "recompute_modules=layernorm+moe" in plan.label()
    assert parse_plan(plan.label()) == plan
    staged = parse_plan("pp=2,stage_recompute=selective:full,recompute_modules=core_attn")
    assert staged.recompute_modules == ("core_attn",)
    for bad, field in (("recompute=selective,recompute_modules=attn", "recompute_modules"),
                       ("recompute=selective,recompute_modules=moe+moe", "recompute_modules"),
                       ("recompute=full,recompute_modules=moe", "recompute_modules")):
        with pytest.raises(ConfigError) as err:
            parse_plan(bad)
        assert err.value.field == field


# --- rotary embeddings, per-head norms and copied key/value heads ----------------------------------
def _llama(**kw):
    """Llama 3 8B's layer (32 query heads, 8 key/value heads of 128) at 256 tokens."""
    return dataclasses_replace(load_model("llama3-8b", 256), **kw)


@pytest.mark.parametrize("tp", [1, 2])
def test_rotary_kernels_by_hand(tp):
    T, q, k = 256, 32 * 128 // tp, 8 * 128 // tp          # this rank's query and key widths
    fused = _ops(layer_graph(_llama(rotary_kernels="fused"), 1, tp, False, "flash", "none"))
    for x, w in (("q", q), ("k", k)):
        # Transformer Engine's fused RoPE: read and write each 2-byte element, 3 FLOPs (two
        # products and a sum), forward and backward alike
        for name in (f"{x}.rotary", f"{x}.rotary.bwd"):
            o = fused[name]
            assert (o.elements, o.bytes_read, o.bytes_written, o.flops) == (T * w, 2 * T * w, 2 * T * w, 3 * T * w)
        assert fused[f"{x}.rotary"].phase == "fwd" and fused[f"{x}.rotary.bwd"].phase == "bwd"
    complex_ = _ops(layer_graph(_llama(rotary_kernels="complex"), 1, tp, False, "flash", "none"))
    # torchtitan: x.float() 2 -> 4 bytes, the complex product 4 -> 4, type_as 4 -> 2
    for name, r, w in (("q.rotary.upcast", 2, 4), ("q.rotary.rotate", 4, 4), ("q.rotary.downcast", 4, 2)):
        for n in (name, name + ".bwd"):
            assert (complex_[n].bytes_read, complex_[n].bytes_written) == (r * T * q, w * T * q)
    assert sum(o.bytes for n, o in complex_.items() if n.startswith("k.rotary")) == 2 * 20 * T * k
    separate = _ops(layer_graph(_llama(rotary_kernels="separate"), 1, tp, False, "flash", "none"))
    # megatron's rotate-half: neg (half), cat, two multiplies, add (two inputs), cat with the
    # unrotated part: 6.5 + 5.5 elements per element each way; six table kernels of 256 x 128 fp32
    # values per tensor, forward only
    main = [n for n in separate if n.startswith("q.rotary.") and not n.split(".")[2].startswith(("cos", "sin"))
            or n.startswith("q.rotary.") and n.split(".")[2] in ("cos_mul", "sin_mul")]
    assert len(main) == 12 and sum(separate[n].bytes for n in main) == 2 * 2 * 12 * T * q
    tables = [n for n in separate if n.startswith("k.rotary.") and n.split(".")[2] in
              ("cos", "cos_scale", "cos_cast", "sin", "sin_scale", "sin_cast")]
    assert len(tables) == 6 and all(separate[n].elements == T * 128 for n in tables)
    assert sum(separate[n].bytes for n in tables) == T * 128 * (6 * 4 + 4 * 4 + 2 * 2)
    # learned positions: no rotation
    gpt = _ops(layer_graph(load_model("gpt3-175b", 256), 1, tp, False, "flash", "none"))
    assert not any("rotary" in n for n in gpt)


def test_partial_and_latent_rotations():
    # GPT-NeoX-20B rotates 24 of each 96-wide head: the fused kernel still passes the whole head
    neox = load_model("gpt-neox-20b", 256)
    g = _ops(layer_graph(neox, 1, 1, False, "flash", "none"))
    assert g["q.rotary"].bytes_read == 2 * 256 * 6144 and g["q.rotary"].flops == 3 * 256 * 64 * 24
    # DeepSeek-V3's MLA: its 128 queries' 64-wide rope parts and one shared 64-wide rope key
    ds = load_model("deepseek-v3", 256)
    g = _ops(layer_graph(ds, 1, 1, False, "flash", "none", ExpertLayout(ep=64)))
    assert g["q.rotary"].elements == 256 * 128 * 64 and g["k.rotary"].elements == 256 * 64


@pytest.mark.parametrize("tp", [1, 4])
def test_copied_key_value_heads_by_hand(tp):
    T, heads, kv = 256, 32 // tp, 8 // tp
    grouped = layer_graph(_llama(kv_repeat="grouped"), 1, tp, False, "flash2", "none")
    copied = layer_graph(_llama(kv_repeat="copied"), 1, tp, False, "flash2", "none")
    g, c = _ops(grouped), _ops(copied)
    assert set(c) - set(g) == {"k.repeat", "v.repeat", "k.repeat.bwd", "v.repeat.bwd"}
    for x in "kv":
        # the copy reads each of this rank's key/value heads once, writes one per query head;
        # the backward sums the copies' gradients back
        fwd, bwd = c[f"{x}.repeat"], c[f"{x}.repeat.bwd"]
        assert (fwd.bytes_read, fwd.bytes_written) == (2 * T * kv * 128, 2 * T * heads * 128)
        assert (bwd.bytes_read, bwd.bytes_written) == (2 * T * heads * 128, 2 * T * kv * 128)
    # the attention reads (and its backward writes) K and V as wide as Q
    assert c["flash_attention"].bytes_read == 2 * T * 3 * heads * 128
    assert g["flash_attention"].bytes_read == 2 * T * (heads + 2 * kv) * 128
    assert c["flash_attention.bwd"].bytes_written == c["flash_attention"].bytes_read
    # multi-head attention has nothing to copy
    mha = _ops(layer_graph(_llama(kv_repeat="copied", kv_heads=32), 1, tp, False, "flash2", "none"))
    assert not any("repeat" in n for n in mha)


def test_copied_key_value_heads_are_kept_and_exchanged_as_copies():
    from phaze.memory import activation_bytes_per_layer
    from phaze.stage import _cp_blocks
    s, h, kv = 256, 4096, 1024
    grouped, copied = _llama(kv_repeat="grouped"), _llama(kv_repeat="copied")
    # the attention keeps K and V as wide as Q: 2 x (4096 - 1024) more 2-byte values per token
    extra = activation_bytes_per_layer(copied, 1, 1, False, "none", "flash2") \
        - activation_bytes_per_layer(grouped, 1, 1, False, "none", "flash2")
    assert extra == pytest.approx(2 * 2 * s * (h - kv))
    # context parallelism moves what the attention reads: four times the K/V block here
    plan = Plan(cp=4, tp=1)
    assert _cp_blocks(copied, plan)[0] == 4 * _cp_blocks(grouped, plan)[0] == 2 * (s // 4) * 32 * 256


def test_qk_norm_normalises_each_query_and_key_head():
    qwen = load_model("qwen3-8b", 256)      # 32 query heads, 8 key/value heads of 128
    g = _ops(layer_graph(qwen, 1, 2, False, "flash", "none"))
    assert g["q.norm"].elements == 256 * 16 * 128 and g["k.norm"].elements == 256 * 4 * 128
    assert g["q.norm.bwd"].bytes_read == 2 * g["q.norm"].bytes_read      # reads its input and the gradient
    assert "q.norm" not in _ops(layer_graph(_llama(), 1, 2, False, "flash", "none"))


@pytest.mark.parametrize("name,changes", [
    ("gemma2-9b", {"softmax_kernel": "torch", "rotary_kernels": "separate"}),   # soft-cap, unfused softmax chain
    ("bloom-176b", {}),                                                            # ALiBi, biases
    ("llama3-8b", {"precision": "fp8", "kv_repeat": "copied", "rotary_kernels": "complex"}),
    ("mamba2-2.7b", {}),                                                           # the scan's gate
    ("llama3.2-1b", {"residual_scale": 0.22}),                                     # residual scales (Granite)
])
def test_each_forward_op_has_the_backward_its_grad_names(name, changes):
    """The backward of a forward op follows its ``grad`` field, never its name: ``none`` runs no
    kernel of its own, each other kind exactly one named after it, which reads what the forward
    wrote (or, for a rotation, what it read), and a GEMM or a unit's rule (grad "") never one
    named ``.bwd``."""
    from phaze.graph import GRADS
    model = dataclasses_replace(load_model(name), **changes)
    kinds = set()
    for attention in ("flash", "standard"):
        g = layer_graph(model, 1, 2, True, attention, "none")
        bwd = {o.name: o for o in g.bwd}
        for op in g.fwd:
            assert op.grad in GRADS, op
            kinds.add(op.grad)
            if op.grad == "none":
                assert f"{op.name}.bwd" not in bwd and not any(b.deps == (op.name,) for b in g.bwd), op.name
            elif op.grad in ("softmax", "scale", "repeat"):
                b = bwd[f"{op.name}.bwd"]
                assert (b.bytes_read >= op.bytes_written, b.bytes_written) == (True, op.bytes_read), op.name
            elif op.grad == "rotary":
                b = bwd[f"{op.name}.bwd"]
                assert (b.bytes_read, b.bytes_written, b.flops) == (op.bytes_read, op.bytes_written, op.flops)
            elif op.grad in ("softcap", "gate"):
                assert bwd[f"{op.name}.bwd"].elements == op.elements
            elif op.unit in ("tensor", "link"):
                assert f"{op.name}.bwd" not in bwd or op.unit == "link", op.name
    assert kinds - {""}, name   # each case has a kind of its own to check
