"""The architecture search: an Optuna study over chip designs.

Each trial samples the chip parameters of a sweep config, builds the chip, scores it on every
workload (:func:`phaze.candidate.evaluate_chip`) and records the objectives, the budgets through
``trial.set_constraint`` (feasible when every value is <= 0) and everything an architect needs
later (chip, plans, time breakdown, area, power, cost, schedule status) as user attributes. The
study lives in an Optuna storage (SQLite at ``results/<study>/study.db`` by default), so a rerun
of the same command resumes: ``--trials N`` is the total of complete trials, and a design that
was already evaluated is never evaluated again (a repeat proposal is pruned as a duplicate).
``sweep`` walks the whole grid instead, largest area first (the original paper's method).
"""
from __future__ import annotations

import contextlib
import csv
import inspect
import io
import itertools
import logging
import math
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import schedule as _schedule
from .arch import load_chip
from .area import silicon
from .candidate import evaluate_chip
from .configio import ConfigError
from .exact import ExactSampler, certificate, make_exact_sampler
from .lazy import tqdm
from .norepeat import make_norepeat
from .space import CONSTRAINTS, SweepConfig, build_chip, chip_values, design_key
from .storage import (  # noqa: F401  (re-exported: phaze.search is where users find them)
    GRACE_PERIOD_S,
    _optuna,
    default_storage,
    make_storage,
    mask_password,
    postgres_driver_url,
    set_user_attrs,
    storage_errors,
    study_dir,
)
from .study_files import write_study_files

# toward --trials: done, in flight on some worker, or queued (the template; a dead worker's retry)
STATES_COUNTED = ("COMPLETE", "RUNNING", "WAITING")
INTERRUPT_WAIT_S = 1.2                     # after Ctrl-C, how long --jobs workers get to fail their trials
DUPLICATE_STREAK = 200                     # consecutive repeat proposals that end a search


def _plain_options(cls, kw: dict, source: str) -> dict:
    """``kw`` checked against the sampler's constructor: only its number and switch parameters
    (annotated ``int``, ``float`` or ``bool``; a YAML file cannot give the others, and ``seed`` is
    the config's), each of its type, so that a wrong one fails here in one line rather than in the
    middle of a study."""
    plain = {}
    for name, p in inspect.signature(cls.__init__).parameters.items():
        kind = str(p.annotation).replace(" | None", "")
        if name != "seed" and kind in ("int", "float", "bool"):
            plain[name] = kind
    for name, value in kw.items():
        kind = plain.get(name)
        if name == "seed":
            raise ConfigError(source, "sampler_options.seed", "is the config's seed (seed:), not a sampler "
                                                              "option; allowed: the others")
        if kind is None:
            raise ConfigError(source, f"sampler_options.{name}", f"is not an option phaze can pass to "
                                                                   f"{cls.__name__}; allowed: {', '.join(plain)}")
        ok = (isinstance(value, bool) if kind == "bool" else not isinstance(value, bool) and (
            isinstance(value, int) if kind == "int" else isinstance(value, (int, float)) and math.isfinite(value)))
        if not ok:
            raise ConfigError(source, f"sampler_options.{name}", f"must be {'an' if kind == 'int' else 'a'} "
                                                                   f"{kind}, got {value!r}")
    return kw


def make_sampler(cfg: SweepConfig, worker: int = 0):
    """The config's sampler, seeded (``seed + worker`` so parallel workers differ)."""
    optuna = _optuna()
    s = optuna.samplers
    seed = cfg.seed + worker
    kw = dict(cfg.sampler_options)
    classes = {"tpe": s.TPESampler, "nsga2": s.NSGAIISampler, "random": s.RandomSampler, "grid": s.GridSampler}
    if cfg.sampler in classes:
        _plain_options(classes[cfg.sampler], kw, cfg.source)
    try:
        if cfg.sampler == "tpe":
            return make_norepeat(s.TPESampler(seed=seed, **{"n_startup_trials": 10, **kw}), cfg, seed)
        if cfg.sampler == "nsga2":
            return make_norepeat(s.NSGAIISampler(seed=seed, **{"population_size": 20, **kw}), cfg, seed)
        if cfg.sampler == "random":
            return make_norepeat(s.RandomSampler(seed=seed, **kw), cfg, seed)
        if cfg.sampler == "grid":
            return s.GridSampler(cfg.grid(), seed=seed, **kw)
        if cfg.sampler == "exact":
            if kw:
                raise ConfigError(cfg.source, "sampler_options", "the exact sampler takes no options")
            return make_exact_sampler(cfg)
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ConfigError(cfg.source, "sampler", "gp needs PyTorch, which phaze does not install "
                              "(pip install torch); allowed without it: tpe, nsga2, random, grid") from None
        return make_norepeat(s.GPSampler(seed=seed, **_plain_options(s.GPSampler, kw, cfg.source)), cfg, seed)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(cfg.source, "sampler_options", f"{exc}") from None


_key = design_key


@dataclass
class _Objective:
    """The trial function: the design the sampler proposes, evaluated unless it already was."""

    cfg: SweepConfig

    def __post_init__(self):
        self.seen: dict[tuple, int] = {}
        self.done: set[int] = set()          # trials of ``seen`` known COMPLETE (they stay so)
        self.in_hand: int | None = None      # the trial id this process is evaluating
        self.shared = None                   # a --jobs worker's copy of it, for its parent
        self.tag_owner = False               # storage without heartbeats: name the process
        self.interrupted = False             # a Ctrl-C ended a trial here (see drive)

    def refresh(self, study, current: int | None = None) -> None:
        """Designs already evaluated, or in evaluation on another worker, read afresh: a trial
        that was RUNNING and then failed (its worker died) no longer holds its design, so that
        the retry Optuna queues for it is evaluated rather than pruned as its duplicate. Two
        workers that start one design at once may both prune it (neither is evaluated twice); the
        exact sampler proposes such a design again (:class:`phaze.exact.ExactSampler`)."""
        states = _optuna().trial.TrialState
        seen: dict[tuple, int] = {}
        for t in study.get_trials(deepcopy=False, states=(states.COMPLETE, states.RUNNING)):
            if t.number != current and (t.state == states.COMPLETE or len(t.params) == len(self.cfg.searched)):
                seen.setdefault(_key(t.params), t.number)
                if t.state == states.COMPLETE:
                    self.done.add(t.number)
        self.seen = seen

    def fail_in_hand(self, study) -> None:
        """Mark the trial this process was evaluating FAIL if Optuna did not (an interruption
        outside the trial function)."""
        _fail_if_running(study, self.in_hand)

    counted: tuple = STATES_COUNTED

    def surplus(self, trial) -> bool:
        """Whether trials created before this one already make up ``--trials`` (workers that
        start trials at the same moment both pass Optuna's budget check; trial numbers, given out
        by the storage one by one, decide which of them is surplus)."""
        states = _optuna().trial.TrialState
        ahead = sum(t.number < trial.number for t in trial.study.get_trials(
            deepcopy=False, states=tuple(getattr(states, s) for s in self.counted)))
        return ahead >= self.cfg.trials

    def __call__(self, trial):
        try:
            return self._evaluate(trial)
        except KeyboardInterrupt:
            self.interrupted = True
            raise

    def _evaluate(self, trial):
        optuna = _optuna()
        cfg = self.cfg
        self.in_hand = trial._trial_id
        if self.shared is not None:          # the --jobs parent fails it if this worker must be ended
            self.shared.value = trial._trial_id
        if self.tag_owner:
            trial.storage.set_trial_system_attr(trial._trial_id, OWNER, _owner())
        if self.surplus(trial):
            trial.set_user_attr("surplus", True)
            trial.study.stop()
            raise optuna.TrialPruned(f"the study already holds its {cfg.trials} trials")
        choices = {d.param: d.suggest(trial) for d in cfg.searched}
        sampler = trial.study.sampler
        if isinstance(sampler, ExactSampler) and sampler.is_filler(trial.number):
            trial.study.stop()
            raise optuna.TrialPruned("every design of the space is decided")
        key = _key(choices)
        if self.seen.get(key) not in self.done:    # new here, or held by a trial that may have failed
            self.refresh(trial.study, trial.number)
        if key in self.seen:
            trial.set_user_attr("duplicate_of", self.seen[key])
            raise optuna.TrialPruned(f"design already evaluated in trial {self.seen[key]}")
        values = record(trial, cfg, choices)
        self.seen[key] = trial.number
        return values[0] if len(values) == 1 else values


def record(trial, cfg: SweepConfig, choices: dict) -> list[float]:
    """Evaluate the design of ``choices`` and record it on ``trial``; return the objective values."""
    start = time.perf_counter()
    values = cfg.values(choices)
    chip = build_chip(cfg.base, values, cfg.process_node_nm, cfg.link_latency_s)
    ev = evaluate_chip(chip, cfg.workloads, constraints=cfg.constraints)
    attrs = {"chip": chip_values(chip)}
    store_evaluation(attrs.__setitem__, ev, cfg)
    attrs["eval_time_s"] = time.perf_counter() - start
    set_user_attrs(trial, attrs)
    for key, v in ev.violations(cfg.constraints).items():
        trial.set_constraint(key, v)
    return [ev.metric(o) for o in cfg.objectives]


def store_evaluation(put, ev, cfg: SweepConfig) -> None:
    """The attributes every trial (and baseline) carries."""
    reasons = ev.reasons(cfg.constraints)
    put("feasible", not reasons)
    put("reason", "; ".join(reasons))
    put("reason_kinds", ev.reason_kinds(cfg.constraints))
    put("evaluated", ev.evaluated)
    put("area_mm2", ev.area_mm2)
    put("power_w", ev.power_w)
    put("cost_usd", ev.cost_usd)
    put("throughput_tokens_per_s", ev.throughput)
    put("silicon", _jsonable(ev.silicon))
    put("workloads", [_jsonable(o.__dict__) for o in ev.outcomes])
    statuses = [o.schedule_status for o in ev.outcomes if o.schedule_status]
    put("schedule_status", max(statuses, key=lambda s: ("OPTIMAL", "FEASIBLE", "HEURISTIC").index(s))
        if statuses else "")
    put("schedule_gap", max((o.schedule_gap for o in ev.outcomes), default=0.0))
    clocks = [o.clock_hz for o in ev.outcomes if o.feasible]
    put("clock_hz", min(clocks) if clocks else None)          # the lowest clock a workload ran at
    put("throttled", [o.workload for o in ev.outcomes if o.throttled])


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# --- studies ---------------------------------------------------------------------------------------
def open_study(cfg: SweepConfig, storage: str, name: str, create: bool = True, sampler=None,
               heartbeat: bool = True, grace_period_s: int = GRACE_PERIOD_S, chosen_by: str = ""):
    """Load the study, or (``create``) create it if it does not exist. ``chosen_by``: how its
    designs are chosen, for the report (default: the config's sampler)."""
    if not create:
        optuna = _optuna()
        try:
            return optuna.load_study(study_name=name, storage=make_storage(storage, heartbeat, grace_period_s),
                                     sampler=sampler)
        except KeyError:
            raise ConfigError("--study", None, f"no study {name!r} in {mask_password(storage)}") from None
    return _create_or_load(cfg, storage, name, sampler, heartbeat, grace_period_s, chosen_by)[0]


def _create_or_load(cfg: SweepConfig, storage: str, name: str, sampler=None, heartbeat: bool = True,
                    grace_period_s: int = GRACE_PERIOD_S, chosen_by: str = ""):
    """(study, created): ``created`` is true in the one process that created the study, even when
    many start together (the database's unique study name decides). The study keeps the config's
    fingerprint, so that only the same space, workloads, budgets and objectives resume it, and
    what a report needs; the fingerprint is written last, so a study whose creator was killed
    before it was whole (a kill between two writes) is completed by the next run."""
    optuna = _optuna()
    st = make_storage(storage, heartbeat, grace_period_s)
    try:
        study, created = optuna.create_study(study_name=name, storage=st, directions=cfg.directions,
                                             sampler=sampler), True
    except optuna.exceptions.DuplicatedStudyError:
        study, created = optuna.load_study(study_name=name, storage=st, sampler=sampler), False
    attrs = study.user_attrs
    if attrs.get("fingerprint", cfg.fingerprint()) != cfg.fingerprint():
        raise ConfigError("--study", None, f"study {name!r} in {mask_password(storage)} was made by a different space, "
                          f"workloads, budgets or objectives; allowed: the same config, or a new --study name")
    if "fingerprint" not in attrs or "config" not in attrs:
        study.set_user_attr("config", {"name": cfg.name, "objectives": list(cfg.objectives),
                                       "constraints": dict(cfg.constraints),
                                       "workloads": [w.label for w in cfg.workloads],
                                       "weights": [w.weight for w in cfg.workloads],
                                       "space": {d.key: (d.expression or list(d.values)) for d in cfg.dimensions},
                                       "base": cfg.base.name, "sampler": chosen_by or cfg.sampler, "seed": cfg.seed,
                                       "workload_sources": [w.source for w in cfg.workloads],
                                       "process_node_nm": cfg.process_node_nm,
                                       "link_latency_s": cfg.link_latency_s})
        study.set_user_attr("fingerprint", cfg.fingerprint())   # last: the study is whole
    if [d.name.lower() for d in study.directions] != cfg.directions:
        raise ConfigError("--study", None, f"study {name!r} has objectives of other directions")
    return study, created


def count(study, states=STATES_COUNTED) -> int:
    optuna = _optuna()
    return len(study.get_trials(deepcopy=False, states=tuple(getattr(optuna.trial.TrialState, s)
                                                               for s in states)))


def template_choices(cfg: SweepConfig) -> dict:
    """The template chip snapped to the nearest point of the space: the first trial."""
    v = chip_values(cfg.base)
    return {d.param: d.nearest_choice(v[d.key]) for d in cfg.searched}


def check_budgets(cfg: SweepConfig) -> None:
    """Refuse budgets that no point can meet. Area and cost grow with every parameter, so the
    smallest corner bounds them from below and the largest from above."""
    if not cfg.constraints:
        return
    lo = {d.param: d.choices[0] for d in cfg.searched}
    hi = {d.param: d.choices[-1] for d in cfg.searched}
    small = silicon(build_chip(cfg.base, cfg.values(lo), cfg.process_node_nm))
    large = silicon(build_chip(cfg.base, cfg.values(hi), cfg.process_node_nm))
    metric = {"area": ("area_mm2", "mm²"), "cost": ("cost_usd", "$")}
    for key, bound in cfg.constraints:
        what, sense = CONSTRAINTS[key]
        if what not in metric:
            continue
        attr, unit = metric[what]
        edge = getattr(small if sense == "max" else large, attr)
        if (sense == "max" and edge > bound) or (sense == "min" and edge < bound):
            raise ConfigError(cfg.source, f"constraints.{key}", f"no point of the space can meet it: "
                              f"the {'smallest' if sense == 'max' else 'largest'} design has "
                              f"{what} {edge:,.1f} {unit} against the bound {bound:,.1f} {unit}")


def evaluate_baselines(cfg: SweepConfig, study, progress: bool = False) -> dict:
    """Each baseline chip scored by the same code on the same workloads; stored on the study.
    With ``progress``, a bar over the chips not scored yet (their schedules take seconds each)."""
    stored = dict(study.user_attrs.get("baselines", {}))
    todo = [name for name in cfg.baselines if name not in stored]
    for name in tqdm.tqdm(todo, desc="baselines", unit="chip", disable=not (progress and todo), dynamic_ncols=True,
                     leave=False):
        chip = load_chip(name)
        ev = evaluate_chip(chip, cfg.workloads, constraints=cfg.constraints, skip_if_over_budget=False)
        attrs: dict = {"chip_name": chip.name, "chip": chip_values(chip)}
        store_evaluation(attrs.__setitem__, ev, cfg)
        attrs["objectives"] = {o: ev.metric(o) for o in cfg.objectives}
        stored[name] = attrs
        study.set_user_attr("baselines", stored)
    return stored


class _Progress:
    """tqdm bar of trials done, feasible so far and the best first objective."""

    def __init__(self, cfg: SweepConfig, study, total: int, enabled: bool):
        self.cfg, self.total = cfg, total
        self.bar = tqdm.tqdm(total=total, initial=min(total, count(study, ("COMPLETE",))), unit="trial",
                        desc=f"search {study.study_name}", disable=not enabled, dynamic_ncols=True)
        self.update(study)

    def update(self, study) -> None:
        optuna = _optuna()
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        feas = [t for t in done if t.user_attrs.get("feasible")]
        self.bar.n = min(self.total, len(done))
        post = {"feasible": len(feas)}
        if feas:
            sign = 1 if self.cfg.directions[0] == "maximize" else -1
            best = max(feas, key=lambda t: sign * t.values[0])
            post[f"best {self.cfg.objectives[0]}"] = f"{best.values[0]:.4g}"
        self.bar.set_postfix(post)
        self.bar.refresh()

    def __call__(self, study, trial) -> None:
        self.update(study)

    def bounded(self, n: int, total: int) -> None:
        """The exact search's level-1 bounds so far (they come before most evaluations)."""
        post = dict(self.bar.postfix and [kv.split("=", 1) for kv in self.bar.postfix.split(", ")] or [])
        post["bounded"] = f"{n}/{total}"
        self.bar.set_postfix(post)
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


class _Stops:
    """Ends a study whose space is exhausted, or whose sampler only repeats evaluated designs."""

    def __init__(self, cfg: SweepConfig):
        self.streak, self.size, self.note = 0, cfg.grid_size(), ""

    def __call__(self, study, trial) -> None:
        self.streak = self.streak + 1 if trial.state.name == "PRUNED" else 0
        if isinstance(study.sampler, ExactSampler) and study.sampler.peek(study) is None:
            study.stop()
        elif count(study, ("COMPLETE",)) >= self.size:
            self.note = f"every one of the {self.size} designs of the space is evaluated"
            study.stop()
        elif self.streak >= DUPLICATE_STREAK:
            self.note = (f"the sampler proposed {self.streak} evaluated designs in a row "
                         f"(converged, or the space is nearly exhausted)")
            study.stop()


def drive(study, cfg: SweepConfig, callbacks=(), poll_s: float = 1.0, in_hand=None) -> str:
    """Run trials until the study holds ``cfg.trials`` complete ones; returns why it stopped early
    ("" when it reached the total). Trials in flight count toward the total (``MaxTrialsCallback``
    over COMPLETE and RUNNING: many workers never overshoot); when they are all that is missing,
    the worker waits for them: they complete, fail (and the sampler fills the gap) or go stale
    (their worker died: failed after the grace period and retried once; on the file journal,
    failed once their process on this host is gone)."""
    optuna = _optuna()
    from optuna.storages._heartbeat import is_heartbeat_enabled  # deferred: optuna imports slowly
    states = optuna.trial.TrialState
    stops = _Stops(cfg)
    objective = _Objective(cfg)
    objective.shared = in_hand
    objective.refresh(study)
    # without heartbeats (the file journal) each trial names its worker's host and process, and a
    # RUNNING trial whose process on this host is gone is failed (see _fail_orphans)
    beating = is_heartbeat_enabled(study._storage)
    counted = STATES_COUNTED
    objective.tag_owner = not beating
    budget = optuna.study.MaxTrialsCallback(cfg.trials, states=tuple(getattr(states, x) for x in counted))
    adopted: set[int] = set()
    exact = isinstance(study.sampler, ExactSampler)
    try:
        while count(study, ("COMPLETE",)) < cfg.trials and not stops.note:
            queued = count(study, ("WAITING",))     # Optuna's ask() runs queued trials first
            if exact and not queued and study.sampler.peek(study) is None:
                if not count(study, ("RUNNING",)):
                    break               # every design is decided: the certificate says how
                time.sleep(poll_s)      # designs in flight elsewhere: wait for them (they may fail)
                optuna.storages.fail_stale_trials(study)
                if not beating:
                    _fail_orphans(study)
                continue
            if queued or count(study, counted) < cfg.trials:
                try:
                    study.optimize(objective, callbacks=[budget, stops, *callbacks], catch=())
                except (ValueError, optuna.exceptions.UpdateFinishedTrialError) as exc:
                    # on SQLite two processes can both take one queued trial (Optuna reads its
                    # state outside the write); the one that tells it second finds it finished by
                    # the other (Optuna's check, or the storage's when the other finished it in
                    # between): carry on. A Ctrl-C that ended the trial here is still one: the
                    # failed tell replaced Optuna's re-raise of it
                    if isinstance(exc, ValueError) and "Cannot tell a" not in str(exc):
                        raise
                    if objective.interrupted:
                        raise KeyboardInterrupt from None
            else:
                if beating:
                    # a worker killed before its trial's first heartbeat leaves a RUNNING trial that
                    # Optuna never calls stale: give each one heartbeat, once, so that it goes stale
                    # after the grace period unless its worker is alive and keeps beating
                    for t in study.get_trials(deepcopy=False, states=(states.RUNNING,)):
                        if t._trial_id not in adopted:
                            adopted.add(t._trial_id)
                            study._storage.record_heartbeat(t._trial_id)
                else:
                    _fail_orphans(study)
                time.sleep(poll_s)
                optuna.storages.fail_stale_trials(study)
                for cb in callbacks:
                    if hasattr(cb, "update"):
                        cb.update(study)
    except KeyboardInterrupt:
        objective.fail_in_hand(study)
        raise
    _settle_queued(study, cfg)
    return stops.note


OWNER = "phaze:owner"       # a trial's system attribute on storage without heartbeats: host and pid


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _fail_orphans(study) -> None:
    """Fail the RUNNING trials of processes of this host that are gone (storage without
    heartbeats, the file journal: a killed worker's trial would otherwise stay RUNNING for ever
    and, counted toward ``--trials``, keep the study from completing). Trials of other hosts
    cannot be checked: they wait for their worker."""
    states = _optuna().trial.TrialState
    host = socket.gethostname()
    for t in study.get_trials(deepcopy=False, states=(states.RUNNING,)):
        where, _, pid = str(t.system_attrs.get(OWNER, "")).rpartition(":")
        if where != host or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            if _fail_if_running(study, t._trial_id) and "failed_trial" not in t.system_attrs:
                # retried once, as Optuna's RetryHeartbeatStaleTrialCallback does on a database
                attrs = {k: v for k, v in t.system_attrs.items() if k != OWNER}
                study.add_trial(_optuna().trial.create_trial(
                    state=states.WAITING, params=t.params, distributions=t.distributions,
                    user_attrs=t.user_attrs,
                    system_attrs={**attrs, "failed_trial": t.number, "retry_history": [t.number]}))
        except OSError:         # alive, another user's
            pass


def _fail_if_running(study, trial_id: int | None) -> bool:
    """Mark a trial FAIL if it is still RUNNING (its process was interrupted or ended); whether
    this call did it."""
    states = _optuna().trial.TrialState
    if trial_id is None or trial_id < 0:
        return False
    try:
        if study._storage.get_trial(trial_id).state == states.RUNNING:
            return bool(study._storage.set_trial_state_values(trial_id, states.FAIL) is not False)
    except Exception:   # another worker did it, or best effort on the way out (heartbeats catch the rest)
        pass
    return False


def _settle_queued(study, cfg: SweepConfig) -> None:
    """Prune, as surplus, trials still queued once the study holds its total: a dead worker's
    retry can be queued after the last sampler trial started (Optuna fails a stale trial and
    queues its retry in two steps), and no worker would ever run it."""
    states = _optuna().trial.TrialState
    if count(study, ("COMPLETE",)) < cfg.trials:
        return
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(states.WAITING,)):
        if storage.set_trial_state_values(t._trial_id, states.RUNNING):   # False: another worker took it
            storage.set_trial_user_attr(t._trial_id, "surplus", True)
            storage.set_trial_state_values(t._trial_id, states.PRUNED)


_HERE = str(Path(__file__).resolve().parent)


def _unsafe(frame) -> bool:
    """Whether a KeyboardInterrupt raised in ``frame`` could be lost or disguised: outside
    phaze's own code (a finalizer or weak-reference callback of a library prints "Exception
    ignored in ..." and carries on; a library's cleanup half done), in a ``__del__``, or inside
    an import (an extension module's import turns it into ImportError)."""
    if frame is None or frame.f_code.co_name == "__del__" or not frame.f_code.co_filename.startswith(_HERE):
        return True
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _on_interrupt(signum, frame) -> None:
    """SIGINT (and the retry alarm): KeyboardInterrupt where it is safe, else again in 10 ms."""
    if signum == signal.SIGALRM and not _PENDING:
        return
    if _unsafe(frame):
        _PENDING.append(True)
        signal.setitimer(signal.ITIMER_REAL, 0.01)
        return
    _PENDING.clear()
    raise KeyboardInterrupt


_PENDING: list[bool] = []


@contextlib.contextmanager
def interruptible():
    """Ctrl-C as a KeyboardInterrupt raised only where it can be handled (see :func:`_unsafe`);
    a no-op outside the main thread, where signals are not delivered."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, _on_interrupt), signal.signal(signal.SIGALRM, _on_interrupt)
    # Python runs handlers only between bytecodes, not during a CP-SAT solve (up to its time
    # limit): the wake-up fd tells a thread of each signal at once, and it stops the solve
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    wakeup = signal.set_wakeup_fd(theirs.fileno(), warn_on_full_buffer=False)
    watcher = threading.Thread(target=_watch, args=(ours,), daemon=True, name="phaze-ctrl-c")
    watcher.start()

    def restore() -> bool:
        signal.setitimer(signal.ITIMER_REAL, 0)
        pending = bool(_PENDING)
        _PENDING.clear()
        signal.set_wakeup_fd(wakeup)
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGALRM, before[1])
        theirs.close()
        watcher.join(timeout=1)
        ours.close()
        _schedule._STOPPED.clear()
        return pending

    try:
        yield
    except BaseException:
        restore()
        raise
    if restore():       # a Ctrl-C deferred to the end of the block is not lost
        raise KeyboardInterrupt


@contextlib.contextmanager
def ctrl_c_held(late: list):
    """Ctrl-C recorded in ``late``, not raised, until the block ends: around a search and the
    writing of its files, so that a Ctrl-C whose handler runs only after the search loop has
    stopped (the loop can stop on the solve that Ctrl-C ended, before Python runs the handler)
    or a second Ctrl-C never cuts the tables and report short. The search loop's own
    :func:`interruptible` raises inside it as before; the block's caller reads ``late``. A no-op
    outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def hold(signum, frame):
        if signum == signal.SIGINT or _PENDING:
            late.append(signum)
    before = signal.signal(signal.SIGINT, hold), signal.signal(signal.SIGALRM, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGALRM, before[1])
        if _PENDING:
            _PENDING.clear()
            late.append(signal.SIGINT)


def _watch(sock) -> None:
    """Stop the CP-SAT solves in progress at each SIGINT (see :func:`interruptible`)."""
    try:
        while data := sock.recv(64):
            if signal.SIGINT in data:
                _schedule.stop_solves()
    except OSError:
        pass


def _worker(cfg: SweepConfig, storage: str, name: str, worker: int, grace_period_s: int, in_hand=None) -> None:
    """One ``--jobs`` worker: its own session (the parent forwards Ctrl-C), SIGINT ignored until
    it is ready to fail its trial in hand cleanly."""
    try:
        os.setsid()
    except OSError:
        pass
    try:
        with interruptible():
            study = open_study(cfg, storage, name, sampler=make_sampler(cfg, worker), grace_period_s=grace_period_s)
            drive(study, cfg, in_hand=in_hand)
    except KeyboardInterrupt:   # Ctrl-C: the trial in hand is failed; end quietly
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclass(frozen=True)
class SearchResult:
    study_name: str
    storage: str
    out_dir: Path
    complete: int
    elapsed_s: float                # the search alone: not the baselines, nor the report
    note: str = ""


def search(cfg: SweepConfig, storage: str | None = None, study_name: str | None = None, jobs: int = 1,
           progress: bool = True, write: bool = True, grace_period_s: int = GRACE_PERIOD_S,
           figures: bool = True) -> SearchResult:
    """Run (or resume, or join) the study of ``cfg`` until it holds ``cfg.trials`` complete trials.

    The same call from another process or machine on the same storage joins the study. The
    process that creates the study enqueues the template chip as its first trial, so it is
    enqueued once however many workers start together. ``figures`` False writes the tables and
    report.md without report.html and the figures (a fleet's workers; ``phaze report`` draws
    them once)."""
    name = study_name or cfg.name
    url = storage or cfg.storage or default_storage(cfg, name)
    with storage_errors(url):
        return _search(cfg, url, name, jobs, progress, write, grace_period_s, figures)


def _search(cfg: SweepConfig, url: str, name: str, jobs: int, progress: bool, write: bool,
            grace_period_s: int, figures: bool = True) -> SearchResult:
    check_budgets(cfg)
    study, created = _create_or_load(cfg, url, name, make_sampler(cfg), grace_period_s=grace_period_s)
    if created:
        study.enqueue_trial(template_choices(cfg), user_attrs={"template": cfg.base.name})
    evaluate_baselines(cfg, study, progress)
    start = time.perf_counter()     # the search alone: not the baselines, nor the report
    exact = isinstance(study.sampler, ExactSampler)
    total = min(cfg.trials, int(study.sampler.space.ok.sum())) if exact else cfg.trials
    bar = _Progress(cfg, study, total, progress)
    if exact:
        study.sampler.on_bound = bar.bounded
    note, interrupted, late = "", False, []
    with ctrl_c_held(late):     # a Ctrl-C after the loop waits for the files (see ctrl_c_held)
        try:
            with interruptible():
                if late:    # a Ctrl-C in the instant before this handler was in place
                    raise KeyboardInterrupt
                if jobs <= 1:
                    note = drive(study, cfg, callbacks=[bar])
                else:
                    _run_workers(cfg, url, name, jobs, bar, study, grace_period_s)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            elapsed_s = time.perf_counter() - start
            bar.update(study)
            bar.close()
            if cfg.sampler == "exact":
                write_certificate(cfg, study, study_dir(url, name) if write else None)
            if write:       # after Ctrl-C, the tables and report.md at once; figures with the next run
                drawn = figures and not (interrupted or late)
                _writing(study_dir(url, name), progress, figures=drawn)
                write_study_files(study, cfg, study_dir(url, name), figures=drawn)
    res = SearchResult(name, url, study_dir(url, name), count(study, ("COMPLETE",)), elapsed_s, note)
    if interrupted or late:
        raise SearchInterrupted(res)
    return res


def _writing(out_dir: Path, progress: bool, figures: bool = True) -> None:
    """One status line while the report and its figures are written (seconds for a large study)."""
    if progress:
        what = ("report.md, report.html and figures" if figures
                else "report.md (report.html and figures: phaze report, or the next run)")
        print(f"writing {out_dir}/trials.csv, {what} ...", file=sys.stderr, flush=True)


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`search`: the trial in hand is failed, the study's tables are written,
    and ``result`` is the study so far; the same call resumes it."""

    def __init__(self, result: SearchResult):
        super().__init__()
        self.result = result


def write_certificate(cfg: SweepConfig, study, out_dir: Path | None):
    """The exact search's certificate, stored on the study (the report reads it) and, with
    ``out_dir``, every design decided without evaluation in ``certificate.csv``."""
    cert, records = certificate(cfg, study)
    study.set_user_attr("certificate", _jsonable(cert.to_dict()))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        buf = io.StringIO()
        cols = ["point", *(d.param for d in cfg.searched), "level", "throughput_bound", "area_mm2",
                "bounded_by_trial"]
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for r in records:
            w.writerow({k: (f"{v:.9g}" if isinstance(v, float) else v) for k, v in r.items()})
        tmp = out_dir / "certificate.csv.tmp"
        tmp.write_text(buf.getvalue())
        tmp.replace(out_dir / "certificate.csv")
    return cert


def _run_workers(cfg, url, name, jobs, bar, study, grace_period_s) -> None:
    """``jobs`` worker processes on the study; the bar follows the storage. The workers run in
    sessions of their own, so that a Ctrl-C reaches them once, through this process: each fails
    its trial in hand and ends; stragglers are terminated (their trials go stale)."""
    ctx = multiprocessing.get_context("spawn")
    in_hand = [ctx.Value("q", -1, lock=False) for _ in range(jobs)]     # each worker's trial id
    procs = [ctx.Process(target=_worker, args=(cfg, url, name, w, grace_period_s, in_hand[w]), daemon=True)
             for w in range(jobs)]
    main = threading.current_thread() is threading.main_thread()    # signals belong to the main thread
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None   # inherited until a worker is set up
    try:
        for p in procs:
            p.start()
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    try:
        while any(p.is_alive() for p in procs):
            time.sleep(0.2)
            bar.update(study)
    except KeyboardInterrupt:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGINT)
        end = time.monotonic() + INTERRUPT_WAIT_S
        for p in procs:
            p.join(timeout=max(0.0, end - time.monotonic()))
        for p, trial_id in zip(procs, in_hand, strict=True):
            if p.is_alive():
                p.terminate()
                p.join()
                _fail_if_running(study, trial_id.value)
        raise
    finally:
        for p in procs:
            p.join()
    bad = [p.exitcode for p in procs if p.exitcode]
    if bad:
        logging.getLogger("phaze").warning("%d worker(s) ended with an error", len(bad))


def sweep(cfg: SweepConfig, storage: str | None = None, study_name: str | None = None,
          limit: int | None = None, progress: bool = True, write: bool = True, figures: bool = True) -> SearchResult:
    """Every point of the grid, largest area first; points over the area or cost budget are
    counted on the study (``sweep_skipped``) rather than evaluated. Resumes like :func:`search`;
    ``figures`` as there."""
    name = study_name or f"{cfg.name}-sweep"
    url = storage or cfg.storage or default_storage(cfg, name)
    with storage_errors(url):
        return _sweep(cfg, url, name, limit, progress, write, figures)


def _sweep(cfg: SweepConfig, url: str, name: str, limit: int | None, progress: bool, write: bool,
           figures: bool = True) -> SearchResult:
    optuna = _optuna()
    check_budgets(cfg)
    study = open_study(cfg, url, name, sampler=optuna.samplers.RandomSampler(seed=cfg.seed), heartbeat=False,
                       chosen_by="sweep")
    conf = dict(study.user_attrs.get("config") or {})
    if conf.get("sampler") != "sweep":      # the report says how the designs were chosen
        study.set_user_attr("config", {**conf, "sampler": "sweep"})
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)  # a sweep is one process
    evaluate_baselines(cfg, study, progress)
    start = time.perf_counter()     # the sweep alone: not the baselines, nor the report
    grid = cfg.grid()
    keys = list(grid)
    points, skipped = [], {}
    static = [(k, b) for k, b in cfg.constraints if CONSTRAINTS[k][0] in ("area", "cost")]
    for combo in itertools.product(*(grid[k] for k in keys)):
        choices = dict(zip(keys, combo, strict=True))
        chip = build_chip(cfg.base, cfg.values(choices), cfg.process_node_nm)
        si = silicon(chip)
        over = [k for k, b in static if (_static_value(si, k) > b if CONSTRAINTS[k][1] == "max"
                                         else _static_value(si, k) < b)]
        if over:
            skipped[over[0]] = skipped.get(over[0], 0) + 1
        else:
            points.append((-si.area_mm2, choices))
    points.sort(key=lambda p: p[0])
    if limit:
        points = points[:limit]
    study.set_user_attr("sweep_skipped", skipped)
    done = {_key(t.params) for t in study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.COMPLETE}
    todo = [c for _, c in points if _key(c) not in done]
    bar = tqdm.tqdm(total=len(points), initial=len(points) - len(todo), unit="design",
               desc=f"sweep {name}", disable=not progress, dynamic_ncols=True)
    interrupted, late = False, []
    with ctrl_c_held(late):     # as in :func:`_search`: a late Ctrl-C waits for the files
        try:
            with interruptible():
                if late:
                    raise KeyboardInterrupt
                for choices in todo:
                    study.enqueue_trial(choices)
                    trial = study.ask()
                    try:
                        values = record(trial, cfg, {d.param: d.suggest(trial) for d in cfg.searched})
                    except BaseException:
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                        raise
                    study.tell(trial, values)
                    bar.update(1)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            elapsed_s = time.perf_counter() - start
            bar.close()
            if write:
                drawn = figures and not (interrupted or late)
                _writing(study_dir(url, name), progress, figures=drawn)
                write_study_files(study, cfg, study_dir(url, name), figures=drawn)
    res = SearchResult(name, url, study_dir(url, name), count(study, ("COMPLETE",)), elapsed_s)
    if interrupted or late:
        raise SearchInterrupted(res)
    return res


def _static_value(si, key: str) -> float:
    return si.area_mm2 if CONSTRAINTS[key][0] == "area" else si.cost_usd

