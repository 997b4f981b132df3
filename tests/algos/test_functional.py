"""Shared math against hand-computed references."""

from __future__ import annotations

import pytest
import torch

from rlfleet.algos.functional import clip_grad_norm, explained_variance, gae, weighted_mean


def test_gae_matches_hand_computation_with_termination_and_truncation() -> None:
    # One env, five steps, gamma 0.9, lambda 0.5.
    # t=0: mid-episode; t=1: terminated; t=2: reset step (first obs of a new episode);
    # t=3: truncated by a time limit whose final observation is worth 2.0; t=4: mid-episode.
    gamma, lam = 0.9, 0.5
    rewards = torch.tensor([[1.0], [2.0], [0.0], [3.0], [1.0]])
    values = torch.tensor([[0.5], [0.4], [7.0], [0.2], [0.1]])
    next_values = torch.tensor([[0.4], [7.0], [0.2], [2.0], [0.3]])
    terminated = torch.tensor([[0.0], [1.0], [0.0], [0.0], [0.0]])
    truncated = torch.tensor([[0.0], [0.0], [0.0], [1.0], [0.0]])

    # By hand, backwards:
    # t=4: delta = 1 + 0.9*0.3 - 0.1 = 1.17;                      A4 = 1.17
    # t=3: delta = 3 + 0.9*2.0 - 0.2 = 4.6 (bootstrap on timeout); A3 = 4.6 (episode cut)
    # t=2: delta = 0 + 0.9*0.2 - 7.0 = -6.82;                     A2 = -6.82 + 0.45*4.6 = -4.75
    # t=1: delta = 2 + 0 - 0.4 = 1.6 (terminal: no bootstrap);     A1 = 1.6 (episode cut)
    # t=0: delta = 1 + 0.9*0.4 - 0.5 = 0.86;                      A0 = 0.86 + 0.45*1.6 = 1.58
    expected = torch.tensor([[1.58], [1.6], [-4.75], [4.6], [1.17]])
    advantages, returns = gae(rewards, values, next_values, terminated, truncated, gamma, lam)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)


def test_gae_envs_are_independent() -> None:
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    values = torch.zeros(2, 2)
    next_values = torch.zeros(2, 2)
    done = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    advantages, _ = gae(rewards, values, next_values, done, torch.zeros(2, 2), 1.0, 1.0)
    # env 0: A1 = 1, A0 = 1 + 1 = 2; env 1 terminates at t=0: A0 = 0, A1 = 1.
    torch.testing.assert_close(advantages, torch.tensor([[2.0, 0.0], [1.0, 1.0]]))


def test_weighted_mean_ignores_masked_entries_and_survives_empty_mask() -> None:
    values = torch.tensor([1.0, 100.0, 3.0])
    assert float(weighted_mean(values, torch.tensor([1.0, 0.0, 1.0]))) == pytest.approx(2.0)
    assert float(weighted_mean(values, torch.zeros(3))) == 0.0


def test_explained_variance() -> None:
    target = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(target, target) == pytest.approx(1.0)
    assert explained_variance(torch.full((3,), 2.0), target) == pytest.approx(0.0)


def test_clip_grad_norm_matches_torch() -> None:
    torch.manual_seed(0)
    ours = [torch.randn(3, 4, requires_grad=True), torch.randn(5, requires_grad=True)]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    for group in (ours, theirs):
        for p in group:
            p.grad = torch.full_like(p, 3.0)
    norm = clip_grad_norm(ours, 0.5)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    torch.testing.assert_close(norm, expected)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    # Small gradients are left alone.
    small = [torch.zeros(2, requires_grad=True)]
    small[0].grad = torch.tensor([0.1, 0.1])
    clip_grad_norm(small, 1.0)
    torch.testing.assert_close(small[0].grad, torch.tensor([0.1, 0.1]))


def test_conjugate_gradient_solves_a_positive_definite_system() -> None:
    from rlfleet.algos.functional import conjugate_gradient

    generator = torch.Generator().manual_seed(0)
    m = torch.randn(6, 6, generator=generator, dtype=torch.float64)
    a = m @ m.T + 6 * torch.eye(6, dtype=torch.float64)
    b = torch.randn(6, generator=generator, dtype=torch.float64)
    x = conjugate_gradient(lambda v: a @ v, b, max_steps=6)
    torch.testing.assert_close(x, torch.linalg.solve(a, b))


def test_retrace_matches_hand_computation() -> None:
    from rlfleet.algos.functional import retrace

    # One env, gamma 0.5. t=0 mid-episode, t=1 truncated (final obs in row 2 worth 4.0),
    # t=2 a reset step, t=3 terminated; bootstrap value after the rollout 9.0 (unused).
    rewards = torch.tensor([[1.0], [2.0], [0.0], [3.0]])
    q_taken = torch.tensor([[0.5], [1.0], [0.0], [2.0]])
    values = torch.tensor([[0.7], [1.5], [4.0], [2.5], [9.0]])
    rho_bar = torch.tensor([[0.5], [1.0], [1.0], [0.2]])
    terminated = torch.tensor([[0.0], [0.0], [0.0], [1.0]])
    truncated = torch.tensor([[0.0], [1.0], [0.0], [0.0]])
    # Backwards: t=3: 3 (terminal). carry = 0.2*(3-2) + 2.5 = 2.7
    # t=2: 0 + 0.5*2.7 = 1.35.        carry = 1*(1.35-0) + 4.0 = 5.35
    # t=1: 2 + 0.5*4.0 = 4 (timeout). carry = 1*(4-1) + 1.5 = 4.5
    # t=0: 1 + 0.5*4.5 = 3.25
    expected = torch.tensor([[3.25], [4.0], [1.35], [3.0]])
    got = retrace(rewards, q_taken, values, rho_bar, terminated, truncated, 0.5)
    torch.testing.assert_close(got, expected)


def test_standardize_ignores_zero_weight_entries() -> None:
    from rlfleet.algos.functional import standardize

    values = torch.tensor([1.0, 3.0, 100.0])
    out = standardize(values, torch.tensor([1.0, 1.0, 0.0]))
    torch.testing.assert_close(out[:2], torch.tensor([-1.0, 1.0]), atol=1e-6, rtol=0)
