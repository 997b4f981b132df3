"""Agents that do not learn: the uniformly random player used as a baseline opponent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from rlfleet.algos.base import Algorithm
from rlfleet.nn.masks import masked_uniform
from rlfleet.types import PolicyStep


@dataclass
class RandomAgentConfig:
    """The random agent has no hyperparameters."""


class RandomAgent(Algorithm[RandomAgentConfig]):
    """Uniformly random legal actions, greedy or not (there is nothing to be greedy about).

    Its update learns nothing, so it can sit in a game with ``learning_mask`` true or false.
    """

    name = "random"
    supports_masks = True
    kind = "off_policy"
    config_class = RandomAgentConfig
    action_spaces = (spaces.Discrete, spaces.Box)
    observation_spaces = (spaces.Space,)

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        config: RandomAgentConfig | None = None,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        super().__init__(
            observation_space, action_space, config or RandomAgentConfig(), seed=seed, device=device
        )

    def _build(self) -> None:
        """No networks."""

    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep:
        self.refuse_unsupported_inputs(None, state)
        if action_mask is not None:
            return PolicyStep(actions=masked_uniform(action_mask, self.generator))
        n = obs.shape[0]
        space = self.action_space
        if isinstance(space, spaces.Discrete):
            return PolicyStep(actions=torch.randint(int(space.n), (n,), generator=self.generator))
        low = torch.as_tensor(space.low, dtype=torch.float32)  # type: ignore[attr-defined]
        high = torch.as_tensor(space.high, dtype=torch.float32)  # type: ignore[attr-defined]
        unit = torch.rand((n, *low.shape), generator=self.generator)
        return PolicyStep(actions=low + unit * (high - low))

    def update(self, batch: Any, **_: Any) -> dict[str, float]:
        """Nothing to learn."""
        return {}

    def modules(self) -> dict[str, nn.Module]:
        return {}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {}
