"""SAC on Pendulum-v1: rlfleet vs Stable-Baselines3, side by side in one invocation.

Two modes (both by default):

``--mode identical``
    RL-Zoo's Pendulum SAC hyperparameters in both libraries (20k steps, learning rate 1e-3,
    SB3's defaults otherwise: 256x256 MLPs, batch 256, learning_starts 100, tau 0.005,
    gamma 0.99, train_freq 1, gradient_steps 1, entropy coefficient tuned from 1.0; buffer
    100k, which holds all 20k steps just as RL-Zoo's 1M does). Runs alternate between the
    libraries; both use ``torch.set_num_threads(--threads)``, and SB3 runs once more at
    torch's default thread count. Training wall time excludes evaluation. Prints the
    wall-time ratio, the env-steps/s ratio and both final returns (10 greedy episodes).
``--mode solve``
    Wall time until the mean evaluation return first reaches -200, each library with its
    own preset: rlfleet's shipped ``sac`` preset for Pendulum-v1, SB3 with RL-Zoo's preset
    and an evaluation callback every 1,000 steps. Evaluation time excluded from both.

``--steps`` shortens the identical mode for a quick speed reading (returns then mean
little). Results go to ``bench/results/sac_pendulum.parquet`` and ``.md``. Needs the
``bench`` extra.
"""

from __future__ import annotations

from offpolicy_common import Comparison, main

BUDGET = 20_000
TARGET = -200.0
EVAL_EPISODES = 10
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
ZOO_RLFLEET = {**SHARED, "hidden_sizes": [256, 256]}
ZOO_SB3 = {**SHARED, "ent_coef": "auto", "policy_kwargs": {"net_arch": [256, 256]}}

SPEC = Comparison(
    title="SAC Pendulum-v1",
    algo="sac",
    env_id="Pendulum-v1",
    budget=BUDGET,
    target=TARGET,
    eval_episodes=EVAL_EPISODES,
    sb3_eval_freq=1000,
    rlfleet_hyperparameters=ZOO_RLFLEET,
    sb3_hyperparameters=ZOO_SB3,
    results="sac_pendulum",
)

if __name__ == "__main__":
    main(SPEC, __doc__)
