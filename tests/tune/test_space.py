"""Search spaces: the shipped defaults, user overrides, sampling, and refusals of bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from rlfleet.algos.registry import get_algorithm, list_algorithms
from rlfleet.errors import ConfigError
from rlfleet.runs.config import RunConfig, default_run_config
from rlfleet.tune import TuneConfig, tune
from rlfleet.tune import space as space_module
from rlfleet.tune.objective import aggregate, interquartile_mean, seed_score
from rlfleet.tune.space import (
    Choice,
    Fixed,
    FloatRange,
    IntRange,
    apply_overrides,
    load_search_space,
    shipped_spaces,
)
from tests.offline.helpers import save_random_dataset


@pytest.fixture
def base() -> RunConfig:
    return default_run_config("ppo", "CartPole-v1")


def _write(tmp_path: Path, data: Any) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _dims(space: space_module.SearchSpace) -> dict[str, Any]:
    return {p.name: p.dimension for p in space.params}


def test_default_ppo_space_is_shipped_and_valid(base: RunConfig) -> None:
    assert "ppo" in shipped_spaces()
    dims = _dims(load_search_space(base))
    assert dims["learning_rate"] == FloatRange(1e-5, 3e-3, log=True)
    assert isinstance(dims["batch_size"], Choice)
    assert isinstance(dims["hidden_sizes"], Choice)
    assert {"gamma", "gae_lambda", "ent_coef", "hidden_sizes"} <= set(dims)


def test_user_file_overrides_entries_and_adds_new_ones(base: RunConfig, tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {
            "hyperparameters": {
                "learning_rate": {"low": 1e-4, "high": 1e-3},
                "num_epochs": {"low": 2, "high": 8, "step": 2},
                "ent_coef": 0.0,
            },
            "env": {
                "num_envs": {"choices": [4, 8]},
                "kwargs": {"value": {"sutton_barto_reward": True}},
            },
        },
    )
    space = load_search_space(base, path)
    dims = _dims(space)
    assert dims["learning_rate"] == FloatRange(1e-4, 1e-3)  # replaced whole: no log inherited
    assert dims["num_epochs"] == IntRange(2, 8, step=2)  # an int field samples ints
    assert dims["ent_coef"] == Fixed(0.0)
    assert dims["env.num_envs"] == Choice((4, 8))
    assert dims["env.kwargs"] == Fixed({"sutton_barto_reward": True})
    assert "gamma" in dims  # kept from the default
    assert "ent_coef" not in [p.name for p in space.searched]


def test_extend_default_false_starts_empty(base: RunConfig, tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {"extend_default": False, "hyperparameters": {"gamma": {"choices": [0.9, 0.99]}}},
    )
    assert list(_dims(load_search_space(base, path))) == ["gamma"]


def test_suggest_samples_every_kind_into_a_valid_run_config(
    base: RunConfig, tmp_path: Path
) -> None:
    path = _write(
        tmp_path,
        {
            "extend_default": False,
            "hyperparameters": {
                "learning_rate": {"low": 1e-4, "high": 1e-2, "log": True},
                "num_epochs": {"low": 1, "high": 3},
                "hidden_sizes": {"choices": [[8], [16, 16]]},
                "ent_coef": 0.01,
            },
            "trainer": {"plateau_reduce_patience": {"choices": [None, 3]}},
        },
    )
    space = load_search_space(base, path)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(5):
        trial = study.ask()
        cfg = apply_overrides(base, space.suggest(trial), "test")
        study.tell(trial, 0.0)
        hp = cfg.hyperparameters
        assert 1e-4 <= hp.learning_rate <= 1e-2
        assert hp.num_epochs in (1, 2, 3)
        assert hp.hidden_sizes in ((8,), (16, 16))
        assert hp.ent_coef == 0.01
        assert cfg.trainer.plateau_reduce_patience in (None, 3)
        # list choices reach Optuna as labels, which it can store
        assert trial.params["hidden_sizes"] in ("[8]", "[16, 16]")
    assert space.to_dict()["hyperparameters"]["hidden_sizes"] == {"choices": [[8], [16, 16]]}


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            {"hyperparameters": {"learning_rat": {"low": 1, "high": 2}}},
            "did you mean 'learning_rate'",
        ),
        ({"hyperparams": {}}, "did you mean 'hyperparameters'"),
        ({"hyperparameters": {"learning_rate": {"low": 0.1, "high": 0.01}}}, "empty range"),
        ({"hyperparameters": {"batch_size": {"choices": []}}}, "non-empty list"),
        ({"hyperparameters": {"batch_size": {"choices": [64, 64]}}}, "repeat 64"),
        ({"hyperparameters": {"gamma": {"low": 0.9, "high": 1.5}}}, "gamma"),
        ({"hyperparameters": {"batch_size": {"low": 32, "high": 64.5}}}, "must be an integer"),
        ({"hyperparameters": {"activation": {"low": 1, "high": 2}}}, "needs an int or float"),
        ({"hyperparameters": {"ent_coef": {"low": 0.0, "high": 0.1, "log": True}}}, "low > 0"),
        ({"hyperparameters": {"gamma": {"min": 0.9}}}, "got keys ['min']"),
        ({"hyperparameters": {"activation": {"choices": ["tanh", "sigmoid"]}}}, "activation"),
        ({"env": {"id": {"choices": ["CartPole-v1"]}}}, "cannot be searched"),
        ({"env": {"num_env": 4}}, "did you mean 'num_envs'"),
        ({"extend_default": "yes"}, "true or false"),
    ],
)
def test_bad_spaces_are_refused_naming_the_entry(
    base: RunConfig, tmp_path: Path, space: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=None) as info:
        load_search_space(base, _write(tmp_path, space))
    assert message in str(info.value)
    assert str(tmp_path / "space.yaml") in str(info.value)


def test_algorithm_without_a_shipped_space_needs_a_file(
    base: RunConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(space_module, "SPACES", tmp_path / "no-spaces")
    (tmp_path / "no-spaces").mkdir()
    with pytest.raises(ConfigError, match=r"no default search space for 'ppo'.*search_space=FILE"):
        load_search_space(base)
    path = _write(tmp_path, {"hyperparameters": {"gamma": {"choices": [0.9, 0.99]}}})
    assert list(_dims(load_search_space(base, path))) == ["gamma"]


def test_interquartile_mean_weighs_the_middle_half() -> None:
    assert interquartile_mean([5.0]) == 5.0
    assert interquartile_mean([1.0, 3.0]) == 2.0
    assert interquartile_mean([4.0, 1.0, 3.0, 2.0]) == 2.5  # the usual 25% trimmed mean
    # three seeds: the median weighs 2/3, so one lucky seed cannot carry the trial
    assert interquartile_mean([0.0, 0.0, 120.0]) == pytest.approx(20.0)
    assert aggregate([0.0, 0.0, 120.0], "mean") == 40.0
    assert aggregate([0.0, 0.0, 120.0], "iqm") == pytest.approx(20.0)


def test_seed_score_kinds() -> None:
    scores = [1.0, 5.0, 3.0]
    assert seed_score(scores, "last") == 3.0
    assert seed_score(scores, "best") == 5.0
    assert seed_score(scores, "mean") == 3.0


TUNED_ON = {
    "a2c": "CartPole-v1", "acer": "CartPole-v1", "appo": "CartPole-v1", "bc": "CartPole-v1",
    "cql": "CartPole-v1", "ddpg": "Pendulum-v1", "dqn": "CartPole-v1",
    "impala": "CartPole-v1", "iql": "Pendulum-v1", "ppo": "CartPole-v1", "sac": "Pendulum-v1",
    "td3": "Pendulum-v1", "td3_bc": "Pendulum-v1", "trpo": "CartPole-v1",
}  # fmt: skip
"""The env each shipped space is tried on."""


def test_every_registered_algorithm_has_a_shipped_space() -> None:
    assert set(shipped_spaces()) == set(list_algorithms()) == set(TUNED_ON)


@pytest.mark.parametrize("algo", sorted(TUNED_ON))
def test_a_tiny_study_completes_on_each_shipped_space(
    algo: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env_id = TUNED_ON[algo]
    if get_algorithm(algo).kind == "distributed":
        # Trials run in this process: they share the module's Ray cluster, as a study's
        # trials share a cluster that is already running.
        request.getfixturevalue("ray_cluster")
    base = None
    if get_algorithm(algo).kind == "offline":
        # An offline study's trials learn from the dataset its base run config names.
        dataset = save_random_dataset(env_id, tmp_path / "dataset", num_steps=500)
        base = tmp_path / "base.yaml"
        config = {"algo": algo, "env": {"id": env_id}, "dataset": str(dataset)}
        base.write_text(yaml.safe_dump(config))
    config = TuneConfig(
        trials=2, seeds=1, max_steps=256, epoch_num_steps=128, test_episodes=1, num_envs=2,
        sampler="random", pruner="none", study_dir=tmp_path / "study", verbose=False,
        config=base,
    )  # fmt: skip
    result = tune(algo, env_id, config)
    assert (result.complete, result.failed) == (2, 0)
    assert result.best_config is not None
    assert result.best_config.is_file()
