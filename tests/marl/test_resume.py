"""Multi-agent checkpoints: a resumed run continues its counters, weights, buffers and
self-play; bad resumes are refused."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos.base import Algorithm
from rlfleet.algos.dqn import DQN, DQNConfig
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.cli.main import main
from rlfleet.errors import CheckpointError, ConfigError
from rlfleet.marl.selfplay import SelfPlayConfig
from rlfleet.marl.trainer import DecentralizedTrainer, DecentralizedTrainerConfig, make_agents

QUIET = {"show_progress": False, "verbose": False}
TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"


def _config(run_dir: Path, max_episodes: int, **changes: Any) -> DecentralizedTrainerConfig:
    return DecentralizedTrainerConfig(
        max_episodes=max_episodes, num_train_envs=2, num_test_envs=2, batch_size=16,
        update_freq=4, test_freq=20, episodes_per_train=10, episodes_per_test=2,
        run_dir=run_dir, **QUIET, **changes,
    )  # fmt: skip


def _mixed_agents(trainer: DecentralizedTrainer) -> list[Algorithm[Any]]:
    obs = trainer.train_envs.observation_spaces["player_1"]
    act = trainer.train_envs.action_spaces["player_1"]
    return [
        PPO(obs, act, PPOConfig(num_epochs=1), seed=0),
        DQN(obs, act, DQNConfig(learning_starts=0), seed=1),
    ]


def test_resume_continues_counters_weights_and_buffers(tmp_path: Path) -> None:
    first = DecentralizedTrainer(tictactoe_v3.env, _config(tmp_path, 40))
    trained = _mixed_agents(first)
    first.train(trained, [True, True])
    assert (tmp_path / "checkpoints" / "latest.json").is_file()
    dqn_steps = trained[1].gradient_steps
    assert dqn_steps > 0

    seen: list[tuple[int, torch.Tensor, torch.Tensor, int]] = []

    def before_block(episode: int, env_step: int) -> None:
        ppo, dqn = fresh
        seen.append((episode, ppo.parameters_vector(), dqn.parameters_vector(), dqn.gradient_steps))

    second = DecentralizedTrainer(tictactoe_v3.env, _config(tmp_path, 60), train_fn=before_block)
    fresh = _mixed_agents(second)
    assert not torch.equal(fresh[0].parameters_vector(), trained[0].parameters_vector())
    result = second.train(fresh, [True, True], resume=True)

    episode, ppo_params, dqn_params, steps = seen[0]
    assert episode == 40  # the first training block of the resumed run starts at episode 40
    assert torch.equal(ppo_params, trained[0].parameters_vector())
    assert torch.equal(dqn_params, trained[1].parameters_vector())
    assert steps == dqn_steps
    # Copies finishing together may overshoot a block by an episode.
    assert 60 <= result.episodes <= 62
    assert result.test_episodes[:2] == [20, 40]
    assert result.train_returns.shape == (result.episodes, 2)
    history = pq.read_table(tmp_path / "history.parquet").to_pydict()
    assert history["episode"] == sorted(set(history["episode"]))  # no row twice
    assert history["episode"][-1] == result.episodes


def test_self_play_state_survives_a_resume(tmp_path: Path) -> None:
    self_play = SelfPlayConfig(save_steps=40, swap_steps=20, window=3)

    def run(max_episodes: int, *, resume: bool) -> tuple[DecentralizedTrainer, Any]:
        trainer = DecentralizedTrainer(
            tictactoe_v3.env, _config(tmp_path, max_episodes, self_play=self_play)
        )
        agents = make_agents(
            tictactoe_v3.env,
            lambda o, a, s: PPO(o, a, PPOConfig(num_epochs=1), seed=s),
            share_parameters=True,
        )
        return trainer, trainer.train(agents, [True, True], resume=resume)

    _, first = run(40, resume=False)
    _, second = run(60, resume=True)
    assert second.elo[: len(first.elo)] == first.elo  # the saved ratings, then new ones
    assert len(second.elo) >= 6
    assert second.elo[-1] != first.elo[-1]


def test_resume_with_other_agents_is_refused(tmp_path: Path) -> None:
    first = DecentralizedTrainer(tictactoe_v3.env, _config(tmp_path, 20))
    first.train(_mixed_agents(first), [True, True])
    second = DecentralizedTrainer(tictactoe_v3.env, _config(tmp_path, 40))
    shared = make_agents(
        tictactoe_v3.env, lambda o, a, s: PPO(o, a, PPOConfig(), seed=s), share_parameters=True
    )
    with pytest.raises(CheckpointError, match=r"player_1\+player_2"):
        second.train(shared, [True, True], resume=True)
    nowhere = DecentralizedTrainer(tictactoe_v3.env, replace(_config(tmp_path, 20), run_dir=None))
    with pytest.raises(ConfigError, match="expected a run_dir"):
        nowhere.train(_mixed_agents(nowhere), [True, True], resume=True)
    empty = DecentralizedTrainer(tictactoe_v3.env, _config(tmp_path / "empty", 20))
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        empty.train(_mixed_agents(empty), [True, True], resume=True)


def test_cli_resume_continues_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    args = ["train", "ppo", "--env", TICTACTOE, "--trainer.max-episodes", "20"]
    args += ["--trainer.test-freq", "20", "--trainer.episodes-per-test", "2"]
    args += ["--trainer.run-dir", str(run_dir), "--num-epochs", "1", "--share-parameters"]
    assert main(args) == 0
    assert main(["train", "ppo", "--resume", str(run_dir), "--trainer.max-episodes", "40"]) == 0
    history = pq.read_table(run_dir / "history.parquet").to_pydict()
    assert [
        e for e, s in zip(history["episode"], history["test/score"], strict=True) if s is not None
    ] == [20, 40]
    assert main(["train", "dqn", "--resume", str(run_dir)]) == 2
    assert "it is a ppo run, not dqn" in capsys.readouterr().err
    assert np.isfinite(history["test/score"][-1])
