"""What a hyperparameter search is asked to do (:class:`TuneConfig`) and what every worker
needs to run its share of the trials (:class:`StudySetup`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlfleet.config.fields import EnvCount, NonNegativeInt, PositiveFloat, PositiveInt, Seed
from rlfleet.tune.objective import AggregateKind, ScoreKind, TrialPlan

PrunerKind = Literal["median", "halving", "none"]
SamplerKind = Literal["tpe", "random"]


@dataclass
class TuneConfig:
    """Settings of a hyperparameter search (``rlfleet tune ALGO --env ENV [flags]``)."""

    trials: PositiveInt = 20
    """Trials in the study in total; a resumed study runs only the missing ones."""
    search_space: Path | None = None
    """Search-space YAML laid over the algorithm's shipped space (format: docs/tuning.md)."""
    seeds: PositiveInt = 3
    """Training runs per trial, on seeds seed, seed+1, ...; the objective aggregates them."""
    seed: Seed = 0
    """First training seed; also seeds the sampler."""
    aggregate: AggregateKind = "iqm"
    """How seeds' scores become the objective: mean, or iqm (interquartile mean)."""
    score: ScoreKind = "last"
    """A seed's score: its last test score, its best, or the mean of all its test scores."""
    pruner: PrunerKind = "median"
    """Stop unpromising trials early: median, halving (successive halving) or none."""
    prune_startup_trials: NonNegativeInt = 5
    """Median pruner: trials that must finish before any is pruned."""
    prune_warmup_steps: NonNegativeInt | None = None
    """Median pruner: no trial is pruned at a step below this (default: a third of max_steps;
    a trial's steps count on over its seeds: seed index x max_steps + env step)."""
    sampler: SamplerKind = "tpe"
    """How parameters are chosen: tpe (Tree-structured Parzen Estimator) or random."""
    study: str | None = None
    """Study name (default: <algo>-<env>)."""
    study_dir: Path | None = None
    """Where trials' run directories and the outputs go (default: studies/<study>)."""
    storage: str | None = None
    """Database URL shared by the workers (default: sqlite:///<study_dir>/study.db);
    postgresql://... or mysql+pymysql://... to share a study between machines."""
    jobs: PositiveInt = 1
    """Worker processes on this machine."""
    timeout: PositiveFloat | None = None
    """Seconds after which no new trial starts (running trials finish)."""
    max_steps: PositiveInt | None = None
    """Env steps per training run (default: the preset's)."""
    epoch_num_steps: PositiveInt | None = None
    """Env steps per epoch, i.e. between test steps (default: the preset's)."""
    test_episodes: PositiveInt | None = None
    """Test episodes per test step (default: the preset's)."""
    num_envs: EnvCount | None = None
    """Training envs per run (default: the preset's)."""
    config: Path | None = None
    """Run config YAML every trial starts from (default: the shipped preset, adapted to an
    env it does not name, as ``rlfleet train`` adapts it)."""
    adapt_defaults: bool = True
    """Without ``config``, start trials from the defaults adapted to an env the presets do
    not name (see ``adapt_defaults`` of the run config); ``--no-adapt-defaults``: from the
    preset's ``default`` section alone."""
    heartbeat_interval: PositiveInt = 10
    """Seconds between a running trial's heartbeats; a trial silent for 3 intervals is
    treated as lost and queued again."""
    verbose: bool = True
    """Print one line per finished trial."""


@dataclass(frozen=True)
class StudySetup:
    """Everything a worker needs, resolved and validated; picklable for worker processes."""

    study_name: str
    storage_url: str
    study_dir: Path
    plan: TrialPlan
    config: TuneConfig
