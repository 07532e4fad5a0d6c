"""Multi-token prediction (DeepSeek-V3 Sec. 2.2; Megatron-Core's --mtp-num-layers): parameter
counts against the published ones, FLOPs and the last stage's costs by hand."""
from dataclasses import replace

import pytest
from conftest import toy_chip

from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.graph import edge_graph, tensor_flops
from phaze.plan import Plan
from phaze.plan_check import stage_layers, stage_split
from phaze.stage import stage_costs, tp_layer_params
from phaze.step import evaluate, model_flops_per_sample
from phaze.workload import Model


def dense(**kw) -> Model:
    base = dict(name="d", layers=4, hidden=256, heads=4, ffn_hidden=688, vocab=1000, seq_len=128,
                activation="swiglu", norm="rmsnorm", bias=False, dropout=False, tied_embeddings=False,
                position_embedding="rotary")
    return Model(**{**base, **kw})


def test_deepseek_v3_module_is_its_published_14b():
    """arXiv:2412.19437 / the HF model card: 685B in the checkpoint, 671B of the main model and
    14B of the MTP module, which the checkpoint stores with its own embedding and head. By hand:
    an MoE layer (MLA 187,107,328; router 1,835,008; 257 experts of 3 x 7168 x 2048; two norms)
    11,507,286,016, eh_proj 2 x 7168^2 and three norms of 7168."""
    m = load_model("deepseek-v3")
    layer = 187_107_328 + 7168 * 256 + 257 * 3 * 7168 * 2048 + 2 * 7168
    assert m.moe_layer_params == layer == 11_507_286_016
    assert m.mtp_params == layer + 2 * 7168 ** 2 + 3 * 7168 == 11_610_067_968
    with_copies = m.mtp_params + 2 * m.vocab * m.hidden      # the checkpoint's embedding and head
    assert with_copies == pytest.approx(14e9, rel=0.04)
    assert m.params + with_copies == pytest.approx(685e9, rel=0.001)
    assert m.params == pytest.approx(671e9, rel=0.001)       # the published count leaves it out


def test_flops_add_a_layer_a_projection_and_a_head():
    """One module adds the work of one more layer (the model with l + 1 layers), eh_proj's
    2s(2h)h forward and twice that backward, and the head's logits again: 6 s h V."""
    for m in (dense(), replace(load_model("deepseek-v3", 256), layers=5, dense_layers=2, mtp_layers=0)):
        s, h, V = m.seq_len, m.hidden, m.vocab
        one_more_layer = (model_flops_per_sample(replace(m, layers=m.layers + 1))
                          - model_flops_per_sample(m))
        got = model_flops_per_sample(replace(m, mtp_layers=1)) - model_flops_per_sample(m)
        assert got == pytest.approx(one_more_layer + 6 * s * 2 * h * h + 6 * s * h * V, rel=1e-12)
        two = model_flops_per_sample(replace(m, mtp_layers=2)) - model_flops_per_sample(m)
        assert two == pytest.approx(2 * got, rel=1e-12)


@pytest.mark.parametrize("tp,sp", [(1, False), (2, False), (2, True)])
def test_edge_ops_and_collectives(tp, sp):
    """The head gains one module's ops: eh_proj's GEMM of T x 2h x h/tp, its input gathered over
    the sequence under sp, its output's columns gathered over tp; the shared embedding's lookup
    and reduction, and a second logits GEMM and loss."""
    m, mbs = dense(), 2
    T, h = mbs * m.seq_len, m.hidden
    base = {o.name: o for o in edge_graph(m, mbs, tp, sp)["head"]}
    ops = {o.name: o for o in edge_graph(replace(m, mtp_layers=1), mbs, tp, sp)["head"]}
    added = set(ops) - set(base)
    assert set(base) <= set(ops) and all(n.startswith("mtp0.") for n in added)
    assert ops["mtp0.eh_proj"].gemm == (1, T, 2 * h, h // tp)
    assert ops["mtp0.logits"].gemm == base["logits"].gemm
    assert tensor_flops([ops[n] for n in added]) == pytest.approx(
        6 * T * 2 * h * h / tp + 6 * T * h * (-(-m.vocab // tp)))
    links = {n: ops[n].collective for n in added if ops[n].collective is not None}
    if tp == 1:
        assert not links
    else:
        p = m.bytes_per_element
        assert links["mtp0.eh_proj.gather"].bytes == p * T * h
        assert ("mtp0.eh_proj.all_gather" in links) == sp
        assert links["mtp0.embedding." + ("reduce_scatter" if sp else "all_reduce")].bytes == p * T * h
        if sp:
            assert links["mtp0.eh_proj.all_gather"].bytes == p * T * 2 * h


@pytest.mark.parametrize("pp", [1, 2])
def test_last_stage_runs_and_holds_the_module(pp):
    """The last stage runs one more layer and the module's edge ops, and holds the layer, eh_proj,
    three norms and (pp > 1, an untied head) its own copy of the embedding table; the first stage
    is unchanged."""
    chip = toy_chip()
    m0 = dense()
    m1 = replace(m0, mtp_layers=1)
    plan = Plan(tp=2, pp=pp, mbs=1)
    c0, c1 = stage_costs(m0, chip, 4, 8, plan), stage_costs(m1, chip, 4, 8, plan)
    last = pp - 1
    layer = c0.mode("none").layer.total
    head_added = c1.head.total - c0.head.total
    assert head_added > 0
    assert c1.time(last, 2, "none").total == pytest.approx(c0.time(last, 2, "none").total + layer + head_added)
    copy = m0.vocab * m0.hidden if pp > 1 else 0
    assert c1.params(last, 2) - c0.params(last, 2) == pytest.approx(
        (tp_layer_params(m0, 2) + 2 * m0.hidden ** 2 + 3 * m0.hidden + copy) / 2)
    if pp > 1:
        assert c1.time(0, 2, "none").total == c0.time(0, 2, "none").total
        assert c1.params(0, 2) == c0.params(0, 2)
    # the fp32 logits of both losses are held for the backward
    assert c1.logits_bytes() == 2 * c0.logits_bytes() == 2 * 4.0 * m0.seq_len * m0.vocab / 2


def test_block_recompute_does_not_rerun_the_module():
    """Megatron-Core skips recomputing the module under --recompute-method block (it warns), and
    re-runs it under full recompute."""
    chip = toy_chip()
    m0, m1 = dense(), dense(mtp_layers=1)
    plan = Plan(tp=1, pp=2, mbs=1)
    c0, c1 = stage_costs(m0, chip, 2, 8, plan), stage_costs(m1, chip, 2, 8, plan)
    added = c1.head.total - c0.head.total
    none, full = c0.mode("none").layer.total, c0.mode("full").layer.total
    assert full > none
    assert c1.time(1, 2, "block", 1).total == pytest.approx(c0.time(1, 2, "block", 1).total + none + added)
    assert c1.time(1, 2, "full").total == pytest.approx(c0.time(1, 2, "full").total + full + added)


def test_step_and_memory_grow_and_report_it():
    chip = toy_chip()
    m0, m1 = dense(layers=8), dense(layers=8, mtp_layers=1)
    plan = Plan(tp=1, pp=2, mbs=1, stages=(4, 4))
    r0, r1 = evaluate(m0, chip, 2, 8, plan), evaluate(m1, chip, 2, 8, plan)
    assert r1.step_time_s > r0.step_time_s
    assert r1.stage_memory[1].total_bytes > r0.stage_memory[1].total_bytes
    assert r1.stage_memory[0].total_bytes == r0.stage_memory[0].total_bytes
    assert r1.model_flops_per_step == pytest.approx(model_flops_per_sample(m1) * 8)


@pytest.mark.parametrize("layers,mtp,pp,vp,want", [
    (61, 1, 16, 1, (3,) + (4,) * 14 + (2,)),     # NeMo 2.6's DeepSeek-V3 recipe: first 3, last 2
    (61, 1, 16, 2, (3,) + (4,) * 14 + (2,)),     # 62 slots in 32 chunks: the last chunk the module's
    (8, 1, 2, 1, (5, 3)),                        # 9 slots: 5 and 4 (the first takes the odd one), 4 less 1
    (8, 2, 2, 1, (5, 3)),                        # 10 slots: 5 and 5, the last's 5 less its 2 modules
    (3, 1, 3, 1, (1, 1, 1)),                     # 4 slots: 1, 2, 1; the last would keep none: plain split
])
def test_default_split_counts_the_modules_as_layers(layers, mtp, pp, vp, want):
    """Without ``stages``, the last stage's module layers take slots of the even split, as
    Megatron-Core's pipeline layouts place them ('m'); a last stage left with no layer of its own
    keeps the plain split."""
    model = dense(layers=layers, mtp_layers=mtp)
    assert stage_split(model, Plan(pp=pp, vp=vp)) == want == stage_layers(layers, pp, vp, mtp)
    assert sum(want) == layers
    assert stage_split(model, Plan(pp=pp, vp=vp, stages=stage_layers(layers, pp, vp))) == stage_layers(layers, pp, vp)


def test_default_split_lightens_the_last_stage():
    """8 layers and two modules on 2 stages: 5 and 3 + the modules, where the plain split's last
    stage ran 4 + the modules (6 layers' work and the heads): the step is shorter."""
    chip = toy_chip()
    model = dense(layers=8, mtp_layers=2)
    plan = Plan(tp=1, pp=2, mbs=1)
    assert evaluate(model, chip, 2, 8, plan).step_time_s < evaluate(
        model, chip, 2, 8, Plan(tp=1, pp=2, mbs=1, stages=(4, 4))).step_time_s


def test_workload_key_and_its_refusals(tmp_path):
    text = "name: t\nlayers: 2\nhidden: 64\nheads: 4\nffn_hidden: 256\nvocab: 100\nseq_len: 32\n"

    def read(extra: str) -> Model:
        path = tmp_path / "w.yaml"
        path.write_text(text + extra)
        return load_model(path)

    assert read("mtp_layers: 2\n").mtp_layers == 2
    assert read("").mtp_layers == 0
    with pytest.raises(ConfigError, match="mtp_layers"):
        read("mtp_layers: -1\n")
    with pytest.raises(ConfigError, match="mtp_layers.*decoder"):
        read("architecture: encoder\nmtp_layers: 1\n")
    with pytest.raises(ConfigError, match="mtp_layers.*factorised"):
        read("embedding_projection_dim: 32\nmtp_layers: 1\n")
    # no more modules than layers: a fuzzed count of 10^40 once built arrays until memory ran out
    with pytest.raises(ConfigError, match="mtp_layers.*allowed: 0-2"):
        read("mtp_layers: 3\n")


def test_validation_column_is_the_runs_choice():
    """``mtp_layers`` in a run's row: blank is none even for a named workload that trains with it
    (Megatron-Core's default), a count adds the modules, anything else is refused by name."""
    from test_validate import synthetic

    from phaze.runs import EXPLICIT_COLUMNS, Case, row_to_case
    assert "mtp_layers" in EXPLICIT_COLUMNS
    assert row_to_case(synthetic()).model.mtp_layers == 0
    assert row_to_case(synthetic(mtp_layers="1")).model.mtp_layers == 1
    ds = dict(model="DeepSeek-V3", layers="", hidden="", heads="", seq_len="4096", tp="1", gpu_count="8",
              ep="8", global_batch="8")
    assert row_to_case(synthetic(**ds)).model.mtp_layers == 0
    assert row_to_case(synthetic(**ds, mtp_layers="1")).model.mtp_layers == 1
    for bad in ("-1", "1.5", "x", "9" * 40):
        r = row_to_case(synthetic(mtp_layers=bad))
        assert not isinstance(r, Case) and "mtp_layers" in r.reason


def test_evaluate_prints_the_modules_beside_the_published_count(tmp_path):
    import json

    from test_cli import phaze_cli
    args = ["evaluate", "--workload", "deepseek-v3", "--arch", "h100-sxm", "--devices", "64", "--global-batch", "64",
            "--plan", "tp=1,pp=4,ep=16", "--allow-oom"]
    proc = phaze_cli(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.splitlines()[1]
    assert line.startswith("  parameters         671.03 B") and line.endswith(
        "; multi-token prediction: 1 module on the last stage, 11.61 B more"), line
    r = json.loads(phaze_cli(tmp_path, *args, "--format", "json").stdout)
    assert (r["params"], r["mtp_params"]) == (load_model("deepseek-v3").params, 11_610_067_968)
