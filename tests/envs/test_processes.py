"""The worker pool every subprocess env uses: answers, faults (raised, died, hung) with the
process id, reason and stack, and a close that leaves no process or stack file behind."""

from __future__ import annotations

import os
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

import pytest

from rlfleet.envs.processes import (
    SPEC_ERROR,
    WorkerPool,
    commands,
    describe_faults,
    spec_error,
    trim_stack,
)


def _serve(conn: Connection, index: int) -> None:
    conn.send((True, f"ready {index}"))
    for command, data in commands(conn):
        if command == "echo":
            conn.send((True, (index, data)))
        elif command == "fail":
            conn.send((False, data))
        elif command == "exit":
            os._exit(data)
        elif command == "sleep":
            _stuck(data)


def _stuck(seconds: float) -> None:
    time.sleep(seconds)


@pytest.fixture
def pool() -> Any:
    workers = WorkerPool(None, name="test-worker")
    for i in range(2):
        workers.start(i, _serve, (i,))
    yield workers
    workers.close(1.0)


def _gone(pid: int | None) -> bool:
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_answers_come_back_by_worker(pool: WorkerPool) -> None:
    replies, faults = pool.gather({0: "startup", 1: "startup"}, 30)
    assert (replies, faults) == ({0: "ready 0", 1: "ready 1"}, {})
    pool.send(0, "echo", [1, 2])
    pool.send(1, "echo", "x")
    assert pool.gather({0: "echo", 1: "echo"}, 30) == ({0: (0, [1, 2]), 1: (1, "x")}, {})


def test_each_kind_of_fault_names_the_worker(pool: WorkerPool) -> None:
    pool.gather({0: "startup", 1: "startup"}, 30)
    pid0, pid1 = pool.pids
    pool.send(0, "fail", SPEC_ERROR + "bad observation")
    pool.send(1, "exit", 3)
    _, faults = pool.gather({0: "step", 1: "step"}, 30)
    assert faults[0].kind == "raised"
    assert spec_error(faults) == "bad observation"
    assert (
        faults[1]
        .describe()
        .startswith(f"env worker 1 (pid {pid1}) during step: exited with code 3")
    )

    pool.stop(0)
    pool.stop(1)
    for i in range(2):
        pool.start(i, _serve, (i,), tag="-again")
    pool.gather({0: "startup", 1: "startup"}, 30)
    pool.send(0, "sleep", 60)
    os.kill(pool.pids[1] or 0, signal.SIGKILL)
    start = time.monotonic()
    _, faults = pool.gather({0: "step", 1: "step"}, 0.5)
    assert time.monotonic() - start < 5
    assert faults[0].kind == "hung"
    assert "did not answer within 0.5 s, so it was killed" in faults[0].reason
    assert "in _stuck" in faults[0].details
    assert "was killed by signal SIGKILL" in faults[1].reason
    message = describe_faults(faults, "a hint")
    assert message.index("env worker 0") < message.index("env worker 1")
    assert message.endswith("\na hint")
    assert "its stack when it stopped answering" in message
    assert _gone(pid0)


def test_close_stops_every_worker_and_removes_the_stack_files(pool: WorkerPool) -> None:
    pool.gather({0: "startup", 1: "startup"}, 30)
    pids = pool.pids
    pool.send(1, "sleep", 60)  # a worker that will not exit by itself
    pool.close(0.2)
    assert all(_gone(pid) for pid in pids)
    assert not pool.stack_dir.exists()


def test_trim_stack_keeps_the_frames_above_the_worker_main() -> None:
    dump = (
        "Current thread 0x1 (most recent call first):\n"
        '  File "env.py", line 3 in step\n'
        '  File "processes.py", line 9 in _worker_main\n'
        '  File "process.py", line 108 in run\n'
        "\nExtension modules: numpy\n"
    )
    assert trim_stack(dump).splitlines() == [
        "Current thread 0x1 (most recent call first):",
        '  File "env.py", line 3 in step',
        '  File "processes.py", line 9 in _worker_main',
    ]
