"""When a test step runs, and how many test episodes it plays: the test cadence.

An epoch ends with a test step (Tianshou's rule) when test scores steer training: a stop
rule on them (``stop_fn``, ``target_reward`` on test episodes), a patience rule
(``early_stop_patience``, ``plateau_reduce_patience``) or a hook that sees them
(``test_fn``, ``test_result_fn``). Skipping such a test step could stop a run, or lower its
learning rate, at another step, and a decision taken on wall time would make a seeded run
unrepeatable; so those runs keep one test step per epoch.

Otherwise test steps only feed ``best/`` and the history, and the cadence adapts to what
they cost (:func:`adaptive_test_episodes`): an epoch's test step runs only if the share of the
run's wall time spent in test steps stays within ``test_time_share`` (10%) once it has run,
predicted from the cost per episode of the last test step (which grows with episode
length), with 20 episodes, or 10 when 20 would not fit. The first epoch of a session and
the last epoch of a run always end with one; a test step predicted to take under
:data:`ALWAYS_TEST_S` always runs, since it cannot slow an epoch by more than that. Those
test steps are outside the budget: a short run whose test episodes are costly can spend
more than ``test_time_share`` testing.

``test_interval_steps`` sets the cadence outright (as ``checkpoint_interval_steps`` sets
the checkpoints'), ``test_step_num_episodes`` the episode count: a value given is kept as
it is, whatever the test steps cost.

The adaptive cadence relies on test steps that never change what training computes when
their scores do not steer it: single-agent test episodes run on test envs of their own,
seeded apart from the training envs, with the greedy policy, which draws no random numbers,
and observation statistics stay frozen. A multi-agent game's test episodes may draw from a
frozen random agent's generator, which its training games use too, so multi-agent runs keep
one test step per epoch unless ``test_interval_steps`` is set
(``TrainingLoop.test_steps_independent``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_TEST_EPISODES = 20
"""Test episodes per test step when ``test_step_num_episodes`` is unset (Tianshou's
examples use as many; more than one per test env of the default ``num_test_envs``, 10)."""

ADAPTIVE_TEST_EPISODES = (DEFAULT_TEST_EPISODES, DEFAULT_TEST_EPISODES // 2)
"""The episode counts the adaptive cadence picks from, largest first: 10 is one episode on
each of the default 10 test envs, 20 two."""

ALWAYS_TEST_S = 1.0
"""Seconds under which a predicted test step always runs under the adaptive cadence."""


@dataclass(frozen=True)
class MeasuredCost:
    """What the last test step cost: its wall time and the episodes it played."""

    seconds: float
    episodes: int

    @property
    def per_episode_s(self) -> float:
        return self.seconds / max(self.episodes, 1)


def adaptive_test_episodes(
    *,
    elapsed_s: float,
    test_s: float,
    last: MeasuredCost | None,
    choices: Sequence[int],
    max_share: float,
    must: bool,
) -> int:
    """Test episodes for the test step an epoch ends with under the adaptive cadence; 0 skips
    it.

    Args:
        elapsed_s: wall time of the run so far, test steps included.
        test_s: the part of it spent in test steps.
        last: the cost of the last test step (None: none measured yet).
        choices: the episode counts allowed, largest first (one, when it is set).
        max_share: the largest share of wall time test steps may take.
        must: the epoch is a session's first or a run's last, which always ends with a test.

    Picks the largest count whose predicted cost ``n * last.per_episode_s`` keeps
    ``(test_s + cost) / (elapsed_s + cost)`` within ``max_share``, or runs under
    :data:`ALWAYS_TEST_S`. When none fits, the smallest count if ``must``, else 0. With
    nothing measured yet, the smallest count: the cheapest way to learn the cost.
    """
    if not choices:
        raise ValueError("choices must name at least one episode count")
    smallest = choices[-1]
    if last is None:
        return smallest
    for episodes in choices:
        cost = episodes * last.per_episode_s
        if cost < ALWAYS_TEST_S or test_s + cost <= max_share * (elapsed_s + cost):
            return episodes
    return smallest if must else 0


def interval_reached(env_step: int, last_test_step: int, interval: int) -> bool:
    """``test_interval_steps``: whether an epoch ending at ``env_step`` is due a test step,
    the last one having run at ``last_test_step`` (whole epochs: the first epoch end at or past
    the interval)."""
    return env_step - last_test_step >= interval
