"""Command lines for tests that send Ctrl-C (SIGINT) to a child process.

A shell starts a program with SIGINT at its default disposition, which Python turns into
KeyboardInterrupt. A child inherits an *ignored* SIGINT, though, and the test process may
have one: a non-interactive shell starts background jobs that way, and a library loaded by an
earlier test may set it. Such a child would never see the Ctrl-C the test sends, so the
command line below puts Python's handler back before it runs the module.
"""

from __future__ import annotations

import sys

_LAUNCHER = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "module = sys.argv.pop(1); runpy.run_module(module, run_name='__main__', alter_sys=True)"
)


def python_module(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS``, taking Ctrl-C as if a shell had started it."""
    return [sys.executable, "-c", _LAUNCHER, module, *args]
