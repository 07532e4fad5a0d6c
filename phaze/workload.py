"""Transformer workloads: the model description, its parameter count and its FLOP formulas.

A workload is read from ``workloads/<name>.yaml`` (or any YAML path) or from a Hugging Face
``config.json``. Everything downstream (operator graphs, memory, step time) derives from the
frozen :class:`Model`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from .configio import ConfigError, Fields, read_mapping

PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
BYTES_PER_ELEMENT = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


@dataclass(frozen=True)
class Model:
    """One transformer language model, as the shapes that decide its cost."""

    name: str
    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    architecture: str = "decoder"        # decoder (causal LM) | encoder (BERT-style MLM)
    kv_heads: int = 0                    # 0 means = heads (multi-head attention)
    head_dim: int = 0                    # 0 means = hidden / heads
    activation: str = "gelu"             # gelu | relu | swiglu
    position_embedding: str = "learned"  # learned | rotary | alibi
    max_positions: int = 0               # learned table size; 0 means = seq_len
    tied_embeddings: bool = True
    norm: str = "layernorm"              # layernorm | rmsnorm
    norm_position: str = "pre"           # pre (final norm after the stack) | post
    bias: bool = True                    # biases in linear layers and LayerNorm
    dropout: bool = True                 # attention and residual dropout present
    embedding_norm: bool = False         # a norm right after the embeddings (BERT)
    embedding_projection_dim: int = 0    # OPT-350M style factorised embedding; 0 = none
    token_types: int = 0                 # BERT segment embeddings
    precision: str = "bf16"
    qkv_bias: bool = False               # biases on the q, k, v projections only (Qwen2) when ``bias`` is off
    sliding_window: int = 0              # attention window (Mistral); 0 = every earlier token
    notes: tuple[str, ...] = field(default=(), compare=False)  # what was assumed in reading it

    def __post_init__(self):
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.max_positions == 0 and self.position_embedding == "learned":
            object.__setattr__(self, "max_positions", self.seq_len)

    # --- derived shapes -------------------------------------------------------------------
    @property
    def causal(self) -> bool:
        return self.architecture == "decoder"

    @property
    def q_dim(self) -> int:
        """Width of the query projection (heads x head_dim)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection."""
        return self.kv_heads * self.head_dim

    @property
    def bytes_per_element(self) -> int:
        """Bytes of one activation or weight element in the compute precision (fp8 keeps
        activations that cross kernels in 16-bit, as Transformer Engine does)."""
        return 2 if self.precision == "fp8" else BYTES_PER_ELEMENT[self.precision]

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.activation == "swiglu" else 2

    # --- parameter counts -----------------------------------------------------------------
    @property
    def norm_params(self) -> int:
        return self.hidden * (2 if self.norm == "layernorm" and self.bias else 1)

    @property
    def attention_params(self) -> int:
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        weights = h * (q + 2 * kv) + q * h
        if self.bias:
            return weights + q + 2 * kv + h
        return weights + ((q + 2 * kv) if self.qkv_bias else 0)

    @property
    def ffn_params(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        weights = self.ffn_matrices * h * f
        return weights + (((self.ffn_matrices - 1) * f + h) if self.bias else 0)

    @property
    def layer_params(self) -> int:
        """Parameters of one transformer layer (attention, FFN, two norms)."""
        return self.attention_params + self.ffn_params + 2 * self.norm_params

    @property
    def embedding_params(self) -> int:
        """Token (+ position, segment, projection) embeddings and the embedding norm."""
        h = self.hidden
        e = self.embedding_projection_dim or h
        n = self.vocab * e
        if e != h:
            n += 2 * e * h  # project_in and project_out, no bias (OPT)
        if self.position_embedding == "learned":
            n += self.max_positions * h
        n += self.token_types * h
        if self.embedding_norm:
            n += self.norm_params
        return n

    @property
    def head_params(self) -> int:
        """Final norm, untied LM head, and the encoder's pooler and MLM transform."""
        h = self.hidden
        n = self.norm_params if self.norm_position == "pre" else 0
        if not self.tied_embeddings:
            n += self.vocab * (self.embedding_projection_dim or h)
        if self.architecture == "encoder":
            n += (h * h + h)                      # pooler
            n += (h * h + h) + self.norm_params   # MLM transform dense + norm
            n += self.vocab                       # MLM output bias
        return n

    @property
    def params(self) -> int:
        """Total trainable parameters."""
        return self.layers * self.layer_params + self.embedding_params + self.head_params


# --- closed-form FLOP counts (used as independent checks on the operator graphs) -------------
def narayanan_flops_per_step(model: Model, global_batch: int, full_recompute: bool = False) -> float:
    """FLOPs of one training step by Narayanan et al. (SC'21), eq. (3): GPT with h_ffn = 4h,
    non-causal attention; ``full_recompute`` adds the second forward pass."""
    B, s, l, h, V = global_batch, model.seq_len, model.layers, model.hidden, model.vocab
    if full_recompute:
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    return 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))


# --- loading --------------------------------------------------------------------------------
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu",
                "relu": "relu", "swiglu": "swiglu", "silu": "swiglu"}


def _model_from_yaml(data: dict, source: str) -> Model:
    f = Fields(data, source)
    name = f.str("name")
    architecture = f.choice("architecture", ("decoder", "encoder"), "decoder")
    layers, hidden, heads = f.int("layers"), f.int("hidden"), f.int("heads")
    kv_heads = f.int("kv_heads", heads)
    head_dim = f.int("head_dim", 0, minimum=0)
    if not head_dim and hidden % heads:
        raise f.error("heads", f"must divide hidden ({hidden}) unless head_dim is given, got {heads}")
    if heads % kv_heads:
        raise f.error("kv_heads", f"must divide heads ({heads}), got {kv_heads}")
    position = f.choice("position_embedding", ("learned", "rotary", "alibi"), "learned")
    model = Model(
        name=name, architecture=architecture, layers=layers, hidden=hidden, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim,
        ffn_hidden=f.int("ffn_hidden"),
        activation=f.choice("activation", ("gelu", "relu", "swiglu"), "gelu"),
        vocab=f.int("vocab"), seq_len=f.int("seq_len"),
        position_embedding=position,
        max_positions=f.int("max_positions", 0, minimum=0),
        tied_embeddings=f.bool("tied_embeddings", True),
        norm=f.choice("norm", ("layernorm", "rmsnorm"), "layernorm"),
        norm_position=f.choice("norm_position", ("pre", "post"), "pre"),
        bias=f.bool("bias", True),
        dropout=f.bool("dropout", True),
        embedding_norm=f.bool("embedding_norm", architecture == "encoder"),
        embedding_projection_dim=f.int("embedding_projection_dim", 0, minimum=0),
        token_types=f.int("token_types", 0, minimum=0),
        precision=f.choice("precision", PRECISIONS, "bf16"),
    )
    f.str("source", None)           # provenance note, free text
    f.int("published_params", None)  # the published count the tests compare against
    f.finish()
    if model.position_embedding == "learned" and model.max_positions < model.seq_len:
        raise ConfigError(source, "seq_len", f"must be <= max_positions ({model.max_positions}) "
                                             f"with learned positions, got {model.seq_len}")
    return model


def _first(cfg: dict, *keys, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def model_from_hf_config(cfg: dict, source: str = "config.json", name: str | None = None) -> Model:
    """Build a :class:`Model` from a Hugging Face ``config.json`` dictionary (GPT-2, OPT, BERT,
    Llama/Mistral, MPT, GPT-NeoX and similar)."""
    mtype = str(cfg.get("model_type", "")).lower()
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
    layers = _first(cfg, "num_hidden_layers", "n_layer", "n_layers", "num_layers")
    heads = _first(cfg, "num_attention_heads", "n_head", "n_heads")
    for key, value in (("hidden_size", hidden), ("num_hidden_layers", layers),
                       ("num_attention_heads", heads), ("vocab_size", cfg.get("vocab_size"))):
        if not isinstance(value, int) or value <= 0:
            raise ConfigError(source, key, f"must be a positive integer, got {value!r}")
    attn_cfg = cfg.get("attn_config") or {}
    kv_heads = _first(cfg, "num_key_value_heads", default=None) or attn_cfg.get("kv_n_heads") or heads
    ffn = _first(cfg, "intermediate_size", "n_inner", "ffn_dim", "d_ff")
    if ffn is None and cfg.get("expansion_ratio"):
        ffn = int(cfg["expansion_ratio"] * hidden)
    ffn = ffn or 4 * hidden
    act = str(_first(cfg, "hidden_act", "activation_function", default="gelu")).lower()
    if mtype in ("llama", "mistral", "qwen2", "gemma"):
        act = "swiglu"
    activation = _ACTIVATIONS.get(act)
    if activation is None:
        raise ConfigError(source, "hidden_act", f"must be one of {', '.join(_ACTIVATIONS)}, got {act!r}")
    max_pos = _first(cfg, "max_position_embeddings", "n_positions", "max_seq_len", default=2048)
    rotary = (mtype in ("llama", "mistral", "gpt_neox", "qwen2", "gemma") or "rope_theta" in cfg
              or bool(attn_cfg.get("rope")))  # MPT keeps its RoPE switch in attn_config
    alibi = bool(attn_cfg.get("alibi")) or mtype in ("bloom",)
    if mtype == "mpt" and not alibi and not rotary:
        position = "learned"
    else:
        position = "rotary" if rotary else ("alibi" if alibi else "learned")
    encoder = mtype in ("bert", "roberta")
    norm = "rmsnorm" if ("rms_norm_eps" in cfg or mtype in ("llama", "mistral")) else "layernorm"
    bias = not cfg.get("no_bias", False) and norm == "layernorm" and mtype not in ("llama", "mistral")
    proj = cfg.get("word_embed_proj_dim") or 0
    post = (mtype == "opt" and cfg.get("do_layer_norm_before") is False) or encoder
    dtype = str(cfg.get("torch_dtype", "bfloat16"))
    precision = {"float16": "fp16", "bfloat16": "bf16", "float32": "bf16"}.get(dtype, "bf16")
    # training length defaults to the context length, capped at 8192 (long-context checkpoints
    # are pre-trained shorter); --seq-len overrides
    notes = []
    if isinstance(max_pos, int) and max_pos > 0:
        seq = min(max_pos, 8192)
        notes.append(f"sequence length {seq}: the config's context of {max_pos}"
                     + (" capped at 8192 (long-context checkpoints pre-train shorter)" if max_pos > 8192 else "")
                     + "; --seq-len sets it")
    else:
        seq = 2048
        notes.append("sequence length 2048: the config gives no context length; --seq-len sets it")
    qkv_bias = mtype == "qwen2" and not bias
    if qkv_bias:
        notes.append("q/k/v projections with biases (Qwen2), no other linear biases")
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window", mtype == "mistral") is False or not isinstance(window, int) or window <= 0:
        window = 0
    if window:
        notes.append(f"sliding-window attention over {window} tokens (in effect when the sequence is longer)")
    return Model(
        name=name or cfg.get("_name_or_path") or mtype or "hf-model",
        architecture="encoder" if encoder else "decoder",
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=cfg.get("head_dim") or 0, ffn_hidden=ffn, activation=activation,
        vocab=cfg["vocab_size"], seq_len=seq, position_embedding=position,
        max_positions=(max_pos + (2 if mtype == "opt" else 0)) if position == "learned" else 0,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", mtype not in ("llama", "mistral"))),
        norm=norm, norm_position="post" if post else "pre", bias=bias,
        dropout=bool(_first(cfg, "attention_probs_dropout_prob", "attn_pdrop", "dropout",
                            "attention_dropout", default=0.0)),
        embedding_norm=encoder, embedding_projection_dim=proj if proj and proj != hidden else 0,
        token_types=cfg.get("type_vocab_size", 0) if encoder else 0, precision=precision,
        qkv_bias=qkv_bias, sliding_window=window, notes=tuple(notes),
    )


def workload_dirs() -> list[Path]:
    """Where workload names are looked up: ./workloads, then the shipped ones."""
    dirs = [Path.cwd() / "workloads"]
    dirs.append(Path(__file__).resolve().parent / "workloads")  # installed (non-editable)
    dirs.append(Path(__file__).resolve().parent.parent / "workloads")
    return dirs


def resolve_config(name: str, dirs: list[Path], what: str, flag: str) -> Path:
    """A name (``gpt3-175b``) or a path; one clear error when it is neither."""
    if not name.strip():
        raise ConfigError(flag, None, f"must name a shipped {what} or a .yaml path, got ''")
    path = Path(name)
    try:
        exists = path.exists()
    except (OSError, ValueError) as exc:     # a name too long for the file system, a NUL byte
        raise ConfigError(flag, None, f"cannot be read as a path ({getattr(exc, 'strerror', None) or exc}); "
                                      f"allowed: a shipped {what} name or a .yaml path") from None
    if path.suffix in (".yaml", ".yml", ".json") or exists:
        if exists:
            return path
        raise ConfigError(name, None, "file not found")
    for d in dirs:
        for suffix in (".yaml", ".yml"):
            candidate = d / f"{name.lower()}{suffix}"
            if candidate.exists():
                return candidate
    known = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.yaml")})
    raise ConfigError(flag, None, f"unknown {what} {name!r}; shipped: {', '.join(known)} "
                                  f"(or give a path to a .yaml file)")


def load_model(name_or_path: str | Path, seq_len: int | None = None) -> Model:
    """Load a workload by shipped name, YAML path or Hugging Face ``config.json`` path."""
    path = resolve_config(str(name_or_path), workload_dirs(), "workload", "--workload")
    data = read_mapping(path)
    if path.suffix == ".json":
        model = model_from_hf_config(data, str(path), name=path.parent.name or path.stem)
    else:
        model = _model_from_yaml(data, str(path))
    if seq_len is not None:
        model = with_seq_len(model, seq_len)
    return model


def with_seq_len(model: Model, seq_len: int) -> Model:
    """The model trained at another sequence length; a learned position table grows to match
    (as llm-foundry's benchmark configs size it to ``max_seq_len``)."""
    if seq_len == model.seq_len:
        return model
    grow = model.position_embedding == "learned" and model.max_positions < seq_len
    notes = tuple(n for n in model.notes if not n.startswith("sequence length")) + (
        f"sequence length {seq_len} (set by --seq-len)",)
    return replace(model, seq_len=seq_len, notes=notes,
                   max_positions=seq_len if grow else model.max_positions)


def published_params(name_or_path: str | Path) -> int | None:
    """The published parameter count recorded in a shipped workload file, if any."""
    path = resolve_config(str(name_or_path), workload_dirs(), "workload", "--workload")
    return read_mapping(path).get("published_params")
