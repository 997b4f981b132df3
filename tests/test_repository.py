"""Repository hygiene: what is committed is finished text."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# A conflict marker is seven of <, = or > at the start of a line; the opening and closing
# ones carry the side's name. A bare "=======" is also a Markdown heading underline, so it
# counts only between an opening and a closing marker.
OPENING = re.compile(r"^<{7}( |$)")
CLOSING = re.compile(r"^>{7}( |$)")


def _tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def conflict_markers(text: str) -> list[int]:
    """Line numbers (1-based) of merge-conflict markers in ``text``."""
    return [
        number
        for number, line in enumerate(text.splitlines(), start=1)
        if OPENING.match(line) or CLOSING.match(line)
    ]


def test_conflict_markers_are_found() -> None:
    text = "a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> branch\nTitle\n=======\n"
    assert conflict_markers(text) == [2, 6]


def test_no_tracked_file_holds_conflict_markers() -> None:
    found = []
    for path in _tracked_files():
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary files (parquet, images) cannot hold a text conflict
        found += [f"{path.relative_to(ROOT)}:{n}" for n in conflict_markers(text)]
    assert not found, f"merge-conflict markers committed: {found}"


def test_the_package_never_unpickles() -> None:
    forbidden = re.compile(
        r"pickle\.loads?\(|cloudpickle|allow_pickle=True|weights_only=False|(?<![\w.])torch\.load\((?![^)]*weights_only=True)"
    )
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in (ROOT / "rlfleet").rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if forbidden.search(line)
    ]
    assert not offenders, offenders
