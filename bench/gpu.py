"""rlfleet on a CUDA GPU: the command-line path end to end, and speed against
Stable-Baselines3 on the same GPU.

    PYTHONPATH=$PWD python bench/gpu.py --pairs 2

End to end, for PPO CartPole-v1, DQN CartPole-v1, SAC Pendulum-v1 and PPO on ALE/Pong-v5,
and at shorter budgets A2C and TRPO on CartPole-v1 and TD3 and DDPG on Pendulum-v1, in
parallel processes:

1. ``rlfleet train ALGO --env ENV --device cuda`` for a short budget (it writes its
   checkpoints from the GPU);
2. ``rlfleet eval RUN --device cpu``: the checkpoint loads on a CPU and plays test episodes;
3. ``rlfleet play RUN --device cpu``;
4. the run's policy loaded on the GPU and on the CPU acts on the same 256 observations:
   the share of equal greedy actions (discrete) or the largest difference (continuous).

Each command must exit with 0; a failure is reported with its last output lines.

Speed: the ``identical`` settings of ``bench/ppo_cartpole.py``, ``bench/dqn_cartpole.py``,
``bench/sac_pendulum.py`` and ``bench/ppo_atari.py`` with both libraries on the GPU, whole
processes alternating (:mod:`harness`), at the env-step budgets of ``--ppo-steps``,
``--dqn-steps``, ``--sac-steps`` and ``--atari-frames``: shorter than the CPU scripts', so
that the whole run fits a short lease of a GPU machine. DQN's and SAC's settings also time
rlfleet with its gradient steps captured as CUDA graphs (``trainer.cuda_graphs``) in each
pair.

Results go to ``bench/results/gpu.md``, ``gpu.parquet`` (the timed runs) and
``gpu_checks.json`` (the checks, with each command's output); ``--results DIR`` writes them
elsewhere. ``--checks``, ``--check-scale`` and ``--speed`` run a part, and ``--keep`` keeps
the stored results of the rest, so that a short lease can finish what an earlier one began.
Without a GPU the script stops with a message; ``--device cpu`` runs the same on the CPU,
to try the script. Needs the ``bench`` and ``atari`` extras.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import dqn_cartpole
import ppo_cartpole
import sac_pendulum
from compare import CUDA_GRAPHS
from harness import (
    RESULTS,
    Case,
    Contender,
    machine,
    machines,
    pair_ratios,
    run_pairs,
    save,
    stored_runs,
)

BENCH = Path(__file__).resolve().parent
CONTENDERS = (Contender("rlfleet", "rlfleet"), Contender("sb3", "sb3"))


@dataclass(frozen=True)
class Check:
    """One end-to-end run of the command-line path."""

    algo: str
    env_id: str
    max_steps: int
    flags: tuple[str, ...] = ()
    """More ``rlfleet train`` flags."""
    eval_episodes: int = 5


CHECKS = (
    Check("ppo", "CartPole-v1", 20_000),
    Check("dqn", "CartPole-v1", 20_000),
    Check("sac", "Pendulum-v1", 3_000),
    Check("ppo", "ALE/Pong-v5", 8_000, ("--num-envs", "8"), eval_episodes=1),
    Check("a2c", "CartPole-v1", 5_000),
    Check("trpo", "CartPole-v1", 5_000),
    Check("td3", "Pendulum-v1", 2_000),
    Check("ddpg", "Pendulum-v1", 2_000),
)


def gpu_name(device: str) -> str:
    """The GPU's name (or ``cpu``) and the CPU, for the report."""
    import torch

    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        gpu = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
    else:
        gpu = "no GPU (device cpu)"
    return f"{gpu}; {machine()}"


def _command(argv: list[str], log: list[str]) -> tuple[bool, float, str]:
    """Run one ``rlfleet`` command; (exited with 0, seconds, its output)."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    output = done.stdout + done.stderr
    log.append(f"$ {' '.join(argv[2:])}  # exit {done.returncode}, {seconds:.1f} s\n{output}")
    return done.returncode == 0, seconds, output


def parity(run_dir: Path, device: str) -> tuple[str, float]:
    """The run's policy loaded on ``device`` and on the CPU, on the same observations:
    (``equal actions`` and its share, or ``largest difference`` and its size)."""
    import numpy as np

    from rlfleet.envs.make import make_vec_env
    from rlfleet.runs.run import load_algorithm

    on_gpu, cfg = load_algorithm(run_dir, device=device)
    on_cpu, _ = load_algorithm(run_dir, device="cpu")
    # The env as the run's test steps build it (Atari preprocessing included).
    env = make_vec_env(
        cfg.env.id,
        8,
        mode=cfg.env.vector_mode,
        env_kwargs=cfg.env.kwargs,
        atari=cfg.env.atari.for_evaluation(),
    )
    with contextlib.closing(env):
        obs, _ = env.reset(seed=1)
        batches = []
        for _ in range(32):
            batches.append(obs)
            obs, *_ = env.step(env.action_space.sample())
    observations = np.concatenate(batches)
    a, b = on_gpu.predict(observations), on_cpu.predict(observations)
    if np.issubdtype(a.dtype, np.integer):
        return "equal greedy actions", float(np.mean(a == b))
    return "largest action difference", float(np.max(np.abs(a - b)))


def run_check(check: Check, device: str, root: Path) -> dict[str, Any]:
    """Train, evaluate on the CPU, play on the CPU and compare actions, for one check."""
    from rlfleet.runs.run import evaluate

    run_dir = root / f"{check.algo}-{check.env_id.replace('/', '-')}"
    rlfleet = [sys.executable, "-m", "rlfleet"]
    log: list[str] = []
    row: dict[str, Any] = {"algo": check.algo, "env_id": check.env_id, "steps": check.max_steps}
    train = [*rlfleet, "train", check.algo, "--env", check.env_id, "--device", device]
    train += ["--max-steps", str(check.max_steps), "--run-dir", str(run_dir), *check.flags]
    row["trained"], row["train_s"], _ = _command(train, log)
    if row["trained"]:
        eval_argv = [*rlfleet, "eval", str(run_dir), "--device", "cpu"]
        row["eval_on_cpu"], _, _ = _command(
            [*eval_argv, "--episodes", str(check.eval_episodes)], log
        )
        row["play_on_cpu"], _, _ = _command(
            [*rlfleet, "play", str(run_dir), "--device", "cpu", "--episodes", "1"], log
        )
        stats, _ = evaluate(run_dir, check.eval_episodes, device="cpu")
        row["eval_return_cpu"] = float(statistics.mean(stats.returns))
        row["parity"], row["parity_value"] = parity(run_dir, device)
    row["log"] = "\n".join(log)
    return row


def run_checks(device: str, names: list[str] | None, scale: float) -> list[dict[str, Any]]:
    """The checks of ``names`` (``ALGO-ENV`` as ``ppo-CartPole-v1``; None: every one) at
    ``scale`` times their budgets, in parallel processes (each one's commands in turn)."""
    chosen = [
        replace(c, max_steps=max(int(c.max_steps * scale), 1_000))
        for c in CHECKS
        if names is None or f"{c.algo}-{c.env_id}" in names
    ]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(len(chosen)) as pool:
        rows = list(pool.map(lambda c: run_check(c, device, Path(tmp)), chosen))
    for row in rows:
        ok = row["trained"] and row.get("eval_on_cpu") and row.get("play_on_cpu")
        print(f"{row['algo']} {row['env_id']}: {'ok' if ok else 'FAILED'}", flush=True)
        if not ok:
            print(row["log"][-4000:], flush=True)
    return rows


def speed_cases(args: argparse.Namespace) -> list[tuple[Path, Case, tuple[Contender, ...]]]:
    """The timed settings of ``args.speed`` (ppo, dqn, sac, atari): (the comparison script,
    its case, who runs it) for each. On a CUDA device DQN's and SAC's are also run with
    ``cuda_graphs``."""
    shared = ("--mode", "identical", "--device", args.device)
    cases = []
    for key, spec, steps in (
        ("ppo", ppo_cartpole.SPEC, args.ppo_steps),
        ("dqn", dqn_cartpole.SPEC, args.dqn_steps),
        ("sac", sac_pendulum.SPEC, args.sac_steps),
    ):
        if key in args.speed:
            name = f"{spec.title}, identical ({steps / 1000:g}k steps)"
            case = Case(name, (*shared, "--steps", str(steps)))
            contenders = CONTENDERS
            if key in ("dqn", "sac") and args.device.startswith("cuda"):
                contenders = (CONTENDERS[0], CUDA_GRAPHS, CONTENDERS[1])
            cases.append((BENCH / f"{spec.results}.py", case, contenders))
    if "atari" in args.speed:
        frames = args.atari_frames
        atari = ("--game", "Pong", "--frames", str(frames))
        case = Case(
            f"PPO Pong, identical ({frames / 1000:g}k frames)",
            (*atari, "--device", args.device),
        )
        cases.append((BENCH / "ppo_atari.py", case, CONTENDERS))
    return cases


def report(checks: list[dict[str, Any]], runs: list[dict[str, Any]], where: str) -> str:
    """Markdown: the end-to-end table, then one speed table per case."""
    lines = [
        f"# rlfleet on a GPU ({time.strftime('%Y-%m-%d')})",
        "",
        f"Machine: {where}.",
        *[f"Some settings were timed on: {m}." for m in machines(runs) if m != where],
        "",
        "## The command-line path end to end",
        "",
        "`rlfleet train ALGO --env ENV --device cuda`, then `rlfleet eval RUN --device cpu` "
        "and `rlfleet play RUN --device cpu` on the checkpoint the GPU run wrote, then the "
        "policy loaded on the GPU and on the CPU acting on the same 256 observations.",
        "",
        "| algorithm | env | env steps | train (s, whole process) | eval on CPU | play on CPU "
        "| mean eval return (CPU) | GPU vs CPU actions |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in checks:
        same = f"{r['parity']}: {r['parity_value']:.4g}" if r.get("parity") is not None else "—"
        eval_return = r.get("eval_return_cpu")
        lines.append(
            f"| {r['algo']} | {r['env_id']} | {r['steps']:,} | "
            f"{'ok' if r['trained'] else 'FAILED'}, {r['train_s']:.1f} | "
            f"{_ok(r.get('eval_on_cpu'))} | {_ok(r.get('play_on_cpu'))} | "
            f"{'—' if eval_return is None else f'{eval_return:.1f}'} | {same} |"
        )
    lines += [
        "",
        "## Speed against Stable-Baselines3 on the same GPU",
        "",
        "Whole-process wall time (imports, CUDA start-up, set-up, training and the library's "
        "own evaluation), the libraries alternating, both on the GPU with the same torch "
        "thread count; the settings of the CPU comparisons (`bench/ppo_cartpole.py`, "
        "`dqn_cartpole.py`, `sac_pendulum.py`, `ppo_atari.py`) at shorter budgets.",
        "",
        "| setting | rlfleet, median s | sb3, median s | rlfleet speed-up (median; each pair) "
        "| training only, sb3 / rlfleet | final return, rlfleet / sb3 |",
        "|---|---|---|---|---|---|",
    ]
    for case in dict.fromkeys(r["case"] for r in runs):
        mine = [r for r in runs if r["case"] == case]
        theirs = [r for r in mine if r["library"] == "sb3"]
        for label in ("rlfleet", CUDA_GRAPHS.label):
            ours = [r for r in mine if r["library"] == label]
            if not ours or not theirs:
                continue
            ratios = pair_ratios(mine, case, label, "sb3")
            median = statistics.median
            train = median(r["train_s"] for r in theirs) / median(r["train_s"] for r in ours)
            setting = case if label == "rlfleet" else f"{case}, rlfleet with `cuda_graphs`"
            lines.append(
                f"| {setting} | {median(r['process_s'] for r in ours):.1f} | "
                f"{median(r['process_s'] for r in theirs):.1f} | **{median(ratios):.2f}×** ("
                + ", ".join(f"{x:.2f}" for x in ratios)
                + f") | {train:.2f}× | {median(r['final_return'] for r in ours):.1f} / "
                f"{median(r['final_return'] for r in theirs):.1f} |"
            )
    graphed = [r for r in runs if r["library"] == CUDA_GRAPHS.label]
    if graphed:
        lines += [
            "",
            "`cuda_graphs` captures each DQN gradient step (loss, gradients, clip, "
            "non-finite check, Adam), and each SAC gradient step (entropy coefficient, "
            "critics and actor, each with its check and Adam step), as a CUDA graph and "
            "replays it (`rlfleet/nn/cuda_graph.py`). Against rlfleet's eager steps in the "
            "same pairs:",
            "",
            "| setting | eager, median s | graphed, median s | graphed speed-up, whole "
            "process (each pair) | training only, eager / graphed | per gradient step, "
            "eager / graphed (ms) |",
            "|---|---|---|---|---|---|",
        ]
        for case in dict.fromkeys(r["case"] for r in graphed):
            mine = [r for r in runs if r["case"] == case]
            eager = [r for r in mine if r["library"] == "rlfleet"]
            captured = [r for r in mine if r["library"] == CUDA_GRAPHS.label]
            if not eager:
                continue
            ratios = pair_ratios(mine, case, CUDA_GRAPHS.label, "rlfleet")
            median = statistics.median
            per_step = [
                1000 * median(r["train_s"] / max(r["gradient_steps"], 1) for r in rows)
                for rows in (eager, captured)
            ]
            train = median(r["train_s"] for r in eager) / median(r["train_s"] for r in captured)
            lines.append(
                f"| {case} | {median(r['process_s'] for r in eager):.1f} | "
                f"{median(r['process_s'] for r in captured):.1f} | **{median(ratios):.2f}×** ("
                + ", ".join(f"{x:.2f}" for x in ratios)
                + f") | {train:.2f}× | {per_step[0]:.2f} / {per_step[1]:.2f} |"
            )
    return "\n".join(lines)


def _ok(value: bool | None) -> str:
    return "—" if value is None else ("ok" if value else "FAILED")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="torch device (cuda, cuda:N)")
    parser.add_argument("--pairs", type=int, default=2, help="alternating pairs per setting")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for every run")
    parser.add_argument("--ppo-steps", type=int, default=30_000)
    parser.add_argument("--dqn-steps", type=int, default=20_000)
    parser.add_argument("--sac-steps", type=int, default=5_000)
    parser.add_argument("--atari-frames", type=int, default=40_000)
    parser.add_argument(
        "--checks",
        nargs="*",
        help="the checks to run, as ALGO-ENV (ppo-CartPole-v1); none: time the settings only; "
        "default: every one",
    )
    parser.add_argument(
        "--check-scale", type=float, default=1.0, help="multiplies every check's env steps"
    )
    parser.add_argument(
        "--speed",
        nargs="*",
        default=["ppo", "dqn", "sac", "atari"],
        choices=["ppo", "dqn", "sac", "atari"],
        help="the settings to time (none: the checks only)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the stored results of the checks and settings this run does not repeat",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where results go")
    args = parser.parse_args()
    names = [f"{c.algo}-{c.env_id}" for c in CHECKS]
    unknown = sorted(set(args.checks or ()) - set(names))
    if unknown:
        parser.error(f"--checks: expected some of {', '.join(names)}, got {', '.join(unknown)}")
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"bench/gpu.py: expected a CUDA GPU for --device {args.device}, found none")
    where = gpu_name(args.device)
    args.results.mkdir(parents=True, exist_ok=True)
    stored_checks = args.results / "gpu_checks.json"
    keep_checks = args.keep and stored_checks.exists()
    kept_checks = json.loads(stored_checks.read_text()) if keep_checks else []
    keep_runs = args.keep and (args.results / "gpu.parquet").exists()
    kept_runs = stored_runs("gpu", args.results) if keep_runs else []
    checks: list[dict[str, Any]] = []
    if args.checks is None or args.checks:
        checks = run_checks(args.device, args.checks, args.check_scale)
        if not any(row["trained"] for row in checks):
            sys.exit("bench/gpu.py: no check trained on the device (above); nothing timed")
    done = {(r["algo"], r["env_id"]) for r in checks}
    checks = [r for r in kept_checks if (r["algo"], r["env_id"]) not in done] + checks
    # Written at once, and again after each setting: a run stopped early keeps what it did.
    stored_checks.write_text(json.dumps(checks, indent=1))
    save("gpu", kept_runs, report(checks, kept_runs, where), results=args.results)
    runs: list[dict[str, Any]] = []
    for script, case, contenders in speed_cases(args):
        try:
            new = run_pairs(script, [case], contenders, args.pairs, (args.threads,))
        except RuntimeError as error:  # one failing setting leaves the others' figures
            print(f"{case.name}: {error}", flush=True)
            continue
        for row in new:
            row.update(machine=where, device=args.device)
        runs += new
        measured = {r["case"] for r in runs}
        everything = [r for r in kept_runs if r["case"] not in measured] + runs
        save("gpu", everything, report(checks, everything, where), results=args.results)


if __name__ == "__main__":
    main()
