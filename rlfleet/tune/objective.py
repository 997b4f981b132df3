"""One trial of a study: train a sampled run config on several seeds and score it.

Every trial trains the seeds ``seed, seed + 1, ...``: all trials see the same seeds, so
they differ by their hyperparameters and not by their luck. Each seed is a normal run
directory, ``<study_dir>/trials/<trial number>/seed-<seed>/``.

Intermediate values: every test step reports its score to Optuna at step
``seed_index * max_steps + env_step``. Seeds run one after another, so a step names the
same seed at the same point of training in every trial, and the pruner compares like with
like. A pruned trial stops at once, in whichever seed it is.

A seed's score is its ``last`` test score (the default), its ``best``, or the ``mean`` of
all its test scores (the area under its learning curve, which also rewards learning fast).
The trial's value aggregates the seeds' scores by their ``mean`` or their interquartile
mean (``iqm``, Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice"),
which down-weights the luckiest and unluckiest seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from rlfleet.runs.config import RunConfig, run_config_to_dict
from rlfleet.runs.run import train
from rlfleet.train.loop import TestResultFn
from rlfleet.tune import attrs
from rlfleet.tune.space import SearchSpace, apply_overrides

if TYPE_CHECKING:
    import optuna

ScoreKind = Literal["last", "best", "mean"]
AggregateKind = Literal["mean", "iqm"]


def interquartile_mean(values: Sequence[float]) -> float:
    """Mean of the middle half of ``values``.

    Each of the ``n`` sorted values stands for a ``1/n`` slice of the distribution and is
    weighted by how much of its slice lies between the 25th and 75th percentiles. With a
    multiple of 4 values this is the usual trimmed mean; with 3 it weighs the median 2/3
    and the others 1/6 each, where a plain trimmed mean would cut nothing.
    """
    x = np.sort(np.asarray(values, dtype=np.float64))
    if x.size == 0:
        raise ValueError("interquartile_mean needs at least one value")
    edges = np.arange(x.size + 1) / x.size
    weights = np.clip(np.minimum(edges[1:], 0.75) - np.maximum(edges[:-1], 0.25), 0.0, None)
    return float(np.dot(weights, x) / weights.sum())


def aggregate(values: Sequence[float], kind: AggregateKind) -> float:
    """The trial's value from its seeds' scores."""
    if kind == "iqm":
        return interquartile_mean(values)
    return float(np.mean(values))


def seed_score(test_scores: Sequence[float], kind: ScoreKind) -> float:
    """A seed run's score from the scores of its test steps, in order."""
    if not test_scores:
        raise ValueError("a run ends with a test step, so it has at least one test score")
    if kind == "last":
        return float(test_scores[-1])
    if kind == "best":
        return float(max(test_scores))
    return float(np.mean(test_scores))


@dataclass(frozen=True)
class TrialPlan:
    """How every trial of a study is run: the base config, the space, seeds and scoring."""

    base: RunConfig
    """The run config every trial starts from (preset or --config, plus budget flags)."""
    space: SearchSpace
    seeds: int
    """Training runs per trial, with seeds ``first_seed, first_seed + 1, ...``."""
    first_seed: int
    score: ScoreKind
    aggregate: AggregateKind
    trials_dir: Path
    """Parent of the trials' run directories."""

    def run(self, trial: optuna.Trial) -> float:
        """Sample ``trial``'s config, train every seed, return the aggregated score.

        Raises:
            optuna.TrialPruned: the pruner stopped the trial at a test step.
            RlfleetError: the sampled config is invalid or training failed (NaN, ...).
        """
        cfg = apply_overrides(self.base, self.space.suggest(trial), f"trial {trial.number}")
        trial_dir = self.trials_dir / f"{trial.number:04d}"
        trial.set_user_attr(attrs.CONFIG, run_config_to_dict(replace(cfg, seed=self.first_seed)))
        trial.set_user_attr(attrs.RUN_DIR, str(trial_dir))
        quiet = replace(cfg.trainer, show_progress=False, verbose=False)
        scores: list[float] = []
        max_steps = cfg.trainer.max_steps
        for index in range(self.seeds):
            seed = self.first_seed + index
            test_scores: list[float] = []
            reporter = _reporter(
                trial, seed, index * max_steps, test_scores, final_step=self.seeds * max_steps
            )
            train(
                replace(cfg, seed=seed, trainer=quiet),
                trial_dir / f"seed-{seed}",
                force=True,
                test_result_fn=reporter,
            )
            scores.append(seed_score(test_scores, self.score))
            trial.set_user_attr(attrs.SEED_SCORES, scores)
        return aggregate(scores, self.aggregate)


def _reporter(
    trial: optuna.Trial,
    seed: int,
    step_offset: int,
    test_scores: list[float],
    *,
    final_step: int,
) -> TestResultFn:
    """The trainer's ``test_result_fn`` for one seed: keep the score, report it, and raise
    ``TrialPruned`` when the pruner says so, except at ``final_step`` (the test step that
    ends the last seed's budget): a trial that has trained every seed to the end of its
    budget completes, and its value counts."""
    import optuna

    def report(epoch: int, env_step: int, score: float) -> None:
        test_scores.append(score)
        step = step_offset + env_step
        trial.report(score, step)
        if step < final_step and trial.should_prune():
            raise optuna.TrialPruned(
                f"pruned at step {step:,} (seed {seed}, test score {score:.2f})"
            )

    return report
