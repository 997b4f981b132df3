"""The Python front door: ``PPO(env_id, **hyperparameters).learn(steps)`` and ``load``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlfleet
from rlfleet.algos import PPO, PPOConfig, get_algorithm
from rlfleet.config.loader import preset
from rlfleet.errors import CheckpointError, ConfigError
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer

QUIET_STEPS = 512


def _observations() -> np.ndarray:
    env = gym.make("CartPole-v1")
    try:
        return np.stack([env.reset(seed=i)[0] for i in range(8)])
    finally:
        env.close()


def test_the_env_form_starts_from_the_preset_with_keywords_on_top() -> None:
    algo = PPO("CartPole-v1", learning_rate=1e-3, seed=2)
    shipped = preset("ppo", "CartPole-v1")["hyperparameters"]
    assert algo.config.num_steps == shipped["num_steps"]
    assert algo.config.learning_rate == 1e-3
    assert algo.seed == 2
    assert algo.env_target is not None
    assert algo.env_target.env_id == "CartPole-v1"


def test_an_env_no_preset_names_gets_adapted_defaults_and_keywords_win() -> None:
    algo = PPO("tests.envs.test_probe:PenaltyEnv", normalize_obs=False)
    assert algo.config.normalize_obs is False
    assert algo.config.normalize_reward is True


def test_learn_trains_in_memory_and_returns_self(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    algo = PPO("CartPole-v1")
    before = algo.parameters_vector().clone()
    assert algo.learn(QUIET_STEPS) is algo
    assert algo.learn_result is not None
    assert algo.learn_result.env_steps >= QUIET_STEPS
    assert algo.learn_result.run_dir is None
    assert not torch.equal(algo.parameters_vector(), before)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("name", "env_id", "steps"),
    [
        ("ppo", "CartPole-v1", QUIET_STEPS),
        ("a2c", "CartPole-v1", QUIET_STEPS),
        # Past learning_starts (1,000 in both presets), so that updates have run.
        ("dqn", "CartPole-v1", 1536),
        ("sac", "Pendulum-v1", 1100),
    ],
)
def test_learn_uses_the_same_run_config_as_the_cli(name: str, env_id: str, steps: int) -> None:
    """Same seed, same preset: learn() and a run built by default_run_config agree bitwise
    (on-policy and off-policy)."""
    algo = get_algorithm(name)(env_id, seed=1).learn(steps)
    assert algo.gradient_steps > 0
    cfg = default_run_config(name, env_id, {"seed": 1, "trainer": {"max_steps": steps}})
    trainer = make_trainer(cfg, None)
    try:
        trainer.run()
    finally:
        trainer.close()
    assert torch.equal(algo.parameters_vector(), trainer.algorithm.parameters_vector())


def test_learn_into_a_run_directory_that_load_reads(tmp_path: Path) -> None:
    algo = PPO(gym.make("CartPole-v1")).learn(QUIET_STEPS, run_dir=tmp_path / "run")
    assert algo.learn_result is not None
    assert algo.learn_result.run_dir == tmp_path / "run"
    assert (tmp_path / "run" / "config.yaml").is_file()
    loaded = rlfleet.load(tmp_path / "run", which="latest")
    obs = _observations()
    np.testing.assert_array_equal(loaded.predict(obs), algo.predict(obs))
    assert loaded.env_target == algo.env_target


def test_learn_into_a_run_directory_holds_its_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/reliability.md: ``Algorithm.learn(run_dir=...)`` holds the run directory's lock
    while it trains (a second writer is refused), and releases it when done."""
    import json

    from rlfleet.cli.main import main
    from rlfleet.runs.run_dir import LOCK_FILE
    from rlfleet.train.trainer import OnPolicyTrainer

    run_dir = tmp_path / "run"
    holders: list[int] = []
    refused: list[int] = []
    step = OnPolicyTrainer._training_step

    def checking_step(self: OnPolicyTrainer) -> Any:
        holders.append(json.loads((run_dir / LOCK_FILE).read_text())["pid"])
        if not refused:  # a second writer, in this process but on its own file handle
            refused.append(main(["train", "ppo", "--resume", str(run_dir)]))
        return step(self)

    monkeypatch.setattr(OnPolicyTrainer, "_training_step", checking_step)
    PPO(gym.make("CartPole-v1")).learn(QUIET_STEPS, run_dir=run_dir)
    assert holders
    assert set(holders) == {os.getpid()}
    assert refused == [2]
    assert f"run dir {run_dir} is in use by pid {os.getpid()}" in capsys.readouterr().err
    assert not (run_dir / LOCK_FILE).exists()


def test_a_loaded_checkpoint_can_learn_on(tmp_path: Path) -> None:
    algo = PPO("CartPole-v1")
    loaded = rlfleet.load(algo.save(tmp_path / "saved"))
    assert loaded.env_target == algo.env_target
    loaded.learn(QUIET_STEPS)
    assert loaded.learn_result is not None


def test_unknown_hyperparameter_names_close_matches() -> None:
    with pytest.raises(ConfigError, match=r"'learning_rat'; did you mean 'learning_rate'"):
        PPO("CartPole-v1", learning_rat=1e-3)


def test_bad_hyperparameter_value_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"hyperparameters\.batch_size.*got -4"):
        PPO("CartPole-v1", batch_size=-4)


def test_keywords_need_an_env_and_learn_needs_one_too() -> None:
    env = gym.make("CartPole-v1")
    with pytest.raises(ConfigError, match="go with an env"):
        PPO(env.observation_space, env.action_space, learning_rate=1e-3)
    algo = PPO(env.observation_space, env.action_space, PPOConfig())
    with pytest.raises(ConfigError, match=r"PPO\.learn needs the env"):
        algo.learn(100)
    with pytest.raises(ConfigError, match="total_steps must be an int >= 1"):
        PPO("CartPole-v1").learn(0)


def test_an_env_without_spec_is_refused() -> None:
    env = gym.make("CartPole-v1").unwrapped
    env.spec = None
    with pytest.raises(ConfigError, match="it has no spec"):
        PPO(env)


def test_load_refuses_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such directory"):
        rlfleet.load(tmp_path / "missing")
    with pytest.raises(CheckpointError):
        rlfleet.load(tmp_path)
