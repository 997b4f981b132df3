"""rlfleet against Stable-Baselines3 on one algorithm and env (``ppo_cartpole.py``,
``dqn_cartpole.py``, ``sac_pendulum.py``): each script is a :class:`Comparison` and its
docstring, and :func:`main` times both libraries as whole processes (:mod:`harness`).

Two settings, both by default:

``identical``
    RL-Zoo's hyperparameters in both libraries for ``budget`` env steps, then the library's
    own greedy evaluation of ``eval_episodes`` episodes (rlfleet: the trainer's test step at
    the end of its one epoch; SB3: ``evaluate_policy``).
``solve``
    Each library with its own preset (rlfleet's shipped one, RL-Zoo's for SB3) until the mean
    evaluation return first reaches ``target``, evaluating on its own cadence (rlfleet: test
    steps and tests in training; SB3: an ``EvalCallback`` every ``sb3_eval_freq`` env steps).

``--bf16`` also times ``rlfleet (bf16)``: rlfleet with the trainer setting
``precision: bf16`` (the update step's matrix products in bfloat16 with fp32 results,
:mod:`rlfleet.nn.precision`; it needs a CPU with AVX-512 BF16 or AMX), in the same pairs.

Both libraries run with ``--threads`` torch threads (rlfleet as its ``torch_threads``
setting). ``--threads 1,2`` times both counts, interleaved within each pair, and the report
gives each library at its fastest count against the other's (SB3 at its fastest setting).
Results at other thread counts from earlier runs of the same case are kept. The worker
processes import their library themselves, so its import time is part of the figure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    Case,
    Contender,
    argument_parser,
    report,
    run_pairs,
    save,
    start_worker,
    stored_runs,
    with_earlier_runs,
    write_result,
)

CONTENDERS = (Contender("rlfleet", "rlfleet"), Contender("sb3", "sb3"))
THREADED = Contender("rlfleet-threaded", "rlfleet-threaded")
"""rlfleet with ``threaded: true``, against plain rlfleet under ``--threaded``."""
CUDA_GRAPHS = Contender("rlfleet-cuda-graphs", "rlfleet-cuda-graphs")
"""rlfleet with ``cuda_graphs: true`` (``bench/gpu.py`` times it beside plain rlfleet)."""
BF16 = Contender("rlfleet (bf16)", "rlfleet-bf16")
"""rlfleet with ``precision: bf16``, beside plain rlfleet and SB3 under ``--bf16``."""
QUIET = {"show_progress": False, "verbose": False}
WORKER_SETTINGS: dict[str, dict[str, Any]] = {
    CUDA_GRAPHS.worker: {"cuda_graphs": True},
    BF16.worker: {"precision": "bf16"},
}
"""The trainer settings each rlfleet worker adds to plain rlfleet's."""


@dataclass(frozen=True)
class Comparison:
    """One algorithm on one env, rlfleet against Stable-Baselines3."""

    title: str
    """e.g. ``DQN CartPole-v1``."""
    algo: str
    """rlfleet's algorithm name; SB3's class is its upper-case spelling."""
    env_id: str
    budget: int
    """Env steps of the identical setting."""
    solve_budget: int
    """Most env steps SB3 may take in the solve setting (rlfleet's preset has its own)."""
    target: float
    """Mean eval return that counts as solved."""
    eval_episodes: int
    sb3_eval_freq: int
    """Env steps between SB3's evaluations in the solve setting."""
    num_envs: int
    """Training envs of the identical setting in both libraries, and of SB3's preset."""
    rlfleet_hyperparameters: dict[str, Any]
    sb3_hyperparameters: dict[str, Any]
    results: str
    """File stem of the results in bench/results/."""


def identical_hyperparameters(algo: str, given: dict[str, Any]) -> dict[str, Any]:
    """Every hyperparameter of ``algo`` for the identical setting: the algorithm's own
    defaults with ``given`` (the comparison's) on top. A hyperparameter the comparison leaves
    out keeps the default, not the value of the shipped preset for the env: a preset's
    ``n_step: 3`` must not reach a comparison with SB3's 1-step targets."""
    from rlfleet.algos.registry import get_algorithm
    from rlfleet.config.loader import to_dict

    return {**to_dict(get_algorithm(algo).config_class()), **given}


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
    num_envs: int = 1,
    threaded: bool = False,
    trainer_settings: dict[str, Any] | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """One rlfleet training run in this process: ``identical`` trains ``max_steps`` with the
    given hyperparameters and ends with one test step of ``eval_episodes``; ``solve`` uses
    the shipped preset until ``target`` is reached. ``threaded``: collection on a thread of
    its own (the trainer setting); ``trainer_settings``: more trainer settings on top (e.g.
    ``compile``, ``precision``); ``device``: the torch device of the networks."""
    import torch

    from rlfleet.envs.make import choose_vector_mode
    from rlfleet.runs.config import default_run_config
    from rlfleet.runs.run import make_trainer

    trainer_cfg: dict[str, Any] = {
        **QUIET,
        "test_step_num_episodes": eval_episodes,
        "threaded": threaded,
        **(trainer_settings or {}),
    }
    # The worker's thread count (set by ``start_worker``), for rlfleet as for SB3.
    overrides: dict[str, Any] = {
        "seed": seed,
        "trainer": trainer_cfg,
        "torch_threads": torch.get_num_threads(),
        "device": device,
    }
    if mode == "identical":
        assert max_steps is not None
        trainer_cfg.update(
            max_steps=max_steps,
            epoch_num_steps=max_steps,
            target_reward=None,
            test_in_training=False,
        )
        overrides["hyperparameters"] = identical_hyperparameters(algo, hyperparameters or {})
        # The vector mode `rlfleet train` picks (auto): the env's native vectorised entry
        # point where it has one and there are several envs, else a loop in this process.
        overrides["env"] = {"num_envs": num_envs}
    else:
        trainer_cfg["target_reward"] = target
    trainer = make_trainer(default_run_config(algo, env_id, overrides), None)
    t0 = time.perf_counter()
    result = trainer.run()
    train_s = time.perf_counter() - t0 - result.test_time_s
    solved = target is not None and result.best_score >= target
    trainer.test_envs.close()
    if trainer.train_envs is not None:
        trainer.train_envs.close()
    return {
        "train_s": train_s,
        # One epoch in the identical setting: its one test step is the final evaluation.
        "final_return": result.best_score,
        "env_steps": result.best_env_step if solved else result.env_steps,
        "solved": solved if mode == "solve" else None,
        "gradient_steps": trainer.algorithm.gradient_steps,
        "vector_mode": choose_vector_mode(env_id, num_envs) if mode == "identical" else None,
    }


def sb3_run(
    spec: Comparison, seed: int, mode: str, budget: int, device: str = "cpu"
) -> dict[str, Any]:
    """One SB3 run in this process, in either setting, on ``device``."""
    import stable_baselines3
    from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    n_envs = spec.num_envs
    env = make_vec_env(spec.env_id, n_envs=n_envs, seed=seed)
    eval_env = make_vec_env(spec.env_id, n_envs=1, seed=999)
    algo = getattr(stable_baselines3, spec.algo.upper())
    model = algo("MlpPolicy", env, seed=seed, device=device, verbose=0, **spec.sb3_hyperparameters)
    if mode == "identical":
        t0 = time.perf_counter()
        model.learn(budget)
        train_s = time.perf_counter() - t0
        final, _ = evaluate_policy(
            model, eval_env, n_eval_episodes=spec.eval_episodes, deterministic=True
        )
        return {
            "train_s": train_s,
            "final_return": float(final),
            "env_steps": model.num_timesteps,
            "solved": None,
        }

    class TimedEval(EvalCallback):
        """SB3's EvalCallback that also adds up the time spent evaluating."""

        eval_s = 0.0

        def _on_step(self) -> bool:
            t0 = time.perf_counter()
            keep_going: bool = super()._on_step()
            if self.eval_freq > 0 and self.n_calls % self.eval_freq == 0:
                self.eval_s += time.perf_counter() - t0
            return keep_going

    callback = TimedEval(
        eval_env,
        n_eval_episodes=spec.eval_episodes,
        eval_freq=max(spec.sb3_eval_freq // n_envs, 1),
        callback_on_new_best=StopTrainingOnRewardThreshold(reward_threshold=spec.target),
        verbose=0,
    )
    t0 = time.perf_counter()
    model.learn(spec.solve_budget, callback=callback)
    train_s = time.perf_counter() - t0 - callback.eval_s
    return {
        "train_s": train_s,
        "final_return": float(callback.best_mean_reward),
        "env_steps": model.num_timesteps,
        "solved": bool(callback.best_mean_reward >= spec.target),
    }


def main(spec: Comparison, description: str | None) -> None:
    """Orchestrate the comparison, or (``--worker``) run one side of it in this process."""
    parser = argument_parser(description, interleaved_threads=True)
    parser.add_argument("--mode", choices=["identical", "solve", "both"], default="both")
    parser.add_argument("--steps", type=int, default=spec.budget, help="identical: env steps")
    parser.add_argument(
        "--threaded",
        action="store_true",
        help="compare rlfleet with threaded collection against rlfleet without it, instead "
        f"of against SB3 (results in bench/results/{spec.results}_threaded.*)",
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="also time rlfleet with the trainer setting precision: bf16 (needs a CPU with "
        "AVX-512 BF16 or AMX)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the report (and the README's table) from the stored results, running nothing",
    )
    args = parser.parse_args()
    if args.worker is not None:
        start_worker(args.threads)
        if args.worker == "sb3":
            row = sb3_run(spec, args.seed, args.mode, args.steps, args.device)
        else:
            row = rlfleet_run(
                spec.algo,
                spec.env_id,
                args.seed,
                mode=args.mode,
                eval_episodes=spec.eval_episodes,
                hyperparameters=spec.rlfleet_hyperparameters,
                max_steps=args.steps,
                target=spec.target if args.mode == "solve" else None,
                num_envs=spec.num_envs,
                threaded=args.worker == THREADED.worker,
                trainer_settings=WORKER_SETTINGS.get(args.worker),
                device=args.device,
            )
        write_result(args.result, row)
        return

    modes = ["identical", "solve"] if args.mode == "both" else [args.mode]
    shared = ("--steps", str(args.steps))
    names = {
        "identical": f"{spec.title}, identical ({args.steps // 1000}k steps)",
        "solve": f"{spec.title}, until eval return ≥ {spec.target:g}",
    }
    cases = [Case(names[m], ("--mode", m, *shared)) for m in modes]
    contenders = (CONTENDERS[0], THREADED) if args.threaded else CONTENDERS
    if args.bf16:
        contenders = (*contenders, BF16)
    stem = f"{spec.results}_threaded" if args.threaded else spec.results
    if args.report_only:
        rows = stored_runs(stem)
    else:
        rows = run_pairs(
            Path(__file__).resolve().parent / f"{spec.results}.py",
            cases,
            contenders,
            args.pairs,
            args.threads,
        )
        for row in rows:
            row["mode"] = "identical" if row["case"] == names["identical"] else "solve"
        rows = with_earlier_runs(stem, rows)
    if args.threaded:
        text = report(
            f"{spec.title}: rlfleet with threaded collection vs without",
            "Whole-process wall time: a fresh Python process per run, the two settings "
            "alternating. rlfleet-threaded steps the envs on a thread of its own while the "
            "learner takes its gradient steps (trainer setting `threaded: true`); everything "
            "else is equal. Both at the same torch thread count.",
            rows,
            reference="rlfleet",
            extra=_solved_line,
        )
        save(f"{spec.results}_threaded", rows, text)
        return
    text = report(
        f"{spec.title}: rlfleet vs Stable-Baselines3",
        "Whole-process wall time: a fresh Python process per run (imports, set-up, training "
        "and the library's own evaluation), the libraries alternating. Identical: RL-Zoo's "
        "hyperparameters in both, then a greedy evaluation of "
        f"{spec.eval_episodes} episodes. Until eval return ≥ {spec.target:g}: each library's "
        "own preset and evaluation cadence. Each library steps its envs its own default "
        "way: rlfleet as `rlfleet train` does (vector mode `auto`: the env's native "
        "vectorised entry point, such as gymnasium's `CartPoleVectorEnv`, where it has one "
        "and there are several envs; else a loop in the process), SB3 with its `DummyVecEnv`. "
        "Training only: the in-process time of training alone, evaluation excluded. Both "
        "libraries at the same torch thread count in each table.",
        rows,
        reference="sb3",
        extra=_solved_line,
    )
    save(spec.results, rows, text)


def _solved_line(runs: list[dict[str, Any]]) -> list[str]:
    if runs[0]["solved"] is None:
        return []
    cells = []
    for library in dict.fromkeys(r["library"] for r in runs):
        mine = [r for r in runs if r["library"] == library]
        steps = sorted(r["env_steps"] for r in mine if r["solved"])
        cells.append(
            f"{library}: {sum(r['solved'] for r in mine)}/{len(mine)} solved"
            + (f", env steps {', '.join(f'{s:,}' for s in steps)}" if steps else "")
        )
    return ["", "Solved: " + "; ".join(cells) + "."]
