"""Checkpoint schemas: bounded JSON depth, one-line errors naming the key, shape mismatches."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
import torch

from rlfleet.checkpoint.schema import (
    MAX_JSON_DEPTH,
    AlgorithmState,
    DistributedLoopState,
    LatestPointer,
    LoopState,
    Manifest,
    json_depth_error,
    state_dict_mismatch,
    validate_part,
)
from rlfleet.errors import CheckpointError


@pytest.mark.parametrize(
    ("document", "depth"),
    [
        (b"1", 0),
        (b"[]", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'{"a": "[[[[[[[[[[[[[[[[[[", "b": ["\\"]]]]"]}', 2),  # brackets in strings
        (b"[" * 3000 + b"]" * 3000, 3000),
    ],
)
def test_json_depth_counts_nesting_outside_strings(document: bytes, depth: int) -> None:
    assert json_depth_error(document, max_depth=depth) is None
    if depth:
        message = json_depth_error(document, max_depth=depth - 1)
        assert message == f"nested {depth} levels deep; at most {depth - 1} are allowed"


def test_the_depth_limit_covers_what_json_and_the_decoder_can_recurse_into() -> None:
    deepest = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert json_depth_error(deepest.encode()) is None
    assert json.loads(deepest) is not None


LOOP_STATE: dict[str, Any] = {
    "trainer": {
        "epoch": 2,
        "env_step": 512,
        "episode": 21,
        "best_score": -math.inf,
        "best_env_step": 0,
        "tests_since_best": 0,
        "tests_since_reduce": 0,
        "wall_time_s": 0.5,
        "test_time_s": 0.1,
        "env_restarts": 0,
    },
    "recent_returns": [10.0, 12.5],
    "recent_lengths": [10, 12],
    "evaluator": None,
}


def _without(key: str) -> dict[str, Any]:
    trainer = {k: v for k, v in LOOP_STATE["trainer"].items() if k != key}
    return {**LOOP_STATE, "trainer": trainer}


def _with(**trainer: Any) -> dict[str, Any]:
    return {**LOOP_STATE, "trainer": {**LOOP_STATE["trainer"], **trainer}}


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (_without("epoch"), "state.json: trainer.epoch: missing"),
        (
            _with(env_step="512"),
            "state.json: trainer.env_step: input should be a valid integer, got '512'",
        ),
        (_with(epoch=True), "state.json: trainer.epoch: input should be a valid integer, got True"),
        (
            _with(epoch=-1),
            "state.json: trainer.epoch: input should be greater than or equal to 0, got -1",
        ),
        (
            {**LOOP_STATE, "recent_returns": {"a": 1}},
            "state.json: recent_returns: input should be a valid list, got an object with keys "
            "['a']",
        ),
        (
            {k: v for k, v in LOOP_STATE.items() if k != "trainer"},
            "state.json: trainer: missing",
        ),
        ([1, 2], "state.json: the document: input should be a valid dictionary or instance of "),
        (
            _with(epoch="x", env_step="y"),
            "state.json: trainer.epoch: input should be a valid integer, got 'x' (and 1 more "
            "problem)",
        ),
    ],
)
def test_a_missing_or_mistyped_key_is_named(state: Any, expected: str) -> None:
    with pytest.raises(CheckpointError) as info:
        validate_part(LoopState, state, "state.json")
    assert str(info.value).startswith(expected)
    assert "\n" not in str(info.value)


def test_valid_parts_pass_and_unknown_keys_are_kept() -> None:
    validate_part(LoopState, {**LOOP_STATE, "collector": {"anything": 1}}, "state.json")
    validate_part(LoopState, {k: v for k, v in LOOP_STATE.items() if k != "recent_lengths"}, "s")
    validate_part(LatestPointer, {"name": "step-000000000512-1"}, "latest.json")
    validate_part(
        Manifest, {"files": {"meta.json": {"sha256": "0" * 64, "bytes": 3}}}, "manifest.json"
    )


@pytest.mark.parametrize(
    ("model", "data", "expected"),
    [
        (LatestPointer, {"name": "../elsewhere"}, "name: string should match pattern"),
        (LatestPointer, {"name": "step-1", "extra": 1}, "extra: extra inputs are not permitted"),
        (Manifest, {"files": {"m": {"sha256": "0" * 64, "bytes": -1}}}, "files.m.bytes: input"),
        (Manifest, {"files": {"m": {"sha256": "xyz", "bytes": 1}}}, "files.m.sha256: string"),
        (
            AlgorithmState,
            {
                "modules": {},
                "generator": [1, 2],
                "progress": 0.0,
                "lr_scale": 1.0,
                "gradient_steps": 0,
            },
            "generator: input should be an instance of Tensor, got [1, 2]",
        ),
    ],
)
def test_schemas_refuse_what_no_writer_writes(model: Any, data: Any, expected: str) -> None:
    with pytest.raises(CheckpointError, match=f"^x: {re.escape(expected)}"):
        validate_part(model, data, "x")


def test_shape_mismatch_lists_the_first_differing_tensors_with_both_shapes() -> None:
    saved = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Linear(32, 2)).state_dict()
    model = torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.Linear(64, 2)).state_dict()
    assert state_dict_mismatch(saved, model, prefix="net.", limit=2) == (
        "net.0.weight: checkpoint [32, 4], model [64, 4]; "
        "net.0.bias: checkpoint [32], model [64] (and 1 more)"
    )
    assert state_dict_mismatch(model, model) is None
    extra = {**model, "2.weight": torch.zeros(1)}
    del extra["1.bias"]
    assert state_dict_mismatch(extra, model) == (
        "1.bias: missing from the checkpoint; 2.weight: not in the model"
    )


@pytest.mark.parametrize(
    ("distributed", "expected"),
    [
        (None, "state.json: distributed: missing"),
        ({"policy_version": 3}, "state.json: distributed.actor_restarts: missing"),
        ({"policy_version": -1, "actor_restarts": 0}, "state.json: distributed.policy_version: "),
        ({"policy_version": "3", "actor_restarts": 0}, "state.json: distributed.policy_version: "),
    ],
)
def test_a_distributed_state_needs_its_counters(distributed: Any, expected: str) -> None:
    state = dict(LOOP_STATE)
    if distributed is not None:
        state["distributed"] = distributed
    with pytest.raises(CheckpointError) as info:
        validate_part(DistributedLoopState, state, "state.json")
    assert str(info.value).startswith(expected)
    validate_part(
        DistributedLoopState,
        {**LOOP_STATE, "distributed": {"policy_version": 3, "actor_restarts": 0}},
        "state.json",
    )
