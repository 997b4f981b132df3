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

from rlfleet import functional as F
from rlfleet.config.fields import LayerWidth, PositiveFloat, PositiveInt
from rlfleet.data.rollout import RolloutStorage
from rlfleet.nn.mlp import mlp
from rlfleet.nn.optim import NanPolicy, optimizer_step
from rlfleet.seeding import stream_seed


@dataclass
class CentralCriticConfig:
    """Hyperparameters of the centralized critic."""

    hidden_sizes: tuple[LayerWidth, ...] = (64, 64)
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
    """State-value network over the global state (and agent id).

    ``nan_policy``: what a non-finite loss or gradient in :meth:`update` does (see
    :mod:`rlfleet.nn.optim`); the multi-agent trainer passes the ``nan_policy`` of the PPO
    algorithm the critic serves, so the two follow one policy.
    """

    def __init__(
        self,
        input_size: int,
        config: CentralCriticConfig,
        *,
        seed: int = 0,
        nan_policy: NanPolicy = "raise",
    ) -> None:
        self.config = config
        self.input_size = input_size
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = mlp(input_size, config.hidden_sizes, 1, "tanh")
        self._params: list[torch.Tensor] = list(self.net.parameters())
        self.optimizer = torch.optim.Adam(self._params, lr=config.learning_rate)
        self.generator = torch.Generator().manual_seed(stream_seed(seed, "critic"))
        self.nan_policy: NanPolicy = nan_policy
        self.skipped_batches = 0
        """Minibatches skipped under ``nan_policy: skip_batch``."""

    def step_label(self) -> str:
        """Names the critic in a NonFiniteError."""
        return "mappo central critic"

    def state_dict(self) -> dict[str, Any]:
        return {
            "net": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "skipped_batches": self.skipped_batches,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.skipped_batches = int(state.get("skipped_batches", 0))

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
        last = torch.zeros(())
        for _ in range(cfg.num_epochs):
            order = torch.randperm(n, generator=self.generator)
            for start in range(0, n, cfg.batch_size):
                idx = order[start : start + cfg.batch_size]
                err = (self.net(x[idx]).squeeze(-1) - targets[idx]).pow(2)
                loss = F.weighted_mean(err, weights[idx])
                norm = optimizer_step(
                    self, self.optimizer, loss, self._params, max_grad_norm=cfg.max_grad_norm
                )
                if norm is not None:  # None: a skipped batch (nan_policy: skip_batch)
                    last = loss
        return {"loss/central_value": float(last.detach())}
