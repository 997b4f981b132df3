"""Atari preprocessing: rlfleet's own wrappers on a scripted fake game, the whole stack on
Breakout against stored observations, ale-py's native vector env, and a short PPO run on Pong."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.envs.atari import (
    AtariConfig,
    EpisodicLife,
    FireAtLifeStart,
    FireReset,
    make_atari_env,
)
from rlfleet.errors import ConfigError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "atari-breakout.json"


class _FakeALE:
    def __init__(self) -> None:
        self.life_count = 3

    def lives(self) -> int:
        return self.life_count


class FakeGame(gym.Env[np.ndarray, int]):
    """Frames filled with the frame counter; a life lost every ``life_every`` frames; game
    over with the last life; reward = frame counter - 2."""

    observation_space = spaces.Box(0, 255, (210, 160), np.uint8)
    action_space = spaces.Discrete(4)

    def __init__(self, life_every: int = 1000) -> None:
        self.ale = _FakeALE()
        self.life_every = life_every
        self.frame = 0
        self.resets = 0
        self.actions: list[int] = []

    def get_action_meanings(self) -> list[str]:
        return ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.frame = 0
        self.resets += 1
        self.ale.life_count = 3
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.frame += 1
        self.actions.append(int(action))
        if self.frame % self.life_every == 0:
            self.ale.life_count -= 1
        return self._obs(), float(self.frame - 2), self.ale.life_count == 0, False, {}

    def _obs(self) -> np.ndarray:
        return np.full((210, 160), self.frame % 256, np.uint8)


def episode_ends(env: gym.Env[np.ndarray, int], steps: int, action: int) -> list[int]:
    """Reset ``env`` with seed 0, then step it ``steps`` times with ``action``, resetting
    after each end; returns the step numbers (from 1) that ended an episode."""
    env.reset(seed=0)
    ends = []
    for step in range(1, steps + 1):
        _, _, terminated, _, _ = env.step(action)
        if terminated:
            ends.append(step)
            env.reset()
    return ends


def test_episodic_life_ends_episodes_per_life_and_resets_only_at_game_over() -> None:
    game = FakeGame(life_every=3)
    ends = episode_ends(EpisodicLife(game), 5, action=0)
    # Lives are lost at frames 3 and 6; the reset after the first loss continues the game
    # with a no-op (frame 4), so the second loss comes 2 learner steps later.
    assert ends[:2] == [3, 5]
    assert game.resets == 1
    assert game.ale.life_count == 1


def test_fire_reset_presses_fire_then_action_2() -> None:
    game = FakeGame()
    FireReset(game).reset(seed=0)
    assert game.actions == [1, 2]


def test_fire_at_life_start_replaces_the_first_two_actions_of_each_life() -> None:
    game = FakeGame(life_every=4)
    env = FireAtLifeStart(game, fire=1)
    ends = episode_ends(env, 12, action=3)
    # Lives are lost at frames 4 and 8, and the game ends at frame 12.
    assert game.actions == [1, 1, 3, 3, 1, 1, 3, 3, 1, 1, 3, 3]
    assert ends == [12]
    env.step(3)
    assert game.actions[-1] == 1  # a new game starts with FIRE too


ale_py = pytest.importorskip("ale_py")


def _digest(obs: np.ndarray) -> str:
    return hashlib.sha256(obs.tobytes()).hexdigest()[:16]


@pytest.mark.parametrize("case", ["train", "evaluation"])
def test_breakout_observations_rewards_and_ends_match_the_stored_trace(case: str) -> None:
    """Every observation of 400 random steps, bitwise: no-op reset, frame skip and max-pool,
    lives, fire reset, resize, stack and clipping together, game overs included (the
    training case loses a life about every 22 steps and the game twice)."""
    expected = json.loads(FIXTURE.read_text())
    trace = expected["cases"][case]
    config = AtariConfig() if case == "train" else AtariConfig().for_evaluation()
    env = make_atari_env(gym.spec(expected["env_id"]), config)
    try:
        obs, _ = env.reset(seed=expected["seed"])
        assert obs.shape == (4, 84, 84)
        assert obs.dtype == np.uint8
        rng = np.random.default_rng(expected["seed"])
        observations, rewards, ends = [_digest(obs)], [], []
        for step in range(expected["steps"]):
            obs, reward, terminated, truncated, _ = env.step(int(rng.integers(4)))
            observations.append(_digest(obs))
            rewards.append(float(reward))
            if terminated or truncated:
                ends.append(step)
                obs, _ = env.reset()
                observations.append(_digest(obs))
    finally:
        env.close()
    assert ends == trace["ends"]
    assert rewards == trace["rewards"]
    assert observations == trace["observations"]


def test_native_and_wrapped_pong_give_the_same_spaces() -> None:
    from rlfleet.envs.make import make_env, make_vec_env

    native = make_vec_env("ALE/Pong-v5", 2, seed=0, mode="native")
    wrapped = make_vec_env("ALE/Pong-v5", 2, seed=0, mode="sync")
    single = make_env("ALE/Pong-v5")
    try:
        assert type(getattr(native, "env", native)).__name__ == "AtariVectorEnv"
        for space in (wrapped.single_observation_space, single.observation_space):
            assert space == native.single_observation_space
            assert space.shape == (4, 84, 84)
        assert wrapped.single_action_space == native.single_action_space
        obs, *_ = wrapped.step(np.zeros(2, dtype=np.int64))
        assert obs.dtype == np.uint8
    finally:
        native.close()
        wrapped.close()
        single.close()


@pytest.mark.parametrize("mode", ["native", "sync"])
def test_a_policy_that_never_fires_still_ends_whole_breakout_games(mode: str) -> None:
    """Training ends an episode at a lost life and fires on the reset, so a policy need not
    learn FIRE; a test env keeps the game whole and fires at the start of each life for it
    (without that, Breakout waits 27,000 steps for its frame limit). Two games per env: a
    vector env's automatic reset starts the second."""
    from rlfleet.envs.make import make_vec_env

    envs = make_vec_env(
        "ALE/Breakout-v5", 2, seed=0, mode=mode, atari=AtariConfig().for_evaluation()
    )
    try:
        games = np.zeros(2, dtype=np.int64)
        for _ in range(3000):
            _, _, terminated, truncated, _ = envs.step(np.zeros(2, dtype=np.int64))
            assert not truncated.any()
            games += terminated
            if (games >= 2).all():
                break
        assert (games >= 2).all(), f"games ended per env in 3,000 NOOP steps: {games}"
    finally:
        envs.close()


def test_atari_evaluation_settings_keep_games_whole_and_rewards_raw() -> None:
    config = AtariConfig().for_evaluation()
    assert not config.terminal_on_life_loss
    assert not config.clip_reward
    assert config.frame_stack == 4


def test_ppo_trains_on_pong_with_uint8_rollouts() -> None:
    from rlfleet.runs.config import default_run_config
    from rlfleet.runs.run import make_trainer

    cfg = default_run_config(
        "ppo",
        "ALE/Pong-v5",
        {
            "env": {"num_envs": 4, "num_test_envs": 1},
            "hyperparameters": {"num_steps": 64, "batch_size": 128, "num_epochs": 1},
            "trainer": {
                "max_steps": 768,
                "epoch_num_steps": 768,
                "test_step_num_episodes": 1,
                "show_progress": False,
                "verbose": False,
            },
        },
    )
    trainer = make_trainer(cfg, None)
    try:
        result = trainer.run()  # 3,072 frames of training, one test game
        assert result.env_steps == 768
        assert trainer.storage.obs.dtype == torch.uint8
        assert trainer.storage.obs.shape[2:] == (4, 84, 84)
        assert -21 <= result.best_score <= 21
    finally:
        trainer.train_envs.close()
        trainer.test_envs.close()


def test_dqn_trains_on_pong_from_uint8_frames_in_its_replay_buffer() -> None:
    from rlfleet.runs.config import default_run_config
    from rlfleet.runs.run import make_trainer

    cfg = default_run_config(
        "dqn",
        "ALE/Pong-v5",
        {
            "env": {"num_test_envs": 1},
            "hyperparameters": {"learning_starts": 256, "buffer_size": 1024},
            "trainer": {
                "max_steps": 512,
                "epoch_num_steps": 512,
                "test_step_num_episodes": 1,
                "show_progress": False,
                "verbose": False,
            },
        },
    )
    assert cfg.hyperparameters.hidden_sizes == ()  # the preset's Nature DQN head
    trainer = make_trainer(cfg, None)
    try:
        result = trainer.run()  # 2,048 frames of training, one test game
        assert result.env_steps == 512
        assert result.gradient_steps > 0
        storage = trainer.buffer.storage
        assert all(a.dtype == np.uint8 and a.shape[2:] == (4, 84, 84) for a in storage.obs.values())
        assert -21 <= result.best_score <= 21
    finally:
        trainer.train_envs.close()
        trainer.test_envs.close()


def test_an_atari_config_built_in_python_is_checked() -> None:
    from rlfleet.envs.make import make_env, make_vec_env

    bad = AtariConfig(frame_skip=0)
    message = r"^AtariConfig\.frame_skip: .*\(got 0\)$"
    with pytest.raises(ConfigError, match=message):
        make_env("ALE/Breakout-v5", atari=bad)
    with pytest.raises(ConfigError, match=message):
        make_vec_env("ALE/Breakout-v5", 1, atari=bad)
