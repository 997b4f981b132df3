"""PPO on CartPole-v1: rlfleet vs Stable-Baselines3, whole processes side by side.

``identical``: RL-Zoo's CartPole PPO hyperparameters in both libraries (8 envs, n_steps 32,
batch 256, gae_lambda 0.8, gamma 0.98, 20 epochs, learning rate linear from 1e-3, clip
range linear from 0.2, no entropy bonus, 64x64 tanh MLPs, 100k steps), then 20 greedy
evaluation episodes. Each steps its 8 envs its default way: rlfleet with gymnasium's native
``CartPoleVectorEnv`` (vector mode ``auto``), SB3 with its ``DummyVecEnv``.

``solve``: until the mean evaluation return first reaches 475, rlfleet's shipped ``ppo``
preset for CartPole-v1 against SB3 with RL-Zoo's preset and an evaluation every 2,048 steps.

How the runs are timed: ``bench/compare.py`` and ``bench/harness.py``. Results go to
``bench/results/ppo_cartpole.parquet`` and ``.md``. Needs the ``bench`` extra.
"""

from __future__ import annotations

from collections.abc import Callable

from compare import Comparison, main


def linear(start: float) -> Callable[[float], float]:
    """SB3's linear schedule: ``start`` times the remaining fraction of training."""
    return lambda remaining: remaining * start


SPEC = Comparison(
    title="PPO CartPole-v1",
    algo="ppo",
    env_id="CartPole-v1",
    budget=100_000,
    solve_budget=100_000,
    target=475.0,
    eval_episodes=20,
    sb3_eval_freq=2048,
    num_envs=8,
    rlfleet_hyperparameters={
        "num_steps": 32,
        "batch_size": 256,
        "num_epochs": 20,
        "gamma": 0.98,
        "gae_lambda": 0.8,
        "learning_rate": 1e-3,
        "lr_schedule": "linear",
        "clip_range": 0.2,
        "clip_range_schedule": "linear",
        "ent_coef": 0.0,
    },
    sb3_hyperparameters={
        "n_steps": 32,
        "batch_size": 256,
        "n_epochs": 20,
        "gamma": 0.98,
        "gae_lambda": 0.8,
        "learning_rate": linear(1e-3),
        "clip_range": linear(0.2),
        "ent_coef": 0.0,
    },
    results="ppo_cartpole",
)

if __name__ == "__main__":
    main(SPEC, __doc__)
