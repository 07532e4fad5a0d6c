"""Finding a workload by name and loading it: the shipped ``workloads/`` files, the published
names and aliases of the bundled catalogues (``phaze/data/model_aliases.csv``, ...), a context
length a name carries, a YAML path or a Hugging Face ``config.json``.
"""
from __future__ import annotations

import csv
import re
from functools import lru_cache
from pathlib import Path

from .configio import ConfigError, config_dirs, read_mapping, resolve_config
from .hf_config import model_from_hf_config
from .workload import Model, model_from_yaml, with_seq_len


def workload_dirs() -> list[Path]:
    """Where workload names are looked up: ./workloads, then the shipped ones."""
    return config_dirs("workloads")


# words after a published model's name that name a fine-tuned or repackaged variant of the same
# network (Llama-2-13b-chat-hf, Meta-Llama-3-8B-Instruct, Nemotron-4-340B-Base, Google's
# instruction-tuned gemma-2-9b-it): same shapes
VARIANT_WORDS = ("hf", "base", "instruct", "chat", "sft", "it")
# a trailing context length (NeMo 2.5.0's recipes llama3_8b_16k, llama3_8b_128k, mixtral_8x7b_64k,
# nemotron4_15b_64k: the same network trained at 16K to 128K tokens, which a row gives in seq_len)
CONTEXT_WORD = re.compile(r"\d+k")
# words that name a parameter-efficient fine-tuning method in a published model name (NeMo's
# performance tables write ``LLAMA3-70B (LoRA)``): adapters trained on frozen weights, a step
# without the base model's weight gradients, their reduction or its optimizer, which phaze does not
# model; such a name is refused (:func:`peft_error`) rather than read as full training of the network
PEFT_WORDS = ("lora", "qlora", "dora", "peft", "ptuning", "prefixtuning", "adapter", "adapters")
# what such a step is, which phaze does not cost (a name's refusal and validate's ``peft`` column's)
PEFT_REASON = ("adapters trained on frozen weights, with no weight gradients, gradient reduction or optimizer "
               "state for the base model")


def peft_error(name: str) -> str:
    """Why a published model name cannot be costed as full training: a word of it, in a qualifier in
    parentheses or not, that names a parameter-efficient method (:data:`PEFT_WORDS`); "" otherwise."""
    words = re.split(r"[^a-z0-9]+", name.strip().rpartition("/")[2].lower())
    found = next((w for w in words if w in PEFT_WORDS), "")
    if not found:
        return ""
    return (f"{name!r} names parameter-efficient fine-tuning ({found}): {PEFT_REASON}, are not modelled "
            f"(phaze costs full training of every weight)")


def name_key(name: str) -> str:
    """A published model name reduced for matching: lower case, letters, digits and dots only
    (``LLAMA2-70B``, ``Llama-2-70B`` and ``Llama 2 70B`` are one key)."""
    return re.sub(r"[^a-z0-9.]", "", name.lower())


def name_keys(name: str) -> tuple[str, ...]:
    """The keys a published name may match, most specific first: the name itself; without a
    Hugging Face organisation (``meta-llama/``); without a trailing qualifier in parentheses (NeMo's
    performance tables write ``LLAMA2-70B (SFT)`` for a fine-tuning run of Llama 2 70B); without
    trailing :data:`VARIANT_WORDS` or context length (:data:`CONTEXT_WORD`). Each drops only what
    names the run or the checkpoint, not the network."""
    text = name.strip().rpartition("/")[2]
    forms = [name, text]
    bare = re.sub(r"(\s*\([^()]*\))+$", "", text).strip()
    forms.append(bare)
    words = re.split(r"[-_\s]+", bare)
    while len(words) > 1 and (words[-1].lower() in VARIANT_WORDS or CONTEXT_WORD.fullmatch(words[-1].lower())):
        words.pop()
        forms.append("-".join(words))
    return tuple(dict.fromkeys(k for k in map(name_key, forms) if k))


@lru_cache(maxsize=4)
def _published_names(dirs: tuple[Path, ...]) -> dict[str, Path]:
    """Name key -> workload file: each workload's file stem and model name in ``dirs`` (the first
    wins: ./workloads, then the shipped ones) and the spellings of ``phaze/data/model_aliases.csv``
    (each with its source)."""
    out: dict[str, Path] = {}
    for d in reversed(dirs):
        for path in sorted(d.glob("*.yaml")) if d.is_dir() else ():
            try:
                model_name = str(read_mapping(path).get("name") or path.stem)
            except ConfigError:
                continue
            out[name_key(path.stem)] = out[name_key(model_name)] = path
    for key, row in catalogue("model_aliases.csv").items():
        target = out.get(name_key(row["model"]))
        if target:
            out.setdefault(key, target)
    return out


def catalogue_rows(filename: str) -> list[dict]:
    """The rows of a catalogue of published models in ``phaze/data`` (``model``, ``aliases``
    joined by ';', ``source``, ...)."""
    with (Path(__file__).resolve().parent / "data" / filename).open(newline="") as fh:
        return list(csv.DictReader(fh))


def catalogue(filename: str) -> dict[str, dict]:
    """:func:`catalogue_rows` by the name key of each row's model and of each of its aliases."""
    return {name_key(name): row for row in catalogue_rows(filename)
            for name in [row["model"], *row["aliases"].split(";")] if name.strip()}


def workload_aliases() -> dict[str, str]:
    """Each spelling of ``phaze/data/model_aliases.csv``, in lower case -> the stem of the shipped
    workload it names: names ``--workload`` takes as they are and offers when one is mistyped."""
    return dict(_aliases(tuple(workload_dirs())))


@lru_cache(maxsize=4)
def _aliases(dirs: tuple[Path, ...]) -> dict[str, str]:
    names = _published_names(dirs)
    out = {}
    for row in catalogue_rows("model_aliases.csv"):
        target = names.get(name_key(row["model"]))
        for alias in row["aliases"].split(";") if target else ():
            if alias.strip():
                out[alias.strip().lower()] = target.stem
    return out


def find_workload(name: str) -> Path | None:
    """The workload file a published model name names (by :func:`name_keys`), or None."""
    names = _published_names(tuple(workload_dirs()))
    return next((names[k] for k in name_keys(name) if k in names), None)


def workload_path(name_or_path: str | Path) -> Path:
    """The file of a workload name (shipped, or a published name in ``phaze/data/model_aliases.csv``,
    in any of the spellings :func:`name_keys` reads) or path."""
    try:
        return resolve_config(str(name_or_path), "workloads", "workload", "--workload", workload_aliases())
    except ConfigError:
        peft = peft_error(name_or_path) if isinstance(name_or_path, str) else ""
        if peft:
            raise ConfigError("--workload", None, peft) from None
        found = find_workload(str(name_or_path)) if isinstance(name_or_path, str) else None
        if found is None:
            raise
        return found


def load_model(name_or_path: str | Path, seq_len: int | None = None) -> Model:
    """Load a workload by shipped name, YAML path or Hugging Face ``config.json`` path."""
    path = workload_path(name_or_path)
    data = read_mapping(path)
    if path.suffix == ".json":
        # a repository's config.json is named by its folder, another JSON file by its own name
        stem = path.stem if path.stem != "config" else ""
        model = model_from_hf_config(data, str(path), name=stem or path.parent.name or "config")
    else:
        model = model_from_yaml(data, str(path))
    named = named_context(name_or_path, path, model) if seq_len is None and isinstance(name_or_path, str) else None
    if named is not None:
        return with_seq_len(model, named, f"named by {name_or_path!r}")
    if seq_len is not None:
        model = with_seq_len(model, seq_len)
    return model


def named_context(name: str, path: Path, model: Model) -> int | None:
    """The sequence length a published name found by dropping its trailing context length
    (:data:`CONTEXT_WORD`: NeMo's ``llama3_8b_16k`` trains Llama 3 8B at 16,384 tokens) says, in
    tokens (K = 1,024); None when the name is the file's or the model's own, or has no such word."""
    word = re.split(r"[-_\s]+", name.strip().rpartition("/")[2])[-1].lower()
    if not CONTEXT_WORD.fullmatch(word) or name_key(name) in (name_key(path.stem), name_key(model.name)):
        return None
    return int(word[:-1]) * 1024


def published_params(name_or_path: str | Path) -> int | None:
    """The published parameter count recorded in a shipped workload file, if any."""
    path = workload_path(name_or_path)
    return read_mapping(path).get("published_params")
