"""Shared pieces of the off-policy benchmarks (``dqn_cartpole.py``, ``sac_pendulum.py``)."""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from rlfleet.collect.evaluator import Evaluator
from rlfleet.train.run import default_run_config, make_trainer

QUIET = {"show_progress": False, "verbose": False}


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
