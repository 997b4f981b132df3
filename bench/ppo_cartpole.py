"""PPO on CartPole-v1: rlfleet vs Stable-Baselines3, side by side in one invocation.

Two modes (both by default):

``--mode identical``
    RL-Zoo's CartPole PPO hyperparameters in both libraries (8 envs, n_steps 32, batch 256,
    gae_lambda 0.8, gamma 0.98, 20 epochs, learning rate linear from 1e-3, clip range linear
    from 0.2, no entropy bonus, 64x64 tanh MLPs, 100k steps). Runs alternate between the
    libraries; training wall time excludes evaluation. Prints the wall-time ratio, the
    env-steps/s ratio and both final evaluation returns (20 greedy episodes).
``--mode solve``
    Wall time of training until the mean evaluation return first reaches 475, each library
    with its own best preset: rlfleet's shipped ``ppo`` preset for CartPole-v1, SB3 with
    RL-Zoo's preset and an evaluation callback every 2,048 steps. Evaluation time excluded.

Results go to ``bench/results/ppo_cartpole.parquet`` and ``.md``. Needs the ``bench`` extra.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from rlfleet.collect.evaluator import Evaluator
from rlfleet.train.run import default_run_config, make_trainer

RESULTS = Path(__file__).parent / "results"
ZOO = {
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
}
BUDGET = 100_000
EVAL_EPISODES = 20


def rlfleet_identical(seed: int) -> dict[str, Any]:
    cfg = default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "seed": seed,
            "env": {"num_envs": 8, "vector_mode": "sync"},
            "hyperparameters": ZOO,
            "trainer": {
                "max_steps": BUDGET,
                "epoch_num_steps": BUDGET,
                "target_reward": None,
                "test_in_training": False,
                "show_progress": False,
                "verbose": False,
            },
        },
    )
    trainer = make_trainer(cfg, None)
    t0 = time.perf_counter()
    result = trainer.run()
    wall = time.perf_counter() - t0
    final = Evaluator(trainer.test_envs, trainer.algorithm, seed=999).run(EVAL_EPISODES).mean
    return {
        "library": "rlfleet",
        "mode": "identical",
        "seed": seed,
        "train_s": wall - result.test_time_s,
        "env_steps": result.env_steps,
        "final_return": final,
    }


def sb3_identical(seed: int) -> dict[str, Any]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    env = sb3_make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **_sb3_zoo())
    t0 = time.perf_counter()
    model.learn(BUDGET)
    wall = time.perf_counter() - t0
    eval_env = sb3_make_vec_env("CartPole-v1", n_envs=1, seed=999)
    final, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
    return {
        "library": "sb3",
        "mode": "identical",
        "seed": seed,
        "train_s": wall,
        "env_steps": model.num_timesteps,
        "final_return": float(final),
    }


def _sb3_zoo() -> dict[str, Any]:
    def linear(start: float) -> Any:
        return lambda remaining: remaining * start

    return {
        "n_steps": 32,
        "batch_size": 256,
        "n_epochs": 20,
        "gamma": 0.98,
        "gae_lambda": 0.8,
        "learning_rate": linear(1e-3),
        "clip_range": linear(0.2),
        "ent_coef": 0.0,
    }


def rlfleet_solve(seed: int) -> dict[str, Any]:
    cfg = default_run_config(
        "ppo",
        "CartPole-v1",
        {
            "seed": seed,
            "trainer": {
                "show_progress": False,
                "verbose": False,
                "test_step_num_episodes": EVAL_EPISODES,
            },
        },
    )
    trainer = make_trainer(cfg, None)
    t0 = time.perf_counter()
    result = trainer.run()
    wall = time.perf_counter() - t0
    solved = result.best_score >= 475
    return {
        "library": "rlfleet",
        "mode": "solve",
        "seed": seed,
        "train_s": wall - result.test_time_s,
        "env_steps": result.best_env_step if solved else result.env_steps,
        "final_return": result.best_score,
        "solved": solved,
    }


def sb3_solve(seed: int) -> dict[str, Any]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env

    env = sb3_make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    eval_env = sb3_make_vec_env("CartPole-v1", n_envs=1, seed=999)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **_sb3_zoo())

    class TimedEval(EvalCallback):
        eval_s = 0.0

        def _on_step(self) -> bool:
            t0 = time.perf_counter()
            keep_going = super()._on_step()
            if self.n_calls % self.eval_freq == 0:
                TimedEval.eval_s += time.perf_counter() - t0
            return keep_going

    stop = StopTrainingOnRewardThreshold(reward_threshold=475, verbose=0)
    callback = TimedEval(
        eval_env,
        n_eval_episodes=EVAL_EPISODES,
        eval_freq=2048 // 8,
        callback_on_new_best=stop,
        verbose=0,
    )
    t0 = time.perf_counter()
    model.learn(BUDGET, callback=callback)
    wall = time.perf_counter() - t0
    solved = callback.best_mean_reward >= 475
    return {
        "library": "sb3",
        "mode": "solve",
        "seed": seed,
        "train_s": wall - TimedEval.eval_s,
        "env_steps": model.num_timesteps,
        "final_return": float(callback.best_mean_reward),
        "solved": solved,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=["identical", "solve", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=3, help="runs per library and mode")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both libraries")
    parser.add_argument(
        "--sb3-default-threads",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time SB3 at torch's default thread count (what SB3 users get)",
    )
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    rows: list[dict[str, Any]] = []
    modes = ["identical", "solve"] if args.mode == "both" else [args.mode]
    for mode in modes:
        ours, theirs = (
            (rlfleet_identical, sb3_identical)
            if mode == "identical"
            else (rlfleet_solve, sb3_solve)
        )
        for seed in range(args.repeats):
            for run in (ours, theirs):  # alternate, so drift in machine load hits both
                _record(rows, mode, seed, run(seed))
    if args.sb3_default_threads and default_threads != args.threads:
        torch.set_num_threads(default_threads)
        for mode in modes:
            for seed in range(args.repeats):
                row = sb3_identical(seed) if mode == "identical" else sb3_solve(seed)
                row["library"] = f"sb3 ({default_threads} threads)"
                _record(rows, mode, seed, row)
        torch.set_num_threads(args.threads)
    report = _report(rows, args)
    print(report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / "ppo_cartpole.parquet")
    (RESULTS / "ppo_cartpole.md").write_text(report + "\n")


def _record(rows: list[dict[str, Any]], mode: str, seed: int, row: dict[str, Any]) -> None:
    row["steps_per_s"] = row["env_steps"] / row["train_s"]
    rows.append(row)
    print(
        f"{mode:9s} {row['library']:16s} seed {seed}: {row['train_s']:6.2f} s, "
        f"{row['steps_per_s']:8.0f} steps/s, return {row['final_return']:.1f}",
        flush=True,
    )


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in rows]))


def _report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"# PPO CartPole-v1: rlfleet vs Stable-Baselines3 ({args.repeats} runs each, "
        f"rlfleet and SB3 at {args.threads} torch thread(s), {time.strftime('%Y-%m-%d')})",
        "",
        "Medians. Training wall time excludes evaluation.",
        "",
    ]
    titles = {
        "identical": "Identical hyperparameters (RL-Zoo set), 100k steps",
        "solve": "Time to mean eval return >= 475 (20 episodes), each library's own preset",
    }
    for mode, title in titles.items():
        ours = [r for r in rows if r["mode"] == mode and r["library"] == "rlfleet"]
        if not ours:
            continue
        lines += [
            f"## {title}",
            "",
            "| library | training s | env steps/s | return | rlfleet speed-up |",
            "|---|---|---|---|---|",
        ]
        libraries = sorted({r["library"] for r in rows if r["mode"] == mode}, key=len)
        for library in libraries:
            runs = [r for r in rows if r["mode"] == mode and r["library"] == library]
            speedup = _median(runs, "train_s") / _median(ours, "train_s")
            solved = (
                f" ({sum(r['solved'] for r in runs)}/{len(runs)} solved)" if mode == "solve" else ""
            )
            lines.append(
                f"| {library} | {_median(runs, 'train_s'):.2f} | "
                f"{_median(runs, 'steps_per_s'):,.0f} | "
                f"{_median(runs, 'final_return'):.1f}{solved} | {speedup:.2f}x |"
            )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
