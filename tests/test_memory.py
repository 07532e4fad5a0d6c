"""Activation and state memory against Korthikanti et al. 2022 and a hand count."""
from dataclasses import replace

import pytest

from phaze.catalogue import load_model
from phaze.memory import activation_bytes_per_layer, state_bytes_per_param
from phaze.workload import Model

MODELS = ["gpt3-175b", "megatron-gpt-18b", "megatron-gpt-1t"]


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("mbs", [1, 4])
def test_activation_bytes_equal_korthikanti(name, tp, sp, recompute, mbs):
    m = load_model(name)
    ours = activation_bytes_per_layer(m, mbs, tp, sp and tp > 1, recompute, "standard")
    s, b, h, a, t = m.seq_len, mbs, m.hidden, m.heads, tp
    # the closed forms written out here, independently of phaze.memory
    if recompute == "full":
        expect = 2 * s * b * h / (t if sp and tp > 1 else 1)
    else:
        attn = 0 if recompute == "selective" else 5 * a * s / h
        if sp and tp > 1:
            expect = s * b * h * (34 + attn) / t
        else:
            expect = s * b * h * (10 + 24 / t + attn / t)
    assert ours == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("dropout", [True, False])
def test_pytorch_softmax_keeps_its_fp32_output_by_hand(dropout):
    # GPT-2 XL, 25 heads, 1,024 tokens, fp16: micro-batch 1 is off Megatron's kernel (25 rows, not
    # a multiple of 4), 4 is on it. Off it, autograd keeps the softmax's fp32 output (4 B a score)
    # for its backward where the kernel keeps its 16-bit one (2 B); the dropout keeps its mask (1 B)
    # and output (2 B), the next product's input; without dropout that input is the downcast copy
    m = replace(load_model("gpt2-xl", 1024), precision="fp16", dropout=dropout)
    meg = replace(m, softmax_kernel="megatron")
    a, s = m.heads, m.seq_len
    for b in (1, 4):
        scores = a * s * s * b
        one = activation_bytes_per_layer(m, b, 1, False, "none", "standard")
        assert activation_bytes_per_layer(replace(m, softmax_kernel="fused"), b, 1, False, "none", "standard") == one
        if b == 4:   # on the kernel's shapes: the same bytes
            assert activation_bytes_per_layer(meg, b, 1, False, "none", "standard") == one
            continue
        extra = (4 - 2) + (0 if dropout else 2)
        assert activation_bytes_per_layer(meg, b, 1, False, "none", "standard") - one == pytest.approx(extra * scores)
        # selective recompute (the core attention) and flash keep none of it
        for rc, att in (("selective", "standard"), ("none", "flash")):
            kept = activation_bytes_per_layer(meg, b, 1, False, rc, att)
            assert kept == activation_bytes_per_layer(m, b, 1, False, rc, att)


def test_flash_attention_drops_the_quadratic_term():
    m = load_model("gpt3-175b")
    sel = activation_bytes_per_layer(m, 1, 8, True, "selective", "standard")
    fl = activation_bytes_per_layer(m, 1, 8, True, "none", "flash")
    assert fl == pytest.approx(sel + 4 * m.heads * m.seq_len / 8)  # fp32 LSE per row


def test_swiglu_gqa_no_dropout_hand_count():
    m = load_model("llama2-70b")  # h 8192, 64 heads of 128, 8 kv heads, f 28672, no dropout
    s, b, h, t, f = 4096, 1, 8192, 8, 28672
    q, kv = 8192, 1024
    rep = 2 * 4 * s * b * h             # ln1 in, qkv in, ln2 in, ffn in; 2 bytes each; no masks
    split = 2 * s * b * (q + 2 * kv + q + 2 * f + f) / t
    core = 2 * 64 * s * s * b / t       # softmax output kept for the context GEMM
    assert activation_bytes_per_layer(m, 1, t, False, "none", "standard") == pytest.approx(rep + split + core)


def test_state_bytes():
    assert state_bytes_per_param("adam", 0, 64) == 16
    assert state_bytes_per_param("adam", 1, 4) == pytest.approx(2 + 2 + 3)
    assert state_bytes_per_param("adam", 3, 8) == pytest.approx(16 / 8)
    assert state_bytes_per_param("sgd", 0, 8) == 4


@pytest.mark.parametrize("tp, sp", [(1, False), (8, True)])
def test_per_op_checkpoint_bytes_hand_count(tp, sp):
    """What torchtitan's per-op policy keeps: the layer input, q and v, the attention output and its
    fp32 log-sum-exp, the gate projection and the down projection's output (SwiGLU), and with tp the
    two reduce-scatter outputs."""
    m = load_model("llama3-8b")
    s, h, a, f, q, kv = 8192, 4096, 32, 14336, 4096, 1024
    rep = 1 / tp if sp else 1
    expect = 2 * s * h * rep + 2 * s * (q + kv + q + f) / tp + 2 * s * h + 4 * a * s / tp
    if tp > 1:
        expect += 2 * 2 * s * h * rep
    got = activation_bytes_per_layer(m, 1, tp, sp, "op", "flash2")
    assert got == pytest.approx(expect, rel=1e-12)
    assert (activation_bytes_per_layer(m, 1, tp, sp, "full", "flash2") < got
            < activation_bytes_per_layer(m, 1, tp, sp, "none", "flash2"))


@pytest.mark.parametrize("tp, sp", [(1, False), (4, True), (4, False)])
@pytest.mark.parametrize("attention", ["flash", "standard"])
def test_fp8_linear_inputs_kept_as_transformer_engine_keeps_them(tp, sp, attention):
    # fused casts (TE 1.13 and 2.8 keep one fp8 layout of a linear's input): the norms' fp8 outputs
    # (qkv and FFN inputs) and the down projection's copy, 1 byte where bf16 keeps 2; the
    # out-projection's fp8 copy sits beside the 16-bit output a fused attention keeps (2 + 1 bytes;
    # unfused, the copy alone); separate casts (torchao) keep the 16-bit tensors
    from dataclasses import replace
    m = load_model("llama3-8b", 4096)
    s, h, q, f = 4096, m.hidden, m.q_dim, m.ffn_hidden
    bf16 = activation_bytes_per_layer(m, 1, tp, sp, "none", attention)
    fused = activation_bytes_per_layer(replace(m, precision="fp8"), 1, tp, sp, "none", attention)
    separate = activation_bytes_per_layer(replace(m, precision="fp8", fp8_casts="separate"), 1, tp, sp, "none",
                                          attention)
    rep = 1 / tp if sp else 1
    out_proj = -1 if attention == "flash" else 1        # bytes an element fp8 saves on the out-projection's input
    saved = 2 * s * h * rep + s * (out_proj * q + f) / tp
    assert bf16 - fused == pytest.approx(saved)
    assert separate == bf16
    # te.Linear (llm-foundry) casts each input itself and keeps the fp8 copy, as the fused layers
    te_linear = activation_bytes_per_layer(replace(m, precision="fp8", fp8_casts="te-linear"), 1, tp, sp, "none",
                                           attention)
    assert te_linear == pytest.approx(fused, rel=1e-12)
    # full recompute keeps the 16-bit layer input only
    assert activation_bytes_per_layer(replace(m, precision="fp8"), 1, tp, sp, "full") == \
        activation_bytes_per_layer(m, 1, tp, sp, "full")


def test_te_linear_shared_norm_keeps_a_copy_per_linear():
    # a parallel block with one norm (GPT-J): in 16 bits qkv and the FFN read the one norm output;
    # under te.Linear each linear keeps its own fp8 copy (2 x 1 byte = the 2 bytes of bf16),
    # torchao keeps the shared 16-bit tensor
    m = Model(name="g", layers=4, hidden=256, heads=8, ffn_hidden=1024, vocab=1000, seq_len=128,
              dropout=False, parallel_block="shared_norm")
    s, f = m.seq_len, m.ffn_hidden
    bf16 = activation_bytes_per_layer(m, 1, 1, False, "none", "flash2")
    te = activation_bytes_per_layer(replace(m, precision="fp8", fp8_casts="te-linear"), 1, 1, False, "none", "flash2")
    separate = activation_bytes_per_layer(replace(m, precision="fp8", fp8_casts="separate"), 1, 1, False, "none",
                                          "flash2")
    assert separate == bf16
    # norm output: 2 -> 1 + 1; the out-projection's input 2 -> 2 + 1; the down projection's 2 -> 1
    assert te - bf16 == pytest.approx(s * m.o_dim - s * f)
