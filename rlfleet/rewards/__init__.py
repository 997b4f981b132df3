"""Reward signals: extrinsic, curiosity (ICM), RND and GAIL, and how they are combined."""

from rlfleet.rewards.base import RewardSignal, Transitions
from rlfleet.rewards.demonstrations import (
    Demonstrations,
    load_demonstrations,
    record_demonstrations,
    save_demonstrations,
)
from rlfleet.rewards.settings import (
    CuriositySettings,
    ExtrinsicSettings,
    GAILSettings,
    RewardSignalsSettings,
    RNDSettings,
    SignalNetworkSettings,
)
from rlfleet.rewards.signals import RewardSignals

__all__ = [
    "CuriositySettings",
    "Demonstrations",
    "ExtrinsicSettings",
    "GAILSettings",
    "RNDSettings",
    "RewardSignal",
    "RewardSignals",
    "RewardSignalsSettings",
    "SignalNetworkSettings",
    "Transitions",
    "load_demonstrations",
    "record_demonstrations",
    "save_demonstrations",
]
