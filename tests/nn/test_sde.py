"""gSDE: noise that is a function of the state, held for a period, whose per-state
distribution is the Gaussian the log-probabilities use; a process whose one counter is its
state."""

from __future__ import annotations

import torch

from rlfleet.nn.sde import SDE_VARIANCE_FLOOR, StateDependentNoise, sde_log_std


def test_the_matrices_are_held_for_a_period_then_redrawn() -> None:
    noise = StateDependentNoise(latent_dim=4, action_dim=2, seed=0, period=3)
    log_std = torch.zeros(4, 2)
    latent = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    shifts = [noise.perturbation(latent, log_std) for _ in range(7)]
    assert shifts[0].shape == (5, 2)
    assert torch.equal(shifts[0], shifts[1])
    assert torch.equal(shifts[0], shifts[2])
    assert not torch.equal(shifts[2], shifts[3])
    assert torch.equal(shifts[3], shifts[5])
    assert noise.step == 7
    # The same matrices read other states differently: the noise depends on the state.
    other = noise.perturbation(latent.flip(0), log_std)
    assert not torch.equal(other, shifts[6].flip(0))


def test_the_same_seed_and_step_give_the_same_noise_whatever_came_before() -> None:
    latent = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    log_std = torch.full((4, 1), -0.5)
    a = StateDependentNoise(4, 1, seed=7, period=2)
    first = [a.perturbation(latent, log_std) for _ in range(9)]
    b = StateDependentNoise(4, 1, seed=7, period=2)
    b.step = 6  # what a checkpoint restores
    assert torch.equal(b.perturbation(latent, log_std), first[6])
    other = StateDependentNoise(4, 1, seed=8, period=2)
    assert not torch.equal(other.perturbation(latent, log_std), first[0])


def test_the_noise_of_one_state_has_the_variance_the_log_std_gives() -> None:
    """Over many draws of the matrices, the perturbation of a fixed state is Gaussian with
    variance ``z**2 @ sigma**2`` per action dimension: what :func:`sde_log_std` gives."""
    latent = torch.tensor([[0.5, -1.0, 2.0]])
    log_std = torch.tensor([[-1.0, 0.0], [0.5, -0.5], [-2.0, 0.2]])
    noise = StateDependentNoise(3, 2, seed=0, period=1)
    draws = torch.cat([noise.perturbation(latent, log_std) for _ in range(20_000)])
    expected = torch.exp(2 * sde_log_std(latent, log_std))[0]
    assert torch.allclose(draws.mean(0), torch.zeros(2), atol=0.05)
    assert torch.allclose(draws.var(0), expected, rtol=0.05)
    assert torch.allclose(expected, latent[0].pow(2) @ torch.exp(2 * log_std) + SDE_VARIANCE_FLOOR)


def test_only_the_log_std_learns_through_the_std() -> None:
    latent = torch.randn(4, 3, requires_grad=True)
    log_std = torch.zeros(3, 2, requires_grad=True)
    sde_log_std(latent, log_std).sum().backward()
    assert log_std.grad is not None
    assert log_std.grad.abs().sum() > 0
    assert latent.grad is None
