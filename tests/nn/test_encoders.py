"""Custom encoders: a factory's module replaces the built-in encoder in the algorithms that
support it, is trained with them, and is needed again to load them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import nn

import rlfleet
from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.algos.registry import algorithms_supporting_custom_encoders
from rlfleet.errors import CheckpointError, ConfigError
from rlfleet.nn.encoders import CustomEncoder, make_encoder
from rlfleet.nn.obs import ObsLayout

OBS = spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTIONS = spaces.Discrete(2)


class Features(nn.Module):
    """A small custom encoder: one tanh layer of 16 features."""

    def __init__(self, layout: ObsLayout) -> None:
        super().__init__()
        self.layer = nn.Linear(layout.shape[0], 16)
        self.out_features = 16

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.layer(obs))


def _custom_parameters(algo: rlfleet.Algorithm[object]) -> list[torch.Tensor]:
    return [
        p
        for module in algo.modules().values()
        for m in module.modules()
        if isinstance(m, CustomEncoder)
        for p in m.parameters()
    ]


def test_make_encoder_wraps_the_factory_module() -> None:
    encoder = make_encoder(ObsLayout(OBS), custom=Features)
    assert isinstance(encoder, CustomEncoder)
    assert encoder.out_features == 16
    assert encoder(torch.zeros(3, 4)).shape == (3, 16)


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda layout: "not a module", "expected a torch.nn.Module"),
        (lambda layout: nn.Identity(), "needs an int attribute out_features"),
    ],
)
def test_a_factory_that_breaks_the_contract_is_refused(factory: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_encoder(ObsLayout(OBS), custom=factory)  # type: ignore[arg-type]


class _Double(nn.Module):
    """``inner``'s output in float64."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).double()  # type: ignore[no-any-return]


def _claiming(width: int, module: nn.Module) -> nn.Module:
    module.out_features = width  # type: ignore[assignment]
    return module


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda layout: _claiming(8, nn.Linear(4, 16)), r"to a \[2, 16\] torch.float32 tensor"),
        (
            lambda layout: _claiming(16, nn.Linear(4, 16, dtype=torch.float64)),
            "failed on a batch of shape",  # float64 weights, float32 input
        ),
        (
            lambda layout: _claiming(16, nn.Sequential(nn.Linear(4, 16), nn.Flatten(0))),
            r"to a \[32\] torch.float32 tensor; expected a \[2, 16\] float32",
        ),
        (
            lambda layout: _claiming(16, _Double(nn.Linear(4, 16))),
            r"to a \[2, 16\] torch.float64 tensor; expected a \[2, 16\] float32",
        ),
    ],
    ids=["wrong-width", "raises", "wrong-shape", "wrong-dtype"],
)
def test_an_encoder_whose_output_breaks_the_contract_is_refused_when_built(
    factory: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        get_algorithm("ppo")(OBS, ACTIONS, encoder=factory)  # type: ignore[arg-type]


def test_the_output_check_leaves_batch_statistics_and_the_seeded_weights_alone() -> None:
    def normed(layout: ObsLayout) -> nn.Module:
        return _claiming(4, nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5)))

    first = get_algorithm("ppo")(OBS, ACTIONS, encoder=normed, seed=3)
    second = get_algorithm("ppo")(OBS, ACTIONS, encoder=normed, seed=3)
    assert torch.equal(first.parameters_vector(), second.parameters_vector())
    (norm,) = [m for m in first.modules()["net"].modules() if isinstance(m, nn.BatchNorm1d)]
    assert int(norm.num_batches_tracked) == 0
    assert norm.training


def test_the_supporting_algorithms_are_the_encoder_based_ones() -> None:
    assert algorithms_supporting_custom_encoders() == ["a2c", "acer", "ppo", "trpo"]


@pytest.mark.parametrize("name", algorithms_supporting_custom_encoders())
def test_the_custom_module_is_part_of_what_is_saved(name: str) -> None:
    algo = get_algorithm(name)(OBS, ACTIONS, encoder=Features)
    custom = _custom_parameters(algo)
    assert custom
    saved = {id(p) for module in algo.modules().values() for p in module.parameters()}
    assert all(id(p) in saved for p in custom)


@pytest.mark.parametrize(
    "name", sorted(set(list_algorithms()) - set(algorithms_supporting_custom_encoders()))
)
def test_the_other_algorithms_refuse_a_custom_encoder(name: str) -> None:
    cls = get_algorithm(name)
    action_space = cls.action_spaces[0]
    space = ACTIONS if action_space is spaces.Discrete else spaces.Box(-1, 1, (1,), np.float32)
    with pytest.raises(
        ConfigError, match=rf"^{name} .*takes no custom encoder; algorithms that do"
    ):
        cls(OBS, space, encoder=Features)


@pytest.mark.parametrize("name", algorithms_supporting_custom_encoders())
def test_learning_trains_the_custom_module(name: str) -> None:
    algo = get_algorithm(name)("CartPole-v1", encoder=Features)
    trained = [p for p in _custom_parameters(algo) if p.requires_grad]
    before = [p.detach().clone() for p in trained]
    algo.learn(1024)
    assert all(not torch.equal(b, p) for b, p in zip(before, trained, strict=True))


def test_loading_needs_the_factory_again(tmp_path: Path) -> None:
    algo = rlfleet.PPO(OBS, ACTIONS, encoder=Features)
    path = algo.save(tmp_path / "saved")
    with pytest.raises(CheckpointError, match=r"saved with the custom encoder .*Features; pass"):
        rlfleet.load(path)
    loaded = rlfleet.load(path, encoder=Features)
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 4)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs), algo.predict(obs))
    plain = rlfleet.PPO(OBS, ACTIONS).save(tmp_path / "plain")
    with pytest.raises(CheckpointError, match="saved with the built-in encoder"):
        rlfleet.load(plain, encoder=Features)


def test_loading_a_run_directory_needs_the_factory_again(tmp_path: Path) -> None:
    model = rlfleet.PPO("CartPole-v1", num_steps=32, batch_size=64, encoder=Features)
    model.learn(256, run_dir=tmp_path / "run")
    with pytest.raises(CheckpointError, match=r"saved with the custom encoder .*Features; pass"):
        rlfleet.load(tmp_path / "run")
    loaded = rlfleet.load(tmp_path / "run", encoder=Features)
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 4)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs), model.predict(obs))
