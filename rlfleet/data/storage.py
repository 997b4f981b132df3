"""Replay storage: preallocated ``[rows, num_envs]`` arrays of transitions, saved without pickle.

The storage part of the replay buffer (storage x sampler x writer, after TorchRL): it owns
the arrays, their memory estimate and their file format, and knows nothing of sampling or of
where the next row goes (:class:`~rlfleet.data.replay.ReplayBuffer` keeps that cursor).

Layout. Row ``t`` holds what env ``e`` saw and did at vector step ``t``: observation,
action, reward, terminated, truncated, valid (and, for an env that masks actions, the mask
the env gave with the observation). The next observation of a transition is the
observation of the following row, so observations are stored once, never twice (an
84x84x4 uint8 Atari frame stack costs 28 KB per transition, not 56 KB).

Observations keep their space's dtype (uint8 images stay uint8); Dict observations are
stored one array per key (nested keys joined with ``/``). A mask that is the ``action_mask``
key of a Dict observation is stored with the observations, not a second time.

File format (``.npz``, read with ``allow_pickle=False``): one array per stored array
(``obs/<key>``, ``actions``, ``rewards``, ``terminated``, ``truncated``, ``valid``, and
``action_masks`` when kept), ``rows_filled`` rows each, plus ``format_version``, ``pos``
(the row the next write goes to), ``rows_filled``, ``rows_dropped`` (whether older rows were
overwritten, so that the oldest row's episode may lack its start), ``num_envs`` and both
spaces as JSON strings, so a file from another env is named and refused before anything is
replaced.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from rlfleet.envs.spaces import describe_space, space_from_json, space_to_json, spaces_equal
from rlfleet.errors import (
    CheckpointError,
    ConfigError,
    EnvSpecError,
    InsufficientMemoryError,
    write_error,
)
from rlfleet.nn.masks import MASK_KEY

__all__ = ["OBS_KEY", "TransitionStorage", "available_memory_bytes"]

OBS_KEY = "obs"
"""Storage key of a non-Dict observation."""
FILE_FORMAT = 1
_GIB = 1024**3


def available_memory_bytes() -> int:
    """Memory the kernel says can be allocated without swapping (``MemAvailable``)."""
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _leaf_spaces(
    space: spaces.Space[Any], prefix: str = "", what: str = "observations"
) -> dict[str, spaces.Space[Any]]:
    """Storage key -> leaf space; Dict keys (observations only) are joined with ``/``."""
    if isinstance(space, spaces.Dict) and what == "observations":
        leaves: dict[str, spaces.Space[Any]] = {}
        for key, sub in space.spaces.items():
            leaves.update(_leaf_spaces(sub, f"{prefix}{key}/"))
        return leaves
    if not isinstance(
        space, spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary
    ):
        raise EnvSpecError(
            f"replay buffer: cannot store {what} of space {describe_space(space)}; supported: "
            "Box, Discrete, MultiDiscrete, MultiBinary (and Dict of those for observations)"
        )
    return {prefix.rstrip("/") or OBS_KEY: space}


def leaf_values(obs: Any, prefix: str = "") -> dict[str, Any]:
    """Storage key -> value of an observation (a Dict observation's keys joined with ``/``)."""
    if isinstance(obs, Mapping):
        values: dict[str, Any] = {}
        for key, sub in obs.items():
            values.update(leaf_values(sub, f"{prefix}{key}/"))
        return values
    return {prefix.rstrip("/") or OBS_KEY: obs}


def _leaf_shape_dtype(space: spaces.Space[Any]) -> tuple[tuple[int, ...], np.dtype[Any]]:
    dtype = space.dtype if space.dtype is not None else np.dtype(np.float32)
    return tuple(space.shape or ()), np.dtype(dtype)


class TransitionStorage:
    """Preallocated arrays for ``capacity`` transitions of ``num_envs`` parallel envs.

    Args:
        capacity: transitions kept (rounded up to a multiple of ``num_envs``, two rows at
            least: a transition needs the row after it for its next observation).
        observation_space / action_space: single-env spaces.
        num_envs: envs written together, one row per vector step.
        mask_size: entries of the env's action mask, when it gives one (see
            :class:`~rlfleet.data.replay.ReplayBuffer`).
        extra_bytes_per_slot: memory a sampler needs per slot, counted in the memory check.

    Raises:
        ConfigError: a ``mask_size`` below 1, or one that differs from the size of the
            observation's ``action_mask`` key.
        EnvSpecError: a space whose values cannot be stored.
        InsufficientMemoryError: the arrays would not fit in the memory available now.
    """

    def __init__(
        self,
        capacity: int,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        num_envs: int = 1,
        *,
        mask_size: int | None = None,
        extra_bytes_per_slot: float = 0.0,
    ) -> None:
        if capacity < 1 or num_envs < 1:
            raise ConfigError(
                f"replay buffer: expected capacity >= 1 and num_envs >= 1, "
                f"got capacity={capacity}, num_envs={num_envs}"
            )
        self.observation_space = observation_space
        self.action_space = action_space
        self.num_envs = num_envs
        self.rows = max(math.ceil(capacity / num_envs), 2)
        self.capacity = self.rows * num_envs
        self._obs_leaves = _leaf_spaces(observation_space)
        self.action_shape, self.action_dtype = _leaf_shape_dtype(
            _leaf_spaces(action_space, what="actions")[OBS_KEY]
        )
        self.masks_in_obs = MASK_KEY in self._obs_leaves
        """The mask is the observation's ``action_mask`` key: stored with the observations."""
        self.mask_size = self._check_mask_size(mask_size)
        """Entries of the action mask each row keeps (None: no masks are kept)."""
        self._check_memory(extra_bytes_per_slot)
        shape = (self.rows, num_envs)
        self.obs = {
            key: np.zeros((*shape, *leaf_shape), leaf_dtype)
            for key, (leaf_shape, leaf_dtype) in (
                (k, _leaf_shape_dtype(s)) for k, s in self._obs_leaves.items()
            )
        }
        self.actions = np.zeros((*shape, *self.action_shape), self.action_dtype)
        self.rewards = np.zeros(shape, np.float32)
        self.terminated = np.zeros(shape, bool)
        self.truncated = np.zeros(shape, bool)
        self.valid = np.zeros(shape, bool)
        self.action_masks: np.ndarray | None = (
            np.ones((*shape, self.mask_size), bool)
            if self.mask_size is not None and not self.masks_in_obs
            else None
        )
        """Bool ``[rows, num_envs, mask_size]`` mask of each row's observation (None: no
        masks, or masks kept in the observations)."""

    def _check_mask_size(self, mask_size: int | None) -> int | None:
        if mask_size is not None and mask_size < 1:
            raise ConfigError(f"replay buffer: expected mask_size >= 1, got {mask_size}")
        if not self.masks_in_obs:
            return mask_size
        in_obs = math.prod(_leaf_shape_dtype(self._obs_leaves[MASK_KEY])[0])
        if mask_size is not None and mask_size != in_obs:
            raise ConfigError(
                f"replay buffer: mask_size {mask_size} differs from the {in_obs} entries of the "
                f"observation's {MASK_KEY!r} key, which is the mask this buffer stores"
            )
        return in_obs

    # ------------------------------------------------------------------ memory
    def bytes_per_slot(self) -> float:
        """Bytes one transition takes in the arrays."""
        obs = sum(
            math.prod(shape) * dtype.itemsize
            for shape, dtype in (_leaf_shape_dtype(s) for s in self._obs_leaves.values())
        )
        action = math.prod(self.action_shape) * self.action_dtype.itemsize
        # A mask in the observations is counted with them.
        mask = 0 if self.mask_size is None or self.masks_in_obs else self.mask_size
        return obs + action + mask + 4 + 3

    def _check_memory(self, extra_bytes_per_slot: float) -> None:
        per_slot = self.bytes_per_slot() + extra_bytes_per_slot
        needed = self.capacity * per_slot
        available = available_memory_bytes()
        if needed > available:
            fits = int(available / per_slot)
            raise InsufficientMemoryError(
                f"replay buffer of {self.capacity:,} transitions of "
                f"{describe_space(self.observation_space)} needs {needed / _GIB:.2f} GiB, "
                f"but only {available / _GIB:.2f} GiB of memory is available; lower "
                f"buffer_size to at most about {fits:,}"
            )

    # ----------------------------------------------------------------- writing
    def write(
        self,
        row: int,
        obs: np.ndarray | Mapping[str, Any],
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        valid: np.ndarray,
        action_mask: np.ndarray | None,
    ) -> None:
        """Store one vector step (``[num_envs, ...]`` arrays) in ``row``.

        Raises:
            ConfigError: ``action_mask`` missing for a storage with a separate mask array,
                or given to one that keeps no separate masks.
        """
        if isinstance(obs, Mapping):
            for key, value in leaf_values(obs).items():
                self.obs[key][row] = value
        else:
            self.obs[OBS_KEY][row] = obs
        self.actions[row] = actions.reshape(self.actions.shape[1:])
        self.rewards[row] = rewards
        self.terminated[row] = terminated
        self.truncated[row] = truncated
        self.valid[row] = valid
        if action_mask is not None or self.action_masks is not None:
            self._write_mask(row, action_mask)

    def _write_mask(self, row: int, action_mask: np.ndarray | None) -> None:
        if self.action_masks is None:
            where = (
                f"the observation's {MASK_KEY!r} key"
                if self.masks_in_obs
                else "nothing (build it with mask_size)"
            )
            raise ConfigError(f"replay buffer: got an action_mask, but it stores masks in {where}")
        if action_mask is None:
            raise ConfigError(
                f"replay buffer: it stores an action mask of {self.mask_size} entries per row, "
                "so add() needs the action_mask of every row"
            )
        self.action_masks[row] = action_mask

    def as_obs(self, values: dict[str, Any]) -> Any:
        """Storage key -> value as the observation it stands for (one array if not a Dict)."""
        return values[OBS_KEY] if set(values) == {OBS_KEY} else values

    # ------------------------------------------------------------- persistence
    def arrays(self) -> dict[str, np.ndarray]:
        """Every stored array by its name in files and state dicts."""
        arrays = {f"obs/{key}": value for key, value in self.obs.items()}
        arrays.update(
            actions=self.actions,
            rewards=self.rewards,
            terminated=self.terminated,
            truncated=self.truncated,
            valid=self.valid,
        )
        if self.action_masks is not None:
            arrays["action_masks"] = self.action_masks
        return arrays

    def refuse_other_masks(self, stored: bool, what: str) -> None:
        """Saved arrays must hold action masks exactly when this storage does."""
        if stored == (self.action_masks is not None):
            return
        if stored:
            raise CheckpointError(
                f"{what} holds action masks, but this buffer stores none: it was saved by a "
                "run whose env masks actions; load it into a buffer with mask_size"
            )
        raise CheckpointError(
            f"{what} holds no action masks, but this buffer stores a mask of {self.mask_size} "
            "entries per transition: the env masks actions and learning targets need the "
            "mask of every stored state; it was saved by a run without masks, so start from "
            "an empty buffer (a new run, or one that does not load this buffer)"
        )

    def load_arrays(self, arrays: Mapping[str, np.ndarray], rows_filled: int) -> None:
        """Fill the first ``rows_filled`` rows from :meth:`arrays`-shaped ``arrays``.

        Everything is checked before anything is written.

        Raises:
            CheckpointError: other array names, more rows than fit, or other shapes.
        """
        self.refuse_other_masks("action_masks" in arrays, "replay buffer state")
        mine = self.arrays()
        if set(arrays) != set(mine) or rows_filled > self.rows:
            raise CheckpointError(
                f"replay buffer state does not fit this buffer: expected arrays "
                f"{sorted(mine)} with at most {self.rows} rows, got {sorted(arrays)} with "
                f"{rows_filled} rows"
            )
        for key, target in mine.items():
            if arrays[key].shape[1:] != target.shape[1:]:
                raise CheckpointError(
                    f"replay buffer state: {key} has shape {arrays[key].shape[1:]} per row, "
                    f"this buffer expects {target.shape[1:]}"
                )
        for key, target in mine.items():
            target[:rows_filled] = arrays[key]
        self.valid[rows_filled:] = False

    def save(
        self, path: str | Path, *, pos: int, rows_filled: int, rows_dropped: bool = False
    ) -> Path:
        """Write the first ``rows_filled`` rows to an ``.npz`` file (atomically; nothing is
        pickled); ``pos`` is the row the next write goes to, ``rows_dropped`` whether older
        rows were overwritten.

        Raises:
            CheckpointError: the file cannot be written (named, with the free space); a file
                already at ``path`` is left as it was.
        """
        path = Path(path)
        arrays: dict[str, Any] = {k: v[:rows_filled] for k, v in self.arrays().items()}
        arrays.update(
            format_version=np.array(FILE_FORMAT),
            pos=np.array(pos),
            rows_filled=np.array(rows_filled),
            rows_dropped=np.array(rows_dropped),
            num_envs=np.array(self.num_envs),
            observation_space=np.array(json.dumps(space_to_json(self.observation_space))),
            action_space=np.array(json.dumps(space_to_json(self.action_space))),
        )
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with open(tmp, "wb") as file:
                np.savez(file, **arrays)
                file.flush()
                os.fsync(file.fileno())
            tmp.replace(path)
        except OSError as error:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise write_error(CheckpointError, path, error) from error
        return path

    def load(self, path: str | Path) -> tuple[int, bool]:
        """Replace the contents with a file written by :meth:`save`, oldest row first.

        The file may come from a storage of another capacity (the newest rows that fit are
        kept) but must have the same spaces and ``num_envs``. Everything is checked before
        anything is replaced, so a refused file leaves the storage as it was. Returns the
        number of rows now filled (rows ``0 .. n-1``, in the order they were written) and
        whether rows older than those were dropped: overwritten before the file was saved
        (its ``rows_dropped``; a file without that entry tells it by a write position
        inside its rows), or left out now because they do not fit.

        Raises:
            CheckpointError: unreadable file, or spaces / num_envs that differ (named).
        """
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                contents = {key: data[key] for key in data.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:
            raise CheckpointError(f"{path}: not a readable replay buffer file ({err})") from err
        needed = {"format_version", "pos", "rows_filled", "num_envs", "observation_space"}
        if not needed <= set(contents):
            raise CheckpointError(
                f"{path}: not a replay buffer file (missing {sorted(needed - set(contents))})"
            )
        for label, mine in (
            ("observation", self.observation_space),
            ("action", self.action_space),
        ):
            try:
                theirs = space_from_json(json.loads(str(contents[f"{label}_space"])))
            except (EnvSpecError, ValueError, KeyError) as err:
                raise CheckpointError(f"{path}: unreadable {label} space ({err})") from err
            if not spaces_equal(theirs, mine):
                raise CheckpointError(
                    f"{path}: replay buffer holds {label}s of space {describe_space(theirs)}, "
                    f"but this buffer stores {describe_space(mine)}"
                )
        self.refuse_other_masks("action_masks" in contents, f"{path}: replay buffer file")
        num_envs = int(contents["num_envs"])
        if num_envs != self.num_envs:
            raise CheckpointError(
                f"{path}: replay buffer was written by {num_envs} envs, this buffer has "
                f"{self.num_envs}; use the same num_envs"
            )
        stored = int(contents["rows_filled"])
        pos = int(contents["pos"])
        for key, target in self.arrays().items():
            found = contents.get(key)
            if found is None or found.shape[1:] != target.shape[1:] or found.shape[0] < stored:
                raise CheckpointError(
                    f"{path}: replay buffer array {key!r} is missing or has the wrong shape "
                    f"(expected {stored} rows of {target.shape[1:]}, got "
                    f"{None if found is None else found.shape})"
                )
        # Chronological row order: a full buffer's oldest row is the one it would overwrite.
        order = np.concatenate([np.arange(pos, stored), np.arange(0, pos)])[-self.rows :]
        for key, target in self.arrays().items():
            target[: order.size] = contents[key][order]
        self.valid[order.size :] = False
        dropped = bool(contents["rows_dropped"]) if "rows_dropped" in contents else 0 < pos < stored
        return int(order.size), dropped or order.size < stored
