"""PPO on an Atari game: rlfleet vs Stable-Baselines3 with identical hyperparameters,
whole processes side by side.

Both libraries train PPO with RL-Zoo's Atari settings (8 envs, ``n_steps`` 128, batch 256,
4 epochs, learning rate linear from 2.5e-4, clip range linear from 0.1, entropy 0.01,
value coefficient 0.5, gradient clip 0.5, gamma 0.99, GAE lambda 0.95) and the Nature CNN
shared by linear actor and critic heads, on SB3's Atari preprocessing (no-op reset 30,
frame skip 4 with max-pool, episodic life, fire reset, 84x84 grayscale, 4-frame stack,
reward clipping, no sticky actions), then evaluate one greedy episode. The budget is
counted in emulator frames (4 per agent step).

Contenders, alternating (``bench/harness.py`` times each as a fresh process):

``sb3``
    ``make_atari_env("<Game>NoFrameskip-v4")`` + ``VecFrameStack(4)`` (SB3's own recipe,
    ``DummyVecEnv``).
``rlfleet``
    ``ALE/<Game>-v5`` with sticky actions off: ale-py's C++ vector env doing the
    preprocessing (what ``rlfleet train ppo --env ALE/<Game>-v5`` uses).
``rlfleet (bf16)``, with ``--bf16``
    ``rlfleet`` with the trainer setting ``precision: bf16``: the update step's matrix
    products and convolutions in bfloat16 with fp32 results (:mod:`rlfleet.nn.precision`;
    it needs a CPU with AVX-512 BF16 or AMX). Acting stays fp32.
``rlfleet (wrappers)``, with ``--wrappers``
    ``<Game>NoFrameskip-v4`` through rlfleet's Python wrappers in a sync vector env: the
    same env pipeline as SB3, so the difference is the learner alone.

Results go to ``bench/results/ppo_atari.*``. Needs the ``bench`` and ``atari`` extras (and
OpenCV for SB3's wrappers).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from compare import BF16, CONTENDERS, identical_hyperparameters
from harness import (
    Case,
    Contender,
    argument_parser,
    report,
    run_pairs,
    save,
    start_worker,
    with_earlier_runs,
    write_result,
)

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


def rlfleet_run(
    game: str,
    frames: int,
    seed: int,
    *,
    wrappers: bool,
    device: str = "cpu",
    precision: str = "fp32",
) -> dict[str, Any]:
    import torch

    from rlfleet.runs.config import default_run_config
    from rlfleet.runs.run import make_trainer

    env_id = f"{game}NoFrameskip-v4" if wrappers else f"ALE/{game}-v5"
    steps = frames // FRAME_SKIP
    cfg = default_run_config(
        "ppo",
        env_id,
        {
            "seed": seed,
            # The worker's thread count (set by ``start_worker``), for rlfleet as for SB3.
            "torch_threads": torch.get_num_threads(),
            "device": device,
            "env": {
                "num_envs": 8,
                "num_test_envs": 1,
                "vector_mode": "sync" if wrappers else "native",
                "atari": {"repeat_action_probability": 0.0},
            },
            "hyperparameters": identical_hyperparameters("ppo", HYPERPARAMETERS),
            "trainer": {
                "max_steps": steps,
                "epoch_num_steps": steps,
                "test_step_num_episodes": 1,
                "target_reward": None,
                "test_in_training": False,
                "show_progress": False,
                "verbose": False,
                "precision": precision,
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
        "env_id": env_id,
        "train_s": wall - result.test_time_s,
        "final_return": result.best_score,
        "frames": result.env_steps * FRAME_SKIP,
        "gradient_steps": result.gradient_steps,
    }


def sb3_run(game: str, frames: int, seed: int, device: str = "cpu") -> dict[str, Any]:
    import ale_py
    import gymnasium
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecFrameStack

    gymnasium.register_envs(ale_py)  # gymnasium >= 1.0 registers ALE ids only when asked
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
        device=device,
        verbose=0,
    )
    t0 = time.perf_counter()
    model.learn(frames // FRAME_SKIP)
    wall = time.perf_counter() - t0
    env.close()
    eval_env = VecFrameStack(make_atari_env(env_id, n_envs=1, seed=999), n_stack=4)
    final, _ = evaluate_policy(model, eval_env, n_eval_episodes=1, deterministic=True)
    return {
        "env_id": env_id,
        "train_s": wall,
        "final_return": float(final),
        "frames": model.num_timesteps * FRAME_SKIP,
        "gradient_steps": model._n_updates * (1024 // 256),
    }


def _frames_per_s(runs: list[dict[str, Any]]) -> list[str]:
    cells = []
    for library in dict.fromkeys(r["library"] for r in runs):
        mine = sorted(r["frames"] / r["process_s"] for r in runs if r["library"] == library)
        cells.append(f"{library} {mine[len(mine) // 2]:,.0f}")
    return ["", "Frames per second of whole-process time, median: " + "; ".join(cells) + "."]


def main() -> None:
    parser = argument_parser(__doc__, interleaved_threads=True)
    parser.add_argument("--game", default="Pong", help="ALE game name, e.g. Pong, Breakout")
    parser.add_argument("--frames", type=int, default=50_000, help="emulator frames per run")
    parser.add_argument(
        "--wrappers", action="store_true", help="also time rlfleet on SB3's env pipeline"
    )
    parser.add_argument(
        "--bf16", action="store_true", help="also time rlfleet with trainer.precision bf16"
    )
    args = parser.parse_args()
    if args.worker is not None:
        start_worker(args.threads)
        if args.worker == "sb3":
            row = sb3_run(args.game, args.frames, args.seed, args.device)
        else:
            row = rlfleet_run(
                args.game,
                args.frames,
                args.seed,
                wrappers=args.worker == "wrappers",
                device=args.device,
                precision="bf16" if args.worker == BF16.worker else "fp32",
            )
        write_result(args.result, row)
        return
    contenders = list(CONTENDERS)
    if args.bf16:
        contenders.append(BF16)
    if args.wrappers:
        contenders.append(Contender("rlfleet (wrappers)", "wrappers"))
    case = Case(
        f"PPO {args.game}, identical ({args.frames // 1000}k frames)",
        ("--game", args.game, "--frames", str(args.frames)),
    )
    rows = run_pairs(Path(__file__).resolve(), [case], contenders, args.pairs, args.threads)
    rows = with_earlier_runs("ppo_atari", rows)
    text = report(
        f"PPO {args.game}: rlfleet vs Stable-Baselines3",
        "Whole-process wall time: a fresh Python process per run (imports, set-up, training "
        "and one greedy evaluation episode), the libraries alternating. Identical "
        "hyperparameters (RL-Zoo Atari set, Nature CNN, 8 envs). Training only: the "
        "in-process time of training alone, evaluation excluded. Both libraries at the same "
        "torch thread count in each table; `--threads 1,2` times both, interleaved within "
        "each pair.",
        rows,
        reference="sb3",
        extra=_frames_per_s,
    )
    save("ppo_atari", rows, text)


if __name__ == "__main__":
    main()
