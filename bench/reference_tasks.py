"""Full learning thresholds of the off-policy reference tasks, with the shipped presets.

CI checks smaller thresholds at fixed seeds and short budgets (tests/algos/test_*.py); this
script checks the full ones of the issue, on several seeds:

- DQN on CartPole-v1: mean test return >= 475;
- SAC, TD3, DDPG on Pendulum-v1: mean test return >= -250 over 10 episodes;
- SAC (discrete actions) on CartPole-v1: mean test return >= 475.

Each run uses the algorithm's shipped preset and stops at the threshold (or at the preset's
``max_steps``). Prints and writes ``bench/results/reference_tasks.parquet`` and ``.md``.
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
from compare import rlfleet_run

RESULTS = Path(__file__).parent / "results"
TASKS = [
    ("dqn", "CartPole-v1", 475.0),
    ("sac", "Pendulum-v1", -250.0),
    ("td3", "Pendulum-v1", -250.0),
    ("ddpg", "Pendulum-v1", -250.0),
    ("sac", "CartPole-v1", 475.0),
]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds per task")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    for algo, env_id, target in TASKS:
        for seed in range(args.seeds):
            row = rlfleet_run(algo, env_id, seed, mode="solve", target=target, eval_episodes=10)
            row.update(algo=algo, env=env_id, target=target)
            rows.append(row)
            print(
                f"{algo:5s} {env_id:12s} seed {seed}: best {row['final_return']:8.1f} "
                f"(target {target:.0f}) at {row['env_steps']:,} steps, "
                f"{row['train_s']:.1f} s, {'solved' if row['solved'] else 'NOT solved'}",
                flush=True,
            )
    lines = [
        f"# Off-policy reference tasks, shipped presets ({args.seeds} seeds, "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        "| algorithm | env | target | solved | median env steps | median training s |",
        "|---|---|---|---|---|---|",
    ]
    for algo, env_id, target in TASKS:
        runs = [r for r in rows if r["algo"] == algo and r["env"] == env_id]
        lines.append(
            f"| {algo} | {env_id} | {target:.0f} | {sum(r['solved'] for r in runs)}/{len(runs)} "
            f"| {np.median([r['env_steps'] for r in runs]):,.0f} "
            f"| {np.median([r['train_s'] for r in runs]):.1f} |"
        )
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / "reference_tasks.parquet")
    (RESULTS / "reference_tasks.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
