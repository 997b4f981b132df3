"""SAC: learns Pendulum (Box), CartPole (Discrete) and images (Discrete, with a CNN); entropy
tuning; refuses bad spaces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import SAC, SACConfig
from rlfleet.config.loader import validate
from rlfleet.errors import EnvSpecError
from rlfleet.nn.encoders import GridEncoder, ImageEncoder
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from tests.toy_envs import assert_bright_side_run_repeats_and_round_trips, bright_side_trainer

QUIET = {"show_progress": False, "verbose": False}
OBS = spaces.Box(-1, 1, (3,), np.float32)

# Thresholds at a fixed seed and budget (a random Pendulum policy scores about -1200, a
# random CartPole one about 22); bench/reference_tasks.py runs the full ones on more seeds.


def _run(env_id: str, overrides: dict[str, Any]) -> Any:
    cfg = default_run_config("sac", env_id, overrides)
    return make_trainer(cfg, None).run()


@pytest.mark.slow
def test_learns_pendulum() -> None:
    result = _run(
        "Pendulum-v1",
        {"seed": 0, "trainer": {**QUIET, "max_steps": 8000, "target_reward": -250}},
    )
    assert result.best_score >= -250, result


@pytest.mark.slow
def test_discrete_learns_cartpole() -> None:
    # The preset reaches 475 at about 12k env steps (bench/reference_tasks.py); CI stops at
    # a smaller bar that is still far from random, to stay well under a minute.
    result = _run(
        "CartPole-v1",
        {"seed": 0, "trainer": {**QUIET, "max_steps": 16000, "target_reward": 350}},
    )
    assert result.best_score >= 350, result


def test_entropy_coefficient_is_tuned_towards_the_target() -> None:
    algo = SAC(OBS, spaces.Box(-2, 2, (1,), np.float32), SACConfig(learning_rate=0.01))
    assert algo.target_entropy == -1.0
    discrete = SAC(OBS, spaces.Discrete(4), SACConfig())
    assert discrete.target_entropy == pytest.approx(0.5 * np.log(4))
    fixed = SAC(OBS, spaces.Discrete(4), SACConfig(ent_coef=0.2))
    assert fixed.ent_coef_optimizer is None
    assert float(fixed.ent_coef.log_value.exp()) == pytest.approx(0.2)


def test_box_actions_respect_bounds_and_greedy_is_repeatable() -> None:
    algo = SAC(OBS, spaces.Box(np.array([0, -5], np.float32), np.array([1, 5], np.float32)))
    obs = torch.rand(256, 3) * 2 - 1
    actions = algo.act(obs).actions
    assert actions.shape == (256, 2)
    assert (actions[:, 0] >= 0).all()
    assert (actions[:, 0] <= 1).all()
    assert (actions[:, 1].abs() <= 5).all()
    assert torch.equal(
        algo.act(obs, deterministic=True).actions, algo.act(obs, deterministic=True).actions
    )


def test_refuses_multibinary_actions() -> None:
    with pytest.raises(EnvSpecError, match=r"sac does not support action space MultiBinary\(3\)"):
        SAC(OBS, spaces.MultiBinary(3))


def test_discrete_spaces_that_do_not_start_at_zero() -> None:
    """``act`` gives indices; the env gets them shifted by ``start`` once."""
    algo = SAC(OBS, spaces.Discrete(3, start=5))
    indices = algo.act(torch.zeros(512, 3)).actions
    assert set(indices.tolist()) == {0, 1, 2}
    assert set(algo.env_actions(indices).tolist()) == {5, 6, 7}


def _image_trainer(steps: int, seed: int = 0) -> Any:
    """Discrete SAC with the Nature CNN and linear heads on BrightSide (36x36 uint8 frames:
    a bright square on the left or the right; reward 1 for naming its side)."""
    config = validate(
        SACConfig,
        {
            "hidden_sizes": [],
            "learning_starts": 256,
            "batch_size": 64,
            "buffer_size": 4096,
            "train_freq": 4,
            "gamma": 0.0,
        },
        "sac",
    )
    return bright_side_trainer(SAC, config, steps, seed)


@pytest.mark.slow
def test_discrete_learns_from_images_with_a_cnn() -> None:
    # Random play scores 0.5; actor and critics see only the pixels.
    trainer = _image_trainer(3072)
    score = trainer.run().best_score
    assert score >= 0.9, score


def test_images_go_through_a_cnn_of_the_actor_and_one_the_twin_critics_share(
    tmp_path: Path,
) -> None:
    # The same seed trains the same parameters; a checkpoint brings back the same actions.
    algo = assert_bright_side_run_repeats_and_round_trips(lambda: _image_trainer(512), tmp_path)
    actor_cnn, critic_cnn, target_cnn = algo.actor[0], algo.critic[0], algo.critic_target[0]
    assert all(isinstance(cnn, ImageEncoder) for cnn in (actor_cnn, critic_cnn, target_cnn))
    assert len({id(actor_cnn), id(critic_cnn), id(target_cnn)}) == 3
    # The critics' loss trains the critics' CNN, the actor's loss the actor's.
    assert not torch.equal(actor_cnn.cnn.convs[0].weight, critic_cnn.cnn.convs[0].weight)


def test_binary_grids_go_through_the_minatar_cnn_only_when_asked() -> None:
    grid = spaces.Box(0, 1, (10, 10, 4), np.bool_)
    flat = SAC(grid, spaces.Discrete(3), SACConfig(hidden_sizes=(32,)))
    assert not flat.encoded
    assert flat.actor[0].in_features == 400
    cnn = SAC(grid, spaces.Discrete(3), SACConfig(cnn="minatar", hidden_sizes=()), seed=3)
    assert isinstance(cnn.actor[0], GridEncoder)
    assert isinstance(cnn.critic[0], GridEncoder)
    obs = np.random.default_rng(0).integers(0, 2, (6, 10, 10, 4)).astype(np.bool_)
    assert cnn.predict(obs).shape == (6,)
    # Box actions flatten the grids whatever the cnn.
    box = SAC(grid, spaces.Box(-1, 1, (2,), np.float32), SACConfig(cnn="minatar"))
    assert not box.encoded


def test_images_with_box_actions_are_refused_naming_the_algorithms_that_take_them() -> None:
    image = spaces.Box(0, 255, (36, 36, 1), np.uint8)
    with pytest.raises(
        EnvSpecError,
        match=r"sac takes image observations with Discrete actions only; got observation "
        r"space Box\(shape=\(36, 36, 1\), uint8\) with action space Box\(shape=\(2,\), "
        r"float32\)\. Algorithms for images with Box actions: a2c, appo, impala, ppo, trpo$",
    ):
        SAC(image, spaces.Box(-1, 1, (2,), np.float32))
