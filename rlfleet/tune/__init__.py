"""Hyperparameter search on Optuna: ``rlfleet tune`` and its Python API.

    from rlfleet.tune import TuneConfig, tune

    result = tune("ppo", "CartPole-v1", TuneConfig(trials=50, seeds=3, jobs=2))
    print(result.best_config)  # studies/ppo-CartPole-v1/best.yaml

Modules: :mod:`~rlfleet.tune.space` (search spaces), :mod:`~rlfleet.tune.objective` (one
trial: seeds, intermediate values, aggregation), :mod:`~rlfleet.tune.study` (storage,
workers, resuming), :mod:`~rlfleet.tune.report` (outputs), :mod:`~rlfleet.tune.storage`.
Needs the ``optuna`` extra (``pip install 'rlfleet[optuna]'``); the modules import it only
when a study runs, so ``rlfleet`` itself and the ``--help`` of ``rlfleet tune`` work without.
"""

from __future__ import annotations

from rlfleet.tune.objective import interquartile_mean
from rlfleet.tune.report import TuneResult
from rlfleet.tune.setup import TuneConfig
from rlfleet.tune.space import SearchSpace, load_search_space, shipped_spaces
from rlfleet.tune.study import prepare_study, tune

__all__ = [
    "SearchSpace",
    "TuneConfig",
    "TuneResult",
    "interquartile_mean",
    "load_search_space",
    "prepare_study",
    "shipped_spaces",
    "tune",
]
