"""Durable checkpoint directories: atomic, fsynced writes, a manifest, verified reads.

A checkpoint is a directory of four files (format version 1)::

    step-000000001000/
      tensors.safetensors  every tensor of the state (see :mod:`rlfleet.checkpoint.codec`),
                           keyed by its path in the state, e.g. "optimizer/state/0/exp_avg"
      state.json           the state's structure (the "skeleton"), referring to tensors by key
      meta.json            {"format_version": 1, <metadata keys>...}
      manifest.json        {"files": {"<name>": {"sha256": "<hex>", "bytes": <size>}}}

Atomicity: a checkpoint is written into a sibling ``.tmp-<name>-<random>`` directory, every
file and the directory are fsynced, the manifest is written last, and only then is the
directory renamed to its final name (and the parent fsynced). A crash at any moment leaves
either no checkpoint or a complete one, plus perhaps a ``.tmp-*`` leftover that
:class:`~rlfleet.checkpoint.manager.CheckpointManager` removes. Loading verifies every file
against the manifest before reading it, and nothing is ever unpickled.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
from safetensors.torch import load as parse_safetensors  # parses the format; no pickle

from rlfleet.checkpoint.codec import (
    decode,
    decode_metadata,
    encode_metadata,
    flatten_state,
    json_bytes,
    parse_json,
    short,
)
from rlfleet.errors import CheckpointError

__all__ = [
    "FORMAT_VERSION",
    "load_checkpoint",
    "read_metadata",
    "save_checkpoint",
]

FORMAT_VERSION: int = 1

TENSORS_FILE = "tensors.safetensors"
STATE_FILE = "state.json"
META_FILE = "meta.json"
MANIFEST_FILE = "manifest.json"
_DATA_FILES = (TENSORS_FILE, STATE_FILE, META_FILE)
_CHUNK_BYTES = 1 << 20
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


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
    meta_bytes = json_bytes({"format_version": FORMAT_VERSION, **encode_metadata(metadata)})
    state_bytes = json_bytes(skeleton)
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        temp = directory.parent / f".tmp-{directory.name}-{secrets.token_hex(6)}"
        temp.mkdir()
    except OSError as error:
        raise CheckpointError(f"{directory}: cannot create the checkpoint ({error})") from error
    try:
        safetensors.torch.save_file(tensors, temp / TENSORS_FILE, metadata={"format": "pt"})
        fsync_file(temp / TENSORS_FILE)
        write_durably(temp / STATE_FILE, state_bytes)
        write_durably(temp / META_FILE, meta_bytes)
        files = {name: _describe_file(temp / name) for name in _DATA_FILES}
        # Last, so a directory with a manifest holds every file the manifest lists.
        write_durably(temp / MANIFEST_FILE, json_bytes({"files": files}))
        fsync_dir(temp)
        os.rename(temp, directory)
    except BaseException as error:
        shutil.rmtree(temp, ignore_errors=True)
        if isinstance(error, OSError):
            raise CheckpointError(f"{directory}: cannot save the checkpoint ({error})") from error
        raise
    fsync_dir(directory.parent)
    return directory


def write_durably(path: str | Path, data: bytes) -> None:
    """Create ``path`` (it must not exist) with ``data``, flushed and fsynced."""
    with open(path, "xb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def fsync_file(path: str | Path) -> None:
    """Flush a file written by another library to the disk."""
    with open(path, "rb") as file:
        os.fsync(file.fileno())


def fsync_dir(path: str | Path) -> None:
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
    skeleton = parse_json(state_path, contents[STATE_FILE])
    try:
        state = decode(skeleton, tensors, "state")
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
    """Check every file against the manifest; return the contents of the files in ``keep``.

    Raises:
        CheckpointError: a file is missing, truncated, modified or unreadable (named).
    """
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
            f"got {short(version)}"
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
    manifest = parse_json(path, path.read_bytes())
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


def _parse_metadata(path: Path, data: bytes) -> dict[str, Any]:
    meta = parse_json(path, data)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {short(meta)}")
    _check_format_version(path.parent, meta.get("format_version"))
    try:
        return decode_metadata(meta)
    except CheckpointError as error:
        raise CheckpointError(f"{path}: {error}") from error


def verification_error(directory: str | Path) -> str | None:
    """Why the checkpoint ``directory`` does not verify, or None if it does."""
    try:
        _read_verified(Path(directory), keep=())
    except CheckpointError as error:
        return str(error)
    return None
