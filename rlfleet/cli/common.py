"""What every command shares: the consoles it prints to, and the checks of ``--device``,
``--seed`` and of numeric flags with bounds."""

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


def check_flags(*flags: tuple[str, float | None, float, float | None]) -> None:
    """Refuse a numeric flag out of its bounds before anything runs: each ``(flag, value,
    least, most)`` (``most`` None: no upper bound; ``value`` None: not given). An episode
    count of 0 would otherwise play nothing and succeed, and a library's own refusal would
    name its argument instead of the flag."""
    for flag, value, least, most in flags:
        if value is None:
            continue
        if most is None and value < least:
            raise ConfigError(f"{flag}: expected a number >= {least:g}, got {_shown(value)}")
        if most is not None and not least <= value <= most:
            raise ConfigError(
                f"{flag}: expected a number from {least:g} to {most:g}, got {_shown(value)}"
            )


def _shown(value: float) -> str:
    """A flag's value as given: an integer in full (``:g`` would print 2**64 as
    1.84467e+19), a float in its shortest form."""
    return str(value) if isinstance(value, int) else f"{value:g}"
