"""Offline datasets: recorded transitions that offline algorithms learn from.

On-disk format (format version 1): a directory holding two files.

``data.npz``
    One array per column, ``N`` rows (one per transition), loaded with
    ``allow_pickle=False``:

    ===================== ======================== ===========================================
    column                shape, dtype             meaning
    ===================== ======================== ===========================================
    ``observations``      ``[N, *obs_shape]``      what the agent saw (the space's dtype)
    ``actions``           ``[N, *action_shape]``   what it did (Box: float, Discrete: int64)
    ``rewards``           ``[N]`` float32          reward of the step
    ``terminations``      ``[N]`` bool             the episode ended in a terminal state
    ``truncations``       ``[N]`` bool             the episode was cut (time limit, end of
                                                   recording); targets bootstrap from
                                                   ``next_observations``
    ``next_observations`` ``[N, *obs_shape]``      what followed (the true final observation
                                                   at an episode's end)
    ===================== ======================== ===========================================

    Episodes are contiguous runs of rows; each ends at a row whose ``terminations`` or
    ``truncations`` is true, and the last row always ends one (a recording that stops
    mid-episode ends it as truncated).

``metadata.json``
    ``format`` (``"rlfleet-offline-dataset"``), ``format_version``, ``env_id``,
    ``observation_space`` and ``action_space`` (as :func:`rlfleet.envs.spaces.space_to_json`),
    ``source`` (how the data was produced: ``{"kind": "collect" | "replay_buffer" | "minari" |
    "arrays", ...}``; a recording, or a replay buffer's streams, list in ``cut_episode_ends``
    the last rows of the episodes the start or end of the data cut short), ``num_transitions``,
    ``num_episodes`` (whole ones), ``num_cut_episodes``, ``episode_return`` statistics (of the
    whole episodes, where there are any) and ``created_at``.

Sources: :func:`rlfleet.collect.record.record_dataset` (``rlfleet collect``, a trained run's
policy), :meth:`OfflineDataset.from_replay_buffer` (a ``ReplayBuffer.save`` file),
:meth:`OfflineDataset.from_minari` (a Minari dataset directory on disk, the ``minari`` extra).
Training samples minibatches through :meth:`OfflineDataset.to_replay_buffer`, so offline
algorithms use the replay buffer's sampling (and its ``ReplayBatch``) unchanged.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import tempfile
import time
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from rlfleet.data.replay import ReplayBuffer
from rlfleet.data.samplers import UniformSampler
from rlfleet.envs.make import make_env
from rlfleet.envs.spaces import describe_space, space_from_json, space_mismatch, space_to_json
from rlfleet.errors import (
    CheckpointError,
    DatasetError,
    EnvSpecError,
    MissingDependencyError,
    RunDirError,
    nameless,
    option,
    write_error,
)
from rlfleet.seeding import stream_seed

__all__ = ["COLUMNS", "DatasetStats", "OfflineDataset", "check_output_dir"]

FORMAT_NAME = "rlfleet-offline-dataset"
FORMAT_VERSION = 1
DATA_FILE = "data.npz"
METADATA_FILE = "metadata.json"
COLUMNS = (
    "observations",
    "actions",
    "rewards",
    "terminations",
    "truncations",
    "next_observations",
)
"""The arrays every dataset holds, in ``data.npz`` under these names."""
_ACTION_TOLERANCE = 1e-5
"""Box actions may exceed their bounds by this much (float rounding of a clipped action)."""


@dataclass(frozen=True)
class DatasetStats:
    """Size and return distribution of a dataset, logged when offline training starts."""

    num_transitions: int
    num_episodes: int
    """Whole episodes: those the env ended (terminated or truncated)."""
    return_mean: float
    return_std: float
    return_min: float
    return_median: float
    return_max: float
    num_cut_episodes: int = 0
    """Episodes cut short by the start or end of the data: a recording's last episodes, or a
    replay buffer's episodes that a stream break ends or whose start was overwritten
    (``source["cut_episode_ends"]``). Their returns count in the statistics only
    when no episode is whole."""

    def as_metrics(self) -> dict[str, float]:
        """The statistics under the ``dataset/`` metric namespace."""
        return {
            "dataset/num_transitions": float(self.num_transitions),
            "dataset/num_episodes": float(self.num_episodes),
            "dataset/num_cut_episodes": float(self.num_cut_episodes),
            "dataset/return_mean": self.return_mean,
            "dataset/return_std": self.return_std,
            "dataset/return_min": self.return_min,
            "dataset/return_median": self.return_median,
            "dataset/return_max": self.return_max,
        }

    def describe(self) -> str:
        """One line for the console."""
        episodes = f"{self.num_episodes:,} episodes"
        of = ""
        if self.num_cut_episodes:
            episodes = (
                f"{self.num_episodes:,} whole episodes and {self.num_cut_episodes:,} cut short "
                "by the start or end of the data"
            )
            of = (
                f" of the {self.num_episodes:,} whole"
                if self.num_episodes
                else f" of the {self.num_cut_episodes:,} cut short"
            )
        return (
            f"dataset: {self.num_transitions:,} transitions, {episodes}, "
            f"return{of} mean {self.return_mean:.1f} ± {self.return_std:.1f} "
            f"(min {self.return_min:.1f}, median {self.return_median:.1f}, "
            f"max {self.return_max:.1f})"
        )


def _return_stats(returns: np.ndarray) -> dict[str, float]:
    """The return fields of :class:`DatasetStats` for episode ``returns`` (not empty)."""
    return {
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "return_min": float(returns.min()),
        "return_median": float(np.median(returns)),
        "return_max": float(returns.max()),
    }


class OfflineDataset:
    """Transitions of one env as columns (see the module docstring for the format).

    The constructor checks everything a training run would otherwise trip over later:
    matching row counts, shapes that fit the spaces, finite values and actions inside the
    action space. A recording that stops mid-episode has its last row marked truncated.

    Raises:
        DatasetError: empty, inconsistent, non-finite or out-of-space data (the message
            names the column, what was expected and what was found, and ``where``).
    """

    def __init__(
        self,
        observations: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        next_observations: np.ndarray,
        *,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        env_id: str,
        source: Mapping[str, Any],
        where: str = "dataset",
    ) -> None:
        check_dataset_spaces(observation_space, action_space, where)
        self.observation_space = observation_space
        self.action_space = action_space
        self.env_id = env_id
        self.source = dict(source)
        obs_dtype = observation_space.dtype or np.float32
        action_dtype = np.float32 if isinstance(action_space, spaces.Box) else np.int64
        self.observations = _column(observations, "observations", obs_dtype, where)
        self.actions = _column(actions, "actions", action_dtype, where)
        self.rewards = _column(rewards, "rewards", np.float32, where)
        self.terminations = _column(terminations, "terminations", np.bool_, where)
        self.truncations = _column(truncations, "truncations", np.bool_, where).copy()
        self.next_observations = _column(next_observations, "next_observations", obs_dtype, where)
        self._validate(where)
        if not (self.terminations[-1] or self.truncations[-1]):
            self.truncations[-1] = True

    # ------------------------------------------------------------ validation
    def _validate(self, where: str) -> None:
        n = self.observations.shape[0]
        if n == 0:
            raise DatasetError(f"{where}: the dataset is empty (expected at least 1 transition)")
        obs_shape = tuple(self.observation_space.shape or ())
        action_shape = tuple(self.action_space.shape or ())
        expected = {
            "observations": obs_shape,
            "actions": action_shape,
            "rewards": (),
            "terminations": (),
            "truncations": (),
            "next_observations": obs_shape,
        }
        for name, row_shape in expected.items():
            array: np.ndarray = getattr(self, name)
            if array.shape != (n, *row_shape):
                raise DatasetError(
                    f"{where}: column {name!r} has shape {array.shape}, expected "
                    f"{(n, *row_shape)} ({n} transitions of {row_shape or 'scalars'})"
                )
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                bad = int(np.flatnonzero(~np.isfinite(array.reshape(n, -1)).all(axis=1))[0])
                raise DatasetError(
                    f"{where}: column {name!r} holds NaN or inf (first at row {bad}); "
                    "expected finite values"
                )
        space = self.action_space
        outside: np.ndarray
        if isinstance(space, spaces.Discrete):
            low, high = int(space.start), int(space.start + space.n - 1)
            outside = (self.actions < low) | (self.actions > high)
        else:
            assert isinstance(space, spaces.Box)
            flat = self.actions.reshape(n, -1)
            beyond = (flat < space.low.reshape(-1) - _ACTION_TOLERANCE) | (
                flat > space.high.reshape(-1) + _ACTION_TOLERANCE
            )
            outside = np.any(beyond, axis=1)
        if outside.any():
            row = int(np.flatnonzero(outside)[0])
            raise DatasetError(
                f"{where}: action at row {row} ({self.actions[row].tolist()}) is outside the "
                f"action space {describe_space(space)}"
            )

    def check_spaces(
        self, observation_space: spaces.Space[Any], action_space: spaces.Space[Any], env_id: str
    ) -> None:
        """Refuse an env whose spaces differ from the dataset's.

        Raises:
            DatasetError: naming the space that differs, both versions, and the env.
        """
        mismatch = space_mismatch(
            (self.observation_space, self.action_space), (observation_space, action_space)
        )
        if mismatch is not None:
            label, mine, theirs = mismatch
            raise DatasetError(
                f"dataset recorded on {self.env_id!r} has {label} space {mine}, but env "
                f"{env_id!r} has {theirs}"
            )

    # ------------------------------------------------------------- statistics
    def __len__(self) -> int:
        return int(self.observations.shape[0])

    def episode_ends(self) -> np.ndarray:
        """Row index of the last transition of each episode."""
        ends: np.ndarray = np.flatnonzero(self.terminations | self.truncations)
        return ends

    def episode_returns(self) -> np.ndarray:
        """Undiscounted return of each episode, in order."""
        starts = np.concatenate([[0], self.episode_ends()[:-1] + 1])
        returns: np.ndarray = np.add.reduceat(self.rewards.astype(np.float64), starts)
        return returns

    def stats(self) -> DatasetStats:
        """Size and episode-return distribution. The episodes the start or end of the data cut
        short (rows listed in ``source["cut_episode_ends"]``) are counted apart, and their partial
        returns are left out of the distribution unless no episode is whole."""
        returns = self.episode_returns()
        cut = np.isin(self.episode_ends(), list(self.source.get("cut_episode_ends", ())))
        whole = returns[~cut]
        return DatasetStats(
            num_transitions=len(self),
            num_episodes=int(whole.size),
            num_cut_episodes=int(cut.sum()),
            **_return_stats(whole if whole.size else returns),
        )

    # --------------------------------------------------------------- training
    def to_replay_buffer(self, seed: int = 0) -> ReplayBuffer:
        """A replay buffer holding exactly these transitions, sampled uniformly.

        Rows follow the buffer's next-step-autoreset layout: each transition is a row whose
        next observation is the following row; where the stream breaks (an episode's end, or
        a next observation that is not the following row's observation) an extra invalid row
        holds the next observation, as a reset step does during collection.
        """
        n = len(self)
        breaks = self.terminations | self.truncations
        breaks[:-1] |= _rows_differ(self.next_observations[:-1], self.observations[1:])
        buffer = ReplayBuffer(
            n + int(breaks.sum()),
            self.observation_space,
            self.action_space,
            sampler=UniformSampler(seed=stream_seed(seed, "replay")),
        )
        blank_action = np.zeros((1, *self.actions.shape[1:]), self.actions.dtype)
        no = np.zeros(1, bool)
        yes = np.ones(1, bool)
        for i in range(n):
            buffer.add(
                self.observations[i : i + 1],
                self.actions[i : i + 1],
                self.rewards[i : i + 1],
                self.terminations[i : i + 1],
                self.truncations[i : i + 1],
                yes,
            )
            if breaks[i]:
                buffer.add(self.next_observations[i : i + 1], blank_action, np.zeros(1), no, no, no)
        return buffer

    # ------------------------------------------------------------ persistence
    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the dataset directory atomically (a temp directory, then a rename).

        Raises:
            DatasetError: ``path`` exists and is not empty, unless ``overwrite`` is set and
                it holds a dataset (anything else is never deleted).
            RunDirError: writing failed (a full disk: the message names ``path`` and the
                free space); no partial dataset is left behind.
        """
        path = Path(path)
        check_output_dir(path, overwrite=overwrite)
        tmp: Path | None = None
        old: Path | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
            with open(tmp / DATA_FILE, "wb") as file:
                np.savez(file, **{name: getattr(self, name) for name in COLUMNS})
                file.flush()
                os.fsync(file.fileno())
            (tmp / METADATA_FILE).write_text(json.dumps(self.metadata(), indent=2) + "\n")
            if path.exists():
                # Set aside, not deleted, until the new one is in place: a crash in between
                # leaves a complete dataset (the new one, or the old one beside it).
                old = path.with_name(f".{path.name}.{secrets.token_hex(4)}.old")
                path.replace(old)
            tmp.replace(path)
            tmp = None
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException as error:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if old is not None and not path.exists():
                with contextlib.suppress(OSError):
                    old.replace(path)  # the new one never arrived: the old one goes back
            if isinstance(error, OSError):
                raise write_error(RunDirError, path, error) from error
            raise
        return path

    def metadata(self) -> dict[str, Any]:
        """What ``metadata.json`` holds."""
        stats = self.stats()
        return {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "env_id": self.env_id,
            "observation_space": space_to_json(self.observation_space),
            "action_space": space_to_json(self.action_space),
            "source": self.source,
            "num_transitions": stats.num_transitions,
            "num_episodes": stats.num_episodes,
            "num_cut_episodes": stats.num_cut_episodes,
            "episode_return": {
                "mean": stats.return_mean,
                "std": stats.return_std,
                "min": stats.return_min,
                "median": stats.return_median,
                "max": stats.return_max,
            },
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }

    @classmethod
    def load(cls, path: str | Path) -> OfflineDataset:
        """Read a dataset directory written by :meth:`save` (nothing is unpickled).

        Raises:
            DatasetError: no such directory, unreadable or foreign files, missing columns,
                or data that fails the constructor's checks.
        """
        path = Path(path)
        meta_path, data_path = path / METADATA_FILE, path / DATA_FILE
        if not meta_path.is_file() or not data_path.is_file():
            raise DatasetError(
                f"{path}: not a dataset directory (expected {METADATA_FILE} and {DATA_FILE}; "
                "record one with `rlfleet collect`)"
            )
        try:
            metadata = json.loads(meta_path.read_text())
        except (OSError, ValueError) as err:
            raise DatasetError(f"{meta_path}: unreadable metadata ({err})") from err
        if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
            raise DatasetError(f"{meta_path}: expected format {FORMAT_NAME!r}")
        if metadata.get("format_version") != FORMAT_VERSION:
            raise DatasetError(
                f"{meta_path}: format version {metadata.get('format_version')!r}, this rlfleet "
                f"reads version {FORMAT_VERSION}"
            )
        try:
            observation_space = space_from_json(metadata["observation_space"])
            action_space = space_from_json(metadata["action_space"])
        except (KeyError, EnvSpecError) as err:
            raise DatasetError(f"{meta_path}: missing or unreadable space ({err})") from err
        try:
            with np.load(data_path, allow_pickle=False) as data:
                columns = {key: data[key] for key in data.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
            raise DatasetError(f"{data_path}: not a readable npz file ({err})") from err
        missing = [name for name in COLUMNS if name not in columns]
        if missing:
            raise DatasetError(
                f"{data_path}: missing column(s) {missing}; a dataset holds {list(COLUMNS)}"
            )
        return cls(
            **{name: columns[name] for name in COLUMNS},
            observation_space=observation_space,
            action_space=action_space,
            env_id=str(metadata.get("env_id", "")),
            source=metadata.get("source") or {},
            where=str(path),
        )

    # ------------------------------------------------------------------ import
    @classmethod
    def from_replay_buffer(cls, path: str | Path, env_id: str) -> OfflineDataset:
        """The transitions of a ``ReplayBuffer.save`` file, one env stream after another.

        Stream breaks (the buffer's oldest rows, the newest row, resumed collection) end an
        episode as truncated, so no transition is ever paired with an unrelated observation.
        The episodes a break cuts short are listed in ``source["cut_episode_ends"]``: those it
        ends, and, in a buffer that overwrote older rows, each env's oldest episode, whose
        start is gone (unless the oldest row is a reset step, so that the episode after it
        starts whole).

        Raises:
            CheckpointError: not a readable replay buffer file.
            DatasetError: Dict observations (datasets hold one observation array), or no
                complete transition in the buffer.
        """
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                rows = int(data["rows_filled"])
                num_envs = int(data["num_envs"])
                observation_space = space_from_json(json.loads(str(data["observation_space"])))
                action_space = space_from_json(json.loads(str(data["action_space"])))
                # Datasets hold no action masks: a masked buffer's masks are read and left.
                masks = data["action_masks"] if "action_masks" in data.files else None
        except (
            OSError,
            ValueError,
            EOFError,
            KeyError,
            EnvSpecError,
            zipfile.BadZipFile,
            zlib.error,
        ) as err:
            raise CheckpointError(f"{path}: not a readable replay buffer file ({err})") from err
        if isinstance(observation_space, spaces.Dict):
            raise DatasetError(
                f"{path}: Dict observations cannot become a dataset (expected Box or Discrete)"
            )
        buffer = ReplayBuffer(
            max(rows, 2) * num_envs,
            observation_space,
            action_space,
            num_envs,
            mask_size=None if masks is None else int(masks.shape[-1]),
        )
        buffer.load(path)
        (obs,) = buffer.obs.values()
        filled = buffer.rows_filled
        # Row t of env e is a transition when it is valid and row t + 1 (its next
        # observation) was written.
        is_transition = buffer.valid[:filled].copy()
        is_transition[filled - 1 :] = False
        following = np.zeros_like(is_transition)
        following[:-1] = is_transition[1:]
        columns: dict[str, list[np.ndarray]] = {name: [] for name in COLUMNS}
        # Episodes a stream break ends (not the env) are cut short, as at a recording's end;
        # so is the oldest episode of an env once older rows were overwritten.
        cut_ends: list[int] = []
        offset = 0  # the dataset row of this env's first transition
        for env in range(num_envs):
            rows_of_env = np.flatnonzero(is_transition[:, env])
            columns["observations"].append(obs[rows_of_env, env])
            columns["actions"].append(buffer.actions[rows_of_env, env])
            columns["rewards"].append(buffer.rewards[rows_of_env, env])
            terminated = buffer.terminated[rows_of_env, env]
            columns["terminations"].append(terminated)
            broken = ~following[rows_of_env, env] & ~terminated
            env_ended = buffer.truncated[rows_of_env, env] | terminated
            columns["truncations"].append(env_ended & ~terminated | broken)
            cut_ends += [offset + int(i) for i in np.flatnonzero(broken & ~env_ended)]
            if buffer.rows_dropped and buffer.valid[0, env] and len(rows_of_env):
                # A stream's last transition always ends an episode (the env's or a break's).
                cut_ends.append(offset + int(np.flatnonzero(env_ended | broken)[0]))
            offset += len(rows_of_env)
            columns["next_observations"].append(obs[rows_of_env + 1, env])
        return cls(
            **{name: np.concatenate(parts) for name, parts in columns.items()},
            observation_space=observation_space,
            action_space=action_space,
            env_id=env_id,
            source={
                "kind": "replay_buffer",
                "path": str(path),
                "num_envs": num_envs,
                "cut_episode_ends": sorted(set(cut_ends)),
            },
            where=str(path),
        )

    @classmethod
    def from_minari(cls, path: str | Path, env_id: str | None = None) -> OfflineDataset:
        """Read a Minari dataset directory from disk (nothing is downloaded).

        ``path`` is the dataset's directory (holding ``data/main_data.hdf5``) or that
        ``data`` directory. Minari's HDF5 layout: one group ``episode_<k>`` per episode with
        ``observations`` (``steps + 1`` rows, the reset observation first), ``actions``,
        ``rewards``, ``terminations`` and ``truncations``; the env spec as a JSON string in
        the root attribute (or ``metadata.json`` entry) ``env_spec``. The spaces come from
        the env, made by ``env_id`` (default: the spec's id); the data is checked against
        them. Needs ``h5py`` (``pip install 'rlfleet[minari]'``).

        Raises:
            MissingDependencyError: h5py is not installed.
            DatasetError: no Minari data file, flattened Dict/Tuple observations, no env id,
                or data that fails the constructor's checks.
        """
        try:
            import h5py
        except ImportError as err:
            raise MissingDependencyError(
                "reading Minari datasets needs h5py: pip install 'rlfleet[minari]'"
            ) from err
        path = Path(path)
        data_dir = path if (path / "main_data.hdf5").is_file() else path / "data"
        file_path = data_dir / "main_data.hdf5"
        if not file_path.is_file():
            raise DatasetError(
                f"{path}: not a Minari dataset directory (expected data/main_data.hdf5)"
            )
        columns: dict[str, list[np.ndarray]] = {name: [] for name in COLUMNS}
        with h5py.File(file_path, "r") as file:
            env_id = env_id or _minari_env_id(dict(file.attrs), data_dir, file_path)
            episodes = sorted(
                (key for key in file if key.startswith("episode_")),
                key=lambda key: int(key.removeprefix("episode_")),
            )
            for key in episodes:
                group = file[key]
                needed = ("observations", "actions", "rewards", "terminations", "truncations")
                missing = [name for name in needed if name not in group]
                if missing:
                    raise DatasetError(f"{file_path}: {key} lacks {missing}")
                if not isinstance(group["observations"], h5py.Dataset):
                    raise DatasetError(
                        f"{file_path}: {key}/observations is a group (Dict or Tuple "
                        "observations); datasets hold one Box or Discrete observation array"
                    )
                obs = np.asarray(group["observations"])
                columns["observations"].append(obs[:-1])
                columns["next_observations"].append(obs[1:])
                columns["actions"].append(np.asarray(group["actions"]))
                for name in ("rewards", "terminations", "truncations"):
                    columns[name].append(np.asarray(group[name]).reshape(-1))
        if not episodes:
            raise DatasetError(f"{file_path}: the dataset is empty (no episode_<k> groups)")
        env = make_env(env_id)
        try:
            observation_space, action_space = env.observation_space, env.action_space
        finally:
            env.close()
        return cls(
            **{name: np.concatenate(parts) for name, parts in columns.items()},
            observation_space=observation_space,
            action_space=action_space,
            env_id=env_id,
            source={"kind": "minari", "path": str(path), "episodes": len(episodes)},
            where=str(file_path),
        )


def check_output_dir(path: str | Path, *, overwrite: bool) -> None:
    """A dataset may be written to ``path``: it is free or empty, or, with ``overwrite``,
    holds a dataset (nothing else is ever deleted).

    Raises:
        DatasetError: naming the directory and what to do.
    """
    path = Path(path)
    if nameless(path):
        raise DatasetError(
            f"output directory {str(path)!r} has no name of its own; expected the path of a "
            "new directory (such as data/expert)"
        )
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        if not overwrite:
            raise DatasetError(
                f"{path} already exists; choose another output directory or overwrite it "
                f"({option('overwrite', flag='--force')})"
            )
        if not (path / METADATA_FILE).is_file():
            raise DatasetError(f"refusing to overwrite {path}: it does not hold a dataset")


def check_dataset_spaces(
    observation_space: spaces.Space[Any], action_space: spaces.Space[Any], where: str
) -> None:
    """Refuse spaces a dataset cannot hold (it holds Box or Discrete ones).

    Raises:
        DatasetError: naming the space and what datasets hold.
    """
    for label, space in (("observation", observation_space), ("action", action_space)):
        if not isinstance(space, spaces.Box | spaces.Discrete):
            raise DatasetError(
                f"{where}: {label} space {describe_space(space)} is not supported; "
                "datasets hold Box or Discrete spaces"
            )


def _column(array: Any, name: str, dtype: Any, where: str) -> np.ndarray:
    """``array`` as a numpy array of ``dtype`` (integers stay exact; bools from 0/1)."""
    array = np.asarray(array)
    if array.dtype.kind not in "biuf":
        raise DatasetError(
            f"{where}: column {name!r} has dtype {array.dtype}, expected numbers or booleans"
        )
    whole = np.dtype(dtype).kind in "biu" and array.dtype.kind == "f"
    if whole:
        flat = np.atleast_1d(array)
        rows = flat.reshape(flat.shape[0], math.prod(flat.shape[1:]))  # no -1: may be empty
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():
            raise DatasetError(
                f"{where}: column {name!r} holds NaN or inf (first at row "
                f"{int(np.flatnonzero(~finite)[0])}); expected finite values"
            )
        fractional = (rows != np.round(rows)).any(axis=1)
        if fractional.any():
            raise DatasetError(
                f"{where}: column {name!r} must hold whole numbers ({np.dtype(dtype)}), "
                f"found a fraction (first at row {int(np.flatnonzero(fractional)[0])})"
            )
    converted: np.ndarray = array.astype(dtype, copy=False)
    return converted


def _rows_differ(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row: do ``a`` and ``b`` differ anywhere?"""
    differ: np.ndarray = (a.reshape(a.shape[0], -1) != b.reshape(b.shape[0], -1)).any(axis=1)
    return differ


def _minari_env_id(attrs: dict[str, Any], data_dir: Path, file_path: Path) -> str:
    """The env id of a Minari dataset: ``env_spec`` from the HDF5 root or ``metadata.json``."""
    spec = attrs.get("env_spec")
    metadata_path = data_dir / "metadata.json"
    if spec is None and metadata_path.is_file():
        spec = json.loads(metadata_path.read_text()).get("env_spec")
    if isinstance(spec, bytes):
        spec = spec.decode()
    try:
        env_id = json.loads(spec)["id"] if isinstance(spec, str) else None
    except (ValueError, KeyError, TypeError):
        env_id = None
    if not env_id:
        raise DatasetError(
            f"{file_path}: no env spec with an id in the dataset; pass the env id explicitly"
        )
    return str(env_id)
