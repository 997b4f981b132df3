"""Typed exceptions: each names what was expected, what was received, and where.

Every error rlfleet raises on bad input derives from :class:`RlfleetError`, so the CLI
can print it as one line without a traceback.
"""

from __future__ import annotations


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
