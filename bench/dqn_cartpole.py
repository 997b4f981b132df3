"""DQN on CartPole-v1: rlfleet vs Stable-Baselines3, whole processes side by side.

``identical``: RL-Zoo's CartPole DQN hyperparameters in both libraries (50k steps, learning
rate 2.3e-3, batch 64, buffer 100k, learning_starts 1000, gamma 0.99, train_freq 256,
gradient_steps 128, exploration_fraction 0.16, exploration_final_eps 0.04, 256x256 MLP),
then 20 greedy evaluation episodes. RL-Zoo's ``target_update_interval: 10`` counts env
steps in SB3; with ``train_freq`` 256 it copies the target once between two blocks of 128
gradient steps, which is rlfleet's ``target_update_interval: 128`` (rlfleet counts gradient
steps): the same schedule.

``solve``: until the mean evaluation return first reaches 475, rlfleet's shipped ``dqn``
preset for CartPole-v1 against SB3 with RL-Zoo's preset and an evaluation every 2,048 steps.

How the runs are timed: ``bench/compare.py`` and ``bench/harness.py``. Results go to
``bench/results/dqn_cartpole.parquet`` and ``.md``. Needs the ``bench`` extra.
"""

from __future__ import annotations

from compare import Comparison, main

ZOO_RLFLEET = {
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1000,
    "gamma": 0.99,
    "target_update_interval": 128,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "hidden_sizes": [256, 256],
}
ZOO_SB3 = {
    "learning_rate": 2.3e-3,
    "batch_size": 64,
    "buffer_size": 100_000,
    "learning_starts": 1000,
    "gamma": 0.99,
    "target_update_interval": 10,
    "train_freq": 256,
    "gradient_steps": 128,
    "exploration_fraction": 0.16,
    "exploration_final_eps": 0.04,
    "policy_kwargs": {"net_arch": [256, 256]},
}

SPEC = Comparison(
    title="DQN CartPole-v1",
    algo="dqn",
    env_id="CartPole-v1",
    budget=50_000,
    solve_budget=100_000,
    target=475.0,
    eval_episodes=20,
    sb3_eval_freq=2048,
    num_envs=1,
    rlfleet_hyperparameters=ZOO_RLFLEET,
    sb3_hyperparameters=ZOO_SB3,
    results="dqn_cartpole",
)

if __name__ == "__main__":
    main(SPEC, __doc__)
