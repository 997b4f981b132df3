"""The ``reward_signals`` of run options and of a run config: extrinsic, curiosity, RND,
GAIL (see :mod:`rlfleet.rewards.settings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlfleet.rewards.settings import RewardSignalsSettings, default_reward_signals
from rlfleet.runs.options_reader import KeyPath, OptionsReader


def read_reward_signals(reader: OptionsReader, data: Any, path: KeyPath) -> RewardSignalsSettings:
    """The settings (none: the extrinsic reward alone); a GAIL demonstration file must exist."""
    if data is None:
        return default_reward_signals()
    signals = reader.build(RewardSignalsSettings, data, path)
    if signals.gail is not None and not Path(signals.gail.demo_path).is_file():
        raise reader.error(
            (*path, "gail", "demo_path"),
            f"demonstration file {signals.gail.demo_path!r} not found (relative paths "
            "start at the working directory)",
        )
    return signals


def parse_reward_signals(data: Any, where: str) -> RewardSignalsSettings:
    """The ``reward_signals`` section of a run config (``where`` starts error messages)."""
    return read_reward_signals(OptionsReader(data, where, {}), data, ())
