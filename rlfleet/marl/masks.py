"""Action masks for the agents the multi-agent trainer drives.

Board games forbid some actions on each turn; the env says which with a boolean mask. rlfleet
algorithms act without masks, so this module reads their action scores (PPO logits, DQN
Q-values) and picks among legal actions only:

- greedy: the legal action with the highest score;
- PPO sampling: a sample of the softmax over legal logits (illegal logits set to -inf);
- DQN exploration: epsilon-greedy where the random action is uniform over legal actions.

PPO's update evaluates log-probabilities without the mask, so the log-probability stored for
a masked sample is the unmasked one: the first epoch's probability ratio is then exactly 1,
and the clipped surrogate raises the probability of good legal actions against all others
(illegal ones lose mass through the softmax). Deviation from a fully masked loss (Huang &
Ontañón 2020, arXiv:2006.14171), which needs the mask stored with the rollout.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlfleet.algos.base import Algorithm
from rlfleet.algos.dqn import DQN
from rlfleet.algos.ppo import PPO
from rlfleet.errors import EnvSpecError
from rlfleet.nn.mlp import flatten_obs
from rlfleet.types import PolicyStep

_ILLEGAL = -1e9
"""Score given to illegal actions: far below any real logit or Q-value, yet finite, so a row
whose actions are all illegal still yields a (meaningless) action instead of NaN."""


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logits`` with illegal actions (``mask`` false) pushed to a huge negative score."""
    return torch.where(mask, logits, torch.full_like(logits, _ILLEGAL))


def masked_argmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Index of the best legal action in each row."""
    return masked_logits(scores, mask).argmax(-1)


def masked_uniform(mask: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A uniformly random legal action per row."""
    noise = torch.rand(mask.shape, generator=generator)
    return masked_argmax(noise, mask)


def supports_masks(algorithm: Algorithm[Any]) -> bool:
    """Whether :func:`masked_act` can restrict this algorithm's actions."""
    return isinstance(algorithm, PPO | DQN) or hasattr(algorithm, "act_masked")


def check_mask_support(algorithm: Algorithm[Any], agent: str) -> None:
    """Refuse, at construction, an algorithm that cannot honour the agent's action masks."""
    if not supports_masks(algorithm):
        raise EnvSpecError(
            f"agent {agent!r}: the env gives action masks, expected an algorithm that honours "
            f"them (ppo, dqn, or one with act_masked), got {algorithm.name}"
        )


def check_mask(mask: np.ndarray, num_actions: int, where: str) -> None:
    """Refuse a mask whose length is not the number of actions."""
    if mask.shape[-1] != num_actions:
        raise EnvSpecError(
            f"{where}: expected an action mask of length {num_actions} (one per action), "
            f"got shape {mask.shape}"
        )


@torch.inference_mode()
def masked_act(
    algorithm: Algorithm[Any],
    obs: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    deterministic: bool,
) -> PolicyStep:
    """``algorithm.act`` restricted to legal actions (plain ``act`` when ``mask`` is None)."""
    if mask is None:
        return algorithm.act(obs, deterministic=deterministic)
    act_masked = getattr(algorithm, "act_masked", None)
    if act_masked is not None:
        step: PolicyStep = act_masked(obs, mask, deterministic=deterministic)
        return step
    if isinstance(algorithm, PPO):
        return _ppo_masked(algorithm, obs, mask, deterministic)
    if isinstance(algorithm, DQN):
        return _dqn_masked(algorithm, obs, mask, deterministic)
    raise EnvSpecError(
        f"masked_act: expected ppo, dqn or an algorithm with act_masked, got {algorithm.name}"
    )


def _ppo_masked(
    algo: PPO, obs: torch.Tensor, mask: torch.Tensor, deterministic: bool
) -> PolicyStep:
    logits, values = algo.net.twin(flatten_obs(obs, len(algo.obs_shape)))
    legal = masked_logits(logits, mask)
    if deterministic:
        actions = legal.argmax(-1)
    else:
        noise = torch.empty_like(legal).exponential_(generator=algo.generator)
        actions = torch.argmax(torch.log_softmax(legal, -1) - noise.log_(), dim=-1)
    log_probs = torch.log_softmax(logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    return PolicyStep(actions=actions, log_probs=log_probs, values=values.squeeze(-1))


def _dqn_masked(
    algo: DQN, obs: torch.Tensor, mask: torch.Tensor, deterministic: bool
) -> PolicyStep:
    greedy = masked_argmax(algo.q_net(flatten_obs(obs, len(algo.obs_shape))), mask)
    if deterministic:
        return PolicyStep(actions=greedy)
    explore = torch.rand(greedy.shape[0], generator=algo.generator) < algo.exploration_rate()
    return PolicyStep(actions=torch.where(explore, masked_uniform(mask, algo.generator), greedy))
