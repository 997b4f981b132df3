"""BC, CQL, IQL and TD3+BC on a mixed-quality Pendulum-v1 dataset.

The dataset: ``--episodes`` whole episodes of a scripted swing-up controller (mean return
about -140) and as many of uniformly random torques (about -1,200), 200 transitions each.
Every algorithm trains with its shipped Pendulum-v1 preset (``max_steps`` gradient steps,
overridable with ``--steps``) for ``--seeds`` seeds, tested on 10 greedy episodes per epoch.
Reports the final and best mean test return and the wall time; results go to
``bench/results/offline_pendulum.parquet`` and ``.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from tests.offline.helpers import mixed_pendulum_dataset

RESULTS = Path(__file__).parent / "results"
ALGORITHMS = ("bc", "cql", "iql", "td3_bc")


def run(algo: str, dataset: Path, seed: int, steps: int | None) -> dict[str, Any]:
    trainer_overrides: dict[str, Any] = {"show_progress": False, "verbose": False}
    if steps is not None:
        trainer_overrides.update(max_steps=steps, epoch_num_steps=max(steps // 10, 1))
    cfg = default_run_config(
        algo, "Pendulum-v1", {"dataset": str(dataset), "seed": seed, "trainer": trainer_overrides}
    )
    scores: list[float] = []
    trainer = make_trainer(cfg, None, test_result_fn=lambda _e, _s, score: scores.append(score))
    start = time.perf_counter()
    try:
        result = trainer.run()
    finally:
        trainer.close()
    return {
        "algorithm": algo,
        "seed": seed,
        "gradient_steps": result.gradient_steps,
        "final_return": scores[-1],
        "best_return": result.best_score,
        "train_s": time.perf_counter() - start - result.test_time_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=50, help="expert (and random) episodes")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None, help="gradient steps (preset's)")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset = mixed_pendulum_dataset(args.episodes, args.episodes)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = dataset.save(Path(tmp) / "data")
        for seed in range(args.seeds):
            for algo in args.algorithms.split(","):
                row = run(algo, path, seed, args.steps)
                rows.append(row)
                print(
                    f"{algo:7s} seed {seed}: final {row['final_return']:8.1f}, best "
                    f"{row['best_return']:8.1f}, {row['train_s']:6.1f} s",
                    flush=True,
                )
    stats = dataset.stats()
    lines = [
        "# Offline RL on a mixed-quality Pendulum-v1 dataset",
        "",
        f"Dataset: {stats.num_transitions:,} transitions, {args.episodes} scripted swing-up "
        f"and {args.episodes} random episodes; episode return mean {stats.return_mean:.0f} "
        f"(min {stats.return_min:.0f}, max {stats.return_max:.0f}). Shipped presets, "
        f"{args.seeds} seed(s); test return: mean of 10 greedy episodes.",
        "",
        "| algorithm | gradient steps | final test return | best test return | train s |",
        "|---|---|---|---|---|",
    ]
    for algo in args.algorithms.split(","):
        mine = [r for r in rows if r["algorithm"] == algo]
        lines.append(
            f"| `{algo}` | {mine[0]['gradient_steps']:,} "
            f"| {np.mean([r['final_return'] for r in mine]):.1f} "
            f"| {np.mean([r['best_return'] for r in mine]):.1f} "
            f"| {np.mean([r['train_s'] for r in mine]):.1f} |"
        )
    text = "\n".join(lines)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / "offline_pendulum.parquet")
    (RESULTS / "offline_pendulum.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
