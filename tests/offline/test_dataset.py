"""The offline dataset format: round trip, sources, statistics and refused input."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
from gymnasium import spaces

from rlfleet.collect.collector import Collector
from rlfleet.data.dataset import COLUMNS, DATA_FILE, METADATA_FILE, OfflineDataset
from rlfleet.data.replay import ReplayBuffer
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import DatasetError, MissingDependencyError, RunDirError
from tests.offline.helpers import random_dataset

BOX = spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = spaces.Discrete(2)


def _arrays(n: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (n + 1, 3)).astype(np.float32)
    terminations = np.zeros(n, bool)
    terminations[2] = True
    return {
        "observations": obs[:-1],
        "actions": rng.integers(0, 2, n),
        "rewards": np.ones(n, np.float32),
        "terminations": terminations,
        "truncations": np.zeros(n, bool),
        "next_observations": obs[1:],
    }


def _dataset(**changes: np.ndarray) -> OfflineDataset:
    return OfflineDataset(
        **{**_arrays(), **changes},
        observation_space=BOX,
        action_space=ACTIONS,
        env_id="Toy-v0",
        source={"kind": "arrays"},
    )


def test_round_trip_keeps_every_column_and_the_metadata(tmp_path: Path) -> None:
    dataset = random_dataset("Pendulum-v1", 900)
    path = dataset.save(tmp_path / "data")
    loaded = OfflineDataset.load(path)
    for name in COLUMNS:
        np.testing.assert_array_equal(getattr(loaded, name), getattr(dataset, name))
    assert loaded.env_id == "Pendulum-v1"
    assert loaded.source["kind"] == "collect"
    meta = json.loads((path / METADATA_FILE).read_text())
    assert meta["num_transitions"] == 900
    # 4 envs of 225 steps each: one whole 200-step episode and one cut one per env.
    assert len(loaded.episode_returns()) == 8
    assert (meta["num_episodes"], meta["num_cut_episodes"]) == (4, 4)
    with np.load(path / DATA_FILE, allow_pickle=False) as data:
        assert set(data.files) == set(COLUMNS)


def test_recording_ends_every_episode_and_keeps_exact_counts() -> None:
    dataset = random_dataset("CartPole-v1", 1001)
    assert len(dataset) == 1001
    ends = dataset.episode_ends()
    assert ends[-1] == len(dataset) - 1
    # Within an episode each next observation is the following row's observation.
    inside = np.setdiff1d(np.arange(len(dataset) - 1), ends)
    np.testing.assert_array_equal(
        dataset.next_observations[inside], dataset.observations[inside + 1]
    )
    stats = dataset.stats()
    assert stats.num_transitions == 1001
    assert stats.return_min <= stats.return_median <= stats.return_max
    assert np.isclose(dataset.episode_returns().sum(), dataset.rewards.sum())


def test_replay_buffer_view_samples_the_dataset_transitions() -> None:
    dataset = _dataset()
    buffer = dataset.to_replay_buffer(seed=0)
    assert len(buffer) == len(dataset)
    batch = buffer.sample(512, gamma=0.9)
    obs = batch.obs.numpy()
    rows = [int(np.flatnonzero((dataset.observations == o).all(1))[0]) for o in obs]
    np.testing.assert_array_equal(batch.next_obs.numpy(), dataset.next_observations[rows])
    np.testing.assert_array_equal(batch.actions.numpy(), dataset.actions[rows])
    # Terminated transitions do not bootstrap; the cut last one does.
    expected = np.where(dataset.terminations[rows], 0.0, 0.9)
    np.testing.assert_allclose(batch.discounts.numpy(), expected)
    assert set(rows) == set(range(len(dataset)))


def test_dataset_from_a_saved_replay_buffer(tmp_path: Path) -> None:
    envs = make_vec_env("CartPole-v1", 2, mode="sync")
    buffer = ReplayBuffer(600, envs.single_observation_space, envs.single_action_space, 2)
    from rlfleet.algos.bc import BC

    collector = Collector(envs, BC(envs.single_observation_space, envs.single_action_space), 0)
    collector.collect_transitions(buffer, 250, random_actions=True)
    envs.close()
    buffer.save(tmp_path / "buffer.npz")
    dataset = OfflineDataset.from_replay_buffer(tmp_path / "buffer.npz", "CartPole-v1")
    assert len(dataset) == len(buffer)
    assert dataset.source["kind"] == "replay_buffer"
    assert dataset.terminations.sum() == buffer.terminated[: buffer.rows_filled - 1].sum()
    inside = np.setdiff1d(np.arange(len(dataset) - 1), dataset.episode_ends())
    np.testing.assert_array_equal(
        dataset.next_observations[inside], dataset.observations[inside + 1]
    )
    assert dataset.to_replay_buffer().sample(64, gamma=0.99).obs.shape == (64, 4)
    # Each env's stream ends with the buffer: an episode still running there was cut short.
    stream_ends = np.cumsum(buffer.valid[: buffer.rows_filled - 1].sum(0)) - 1
    cut = [row for row in stream_ends if not dataset.terminations[row]]
    assert dataset.source["cut_episode_ends"] == cut
    stats = dataset.stats()
    assert stats.num_cut_episodes == len(cut)
    assert stats.num_episodes + stats.num_cut_episodes == len(dataset.episode_ends())


def _episode_rows(start: float, steps: int) -> list[tuple[float, bool, bool]]:
    """One env's rows for an episode of ``steps`` steps, terminated, then its reset row:
    ``(obs, terminated, valid)``, reward 1 per step."""
    rows = [(start + i, i == steps - 1, True) for i in range(steps)]
    return [*rows, (start + steps, False, False)]


@pytest.mark.parametrize(
    ("rows_written", "whole", "cut"),
    [
        # Rows 3-12 of 13 kept: episode 0's last step (its start overwritten), episode 1
        # whole, episode 2's first two steps (the buffer's end).
        (13, 1, 2),
        # Rows 4-13 of 14: the oldest kept row is episode 0's reset row, so episode 1,
        # after it, starts whole.
        (14, 1, 1),
    ],
)
def test_a_replay_buffer_episode_whose_start_was_overwritten_counts_as_cut(
    tmp_path: Path, rows_written: int, whole: int, cut: int
) -> None:
    space = spaces.Box(-1000, 1000, (1,), np.float32)
    buffer = ReplayBuffer(10, space, spaces.Discrete(2))
    rows = [*_episode_rows(0, 4), *_episode_rows(10, 4), *_episode_rows(20, 4)]
    for obs, terminated, valid in rows[:rows_written]:
        buffer.add(
            np.array([[obs]], np.float32),
            np.array([0]),
            np.array([1.0]),
            np.array([terminated]),
            np.array([False]),
            np.array([valid]),
        )
    dataset = OfflineDataset.from_replay_buffer(buffer.save(tmp_path / "b.npz"), "CartPole-v1")
    stats = dataset.stats()
    assert (stats.num_episodes, stats.num_cut_episodes) == (whole, cut)
    # The statistics are those of the whole episode alone: 4 steps of reward 1.
    assert (stats.return_min, stats.return_max) == (4.0, 4.0)


def test_minari_directory_is_read(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    data_dir = tmp_path / "cartpole-random-v0" / "data"
    data_dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with h5py.File(data_dir / "main_data.hdf5", "w") as file:
        file.attrs["env_spec"] = json.dumps({"id": "CartPole-v1"})
        for k, steps in enumerate((5, 3)):
            group = file.create_group(f"episode_{k}")
            group["observations"] = rng.uniform(-0.05, 0.05, (steps + 1, 4)).astype(np.float32)
            group["actions"] = rng.integers(0, 2, steps)
            group["rewards"] = np.ones(steps)
            group["terminations"] = np.arange(steps) == steps - 1
            group["truncations"] = np.zeros(steps, bool)
    dataset = OfflineDataset.from_minari(tmp_path / "cartpole-random-v0")
    assert len(dataset) == 8
    assert dataset.env_id == "CartPole-v1"
    np.testing.assert_array_equal(dataset.episode_returns(), [5.0, 3.0])
    assert dataset.source["kind"] == "minari"


def test_minari_without_h5py_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(MissingDependencyError, match=r"rlfleet\[minari\]"):
        OfflineDataset.from_minari("anywhere")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rewards": np.array([1, np.nan, 1, 1, 1, 1], np.float32)}, "'rewards'.*NaN.*row 1"),
        ({"rewards": np.array([1, 1, 1, 1, -np.inf, 1], np.float32)}, "'rewards'.*inf.*row 4"),
        ({"actions": np.array([0, 1, 0, np.nan, 1, 0])}, "'actions'.*NaN or inf.*row 3"),
        ({"actions": np.array([0, 1, 0.5, 1, 1, 0])}, "'actions'.*whole numbers.*row 2"),
        ({"terminations": np.array([0, 0, 1, 0, np.inf, 0])}, "'terminations'.*inf.*row 4"),
        ({"truncations": np.array([np.nan, 0, 0, 0, 0, 0])}, "'truncations'.*NaN.*row 0"),
        (
            {"observations": np.where(np.arange(18).reshape(6, 3) == 13, np.nan, 0.0)},
            "'observations'.*NaN.*row 4",
        ),
        (
            {"next_observations": np.where(np.arange(18).reshape(6, 3) == 2, np.inf, 0.0)},
            "'next_observations'.*inf.*row 0",
        ),
        ({"actions": np.array([0, 1, 2, 0, 1, 0])}, "row 2.*outside the action space"),
        ({"next_observations": np.zeros((6, 4), np.float32)}, "'next_observations'.*shape"),
        ({"terminations": np.zeros(5, bool)}, "'terminations'.*shape"),
    ],
)
def test_bad_columns_are_refused(changes: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        _dataset(**changes)


def test_empty_dataset_is_refused() -> None:
    empty = {name: value[:0] for name, value in _arrays().items()}
    with pytest.raises(DatasetError, match="empty"):
        _dataset(**empty)


def test_missing_column_and_foreign_directory_are_refused(tmp_path: Path) -> None:
    path = _dataset().save(tmp_path / "data")
    arrays = {k: v for k, v in _arrays().items() if k != "rewards"}
    np.savez(path / DATA_FILE, **arrays)
    with pytest.raises(DatasetError, match=r"missing column\(s\) \['rewards'\]"):
        OfflineDataset.load(path)
    with pytest.raises(DatasetError, match="not a dataset directory"):
        OfflineDataset.load(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "d4rl"}, r"expected format 'rlfleet-offline-dataset'"),
        ({"format_version": 2}, r"format version 2, this rlfleet reads version 1"),
    ],
)
def test_a_foreign_or_newer_format_is_refused(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    # docs/offline.md: "a foreign or newer format" raises DatasetError.
    path = _dataset().save(tmp_path / "data")
    metadata = json.loads((path / METADATA_FILE).read_text())
    (path / METADATA_FILE).write_text(json.dumps(metadata | change))
    with pytest.raises(DatasetError, match=message):
        OfflineDataset.load(path)


def test_saving_never_replaces_other_files(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="already exists"):
        _dataset().save(tmp_path / "taken")
    with pytest.raises(DatasetError, match="does not hold a dataset"):
        _dataset().save(tmp_path / "taken", overwrite=True)
    path = _dataset().save(tmp_path / "data")
    assert _dataset().save(path, overwrite=True) == path


def test_spaces_that_differ_from_the_env_are_named() -> None:
    with pytest.raises(DatasetError, match=r"observation space Box.*CartPole-v1"):
        _dataset().check_spaces(spaces.Box(-1, 1, (4,), np.float32), ACTIONS, "CartPole-v1")
    observations = _dataset().observation_space
    with pytest.raises(DatasetError, match=r"has action space Discrete\(2\), but env 'X' has "
                       r"Discrete\(3\)$"):  # fmt: skip
        _dataset().check_spaces(observations, spaces.Discrete(3), "X")
    _dataset().check_spaces(observations, ACTIONS, "X")


def test_a_dataset_that_cannot_be_written_is_a_run_dir_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = random_dataset("CartPole-v1", 50)

    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "savez", no_space)
    with pytest.raises(RunDirError, match=r"data: cannot write \(No space left on device; "):
        dataset.save(tmp_path / "data")
    assert list(tmp_path.iterdir()) == []


def test_overwriting_keeps_the_old_dataset_until_the_new_one_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = random_dataset("CartPole-v1", 50)
    old.save(tmp_path / "data")
    real_replace = Path.replace

    def fail_the_new_one(self: Path, target: Path) -> Path:
        if self.name.startswith(".data.") and not self.name.endswith(".old"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", fail_the_new_one)
    with pytest.raises(RunDirError, match="No space left on device"):
        random_dataset("CartPole-v1", 60).save(tmp_path / "data", overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert len(OfflineDataset.load(tmp_path / "data")) == len(old)
    random_dataset("CartPole-v1", 60).save(tmp_path / "data", overwrite=True)
    assert len(OfflineDataset.load(tmp_path / "data")) == 60
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
