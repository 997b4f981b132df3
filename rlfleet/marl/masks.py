"""Action masks for the agents the multi-agent trainer drives.

Board games forbid some actions on each turn; the env says which with a boolean mask. An
agent's algorithm must honour masks (``supports_masks``: it never picks an action whose mask
entry is false, greedy or exploring); this module refuses one that cannot, checks each mask's
length and hands the mask to ``Algorithm.act``.

The trainer stores each turn's mask with the transition: PPO's rollout (so its loss,
probability ratio and entropy use the legal actions the sample was drawn from, a fully
masked loss after Huang & Ontañón 2020, arXiv:2006.14171) and the off-policy replay buffer
(so targets bootstrap over the next turn's legal actions).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlfleet.algos.base import Algorithm
from rlfleet.algos.registry import algorithms_supporting_masks
from rlfleet.errors import EnvSpecError
from rlfleet.types import PolicyStep


def check_mask_support(algorithm: Algorithm[Any], agent: str) -> None:
    """Refuse, at construction, an algorithm that cannot honour the agent's action masks."""
    if not algorithm.supports_masks:
        raise EnvSpecError(
            f"agent {agent!r}: the env gives action masks, expected an algorithm that honours "
            f"them ({', '.join(algorithms_supporting_masks())}), got {algorithm.name}"
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
    return algorithm.act(obs, deterministic=deterministic, action_mask=mask)
