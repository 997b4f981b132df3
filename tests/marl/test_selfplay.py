"""Self-play on tic-tac-toe (symmetric): the learner's Elo rises against its past selves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.errors import CheckpointError, ConfigError
from rlfleet.marl.agents import make_agents
from rlfleet.marl.selfplay import (
    LATEST,
    SelfPlay,
    SelfPlayConfig,
    SelfPlayTeams,
    elo_expected,
    self_play_groups,
)
from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings
from rlfleet.train.loop import TrainerConfig


def test_elo_expected_is_symmetric() -> None:
    assert elo_expected(1200, 1200) == pytest.approx(0.5)
    assert elo_expected(1400, 1200) + elo_expected(1200, 1400) == pytest.approx(1.0)
    assert elo_expected(1600, 1200) == pytest.approx(1 / (1 + 10**-1))


@pytest.mark.slow
def test_self_play_elo_rises() -> None:
    self_play = SelfPlayConfig(
        save_steps=500, swap_steps=250, play_against_latest_model_ratio=0.3, window=5
    )
    ppo_config = PPOConfig(learning_rate=1e-3, num_epochs=4, ent_coef=0.01, hidden_sizes=(128, 128))
    agents = make_agents(
        tictactoe_v3.env, lambda o, a, s: PPO(o, a, ppo_config, seed=s), share_parameters=True
    )
    elo: list[float] = []
    trainer = DecentralizedTrainer(
        tictactoe_v3.env,
        agents,
        TrainerConfig(max_episodes=3_000, epoch_num_steps=11_000, test_step_num_episodes=20),
        MultiAgentSettings(batch_size=256, collection_step_num_episodes=100, self_play=self_play),
        num_envs=8,
        training_fn=lambda epoch, step: elo.append(trainer.collector.self_play.elo),  # type: ignore[union-attr]
    )
    trainer.run()
    assert trainer.collector.self_play is not None
    elo.append(trainer.collector.self_play.elo)
    ratings = np.asarray(elo[1:])  # after each collection step
    assert len(ratings) == 3_000 // 100
    # Noisy game by game, and it swings with the learning seat (the first player wins more
    # often, and ML-Agents rates a game by its result alone): over the run it stays above
    # where it started.
    assert ratings.mean() > self_play.initial_elo + 50, ratings.round()
    assert ratings.max() > self_play.initial_elo + 150, ratings.round()


def test_pool_keeps_a_window_of_snapshots() -> None:
    agents = make_agents(
        tictactoe_v3.env, lambda o, a, s: PPO(o, a, PPOConfig(), seed=s), share_parameters=True
    )
    play = SelfPlay(agents[0], SelfPlayConfig(save_steps=10, swap_steps=5, window=3))
    teams = SelfPlayTeams([["player_1"], ["player_2"]], [play, play])
    for _ in range(10):
        teams.on_steps({id(play): 11}, {id(play): 11})
    assert len(play.pool) == 3  # a ring of window snapshots
    assert len(play.pool_elo) == 3
    assert play.snapshot_counter == (1 + 10) % 3


def _recorded_swaps(play: SelfPlay) -> list[tuple[int, int]]:
    """Each swap of ``play`` from now on: the ghost steps then and the opponent drawn."""
    swaps: list[tuple[int, int]] = []
    swap = play.swap

    def recording_swap() -> None:
        swap()
        swaps.append((play.ghost_steps, play.opponent_index))

    play.swap = recording_swap  # type: ignore[method-assign]
    return swaps


@pytest.mark.parametrize("ratio", [0.0, 1.0])
def test_opponents_change_every_swap_steps_and_when_the_learning_team_changes(
    ratio: float,
) -> None:
    agents = make_agents(
        tictactoe_v3.env, lambda o, a, s: PPO(o, a, PPOConfig(), seed=s), share_parameters=True
    )
    config = SelfPlayConfig(
        save_steps=10, swap_steps=5, team_change=1_000, window=3,
        play_against_latest_model_ratio=ratio,
    )  # fmt: skip
    play = SelfPlay(agents[0], config)
    swaps = _recorded_swaps(play)
    teams = SelfPlayTeams([["player_1"], ["player_2"]], [play, play])
    for _ in range(6):
        teams.on_steps({id(play): 11}, {id(play): 3})
    # More than 5 ghost steps since the last swap ('>', as ML-Agents compares): at 6, 12, 18.
    assert [steps for steps, _ in swaps] == [6, 12, 18]
    # Ratio 1: always the latest weights; ratio 0: always a snapshot of the pool.
    assert all((index == LATEST) == (ratio == 1.0) for _, index in swaps)
    assert all(index == LATEST or 0 <= index < len(play.pool) for _, index in swaps)

    changing = SelfPlay(agents[0], SelfPlayConfig(save_steps=10, team_change=25, swap_steps=1_000))
    swaps = _recorded_swaps(changing)
    teams = SelfPlayTeams([["player_1"], ["player_2"]], [changing, changing])
    for _ in range(3):
        teams.on_steps({id(changing): 10}, {})
    assert teams.learning_team == 1
    assert [steps for steps, _ in swaps] == [0]  # no ghost steps: the team change swapped


def test_learning_team_changes_every_team_change_learner_steps() -> None:
    agents = make_agents(
        tictactoe_v3.env, lambda o, a, s: PPO(o, a, PPOConfig(), seed=s), share_parameters=True
    )
    play = SelfPlay(agents[0], SelfPlayConfig(save_steps=10, team_change=25))
    teams = SelfPlayTeams([["player_1"], ["player_2"]], [play, play])
    learning = []
    for _ in range(12):
        teams.on_steps({id(play): 10}, {})
        learning.append(teams.learning_team)
    # ML-Agents compares with '>': a change after 30 steps (> 25), then 30 more, ...
    assert learning == [0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0]
    assert SelfPlayConfig(save_steps=7).team_change_steps == 35  # ML-Agents' default


def test_elo_moves_as_ml_agents_moves_it() -> None:
    agents = make_agents(
        tictactoe_v3.env, lambda o, a, s: PPO(o, a, PPOConfig(), seed=s), share_parameters=True
    )
    play = SelfPlay(agents[0], SelfPlayConfig())
    teams = SelfPlayTeams([["player_1"], ["player_2"]], [play, play])
    assert play.opponent_index == 0  # the first snapshot: the initial weights
    change = teams.record_result(1.0)
    assert change == pytest.approx(16 * (1 - 0.5))
    assert play.elo == pytest.approx(1208)
    assert play.pool_elo == [pytest.approx(1192)]
    teams.record_result(0.0)  # a draw: expected above 0.5, so the rating drops
    assert play.elo < 1208
    play.opponent_index = LATEST  # against the latest model nothing moves
    before = play.elo
    teams.record_result(-1.0)
    assert play.elo == before


def test_self_play_needs_every_learner_configured() -> None:
    groups = [("a", ["a"], True), ("b", ["b"], True)]
    with pytest.raises(ConfigError, match=r"\['b'\] have none"):
        self_play_groups(["a", "b"], groups, {"a": SelfPlayConfig()})
    with pytest.raises(ConfigError, match="no learner named"):
        self_play_groups(["a", "b"], groups, {"c": SelfPlayConfig()})
    _configs, teams = self_play_groups(
        ["a", "b"], groups, {"a": SelfPlayConfig(), "b": SelfPlayConfig()}
    )
    assert teams == [["a"], ["b"]]
    frozen = [("a", ["a"], True), ("b", ["b"], False)]
    with pytest.raises(ConfigError, match=r"learner\(s\) \['b'\] are frozen"):
        self_play_groups(["a", "b"], frozen, {"a": SelfPlayConfig(), "b": SelfPlayConfig()})


def test_resuming_without_saved_self_play_state_is_refused(tmp_path: Path) -> None:
    def trainer(self_play: SelfPlayConfig | None, resume: bool) -> DecentralizedTrainer:
        agents = make_agents(
            tictactoe_v3.env,
            lambda o, a, s: PPO(o, a, PPOConfig(num_epochs=1), seed=s),
            share_parameters=True,
        )
        return DecentralizedTrainer(
            tictactoe_v3.env,
            agents,
            TrainerConfig(max_episodes=20, show_progress=False, verbose=False),
            MultiAgentSettings(collection_step_num_episodes=10, self_play=self_play),
            num_envs=2,
            num_test_envs=1,
            run_dir=tmp_path,
            resume_from_log=resume,
        )

    trainer(None, False).run()
    with pytest.raises(CheckpointError, match="self_play: expected the checkpoint to hold"):
        trainer(SelfPlayConfig(), True)


def test_ghosts_explore_in_training_and_act_greedily_in_test_episodes() -> None:
    agents = make_agents(
        tictactoe_v3.env, lambda o, a, s: PPO(o, a, PPOConfig(), seed=s), share_parameters=True
    )
    phase = ["training"]
    trainer = DecentralizedTrainer(
        tictactoe_v3.env, agents,
        TrainerConfig(max_episodes=40, epoch_num_steps=200, test_step_num_episodes=4,
                      show_progress=False, verbose=False),
        MultiAgentSettings(batch_size=64, collection_step_num_episodes=10,
                           self_play=SelfPlayConfig(save_steps=20, swap_steps=10)),
        num_envs=2, num_test_envs=2,
        test_fn=lambda epoch, step: phase.__setitem__(0, "test"),
        training_fn=lambda epoch, step: phase.__setitem__(0, "training"),
    )  # fmt: skip
    modes: set[tuple[str, bool]] = set()
    for ghost in trainer.collector.ghosts.values():
        act = ghost.algorithm.act

        def recording_act(obs: Any, *, _act: Any = act, **kwargs: Any) -> Any:
            modes.add((phase[0], kwargs.get("deterministic", False)))
            return _act(obs, **kwargs)

        ghost.algorithm.act = recording_act  # type: ignore[method-assign]
    trainer.run()
    assert ("training", False) in modes
    assert {greedy for seen, greedy in modes if seen == "test"} == {True}


def test_every_non_learning_team_of_one_behavior_plays_the_same_snapshot() -> None:
    """docs/coming-from-ml-agents.md: with one behavior and more than two agents, the agents of
    every non-learning team play the same snapshot, through every team change and swap."""
    spread = pytest.importorskip("mpe2.simple_spread_v3")

    def game() -> Any:
        return spread.parallel_env(N=3, max_cycles=5, continuous_actions=False)

    agents = make_agents(
        game, lambda o, a, s: PPO(o, a, PPOConfig(), seed=s), share_parameters=True
    )
    config = SelfPlayConfig(save_steps=4, swap_steps=2, team_change=9, window=3)
    trainer = DecentralizedTrainer(
        game, agents,
        TrainerConfig(max_episodes=6, epoch_num_steps=50, test_step_num_episodes=1,
                      show_progress=False, verbose=False),
        MultiAgentSettings(batch_size=16, collection_step_num_episodes=2,
                           self_play={"agent_0+agent_1+agent_2": config}),
        num_envs=1, num_test_envs=1,
    )  # fmt: skip
    collector = trainer.collector
    teams = collector.teams
    assert teams is not None
    assert len(teams.teams) == 3
    play = teams.owners[0]
    learning_teams, opponents = set(), set()
    for _ in range(20):
        teams.on_steps({id(play): 3}, {id(play): 3})
        seats = collector.seating()
        learners = [a for a in seats if teams.learning(a)]
        ghosts = {id(seats[a]) for a in seats if not teams.learning(a)}
        assert len(learners) == 1, learners
        assert len(ghosts) == 1, seats
        learning_teams.add(teams.learning_team)
        opponents.add(play.opponent_index)
    assert learning_teams == {0, 1, 2}  # every team learned in turn
    assert len(opponents) > 1  # and the ghosts changed snapshot
    trainer.run()  # the game itself plays through with three seats
