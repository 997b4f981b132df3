"""Tic-tac-toe self-play from an ML-Agents run options file, against a uniformly random player.

    PYTHONPATH=$PWD python bench/selfplay_tictactoe.py [--seeds 5] [--budgets 30000 60000]

One behavior (``player``) with a ``self_play`` section plays both seats of PettingZoo's
``tictactoe_v3``: each seat is a team, one learns while the other plays snapshots. After
training, the latest policy plays 500 greedy games per seat against a uniformly random
legal-move player. Writes ``bench/results/selfplay_tictactoe.md`` and ``.parquet``: per seed
and budget (agent steps, both seats counted), the final Elo and the shares of games won,
drawn and lost as first player (``player_1``) and as second player (``player_2``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from pettingzoo.classic import tictactoe_v3

from rlfleet.config.located import parse_yaml
from rlfleet.marl.agents import Agents, RandomAgent
from rlfleet.runs.from_options import train_from_options
from rlfleet.runs.multi_agent import play_against
from rlfleet.runs.options_parser import parse_run_options
from rlfleet.runs.run import load_policy

RESULTS = Path(__file__).parent / "results"

OPTIONS = """\
env_settings:
  env_id: pettingzoo:pettingzoo.classic.tictactoe_v3
  num_envs: 8
  num_test_envs: 2
  seed: {seed}
behaviors:
  player:
    trainer_type: ppo
    hyperparameters: {{learning_rate: 1.0e-3, batch_size: 64, num_epoch: 4, beta: 0.1}}
    network_settings: {{hidden_units: 128, num_layers: 2}}
    reward_signals:
      extrinsic: {{gamma: 0.9, strength: 1.0}}
    max_steps: {max_steps}
    summary_freq: 2000
    checkpoint_interval: 1000000
    self_play:
      save_steps: 2000
      team_change: 2000
      swap_steps: 500
      window: 50
      play_against_latest_model_ratio: 0.2
"""
"""The run options (ML-Agents' names; the test in tests/runs/test_options_mlagents_selfplay.py
trains the same file at a shorter budget)."""
GAMES = 500


def run(seed: int, max_steps: int) -> dict[str, Any]:
    """Train one seed to ``max_steps`` agent steps and play the random player."""
    with tempfile.TemporaryDirectory() as results:
        text = OPTIONS.format(seed=seed, max_steps=max_steps)
        options = parse_run_options(
            parse_yaml(text, "selfplay.yaml"),
            "selfplay.yaml",
            flags={"results_dir": results, "run_id": "run"},
        )
        start = time.perf_counter()
        train_from_options(options)
        train_s = time.perf_counter() - start
        run_dir = Path(results) / "run"
        history = pq.read_table(run_dir / "history.parquet").to_pydict()
        elo = [e for e in history["selfplay/elo"] if e is not None]
        agents, _ = load_policy(run_dir, which="latest")
        assert isinstance(agents, Agents)
        first = agents["player_1"]
        opponent = RandomAgent(first.observation_space, first.action_space, seed=seed + 1)
        records = play_against(agents, tictactoe_v3.env, opponent, episodes=GAMES, seed=10_000)
    row: dict[str, Any] = {
        "seed": seed,
        "max_steps": max_steps,
        "train_s": round(train_s, 1),
        "final_elo": round(elo[-1], 1),
    }
    for seat, record in records.items():
        row[f"{seat}_won"] = record.won
        row[f"{seat}_drawn"] = record.drawn
        row[f"{seat}_lost"] = record.lost
    print(row, flush=True)
    return row


def report(rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Tic-tac-toe self-play (ML-Agents run options) against a uniformly random player",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}. Written by `bench/selfplay_tictactoe.py`: PPO, one behavior "
        "with `self_play` (beta 0.1, save_steps 2000, team_change 2000, swap_steps 500, window 50, "
        f"play_against_latest_model_ratio 0.2), {GAMES} greedy games per seat against a "
        "uniformly random legal-move player after training. Budget: agent steps, both seats "
        "counted (about 7.6 per game).",
        "",
        "| budget (agent steps) | seed | train s | final Elo | first player won / drawn / "
        "lost | second player won / drawn / lost | both seats won |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        both = (row["player_1_won"] + row["player_2_won"]) / 2
        lines.append(
            f"| {row['max_steps']:,} | {row['seed']} | {row['train_s']} | {row['final_elo']} | "
            f"{row['player_1_won']:.3f} / {row['player_1_drawn']:.3f} / "
            f"{row['player_1_lost']:.3f} | {row['player_2_won']:.3f} / "
            f"{row['player_2_drawn']:.3f} / {row['player_2_lost']:.3f} | {both:.3f} |"
        )
    lines += ["", "| budget | first player won: median (min) | both seats won: median |"]
    lines.append("|---|---|---|")
    for budget in sorted({r["max_steps"] for r in rows}):
        mine = [r for r in rows if r["max_steps"] == budget]
        first = [r["player_1_won"] for r in mine]
        both = [(r["player_1_won"] + r["player_2_won"]) / 2 for r in mine]
        lines.append(
            f"| {budget:,} | {statistics.median(first):.3f} ({min(first):.3f}) | "
            f"{statistics.median(both):.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budgets", type=int, nargs="+", default=[60_000, 100_000])
    args = parser.parse_args()
    rows = [run(seed, budget) for budget in args.budgets for seed in range(args.seeds)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / "selfplay_tictactoe.parquet")
    text = report(rows)
    (RESULTS / "selfplay_tictactoe.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
