"""The transition source interface: the replay buffer and the reward-signal replay both
provide every member an off-policy update may call (mypy checks the signatures)."""

from __future__ import annotations

import inspect

import pytest

from rlfleet.data.replay import ReplayBuffer
from rlfleet.data.source import TransitionSource
from rlfleet.rewards.replay import SignalReplay

MEMBERS = ["__len__", "sample", "update_priorities"]


def test_the_interface_lists_what_updates_call() -> None:
    assert all(callable(getattr(TransitionSource, name)) for name in MEMBERS)


@pytest.mark.parametrize("source", [ReplayBuffer, SignalReplay])
def test_buffer_and_signal_replay_are_transition_sources(source: type) -> None:
    for name in MEMBERS:
        expected = inspect.signature(getattr(TransitionSource, name))
        assert inspect.signature(getattr(source, name)).parameters.keys() == (
            expected.parameters.keys()
        ), name
