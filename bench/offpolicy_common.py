"""The off-policy benchmarks' runner (``dqn_cartpole.py``, ``sac_pendulum.py``): each
script is a :class:`Comparison` and its docstring; :func:`main` runs both libraries
side by side and writes the report."""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from rlfleet.collect.evaluator import Evaluator
from rlfleet.train.run import default_run_config, make_trainer

QUIET = {"show_progress": False, "verbose": False}
RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Comparison:
    """One algorithm on one env, rlfleet against Stable-Baselines3."""

    title: str
    """e.g. ``DQN CartPole-v1``."""
    algo: str
    """rlfleet's algorithm name; SB3's class is its upper-case spelling."""
    env_id: str
    budget: int
    """Env steps of the identical-hyperparameters mode."""
    target: float
    """Mean eval return that counts as solved."""
    eval_episodes: int
    sb3_eval_freq: int
    """Env steps between SB3's evaluations in the solve mode."""
    rlfleet_hyperparameters: dict[str, Any]
    sb3_hyperparameters: dict[str, Any]
    results: str
    """File stem of the results in bench/results/."""


def rlfleet_run(
    algo: str,
    env_id: str,
    seed: int,
    *,
    mode: str,
    eval_episodes: int,
    hyperparameters: dict[str, Any] | None = None,
    max_steps: int | None = None,
    target: float | None = None,
    num_envs: int | None = None,
) -> dict[str, Any]:
    """One rlfleet run: ``identical`` trains ``max_steps`` with the given hyperparameters and
    evaluates at the end; ``solve`` uses the shipped preset until ``target`` is reached."""
    trainer_cfg: dict[str, Any] = {**QUIET, "test_step_num_episodes": eval_episodes}
    overrides: dict[str, Any] = {"seed": seed, "trainer": trainer_cfg}
    if mode == "identical":
        assert max_steps is not None
        trainer_cfg.update(
            max_steps=max_steps,
            epoch_num_steps=max_steps,
            target_reward=None,
            test_in_training=False,
            test_step_num_episodes=1,
        )
        overrides["hyperparameters"] = hyperparameters or {}
        overrides["env"] = {"num_envs": num_envs or 1, "vector_mode": "sync"}
    else:
        trainer_cfg["target_reward"] = target
    cfg = default_run_config(algo, env_id, overrides)
    trainer = make_trainer(cfg, None)
    test_cpu = _TimedEvaluator(trainer.evaluator)
    trainer.evaluator = test_cpu
    t0, cpu0 = time.perf_counter(), time.process_time()
    result = trainer.run()
    train_s = time.perf_counter() - t0 - trainer.test_seconds
    # CPU time is the fairer clock on a machine shared with other work, where wall time
    # also counts the time slices other processes took.
    cpu_s = time.process_time() - cpu0 - test_cpu.cpu_s
    if mode == "identical":
        final = Evaluator(trainer.test_envs, trainer.algorithm, seed=999).run(eval_episodes).mean
        row: dict[str, Any] = {"final_return": final, "env_steps": result.env_steps}
    else:
        solved = target is not None and result.best_score >= target
        row = {
            "final_return": result.best_score,
            "env_steps": result.best_env_step if solved else result.env_steps,
            "solved": solved,
        }
    trainer.train_envs.close()
    trainer.test_envs.close()
    return {
        "library": "rlfleet",
        "mode": mode,
        "seed": seed,
        "train_s": train_s,
        "cpu_s": cpu_s,
        **row,
    }


class _TimedEvaluator:
    """Wraps an Evaluator to add up the CPU time of test steps."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self.cpu_s = 0.0

    def run(self, num_episodes: int, **kwargs: Any) -> Any:
        cpu0 = time.process_time()
        stats = self.evaluator.run(num_episodes, **kwargs)
        self.cpu_s += time.process_time() - cpu0
        return stats


def sb3_final_return(model: Any, env_id: str, episodes: int) -> float:
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    eval_env = sb3_make_vec_env(env_id, n_envs=1, seed=999)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=episodes, deterministic=True)
    return float(mean)


def _timed_eval_class() -> type[Any]:
    from stable_baselines3.common.callbacks import EvalCallback

    class TimedEval(EvalCallback):
        """SB3's EvalCallback that also adds up the time spent evaluating."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, verbose=0, **kwargs)
            self.eval_s = 0.0
            self.eval_cpu_s = 0.0

        def _on_step(self) -> bool:
            t0, cpu0 = time.perf_counter(), time.process_time()
            keep_going: bool = super()._on_step()
            if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
                self.eval_s += time.perf_counter() - t0
                self.eval_cpu_s += time.process_time() - cpu0
            return keep_going

    return TimedEval


def sb3_timed_eval(*args: Any, **kwargs: Any) -> Any:
    """An SB3 EvalCallback that adds up its evaluation time in ``eval_s``."""
    return _timed_eval_class()(*args, **kwargs)


def _med(rows: list[dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in rows]))


def _line(
    ours: list[dict[str, Any]],
    groups: list[list[dict[str, Any]]],
    label: str,
    key: str,
    fmt: str,
    ratio: str | None,
) -> str:
    """One table row: rlfleet's median, then each other library's with rlfleet's advantage."""
    cells = [format(_med(ours, key), fmt)]
    for group in groups:
        cell = format(_med(group, key), fmt)
        if ratio == "lower is better":
            cell += f" ({_med(group, key) / _med(ours, key):.2f}x)"
        elif ratio == "higher is better":
            cell += f" (rlfleet {_med(ours, key) / _med(group, key):.2f}x)"
        cells.append(cell)
    return f"| {label} | " + " | ".join(cells) + " |"


def report(
    title: str,
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    *,
    identical_title: str,
    solve_title: str,
    default_threads: int,
) -> str:
    """Markdown tables of medians, rlfleet against each SB3 variant."""
    lines = [
        f"# {title}: rlfleet vs Stable-Baselines3 ({args.repeats} runs each, "
        f"torch threads {args.threads}; SB3 also at torch's default of {default_threads}; "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        "Speed ratios are rlfleet's advantage: the other library's time over rlfleet's, and",
        "rlfleet's steps/s over the other's. CPU time is the fairer clock when the machine is",
        "shared with other work (wall time then also counts lost time slices); the",
        "default-thread run's CPU time adds up both threads.",
        "",
    ]

    for mode, heading in (("identical", identical_title), ("solve", solve_title)):
        runs = [r for r in rows if r["mode"] == mode]
        ours = [r for r in runs if r["library"] == "rlfleet"]
        if not ours:
            continue
        others = sorted({r["library"] for r in runs} - {"rlfleet"})
        groups = [[r for r in runs if r["library"] == o] for o in others]
        lines += [
            f"## {heading}",
            "",
            "| | rlfleet | " + " | ".join(others) + " |",
            "|---|---|" + "---|" * len(others),
            _line(
                ours, groups, "training wall time (median s)", "train_s", ".2f", "lower is better"
            ),
            _line(
                ours, groups, "env steps/s, wall (median)", "steps_per_s", ".0f", "higher is better"
            ),
        ]
        if all("cpu_steps_per_s" in r for r in runs):
            lines.append(
                _line(
                    ours, groups, "training CPU time (median s)", "cpu_s", ".2f", "lower is better"
                )
            )
            lines.append(
                _line(
                    ours,
                    groups,
                    "env steps/s, CPU (median)",
                    "cpu_steps_per_s",
                    ".0f",
                    "higher is better",
                )
            )
        final = "final" if mode == "identical" else "best"
        lines.append(
            _line(ours, groups, f"{final} eval return (median)", "final_return", ".1f", None)
        )
        if mode == "solve":
            lines.append(
                _line(ours, groups, "env steps to solve (median)", "env_steps", ".0f", None)
            )
            solved = [f"{sum(r['solved'] for r in g)}/{len(g)}" for g in [ours, *groups]]
            lines.append("| runs solved | " + " | ".join(solved) + " |")
        lines.append("")
    return "\n".join(lines)


def _sb3_model(spec: Comparison, seed: int) -> Any:
    import stable_baselines3
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env

    env = sb3_make_vec_env(spec.env_id, n_envs=1, seed=seed)
    algo = getattr(stable_baselines3, spec.algo.upper())
    return algo("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **spec.sb3_hyperparameters)


def sb3_identical(spec: Comparison, seed: int, threads: int | None, budget: int) -> dict[str, Any]:
    """SB3 with the identical hyperparameters; ``threads`` None keeps torch's default."""
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        model = _sb3_model(spec, seed)
        t0, cpu0 = time.perf_counter(), time.process_time()
        model.learn(budget)
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        final = sb3_final_return(model, spec.env_id, spec.eval_episodes)
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


def sb3_solve(spec: Comparison, seed: int) -> dict[str, Any]:
    """SB3 with RL-Zoo's preset until the mean eval return reaches the target."""
    from stable_baselines3.common.callbacks import StopTrainingOnRewardThreshold
    from stable_baselines3.common.env_util import make_vec_env as sb3_make_vec_env

    eval_env = sb3_make_vec_env(spec.env_id, n_envs=1, seed=999)
    model = _sb3_model(spec, seed)
    stop = StopTrainingOnRewardThreshold(reward_threshold=spec.target, verbose=0)
    callback = sb3_timed_eval(
        eval_env,
        n_eval_episodes=spec.eval_episodes,
        eval_freq=spec.sb3_eval_freq,
        callback_on_new_best=stop,
    )
    t0, cpu0 = time.perf_counter(), time.process_time()
    model.learn(spec.budget * 2, callback=callback)
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
        "solved": bool(callback.best_mean_reward >= spec.target),
    }


def main(spec: Comparison, description: str | None) -> None:
    """Parse the command line, run the comparison and write ``bench/results/<results>``."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=["identical", "solve", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=3, help="runs per library and mode")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both libraries")
    parser.add_argument("--steps", type=int, default=spec.budget, help="identical mode: env steps")
    parser.add_argument(
        "--results", default=spec.results, help="file stem of the results in bench/results/"
    )
    parser.add_argument(
        "--no-default-threads", action="store_true", help="skip SB3 at torch's default threads"
    )
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)

    rlfleet_identical = functools.partial(
        rlfleet_run,
        spec.algo,
        spec.env_id,
        mode="identical",
        hyperparameters=spec.rlfleet_hyperparameters,
        max_steps=args.steps,
        eval_episodes=spec.eval_episodes,
        num_envs=1,
    )
    rlfleet_solve = functools.partial(
        rlfleet_run,
        spec.algo,
        spec.env_id,
        mode="solve",
        target=spec.target,
        eval_episodes=spec.eval_episodes,
    )

    rows: list[dict[str, Any]] = []
    modes = ["identical", "solve"] if args.mode == "both" else [args.mode]
    for mode in modes:
        for seed in range(args.repeats):
            runs: list[Callable[[int], dict[str, Any]]]
            if mode == "identical":
                runs = [
                    rlfleet_identical,
                    lambda s: sb3_identical(spec, s, args.threads, args.steps),
                ]
                if not args.no_default_threads:
                    runs.append(lambda s: sb3_identical(spec, s, None, args.steps))
            else:
                runs = [rlfleet_solve, lambda s: sb3_solve(spec, s)]
            for run in runs:  # alternate, so drift in machine load hits both
                row = run(seed)
                row["steps_per_s"] = row["env_steps"] / row["train_s"]
                row["cpu_steps_per_s"] = row["env_steps"] / row["cpu_s"]
                rows.append(row)
                print(
                    f"{mode:9s} {row['library']:22s} seed {seed}: {row['train_s']:6.2f} s, "
                    f"{row['steps_per_s']:8.0f} steps/s, return {row['final_return']:.1f}",
                    flush=True,
                )
    text = report(
        spec.title,
        rows,
        args,
        identical_title=f"identical hyperparameters (RL-Zoo), {args.steps:,} steps",
        solve_title=f"time to mean eval return >= {spec.target:.0f}, own presets",
        default_threads=default_threads,
    )
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / f"{args.results}.parquet")
    (RESULTS / f"{args.results}.md").write_text(text + "\n")
