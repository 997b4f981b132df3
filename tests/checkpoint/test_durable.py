"""Checkpoint directories: exact round trips, strict JSON, damaged or crafted files refused,
nothing ever unpickled."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pickle
import re
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.algos import get_algorithm
from rlfleet.checkpoint import (
    FORMAT_VERSION,
    load_checkpoint,
    read_metadata,
    save_checkpoint,
)
from rlfleet.checkpoint.schema import LoopState, PolicyMetadata, PolicyState
from rlfleet.cli.main import main
from rlfleet.envs.spaces import space_from_json, space_to_json, spaces_equal
from rlfleet.errors import CheckpointError
from rlfleet.runs.run import initialize_weights
from tests.checkpoint.states import assert_same, expected_after_load, make_state, step

FILES = {"tensors.safetensors", "state.json", "meta.json", "manifest.json"}
WRITE_ORDER = ("tensors.safetensors", "state.json", "meta.json", "manifest.json")
"""The files of a checkpoint in the order it writes them (the manifest last)."""


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


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    state = make_state()
    path = save_checkpoint(tmp_path / "nested" / "ckpt", state, {"step": 3})
    assert path == tmp_path / "nested" / "ckpt"
    assert {p.name for p in path.iterdir()} == FILES
    assert [p.name for p in path.parent.iterdir()] == ["ckpt"]
    loaded, metadata = load_checkpoint(path)
    assert_same(loaded, expected_after_load(state))
    assert metadata == {"step": 3}


def test_every_file_and_both_directories_are_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    path = save_checkpoint(tmp_path / "ckpt", make_state(), {"step": 3})
    (temp,) = {p.parent for p in synced if p.name in FILES}
    assert temp.name.startswith(".tmp-ckpt-")
    # Each file written, then the temporary directory, then the parent after the rename.
    assert synced == [*(temp / name for name in WRITE_ORDER), temp, tmp_path.resolve()]
    assert path.is_dir()


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
    step(model, optimizer, x)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    loaded, _ = load_checkpoint(save_checkpoint(tmp_path / "ckpt", state, {}))

    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.5)
    fresh.load_state_dict(loaded["model"])
    fresh_optimizer.load_state_dict(loaded["optimizer"])
    step(model, optimizer, x)
    step(fresh, fresh_optimizer, x)

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
        r"meta\.json: format_version: missing$",
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


# --------------------------------------------------------------------------- crafted files


class Payload:
    """Unpickling this writes a marker file: proof that code ran."""

    marker = ""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (self.marker,))  # type: ignore[return-value]


def _rewrite_manifest(directory: Path) -> None:
    """Recompute checksums, as an attacker who edits files would."""
    manifest = json.loads((directory / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        data = (directory / name).read_bytes()
        entry["sha256"] = hashlib.sha256(data).hexdigest()
        entry["bytes"] = len(data)
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_pickle_payload_in_a_checkpoint_never_runs(tmp_path: Path) -> None:
    ckpt = save_checkpoint(tmp_path / "ckpt", {"w": torch.ones(3)}, {"algorithm": "ppo"})
    marker = tmp_path / "payload-ran"
    payload = Payload()
    payload.marker = str(marker)
    torch.save(
        {"w": payload}, ckpt / "tensors.safetensors"
    )  # a pickle, under the tensor file's name
    _rewrite_manifest(ckpt)
    with pytest.raises(CheckpointError):
        load_checkpoint(ckpt)
    assert not marker.exists()


def test_json_state_cannot_smuggle_objects(tmp_path: Path) -> None:
    ckpt = save_checkpoint(tmp_path / "ckpt", {"w": torch.ones(3)}, {"algorithm": "ppo"})
    (ckpt / "state.json").write_text(json.dumps({"$object": "os.system", "args": ["true"]}))
    _rewrite_manifest(ckpt)
    with pytest.raises(CheckpointError):
        load_checkpoint(ckpt)


def test_a_checkpoint_written_in_format_1_still_loads() -> None:
    """tests/fixtures/checkpoint-format1 was written by format 1 and is never regenerated: when
    the format changes, this proves older checkpoints still load."""
    state, metadata = load_checkpoint(
        Path(__file__).resolve().parents[1] / "fixtures" / "checkpoint-format1"
    )
    assert metadata["algorithm"] == "example"
    assert torch.equal(state["weights"]["layer.weight"], torch.arange(6.0).reshape(2, 3))
    assert state["optimizer"]["state"][0]["step"].item() == 3.0
    assert state["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    assert state["rng"] == np.random.default_rng(7).bit_generator.state
    assert state["counters"] == {"env_step": 4096, "best_score": float("-inf")}
    assert state["buffer"].dtype == np.uint8


# --------------------------------------------------------------------------- adversarial corpus


@contextlib.contextmanager
def no_hang(seconds: int = 10) -> Iterator[None]:
    """Fail, rather than hang, if the block blocks (on a FIFO, say) for ``seconds``."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"blocked for {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _link_to_dev_zero(directory: Path, name: str) -> None:
    (directory / name).unlink()
    (directory / name).symlink_to("/dev/zero")


def _fifo(directory: Path, name: str) -> None:
    (directory / name).unlink()
    os.mkfifo(directory / name)


def _rewrite_json(directory: Path, name: str, edit: Callable[[Any], Any]) -> None:
    """Edit a JSON file and recompute its checksum: a consistent, crafted checkpoint."""
    rewrite(directory, name, json.dumps(edit(json.loads((directory / name).read_text()))).encode())


NESTED = b"[" * 3000 + b"]" * 3000

CRAFTED: dict[str, tuple[Callable[[Path], object], str]] = {
    "meta.json links to /dev/zero": (
        lambda d: _link_to_dev_zero(d, "meta.json"),
        r"meta\.json: is a symbolic link; a checkpoint is read only from regular files$",
    ),
    "state.json links to /dev/zero": (
        lambda d: _link_to_dev_zero(d, "state.json"),
        r"state\.json: is a symbolic link",
    ),
    "manifest.json links to /dev/zero": (
        lambda d: _link_to_dev_zero(d, "manifest.json"),
        r"manifest\.json: is a symbolic link",
    ),
    "meta.json is a FIFO": (lambda d: _fifo(d, "meta.json"), r"meta\.json: is a FIFO, not a"),
    "manifest.json is a FIFO": (
        lambda d: _fifo(d, "manifest.json"),
        r"manifest\.json: is a FIFO, not a regular file$",
    ),
    "tensors are a directory": (
        lambda d: ((d / "tensors.safetensors").unlink(), (d / "tensors.safetensors").mkdir()),
        r"tensors\.safetensors: is a directory, not a regular file$",
    ),
    "state.json nested 3,000 deep": (
        lambda d: rewrite(d, "state.json", NESTED),
        r"state\.json: not a checkpoint file: nested 3000 levels deep; at most 64 are allowed$",
    ),
    "meta.json nested 3,000 deep": (
        lambda d: rewrite(d, "meta.json", b'{"format_version": 1, "x": ' + NESTED + b"}"),
        r"meta\.json: not a checkpoint file: nested 3001 levels deep",
    ),
    "manifest.json nested 3,000 deep": (
        lambda d: (d / "manifest.json").write_bytes(NESTED),
        r"manifest\.json: not a checkpoint file: nested 3000 levels deep",
    ),
    "manifest.json declares a huge file": (
        lambda d: (d / "manifest.json").write_bytes(b" " * (1 << 17)),
        r"manifest\.json: 131072 bytes, more than the 65536 such a file may hold$",
    ),
    "format_version mistyped": (
        lambda d: _rewrite_json(d, "meta.json", lambda m: {**m, "format_version": "1"}),
        r"meta\.json: format_version: input should be a valid integer, got '1'$",
    ),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_crafted_checkpoint_is_refused_with_one_line(saved: Path, case: str) -> None:
    craft, expected = CRAFTED[case]
    craft(saved)
    with no_hang(), pytest.raises(CheckpointError, match=expected) as info:
        load_checkpoint(saved)
    assert str(info.value).startswith(str(saved))
    assert "\n" not in str(info.value)


TINY = [
    "--num-envs", "4", "--num-steps", "32", "--batch-size", "64", "--num-epochs", "1",
    "--max-steps", "256", "--epoch-num-steps", "128", "--num-test-envs", "2",
    "--test-step-num-episodes", "2", "--no-show-progress",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(run_dir), *TINY]) == 0
    return run_dir


def _latest(run: Path, sub: str) -> Path:
    return run / sub / json.loads((run / sub / "latest.json").read_text())["name"]


def _drop(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda document: {k: v for k, v in document.items() if k != key}


def _drop_counter(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda state: {**state, "trainer": _drop(name)(state["trainer"])}


def _set_counter(name: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda state: {**state, "trainer": {**state["trainer"], name: value}}


def _newer_everywhere(run: Path) -> None:
    for sub in ("best", "checkpoints"):
        _newer_format(_latest(run, sub))


def _in_every_checkpoint(
    name: str, edit: Callable[[Any], Any], subs: tuple[str, ...] = ("best", "checkpoints")
) -> Callable[[Path], None]:
    def craft(run: Path) -> None:
        for sub in subs:
            for checkpoint in (run / sub).glob("step-*"):
                _rewrite_json(checkpoint, name, edit)

    return craft


def _each_checkpoint(craft: Callable[[Path], object]) -> Callable[[Path], None]:
    def craft_all(run: Path) -> None:
        for checkpoint in run.glob("*/step-*"):
            craft(checkpoint)

    return craft_all


# (what is done to the run, the command, what the one-line error says)
THROUGH_THE_CLI: dict[str, tuple[Callable[[Path], object], list[str], str]] = {
    "meta.json a FIFO, eval": (
        _each_checkpoint(lambda d: _fifo(d, "meta.json")),
        ["eval", "{run}"],
        r"no checkpoint found \(.*/meta\.json: is a FIFO, not a regular file\)$",
    ),
    "meta.json links to /dev/zero, resume": (
        _each_checkpoint(lambda d: _link_to_dev_zero(d, "meta.json")),
        ["train", "ppo", "--resume", "{run}"],
        r"no checkpoint found \(.*/meta\.json: is a symbolic link; a checkpoint is read only",
    ),
    "future format_version, eval": (
        _newer_everywhere,
        ["eval", "{run}"],
        r"step-\d+: written by a newer rlfleet \(format 7\); this version reads formats up to 1$",
    ),
    "future format_version, resume": (
        _newer_everywhere,
        ["train", "ppo", "--resume", "{run}"],
        r": written by a newer rlfleet \(format 7\)",
    ),
    "trainer state missing epoch": (
        _in_every_checkpoint("state.json", _drop_counter("epoch"), subs=("checkpoints",)),
        ["train", "ppo", "--resume", "{run}"],
        r"checkpoints/step-\d+/state\.json: trainer\.epoch: missing$",
    ),
    "trainer counter mistyped": (
        _in_every_checkpoint("state.json", _set_counter("env_step", "256"), subs=("checkpoints",)),
        ["train", "ppo", "--resume", "{run}"],
        r"state\.json: trainer\.env_step: input should be a valid integer, got '256'$",
    ),
    "algorithm state missing a key": (
        _in_every_checkpoint(
            "state.json", lambda s: {**s, "algorithm": _drop("progress")(s["algorithm"])}
        ),
        ["eval", "{run}"],
        r"best/step-\d+/state\.json: algorithm\.progress: missing$",
    ),
    "metadata missing a key": (
        _in_every_checkpoint("meta.json", _drop("observation_space")),
        ["eval", "{run}"],
        r"meta\.json: observation_space: missing$",
    ),
    "metadata key mistyped": (
        _in_every_checkpoint("meta.json", lambda m: {**m, "action_space": [2]}),
        ["eval", "{run}"],
        r"meta\.json: action_space: input should be a valid dictionary, got \[2\]$",
    ),
    "network mismatch": (
        lambda run: None,
        ["train", "ppo", "--resume", "{run}", "--hidden-sizes", "32"],
        r"checkpoint does not match this ppo model: net\.\S+: checkpoint \[[\d, ]+64\], "
        r"model \[[\d, ]+32\]; ",
    ),
}


@pytest.mark.parametrize("case", list(THROUGH_THE_CLI))
def test_crafted_run_is_refused_by_the_cli_with_one_line(
    trained: Path, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    craft, command, expected = THROUGH_THE_CLI[case]
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    craft(run)
    with no_hang(60):
        assert main([part.format(run=run) for part in command]) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(expected, err), err
    assert len(err.splitlines()) == 1, err


def test_a_valid_checkpoint_still_passes_every_schema(trained: Path) -> None:
    state, _ = load_checkpoint(
        _latest(trained, "checkpoints"), state_schema=LoopState, metadata_schema=PolicyMetadata
    )
    assert state["trainer"]["env_step"] == 256
    load_checkpoint(
        _latest(trained, "best"), state_schema=PolicyState, metadata_schema=PolicyMetadata
    )


# --------------------------------------------------------------------------- fuzzing the reader

FUZZED_FILES = ["manifest.json", "meta.json", "state.json", "tensors.safetensors"]
# Positions near the start (the JSON header of the tensors file) or anywhere.
positions = st.one_of(st.integers(0, 4096), st.integers(0, 2**31))
byte_edits = st.lists(
    st.tuples(positions, st.integers(0, 255), st.sampled_from(["set", "insert", "delete"])),
    min_size=1,
    max_size=8,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
) | st.sampled_from(
    [{"$tensor": "algorithm/generator"}, {"$int": "zz"}, {"$dict": [[1]]}, {"$float": "x"}]
)


def _load_crafted(trained: Path, craft: Callable[[Path], object]) -> None:
    """Craft a copy of the run's latest checkpoint; loading it may only raise CheckpointError."""
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "ckpt"
        shutil.copytree(_latest(trained, "checkpoints"), checkpoint)
        craft(checkpoint)
        try:
            load_checkpoint(checkpoint, state_schema=LoopState, metadata_schema=PolicyMetadata)
        except CheckpointError as error:
            message = str(error)
        else:
            return
        assert "\n" not in message


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(FUZZED_FILES), edits=byte_edits, truncate=st.booleans())
def test_fuzzed_bytes_raise_only_checkpoint_error(
    trained: Path, name: str, edits: list[tuple[int, int, str]], truncate: bool
) -> None:
    def craft(checkpoint: Path) -> None:
        data = bytearray((checkpoint / name).read_bytes())
        for position, byte, operation in edits:
            index = position % (len(data) + 1)
            if operation == "insert":
                data.insert(index, byte)
            elif index < len(data):
                if operation == "set":
                    data[index] = byte
                else:
                    del data[index]
        if truncate:
            del data[edits[0][0] % (len(data) + 1) :]
        if name == "manifest.json":
            (checkpoint / name).write_bytes(bytes(data))
        else:  # checksums recomputed, so the parser is reached
            rewrite(checkpoint, name, bytes(data))

    _load_crafted(trained, craft)


def _replace_at(document: Any, choices: list[int], value: Any) -> Any:
    """``document`` with the node that ``choices`` walk to replaced by ``value``."""
    if not choices or not isinstance(document, dict | list) or not document:
        return value
    if isinstance(document, dict):
        key = list(document)[choices[0] % len(document)]
        return {**document, key: _replace_at(document[key], choices[1:], value)}
    index = choices[0] % len(document)
    return [
        *document[:index],
        _replace_at(document[index], choices[1:], value),
        *document[index + 1 :],
    ]


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(["manifest.json", "meta.json", "state.json"]),
    choices=st.lists(st.integers(0, 1000), max_size=8),
    value=json_values,
)
def test_fuzzed_json_values_raise_only_checkpoint_error(
    trained: Path, name: str, choices: list[int], value: Any
) -> None:
    def craft(checkpoint: Path) -> None:
        edited = _replace_at(json.loads((checkpoint / name).read_text()), choices, value)
        if name == "manifest.json":
            (checkpoint / name).write_text(json.dumps(edited))
        else:
            rewrite(checkpoint, name, json.dumps(edited).encode())

    _load_crafted(trained, craft)


def test_initializing_another_network_lists_the_differing_tensors(trained: Path) -> None:
    narrower = get_algorithm("ppo")("CartPole-v1", hidden_sizes=(32,))
    with pytest.raises(CheckpointError) as info:
        initialize_weights(narrower, trained)
    message = str(info.value)
    assert re.search(
        r"the networks differ \(net\.\S+: checkpoint \[[\d, ]+64\], model \[[\d, ]+32\]; ", message
    )
    assert "\n" not in message
    assert initialize_weights(get_algorithm("ppo")("CartPole-v1"), trained).is_dir()


def test_initializing_from_a_run_of_other_spaces_names_the_space(trained: Path) -> None:
    acrobot = get_algorithm("ppo")("Acrobot-v1")
    expected = r"its observation space Box\(shape=\(4,\), float32\) differs from this env's "
    with pytest.raises(CheckpointError, match=expected + r"Box\(shape=\(6,\), float32\)$"):
        initialize_weights(acrobot, trained)
