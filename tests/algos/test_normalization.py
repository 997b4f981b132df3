"""Observation and reward normalisation: learned in training, saved in checkpoints, frozen in
evaluation and play; off-policy algorithms normalise replay samples with the current
statistics."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlfleet
from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.collect.evaluator import Evaluator
from rlfleet.errors import ConfigError
from rlfleet.nn.normalize import RewardScaler
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import load_algorithm, make_trainer, train

# Every on-policy algorithm has both switches (docs/spaces.md, "Normalisation").
ALGOS = [name for name in list_algorithms() if get_algorithm(name).kind == "on_policy"]


def _cfg(name: str) -> object:
    short = {
        "ppo": {"num_steps": 16, "batch_size": 64, "num_epochs": 1},
        "a2c": {"num_steps": 8},
        "trpo": {"num_steps": 32, "batch_size": 64, "num_epochs": 1},
        "acer": {"num_steps": 16, "replay_start": 1},
    }[name]
    return default_run_config(
        name,
        "CartPole-v1",
        {
            "env": {"num_envs": 4, "num_test_envs": 2},
            "hyperparameters": {**short, "normalize_obs": True, "normalize_reward": True},
            "trainer": {
                "max_steps": 512,
                "epoch_num_steps": 512,
                "test_step_num_episodes": 2,
                "target_reward": None,
                "show_progress": False,
                "verbose": False,
            },
        },
    )


@pytest.mark.parametrize("name", ALGOS)
def test_statistics_learn_in_training_are_frozen_in_evaluation_and_saved(
    name: str, tmp_path: Path
) -> None:
    cfg = _cfg(name)
    train(cfg, tmp_path / "run")  # type: ignore[arg-type]
    algo, _ = load_algorithm(tmp_path / "run", which="latest")
    obs_stats, reward_stats = algo.obs_normalizer, algo.reward_scaler  # type: ignore[attr-defined]
    # The checkpoint holds the statistics of the whole run.
    assert float(obs_stats.count) >= 512
    assert float(reward_stats.return_stats.count) > 100
    assert float(reward_stats.return_stats.var) != 1.0
    before = (
        obs_stats.mean.clone(),
        obs_stats.count.clone(),
        reward_stats.return_stats.var.clone(),
    )
    trainer = make_trainer(cfg, None)  # type: ignore[arg-type]
    Evaluator(trainer.test_envs, algo, seed=0).run(3)
    after = (obs_stats.mean, obs_stats.count, reward_stats.return_stats.var)
    for old, new in zip(before, after, strict=True):
        assert torch.equal(old, new)


OFF_POLICY = [name for name in list_algorithms() if get_algorithm(name).kind == "off_policy"]


@pytest.mark.parametrize("name", OFF_POLICY)
def test_off_policy_statistics_are_saved_in_checkpoints_and_best_resumed_and_frozen(
    name: str, tmp_path: Path
) -> None:
    env = "CartPole-v1" if name == "dqn" else "Pendulum-v1"
    run = tmp_path / "run"

    def cfg(max_steps: int) -> Any:
        return default_run_config(
            name, env,
            {
                "env": {"num_envs": 2, "num_test_envs": 2},
                "hyperparameters": {"normalize_obs": True, "learning_starts": 64,
                                    "batch_size": 32},
                "trainer": {"max_steps": max_steps, "epoch_num_steps": 128,
                            "test_step_num_episodes": 1, "target_reward": None,
                            "show_progress": False, "verbose": False},
            },
        )  # fmt: skip

    train(cfg(256), run)
    for which in ("latest", "best"):
        algo, _ = load_algorithm(run, which=which)
        assert algo.obs_normalizer is not None
        assert float(algo.obs_normalizer.count) >= 128, which  # a test step's, at the least
    latest, _ = load_algorithm(run, which="latest")
    stats = latest.obs_normalizer
    assert stats is not None
    assert float(stats.count) >= 256
    mean, count = stats.mean.clone(), stats.count.clone()
    Evaluator(make_trainer(cfg(256), None).test_envs, latest, seed=0).run(2)
    assert torch.equal(stats.mean, mean)
    assert torch.equal(stats.count, count)
    resumed = make_trainer(cfg(384), run, resume=True)
    resumed_stats = resumed.algorithm.obs_normalizer
    assert resumed_stats is not None
    assert torch.equal(resumed_stats.count, count)  # the resume starts from the saved ones
    resumed.run()
    assert float(resumed_stats.count) >= float(count) + 128


def test_reward_scaler_divides_by_the_std_of_discounted_returns() -> None:
    scaler = RewardScaler(gamma=0.5)
    rewards = torch.tensor([[1.0], [1.0], [1.0], [1.0]])
    done = torch.tensor([[0.0], [1.0], [0.0], [0.0]])
    valid = torch.tensor([[1.0], [1.0], [0.0], [1.0]])
    scaled = scaler(rewards, done, valid, update=True)
    # Returns 1, 1.5 | 1 (reset step, no sample), 1.5: samples 1, 1.5, 1.5.
    samples = torch.tensor([1.0, 1.5, 1.5], dtype=torch.float64)
    stats = scaler.return_stats
    expected_var = (samples.var(unbiased=False) * 3 + 1e-4 * samples.mean().pow(2)) / (3 + 1e-4)
    torch.testing.assert_close(stats.var, expected_var, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(scaled, rewards / torch.sqrt(stats.var.float() + 1e-8))
    frozen = scaler(rewards, done, valid, update=False)
    torch.testing.assert_close(frozen, scaled)


def test_reward_scaler_saves_its_running_returns() -> None:
    """A scaler loaded from a state dict scales the next rollout as the saved one does: the
    per-env discounted returns of episodes in progress are part of its state."""
    generator = torch.Generator().manual_seed(0)
    rollouts = [
        (torch.randn(5, 3, generator=generator), (torch.rand(5, 3, generator=generator) < 0.2))
        for _ in range(2)
    ]
    valid = torch.ones(5, 3)
    straight = RewardScaler(gamma=0.9)
    straight(rollouts[0][0], rollouts[0][1].float(), valid, update=True)
    loaded = RewardScaler(gamma=0.9)
    loaded.load_state_dict(straight.state_dict())
    assert loaded.running_return.shape == (3,)
    rewards, done = rollouts[1]
    expected = straight(rewards, done.float(), valid, update=True)
    assert torch.equal(loaded(rewards, done.float(), valid, update=True), expected)
    assert torch.equal(loaded.state_dict()["running_return"], straight.running_return)


def test_reward_scaler_loads_a_state_without_running_returns() -> None:
    """A state saved before the running returns were loads; its returns start at zero."""
    saved = RewardScaler(gamma=0.9)
    saved(torch.ones(4, 2), torch.zeros(4, 2), torch.ones(4, 2), update=True)
    state = {k: v for k, v in saved.state_dict().items() if k != "running_return"}
    loaded = RewardScaler(gamma=0.9)
    loaded.load_state_dict(state)
    assert loaded.running_return.numel() == 0
    assert torch.equal(loaded.return_stats.var, saved.return_stats.var)
    loaded(torch.ones(1, 2), torch.zeros(1, 2), torch.ones(1, 2), update=True)
    assert torch.equal(loaded.running_return, torch.ones(2, dtype=torch.float64))


def test_observation_normalisation_of_images_is_refused() -> None:
    from gymnasium import spaces

    from rlfleet.algos import PPO, PPOConfig

    image = spaces.Box(0, 255, (36, 36, 3), np.uint8)
    with pytest.raises(ConfigError, match="normalize_obs"):
        PPO(image, spaces.Discrete(2), PPOConfig(normalize_obs=True))


# ------------------------------------------------------------- off-policy algorithms
SCALE = 1000.0
"""Observations of the scaled envs are the original ones times this."""
OFF_POLICY = {"sac": "ScaledPendulum-v0", "td3": "ScaledPendulum-v0", "ddpg": "ScaledPendulum-v0"}
OFF_POLICY["dqn"] = "ScaledCartPole-v0"


def _scaled(env_id: str) -> gym.Env[Any, Any]:
    env = gym.make(env_id)
    box = env.observation_space
    assert isinstance(box, gym.spaces.Box)
    space = gym.spaces.Box(box.low * SCALE, box.high * SCALE, box.shape, np.float32)
    return gym.wrappers.TransformObservation(
        env, lambda obs: (obs * SCALE).astype(np.float32), space
    )


for _id, _source in (("ScaledPendulum-v0", "Pendulum-v1"), ("ScaledCartPole-v0", "CartPole-v1")):
    if _id not in gym.registry:
        gym.register(_id, entry_point=partial(_scaled, _source), max_episode_steps=200)


def _off_policy_cfg(name: str, normalize: bool, threaded: bool = False) -> Any:
    return default_run_config(
        name,
        OFF_POLICY[name],
        {
            "seed": 0,
            "env": {"num_envs": 2, "num_test_envs": 1},
            "hyperparameters": {
                "learning_starts": 100,
                "batch_size": 32,
                "buffer_size": 2000,
                "hidden_sizes": [32],
                "normalize_obs": normalize,
            },
            "trainer": {
                "max_steps": 400,
                "epoch_num_steps": 400,
                "test_step_num_episodes": 1,
                "target_reward": None,
                "show_progress": False,
                "verbose": False,
                "threaded": threaded,
            },
        },
    )


@pytest.mark.parametrize("threaded", [False, True], ids=["", "threaded"])
@pytest.mark.parametrize("name", sorted(OFF_POLICY))
def test_off_policy_statistics_cover_every_collected_observation_and_are_saved(
    name: str, threaded: bool, tmp_path: Path
) -> None:
    trainer = make_trainer(_off_policy_cfg(name, True, threaded), None)
    try:
        trainer.run()
    finally:
        trainer.close()
    algo = trainer.algorithm
    stats = algo.obs_normalizer
    assert stats is not None
    # Every observation the collector saw, the random warm-up's included (collected on the
    # thread or not), and no other.
    assert float(stats.count) == pytest.approx(400, abs=1e-3)
    obs = np.stack([algo.observation_space.sample() for _ in range(64)]) / 10
    raw = torch.as_tensor(obs, dtype=torch.float32)
    # The statistics match the env's scale: normalised observations are O(1).
    assert float(stats.var.max()) > SCALE
    assert float(algo.preprocess(raw).abs().max()) <= 10.0
    loaded = rlfleet.load(algo.save(tmp_path / "saved"))
    assert "obs_normalizer" in loaded.modules()
    assert loaded.obs_normalizer is not None
    assert torch.equal(loaded.obs_normalizer.mean, stats.mean)
    assert torch.equal(loaded.obs_normalizer.var, stats.var)
    np.testing.assert_array_equal(loaded.predict(obs), algo.predict(obs))


def test_sac_updates_on_replay_observations_normalised_with_current_statistics() -> None:
    seen: list[float] = []
    cfg = _off_policy_cfg("sac", True)
    trainer = make_trainer(cfg, None)
    algo = trainer.algorithm
    first = algo.actor[0]  # type: ignore[attr-defined,index]
    hook = first.register_forward_pre_hook(lambda _, args: seen.append(float(args[0].abs().max())))
    try:
        trainer.run()
    finally:
        hook.remove()
        trainer.close()
    assert algo.gradient_steps > 0
    # Raw observations reach 8 * SCALE; everything the actor saw, in act and in the update,
    # was normalised (and clipped to 10).
    assert seen
    assert max(seen) <= 10.0


def test_off_policy_normalisation_is_off_by_default() -> None:
    for name in OFF_POLICY:
        algo = make_trainer(_off_policy_cfg(name, False), None).algorithm
        assert algo.obs_normalizer is None
        assert "obs_normalizer" not in algo.modules()
