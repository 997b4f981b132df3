"""PPO: learning at a fixed seed and budget, and the options that change its update."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos import PPO, PPOConfig
from rlfleet.collect.evaluator import Evaluator
from rlfleet.config.loader import validate
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import load_algorithm, make_trainer, train

QUIET = {"show_progress": False, "verbose": False}


def _cfg(env_id: str, **overrides: Any) -> Any:
    trainer = {**QUIET, **overrides.pop("trainer", {})}
    return default_run_config("ppo", env_id, {"trainer": trainer, **overrides})


@pytest.mark.slow
def test_ppo_solves_cartpole(tmp_path: Path) -> None:
    # Over seeds 0-7 at 60k steps the preset reached 475 on all 8 on the default numerics
    # path and on 7 with ATEN_CPU_CAPABILITY=default (seed 0 there: best 360), so a second
    # seed is tried when the first misses; a learner that does not learn fails both.
    for seed in (0, 1):
        cfg = _cfg("CartPole-v1", seed=seed, trainer={"max_steps": 60_000, "target_reward": 475})
        result = train(cfg, tmp_path / "run", force=True)
        if result.best_score >= 475:
            break
    assert result.best_score >= 475, result
    # The saved best policy plays at a solved level on 20 fresh test episodes. Not >= 475
    # again: the best of several noisy test steps regresses towards its mean when re-drawn
    # (471.9 on one numerics path), while a policy that is not the best one scores far lower.
    algo, _ = load_algorithm(tmp_path / "run")
    envs = make_vec_env("CartPole-v1", 10)
    stats = Evaluator(envs, algo, seed=2024).run(20)
    assert stats.returns.size == 20
    assert stats.mean >= 400


@pytest.mark.slow
def test_continuous_ppo_improves_on_pendulum() -> None:
    trainer = {"max_steps": 61_440, "epoch_num_steps": 20_480, "target_reward": -400}
    result = make_trainer(_cfg("Pendulum-v1", seed=0, trainer=trainer), None).run()
    # A random policy scores about -1200; the first test is taken after 20k steps.
    assert result.best_score >= -400, result


def test_obs_normalizer_learns_in_training_and_is_frozen_in_evaluation() -> None:
    cfg = _cfg(
        "CartPole-v1",
        hyperparameters={"normalize_obs": True, "num_steps": 16, "num_epochs": 1, "batch_size": 64},
        env={"num_envs": 4, "num_test_envs": 2},
        trainer={"max_steps": 256, "epoch_num_steps": 256, "test_step_num_episodes": 2},
    )
    trainer = make_trainer(cfg, None)
    trainer.run()
    normalizer = trainer.algorithm.obs_normalizer
    assert normalizer is not None
    count = float(normalizer.count)
    assert count >= 256
    Evaluator(trainer.test_envs, trainer.algorithm, seed=0).run(2)
    assert float(normalizer.count) == count


def test_target_kl_stops_the_epochs_early() -> None:
    obs_space = spaces.Box(-1, 1, (4,), np.float32)
    algo = PPO(
        obs_space, spaces.Discrete(2), PPOConfig(num_epochs=10, target_kl=1e-9, batch_size=32)
    )
    from rlfleet.data.rollout import RolloutStorage

    storage = RolloutStorage(16, 4, (4,), (), action_dtype=torch.int64)
    storage.obs.uniform_(-1, 1)
    storage.rewards.uniform_(0, 1)
    storage.valid.fill_(1)
    step = algo.act(storage.obs.reshape(64, 4))
    storage.actions.copy_(step.actions.reshape(16, 4))
    assert step.log_probs is not None
    assert step.values is not None
    storage.log_probs.copy_(step.log_probs.reshape(16, 4))
    storage.values.copy_(step.values.reshape(16, 4))
    metrics = algo.update(storage)
    # One epoch of 2 minibatches, then the KL check stops it.
    assert metrics["train/gradient_steps_per_update"] == 2


def test_linear_schedules_follow_progress() -> None:
    algo = PPO(
        spaces.Box(-1, 1, (4,), np.float32),
        spaces.Discrete(2),
        PPOConfig(learning_rate=1e-3, lr_schedule="linear", clip_range_schedule="linear"),
    )
    from rlfleet.data.rollout import RolloutStorage

    storage = RolloutStorage(8, 32, (4,), (), action_dtype=torch.int64)
    storage.valid.fill_(1)
    algo.set_progress(0.75)
    metrics = algo.update(storage, num_repetitions=1)
    assert metrics["train/learning_rate"] == pytest.approx(2.5e-4)
    assert metrics["train/clip_range"] == pytest.approx(0.05)


def test_a_linear_entropy_schedule_reaches_zero_at_the_end() -> None:
    from rlfleet.data.rollout import RolloutStorage

    storage = RolloutStorage(8, 32, (4,), (), action_dtype=torch.int64)
    storage.valid.fill_(1)
    storage.obs.copy_(torch.randn(storage.obs.shape, generator=torch.Generator().manual_seed(0)))
    storage.rewards.copy_(torch.linspace(-1, 1, storage.rewards.numel()).view_as(storage.rewards))

    def trained(**config: Any) -> list[torch.Tensor]:
        algo = PPO(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2), PPOConfig(**config))
        algo.set_progress(1.0)
        algo.update(storage, num_repetitions=1)
        return [p.detach().clone() for p in algo.net.parameters()]

    decayed = trained(ent_coef=0.5, ent_coef_schedule="linear")
    without = trained(ent_coef=0.0)
    constant = trained(ent_coef=0.5)
    assert all(torch.equal(a, b) for a, b in zip(decayed, without, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(decayed, constant, strict=True))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("learning_rate", -1.0, "learning_rate"),
        ("gamma", 1.5, "gamma"),
        ("batch_size", 0, "batch_size"),
        ("lr_schedule", "cosine", "lr_schedule"),
        ("hidden_sizes", [64, -1], "hidden_sizes"),
        ("time_horizon", 0, "time_horizon"),
    ],
)
def test_invalid_hyperparameters_are_refused(field: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(PPOConfig, {field: value}, "ppo")


def test_unknown_hyperparameter_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        validate(PPOConfig, {"learning_rat": 1e-3}, "ppo")


def _ppo_trainer(hyperparameters: dict[str, Any], env_id: str = "CartPole-v1") -> Any:
    return make_trainer(
        _cfg(
            env_id,
            seed=3,
            hyperparameters={
                "num_steps": 32,
                "batch_size": 64,
                "num_epochs": 3,
                "learning_rate": 3e-3,
                **hyperparameters,
            },
            env={"num_envs": 4, "num_test_envs": 1},
            trainer={
                "max_steps": 1024,
                "epoch_num_steps": 1024,
                "test_step_num_episodes": 1,
                "target_reward": None,
            },
        ),
        None,
    )


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"ent_coef": 0.01},
        {"clip_range_vf": 0.2, "ent_coef": 0.01, "activation": "relu"},
        {"clip_range_vf": 0.05, "target_kl": 0.5, "hidden_sizes": []},
        {"normalize_obs": True, "normalize_reward": True, "max_grad_norm": 100.0},
        {"batch_size": 128, "num_epochs": 2, "hidden_sizes": [16, 8, 8], "clip_range": 0.05},
    ],
)
def test_written_out_backward_gives_autograds_parameters(flags: dict[str, Any]) -> None:
    # The update's gradients come from PlainTwinMLP's kernels and the loss's gradient
    # formulas written out, not from loss.backward(): the trained parameters and the logged
    # statistics must be bitwise those of the autograd update.
    def train(written_out: bool) -> tuple[torch.Tensor, dict[str, float]]:
        trainer = _ppo_trainer(flags)
        algo = trainer.algorithm
        assert algo._plain_twin is not None
        if not written_out:
            algo._plain_twin = None
        metrics: dict[str, float] = {}
        update = algo.update

        def logged(*args: Any, **kwargs: Any) -> dict[str, float]:
            metrics.update(update(*args, **kwargs))
            return metrics

        algo.update = logged
        result = trainer.run()
        assert result.gradient_steps >= 16
        return algo.parameters_vector(), metrics

    (mine, my_metrics), (theirs, their_metrics) = train(True), train(False)
    assert torch.equal(mine, theirs)
    assert my_metrics == their_metrics


def test_written_out_path_covers_only_what_it_can_differentiate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlfleet.nn.compile import INDUCTOR_CACHE_ENV

    obs = spaces.Box(-1, 1, (4,), np.float32)
    assert PPO(obs, spaces.Discrete(3), PPOConfig())._plain_twin is not None
    for action_space, config in [
        (spaces.Box(-1, 1, (2,), np.float32), PPOConfig()),
        (spaces.MultiDiscrete([2, 3]), PPOConfig()),
        (spaces.Discrete(3), PPOConfig(lstm_hidden_size=8)),
        (spaces.Discrete(3), PPOConfig(activation="elu")),
    ]:
        assert PPO(obs, action_space, config)._plain_twin is None, (action_space, config)
    images = spaces.Box(0, 255, (36, 36, 1), np.uint8)
    assert PPO(images, spaces.Discrete(3), PPOConfig())._plain_twin is None
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path))  # compile_update points it there
    compiled = PPO(obs, spaces.Discrete(3), PPOConfig())
    compiled.compile_update()  # torch.compile wraps lazily: nothing is compiled here
    assert compiled._plain_twin is None


@pytest.mark.parametrize("why", ["bf16", "hook", "mask"])
def test_bf16_products_hooks_and_action_masks_take_autograd(
    why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under bf16 products the matmuls must go through precision's interception, a hook must
    # run, and masked logits need their masking's gradient: the written-out path does none
    # of these, so those updates take autograd.
    import rlfleet.algos.ppo as ppo_module
    from rlfleet.data.rollout import RolloutStorage

    algo = PPO(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(3), PPOConfig(batch_size=32))
    storage = RolloutStorage(16, 4, (4,), (), action_dtype=torch.int64)
    mask = torch.ones(4, 3, dtype=torch.bool) if why == "mask" else None
    for t in range(16):
        obs = torch.rand(4, 4) * 2 - 1
        storage.insert(
            t,
            obs,
            algo.act(obs, action_mask=mask),
            np.ones(4, np.float32),
            np.zeros(4, bool),
            np.zeros(4, bool),
            np.ones(4, np.float32),
            mask=mask,
        )
    storage.set_length(16)
    storage.next_obs.uniform_(-1, 1)
    hooked: list[bool] = []
    if why == "bf16":
        monkeypatch.setattr(ppo_module, "bf16_products_active", lambda: True)
    elif why == "hook":
        algo.net.twin.weights[0].register_hook(lambda grad: hooked.append(True))

    def refuse(*_: Any) -> None:
        raise AssertionError("the written-out path ran")

    monkeypatch.setattr(algo, "_written_out_losses", refuse)
    algo.update(storage, num_repetitions=1)
    assert algo.gradient_steps == 2
    assert algo._plain_twin is not None
    assert hooked == ([True, True] if why == "hook" else [])
