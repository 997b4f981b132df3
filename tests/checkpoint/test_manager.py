"""Checkpoints survive SIGKILL at random moments and a full disk."""

from __future__ import annotations

import errno
import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from rlfleet import checkpoint
from rlfleet.checkpoint import CheckpointManager
from rlfleet.errors import CheckpointError


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


def test_full_disk_leaves_the_previous_checkpoint_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    manager.save(_state(1), {"step": 1}, step=1)

    def no_space(path: Path, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint, "_write_durably", no_space)
    with pytest.raises(CheckpointError, match="No space left on device"):
        manager.save(_state(2), {"step": 2}, step=2)
    monkeypatch.undo()
    assert not list(tmp_path.glob(".tmp-*"))
    state, metadata = CheckpointManager(tmp_path).load_latest()
    assert metadata["step"] == 1
    assert torch.equal(state["weights"], torch.full((1024, 1024), 1.0))
