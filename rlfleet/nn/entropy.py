"""The entropy coefficient of maximum-entropy RL (SAC, continuous CQL), tuned by gradient."""

from __future__ import annotations

import math

import torch
from torch import nn


class EntropyCoefficient(nn.Module):
    """``log(alpha)`` as a module, so it is saved and restored with the networks.

    Tuning (Haarnoja et al. 2018, arXiv:1812.05905, section 5) minimises :meth:`loss`, which
    raises alpha while the policy's entropy is below ``target_entropy`` and lowers it above.
    """

    def __init__(self, initial: float, trainable: bool) -> None:
        super().__init__()
        self.log_value = nn.Parameter(torch.tensor([math.log(initial)]), requires_grad=trainable)

    def loss(self, log_prob: torch.Tensor, target_entropy: float | torch.Tensor) -> torch.Tensor:
        """``-log(alpha) * (log pi(a|s) + target_entropy)``, averaged over the batch (the
        target may differ per state: a tensor of the batch's shape)."""
        return -(self.log_value * (log_prob.detach() + target_entropy)).mean()
