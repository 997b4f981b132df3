"""CheckpointManager: rotation, the `latest` pointer and its fallbacks, and checkpoints that
survive SIGKILL at random moments, a crash at any operation and a full disk."""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import safetensors
import torch

from rlfleet import errors
from rlfleet.checkpoint import durable
from rlfleet.checkpoint import manager as manager_module
from rlfleet.checkpoint.manager import CheckpointManager
from rlfleet.errors import WRITE_BOUNDARIES, CheckpointError, ConfigError


def _state(step: int) -> dict[str, object]:
    # ~4 MB, so a save takes long enough to be killed in the middle of it.
    return {"weights": torch.full((1024, 1024), float(step)), "step": step}


def _writer(root: Path, first_step: int, done: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    manager = CheckpointManager(root, keep=3)
    step = first_step
    while True:
        manager.save(_state(step), {"step": step}, step=step)
        done.put(step)
        step += 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_sigkill_at_random_moments_never_breaks_latest(tmp_path: Path) -> None:
    rng = random.Random(1234)
    context = multiprocessing.get_context("fork")
    root = tmp_path / "checkpoints"
    last_completed = -1
    interrupted_saves = 0
    for _kill in range(20):
        done: multiprocessing.Queue = context.Queue()  # type: ignore[type-arg]
        process = context.Process(target=_writer, args=(root, last_completed + 1, done))
        process.start()
        time.sleep(rng.uniform(0.02, 0.25))
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        while not done.empty():
            last_completed = done.get()
        if last_completed < 0:
            continue
        # Opening the manager removes a killed save's leftovers; the latest verifies and is
        # either the last save the writer reported or the one it finished while being killed.
        interrupted_saves += bool(list(root.glob(".tmp-*")))
        manager = CheckpointManager(root, keep=3)
        assert not list(root.glob(".tmp-*"))
        state, metadata = manager.load_latest()
        assert metadata["step"] in (last_completed, last_completed + 1)
        assert torch.equal(state["weights"], torch.full((1024, 1024), float(metadata["step"])))
        last_completed = metadata["step"]
    assert last_completed > 0
    assert interrupted_saves >= 3, "the kills should land in the middle of saves"


def _no_space(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def _safetensors_full(*args: Any, **kwargs: Any) -> None:
    raise safetensors.SafetensorError("Error while serializing: No space left on device")


@pytest.mark.parametrize(
    ("module", "writer", "failure", "message"),
    [
        (durable.safetensors.torch, "save_file", _safetensors_full, "cannot save the checkpoint"),
        (durable, "write_durably", _no_space, "cannot save the checkpoint"),
        (manager_module, "write_durably", _no_space, "latest.json: cannot update"),
    ],
    ids=["tensors", "json", "latest"],
)
def test_full_disk_is_a_checkpoint_error_and_the_previous_checkpoint_stays(
    module: Any,
    writer: str,
    failure: Callable[..., None],
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    manager.save(_state(1), {"step": 1}, step=1)
    monkeypatch.setattr(module, writer, failure)
    with pytest.raises(CheckpointError) as raised:
        manager.save(_state(2), {"step": 2}, step=2)
    monkeypatch.undo()
    assert message in str(raised.value)
    assert "No space left on device" in str(raised.value)
    assert re.search(r"; [\d.]+ [KMGT]?i?B free on its file system\)$", str(raised.value))
    assert not list(tmp_path.glob(".tmp-*"))
    state, metadata = CheckpointManager(tmp_path).load_latest()
    assert metadata["step"] == 1
    assert torch.equal(state["weights"], torch.full((1024, 1024), 1.0))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork to simulate a crash")
@pytest.mark.parametrize(
    "boundary", [name for name in WRITE_BOUNDARIES if not name.startswith("history.")]
)
def test_a_kill_at_each_write_boundary_leaves_a_complete_latest(
    boundary: str, tmp_path: Path
) -> None:
    CheckpointManager(tmp_path, keep=1).save({"w": torch.full((3,), 1.0)}, {"step": 1}, 1)
    pid = os.fork()
    if pid == 0:

        def die(name: str, path: Path) -> None:
            if name == boundary:
                os._exit(CRASH_EXIT_CODE)

        errors.FAULT_HOOK = die
        try:
            CheckpointManager(tmp_path, keep=1).save({"w": torch.full((3,), 2.0)}, {"step": 2}, 2)
        finally:
            os._exit(1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == CRASH_EXIT_CODE
    manager = CheckpointManager(tmp_path, keep=1)
    assert manager.latest_problem() is None
    state, metadata = manager.load_latest()
    # Step 2 is the latest from the moment latest.json names it.
    moved = WRITE_BOUNDARIES.index(boundary) >= WRITE_BOUNDARIES.index("latest.renamed")
    assert metadata["step"] == (2 if moved else 1)
    assert torch.equal(state["w"], torch.full((3,), float(metadata["step"])))


def _flip_byte(directory: Path) -> None:
    path = directory / "tensors.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(directory: Path) -> None:
    path = directory / "tensors.safetensors"
    path.write_bytes(path.read_bytes()[:-10])


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


# --------------------------------------------------------------------------- crafted latest.json


def _pointer_to_dev_zero(root: Path) -> None:
    (root / "latest.json").unlink()
    (root / "latest.json").symlink_to("/dev/zero")


def _pointer_fifo(root: Path) -> None:
    (root / "latest.json").unlink()
    os.mkfifo(root / "latest.json")


CRAFTED_POINTERS: dict[str, tuple[Callable[[Path], object], str]] = {
    "links to /dev/zero": (_pointer_to_dev_zero, r"latest\.json: is a symbolic link"),
    "a FIFO": (_pointer_fifo, r"latest\.json: is a FIFO, not a regular file"),
    "nested 3,000 deep": (
        lambda root: (root / "latest.json").write_bytes(b"[" * 3000),  # 3,000 bytes: under the cap
        r"latest\.json: not a checkpoint file: nested 3000 levels deep",
    ),
    "too large": (
        lambda root: (root / "latest.json").write_bytes(b" " * 5000),
        r"latest\.json: 5000 bytes, more than the 4096 such a file may hold",
    ),
    "name mistyped": (
        lambda root: (root / "latest.json").write_text('{"name": 12}'),
        r"latest\.json: name: input should be a valid string, got 12",
    ),
    "name missing": (
        lambda root: (root / "latest.json").write_text('{"step": 12}'),
        r"latest\.json: name: missing",
    ),
}


@pytest.mark.parametrize("case", list(CRAFTED_POINTERS))
def test_a_crafted_pointer_is_passed_over_with_a_one_line_reason(tmp_path: Path, case: str) -> None:
    craft, expected = CRAFTED_POINTERS[case]
    manager = CheckpointManager(tmp_path)
    _, second = _save_steps(manager, 1, 2)
    craft(tmp_path)
    signal.alarm(10)  # a regression that blocks on the FIFO fails instead of hanging
    try:
        with pytest.warns(RuntimeWarning, match=expected) as caught:
            assert manager.latest() == second
        assert "\n" not in str(caught[0].message)
        for checkpoint in manager.list():
            shutil.rmtree(checkpoint)
        with pytest.raises(CheckpointError, match=f"no checkpoint found .*{expected}") as info:
            manager.load_latest()
        assert "\n" not in str(info.value)
    finally:
        signal.alarm(0)


def test_a_checkpoint_of_a_newer_format_is_named_not_passed_over(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    _, second = _save_steps(manager, 1, 2)
    meta = json.loads((second / "meta.json").read_text())
    data = json.dumps({**meta, "format_version": 2}).encode()
    (second / "meta.json").write_bytes(data)
    manifest = json.loads((second / "manifest.json").read_text())
    manifest["files"]["meta.json"] = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
    }
    (second / "manifest.json").write_text(json.dumps(manifest))
    expected = (
        f"{second}: written by a newer rlfleet (format 2); this version reads formats up to 1"
    )
    for read in (manager.latest, manager.load_latest):
        with pytest.raises(CheckpointError, match=f"^{re.escape(expected)}$"):
            read()


def test_a_step_newer_than_latest_is_replaced_when_saved_again(tmp_path: Path) -> None:
    """A process killed after writing step 3 but before pointing latest.json at it leaves
    step 3 behind; the resumed run redoes step 3 and its save replaces the leftover."""
    manager = CheckpointManager(tmp_path, keep=3)
    _save_steps(manager, 1, 2)
    leftover = manager.save({"w": torch.full((2,), -1.0)}, {"step": "killed"}, 3)
    (tmp_path / "latest.json").write_text(json.dumps({"name": "step-000000000002"}))
    again = manager.save({"w": torch.full((2,), 3.0)}, {"step": 3}, 3)
    assert again == leftover
    assert _names(manager.list()) == [f"step-00000000000{s}" for s in (1, 2, 3)]
    assert manager.load_latest()[1] == {"step": 3}


def test_prune_finishes_a_rotation_that_was_cut_short(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    _save_steps(manager, 1, 2)
    CheckpointManager(tmp_path).save({"w": torch.zeros(2)}, {"step": 3}, 3)  # no rotation
    assert len(manager.list()) == 3
    manager.prune()
    assert _names(manager.list()) == ["step-000000000002", "step-000000000003"]
    with pytest.raises(CheckpointError, match="read-only"):
        CheckpointManager(tmp_path, readonly=True).prune()
