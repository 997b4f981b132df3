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


def test_multi_discrete_and_bernoulli_heads_match_torch_distributions() -> None:
    import numpy as np
    from gymnasium import spaces

    from rlfleet.nn.action_head import ActionHead

    generator = torch.Generator().manual_seed(0)
    head = ActionHead(spaces.MultiDiscrete([3, 2, 4]))
    logits = torch.randn(5, 9, generator=generator)
    actions, log_probs = head.sample(logits, generator)
    parts = torch.split(logits, [3, 2, 4], dim=1)
    dists = [torch.distributions.Categorical(logits=p) for p in parts]
    expected = sum(d.log_prob(actions[:, i]) for i, d in enumerate(dists))
    torch.testing.assert_close(log_probs, expected)
    _, entropy = head.log_prob_entropy(logits, actions)
    torch.testing.assert_close(entropy, sum(d.entropy() for d in dists))

    bits = ActionHead(spaces.MultiBinary(4))
    logits = torch.randn(5, 4, generator=generator) * 3
    sample, log_probs = bits.sample(logits, generator)
    reference = torch.distributions.Bernoulli(logits=logits)
    torch.testing.assert_close(log_probs, reference.log_prob(sample).sum(-1))
    _, entropy = bits.log_prob_entropy(logits, sample)
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))
    assert set(np.unique(sample.numpy())) <= {0.0, 1.0}


def test_kl_divergences_match_torch_distributions() -> None:
    from torch.distributions import Bernoulli, Categorical, Normal, kl_divergence

    generator = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 7, 5, generator=generator)
    torch.testing.assert_close(
        D.categorical_kl(a, b), kl_divergence(Categorical(logits=a), Categorical(logits=b))
    )
    torch.testing.assert_close(
        D.bernoulli_kl(a, b), kl_divergence(Bernoulli(logits=a), Bernoulli(logits=b)).sum(-1)
    )
    std_a, std_b = torch.randn(2, 5, generator=generator) * 0.3
    torch.testing.assert_close(
        D.gaussian_kl(a, std_a, b, std_b),
        kl_divergence(Normal(a, std_a.exp()), Normal(b, std_b.exp())).sum(-1),
    )


def test_categorical_log_prob_is_the_log_prob_of_log_prob_entropy() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 4, generator=generator)
    actions = torch.randint(4, (7,), generator=generator)
    log_prob, _ = D.categorical_log_prob_entropy(logits, actions)
    assert torch.equal(D.categorical_log_prob(logits, actions), log_prob)
