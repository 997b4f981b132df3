"""Reward signals with off-policy algorithms: relabelled minibatches, metrics, SAC end to end.

- The unit tests drive :class:`SignalReplay` over a hand-filled buffer.
- SAC rewarded by GAIL alone (no env reward) trains its discriminator and logs its reward;
  ``bench/gail_pendulum.py`` measures how soon SAC learns Pendulum from it, over seeds.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from gymnasium import spaces

from rlfleet.data.replay import ReplayBuffer
from rlfleet.errors import ConfigError
from rlfleet.rewards import (
    CuriositySettings,
    ExtrinsicSettings,
    GAILSettings,
    RewardSignals,
    RewardSignalsSettings,
    RNDSettings,
    Transitions,
    record_demonstrations,
    save_demonstrations,
)
from rlfleet.rewards.replay import SignalReplay
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from tests.offline.helpers import pendulum_swing_up

OBS = spaces.Box(-100, 100, (3,), np.float32)
ACT = spaces.Discrete(2)
ENVS = 2
QUIET = {"show_progress": False, "verbose": False}


def _preprocess(obs: Any) -> torch.Tensor:
    return torch.as_tensor(obs, dtype=torch.float32)


def _fill(buffer: ReplayBuffer, first: int, last: int, *, end_at: int | None = None) -> None:
    """Rows ``first..last-1``: observation = the row number, reward 1; env 0's episode
    terminates at ``end_at`` (the next row is its reset step)."""
    for t in range(first, last):
        terminated = np.array([t == end_at, False])
        valid = np.array([end_at is None or t != end_at + 1, True])
        buffer.add(
            np.full((ENVS, 3), float(t), np.float32),
            np.array([t % 2, (t + 1) % 2]),
            np.ones(ENVS, np.float32),
            terminated,
            np.zeros(ENVS, bool),
            valid,
        )


def _signals(**settings: Any) -> RewardSignals:
    return RewardSignals(RewardSignalsSettings(**settings), OBS, ACT, num_envs=ENVS)


def test_minibatches_carry_the_combined_rewards_and_the_buffer_keeps_the_env_rewards() -> None:
    buffer = ReplayBuffer(64, OBS, ACT, ENVS)
    _fill(buffer, 0, 20)
    signals = _signals(extrinsic=ExtrinsicSettings(strength=2.0), rnd=RNDSettings(strength=0.5))
    before = copy.deepcopy(signals.signals[1])
    replay = SignalReplay(buffer, signals, _preprocess)

    batch = replay.sample(16, gamma=0.9)
    sampled = Transitions(
        batch.obs, batch.actions, batch.next_obs, torch.ones(16), torch.ones(16)
    )  # fmt: skip
    expected = 2.0 * 1.0 + 0.5 * before.rewards(sampled)
    assert torch.allclose(batch.rewards, expected)
    assert np.all(buffer.rewards[:20] == 1.0)
    # The signal learned from the minibatch it rewarded.
    assert not torch.allclose(before.rewards(sampled), signals.signals[1].rewards(sampled))
    metrics = replay.take_update_metrics()
    assert metrics["loss/rnd"] > 0
    assert replay.take_update_metrics() == {}


def test_new_transitions_are_scored_once_with_intrinsic_returns() -> None:
    buffer = ReplayBuffer(40, OBS, ACT, ENVS)  # 20 rows: the second fill wraps around
    signals = _signals(extrinsic=ExtrinsicSettings(), rnd=RNDSettings(strength=0.1))
    replay = SignalReplay(buffer, signals, _preprocess)
    scored: list[float] = []
    rewards = signals.signals[1].rewards

    def record(batch: Transitions) -> torch.Tensor:
        scored.extend(batch.obs[batch.weights > 0, 0].tolist())
        return rewards(batch)

    signals.signals[1].rewards = record  # type: ignore[method-assign]
    _fill(buffer, 0, 3)
    assert replay.observe_collection() == {}  # rows before the first call are not scored
    _fill(buffer, 3, 12, end_at=6)
    metrics = replay.observe_collection()
    _fill(buffer, 12, 30)
    replay.observe_collection()
    # Rows 2..28, once each, for both envs except env 0's reset step (row 7); row 29 waits
    # for its next observation.
    expected = sorted([float(t) for t in range(2, 29)] * 2)
    expected.remove(7.0)
    assert sorted(scored) == expected
    assert metrics["train/intrinsic_rnd_reward"] > 0
    assert "train/intrinsic_rnd_return" in metrics  # env 0's episode ended at row 6


def test_n_step_returns_are_refused_with_reward_signals() -> None:
    cfg = default_run_config(
        "dqn", "CartPole-v1", {"trainer": QUIET, "hyperparameters": {"n_step": 3}}
    )
    cfg = replace(
        cfg, reward_signals=RewardSignalsSettings(extrinsic=ExtrinsicSettings(), rnd=RNDSettings())
    )
    with pytest.raises(ConfigError, match="need n_step = 1, got n_step = 3"):
        make_trainer(cfg, None)


def test_sac_with_curiosity_logs_and_resumes(tmp_path: Path) -> None:
    signals = RewardSignalsSettings(
        extrinsic=ExtrinsicSettings(), curiosity=CuriositySettings(strength=0.1)
    )
    overrides = {
        "seed": 1,
        "trainer": {**QUIET, "max_steps": 600, "epoch_num_steps": 300},
        "hyperparameters": {"learning_starts": 200, "batch_size": 32},
    }
    cfg = replace(default_run_config("sac", "Pendulum-v1", overrides), reward_signals=signals)
    make_trainer(cfg, tmp_path / "run").run()
    history = pq.read_table(tmp_path / "run" / "history.parquet").to_pydict()
    assert all(v > 0 for v in history["train/intrinsic_curiosity_reward"] if v is not None)
    assert [v for v in history["loss/curiosity_forward"] if v is not None]

    longer = replace(cfg, trainer=replace(cfg.trainer, max_steps=900))
    resumed = make_trainer(longer, tmp_path / "run", resume=True)
    saved = resumed.reward_signals
    assert saved is not None
    forward = saved.signals[1].modules()["forward"]
    fresh = RewardSignals(signals, OBS, spaces.Box(-2, 2, (1,), np.float32), 1, seed=1)
    assert not torch.equal(
        next(forward.parameters()), next(fresh.signals[1].modules()["forward"].parameters())
    )
    assert resumed.run().env_steps == 900


def test_sac_with_gail_alone_trains_its_discriminator_and_logs_its_reward(tmp_path: Path) -> None:
    """SAC rewarded by GAIL alone (no env reward): its discriminator learns to tell the
    demonstrations from the agent's transitions and its reward reaches the history. Whether
    SAC then learns Pendulum from it is ``bench/gail_pendulum.py``'s, over 5 seeds."""
    demos, returns = record_demonstrations(gym.make("Pendulum-v1"), pendulum_swing_up, 2)
    assert np.mean(returns) > -250  # a random policy scores about -1200
    save_demonstrations(tmp_path / "pendulum-demos.npz", demos)
    gail = GAILSettings(demo_path=str(tmp_path / "pendulum-demos.npz"), gamma=0.98)
    overrides = {
        "seed": 0,
        "hyperparameters": {"learning_starts": 200},
        "trainer": {**QUIET, "max_steps": 600, "epoch_num_steps": 300},
    }
    cfg = replace(
        default_run_config("sac", "Pendulum-v1", overrides),
        # No extrinsic signal: the env's reward is never seen.
        reward_signals=RewardSignalsSettings(gail=gail),
    )
    make_trainer(cfg, tmp_path / "run").run()
    history = pq.read_table(tmp_path / "run" / "history.parquet").to_pydict()
    expert = [v for v in history["train/gail_expert_estimate"] if v is not None]
    agent = [v for v in history["train/gail_policy_estimate"] if v is not None]
    assert expert[-1] > agent[-1] + 0.2, (expert, agent)
    assert [v for v in history["train/intrinsic_gail_reward"] if v is not None]


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_training_returns_are_the_envs_own_with_an_intrinsic_signal_on(
    algo: str, tmp_path: Path
) -> None:
    # CartPole pays 1 per step: an env return equals its episode's length, and a return
    # with RND's reward (every step's > 0) in it would not.
    signals = RewardSignalsSettings(extrinsic=ExtrinsicSettings(), rnd=RNDSettings(strength=1.0))
    overrides: dict[str, Any] = {
        "trainer": {**QUIET, "max_steps": 1024, "epoch_num_steps": 512},
        "env": {"num_envs": 2, "num_test_envs": 2},
    }
    overrides["hyperparameters"] = (
        {"n_step": 1, "learning_starts": 256} if algo == "dqn" else {"batch_size": 64}
    )
    cfg = replace(default_run_config(algo, "CartPole-v1", overrides), reward_signals=signals)
    make_trainer(cfg, tmp_path / "run").run()
    history = pq.read_table(tmp_path / "run" / "history.parquet").to_pydict()
    assert [v for v in history["train/intrinsic_rnd_reward"] if v is not None]
    episodes = [
        (ret, length)
        for ret, length in zip(history["episode/return"], history["episode/length"], strict=True)
        if ret is not None
    ]
    assert len(episodes) > 10
    assert all(ret == length for ret, length in episodes)
    means = [v for v in history["train/return_mean"] if v is not None]
    assert means
    assert max(means) <= max(length for _, length in episodes)
