"""Tic-tac-toe (PettingZoo classic, AEC with action masks): learning, masks, frozen agents."""

from __future__ import annotations

from pathlib import Path
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
from rlfleet.marl.envs import MultiAgentVecEnv
from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings
from rlfleet.train.loop import TrainerConfig

ILLEGAL_MOVES: list[tuple[str, int]] = []
ENVS = MultiAgentVecEnv(tictactoe_v3.env, 1)
OBS, ACT = ENVS.observation_spaces["player_1"], ENVS.action_spaces["player_1"]


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


def _quiet(max_episodes: int, **changes: Any) -> TrainerConfig:
    return TrainerConfig(
        max_episodes=max_episodes, test_step_num_episodes=4, show_progress=False,
        verbose=False, **changes,
    )  # fmt: skip


@pytest.mark.slow
def test_ppo_first_player_beats_frozen_random(tmp_path: Path) -> None:
    ILLEGAL_MOVES.clear()
    ppo = PPO(
        OBS, ACT,
        PPOConfig(learning_rate=1e-3, num_epochs=4, ent_coef=0.01, hidden_sizes=(128, 128)),
        seed=0,
    )  # fmt: skip
    random_player = RandomAgent(OBS, ACT, seed=1)
    trainer = DecentralizedTrainer(
        audited_env,
        [ppo, random_player],
        TrainerConfig(max_episodes=2_000, epoch_num_steps=7_000, test_step_num_episodes=200),
        MultiAgentSettings(
            learning_mask=[True, False], batch_size=256, collection_step_num_episodes=100
        ),
        num_envs=8,
        num_test_envs=8,
        run_dir=tmp_path,
        reward_metric=first_player_win_rate,
    )
    trainer.run()
    history = pq.read_table(tmp_path / "history.parquet").to_pydict()
    scores = [s for s in history["test/score"] if s is not None]
    assert scores[-1] >= 0.8, scores
    assert ILLEGAL_MOVES == []
    assert (tmp_path / "plots" / "learning_curve.png").exists()
    assert (tmp_path / "best").is_dir()


def test_learning_mask_freezes_weights_bitwise() -> None:
    ILLEGAL_MOVES.clear()
    learner = DQN(OBS, ACT, DQNConfig(learning_starts=0), seed=0)
    frozen = PPO(OBS, ACT, PPOConfig(), seed=1)
    before_learner = learner.parameters_vector().clone()
    before_frozen = frozen.parameters_vector().clone()
    # Exploring but frozen: acts stochastically, yet must never change.
    settings = MultiAgentSettings(
        learning_mask=[True, False], exploration_mask=[True, True], batch_size=32,
        collection_step_num_env_steps=4, collection_step_num_episodes=20,
    )  # fmt: skip
    trainer = DecentralizedTrainer(
        audited_env, [learner, frozen], _quiet(60), settings, num_envs=4, num_test_envs=2
    )
    result = trainer.run()
    assert result.episodes == 60
    assert torch.equal(frozen.parameters_vector(), before_frozen)
    assert not torch.equal(learner.parameters_vector(), before_learner)
    assert learner.gradient_steps > 0
    assert frozen.gradient_steps == 0
    assert frozen.progress == 0.0  # a frozen agent's schedules stay where they were
    assert ILLEGAL_MOVES == []


def _short_game(agents: list[Any], **changes: Any) -> DecentralizedTrainer:
    """40 episodes on 4 copies, updates every 4 agent steps."""
    settings = MultiAgentSettings(
        batch_size=32, collection_step_num_env_steps=4, collection_step_num_episodes=20,
        **changes,
    )  # fmt: skip
    return DecentralizedTrainer(
        tictactoe_v3.env, agents, _quiet(40), settings, num_envs=4, num_test_envs=2
    )


def test_mixed_on_and_off_policy_learners_both_update() -> None:
    dqn = DQN(OBS, ACT, DQNConfig(learning_starts=0), seed=0)
    ppo = PPO(OBS, ACT, PPOConfig(num_epochs=1), seed=1)
    trainer = _short_game([ppo, dqn])
    trainer.run()
    assert dqn.gradient_steps > 0
    assert ppo.gradient_steps > 0
    assert trainer.train_returns.shape == (40, 2)
    # Zero-sum game: the two players' returns cancel in every episode.
    np.testing.assert_allclose(trainer.train_returns.sum(axis=1), 0.0)


def test_progress_prints_a_summary_after_every_epoch(capsys: pytest.CaptureFixture[str]) -> None:
    agents = [RandomAgent(OBS, ACT, seed=s) for s in (0, 1)]
    settings = MultiAgentSettings(learning_mask=[False, False], collection_step_num_episodes=10)
    config = TrainerConfig(
        max_episodes=20, epoch_num_steps=50, test_step_num_episodes=2, show_progress=False
    )
    result = DecentralizedTrainer(tictactoe_v3.env, agents, config, settings, num_envs=2).run()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch")]
    assert len(lines) == result.epochs >= 2

    quiet = TrainerConfig(max_episodes=20, epoch_num_steps=50, show_progress=False, verbose=False)
    DecentralizedTrainer(tictactoe_v3.env, agents, quiet, settings, num_envs=2).run()
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
    dqn = _BufferRecordingDQN(OBS, ACT, DQNConfig(learning_starts=0), seed=0)
    _short_game([dqn, RandomAgent(OBS, ACT, seed=1)], learning_mask=[True, False]).run()
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


def test_masked_ppo_rollouts_keep_their_masks(tmp_path: Path) -> None:
    # One epoch of one minibatch: the first gradient step's probability ratio must be exactly
    # 1, which holds only when the loss sees the masks the actions were sampled under.
    ppo = PPO(OBS, ACT, PPOConfig(num_epochs=1), seed=0)
    settings = MultiAgentSettings(
        learning_mask=[True, False], batch_size=4096, collection_step_num_episodes=10
    )
    DecentralizedTrainer(
        tictactoe_v3.env, [ppo, RandomAgent(OBS, ACT, seed=1)], _quiet(10), settings,
        num_envs=2, num_test_envs=2, run_dir=tmp_path,
    ).run()  # fmt: skip
    history = pq.read_table(tmp_path / "history.parquet").to_pydict()
    kl = [v for v in history["player_1/train/approx_kl"] if v is not None]
    clipped = [v for v in history["player_1/train/clip_fraction"] if v is not None]
    assert kl[-1] == pytest.approx(0.0, abs=1e-7)
    assert clipped[-1] == 0.0
