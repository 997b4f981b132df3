"""NaN guard: bad env values are caught at the source; the trainer's ``nan_policy`` reaches
every learner of the run (algorithm and reward signals) and its skips are logged. That no
algorithm's update lets a bad loss or gradient through is tested for each registered
algorithm in tests/algos/test_shared.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from torch import nn

from rlfleet.algos import PPO, PPOConfig
from rlfleet.checkpoint import CheckpointManager
from rlfleet.errors import NonFiniteError
from rlfleet.logging.history import read_history
from rlfleet.nn.optim import NanPolicy
from rlfleet.rewards import ExtrinsicSettings, RewardSignals, RewardSignalsSettings, RNDSettings
from rlfleet.train.loop import TrainerConfig
from rlfleet.train.trainer import OnPolicyTrainer
from tests.nan_injection import assert_unchanged, nan_gradients


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


def _trainer(tmp_path: Path, nan_policy: NanPolicy) -> OnPolicyTrainer:
    """PPO with an RND reward signal: 2 updates of 3 epochs, one 48-row minibatch each."""
    envs = _envs(bad_env=-1, bad_step=0, field="reward")
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    signals = RewardSignals(
        RewardSignalsSettings(extrinsic=ExtrinsicSettings(), rnd=RNDSettings()),
        obs_space, act_space, num_envs=3,
    )  # fmt: skip
    return OnPolicyTrainer(
        PPO(obs_space, act_space, PPOConfig(num_steps=16, batch_size=48, num_epochs=3)),
        envs,
        _envs(bad_env=-1, bad_step=0, field="reward"),
        TrainerConfig(max_steps=96, epoch_num_steps=48, show_progress=False, verbose=False,
                      test_step_num_episodes=3, nan_policy=nan_policy),
        run_dir=tmp_path,
        reward_signals=signals,
    )  # fmt: skip


def _learners(trainer: OnPolicyTrainer) -> list[nn.Module]:
    assert trainer.reward_signals is not None
    signals = [m for s in trainer.reward_signals.signals for m in s.modules().values()]
    return [*trainer.algorithm.modules().values(), *signals]


def test_skip_batch_reaches_every_learner_counts_and_goes_on(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, "skip_batch")
    algo, signals = trainer.algorithm, trainer.reward_signals
    assert signals is not None
    assert [s.nan_policy for s in signals.signals] == ["skip_batch", "skip_batch"]
    modules = _learners(trainer)
    before = [p.detach().clone() for m in modules for p in m.parameters()]
    nan_gradients(p for m in modules for p in m.parameters())
    trainer.run()
    assert algo.skipped_batches == 6  # 2 updates x 3 epochs x 1 minibatch
    assert signals.skipped_batches == 6  # the signal learns for as many epochs as PPO
    assert algo.gradient_steps == 0
    assert_unchanged(before, [p.detach() for m in modules for p in m.parameters()], "weights")
    assert not any(o.state for o in algo.optimizers().values())  # Adam never stepped
    logged = [
        row.get("train/skipped_batches") for row in read_history(tmp_path / "history.parquet")
    ]
    assert [n for n in logged if n is not None] == [6, 12]  # algorithm and signal, per epoch


def test_raise_stops_training_at_the_learner_that_saw_it(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, "raise")
    assert trainer.reward_signals is not None
    rnd = trainer.reward_signals.signals[1]
    nan_gradients(p for m in rnd.modules().values() for p in m.parameters())
    before = trainer.algorithm.parameters_vector().clone()
    with pytest.raises(NonFiniteError, match=r"^reward signal 'rnd': non-finite loss .+ unchanged"):
        trainer.run()
    assert torch.equal(trainer.algorithm.parameters_vector(), before)
    assert trainer.algorithm.gradient_steps == 0
