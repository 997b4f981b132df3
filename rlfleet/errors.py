"""Typed exceptions: each names what was expected, what was received, and where.

Every error rlfleet raises on bad input derives from :class:`RlfleetError`, so the CLI
can print it as one line without a traceback.

A message that tells the user what to set names it with :func:`option`, so the same message
says ``force=True`` to a Python caller and ``--force`` inside the ``rlfleet`` command.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_cli_wording: ContextVar[bool] = ContextVar("rlfleet_cli_wording", default=False)


def option(name: str, value: str | None = "True", *, flag: str | None = None) -> str:
    """How a message names the setting ``name``: ``name=value`` for a Python caller; inside
    :func:`cli_wording`, its command-line flag (``flag``, by default ``--name`` with hyphens)
    followed by ``value`` unless that is ``"True"`` (a switch). ``value=None`` names the
    setting alone (``name``, or the bare flag)."""
    if _cli_wording.get():
        cli = flag or "--" + name.replace("_", "-")
        return cli if value in (None, "True") else f"{cli} {value}"
    return name if value is None else f"{name}={value}"


@contextmanager
def cli_wording() -> Iterator[None]:
    """Within this block, :func:`option` names command-line flags (the ``rlfleet`` command
    runs every subcommand in it)."""
    token = _cli_wording.set(True)
    try:
        yield
    finally:
        _cli_wording.reset(token)


class RlfleetError(Exception):
    """Base class of every error rlfleet raises on bad input or a broken run."""


class ConfigError(RlfleetError, ValueError):
    """A configuration value, file or command-line flag is invalid."""


class EnvSpecError(RlfleetError, ValueError):
    """An environment id, space or env behaviour does not fit what was asked of it."""


class CheckpointError(RlfleetError):
    """A checkpoint or run directory is missing, truncated, tampered with or incompatible."""


class RunDirError(RlfleetError):
    """A run directory cannot be used as asked (exists without resume/force, not a run, ...)."""


class NonFiniteError(RlfleetError, FloatingPointError):
    """A NaN or infinity appeared in an observation, reward, loss or gradient."""


class EnvWorkerError(RlfleetError):
    """An environment worker process died, raised or stopped answering."""


class MissingDependencyError(RlfleetError, ImportError):
    """An optional dependency is needed for the requested feature but is not installed."""


class StorageError(RlfleetError):
    """A study's storage (SQLite file or database server) cannot be reached or used."""


class ClusterError(RlfleetError, ConnectionError):
    """A Ray cluster cannot be reached, or its rollout actors or learners were lost."""


class InsufficientMemoryError(RlfleetError, MemoryError):
    """Something (a replay buffer) would need more memory than the machine has available."""


class DatasetError(RlfleetError, ValueError):
    """An offline dataset is missing, malformed, empty, non-finite or does not fit the env."""
