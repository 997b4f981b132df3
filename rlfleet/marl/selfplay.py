"""Self-play after Unity ML-Agents: a learner plays frozen snapshots of its own past.

Every ``save_steps`` learner steps the learner's weights join a pool of at most ``window``
snapshots; every ``swap_steps`` learner steps the opponent changes: with probability
``play_against_latest_model_ratio`` it is the learner as it is now, otherwise a snapshot drawn
uniformly from the pool. Each snapshot keeps an Elo rating; after every game the learner's
rating and its opponent's move by ``K * (score - expected)`` in opposite directions, as in
ML-Agents (K = 16, ratings start at 1200). A learner that keeps beating its past selves has a
rising Elo.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet.algos.base import Algorithm
from rlfleet.config.fields import PositiveFloat, PositiveInt, UnitFloat


@dataclass
class SelfPlayConfig:
    """ML-Agents self-play options (same names)."""

    save_steps: PositiveInt = 2_000
    """Learner steps between snapshots added to the opponent pool."""
    swap_steps: PositiveInt = 1_000
    """Learner steps between changes of opponent."""
    play_against_latest_model_ratio: UnitFloat = 0.5
    """Probability that the new opponent is the current learner rather than a past snapshot."""
    window: PositiveInt = 10
    """Snapshots kept in the pool (the oldest is dropped first)."""
    initial_elo: float = 1200.0
    """Rating of the learner and of its first snapshot."""
    elo_k: PositiveFloat = 16.0
    """Elo K-factor: the largest rating change one game can cause."""


def elo_expected(rating: float, opponent: float) -> float:
    """Expected score of a player rated ``rating`` against ``opponent`` (1 = certain win)."""
    return float(1.0 / (1.0 + 10.0 ** ((opponent - rating) / 400.0)))


class SelfPlay:
    """The opponent pool, the current opponent and the Elo ratings of one learner."""

    def __init__(self, learner: Algorithm[Any], config: SelfPlayConfig, *, seed: int = 0) -> None:
        self.learner = learner
        self.config = config
        self.opponent = copy.deepcopy(learner)
        """A frozen copy of the learner whose weights are swapped for snapshots."""
        self.rng = np.random.default_rng(seed)
        self.elo = config.initial_elo
        self.pool: list[dict[str, Any]] = []
        self.pool_elo: list[float] = []
        self.opponent_index: int | None = None
        """Pool index of the current opponent; None when it is the latest learner."""
        self.learner_steps = 0
        self._next_save = 0
        self._next_swap = config.swap_steps
        self._save()
        self._load_opponent(0)

    def _save(self) -> None:
        self.pool.append(_weights(self.learner))
        self.pool_elo.append(self.elo)
        if len(self.pool) > self.config.window:
            self.pool.pop(0)
            self.pool_elo.pop(0)
            if self.opponent_index is not None:
                self.opponent_index = max(self.opponent_index - 1, 0)
        self._next_save += self.config.save_steps

    def _load_opponent(self, index: int | None) -> None:
        self.opponent_index = index
        weights = _weights(self.learner) if index is None else self.pool[index]
        for key, module in self.opponent.modules().items():
            module.load_state_dict(weights[key])
        # Exploration schedules (DQN's epsilon) follow the learner's, not the snapshot's age.
        self.opponent.set_progress(self.learner.progress)

    def opponent_elo(self) -> float:
        """Rating of the current opponent."""
        return self.elo if self.opponent_index is None else self.pool_elo[self.opponent_index]

    def on_learner_steps(self, steps: int) -> None:
        """Count learner steps; snapshot and swap opponents when their intervals are due."""
        self.learner_steps += steps
        if self.learner_steps >= self._next_save:
            self._save()
        if self.learner_steps >= self._next_swap:
            self._next_swap += self.config.swap_steps
            latest = self.rng.random() < self.config.play_against_latest_model_ratio
            self._load_opponent(None if latest else int(self.rng.integers(len(self.pool))))

    def state_dict(self) -> dict[str, Any]:
        """The pool, ratings, schedule, RNG and current opponent, for checkpoints."""
        return {
            "pool": self.pool,
            "pool_elo": self.pool_elo,
            "opponent": _weights(self.opponent),
            "opponent_index": self.opponent_index,
            "elo": self.elo,
            "learner_steps": self.learner_steps,
            "next_save": self._next_save,
            "next_swap": self._next_swap,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the learner's own weights are restored apart)."""
        self.pool = list(state["pool"])
        self.pool_elo = [float(x) for x in state["pool_elo"]]
        index = state["opponent_index"]
        self.opponent_index = None if index is None else int(index)
        for key, module in self.opponent.modules().items():
            module.load_state_dict(state["opponent"][key])
        self.opponent.set_progress(self.learner.progress)
        self.elo = float(state["elo"])
        self.learner_steps = int(state["learner_steps"])
        self._next_save = int(state["next_save"])
        self._next_swap = int(state["next_swap"])
        self.rng.bit_generator.state = dict(state["rng"])

    def record_game(self, learner_return: float, opponent_return: float) -> None:
        """Update both ratings from one finished game (a higher return wins)."""
        if learner_return == opponent_return:
            score = 0.5
        else:
            score = 1.0 if learner_return > opponent_return else 0.0
        change = self.config.elo_k * (score - elo_expected(self.elo, self.opponent_elo()))
        self.elo += change
        if self.opponent_index is not None:
            self.pool_elo[self.opponent_index] -= change


def _weights(algorithm: Algorithm[Any]) -> dict[str, Any]:
    return {
        key: {k: v.detach().clone() for k, v in module.state_dict().items()}
        for key, module in algorithm.modules().items()
    }


__all__ = ["SelfPlay", "SelfPlayConfig", "elo_expected"]
