"""Exploration bonuses on sparse-reward MountainCar-v0: env steps until the flag is reached.

PPO with the settings of ``tests/rewards/test_learning.py`` (8 envs, time horizon 128,
normalised observations, 64x64) and three reward set-ups: the env's reward alone, plus RND,
plus curiosity (strength 0.5, learning rate 1e-3). For each seed, the env steps until a
training episode first reaches the flag (a return above -200, the time limit), or none
within the budget. The CI test runs one seed at 20k steps; this runs several at a larger
budget.

    python bench/reward_signals_mountaincar.py --seeds 0 1 2 3 4 --budget 60000

Results go to ``bench/results/reward_signals_mountaincar.parquet`` and ``.md``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from rlfleet.runs.from_options import train_from_options
from rlfleet.runs.options_parser import parse_run_options

RESULTS = Path(__file__).parent / "results"
SIGNALS: dict[str, dict[str, Any]] = {
    "ppo": {},
    "ppo+rnd": {"rnd": {"strength": 0.5, "gamma": 0.99, "learning_rate": 1e-3}},
    "ppo+curiosity": {"curiosity": {"strength": 0.5, "gamma": 0.99, "learning_rate": 1e-3}},
}


def first_goal(signals: dict[str, Any], seed: int, budget: int) -> tuple[int | None, float]:
    """Env steps at the first history row with a goal-reaching episode, and wall time."""
    with tempfile.TemporaryDirectory() as results:
        options = parse_run_options(
            {
                "env_settings": {"env_id": "MountainCar-v0", "num_envs": 8, "num_test_envs": 2,
                                 "seed": seed},
                "behaviors": {"MountainCar": {
                    "hyperparameters": {"learning_rate": 1e-3, "batch_size": 256,
                                        "num_epochs": 4},
                    "network_settings": {"hidden_units": 64, "num_layers": 2, "normalize": True},
                    "time_horizon": 128,
                    "max_steps": budget,
                    "summary_freq": 1024,
                    "checkpoint_interval": budget,
                    "reward_signals": {"extrinsic": {"gamma": 0.99}, **signals},
                    "trainer_settings": {"show_progress": False, "verbose": False,
                                         "test_step_num_episodes": 2},
                }},
                "checkpoint_settings": {"results_dir": results, "run_id": "run"},
            }
        )  # fmt: skip
        start = time.perf_counter()
        train_from_options(options)
        seconds = time.perf_counter() - start
        history = pq.read_table(Path(results) / "run" / "history.parquet").to_pydict()
    for step, best in zip(history["env_step"], history["train/return_max"], strict=True):
        if best is not None and best > -200:
            return int(step), seconds
    return None, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--budget", type=int, default=60_000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    for seed in args.seeds:
        for name, signals in SIGNALS.items():
            step, seconds = first_goal(signals, seed, args.budget)
            rows.append({"setup": name, "seed": seed, "first_goal_step": step,
                         "wall_time_s": round(seconds, 1)})  # fmt: skip
            print(rows[-1], flush=True)
    RESULTS.mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / "reward_signals_mountaincar.parquet")
    lines = [
        f"# MountainCar-v0: env steps until the flag is first reached (budget {args.budget:,})",
        "",
        "| setup | " + " | ".join(f"seed {s}" for s in args.seeds) + " | reached |",
        "|---|" + "---|" * (len(args.seeds) + 1),
    ]
    for name in SIGNALS:
        steps = [r["first_goal_step"] for r in rows if r["setup"] == name]
        cells = [f"{s:,}" if s is not None else "—" for s in steps]
        reached = sum(s is not None for s in steps)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {reached}/{len(steps)} |")
    (RESULTS / "reward_signals_mountaincar.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
