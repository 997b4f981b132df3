"""One YAML entry point: a file ``rlfleet train FILE.yaml`` takes, in either of two formats.

- a **run config**, what a run directory's ``config.yaml`` and ``rlfleet tune``'s
  ``best.yaml`` hold (:class:`~rlfleet.runs.config.RunConfig`: ``algo``, ``env``,
  ``hyperparameters``, ``trainer``, ...);
- **ML-Agents run options** (:class:`~rlfleet.runs.run_options.RunOptions`: ``behaviors``,
  ``env_settings``, ``checkpoint_settings``, ...).

The format is recognised by the file's top-level keys: those only a run config has, or those
only run options have (ML-Agents' own ``engine_settings`` and ``debug`` count as run options:
they are accepted there and noted as ignored). ``environment_parameters`` belongs to both
and decides nothing. An error found while reading the file says which format it was read as;
a file that matches neither, or both, gets one ConfigError naming the keys of each.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from rlfleet.config.located import parse_yaml, read_config_text
from rlfleet.errors import ConfigError
from rlfleet.runs.config import RUN_CONFIG_KEYS
from rlfleet.runs.run_options import RunOptions

RunFileFormat = Literal["run config", "ML-Agents run options"]
RUN_CONFIG: RunFileFormat = "run config"
RUN_OPTIONS: RunFileFormat = "ML-Agents run options"
RUN_OPTIONS_KEYS: tuple[str, ...] = (
    *(f.name for f in fields(RunOptions)),
    "engine_settings",
    "debug",
)
"""The top-level keys of run options (with ML-Agents' ``engine_settings`` and ``debug``)."""
_ONLY = {
    RUN_CONFIG: sorted(set(RUN_CONFIG_KEYS) - set(RUN_OPTIONS_KEYS)),
    RUN_OPTIONS: sorted(set(RUN_OPTIONS_KEYS) - set(RUN_CONFIG_KEYS)),
}


@dataclass(frozen=True)
class RunFile:
    """A YAML file read once, with the format its top-level keys say it has."""

    path: Path
    format: RunFileFormat
    data: Any
    """The parsed document (line-aware, see :mod:`rlfleet.config.located`)."""


def read_run_file(path: str | Path) -> RunFile:
    """Read ``path`` and recognise its format (see the module docstring)."""
    path = Path(path)
    text = read_config_text(path, "the file")
    data = parse_yaml(text, str(path))
    keys = set(data) if isinstance(data, dict) else set()
    found = [name for name, only in _ONLY.items() if keys & set(only)]
    formats = (
        f"a run config (keys {', '.join(RUN_CONFIG_KEYS)}) or ML-Agents run options "
        f"(keys {', '.join(RUN_OPTIONS_KEYS)})"
    )
    if not found:
        what = f"top-level keys {sorted(map(str, keys))}" if keys else "no top-level keys"
        raise ConfigError(f"{path}: expected {formats}; found {what}")
    if len(found) > 1:
        both = sorted(str(k) for k in keys if k in _ONLY[RUN_CONFIG] or k in _ONLY[RUN_OPTIONS])
        raise ConfigError(f"{path}: expected {formats}, not a mix of both (found {both})")
    return RunFile(path, found[0], data)


@contextmanager
def reading_as(run_file: RunFile) -> Iterator[None]:
    """Errors about the file's settings inside this block say which format it was read as."""
    try:
        yield
    except ConfigError as err:
        raise ConfigError(f"read as {_article(run_file.format)}: {err}") from None


def _article(name: RunFileFormat) -> str:
    return "a run config" if name == RUN_CONFIG else name
