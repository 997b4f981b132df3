"""SAC rewarded by GAIL alone on Pendulum-v1: env steps until the test return passes -250.

SAC with the Pendulum-v1 preset learns from GAIL's reward only (the env's reward is never
seen), the discriminator fed ten episodes of a scripted swing-up controller
(``tests/offline/helpers.py``; mean return about -140, a random policy's about -1200). Each
seed trains until a test step's mean return reaches -250, or for the budget; the table gives
the env step of that test step (—: not within the budget), the best test return and the
run's wall time.

    python bench/gail_pendulum.py --seeds 0 1 2 3 4 --budget 10000 --jobs 2

Results go to ``bench/results/gail_pendulum.parquet`` and ``.md``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' helpers

from rlfleet.logging.history import read_history
from rlfleet.rewards import (
    GAILSettings,
    RewardSignalsSettings,
    SignalNetworkSettings,
    record_demonstrations,
    save_demonstrations,
)
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from tests.offline.helpers import pendulum_swing_up

RESULTS = Path(__file__).parent / "results"
TARGET = -250.0
"""The test return a run must reach (the demonstrator's is about -135)."""


def run(seed: int, budget: int) -> dict[str, Any]:
    """One seed: the env step of the first test step at or above :data:`TARGET` (None if
    none), the best test return and the wall time (recording the demonstrations included)."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        demos, returns = record_demonstrations(gym.make("Pendulum-v1"), pendulum_swing_up, 10)
        save_demonstrations(Path(tmp) / "demos.npz", demos)
        gail = GAILSettings(
            demo_path=str(Path(tmp) / "demos.npz"),
            gamma=0.98,
            network_settings=SignalNetworkSettings(hidden_units=64),
        )
        quiet = {"show_progress": False, "verbose": False}
        overrides = {
            "seed": seed,
            "trainer": {**quiet, "max_steps": budget, "target_reward": TARGET},
        }
        cfg = replace(
            default_run_config("sac", "Pendulum-v1", overrides),
            reward_signals=RewardSignalsSettings(gail=gail),
        )
        result = make_trainer(cfg, Path(tmp) / "run").run()
        tests = [
            (int(row["env_step"]), float(row["test/return_mean"]))
            for row in read_history(Path(tmp) / "run" / "history.parquet")
            if row.get("test/return_mean") is not None
        ]
    reached = next((step for step, score in tests if score >= TARGET), None)
    return {
        "seed": seed,
        "demo_return": round(float(np.mean(returns)), 1),
        "reached_step": reached,
        "best_test_return": round(result.best_score, 1),
        "env_steps": result.env_steps,
        "wall_time_s": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--budget", type=int, default=10_000)
    parser.add_argument("--jobs", type=int, default=1, help="seeds run side by side")
    args = parser.parse_args()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run, args.seeds, [args.budget] * len(args.seeds)))
    for row in rows:
        print(row, flush=True)
    RESULTS.mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / "gail_pendulum.parquet")
    reached = [r["reached_step"] for r in rows if r["reached_step"] is not None]
    lines = [
        f"# SAC with GAIL alone on Pendulum-v1: env steps to a test return of {TARGET:.0f} "
        f"(budget {args.budget:,}, {args.jobs} seeds side by side)",
        "",
        "| seed | demonstrations' return | reached at | best test return | wall time |",
        "|---|---|---|---|---|",
        *(
            f"| {r['seed']} | {r['demo_return']} | "
            + (f"{r['reached_step']:,}" if r["reached_step"] is not None else "—")
            + f" | {r['best_test_return']} | {r['wall_time_s']} s |"
            for r in rows
        ),
        "",
        f"Reached by {len(reached)} of {len(rows)} seeds"
        + (f", median {int(np.median(reached)):,} env steps." if reached else "."),
    ]
    (RESULTS / "gail_pendulum.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
