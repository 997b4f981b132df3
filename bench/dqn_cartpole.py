"""DQN on CartPole-v1: rlfleet vs Stable-Baselines3, side by side in one invocation.

Two modes (both by default):

``--mode identical``
    RL-Zoo's CartPole DQN hyperparameters in both libraries (50k steps, learning rate
    2.3e-3, batch 64, buffer 100k, learning_starts 1000, gamma 0.99, train_freq 256,
    gradient_steps 128, exploration_fraction 0.16, exploration_final_eps 0.04, 256x256 MLP).
    RL-Zoo's ``target_update_interval: 10`` counts env steps in SB3; with ``train_freq`` 256
    it copies the target once between two blocks of 128 gradient steps, which is rlfleet's
    ``target_update_interval: 128`` (rlfleet counts gradient steps): the same schedule. Runs
    alternate between the libraries; both use ``torch.set_num_threads(--threads)``, and SB3
    runs once more at torch's default thread count. Training wall time excludes evaluation.
    Prints the wall-time ratio, the env-steps/s ratio and both final returns (20 greedy
    episodes).
``--mode solve``
    Wall time until the mean evaluation return first reaches 475, each library with its own
    preset: rlfleet's shipped ``dqn`` preset for CartPole-v1, SB3 with RL-Zoo's preset and an
    evaluation callback every 2,048 steps. Evaluation time excluded from both.

Results go to ``bench/results/dqn_cartpole.parquet`` and ``.md``. Needs the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from offpolicy_common import (
    report,
    rlfleet_run,
    sb3_final_return,
    sb3_timed_eval,
)

RESULTS = Path(__file__).parent / "results"
BUDGET = 50_000
TARGET = 475.0
EVAL_EPISODES = 20
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


def rlfleet_identical(seed: int) -> dict[str, Any]:
    return rlfleet_run(
        "dqn",
        "CartPole-v1",
        seed,
        mode="identical",
        hyperparameters=ZOO_RLFLEET,
        max_steps=BUDGET,
        eval_episodes=EVAL_EPISODES,
        num_envs=1,
    )


def sb3_identical(seed: int, threads: int | None) -> dict[str, Any]:
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        env = sb3_make_vec_env("CartPole-v1", n_envs=1, seed=seed)
        model = DQN("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **ZOO_SB3)
        t0, cpu0 = time.perf_counter(), time.process_time()
        model.learn(BUDGET)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        final = sb3_final_return(model, "CartPole-v1", EVAL_EPISODES)
    finally:
        torch.set_num_threads(previous)
    return {
        "library": "sb3" if threads is not None else "sb3 (default threads)",
        "mode": "identical",
        "seed": seed,
        "train_s": wall,
        "cpu_s": cpu,
        "env_steps": model.num_timesteps,
        "final_return": final,
    }


def rlfleet_solve(seed: int) -> dict[str, Any]:
    return rlfleet_run(
        "dqn",
        "CartPole-v1",
        seed,
        mode="solve",
        target=TARGET,
        eval_episodes=EVAL_EPISODES,
    )


def sb3_solve(seed: int) -> dict[str, Any]:
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import StopTrainingOnRewardThreshold
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env

    env = sb3_make_vec_env("CartPole-v1", n_envs=1, seed=seed)
    eval_env = sb3_make_vec_env("CartPole-v1", n_envs=1, seed=999)
    model = DQN("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **ZOO_SB3)
    stop = StopTrainingOnRewardThreshold(reward_threshold=TARGET, verbose=0)
    callback = sb3_timed_eval(
        eval_env, n_eval_episodes=EVAL_EPISODES, eval_freq=2048, callback_on_new_best=stop
    )
    t0, cpu0 = time.perf_counter(), time.process_time()
    model.learn(BUDGET * 2, callback=callback)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 - callback.eval_cpu_s
    return {
        "library": "sb3",
        "mode": "solve",
        "seed": seed,
        "train_s": wall - callback.eval_s,
        "cpu_s": cpu,
        "env_steps": model.num_timesteps,
        "final_return": float(callback.best_mean_reward),
        "solved": bool(callback.best_mean_reward >= TARGET),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=["identical", "solve", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=3, help="runs per library and mode")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both libraries")
    parser.add_argument(
        "--results", default="dqn_cartpole", help="file stem of the results in bench/results/"
    )
    parser.add_argument(
        "--no-default-threads", action="store_true", help="skip SB3 at torch's default threads"
    )
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    rows: list[dict[str, Any]] = []
    modes = ["identical", "solve"] if args.mode == "both" else [args.mode]
    for mode in modes:
        for seed in range(args.repeats):
            if mode == "identical":
                runs = [lambda s: rlfleet_identical(s), lambda s: sb3_identical(s, args.threads)]
                if not args.no_default_threads:
                    runs.append(lambda s: sb3_identical(s, None))
            else:
                runs = [rlfleet_solve, sb3_solve]
            for run in runs:  # alternate, so drift in machine load hits both
                row = run(seed)
                row["steps_per_s"] = row["env_steps"] / row["train_s"]
                if "cpu_s" in row:
                    row["cpu_steps_per_s"] = row["env_steps"] / row["cpu_s"]
                rows.append(row)
                print(
                    f"{mode:9s} {row['library']:22s} seed {seed}: {row['train_s']:6.2f} s, "
                    f"{row['steps_per_s']:8.0f} steps/s, return {row['final_return']:.1f}",
                    flush=True,
                )
    text = report(
        "DQN CartPole-v1",
        rows,
        args,
        identical_title=f"identical hyperparameters (RL-Zoo), {BUDGET // 1000}k steps",
        solve_title=f"time to mean eval return >= {TARGET:.0f}, own presets",
        default_threads=default_threads,
    )
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / f"{args.results}.parquet")
    (RESULTS / f"{args.results}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
