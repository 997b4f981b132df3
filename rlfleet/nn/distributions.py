"""Action distributions as plain functions of network outputs.

Plain functions (no ``torch.distributions`` objects) keep the per-batch cost to a few
tensor ops: no argument validation, no object construction in the hot loop, and they
trace cleanly under ``torch.compile``.

Random draws come from a CPU generator (the algorithm's, whose state a checkpoint keeps)
and are moved to the device of the network outputs: a seed gives the same draws on every
device, and on the CPU the move is free.
"""

from __future__ import annotations

import math

import torch

_LOG_2PI = math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)


def categorical_sample(
    logits: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample actions and return them with their log-probabilities.

    Gumbel-max in its exponential form: ``argmax(log p - log E)`` with ``E ~ Exp(1)`` is a
    sample from ``p`` (-log E is Gumbel-distributed), at one random draw per logit.
    """
    log_p = torch.log_softmax(logits, dim=-1)
    noise = torch.empty_like(log_p, device="cpu").exponential_(generator=generator)
    noise = noise.to(log_p.device)
    actions = torch.argmax(log_p - noise.log_(), dim=-1)
    return actions, log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def categorical_greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The most likely actions and their log-probabilities."""
    log_p = torch.log_softmax(logits, dim=-1)
    log_prob, actions = log_p.max(dim=-1)
    return actions, log_prob


def categorical_log_prob_entropy(
    logits: torch.Tensor, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of ``actions`` and the entropy, from unnormalised ``logits``."""
    log_p = torch.log_softmax(logits, dim=-1)
    log_prob = _gather_log_prob(log_p, actions)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return log_prob, entropy


def categorical_log_prob(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """The log-probability of :func:`categorical_log_prob_entropy`, without the entropy."""
    return _gather_log_prob(torch.log_softmax(logits, dim=-1), actions)


def _gather_log_prob(log_p: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def categorical_kl(old_logits: torch.Tensor, new_logits: torch.Tensor) -> torch.Tensor:
    """``KL(old || new)`` over the last dim; masked entries (probability 0) add exactly 0."""
    old_log_p = torch.log_softmax(old_logits, dim=-1)
    new_log_p = torch.log_softmax(new_logits, dim=-1)
    return (old_log_p.exp() * (old_log_p - new_log_p)).sum(-1)


def gaussian_sample(
    mean: torch.Tensor,
    log_std: torch.Tensor,
    generator: torch.Generator | None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sample a diagonal Gaussian (``noise``: the standard-normal draw to use, e.g. a step
    of colored noise, instead of a fresh one from ``generator``)."""
    if noise is None:
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype).to(mean.device)
    return mean + noise * log_std.exp()


def squashed_gaussian_sample(
    mean: torch.Tensor,
    log_std: torch.Tensor,
    generator: torch.Generator | None,
    noise: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``tanh(u)``, ``u ~ N(mean, exp(log_std))``, with its log-density (summed over
    action dims), as SAC's policy does (Haarnoja et al. 2018, arXiv:1812.05905, appendix C).
    ``noise``: the standard-normal draw to use instead of a fresh one from ``generator``."""
    if noise is None:
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype).to(mean.device)
    pre_tanh = mean + noise * log_std.exp()
    # log N(u) - sum log(1 - tanh(u)^2), the correction written stably:
    # log(1 - tanh(u)^2) = 2 * (log 2 - u - softplus(-2u)).
    log_prob = (
        -0.5 * noise.pow(2)
        - log_std
        - 0.5 * _LOG_2PI
        - 2.0 * (_LOG_2 - pre_tanh - torch.nn.functional.softplus(-2.0 * pre_tanh))
    ).sum(-1)
    return torch.tanh(pre_tanh), log_prob


def gaussian_log_prob_entropy(
    mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-density of ``actions`` (summed over action dims) and entropy of a diagonal Gaussian."""
    z = (actions - mean) * torch.exp(-log_std)
    log_prob = (-0.5 * z.pow(2) - log_std - 0.5 * _LOG_2PI).sum(-1)
    entropy = (log_std + 0.5 * (1.0 + _LOG_2PI)).sum(-1).expand(log_prob.shape)
    return log_prob, entropy


def gaussian_kl(
    old_mean: torch.Tensor,
    old_log_std: torch.Tensor,
    new_mean: torch.Tensor,
    new_log_std: torch.Tensor,
) -> torch.Tensor:
    """``KL(old || new)`` of diagonal Gaussians, summed over the last dim."""
    old_var = torch.exp(2.0 * old_log_std)
    new_var = torch.exp(2.0 * new_log_std)
    per_dim = (
        new_log_std - old_log_std + (old_var + (old_mean - new_mean).pow(2)) / (2.0 * new_var) - 0.5
    )
    return per_dim.sum(-1)


def bernoulli_sample(
    logits: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample independent bits (float 0/1) and return them with their summed log-probability."""
    uniform = torch.rand(logits.shape, generator=generator, dtype=logits.dtype).to(logits.device)
    bits = (uniform < torch.sigmoid(logits)).to(logits.dtype)
    return bits, bernoulli_log_prob_entropy(logits, bits)[0]


def bernoulli_greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The most likely bits and their summed log-probability."""
    bits = (logits > 0).to(logits.dtype)
    return bits, bernoulli_log_prob_entropy(logits, bits)[0]


def bernoulli_log_prob_entropy(
    logits: torch.Tensor, bits: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of ``bits`` and entropy, each summed over the last dim.

    ``log p(1) = -softplus(-l)`` and ``log p(0) = -softplus(l)``, so
    ``log p(b) = b * l - softplus(l)``: exact for logits far from 0, where ``log(sigmoid)``
    would round to ``log 0``.
    """
    softplus = torch.nn.functional.softplus(logits)
    log_prob = (bits * logits - softplus).sum(-1)
    entropy = (softplus - logits * torch.sigmoid(logits)).sum(-1)
    return log_prob, entropy


def bernoulli_kl(old_logits: torch.Tensor, new_logits: torch.Tensor) -> torch.Tensor:
    """``KL(old || new)`` of independent bits, summed over the last dim."""
    old_p = torch.sigmoid(old_logits)
    log_sig = torch.nn.functional.logsigmoid
    per_bit = old_p * (log_sig(old_logits) - log_sig(new_logits)) + (1.0 - old_p) * (
        log_sig(-old_logits) - log_sig(-new_logits)
    )
    return per_bit.sum(-1)
