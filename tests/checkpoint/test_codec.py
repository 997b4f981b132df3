"""Checkpoint codec: states split into tensors and a strict-JSON skeleton, and back."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch

from rlfleet.checkpoint.codec import (
    decode_metadata,
    encode_metadata,
    flatten_state,
    unflatten_state,
)
from rlfleet.errors import CheckpointError
from tests.checkpoint.states import assert_same, expected_after_load, make_state


def test_flatten_and_unflatten_in_memory() -> None:
    state = make_state()
    tensors, skeleton = flatten_state(state)
    text = json.dumps(skeleton, allow_nan=False)
    assert_same(unflatten_state(tensors, json.loads(text)), expected_after_load(state))


def test_skeleton_is_plain_json_where_the_data_is() -> None:
    tensors, skeleton = flatten_state(
        {"lr": 0.1, "model": {"fc.weight": torch.ones(2)}, "state": {3: torch.zeros(1)}}
    )
    assert skeleton == {
        "lr": 0.1,
        "model": {"fc.weight": {"$tensor": "model/fc.weight"}},
        "state": {"$dict": [[3, {"$tensor": "state/3"}]]},
    }
    assert set(tensors) == {"model/fc.weight", "state/3"}


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ({"a": [1, object()]}, r"state\['a'\]\[1\]: cannot store a object in a checkpoint"),
        ({"a": {1.5: 2}}, r"state\['a'\]: dict key 1\.5 of type float cannot be stored"),
        ({"a": {True: 2}}, r"dict key True of type bool cannot be stored"),
        ({"s": {1, 2}}, r"state\['s'\]: cannot store a set"),
        ({"c": torch.zeros(2, dtype=torch.complex128)}, r"state\['c'\]: safetensors cannot"),
        ({"o": np.array([None])}, r"state\['o'\]: cannot store a numpy array of dtype object"),
    ],
)
def test_unstorable_values_name_their_path(state: Any, expected: str) -> None:
    with pytest.raises(CheckpointError, match=expected):
        flatten_state(state)


def test_shared_storage_is_cloned_and_keys_stay_unique() -> None:
    shared = torch.arange(4.0)
    tensors, skeleton = flatten_state({"a/b": shared, "a": {"b": shared[1:]}})
    assert skeleton == {"a/b": {"$tensor": "a/b"}, "a": {"b": {"$tensor": "a/b~2"}}}
    assert tensors["a/b"].untyped_storage().data_ptr() != (
        tensors["a/b~2"].untyped_storage().data_ptr()
    )
    torch.testing.assert_close(tensors["a/b~2"], torch.arange(1.0, 4.0))


def test_large_ints_and_special_floats_are_tagged_and_come_back_exactly() -> None:
    state = {"big": 2**80, "edge": 2**53, "floats": [math.inf, -math.inf, math.nan], "t": (1,)}
    _, skeleton = flatten_state(state)
    assert skeleton["big"] == {"$int": format(2**80, "x")}
    assert skeleton["edge"] == 2**53
    assert skeleton["floats"][:2] == [{"$float": "inf"}, {"$float": "-inf"}]
    assert skeleton["t"] == {"$tuple": [1]}
    assert_same(unflatten_state({}, json.loads(json.dumps(skeleton))), state)


@pytest.mark.parametrize(
    ("skeleton", "expected"),
    [
        ({"$tensor": "missing"}, r"state: refers to tensor 'missing', which is not stored"),
        ({"$tuple": [], "x": 1}, r"state: expected an object with the single key '\$tuple'"),
        ({"$int": "zz"}, r"state: expected a hex integer, got 'zz'"),
        ({"$float": "big"}, r"state: unknown or malformed '\$float' entry"),
        ({"$dict": [[1.5, 0]]}, r"state: expected a str or int key, got 1\.5"),
        ({"$dict": [1]}, r"state: expected \[key, value\] pairs, got 1"),
    ],
)
def test_malformed_skeletons_are_refused_with_their_place(skeleton: Any, expected: str) -> None:
    with pytest.raises(CheckpointError, match=expected):
        unflatten_state({}, skeleton)


def test_metadata_round_trips_and_refuses_tensors_and_reserved_keys() -> None:
    metadata = {"best": -math.inf, "per_agent": {0: 1.5}, "betas": (0.9, 0.999)}
    encoded = encode_metadata(metadata)
    assert encoded["best"] == {"$float": "-inf"}
    assert_same(decode_metadata({"format_version": 1, **encoded}), metadata)
    with pytest.raises(CheckpointError, match=r"metadata holds tensors.* \(w\)"):
        encode_metadata({"w": torch.ones(1)})
    with pytest.raises(CheckpointError, match="key 'format_version' cannot be used"):
        encode_metadata({"format_version": 2})
