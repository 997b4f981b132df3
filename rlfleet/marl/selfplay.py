"""Self-play after Unity ML-Agents (its ``GhostTrainer`` and ``GhostController``): one team
learns at a time while the other teams play frozen snapshots ("ghosts") of their past.

teams
    With one self-play learner shared by several agents (a symmetric game such as
    tic-tac-toe), each agent is a team; with several self-play learners (an asymmetric game,
    one behavior per side), each learner's agents are one team. Teams are ordered as their
    first agent is in the env.
learner step
    One action of a learning agent (the learning team's). A learner's step count only moves
    while its team learns.
ghost step
    One action of an agent of a non-learning team, counted by the learner whose snapshots it
    plays.

Each learner (:class:`SelfPlay`) follows its :class:`SelfPlayConfig`, as ML-Agents does:

- every ``save_steps`` learner steps its weights become a snapshot; the last ``window``
  snapshots are kept (a ring: the newest overwrites the oldest), each with the Elo rating the
  learner had when it was taken;
- every ``swap_steps`` ghost steps, and whenever the learning team changes, each of its
  non-learning teams gets a new opponent: with probability ``play_against_latest_model_ratio``
  the learner as it is now, otherwise a snapshot drawn uniformly from the pool;
- when its learner steps since the last change of learning team exceed ``team_change``, the
  next team in the queue (:class:`SelfPlayTeams`) starts learning and the learning one joins
  the queue's end.

Elo (ML-Agents' formula, K = 16): when a learning agent's trajectory ends, its last reward
says win (> 0), draw (0) or loss (< 0); with ``e`` the expected score of the learner's rating
against the rating of the opponent the other team plays, the learner's rating moves by
``K * (result - e)`` and the opponent's by the opposite. Ratings start at ``initial_elo``; the
latest model's rating is the learner's own, so a game against the latest model moves nothing.

ML-Agents' counters compare with ``>`` (a snapshot after ``save_steps + 1`` steps); so do
these, so that a run's schedule is ML-Agents'.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet.algos.base import Algorithm
from rlfleet.config.fields import PositiveFloat, PositiveInt, UnitFloat
from rlfleet.errors import ConfigError

LATEST = -1
"""``SelfPlay.opponent_index`` of the latest model (the learner as it is now)."""


@dataclass
class SelfPlayConfig:
    """ML-Agents self-play options (same names)."""

    save_steps: PositiveInt = 2_000
    """Learner steps between snapshots added to the opponent pool."""
    team_change: PositiveInt | None = None
    """Learner steps between changes of the learning team (unset: ``5 * save_steps``,
    ML-Agents' default)."""
    swap_steps: PositiveInt = 1_000
    """Ghost steps (steps of the agents playing snapshots) between changes of opponent."""
    play_against_latest_model_ratio: UnitFloat = 0.5
    """Probability that the new opponent is the current learner rather than a past snapshot."""
    window: PositiveInt = 10
    """Snapshots kept in the pool (the oldest is overwritten first)."""
    initial_elo: float = 1200.0
    """Rating of the learner and of its first snapshot."""
    elo_k: PositiveFloat = 16.0
    """Elo K-factor: the largest rating change one game can cause."""

    @property
    def team_change_steps(self) -> int:
        """``team_change``, or its default ``5 * save_steps``."""
        return self.team_change if self.team_change is not None else 5 * self.save_steps


def elo_expected(rating: float, opponent: float) -> float:
    """Expected score of a player rated ``rating`` against ``opponent`` (1 = certain win)."""
    return float(1.0 / (1.0 + 10.0 ** ((opponent - rating) / 400.0)))


def game_result(final_reward: float) -> float:
    """ML-Agents' reading of a trajectory's last reward: 1 (win), 0.5 (draw) or 0 (loss)."""
    return 1.0 if final_reward > 0 else 0.0 if final_reward < 0 else 0.5


class SelfPlay:
    """One self-play learner: its snapshot pool, ratings, counters and the frozen copy
    (``opponent``) its non-learning teams play."""

    def __init__(self, learner: Algorithm[Any], config: SelfPlayConfig, *, seed: int = 0) -> None:
        self.learner = learner
        self.config = config
        self.opponent = copy.deepcopy(learner)
        """A frozen copy of the learner whose weights are swapped for snapshots."""
        self.rng = np.random.default_rng(seed)
        self.pool: list[dict[str, Any]] = []
        """Snapshots' weights (at most ``window``)."""
        self.ratings = [config.initial_elo] * (config.window + 1)
        """Slot ``i``: the rating of snapshot ``i``; the last slot: the learner's."""
        self.snapshot_counter = 0
        """The pool slot the next snapshot goes into."""
        self.opponent_index = LATEST
        """Pool slot of the snapshot the non-learning teams play (at first the learner's
        initial weights); :data:`LATEST`: the learner's weights as they were at the last
        swap."""
        self.learner_steps = 0
        self.ghost_steps = 0
        self.last_save = 0
        self.last_swap = 0
        self.last_team_change = 0
        self.seen_team = 0
        """The learning team when this learner last swapped (a change of team swaps)."""
        self.save()
        self._load_opponent(0)

    @property
    def elo(self) -> float:
        """The learner's rating."""
        return self.ratings[-1]

    @property
    def pool_elo(self) -> list[float]:
        """The snapshots' ratings, slot by slot."""
        return self.ratings[: len(self.pool)]

    def opponent_elo(self) -> float:
        """Rating of the current opponent."""
        return self.ratings[self.opponent_index]

    def save(self) -> None:
        """Add the learner's weights to the pool (overwriting the oldest once it is full)."""
        weights = _weights(self.learner)
        if len(self.pool) <= self.snapshot_counter:
            self.pool.append(weights)
        else:
            self.pool[self.snapshot_counter] = weights
        self.ratings[self.snapshot_counter] = self.elo
        self.snapshot_counter = (self.snapshot_counter + 1) % self.config.window

    def swap(self) -> None:
        """Draw a new opponent: the latest model with probability
        ``play_against_latest_model_ratio``, else a snapshot drawn uniformly."""
        if self.rng.uniform() < 1.0 - self.config.play_against_latest_model_ratio:
            self._load_opponent(int(self.rng.integers(len(self.pool))))
        else:
            self._load_opponent(LATEST)

    def _load_opponent(self, index: int) -> None:
        self.opponent_index = index
        weights = _weights(self.learner) if index == LATEST else self.pool[index]
        for key, module in self.opponent.modules().items():
            module.load_state_dict(weights[key])
        # Exploration schedules (DQN's epsilon) follow the learner's, not the snapshot's age.
        self.opponent.set_progress(self.learner.progress)

    def state_dict(self) -> dict[str, Any]:
        """The pool, ratings, counters, RNG and current opponent, for checkpoints."""
        return {
            "pool": self.pool,
            "ratings": list(self.ratings),
            "snapshot_counter": self.snapshot_counter,
            "opponent": _weights(self.opponent),
            "opponent_index": self.opponent_index,
            "learner_steps": self.learner_steps,
            "ghost_steps": self.ghost_steps,
            "last_save": self.last_save,
            "last_swap": self.last_swap,
            "last_team_change": self.last_team_change,
            "seen_team": self.seen_team,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the learner's own weights are restored apart)."""
        self.pool = list(state["pool"])
        self.ratings = [float(x) for x in state["ratings"]]
        self.snapshot_counter = int(state["snapshot_counter"])
        self.opponent_index = int(state["opponent_index"])
        for key, module in self.opponent.modules().items():
            module.load_state_dict(state["opponent"][key])
        self.opponent.set_progress(self.learner.progress)
        for name in (
            "learner_steps",
            "ghost_steps",
            "last_save",
            "last_swap",
            "last_team_change",
            "seen_team",
        ):
            setattr(self, name, int(state[name]))
        self.rng.bit_generator.state = dict(state["rng"])


class SelfPlayTeams:
    """ML-Agents' ghost controller: the teams, which one learns, and the queue of the others.

    Args:
        teams: each team's agents.
        owners: each team's :class:`SelfPlay` (the learner that plays it).
    """

    def __init__(self, teams: Sequence[Sequence[str]], owners: Sequence[SelfPlay]) -> None:
        self.teams = [list(t) for t in teams]
        self.owners = list(owners)
        self.learning_team = 0
        self.queue = list(range(1, len(self.teams)))
        """The teams waiting to learn, next first."""
        self.team_of = {agent: i for i, team in enumerate(self.teams) for agent in team}

    def distinct(self) -> list[SelfPlay]:
        """Each learner once, in team order."""
        return list({id(s): s for s in self.owners}.values())

    def learning(self, agent: str) -> bool:
        """Whether ``agent``'s team is learning now."""
        return self.team_of[agent] == self.learning_team

    def owner(self, agent: str) -> SelfPlay:
        return self.owners[self.team_of[agent]]

    def on_steps(self, learner_steps: Mapping[int, int], ghost_steps: Mapping[int, int]) -> None:
        """Count the steps each learner (by ``id``) took and its ghosts played; then, learner
        by learner as ML-Agents advances its trainers, change the learning team, save and
        swap when due."""
        for play in self.distinct():
            play.learner_steps += learner_steps.get(id(play), 0)
            play.ghost_steps += ghost_steps.get(id(play), 0)
        for play in self.distinct():
            config = play.config
            if play.learner_steps - play.last_team_change > config.team_change_steps:
                self.queue.append(self.learning_team)
                self.learning_team = self.queue.pop(0)
                play.last_team_change = play.learner_steps
            if play.learner_steps - play.last_save > config.save_steps:
                play.save()
                play.last_save = play.learner_steps
            changed = play.seen_team != self.learning_team
            if changed or play.ghost_steps - play.last_swap > config.swap_steps:
                play.seen_team = self.learning_team
                if any(
                    self.owners[t] is play
                    for t in range(len(self.teams))
                    if t != self.learning_team
                ):
                    play.swap()
                play.last_swap = play.ghost_steps

    def record_result(self, final_reward: float, team: int | None = None) -> float:
        """Rate one finished trajectory of a learning agent (its last reward) of ``team``
        (default: the learning team; a copy whose episode began before the learning team
        changed still seats the team that learned then); returns the learner's rating
        change."""
        team = self.learning_team if team is None else team
        learner = self.owners[team]
        others = [t for t in range(len(self.teams)) if t != team]
        opponent = self.owners[others[-1]].opponent_elo()
        change = learner.config.elo_k * (
            game_result(final_reward) - elo_expected(learner.elo, opponent)
        )
        for team in others:
            owner = self.owners[team]
            owner.ratings[owner.opponent_index] -= change
        learner.ratings[-1] += change
        return change

    def state_dict(self) -> dict[str, Any]:
        return {"learning_team": self.learning_team, "queue": list(self.queue)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.learning_team = int(state["learning_team"])
        self.queue = [int(t) for t in state["queue"]]


SelfPlayOption = SelfPlayConfig | dict[str, SelfPlayConfig]
"""``MultiAgentSettings.self_play``: one config for a two-player game whose agents share one
learner, or a config per learner, keyed by its name (its agents joined by ``+``)."""


def self_play_groups(
    names: Sequence[str],
    groups: Sequence[tuple[str, Sequence[str], bool]],
    settings: SelfPlayOption,
) -> tuple[dict[str, SelfPlayConfig], list[list[str]]]:
    """Which learners play self-play and the teams: ``groups`` are ``(name, agents,
    learning)`` of each distinct algorithm. Returns each self-play learner's config (by name)
    and the teams (see the module docstring).

    Raises:
        ConfigError: a config for a learner the game does not have; an agent played by a
            learner without self-play; a frozen learner; one learner for a single agent.
    """
    if isinstance(settings, SelfPlayConfig):
        if len(groups) != 1 or not groups[0][2] or len(names) != 2:
            raise ConfigError(
                "self_play: expected a two-player game whose agents all share one learning "
                f"algorithm, got {len(names)} agents and {len(groups)} distinct algorithm(s) "
                "(give a mapping from each learner's name to its settings for teams with "
                "learners of their own)"
            )
        settings = {groups[0][0]: settings}
    known = [g[0] for g in groups]
    unknown = [k for k in settings if k not in known]
    if unknown:
        raise ConfigError(
            f"self_play: no learner named {unknown} in this game; its learners are {known}"
        )
    without = [g[0] for g in groups if g[0] not in settings]
    if without:
        raise ConfigError(
            f"self_play: every learner of the game needs self-play settings (one team learns "
            f"while the others play snapshots); {without} have none"
        )
    frozen = [g[0] for g in groups if not g[2]]
    if frozen:
        raise ConfigError(f"self_play: learner(s) {frozen} are frozen; self-play trains them")
    if len(groups) == 1:
        teams = [[agent] for agent in groups[0][1]]
        if len(teams) < 2:
            raise ConfigError(
                f"self_play: learner {groups[0][0]!r} plays one agent, and self-play needs "
                "two teams"
            )
    else:
        teams = [list(g[1]) for g in groups]
    return dict(settings), teams


def _weights(algorithm: Algorithm[Any]) -> dict[str, Any]:
    return {
        key: {k: v.detach().clone() for k, v in module.state_dict().items()}
        for key, module in algorithm.modules().items()
    }


__all__ = [
    "LATEST",
    "SelfPlay",
    "SelfPlayConfig",
    "SelfPlayOption",
    "SelfPlayTeams",
    "elo_expected",
    "game_result",
    "self_play_groups",
]
