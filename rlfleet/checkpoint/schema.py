"""Schemas of what a checkpoint reader parses, and one-line errors that name the bad key.

Each JSON file a reader opens is checked against a pydantic model before any value is used:
``manifest.json`` and ``latest.json`` completely, ``meta.json`` for its ``format_version`` (the
rest is the caller's metadata), and the parts of a decoded state that rlfleet's own loaders
read (an algorithm's state, a trainer's counters). Models are strict (``"1"`` is not an
integer, ``true`` is not a number) and keep unknown keys, so a checkpoint that carries more
than a loader reads still loads. A mismatch becomes a :class:`~rlfleet.errors.CheckpointError`
such as ``state.json: trainer.epoch: missing``.

:func:`json_depth_error` bounds how deeply a JSON document nests before ``json.loads`` and the
state decoder recurse into it, so a crafted file cannot reach Python's recursion limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlfleet.errors import CheckpointError

__all__ = [
    "MAX_JSON_DEPTH",
    "STEP_NAME",
    "AlgorithmState",
    "CheckpointMeta",
    "DistributedCounters",
    "DistributedLoopState",
    "LatestPointer",
    "LoopState",
    "Manifest",
    "ManifestEntry",
    "MultiAgentLoopState",
    "PolicyMetadata",
    "PolicyState",
    "TrainerCounters",
    "json_depth_error",
    "state_dict_mismatch",
    "validate_part",
]

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects a checkpoint's JSON may have; rlfleet's own states
nest about 10 levels deep."""

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = (ord("["), ord("{"))
_CLOSE = (ord("]"), ord("}"))
STEP_NAME = re.compile(r"step-(\d+)(?:-(\d+))?")


def json_depth_error(data: bytes, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``data`` nests too deeply to parse, or None.

    Strings are blanked first (a bracket inside a string does not nest), then the running
    count of open brackets is taken with numpy: linear in the size of the file and without
    recursion. For a document that is not valid JSON the count may be off, but the parser
    rejects that document anyway.
    """
    codes = np.frombuffer(_JSON_STRING.sub(b'""', data), dtype=np.uint8)
    steps = np.isin(codes, _OPEN).astype(np.int64) - np.isin(codes, _CLOSE).astype(np.int64)
    depth = int(np.cumsum(steps).max(initial=0))
    if depth > max_depth:
        return f"nested {depth} levels deep; at most {max_depth} are allowed"
    return None


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", arbitrary_types_allowed=True)


class _Closed(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class ManifestEntry(_Closed):
    """One file of a checkpoint, as ``manifest.json`` lists it."""

    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    bytes: Annotated[int, Field(ge=0)]


class Manifest(_Closed):
    """``manifest.json``: every data file of a checkpoint with its sha256 and size."""

    files: dict[str, ManifestEntry]


class LatestPointer(_Closed):
    """``latest.json``: the name of the latest step checkpoint beside it."""

    name: Annotated[str, Field(pattern=STEP_NAME.pattern.join("^$"))]


class CheckpointMeta(_Model):
    """``meta.json``: the format version, then whatever metadata the writer stored."""

    format_version: Annotated[int, Field(ge=1)]


class PolicyMetadata(_Model):
    """The metadata a policy's loader reads (``Algorithm.save`` and trainers write it)."""

    algorithm: str
    observation_space: dict[str, Any]
    action_space: dict[str, Any]


class AlgorithmState(_Model):
    """What :meth:`rlfleet.algos.base.Algorithm.state_dict` returns."""

    modules: dict[str, dict[str, Any]]
    optimizers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    generator: torch.Tensor
    progress: float
    lr_scale: float
    gradient_steps: Annotated[int, Field(ge=0)]
    skipped_batches: Annotated[int, Field(ge=0)] = 0
    encoder: str | None = None
    action_noise_step: Annotated[int, Field(ge=0)] = 0
    """Steps of colored exploration noise sampled (``action_noise_color`` above 0)."""
    exploration_step: Annotated[int, Field(ge=0)] = 0
    """Steps acted with gSDE's exploration matrices (``use_sde``)."""


class PolicyState(_Model):
    """A single-agent policy checkpoint: the algorithm's state under ``algorithm``."""

    algorithm: AlgorithmState


class TrainerCounters(_Model):
    """The training loop's counters (``trainer`` in a trainer's checkpoint)."""

    epoch: Annotated[int, Field(ge=0)]
    env_step: Annotated[int, Field(ge=0)]
    episode: Annotated[int, Field(ge=0)]
    best_score: float
    best_env_step: Annotated[int, Field(ge=0)]
    tests_since_best: Annotated[int, Field(ge=0)]
    tests_since_reduce: Annotated[int, Field(ge=0)]
    wall_time_s: float
    test_time_s: float
    env_restarts: Annotated[int, Field(ge=0)]
    # Absent from checkpoints written before the stop reason was kept.
    stop_reason: str = ""


class LoopState(_Model):
    """The training loop's part of every trainer's checkpoint."""

    trainer: TrainerCounters
    recent_returns: list[float]
    # Absent from checkpoints written before episode lengths were kept.
    recent_lengths: list[int] = Field(default_factory=list)
    evaluator: dict[str, Any] | None


class DistributedCounters(_Model):
    """The actor-learner trainer's own counters (``distributed`` in its checkpoint)."""

    policy_version: Annotated[int, Field(ge=0)]
    actor_restarts: Annotated[int, Field(ge=0)]


class DistributedLoopState(LoopState):
    """A distributed (actor-learner) trainer's checkpoint state."""

    distributed: DistributedCounters


class MultiAgentLoopState(LoopState):
    """A multi-agent trainer's checkpoint state: the collector's, with every learner, under
    ``run``."""

    run: dict[str, Any]


def validate_part(model: type[BaseModel], data: Any, where: str) -> None:
    """Check ``data`` against ``model``.

    Raises:
        CheckpointError: ``<where>: <key path>: <problem>``, for the first key that is missing
            or of the wrong type (``state.json: trainer.epoch: missing``).
    """
    try:
        model.model_validate(data)
    except ValidationError as error:
        raise CheckpointError(f"{where}: {_describe(error)}") from error


def _describe(error: ValidationError) -> str:
    first = error.errors(include_url=False)[0]
    location = ".".join(str(part) for part in first["loc"])
    if first["type"] == "missing":
        problem = "missing"
    else:
        problem = f"{first['msg'][0].lower()}{first['msg'][1:]}, got {_short(first['input'])}"
    more = error.error_count() - 1
    suffix = f" (and {more} more {'problem' if more == 1 else 'problems'})" if more else ""
    return f"{location or 'the document'}: {problem}{suffix}"


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, Mapping):
        return "an object" if not value else f"an object with keys {list(value)[:5]}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def state_dict_mismatch(
    saved: Mapping[str, Any], expected: Mapping[str, Any], prefix: str = "", limit: int = 3
) -> str | None:
    """How the saved ``state_dict`` differs from the model's, naming the first ``limit``
    differing tensors with both shapes (``net.actor.0.weight: checkpoint [32, 4], model
    [64, 4]``), or None when every key is there with its shape."""
    problems: list[str] = []
    for key, tensor in expected.items():
        if key not in saved:
            problems.append(f"{prefix}{key}: missing from the checkpoint")
        elif isinstance(tensor, torch.Tensor):
            theirs = saved[key]
            if not isinstance(theirs, torch.Tensor):
                problems.append(f"{prefix}{key}: checkpoint holds {_short(theirs)}, not a tensor")
            elif theirs.shape != tensor.shape:
                problems.append(
                    f"{prefix}{key}: checkpoint {list(theirs.shape)}, model {list(tensor.shape)}"
                )
    problems += [f"{prefix}{key}: not in the model" for key in saved if key not in expected]
    if not problems:
        return None
    more = len(problems) - limit
    shown = "; ".join(problems[:limit])
    return shown + (f" (and {more} more)" if more > 0 else "")
