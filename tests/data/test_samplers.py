"""Samplers: uniform rejection of incomplete slots, the prioritized sum-tree, n-step targets."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from rlfleet.data.replay import ReplayBuffer
from rlfleet.data.samplers import PrioritizedSampler, UniformSampler, n_step_targets
from rlfleet.data.storage import TransitionStorage
from rlfleet.errors import ConfigError

OBS = spaces.Box(-1000, 1000, (1,), np.float32)
ACTIONS = spaces.Discrete(3)


def _fill(buffer: ReplayBuffer, count: int) -> None:
    """Single-env steps with observations 0, 1, ..., every one valid, no episode end."""
    for i in range(count):
        buffer.add(
            np.array([[float(i)]], np.float32),
            np.array([0]),
            np.array([0.0]),
            np.array([False]),
            np.array([False]),
            np.array([True]),
        )


class _Slots:
    """A buffer stand-in: ``rows_filled`` rows of ``num_envs`` slots, ``ok`` the sampleable ones."""

    def __init__(self, ok: np.ndarray, num_envs: int = 1) -> None:
        self.ok = ok
        self.num_envs = num_envs
        self.rows_filled = ok.size // num_envs

    def __len__(self) -> int:
        return int(self.ok.sum())

    def sampleable(self, slots: np.ndarray) -> np.ndarray:
        found: np.ndarray = self.ok[slots]
        return found


def test_uniform_sampler_draws_only_sampleable_slots_and_each_of_them() -> None:
    ok = np.array([True, False, True, True, False, True])
    sampler = UniformSampler(seed=0)
    slots, weights = sampler.sample(_Slots(ok), 6000, 0.0)
    assert weights is None
    counts = np.bincount(slots, minlength=6)
    assert counts[~ok].sum() == 0
    assert counts[ok].min() > 1300  # about 1500 each


def test_uniform_sampler_state_round_trip_repeats_the_draws() -> None:
    source = _Slots(np.ones(50, bool))
    first = UniformSampler(seed=7)
    first.sample(source, 10, 0.0)
    second = UniformSampler(seed=99)
    second.load_state_dict(first.state_dict())
    np.testing.assert_array_equal(
        first.sample(source, 20, 0.0)[0], second.sample(source, 20, 0.0)[0]
    )


def test_sum_tree_finds_the_leaf_of_every_prefix_sum() -> None:
    sampler = PrioritizedSampler(alpha=1.0, eps=0.0)
    sampler.attach(5)  # 8 leaves
    assert sampler.size == 8
    priorities = np.array([1.0, 0.0, 2.0, 3.0, 0.5])
    sampler.update_priorities(np.arange(5), priorities)
    assert sampler.total() == pytest.approx(6.5)
    edges = np.cumsum(priorities)
    values = np.array([0.5, 1.5, 2.9, 3.1, 5.9, 6.2])
    np.testing.assert_array_equal(sampler._find(values), np.searchsorted(edges, values))


def test_prioritized_sampler_clears_and_readies_slots_at_the_highest_priority() -> None:
    sampler = PrioritizedSampler(alpha=0.5, eps=0.0)
    sampler.attach(4)
    sampler.on_write(np.array([], np.int64), np.array([0, 1, 2]))
    np.testing.assert_allclose(sampler.priorities(np.arange(3)), 1.0)
    sampler.update_priorities(np.array([1]), np.array([9.0]))
    sampler.on_write(np.array([0]), np.array([3]))
    np.testing.assert_allclose(sampler.priorities(np.arange(4)), [0.0, 3.0, 1.0, 3.0])
    assert sampler.total() == pytest.approx(7.0)
    sampler.reset(np.array([True, False, True, False]))
    np.testing.assert_allclose(sampler.priorities(np.arange(4)), [3.0, 0.0, 3.0, 0.0])


def test_prioritized_sampler_state_round_trip_restores_tree_and_rng() -> None:
    source = _Slots(np.ones(8, bool))
    first = PrioritizedSampler(seed=3)
    first.attach(8)
    first.on_write(np.array([], np.int64), np.arange(8))
    first.update_priorities(np.arange(8), np.arange(8.0))
    second = PrioritizedSampler(seed=4)
    second.attach(8)
    second.load_state_dict(first.state_dict())
    a, b = first.sample(source, 16, 0.3), second.sample(source, 16, 0.3)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_prioritized_sampler_refuses_bad_exponents() -> None:
    with pytest.raises(ConfigError, match="expected alpha >= 0 and beta in \\[0, 1\\]"):
        PrioritizedSampler(alpha=-1.0)
    with pytest.raises(ConfigError, match=r"beta=1\.5"):
        PrioritizedSampler(beta=1.5)


def test_n_step_targets_stop_at_episode_ends_and_before_the_newest_row() -> None:
    storage = TransitionStorage(8, OBS, ACTIONS)
    rewards = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    terminated = [False, False, True, False, False, False]
    for row, (reward, done) in enumerate(zip(rewards, terminated, strict=True)):
        storage.write(
            row,
            np.array([[float(row)]], np.float32),
            np.array([0]),
            np.array([reward]),
            np.array([done]),
            np.array([False]),
            np.array([row != 3]),  # row 3: the reset row after the terminal step
            None,
        )
    returns, discounts = np.zeros(3, np.float32), np.zeros(3, np.float32)
    slots = np.array([0, 1, 4])
    next_rows = n_step_targets(
        storage, 5, slots, 0.5, 3, out_returns=returns, out_discounts=discounts
    )
    # Slot 0: 1 + 0.5 * 2 + 0.25 * 4, terminated at row 2: no bootstrap.
    # Slot 1: 2 + 0.5 * 4, terminated. Slot 4: one step, then the newest row 5, whose
    # next observation is not written yet: bootstrap from row 5 with gamma^1.
    np.testing.assert_allclose(returns, [3.0, 4.0, 16.0])
    np.testing.assert_allclose(discounts, [0.0, 0.0, 0.5])
    np.testing.assert_array_equal(next_rows, [3, 3, 5])


def test_prioritized_sampling_follows_priorities() -> None:
    sampler = PrioritizedSampler(alpha=1.0, beta=0.5, seed=0)
    buffer = ReplayBuffer(8, OBS, ACTIONS, sampler=sampler)
    _fill(buffer, 5)  # 4 transitions
    priorities = np.array([1.0, 2.0, 3.0, 4.0])
    buffer.update_priorities(np.arange(4), priorities - sampler.eps)
    assert sampler.total() == pytest.approx(10.0)
    draws = 40_000
    counts = np.zeros(4)
    for _ in range(draws // 100):
        batch = buffer.sample(100, gamma=0.9)
        counts += np.bincount(batch.indices, minlength=4)
    expected = priorities / priorities.sum()
    # Chi-square with 3 degrees of freedom: 16.3 is the 0.1% critical value.
    chi2 = float((((counts - draws * expected) ** 2) / (draws * expected)).sum())
    assert chi2 < 16.3, (counts / draws, expected)
    # Importance weights (N * P)^-beta, normalised by the largest in the batch.
    batch = buffer.sample(100, gamma=0.9)
    raw = (4 * expected[batch.indices]) ** -0.5
    np.testing.assert_allclose(batch.weights.numpy(), raw / raw.max(), rtol=1e-5)


def test_prioritized_new_transitions_get_the_highest_priority_and_beta_anneals() -> None:
    sampler = PrioritizedSampler(alpha=0.5, beta=0.4, seed=1)
    buffer = ReplayBuffer(8, OBS, ACTIONS, sampler=sampler)
    _fill(buffer, 3)
    buffer.update_priorities(np.array([0, 1]), np.array([8.0, 1.0]))
    _fill(buffer, 1)  # slot 2 becomes sampleable
    np.testing.assert_allclose(sampler.priorities(np.array([2])), [8.0**0.5], rtol=1e-5)
    # At the end of training beta is 1: weights are exactly 1 / (N P) normalised.
    batch = buffer.sample(64, gamma=0.9, progress=1.0)
    probs = sampler.priorities(batch.indices) / sampler.total()
    raw = 1.0 / (3 * probs)
    np.testing.assert_allclose(batch.weights.numpy(), raw / raw.max(), rtol=1e-5)
