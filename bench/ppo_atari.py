"""PPO on an Atari game: rlfleet vs Stable-Baselines3 with identical hyperparameters.

Both libraries train PPO with RL-Zoo's Atari settings (8 envs, ``n_steps`` 128, batch 256,
4 epochs, learning rate linear from 2.5e-4, clip range linear from 0.1, entropy 0.01,
value coefficient 0.5, gradient clip 0.5, gamma 0.99, GAE lambda 0.95) and the Nature CNN
shared by linear actor and critic heads, on SB3's Atari preprocessing (no-op reset 30,
frame skip 4 with max-pool, episodic life, fire reset, 84x84 grayscale, 4-frame stack,
reward clipping, no sticky actions). The budget is counted in emulator frames (4 per agent
step); training wall time excludes evaluation.

Runs, alternating so that drift in machine load hits all of them:

``sb3``
    ``make_atari_env("<Game>NoFrameskip-v4")`` + ``VecFrameStack(4)`` (SB3's own recipe,
    ``DummyVecEnv``).
``rlfleet``
    ``ALE/<Game>-v5`` with sticky actions off: ale-py's C++ vector env doing the
    preprocessing (what ``rlfleet train ppo --env ALE/<Game>-v5`` uses).
``rlfleet (wrappers)``
    ``<Game>NoFrameskip-v4`` through rlfleet's Python wrappers in a sync vector env: the
    same env pipeline as SB3, so the difference is the learner alone.

Prints env frames per second and the ratios; results go to ``bench/results/ppo_atari.*``.
Needs the ``bench`` and ``atari`` extras (and OpenCV for SB3's wrappers).
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

from rlfleet.train.run import default_run_config, make_trainer

RESULTS = Path(__file__).parent / "results"
FRAME_SKIP = 4
HYPERPARAMETERS = {
    "num_steps": 128,
    "batch_size": 256,
    "num_epochs": 4,
    "learning_rate": 2.5e-4,
    "lr_schedule": "linear",
    "clip_range": 0.1,
    "clip_range_schedule": "linear",
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "hidden_sizes": [],
    "cnn": "nature",
}


def rlfleet_run(game: str, frames: int, seed: int, *, wrappers: bool) -> dict[str, Any]:
    env_id = f"{game}NoFrameskip-v4" if wrappers else f"ALE/{game}-v5"
    steps = frames // FRAME_SKIP
    cfg = default_run_config(
        "ppo",
        env_id,
        {
            "seed": seed,
            "env": {
                "num_envs": 8,
                "num_test_envs": 1,
                "vector_mode": "sync" if wrappers else "native",
                "atari": {"repeat_action_probability": 0.0},
            },
            "hyperparameters": HYPERPARAMETERS,
            "trainer": {
                "max_steps": steps,
                "epoch_num_steps": steps,
                "test_step_num_episodes": 1,
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
    trainer.train_envs.close()
    trainer.test_envs.close()
    return {
        "library": "rlfleet (wrappers)" if wrappers else "rlfleet",
        "env_id": env_id,
        "seed": seed,
        "train_s": wall - result.test_time_s,
        "frames": result.env_steps * FRAME_SKIP,
        "gradient_steps": result.gradient_steps,
    }


def sb3_run(game: str, frames: int, seed: int) -> dict[str, Any]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    env_id = f"{game}NoFrameskip-v4"
    env = VecFrameStack(make_atari_env(env_id, n_envs=8, seed=seed), n_stack=4)

    def linear(start: float) -> Any:
        return lambda remaining: remaining * start

    model = PPO(
        "CnnPolicy",
        env,
        n_steps=128,
        batch_size=256,
        n_epochs=4,
        learning_rate=linear(2.5e-4),
        clip_range=linear(0.1),
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        gamma=0.99,
        gae_lambda=0.95,
        seed=seed,
        device="cpu",
        verbose=0,
    )
    t0 = time.perf_counter()
    model.learn(frames // FRAME_SKIP)
    wall = time.perf_counter() - t0
    env.close()
    return {
        "library": "sb3",
        "env_id": env_id,
        "seed": seed,
        "train_s": wall,
        "frames": model.num_timesteps * FRAME_SKIP,
        "gradient_steps": model._n_updates * (1024 // 256),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--game", default="Pong", help="ALE game name, e.g. Pong, Breakout")
    parser.add_argument("--frames", type=int, default=100_000, help="emulator frames per run")
    parser.add_argument("--repeats", type=int, default=1, help="runs per library")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for all runs")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs = (
        lambda seed: rlfleet_run(args.game, args.frames, seed, wrappers=False),
        lambda seed: sb3_run(args.game, args.frames, seed),
        lambda seed: rlfleet_run(args.game, args.frames, seed, wrappers=True),
    )
    rows: list[dict[str, Any]] = []
    for seed in range(args.repeats):
        for run in runs:
            row = run(seed)
            row["frames_per_s"] = row["frames"] / row["train_s"]
            rows.append(row)
            print(
                f"{row['library']:18s} seed {seed}: {row['train_s']:7.1f} s, "
                f"{row['frames_per_s']:7.0f} frames/s ({row['gradient_steps']} gradient steps)",
                flush=True,
            )
    report = _report(rows, args)
    print(report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / "ppo_atari.parquet")
    (RESULTS / "ppo_atari.md").write_text(report + "\n")


def _report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    def median(library: str) -> float:
        return float(np.median([r["frames_per_s"] for r in rows if r["library"] == library]))

    sb3 = median("sb3")
    lines = [
        f"# PPO {args.game}: rlfleet vs Stable-Baselines3 ({args.frames:,} frames per run, "
        f"{args.repeats} run(s) each, {args.threads} torch thread(s), "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        "Identical hyperparameters (RL-Zoo Atari set, Nature CNN, 8 envs). Medians; "
        "training wall time excludes evaluation.",
        "",
        "| library | env | env frames/s | vs SB3 |",
        "|---|---|---|---|",
    ]
    for library in ("rlfleet", "rlfleet (wrappers)", "sb3"):
        env_id = next(r["env_id"] for r in rows if r["library"] == library)
        fps = median(library)
        lines.append(f"| {library} | `{env_id}` | {fps:,.0f} | {fps / sb3:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
