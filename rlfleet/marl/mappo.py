"""A centralized critic for PPO agents: MAPPO (Yu et al. 2022, "The Surprising Effectiveness
of PPO in Cooperative Multi-Agent Games", arXiv:2103.01955).

Each actor still sees only its own observation; the critic sees the global state the env
provides (``env.state()``), plus the agent-id one-hot when agents share parameters. The
trainer writes the critic's values into the PPO rollout, so PPO's GAE advantages come from
the centralized critic, and fits the critic to the same GAE returns. PPO's own (local) value
head keeps training on those returns but no longer drives the advantages; PPO itself is
unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlfleet.algos import functional as F
from rlfleet.config.fields import PositiveFloat, PositiveInt
from rlfleet.data.rollout import RolloutStorage
from rlfleet.nn.mlp import mlp


@dataclass
class CentralCriticConfig:
    """Hyperparameters of the centralized critic."""

    hidden_sizes: tuple[PositiveInt, ...] = (64, 64)
    """Hidden layer widths."""
    learning_rate: PositiveFloat = 5e-4
    """Adam step size."""
    num_epochs: PositiveInt = 5
    """Passes over the rollout per update."""
    batch_size: PositiveInt = 256
    """Minibatch size."""
    max_grad_norm: PositiveFloat = 0.5
    """Global gradient-norm clip."""


class CentralCritic:
    """State-value network over the global state (and agent id)."""

    def __init__(self, input_size: int, config: CentralCriticConfig, *, seed: int = 0) -> None:
        self.config = config
        self.input_size = input_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = mlp(input_size, config.hidden_sizes, 1, "tanh")
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=config.learning_rate)
        self.generator = torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict[str, Any]:
        return {
            "net": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])

    @torch.inference_mode()
    def values(self, inputs: torch.Tensor) -> torch.Tensor:
        """Values of a batch of ``[batch, input_size]`` critic inputs."""
        out: torch.Tensor = self.net(inputs).squeeze(-1)
        return out

    def update(
        self, inputs: torch.Tensor, rollout: RolloutStorage, gamma: float, gae_lambda: float
    ) -> dict[str, float]:
        """Fit the critic to the rollout's GAE returns (``inputs`` row-aligned with it)."""
        _, returns = F.gae(
            rollout.rewards,
            rollout.values,
            rollout.next_values(),
            rollout.terminated,
            rollout.truncated,
            gamma,
            gae_lambda,
        )
        n = rollout.num_steps * rollout.num_envs
        x = inputs.reshape(n, -1)
        targets = returns.reshape(n)
        weights = rollout.valid.reshape(n)
        cfg = self.config
        params: list[torch.Tensor] = list(self.net.parameters())
        loss = torch.zeros(())
        for _ in range(cfg.num_epochs):
            order = torch.randperm(n, generator=self.generator)
            for start in range(0, n, cfg.batch_size):
                idx = order[start : start + cfg.batch_size]
                err = (self.net(x[idx]).squeeze(-1) - targets[idx]).pow(2)
                loss = F.weighted_mean(err, weights[idx])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                F.clip_grad_norm(params, cfg.max_grad_norm)
                self.optimizer.step()
        return {"loss/central_value": float(loss.detach())}
