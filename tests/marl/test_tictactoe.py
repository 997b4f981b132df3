"""Tic-tac-toe (PettingZoo classic, AEC with action masks): learning, masks, frozen agents."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3
from pettingzoo.utils import BaseWrapper

from rlfleet.algos.dqn import DQN, DQNConfig
from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.marl.agents import RandomAgent
from rlfleet.marl.trainer import DecentralizedTrainer, DecentralizedTrainerConfig

ILLEGAL_MOVES: list[tuple[str, int]] = []


class _MaskAuditor(BaseWrapper):  # type: ignore[misc]
    """Records every action that the current agent's mask forbids."""

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        live = action is not None and not (self.terminations[agent] or self.truncations[agent])
        if live and not self.observe(agent)["action_mask"][action]:
            ILLEGAL_MOVES.append((agent, int(action)))
        super().step(action)


def audited_env() -> Any:
    return _MaskAuditor(tictactoe_v3.env())


def first_player_win_rate(rewards: np.ndarray) -> float:
    return float((rewards[:, 0] > 0).mean())


@pytest.mark.slow
def test_ppo_first_player_beats_frozen_random(tmp_path: Any) -> None:
    ILLEGAL_MOVES.clear()
    config = DecentralizedTrainerConfig(
        max_episodes=2_000,
        num_train_envs=8,
        num_test_envs=8,
        batch_size=256,
        test_freq=1_000,
        episodes_per_train=100,
        episodes_per_test=200,
        run_dir=tmp_path,
    )
    trainer = DecentralizedTrainer(audited_env, config, reward_metric=first_player_win_rate)
    obs_space = trainer.train_envs.observation_spaces["player_1"]
    action_space = trainer.train_envs.action_spaces["player_1"]
    ppo = PPO(
        obs_space,
        action_space,
        PPOConfig(learning_rate=1e-3, num_epochs=4, ent_coef=0.01, hidden_sizes=(128, 128)),
        seed=0,
    )
    random_player = RandomAgent(obs_space, action_space, seed=1)
    result = trainer.train([ppo, random_player], learning_mask=[True, False])
    assert result.test_scores[-1] >= 0.8, result.test_scores
    assert ILLEGAL_MOVES == []
    assert (tmp_path / "history.parquet").exists()
    assert (tmp_path / "plots" / "metric.png").exists()
    assert (tmp_path / "best" / "player_1").is_dir()


def test_learning_mask_freezes_weights_bitwise() -> None:
    ILLEGAL_MOVES.clear()
    config = DecentralizedTrainerConfig(
        max_episodes=60, num_train_envs=4, num_test_envs=2, batch_size=32, update_freq=4,
        test_freq=60, episodes_per_train=20, episodes_per_test=4,
    )  # fmt: skip
    trainer = DecentralizedTrainer(audited_env, config)
    obs_space = trainer.train_envs.observation_spaces["player_1"]
    action_space = trainer.train_envs.action_spaces["player_1"]
    learner = DQN(obs_space, action_space, DQNConfig(learning_starts=0), seed=0)
    frozen = PPO(obs_space, action_space, PPOConfig(), seed=1)
    before_learner = learner.parameters_vector().clone()
    before_frozen = frozen.parameters_vector().clone()
    # Exploring but frozen: acts stochastically, yet must never change.
    result = trainer.train(
        [learner, frozen], learning_mask=[True, False], exploration_mask=[True, True]
    )
    assert result.episodes == 60
    assert torch.equal(frozen.parameters_vector(), before_frozen)
    assert not torch.equal(learner.parameters_vector(), before_learner)
    assert learner.gradient_steps > 0
    assert frozen.gradient_steps == 0
    assert ILLEGAL_MOVES == []


def _short_game() -> tuple[DecentralizedTrainer, Any, Any]:
    """40 episodes on 4 copies, updates every 4 agent steps; and a player's spaces."""
    config = DecentralizedTrainerConfig(
        max_episodes=40, num_train_envs=4, num_test_envs=2, batch_size=32, update_freq=4,
        test_freq=40, episodes_per_train=20, episodes_per_test=4,
    )  # fmt: skip
    trainer = DecentralizedTrainer(tictactoe_v3.env, config)
    spaces = trainer.train_envs.observation_spaces, trainer.train_envs.action_spaces
    return trainer, spaces[0]["player_1"], spaces[1]["player_1"]


def test_mixed_on_and_off_policy_learners_both_update() -> None:
    trainer, obs_space, action_space = _short_game()
    dqn = DQN(obs_space, action_space, DQNConfig(learning_starts=0), seed=0)
    ppo = PPO(obs_space, action_space, PPOConfig(num_epochs=1), seed=1)
    result = trainer.train([ppo, dqn], learning_mask=[True, True])
    assert dqn.gradient_steps > 0
    assert ppo.gradient_steps > 0
    assert result.train_returns.shape == (40, 2)
    # Zero-sum game: the two players' returns cancel in every episode.
    np.testing.assert_allclose(result.train_returns.sum(axis=1), 0.0)


def test_progress_prints_a_summary_after_every_test_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = DecentralizedTrainerConfig(
        max_episodes=20, num_train_envs=2, num_test_envs=2, test_freq=10,
        episodes_per_train=10, episodes_per_test=2,
    )  # fmt: skip
    trainer = DecentralizedTrainer(tictactoe_v3.env, config)
    obs_space = trainer.train_envs.observation_spaces["player_1"]
    action_space = trainer.train_envs.action_spaces["player_1"]
    agents = [RandomAgent(obs_space, action_space, seed=s) for s in (0, 1)]
    trainer.train(agents, learning_mask=[False, False])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("episode")]
    assert [line.split(" | ")[0] for line in lines] == ["episode 10", "episode 20"]
    assert all("test/score" in line and "best" in line for line in lines)

    quiet = DecentralizedTrainer(tictactoe_v3.env, replace(config, verbose=False))
    quiet.train(agents, learning_mask=[False, False])
    assert capsys.readouterr().out == ""


class _BufferRecordingDQN(DQN):
    """DQN that keeps the replay buffer the trainer hands to its updates."""

    buffer: Any = None

    def update(self, batch: Any, **kwargs: Any) -> dict[str, float]:
        self.buffer = batch
        return super().update(batch, **kwargs)


def _empty_cells(boards: torch.Tensor) -> torch.Tensor:
    """Legal moves of ``[batch, 3, 3, 2]`` observations: the cells neither player holds."""
    return (boards.sum(-1) == 0).reshape(boards.shape[0], 9)


def test_dqn_learns_from_the_legal_moves_of_each_next_turn() -> None:
    trainer, obs_space, action_space = _short_game()
    dqn = _BufferRecordingDQN(obs_space, action_space, DQNConfig(learning_starts=0), seed=0)
    random_player = RandomAgent(obs_space, action_space, seed=1)
    trainer.train([dqn, random_player], learning_mask=[True, False])
    assert dqn.buffer is not None
    assert dqn.buffer.mask_size == 9
    batch = dqn.buffer.sample(512, gamma=0.9, n_step=2)
    torch.testing.assert_close(batch.action_masks, _empty_cells(batch.obs))
    # The target bootstraps over the moves open at the player's next turn; a finished game
    # (discount 0) may leave none.
    going_on = batch.discounts > 0
    assert going_on.any()
    assert not going_on.all()
    torch.testing.assert_close(
        batch.next_action_masks[going_on], _empty_cells(batch.next_obs)[going_on]
    )


def test_masked_ppo_rollouts_keep_their_masks(tmp_path: Any) -> None:
    # One epoch of one minibatch: the first gradient step's probability ratio must be exactly
    # 1, which holds only when the loss sees the masks the actions were sampled under.
    config = DecentralizedTrainerConfig(
        max_episodes=10, num_train_envs=2, num_test_envs=2, batch_size=4096, test_freq=10,
        episodes_per_train=10, episodes_per_test=2, run_dir=tmp_path, verbose=False,
    )  # fmt: skip
    trainer = DecentralizedTrainer(tictactoe_v3.env, config)
    obs_space = trainer.train_envs.observation_spaces["player_1"]
    action_space = trainer.train_envs.action_spaces["player_1"]
    ppo = PPO(obs_space, action_space, PPOConfig(num_epochs=1), seed=0)
    random_player = RandomAgent(obs_space, action_space, seed=1)
    trainer.train([ppo, random_player], learning_mask=[True, False])
    history = pq.read_table(tmp_path / "history.parquet").to_pydict()
    assert history["player_1/train/approx_kl"][-1] == pytest.approx(0.0, abs=1e-7)
    assert history["player_1/train/clip_fraction"][-1] == 0.0
