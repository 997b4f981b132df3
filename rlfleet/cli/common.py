"""What every command shares: the consoles it prints to, and the check of a ``--device``."""

from __future__ import annotations

from rich.console import Console

from rlfleet.nn.device import resolve_device

out = Console(highlight=False, soft_wrap=True)
"""Results, on stdout."""
err = Console(stderr=True, highlight=False, soft_wrap=True)
"""Errors and notes, on stderr."""


def device_flag(flag: str | None) -> str | None:
    """A ``--device`` flag, checked before a run is loaded (None: the run's own device)."""
    if flag is not None:
        resolve_device(flag, "--device")
    return flag
