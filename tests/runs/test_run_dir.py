"""The run directory's lock, its versioned files and the schedule choice of a resume."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from rlfleet.errors import RunDirError
from rlfleet.runs.config import CONFIG_FILE, RunConfig, default_run_config, load_run_config
from rlfleet.runs.run_dir import (
    LOCK_FILE,
    RunDirAttempt,
    RunDirLock,
    default_run_dir,
    resumed_config,
    scheduled_settings,
    write_run_files,
)

HOLD_LOCK = (
    "import sys, time; from rlfleet.runs.run_dir import RunDirLock; "
    "RunDirLock(sys.argv[1]).acquire(); print('locked', flush=True); time.sleep(120)"
)


@pytest.fixture
def holder(tmp_path: Path) -> subprocess.Popen[str]:
    """Another process holding the lock of ``tmp_path / "run"``."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(run_dir)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "locked"
    yield child
    child.kill()
    child.wait()


def test_runs_of_one_config_started_within_a_second_get_directories_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt, *args: "20261201-120000")
    cfg = default_run_config("ppo", "ALE/Pong-v5")
    first = default_run_dir(cfg)
    assert first == Path(f"runs/ppo-ALE-Pong-v5-s{cfg.seed}-20261201-120000")
    first.mkdir(parents=True)
    second = default_run_dir(cfg)
    assert second == first.with_name(f"{first.name}-2")
    second.mkdir()
    assert default_run_dir(cfg) == first.with_name(f"{first.name}-3")


def test_the_lock_file_names_its_owner_and_goes_on_release(tmp_path: Path) -> None:
    lock = RunDirLock(tmp_path)
    lock.acquire()
    text = (tmp_path / LOCK_FILE).read_text()
    assert f'"pid": {os.getpid()}' in text
    assert socket.gethostname() in text
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
    lock.release()  # a second release is a no-op


def test_a_lock_that_cannot_be_written_is_a_one_line_run_dir_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/reliability.md, a full disk: the run directory's .lock -> RunDirError.
    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(RunDirError) as err:
        RunDirLock(tmp_path).acquire()
    message = str(err.value)
    assert str(tmp_path / LOCK_FILE) in message
    assert "No space left on device" in message
    assert "free" in message
    assert "\n" not in message
    assert not (tmp_path / LOCK_FILE).exists()  # nothing is left behind


def test_a_second_writer_fails_at_once_naming_the_holder(
    holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(RunDirError) as err:
        RunDirLock(run_dir).acquire()
    message = str(err.value)
    assert f"run dir {run_dir} is in use by pid {holder.pid} on host {socket.gethostname()}" in (
        message
    )
    assert " since " in message
    assert "\n" not in message


def test_the_lock_of_a_killed_owner_is_taken_over_with_a_warning(
    holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (run_dir / LOCK_FILE).exists()  # left behind, but no longer locked
    lock = RunDirLock(run_dir)
    with pytest.warns(RuntimeWarning, match=f"taking over the lock of pid {holder.pid} on host"):
        lock.acquire()
    assert f'"pid": {os.getpid()}' in (run_dir / LOCK_FILE).read_text()
    lock.release()


def test_a_new_run_starts_where_a_killed_one_left_only_its_lock(
    holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    holder.kill()
    holder.wait()
    attempt = RunDirAttempt(run_dir, resume=False, force=False)
    with pytest.warns(RuntimeWarning, match=f"taking over the lock of pid {holder.pid}"):
        attempt.__enter__()
    attempt.__exit__(None, None, None)
    assert list(run_dir.iterdir()) == []


def _cfg(**trainer: object) -> RunConfig:
    cfg = default_run_config("ppo", "CartPole-v1")
    return replace(cfg, trainer=replace(cfg.trainer, **trainer))


def _constant(cfg: RunConfig) -> RunConfig:
    hp = replace(cfg.hyperparameters, lr_schedule="constant", clip_range_schedule="constant")
    return replace(cfg, hyperparameters=hp)


def _tree(run_dir: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(run_dir)): p.read_bytes() if p.is_file() else None
        for p in sorted(run_dir.rglob("*"))
    }


def test_an_attempt_on_a_locked_run_writes_and_removes_nothing(
    holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    write_run_files(run_dir, _cfg(), {}, resume=False)
    before = _tree(run_dir)
    for resume, force in ((True, False), (False, True)):
        attempt = RunDirAttempt(run_dir, resume=resume, force=force)
        with pytest.raises(RunDirError, match=f"in use by pid {holder.pid}"):
            attempt.__enter__()
        assert _tree(run_dir) == before
    assert not list(tmp_path.glob(".run.replaced-*"))


def test_an_attempt_holds_the_lock_until_it_ends_even_when_it_fails(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_run_files(run_dir, _cfg(), {}, resume=False)
    before = _tree(run_dir)
    attempt = RunDirAttempt(run_dir, resume=True, force=False)

    def interrupted_while_locked() -> None:
        with attempt:
            assert (run_dir / LOCK_FILE).is_file()
            with pytest.raises(RunDirError, match="is in use by pid"):
                RunDirLock(run_dir).acquire()
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_while_locked()
    assert _tree(run_dir) == before
    RunDirLock(run_dir).acquire()  # free again


def test_a_resume_writes_a_changed_config_as_a_new_version(tmp_path: Path) -> None:
    first = _cfg(max_steps=512)
    assert write_run_files(tmp_path, first, {"extra.yaml": {"a": 1}}, resume=False) == [
        tmp_path / CONFIG_FILE,
        tmp_path / "extra.yaml",
    ]
    original = (tmp_path / CONFIG_FILE).read_bytes()
    # Unchanged: nothing written.
    assert write_run_files(tmp_path, first, {"extra.yaml": {"a": 1}}, resume=True) == []
    second = _cfg(max_steps=768)
    written = write_run_files(tmp_path, second, {"extra.yaml": {"a": 2}}, resume=True)
    assert written == [tmp_path / "config.1.yaml", tmp_path / "extra.1.yaml"]
    assert (tmp_path / CONFIG_FILE).read_bytes() == original
    assert load_run_config(tmp_path).trainer.max_steps == 768
    write_run_files(tmp_path, _cfg(max_steps=1024), {}, resume=True)
    assert load_run_config(tmp_path).trainer.max_steps == 1024
    assert sorted(p.name for p in tmp_path.glob("config*.yaml")) == [
        "config.1.yaml",
        "config.2.yaml",
        "config.yaml",
    ]


def test_settings_that_follow_max_steps_are_found() -> None:
    ppo = default_run_config("ppo", "CartPole-v1")  # the preset's schedules are linear
    assert scheduled_settings(ppo) == [
        "hyperparameters.lr_schedule: linear",
        "hyperparameters.clip_range_schedule: linear",
    ]
    assert scheduled_settings(_constant(ppo)) == []
    dqn = default_run_config("dqn", "CartPole-v1")
    assert any("exploration_fraction" in s for s in scheduled_settings(dqn))
    sac = default_run_config("sac", "Pendulum-v1")
    assert scheduled_settings(sac) == []
    dqn = default_run_config(
        "dqn", "CartPole-v1", {"hyperparameters": {"exploration_fraction": 0.0,
                                                   "prioritized": True, "prioritized_beta": 0.4}}
    )  # fmt: skip
    assert scheduled_settings(dqn) == ["hyperparameters.prioritized_beta: 0.4"]
    lessons = [
        {"name": "light", "value": 0.05,
         "completion_criteria": {"behavior": "CartPole", "measure": "progress", "threshold": 0.5}},
        {"name": "heavy", "value": 0.5},
    ]  # fmt: skip
    curriculum = default_run_config(
        "ppo", "CartPole-v1", {"environment_parameters": {"masspole": {"curriculum": lessons}}}
    )
    assert scheduled_settings(_constant(curriculum)) == [
        "environment_parameters.masspole: a curriculum measured by progress"
    ]


def test_a_new_max_steps_with_schedules_needs_a_choice(tmp_path: Path) -> None:
    write_run_files(tmp_path, _cfg(max_steps=512), {}, resume=False)
    longer = _cfg(max_steps=1024)
    with pytest.raises(RunDirError) as err:
        resumed_config(tmp_path, longer, None)
    assert str(err.value) == (
        f"resuming {tmp_path} with max_steps 1,024 instead of 512: its schedules follow "
        "max_steps (hyperparameters.lr_schedule: linear; hyperparameters.clip_range_schedule: "
        "linear); pass schedule_on_resume continue "
        "(keep their horizon at 512 steps) or schedule_on_resume stretch (run them over 1,024)"
    )
    assert resumed_config(tmp_path, longer, "continue").trainer.schedule_max_steps == 512
    assert resumed_config(tmp_path, longer, "stretch").trainer.schedule_max_steps is None
    # No choice needed: the same horizon, or nothing that follows it.
    assert resumed_config(tmp_path, _cfg(max_steps=512), None) == _cfg(max_steps=512)
    assert resumed_config(tmp_path, _constant(longer), None) == _constant(longer)


def test_a_continued_horizon_stays_until_stretched(tmp_path: Path) -> None:
    write_run_files(tmp_path, _cfg(max_steps=1024, schedule_max_steps=512), {}, resume=False)
    # The base of a resume is the run's config: its horizon comes with it.
    again = _cfg(max_steps=2048, schedule_max_steps=512)
    assert resumed_config(tmp_path, again, None) == again
    assert resumed_config(tmp_path, again, "stretch").trainer.schedule_max_steps is None


HOLD_LOCK_AND_FORK = (
    "import os, sys, time; from rlfleet.runs.run_dir import RunDirLock; "
    "RunDirLock(sys.argv[1]).acquire(); child = os.fork(); "
    "print(child, flush=True) if child else None; time.sleep(120)"
)


def test_a_dead_owner_whose_child_still_holds_the_lock_is_named_as_such(tmp_path: Path) -> None:
    # A process started by the owner (an env worker, forked) inherits the lock.
    parent = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK_AND_FORK, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait()
        with pytest.raises(RunDirError) as err:
            RunDirLock(tmp_path).acquire()
        assert f"in use by pid {parent.pid} on host" in str(err.value)
        assert str(err.value).endswith("(exited; a process it started still holds the lock)")
    finally:
        os.kill(child, signal.SIGKILL)
    lock = RunDirLock(tmp_path)
    with pytest.warns(RuntimeWarning, match=f"taking over the lock of pid {parent.pid} on host"):
        _acquire_once_free(lock)
    lock.release()


def _acquire_once_free(lock: RunDirLock) -> None:
    """Acquire ``lock`` as soon as its holder is gone (a grandchild of the test, which init
    reaps)."""
    deadline = time.monotonic() + 30
    while not lock.held:
        try:
            lock.acquire()
        except RunDirError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
