"""SAC on Pendulum-v1: rlfleet vs Stable-Baselines3, whole processes side by side.

``identical``: RL-Zoo's Pendulum SAC hyperparameters in both libraries (20k steps unless
``--steps``, learning rate 1e-3, SB3's defaults otherwise: 256x256 MLPs, batch 256,
learning_starts 100, tau 0.005, gamma 0.99, train_freq 1, gradient_steps 1, entropy
coefficient tuned from 1.0; buffer 100k, which holds every step just as RL-Zoo's 1M does),
then 10 greedy evaluation episodes.

``solve``: until the mean evaluation return first reaches -200, rlfleet's shipped ``sac``
preset for Pendulum-v1 against SB3 with RL-Zoo's preset and an evaluation every 1,000 steps.

How the runs are timed: ``bench/compare.py`` and ``bench/harness.py``. Results go to
``bench/results/sac_pendulum.parquet`` and ``.md``. Needs the ``bench`` extra.
"""

from __future__ import annotations

from compare import Comparison, main

SHARED = {
    "learning_rate": 1e-3,
    "batch_size": 256,
    "buffer_size": 100_000,
    "learning_starts": 100,
    "gamma": 0.99,
    "tau": 0.005,
    "train_freq": 1,
    "gradient_steps": 1,
}

SPEC = Comparison(
    title="SAC Pendulum-v1",
    algo="sac",
    env_id="Pendulum-v1",
    budget=20_000,
    solve_budget=40_000,
    target=-200.0,
    eval_episodes=10,
    sb3_eval_freq=1000,
    num_envs=1,
    rlfleet_hyperparameters={**SHARED, "hidden_sizes": [256, 256]},
    sb3_hyperparameters={**SHARED, "ent_coef": "auto", "policy_kwargs": {"net_arch": [256, 256]}},
    results="sac_pendulum",
)

if __name__ == "__main__":
    main(SPEC, __doc__)
