"""Learning parity of bf16 update steps (trainer setting ``precision: bf16``) against fp32:
SAC on Pendulum-v1, PPO on CartPole-v1 and PPO with the Nature CNN on PixelCartPole (CartPole
drawn into 36x36 frames, ``bench/pixel_cartpole.py``), three seeds each, final returns and
time per gradient step.

    PYTHONPATH=$PWD python bench/precision.py

``precision: bf16`` runs the update step's matrix products in bfloat16 with fp32 results
(:mod:`rlfleet.nn.precision`); it needs a CPU with AVX-512 BF16 or AMX (or a CUDA device
with bf16), and this script stops with that error elsewhere. Each run is a fresh
``python bench/precision.py --worker ...`` process (:mod:`harness`); for each seed the two
precisions run in turn, so that drift in machine load hits both. The settings are the
``identical`` ones of ``bench/sac_pendulum.py`` and ``bench/ppo_cartpole.py`` (RL-Zoo's
hyperparameters), at the env-step budgets ``--sac-steps`` and ``--ppo-steps`` (SAC's shorter
than that script's 20k by default: Pendulum is mostly learnt by 8k steps, and three seeds of
two precisions at 20k take an hour on two cores). The CNN workload (``--cnn-steps``, 0 leaves
it out) takes the PixelCartPole settings of ``bench/distributed.py``: the convolutions are
where bf16 pays on a CPU with AMX. The final return is the mean of the test step that ends
each run (10 episodes for SAC, 20 for PPO, greedy).

Results go to ``bench/results/precision.md`` and ``precision.parquet`` (one row per process).
A run on another CPU keeps the earlier CPUs' runs beside its own, each machine's under its own
heading (``--report-only`` rewrites the report from the stored runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import ppo_cartpole
import sac_pendulum
from compare import Comparison, rlfleet_run
from distributed import IMAGE_ENV, IMAGE_HYPERPARAMETERS
from harness import (
    NOT_RECORDED,
    counted,
    cpu_of,
    groups,
    machine_line,
    run_worker,
    save,
    start_worker,
    stored_runs,
    threads_of,
    with_earlier_runs,
    write_result,
)

from rlfleet.nn.device import resolve_device
from rlfleet.nn.precision import check_precision

CNN = Comparison(
    title="PPO PixelCartPole (36x36 frames, Nature CNN)",
    algo="ppo",
    env_id=IMAGE_ENV,
    budget=60_000,
    solve_budget=60_000,
    target=475.0,
    eval_episodes=20,
    sb3_eval_freq=0,
    num_envs=8,
    rlfleet_hyperparameters=IMAGE_HYPERPARAMETERS["ppo"],
    sb3_hyperparameters={},
    results="precision",
)
"""PPO on the image task, as ``bench/distributed.py`` trains it (no SB3 side here)."""
SPECS: dict[str, Comparison] = {"sac": sac_pendulum.SPEC, "ppo": ppo_cartpole.SPEC, "cnn": CNN}
PRECISIONS = ("fp32", "bf16")


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One run in this process at ``args.precision``."""
    spec = SPECS[args.algo]
    return rlfleet_run(
        spec.algo,
        spec.env_id,
        args.seed,
        mode="identical",
        eval_episodes=spec.eval_episodes,
        hyperparameters=spec.rlfleet_hyperparameters,
        max_steps=args.steps,
        num_envs=spec.num_envs,
        trainer_settings={"precision": args.precision},
    )


def measure(budgets: dict[str, int], seeds: int, threads: int) -> list[dict[str, Any]]:
    script = Path(__file__).resolve()
    rows: list[dict[str, Any]] = []
    for algo, steps in budgets.items():
        spec = SPECS[algo]
        case = f"{spec.title}, {steps // 1000}k steps"
        for seed in range(seeds):
            for precision in PRECISIONS:
                args = ["--algo", algo, "--steps", str(steps), "--precision", precision]
                row = run_worker(script, "rlfleet", seed, [*args, "--threads", str(threads)])
                row.update(
                    case=case,
                    algo=algo,
                    precision=precision,
                    seed=seed,
                    steps=steps,
                    threads=threads,
                )
                rows.append(row)
                print(
                    f"{case} | {precision} seed {seed}: process {row['process_s']:7.2f} s, "
                    f"{1e3 * row['train_s'] / max(row['gradient_steps'], 1):.2f} ms per "
                    f"gradient step, return {row['final_return']:.1f}",
                    flush=True,
                )
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    """Markdown: per machine and invocation (with its load and thread count), per case, each
    precision's final returns by seed, time per gradient step and process time."""
    lines = [
        f"# bf16 update steps against fp32 ({time.strftime('%Y-%m-%d')})",
        "",
        "Trainer setting `precision` fp32 and bf16 (the update step's matrix products and "
        "convolutions in bfloat16, results rounded to bf16), RL-Zoo hyperparameters as in the "
        "`identical` setting of bench/sac_pendulum.py and bench/ppo_cartpole.py, and for the "
        "CNN the PixelCartPole settings of bench/distributed.py, the two precisions in turn "
        "per seed. Final return: the greedy test step that ends each run. Per gradient step: "
        "in-process training time (test steps excluded) over gradient steps; for PPO it "
        "includes collection, a large share of its time.",
        "",
    ]
    # A section per machine and invocation: the runs of one command on one CPU, whose
    # thread count and budgets its tables share.
    for where, invocation in dict.fromkeys(map(_section_key, rows)):
        mine = [r for r in rows if _section_key(r) == (where, invocation)]
        first = mine[0]
        lines += [
            f"## {cpu_of(where)}, {counted(threads_of(first), 'thread')}",
            "",
            f"`{invocation}`, {counted(1 + max(r['seed'] for r in mine), 'seed')}.",
            "",
            machine_line((first["load_before"], first["load_after"]), where),
            "",
        ]
        lines += _machine_tables(mine)
    return "\n".join(lines)


def _section_key(row: dict[str, Any]) -> tuple[str, str]:
    return row.get("machine") or NOT_RECORDED, row["invocation"]


def _machine_tables(rows: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for case, _, runs in groups(rows):
        lines += [
            f"### {case}",
            "",
            "| precision | final return per seed | median | per gradient step, median ms | "
            "whole process, median s |",
            "|---|---|---|---|---|",
        ]
        for precision in PRECISIONS:
            mine = sorted((r for r in runs if r["precision"] == precision), key=lambda r: r["seed"])
            returns = [r["final_return"] for r in mine]
            per_step = statistics.median(
                1e3 * r["train_s"] / max(r["gradient_steps"], 1) for r in mine
            )
            lines.append(
                f"| {precision} | {', '.join(f'{x:.1f}' for x in returns)} | "
                f"{statistics.median(returns):.1f} | {per_step:.2f} | "
                f"{statistics.median(r['process_s'] for r in mine):.2f} |"
            )
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3, help="seeds per algorithm and precision")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for every run")
    parser.add_argument("--sac-steps", type=int, default=8_000)
    parser.add_argument("--ppo-steps", type=int, default=100_000)
    parser.add_argument("--cnn-steps", type=int, default=60_000, help="0: no CNN workload")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the report from the stored runs, running nothing",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--algo", choices=sorted(SPECS), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--precision", choices=PRECISIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        start_worker(args.threads)
        write_result(args.result, worker(args))
        return
    if args.report_only:
        rows = stored_runs("precision")
        save("precision", rows, report(rows))
        return
    check_precision("bf16", resolve_device("cpu"), "bench/precision.py")
    budgets = {"sac": args.sac_steps, "ppo": args.ppo_steps, "cnn": args.cnn_steps}
    budgets = {algo: steps for algo, steps in budgets.items() if steps > 0}
    before = os.getloadavg()[0]
    rows = measure(budgets, args.seeds, args.threads)
    invocation = (
        f"python bench/precision.py --seeds {args.seeds} --sac-steps {args.sac_steps} "
        f"--ppo-steps {args.ppo_steps} --cnn-steps {args.cnn_steps} --threads {args.threads}"
    )
    after = os.getloadavg()[0]
    for row in rows:
        row.update(invocation=invocation, load_before=before, load_after=after)
    rows = with_earlier_runs("precision", rows)
    save("precision", rows, report(rows))


if __name__ == "__main__":
    main()
