"""Generative Adversarial Imitation Learning (Ho & Ermon 2016, arXiv:1606.03476).

A discriminator ``D(s, a)`` learns to tell the demonstrator's transitions (label 1) from
the agent's (label 0); the agent is rewarded ``-log(1 - D(s, a))``, large where it looks
like the demonstrator. As in ML-Agents, the discriminator sees observations only unless
``use_actions`` is set, and its loss carries a gradient penalty on inputs interpolated
between demonstrator and agent samples (Gulrajani et al. 2017), which keeps the reward
smooth while the discriminator is far ahead of the policy.

The reward is positive everywhere, so it also pays for simply staying alive; in tasks
where ending an episode early is the goal, pair it with the extrinsic signal (Kostrikov
et al. 2019 discuss this bias).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from rlfleet.nn.mlp import mlp
from rlfleet.nn.normalize import RunningNormalizer
from rlfleet.nn.optim import optimizer_step
from rlfleet.rewards.base import RewardSignal, Transitions
from rlfleet.rewards.demonstrations import load_demonstrations
from rlfleet.rewards.settings import GAILSettings

GRADIENT_PENALTY_WEIGHT = 10.0
"""Weight of the gradient penalty (the value of Gulrajani et al. and ML-Agents)."""
_EPS = 1e-7


class GAILSignal(RewardSignal):
    """GAIL: a discriminator between demonstrations and the agent's transitions."""

    name = "gail"

    def __init__(
        self,
        settings: GAILSettings,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(settings, observation_space, action_space, seed=seed, device=device)
        demos = load_demonstrations(Path(settings.demo_path), observation_space, action_space)
        self.demo_obs = torch.from_numpy(demos.observations)
        self.demo_actions = torch.from_numpy(demos.actions)
        self.use_actions = settings.use_actions
        in_features = self.obs_dim + (self.action_dim if self.use_actions else 0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            # Fitted once on the demonstrations, then on the agent's observations as they come.
            self.normalizer = RunningNormalizer((self.obs_dim,)).to(self.device)
            self.normalizer.update(self.demo_obs.to(self.device))
            self.discriminator = mlp(
                in_features, settings.network_settings.hidden_sizes, 1, "relu"
            ).to(self.device)
        self._params: list[torch.Tensor] = list(self.discriminator.parameters())
        self.optimizer = torch.optim.Adam(self._params, lr=settings.learning_rate)

    def modules(self) -> dict[str, nn.Module]:
        return {"normalizer": self.normalizer, "discriminator": self.discriminator}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    def _inputs(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.normalizer(self.flat(obs).to(self.device))
        if self.use_actions:
            x = torch.cat([x, self.encode_actions(actions.to(self.device))], -1)
        return x

    @torch.no_grad()
    def rewards(self, batch: Transitions) -> torch.Tensor:
        logits: torch.Tensor = self.discriminator(self._inputs(batch.obs, batch.actions))
        return -torch.log(1.0 - torch.sigmoid(logits.squeeze(-1)) + _EPS).cpu()

    def update(self, batch: Transitions, *, batch_size: int, num_epochs: int) -> dict[str, float]:
        real = batch.weights > 0
        if not bool(real.any()):
            return {}
        self.normalizer.update(self.flat(batch.obs[real]).to(self.device))
        sums = torch.zeros(4)  # loss, penalty, D(expert), D(policy)
        steps = 0
        for mb in self.minibatches(batch, batch_size, num_epochs):
            idx = torch.randint(len(self.demo_obs), (len(mb),), generator=self.generator)
            expert = self._inputs(self.demo_obs[idx], self.demo_actions[idx])
            policy = self._inputs(mb.obs, mb.actions)
            expert_logits = self.discriminator(expert).squeeze(-1)
            policy_logits = self.discriminator(policy).squeeze(-1)
            bce = nn.functional.binary_cross_entropy_with_logits
            loss = bce(expert_logits, torch.ones_like(expert_logits)) + bce(
                policy_logits, torch.zeros_like(policy_logits)
            )
            penalty = self._gradient_penalty(expert, policy)
            total = loss + GRADIENT_PENALTY_WEIGHT * penalty
            if optimizer_step(self, self.optimizer, total, self._params) is None:
                continue  # a skipped batch (nan_policy: skip_batch)
            steps += 1
            with torch.no_grad():
                sums += torch.stack(
                    [
                        loss.detach().cpu(),
                        penalty.detach().cpu(),
                        torch.sigmoid(expert_logits).mean().cpu(),
                        torch.sigmoid(policy_logits).mean().cpu(),
                    ]
                )
        means = (sums / max(steps, 1)).tolist()
        return {
            "loss/gail_discriminator": means[0],
            "loss/gail_gradient_penalty": means[1],
            "train/gail_expert_estimate": means[2],
            "train/gail_policy_estimate": means[3],
        }

    def _gradient_penalty(self, expert: torch.Tensor, policy: torch.Tensor) -> torch.Tensor:
        """``(||grad D(x)|| - 1)^2`` at random points between demonstrator and agent inputs."""
        mix = torch.rand(len(expert), 1, generator=self.generator).to(self.device)
        x = (mix * expert + (1 - mix) * policy).requires_grad_(True)
        out = self.discriminator(x).sum()
        (grad,) = torch.autograd.grad(out, x, create_graph=True)
        penalty: torch.Tensor = (grad.norm(dim=-1) - 1.0).pow(2).mean()
        return penalty
