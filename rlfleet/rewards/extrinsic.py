"""The extrinsic reward signal: the environment's own reward, scaled by ``strength``."""

from __future__ import annotations

import torch

from rlfleet.rewards.base import RewardSignal, Transitions


class ExtrinsicSignal(RewardSignal):
    """Passes the environment's reward through."""

    name = "extrinsic"
    intrinsic = False

    def rewards(self, batch: Transitions) -> torch.Tensor:
        return batch.env_rewards
