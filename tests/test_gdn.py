"""Gated DeltaNet layers (Qwen3-Next; Megatron-Core 0.16 ssm/gated_delta_net.py on fla-core 0.6):
the mixer's parameters, FLOPs and memory by hand, the layer kinds' shares, the shared experts'
gate, the refusals and the Hugging Face reader."""
from __future__ import annotations

from dataclasses import replace

import pytest

from phaze.arch import load_chip
from phaze.catalogue import load_model
from phaze.configio import ConfigError
from phaze.graph import layer_graph, tensor_flops
from phaze.memory import activation_bytes_per_layer
from phaze.plan import parse_plan
from phaze.stage import layer_mix
from phaze.step import evaluate
from phaze.workload import _check_moe

QN = load_model("qwen3-next-80b-a3b")


def test_gdn_mixer_parameters_by_hand():
    h, qk, v, hv = 2048, 16 * 128, 32 * 128, 32
    mixer = h * (2 * qk + 2 * v + 2 * hv) + (2 * qk + v) * 4 + 2 * hv + 128 + v * h
    assert QN.gdn_params == mixer
    assert QN.gdn_layers == 36   # three of every four of 48


def test_gdn_mixer_flops_by_hand():
    """tp 2: 8 key and 16 value heads a rank; chunks of 64 over 4,096 tokens."""
    gdn = replace(QN, linear_attention_interval=-1, experts=0, top_k=0, shared_experts=0)
    t, T, h, C, dk, dv = 2, 4096, 2048, 64, 128, 128
    hk, hv = 16 // t, 32 // t
    chunks = T // C
    g = layer_graph(gdn, 1, t, True, "flash", "none")
    names = [o.name for o in g.fwd]
    assert names[:4] == ["ln1", "ln1.all_gather", "gdn_in", "gdn_conv"] and "gdn_out.reduce_scatter" in names
    mixer = (2 * T * h * (2 * hk * dk + 2 * hv * dv + 2 * hv)
             + 2 * chunks * hv * (C * dk * C + C * C * dk + C * C * dv + C * dk * dv + dk * C * dv + C * dk * dv
                                  + C * dk * C + C * C * dv)
             + 2 * T * hv * dv * h)
    ffn = 2 * T * h * 2 * 5632 // t + 2 * T * 5632 // t * h
    assert tensor_flops(g.fwd) == mixer + ffn
    # the triangular solve for A: sum of i^2 for i < 64 multiply-adds a chunk and head, on the vector unit
    solve = next(o for o in g.fwd if o.name == "gdn_solve")
    assert solve.flops == pytest.approx(chunks * hv * 2 * 64 ** 3 / 3) and solve.bytes_read == solve.bytes_written == 0


def test_the_kinds_and_their_shares():
    kinds = [(w, m.linear_attention_interval) for w, m, _ in layer_mix(QN)]
    assert kinds == [(0.75, -1), (0.25, 0)]


@pytest.mark.parametrize("plan,key,allowed", [
    ("tp=3,ep=8", "tp", "allowed: 1, 2, 4, 8, 16"),          # the divisors of gcd(16 key, 32 value heads)
    ("tp=2,cp=2,ep=8", "cp", "allowed: 1"),
    ("tp=2,pp=2,ep=8,recompute=full,offload=qkv_proj", "offload", "allowed: no offload and pipe_schedule 1f1b")])
def test_plans_it_may_not_run(plan, key, allowed):
    with pytest.raises(ConfigError, match=f"field '{key}'") as e:
        evaluate(QN, load_chip("h100-sxm"), 96, 96, parse_plan(plan))
    assert e.value.message.endswith(allowed)


def test_gdn_layer_memory_against_the_gated_attention_layers():
    """Dense Qwen3-Next shapes, tp 1, 16-bit, no recompute, 4,096 tokens: per token the gated full
    attention keeps its norm's and projection's inputs (4 x 2048), q, k, v (2 x (4096 + 512 + 512)),
    the out-projection's input (2 x 4096), the kernel's fp32 statistics (4 x 16) and the gate's two
    inputs (2 x (4096 + 4096)): 43,072 B; the GDN mixer its norm's and projection's inputs (4 x 2048),
    q, k, v before the convolution (2 x 8192), q and k after the L2 norms (2 x 4096) with their fp32
    reciprocal norms (4 x 2 x 16), q and k repeated to 32 value heads and v (2 x (8192 + 4096)), the
    fp32 cumulative g, beta and A (4 x 32 + 2 x 32 + 2 x 64 x 32), the softplus's fp32 input and
    output (8 x 32), z, the gated norm's and the out-projection's inputs (3 x 2 x 4096): 86,592 B."""
    dense = replace(QN, experts=0, top_k=0, shared_experts=0, shared_expert_ffn_hidden=0, expert_ffn_hidden=0)
    gdn = activation_bytes_per_layer(replace(dense, linear_attention_interval=-1), 1, 1, False, "none", "flash")
    full = activation_bytes_per_layer(replace(dense, linear_attention_interval=0), 1, 1, False, "none", "flash")
    assert gdn - full == (86_592 - 43_072) * 4096
    mixed = activation_bytes_per_layer(dense, 1, 1, False, "none", "flash")
    assert mixed == pytest.approx(0.75 * gdn + 0.25 * full)


@pytest.mark.parametrize("attention", ["flash", "standard"])
def test_a_gdn_layer_keeps_as_much_under_core_attn_recompute(attention):
    """A Gated DeltaNet layer has no core attention, so Megatron-Core's checkpointed core_attn
    frees nothing of it: the full-attention layer it is counted from and the attention bytes taken
    off it both drop the core's (a fused kernel's statistics had been taken off without being in)."""
    g = replace(QN, experts=0, top_k=0, shared_experts=0, shared_expert_ffn_hidden=0, expert_ffn_hidden=0,
                linear_attention_interval=-1)
    assert (activation_bytes_per_layer(g, 1, 1, False, "selective+core_attn", attention)
            == activation_bytes_per_layer(g, 1, 1, False, "none", attention))


def test_qwen3_next_hugging_face_config_reads_as_the_workload():
    """Qwen3-Next's config.json fields (transformers 4.57.1's Qwen3NextConfig defaults)."""
    from phaze.hf_config import model_from_hf_config
    cfg = {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
           "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5632, "moe_intermediate_size": 512,
           "shared_expert_intermediate_size": 512, "num_experts": 512, "num_experts_per_tok": 10,
           "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
           "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
           "partial_rotary_factor": 0.25, "rope_theta": 10_000_000, "vocab_size": 151936,
           "tie_word_embeddings": False, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
           "decoder_sparse_step": 1, "mlp_only_layers": [], "torch_dtype": "bfloat16", "hidden_act": "silu"}
    m = model_from_hf_config(cfg)
    assert m.gdn_layers == 36 and m.attention_output_gate and m.experts == 512 and m.shared_experts == 1
    assert m.shared_expert_gate and m.params == QN.params
    # transformers' own layer_types, the same pattern: the same model; another: by count, noted
    kinds = ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(48)]
    assert model_from_hf_config(dict(cfg, layer_types=kinds)).params == QN.params
    odd = model_from_hf_config(dict(cfg, layer_types=kinds[::-1]))
    assert odd.gdn_layers == 36 and any("costed by count" in n for n in odd.notes)
    with pytest.raises(ConfigError, match="field 'layer_types'"):
        model_from_hf_config(dict(cfg, layer_types=["linear_attention"] * 48))


def test_the_shared_experts_gate_by_hand():
    """Megatron-Core's SharedExpertMLP with --moe-shared-expert-gate: a weight vector of hidden
    2048 a layer; the output times sigmoid(x.w) (3 FLOPs an element, one sigmoid a token) after the
    tp reduce-scatter; it keeps the output and its sigmoid (2 x (2048 + 1) B a token, over tp)."""
    from phaze.memory import activation_bytes_per_layer
    off = replace(QN, shared_expert_gate=False)
    assert QN.params - off.params == 48 * 2048
    g = layer_graph(QN, 1, 2, True, "flash", "none")
    gate = next(o for o in g.fwd if o.name == "shared_gate")
    assert gate.flops == 3 * 2048 * 4096 / 2 and gate.special == 4096 / 2
    names = [o.name for o in g.fwd]
    assert names.index("shared_gate") > names.index("shared.reduce_scatter")
    mem = lambda m: activation_bytes_per_layer(m, 1, 2, True, "none", "flash")  # noqa: E731
    assert mem(QN) - mem(off) == pytest.approx(2 * (2048 + 1) * 4096 / 2)
    with pytest.raises(ConfigError, match="field 'shared_expert_gate'"):
        _check_moe(replace(QN, shared_experts=0), "w.yaml")
