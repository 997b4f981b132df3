"""The collector under next-step autoreset: reset steps masked, terminated and truncated apart;
off-policy collection with action masks."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlfleet.algos import DQN, PPO
from rlfleet.collect.collector import Collector
from rlfleet.collect.evaluator import Evaluator
from rlfleet.data.replay import ReplayBuffer
from rlfleet.data.rollout import RolloutStorage
from rlfleet.errors import ConfigError
from tests.toy_envs import MaskedPick


class Countdown(gym.Env[np.ndarray, int]):
    """Observation = steps taken; reward 1 per step; terminates at step 3."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t == 3, False, {}


def _envs(max_steps: int | None) -> SyncVectorEnv:
    def make() -> gym.Env:
        env: gym.Env = Countdown()
        if max_steps is not None:
            env = gym.wrappers.TimeLimit(env, max_steps)
        return env

    return SyncVectorEnv([make, make], autoreset_mode=AutoresetMode.NEXT_STEP)


def test_termination_and_reset_steps() -> None:
    envs = _envs(None)
    algo = PPO(envs.single_observation_space, envs.single_action_space)
    storage = RolloutStorage(8, 2, (1,), ())
    collector = Collector(envs, algo, seed=0)
    stats = collector.collect_rollout(storage)
    # Steps 0-2 are an episode ending in termination at t=2; t=3 is the reset step.
    np.testing.assert_array_equal(storage.terminated[:, 0].numpy(), [0, 0, 1, 0, 0, 0, 1, 0])
    np.testing.assert_array_equal(storage.valid[:, 0].numpy(), [1, 1, 1, 0, 1, 1, 1, 0])
    assert storage.truncated.sum() == 0
    # The row after the terminal step holds the terminal observation (3), so its value is
    # the one a truncated episode would bootstrap from.
    assert storage.obs[3, 0, 0] == 3.0
    assert stats.episode_returns == [3.0, 3.0, 3.0, 3.0]
    assert stats.episode_lengths == [3, 3, 3, 3]
    assert stats.env_steps == 16


def test_truncation_is_flagged_separately() -> None:
    envs = _envs(2)
    algo = PPO(envs.single_observation_space, envs.single_action_space)
    storage = RolloutStorage(6, 2, (1,), ())
    Collector(envs, algo, seed=0).collect_rollout(storage)
    np.testing.assert_array_equal(storage.truncated[:, 1].numpy(), [0, 1, 0, 0, 1, 0])
    assert storage.terminated.sum() == 0
    next_values = storage.next_values()
    torch.testing.assert_close(next_values[1], storage.values[2])


def test_evaluator_runs_exactly_the_requested_episodes() -> None:
    envs = _envs(None)
    algo = PPO(envs.single_observation_space, envs.single_action_space)
    stats = Evaluator(envs, algo, seed=0).run(5)
    assert stats.returns.tolist() == [3.0] * 5
    assert stats.lengths.tolist() == [3] * 5


def test_evaluator_reports_each_episodes_end() -> None:
    envs = _envs(None)
    algo = PPO(envs.single_observation_space, envs.single_action_space)
    counts: list[int] = []
    Evaluator(envs, algo, seed=0).run(5, on_episode=counts.append)
    # Two envs end their episodes in lockstep; the fifth ends alone, the sixth is not counted.
    assert counts == [2, 4, 5]


def test_collecting_by_episodes_grows_the_storage() -> None:
    envs = _envs(None)
    algo = PPO(envs.single_observation_space, envs.single_action_space)
    storage = RolloutStorage(2, 2, (1,), ())
    stats = Collector(envs, algo, seed=0).collect_rollout(storage, num_episodes=5)
    # Episodes take 3 steps plus a reset step; two envs finish in lockstep: 6 episodes after
    # 11 steps (ends at t=2, 6, 10).
    assert stats.episodes == 6
    assert storage.num_steps == 11
    assert storage.capacity >= 11
    assert storage.obs.shape[0] == storage.rewards.shape[0] == 11
    np.testing.assert_array_equal(storage.terminated[:, 0].numpy(), [0, 0, 1, 0] * 2 + [0, 0, 1])


def test_on_policy_trainer_collects_by_episodes() -> None:
    from rlfleet.train.loop import TrainerConfig
    from rlfleet.train.trainer import OnPolicyTrainer

    envs = _envs(None)
    algo = PPO(envs.single_observation_space, envs.single_action_space)
    trainer = OnPolicyTrainer(
        algo,
        envs,
        _envs(None),
        TrainerConfig(max_steps=60, epoch_num_steps=60, show_progress=False, verbose=False,
                      test_step_num_episodes=2),
        collection_step_num_episodes=4,
        batch_size=8,
    )  # fmt: skip
    result = trainer.run()
    assert result.episodes >= 4 * (result.env_steps // 22)
    assert result.env_steps >= 60


def test_off_policy_collection_skips_reset_steps_and_keeps_the_final_observation() -> None:
    envs = _envs(2)  # truncated after 2 steps
    algo = DQN(envs.single_observation_space, envs.single_action_space)
    buffer = ReplayBuffer(64, envs.single_observation_space, envs.single_action_space, 2)
    stats = Collector(envs, algo, seed=0).collect_transitions(buffer, 7, random_actions=True)
    assert stats.env_steps == 14
    assert stats.episode_returns == [2.0] * 4
    # Per env: obs 0, 1 (truncated, next obs is the final obs 2), reset row holding 2, ...
    np.testing.assert_array_equal(buffer.obs["obs"][:7, 0, 0], [0, 1, 2, 0, 1, 2, 0])
    np.testing.assert_array_equal(buffer.valid[:7, 0], [1, 1, 0, 1, 1, 0, 1])
    np.testing.assert_array_equal(buffer.truncated[:7, 0], [0, 1, 0, 0, 1, 0, 0])
    batch = buffer.sample(256, gamma=0.5)
    obs, next_obs = batch.obs[:, 0], batch.next_obs[:, 0]
    torch.testing.assert_close(next_obs, obs + 1)  # never a reset obs as a next obs
    torch.testing.assert_close(batch.discounts, torch.full((256,), 0.5))  # truncation bootstraps


class _RestorableMaskedPick(MaskedPick):
    """MaskedPick whose state a checkpoint can keep (the get_state protocol)."""

    def get_state(self) -> dict[str, Any]:
        return {"t": self.t, "mask": self._mask.copy(), "rng": self.np_random.bit_generator.state}

    def set_state(self, state: dict[str, Any]) -> None:
        self.t = int(state["t"])
        self._mask = np.asarray(state["mask"]).copy()
        self.np_random.bit_generator.state = state["rng"]


def _masked_envs(n: int, env: type[MaskedPick] = MaskedPick) -> tuple[SyncVectorEnv, list]:
    made = [env("discrete", length=3) for _ in range(n)]
    envs = SyncVectorEnv([lambda e=e: e for e in made], autoreset_mode=AutoresetMode.NEXT_STEP)
    return envs, made


def _check_rows_keep_their_masks(buffer: ReplayBuffer) -> None:
    # MaskedPick's observation is its mask: every row (reset rows, which hold a final
    # observation, included) keeps the mask the env gave with its observation.
    assert buffer.action_masks is not None
    rows = buffer.rows_filled
    np.testing.assert_array_equal(buffer.action_masks[:rows], buffer.obs["obs"][:rows] > 0.5)


def test_off_policy_collection_acts_legally_and_stores_each_rows_mask() -> None:
    envs, made = _masked_envs(2)
    algo = DQN(envs.single_observation_space, envs.single_action_space)
    collector = Collector(envs, algo, seed=0)
    assert collector.mask_size() == 5
    buffer = ReplayBuffer(
        64, envs.single_observation_space, envs.single_action_space, 2, mask_size=5
    )
    collector.collect_transitions(buffer, 12, random_actions=True)
    collector.collect_transitions(buffer, 12)
    assert sum(env.violations for env in made) == 0
    assert sum(env.steps for env in made) == 48 - 2 * 6  # reset steps are not env steps
    _check_rows_keep_their_masks(buffer)
    assert not buffer.valid[:24].all()  # reset rows were stored too
    batch = buffer.sample(64, gamma=0.5)
    assert batch.next_action_masks is not None
    torch.testing.assert_close(batch.next_action_masks, batch.next_obs > 0.5)


def test_collection_refuses_a_buffer_whose_masks_do_not_fit_the_env() -> None:
    envs, _ = _masked_envs(1)
    algo = DQN(envs.single_observation_space, envs.single_action_space)
    plain = ReplayBuffer(16, envs.single_observation_space, envs.single_action_space, 1)
    with pytest.raises(ConfigError, match="gives an action mask of 5 entries, but the replay"):
        Collector(envs, algo, seed=0).collect_transitions(plain, 2)
    cartpole = _envs(None)
    dqn = DQN(cartpole.single_observation_space, cartpole.single_action_space)
    masked = ReplayBuffer(
        16, cartpole.single_observation_space, cartpole.single_action_space, 2, mask_size=2
    )
    with pytest.raises(ConfigError, match=r"gives no action mask, but .* keeps a mask of 2"):
        Collector(cartpole, dqn, seed=0).collect_transitions(masked, 2)


def test_a_restored_collector_keeps_the_mask_of_its_restored_observations() -> None:
    envs, _ = _masked_envs(2, _RestorableMaskedPick)
    algo = DQN(envs.single_observation_space, envs.single_action_space)
    collector = Collector(envs, algo, seed=0)
    buffer = ReplayBuffer(
        64, envs.single_observation_space, envs.single_action_space, 2, mask_size=5
    )
    collector.collect_transitions(buffer, 4, random_actions=True)
    state = collector.state_dict()
    assert state["env"] is not None
    np.testing.assert_array_equal(state["action_mask"], np.asarray(collector.obs) > 0.5)

    other_envs, made = _masked_envs(2, _RestorableMaskedPick)
    restored = Collector(other_envs, algo, seed=123)  # reset to other observations and masks
    restored.load_state_dict(state)
    restored.collect_transitions(buffer, 4)
    assert sum(env.violations for env in made) == 0
    _check_rows_keep_their_masks(buffer)
