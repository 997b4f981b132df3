"""ML-Agents self-play and several behaviors on PettingZoo games, from run options files:
``self_play`` with ML-Agents' keys and defaults, behaviors mapped onto a game's agents, each
with its own learner and hyperparameters, and ``--resume`` continuing all of it."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

pytest.importorskip("pettingzoo")
from pettingzoo.classic import tictactoe_v3

from rlfleet.checkpoint.durable import load_checkpoint
from rlfleet.checkpoint.manager import CheckpointManager
from rlfleet.config.located import parse_yaml
from rlfleet.errors import ConfigError
from rlfleet.marl.agents import Agents, RandomAgent
from rlfleet.marl.collector import MultiAgentCollector
from rlfleet.marl.selfplay import SelfPlayConfig, self_play_groups
from rlfleet.runs.config import load_run_config
from rlfleet.runs.from_options import behavior_agents, run_config_from_options, train_from_options
from rlfleet.runs.multi_agent import play_against, play_command
from rlfleet.runs.options_parser import parse_run_options
from rlfleet.runs.run import build_agents, load_policy
from rlfleet.runs.run_options import RunOptions, run_options_to_dict

TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"


def _parse(text: str, **flags: Any) -> RunOptions:
    return parse_run_options(parse_yaml(text, "test.yaml"), "test.yaml", flags=flags)


def _options(behaviors: str, env_id: str = TICTACTOE, **flags: Any) -> RunOptions:
    return _parse(
        f"env_settings: {{env_id: '{env_id}', num_envs: 4}}\nbehaviors:\n{behaviors}", **flags
    )


def test_self_play_takes_ml_agents_keys_and_defaults() -> None:
    cfg = run_config_from_options(_options("  player:\n    self_play: {window: 4}\n"))
    assert cfg.multi_agent is not None
    assert cfg.multi_agent.share_parameters  # one behavior: a symmetric game, one network
    assert cfg.multi_agent.self_play == {
        "player_1+player_2": SelfPlayConfig(
            save_steps=20_000,
            team_change=100_000,  # 5 x save_steps
            swap_steps=2_000,
            window=4,
            play_against_latest_model_ratio=0.5,
            initial_elo=1200.0,
        )
    }
    given = _options(
        "  player:\n    self_play:\n      {save_steps: 10, team_change: 30, swap_steps: 5, "
        "play_against_latest_model_ratio: 0.25, initial_elo: 1000}\n"
    )
    assert run_config_from_options(given).multi_agent.self_play == {  # type: ignore[union-attr]
        "player_1+player_2": SelfPlayConfig(
            save_steps=10,
            team_change=30,
            swap_steps=5,
            play_against_latest_model_ratio=0.25,
            initial_elo=1000.0,
        )
    }


def test_a_team_change_past_max_steps_is_noted(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rlfleet.runs"):
        _options("  player:\n    max_steps: 1000\n    self_play: {save_steps: 300}\n")
    assert "(1500 learner steps) exceeds max_steps (1000)" in caplog.text


def test_one_behavior_without_self_play_keeps_one_network_per_agent() -> None:
    cfg = run_config_from_options(_options("  anything:\n    trainer_type: ppo\n"))
    assert cfg.multi_agent is not None
    assert not cfg.multi_agent.share_parameters
    assert cfg.multi_agent.self_play is None
    assert cfg.agent_behaviors == {}


def _build(behaviors: str) -> None:
    """Read the options, map them onto a run config and build its agents and teams."""
    cfg = run_config_from_options(_options(behaviors))
    agents = build_agents(cfg)
    assert cfg.multi_agent is not None
    if cfg.multi_agent.self_play is not None:
        groups = [(g.name, g.agents, g.learning) for g in agents.groups]
        self_play_groups(agents.names, groups, cfg.multi_agent.self_play)


@pytest.mark.parametrize(
    ("behaviors", "fragments"),
    [
        ("  player: {}\n  other: {}\n", ["behaviors.other", "plays none of the game's agents"]),
        (
            "  player: {}\n  crosses: {agents: [player_1]}\n",
            ["agent 'player_1'", "behaviors ['player', 'crosses'] all play it"],
        ),
        (
            "  crosses: {agents: [player_1]}\n",
            ["agent 'player_2'", "no behavior plays it"],
        ),
        ("  crosses: {agents: [player_3]}\n", ["behaviors.crosses.agents", "'player_3'"]),
        (
            "  crosses: {agents: [player_1], self_play: {}}\n  noughts: {agents: [player_2]}\n",
            ["self_play", "['player_2'] have none"],
        ),
    ],
)
def test_behaviors_map_onto_agents_or_fail_naming_them(
    behaviors: str, fragments: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        _build(behaviors)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_the_prefix_rule() -> None:
    options = _options("  agent: {}\n  adversary: {}\n")
    mapping = behavior_agents(options, ["adversary_0", "agent_0", "agent_1", "agents_2"][:3])
    assert mapping == {"agent": ["agent_0", "agent_1"], "adversary": ["adversary_0"]}
    with pytest.raises(ConfigError, match="agent 'agents_2': no behavior plays it"):
        behavior_agents(options, ["adversary_0", "agent_0", "agents_2"])


@pytest.mark.parametrize("key", ["self_play: {}", "agents: [a]"])
def test_a_gymnasium_env_refuses_self_play_and_agent_lists(key: str) -> None:
    with pytest.raises(ConfigError, match="a Gymnasium env has one"):
        _options(f"  B:\n    {key}\n", env_id="CartPole-v1")
    with pytest.raises(ConfigError, match="a Gymnasium env has one behavior"):
        _options("  A: {}\n  B: {}\n", env_id="CartPole-v1")


TWO_BEHAVIORS = """\
env_settings: {env_id: 'pettingzoo:pettingzoo.classic.tictactoe_v3', num_envs: 4,
               num_test_envs: 2, seed: 3}
behaviors:
  crosses:
    agents: [player_1]
    hyperparameters: {learning_rate: 1.0e-3, batch_size: 64}
    network_settings: {hidden_units: 64, num_layers: 2}
    max_steps: MAX_STEPS
    summary_freq: 200
    checkpoint_interval: 400
    self_play: {save_steps: 100, team_change: 150, swap_steps: 50}
  noughts:
    agents: [player_2]
    hyperparameters: {learning_rate: 3.0e-4, num_epoch: 2, batch_size: 32}
    network_settings: {hidden_units: 32, num_layers: 1}
    self_play: {save_steps: 120, team_change: 150, swap_steps: 50, window: 3}
"""


def _two_behaviors(tmp_path: Path, max_steps: int, **flags: Any) -> RunOptions:
    text = TWO_BEHAVIORS.replace("MAX_STEPS", str(max_steps))
    return _parse(text, results_dir=str(tmp_path), run_id="teams", **flags)


def test_two_behaviors_train_their_own_learners_with_their_own_hyperparameters(
    tmp_path: Path,
) -> None:
    options = _two_behaviors(tmp_path, 1200)
    cfg = run_config_from_options(options)
    assert list(cfg.agent_behaviors) == ["crosses", "noughts"]
    assert cfg.multi_agent is not None
    assert set(cfg.multi_agent.self_play) == {"player_1", "player_2"}  # type: ignore[arg-type]
    train_from_options(options)
    run_dir = tmp_path / "teams"
    assert load_run_config(run_dir).agent_behaviors == cfg.agent_behaviors  # config.yaml reads back
    agents, _ = load_policy(run_dir, which="latest")
    assert isinstance(agents, Agents)
    crosses, noughts = agents["player_1"], agents["player_2"]
    assert crosses is not noughts
    assert crosses.config.learning_rate == 1e-3
    assert crosses.config.hidden_sizes == (64, 64)
    assert noughts.config.learning_rate == 3e-4
    assert noughts.config.hidden_sizes == (32,)
    assert noughts.config.num_epochs == 2
    # Each learner's minibatches are its behavior's batch_size: the run sets none of its own.
    assert cfg.multi_agent.batch_size is None
    assert (crosses.config.batch_size, noughts.config.batch_size) == (64, 32)
    # Each behavior's network sees its own agents' observations (no one-hot for one agent).
    assert crosses.observation_space == noughts.observation_space
    assert play_command(run_dir, episodes=1, seed=0, frame_dir=None, checkpoint="latest") == 0
    random_player = RandomAgent(crosses.observation_space, crosses.action_space, seed=0)
    records = play_against(agents, tictactoe_v3.env, random_player, episodes=4)
    assert set(records) == {"player_1", "player_2"}
    state = _latest_state(run_dir)["self_play"]
    steps = {name: s["learner_steps"] for name, s in state["learners"].items()}
    # Only the learning team moves its step count: each side learned in turn.
    assert steps["player_1"] > 150, steps
    assert steps["player_2"] > 0, steps
    history = pq.read_table(run_dir / "history.parquet").to_pydict()
    assert "selfplay/elo/player_1" in history
    assert "selfplay/elo/player_2" in history


def _latest_state(run_dir: Path) -> dict[str, Any]:
    path = CheckpointManager(run_dir / "checkpoints", readonly=True).latest()
    assert path is not None
    state, _ = load_checkpoint(path)
    return dict(state["run"])


def test_resume_continues_pool_ratings_opponents_learning_team_and_counters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train_from_options(_two_behaviors(tmp_path, 800))
    run_dir = tmp_path / "teams"
    saved = _latest_state(run_dir)["self_play"]
    first_rows = pq.read_table(run_dir / "history.parquet").num_rows

    restored: list[dict[str, Any]] = []
    load = MultiAgentCollector.load_state_dict

    def spy(collector: MultiAgentCollector, state: Any) -> None:
        load(collector, state)
        assert collector.teams is not None
        learners = {n: p.state_dict() for n, p in collector.self_play_learners.items()}
        restored.append(
            copy.deepcopy({"teams": collector.teams.state_dict(), "learners": learners})
        )

    monkeypatch.setattr(MultiAgentCollector, "load_state_dict", spy)
    train_from_options(_two_behaviors(tmp_path, 1600, resume=True))
    assert len(restored) == 1
    assert restored[0]["teams"] == saved["teams"]
    for name, play in saved["learners"].items():
        now = restored[0]["learners"][name]
        for key in (
            "ratings", "snapshot_counter", "opponent_index", "learner_steps", "ghost_steps",
            "last_save", "last_swap", "last_team_change", "seen_team", "rng",
        ):  # fmt: skip
            assert now[key] == play[key], (name, key)
        assert len(now["pool"]) == len(play["pool"])
        for mine, theirs in zip(now["pool"], play["pool"], strict=True):
            for module in mine:
                for k, v in mine[module].items():
                    assert np.array_equal(v.numpy(), theirs[module][k].numpy())
    after = _latest_state(run_dir)["self_play"]["learners"]
    assert sum(p["learner_steps"] for p in after.values()) > sum(
        p["learner_steps"] for p in saved["learners"].values()
    )
    assert pq.read_table(run_dir / "history.parquet").num_rows > first_rows


SELF_PLAY = """\
env_settings: {env_id: 'pettingzoo:pettingzoo.classic.tictactoe_v3', num_envs: 8,
               num_test_envs: 2, seed: 0}
behaviors:
  player:
    trainer_type: ppo
    hyperparameters: {learning_rate: 1.0e-3, batch_size: 64, num_epoch: 4, beta: 0.1}
    network_settings: {hidden_units: 128, num_layers: 2}
    reward_signals: {extrinsic: {gamma: 0.9, strength: 1.0}}
    max_steps: 60000
    summary_freq: 2000
    checkpoint_interval: 1000000
    self_play: {save_steps: 2000, team_change: 2000, swap_steps: 500, window: 50,
                play_against_latest_model_ratio: 0.2}
"""
"""The file ``bench/selfplay_tictactoe.py`` trains at longer budgets and over seeds."""


@pytest.mark.slow
def test_tictactoe_self_play_elo_rises_and_beats_a_random_player(tmp_path: Path) -> None:
    train_from_options(_parse(SELF_PLAY, results_dir=str(tmp_path), run_id="ttt"))
    run_dir = tmp_path / "ttt"
    history = pq.read_table(run_dir / "history.parquet").to_pydict()
    elo = np.asarray([e for e in history["selfplay/elo"] if e is not None])
    # It swings with the learning seat (the first player wins more often): over the run it
    # stays above where it started.
    assert elo.mean() > 1200 + 50, elo.round()
    assert elo.max() > 1200 + 150, elo.round()
    agents, _ = load_policy(run_dir, which="latest")
    assert isinstance(agents, Agents)
    random_player = RandomAgent(
        agents["player_1"].observation_space, agents["player_1"].action_space, seed=7
    )
    records = play_against(agents, tictactoe_v3.env, random_player, episodes=300, seed=100)
    # The full bar (90% as first player, on each of 5 seeds) is bench/selfplay_tictactoe.py's.
    assert records["player_1"].won >= 0.8, records
    assert records["player_2"].won + records["player_2"].drawn >= 0.6, records


def test_written_options_with_self_play_and_agent_lists_read_back_equal(tmp_path: Path) -> None:
    options = _two_behaviors(tmp_path, 1000)
    written = yaml.safe_dump(run_options_to_dict(options))
    assert parse_run_options(yaml.safe_load(written)) == options


def test_default_settings_are_merged_under_every_behavior_key_by_key() -> None:
    """docs/run-options.md: ``default_settings`` is merged under every behavior, key by key:
    each behavior keeps the keys it sets and takes the others from the defaults."""
    options = _parse(
        f"env_settings: {{env_id: '{TICTACTOE}', num_envs: 4}}\n"
        "default_settings:\n"
        "  hyperparameters: {beta: 0.02, batch_size: 48}\n"
        "  network_settings: {hidden_units: 24}\n"
        "behaviors:\n"
        "  crosses: {agents: [player_1], hyperparameters: {learning_rate: 1.0e-3}}\n"
        "  noughts: {agents: [player_2], hyperparameters: {batch_size: 16},\n"
        "            network_settings: {num_layers: 1}}\n"
    )
    crosses, noughts = options.behaviors["crosses"], options.behaviors["noughts"]
    # beta is ML-Agents' name of ent_coef.
    assert (crosses.hyperparameters.ent_coef, noughts.hyperparameters.ent_coef) == (0.02, 0.02)
    assert (crosses.hyperparameters.batch_size, noughts.hyperparameters.batch_size) == (48, 16)
    assert crosses.hyperparameters.learning_rate == 1e-3
    assert noughts.hyperparameters.learning_rate != 1e-3  # ML-Agents' default, not crosses'
    assert (crosses.network_settings.hidden_units, noughts.network_settings.hidden_units) == (
        24,
        24,
    )
    assert (crosses.network_settings.num_layers, noughts.network_settings.num_layers) == (2, 1)
