"""Device strings: a typo or a device this machine lacks is one ConfigError naming both."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.errors import ConfigError
from rlfleet.nn.device import available_devices, resolve_device


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make this machine look like it has two CUDA devices (nothing is ever moved there)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_cpu_is_always_available() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert available_devices()[0] == "cpu"


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("gpu", "--device: 'gpu' is not a torch device (expected one of: cpu"),
        ("CPU", "'CPU' is not a torch device"),
        ("cuda:x", "'cuda:x' is not a torch device"),
        ("", "'' is not a torch device"),
        ("meta", "rlfleet does not train on 'meta' devices"),
        (0, "expected a device string such as 'cpu', got 0"),
    ],
)
def test_unknown_devices_are_refused(device: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_device(device, "--device")  # type: ignore[arg-type]
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_device_this_machine_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"device 'cuda' is not available .* one of: cpu$"):
        resolve_device("cuda")
    # Only the spelling is checked for a config that is read, not trained.
    assert resolve_device("cuda:1", check_available=False) == torch.device("cuda:1")


def test_cuda_devices_up_to_the_count(two_gpus: None) -> None:
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ConfigError, match="this machine has 2 cuda device") as info:
        resolve_device("cuda:2")
    assert "expected one of: cpu, cuda, cuda:0, cuda:1" in str(info.value)


def test_an_algorithm_refuses_a_missing_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    with pytest.raises(ConfigError, match="device 'cuda' is not available"):
        PPO(box, gym.spaces.Discrete(2), PPOConfig(), device="cuda")
