"""A study's storage: opening an Optuna storage (SQLite, the file journal, PostgreSQL) with
heartbeats, and where a study's files go. Shared by the search, which writes studies, and the
report, which reads them back.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import re
import time
import warnings
from pathlib import Path

from .configio import ConfigError
from .space import SweepConfig


def _optuna():
    import optuna  # deferred: optuna imports slowly
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    for handler in logging.getLogger("optuna").handlers:
        if _quiet_interrupt not in handler.filters:
            handler.addFilter(_quiet_interrupt)
    return optuna


_INTERRUPTED: set[str] = set()      # trials whose failure was a Ctrl-C


def _quiet_interrupt(record: logging.LogRecord) -> bool:
    """Drop Optuna's "Trial N failed ... KeyboardInterrupt()" (with its traceback) and the "Trial N
    failed with value None" after it: Ctrl-C is no fault of the trial, and phaze says itself that
    the search was interrupted."""
    text = record.getMessage()
    m = re.match(r"Trial (\d+) failed with ", text)
    exc = record.exc_info[1] if record.exc_info else None
    if m and (isinstance(exc, KeyboardInterrupt) or "KeyboardInterrupt" in text):
        _INTERRUPTED.add(m.group(1))
        return False
    return not (m and text.startswith(f"Trial {m.group(1)} failed with value") and m.group(1) in _INTERRUPTED)


def default_storage(cfg: SweepConfig, study: str | None = None, root: str | Path = "results") -> str:
    """SQLite file under ``results/<study>/``, as a relative URL (no machine paths in files)."""
    return f"sqlite:///{Path(root) / (study or cfg.name) / 'study.db'}"


def study_dir(storage: str, study: str, root: str | Path = "results") -> Path:
    """Where a study's files go: beside its SQLite or journal file when the file's folder is named
    after the study (the default ``results/<study>/study.db``), else in a folder of the study's
    name beside the file (several studies in one file never overwrite each other's files); for a
    server storage, ``results/<study>/``."""
    for prefix in ("sqlite:///", "journal:///"):
        if storage.startswith(prefix):
            parent = Path(storage[len(prefix):]).parent
            return parent if parent.name == study else parent / study
    return Path(root) / study


SCHEMA_RETRIES = 8
_SCHEMA_RACE = ("UNIQUE constraint failed", "duplicate key value", "already exists", "UniqueViolation")
NAME_MAX = 255          # bytes in a file name (Linux, macOS)
GRACE_PERIOD_S = 30     # a running trial whose worker has not beaten its heart for this long is dead


def make_storage(url: str, heartbeat: bool = True, grace_period_s: int = GRACE_PERIOD_S):
    """An Optuna RDB storage; with ``heartbeat``, a killed worker's trial is failed after
    ``grace_period_s`` and retried once (heartbeats work only inside ``study.optimize``)."""
    _optuna()
    from optuna.storages import (  # deferred: optuna imports slowly
        JournalStorage,
        RDBStorage,
        RetryHeartbeatStaleTrialCallback,
    )
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
    kwargs = {}
    if url.startswith("journal:///"):     # Optuna's file journal: no database, no heartbeats
        path = Path(url[len("journal:///"):])
        if path.exists() and not path.is_file():
            raise ConfigError("--storage", None, f"cannot use {str(path)!r} as a journal: not a regular file "
                              f"(a study must be kept); allowed: journal:///PATH of a new or journal file")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() and path.stat().st_size:    # a journal's first line is a JSON record
                with path.open("rb") as fh:
                    first = json.loads(fh.readline(1 << 16))
                if not isinstance(first, dict) or "op_code" not in first:
                    raise ValueError("its first line is not a journal record")
            return JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))
        except OSError as exc:
            raise ConfigError("--storage", None, f"cannot open the journal {str(path)!r} ({exc.strerror})") from None
        except (ValueError, KeyError, TypeError) as exc:     # JSONDecodeError, UnicodeDecodeError, bad records
            raise ConfigError("--storage", None, f"{str(path)!r} is not an Optuna journal "
                              f"({_first_line(exc)[:120]}); allowed: journal:///PATH of a new or journal file"
                              ) from None
    if url in ("sqlite://", "sqlite:///") or url.startswith("sqlite:///:memory:") or "mode=memory" in url:
        raise ConfigError("--storage", None, f"{url!r} is an in-memory database, gone when the process ends "
                          f"(heartbeats and resuming need the study kept); allowed: sqlite:///PATH")
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):].split("?")[0])
        if len(path.name.encode()) > NAME_MAX:
            raise ConfigError("--storage", None, f"file name too long ({len(path.name.encode())} bytes): "
                              f"{path.name[:40]}...; allowed: at most {NAME_MAX} bytes")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError("--storage", None, f"cannot create {str(path.parent)[:200]!r} ({exc.strerror})") from None
        kwargs = {"connect_args": {"timeout": 60}}
    elif url.startswith("postgresql"):
        kwargs = {"connect_args": {"connect_timeout": 5}}
    shown = mask_password(url)
    if "@" in _password(url):
        raise ConfigError("--storage", None, f"cannot open {shown!r}: the password holds '@', which ends it "
                          f"in a URL; write each '@' in it as %40")
    url = postgres_driver_url(url)
    def open_rdb():
        if not heartbeat:
            return RDBStorage(url, engine_kwargs=kwargs)
        interval = max(1, grace_period_s // 6)
        return RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=interval,
                          grace_period=max(grace_period_s, interval + 1),
                          heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1))

    try:
        for attempt in range(SCHEMA_RETRIES):
            try:
                return open_rdb()
            except Exception as exc:
                # processes started together on a new storage race to create its tables: the
                # losers see the winner's rows or tables; the schema is there once it commits
                text = str(exc)
                if attempt + 1 == SCHEMA_RETRIES or not any(w in text for w in _SCHEMA_RACE):
                    raise
                time.sleep(0.2 * (attempt + 1))
    except Exception as exc:   # bad URL, missing driver, unreachable server: one line
        detail = _first_line(exc).replace(url, shown)
        if _password(url):
            detail = detail.replace(_password(url), "***")
        raise ConfigError("--storage", None, f"cannot open {shown!r}: {detail[:200]}; allowed: "
                          f"sqlite:///PATH, postgresql://USER@HOST/DB (pip install -e '.[postgres]'), "
                          f"or any SQLAlchemy URL Optuna supports") from None


def set_user_attrs(trial, attrs: dict) -> None:
    """Write ``attrs`` as ``trial``'s user attributes. On a database storage they go in one
    transaction (a trial's 18 attributes: about 14 ms on SQLite, against 37 ms for one commit
    each), through the storage's own per-attribute upsert; any other storage, or an Optuna
    without that method, gets one call per attribute."""
    storage = trial.storage
    upsert = getattr(storage, "_set_trial_attr_without_commit", None)
    if upsert is not None:
        try:
            from optuna.storages._rdb import models  # deferred: optuna imports slowly
            from optuna.storages._rdb.storage import _create_scoped_session  # deferred: optuna imports slowly
        except ImportError:
            upsert = None
    if upsert is None:
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return
    with _create_scoped_session(storage.scoped_session, True) as session:
        for key, value in attrs.items():
            upsert(session, models.TrialUserAttributeModel, trial._trial_id, key, value)
    trial._cached_frozen_trial.user_attrs.update(attrs)


@contextlib.contextmanager
def storage_errors(url: str):
    """A storage that fails a write (a read-only file or database, a full disk, a lost server)
    as one line naming ``--storage``, instead of Optuna's StorageInternalError and its traceback."""
    try:
        yield
    except ConfigError:
        raise
    except Exception as exc:
        optuna = _optuna()
        if not (isinstance(exc, optuna.exceptions.StorageInternalError)
                or type(exc).__module__.split(".")[0] in ("sqlalchemy", "sqlite3")):
            raise
        cause = exc.__cause__ or exc
        raise ConfigError("--storage", None, f"cannot write to {mask_password(url)!r}: "
                          f"{_first_line(cause)[:200]}; allowed: a storage this user can write") from None


def _password(url: str) -> str:
    """The password of a URL's ``user:password@`` (everything up to the host's ``@``)."""
    m = re.match(r"[^:/]+(?:\+[^:/]+)?://[^:/@]+:([^/]*)@", url)
    return m.group(1) if m else ""


def mask_password(url: str) -> str:
    """``url`` with its password (all of it, ``@`` included) shown as ``***``."""
    pw = _password(url)
    return url.replace(f":{pw}@", ":***@", 1) if pw else url


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def postgres_driver_url(url: str) -> str:
    """``postgresql://`` means psycopg2 to SQLAlchemy; phaze's ``postgres`` extra installs psycopg
    (3), so a plain URL is given that driver when psycopg2 is not there."""
    if not url.startswith("postgresql://"):
        return url
    if importlib.util.find_spec("psycopg2") is None and importlib.util.find_spec("psycopg") is not None:
        return "postgresql+psycopg://" + url[len("postgresql://"):]
    return url
