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
:class:`~rlfleet.checkpoint.manager.CheckpointManager` removes. Each file written and the
rename are write boundaries (:func:`rlfleet.errors.write_boundary`), where tests kill the
process or fail the write; a failed write is a :class:`CheckpointError` naming the directory,
the cause and the free space.

Loading reads the manifest first and trusts nothing else before it verifies: each file must be
a regular file (no symbolic link, FIFO or device), is read only up to the size the manifest
lists, and is parsed only once its sha256 matches; JSON is depth-bounded and checked against
the models of :mod:`rlfleet.checkpoint.schema`. Nothing is ever unpickled.
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
from pydantic import BaseModel, ValidationError
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
from rlfleet.checkpoint.schema import CheckpointMeta, Manifest, ManifestEntry, validate_part
from rlfleet.errors import CheckpointError, file_kind, write_boundary, write_error

__all__ = [
    "FORMAT_VERSION",
    "NewerFormatError",
    "load_checkpoint",
    "read_bounded",
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
# A manifest lists three files in about 400 bytes.
_MAX_MANIFEST_BYTES = 1 << 16
# meta.json is read before the manifest vouches for it only to name a newer format.
_MAX_UNVERIFIED_META_BYTES = 1 << 20


def save_checkpoint(
    directory: str | Path, state: Mapping[str, Any], metadata: Mapping[str, Any]
) -> Path:
    """Write ``state`` and ``metadata`` atomically as the checkpoint ``directory``.

    ``metadata`` is small JSON-like data (config, counters, spaces as JSON, scores); it uses
    the state's encoding, so ``-inf``, tuples and int keys survive, but it may hold no tensors.

    Raises:
        CheckpointError: ``directory`` exists already, a value cannot be stored, or writing
            failed (the temp directory is removed; nothing appears under ``directory``; the
            message names the cause and the free space, e.g. a full disk).
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
        raise write_error(CheckpointError, directory, error, "create the checkpoint") from error
    try:
        safetensors.torch.save_file(tensors, temp / TENSORS_FILE, metadata={"format": "pt"})
        fsync_file(temp / TENSORS_FILE)
        write_boundary("checkpoint.tensors_written", temp / TENSORS_FILE)
        write_durably(temp / STATE_FILE, state_bytes)
        write_boundary("checkpoint.state_written", temp / STATE_FILE)
        write_durably(temp / META_FILE, meta_bytes)
        write_boundary("checkpoint.meta_written", temp / META_FILE)
        files = {name: _describe_file(temp / name) for name in _DATA_FILES}
        # Last, so a directory with a manifest holds every file the manifest lists.
        write_durably(temp / MANIFEST_FILE, json_bytes({"files": files}))
        fsync_dir(temp)
        write_boundary("checkpoint.manifest_written", temp / MANIFEST_FILE)
        os.rename(temp, directory)
        fsync_dir(directory.parent)
    except BaseException as error:
        shutil.rmtree(temp, ignore_errors=True)
        if isinstance(error, OSError | safetensors.SafetensorError):
            raise write_error(CheckpointError, directory, error, "save the checkpoint") from error
        raise
    write_boundary("checkpoint.renamed", directory)
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
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK_BYTES):
            sha.update(chunk)
            size += len(chunk)
    return {"sha256": sha.hexdigest(), "bytes": size}


# --------------------------------------------------------------------------- loading


class NewerFormatError(CheckpointError):
    """The checkpoint was written by a newer rlfleet, in a format this version cannot read."""


def load_checkpoint(
    directory: str | Path,
    *,
    state_schema: type[BaseModel] | None = None,
    metadata_schema: type[BaseModel] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Verify and read the checkpoint ``directory``; returns ``(state, metadata)``.

    The metadata is what was saved, without the ``format_version`` the checkpoint adds.
    ``state_schema`` and ``metadata_schema`` (models of :mod:`rlfleet.checkpoint.schema`)
    check the decoded state and metadata, so that a missing or mistyped key is refused here,
    named with its file, rather than failing wherever it is first used.

    Raises:
        CheckpointError: the directory is missing, incomplete, truncated, modified, written by
            a newer rlfleet (:class:`NewerFormatError`), crafted (a symbolic link, a FIFO or
            device, JSON nested too deeply) or unreadable, or its state or metadata do not fit
            the schemas; the one-line message names the file.
    """
    directory = Path(directory)
    contents = _read_verified(directory, keep=_DATA_FILES)
    meta_path = directory / META_FILE
    metadata = _parse_metadata(meta_path, contents[META_FILE])
    if metadata_schema is not None:
        validate_part(metadata_schema, metadata, str(meta_path))
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
    if state_schema is not None:
        validate_part(state_schema, state, str(state_path))
    return state, metadata


def read_metadata(directory: str | Path) -> dict[str, Any]:
    """The metadata of the checkpoint ``directory``, after verifying every file's checksum.

    Tensors are hashed but not loaded. Raises :class:`CheckpointError` as
    :func:`load_checkpoint` does.
    """
    directory = Path(directory)
    contents = _read_verified(directory, keep=(META_FILE,))
    return _parse_metadata(directory / META_FILE, contents[META_FILE])


def read_bounded(path: str | Path, limit: int) -> bytes:
    """The contents of the regular file ``path``, which may hold at most ``limit`` bytes.

    Raises:
        CheckpointError: ``path`` is a symbolic link, not a regular file (a FIFO, a device, a
            directory) or larger than ``limit``.
        OSError: it cannot be read (FileNotFoundError: it does not exist).
    """
    path = Path(path)
    size, _, data = _read_regular(path, limit, keep=True)
    if data is None:
        raise CheckpointError(f"{path}: {size} bytes, more than the {limit} such a file may hold")
    return data


def _read_regular(path: Path, limit: int, keep: bool) -> tuple[int, str, bytes | None]:
    """(size, sha256, contents, or ``b""`` unless ``keep``) of the regular file ``path``;
    the contents are None, and the sha256 empty, when it holds more than ``limit`` bytes.

    A symbolic link is refused outright (a checkpoint never holds one, and following it could
    lead anywhere: ``/dev/zero``, a FIFO, another user's file). The file is opened
    non-blocking, so a FIFO swapped in after the first check cannot block the open, and is
    checked again through its descriptor before a byte is read. At most ``limit + 1`` bytes
    are read, so a file that grows while it is read cannot exhaust memory.
    """
    _check_regular(path, os.lstat(path).st_mode)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        if error.errno == errno.ELOOP:  # replaced by a link since the check
            _check_regular(path, stat.S_IFLNK)
        raise
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        _check_regular(path, info.st_mode)
        if info.st_size > limit:
            return info.st_size, "", None
        sha = hashlib.sha256()
        chunks: builtins.list[bytes] = []
        size = 0
        while size <= limit and (chunk := file.read(min(_CHUNK_BYTES, limit + 1 - size))):
            sha.update(chunk)
            size += len(chunk)
            if keep:
                chunks.append(chunk)
    if size > limit:
        return size, "", None
    return size, sha.hexdigest(), b"".join(chunks) if keep else b""


def _check_regular(path: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISLNK(mode):
        raise CheckpointError(
            f"{path}: is a symbolic link; a checkpoint is read only from regular files"
        )
    raise CheckpointError(f"{path}: is a {file_kind(mode)}, not a regular file")


def _read_verified(directory: Path, keep: Collection[str]) -> dict[str, bytes]:
    """Check every file against the manifest, which is read first; return the contents of
    the files in ``keep``. ``meta.json`` is checked right after the manifest, so that a newer
    format is named before anything else.

    Raises:
        CheckpointError: a file is missing, truncated, modified, not a regular file or
            unreadable (named); NewerFormatError: a newer rlfleet wrote the checkpoint.
    """
    try:
        if not directory.exists():
            raise CheckpointError(f"{directory}: no such checkpoint directory")
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: is a file, not a checkpoint directory")
        files = _read_manifest(directory)
        contents: dict[str, bytes] = {}
        for name in sorted(files, key=lambda name: name != META_FILE):
            path = directory / name
            expected = files[name]
            try:
                size, digest, data = _read_regular(
                    path, expected.bytes, keep=name in keep or name == META_FILE
                )
            except FileNotFoundError:
                raise CheckpointError(f"{path}: missing, though {MANIFEST_FILE} lists it") from None
            if data is None or size != expected.bytes:
                raise CheckpointError(
                    f"{path}: size mismatch ({size} bytes, the manifest says "
                    f"{expected.bytes}) — the checkpoint is truncated or was modified"
                )
            if digest != expected.sha256:
                raise CheckpointError(
                    f"{path}: checksum mismatch — the checkpoint is truncated or was modified"
                )
            if name == META_FILE:
                _refuse_newer_format(path, data)
            if name in keep:
                contents[name] = data
        return contents
    except OSError as error:
        where = error.filename if error.filename is not None else directory
        raise CheckpointError(f"{where}: cannot read ({error.strerror or error})") from error


def _read_manifest(directory: Path) -> dict[str, ManifestEntry]:
    path = directory / MANIFEST_FILE
    try:
        data = read_bounded(path, _MAX_MANIFEST_BYTES)
        files = _parse_manifest(path, data)
    except FileNotFoundError:
        _refuse_newer_format_if_readable(directory / META_FILE)
        raise CheckpointError(
            f"{path}: missing — not a complete checkpoint (it is written last when saving)"
        ) from None
    except CheckpointError:
        # A newer format may lay its manifest out differently: say so rather than "malformed".
        _refuse_newer_format_if_readable(directory / META_FILE)
        raise
    return files


def _parse_manifest(path: Path, data: bytes) -> dict[str, ManifestEntry]:
    manifest = parse_json(path, data)
    expected = '{"files": {name: {"sha256": hex, "bytes": int}}}'
    try:
        files = Manifest.model_validate(manifest).files
    except ValidationError as error:
        raise CheckpointError(f"{path}: malformed; expected {expected}") from error
    for name in files:
        if "/" in name or "\\" in name or name in ("", ".", ".."):
            raise CheckpointError(
                f"{path}: malformed; {short(name)} is not a file name inside the checkpoint"
            )
    for name in _DATA_FILES:
        if name not in files:
            raise CheckpointError(f"{path}: does not list {name}")
    return files


def _refuse_newer_format_if_readable(meta_path: Path) -> None:
    """Name a newer format when the manifest cannot be used; say nothing if ``meta.json``
    cannot tell (the manifest's own problem is reported instead)."""
    try:
        data = read_bounded(meta_path, _MAX_UNVERIFIED_META_BYTES)
        _refuse_newer_format(meta_path, data)
    except NewerFormatError:
        raise
    except (OSError, CheckpointError):
        return


def _refuse_newer_format(meta_path: Path, data: bytes) -> None:
    meta = parse_json(meta_path, data)
    version = meta.get("format_version") if isinstance(meta, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise NewerFormatError(
            f"{meta_path.parent}: written by a newer rlfleet (format {version}); "
            f"this version reads formats up to {FORMAT_VERSION}"
        )


def _parse_metadata(path: Path, data: bytes) -> dict[str, Any]:
    meta = parse_json(path, data)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {short(meta)}")
    _refuse_newer_format(path, data)
    validate_part(CheckpointMeta, meta, str(path))
    try:
        return decode_metadata(meta)
    except CheckpointError as error:
        raise CheckpointError(f"{path}: {error}") from error


def verification_error(directory: str | Path) -> str | None:
    """Why the checkpoint ``directory`` does not verify, or None if it does.

    Raises:
        NewerFormatError: a newer rlfleet wrote it; that is no damage to pass over.
    """
    try:
        _read_verified(Path(directory), keep=())
    except NewerFormatError:
        raise
    except CheckpointError as error:
        return str(error)
    return None
