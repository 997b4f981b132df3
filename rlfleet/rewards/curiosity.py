"""Intrinsic Curiosity Module (Pathak, Agrawal, Efros & Darrell 2017, arXiv:1705.05363).

An encoder maps observations to features ``phi(s)``. An inverse model predicts the action
from ``(phi(s), phi(s'))``, which trains the encoder to keep what the agent's actions
affect; a forward model predicts ``phi(s')`` from ``(phi(s), a)``. The reward is the
forward model's error ``0.5 * ||f(phi(s), a) - phi(s')||^2``: transitions whose outcome
the agent cannot yet predict. Loss ``(1 - beta) * inverse + beta * forward`` with the
paper's ``beta = 0.2``; the forward loss does not train the encoder (the features would
otherwise collapse to make prediction trivial).

Deviation: observations are standardised by running statistics before the encoder, so
that low-dimensional states with very different scales (MountainCar's position and
velocity differ by 20x) all reach the features; the paper works on images.
"""

from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from rlfleet.nn.mlp import mlp
from rlfleet.nn.normalize import RunningNormalizer
from rlfleet.nn.optim import optimizer_step
from rlfleet.rewards.base import RewardSignal, Transitions
from rlfleet.rewards.settings import CuriositySettings

FORWARD_LOSS_WEIGHT = 0.2
"""The paper's beta: weight of the forward loss against the inverse loss."""


class CuriositySignal(RewardSignal):
    """ICM: forward-model prediction error in a learned feature space."""

    name = "curiosity"

    def __init__(
        self,
        settings: CuriositySettings,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(settings, observation_space, action_space, seed=seed, device=device)
        hidden = settings.network_settings.hidden_sizes
        enc = settings.encoding_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.normalizer = RunningNormalizer((self.obs_dim,)).to(self.device)
            self.encoder = mlp(self.obs_dim, hidden, enc, "elu").to(self.device)
            self.inverse = mlp(2 * enc, hidden, self.action_dim, "elu").to(self.device)
            self.forward_model = mlp(enc + self.action_dim, hidden, enc, "elu").to(self.device)
        self._params: list[torch.Tensor] = [
            *self.encoder.parameters(),
            *self.inverse.parameters(),
            *self.forward_model.parameters(),
        ]
        self.optimizer = torch.optim.Adam(self._params, lr=settings.learning_rate)

    def modules(self) -> dict[str, nn.Module]:
        return {
            "normalizer": self.normalizer,
            "encoder": self.encoder,
            "inverse": self.inverse,
            "forward": self.forward_model,
        }

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    def _losses(self, batch: Transitions) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-transition forward error ``[B]`` and inverse loss ``[B]``."""
        phi = self.encoder(self.normalizer(self.flat(batch.obs).to(self.device)))
        phi_next = self.encoder(self.normalizer(self.flat(batch.next_obs).to(self.device)))
        actions = batch.actions.to(self.device)
        predicted = self.forward_model(torch.cat([phi.detach(), self.encode_actions(actions)], -1))
        forward_error = 0.5 * (predicted - phi_next.detach()).pow(2).sum(-1)
        action_out = self.inverse(torch.cat([phi, phi_next], -1))
        if self.discrete:
            inverse_loss = nn.functional.cross_entropy(
                action_out, self.action_indices(actions), reduction="none"
            )
        else:
            inverse_loss = (action_out - self.encode_actions(actions)).pow(2).mean(-1)
        return forward_error, inverse_loss

    @torch.no_grad()
    def rewards(self, batch: Transitions) -> torch.Tensor:
        forward_error, _ = self._losses(batch)
        return forward_error.cpu()

    def update(self, batch: Transitions, *, batch_size: int, num_epochs: int) -> dict[str, float]:
        real = batch.weights > 0
        if not bool(real.any()):
            return {}
        self.normalizer.update(self.flat(batch.obs[real]).to(self.device))
        forward_sum = inverse_sum = 0.0
        steps = 0
        for mb in self.minibatches(batch, batch_size, num_epochs):
            forward_error, inverse_loss = self._losses(mb)
            forward_loss, inv_loss = forward_error.mean(), inverse_loss.mean()
            loss = (1 - FORWARD_LOSS_WEIGHT) * inv_loss + FORWARD_LOSS_WEIGHT * forward_loss
            if optimizer_step(self, self.optimizer, loss, self._params) is None:
                continue  # a skipped batch (nan_policy: skip_batch)
            forward_sum += float(forward_loss.detach())
            inverse_sum += float(inv_loss.detach())
            steps += 1
        n = max(steps, 1)
        return {
            "loss/curiosity_forward": forward_sum / n,
            "loss/curiosity_inverse": inverse_sum / n,
        }
