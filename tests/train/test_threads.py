"""Torch threads while rlfleet trains: the run's setting inside, the caller's own afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import DQN, PPO, SAC, DQNConfig, PPOConfig, SACConfig
from rlfleet.algos.registry import get_algorithm, list_algorithms
from rlfleet.config.fields import MAX_TORCH_THREADS
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError, EnvSpecError
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer, train
from rlfleet.train import threads as threads_module
from rlfleet.train.loop import TrainerConfig
from rlfleet.train.threads import (
    AUTO,
    BUILD_THREADS,
    DEFAULT_TORCH_THREADS,
    WORK_PER_THREAD,
    ThreadSetting,
    auto_torch_threads,
    check_thread_setting,
    torch_threads,
    update_work,
)
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


@pytest.mark.parametrize(("setting", "expected"), [(2, 2), (AUTO, BUILD_THREADS), (None, CALLERS)])
def test_make_trainer_builds_the_algorithm_on_the_configs_threads(
    setting: ThreadSetting, expected: int
) -> None:
    # Initial weights depend on the thread count: a script's make_trainer must build the
    # networks `rlfleet train` builds for the same seed, whatever its own count.
    built_on: list[int] = []

    class Recording(PPO):
        def _build(self) -> None:
            built_on.append(torch.get_num_threads())
            super()._build()

    cfg = default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "torch_threads": setting,
            "env": {"num_envs": 2, "num_test_envs": 1},
            "hyperparameters": {"num_steps": 16, "batch_size": 32},
        },
    )
    torch.set_num_threads(CALLERS)
    trainer = make_trainer(cfg, None, algorithm_class=Recording)
    trainer.close()
    assert built_on == [expected]
    assert torch.get_num_threads() == CALLERS


@pytest.mark.parametrize("threads", [DEFAULT_TORCH_THREADS, 2, None])
def test_a_hand_assembled_trainer_sets_threads_while_it_runs(threads: ThreadSetting) -> None:
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
    # auto: a 64x64 MLP at batch 32 is far too little work for a second thread.
    expected = {None: CALLERS, AUTO: 1}.get(threads, threads)
    assert set(seen) == {expected}
    assert torch.get_num_threads() == CALLERS


def test_the_default_is_the_run_configs_default() -> None:
    assert default_run_config("ppo", "CartPole-v1").torch_threads == DEFAULT_TORCH_THREADS == AUTO


BOX4 = spaces.Box(-1, 1, (4,), np.float32)
ATARI = spaces.Box(0, 255, (4, 84, 84), np.uint8)


def test_update_work_counts_the_matmuls_of_the_trained_networks_per_minibatch() -> None:
    dqn = DQN(BOX4, spaces.Discrete(2), DQNConfig(hidden_sizes=(256, 256), batch_size=64))
    # The online network only (the target network trains nothing): 4x256 + 256x256 + 256x2.
    assert update_work(dqn) == (4 * 256 + 256 * 256 + 256 * 2) * 64
    nature = (
        20 * 20 * (4 * 8 * 8) * 32  # 8x8 stride 4: 84 -> 20
        + 9 * 9 * (32 * 4 * 4) * 64  # 4x4 stride 2: 20 -> 9
        + 7 * 7 * (64 * 3 * 3) * 64  # 3x3 stride 1: 9 -> 7
        + 64 * 7 * 7 * 512  # the linear layer after the convolutions
    )
    cnn = PPO(ATARI, spaces.Discrete(6), PPOConfig(hidden_sizes=(), batch_size=256))
    # ... and the actor and critic heads on the 512 features: a few thousand more.
    assert nature * 256 < update_work(cnn) < (nature + 512 * 16) * 256
    assert update_work(object()) == 0


@pytest.mark.parametrize(
    ("algo", "cores", "expected"),
    [
        ("ppo_64", 2, 1),
        ("ppo_64", 64, 1),
        ("dqn_256_b64", 2, 1),
        ("dqn_256_b64", 64, 1),
        ("sac_256_b256", 1, 1),
        ("sac_256_b256", 2, 2),
        ("sac_256_b256", 16, 3),
        ("cnn_b256", 2, 2),
        ("cnn_b256", 16, 16),
        ("cnn_b256", 1, 1),
    ],
)
def test_auto_gives_one_thread_per_share_of_work_up_to_the_cores(
    algo: str, cores: int, expected: int
) -> None:
    built = {
        "ppo_64": lambda: PPO(BOX4, spaces.Discrete(2)),
        "dqn_256_b64": lambda: DQN(
            BOX4, spaces.Discrete(2), DQNConfig(hidden_sizes=(256, 256), batch_size=64)
        ),
        "sac_256_b256": lambda: SAC(
            spaces.Box(-1, 1, (3,), np.float32),
            spaces.Box(-2, 2, (1,), np.float32),
            SACConfig(hidden_sizes=(256, 256), batch_size=256),
        ),
        "cnn_b256": lambda: PPO(ATARI, spaces.Discrete(6), PPOConfig(hidden_sizes=())),
    }[algo]()
    assert auto_torch_threads(built, cores) == expected
    assert expected == max(1, min(cores, update_work(built) // WORK_PER_THREAD))


def test_auto_trains_on_the_count_chosen_from_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rlfleet.train.loop.available_cores", lambda: 3)
    envs, test_envs = make_vec_env("CartPole-v1", 2, seed=0), make_vec_env("CartPole-v1", 1)
    wide = PPOConfig(num_steps=16, hidden_sizes=(2048, 2048), batch_size=32, num_epochs=1)
    algo = PPO(envs.single_observation_space, envs.single_action_space, wide)
    assert update_work(algo) > 3 * WORK_PER_THREAD
    seen: list[int] = []
    trainer = OnPolicyTrainer(
        algo,
        envs,
        test_envs,
        TrainerConfig(max_steps=32, epoch_num_steps=32, **QUIET),
        training_fn=lambda epoch, step: seen.append(torch.get_num_threads()),
        torch_threads=AUTO,
    )
    torch.set_num_threads(CALLERS)
    try:
        trainer.run()
    finally:
        trainer.close()
    assert set(seen) == {3}
    assert torch.get_num_threads() == CALLERS


@pytest.mark.parametrize(("share", "expected"), [("1", 1), ("", 2), ("0", 2), ("many", 2)])
def test_omp_num_threads_caps_the_cores_auto_counts(
    monkeypatch: pytest.MonkeyPatch, share: str, expected: int
) -> None:
    monkeypatch.setattr(threads_module.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", share)
    assert threads_module.available_cores() == expected


def test_auto_without_an_algorithm_builds_on_one_thread() -> None:
    torch.set_num_threads(CALLERS)
    with torch_threads(AUTO):
        assert torch.get_num_threads() == BUILD_THREADS == 1
    assert torch.get_num_threads() == CALLERS


@pytest.mark.parametrize("setting", [0, 1025, "fast", True, 2.0])
def test_a_bad_setting_is_refused_with_what_it_takes(setting: object) -> None:
    expected = r"run: torch_threads must be an integer from 1 to 1024, 'auto' or null, got "
    with pytest.raises(ConfigError, match=expected):
        check_thread_setting(setting, "run")
    for good in (1, 1024, AUTO, None):
        assert check_thread_setting(good, "run") == good


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_auto_gives_every_shipped_preset_one_thread(env_id: str) -> None:
    env = gym.make(env_id)
    built = 0
    for name in list_algorithms():
        algo_cls = get_algorithm(name)
        try:
            algo_cls.check_spaces(env.observation_space, env.action_space)
        except EnvSpecError:
            continue  # e.g. DQN on Pendulum's Box actions
        cfg = default_run_config(name, env_id)
        algo = algo_cls(env.observation_space, env.action_space, cfg.hyperparameters)
        assert auto_torch_threads(algo, cores=64) == 1, name
        built += 1
    assert built >= 10
