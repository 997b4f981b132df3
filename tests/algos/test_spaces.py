"""Every space combination an algorithm claims learns a small task (tests/toy_envs.py).

Algorithms x tasks: each registered algorithm is trained on every toy task whose action
space it supports, at a fixed seed and step budget, and its greedy policy must score well
above chance. The tasks are one-step, so these are a few seconds each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.config.loader import validate
from rlfleet.train.loop import TrainerConfig
from rlfleet.train.trainer import OnPolicyTrainer
from tests.toy_envs import (
    BrightSide,
    CopyBits,
    GuessIndex,
    ImageAndVector,
    MatchDigits,
    NestedDictChoice,
    SteerToTarget,
)

# Settings that learn these easy tasks fast, per algorithm.
FAST: dict[str, dict[str, Any]] = {
    "ppo": {"num_steps": 16, "batch_size": 64, "num_epochs": 4, "learning_rate": 3e-3},
    "a2c": {
        "num_steps": 8,
        "learning_rate": 3e-3,
        "optimizer": "adam",
        "normalize_advantage": True,
    },
    "trpo": {
        "num_steps": 32,
        "batch_size": 128,
        "num_epochs": 5,
        "target_kl": 0.05,
        "learning_rate": 3e-3,
    },
    "acer": {
        "num_steps": 16,
        "learning_rate": 7e-4,
        "replay_start": 2,
        "replay_ratio": 2.0,
        "ent_coef": 0.0,
    },
}

# Cheaper settings where images make an update expensive (TRPO's Fisher-vector products
# run the CNN twice backwards per conjugate-gradient step).
IMAGE_FAST: dict[str, dict[str, Any]] = {"trpo": {"num_steps": 16, "cg_max_steps": 8}}


@dataclass(frozen=True)
class Task:
    make: Callable[[], gym.Env[Any, Any]]
    hyperparameters: dict[str, Any]
    steps: int
    threshold: float
    only: tuple[str, ...] | None = None
    """Algorithms to run it with (default: every one whose spaces fit). The CNN encoders are
    shared code: one test per algorithm on images, the other CNN and the image+vector Dict
    encoder with PPO."""


TASKS: dict[str, Task] = {
    "discrete-obs-discrete-act": Task(GuessIndex, {}, 4096, 0.95),
    "box-obs-box-act": Task(SteerToTarget, {"log_std_init": -1.0}, 8192, 0.8),
    "multidiscrete-obs-multidiscrete-act": Task(MatchDigits, {}, 6144, 0.9),
    "multibinary-obs-multibinary-act": Task(CopyBits, {}, 6144, 0.9),
    "nested-dict-obs": Task(NestedDictChoice, {}, 4096, 0.95),
    "image-hwc-nature-cnn": Task(BrightSide, {"cnn": "nature", "learning_rate": 1e-3}, 4096, 0.9),
    "image-chw-impala-cnn": Task(
        lambda: BrightSide(channels_first=True, size=24),
        {"cnn": "impala", "learning_rate": 1e-3},
        4096,
        0.9,
        only=("ppo",),
    ),
    "dict-image-and-vector": Task(
        ImageAndVector, {"cnn": "nature", "learning_rate": 1e-3}, 8192, 0.85, only=("ppo",)
    ),
}


def _cases() -> list[Any]:
    cases = []
    # Driven through OnPolicyTrainer: the on-policy family; the other kinds learn their
    # reference tasks in their own tests.
    for name in list_algorithms():
        cls = get_algorithm(name)
        if cls.kind != "on_policy":
            continue
        for task_id, task in TASKS.items():
            env = task.make()
            if (task.only is None or name in task.only) and (
                isinstance(env.action_space, cls.action_spaces)
                and isinstance(env.observation_space, cls.observation_spaces)
            ):
                cases.append(pytest.param(name, task_id, id=f"{name}-{task_id}"))
    return cases


def train_on(
    name: str,
    make: Callable[[], gym.Env[Any, Any]],
    hyperparameters: dict[str, Any],
    steps: int,
    *,
    test_every: int | None = None,
    target: float | None = None,
    test_episodes: int = 40,
) -> float:
    """Train ``name`` on 8 copies of a toy env; the best mean greedy return of
    ``test_episodes`` test episodes, tested every ``test_every`` steps (default: once, at the
    end) and stopping once a test reaches ``target``."""
    envs = SyncVectorEnv([make] * 8, autoreset_mode=AutoresetMode.NEXT_STEP)
    test_envs = SyncVectorEnv([make] * 4, autoreset_mode=AutoresetMode.NEXT_STEP)
    cls = get_algorithm(name)
    config = validate(cls.config_class, hyperparameters, name)
    algo = cls(envs.single_observation_space, envs.single_action_space, config, seed=0)
    trainer = OnPolicyTrainer(
        algo,
        envs,
        test_envs,
        TrainerConfig(
            max_steps=steps,
            epoch_num_steps=test_every or steps,
            test_step_num_episodes=test_episodes,
            target_reward=target,
            show_progress=False,
            verbose=False,
        ),
        seed=0,
    )
    return trainer.run().best_score


@pytest.mark.slow
@pytest.mark.parametrize(("name", "task"), _cases())
def test_learns_toy_task(name: str, task: str) -> None:
    spec = TASKS[task]
    hyperparameters = {**FAST[name], **spec.hyperparameters}
    if "cnn" in spec.hyperparameters:
        hyperparameters.update(IMAGE_FAST.get(name, {}))
    score = train_on(name, spec.make, hyperparameters, spec.steps)
    assert score >= spec.threshold, f"{name} on {task}: greedy return {score:.3f}"


def test_every_algorithm_is_tested_on_every_action_space_it_claims() -> None:
    for name in list_algorithms():
        cls = get_algorithm(name)
        covered = {type(task.make().action_space) for task in TASKS.values()}
        assert set(cls.action_spaces) <= covered, name


def test_cnn_weights_survive_a_checkpoint_round_trip(tmp_path: Any) -> None:
    import numpy as np
    import torch
    from gymnasium import spaces

    from rlfleet.checkpoint import load_checkpoint, save_checkpoint

    image = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    cls = get_algorithm("ppo")
    algo = cls(image, spaces.Discrete(3), validate(cls.config_class, {"hidden_sizes": []}, "ppo"))
    save_checkpoint(tmp_path / "ckpt", {"algorithm": algo.state_dict()}, {"algorithm": "ppo"})
    state, _ = load_checkpoint(tmp_path / "ckpt")
    fresh = cls(image, spaces.Discrete(3), algo.config, seed=7)
    fresh.load_state_dict(state["algorithm"])
    assert torch.equal(algo.parameters_vector(), fresh.parameters_vector())
    obs = np.random.default_rng(0).integers(0, 256, (5, 4, 84, 84), dtype=np.uint8)
    np.testing.assert_array_equal(algo.predict(obs), fresh.predict(obs))
