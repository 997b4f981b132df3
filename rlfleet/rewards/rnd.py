"""Random Network Distillation (Burda, Edwards, Storkey & Klimov 2018, arXiv:1810.12894).

A fixed, randomly initialised target network maps observations to features; a predictor
is trained to reproduce them on the observations the agent visits. The reward for
reaching ``s'`` is the predictor's squared error there: large on observations unlike
the ones seen so far, shrinking as they become familiar.

As in the paper, observations are standardised by running statistics and clipped to
[-5, 5] before both networks (a fixed random network cannot adapt to the input scale),
and rewards are divided by a standard deviation so that ``strength`` means the same across
environments. Deviation: the paper divides by the running deviation of intrinsic
*returns* and keeps a separate value head for them; rlfleet divides each batch's rewards
by their own deviation over the batch. That needs no time order (replay minibatches work
too), and it keeps the reward alive: the predictor's error falls by orders of magnitude
within the first updates, and a deviation averaged over the run would stay dominated by
those first errors and let the reward fade to nothing.
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
from rlfleet.rewards.settings import RNDSettings

OBS_CLIP = 5.0
"""The paper clips standardised observations to [-5, 5]."""


class RNDSignal(RewardSignal):
    """RND: predictor error against a fixed random network."""

    name = "rnd"

    def __init__(
        self,
        settings: RNDSettings,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(settings, observation_space, action_space, seed=seed, device=device)
        hidden = settings.network_settings.hidden_sizes
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.obs_normalizer = RunningNormalizer((self.obs_dim,), clip=OBS_CLIP).to(self.device)
            self.target = mlp(self.obs_dim, hidden, settings.encoding_size, "relu").to(self.device)
            self.predictor = mlp(self.obs_dim, hidden, settings.encoding_size, "relu").to(
                self.device
            )
        self.target.requires_grad_(False)
        self._params: list[torch.Tensor] = list(self.predictor.parameters())
        self.optimizer = torch.optim.Adam(self._params, lr=settings.learning_rate)

    def modules(self) -> dict[str, nn.Module]:
        return {
            "obs_normalizer": self.obs_normalizer,
            "target": self.target,
            "predictor": self.predictor,
        }

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    def _errors(self, next_obs: torch.Tensor) -> torch.Tensor:
        x = self.obs_normalizer(self.flat(next_obs).to(self.device))
        errors: torch.Tensor = (self.predictor(x) - self.target(x)).pow(2).mean(-1)
        return errors

    @torch.no_grad()
    def rewards(self, batch: Transitions) -> torch.Tensor:
        errors = self._errors(batch.next_obs).cpu()
        real = errors[batch.weights > 0]
        scale = real.std() if real.numel() > 1 else torch.tensor(1.0)
        return errors / (scale + 1e-8)

    def update(self, batch: Transitions, *, batch_size: int, num_epochs: int) -> dict[str, float]:
        real = batch.weights > 0
        if not bool(real.any()):
            return {}
        self.obs_normalizer.update(self.flat(batch.next_obs[real]).to(self.device))
        total = 0.0
        steps = 0
        for mb in self.minibatches(batch, batch_size, num_epochs):
            loss = self._errors(mb.next_obs).mean()
            if optimizer_step(self, self.optimizer, loss, self._params) is None:
                continue  # a skipped batch (nan_policy: skip_batch)
            total += float(loss.detach())
            steps += 1
        return {"loss/rnd": total / max(steps, 1)}
