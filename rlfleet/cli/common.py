"""What every command shares: the consoles it prints to, and the checks of ``--device`` and
``--seed``."""

from __future__ import annotations

from rich.console import Console

from rlfleet.config.fields import MAX_SEED
from rlfleet.errors import ConfigError

out = Console(highlight=False, soft_wrap=True)
"""Results, on stdout."""
err = Console(stderr=True, highlight=False, soft_wrap=True)
"""Errors and notes, on stderr."""


def device_flag(flag: str | None) -> str | None:
    """A ``--device`` flag, checked before a run is loaded (None: the run's own device)."""
    # Imported here: torch, which `rlfleet --help` (that imports this module) does without.
    from rlfleet.nn.device import resolve_device

    if flag is not None:
        resolve_device(flag, "--device")
    return flag


def seed_flag(seed: int) -> int:
    """A ``--seed`` flag, checked against the range every seeded library takes (torch
    overflows beyond it, gymnasium refuses a negative seed)."""
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed must be an integer from 0 to {MAX_SEED}, got {seed}")
    return seed
