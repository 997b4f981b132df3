"""IMPALA and APPO on Ray rollout actors against single-process PPO: returns and throughput.

Three parts, every run through rlfleet's own run API (``default_run_config`` + ``make_trainer``)
with the shipped presets:

returns
    IMPALA (2 actors) and PPO (one process) on CartPole-v1 at the same env-step budget, over
    several seeds. The figure is the final greedy return: the mean of 20 test episodes of the
    policy the run ends with (no early stop, no best-model pick), plus the mean training
    return of the last logged window.
image
    PPO (one process), IMPALA and APPO (2 actors each) on two image tasks at reduced budgets:
    ``PixelCartPole`` (``bench/pixel_cartpole.py``: CartPole-v1 drawn into 36 x 36 uint8
    frames, the last two stacked) with the Nature CNN and linear heads (as for Atari), with
    the settings of :data:`IMAGE_HYPERPARAMETERS`; and MinAtar's ``MinAtar/Breakout-v1``
    (10 x 10 bool grids, the MinAtar network) with each algorithm's ``"MinAtar/*"`` preset.
    Atari itself needs millions of frames before PPO's returns move away from the random
    policy's, more than a two-core benchmark can afford. The policy lag of each actor-learner
    run is reported with it: it depends on how busy the machine's cores are.
throughput
    IMPALA env steps/s with 1, 2 and 4 actors on CartPole-v1 (8 envs each), next to PPO's.
    The timed span is ``trainer.run()`` (Ray start and actor start-up excluded), which includes
    the final test step. All IMPALA runs share one local Ray cluster; actors reserve fractional
    CPUs so that four fit on a two-core machine.

``--quick`` runs a small version (one seed, small budgets) in a few minutes and only
prints its report; the full run writes ``bench/results/distributed.md`` and ``.parquet``.
Needs the ``ray`` extra.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from harness import counted, machine_line

from rlfleet.distributed.cluster import local_cluster_settings
from rlfleet.logging.history import read_history
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
ACTOR_COUNTS = (1, 2, 4)
CARTPOLE = "CartPole-v1"
IMAGE_ENV = "pixel_cartpole:PixelCartPole"
MINATAR = "MinAtar/Breakout-v1"
IMAGE_RUNS = (("ppo", None), ("impala", 2), ("appo", 2))
"""The algorithms of the image part, with their actor counts (None: one process)."""
IMAGE_HYPERPARAMETERS: dict[str, dict[str, Any]] = {
    # PPO's CartPole-v1 preset on the CNN, with linear heads (as for Atari), 4 epochs instead
    # of 10 (a CNN epoch costs far more than an MLP one) and a learning rate of 0.001. APPO
    # takes the same settings. IMPALA its CartPole-v1 preset with 8-step fragments and the
    # same discount. Both set V-trace's lambda to PPO's GAE lambda. Seeds 0-2 on 2 actors
    # (lag about 3 updates), final greedy returns: IMPALA 172, 69, 98 with this set; 32, 26, 27
    # with 16-step fragments, a learning rate of 0.001, gamma 0.99 and plain V-trace (lambda
    # 1); APPO 42 on seed 0 with plain V-trace even without lag. No observation normalisation
    # (the CNN scales the bytes to [0, 1]).
    "ppo": {
        "hidden_sizes": [],
        "cnn": "nature",
        "num_steps": 32,
        "batch_size": 256,
        "num_epochs": 4,
        "gamma": 0.98,
        "gae_lambda": 0.8,
        "learning_rate": 0.001,
        "lr_schedule": "linear",
        "clip_range": 0.2,
        "ent_coef": 0.0,
    },
    "impala": {
        "hidden_sizes": [],
        "cnn": "nature",
        "num_steps": 8,
        "batch_fragments": 1,
        "gamma": 0.98,
        "vtrace_lambda": 0.8,
        "learning_rate": 0.002,
        "lr_schedule": "linear",
        "ent_coef": 0.0,
        "normalize_obs": False,
    },
    "appo": {
        "hidden_sizes": [],
        "cnn": "nature",
        "num_steps": 32,
        "batch_fragments": 1,
        "batch_size": 256,
        "num_epochs": 4,
        "gamma": 0.98,
        "vtrace_lambda": 0.8,
        "learning_rate": 0.001,
        "lr_schedule": "linear",
        "clip_range": 0.2,
        "ent_coef": 0.0,
        "normalize_obs": False,
    },
}
TEST_EPISODES = 20


def run(
    algo: str,
    env_id: str,
    num_actors: int | None,
    budget: int,
    seed: int,
    hyperparameters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One run without early stop; its speed and final returns."""
    overrides: dict[str, Any] = {
        "seed": seed,
        "env": {"num_test_envs": 4},
        "trainer": {
            "max_steps": budget,
            "epoch_num_steps": budget,
            "log_interval_steps": max(budget // 10, 1),
            "target_reward": None,
            "test_in_training": False,
            "test_step_num_episodes": TEST_EPISODES,
            "show_progress": False,
            "verbose": False,
        },
        "hyperparameters": hyperparameters or {},
    }
    cpus = os.cpu_count() or 1
    if num_actors is not None:
        overrides["distributed"] = {
            "num_actors": num_actors,
            "actor_num_cpus": min(1.0, cpus / num_actors),
        }
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(default_run_config(algo, env_id, overrides), Path(tmp))
        try:
            start = time.perf_counter()
            result = trainer.run()
            wall = time.perf_counter() - start
        finally:
            trainer.close()
        rows = read_history(Path(tmp) / "history.parquet")

    def last(key: str) -> float | None:
        values = [row[key] for row in rows if row.get(key) is not None]
        return float(values[-1]) if values else None

    def mean_of(key: str) -> float | None:
        values = [row[key] for row in rows if row.get(key) is not None]
        return float(np.mean(values)) if values else None

    return {
        "algo": algo,
        "env_id": env_id,
        "num_actors": num_actors or 0,
        "seed": seed,
        "budget": budget,
        "env_steps": result.env_steps,
        "wall_s": wall,
        "steps_per_s": result.env_steps / wall,
        "gradient_steps": result.gradient_steps,
        "final_test_return": last("test/return_mean"),
        "final_train_return": last("train/return_mean"),
        "policy_lag": mean_of("train/policy_lag"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small version, report printed")
    parser.add_argument("--seeds", type=int, default=3, help="seeds of the return comparisons")
    parser.add_argument("--budget", type=int, default=200_000, help="CartPole env steps per run")
    parser.add_argument(
        "--image-budget", type=int, default=60_000, help="PixelCartPole env steps per run"
    )
    parser.add_argument(
        "--minatar-budget", type=int, default=300_000, help="MinAtar Breakout env steps per run"
    )
    parser.add_argument("--speed-budget", type=int, default=100_000, help="steps per speed run")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.budget, args.speed_budget = 1, 40_000, 16_000
        args.image_budget, args.minatar_budget = 24_000, 40_000
    torch.set_num_threads(1)
    # The actors build the image env from its id: they need bench/ on their path too.
    sys.path.insert(0, str(BENCH))
    import ray

    path = os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH")) if p)
    ray.init(
        include_dashboard=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
        **local_cluster_settings(),
    )
    rows: list[dict[str, Any]] = []
    before = os.getloadavg()[0]

    def record(part: str, row: dict[str, Any]) -> None:
        row["part"] = part
        rows.append(row)
        label = f"{row['algo']} x{row['num_actors']}" if row["num_actors"] else row["algo"]
        print(
            f"{part:10s} {label:10s} seed {row['seed']}: {row['steps_per_s']:7.0f} steps/s, "
            f"final test return {row['final_test_return']:.1f}",
            flush=True,
        )

    try:
        for seed in range(args.seeds):
            record("returns", run("ppo", CARTPOLE, None, args.budget, seed))
            record("returns", run("impala", CARTPOLE, 2, args.budget, seed))
        for seed in range(args.seeds):
            for algo, actors in IMAGE_RUNS:
                hyperparameters = IMAGE_HYPERPARAMETERS[algo]
                record(
                    "image", run(algo, IMAGE_ENV, actors, args.image_budget, seed, hyperparameters)
                )
        for seed in range(args.seeds):
            for algo, actors in IMAGE_RUNS:
                record("minatar", run(algo, MINATAR, actors, args.minatar_budget, seed))
        record("throughput", run("ppo", CARTPOLE, None, args.speed_budget, 0))
        for actors in ACTOR_COUNTS:
            record("throughput", run("impala", CARTPOLE, actors, args.speed_budget, 0))
    finally:
        ray.shutdown()
    report = _report(rows, args, (before, os.getloadavg()[0]))
    print(report)
    if args.quick:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / "distributed.parquet")
    (RESULTS / "distributed.md").write_text(report + "\n")


def _report(rows: list[dict[str, Any]], args: argparse.Namespace, load: tuple[float, float]) -> str:
    def figures(group: list[dict[str, Any]], key: str) -> str:
        values = [r[key] for r in group if r[key] is not None]
        if not values:
            return "-"
        # Whole numbers for CartPole's hundreds, one decimal for MinAtar's few points.
        digits = 0 if max(abs(v) for v in values) >= 50 else 1
        each = ", ".join(f"{v:.{digits}f}" for v in values)
        mean = f"{np.mean(values):.{digits}f}"
        return f"{mean} ({each})" if len(values) > 1 else mean

    def select(part: str, algo: str, actors: int | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in rows
            if r["part"] == part
            and r["algo"] == algo
            and (actors is None or r["num_actors"] == actors)
        ]

    def lag(group: list[dict[str, Any]]) -> str:
        values = [r["policy_lag"] for r in group if r["policy_lag"] is not None]
        return f"{np.mean(values):.1f}" if values else "-"

    quick = " (--quick)" if args.quick else ""
    lines = [
        f"# IMPALA and APPO on Ray vs single-process PPO{quick} ({os.cpu_count()} CPUs, "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        f"{machine_line(load)} The returns of PPO do not depend on the load; those of the "
        "actor-learner runs can, through which fragments reach which update (the policy lag).",
        "",
        f"## Final returns at the same env-step budget ({args.seeds} seed(s))",
        "",
        f"Final greedy return: mean of {TEST_EPISODES} test episodes of the policy each run ends "
        "with; training return: the last logged window. Mean over seeds (each seed's value). "
        "Policy lag: learner updates between the weights that collected a fragment and the "
        "learner's, mean over the run and the seeds.",
        "",
        "| task | budget (env steps) | run | final greedy return | final training return "
        "| policy lag |",
        "|---|---|---|---|---|---|",
    ]
    labels = {"ppo": "PPO, 1 process", "impala": "IMPALA, 2 actors", "appo": "APPO, 2 actors"}
    for part, task, budget, algos in (
        ("returns", "CartPole-v1", args.budget, ("ppo", "impala")),
        (
            "image",
            "PixelCartPole (36x36 frames, Nature CNN)",
            args.image_budget,
            tuple(a for a, _ in IMAGE_RUNS),
        ),
        (
            "minatar",
            "MinAtar/Breakout-v1 (MinAtar CNN)",
            args.minatar_budget,
            tuple(a for a, _ in IMAGE_RUNS),
        ),
    ):
        for algo in algos:
            group = select(part, algo)
            lines.append(
                f"| {task} | {budget:,} | {labels[algo]} | "
                f"{figures(group, 'final_test_return')} | "
                f"{figures(group, 'final_train_return')} | {lag(group)} |"
            )
    lines += [
        "",
        f"## Throughput on CartPole-v1 ({args.speed_budget:,} env steps per run)",
        "",
        "Actors and the learner share the machine's cores: once every core is busy, more actors "
        "add policy lag, not throughput.",
        "",
        "| run | env steps/s | gradient steps | policy lag (updates) |",
        "|---|---|---|---|",
    ]
    speed = [("PPO, 1 process (8 envs)", select("throughput", "ppo"))]
    speed += [
        (
            f"IMPALA, {counted(n, 'actor')} (8 envs each)",
            select("throughput", "impala", n),
        )
        for n in ACTOR_COUNTS
    ]
    for label, group in speed:
        row = group[0]
        lag = "-" if row["policy_lag"] is None else f"{row['policy_lag']:.2f}"
        lines.append(f"| {label} | {row['steps_per_s']:,.0f} | {row['gradient_steps']:,} | {lag} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
