"""A sampler wrapper that never proposes a design the study already holds.

TPE, NSGA-II and the random sampler propose designs with replacement: on a small grid, TPE
re-proposed designs it had already evaluated in up to 45 % of its proposals, each one a wasted
trial. :class:`NoRepeatSampler` asks the wrapped sampler for a whole design (its relative sample,
completed parameter by parameter) and draws again while the design is already in the study
(evaluated, in flight or proposed before); after ``attempts`` repeats it takes a uniformly random
design the study does not hold. The wrapped sampler still sees every trial and its constraints
(``trial.set_constraint``), so its model is unchanged.
"""
from __future__ import annotations

import random

from .space import design_key

ATTEMPTS = 4             # draws from the wrapped sampler before a random unseen design (each
                         # reads the whole study: 64 cost 35 ms a trial once TPE converged)
RANDOM_ATTEMPTS = 10_000


def make_norepeat(inner, cfg, seed: int = 0):
    """``inner`` wrapped so that it never repeats a design of ``cfg``'s space."""
    import optuna  # deferred: optuna imports slowly

    class NoRepeatSampler(optuna.samplers.BaseSampler):
        def __init__(self):
            self.inner = inner
            self.space = {d.param: d.distribution() for d in cfg.searched}
            self.choices = {d.param: list(d.choices) for d in cfg.searched}
            self.rng = random.Random(seed)
            self.repeats_avoided = 0

        def infer_relative_search_space(self, study, trial):
            return dict(self.space)

        def _seen(self, study) -> set:
            return {design_key(t.params) for t in study.get_trials(deepcopy=False) if len(t.params) == len(self.space)}

        def sample_relative(self, study, trial, search_space):
            seen = self._seen(study)
            inner_space = self.inner.infer_relative_search_space(study, trial)
            for _ in range(ATTEMPTS):
                p = dict(self.inner.sample_relative(study, trial, inner_space)) if inner_space else {}
                for name, dist in self.space.items():
                    if name not in p:
                        p[name] = self.inner.sample_independent(study, trial, name, dist)
                if design_key(p) not in seen:
                    return p
                self.repeats_avoided += 1
            for _ in range(RANDOM_ATTEMPTS):      # the sampler has converged: explore instead
                p = {name: self.rng.choice(c) for name, c in self.choices.items()}
                if design_key(p) not in seen:
                    return p
            return p                              # (nearly) every design is held: a repeat is pruned

        def sample_independent(self, study, trial, param_name, param_distribution):
            return self.inner.sample_independent(study, trial, param_name, param_distribution)

        def before_trial(self, study, trial):
            self.inner.before_trial(study, trial)

        def after_trial(self, study, trial, state, values):
            self.inner.after_trial(study, trial, state, values)

        def reseed_rng(self):
            self.inner.reseed_rng()
            self.rng = random.Random()

    return NoRepeatSampler()
