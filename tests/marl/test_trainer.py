"""The DecentralizedTrainer's Python API: settings as a user writes them (a ``str`` run_dir),
checked at construction, and torch threads set while it trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.errors import ConfigError
from rlfleet.marl.agents import RandomAgent
from rlfleet.marl.trainer import DecentralizedTrainer, DecentralizedTrainerConfig, make_agents

CALLERS = 3
"""The caller's own torch thread count, restored after training."""


def _config(run_dir: str) -> DecentralizedTrainerConfig:
    return DecentralizedTrainerConfig(
        max_episodes=4, num_train_envs=2, num_test_envs=2, test_freq=4, episodes_per_train=2,
        episodes_per_test=2, show_progress=False, verbose=False, run_dir=run_dir,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize("threads", ["default", None, 2])
def test_str_run_dir_and_threads_while_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int | str | None
) -> None:
    monkeypatch.chdir(tmp_path)
    seen: list[int] = []
    trainer = DecentralizedTrainer(
        tictactoe_v3.env,
        _config("runs/ttt"),
        train_fn=lambda episode, step: seen.append(torch.get_num_threads()),
        **({} if threads == "default" else {"torch_threads": threads}),
    )
    ppo, _ = make_agents(tictactoe_v3.env, lambda obs, act, seed: PPO(obs, act, PPOConfig()))
    opponent = RandomAgent(ppo.observation_space, ppo.action_space)
    torch.set_num_threads(CALLERS)
    try:
        result = trainer.train([ppo, opponent], learning_mask=[True, False])
    finally:
        trainer.close()
    assert result.run_dir == Path("runs/ttt")
    assert (tmp_path / "runs/ttt/history.parquet").is_file()
    expected = {"default": 1, None: CALLERS, 2: 2}[threads]
    assert set(seen) == {expected}
    assert torch.get_num_threads() == CALLERS


def test_out_of_range_settings_are_refused_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"config\.max_episodes: .*greater than 0.*got 0"):
        DecentralizedTrainer(tictactoe_v3.env, DecentralizedTrainerConfig(max_episodes=0))
