"""``torch.compile`` of the update step (trainer setting ``compile: true``): whole processes
with it off, on with an empty compile cache (cold), and on with the cache the cold run left
(warm), for PPO CartPole, DQN CartPole and SAC Pendulum.

    PYTHONPATH=$PWD python bench/compile.py --pairs 2

Each run is a fresh ``python bench/compile.py --worker ...`` process (imports, compilation,
training and the final evaluation), timed from spawn to exit (:mod:`harness`). One pair runs
off, cold and warm in turn, so that drift in machine load hits all three; the cold run of a
pair compiles into a new, empty cache directory (``RLFLEET_CACHE_DIR``, see
:mod:`rlfleet.nn.compile`) and the warm run of the same pair reads it. The settings are the
``identical`` ones of ``bench/ppo_cartpole.py``, ``bench/dqn_cartpole.py`` and
``bench/sac_pendulum.py`` (RL-Zoo's hyperparameters), at the env-step budgets given by
``--ppo-steps``, ``--dqn-steps`` and ``--sac-steps`` (shorter than those scripts' by default,
so that the whole comparison takes minutes: the compile cost is paid once per process,
whatever the budget, so a longer budget only adds the per-step difference the report shows).

Results go to ``bench/results/compile.md`` and ``compile.parquet`` (one row per process).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import dqn_cartpole
import ppo_cartpole
import sac_pendulum
from compare import Comparison, rlfleet_run
from harness import (
    argument_parser,
    machine_line,
    pair_ratios,
    run_worker,
    save,
    start_worker,
    write_result,
)

SPECS: dict[str, Comparison] = {
    "ppo": ppo_cartpole.SPEC,
    "dqn": dqn_cartpole.SPEC,
    "sac": sac_pendulum.SPEC,
}
OFF, COLD, WARM = "compile off", "compile on, cold cache", "compile on, warm cache"
MODES = (OFF, COLD, WARM)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One run in this process, compiled into ``args.cache_dir`` when it is given."""
    if args.cache_dir:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        os.environ["RLFLEET_CACHE_DIR"] = args.cache_dir
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
        trainer_settings={"compile": bool(args.cache_dir)},
    )


def measure(budgets: dict[str, int], pairs: int, threads: int) -> list[dict[str, Any]]:
    """``pairs`` rounds of off, cold and warm per algorithm."""
    script = Path(__file__).resolve()
    rows: list[dict[str, Any]] = []
    for algo, steps in budgets.items():
        spec = SPECS[algo]
        case = f"{spec.title}, {steps // 1000}k steps"
        for pair in range(pairs):
            with tempfile.TemporaryDirectory() as cache:
                for mode in MODES:
                    args = ["--algo", algo, "--steps", str(steps), "--threads", str(threads)]
                    if mode != OFF:
                        args += ["--cache-dir", cache]
                    row = run_worker(script, "rlfleet", pair, args)
                    row.update(case=case, algo=algo, library=mode, pair=pair, steps=steps)
                    rows.append(row)
                    print(
                        f"{case} | {mode:24s} pair {pair}: process {row['process_s']:7.2f} s, "
                        f"training {row['train_s']:7.2f} s, return {row['final_return']:.1f}",
                        flush=True,
                    )
    return rows


def report(rows: list[dict[str, Any]], invocation: str, load: tuple[float, float]) -> str:
    """Markdown: per algorithm and mode, the median whole-process time, the per-pair ratio
    against compile off, training time, time per gradient step and final return."""
    pairs = 1 + max(r["pair"] for r in rows)
    lines = [
        f"# torch.compile of the update step ({time.strftime('%Y-%m-%d')})",
        "",
        f"`{invocation}`: whole-process wall time (spawn to exit: imports, compilation, "
        "training, final evaluation) with the trainer setting `compile` off, on with an empty "
        "compile cache (cold) and on with the cache the cold run of the same pair left (warm). "
        f"{pairs} alternating pairs per algorithm (seed = pair). RL-Zoo hyperparameters as in "
        "the `identical` setting of bench/ppo_cartpole.py, dqn_cartpole.py and "
        "sac_pendulum.py, at the budgets named below (shorter than those scripts': compilation "
        "is paid once per process, so a longer budget changes only the per-step share).",
        "",
        machine_line(load),
        "",
    ]
    for case in dict.fromkeys(r["case"] for r in rows):
        runs = [r for r in rows if r["case"] == case]
        lines += [
            f"## {case}",
            "",
            "| mode | whole process, median s | compile off / this, per pair | training "
            "only, median s | per gradient step, median ms | final return, median |",
            "|---|---|---|---|---|---|",
        ]
        for mode in MODES:
            mine = [r for r in runs if r["library"] == mode]
            ratios = pair_ratios(runs, case, mode, OFF)
            cell = "—" if mode == OFF else ", ".join(f"{x:.2f}" for x in ratios)
            per_step = statistics.median(
                1e3 * r["train_s"] / max(r["gradient_steps"], 1) for r in mine
            )
            lines.append(
                f"| {mode} | {statistics.median(r['process_s'] for r in mine):.2f} | {cell} | "
                f"{statistics.median(r['train_s'] for r in mine):.2f} | {per_step:.2f} | "
                f"{statistics.median(r['final_return'] for r in mine):.1f} |"
            )
        lines.append("")
    lines += [
        "Training only and per gradient step include the compilation, which happens in the "
        "first update steps (a ratio above 1 means compiling won).",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.set_defaults(pairs=2)
    parser.add_argument("--ppo-steps", type=int, default=100_000)
    parser.add_argument("--dqn-steps", type=int, default=20_000)
    parser.add_argument("--sac-steps", type=int, default=3_000)
    parser.add_argument("--algo", choices=sorted(SPECS), help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        start_worker(args.threads)
        write_result(args.result, worker(args))
        return
    budgets = {"ppo": args.ppo_steps, "dqn": args.dqn_steps, "sac": args.sac_steps}
    before = os.getloadavg()[0]
    rows = measure(budgets, args.pairs, args.threads)
    invocation = (
        f"python bench/compile.py --pairs {args.pairs} --ppo-steps {args.ppo_steps} "
        f"--dqn-steps {args.dqn_steps} --sac-steps {args.sac_steps}"
    )
    text = report(rows, invocation, (before, os.getloadavg()[0]))
    save("compile", rows, text)


if __name__ == "__main__":
    main()
