"""``bench/compare.py``'s identical setting: rlfleet's side runs the comparison's
hyperparameters and the algorithm's own defaults, never the env's shipped preset."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from rlfleet.algos.registry import get_algorithm
from rlfleet.config.loader import preset, to_dict
from rlfleet.runs.config import default_run_config


@pytest.mark.parametrize("name", ["ppo_cartpole", "dqn_cartpole", "sac_pendulum"])
def test_identical_runs_take_no_hyperparameter_from_the_envs_preset(
    bench_module: Callable[[str], ModuleType], name: str
) -> None:
    compare = bench_module("compare")
    spec = bench_module(name).SPEC
    given = spec.rlfleet_hyperparameters
    hyperparameters = compare.identical_hyperparameters(spec.algo, given)
    cfg = default_run_config(spec.algo, spec.env_id, {"hyperparameters": hyperparameters})
    expected = get_algorithm(spec.algo).config_class(**given)
    assert to_dict(cfg.hyperparameters) == to_dict(expected)


def test_a_preset_value_the_comparison_leaves_out_is_the_default(
    bench_module: Callable[[str], ModuleType],
) -> None:
    # DQN's CartPole preset takes 3-step returns; RL-Zoo's set, and SB3, take 1-step ones.
    assert preset("dqn", "CartPole-v1")["hyperparameters"]["n_step"] == 3
    spec = bench_module("dqn_cartpole").SPEC
    assert "n_step" not in spec.rlfleet_hyperparameters
    hyperparameters = bench_module("compare").identical_hyperparameters("dqn", {})
    cfg = default_run_config("dqn", "CartPole-v1", {"hyperparameters": hyperparameters})
    assert cfg.hyperparameters.n_step == 1
