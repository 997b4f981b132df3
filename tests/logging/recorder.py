"""A metrics writer stand-in (``write(row, step)``, ``close()``) that keeps what it is given."""

from __future__ import annotations

from typing import Any


class Recorder:
    """Keeps a copy of every row with its step; ``fail``: ``close`` raises, as a full disk would."""

    def __init__(self, fail: bool = False) -> None:
        self.rows: list[tuple[dict[str, Any], int]] = []
        self.closed = False
        self.fail = fail

    def write(self, row: dict[str, Any], step: int) -> None:
        self.rows.append((dict(row), step))  # a copy: what was written, not what the row became

    def close(self) -> None:
        self.closed = True
        if self.fail:
            raise OSError("disk full")
