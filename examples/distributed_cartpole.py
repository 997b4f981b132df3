"""Train IMPALA on CartPole-v1 with four Ray rollout actors, then evaluate it.

Ray starts a local cluster by itself; pass ``ray_address="auto"`` (or
``"ray://HEAD:10001"``) to use an existing one. Needs ``pip install 'rlfleet[ray]'``.
"""

from __future__ import annotations

from rlfleet import DistributedAgent


def main() -> None:
    agent = DistributedAgent("CartPole-v1", tag="impala-cartpole", num_actors=4, num_steps=32)
    result = agent.train(
        num_train_steps=400_000, eval_interval=20_000, save_interval=40_000, target_reward=475
    )
    stats = agent.eval(num_eval_episodes=20)
    print(f"run directory: {result.run_dir}")
    print(f"mean test return over 20 episodes: {stats.mean:.1f} ± {stats.std:.1f}")


if __name__ == "__main__":
    main()
