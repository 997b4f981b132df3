"""Reading the run file of an offline W&B run in tests."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import pytest


def use_offline_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs W&B offline and silently for the calling test, or skips it without ``wandb``.

    W&B reads its settings from the environment once per process, when its first run (or
    anything else) sets it up: the set-up an earlier test left behind is torn down, so this
    test's runs read ``WANDB_MODE=offline`` whichever tests its worker ran before.
    """
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()


def offline_run_records(directory: Path, expected: Iterable[bytes], timeout_s: float = 60) -> bytes:
    """The records of the one offline W&B run under ``directory / "wandb"``, once they hold
    every name in ``expected`` (or as they are after ``timeout_s``).

    W&B's service process writes the run file on its own: on a loaded machine it can still be
    writing after ``wandb.finish()`` has returned, so a test that read the file at once could
    see only its header.
    """
    names = list(expected)
    deadline = time.monotonic() + timeout_s
    while True:
        paths = list(directory.glob("wandb/offline-run-*/run-*.wandb"))
        assert len(paths) <= 1, paths
        records = paths[0].read_bytes() if paths else b""
        if (paths and all(name in records for name in names)) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)
