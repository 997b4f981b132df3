"""Atomic, checksummed checkpoints that never unpickle anything.

A checkpoint is a directory of four files (format version 1)::

    step-000000001000/
      tensors.safetensors  every torch.Tensor, numpy array and numpy scalar of the state,
                           keyed by its path in the state, e.g. "optimizer/state/0/exp_avg"
      state.json           the state's structure (the "skeleton"), referring to tensors by key
      meta.json            {"format_version": 1, <metadata keys>...}
      manifest.json        {"files": {"<name>": {"sha256": "<hex>", "bytes": <size>}}}

Both JSON files are strict JSON (no ``NaN``/``Infinity`` literals) and use one encoding,
which is plain JSON wherever the data already is plain JSON:

- ``null``, booleans, strings, finite floats and integers up to 2**53 in size are themselves;
- a dict whose keys are all strings, none starting with ``$``, is a JSON object;
- anything else is an object with a single ``$``-key:
  ``{"$float": "nan" | "inf" | "-inf"}``, ``{"$int": "<hex>"}`` (larger integers, such as a
  PCG64 state, so that any JSON reader keeps them exact), ``{"$tuple": [...]}``,
  ``{"$dict": [[key, value], ...]}`` (int keys, as in optimizer state dicts, or ``$`` keys),
  ``{"$tensor": key}``, ``{"$ndarray": key}`` and ``{"$npscalar": key}``.

Containers come back as plain ``dict``/``list``/``tuple`` (an ``OrderedDict`` state dict comes
back as a ``dict``, which ``load_state_dict`` accepts); tensors come back on the CPU.

Atomicity: a checkpoint is written into a sibling ``.tmp-<name>-<random>`` directory, every
file and the directory are fsynced, the manifest is written last, and only then is the
directory renamed to its final name (and the parent fsynced). A crash at any moment leaves
either no checkpoint or a complete one, plus perhaps a ``.tmp-*`` leftover that
:class:`CheckpointManager` removes. Loading verifies every file against the manifest before
reading it, and nothing is ever unpickled.

:class:`CheckpointManager` keeps a folder of them::

    root/
      latest.json          {"name": "step-000000001000"}, replaced atomically after each save
      step-000000000500/
      step-000000001000/
      step-000000001000-1/ the same step saved again
      .tmp-*               a save or deletion in progress, or one a crash interrupted
"""

from __future__ import annotations

import builtins
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import warnings
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.torch
import torch
from safetensors.torch import load as parse_safetensors  # parses the format; no pickle

from rlfleet.errors import CheckpointError, ConfigError

__all__ = [
    "FORMAT_VERSION",
    "CheckpointManager",
    "flatten_state",
    "load_checkpoint",
    "read_metadata",
    "save_checkpoint",
    "unflatten_state",
]

FORMAT_VERSION: int = 1

TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
META_FILE = "meta.json"
MANIFEST_FILE = "manifest.json"
LATEST_FILE = "latest.json"
_DATA_FILES = (TENSORS_FILE, STATE_FILE, META_FILE)

# Larger integers lose precision in JSON readers that parse numbers as doubles.
_MAX_PLAIN_INT = 2**53
_CHUNK_BYTES = 1 << 20
_STEP_NAME = re.compile(r"step-(\d+)(?:-(\d+))?")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# What safetensors stores; the unsigned and float8 types are missing from older torch.
_STORABLE_DTYPES = frozenset(
    getattr(torch, name)
    for name in (
        "bool",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
    )
    if hasattr(torch, name)
)
_SUPPORTED_TEXT = (
    "dict, list, tuple, torch.Tensor, numpy array or scalar, int, float, bool, str or None"
)


# --------------------------------------------------------------------------- state encoding


def flatten_state(obj: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """Split ``obj`` into its tensors and a strict-JSON skeleton that refers to them by key.

    Tensors are detached, made contiguous and cloned where they share storage with an earlier
    one, as safetensors requires. numpy arrays and scalars travel as tensors too and come
    back with their dtype. See the module docstring for the skeleton's encoding.

    Raises:
        CheckpointError: a value or dict key cannot be stored; the message names its path.
    """
    flattener = _Flattener("state")
    return flattener.tensors, flattener.encode(obj, ())


def unflatten_state(tensors: Mapping[str, torch.Tensor], skeleton: Any) -> Any:
    """Rebuild what :func:`flatten_state` split; the inverse of it.

    Raises:
        CheckpointError: the skeleton is malformed or refers to a tensor ``tensors`` lacks.
    """
    return _decode(skeleton, tensors, "state")


class _Flattener:
    """One pass over a state: collects tensors under unique keys, returns the skeleton."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.tensors: dict[str, torch.Tensor] = {}
        self._storages: set[tuple[torch.device, int]] = set()

    def encode(self, obj: Any, path: tuple[str | int, ...]) -> Any:
        if obj is None or isinstance(obj, bool | str):
            return obj
        if isinstance(obj, np.generic):
            return {"$npscalar": self._add_array(np.asarray(obj), path)}
        if isinstance(obj, int):
            return _encode_int(obj)
        if isinstance(obj, float):
            return float(obj) if math.isfinite(obj) else {"$float": str(obj)}
        if isinstance(obj, torch.Tensor):
            return {"$tensor": self._add_tensor(obj, path)}
        if isinstance(obj, np.ndarray):
            return {"$ndarray": self._add_array(obj, path)}
        if isinstance(obj, Mapping):
            return self._encode_mapping(obj, path)
        if isinstance(obj, list):
            return [self.encode(item, (*path, i)) for i, item in enumerate(obj)]
        if isinstance(obj, tuple):
            return {"$tuple": [self.encode(item, (*path, i)) for i, item in enumerate(obj)]}
        raise CheckpointError(
            f"{_render(self.root, path)}: cannot store a {type(obj).__qualname__} in a "
            f"checkpoint; expected {_SUPPORTED_TEXT}"
        )

    def _encode_mapping(self, obj: Mapping[Any, Any], path: tuple[str | int, ...]) -> Any:
        for key in obj:
            if isinstance(key, bool) or not isinstance(key, str | int):
                raise CheckpointError(
                    f"{_render(self.root, path)}: dict key {key!r} of type "
                    f"{type(key).__qualname__} cannot be stored; expected str or int keys"
                )
        if all(isinstance(key, str) and not key.startswith("$") for key in obj):
            return {key: self.encode(value, (*path, key)) for key, value in obj.items()}
        return {
            "$dict": [
                [_encode_int(key) if isinstance(key, int) else key, self.encode(v, (*path, key))]
                for key, v in obj.items()
            ]
        }

    def _add_array(self, array: np.ndarray[Any, Any], path: tuple[str | int, ...]) -> str:
        if not (array.flags.c_contiguous and array.flags.writeable):
            array = np.array(array, order="C", copy=True)
        try:
            tensor = torch.from_numpy(array)
        except (TypeError, ValueError) as error:
            raise CheckpointError(
                f"{_render(self.root, path)}: cannot store a numpy array of dtype "
                f"{array.dtype} ({error})"
            ) from error
        return self._add_tensor(tensor, path)

    def _add_tensor(self, tensor: torch.Tensor, path: tuple[str | int, ...]) -> str:
        if tensor.layout != torch.strided or tensor.dtype not in _STORABLE_DTYPES:
            raise CheckpointError(
                f"{_render(self.root, path)}: safetensors cannot store a {tensor.layout} "
                f"tensor of dtype {tensor.dtype}"
            )
        tensor = tensor.detach()
        storage = (tensor.device, tensor.untyped_storage().data_ptr())
        if storage in self._storages:
            # Tied weights or views of one buffer: safetensors refuses shared storage.
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        else:
            self._storages.add(storage)
            tensor = tensor.contiguous()
        base = "/".join(str(part) for part in path) or "tensor"
        key, n = base, 1
        while key in self.tensors:
            n += 1
            key = f"{base}~{n}"
        self.tensors[key] = tensor
        return key


def _encode_int(value: int) -> Any:
    value = int(value)
    return value if abs(value) <= _MAX_PLAIN_INT else {"$int": format(value, "x")}


def _render(root: str, path: tuple[str | int, ...]) -> str:
    return root + "".join(f"[{part!r}]" for part in path)


def _decode(node: Any, tensors: Mapping[str, torch.Tensor], where: str) -> Any:
    if node is None or isinstance(node, bool | str | int | float):
        return node
    if isinstance(node, list):
        return [_decode(item, tensors, f"{where}[{i}]") for i, item in enumerate(node)]
    if not isinstance(node, dict):
        raise CheckpointError(f"{where}: unexpected {type(node).__qualname__} in the skeleton")
    tags = [key for key in node if key.startswith("$")]
    if not tags:
        return {key: _decode(value, tensors, f"{where}[{key!r}]") for key, value in node.items()}
    if len(node) != 1:
        raise CheckpointError(
            f"{where}: expected an object with the single key {tags[0]!r}, got keys {list(node)}"
        )
    tag, value = tags[0], node[tags[0]]
    if tag in ("$tensor", "$ndarray", "$npscalar"):
        if not isinstance(value, str) or value not in tensors:
            raise CheckpointError(f"{where}: refers to tensor {value!r}, which is not stored")
        tensor = tensors[value]
        if tag == "$tensor":
            return tensor
        try:
            array = tensor.numpy()
        except TypeError as error:
            raise CheckpointError(f"{where}: tensor {value!r} is not a numpy array") from error
        return array if tag == "$ndarray" else array[()]
    if tag == "$float" and value in ("nan", "inf", "-inf"):
        return float(value)
    if tag == "$int" and isinstance(value, str):
        return _decode_hex_int(value, where)
    if tag == "$tuple" and isinstance(value, list):
        return tuple(_decode(item, tensors, f"{where}[{i}]") for i, item in enumerate(value))
    if tag == "$dict" and isinstance(value, list):
        return _decode_pairs(value, tensors, where)
    raise CheckpointError(f"{where}: unknown or malformed {tag!r} entry: {_short(value)}")


def _decode_hex_int(value: str, where: str) -> int:
    try:
        return int(value, 16)
    except ValueError as error:
        raise CheckpointError(f"{where}: expected a hex integer, got {value!r}") from error


def _decode_pairs(pairs: list[Any], tensors: Mapping[str, torch.Tensor], where: str) -> Any:
    result: dict[str | int, Any] = {}
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise CheckpointError(f"{where}: expected [key, value] pairs, got {_short(pair)}")
        key = pair[0]
        if isinstance(key, dict) and set(key) == {"$int"} and isinstance(key["$int"], str):
            key = _decode_hex_int(key["$int"], where)
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise CheckpointError(f"{where}: expected a str or int key, got {_short(key)}")
        result[key] = _decode(pair[1], tensors, f"{where}[{key!r}]")
    return result


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# --------------------------------------------------------------------------- saving


def save_checkpoint(
    directory: str | Path, state: Mapping[str, Any], metadata: Mapping[str, Any]
) -> Path:
    """Write ``state`` and ``metadata`` atomically as the checkpoint ``directory``.

    ``metadata`` is small JSON-like data (config, counters, spaces as JSON, scores); it uses
    the state's encoding, so ``-inf``, tuples and int keys survive, but it may hold no tensors.

    Raises:
        CheckpointError: ``directory`` exists already, a value cannot be stored, or writing
            failed (the temp directory is removed; nothing appears under ``directory``).
    """
    directory = Path(directory)
    if os.path.lexists(directory):
        raise CheckpointError(f"{directory}: already exists; a checkpoint is never overwritten")
    tensors, skeleton = flatten_state(state)
    meta_bytes = _json_bytes(_encode_metadata(metadata))
    state_bytes = _json_bytes(skeleton)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        temp = directory.parent / f".tmp-{directory.name}-{secrets.token_hex(6)}"
        temp.mkdir()
    except OSError as error:
        raise CheckpointError(f"{directory}: cannot create the checkpoint ({error})") from error
    try:
        safetensors.torch.save_file(tensors, temp / TENSORS_FILE, metadata={"format": "pt"})
        _fsync_file(temp / TENSORS_FILE)
        _write_durably(temp / STATE_FILE, state_bytes)
        _write_durably(temp / META_FILE, meta_bytes)
        files = {name: _describe_file(temp / name) for name in _DATA_FILES}
        # Last, so a directory with a manifest holds every file the manifest lists.
        _write_durably(temp / MANIFEST_FILE, _json_bytes({"files": files}))
        _fsync_dir(temp)
        os.rename(temp, directory)
    except BaseException as error:
        shutil.rmtree(temp, ignore_errors=True)
        if isinstance(error, OSError):
            raise CheckpointError(f"{directory}: cannot save the checkpoint ({error})") from error
        raise
    _fsync_dir(directory.parent)
    return directory


def _encode_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    flattener = _Flattener("metadata")
    encoded: dict[str, Any] = {"format_version": FORMAT_VERSION}
    for key, value in metadata.items():
        if not isinstance(key, str) or key == "format_version":
            raise CheckpointError(
                f"metadata: key {key!r} cannot be used; expected str keys other than "
                "'format_version', which the checkpoint sets itself"
            )
        encoded[key] = flattener.encode(value, (key,))
    if flattener.tensors:
        raise CheckpointError(
            f"metadata holds tensors, arrays or numpy scalars ({', '.join(flattener.tensors)}); "
            "put them in the state instead"
        )
    return encoded


def _json_bytes(data: Any) -> bytes:
    return json.dumps(data, allow_nan=False, indent=1).encode("utf-8") + b"\n"


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "xb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def _fsync_dir(path: Path) -> None:
    """Make a rename or new entry in ``path`` durable; a file's own fsync does not."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _describe_file(path: Path) -> dict[str, Any]:
    digest, size, _ = _hash_file(path, keep=False)
    return {"sha256": digest, "bytes": size}


def _hash_file(path: Path, keep: bool) -> tuple[str, int, bytes | None]:
    """sha256 and size of ``path``, plus its contents if ``keep`` (read once, not twice)."""
    sha = hashlib.sha256()
    chunks: builtins.list[bytes] = []
    size = 0
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK_BYTES):
            sha.update(chunk)
            size += len(chunk)
            if keep:
                chunks.append(chunk)
    return sha.hexdigest(), size, b"".join(chunks) if keep else None


# --------------------------------------------------------------------------- loading


def load_checkpoint(directory: str | Path) -> tuple[Any, dict[str, Any]]:
    """Verify and read the checkpoint ``directory``; returns ``(state, metadata)``.

    The metadata is what was saved, without the ``format_version`` the checkpoint adds.

    Raises:
        CheckpointError: the directory is missing, incomplete, truncated, modified, written by
            a newer rlfleet, or unreadable; the one-line message names the file.
    """
    directory = Path(directory)
    contents = _read_verified(directory, keep=_DATA_FILES)
    metadata = _parse_metadata(directory / META_FILE, contents[META_FILE])
    tensors_path = directory / TENSORS_FILE
    try:
        tensors = parse_safetensors(contents[TENSORS_FILE])
    except (safetensors.SafetensorError, ValueError, KeyError, RuntimeError) as error:
        reason = " ".join(str(error).split())
        raise CheckpointError(f"{tensors_path}: not a valid safetensors file ({reason})") from error
    state_path = directory / STATE_FILE
    skeleton = _parse_json(state_path, contents[STATE_FILE])
    try:
        state = _decode(skeleton, tensors, "state")
    except CheckpointError as error:
        raise CheckpointError(f"{state_path}: {error}") from error
    return state, metadata


def read_metadata(directory: str | Path) -> dict[str, Any]:
    """The metadata of the checkpoint ``directory``, after verifying every file's checksum.

    Tensors are hashed but not loaded. Raises :class:`CheckpointError` as
    :func:`load_checkpoint` does.
    """
    directory = Path(directory)
    contents = _read_verified(directory, keep=(META_FILE,))
    return _parse_metadata(directory / META_FILE, contents[META_FILE])


def _read_verified(directory: Path, keep: Collection[str]) -> dict[str, bytes]:
    """Check every file against the manifest; return the contents of the files in ``keep``."""
    try:
        if not directory.exists():
            raise CheckpointError(f"{directory}: no such checkpoint directory")
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: is a file, not a checkpoint directory")
        _refuse_newer_format(directory / META_FILE)
        files = _read_manifest(directory)
        contents: dict[str, bytes] = {}
        for name, expected in files.items():
            path = directory / name
            if not path.is_file():
                raise CheckpointError(f"{path}: missing, though {MANIFEST_FILE} lists it")
            # A size check first spares hashing a truncated file.
            size = path.stat().st_size
            if size != expected["bytes"]:
                raise CheckpointError(
                    f"{path}: size mismatch ({size} bytes, the manifest says "
                    f"{expected['bytes']}) — the checkpoint is truncated or was modified"
                )
            digest, _, data = _hash_file(path, keep=name in keep)
            if digest != expected["sha256"]:
                raise CheckpointError(
                    f"{path}: checksum mismatch — the checkpoint is truncated or was modified"
                )
            if data is not None:
                contents[name] = data
        return contents
    except OSError as error:
        where = error.filename if error.filename is not None else directory
        raise CheckpointError(f"{where}: cannot read ({error.strerror or error})") from error


def _refuse_newer_format(meta_path: Path) -> None:
    """Name a newer format before anything else: its files may not verify the way ours do."""
    try:
        version = json.loads(meta_path.read_bytes()).get("format_version")
    except (OSError, ValueError, AttributeError):
        return  # verification reports the actual problem
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        _check_format_version(meta_path.parent, version)


def _check_format_version(directory: Path, version: Any) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(
            f"{directory / META_FILE}: expected a positive integer format_version, "
            f"got {_short(version)}"
        )
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{directory}: written by a newer rlfleet (format {version}); "
            f"this version reads formats up to {FORMAT_VERSION}"
        )


def _read_manifest(directory: Path) -> dict[str, dict[str, Any]]:
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{path}: missing — not a complete checkpoint (it is written last when saving)"
        )
    manifest = _parse_json(path, path.read_bytes())
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(name, str)
        and "/" not in name
        and name not in ("", ".", "..")
        and isinstance(entry, dict)
        and isinstance(entry.get("sha256"), str)
        and _SHA256_HEX.fullmatch(entry["sha256"])
        and isinstance(entry.get("bytes"), int)
        for name, entry in files.items()
    ):
        raise CheckpointError(
            f'{path}: malformed; expected {{"files": {{name: {{"sha256": hex, "bytes": int}}}}}}'
        )
    for name in _DATA_FILES:
        if name not in files:
            raise CheckpointError(f"{path}: does not list {name}")
    return files


def _parse_json(path: Path, data: bytes) -> Any:
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except ValueError as error:
        raise CheckpointError(f"{path}: not valid JSON ({error})") from error


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")


def _parse_metadata(path: Path, data: bytes) -> dict[str, Any]:
    meta = _parse_json(path, data)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {_short(meta)}")
    _check_format_version(path.parent, meta.get("format_version"))
    try:
        return {
            key: _decode(value, {}, f"metadata[{key!r}]")
            for key, value in meta.items()
            if key != "format_version"
        }
    except CheckpointError as error:
        raise CheckpointError(f"{path}: {error}") from error


# --------------------------------------------------------------------------- manager


class CheckpointManager:
    """A folder of step-numbered checkpoints with an atomic `latest` pointer.

    One process writes to a root at a time: construction removes every ``.tmp-*`` entry,
    which would include another writer's save in progress.
    """

    def __init__(
        self, root: str | Path, keep: int | None = None, *, readonly: bool = False
    ) -> None:
        """Open (creating it if needed) ``root``; keep at most ``keep`` checkpoints, or all.

        Removes the ``.tmp-*`` leftovers of a save or deletion a crash interrupted. With
        ``readonly`` nothing on disk is touched (for readers such as ``eval``, which may run
        while a trainer writes to the same folder) and :meth:`save` is refused.
        """
        self.readonly = readonly
        if readonly:
            self.root = Path(root)
            self.keep = None
            return
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ConfigError(f"keep: expected None (keep all) or an integer >= 1, got {keep!r}")
        self.root = Path(root)
        self.keep = keep
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for leftover in self.root.glob(".tmp-*"):
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink()
        except OSError as error:
            raise CheckpointError(f"{self.root}: cannot prepare the folder ({error})") from error

    def save(self, state: Mapping[str, Any], metadata: Mapping[str, Any], step: int) -> Path:
        """Save as ``step-<step>`` (``-1``, ``-2``, ... if taken), point `latest` at it, rotate.

        Returns the new checkpoint's directory. Checkpoints beyond ``keep`` are deleted oldest
        first, never the one just saved.
        """
        if self.readonly:
            raise CheckpointError(f"{self.root}: opened read-only, cannot save")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"step: expected an integer >= 0, got {step!r}")
        base = f"step-{step:012d}"
        name, suffix = base, 0
        while os.path.lexists(self.root / name):
            suffix += 1
            name = f"{base}-{suffix}"
        path = save_checkpoint(self.root / name, state, metadata)
        self._point_latest_to(name)
        self._rotate(protected=name)
        return path

    def latest(self) -> Path | None:
        """The checkpoint `latest.json` names if it verifies, else the newest one that does.

        Falling back warns (``RuntimeWarning``): it means a checkpoint is gone or damaged.
        ``None`` if no checkpoint verifies.
        """
        return self._resolve_latest()[0]

    def load_latest(self) -> tuple[Any, dict[str, Any]]:
        """``(state, metadata)`` of :meth:`latest`; CheckpointError if there is none."""
        path, problem = self._resolve_latest()
        if path is None:
            detail = f" ({problem})" if problem is not None else ""
            raise CheckpointError(f"{self.root}: no checkpoint found{detail}")
        return load_checkpoint(path)

    def _resolve_latest(self) -> tuple[Path | None, str | None]:
        path, problem = self._find_latest()
        if path is not None and problem is not None:
            warnings.warn(f"{problem}; using {path} instead", RuntimeWarning, stacklevel=3)
        return path, problem

    def _find_latest(self) -> tuple[Path | None, str | None]:
        """(the checkpoint to resume from, or None; why a preferred one was passed over)."""
        named, problem = self._read_pointer()
        candidates = [self.root / named] if named is not None else []
        candidates += [path for path in reversed(self.list()) if path.name != named]
        for path in candidates:
            error = _verification_error(path)
            if error is None:
                return path, problem
            if problem is None:
                pointed = f"{LATEST_FILE} names {named}, but " if path.name == named else ""
                problem = f"{pointed}{error}"
        return None, problem

    def list(self) -> builtins.list[Path]:
        """Complete checkpoints (step directories with a manifest), oldest step first."""
        found = []
        if not self.root.is_dir():
            return []
        for entry in self.root.iterdir():
            match = _STEP_NAME.fullmatch(entry.name)
            if match and entry.is_dir() and (entry / MANIFEST_FILE).is_file():
                found.append((int(match[1]), int(match[2] or 0), entry))
        return [entry for _, _, entry in sorted(found)]

    def _read_pointer(self) -> tuple[str | None, str | None]:
        """(name latest.json holds, or None; why it could not be used, or None)."""
        path = self.root / LATEST_FILE
        try:
            pointer = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError) as error:
            return None, f"{path}: unreadable ({error})"
        name = pointer.get("name") if isinstance(pointer, dict) else None
        if not isinstance(name, str) or not _STEP_NAME.fullmatch(name):
            return None, f"{path}: does not name a step checkpoint: {_short(pointer)}"
        return name, None

    def _point_latest_to(self, name: str) -> None:
        temp = self.root / f".tmp-{LATEST_FILE}-{secrets.token_hex(6)}"
        try:
            _write_durably(temp, _json_bytes({"name": name}))
            os.replace(temp, self.root / LATEST_FILE)
            _fsync_dir(self.root)
        except OSError as error:
            temp.unlink(missing_ok=True)
            raise CheckpointError(f"{self.root / LATEST_FILE}: cannot update ({error})") from error

    def _rotate(self, protected: str) -> None:
        if self.keep is None:
            return
        checkpoints = self.list()
        excess = len(checkpoints) - self.keep
        for path in checkpoints:
            if excess <= 0:
                break
            if path.name != protected:
                self._delete(path)
                excess -= 1

    def _delete(self, path: Path) -> None:
        # Renamed first, so a crash midway leaves a .tmp-* leftover, not a half checkpoint.
        doomed = self.root / f".tmp-delete-{path.name}-{secrets.token_hex(6)}"
        try:
            os.rename(path, doomed)
            _fsync_dir(self.root)
            shutil.rmtree(doomed)
        except OSError as error:
            raise CheckpointError(f"{path}: cannot delete an old checkpoint ({error})") from error


def _verification_error(directory: Path) -> str | None:
    try:
        _read_verified(directory, keep=())
    except CheckpointError as error:
        return str(error)
    return None
