"""Behavioral cloning beside the RL loss: the loss, its decay, the trainers that apply it,
checkpoints, and the run config that turns it on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos.dqn import DQN
from rlfleet.algos.kinds import ImitationPolicy
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.algos.registry import get_algorithm, list_algorithms
from rlfleet.algos.sac import SAC, SACConfig
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError, NonFiniteError
from rlfleet.logging.history import read_history
from rlfleet.nn.optim import NanPolicy
from rlfleet.rewards.demonstrations import (
    Demonstrations,
    record_demonstrations,
    save_demonstrations,
)
from rlfleet.runs.config import default_run_config, run_config_from_dict, run_config_to_dict
from rlfleet.runs.run import make_trainer
from rlfleet.train.behavioral_cloning import BehavioralCloning, BehavioralCloningSettings
from rlfleet.train.loop import TrainerConfig
from rlfleet.train.trainer import OffPolicyTrainer, OnPolicyTrainer
from tests.nan_injection import assert_unchanged, nan_gradients, nan_outputs, optimizer_state

QUIET = TrainerConfig(verbose=False, show_progress=False)


def _balance(obs: np.ndarray) -> int:
    """A scripted CartPole controller that keeps the pole up for 500 steps."""
    return int(obs[2] + 0.5 * obs[3] > 0)


@pytest.fixture(scope="module")
def cartpole_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    demos, returns = record_demonstrations(gym.make("CartPole-v1"), _balance, num_episodes=2)
    assert min(returns) == 500.0
    path = tmp_path_factory.mktemp("demos") / "cartpole.npz"
    save_demonstrations(path, demos)
    return path


@pytest.fixture(scope="module")
def pendulum_demos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    theta = rng.uniform(-np.pi, np.pi, 512)
    obs = np.stack([np.cos(theta), np.sin(theta), rng.uniform(-8, 8, 512)], 1).astype(np.float32)
    actions = np.clip(-2.0 * np.sin(theta), -2, 2).astype(np.float32).reshape(-1, 1)
    path = tmp_path_factory.mktemp("demos") / "pendulum.npz"
    save_demonstrations(path, Demonstrations(obs, actions))
    return path


def _ppo(**config: Any) -> PPO:
    env = gym.make("CartPole-v1")
    return PPO(env.observation_space, env.action_space, PPOConfig(**config), seed=0)


def _agreement(algo: PPO, path: Path) -> float:
    """How often the greedy policy takes the demonstrated action."""
    with np.load(path) as data:
        obs, actions = torch.from_numpy(data["observations"]), data["actions"]
    chosen = algo.act(algo.preprocess(obs), deterministic=True).actions.numpy()
    return float(np.mean(chosen == actions))


def _cloning(
    algorithm: str, cartpole_demos: Path, pendulum_demos: Path, **ppo: Any
) -> tuple[PPO | SAC, BehavioralCloning]:
    """PPO on CartPole's demonstrations (``ppo``: more of its config) or SAC on Pendulum's,
    minibatches of 64, and its cloning step."""
    if algorithm == "ppo":
        algo: PPO | SAC = _ppo(batch_size=64, num_epochs=2, **ppo)
        path = cartpole_demos
    else:
        env = gym.make("Pendulum-v1")
        algo = SAC(env.observation_space, env.action_space, SACConfig(batch_size=64), seed=0)
        path = pendulum_demos
    return algo, BehavioralCloning(BehavioralCloningSettings(str(path)), algo, seed=0)


@pytest.mark.parametrize("algorithm", ["ppo", "sac"])
def test_the_loss_decreases_on_the_demonstrations(
    algorithm: str, cartpole_demos: Path, pendulum_demos: Path
) -> None:
    _, cloning = _cloning(algorithm, cartpole_demos, pendulum_demos, learning_rate=1e-3)
    losses = [cloning.update(0)["bc/loss"] for _ in range(8)]
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("injection", ["loss", "gradient"])
@pytest.mark.parametrize("nan_policy", ["raise", "skip_batch"])
@pytest.mark.parametrize("algorithm", ["ppo", "sac"])
def test_a_non_finite_cloning_step_follows_the_algorithms_nan_policy(
    algorithm: str, nan_policy: NanPolicy, injection: str, cartpole_demos: Path,
    pendulum_demos: Path,
) -> None:  # fmt: skip
    algo, cloning = _cloning(algorithm, cartpole_demos, pendulum_demos)
    cloning.update(0)  # optimiser state to compare
    algo.nan_policy = nan_policy
    skipped = algo.skipped_batches
    params = [p.detach().clone() for p in cloning.parameters]
    state = optimizer_state([cloning.optimizer])
    if injection == "loss":
        nan_outputs(algo.modules().values())
    else:
        nan_gradients(cloning.parameters)
    if nan_policy == "raise":
        with pytest.raises(NonFiniteError, match="non-finite"):
            cloning.update(0)
    else:
        cloning.update(0)
        assert algo.skipped_batches > skipped
    assert_unchanged(params, [p.detach() for p in cloning.parameters], "weights")
    assert_unchanged(state, optimizer_state([cloning.optimizer]), "optimizer state")


def test_ppo_and_sac_can_clone_and_the_other_algorithms_cannot() -> None:
    cloners = {n for n in list_algorithms() if issubclass(get_algorithm(n), ImitationPolicy)}
    assert cloners == {"ppo", "sac"}
    assert isinstance(_ppo(), ImitationPolicy)


def test_strength_decays_linearly_to_zero_over_steps_then_cloning_stops(
    cartpole_demos: Path,
) -> None:
    algo = _ppo(learning_rate=1e-3, batch_size=64)
    settings = BehavioralCloningSettings(str(cartpole_demos), strength=0.5, steps=1000)
    cloning = BehavioralCloning(settings, algo)
    assert cloning.strength(0) == 0.5
    assert cloning.strength(250) == pytest.approx(0.375)
    assert cloning.learning_rate(250) == pytest.approx(1e-3 * 0.375)
    assert cloning.strength(5000) == 0.0
    before = [p.clone() for p in algo.net.parameters()]
    assert cloning.update(1000) == {"bc/strength": 0.0}
    assert all(torch.equal(a, b) for a, b in zip(before, algo.net.parameters(), strict=True))
    metrics = cloning.update(500)
    assert metrics["bc/strength"] == pytest.approx(0.25)
    assert cloning.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3 * 0.25)
    constant = BehavioralCloning(BehavioralCloningSettings(str(cartpole_demos)), algo)
    assert constant.strength(10**9) == 1.0


def test_samples_per_update_caps_the_minibatches_of_a_pass(cartpole_demos: Path) -> None:
    algo = _ppo(batch_size=64, num_epochs=3)
    settings = BehavioralCloningSettings(str(cartpole_demos), samples_per_update=128)
    cloning = BehavioralCloning(settings, algo)
    steps = 0

    def count(*_: Any, **__: Any) -> None:
        nonlocal steps
        steps += 1

    cloning.optimizer.register_step_post_hook(count)
    cloning.update(0)
    assert (cloning.batch_size, cloning.num_epoch) == (64, 3)  # the algorithm's own
    assert steps == 3 * 2  # 3 epochs of 128 // 64 minibatches


def test_an_ml_agents_demo_file_and_an_algorithm_without_the_loss_are_refused(
    cartpole_demos: Path,
) -> None:
    with pytest.raises(ConfigError, match=r"ML-Agents \.demo file.*expected an \.npz"):
        BehavioralCloning(BehavioralCloningSettings("ExpertPyramid.demo"), _ppo())
    env = gym.make("CartPole-v1")
    dqn = DQN(env.observation_space, env.action_space)
    with pytest.raises(ConfigError, match="dqn has no imitation loss"):
        BehavioralCloning(BehavioralCloningSettings(str(cartpole_demos)), dqn)
    with pytest.raises(ConfigError, match="recurrent policy"):
        BehavioralCloning(
            BehavioralCloningSettings(str(cartpole_demos)),
            _ppo(lstm_hidden_size=8, num_steps=8),
        )
    data = {**run_config_to_dict(default_run_config("ppo", "CartPole-v1"))}
    with pytest.raises(ConfigError, match=r"behavioral_cloning\.demo_path.*ML-Agents \.demo"):
        run_config_from_dict({**data, "behavioral_cloning": {"demo_path": "x.demo"}}, "cfg")
    dqn_data = run_config_to_dict(default_run_config("dqn", "CartPole-v1"))
    with pytest.raises(ConfigError, match=r"imitation loss.*not dqn"):
        run_config_from_dict(
            {**dqn_data, "behavioral_cloning": {"demo_path": str(cartpole_demos)}}, "cfg"
        )
    with pytest.raises(ConfigError, match="strength"):
        run_config_from_dict(
            {**data, "behavioral_cloning": {"demo_path": "d.npz", "strength": -1}}, "cfg"
        )


def _ppo_run(max_steps: int, cloning: BehavioralCloningSettings | None) -> PPO:
    envs = make_vec_env("CartPole-v1", 4, seed=0)
    algo = PPO(
        envs.single_observation_space,
        envs.single_action_space,
        PPOConfig(num_steps=64, batch_size=64, num_epochs=2, learning_rate=1e-3),
        seed=0,
    )
    config = TrainerConfig(
        max_steps=max_steps, epoch_num_steps=max_steps, verbose=False, show_progress=False
    )
    bc = None if cloning is None else BehavioralCloning(cloning, algo, seed=0)
    OnPolicyTrainer(algo, envs, None, config, behavioral_cloning=bc).run()
    return algo


def test_ppo_with_cloning_acts_more_like_the_demonstrator(cartpole_demos: Path) -> None:
    settings = BehavioralCloningSettings(str(cartpole_demos), batch_size=64, num_epoch=10)
    with_cloning = _agreement(_ppo_run(2048, settings), cartpole_demos)
    without = _agreement(_ppo_run(2048, None), cartpole_demos)
    assert with_cloning > 0.9
    assert with_cloning > without + 0.1, (with_cloning, without)


def test_the_off_policy_trainer_clones_after_its_gradient_steps(pendulum_demos: Path) -> None:
    envs = make_vec_env("Pendulum-v1", 1, seed=0)
    algo = SAC(
        envs.single_observation_space,
        envs.single_action_space,
        SACConfig(batch_size=32, learning_starts=64, hidden_sizes=(32, 32)),
        seed=0,
    )
    settings = BehavioralCloningSettings(str(pendulum_demos), samples_per_update=64)
    cloning = BehavioralCloning(settings, algo, seed=0)
    steps = 0

    def count(*_: Any, **__: Any) -> None:
        nonlocal steps
        steps += 1

    cloning.optimizer.register_step_post_hook(count)
    config = TrainerConfig(max_steps=96, epoch_num_steps=96, verbose=False, show_progress=False)
    OffPolicyTrainer(algo, envs, None, config, behavioral_cloning=cloning).run()
    # One update (num_epoch 1: SAC has no epochs) of 64 // 32 minibatches per training step
    # that took gradient steps: the 33 that end at env steps 64..96.
    assert steps == 2 * 33


def test_a_run_config_turns_it_on_logs_it_and_a_resume_keeps_its_optimizer(
    tmp_path: Path, cartpole_demos: Path
) -> None:
    data = run_config_to_dict(default_run_config("ppo", "CartPole-v1"))
    data["env"] = {**data["env"], "num_envs": 2}
    data["hyperparameters"] = {**data["hyperparameters"], "num_steps": 32, "batch_size": 64}
    data["behavioral_cloning"] = {"demo_path": str(cartpole_demos), "steps": 10_000}
    data["trainer"] = {
        **data["trainer"], "max_steps": 128, "epoch_num_steps": 64, "log_interval_steps": 64,
        "verbose": False, "show_progress": False,
    }  # fmt: skip
    cfg = run_config_from_dict(data, "cfg")
    assert run_config_from_dict(run_config_to_dict(cfg), "again") == cfg
    trainer = make_trainer(cfg, tmp_path)
    assert isinstance(trainer, OnPolicyTrainer)
    trainer.run()
    trainer.close()
    history = read_history(tmp_path / "history.parquet")
    losses = [float(row["bc/loss"] or 0) for row in history if row.get("bc/loss") is not None]
    strengths = [row["bc/strength"] for row in history if row.get("bc/strength") is not None]
    assert losses
    assert all(v > 0 for v in losses)
    assert strengths[-1] == pytest.approx(1 - 128 / 10_000)
    saved = trainer.behavioral_cloning
    assert saved is not None
    resumed = make_trainer(
        run_config_from_dict({**data, "trainer": {**data["trainer"], "max_steps": 192}}, "c"),
        tmp_path,
        resume=True,
    )
    assert isinstance(resumed, OnPolicyTrainer)
    cloning = resumed.behavioral_cloning
    assert cloning is not None
    for key, value in saved.optimizer.state_dict()["state"].items():
        restored = cloning.optimizer.state_dict()["state"][key]
        assert torch.equal(value["exp_avg"], restored["exp_avg"])
    assert torch.equal(saved.generator.get_state(), cloning.generator.get_state())
    resumed.close()
