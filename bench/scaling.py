"""Env steps/s against the number of envs for each vector mode, and against Ray actors.

Two parts, both on this machine:

vector
    For CartPole-v1, MinAtar/Breakout-v1 and Acrobot-v1 (a classic-control env without a
    native vector entry point), each vector mode that applies (``sync``, ``async``,
    ``native``: CartPole's own vectorised entry point, and ``envpool``: EnvPool's C++ CartPole
    and Acrobot), and each ``num_envs`` of ``--num-envs``, the env steps/s of

    - ``collect``: rlfleet's :class:`~rlfleet.collect.collector.Collector` filling rollouts of
      16 vector steps with PPO acting (the env's PPO preset network; collection only, no
      update), as the collection step of an on-policy run does;
    - ``random``: raw ``envs.step`` with uniform random actions drawn beforehand: the ceiling
      the vector env sets.

    Each cell is capped by time: it runs for ``--cell-s`` seconds after one warm-up rollout,
    on one vector env built for it (``make_vec_env``, seeded). ``--repeats`` builds the env
    again and measures again; the plot's error bars span the repeats' minimum to maximum.
    ``async`` runs one process per env, so its grid stops at ``--async-max-envs``.
actors
    IMPALA and APPO on CartPole-v1 with 1, 2 and 4 Ray rollout actors of 8 envs each: env
    steps/s over ``trainer.run()``, measured by ``distributed.py``'s :func:`distributed.run`
    (Ray and actor start-up excluded, the final test step included). A training run has no
    time limit, so these runs are capped by env steps (``--actor-budget``), sized to take a few
    seconds each.

Torch runs on ``--threads`` threads (default 1, as in the speed comparisons). Results go to
``bench/results/scaling.md`` and ``.parquet`` and the plot to ``docs/images/scaling.png``
(log-log, one line per mode and kind, one panel per env, one for the actors).
``--quick`` runs a small grid with short cells and only prints its report unless
``--results``/``--plot`` are given.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import torch
from distributed import run as actor_run
from harness import RESULTS, machine, save

from rlfleet.algos.base import Algorithm
from rlfleet.collect.collector import Collector
from rlfleet.data.rollout import RolloutStorage
from rlfleet.distributed.cluster import connect
from rlfleet.envs.make import make_vec_env
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import build_algorithm

PLOT = Path(__file__).resolve().parent.parent / "docs" / "images" / "scaling.png"
NUM_ENVS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ENV_MODES: dict[str, tuple[str, ...]] = {
    "CartPole-v1": ("sync", "async", "native", "envpool"),
    # MinAtar has neither a native vector entry point nor an EnvPool version.
    "MinAtar/Breakout-v1": ("sync", "async"),
    # A classic-control env without a native vector entry point: EnvPool is its batched mode.
    "Acrobot-v1": ("sync", "async", "envpool"),
}
KINDS = ("collect", "random")
COLORS = {"sync": "tab:blue", "async": "tab:red", "native": "tab:green", "envpool": "tab:purple"}
ACTOR_ALGOS = ("impala", "appo")
ACTOR_COUNTS = (1, 2, 4)
ROLLOUT_STEPS = 16
"""Vector steps per collected rollout: the granularity at which a cell's time cap is checked."""
RANDOM_BATCHES = 64
"""Batches of random actions drawn before a ``random`` cell, used in turn."""


def policy(env_id: str, envs: Any) -> Algorithm[Any]:
    """PPO with the env's preset hyperparameters, built for ``envs``' spaces."""
    cfg = default_run_config("ppo", env_id, {"seed": 0})
    return build_algorithm(cfg, envs.single_observation_space, envs.single_action_space)


def time_collect(env_id: str, envs: Any, cell_s: float) -> tuple[int, float]:
    """Env steps and seconds of rollouts collected by PPO until ``cell_s`` has passed."""
    algo = policy(env_id, envs)
    storage = RolloutStorage(
        ROLLOUT_STEPS,
        envs.num_envs,
        algo.obs_layout.shape,
        algo.action_shape,
        obs_dtype=algo.obs_layout.dtype,
        action_dtype=algo.action_dtype,
    )
    collector = Collector(envs, algo, seed=0)
    collector.collect_rollout(storage)  # warm-up
    steps = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < cell_s:
        steps += collector.collect_rollout(storage).env_steps
    return steps, elapsed


def time_random(envs: Any, cell_s: float) -> tuple[int, float]:
    """Env steps and seconds of ``envs.step`` with random actions until ``cell_s`` has
    passed."""
    actions = [envs.action_space.sample() for _ in range(RANDOM_BATCHES)]
    envs.reset(seed=0)
    for batch in actions[:ROLLOUT_STEPS]:  # warm-up
        envs.step(batch)
    vector_steps = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < cell_s:
        for batch in actions[:ROLLOUT_STEPS]:
            envs.step(batch)
        vector_steps += ROLLOUT_STEPS
        actions.append(actions.pop(0))
    return vector_steps * envs.num_envs, elapsed


def vector_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for env_id in args.envs:
        for mode in ENV_MODES[env_id]:
            if mode not in args.modes:
                continue
            for num_envs in args.num_envs:
                if mode == "async" and num_envs > args.async_max_envs:
                    continue
                for repeat in range(args.repeats):
                    envs = make_vec_env(env_id, num_envs, seed=repeat, mode=mode)
                    try:
                        for kind in KINDS:
                            if kind == "collect":
                                steps, seconds = time_collect(env_id, envs, args.cell_s)
                            else:
                                steps, seconds = time_random(envs, args.cell_s)
                            row = {
                                "part": "vector",
                                "env_id": env_id,
                                "mode": mode,
                                "kind": kind,
                                "num_envs": num_envs,
                                "num_actors": 0,
                                "repeat": repeat,
                                "env_steps": steps,
                                "seconds": seconds,
                                "steps_per_s": steps / seconds,
                            }
                            rows.append(row)
                            print(
                                f"{env_id:20s} {mode:8s} {kind:8s} {num_envs:4d} envs "
                                f"(repeat {repeat}): {row['steps_per_s']:10,.0f} steps/s",
                                flush=True,
                            )
                    finally:
                        envs.close()
    return rows


def actor_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    if not args.actors:
        return []
    import ray  # optional dependency: only this part needs it

    # The cluster a distributed run would start (a session already connected is reused and
    # kept): the machine's CPUs, its workers at the learner's priority.
    started = connect(None, local_num_cpus=1)
    rows = []
    try:
        for algo in args.algos:
            for actors in args.actors:
                for repeat in range(args.repeats):
                    found = actor_run(algo, "CartPole-v1", actors, args.actor_budget, repeat)
                    row = {
                        "part": "actors",
                        "env_id": "CartPole-v1",
                        "mode": algo,
                        "kind": "train",
                        "num_envs": 8,
                        "num_actors": actors,
                        "repeat": repeat,
                        "env_steps": found["env_steps"],
                        "seconds": found["wall_s"],
                        "steps_per_s": found["steps_per_s"],
                    }
                    rows.append(row)
                    print(
                        f"{algo:6s} {actors} actor(s) (repeat {repeat}): "
                        f"{row['steps_per_s']:10,.0f} steps/s",
                        flush=True,
                    )
    finally:
        if started:
            ray.shutdown()
    return rows


def _cells(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[float]]:
    """Steps/s of each cell over its repeats."""
    cells: dict[tuple[Any, ...], list[float]] = {}
    for r in rows:
        key = (r["part"], r["env_id"], r["mode"], r["kind"], r["num_envs"], r["num_actors"])
        cells.setdefault(key, []).append(r["steps_per_s"])
    return cells


def _median_or_none(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    cells = _cells(rows)
    repeats = f", median of {args.repeats} repeats" if args.repeats > 1 else ""
    quick = " (--quick)" if args.quick else ""
    lines = [
        f"# Env steps/s against num_envs and Ray actors{quick} ({time.strftime('%Y-%m-%d')})",
        "",
        f"Machine: {machine()}; torch on {args.threads} thread(s). Each vector cell ran "
        f"{args.cell_s:g} s{repeats}. `collect`: rlfleet's Collector with PPO acting (no "
        "update); `random`: raw `envs.step` with random actions. Generated by "
        "`bench/scaling.py`.",
        "",
    ]
    for env_id in args.envs:
        columns = [
            (mode, kind)
            for mode in ENV_MODES[env_id]
            if mode in args.modes
            for kind in KINDS
            if any(k[1:4] == (env_id, mode, kind) for k in cells)
        ]
        if not columns:
            continue
        lines += [
            f"## {env_id}: env steps/s",
            "",
            "| num_envs | " + " | ".join(f"{mode} {kind}" for mode, kind in columns) + " |",
            "|---" * (len(columns) + 1) + "|",
        ]
        for num_envs in args.num_envs:
            medians = [
                _median_or_none(cells.get(("vector", env_id, mode, kind, num_envs, 0)))
                for mode, kind in columns
            ]
            best = {
                kind: max(
                    (m for m, (_, k) in zip(medians, columns, strict=True) if k == kind and m),
                    default=None,
                )
                for kind in KINDS
            }
            cell_text = [
                "—" if m is None else f"**{m:,.0f}**" if m == best[kind] else f"{m:,.0f}"
                for m, (_, kind) in zip(medians, columns, strict=True)
            ]
            lines.append(f"| {num_envs} | " + " | ".join(cell_text) + " |")
        lines.append("")
        lines.append("Bold: the fastest mode of the row, for `collect` and for `random`.")
        lines.append("")
    actor_keys = [k for k in cells if k[0] == "actors"]
    if actor_keys:
        lines += [
            f"## CartPole-v1, Ray rollout actors of 8 envs ({args.actor_budget:,} env steps per "
            "run): env steps/s",
            "",
            "| actors | " + " | ".join(args.algos) + " |",
            "|---" * (len(args.algos) + 1) + "|",
        ]
        for actors in args.actors:
            values = [
                cells.get(("actors", "CartPole-v1", algo, "train", 8, actors))
                for algo in args.algos
            ]
            lines.append(
                f"| {actors} | "
                + " | ".join("—" if not v else f"{statistics.median(v):,.0f}" for v in values)
                + " |"
            )
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> None:
    cells = _cells(rows)
    envs = [e for e in args.envs if any(k[1] == e and k[0] == "vector" for k in cells)]
    has_actors = any(k[0] == "actors" for k in cells)
    panels = len(envs) + int(has_actors)
    columns = min(panels, 2)
    rows_of_panels = -(-panels // columns)
    fig, grid = plt.subplots(
        rows_of_panels, columns, figsize=(6 * columns, 4.5 * rows_of_panels), squeeze=False
    )
    axes = list(grid.flat)
    for ax in axes[panels:]:
        ax.set_visible(False)
    for ax, env_id in zip(axes, envs, strict=False):
        for mode in ENV_MODES[env_id]:
            for kind, style in zip(KINDS, ("-", "--"), strict=True):
                xs = [n for n in args.num_envs if ("vector", env_id, mode, kind, n, 0) in cells]
                if not xs:
                    continue
                values = [cells[("vector", env_id, mode, kind, n, 0)] for n in xs]
                mid = np.array([statistics.median(v) for v in values])
                low = mid - np.array([min(v) for v in values])
                high = np.array([max(v) for v in values]) - mid
                ax.errorbar(
                    xs,
                    mid,
                    yerr=[low, high],
                    linestyle=style,
                    marker="o",
                    markersize=3,
                    capsize=2,
                    color=COLORS[mode],
                    label=f"{mode} {kind}",
                )
        ax.set(xscale="log", yscale="log", xlabel="num_envs", ylabel="env steps/s", title=env_id)
        ax.set_xticks(list(args.num_envs), [str(n) for n in args.num_envs])
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if has_actors:
        ax = axes[panels - 1]
        for algo in args.algos:
            xs = [n for n in args.actors if ("actors", "CartPole-v1", algo, "train", 8, n) in cells]
            values = [cells[("actors", "CartPole-v1", algo, "train", 8, n)] for n in xs]
            ax.plot(xs, [statistics.median(v) for v in values], marker="o", label=algo)
        ax.set_ylim(bottom=0)
        ax.set(
            xscale="log",
            xlabel="Ray actors (8 envs each)",
            ylabel="env steps/s",
            title="CartPole-v1, training",
        )
        ax.set_xticks(list(args.actors), [str(n) for n in args.actors])
        ax.minorticks_off()
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Env steps/s ({os.cpu_count()} cores; solid: collect with PPO, dashed: random)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a small grid with short cells")
    parser.add_argument(
        "--envs",
        type=_names,
        default=tuple(ENV_MODES),
        help=f"comma-separated, of {', '.join(ENV_MODES)} (default: all)",
    )
    parser.add_argument(
        "--modes",
        type=_names,
        default=("sync", "async", "native", "envpool"),
        help="vector modes, comma-separated (each env runs those that apply to it)",
    )
    parser.add_argument("--num-envs", type=_ints, help=f"comma-separated (default {NUM_ENVS})")
    parser.add_argument("--async-max-envs", type=int, default=64, help="largest async num_envs")
    parser.add_argument("--cell-s", type=float, help="seconds each vector cell runs (default 3)")
    parser.add_argument("--repeats", type=int, default=1, help="measurements of each cell")
    parser.add_argument(
        "--actors", type=_ints, help=f"Ray actor counts (default {ACTOR_COUNTS}; '' skips)"
    )
    parser.add_argument(
        "--algos", type=_names, default=ACTOR_ALGOS, help="actor-learner algorithms"
    )
    parser.add_argument("--actor-budget", type=int, help="env steps per actor run (default 60,000)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--results", type=Path, help="directory of scaling.md/.parquet")
    parser.add_argument("--plot", type=Path, help="where the plot goes")
    args = parser.parse_args(argv)
    # --quick: a small grid and short cells, unless the flags say otherwise.
    quick = {"num_envs": (1, 8, 64), "cell_s": 0.3, "actors": (1,), "actor_budget": 8_000}
    full = {"num_envs": NUM_ENVS, "cell_s": 3.0, "actors": ACTOR_COUNTS, "actor_budget": 60_000}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    torch.set_num_threads(args.threads)
    rows = vector_rows(args) + actor_rows(args)
    text = report(rows, args)
    if args.quick and args.results is None:
        print(text)
    else:
        save("scaling", rows, text, results=args.results or RESULTS)
    if not args.quick or args.plot is not None:
        plot(rows, args, args.plot or PLOT)


if __name__ == "__main__":
    main()
