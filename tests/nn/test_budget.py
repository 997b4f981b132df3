"""The lower bound on network parameters that refuses impossible sizes before any is built."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlfleet.algos.ppo import PPOConfig
from rlfleet.nn.budget import parameter_lower_bound
from rlfleet.nn.mlp import mlp
from rlfleet.rewards.settings import SignalNetworkSettings


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_an_mlp_has_at_least_the_bound() -> None:
    for sizes in [(64, 64), (7,), (3, 5, 11)]:
        bound = parameter_lower_bound({"hidden_sizes": sizes})
        assert bound <= _count(mlp(1, sizes, 1, "tanh"))
        assert bound > 0


def test_an_lstm_has_at_least_the_bound() -> None:
    bound = parameter_lower_bound({"lstm_hidden_size": 32})
    assert 0 < bound <= _count(torch.nn.LSTM(1, 32))


def test_hidden_units_times_num_layers_matches_the_list_form() -> None:
    settings = SignalNetworkSettings(hidden_units=16, num_layers=3)
    assert parameter_lower_bound(settings) == parameter_lower_bound(
        {"hidden_sizes": settings.hidden_sizes}
    )
    # Computed without building a list of num_layers widths.
    assert parameter_lower_bound({"hidden_units": 2, "num_layers": 10**12}) > 10**12


@dataclass
class _Nested:
    actor: dict[str, tuple[int, ...]] = field(default_factory=lambda: {"hidden_sizes": (8,)})
    critic: list[dict[str, int]] = field(default_factory=lambda: [{"lstm_hidden_size": 4}])


def test_nested_settings_are_searched() -> None:
    assert parameter_lower_bound(_Nested()) == parameter_lower_bound(
        {"hidden_sizes": (8,)}
    ) + parameter_lower_bound({"lstm_hidden_size": 4})
    assert parameter_lower_bound(PPOConfig(hidden_sizes=(1000, 1000))) >= 1000 * 1000
    assert parameter_lower_bound(None) == 0
