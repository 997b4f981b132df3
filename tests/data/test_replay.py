"""Replay buffer: circular storage, next observations, n-step returns, samplers, persistence."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.data.replay import ReplayBuffer
from rlfleet.data.samplers import PrioritizedSampler, UniformSampler
from rlfleet.errors import (
    CheckpointError,
    ConfigError,
)

OBS = spaces.Box(-1000, 1000, (1,), np.float32)
ACTIONS = spaces.Discrete(3)


def _fill(buffer: ReplayBuffer, steps: list[tuple[float, float, bool, bool, bool]]) -> None:
    """Write single-env steps ``(obs, reward, terminated, truncated, valid)``."""
    for obs, reward, terminated, truncated, valid in steps:
        buffer.add(
            np.array([[obs]], np.float32),
            np.array([int(obs) % 3]),
            np.array([reward]),
            np.array([terminated]),
            np.array([truncated]),
            np.array([valid]),
        )


def _sample_all(
    buffer: ReplayBuffer, n_step: int = 1, gamma: float = 0.5, draws: int = 512
) -> dict[float, tuple[float, float, float]]:
    """obs -> (reward, discount, next obs) of every transition a large batch hits."""
    batch = buffer.sample(draws, gamma=gamma, n_step=n_step)
    found: dict[float, tuple[float, float, float]] = {}
    for i in range(draws):
        found[float(batch.obs[i, 0])] = (
            float(batch.rewards[i]),
            float(batch.discounts[i]),
            float(batch.next_obs[i, 0]),
        )
    return found


def test_next_observation_is_the_following_row_and_reset_rows_are_never_sampled() -> None:
    buffer = ReplayBuffer(100, OBS, ACTIONS)
    # Episode 0, 1, 2 (terminated at 2); next-step autoreset: row 3 holds the final obs 3
    # with its ignored action (invalid); then a new episode 10, 11, ...
    _fill(
        buffer,
        [
            (0, 1, False, False, True),
            (1, 1, False, False, True),
            (2, 5, True, False, True),
            (3, 0, False, False, False),
            (10, 1, False, False, True),
            (11, 1, False, False, True),
            (12, 1, False, False, True),
        ],
    )
    assert len(buffer) == 5  # 0, 1, 2, 10, 11; 3 is a reset row, 12 has no next obs yet
    found = _sample_all(buffer)
    assert found == {
        0.0: (1.0, 0.5, 1.0),
        1.0: (1.0, 0.5, 2.0),
        2.0: (5.0, 0.0, 3.0),  # terminated: no bootstrap; next obs is the true final obs
        10.0: (1.0, 0.5, 11.0),
        11.0: (1.0, 0.5, 12.0),
    }


def test_wrap_around_overwrites_the_oldest_rows() -> None:
    buffer = ReplayBuffer(4, OBS, ACTIONS)
    _fill(buffer, [(float(i), float(i), False, False, True) for i in range(7)])
    assert buffer.rows_filled == 4
    assert buffer.pos == 3
    np.testing.assert_array_equal(buffer.obs["obs"][:, 0, 0], [4, 5, 6, 3])
    assert len(buffer) == 3
    found = _sample_all(buffer)
    assert found == {3.0: (3.0, 0.5, 4.0), 4.0: (4.0, 0.5, 5.0), 5.0: (5.0, 0.5, 6.0)}


def test_n_step_returns_stop_at_episode_ends_and_the_newest_row() -> None:
    gamma = 0.5
    buffer = ReplayBuffer(100, OBS, ACTIONS)
    _fill(
        buffer,
        [
            (0, 1, False, False, True),
            (1, 2, False, False, True),
            (2, 4, True, False, True),  # terminated
            (3, 0, False, False, False),  # reset row: final obs of the episode above
            (10, 1, False, False, True),
            (11, 2, False, True, True),  # truncated by a time limit
            (12, 0, False, False, False),  # reset row: final obs 12
            (20, 1, False, False, True),
            (21, 1, False, False, True),
            (22, 1, False, False, True),  # newest row: no next obs yet
        ],
    )
    found = _sample_all(buffer, n_step=3, gamma=gamma, draws=1024)
    # By hand (gamma 0.5):
    # 0: 1 + .5*2 + .25*4 = 3, terminated at step 3: discount 0, next obs 3
    # 1: 2 + .5*4 = 4, terminated: discount 0, next obs 3
    # 2: 4, terminated: 0
    # 10: 1 + .5*2 = 2, truncated after 2 steps: discount .25, bootstrap from final obs 12
    # 11: 2, truncated: discount .5, next obs 12
    # 20: 1 + .5 = 1.5; the window stops at the newest row: discount .25, next obs 22
    # 21: 1, discount .5, next obs 22
    assert found == {
        0.0: (3.0, 0.0, 3.0),
        1.0: (4.0, 0.0, 3.0),
        2.0: (4.0, 0.0, 3.0),
        10.0: (2.0, 0.25, 12.0),
        11.0: (2.0, 0.5, 12.0),
        20.0: (1.5, 0.25, 22.0),
        21.0: (1.0, 0.5, 22.0),
    }


def test_several_envs_keep_separate_streams() -> None:
    buffer = ReplayBuffer(10, OBS, ACTIONS, num_envs=2)
    for t in range(4):
        buffer.add(
            np.array([[t], [100 + t]], np.float32),
            np.array([0, 1]),
            np.array([t, 100 + t], np.float32),
            np.zeros(2, bool),
            np.zeros(2, bool),
            np.ones(2, bool),
        )
    found = _sample_all(buffer)
    assert found == {
        **{float(t): (float(t), 0.5, float(t + 1)) for t in range(3)},
        **{float(100 + t): (float(100 + t), 0.5, float(101 + t)) for t in range(3)},
    }


def test_stream_break_drops_the_transition_without_a_next_observation() -> None:
    buffer = ReplayBuffer(10, OBS, ACTIONS)
    _fill(buffer, [(0, 1, False, False, True), (1, 1, False, False, True)])
    buffer.mark_stream_break()  # e.g. resumed: the envs were reset
    _fill(buffer, [(50, 1, False, False, True), (51, 1, False, False, True)])
    assert set(_sample_all(buffer)) == {0.0, 50.0}


def test_dict_and_uint8_image_observations_are_stored_once() -> None:
    space = spaces.Dict(
        {
            "image": spaces.Box(0, 255, (4, 4, 3), np.uint8),
            "state": spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32)}),
        }
    )
    buffer = ReplayBuffer(8, space, spaces.Box(-1, 1, (2,), np.float32))
    assert buffer.obs["image"].dtype == np.uint8
    assert set(buffer.obs) == {"image", "state/pos"}
    for t in range(3):
        buffer.add(
            {
                "image": np.full((1, 4, 4, 3), t, np.uint8),
                "state": {"pos": np.full((1, 2), t / 10, np.float32)},
            },
            np.full((1, 2), t / 10, np.float32),
            np.ones(1),
            np.zeros(1, bool),
            np.zeros(1, bool),
            np.ones(1, bool),
        )
    batch = buffer.sample(16, gamma=0.9)
    assert batch.obs["image"].dtype == torch.uint8
    assert batch.obs["image"].shape == (16, 4, 4, 3)
    torch.testing.assert_close(
        batch.next_obs["image"][:, 0, 0, 0], batch.obs["image"][:, 0, 0, 0] + 1
    )
    torch.testing.assert_close(batch.actions[:, 0], batch.obs["state/pos"][:, 0])


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    buffer = ReplayBuffer(6, OBS, ACTIONS, sampler=UniformSampler(seed=3))
    _fill(buffer, [(float(i), i, i % 4 == 3, False, i % 4 != 0) for i in range(9)])
    path = buffer.save(tmp_path / "replay.npz")
    loaded = ReplayBuffer(6, OBS, ACTIONS, sampler=UniformSampler(seed=3))
    loaded.load(path)
    assert len(loaded) == len(buffer)
    # Loading stores rows oldest first; the transitions are the same.
    assert _sample_all(loaded) == _sample_all(buffer)
    with np.load(path, allow_pickle=False) as data:
        assert "observation_space" in data.files


def test_load_into_a_smaller_buffer_keeps_the_newest(tmp_path: Path) -> None:
    big = ReplayBuffer(20, OBS, ACTIONS)
    _fill(big, [(float(i), 0, False, False, True) for i in range(10)])
    small = ReplayBuffer(4, OBS, ACTIONS)
    small.load(big.save(tmp_path / "replay.npz"))
    np.testing.assert_array_equal(small.obs["obs"][:, 0, 0], [6, 7, 8, 9])
    assert set(_sample_all(small)) == {6.0, 7.0, 8.0}


def test_a_buffer_knows_whether_it_dropped_older_rows(tmp_path: Path) -> None:
    buffer = ReplayBuffer(4, OBS, ACTIONS)
    _fill(buffer, [(float(i), 0, False, False, True) for i in range(4)])
    assert not buffer.rows_dropped  # full, nothing overwritten yet
    _fill(buffer, [(4.0, 0, False, False, True)])
    assert buffer.rows_dropped
    # The flag travels with the rows: through a file, a state dict, and a smaller buffer.
    path = buffer.save(tmp_path / "wrapped.npz")
    loaded = ReplayBuffer(4, OBS, ACTIONS)
    loaded.load(path)
    assert loaded.rows_dropped
    restored = ReplayBuffer(4, OBS, ACTIONS)
    restored.load_state_dict(buffer.state_dict())
    assert restored.rows_dropped
    whole = ReplayBuffer(8, OBS, ACTIONS)
    _fill(whole, [(float(i), 0, False, False, True) for i in range(5)])
    fits = ReplayBuffer(8, OBS, ACTIONS)
    fits.load(whole.save(tmp_path / "whole.npz"))
    assert not fits.rows_dropped
    smaller = ReplayBuffer(4, OBS, ACTIONS)
    smaller.load(tmp_path / "whole.npz")
    assert smaller.rows_dropped  # its oldest row was left out
    loaded.clear()
    assert not loaded.rows_dropped


def test_a_file_saved_without_the_dropped_flag_tells_it_by_its_write_position(
    tmp_path: Path,
) -> None:
    buffer = ReplayBuffer(4, OBS, ACTIONS)
    _fill(buffer, [(float(i), 0, False, False, True) for i in range(6)])  # pos 2 of 4 rows
    path = buffer.save(tmp_path / "replay.npz")
    with np.load(path, allow_pickle=False) as data:
        older = {key: data[key] for key in data.files if key != "rows_dropped"}
    np.savez(tmp_path / "older.npz", **older)
    loaded = ReplayBuffer(4, OBS, ACTIONS)
    loaded.load(tmp_path / "older.npz")
    assert loaded.rows_dropped
    state = buffer.state_dict()
    del state["rows_dropped"]
    restored = ReplayBuffer(4, OBS, ACTIONS)
    restored.load_state_dict(state)
    assert restored.rows_dropped


def test_load_refuses_a_file_from_another_observation_space(tmp_path: Path) -> None:
    other = ReplayBuffer(6, spaces.Box(-1, 1, (3,), np.float32), ACTIONS)
    path = other.save(tmp_path / "replay.npz")
    buffer = ReplayBuffer(6, OBS, ACTIONS)
    _fill(buffer, [(1.0, 0, False, False, True)])
    with pytest.raises(
        CheckpointError, match=r"Box\(shape=\(3,\).*this buffer stores Box\(shape=\(1,\)"
    ):
        buffer.load(path)
    assert buffer.obs["obs"][0, 0, 0] == 1.0  # nothing lost


def test_load_refuses_garbage(tmp_path: Path) -> None:
    path = tmp_path / "replay.npz"
    path.write_bytes(b"not an npz file")
    with pytest.raises(CheckpointError, match="not a readable replay buffer file"):
        ReplayBuffer(6, OBS, ACTIONS).load(path)


def test_state_dict_round_trip_continues_sampling_identically() -> None:
    def make() -> ReplayBuffer:
        return ReplayBuffer(16, OBS, ACTIONS, sampler=PrioritizedSampler(seed=5))

    buffer = make()
    _fill(buffer, [(float(i), i, False, False, True) for i in range(20)])
    buffer.update_priorities(np.arange(4), np.arange(4.0))
    restored = make()
    restored.load_state_dict(buffer.state_dict())
    a, b = buffer.sample(32, gamma=0.9), restored.sample(32, gamma=0.9)
    np.testing.assert_array_equal(a.indices, b.indices)
    torch.testing.assert_close(a.weights, b.weights)


@pytest.mark.parametrize("sampler", [UniformSampler, PrioritizedSampler])
def test_clear_forgets_every_transition(sampler: type[UniformSampler | PrioritizedSampler]) -> None:
    buffer = ReplayBuffer(4, OBS, ACTIONS, sampler=sampler())
    _fill(buffer, [(float(i), float(i), False, False, True) for i in range(7)])
    buffer.clear()
    assert len(buffer) == 0
    assert buffer.rows_filled == buffer.pos == 0
    with pytest.raises(ConfigError, match="no complete transition"):
        buffer.sample(2, gamma=0.5)
    _fill(buffer, [(20.0, 1.0, False, False, True), (21.0, 1.0, False, False, True)])
    assert len(buffer) == 1
    assert _sample_all(buffer) == {20.0: (1.0, 0.5, 21.0)}


def test_sampling_an_empty_buffer_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="no complete transition"):
        ReplayBuffer(8, OBS, ACTIONS).sample(4, gamma=0.9)


# ------------------------------------------------------------------------- action masks
MASK_SIZE = 3


def _mask_of(obs: float) -> np.ndarray:
    """A mask that tells observations apart: bits of ``(obs + 5) % 8`` (obs 3: all false)."""
    value = (int(obs) + 5) % 8
    return np.array([(value >> bit) & 1 for bit in range(MASK_SIZE)], bool)


def _fill_masked(
    buffer: ReplayBuffer, steps: list[tuple[float, float, bool, bool, bool]], num_envs: int = 1
) -> None:
    """Like ``_fill``; env ``e`` sees ``obs + 100 e``; each row's mask is ``_mask_of(obs)``."""
    offsets = 100.0 * np.arange(num_envs)
    for obs, reward, terminated, truncated, valid in steps:
        values = obs + offsets
        buffer.add(
            values[:, None].astype(np.float32),
            np.zeros(num_envs, np.int64),
            np.full(num_envs, reward, np.float32),
            np.full(num_envs, terminated),
            np.full(num_envs, truncated),
            np.full(num_envs, valid),
            np.stack([_mask_of(v) for v in values]),
        )


def _sample_masks(
    buffer: ReplayBuffer, n_step: int = 1, draws: int = 1024
) -> dict[float, tuple[float, tuple[bool, ...], tuple[bool, ...]]]:
    """obs -> (next obs, mask, next mask) of every transition a large batch hits."""
    batch = buffer.sample(draws, gamma=0.5, n_step=n_step)
    assert batch.action_masks is not None
    assert batch.next_action_masks is not None
    assert batch.action_masks.dtype == torch.bool
    return {
        float(batch.obs[i, 0]): (
            float(batch.next_obs[i, 0]),
            tuple(batch.action_masks[i].tolist()),
            tuple(batch.next_action_masks[i].tolist()),
        )
        for i in range(draws)
    }


def _check_masks_name_their_rows(
    found: dict[float, tuple[float, tuple[bool, ...], tuple[bool, ...]]],
) -> None:
    for obs, (next_obs, mask, next_mask) in found.items():
        assert mask == tuple(_mask_of(obs)), obs
        assert next_mask == tuple(_mask_of(next_obs)), obs


EPISODES = [
    (0, 1, False, False, True),
    (1, 1, False, False, True),
    (2, 1, True, False, True),  # terminated
    (3, 0, False, False, False),  # reset row: final obs 3, whose mask has no legal action
    (10, 1, False, False, True),
    (11, 1, False, True, True),  # truncated: bootstraps over the final obs's legal actions
    (12, 0, False, False, False),  # reset row: final obs 12
    (20, 1, False, False, True),
    (21, 1, False, False, True),
    (22, 1, False, False, True),  # newest row
]


def test_batches_carry_the_mask_of_the_state_they_bootstrap_from() -> None:
    buffer = ReplayBuffer(100, OBS, ACTIONS, num_envs=2, mask_size=MASK_SIZE)
    assert buffer.action_masks is not None
    assert buffer.action_masks.shape == (50, 2, MASK_SIZE)
    _fill_masked(buffer, EPISODES, num_envs=2)
    found = _sample_masks(buffer)
    assert {obs: v[0] for obs, v in found.items() if obs < 100} == {
        0.0: 1.0,
        1.0: 2.0,
        2.0: 3.0,
        10.0: 11.0,
        11.0: 12.0,
        20.0: 21.0,
        21.0: 22.0,
    }
    assert len(found) == 14  # both envs, each with its own masks
    _check_masks_name_their_rows(found)
    assert found[2.0][2] == (False, False, False)  # terminal: its discount is 0
    assert found[11.0][2] == tuple(_mask_of(12))  # truncated: the final obs's own mask


def test_n_step_batches_carry_the_mask_n_steps_on() -> None:
    buffer = ReplayBuffer(100, OBS, ACTIONS, mask_size=MASK_SIZE)
    _fill_masked(buffer, EPISODES)
    found = _sample_masks(buffer, n_step=3)
    # Next observations as in test_n_step_returns_stop_at_episode_ends_and_the_newest_row.
    assert {obs: v[0] for obs, v in found.items()} == {
        0.0: 3.0,
        1.0: 3.0,
        2.0: 3.0,
        10.0: 12.0,
        11.0: 12.0,
        20.0: 22.0,
        21.0: 22.0,
    }
    _check_masks_name_their_rows(found)
    # Three steps on, not one: the masks of obs 1 and 22 differ.
    assert found[20.0][2] == tuple(_mask_of(22)) != tuple(_mask_of(21))


def test_masks_wrap_around_with_their_rows() -> None:
    buffer = ReplayBuffer(8, OBS, ACTIONS, num_envs=2, mask_size=MASK_SIZE)  # 4 rows
    _fill_masked(buffer, [(float(i), 0, False, False, True) for i in range(11)], num_envs=2)
    assert buffer.pos == 3
    found = _sample_masks(buffer)
    assert {obs: v[0] for obs, v in found.items()} == {
        **{float(t): float(t + 1) for t in (7, 8, 9)},
        **{float(100 + t): float(101 + t) for t in (7, 8, 9)},
    }
    _check_masks_name_their_rows(found)
    found = _sample_masks(buffer, n_step=2)
    assert {obs: v[0] for obs, v in found.items() if obs < 100} == {7.0: 9.0, 8.0: 10.0, 9.0: 10.0}
    _check_masks_name_their_rows(found)


def test_a_buffer_without_masks_keeps_and_returns_none() -> None:
    buffer = ReplayBuffer(10, OBS, ACTIONS)
    _fill(buffer, [(0, 1, False, False, True), (1, 1, False, False, True)])
    batch = buffer.sample(4, gamma=0.5)
    assert buffer.mask_size is None
    assert buffer.action_masks is None
    assert batch.action_masks is None
    assert batch.next_action_masks is None
    assert "action_masks" not in buffer.state_dict()["arrays"]


def test_masks_in_a_dict_observation_are_read_from_it() -> None:
    space = spaces.Dict({"state": OBS, "action_mask": spaces.MultiBinary(MASK_SIZE)})
    buffer = ReplayBuffer(16, space, ACTIONS)
    assert buffer.mask_size == MASK_SIZE
    assert buffer.action_masks is None  # stored once, with the observations
    for obs in range(5):
        buffer.add(
            {
                "state": np.array([[obs]], np.float32),
                "action_mask": _mask_of(obs).astype(np.int8)[None],
            },
            np.zeros(1, np.int64),
            np.ones(1, np.float32),
            np.zeros(1, bool),
            np.zeros(1, bool),
            np.ones(1, bool),
        )
    batch = buffer.sample(64, gamma=0.5, n_step=2)
    assert batch.action_masks is not None
    assert batch.next_action_masks is not None
    assert batch.next_action_masks.dtype == torch.bool
    for i in range(64):
        obs, next_obs = float(batch.obs["state"][i, 0]), float(batch.next_obs["state"][i, 0])
        assert next_obs == min(obs + 2, 4)
        assert batch.action_masks[i].tolist() == _mask_of(obs).tolist()
        assert batch.next_action_masks[i].tolist() == _mask_of(next_obs).tolist()
    with pytest.raises(ConfigError, match="differs from the 3 entries of the observation's"):
        ReplayBuffer(16, space, ACTIONS, mask_size=4)


def test_adding_without_the_mask_the_buffer_keeps_is_refused() -> None:
    masked = ReplayBuffer(8, OBS, ACTIONS, mask_size=MASK_SIZE)
    with pytest.raises(ConfigError, match="add\\(\\) needs the action_mask of every row"):
        _fill(masked, [(0, 1, False, False, True)])
    with pytest.raises(ConfigError, match="got an action_mask, but it stores masks in nothing"):
        _fill_masked(ReplayBuffer(8, OBS, ACTIONS), [(0, 1, False, False, True)])


def test_masks_survive_save_load_and_state_dict(tmp_path: Path) -> None:
    def make(capacity: int = 12) -> ReplayBuffer:
        return ReplayBuffer(capacity, OBS, ACTIONS, num_envs=2, mask_size=MASK_SIZE)

    buffer = make()
    _fill_masked(buffer, EPISODES, num_envs=2)  # 10 rows into 6: wrapped
    expected = _sample_masks(buffer)
    _check_masks_name_their_rows(expected)
    path = buffer.save(tmp_path / "replay.npz")
    with np.load(path, allow_pickle=False) as data:
        assert data["action_masks"].dtype == bool
    loaded = make()
    loaded.load(path)
    assert _sample_masks(loaded) == expected
    smaller = make(8)
    smaller.load(path)  # the newest rows only
    found = _sample_masks(smaller)
    assert set(found) < set(expected)
    _check_masks_name_their_rows(found)
    restored = make()
    restored.load_state_dict(buffer.state_dict())
    assert restored.action_masks is not None
    assert buffer.action_masks is not None
    np.testing.assert_array_equal(restored.action_masks, buffer.action_masks)


def test_a_saved_buffer_without_masks_is_refused_by_a_masked_one(tmp_path: Path) -> None:
    plain = ReplayBuffer(8, OBS, ACTIONS)
    _fill(plain, [(float(i), 0, False, False, True) for i in range(3)])
    masked = ReplayBuffer(8, OBS, ACTIONS, mask_size=MASK_SIZE)
    path = plain.save(tmp_path / "plain.npz")
    with pytest.raises(
        CheckpointError, match=r"plain\.npz: replay buffer file holds no action masks"
    ):
        masked.load(path)
    with pytest.raises(CheckpointError, match="replay buffer state holds no action masks"):
        masked.load_state_dict(plain.state_dict())
    assert masked.rows_filled == 0  # nothing replaced
    _fill_masked(masked, [(float(i), 0, False, False, True) for i in range(3)])
    with pytest.raises(CheckpointError, match="holds action masks, but this buffer stores none"):
        plain.load(masked.save(tmp_path / "masked.npz"))
    with pytest.raises(CheckpointError, match="holds action masks, but this buffer stores none"):
        plain.load_state_dict(masked.state_dict())


def test_a_buffer_that_cannot_be_saved_is_a_checkpoint_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffer = ReplayBuffer(6, OBS, ACTIONS)
    _fill(buffer, [(float(i), i, False, False, True) for i in range(4)])
    path = buffer.save(tmp_path / "replay.npz")
    before = path.read_bytes()

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", no_space)
    with pytest.raises(
        CheckpointError, match=r"replay\.npz: cannot write \(No space left on device; .* free on"
    ):
        buffer.save(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay.npz"]
