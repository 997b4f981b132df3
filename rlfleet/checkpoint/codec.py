"""Checkpoint codec: any training state <-> tensors plus a strict-JSON skeleton.

A state (nested dicts, lists and tuples of tensors, numpy arrays and scalars, ints, floats,
bools, strings and None: what ``state_dict()`` methods, optimizers and RNGs return) is split
into its tensors, which :mod:`rlfleet.checkpoint.durable` stores with safetensors, and a
skeleton that refers to them by key. The skeleton is strict JSON (no ``NaN``/``Infinity``
literals) in one encoding, plain JSON wherever the data already is plain JSON:

- ``null``, booleans, strings, finite floats and integers up to 2**53 in size are themselves;
- a dict whose keys are all strings, none starting with ``$``, is a JSON object;
- anything else is an object with a single ``$``-key:
  ``{"$float": "nan" | "inf" | "-inf"}``, ``{"$int": "<hex>"}`` (larger integers, such as a
  PCG64 state, so that any JSON reader keeps them exact), ``{"$tuple": [...]}``,
  ``{"$dict": [[key, value], ...]}`` (int keys, as in optimizer state dicts, or ``$`` keys),
  ``{"$tensor": key}``, ``{"$ndarray": key}`` and ``{"$npscalar": key}``.

Containers come back as plain ``dict``/``list``/``tuple`` (an ``OrderedDict`` state dict comes
back as a ``dict``, which ``load_state_dict`` accepts); tensors come back on the CPU. Checkpoint
metadata uses the same encoding, without tensors.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlfleet.checkpoint.schema import json_depth_error
from rlfleet.errors import CheckpointError

__all__ = [
    "decode",
    "decode_metadata",
    "encode_metadata",
    "flatten_state",
    "json_bytes",
    "parse_json",
    "unflatten_state",
]

# Larger integers lose precision in JSON readers that parse numbers as doubles.
_MAX_PLAIN_INT = 2**53
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
    return decode(skeleton, tensors, "state")


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


def decode(node: Any, tensors: Mapping[str, torch.Tensor], where: str) -> Any:
    """Rebuild the skeleton ``node`` (found at ``where``) with the tensors it refers to."""
    if node is None or isinstance(node, bool | str | int | float):
        return node
    if isinstance(node, list):
        return [decode(item, tensors, f"{where}[{i}]") for i, item in enumerate(node)]
    if not isinstance(node, dict):
        raise CheckpointError(f"{where}: unexpected {type(node).__qualname__} in the skeleton")
    tags = [key for key in node if key.startswith("$")]
    if not tags:
        return {key: decode(value, tensors, f"{where}[{key!r}]") for key, value in node.items()}
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
        return tuple(decode(item, tensors, f"{where}[{i}]") for i, item in enumerate(value))
    if tag == "$dict" and isinstance(value, list):
        return _decode_pairs(value, tensors, where)
    raise CheckpointError(f"{where}: unknown or malformed {tag!r} entry: {short(value)}")


def _decode_hex_int(value: str, where: str) -> int:
    try:
        return int(value, 16)
    except ValueError as error:
        raise CheckpointError(f"{where}: expected a hex integer, got {value!r}") from error


def _decode_pairs(pairs: list[Any], tensors: Mapping[str, torch.Tensor], where: str) -> Any:
    result: dict[str | int, Any] = {}
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise CheckpointError(f"{where}: expected [key, value] pairs, got {short(pair)}")
        key = pair[0]
        if isinstance(key, dict) and set(key) == {"$int"} and isinstance(key["$int"], str):
            key = _decode_hex_int(key["$int"], where)
        if isinstance(key, bool) or not isinstance(key, str | int):
            raise CheckpointError(f"{where}: expected a str or int key, got {short(key)}")
        result[key] = decode(pair[1], tensors, f"{where}[{key!r}]")
    return result


def short(value: Any) -> str:
    """``repr(value)``, cut to 80 characters for one-line error messages."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def encode_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` in the state's encoding; it may hold no tensors.

    Raises:
        CheckpointError: a key other than a str, the reserved ``format_version`` key (the
            checkpoint sets it itself), a value that cannot be stored, or a tensor.
    """
    flattener = _Flattener("metadata")
    encoded: dict[str, Any] = {}
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


def decode_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`encode_metadata` encoded, less the ``format_version`` key."""
    return {
        key: decode(value, {}, f"metadata[{key!r}]")
        for key, value in meta.items()
        if key != "format_version"
    }


def json_bytes(data: Any) -> bytes:
    """``data`` as strict JSON (no ``NaN``/``Infinity`` literals), UTF-8, one key per line."""
    return json.dumps(data, allow_nan=False, indent=1).encode("utf-8") + b"\n"


def parse_json(path: str | Path, data: bytes) -> Any:
    """Strict JSON of the file ``path`` (a ``NaN``/``Infinity`` literal is refused), nested
    at most :data:`~rlfleet.checkpoint.schema.MAX_JSON_DEPTH` levels deep.

    Raises:
        CheckpointError: not valid strict JSON, or nested too deeply; the message names
            ``path``.
    """
    too_deep = json_depth_error(data)
    if too_deep is not None:
        raise CheckpointError(f"{path}: not a checkpoint file: {too_deep}")
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:
        reason = "nested too deeply" if isinstance(error, RecursionError) else error
        raise CheckpointError(f"{path}: not valid JSON ({reason})") from error


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")
