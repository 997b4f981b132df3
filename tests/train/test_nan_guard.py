"""NaN guard: bad env values are caught at the source; bad losses never reach the optimizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlfleet.algos import PPO, PPOConfig
from rlfleet.data.rollout import RolloutStorage
from rlfleet.errors import NonFiniteError
from rlfleet.train.checkpoint import CheckpointManager
from rlfleet.train.trainer import OnPolicyTrainer, TrainerConfig


class PoisonAt(gym.Env[np.ndarray, int]):
    """Runs fine until its ``bad_step``-th step, then returns NaN in ``field``."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, bad_step: int, field: str) -> None:
        self.bad_step, self.field, self.total = bad_step, field, 0

    def reset(
        self, *, seed: int | None = None, options: Any = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        self.total += 1
        obs = np.zeros(2, np.float32)
        reward = 1.0
        if self.total >= self.bad_step:
            if self.field == "observation":
                obs[1] = np.nan
            else:
                reward = float("inf")
        return obs, reward, False, self.t >= 20, {}


def _envs(bad_env: int, bad_step: int, field: str) -> SyncVectorEnv:
    fns = [(lambda i=i: PoisonAt(bad_step if i == bad_env else 10**9, field)) for i in range(3)]
    return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP)


@pytest.mark.parametrize("field", ["reward", "observation"])
def test_non_finite_env_values_name_env_index_and_step(field: str, tmp_path: Path) -> None:
    envs = _envs(bad_env=2, bad_step=100, field=field)
    algo = PPO(
        envs.single_observation_space,
        envs.single_action_space,
        PPOConfig(num_steps=16, batch_size=48),
    )
    trainer = OnPolicyTrainer(
        algo,
        envs,
        _envs(bad_env=-1, bad_step=0, field=field),
        TrainerConfig(max_steps=10_000, epoch_num_steps=48, show_progress=False, verbose=False,
                      test_step_num_episodes=3),
        run_dir=tmp_path,
    )  # fmt: skip
    # Env 2's 100th step() comes at vector step 104: episodes last 20 steps, and the reset
    # step after each of the first 4 episodes does not call step(). 104 x 3 envs = 312.
    with pytest.raises(
        NonFiniteError, match=rf"non-finite {field} from env index 2 at env step 312"
    ):
        trainer.run()
    # Checkpoints written before the failure are intact and load.
    _, metadata = CheckpointManager(tmp_path / "checkpoints").load_latest()
    assert metadata["counters"]["env_step"] == 288


def _storage_with_nan() -> RolloutStorage:
    storage = RolloutStorage(8, 4, (2,), (), action_dtype=torch.int64)
    storage.valid.fill_(1)
    storage.rewards[3, 1] = float("nan")
    return storage


def test_non_finite_loss_raises_and_leaves_parameters_unchanged() -> None:
    algo = PPO(spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(2), PPOConfig(batch_size=32))
    before = algo.parameters_vector().clone()
    with pytest.raises(NonFiniteError, match="parameters were left unchanged"):
        algo.update(_storage_with_nan())
    assert torch.equal(algo.parameters_vector(), before)
    assert algo.gradient_steps == 0


def test_skip_batch_policy_counts_and_goes_on() -> None:
    algo = PPO(
        spaces.Box(-1, 1, (2,), np.float32),
        spaces.Discrete(2),
        PPOConfig(batch_size=32, num_epochs=3),
    )
    algo.nan_policy = "skip_batch"
    before = algo.parameters_vector().clone()
    algo.update(_storage_with_nan())
    assert algo.skipped_batches == 3
    assert algo.gradient_steps == 0
    assert torch.equal(algo.parameters_vector(), before)
    assert not algo.optimizer.state  # Adam never stepped
