"""Worker processes that fail loudly and never hang: what every subprocess env shares.

:class:`WorkerPool` starts one process per env (or env copy), sends each a command through
its pipe and waits for the answers. An answer is ``(True, payload)`` or
``(False, traceback_text)``; a worker that raises, exits, is killed or does not answer within
a timeout becomes a :class:`Fault` naming the env index, the process id, the command, the exit
code or signal, and the remote traceback (or the Python stack :mod:`faulthandler` dumped for a
crash in native code or a hang). A death is seen at once, through the process sentinel.
Tracebacks travel as text formatted in the worker, never as pickled exceptions.

The worker side runs ``serve(conn, *args)`` inside :func:`_worker_main`, which ignores
Ctrl-C (the parent handles it and closes the workers), arms :mod:`faulthandler` on a file
the parent reads after a crash, dumps the stack there on ``SIGUSR1`` (sent to a hung worker
before it is killed), and :func:`commands` yields the commands until the parent says
``close`` or dies.

Used by :class:`rlfleet.envs.workers.WorkerVectorEnv` (Gymnasium envs) and
:class:`rlfleet.marl.workers.WorkerMultiAgentVecEnv` (PettingZoo envs). Gymnasium's
``AsyncVectorEnv`` has neither the per-worker fault reports nor hang timeouts on every call,
hence this module.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Literal

ORPHAN_CHECK_S = 1.0
"""How often an idle worker checks that its parent is still alive."""
STACK_DUMP_WAIT_S = 1.0
"""How long to wait for a hung worker to dump its stack before it is killed."""
STARTUP = "startup (building the env)"
SPEC_ERROR = "EnvSpecError: "
"""Starts a worker's answer when its env's outputs do not fit the expected API (the rest is
the one-line message), as opposed to a traceback."""

FaultKind = Literal["raised", "died", "hung"]
Serve = Callable[..., None]
"""``serve(conn, *args)``: the worker's body, answering the commands of :func:`commands`."""


@dataclass(frozen=True)
class Fault:
    """One worker's failure, as the parent saw it."""

    index: int
    pid: int | None
    command: str
    kind: FaultKind
    reason: str
    """One line: ``raised an exception``, ``exited with code 3``, ``was killed by ...``."""
    details: str
    """The remote traceback, or the stack faulthandler dumped; may be empty."""

    def describe(self) -> str:
        head = f"env worker {self.index} (pid {self.pid}) during {self.command}: {self.reason}"
        details = self.details.strip()
        if not details:
            return head + "; it left no traceback"
        label = {
            "raised": "remote traceback",
            "died": "the stack faulthandler dumped",
            "hung": "its stack when it stopped answering",
        }[self.kind]
        body = "\n".join("    " + line for line in details.splitlines())
        return f"{head}; {label}:\n{body}"


@dataclass
class Worker:
    """The parent's handle on one worker process."""

    process: multiprocessing.process.BaseProcess
    conn: Connection
    stack_path: Path


class WorkerPool:
    """The parent's side of ``num_workers`` worker processes (see the module docstring).

    Args:
        context: :mod:`multiprocessing` start method (``fork``, ``spawn``, ``forkserver``);
            the platform default when ``None``.
        name: process name prefix (``<name>-<index>``).
    """

    def __init__(self, context: str | None, name: str = "rlfleet-env-worker") -> None:
        self.ctx = multiprocessing.get_context(context)
        self.name = name
        self.workers: list[Worker] = []
        self.stack_dir = Path(tempfile.mkdtemp(prefix="rlfleet-workers-"))

    @property
    def pids(self) -> tuple[int | None, ...]:
        """Process ids of the current workers."""
        return tuple(w.process.pid for w in self.workers)

    def start(self, index: int, serve: Serve, args: tuple[Any, ...], tag: str = "") -> Worker:
        """Start worker ``index`` running ``serve(conn, *args)``; it replaces any worker
        ``index`` had (stop that one first). ``tag`` tells apart the stack files of
        successive workers of one index."""
        stack_path = self.stack_dir / f"env{index}{tag}.txt"
        parent_conn, child_conn = self.ctx.Pipe()
        process = self.ctx.Process(  # type: ignore[attr-defined]
            target=_worker_main,
            name=f"{self.name}-{index}",
            args=(serve, child_conn, str(stack_path), args),
            daemon=True,
        )
        process.start()
        # Only the child may hold its end: then the parent sees EOF when the child dies.
        child_conn.close()
        worker = Worker(process, parent_conn, stack_path)
        if index == len(self.workers):
            self.workers.append(worker)
        else:
            self.workers[index] = worker
        return worker

    def send(self, index: int, command: str, data: Any) -> None:
        """Send one command; a dead worker is reported by the next :meth:`gather`."""
        with contextlib.suppress(OSError):
            self.workers[index].conn.send((command, data))

    def gather(
        self, labels: dict[int, str], timeout: float
    ) -> tuple[dict[int, Any], dict[int, Fault]]:
        """Wait for one answer from each worker in ``labels``, at most ``timeout`` seconds.

        ``labels`` names what each worker was asked to do, for error messages. Returns the
        payloads of the answers and a fault for each worker that raised, died or did not
        answer in time (a worker that did not answer is killed).
        """
        deadline = time.monotonic() + timeout
        pending = set(labels)
        replies: dict[int, Any] = {}
        faults: dict[int, Fault] = {}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            owners: dict[Any, int] = {}
            for i in pending:
                owners[self.workers[i].conn] = i
                owners[self.workers[i].process.sentinel] = i
            for ready in wait(list(owners), remaining):
                i = owners[ready]
                if i in pending:
                    pending.discard(i)
                    answer = self._receive(i, labels[i])
                    if isinstance(answer, Fault):
                        faults[i] = answer
                    else:
                        replies[i] = answer[0]
        for i in sorted(pending):
            faults[i] = self._hung(i, labels[i], timeout)
        return replies, faults

    def stop(self, index: int) -> None:
        """Kill one worker at once and close its pipe."""
        stop_process(self.workers[index].process, grace_s=0.0)
        self.workers[index].conn.close()

    def close(self, timeout_s: float) -> None:
        """Stop every worker: ask, wait up to ``timeout_s`` in all, then terminate, then
        kill; remove the stack files."""
        for w in self.workers:
            if w.process.is_alive():
                with contextlib.suppress(OSError):  # already gone; reaped below
                    w.conn.send(("close", None))
        deadline = time.monotonic() + timeout_s
        for w in self.workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in self.workers:
            stop_process(w.process)
            w.conn.close()
        shutil.rmtree(self.stack_dir, ignore_errors=True)

    def _receive(self, index: int, command: str) -> tuple[Any] | Fault:
        """Read a worker's answer (as a 1-tuple), or describe why there is none."""
        w = self.workers[index]
        try:
            if w.conn.poll():
                ok, payload = w.conn.recv()
                if ok:
                    return (payload,)
                return Fault(
                    index, w.process.pid, command, "raised", "raised an exception", payload
                )
        except (EOFError, OSError):
            pass  # the pipe closed: the process is gone
        w.process.join(1.0)
        code = w.process.exitcode
        if code is None:
            reason = "closed its pipe without exiting"
        elif code < 0:
            reason = f"was killed by signal {_signal_name(-code)} (exit code {code})"
        else:
            reason = f"exited with code {code}"
        stack = trim_stack(_read(w.stack_path))
        return Fault(index, w.process.pid, command, "died", reason, stack)

    def _hung(self, index: int, command: str, timeout: float) -> Fault:
        """Ask a worker that did not answer for its stack, then kill it."""
        w = self.workers[index]
        usr1 = getattr(signal, "SIGUSR1", None)
        stack = ""
        if usr1 is not None and w.process.pid is not None and w.process.is_alive():
            os.kill(w.process.pid, usr1)
            deadline = time.monotonic() + STACK_DUMP_WAIT_S
            while not stack and time.monotonic() < deadline:
                time.sleep(0.02)
                stack = _read(w.stack_path)
        stop_process(w.process, grace_s=0.0)
        reason = f"did not answer within {timeout:g} s, so it was killed"
        return Fault(index, w.process.pid, command, "hung", reason, trim_stack(stack))


def describe_faults(faults: dict[int, Fault], hint: str = "") -> str:
    """One message for several faults, in env order, with an optional hint line."""
    message = "\n".join(faults[i].describe() for i in sorted(faults))
    return f"{message}\n{hint}" if hint else message


def spec_error(faults: dict[int, Fault]) -> str | None:
    """The message of the first fault that is an env spec error (:data:`SPEC_ERROR`)."""
    for i in sorted(faults):
        details = faults[i].details
        if faults[i].kind == "raised" and details.startswith(SPEC_ERROR):
            return details.removeprefix(SPEC_ERROR)
    return None


def stop_process(process: multiprocessing.process.BaseProcess, grace_s: float = 1.0) -> None:
    """Make sure a process has ended and is reaped: terminate, then kill."""
    if process.is_alive():
        process.terminate()
        process.join(grace_s)
    if process.is_alive():
        process.kill()
    process.join()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def trim_stack(text: str) -> str:
    """Drop what a faulthandler dump holds below the worker's main loop: multiprocessing's
    bootstrap, the parent's frames a forked worker inherited, the extension module list."""
    kept: list[str] = []
    below_main = False
    for line in text.rstrip().splitlines():
        if line.startswith(("Thread ", "Current thread ", "Extension modules:")):
            below_main = False
        if line.startswith("Extension modules:"):
            continue
        if not below_main:
            kept.append(line)
        below_main = below_main or line.rstrip().endswith(" in _worker_main")
    return "\n".join(kept).strip()


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def commands(conn: Connection) -> Iterator[tuple[str, Any]]:
    """The worker's commands, until the parent sends ``close`` or dies without closing it."""
    # The pid of the process that started this one, even if it died before this line.
    starter = multiprocessing.parent_process()
    parent = starter.pid if starter is not None else os.getppid()
    while True:
        if not conn.poll(ORPHAN_CHECK_S):
            if os.getppid() != parent:
                return
            continue
        command, data = conn.recv()
        if command == "close":
            return
        yield command, data


def _worker_main(serve: Serve, conn: Connection, stack_path: str, args: tuple[Any, ...]) -> None:
    """A worker process: arm the crash and hang reports, then run ``serve(conn, *args)``."""
    # Ctrl-C reaches the whole process group; the parent handles it and closes the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(stack_path, "w") as stack_file:
        # A library may have replaced the parent's SIGSEGV handler after faulthandler was
        # enabled there: the fork inherits that handler while faulthandler still counts
        # itself enabled, and enable() would then only change its file. Start over.
        faulthandler.disable()
        faulthandler.enable(stack_file, all_threads=True)
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, stack_file, all_threads=True)
        serve(conn, *args)
