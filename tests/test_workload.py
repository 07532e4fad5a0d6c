"""Workload files, parameter counts and config loading.

Every expected number here comes from outside phaze: a published parameter count (paper table,
official checkpoint, llm-foundry benchmark table), a closed-form formula from a paper, or a count
written out by hand from the architecture. None is copied from phaze's own output.
"""
from __future__ import annotations

import csv
import json
import re
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from phaze.catalogue import find_workload, load_model, name_keys, peft_error, published_params, workload_aliases
from phaze.configio import ConfigError
from phaze.hf_config import model_from_hf_config
from phaze.workload import Model

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ROOT / "workloads"
HF = Path(__file__).resolve().parent / "data" / "hf"
RUNS_CSV = ROOT / "phaze" / "data" / "reference" / "training_runs.csv"

WORKLOAD_FILES = sorted(WORKLOADS.glob("*.yaml"))

REQUIRED = [
    "gpt3-175b", "bert-large", "gpt2-xl", "opt-350m", "opt-175b",
    "llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b",
    *(f"mpt-{s}" for s in ("125m", "350m", "760m", "1b", "3b", "7b", "13b", "30b", "70b")),
    *(f"megatron-gpt-{s}" for s in ("1.7b", "3.6b", "7.5b", "18b", "39b", "76b", "145b",
                                    "310b", "530b", "1t")),
]

# Sources that print counts rounded (to 0.1B, or the billion): allow half of the last printed digit.
ROUNDED_TO = {"megatron-gpt-": 0.1e9, "gpt3-175b": 0.1e9,
              "nemotron-h-": 1e9, "nemotron-nano-": 1e9,   # NVIDIA's hybrids: named by the billion
              "mamba2-1.3b": 0.1e9, "mamba2-2.7b": 0.1e9,   # Dao and Gu's Mamba-2: named to 0.1B
              "llama-": 0.1e9,                               # LLaMA's Table 2: to 0.1B
              "qwen3-1.7b": 0.1e9}                           # Qwen3's model cards: to 0.1B


def _llama4_vision_params() -> int:
    """Llama 4's vision encoder and projector, which its published totals count and phaze does
    not train, by hand from transformers 4.57.1 modeling_llama4.py with the checkpoints'
    vision_config (hidden 1408, MLP 5632, 34 layers, 16 heads, 336-pixel images of 14-pixel
    patches, projector 4096 wide) and the text model's hidden 5120."""
    h, f, layers, patches = 1408, 5632, 34, (336 // 14) ** 2 + 1
    embed = 3 * 14 * 14 * h + h + patches * h + 2 * 2 * h   # unfold linear, class, positions, two LNs
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h   # biased q, k, v, o; MLP; two LNs
    adapter = f * 4096 + 4096 * 4096                          # pixel-shuffle MLP, no biases
    return embed + layers * layer + adapter + 4096 * 5120     # + the multimodal projector


# Models whose size is published only in their name (NVIDIA's Nemotron-3 8B and 22B): the exact totals
# are derived by hand below (test_nemotron3_parameters_by_hand), and here need only be within a tenth of it.
NAMED_ONLY = {"nemotron3-": 0.1,
              "gpt3-20b": 0.1, "gpt3-40b": 0.1,   # NeMo's GPTConfig20B/40B (test_nemo_gpt3_parameters_by_hand)
              "mistral-nemo-": 0.1}               # Mistral AI's "12B" (test_mistral_nemo_parameters_by_hand)

# Published totals that count parts of a checkpoint phaze does not model, by hand.
NOT_MODELLED_PARAMS = {"llama4-": _llama4_vision_params()}


def _rounding(stem: str) -> float:
    for prefix, unit in ROUNDED_TO.items():
        if stem.startswith(prefix):
            return unit
    return 0.0


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


# --- every shipped workload ---------------------------------------------------------------------
def test_required_workloads_present():
    stems = {p.stem for p in WORKLOAD_FILES}
    missing = [n for n in REQUIRED if n not in stems]
    assert not missing, f"missing workload files: {missing}"


@pytest.mark.parametrize("path", WORKLOAD_FILES, ids=lambda p: p.stem)
def test_workload_file_documented(path):
    text = path.read_text()
    assert text.startswith("#"), "header comment citing the sources must come first"
    assert path.stem == path.stem.lower()
    raw = _yaml(path)
    assert isinstance(raw.get("source"), str) and raw["source"].strip()
    assert isinstance(raw.get("published_params"), int) and raw["published_params"] > 0
    # where the count is published: a comment on the published_params line, or (older files
    # such as gpt3-175b.yaml) the source field
    assert re.search(r"^published_params:.*#\s*\S", text, re.M) or "param" in raw["source"], \
        "published_params needs a comment saying where the count is published"


@pytest.mark.parametrize("path", WORKLOAD_FILES, ids=lambda p: p.stem)
def test_params_match_published(path):
    model = load_model(path)
    published = _yaml(path)["published_params"]
    assert published_params(path) == published
    named = next((share for prefix, share in NAMED_ONLY.items() if path.stem.startswith(prefix)), 0.0)
    tolerance = max(0.01 * published, _rounding(path.stem) / 2, named * published)
    extra = next((n for prefix, n in NOT_MODELLED_PARAMS.items() if path.stem.startswith(prefix)), 0)
    assert abs(model.params + extra - published) <= tolerance, (
        f"{path.stem}: ours {model.params:,} vs published {published:,} "
        f"(ratio {model.params / published:.5f})")


@pytest.mark.parametrize("path", WORKLOAD_FILES, ids=lambda p: p.stem)
def test_loads_by_name(path):
    assert load_model(path.stem) == load_model(path)


# --- Megatron GPT: Narayanan et al. SC'21 -----------------------------------------------------------
# Table 1 of the paper: name -> (layers, hidden, heads).
NARAYANAN_TABLE_1 = {
    "1.7b": (24, 2304, 24), "3.6b": (30, 3072, 32), "7.5b": (36, 4096, 32),
    "18b": (40, 6144, 48), "39b": (48, 8192, 64), "76b": (60, 10240, 80),
    "145b": (80, 12288, 96), "310b": (96, 16384, 128), "530b": (105, 20480, 128),
    "1t": (128, 25600, 160),
}


@pytest.mark.parametrize("size", sorted(NARAYANAN_TABLE_1))
def test_megatron_shapes_follow_table_1(size):
    m = load_model(WORKLOADS / f"megatron-gpt-{size}.yaml")
    assert (m.layers, m.hidden, m.heads) == NARAYANAN_TABLE_1[size]
    assert (m.ffn_hidden, m.vocab, m.seq_len, m.max_positions) == (4 * m.hidden, 51200, 2048, 2048)


@pytest.mark.parametrize("size", ["1.7b", "18b", "145b", "530b", "1t"])
def test_megatron_params_equal_narayanan_eq2(size):
    """Eq. (2): P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)) for f = 4h, tied embeddings,
    learned positions, biases, two LayerNorms per layer. The paper's formula leaves out the final
    LayerNorm of the pre-norm stack (weight + bias = 2h), which the model does have."""
    l, h, _ = NARAYANAN_TABLE_1[size]
    V, s = 51200, 2048
    eq2 = 12 * l * h * h * (1 + Fraction(13, 12 * h) + Fraction(V + s, 12 * l * h))
    assert eq2.denominator == 1
    m = load_model(WORKLOADS / f"megatron-gpt-{size}.yaml")
    assert m.params == eq2 + 2 * h


def test_gpt3_params_equal_narayanan_eq2():
    l, h, V, s = 96, 12288, 50257, 2048  # Brown et al. Table 2.1, GPT-2 vocabulary
    eq2 = 12 * l * h * h * (1 + Fraction(13, 12 * h) + Fraction(V + s, 12 * l * h))
    assert load_model("gpt3-175b").params == eq2 + 2 * h


# --- Llama: counts written out by hand ------------------------------------------------------------
def test_llama2_7b_by_hand():
    V, h, L, f = 32000, 4096, 32, 11008
    embedding = V * h                  # tok_embeddings
    per_layer = (4 * h * h             # wq, wk, wv, wo (32 kv heads = 32 heads, no bias)
                 + 3 * h * f           # w1 (gate), w3 (up), w2 (down)
                 + 2 * h)              # attention_norm, ffn_norm (RMSNorm weight only)
    final_norm = h
    lm_head = V * h                    # untied output projection
    total = embedding + L * per_layer + final_norm + lm_head
    assert total == 6_738_415_616      # official HF checkpoint meta-llama/Llama-2-7b-hf
    assert load_model("llama2-7b").params == total


def _llama_by_hand(V, h, L, heads, kv_heads, f, tied=False):
    d = h // heads
    attn = h * heads * d + 2 * h * kv_heads * d + heads * d * h   # q, k, v, o
    return V * h + L * (attn + 3 * h * f + 2 * h) + h + (0 if tied else V * h)


# Official HF checkpoint counts (exact tensor-size sums) and the config.json shapes.
LLAMA = {
    "llama2-7b": ((32000, 4096, 32, 32, 32, 11008), 6_738_415_616),
    "llama2-70b": ((32000, 8192, 80, 64, 8, 28672), 68_976_648_192),
    "llama3-8b": ((128256, 4096, 32, 32, 8, 14336), 8_030_261_248),
    "llama3-70b": ((128256, 8192, 80, 64, 8, 28672), 70_553_706_496),
    "llama3-405b": ((128256, 16384, 126, 128, 8, 53248), 405_853_388_800),
    "llama2-13b": ((32000, 5120, 40, 40, 40, 13824), 13_015_864_320),
}
# Mistral 7B v0.1 (Jiang et al. 2023, Table 1), the same layer as Llama's with 8 KV heads
MISTRAL = {"mistral-7b": ((32000, 4096, 32, 32, 8, 14336), 7_241_732_096)}
# Llama 3.2's text models share the input and output embeddings (tie_word_embeddings true)
LLAMA_TIED = {
    "llama3.2-1b": ((128256, 2048, 16, 32, 8, 8192), 1_235_814_400),
    "llama3.2-3b": ((128256, 3072, 28, 24, 8, 8192), 3_212_749_824),
}


# LLaMA (Touvron et al. 2023, Table 2): dimension, heads, layers; the FFN is the released code's
# 2/3 x 4d rounded up to a multiple of 256
LLAMA1 = {"llama-7b": (4096, 32, 32), "llama-13b": (5120, 40, 40), "llama-33b": (6656, 52, 60),
          "llama-65b": (8192, 64, 80)}


@pytest.mark.parametrize("name", sorted(LLAMA1))
def test_llama1_shapes_from_the_paper_and_code(name):
    h, heads, L = LLAMA1[name]
    f = -(-int(2 * 4 * h / 3) // 256) * 256
    m = load_model(name)
    assert (m.vocab, m.hidden, m.layers, m.heads, m.kv_heads, m.ffn_hidden, m.seq_len) == (32000, h, L, heads, heads, f,
                                                                                          2048)
    assert m.params == _llama_by_hand(32000, h, L, heads, heads, f)
    if name == "llama-13b":   # Llama 2 13B is the same network at a longer context
        assert m.params == LLAMA["llama2-13b"][1]


@pytest.mark.parametrize("name", sorted(LLAMA) + sorted(LLAMA_TIED) + sorted(MISTRAL))
def test_llama_exact_counts(name):
    tied = name in LLAMA_TIED
    (V, h, L, heads, kv, f), checkpoint = (LLAMA_TIED if tied else LLAMA | MISTRAL)[name]
    assert _llama_by_hand(V, h, L, heads, kv, f, tied) == checkpoint
    m = load_model(name)
    assert (m.vocab, m.hidden, m.layers, m.heads, m.kv_heads, m.ffn_hidden) == (V, h, L, heads, kv, f)
    assert (m.activation, m.norm, m.position_embedding, m.bias, m.tied_embeddings, m.dropout) == \
        ("swiglu", "rmsnorm", "rotary", False, tied, False)
    assert m.params == checkpoint


# --- other exact checkpoint counts -------------------------------------------------------------
def test_gpt2_xl_by_hand():
    V, s, h, L = 50257, 1024, 1600, 48
    per_layer = (2 * 2 * h                      # ln_1, ln_2
                 + h * 3 * h + 3 * h + h * h + h  # c_attn, c_proj
                 + h * 4 * h + 4 * h + 4 * h * h + h)  # c_fc, c_proj
    total = V * h + s * h + L * per_layer + 2 * h  # wte, wpe, blocks, ln_f; lm_head tied
    assert total == 1_557_611_200
    assert load_model("gpt2-xl").params == total


def test_opt_350m_by_hand():
    V, h, L, f, e = 50272, 1024, 24, 4096, 512
    embeddings = V * e + (2048 + 2) * h + e * h + h * e  # embed_tokens, positions (+2), project_in/out
    per_layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    total = embeddings + L * per_layer                      # post-norm: no final_layer_norm
    assert total == 331_196_416
    assert load_model("opt-350m").params == total


def test_bert_large_by_hand():
    V, P, T, h, L, f = 30522, 512, 2, 1024, 24, 4096
    embeddings = V * h + P * h + T * h + 2 * h
    per_layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    pooler = h * h + h
    mlm = (h * h + h) + 2 * h + V                # transform dense + LayerNorm, decoder bias (tied)
    bert_model = embeddings + L * per_layer + pooler
    assert bert_model == 335_141_888             # HF BertModel(bert-large-uncased) incl. pooler
    m = load_model("bert-large")
    assert m.params == bert_model + mlm
    assert m.architecture == "encoder" and not m.causal


# --- MPT against the llm-foundry benchmark table (source S04 in the repository CSV) ----------------
def _s04_rows():
    with RUNS_CSV.open(newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["source_id"].startswith("S04")]


MPT_SIZES = ["125m", "350m", "760m", "1b", "3b", "7b", "13b", "30b", "70b"]


@pytest.mark.parametrize("size", MPT_SIZES)
def test_mpt_params_match_llmfoundry_table(size):
    rows = [r for r in _s04_rows() if r["model"].lower() == f"mpt-{size}" and int(r["seq_len"]) == 2048]
    assert rows, f"no S04 row for MPT-{size} at seq 2048"
    m = load_model(WORKLOADS / f"mpt-{size}.yaml")
    for r in rows:
        assert (m.layers, m.hidden) == (int(r["layers"]), int(r["hidden"]))
        assert m.heads == int(float(r["heads"])) and m.ffn_hidden == int(float(r["ffn_hidden"]))
        assert m.params == pytest.approx(float(r["params_b"]) * 1e9, rel=0.01)


def test_mpt_exact_numparams_at_every_sequence_length():
    """The benchmark table's NumParams grows with the learned position table (max_seq_len = seq);
    with biases (MPTConfig default no_bias false) the count is exact for every row."""
    checked = 0
    for r in _s04_rows():
        found = re.search(r"NumParams=(\d+)", r["notes"])
        if not found:
            continue
        base = load_model(WORKLOADS / f"{r['model'].lower()}.yaml")
        s = int(r["seq_len"])
        m = Model(**{**base.__dict__, "seq_len": s, "max_positions": s})
        assert m.params == int(found.group(1)), (r["run_id"], r["model"], s)
        checked += 1
    assert checked >= 9


# --- Hugging Face config.json ------------------------------------------------------------------------
HF_CASES = {
    # fixture dir: (workload yaml or exact count, kv_heads, activation, norm, norm_position, position)
    "llama-2-7b": ("llama2-7b", 32, "swiglu", "rmsnorm", "pre", "rotary"),
    "gpt2-xl": ("gpt2-xl", 25, "gelu", "layernorm", "pre", "learned"),
    "opt-350m": ("opt-350m", 16, "relu", "layernorm", "post", "learned"),
    "bert-large-uncased": ("bert-large", 16, "gelu", "layernorm", "post", "learned"),
    # released MPT-7B: ALiBi (no position table), no_bias true, vocab 50432
    "mpt-7b": (6_649_286_656, 32, "gelu", "layernorm", "pre", "alibi"),
}


@pytest.mark.parametrize("fixture", sorted(HF_CASES))
def test_hf_config_loads(fixture):
    expected, kv, act, norm, norm_pos, pos = HF_CASES[fixture]
    m = load_model(HF / fixture / "config.json")
    if isinstance(expected, str):
        ref = load_model(expected)
        assert m.params == ref.params
        assert (m.layers, m.hidden, m.heads, m.ffn_hidden, m.vocab) == \
            (ref.layers, ref.hidden, ref.heads, ref.ffn_hidden, ref.vocab)
        assert (m.architecture, m.tied_embeddings, m.bias, m.embedding_projection_dim) == \
            (ref.architecture, ref.tied_embeddings, ref.bias, ref.embedding_projection_dim)
    else:
        assert m.params == expected
    assert (m.kv_heads, m.activation, m.norm, m.norm_position, m.position_embedding) == \
        (kv, act, norm, norm_pos, pos)
    assert m.name == fixture


def test_hf_mpt_7b_by_hand():
    """Released mosaicml/mpt-7b: 32 x (Wqkv, out_proj, up, down; two LayerNorm weights), wte of
    50432 rows tied to the head, final norm_f weight; no biases, ALiBi so no wpe."""
    V, h, L = 50432, 4096, 32
    total = V * h + L * (4 * h * h + 8 * h * h + 2 * h) + h
    assert total == 6_649_286_656
    m = load_model(HF / "mpt-7b" / "config.json")
    assert m.params == total and not m.bias and m.tied_embeddings
    # same shapes as the llm-foundry mpt-7b.yaml benchmark model
    ref = load_model("mpt-7b")
    assert (m.layers, m.hidden, m.heads, m.ffn_hidden) == (ref.layers, ref.hidden, ref.heads, ref.ffn_hidden)


def test_hf_opt_350m_projection_and_positions():
    m = load_model(HF / "opt-350m" / "config.json")
    assert m.embedding_projection_dim == 512 and m.max_positions == 2050 and m.precision == "fp16"


def test_hf_grouped_query_attention(tmp_path):
    """meta-llama/Meta-Llama-3-8B config.json: 8 KV heads."""
    cfg = {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "vocab_size": 128256,
    }
    path = tmp_path / "llama-3-8b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    m = load_model(path)
    assert (m.kv_heads, m.kv_dim, m.q_dim) == (8, 1024, 4096)
    assert m.params == 8_030_261_248 == load_model("llama3-8b").params


def test_hf_mpt_rope_has_no_position_table():
    base = json.loads((HF / "mpt-7b" / "config.json").read_text())
    base["attn_config"] = {**base["attn_config"], "alibi": False, "rope": True, "rope_theta": 10000}
    m = model_from_hf_config(base, "mpt-rope")
    assert m.position_embedding == "rotary"
    assert m.params == 6_649_286_656  # same tensors as the ALiBi model


def test_hf_mpt_learned_positions():
    base = json.loads((HF / "mpt-7b" / "config.json").read_text())
    base["attn_config"] = {**base["attn_config"], "alibi": False}
    m = model_from_hf_config(base, "mpt-learned")
    assert m.position_embedding == "learned"
    assert m.params == 6_649_286_656 + 2048 * 4096  # plus wpe of max_seq_len rows


def test_hf_bad_config_names_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 0, "num_hidden_layers": 2,
                                "num_attention_heads": 2, "vocab_size": 10}))
    with pytest.raises(ConfigError) as err:
        load_model(path)
    assert str(path) in str(err.value) and "hidden_size" in str(err.value)


# --- validation errors ---------------------------------------------------------------------------
VALID = {
    "name": "tiny", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256,
    "vocab": 1000, "seq_len": 128,
}


def _write(tmp_path, data, name="bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_valid_minimal_yaml_loads(tmp_path):
    m = load_model(_write(tmp_path, VALID, "ok.yaml"))
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.max_positions) == (2, 64, 4, 4, 128)


@pytest.mark.parametrize("change, field", [
    ({"layers": None}, "layers"),            # missing (None -> key removed below)
    ({"hidden": -4}, "hidden"),
    ({"heads": 0}, "heads"),
    ({"hiden": 64}, "hiden"),                # unknown key next to the right one
    ({"heads": 4, "kv_heads": 3}, "kv_heads"),
    ({"kv_heads": 8}, "kv_heads"),           # more kv heads than heads
    ({"activation": "tanh"}, "activation"),
    ({"heads": 5}, "heads"),                 # does not divide hidden 64
    ({"seq_len": 4096, "max_positions": 2048}, "seq_len"),
    ({"precision": "int4"}, "precision"),
    ({"bias": "yes"}, "bias"),
    ({"hidden": 10 ** 200}, "hidden"),       # the fuzz's 200-digit width: a traceback in evaluate
    ({"layers": 10 ** 15 + 1}, "layers"),    # just past configio.MAX_INT
])
def test_bad_field_named_in_error(tmp_path, change, field):
    data = {**VALID, **{k: v for k, v in change.items() if v is not None}}
    for k, v in change.items():
        if v is None:
            data.pop(k)
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_model(path)
    msg = str(err.value)
    assert str(path) in msg and f"'{field}'" in msg, msg


def test_typo_instead_of_required_key(tmp_path):
    data = {k: v for k, v in VALID.items() if k != "hidden"} | {"hiden": 64}
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_model(path)
    assert str(path) in str(err.value) and "hidden" in str(err.value)


def test_malformed_yaml_reports_line(tmp_path):
    path = _write(tmp_path, "name: tiny\nlayers: 2\nhidden: [64\nheads: 4\n")
    with pytest.raises(ConfigError) as err:
        load_model(path)
    msg = str(err.value)
    assert str(path) in msg and "line" in msg, msg


def test_top_level_list_rejected(tmp_path):
    path = _write(tmp_path, "- name: tiny\n- layers: 2\n")
    with pytest.raises(ConfigError) as err:
        load_model(path)
    assert str(path) in str(err.value) and "mapping" in str(err.value)


def test_unknown_workload_lists_shipped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_model("no-such-model-xyz")
    msg = str(err.value)
    assert "no-such-model-xyz" in msg
    for shipped in ("gpt3-175b", "llama2-7b", "megatron-gpt-1.7b", "mpt-7b", "bert-large"):
        assert shipped in msg, msg


def test_missing_yaml_path(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as err:
        load_model(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("name, embedding, non_embedding", [
    ("nemotron4-15b", 3.2e9, 12.5e9),      # Nemotron-4 15B report, Sec. 2
    ("nemotron4-340b", 9.4e9, 331.6e9),    # Nemotron-4 340B report, Sec. 2.2
])
def test_nemotron4_split_matches_the_reports(name, embedding, non_embedding):
    # the reports give embedding and non-embedding counts to 0.1B (the 15B report's 3.2B embedding
    # is 2 x 256000 x 6144 = 3.146B, so agreement is to within 0.1B, not to the rounding)
    m = load_model(name)
    assert abs(m.layers * m.layer_params + m.norm_params - non_embedding) <= 0.1e9
    assert abs(m.embedding_params + m.vocab * m.hidden - embedding) <= 0.1e9   # untied input + output
    assert (m.activation, m.bias, m.tied_embeddings, m.kv_heads, m.vocab) == ("relu", False, False, 8, 256000)


@pytest.mark.parametrize("name", ["llama3.1-405b", "Llama-3.1-405B", "meta-llama/Llama-3.1-405B"])
def test_published_name_resolves(name, tmp_path, monkeypatch):
    """Llama 3.1 405B by its published name (the shipped file is llama3-405b) and its HF id."""
    monkeypatch.chdir(tmp_path)
    assert load_model(name) == load_model("llama3-405b")


@pytest.mark.parametrize("name, keys", [
    ("LLAMA2-70B (SFT)", ("llama270bsft", "llama270b")),                      # NeMo's performance tables
    ("meta-llama/Llama-2-13b-chat-hf", ("metallamallama213bchathf", "llama213bchathf", "llama213bchat", "llama213b")),
    ("Nemotron-H 8B", ("nemotronh8b",)),
    ("GPT (1.3B)", ("gpt1.3b", "gpt")),
    ("Mixtral-8x7B-Instruct-v0.1", ("mixtral8x7binstructv0.1",)),   # a version is kept: it may change the network
])
def test_name_keys_drop_only_what_names_the_run_or_checkpoint(name, keys):
    assert name_keys(name) == keys


@pytest.mark.parametrize("name, stem", [
    ("LLAMA2-70B (SFT)", "llama2-70b"), ("GPT-3-175B (NeMo)", "gpt3-175b"), ("LLAMA2-13B", "llama2-13b"),
    ("meta-llama/Llama-2-13b-chat-hf", "llama2-13b"), ("Meta-Llama-3-8B-Instruct", "llama3-8b"),
    ("nvidia/Nemotron-4-340B-Base", "nemotron4-340b"), ("Nemotron-340B", "nemotron4-340b"),
    ("MT-NLG-530B", "megatron-gpt-530b"), ("Nemotron-H 8B", "nemotron-h-8b"),
    ("Qwen/Qwen3-30B-A3B-Base", "qwen3-30b-a3b"), ("google/gemma-2-9b-it", "gemma2-9b"), ("gemma-7b-it", "gemma-7b"),
    ("gemma2_27b", "gemma2-27b"),
])
def test_published_spellings_load_the_shipped_workload(name, stem, tmp_path, monkeypatch):
    """By :func:`find_workload`: the same lookup for ``--workload`` and a validation row's ``model``."""
    monkeypatch.chdir(tmp_path)
    assert load_model(name) == load_model(stem)


def test_a_spelling_that_names_no_workload_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("GPT (1.3B)", "Llama-2-34B (SFT)", "Mixtral-8x7B-Instruct-v0.1"):
        assert find_workload(name) is None, name
        with pytest.raises(ConfigError, match="unknown workload"):
            load_model(name)


@pytest.mark.parametrize("name", ["LLAMA3-70B (LoRA)", "Llama3 8B LoRA", "llama3-70b-lora", "QLoRA-65B",
                                  "Mistral-7B-Adapter", "gpt2 (fp8, dora)"])
def test_a_name_that_says_parameter_efficient_fine_tuning_is_refused_not_costed_as_full_training(name, tmp_path,
                                                                                                  monkeypatch):
    """``LLAMA3-70B (LoRA)`` would otherwise drop its qualifier and find Llama 3 70B: a step with every
    weight's gradient, its reduction and its optimizer, where LoRA trains adapters on frozen weights."""
    monkeypatch.chdir(tmp_path)
    refused = r"--workload: .*parameter-efficient fine-tuning \((lora|qlora|adapter|dora)\)"
    with pytest.raises(ConfigError, match=refused):
        load_model(name)
    # words that only contain one are not one; SFT is full training
    assert load_model("LLAMA3-70B (SFT)") == load_model("llama3-70b")
    assert find_workload("Loraxx-7B") is None and not peft_error("explora-7b") and not peft_error("Llama-3-8B")


def test_a_local_workload_is_found_by_its_published_name(tmp_path, monkeypatch):
    """./workloads is searched first by every spelling too (the lookup is cached per directory list)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workloads").mkdir()
    text = (WORKLOADS / "llama2-7b.yaml").read_text().replace("name: Llama-2-7B", "name: My Llama 7B")
    (tmp_path / "workloads" / "mine.yaml").write_text(text)
    assert load_model("My-Llama-7B (SFT)").name == "My Llama 7B"
    assert find_workload("Llama-2-7B (SFT)") == WORKLOADS / "llama2-7b.yaml"


@pytest.mark.parametrize("name,layers,h,f,heads", [("nemotron3-8b", 32, 4096, 16384, 32),
                                                      ("nemotron3-22b", 40, 6144, 24576, 48)])
def test_nemotron3_parameters_by_hand(name, layers, h, f, heads):
    """NeMo 2.5.0's Nemotron3Config8B and 22B: full multi-head attention (q, k, v, out: 4·h²), a squared
    ReLU MLP of two matrices, no linear biases, two LayerNorm weights a layer and a final one,
    untied 256,000-token table and head (the LayerNorms' biases are not counted: the workload's
    header says why); rotary embeddings over half of each 128-wide head."""
    m = load_model(name)
    assert (m.kv_heads, m.head_dim, m.rotary_dim, m.tied_embeddings) == (heads, 128, 64, False)
    assert m.params == layers * (4 * h * h + 2 * h * f + 2 * h) + 2 * 256000 * h + h


# Qwen3's dense models (NeMo 2.5.0 Qwen3Config*): layers, hidden, query heads, FFN, tied; and the
# non-embedding count each model card gives ("Number of Parameters (Non-Embedding)"), to 0.01B or 0.1B
QWEN3 = {"qwen3-0.6b": (28, 1024, 16, 3072, True, 0.44e9, 0.01e9),
         "qwen3-1.7b": (28, 2048, 16, 6144, True, 1.4e9, 0.1e9),
         "qwen3-4b": (36, 2560, 32, 9728, True, 3.6e9, 0.1e9),
         "qwen3-8b": (36, 4096, 32, 12288, False, 6.95e9, 0.01e9),
         "qwen3-14b": (40, 5120, 40, 17408, False, 13.2e9, 0.1e9),
         "qwen3-32b": (64, 5120, 64, 25600, False, 31.2e9, 0.1e9)}


@pytest.mark.parametrize("name", sorted(QWEN3))
def test_qwen3_dense_parameters_by_hand(name):
    """8 KV heads of width 128 (queries heads x 128 wide, not the hidden width), a 128-wide RMSNorm on
    the queries and one on the keys, SwiGLU, no biases, a 151,936-token table (shared with the head
    up to 4B)."""
    L, h, heads, f, tied, non_embedding, digits = QWEN3[name]
    q = heads * 128
    layer = h * q + 2 * h * 8 * 128 + q * h + 2 * 128 + 3 * h * f + 2 * h
    m = load_model(name)
    assert (m.kv_heads, m.head_dim, m.qk_norm, m.tied_embeddings) == (8, 128, True, tied)
    assert m.params == L * layer + h + (1 if tied else 2) * 151936 * h
    assert abs(L * layer + h - non_embedding) < digits / 2


# Qwen2.5's dense models (Megatron-Bridge 0.3.1 Qwen25ModelProvider*): layers, hidden, query heads,
# KV heads, FFN; and the total each model card gives, to its rounding
QWEN25 = {"qwen2.5-7b": (28, 3584, 28, 4, 18944, 7.61e9, 0.01e9),
          "qwen2.5-14b": (48, 5120, 40, 8, 13824, 14.7e9, 0.1e9),
          "qwen2.5-32b": (64, 5120, 40, 8, 27648, 32.5e9, 0.1e9),
          "qwen2.5-72b": (80, 8192, 64, 8, 29568, 72.7e9, 0.1e9)}


@pytest.mark.parametrize("name", sorted(QWEN25))
def test_qwen25_parameters_by_hand(name):
    """Heads of width 128, biases on the q, k and v projections only (``qkv_bias``, a workload
    key since 2026-12-07; Hugging Face's qwen2 type always has them), SwiGLU, two RMSNorms a layer
    and a final one, an untied 152,064-token table; the YAML gives what phaze's Hugging Face reader
    gives from the published config.json keys. The 32B comes out 32.76B against its card's 32.5B
    (0.8 %), the others to the card's rounding."""
    L, h, heads, kv, f, published, digits = QWEN25[name]
    q, k = heads * 128, kv * 128
    layer = h * q + q + 2 * (h * k + k) + q * h + 3 * h * f + 2 * h
    m = load_model(name)
    assert (m.qkv_bias, m.bias, m.tied_embeddings, m.head_dim) == (True, False, False, 128)
    assert m.params == L * layer + h + 2 * 152064 * h
    assert abs(m.params - published) <= max(digits / 2, 0.01 * published)
    hf = model_from_hf_config(dict(model_type="qwen2", hidden_size=h, num_hidden_layers=L, num_attention_heads=heads,
                                   num_key_value_heads=kv, intermediate_size=f, vocab_size=152064, hidden_act="silu",
                                   rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=32768))
    assert hf.params == m.params and hf.qkv_bias


@pytest.mark.parametrize("stem,layers,h,f", [("gpt3-126m", 12, 768, 3072), ("gpt3-20b", 44, 6144, 24576),
                                             ("gpt3-40b", 48, 8192, 32768)])
def test_nemo_gpt3_parameters_by_hand(stem, layers, h, f):
    """NeMo 2.5.0's GPTConfig126M/20B/40B: biased q, k, v and out (4·h² + 4·h), a biased GELU MLP
    (2·h·f + f + h), two LayerNorms a layer (4·h) and a final one, the GPT-2 BPE's 50,257-row table
    tied to the head, 2,048 learned positions. NeMo names the sizes only: 20.26 and 39.09 B;
    the 126M is GPT-3 Small's shape, Brown et al.'s 125M."""
    m = load_model(stem)
    assert (m.activation, m.position_embedding, m.tied_embeddings, m.bias) == ("gelu", "learned", True, True)
    assert m.vocab == 50257
    layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
    assert m.params == layers * layer + 50257 * h + 2048 * h + 2 * h


def test_mistral_nemo_parameters_by_hand():
    """NeMo 2.5.0's MistralNeMoConfig12B: 32 query and 8 key/value heads of width 128 (4,096 wide, the
    hidden 5,120), SwiGLU of 14,336, two RMSNorms a layer and a final one, no biases, an untied
    131,072-token table: 12.25 B, Mistral AI's "12B"."""
    m = load_model("mistral-nemo-12b")
    h, q, k = 5120, 32 * 128, 8 * 128
    layer = h * q + 2 * h * k + q * h + 3 * h * 14336 + 2 * h
    assert (m.head_dim, m.kv_heads, m.tied_embeddings, m.bias, m.sliding_window) == (128, 8, False, False, 0)
    assert m.params == 40 * layer + h + 2 * 131072 * h == 12_247_782_400


@pytest.mark.parametrize("name", ["model_aliases.csv", "moe_models.csv", "unmodelled_models.csv"])
def test_every_catalogue_row_has_the_header_fields(name):
    """A catalogue's source text holds commas inside quotes: a row with more cells than the header
    (an unquoted comma) would lose the rest of its source."""
    with (ROOT / "phaze" / "data" / name).open(newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows and all(len(r) == len(rows[0]) for r in rows), [r[0] for r in rows if len(r) != len(rows[0])]


@pytest.mark.parametrize("name,layers,h,heads,kv,f,non_embedding", [
    ("gemma-2b", 18, 2048, 8, 1, 16384, 1_981_884_416),
    ("gemma-7b", 28, 3072, 16, 16, 24576, 7_751_248_896)])
def test_gemma_parameters_by_hand(name, layers, h, heads, kv, f, non_embedding):
    """Gemma (the report's Table 1): heads of 256 (queries heads x 256 wide), a GeGLU FFN (gate, value
    and down: three matrices), two RMSNorms a layer and a final one, no biases, a tied 256,000-row
    table; the non-embedding count is exactly the report's Table 2."""
    m = load_model(name)
    q, k = heads * 256, kv * 256
    layer = h * q + 2 * h * k + q * h + 3 * h * f + 2 * h
    assert (m.activation, m.head_dim, m.kv_heads, m.tied_embeddings, m.bias) == ("geglu", 256, kv, True, False)
    assert m.layers == layers and layers * layer + h == non_embedding
    assert m.params == non_embedding + 256000 * h


def test_nemo_recipe_names_find_the_shipped_workloads():
    """NeMo 2.5.0's recipe names (nemo/collections/llm/recipes) of the models phaze ships, as NeMo's
    command line takes them (``--factory llama31_405b``)."""
    for recipe, stem in (("llama31_405b", "llama3-405b"), ("llama31_8b", "llama3.1-8b"), ("llama32_1b", "llama3.2-1b"),
                         ("qwen3_600m", "qwen3-0.6b"), ("qwen3_1p7b", "qwen3-1.7b"), ("qwen3_32b", "qwen3-32b"),
                         ("mamba2_1_3b", "mamba2-1.3b"), ("nemotron3_22b", "nemotron3-22b"),
                         ("nemotronh_56b", "nemotron-h-56b"), ("gpt3_175b", "gpt3-175b"),
                         ("gemma_2b", "gemma-2b"), ("gemma_7b", "gemma-7b"), ("codegemma_7b", "gemma-7b")):
        assert find_workload(recipe) == WORKLOADS / f"{stem}.yaml", recipe
    for recipe, stem in (("qwen25_7b", "qwen2.5-7b"), ("qwen25_32b", "qwen2.5-32b"), ("qwen2_72b", "qwen2.5-72b"),
                         ("llama31_nemotron_70b", "llama3.1-70b"), ("mistral_nemo_12b", "mistral-nemo-12b")):
        assert find_workload(recipe) == WORKLOADS / f"{stem}.yaml", recipe


@pytest.mark.parametrize("recipe,stem,seq", [("llama3_8b_16k", "llama3-8b", 16384),
                                             ("llama3_8b_128k", "llama3-8b", 131072),
                                             ("llama3_70b_64k", "llama3-70b", 65536),
                                             ("mixtral_8x7b_64k", "mixtral-8x7b", 65536),
                                             ("nemotron4_15b_16k", "nemotron4-15b", 16384)])
def test_a_long_context_recipe_name_is_its_network_at_that_length(recipe, stem, seq):
    """NeMo 2.5.0's long-context recipes (recipes/llama3_8b_16k.py: ``seq_length = 16384``; _64k
    65,536, _128k 131,072) train the shipped network at the length their name says: found by
    dropping the length, loaded at it (K = 1,024 tokens), and an explicit length still wins."""
    assert find_workload(recipe) == WORKLOADS / f"{stem}.yaml"
    m = load_model(recipe)
    assert m.seq_len == seq and m.name == load_model(stem).name
    assert f"sequence length {seq} (named by '{recipe}')" in m.notes
    assert load_model(recipe, seq_len=4096).seq_len == 4096


def test_a_workload_named_with_a_length_keeps_its_own(tmp_path, monkeypatch):
    """The length is read from a name only where it was dropped to find the file: a local workload
    whose own name ends in one (and a catalogued spelling such as Nemotron-3-8B-Base-4k) keeps the
    sequence its file gives."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workloads").mkdir()
    text = (WORKLOADS / "llama2-7b.yaml").read_text().replace("name: Llama-2-7B", "name: Long Llama 32k")
    (tmp_path / "workloads" / "long-llama-32k.yaml").write_text(text)
    assert load_model("long-llama-32k").seq_len == load_model("Long Llama 32k").seq_len == 4096
    assert load_model("Nemotron-3-8B-Base-4k").seq_len == load_model("nemotron3-8b").seq_len


def test_every_catalogued_spelling_names_a_shipped_workload():
    """``phaze/data/model_aliases.csv``: each row's model is a shipped workload's name, and each of
    its spellings finds that workload."""
    with (ROOT / "phaze" / "data" / "model_aliases.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows
    for r in rows:
        target = find_workload(r["model"])
        assert target is not None and load_model(target).name == r["model"], r["model"]
        assert r["source"].strip(), r["model"]
        for alias in r["aliases"].split(";"):
            assert find_workload(alias) == target, alias


def test_every_alias_names_a_shipped_workload():
    aliases = workload_aliases()
    assert aliases["llama3.1-405b"] == "llama3-405b" and aliases["gpt-3"] == "gpt3-175b"
    for alias, stem in aliases.items():
        assert alias == alias.lower() and load_model(alias) == load_model(stem), alias
    # the spellings a published name may take beyond the catalogue are read, not listed
    for name, stem in (("llama-3-8b", "llama3-8b"), ("Llama-2-70b-hf", "llama2-70b"), ("gpt-3-175b", "gpt3-175b"),
                       ("Nemotron-4-340B", "nemotron4-340b"), ("meta-llama/Meta-Llama-3-70B", "llama3-70b")):
        assert name.lower() not in aliases
        assert load_model(name) == load_model(stem), name


def test_unknown_workload_suggests_the_nearest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_model("llama3.1-450b")
    assert "did you mean 'llama3.1-405b'" in str(err.value)


@pytest.mark.parametrize("loader", ["CSafeLoader", "SafeLoader"])
def test_yaml_aliases_are_bounded_under_either_parser(tmp_path, monkeypatch, loader):
    # libyaml's parser where PyYAML has it, the pure-Python one otherwise: the same data, and the
    # same refusals of a recursive alias (line 2) and of aliases expanding past MAX_YAML_NODES
    # (10^6 values from 6 lines), while shared aliases that stay small load
    from phaze import configio
    if not hasattr(yaml, loader):
        pytest.skip("PyYAML built without libyaml")
    monkeypatch.setattr(configio, "_LOADER", getattr(yaml, loader))
    ok = _write(tmp_path, "a: &x [1, 2]\nb: {c: *x, d: *x}\n")
    assert configio.read_mapping(ok) == {"a": [1, 2], "b": {"c": [1, 2], "d": [1, 2]}}
    rec = _write(tmp_path, "a: 1\nb: &r {c: *r}\n")
    with pytest.raises(ConfigError, match="line 2: recursive alias"):
        configio.read_mapping(rec)
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 6)]
    bomb = _write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="aliases expand to more than 100,000 values"):
        configio.read_mapping(bomb)
    # two levels fewer: 10^4 values and the lists holding them, 11,111 nodes in all, load
    small = _write(tmp_path, "\n".join(lines[:4]) + "\n")
    assert len(configio.read_mapping(small)["l3"]) == 10


@pytest.mark.parametrize("mtype", ["jamba", "minimax", "rwkv", "falcon_h1", "deepseek_v32", "mistral_large4_text",
                                   "deepseek_v4", "kimi_linear", "longcat_flash", "gemma4", "jetmoe"])
def test_hugging_face_configs_without_attention_layers_are_refused(mtype):
    """A state-space, recurrent, hybrid or sparse-attention config phaze cannot read is refused naming
    model_type and what it has, not read as a transformer of its width and depth (Mamba-2's,
    Nemotron-H's and Qwen3-Next's are read: tests/test_hybrid.py, tests/test_gdn.py)."""
    cfg = {"model_type": mtype, "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
           "vocab_size": 50000}
    with pytest.raises(ConfigError, match="model_type.*which phaze does not model"):
        model_from_hf_config(cfg)


@pytest.mark.parametrize("mtype", ["gpt_neo", "jais2", "apertus", "cohere2_moe", ""])
def test_hugging_face_types_phaze_does_not_read_are_refused(mtype):
    """A transformer type outside phaze's table (its norms, experts or local layers would be read
    as the nearest type's: GPT-Neo's local layers as global ones, Apertus's xIELU as another
    activation, Cohere 2 MoE's experts as a dense FFN) is refused
    naming model_type and the types phaze reads."""
    cfg = {"model_type": mtype, "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
           "vocab_size": 50000, "num_experts": 60, "intermediate_size": 5632}
    with pytest.raises(ConfigError, match=r"model_type.*(got|missing).*phaze reads only.*llama, llama4_text"):
        model_from_hf_config(cfg)


def test_hf_gemma_is_geglu_by_hand():
    """transformers 5.25.0 GemmaConfig's defaults (google/gemma-7b): 28 layers of width 3,072, 16
    heads of 256 (queries 4,096 wide), a gated FFN of 24,576 under gelu_pytorch_tanh (GeGLU), a
    256,000-token table tied to the head, RMSNorms: 8,537,680,896 parameters (Gemma Team 2024:
    "7B", 8.54B with the embeddings)."""
    cfg = dict(model_type="gemma", vocab_size=256000, hidden_size=3072, intermediate_size=24576,
               num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=16, head_dim=256,
               hidden_act="gelu_pytorch_tanh", max_position_embeddings=8192, rms_norm_eps=1e-6)
    m = model_from_hf_config(cfg)
    V, h, L, f, q = 256000, 3072, 28, 24576, 4096
    assert m.params == V * h + L * (4 * h * q + 3 * h * f + 2 * h) + h == 8_537_680_896
    assert (m.activation, m.gated, m.ffn_matrices, m.head_dim, m.tied_embeddings, m.norm, m.bias) == \
        ("geglu", True, 3, 256, True, "rmsnorm", False)
    assert m.embedding_scale and not any("square root" in n for n in m.notes)   # its times sqrt(h), costed
    # the same FFN under silu is SwiGLU: same shapes, same parameters
    silu = model_from_hf_config({**cfg, "hidden_act": "silu"})
    assert silu.activation == "swiglu" and silu.params == m.params


@pytest.mark.parametrize("mtype,act,key", [("llama", "relu", "hidden_act"), ("gemma", "tanh", "hidden_act"),
                                           ("gpt2", "silu", "activation_function"), ("phi", "swish", "hidden_act")])
def test_hf_activation_outside_the_types_ffn_is_refused(mtype, act, key):
    """A gated type takes SiLU (SwiGLU) or a GELU (GeGLU); an ungated one a GELU or ReLU. Anything
    else (a ReGLU Llama, an ungated SiLU) is refused naming the key, not costed as the nearest."""
    cfg = {"model_type": mtype, "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
           "vocab_size": 1000, key: act}
    with pytest.raises(ConfigError, match=rf"{key}.*for '{mtype}'.*got '{act}'"):
        model_from_hf_config(cfg)


def test_hf_phi3_starcoder2_and_gpt_bigcode_by_hand():
    """Three types read as transformers 5.25.0 builds them, each counted by hand: Phi-3-mini (a
    fused gate_up_proj, SiLU, RMSNorms, no biases, untied by default; its 2,047-token window in
    every layer): 3,821,079,552; StarCoder2 (Starcoder2Config's defaults: a plain GELU FFN and
    linears with biases, LayerNorms, 2 KV heads, tied; the window in every layer); GPTBigCode
    (GPTBigCodeConfig's defaults: multi-query, one KV head of 64 in c_attn, learned positions)."""
    phi3 = model_from_hf_config(dict(
        model_type="phi3", vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, hidden_act="silu", max_position_embeddings=4096,
        sliding_window=2047))
    V, h, L, f = 32064, 3072, 32, 8192
    assert phi3.params == 2 * V * h + L * (4 * h * h + 3 * h * f + 2 * h) + h == 3_821_079_552
    assert (phi3.activation, phi3.norm, phi3.bias, phi3.tied_embeddings) == ("swiglu", "rmsnorm", False, False)
    assert (phi3.sliding_window, phi3.window_layer_share, phi3.position_embedding) == (2047, 1.0, "rotary")
    sc2 = model_from_hf_config(dict(
        model_type="starcoder2", vocab_size=49152, hidden_size=3072, intermediate_size=12288,
        num_hidden_layers=30, num_attention_heads=24, num_key_value_heads=2, hidden_act="gelu_pytorch_tanh",
        max_position_embeddings=4096, sliding_window=4096))
    V, h, L, f, kv = 49152, 3072, 30, 12288, 2 * 128
    per_layer = 2 * 2 * h + h * (h + 2 * kv) + (h + 2 * kv) + h * h + h + h * f + f + f * h + h
    assert sc2.params == V * h + L * per_layer + 2 * h
    assert (sc2.activation, sc2.norm, sc2.bias, sc2.tied_embeddings, sc2.kv_heads) == \
        ("gelu", "layernorm", True, True, 2)
    assert (sc2.sliding_window, sc2.window_layer_share) == (4096, 1.0)
    assert not model_from_hf_config(dict(
        model_type="starcoder2", vocab_size=49152, hidden_size=3072, num_hidden_layers=30,
        num_attention_heads=24, use_bias=False)).bias
    big = model_from_hf_config(dict(model_type="gpt_bigcode", vocab_size=50257, n_positions=1024, n_embd=768,
                                    n_layer=12, n_head=12))
    V, P, h, L, kv = 50257, 1024, 768, 12, 64
    per_layer = 2 * h + h * (h + 2 * kv) + (h + 2 * kv) + h * h + h + 2 * h + h * 4 * h + 4 * h + 4 * h * h + h
    assert big.params == V * h + P * h + L * per_layer + 2 * h == 111_446_784
    assert (big.kv_heads, big.activation, big.position_embedding, big.tied_embeddings) == (1, "gelu", "learned", True)


@pytest.mark.parametrize("cfg,expected", [
    # Mistral, Mixtral, Phi-3, StarCoder2: every layer whenever sliding_window is set
    (dict(model_type="mistral", sliding_window=4096), (4096, 1.0)),
    (dict(model_type="mistral", sliding_window=None), (0, 1.0)),
    (dict(model_type="mixtral", sliding_window=4096, num_local_experts=8, num_experts_per_tok=2), (4096, 1.0)),
    # Qwen2 and Qwen3 only under use_sliding_window, from layer max_window_layers on
    (dict(model_type="qwen2", sliding_window=4096), (0, 1.0)),
    (dict(model_type="qwen2", sliding_window=4096, use_sliding_window=True, max_window_layers=24), (4096, 0.25)),
    (dict(model_type="qwen3", sliding_window=4096, use_sliding_window=True,
          layer_types=["full_attention"] * 24 + ["sliding_attention"] * 8), (4096, 0.25)),
    # Qwen2-MoE: every other layer below max_window_layers, under use_sliding_window
    (dict(model_type="qwen2_moe", sliding_window=4096, use_sliding_window=True, max_window_layers=16,
          num_experts=8, num_experts_per_tok=2), (4096, 0.25)),
    # GPT-OSS: every other layer by default, else as layer_types marks them
    (dict(model_type="gpt_oss", sliding_window=128, num_local_experts=32, num_experts_per_tok=4), (128, 0.5)),
    # Llama has no window whatever the config says
    (dict(model_type="llama", sliding_window=4096), (0, 1.0)),
])
def test_hf_sliding_window_as_transformers_applies_it(cfg, expected):
    """transformers 5.25.0 applies ``sliding_window`` by type (its modeling files): phaze reads the
    window and the share of layers that use it the same way."""
    base = {"hidden_size": 512, "num_hidden_layers": 32, "num_attention_heads": 8, "vocab_size": 1000,
            "intermediate_size": 1024}
    m = model_from_hf_config({**base, **cfg})
    assert (m.sliding_window, m.window_layer_share) == expected


@pytest.mark.parametrize("mtype,tied", [("qwen2", False), ("gpt_neox", False), ("phi", False), ("gemma", True),
                                        ("gpt2", True), ("starcoder2", True), ("llama", False)])
def test_hf_tied_head_defaults_to_the_types(mtype, tied):
    """A config that does not say ``tie_word_embeddings`` takes its type's default (transformers
    5.25.0's configuration classes), which sets whether the head's parameters count twice."""
    m = model_from_hf_config({"model_type": mtype, "hidden_size": 512, "num_hidden_layers": 2,
                              "num_attention_heads": 8, "vocab_size": 1000})
    assert m.tied_embeddings is tied


def test_hf_attention_and_mlp_biases_of_a_gated_type():
    """A Llama-type config with ``attention_bias`` has q, k, v and output biases (transformers 5.25.0
    LlamaAttention): the q, k, v biases are counted and a note says the output's is not; ``mlp_bias``
    (biases on a gated FFN) and MLA's ``attention_bias`` are refused naming the key."""
    base = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
            "num_key_value_heads": 2, "vocab_size": 1000, "intermediate_size": 1024}
    plain, biased = model_from_hf_config(base), model_from_hf_config({**base, "attention_bias": True})
    assert biased.qkv_bias and not plain.qkv_bias
    assert biased.params - plain.params == 2 * (512 + 2 * 128)
    assert any("output projection's bias, 512 per layer, is not counted" in n for n in biased.notes)
    with pytest.raises(ConfigError, match="mlp_bias.*must be false"):
        model_from_hf_config({**base, "mlp_bias": True})
    with pytest.raises(ConfigError, match="attention_bias.*MLA"):
        model_from_hf_config({**base, "model_type": "deepseek_v3", "attention_bias": True})


def test_hf_qwen2_moe_and_deepseek_v2_by_hand():
    """transformers 5.25.0's Qwen2MoeConfig defaults (Qwen1.5-MoE-A2.7B): 60 experts of 1,408, top 4,
    one shared expert of 5,632 behind a sigmoid gate (one weight vector), q/k/v biases, an untied
    151,936-row table: 14,315,784,192 parameters (Qwen: 14.3B), 2.7B active. DeepSeek-V2-Lite
    (deepseek_v2): MLA with a full-rank query projection (q_lora_rank null), one dense layer first,
    64 routed experts and 2 shared, 6 a token: 15.7B as DeepSeek-AI publish it; DeepSeek-V2's
    group-limited routing (8 groups, 3 a token) is read as V3's."""
    qm = model_from_hf_config(dict(
        model_type="qwen2_moe", vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=16, num_experts=60, num_experts_per_tok=4,
        moe_intermediate_size=1408, shared_expert_intermediate_size=5632, max_position_embeddings=8192))
    h, L, V = 2048, 24, 151936
    layer = 4 * h * h + 3 * h + 60 * 3 * h * 1408 + 3 * h * 5632 + h + h * 60 + 2 * h
    assert qm.params == L * layer + 2 * V * h + h == 14_315_784_192
    assert (qm.shared_experts, qm.shared_expert_gate, qm.qkv_bias, qm.tied_embeddings) == (1, True, True, False)
    assert round(qm.active_params / 1e9, 1) == 2.7
    lite = dict(model_type="deepseek_v2", vocab_size=102400, hidden_size=2048, intermediate_size=10944,
                moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16, n_routed_experts=64,
                n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1, q_lora_rank=None,
                kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                max_position_embeddings=163840)
    m = model_from_hf_config(lite)
    h, a, L, r = 2048, 16, 27, 512
    mla = h * a * 192 + h * (r + 64) + r + r * a * (128 + 128) + a * 128 * h
    dense, moe = 3 * h * 10944, 64 * 3 * h * 1408 + 2 * 3 * h * 1408 + h * 64
    assert m.params == L * (mla + 2 * h) + dense + (L - 1) * moe + 2 * 102400 * h + h
    assert round(m.params / 1e9, 1) == 15.7 and (m.mla, m.q_lora_rank, m.dense_layers, m.mtp_layers) == (True, 0, 1, 0)
    v2 = model_from_hf_config({**lite, "n_group": 8, "topk_group": 3})
    assert (v2.router_groups, v2.router_group_topk) == (8, 3)


@pytest.mark.parametrize("mtype,key,value", [
    ("gemma2", "attn_logit_softcapping", "x"), ("gemma2", "final_logit_softcapping", -5),
    ("qwen2_moe", "num_experts", "abc"), ("mixtral", "num_experts_per_tok", 2.5),
    ("gemma3_text", "sliding_window_pattern", "z"), ("deepseek_v3", "kv_lora_rank", True),
    ("mixtral", "mlp_only_layers", ["a"]), ("llama", "intermediate_size", float("inf")),
    ("qwen3_next", "full_attention_interval", -1)])
def test_hf_counts_that_are_not_numbers_are_refused(mtype, key, value):
    """A config's count or number that is not one is one clear error naming the key, never a
    traceback or a silent default."""
    cfg = {"model_type": mtype, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "vocab_size": 100, key: value}
    with pytest.raises(ConfigError, match=rf"field '{key}': must be"):
        model_from_hf_config(cfg)


def test_hf_ministral_and_seed_oss_by_hand():
    """Ministral (``ministral``): Mistral's layer, its window in the layers layer_types marks (every one
    by default); Ministral-8B's config, one windowed layer of four: 36 x (2·4096² + 2·4096·1024 +
    3·4096·12,288 + 2·4096) + 2·131,072·4096 + 4096 = 8,019,808,256 (published 8.0B). Seed-OSS
    (``seed_oss``): Llama's layer with q, k and v biases (attention_bias) and training dropout (0.1):
    Seed-OSS-36B 36,151,104,512 (published 36B)."""
    kinds = ["sliding_attention", "full_attention", "full_attention", "full_attention"] * 9
    cfg = dict(model_type="ministral", hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=131072,
               max_position_embeddings=32768, sliding_window=32768, layer_types=kinds)
    m = model_from_hf_config(cfg)
    h, kv, f = 4096, 1024, 12288
    assert m.params == 36 * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + 2 * 131072 * h + h == 8_019_808_256
    assert (m.sliding_window, m.window_layer_share) == (32768, 0.25)
    plain = {k: v for k, v in cfg.items() if k not in ("layer_types", "sliding_window")}
    assert (model_from_hf_config(plain).sliding_window, model_from_hf_config(plain).window_layer_share) == (4096, 1.0)
    seed = model_from_hf_config(dict(model_type="seed_oss", hidden_size=5120, num_hidden_layers=64,
                                     num_attention_heads=80, vocab_size=155136, max_position_embeddings=524288))
    h, q, kv, f = 5120, 80 * 128, 8 * 128, 27648
    layer = 2 * h * q + 2 * h * kv + (q + 2 * kv) + 3 * h * f + 2 * h
    assert seed.params == 64 * layer + 2 * 155136 * h + h == 36_151_104_512
    assert (seed.qkv_bias, seed.dropout, seed.kv_heads) == (True, True, 8)


def test_hf_ernie45_by_hand():
    """ERNIE 4.5 (``ernie4_5``, its 0.3B dense model): Llama's layer, 16 query heads and 2 key/value
    heads of 128 beside a width of 1,024, a tied 103,424-row table: 18 x (2·1024·2048 + 2·1024·256 +
    3·1024·3072 + 2·1024) + 103,424·1024 + 1024 = 360,748,032 (published 0.36B); use_bias, biases on
    every linear and the gated FFN's, is refused."""
    cfg = dict(model_type="ernie4_5", hidden_size=1024, num_hidden_layers=18, num_attention_heads=16,
               vocab_size=103424, max_position_embeddings=131072)
    m = model_from_hf_config(cfg)
    h, q, kv, f = 1024, 2048, 256, 3072
    assert m.params == 18 * (2 * h * q + 2 * h * kv + 3 * h * f + 2 * h) + 103424 * h + h == 360_748_032
    assert (m.tied_embeddings, m.kv_heads, m.head_dim, m.activation) == (True, 2, 128, "swiglu")
    with pytest.raises(ConfigError, match="use_bias"):
        model_from_hf_config({**cfg, "use_bias": True})


def test_hf_dbrx_by_hand():
    """DBRX (``dbrx``): its nested configs read (ffn_config: 16 GLU experts of 10,752, 4 a token, SiLU;
    attn_config: 8 key/value heads), weight-only LayerNorms, no biases, an untied 100,352-row table:
    40 x (6144·(6144 + 2·1024) + 6144² + 16·3·6144·10,752 + 16·6144 + 2·6144) + 2·100,352·6144 + 6144
    = 131,596,523,520, 36,469,708,800 active (the published 132B and 36B); clip_qkv noted; a nested
    key that is not a count is refused naming it."""
    cfg = {"model_type": "dbrx", "d_model": 6144, "n_heads": 48, "n_layers": 40, "max_seq_len": 32768,
           "vocab_size": 100352, "attn_config": {"clip_qkv": 8, "kv_n_heads": 8, "rope_theta": 500000},
           "ffn_config": {"ffn_act_fn": {"name": "silu"}, "ffn_hidden_size": 10752, "moe_num_experts": 16,
                          "moe_top_k": 4}}
    m = model_from_hf_config(cfg)
    h, kv, f, E, V = 6144, 1024, 10752, 16, 100352
    attn, norms, router = h * (h + 2 * kv) + h * h, 2 * h, E * h
    assert m.params == 40 * (attn + E * 3 * h * f + router + norms) + 2 * V * h + h == 131_596_523_520
    assert m.active_params == m.params - 40 * (E - 4) * 3 * h * f == 36_469_708_800
    assert (m.norm, m.norm_tensors, m.kv_heads, m.activation, m.tied_embeddings) == ("layernorm", 1, 8, "swiglu", False)
    assert any("clip_qkv" in n for n in m.notes)
    assert model_from_hf_config({**cfg, "attn_config": {}}).kv_heads == 1      # DbrxAttentionConfig's default
    for bad, field in (({"ffn_config": [1]}, "ffn_config"),
                       ({"ffn_config": {"moe_top_k": "4"}}, "ffn_config.moe_top_k"),
                       ({"attn_config": {"kv_n_heads": 0}}, "attn_config.kv_n_heads")):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            model_from_hf_config({**cfg, **bad})


@pytest.mark.parametrize("change,field", [({"model_type": "mpt", "attn_config": [1]}, "attn_config"),
                                          ({"model_type": "mpt", "attn_config": {"kv_n_heads": "8"}},
                                           "attn_config.kv_n_heads"),
                                          ({"model_type": "llama4_text", "layer_types": 3}, "layer_types"),
                                          ({"model_type": "gemma2", "layer_types": [1, 2]}, "layer_types"),
                                          ({"model_type": "ministral", "head_dim": 1e308}, "head_dim"),
                                          ({"model_type": "granite", "partial_rotary_factor": 1e308},
                                           "partial_rotary_factor")])
def test_hf_nested_and_layer_type_junk_is_refused_naming_the_key(change, field):
    """Found by a longer run of the fuzz benchmark's config mutator: an MPT attn_config that is not a
    mapping, and a layer_types that is not a list of names, were tracebacks; so was a finite but huge
    head width or rotary share (1e308: an OverflowError in int()), now refused above 1e15."""
    cfg = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 100,
           "intermediate_size": 128, **change}
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        model_from_hf_config(cfg)
