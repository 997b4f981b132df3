"""Training states for checkpoint tests: one that holds every kind of value a state may hold,
and an exact comparison."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

ARRAY_DTYPES = [
    np.bool_,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
]


def assert_same(actual: Any, expected: Any, where: str = "state") -> None:
    """Exact equality, including types, dtypes, dict key order and NaN positions."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), where
        assert torch.equal(_bytes_of(actual), _bytes_of(expected)), where
    elif isinstance(expected, np.ndarray):
        assert type(actual) is np.ndarray, where
        assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape), where
        np.testing.assert_array_equal(actual, expected, err_msg=where)
    elif isinstance(expected, np.generic):
        assert type(actual) is type(expected), where
        np.testing.assert_array_equal(actual, expected, err_msg=where)
    elif isinstance(expected, dict):
        assert type(actual) is dict, where
        assert [(type(k), k) for k in actual] == [(type(k), k) for k in expected], where
        for key, value in expected.items():
            assert_same(actual[key], value, f"{where}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert type(actual) is type(expected), where
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert type(actual) is float, where
        assert math.isnan(actual) if math.isnan(expected) else actual == expected, where
        assert math.copysign(1, actual) == math.copysign(1, expected), where
    else:
        assert type(actual) is type(expected), where
        assert actual == expected, where


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()


def make_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step(model, optimizer, torch.randn(5, 3))
    shared = torch.arange(6.0)
    read_only = np.arange(4.0)
    read_only.flags.writeable = False
    return {
        "model": dict(model.state_dict()),
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.default_rng(1).bit_generator.state,
        "floats": [math.nan, math.inf, -math.inf, -0.0, 0.1, 1e-320, 1.7976931348623157e308],
        "int_keys": {0: "zero", -7: (1, 2), 2**80: "huge key", "mixed": None},
        "ints": [2**200, -(2**64) + 1, 2**53, 2**53 + 1, -(2**53) - 1, True, False],
        "tuples": ((), (1,), ((2, 3), [4, (5,)])),
        "arrays": {np.dtype(d).name: np.arange(6).astype(d).reshape(2, 3) for d in ARRAY_DTYPES},
        "array_specials": [np.array([np.nan, -np.inf, -0.0]), np.zeros((0, 2), np.int32)],
        "array_views": [np.arange(10.0)[::3], read_only, np.asfortranarray(np.eye(3))],
        "array_scalar": np.array(4.5, dtype=np.float32),
        "numpy_scalars": [np.float32(1.5), np.int64(-3), np.bool_(True), np.float64(np.nan)],
        "tensors": {
            "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
            "empty": torch.zeros(0, 5),
            "scalar": torch.tensor(7, dtype=torch.int64),
            "transposed": torch.arange(12.0).reshape(3, 4).t(),
            "needs_grad": torch.ones(2, requires_grad=True),
        },
        "shared": [shared, shared, shared[2:4]],
        "dollar_keys": {"$tensor": "not a reference", "$": 1},
        "a/b": {"c": torch.zeros(1)},
        "a": {"b": {"c": torch.ones(1)}},
        "text": ["", "ünïcödé", "line\nbreak", '{"$float": "nan"}'],
        "nothing": None,
    }


def expected_after_load(state: dict[str, Any]) -> dict[str, Any]:
    """What loading returns: tensors detached, every container a plain dict/list/tuple."""
    expected = dict(state)
    expected["tensors"] = {**state["tensors"], "needs_grad": torch.ones(2)}
    return expected
