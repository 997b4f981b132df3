"""Transition storage: preallocated arrays, memory estimate, ``.npz`` files without pickle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces

from rlfleet.data.storage import TransitionStorage
from rlfleet.errors import CheckpointError, ConfigError, EnvSpecError, InsufficientMemoryError

OBS = spaces.Box(-1000, 1000, (1,), np.float32)
ACTIONS = spaces.Discrete(3)


def _write(storage: TransitionStorage, row: int, value: float) -> None:
    n = storage.num_envs
    storage.write(
        row,
        np.full((n, 1), value, np.float32),
        np.full(n, int(value) % 3),
        np.full(n, value),
        np.zeros(n, bool),
        np.zeros(n, bool),
        np.ones(n, bool),
        None,
    )


def test_capacity_rounds_up_to_whole_rows_of_at_least_two() -> None:
    storage = TransitionStorage(7, OBS, ACTIONS, num_envs=3)
    assert (storage.rows, storage.capacity) == (3, 9)
    assert storage.obs["obs"].shape == (3, 3, 1)
    assert TransitionStorage(1, OBS, ACTIONS).rows == 2
    with pytest.raises(ConfigError, match="expected capacity >= 1 and num_envs >= 1"):
        TransitionStorage(0, OBS, ACTIONS)


def test_dict_observations_keep_one_array_per_key_and_their_dtype() -> None:
    space = spaces.Dict(
        {
            "image": spaces.Box(0, 255, (2, 2), np.uint8),
            "state": spaces.Dict({"pos": spaces.Box(-1, 1, (3,), np.float32)}),
        }
    )
    storage = TransitionStorage(4, space, spaces.Box(-1, 1, (2,), np.float32), num_envs=2)
    assert {key: array.dtype for key, array in storage.obs.items()} == {
        "image": np.uint8,
        "state/pos": np.float32,
    }
    storage.write(
        1,
        {"image": np.full((2, 2, 2), 7, np.uint8), "state": {"pos": np.ones((2, 3))}},
        np.zeros((2, 2)),
        np.zeros(2),
        np.zeros(2, bool),
        np.zeros(2, bool),
        np.ones(2, bool),
        None,
    )
    assert storage.obs["image"][1].min() == 7
    assert storage.obs["state/pos"][1].sum() == 6.0
    # The bytes of one transition: 4 + 12 observation bytes, 8 action, reward 4, flags 3.
    assert storage.bytes_per_slot() == 4 + 12 + 8 + 4 + 3


def test_memory_refusal_names_the_gib_needed_and_available() -> None:
    image = spaces.Box(0, 255, (84, 84, 4), np.uint8)
    with pytest.raises(InsufficientMemoryError, match=r"needs [\d.]+ GiB, but only [\d.]+ GiB"):
        TransitionStorage(10**9, image, ACTIONS)


def test_masks_and_sampler_bytes_count_in_the_memory_estimate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rlfleet.data.storage as storage

    capacity = 1000
    # Room for transitions of 19 bytes (observation 4, action 8, reward and flags 7) and 32
    # to spare, not for 64 mask entries more, nor for a sampler's 40 bytes per slot.
    monkeypatch.setattr(storage, "available_memory_bytes", lambda: capacity * (4 + 8 + 7 + 32))
    TransitionStorage(capacity, OBS, ACTIONS, extra_bytes_per_slot=32)
    with pytest.raises(InsufficientMemoryError, match="lower buffer_size to at most about 614"):
        TransitionStorage(capacity, OBS, ACTIONS, mask_size=64)
    with pytest.raises(InsufficientMemoryError, match="at most about 864"):
        TransitionStorage(capacity, OBS, ACTIONS, extra_bytes_per_slot=40)


def test_unsupported_spaces_are_refused_by_name() -> None:
    with pytest.raises(EnvSpecError, match=r"cannot store actions of space Dict"):
        TransitionStorage(8, OBS, spaces.Dict({"a": spaces.Discrete(2)}))
    with pytest.raises(EnvSpecError, match=r"cannot store observations of space Tuple"):
        TransitionStorage(8, spaces.Tuple([OBS]), ACTIONS)


def test_a_file_loads_oldest_row_first_and_holds_no_pickle(tmp_path: Path) -> None:
    storage = TransitionStorage(4, OBS, ACTIONS)
    for row, value in enumerate([4.0, 5.0, 2.0, 3.0]):  # rows 2, 3 older than 0, 1
        _write(storage, row, value)
    path = storage.save(tmp_path / "replay.npz", pos=2, rows_filled=4, rows_dropped=True)
    with np.load(path, allow_pickle=False) as data:
        assert all(data[key].dtype != object for key in data.files)
        assert int(data["pos"]) == 2
    loaded = TransitionStorage(4, OBS, ACTIONS)
    assert loaded.load(path) == (4, True)
    np.testing.assert_array_equal(loaded.obs["obs"][:, 0, 0], [2, 3, 4, 5])
    np.testing.assert_array_equal(loaded.rewards[:, 0], [2, 3, 4, 5])
    smaller = TransitionStorage(2, OBS, ACTIONS)
    assert smaller.load(path) == (2, True)
    np.testing.assert_array_equal(smaller.obs["obs"][:, 0, 0], [4, 5])


def test_a_file_from_other_envs_is_refused_before_anything_changes(tmp_path: Path) -> None:
    path = TransitionStorage(4, OBS, ACTIONS, num_envs=2).save(
        tmp_path / "two.npz", pos=0, rows_filled=0
    )
    storage = TransitionStorage(4, OBS, ACTIONS)
    _write(storage, 0, 9.0)
    with pytest.raises(CheckpointError, match="written by 2 envs, this buffer has 1"):
        storage.load(path)
    other = TransitionStorage(4, OBS, spaces.Discrete(5)).save(
        tmp_path / "other.npz", pos=0, rows_filled=0
    )
    with pytest.raises(CheckpointError, match="holds actions of space Discrete\\(5\\)"):
        storage.load(other)
    assert storage.obs["obs"][0, 0, 0] == 9.0


def test_state_arrays_are_checked_before_they_are_copied() -> None:
    storage = TransitionStorage(4, OBS, ACTIONS)
    arrays = {key: value[:1].copy() for key, value in storage.arrays().items()}
    arrays["obs/obs"] = np.zeros((1, 1, 2), np.float32)
    with pytest.raises(CheckpointError, match=r"obs/obs has shape \(1, 2\) per row"):
        storage.load_arrays(arrays, 1)
    with pytest.raises(CheckpointError, match="with at most 4 rows, got"):
        storage.load_arrays({k: v[:1] for k, v in storage.arrays().items()}, 5)
