"""Checkpoints round-trip training state exactly, refuse damaged files and survive crashes."""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.checkpoint import (
    FORMAT_VERSION,
    CheckpointManager,
    flatten_state,
    load_checkpoint,
    read_metadata,
    save_checkpoint,
    unflatten_state,
)
from rlfleet.envs.spaces import space_from_json, space_to_json, spaces_equal
from rlfleet.errors import CheckpointError, ConfigError

FILES = {"tensors.safetensors", "state.json", "meta.json", "manifest.json"}
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


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()


def make_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    _step(model, optimizer, torch.randn(5, 3))
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


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return save_checkpoint(tmp_path / "ckpt", make_state(), {"algo": "ppo", "step": 10})


def rewrite(directory: Path, name: str, data: bytes) -> None:
    """Replace a file and update the manifest, as a consistent (if odd) checkpoint would."""
    (directory / name).write_bytes(data)
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    manifest_path.write_text(json.dumps(manifest))


# --------------------------------------------------------------------------- round trips


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


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    state = make_state()
    path = save_checkpoint(tmp_path / "nested" / "ckpt", state, {"step": 3})
    assert path == tmp_path / "nested" / "ckpt"
    assert {p.name for p in path.iterdir()} == FILES
    assert [p.name for p in path.parent.iterdir()] == ["ckpt"]
    loaded, metadata = load_checkpoint(path)
    assert_same(loaded, expected_after_load(state))
    assert metadata == {"step": 3}


def test_json_files_are_strict_json(saved: Path) -> None:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in strict JSON")

    for name in ("state.json", "meta.json", "manifest.json"):
        json.loads((saved / name).read_text(), parse_constant=refuse)
    assert json.loads((saved / "meta.json").read_text())["format_version"] == FORMAT_VERSION


def test_adam_resumes_bitwise(tmp_path: Path) -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.8, 0.99))
    _step(model, optimizer, x)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    loaded, _ = load_checkpoint(save_checkpoint(tmp_path / "ckpt", state, {}))

    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.5)
    fresh.load_state_dict(loaded["model"])
    fresh_optimizer.load_state_dict(loaded["optimizer"])
    _step(model, optimizer, x)
    _step(fresh, fresh_optimizer, x)

    for original, resumed in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(original, resumed)
    assert fresh_optimizer.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]


def test_rng_states_resume_the_same_streams(tmp_path: Path) -> None:
    torch.manual_seed(3)
    torch.rand(4)
    generator = np.random.default_rng(1)
    generator.random(4)
    state = {"torch": torch.get_rng_state(), "numpy": generator.bit_generator.state}
    expected_torch, expected_numpy = torch.rand(5), generator.random(5)

    loaded, _ = load_checkpoint(save_checkpoint(tmp_path / "ckpt", state, {}))
    torch.set_rng_state(loaded["torch"])
    resumed = np.random.default_rng()
    resumed.bit_generator.state = loaded["numpy"]
    assert torch.equal(torch.rand(5), expected_torch)
    np.testing.assert_array_equal(resumed.random(5), expected_numpy)


def test_metadata_round_trip(tmp_path: Path) -> None:
    observation_space = spaces.Dict(
        [("z", spaces.Box(-np.inf, np.inf, (3,))), ("a", spaces.Discrete(4))]
    )
    metadata = {
        "algorithm": "ppo",
        "config": {"gamma": 0.99, "hidden": [64, 64], "betas": (0.9, 0.999)},
        "counters": {"env_steps": 2**40, "updates": 12},
        "best_return": -math.inf,
        "per_agent": {0: 1.5, 1: math.nan},
        "observation_space": space_to_json(observation_space),
    }
    path = save_checkpoint(tmp_path / "ckpt", {}, metadata)
    _, loaded = load_checkpoint(path)
    assert_same(loaded, metadata)
    assert_same(read_metadata(path), metadata)
    assert spaces_equal(space_from_json(loaded["observation_space"]), observation_space)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (
            {"weights": torch.ones(2)},
            r"metadata holds tensors.* \(weights\); put them in the state",
        ),
        ({"format_version": 3}, r"metadata: key 'format_version' cannot be used"),
        ({1: "int key at the top"}, r"metadata: key 1 cannot be used"),
    ],
)
def test_bad_metadata_is_refused(tmp_path: Path, metadata: Any, expected: str) -> None:
    with pytest.raises(CheckpointError, match=expected):
        save_checkpoint(tmp_path / "ckpt", {}, metadata)
    assert list(tmp_path.iterdir()) == []


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
def test_unstorable_values_name_their_path(tmp_path: Path, state: Any, expected: str) -> None:
    with pytest.raises(CheckpointError, match=expected):
        save_checkpoint(tmp_path / "ckpt", state, {})
    assert list(tmp_path.iterdir()) == []


def test_existing_directory_is_never_overwritten(saved: Path) -> None:
    before = {p.name: p.read_bytes() for p in saved.iterdir()}
    with pytest.raises(CheckpointError, match="already exists"):
        save_checkpoint(saved, {"x": 1}, {})
    assert {p.name: p.read_bytes() for p in saved.iterdir()} == before
    assert [p.name for p in saved.parent.iterdir()] == [saved.name]


def test_loading_never_unpickles(saved: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("something tried to unpickle")

    for owner, name in [
        (pickle, "load"),
        (pickle, "loads"),
        (pickle, "Unpickler"),
        (torch, "load"),
        (np, "load"),
    ]:
        monkeypatch.setattr(owner, name, forbidden)
    load_checkpoint(saved)
    read_metadata(saved)


# --------------------------------------------------------------------------- damaged checkpoints


def _flip_byte(directory: Path) -> None:
    path = directory / "tensors.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(directory: Path) -> None:
    path = directory / "tensors.safetensors"
    path.write_bytes(path.read_bytes()[:-10])


def _newer_format(directory: Path) -> None:
    meta = json.loads((directory / "meta.json").read_text())
    rewrite(directory, "meta.json", json.dumps({**meta, "format_version": 7}).encode())


def _skeleton_with_nan_literal(directory: Path) -> None:
    rewrite(directory, "state.json", b'{"x": NaN}')


DAMAGE: dict[str, tuple[Callable[[Path], object], str]] = {
    "flipped byte": (
        _flip_byte,
        r"tensors\.safetensors: checksum mismatch — the checkpoint is truncated or was modified",
    ),
    "truncated tensors": (_truncate, r"tensors\.safetensors: size mismatch"),
    "emptied state": (
        lambda d: (d / "state.json").write_bytes(b""),
        r"state\.json: size mismatch",
    ),
    "deleted manifest": (
        lambda d: (d / "manifest.json").unlink(),
        r"manifest\.json: missing — not a complete checkpoint",
    ),
    "deleted listed file": (
        lambda d: (d / "meta.json").unlink(),
        r"meta\.json: missing, though manifest\.json lists it",
    ),
    "manifest not json": (
        lambda d: (d / "manifest.json").write_text("{files"),
        r"manifest\.json: not valid JSON",
    ),
    "manifest malformed": (
        lambda d: (d / "manifest.json").write_text('{"files": {"../x": {}}}'),
        r"manifest\.json: malformed",
    ),
    "manifest incomplete": (
        lambda d: (d / "manifest.json").write_text('{"files": {}}'),
        r"manifest\.json: does not list tensors\.safetensors",
    ),
    "newer format": (
        _newer_format,
        r": written by a newer rlfleet \(format 7\); this version reads formats up to 1$",
    ),
    "state not json": (
        lambda d: rewrite(d, "state.json", b"{not json"),
        r"state\.json: not valid JSON",
    ),
    "nan literal": (_skeleton_with_nan_literal, r"state\.json: not valid JSON"),
    "bad safetensors header": (
        lambda d: rewrite(d, "tensors.safetensors", b"\xff" * 8 + b"garbage"),
        r"tensors\.safetensors: not a valid safetensors file",
    ),
    "dangling tensor reference": (
        lambda d: rewrite(d, "state.json", b'{"w": {"$tensor": "nope"}}'),
        r"state\.json: state\['w'\]: refers to tensor 'nope', which is not stored",
    ),
    "unknown tag": (
        lambda d: rewrite(d, "state.json", b'{"w": {"$pickle": "x"}}'),
        r"state\.json: state\['w'\]: unknown or malformed '\$pickle' entry",
    ),
    "format version missing": (
        lambda d: rewrite(d, "meta.json", b"{}"),
        r"meta\.json: expected a positive integer format_version",
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_checkpoint_is_refused_with_one_line(saved: Path, damage: str) -> None:
    mutate, expected = DAMAGE[damage]
    mutate(saved)
    with pytest.raises(CheckpointError, match=expected) as info:
        load_checkpoint(saved)
    message = str(info.value)
    assert str(saved) in message
    assert "\n" not in message


def test_newer_format_message_names_the_directory(saved: Path) -> None:
    _newer_format(saved)
    expected = f"{saved}: written by a newer rlfleet (format 7); this version reads formats up to 1"
    with pytest.raises(CheckpointError, match=f"^{re.escape(expected)}$"):
        read_metadata(saved)


def test_read_metadata_verifies_the_tensors_too(saved: Path) -> None:
    assert read_metadata(saved) == {"algo": "ppo", "step": 10}
    _flip_byte(saved)
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        read_metadata(saved)


def test_missing_directory_and_file_instead_of_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        load_checkpoint(tmp_path / "absent")
    (tmp_path / "file").write_text("not a checkpoint")
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(tmp_path / 'file'))}: is a file"):
        load_checkpoint(tmp_path / "file")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads anything")
def test_permission_denied(saved: Path) -> None:
    (saved / "tensors.safetensors").chmod(0)
    try:
        with pytest.raises(CheckpointError, match="Permission denied"):
            load_checkpoint(saved)
    finally:
        (saved / "tensors.safetensors").chmod(0o644)


# --------------------------------------------------------------------------- manager


def _save_steps(manager: CheckpointManager, *steps: int) -> list[Path]:
    return [manager.save({"w": torch.full((2,), float(s))}, {"step": s}, s) for s in steps]


def _names(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


def test_rotation_keeps_the_newest_and_points_latest_at_the_last_save(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "ckpts", keep=2)
    _save_steps(manager, 1, 2, 3, 4)
    assert _names(manager.list()) == ["step-000000000003", "step-000000000004"]
    pointer = json.loads((manager.root / "latest.json").read_text())
    assert pointer == {"name": "step-000000000004"}
    assert manager.latest() == manager.root / "step-000000000004"
    state, metadata = manager.load_latest()
    assert metadata == {"step": 4}
    assert torch.equal(state["w"], torch.full((2,), 4.0))
    assert sorted(p.name for p in manager.root.iterdir()) == [
        "latest.json",
        "step-000000000003",
        "step-000000000004",
    ]


def test_rotation_never_deletes_the_latest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    _save_steps(manager, 5, 6, 1)  # e.g. resumed from an early checkpoint
    assert _names(manager.list()) == ["step-000000000001", "step-000000000006"]
    assert manager.latest() == tmp_path / "step-000000000001"


def test_same_step_saved_twice_gets_a_suffix(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    first, second = _save_steps(manager, 5, 5)
    third = manager.save({"w": torch.zeros(1)}, {"again": True}, 5)
    assert _names([first, second, third]) == [
        "step-000000000005",
        "step-000000000005-1",
        "step-000000000005-2",
    ]
    assert manager.list() == [first, second, third]
    assert manager.latest() == third
    assert manager.load_latest()[1] == {"again": True}


def test_latest_falls_back_when_the_pointer_names_a_deleted_checkpoint(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    first, second = _save_steps(manager, 1, 2)
    shutil.rmtree(second)
    with pytest.warns(RuntimeWarning, match="latest.json names step-000000000002"):
        assert manager.latest() == first
    with pytest.warns(RuntimeWarning):
        assert manager.load_latest()[1] == {"step": 1}


def test_latest_falls_back_when_the_pointed_checkpoint_is_damaged(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    first, second = _save_steps(manager, 1, 2)
    _flip_byte(second)
    with pytest.warns(RuntimeWarning, match="checksum mismatch"):
        assert manager.latest() == first


def test_latest_without_pointer_is_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    _, second = _save_steps(manager, 1, 2)
    (tmp_path / "latest.json").unlink()
    (tmp_path / "step-000000000009").mkdir()  # no manifest: not a checkpoint
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert manager.latest() == second
    assert _names(manager.list()) == ["step-000000000001", "step-000000000002"]


@pytest.mark.parametrize("pointer", ['{"name": "../../elsewhere"}', "[1, 2]", "{broken"])
def test_a_bad_pointer_is_not_followed(tmp_path: Path, pointer: str) -> None:
    manager = CheckpointManager(tmp_path)
    _, second = _save_steps(manager, 1, 2)
    (tmp_path / "latest.json").write_text(pointer)
    with pytest.warns(RuntimeWarning, match="latest.json"):
        assert manager.latest() == second


def test_leftovers_of_a_crash_are_removed_on_construction(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    (checkpoint,) = _save_steps(manager, 1)
    leftover = tmp_path / ".tmp-step-000000000002-0123456789ab"
    leftover.mkdir()
    (leftover / "tensors.safetensors").write_bytes(b"half written")
    (tmp_path / ".tmp-latest.json-0123456789ab").write_text('{"name": "step-000000000002"}')
    CheckpointManager(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", checkpoint.name]
    assert manager.latest() == checkpoint


def test_no_checkpoint(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "new")
    assert manager.latest() is None
    assert manager.list() == []
    with pytest.raises(
        CheckpointError, match=f"^{re.escape(str(tmp_path / 'new'))}: no checkpoint"
    ):
        manager.load_latest()


def test_no_usable_checkpoint_says_why(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    (only,) = _save_steps(manager, 1)
    _truncate(only)
    assert manager.latest() is None
    with pytest.raises(CheckpointError, match=r"no checkpoint found .*size mismatch"):
        manager.load_latest()


@pytest.mark.parametrize("keep", [0, -1, 1.5, True])
def test_keep_must_be_a_positive_integer(tmp_path: Path, keep: Any) -> None:
    with pytest.raises(ConfigError, match="keep"):
        CheckpointManager(tmp_path, keep=keep)


@pytest.mark.parametrize("step", [-1, 1.0, None])
def test_step_must_be_a_non_negative_integer(tmp_path: Path, step: Any) -> None:
    with pytest.raises(CheckpointError, match="step"):
        CheckpointManager(tmp_path).save({}, {}, step)


CRASH_EXIT_CODE = 17


def _save_in_child_and_die(root: Path, crash_at: int) -> None:
    """Runs in a forked child: save step 2, but vanish (no cleanup) at operation `crash_at`."""
    exit_code = 0
    try:
        calls = 0

        def crashing(real: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                nonlocal calls
                if calls == crash_at:
                    os._exit(CRASH_EXIT_CODE)
                calls += 1
                return real(*args, **kwargs)

            return wrapper

        # Every step that changes what is durable on disk is a place a crash can land.
        os.fsync = crashing(os.fsync)  # type: ignore[assignment]
        os.rename = crashing(os.rename)  # type: ignore[assignment]
        os.replace = crashing(os.replace)  # type: ignore[assignment]
        shutil.rmtree = crashing(shutil.rmtree)  # type: ignore[assignment]
        CheckpointManager(root, keep=1).save({"w": torch.full((3,), 2.0)}, {"step": 2}, 2)
    except BaseException:
        exit_code = 1
    finally:
        os._exit(exit_code)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork to simulate a crash")
def test_a_crash_at_any_point_leaves_a_complete_latest(tmp_path: Path) -> None:
    template = tmp_path / "template"
    CheckpointManager(template, keep=1).save({"w": torch.full((3,), 1.0)}, {"step": 1}, 1)
    outcomes = []
    for crash_at in range(100):
        root = tmp_path / f"crash-{crash_at}"
        shutil.copytree(template, root)
        pid = os.fork()
        if pid == 0:
            _save_in_child_and_die(root, crash_at)
        exit_code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        assert exit_code in (0, CRASH_EXIT_CODE)

        manager = CheckpointManager(root, keep=1)
        assert not list(root.glob(".tmp-*"))
        state, metadata = manager.load_latest()
        assert torch.equal(state["w"], torch.full((3,), float(metadata["step"])))
        outcomes.append(metadata["step"])
        if exit_code == 0:
            break
    else:
        pytest.fail("the save never finished")
    assert outcomes[0] == 1
    assert outcomes[-1] == 2
    assert outcomes == sorted(outcomes)  # once latest moved to step 2 it never went back
    assert _names(CheckpointManager(root).list()) == ["step-000000000002"]
