"""Env-steps/s of IMPALA with 1, 2 and 4 Ray rollout actors, and of single-process PPO.

Every run goes through rlfleet's own run API (``default_run_config`` + ``make_trainer``) with
the shipped CartPole-v1 presets: IMPALA with 8 envs per actor, fragments of 32 steps, two
fragments per update (one gradient step each); PPO with 8 envs, rollouts of 32 steps and 20
epochs of minibatch updates per rollout. Each run trains for a fixed budget of env steps with
no early stop; the timed span is ``trainer.run()`` (actor start-up and Ray start excluded),
which includes one test step of one episode at the end. All IMPALA runs share one local Ray
cluster; its actors reserve fractional CPUs so that four fit on a two-core machine.

Results go to ``bench/results/distributed.parquet`` and ``.md``. Needs the ``ray`` extra.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from rlfleet.logging.history import read_history
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer

RESULTS = Path(__file__).parent / "results"
ACTOR_COUNTS = (1, 2, 4)


def run(algo: str, num_actors: int | None, budget: int, seed: int) -> dict[str, Any]:
    overrides: dict[str, Any] = {
        "seed": seed,
        "env": {"num_test_envs": 1},
        "trainer": {
            "max_steps": budget,
            "epoch_num_steps": budget,
            "log_interval_steps": budget // 10,
            "target_reward": None,
            "test_in_training": False,
            "test_step_num_episodes": 1,
            "show_progress": False,
            "verbose": False,
        },
    }
    cpus = os.cpu_count() or 1
    if num_actors is not None:
        overrides["distributed"] = {
            "num_actors": num_actors,
            "actor_num_cpus": min(1.0, cpus / num_actors),
        }
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(default_run_config(algo, "CartPole-v1", overrides), Path(tmp))
        try:
            start = time.perf_counter()
            result = trainer.run()
            wall = time.perf_counter() - start
        finally:
            trainer.close()
        rows = read_history(Path(tmp) / "history.parquet")

    def mean_of(key: str) -> float | None:
        values = [row[key] for row in rows if row.get(key) is not None]
        return float(np.mean(values)) if values else None

    return {
        "algo": algo,
        "num_actors": num_actors or 0,
        "seed": seed,
        "env_steps": result.env_steps,
        "wall_s": wall,
        "steps_per_s": result.env_steps / wall,
        "gradient_steps": result.gradient_steps,
        "train_return_mean": mean_of("train/return_mean"),
        "policy_lag": mean_of("train/policy_lag"),
        "wait_s_per_update": mean_of("time/wait_s"),
        "learner_s_per_update": mean_of("time/learner_s"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget", type=int, default=200_000, help="env steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="runs per configuration")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import ray

    ray.init(include_dashboard=False, logging_level=logging.WARNING)
    rows: list[dict[str, Any]] = []
    try:
        for seed in range(args.repeats):
            configs: list[tuple[str, int | None]] = [("ppo", None)]
            configs += [("impala", n) for n in ACTOR_COUNTS]
            for algo, actors in configs:
                row = run(algo, actors, args.budget, seed)
                rows.append(row)
                label = f"{algo} x{actors}" if actors else f"{algo} (1 process)"
                print(
                    f"{label:18s} seed {seed}: {row['steps_per_s']:8.0f} steps/s "
                    f"({row['wall_s']:.1f} s), train return {row['train_return_mean']:.1f}",
                    flush=True,
                )
    finally:
        ray.shutdown()
    report = _report(rows, args)
    print(report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / "distributed.parquet")
    (RESULTS / "distributed.md").write_text(report + "\n")


def _report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    def med(group: list[dict[str, Any]], key: str) -> str:
        values = [r[key] for r in group if r[key] is not None]
        return f"{np.median(values):.3g}" if values else "-"

    lines = [
        f"# CartPole-v1 env-steps/s: IMPALA on Ray vs single-process PPO "
        f"({args.budget:,} steps per run, median of {args.repeats}, {os.cpu_count()} CPUs, "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        "Actors and the learner share the machine's cores: once every core is busy, more actors "
        "add policy lag, not throughput.",
        "",
        "| run | env steps/s | gradient steps | train return (mean) | policy lag (updates) "
        "| wait for fragments (s/update) | learner (s/update) |",
        "|---|---|---|---|---|---|---|",
    ]
    ppo = [r for r in rows if r["algo"] == "ppo"]
    groups = [("PPO, 1 process (8 envs, 20 epochs)", ppo)]
    groups += [
        (
            f"IMPALA, {n} actor{'s' if n > 1 else ''} (8 envs each)",
            [r for r in rows if r["algo"] == "impala" and r["num_actors"] == n],
        )
        for n in ACTOR_COUNTS
    ]
    for label, group in groups:
        lines.append(
            f"| {label} | {np.median([r['steps_per_s'] for r in group]):,.0f} | "
            f"{med(group, 'gradient_steps')} | {med(group, 'train_return_mean')} | "
            f"{med(group, 'policy_lag')} | {med(group, 'wait_s_per_update')} | "
            f"{med(group, 'learner_s_per_update')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
