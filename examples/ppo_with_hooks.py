"""Train PPO on CartPole with the trainer's hooks, then evaluate the best policy.

python examples/ppo_with_hooks.py --max-steps 50000
"""

from __future__ import annotations

import argparse

import torch

import rlfleet
from rlfleet.collect.evaluator import Evaluator
from rlfleet.types import EvalStats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-steps", type=int, default=50_000)
    args = parser.parse_args()
    torch.set_num_threads(1)

    envs = rlfleet.make_vec_env("CartPole-v1", 8, seed=0)
    test_envs = rlfleet.make_vec_env("CartPole-v1", 10)
    algo = rlfleet.PPO(
        envs.single_observation_space,
        envs.single_action_space,
        rlfleet.PPOConfig(
            num_steps=32, num_epochs=10, learning_rate=2e-3, gamma=0.98, gae_lambda=0.8
        ),
        seed=0,
    )

    def worst_case_score(stats: EvalStats) -> float:
        # Rank policies by their worst test episode rather than the mean.
        return float(stats.returns.min())

    trainer = rlfleet.OnPolicyTrainer(
        algo,
        envs,
        test_envs,
        rlfleet.TrainerConfig(max_steps=args.max_steps, epoch_num_steps=4096, show_progress=True),
        seed=0,
        compute_score_fn=worst_case_score,
        stop_fn=lambda score: score >= 500,
        test_fn=lambda epoch, step: print(f"testing at epoch {epoch}, step {step:,}"),
    )
    result = trainer.run()
    print(f"stopped by {result.stop_reason} after {result.env_steps:,} steps")
    print(f"best worst-case test return: {result.best_score}")
    stats = Evaluator(test_envs, algo, seed=123).run(20)
    print(f"final policy: mean return {stats.mean:.1f} over 20 episodes")


if __name__ == "__main__":
    main()
