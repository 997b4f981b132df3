"""Torch threads while rlfleet trains: the run's setting inside, the caller's own afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rlfleet.algos import PPO, PPOConfig
from rlfleet.config.fields import MAX_TORCH_THREADS
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import train
from rlfleet.train.loop import TrainerConfig
from rlfleet.train.threads import DEFAULT_TORCH_THREADS, torch_threads
from rlfleet.train.trainer import OnPolicyTrainer

CALLERS = 3
"""The caller's own thread count: neither the default nor what the runs below ask for."""
QUIET: dict[str, Any] = {"show_progress": False, "verbose": False, "test_step_num_episodes": 1}


def test_the_block_runs_on_the_given_count_and_the_callers_comes_back() -> None:
    torch.set_num_threads(CALLERS)
    interop = torch.get_num_interop_threads()
    with torch_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == CALLERS
    with pytest.raises(RuntimeError, match="boom"), torch_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == CALLERS
    with torch_threads(None):
        assert torch.get_num_threads() == CALLERS
    assert torch.get_num_interop_threads() == interop


@pytest.mark.parametrize("count", [0, -1, MAX_TORCH_THREADS + 1, 100_000])
def test_a_count_out_of_range_is_refused_before_torch_sees_it(count: int) -> None:
    torch.set_num_threads(CALLERS)
    message = f"torch_threads must be from 1 to 1024, got {count}"
    with pytest.raises(ConfigError, match=message), torch_threads(count):
        pass  # pragma: no cover (never entered)
    assert torch.get_num_threads() == CALLERS


def test_train_uses_the_configs_threads_and_restores_the_callers(tmp_path: Path) -> None:
    cfg = default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "torch_threads": 2,
            "env": {"num_envs": 2, "num_test_envs": 1},
            "hyperparameters": {"num_steps": 16, "batch_size": 32, "num_epochs": 1},
            "trainer": {"max_steps": 64, "epoch_num_steps": 64, **QUIET},
        },
    )
    seen: list[int] = []
    torch.set_num_threads(CALLERS)
    train(
        cfg, tmp_path / "run", training_fn=lambda epoch, step: seen.append(torch.get_num_threads())
    )
    assert set(seen) == {2}
    assert torch.get_num_threads() == CALLERS


@pytest.mark.parametrize("threads", [DEFAULT_TORCH_THREADS, 2, None])
def test_a_hand_assembled_trainer_sets_threads_while_it_runs(threads: int | None) -> None:
    envs, test_envs = make_vec_env("CartPole-v1", 2, seed=0), make_vec_env("CartPole-v1", 1)
    algo = PPO(envs.single_observation_space, envs.single_action_space, PPOConfig(num_steps=16))
    seen: list[int] = []
    # Left out, the trainer's own default applies.
    kwargs: dict[str, Any] = {} if threads == DEFAULT_TORCH_THREADS else {"torch_threads": threads}
    trainer = OnPolicyTrainer(
        algo,
        envs,
        test_envs,
        TrainerConfig(max_steps=64, epoch_num_steps=64, **QUIET),
        batch_size=32,
        training_fn=lambda epoch, step: seen.append(torch.get_num_threads()),
        **kwargs,
    )
    torch.set_num_threads(CALLERS)
    try:
        trainer.run()
    finally:
        trainer.close()
    assert set(seen) == {CALLERS if threads is None else threads}
    assert torch.get_num_threads() == CALLERS


def test_the_default_is_the_run_configs_default() -> None:
    assert default_run_config("ppo", "CartPole-v1").torch_threads == DEFAULT_TORCH_THREADS == 1
