"""Action distributions: sampling frequencies and log-densities against references."""

from __future__ import annotations

import math

import torch

from rlfleet.nn import distributions as D


def test_categorical_sample_follows_the_softmax() -> None:
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.7]])).expand(200_000, 3)
    generator = torch.Generator().manual_seed(0)
    actions, log_probs = D.categorical_sample(logits, generator)
    freq = torch.bincount(actions, minlength=3).double() / actions.numel()
    torch.testing.assert_close(
        freq, torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64), atol=4e-3, rtol=0
    )
    torch.testing.assert_close(log_probs, torch.log(torch.tensor([0.1, 0.2, 0.7]))[actions])


def test_categorical_greedy_and_log_prob_entropy() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    actions, log_prob = D.categorical_greedy(logits)
    assert actions.tolist() == [1]
    expected = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(log_prob, expected.log_prob(actions))
    lp, entropy = D.categorical_log_prob_entropy(logits, torch.tensor([2]))
    torch.testing.assert_close(lp, expected.log_prob(torch.tensor([2])))
    torch.testing.assert_close(entropy, expected.entropy())


def test_gaussian_matches_torch_normal() -> None:
    mean = torch.tensor([[0.5, -1.0]])
    log_std = torch.tensor([0.1, -0.3])
    actions = torch.tensor([[0.7, -0.2]])
    lp, entropy = D.gaussian_log_prob_entropy(mean, log_std, actions)
    normal = torch.distributions.Normal(mean, log_std.exp())
    torch.testing.assert_close(lp, normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, normal.entropy().sum(-1))
    samples = D.gaussian_sample(mean.expand(100_000, 2), log_std, torch.Generator().manual_seed(1))
    assert math.isclose(float(samples[:, 0].std()), math.exp(0.1), rel_tol=0.02)
