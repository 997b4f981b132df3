"""Versioned files of a run directory: a file a resumed run changes is never overwritten.

A run directory's ``config.yaml`` is the config the run started with. A resume that changes the
config writes the new one next to it as ``config.1.yaml``, the next change ``config.2.yaml``,
and so on; the *current* config is the one with the highest number (``config.yaml`` while
there is none). Every reader of a run directory (``rlfleet eval``, ``play``, ``plot``, a later
``--resume``) takes the current one, through :func:`current_version`.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlfleet.errors import RunDirError


def _split(name: str) -> tuple[str, str]:
    """``config.yaml`` -> (``config``, ``.yaml``)."""
    path = Path(name)
    return path.stem, path.suffix


def versions(directory: str | Path, name: str) -> list[tuple[int, Path]]:
    """The versions of file ``name`` in ``directory``, oldest first: ``(0, name)`` for the
    file itself, then ``(n, stem.n.suffix)`` for each numbered one. A directory the operating
    system cannot look into (a name too long, no permission) is a :class:`RunDirError`."""
    directory = Path(directory)
    stem, suffix = _split(name)
    pattern = re.compile(rf"{re.escape(stem)}\.([1-9][0-9]*){re.escape(suffix)}")
    try:
        found = [(0, directory / name)] if (directory / name).is_file() else []
        if directory.is_dir():
            for path in directory.iterdir():
                match = pattern.fullmatch(path.name)
                if match is not None and path.is_file():
                    found.append((int(match.group(1)), path))
    except OSError as exc:  # a name too long, a directory that cannot be listed
        raise RunDirError(
            f"{directory}: cannot be read ({exc.strerror}) — expected a run directory written "
            "by `rlfleet train`"
        ) from None
    return sorted(found)


def current_version(directory: str | Path, name: str) -> Path:
    """The current version of file ``name`` in ``directory``: the highest-numbered one, else
    ``name`` itself (which need not exist)."""
    found = versions(directory, name)
    return found[-1][1] if found else Path(directory) / name


def next_version(directory: str | Path, name: str) -> Path:
    """Where the next version of file ``name`` goes: ``name`` itself while it does not exist,
    else ``stem.N.suffix`` one past the highest number."""
    found = versions(directory, name)
    if not found:
        return Path(directory) / name
    stem, suffix = _split(name)
    return Path(directory) / f"{stem}.{found[-1][0] + 1}{suffix}"
