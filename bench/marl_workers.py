"""Multi-agent env copies in-process vs in subprocess workers (``multi_agent.shared_memory``).

    PYTHONPATH=$PWD python bench/marl_workers.py

Two games, stepped with random legal actions (no policy, so the figure is the env side of a
run): PettingZoo's tic-tac-toe (AEC; a step costs microseconds) and a two-agent Parallel
game that spends ``--work-ms`` of CPU per step (standing for a physics or game engine). For
1, 2, 4 and 8 copies, :class:`~rlfleet.marl.envs.MultiAgentVecEnv` (in-process) and
:class:`~rlfleet.marl.workers.WorkerMultiAgentVecEnv` (one process per copy) alternate, in
pairs, ``--repeats`` times; each is timed over ``--seconds`` of stepping after a short warm-up,
and the report gives the median agent steps/s (one action of one agent in one copy) and the
workers' start-up time. Results go to ``bench/results/marl_workers.md`` and ``.parquet``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from datetime import date
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from gymnasium import spaces
from harness import RESULTS, machine_line
from pettingzoo import ParallelEnv
from pettingzoo.classic import tictactoe_v3

from rlfleet.marl.envs import MultiAgentVecEnv
from rlfleet.marl.workers import WorkerMultiAgentVecEnv

COPIES = (1, 2, 4, 8)


class BusyParallel(ParallelEnv[str, np.ndarray, int]):
    """Two agents; each step spins the CPU for ``work_ms`` milliseconds; episodes of 50 steps."""

    metadata: ClassVar[dict[str, Any]] = {"name": "busy_parallel"}

    def __init__(self, work_ms: float = 1.0) -> None:
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self.work_s = work_ms / 1000
        self.t = 0
        self.rng = np.random.default_rng()

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return spaces.Box(-1.0, 1.0, (16,), np.float32)

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return spaces.Discrete(4)

    def _obs(self) -> dict[str, np.ndarray]:
        return {a: self.rng.uniform(-1, 1, 16).astype(np.float32) for a in self.agents}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]) -> Any:
        end = time.perf_counter() + self.work_s
        while time.perf_counter() < end:
            pass
        self.t += 1
        obs = self._obs()
        done = self.t >= 50
        rewards = {a: float(actions[a]) for a in self.agents}
        flags = {a: done for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, flags, dict.fromkeys(flags, False), {a: {} for a in obs}


def measure(
    vec: Callable[..., MultiAgentVecEnv], env_fn: Callable[[], Any], copies: int, seconds: float
) -> dict[str, float]:
    """Agent steps/s over ``seconds`` of random legal stepping, and the time to build."""
    start = time.perf_counter()
    envs = vec(env_fn, copies, seed=0)
    envs.reset()
    build_s = time.perf_counter() - start
    rng = np.random.default_rng(0)

    def one_step() -> int:
        actions = {}
        for r in envs.acting:
            n = int(envs.action_spaces[r.agent].n)  # type: ignore[attr-defined]
            legal = np.flatnonzero(r.mask) if r.mask is not None else np.arange(n)
            actions[(r.env_id, r.agent)] = int(legal[rng.integers(len(legal))])
        envs.step(actions)
        return len(actions)

    try:
        for _ in range(20):
            one_step()
        steps = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            steps += one_step()
    finally:
        envs.close()
    return {"agent_steps_per_s": steps / elapsed, "build_s": build_s}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="stepping time per run")
    parser.add_argument("--repeats", type=int, default=3, help="pairs per setting")
    parser.add_argument("--work-ms", type=float, default=1.0, help="CPU per step, busy game")
    args = parser.parse_args()
    games: dict[str, Callable[[], Any]] = {
        "tic-tac-toe (AEC, cheap)": tictactoe_v3.env,
        f"busy Parallel game ({args.work_ms:g} ms CPU/step)": lambda: BusyParallel(args.work_ms),
    }
    modes = {"in-process": MultiAgentVecEnv, "workers": WorkerMultiAgentVecEnv}
    rows: list[dict[str, Any]] = []
    before = os.getloadavg()[0]
    for game, env_fn in games.items():
        for copies in COPIES:
            for repeat in range(args.repeats):
                for mode, vec in modes.items():
                    row = {"game": game, "copies": copies, "mode": mode, "repeat": repeat}
                    row.update(measure(vec, env_fn, copies, args.seconds))
                    rows.append(row)
                    print(
                        f"{game:36s} x{copies} {mode:10s}: "
                        f"{row['agent_steps_per_s']:9.0f} agent steps/s",
                        flush=True,
                    )
    text = report(rows, args, (before, os.getloadavg()[0]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / "marl_workers.parquet")
    (RESULTS / "marl_workers.md").write_text(text + "\n")
    print(text)


def report(rows: list[dict[str, Any]], args: argparse.Namespace, load: tuple[float, float]) -> str:
    def median(game: str, copies: int, mode: str, key: str) -> float:
        return statistics.median(
            r[key] for r in rows if (r["game"], r["copies"], r["mode"]) == (game, copies, mode)
        )

    lines = [
        "# Multi-agent env copies: in-process vs subprocess workers "
        f"(agent steps/s, median of {args.repeats}, {date.today().isoformat()})",
        "",
        f"{machine_line(load)} The ratios are what to read. Random legal actions, no policy;"
        f" {args.seconds:g} s of stepping per run after a warm-up, in-process and "
        "workers alternating.",
        "",
        "| game | copies | in-process | workers | workers / in-process | workers start-up (s) |",
        "|---|---|---|---|---|---|",
    ]
    for game in dict.fromkeys(r["game"] for r in rows):
        for copies in COPIES:
            local = median(game, copies, "in-process", "agent_steps_per_s")
            workers = median(game, copies, "workers", "agent_steps_per_s")
            build = median(game, copies, "workers", "build_s")
            lines.append(
                f"| {game} | {copies} | {local:,.0f} | {workers:,.0f} | "
                f"{workers / local:.2f} | {build:.2f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
