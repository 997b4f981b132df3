"""Colored exploration noise: its spectrum, and a process whose one counter is its state."""

from __future__ import annotations

import pytest
import torch

from rlfleet.nn.noise import ColoredNoise, next_noise, powerlaw_noise


def _lag_one(x: torch.Tensor) -> float:
    centred = x - x.mean(-1, keepdim=True)
    return float((centred[..., 1:] * centred[..., :-1]).mean() / centred.pow(2).mean())


@pytest.mark.parametrize("length", [1000, 1001])
def test_white_noise_is_independent_and_colored_noise_is_correlated(length: int) -> None:
    generator = torch.Generator().manual_seed(0)
    white, pink, red = (powerlaw_noise(b, (64, 2), length, generator) for b in (0.0, 1.0, 2.0))
    for x in (white, pink, red):
        assert x.shape == (64, 2, length)
        assert 0.8 < float(x.std()) < 1.25
    assert abs(_lag_one(white)) < 0.02
    assert _lag_one(pink) > 0.5
    assert _lag_one(red) > _lag_one(pink)


def test_the_same_seed_and_step_give_the_same_noise_whatever_came_before() -> None:
    a = ColoredNoise(1.0, 3, seed=7, length=16)
    first = [a.sample(4, torch.device("cpu")).clone() for _ in range(40)]
    assert first[0].shape == (4, 3)
    assert a.step == 40
    b = ColoredNoise(1.0, 3, seed=7, length=16)
    b.step = 37  # what a checkpoint restores
    assert torch.equal(b.sample(4, torch.device("cpu")), first[37])
    other = ColoredNoise(1.0, 3, seed=8, length=16)
    assert not torch.equal(other.sample(4, torch.device("cpu")), first[0])


def test_greedy_acting_and_white_noise_use_no_step() -> None:
    noise = ColoredNoise(1.0, 1, seed=0)
    assert next_noise(noise, True, 2, torch.device("cpu")) is None
    assert noise.step == 0
    assert next_noise(None, False, 2, torch.device("cpu")) is None
    drawn = next_noise(noise, False, 2, torch.device("cpu"))
    assert drawn is not None
    assert drawn.shape == (2, 1)
    assert noise.step == 1
