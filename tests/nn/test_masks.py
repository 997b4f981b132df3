"""Masked distributions: illegal actions get probability 0, and the entropy, log-probabilities
and gradients stay finite and ignore them."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.nn.action_head import ActionHead
from rlfleet.nn.masks import masked_argmax


def test_masked_categorical_entropy_is_that_of_the_legal_actions() -> None:
    head = ActionHead(spaces.Discrete(4))
    logits = torch.tensor([[0.3, -1.0, 2.0, 0.5]], requires_grad=True)
    mask = torch.tensor([[True, False, True, False]])
    actions = torch.tensor([2])
    log_prob, entropy = head.log_prob_entropy(logits, actions, mask=mask)
    legal = torch.distributions.Categorical(logits=logits.detach()[:, [0, 2]])
    torch.testing.assert_close(entropy, legal.entropy())
    torch.testing.assert_close(log_prob, legal.log_prob(torch.tensor([1])))
    (log_prob + entropy).sum().backward()
    assert logits.grad is not None
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[0, 1] == 0
    assert logits.grad[0, 3] == 0


def test_sampling_never_picks_a_masked_action() -> None:
    generator = torch.Generator().manual_seed(0)
    for space in (spaces.Discrete(5), spaces.MultiDiscrete([3, 4]), spaces.MultiBinary(3)):
        head = ActionHead(space)
        assert head.mask_size is not None
        mask = torch.rand(2000, head.mask_size, generator=generator) < 0.5
        mask[:, 0] = True  # every block needs a legal entry: make the first always legal
        if isinstance(space, spaces.MultiDiscrete):
            mask[:, 3] = True
        if isinstance(space, spaces.MultiBinary):
            mask[:, 0::2] |= ~mask[:, 1::2]
        logits = torch.randn(2000, head.num_outputs, generator=generator) * 5
        actions, log_probs = head.sample(logits, generator, mask=mask)
        assert torch.isfinite(log_probs).all()
        flat = _chosen(space, actions)
        assert mask.gather(1, flat).all(), space


def _chosen(space: spaces.Space, actions: torch.Tensor) -> torch.Tensor:
    """Indices into a flat mask of the entries each action uses."""
    if isinstance(space, spaces.Discrete):
        return actions.long().view(-1, 1)
    if isinstance(space, spaces.MultiDiscrete):
        starts = torch.tensor(np.cumsum([0, *space.nvec[:-1]]))
        return actions.long() + starts
    return actions.long() + torch.arange(0, 2 * actions.shape[1], 2)


def test_masked_argmax_for_value_based_methods() -> None:
    values = torch.tensor([[5.0, 1.0, 3.0]])
    assert masked_argmax(values, torch.tensor([[False, True, True]])).item() == 2
    assert masked_argmax(values, None).item() == 0
