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
    t0 = time.perf_counter()
    result = trainer.run()
    train_s = time.perf_counter() - t0 - trainer.test_seconds
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
    return {"library": "rlfleet", "mode": mode, "seed": seed, "train_s": train_s, **row}


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

        def _on_step(self) -> bool:
            t0 = time.perf_counter()
            keep_going: bool = super()._on_step()
            if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
                self.eval_s += time.perf_counter() - t0
            return keep_going

    return TimedEval


def sb3_timed_eval(*args: Any, **kwargs: Any) -> Any:
    """An SB3 EvalCallback that adds up its evaluation time in ``eval_s``."""
    return _timed_eval_class()(*args, **kwargs)


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
    ]

    def med(rs: list[dict[str, Any]], key: str) -> float:
        return float(np.median([r[key] for r in rs]))

    for mode, heading in (("identical", identical_title), ("solve", solve_title)):
        ours = [r for r in rows if r["mode"] == mode and r["library"] == "rlfleet"]
        if not ours:
            continue
        others = sorted({r["library"] for r in rows if r["mode"] == mode} - {"rlfleet"})
        lines += [
            f"## {heading}",
            "",
            "| | rlfleet | " + " | ".join(others) + " |",
            "|---|---|" + "---|" * len(others),
            f"| training wall time (median s) | {med(ours, 'train_s'):.2f} | "
            + " | ".join(
                f"{med(t, 'train_s'):.2f} ({med(t, 'train_s') / med(ours, 'train_s'):.2f}x)"
                for t in (
                    [r for r in rows if r["mode"] == mode and r["library"] == o] for o in others
                )
            )
            + " |",
            f"| env steps/s (median) | {med(ours, 'steps_per_s'):.0f} | "
            + " | ".join(
                f"{med(t, 'steps_per_s'):.0f} (rlfleet "
                f"{med(ours, 'steps_per_s') / med(t, 'steps_per_s'):.2f}x)"
                for t in (
                    [r for r in rows if r["mode"] == mode and r["library"] == o] for o in others
                )
            )
            + " |",
            f"| {'final' if mode == 'identical' else 'best'} eval return (median) | "
            f"{med(ours, 'final_return'):.1f} | "
            + " | ".join(
                f"{med(t, 'final_return'):.1f}"
                for t in (
                    [r for r in rows if r["mode"] == mode and r["library"] == o] for o in others
                )
            )
            + " |",
        ]
        if mode == "solve":
            lines.append(
                f"| runs solved | {sum(r['solved'] for r in ours)}/{len(ours)} | "
                + " | ".join(
                    f"{sum(r['solved'] for r in rows if r['mode'] == mode and r['library'] == o)}"
                    f"/{sum(1 for r in rows if r['mode'] == mode and r['library'] == o)}"
                    for o in others
                )
                + " |"
            )
        lines.append("")
    return "\n".join(lines)
