"""Reading and validating user-supplied configuration (YAML, JSON, CSV rows).

Every problem becomes a :class:`ConfigError` that names the file, the field and what is
allowed, so the CLI can print one line and exit with status 2.
"""
from __future__ import annotations

import difflib
import json
import math
import os
import reprlib
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

_MISSING = object()
# the largest integer a config field may hold unless it says less: no field comes near, and beyond it
# the products of widths leave the floats (a 200-digit hidden width overflowed in evaluate)
MAX_INT = 10 ** 15
MAX_FILE_BYTES = 16 * 2 ** 20      # a config file larger than this is not a config (16 MiB)
MAX_YAML_NODES = 100_000           # YAML nodes after alias expansion (a billion-laughs file has 10^9)
_QUOTE = reprlib.Repr()
_QUOTE.maxstring, _QUOTE.maxother, _QUOTE.maxlong, _QUOTE.maxlevel = 80, 80, 40, 3


def quote(value: Any) -> str:
    """``repr(value)`` cut to a line: what an error message may quote of user input, whatever its
    size (a huge string, a deeply nested or alias-expanded YAML value)."""
    return _QUOTE.repr(value)


# libyaml's parser where PyYAML was built with it (its wheels are): ten times the pure-Python
# loader's speed, which is most of reading a chip file; the same safe constructor either way
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_aliases(root) -> None:
    """Refuse a composed YAML document with a recursive alias, or whose aliases expand to more than
    :data:`MAX_YAML_NODES` nodes: the composer shares an aliased node, and the expansion happens in
    every consumer of the data (a billion-laughs file of a few hundred bytes)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list = [(root, None)]      # (node, its children once they are on the stack above it)
    while stack:
        node, children = stack.pop()
        key = id(node)
        if children is not None:        # every child sized: the node's expanded size
            size = 1 + sum(sizes[id(c)] for c in children)
            if size > MAX_YAML_NODES:
                raise yaml.composer.ComposerError(
                    None, None, f"aliases expand to more than {MAX_YAML_NODES:,} values", node.start_mark)
            sizes[key] = size
            open_nodes.discard(key)
        elif key in open_nodes:
            raise yaml.composer.ComposerError(None, None, "recursive alias (an anchor used inside its own value)",
                                              node.start_mark)
        elif key not in sizes:
            if isinstance(node, yaml.ScalarNode):
                sizes[key] = 1
                continue
            open_nodes.add(key)
            children = ([c for kv in node.value for c in kv] if isinstance(node, yaml.MappingNode)
                        else node.value)
            stack.append((node, children))
            stack.extend((c, None) for c in reversed(children))


def _load_yaml(text: str):
    """The data of one YAML document, composed, checked by :func:`_check_aliases`, constructed."""
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_aliases(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


class ConfigError(ValueError):
    """Bad user input: ``<source>: field '<field>': <what is wrong and what is allowed>``."""

    def __init__(self, source: str, field: str | None, message: str):
        self.source, self.field, self.message = str(source), field, message
        where = f"{self.source}: field '{field}'" if field else self.source
        super().__init__(f"{where}: {message if len(message) <= 2000 else message[:2000] + '...'}")


def read_mapping(path: str | Path) -> dict:
    """Load a YAML or JSON file whose top level must be a mapping."""
    path = Path(path)
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(info.st_mode):     # /dev/zero, a FIFO, a socket: reading never ends
            raise ConfigError(path, None, "not a regular file; allowed: a YAML or JSON file")
        if info.st_size > MAX_FILE_BYTES:
            raise ConfigError(path, None, f"{info.st_size:,} bytes; allowed: a YAML or JSON file of at "
                                          f"most {MAX_FILE_BYTES:,} bytes")
        with open(path, "rb") as fh:
            text = fh.read(MAX_FILE_BYTES + 1).decode()
        if len(text) > MAX_FILE_BYTES:
            raise ConfigError(path, None, f"over {MAX_FILE_BYTES:,} bytes; allowed: a YAML or JSON file "
                                          f"of at most {MAX_FILE_BYTES:,} bytes")
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except IsADirectoryError:
        raise ConfigError(path, None, "is a directory; allowed: a YAML or JSON file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(path, None, f"not a text file (byte {exc.start} is not UTF-8); allowed: "
                                      f"a YAML or JSON file") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read file ({exc.strerror or exc})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else _load_yaml(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else (
            f" at line {exc.lineno}" if hasattr(exc, "lineno") else "")
        reason = getattr(exc, "problem", None) or getattr(exc, "msg", None) or "syntax error"
        reason = reason if len(reason) <= 200 else reason[:200] + "..."
        raise ConfigError(path, None, f"not valid {'JSON' if path.suffix == '.json' else 'YAML'}"
                                      f"{line}: {reason}") from None
    except (RecursionError, ValueError) as exc:     # absurd nesting, numbers past the int limit
        raise ConfigError(path, None, f"not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                                      f"{type(exc).__name__}") from None
    if not isinstance(data, dict):
        raise ConfigError(path, None, "top level must be a mapping of field: value")
    return data


class Fields:
    """Typed, checked access to one mapping; remembers which keys were read so that
    :meth:`finish` can reject unknown ones."""

    def __init__(self, data: dict, source: str | Path, prefix: str = ""):
        if not isinstance(data, dict):
            raise ConfigError(source, prefix.rstrip(".") or None, "must be a mapping")
        self.data, self.source, self.prefix = data, str(source), prefix
        self._used: set[str] = set()

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.source, self.prefix + key, message)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def _get(self, key: str, default: Any) -> Any:
        self._used.add(key)
        if key not in self.data or self.data[key] is None:
            if default is _MISSING:
                near = difflib.get_close_matches(key, [str(k) for k in self.data], n=1)
                hint = f"; found {near[0]!r}: a misspelling?" if near else ""
                raise self.error(key, f"missing (required){hint}")
            return default
        return self.data[key]

    def int(self, key: str, default: Any = _MISSING, minimum: int = 1, maximum: int | None = None) -> Any:
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        maximum = MAX_INT if maximum is None else maximum
        if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
                or value > maximum):
            allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            allowed += f" up to {maximum:,}"
            raise self.error(key, f"must be {allowed}, got {quote(value)}")
        return value

    def number(self, key: str, default: Any = _MISSING, minimum: float = 0.0,
               inclusive: bool = False, maximum: float | None = None) -> Any:
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value)
              and (value >= minimum if inclusive else value > minimum)
              and (maximum is None or value <= maximum))
        if not ok:
            lo = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            hi = f" and <= {maximum:g}" if maximum is not None else ""
            raise self.error(key, f"must be a number {lo}{hi}, got {quote(value)}")
        return float(value)

    def choice(self, key: str, choices: Iterable[str], default: Any = _MISSING) -> Any:
        choices = tuple(choices)
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, str):
            value = value.strip().lower()
        if value not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}, got {quote(value)}")
        return value

    def bool(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {quote(value)}")
        return value

    def str(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str) or not value.strip():
            raise self.error(key, f"must be a non-empty string, got {quote(value)}")
        return value.strip()

    def sub(self, key: str, default: Any = _MISSING) -> Fields | None:
        value = self._get(key, default)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.error(key, "must be a mapping")
        return Fields(value, self.source, f"{self.prefix}{key}.")

    def list(self, key: str, default: Any = _MISSING) -> list:
        value = self._get(key, default)
        if not isinstance(value, list) or not value:
            raise self.error(key, "must be a non-empty list")
        return value

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self._used)
        if unknown:
            allowed = ", ".join(sorted(self._used))
            raise self.error(str(unknown[0]), f"unknown key; allowed keys here: {allowed}")


# --- shipped configs by name ------------------------------------------------------------------
def config_dirs(folder: str) -> list[Path]:
    """Where shipped config names are looked up: ``./<folder>``, then the copy installed inside
    the package (non-editable install), then the repository's."""
    here = Path(__file__).resolve().parent
    return [Path.cwd() / folder, here / folder, here.parent / folder]


def suggest(name: str, known: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the known names that start with ``name`` or are close to it
    (difflib), else ``""``: a typo or a short form should be one edit away from the right name."""
    known = sorted(set(known))
    low = name.strip().lower()
    near = [k for k in known if low and k.startswith(low)][:3]
    near += [k for k in difflib.get_close_matches(low, known, n=3, cutoff=0.6) if k not in near]
    if not near:
        return ""
    return " (did you mean " + " or ".join(repr(k) for k in near[:3]) + "?)"


def resolve_config(name: str, folder: str, what: str, flag: str,
                   aliases: dict[str, str] | None = None) -> Path:
    """The file of a shipped config name (``gpt3-175b``, or a published name in ``aliases``,
    mapped to the shipped name) or of a path; one clear error, with the nearest names, when it is
    neither."""
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
    dirs = config_dirs(folder)
    aliases = aliases or {}
    key = name.strip().lower()
    for stem in (key, aliases.get(key), aliases.get(key.rpartition("/")[2])):   # also an HF id org/name
        for d in dirs if stem else ():
            for suffix in (".yaml", ".yml"):
                candidate = d / f"{stem}{suffix}"
                if candidate.exists():
                    return candidate
    known = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.yaml")})
    raise ConfigError(flag, None, f"unknown {what} {name!r}{suggest(key, known + list(aliases))}; shipped: "
                                  f"{', '.join(known)} (or give a path to a .yaml file)")


def divisors(n: int) -> str:
    """The divisors of ``n``, comma-separated: what a width that must divide ``n`` may be (the
    'allowed' part of an error)."""
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
