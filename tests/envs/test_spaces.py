"""Spaces survive a trip through strict JSON exactly, and bad input gets a precise error."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

from rlfleet.envs.spaces import (
    describe_space,
    space_from_json,
    space_mismatch,
    space_to_json,
    spaces_equal,
)
from rlfleet.errors import EnvSpecError

SPACES: dict[str, spaces.Space[Any]] = {
    "box": spaces.Box(-1.0, 1.0, (4,), np.float32),
    "box-inf": spaces.Box(
        low=np.array([-np.inf, 0.0, -2.5], dtype=np.float32),
        high=np.array([np.inf, np.inf, 3.25], dtype=np.float32),
    ),
    "box-image": spaces.Box(0, 255, (3, 4, 2), np.uint8),
    "box-int64-extremes": spaces.Box(
        np.iinfo(np.int64).min, np.iinfo(np.int64).max - 1, (2,), np.int64
    ),
    "box-float64-scalar": spaces.Box(-0.1, 1e300, (), np.float64),
    "box-bool": spaces.Box(0, 1, (2, 2), bool),
    "discrete": spaces.Discrete(2),
    "discrete-start": spaces.Discrete(5, start=-2),
    "discrete-int32": spaces.Discrete(3, dtype=np.int32),
    "multi-discrete": spaces.MultiDiscrete([3, 4], start=[1, -1]),
    "multi-discrete-2d": spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), dtype=np.int32),
    "multi-binary": spaces.MultiBinary(4),
    "multi-binary-2d": spaces.MultiBinary([2, 3]),
    "tuple": spaces.Tuple([spaces.Discrete(2), spaces.Box(0.0, 1.0, (2,))]),
    "dict-nested": spaces.Dict(
        [
            ("zeta", spaces.Box(-np.inf, np.inf, (3,), np.float32)),
            (
                "alpha",
                spaces.Dict(
                    [
                        ("inner", spaces.Tuple([spaces.MultiBinary(2), spaces.Discrete(5)])),
                        ("mask", spaces.MultiBinary(3)),
                    ]
                ),
            ),
        ]
    ),
}


@pytest.mark.parametrize("name", list(SPACES))
def test_round_trip_through_strict_json(name: str) -> None:
    space = SPACES[name]
    text = json.dumps(space_to_json(space), allow_nan=False)
    restored = space_from_json(json.loads(text))
    assert type(restored) is type(space)
    assert spaces_equal(restored, space)
    assert restored == space
    assert describe_space(restored) == describe_space(space)
    assert restored.dtype == space.dtype


def test_box_bounds_are_exact_and_infinities_are_strings() -> None:
    space = SPACES["box-inf"]
    assert isinstance(space, spaces.Box)
    data = space_to_json(space)
    assert data == {
        "type": "Box",
        "shape": [3],
        "dtype": "float32",
        "low": ["-inf", 0.0, -2.5],
        "high": ["inf", "inf", 3.25],
    }
    restored = space_from_json(data)
    assert isinstance(restored, spaces.Box)
    np.testing.assert_array_equal(restored.low, space.low)
    np.testing.assert_array_equal(restored.high, space.high)
    assert not restored.bounded_below[0]
    assert not restored.bounded_above[1]


def test_float32_bounds_that_are_not_round_decimals_survive_exactly() -> None:
    low = np.array([0.1, -1 / 3, 1e-30], dtype=np.float32)
    space = spaces.Box(low, low + 1, dtype=np.float32)
    restored = space_from_json(json.loads(json.dumps(space_to_json(space))))
    assert isinstance(restored, spaces.Box)
    assert restored.low.tobytes() == space.low.tobytes()
    assert restored.high.tobytes() == space.high.tobytes()


def test_dict_key_order_is_kept() -> None:
    restored = space_from_json(space_to_json(SPACES["dict-nested"]))
    assert isinstance(restored, spaces.Dict)
    assert list(restored.spaces) == ["zeta", "alpha"]
    inner = restored.spaces["alpha"]
    assert isinstance(inner, spaces.Dict)
    assert list(inner.spaces) == ["inner", "mask"]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (spaces.Box(0.0, 1.0, (2,)), spaces.Box(0.0, 1.0, (3,))),
        (spaces.Box(0.0, 1.0, (2,)), spaces.Box(0.0, 1.0, (2,), np.float64)),
        (spaces.Box(0.0, 1.0, (2,)), spaces.Box(0.0, 1.0 + 1e-7, (2,))),
        (spaces.Discrete(2), spaces.Discrete(3)),
        (spaces.Discrete(2), spaces.Discrete(2, start=1)),
        (spaces.Discrete(2), spaces.MultiDiscrete([2])),
        (spaces.MultiDiscrete([2, 3]), spaces.MultiDiscrete([2, 4])),
        (spaces.MultiDiscrete([2, 3]), spaces.MultiDiscrete([2, 3], start=[0, 1])),
        (spaces.MultiBinary(3), spaces.MultiBinary([3, 1])),
        (spaces.Tuple([spaces.Discrete(2)]), spaces.Tuple([spaces.Discrete(2)] * 2)),
        (
            spaces.Dict([("a", spaces.Discrete(2)), ("b", spaces.Discrete(3))]),
            spaces.Dict([("b", spaces.Discrete(3)), ("a", spaces.Discrete(2))]),
        ),
        (spaces.Dict(a=spaces.Discrete(2)), spaces.Dict(b=spaces.Discrete(2))),
    ],
)
def test_spaces_equal_tells_structures_apart(a: spaces.Space[Any], b: spaces.Space[Any]) -> None:
    assert spaces_equal(a, a)
    assert not spaces_equal(a, b)
    assert not spaces_equal(b, a)


@pytest.mark.parametrize(
    ("space", "text"),
    [
        (spaces.Box(-1.0, 1.0, (4,)), "Box(shape=(4,), float32)"),
        (spaces.Box(0, 255, (84, 84, 4), np.uint8), "Box(shape=(84, 84, 4), uint8)"),
        (spaces.Discrete(2), "Discrete(2)"),
        (spaces.Discrete(3, start=-1), "Discrete(3, start=-1)"),
        (spaces.Discrete(3, dtype=np.int32), "Discrete(3, int32)"),
        (spaces.MultiDiscrete([3, 3]), "MultiDiscrete([3, 3])"),
        (spaces.MultiDiscrete([3, 3], start=[1, 1]), "MultiDiscrete([3, 3], start=[1, 1])"),
        (spaces.MultiBinary(4), "MultiBinary(4)"),
        (spaces.MultiBinary([2, 3]), "MultiBinary((2, 3))"),
        (
            spaces.Dict([("a", spaces.Box(0.0, 1.0, (3,))), ("b", spaces.Discrete(5))]),
            "Dict(a: Box(shape=(3,), float32), b: Discrete(5))",
        ),
        (
            spaces.Tuple([spaces.Discrete(2), spaces.MultiBinary(2)]),
            "Tuple(Discrete(2), MultiBinary(2))",
        ),
    ],
)
def test_describe_space(space: spaces.Space[Any], text: str) -> None:
    assert describe_space(space) == text


def test_space_mismatch_names_the_first_space_that_differs() -> None:
    box, other_box = spaces.Box(-1, 1, (3,)), spaces.Box(-1, 1, (4,))
    two, three = spaces.Discrete(2), spaces.Discrete(3)
    assert space_mismatch((box, two), (box, two)) is None
    assert space_mismatch((box, two), (box, three)) == ("action", "Discrete(2)", "Discrete(3)")
    assert space_mismatch((box, two), (other_box, three)) == (
        "observation",
        describe_space(box),
        describe_space(other_box),
    )


def test_unsupported_space_names_its_type_place_and_the_supported_ones() -> None:
    space = spaces.Dict(obs=spaces.Tuple([spaces.Discrete(2), spaces.Text(5)]))
    with pytest.raises(EnvSpecError) as info:
        space_to_json(space)
    message = str(info.value)
    assert "space['obs'][1]" in message
    assert "Text" in message
    assert "Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple" in message


BOX = {"type": "Box", "shape": [2], "dtype": "float32", "low": [0.0, 0.0], "high": [1.0, 1.0]}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([1, 2], r"space: expected a JSON object describing a space"),
        ({"type": "Graph"}, r"space\.type: expected one of Box, Discrete"),
        ({}, r"space\.type: expected one of"),
        ({**BOX, "dtype": "flot32"}, r"space\.dtype: expected a numpy dtype name"),
        ({**BOX, "shape": [2.0]}, r"space\.shape: expected a list of integers"),
        ({**BOX, "low": [0.0, 0.0, 0.0]}, r"space\.low: expected shape \(2,\), got .* \(3,\)"),
        ({**BOX, "high": [1.0, "big"]}, r"space\.high: expected numbers \(or \"inf\"/\"-inf\"\)"),
        ({**BOX, "high": [1.0, [1.0]]}, r"space\.high: expected nested lists of float32"),
        ({**BOX, "low": [2.0, 0.0]}, r"space: invalid Box space"),
        ({**BOX, "dtype": "int64", "low": ["-inf", 0]}, r"space\.low: expected nested lists"),
        ({"type": "Discrete", "n": 0, "start": 0, "dtype": "int64"}, r"invalid Discrete"),
        ({"type": "Discrete", "n": True, "start": 0, "dtype": "int64"}, r"space\.n: expected"),
        ({"type": "Discrete", "n": 2, "dtype": "int64"}, r"space\.start: expected an integer"),
        ({"type": "MultiBinary", "n": "4"}, r"space\.n: expected an integer"),
        ({"type": "Dict", "spaces": [BOX]}, r"space\.spaces: expected a JSON object"),
        ({"type": "Dict", "spaces": {"a": {"type": "Box"}}}, r"space\['a'\]\.dtype: expected"),
        ({"type": "Tuple", "spaces": {"a": BOX}}, r"space\.spaces: expected a list of spaces"),
        ({"type": "Tuple", "spaces": [BOX, {}]}, r"space\[1\]\.type: expected one of"),
    ],
)
def test_malformed_json_raises_env_spec_error(data: Any, expected: str) -> None:
    with pytest.raises(EnvSpecError, match=expected):
        space_from_json(data)
