"""Hybrid Mamba-2 / transformer models (Megatron-Core's MambaModel, NeMo's Nemotron-H): the pattern
of layer kinds, the Mamba-2 mixer's parameters, operators and FLOPs, the mean layer the step
weighs, the memory it keeps, NeMo's FLOP convention for hybrids, what a plan may not do, and rows
and Hugging Face configs that name them.

Expected numbers are derived here by hand from Megatron-Core 0.16's MambaMixer (input projection
of 2·d_inner + 2·G·N + heads, a depthwise convolution over d_inner + 2·G·N channels, A_log, D and
dt_bias a head, a gated RMSNorm, an output projection), Dao and Gu's SSD chunked scan (arXiv:
2405.21060, Sec. 7) and NeMo 2.5's flops_formulas.py.
"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from phaze.arch import load_chip
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.graph import layer_graph, tensor_flops
from phaze.hf_config import model_from_hf_config
from phaze.memory import activation_bytes_per_layer
from phaze.placement import PlacementOptions, cp_values, vp_values
from phaze.plan import parse_plan
from phaze.runs import Case, Skipped, convention_flops_per_step, row_to_case
from phaze.stage import layer_mix, layer_time
from phaze.step import evaluate, model_flops_per_sample
from phaze.workload import hybrid_views, with_seq_len

H8 = load_model("nemotron-h-8b")   # 24 M, 4 *, 24 -; hidden 4096, d_inner 8192, N 128, G 8, 128 heads
S = H8.seq_len                     # 8192


def kind(model, k):
    return replace(model, hybrid_pattern=k * model.layers)


def test_the_patterns_counts_and_the_shipped_shapes():
    assert H8.hybrid_counts == {"M": 24, "*": 4, "-": 24} and H8.layer_kind is None
    assert (H8.mamba_heads, H8.mamba_inner, H8.mamba_in_width, H8.mamba_conv_width) == (128, 8192, 18560, 10240)
    assert load_model("nemotron-h-56b").hybrid_counts == {"M": 54, "*": 10, "-": 54}   # NeMo's 56B pattern
    assert load_model("nemotron-h-47b").hybrid_counts == {"M": 45, "*": 5, "-": 48}
    assert kind(H8, "M").layer_kind == "M" and load_model("llama3-8b").layer_kind == ""


def test_mamba_layer_parameters_by_hand():
    h, d = 4096, 8192
    mixer = h * (2 * d + 2 * 8 * 128 + 128) + (d + 2 * 8 * 128) * (4 + 1) + 3 * 128 + d + d * h
    assert H8.mamba_params == mixer == 109_635_968
    attention = h * (4096 + 2 * 1024) + 4096 * h      # q, k, v (8 groups of 128) and out, no biases
    mlp = 2 * h * 21504                               # squared ReLU: up and down
    layers = 24 * (mixer + h) + 4 * (attention + h) + 24 * (mlp + h)
    assert H8.params == layers + 2 * 131072 * h + h   # untied table and head, final norm
    assert H8.layer_params == pytest.approx(layers / 52)


def test_mamba_mixer_operators_and_flops_by_hand():
    """tp 2 splits heads and groups: the four SSD products of 64 heads and 4 groups, chunks of 128."""
    T, h, t = S, 4096, 2
    heads, groups, N, P, Q = 128 // t, 8 // t, 128, 64, 128
    d = heads * P
    g = layer_graph(kind(H8, "M"), 1, t, True, "flash", "none")
    names = [o.name for o in g.fwd]
    assert names == ["ln1", "ln1.all_gather", "mamba_in", "mamba_conv", "ssd_dt", "ssd_cb", "ssd_states",
                     "ssd_state_passing", "ssd_y_off", "ssd_y_diag", "ssd_gate", "mamba_norm", "mamba_out",
                     "mamba_out.reduce_scatter", "mamba_residual"]
    chunks = T // Q
    expected = (2 * T * h * (2 * d + 2 * groups * N + heads)   # z, x, B, C, dt
                + 2 * chunks * groups * Q * N * Q              # C·Bᵀ within each chunk, per group
                + 2 * chunks * heads * N * Q * P               # each chunk's state Bᵀ·X
                + 2 * chunks * heads * Q * N * P               # C·(states before it)
                + 2 * chunks * heads * Q * Q * P               # (L∘C·Bᵀ)·X
                + 2 * T * d * h)                               # out
    assert tensor_flops(g.fwd) == expected
    # each product's two input gradients (data and weight), and the products the fused scan's
    # backward re-runs from its saved inputs first: C·Bᵀ and the chunk states (mamba_ssm 2.2.4
    # _mamba_chunk_scan_combined_bwd), with the convolution and dt's decay before them
    rerun = 2 * chunks * groups * Q * N * Q + 2 * chunks * heads * N * Q * P
    assert tensor_flops(g.bwd) == 2 * expected + rerun
    bwd = [o.name for o in g.bwd]
    first = bwd.index("mamba_conv.rerun")
    assert bwd[first:first + 6] == ["mamba_conv.rerun", "ssd_dt.rerun", "ssd_cb.rerun", "ssd_states.rerun",
                                    "ssd_state_passing.rerun", "ssd_gate.bwd"]
    full = layer_graph(kind(H8, "M"), 1, t, True, "flash", "full")   # under a full recompute too, once
    assert [o.name for o in full.bwd].count("ssd_cb.rerun") == 1


def test_model_flops_sum_the_kinds():
    """Per sequence: three times each kind's forward GEMMs (attention non-causal, in full) and the logits."""
    h, d, T, V = 4096, 8192, S, 131072
    mamba = 2 * T * h * 18560 + 2 * T * 8 * 128 * 128 + 4 * T * 128 * d + 2 * T * 128 * d + 2 * T * d * h
    attention = 2 * T * h * 6144 + 2 * T * 4096 * h + 2 * 2 * S * S * 4096
    mlp = 2 * 2 * T * h * 21504
    assert model_flops_per_sample(H8) == 3 * (24 * mamba + 4 * attention + 24 * mlp) + 6 * T * h * V


def test_nemo_hybrid_convention_is_nemos_formula():
    """NeMo 2.5 flops_formulas.py _hybrid_model_flops with its terms written out for the 56B."""
    m = load_model("nemotron-h-56b")
    s, h, V, f, d, N, G, heads = 8192, 8192, 131072, 32768, 16384, 256, 8, 256
    attn = 6 * s * h * (h + 8 / 64 * h * 2 + s / 2 * 2 + h)
    mamba = 6 * s * h * (2 * d + 2 * G * N + heads) + 3 * 2 * s * d * N + 6 * s * d * h
    mlp = 6 * s * h * f * 3                       # NeMo assumes a gated unit
    nemo = 10 * attn + 54 * mamba + 54 * mlp + 6 * s * h * V
    assert convention_flops_per_step(m, 4, "model_causal", "none") == pytest.approx(4 * nemo, rel=1e-12)
    # phaze's own count of the same model is lower: its squared-ReLU MLP has two matrices, not three
    assert convention_flops_per_step(m, 1, "model", "none") < nemo
    with pytest.raises(ValueError, match="allowed: model, model_causal"):
        convention_flops_per_step(m, 1, "6n_12lqs", "none")


@pytest.mark.parametrize("chip", ["h100-sxm", "tpuv5p"])
def test_layer_time_is_the_kinds_mean(chip):
    """On the H100 (sequential units) the operator sums, on the TPU v5p each kind's schedule."""
    c = load_chip(chip)
    mix = layer_mix(H8)
    assert [(round(w, 6), m.layer_kind) for w, m, _ in mix] == [(round(24 / 52, 6), "M"), (round(4 / 52, 6), "*"),
                                                                 (round(24 / 52, 6), "-")]
    got = layer_time(H8, c, 1, 2, True, "flash", "none")
    parts = [layer_time(kind(H8, k), c, 1, 2, True, "flash", "none") for k in "M*-"]
    for phase in (0, 1):
        want = (24 * parts[0][phase].total + 4 * parts[1][phase].total + 24 * parts[2][phase].total) / 52
        assert got[phase].total == pytest.approx(want, rel=1e-9)


def test_memory_of_each_kind_by_hand():
    """tp 2 with sequence parallelism, 16-bit, no recompute: what each kind keeps per token."""
    t, h, d, sb = 2, 4096, 8192, S
    mamba = (2 * h / t + 2 * h / t                 # the norm's input, the input projection's input
             + 2 * 18560 / t                       # z, x, B, C, dt as projected (the scan's input)
             + 2 * d / t + 2 * d / t               # the scan's output, the gated norm's input
             + 2 * d / t + 4 * 8 / t)              # the output projection's input, fp32 rstd a group
    attention = 2 * h / t + 2 * h / t + 2 * (4096 + 1024 + 1024) / t + 2 * 4096 / t + 4 * 32 / t
    mlp = 2 * h / t + 2 * h / t + 2 * 21504 / t + 2 * 21504 / t
    for k, per_token in (("M", mamba), ("*", attention), ("-", mlp)):
        assert activation_bytes_per_layer(kind(H8, k), 1, t, True, "none", "flash") == pytest.approx(sb * per_token)
    mean = activation_bytes_per_layer(H8, 1, t, True, "none", "flash")
    assert mean == pytest.approx(sb * (24 * mamba + 4 * attention + 24 * mlp) / 52)
    assert activation_bytes_per_layer(H8, 1, t, True, "full", "flash") == 2 * sb * h / t   # the layer input


def test_hybrid_views_weigh_to_one():
    assert sum(w for w, _ in hybrid_views(H8)) == pytest.approx(1.0)
    assert [m.layer_kind for _, m in hybrid_views(H8)] == ["M", "*", "-"]


@pytest.mark.parametrize("plan,key", [("tp=16", "tp"), ("tp=2,pp=2,cp=2", "cp"), ("tp=2,pp=4,vp=2", "vp"),
                                      ("tp=2,recompute=selective,recompute_modules=core_attn", "recompute"),
                                      ("tp=2,recompute=full,offload=qkv_proj", "offload")])
def test_plans_a_hybrid_may_not_run(plan, key):
    with pytest.raises(ConfigError, match=f"field '{key}'"):
        evaluate(H8, load_chip("h100-sxm"), 64, 64, parse_plan(plan))


def test_cli_refusal_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "phaze.cli", "evaluate", "--workload", "nemotron-h-8b", "--arch",
                           "h100-sxm", "--devices", "16", "--global-batch", "16", "--plan", "tp=2,cp=2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Mamba-2" in proc.stderr and "cp" in proc.stderr


def test_a_plan_runs_and_fits_where_it_should():
    r = evaluate(H8, load_chip("h100-sxm"), 64, 128, parse_plan("tp=2,pp=1,mbs=1,sp=1,zero=1"))
    assert r.step_time_s > 0 and r.fits
    # a tenth of the parameters and the same tokens: far below a dense 70B's step
    dense = evaluate(load_model("llama3-70b", S), load_chip("h100-sxm"), 64, 128,
                     parse_plan("tp=8,pp=2,mbs=1,sp=1,zero=1,recompute=full"))
    assert r.step_time_s < dense.step_time_s / 4


def _row(**kw):
    base = dict(run_id="X1", source_id="SX", gpu="H100-SXM5-80GB", gpu_count="64", seq_len="8192",
                global_batch="128", micro_batch="1", tp="2", pp="1", measured_metric="step_time_s",
                measured_value="2.0")
    return {**base, **kw}


def test_rows_naming_nemotron_h_are_expressed_as_the_hybrid():
    for name in ("Nemotron-H 8B", "NemotronH_8B", "nemotron-h-8b-base-8k"):
        case = row_to_case(_row(model=name))
        assert isinstance(case, Case), name
        assert case.model.hybrid_pattern == H8.hybrid_pattern
    same = row_to_case(_row(model="Nemotron-H 8B", layers="52", hidden="4096", heads="32"))
    assert isinstance(same, Case) and same.model.hybrid
    other = row_to_case(_row(model="Nemotron-H 8B", layers="48", hidden="4096", heads="32"))
    assert isinstance(other, Skipped) and "layer pattern is unknown" in other.reason
    pure = row_to_case(_row(model="Mamba2-8B"))
    assert isinstance(pure, Skipped) and "ships no workload" in pure.reason


def test_nemotron_h_hugging_face_config_reads_as_the_shipped_workload():
    """nvidia/Nemotron-H-8B-Base-8K's config.json fields (NVIDIA's remote code, configuration_nemotron_h.py)."""
    cfg = {"model_type": "nemotron_h", "hidden_size": 4096, "num_hidden_layers": 52, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 21504, "vocab_size": 131072,
           "hybrid_override_pattern": H8.hybrid_pattern, "mamba_num_heads": 128, "mamba_head_dim": 64,
           "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "mlp_hidden_act": "relu2",
           "tie_word_embeddings": False, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
    m = model_from_hf_config(cfg)
    assert m.params == H8.params and m.hybrid_pattern == H8.hybrid_pattern
    assert model_flops_per_sample(m) == model_flops_per_sample(H8)
    with pytest.raises(ConfigError) as e:
        model_from_hf_config({**cfg, "hybrid_override_pattern": "MX" * 26})
    assert e.value.field == "hybrid_override_pattern" and "E (mixture of experts)" in e.value.message
    with pytest.raises(ConfigError) as e:     # MoE layers without the experts' fields
        model_from_hf_config({**cfg, "hybrid_override_pattern": "ME" * 26})
    assert e.value.field == "n_routed_experts"


def test_mamba2_hugging_face_config_is_mamba_layers_only():
    """state-spaces/mamba2-2.7b as transformers' Mamba2Config: 64 layers of 80 heads of 64, state
    128, one group, vocabulary 50,288, tied embeddings; Dao and Gu publish 2.7B."""
    cfg = {"model_type": "mamba2", "hidden_size": 2560, "num_hidden_layers": 64, "num_heads": 80, "head_dim": 64,
           "state_size": 128, "n_groups": 1, "conv_kernel": 4, "chunk_size": 256, "vocab_size": 50288,
           "tie_word_embeddings": True}
    m = model_from_hf_config(cfg)
    assert m.layer_kind == "M" and m.attention_layers == 0
    assert m.params == pytest.approx(2.7e9, rel=0.01)
    r = evaluate(m, load_chip("h100-sxm"), 8, 16, parse_plan("tp=1,mbs=1"))   # no attention heads to divide
    assert r.step_time_s > 0
    with pytest.raises(ConfigError, match="groups \\(1\\)"):   # one group: Megatron-Core asserts tp divides it
        evaluate(m, load_chip("h100-sxm"), 8, 16, parse_plan("tp=2,mbs=1,sp=1"))
    for key in ("num_hidden_layers", "num_heads"):   # a JSON true is not a count of one
        with pytest.raises(ConfigError, match=f"field '{key}': must be a positive integer, got True"):
            model_from_hf_config({**cfg, key: True})


# Dao and Gu's Mamba-2 sizes (NeMo 2.5.0 BaseMambaConfig*): name -> (layers, hidden, published size)
MAMBA2 = {"130m": (24, 768, 130e6), "370m": (48, 1024, 370e6), "780m": (48, 1536, 780e6),
          "1.3b": (48, 2048, 1.3e9), "2.7b": (64, 2560, 2.7e9)}


@pytest.mark.parametrize("size", sorted(MAMBA2))
def test_mamba2_parameters_by_hand_from_mamba_ssm(size):
    """mamba_ssm 2.2.4's Mamba2 and MixerModel with their defaults: in_proj to z, x, B, C (one group of
    state 128) and dt (d_inner / 64 heads), no bias; a depthwise convolution of width 4 with a bias over
    x, B, C; A_log, D and dt_bias a head; the gated RMSNorm's weight; out_proj; each block's RMSNorm;
    a tied 50,288-token table and the final norm. Each total rounds to the size in its name."""
    layers, h, named = MAMBA2[size]
    d, heads, xbc = 2 * h, 2 * h // 64, 2 * h + 2 * 128
    block = h * (d + xbc + heads) + xbc * 4 + xbc + 3 * heads + d + d * h + h
    m = load_model(f"mamba2-{size}")
    assert (m.layers, m.hidden, m.hybrid_counts, m.mamba_heads, m.mamba_chunk) == (layers, h, {"M": layers}, heads, 256)
    assert m.params == layers * block + 50288 * h + h
    digits = 0.1e9 if named >= 1e9 else 10e6
    assert abs(m.params - named) < digits / 2, f"{m.params:,} does not round to {named:,.0f}"


def test_mamba2_workloads_are_what_phaze_reads_from_their_configs():
    """The shipped 2.7B equals transformers' mamba2 config of it; a row or --workload naming it by
    NeMo's recipe name finds it; tp beyond its one group is refused naming the Mamba-2 groups, not
    the attention heads it does not have."""
    cfg = {"model_type": "mamba2", "hidden_size": 2560, "num_hidden_layers": 64, "num_heads": 80, "head_dim": 64,
           "state_size": 128, "n_groups": 1, "conv_kernel": 4, "chunk_size": 256, "vocab_size": 50288,
           "tie_word_embeddings": True, "max_position_embeddings": 2048}
    shipped = load_model("mamba2-2.7b")
    read = model_from_hf_config(cfg, name=shipped.name)
    assert read.params == shipped.params and model_flops_per_sample(read) == model_flops_per_sample(shipped)
    case = row_to_case(_row(model="mamba2_2_7b", tp="1", seq_len="2048"))
    assert isinstance(case, Case) and case.model.params == shipped.params
    bad = subprocess.run([sys.executable, "-m", "phaze.cli", "place", "--workload", "state-spaces/mamba2-1.3b",
                          "--arch", "a100-80gb", "--devices", "8", "--global-batch", "64", "--tp", "2"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Mamba-2 heads (64) and groups (1); allowed: 1" in bad.stderr
    ok = subprocess.run([sys.executable, "-m", "phaze.cli", "place", "--workload", "mamba2-130m", "--arch",
                         "h100-sxm", "--devices", "8", "--global-batch", "64", "--top", "1"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "tp=1," in ok.stdout and "KV heads" not in ok.stdout
    assert "tp 1 (not 2,4,8: does not divide the Mamba-2 heads (24) and groups (1));" in ok.stdout


def test_schedule_cli_picks_a_kind(tmp_path):
    def run(*extra):
        return subprocess.run([sys.executable, "-m", "phaze.cli", "schedule", "--workload", "nemotron-h-8b",
                               "--arch", "tpuv5p", "--tp", "2", "--seq-len", "1024", *extra],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    ok = run("--layer-kind", "attention")
    assert ok.returncode == 0 and "one layer of its 4 attention layers" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "phaze.cli", "schedule", "--workload", "llama3-8b", "--arch",
                          "tpuv5p", "--layer-kind", "mlp"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--layer-kind" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_selective_recompute_re_runs_only_the_attention_layers_core():
    """Megatron's selective recompute checkpoints the core attention: an unfused attention layer
    re-runs its scores, softmax and context; a Mamba-2 or MLP layer has none to re-run."""
    for k, reruns in (("*", True), ("M", False), ("-", False)):
        g = layer_graph(kind(H8, k), 1, 1, False, "standard", "selective")
        assert any(o.name == "recompute.scores" for o in g.bwd) == reruns, k
        assert not any(o.name.startswith("recompute.") and not o.core_attention for o in g.bwd), k


def test_the_placement_searches_what_a_hybrid_may_run():
    """No context parallelism even at 32K tokens (a transformer would search cp up to 8), no interleaving."""
    long = with_seq_len(H8, 32768)
    assert cp_values(long, PlacementOptions()) == (1,)
    assert cp_values(with_seq_len(load_model("llama3-8b"), 32768), PlacementOptions()) != (1,)
    assert vp_values(H8, 4, PlacementOptions()) == (1,)
    assert vp_values(load_model("llama3-8b"), 4, PlacementOptions()) != (1,)


def test_the_printout_says_the_kinds(capsys):
    import json

    from phaze.cli import main
    assert main(["evaluate", "--workload", "nemotron-h-8b", "--arch", "h100-sxm", "--devices", "16",
                 "--global-batch", "32", "--seq-len", "1024", "--plan", "tp=2,sp=1", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["assumptions"]["layers"].startswith("24 Mamba-2, 4 attention, 24 MLP (hybrid_pattern)")
    assert out["params"] == H8.params


def test_a_megatron_core_preset_places_a_hybrid_without_its_recompute_modules():
    """Megatron-Core's preset re-runs the core attention under selective recompute (its
    --recompute-modules), which is not modelled for a hybrid: for a hybrid it sets no modules
    (selective recompute is then Megatron-LM's), so ``place`` finds plans (it found none, and
    blamed the global batch); asking for the modules names --recompute-modules."""
    from phaze.framework import framework, options_with
    from phaze.placement import place
    fw = framework("megatron-core", "test", "framework")
    plain, _ = options_with(fw, PlacementOptions(), set(), "bf16")
    assert plain.recompute_modules == ("core_attn",)
    options, changes = options_with(fw, PlacementOptions(tp=(1, 2), pp=(1, 2)), set(), "bf16", H8)
    assert options.recompute_modules == () and "recompute_modules" not in changes and options.tp_async
    chip = load_chip("h100-sxm")
    res = place(H8, chip, 64, 768, options, top=1)
    assert res.best is not None and res.best.plan.tp_async
    asked = place(H8, chip, 64, 768, PlacementOptions(tp=(1, 2), pp=(1, 2), recompute_modules=("core_attn",)), top=1)
    assert asked.best is None and asked.infeasible_source == "--recompute-modules"
    assert "not modelled for a hybrid; allowed: no modules" in asked.infeasible_reason


# --- hybrids with mixture-of-experts layers (E) ---------------------------------------------------------
N3 = load_model("nemotron-3-nano-30b-a3b")   # 23 M, 6 *, 23 E; hidden 2688; 128 experts of 1856, top 6


def test_nemotron_3_nano_counts_by_hand():
    """Megatron-Bridge 0.3.1's Nemotron3NanoProvider shapes, counted by hand: a Mamba-2 layer
    (in_proj to z, x, B, C, dt; the convolution over x, B, C with its bias; A_log, D, dt_bias; the
    gated norm; out_proj; the pre-norm), an attention layer (q, k, v, o; two query groups), an MoE
    layer (the router, 128 experts and one shared expert of two matrices each), two untied token
    tables and the final norm: 31,577,937,344, NVIDIA's 31.6B; active with 6 of the 128 experts,
    3.58B (its 3.6B with the embeddings)."""
    h, V = 2688, 131072
    d, G, N, H = 64 * 64, 8, 128, 64                         # d_inner, groups, state, Mamba-2 heads
    mamba = h * (2 * d + 2 * G * N + H) + (d + 2 * G * N) * (4 + 1) + 3 * H + d + d * h + h
    attention = h * (32 * 128 + 2 * 2 * 128) + 32 * 128 * h + h
    expert, shared = 2 * h * 1856, 2 * h * 3712
    moe = h * 128 + 128 * expert + shared + h
    total = 23 * mamba + 6 * attention + 23 * moe + 2 * V * h + h
    assert N3.params == total == 31_577_937_344
    assert N3.moe_layers == 23 and N3.hybrid_counts == {"M": 23, "*": 6, "E": 23}
    assert N3.active_params == total - 23 * (128 - 6) * expert
    assert abs(N3.active_params - 3.6e9) < 0.05e9 and abs(N3.params - 31.6e9) < 0.05e9


def test_an_moe_layer_of_a_hybrid_is_its_norm_router_and_experts():
    """The E kind's layer graph: the pre-norm, the router (2 T h E), the routed experts over T k
    tokens and the shared expert (two matrices each, squared ReLU as relu), the residual; no
    attention and no Mamba-2 mixer. The other kinds hold no experts, and the mean layer weighs
    the three kinds by their shares, E with the plan's expert layout."""
    from phaze.graph import ExpertLayout
    T, h, k, f, fs, E = 8192, 2688, 6, 1856, 3712, 128
    views = dict((v.layer_kind, v) for _, v in hybrid_views(N3))
    g = layer_graph(views["E"], 1, 1, False, "flash", "none")
    fwd = {o.name: o for o in g.fwd}
    assert fwd["router"].flops == 2 * T * h * E
    assert fwd["expert_up"].flops + fwd["expert_down"].flops == 2 * (2 * T * k * h * f)
    assert not any(o.core_attention or o.name.startswith(("qkv", "mamba")) for o in g.fwd)
    assert tensor_flops(g.fwd) == 2 * T * h * E + 2 * (2 * T * k * h * f) + 2 * (2 * T * h * fs)
    assert not views["M"].moe and not views["*"].moe and views["E"].moe
    layout = ExpertLayout(ep=8)
    mix = layer_mix(N3, layout)
    assert [(round(w * 52), v.layer_kind, lm) for w, v, lm in mix] == [(23, "M", None), (6, "*", None),
                                                                       (23, "E", layout)]


@pytest.mark.parametrize("changes, field", [({"experts": 0, "top_k": 0, "shared_experts": 0}, "experts"),
                                            ({"hybrid_pattern": "M*" * 26}, "experts"),
                                            ({"dense_layers": 2}, "hybrid_pattern")])
def test_e_layers_and_experts_come_together(changes, field):
    from phaze.workload import hybrid_error
    bad, message = hybrid_error(replace(N3, **changes))
    assert bad == field and message


def test_the_recipe_runs_and_place_finds_expert_parallel_plans():
    """Megatron-Bridge's pretraining recipe (tp 4, sp, ep 8, mbs 2, no recompute, DeepEP) on 64
    H100s, global batch 3,072: it fits, its experts' all-to-alls show, and a device holds the
    dense weights over tp and the routed experts over ep x etp: the expert-parallel group halves
    the experts' bytes from ep 8 to ep 16. ``place`` ranks plans with ep among 8 and 16."""
    from phaze.placement import place
    chip = load_chip("h100-sxm")
    plan = parse_plan("tp=4,pp=1,mbs=2,recompute=none,sp=1,ep=8,etp=1,dispatcher=deepep,zero=1")
    res = evaluate(N3, chip, 64, 3072, plan)
    assert res.fits and res.communication_by_group_s["expert_parallel_s"] > 0
    wide = evaluate(N3, chip, 64, 3072, replace(plan, ep=16))
    experts = 23 * 128 * 2 * 2688 * 1856       # routed-expert parameters
    # 2 B of weights and 2 B of gradients an expert parameter held; the distributed optimizer's
    # states shard over ep x the experts' data-parallel group, 64 ranks at either ep
    saved = res.stage_memory[0].weights_and_optimizer_bytes - wide.stage_memory[0].weights_and_optimizer_bytes
    assert saved == pytest.approx(4 * experts * (1 / 8 - 1 / 16), rel=1e-9)
    # a space that holds the recipe's plan: its best is at least as fast
    best = place(N3, chip, 64, 3072, PlacementOptions(tp=(2, 4), pp=(1, 2), mbs=(1, 2), ep=(8, 16),
                                                      dispatcher=("deepep",)), top=3)
    assert best.best is not None and best.best.plan.ep in (8, 16)
    assert best.best.result.step_time_s <= res.step_time_s * (1 + 1e-9)


def test_a_hybrids_flop_conventions_with_moe_layers():
    """NeMo 2.5's nemotronh formula (model_causal for a hybrid) counts no MoE layers: refused for
    one with E layers rather than undercounted; ``model`` counts phaze's own FLOPs, every kind."""
    with pytest.raises(ValueError, match="counts no mixture-of-experts layers"):
        convention_flops_per_step(N3, 8, "model_causal", "none")
    f = model_flops_per_sample(N3)
    assert convention_flops_per_step(N3, 8, "model", "none") == 8 * f
    # 6 FLOPs a token and weight a token uses (top 6 of the routed experts; the input table and the
    # norms read, not multiplied), the 6 attention layers' two products (non-causal, as model FLOPs
    # count them), and the Mamba-2 scans' own products, a little
    s = N3.seq_len
    mixer_rest = (4096 + 2 * 8 * 128) * (4 + 1) + 3 * 64 + 4096     # conv, A_log/D/dt_bias, gated norm
    weights = N3.active_params - N3.vocab * N3.hidden - 53 * N3.hidden - 23 * mixer_rest
    linear, attention = 6 * weights * s, 6 * 3 * 4 * s * s * 32 * 128
    assert 0 < f - linear - attention < 0.02 * f


def test_a_nemotron_3_hugging_face_config_reads_as_the_shipped_workload():
    """A nemotron_h config with E layers: the experts' fields under the names Megatron-Bridge
    0.3.1 maps (n_routed_experts, num_experts_per_tok, moe_intermediate_size,
    moe_shared_expert_intermediate_size, n_group/topk_group); one group is no group limit."""
    cfg = {"model_type": "nemotron_h", "hidden_size": 2688, "num_hidden_layers": 52, "num_attention_heads": 32,
           "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 1856, "vocab_size": 131072,
           "hybrid_override_pattern": N3.hybrid_pattern, "mamba_num_heads": 64, "mamba_head_dim": 64,
           "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128, "mlp_hidden_act": "relu2",
           "n_routed_experts": 128, "num_experts_per_tok": 6, "moe_intermediate_size": 1856,
           "moe_shared_expert_intermediate_size": 3712, "n_group": 1, "topk_group": 1,
           "tie_word_embeddings": False, "max_position_embeddings": 262144, "torch_dtype": "bfloat16"}
    m = model_from_hf_config(cfg)
    assert m.params == N3.params and m.active_params == N3.active_params and m.router_groups == 0
    assert model_flops_per_sample(m) == model_flops_per_sample(N3)
    grouped = model_from_hf_config({**cfg, "n_group": 8, "topk_group": 2})
    assert (grouped.router_groups, grouped.router_group_topk) == (8, 2)


@pytest.mark.parametrize("name", ["Nemotron 3 Nano 30B-A3B", "NVIDIA-Nemotron-3-Nano-30B-A3B", "Nemotron-3-Nano"])
def test_a_row_naming_nemotron_3_nano_runs_the_shipped_workload(name):
    case = row_to_case(_row(model=name))
    assert isinstance(case, Case) and case.model.hybrid_pattern == N3.hybrid_pattern and case.model.moe


def test_schedule_cli_schedules_an_moe_layer_of_a_hybrid(capsys):
    """``phaze schedule --layer-kind moe``: one of Nemotron 3 Nano's 23 E layers, its router and
    experts (no attention, no Mamba-2 mixer); a hybrid without E layers says which kinds it has."""
    from phaze.cli import main
    assert main(["schedule", "--workload", "nemotron-3-nano-30b-a3b", "--arch", "h100-sxm", "--tp", "2",
                 "--seq-len", "1024", "--layer-kind", "moe", "--format", "json"]) == 0
    text = capsys.readouterr().out
    assert "router" in text and "expert_up" in text and "qkv" not in text and "mamba" not in text
    assert main(["schedule", "--workload", "nemotron-h-8b", "--arch", "h100-sxm", "--layer-kind", "moe"]) == 2
    err = capsys.readouterr().err
    assert "--layer-kind" in err and "allowed: mamba, attention, mlp" in err


def test_the_mamba_gate_runs_inside_the_chunk_scan():
    """Megatron-Core 0.16's training path calls mamba_split_conv1d_scan_combined without
    rmsnorm_weight, so mamba_ssm 2.2.4 passes z to the chunk scan: the SiLU gate (and the D skip) run
    in the scan's kernel, which then reads z and writes the gated output beside the ungated one
    (one element each, 16-bit, per token and channel); its backward (_chunk_scan_bwd_dz) reads the
    output's gradient, the ungated output and z and writes both gradients. The group norm after it
    is a pass of its own (Megatron's self.norm(y), RMSNormGated without z)."""
    t = 2
    d = 128 // t * 64
    g = layer_graph(kind(H8, "M"), 1, t, True, "flash", "none")
    gate = next(o for o in g.fwd if o.name == "ssd_gate")
    back = next(o for o in g.bwd if o.name == "ssd_gate.bwd")
    assert gate.elements == back.elements == S * d
    assert (gate.bytes_read, gate.bytes_written) == (2 * S * d, 2 * S * d)
    assert (back.bytes_read, back.bytes_written) == (3 * 2 * S * d, 2 * 2 * S * d)
    norm = next(o for o in g.fwd if o.name == "mamba_norm")
    assert (norm.bytes_read, norm.bytes_written) == (2 * S * d, 2 * S * d)
