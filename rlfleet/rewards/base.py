"""The :class:`RewardSignal` interface and the batch of transitions a signal works on.

A reward signal gives every transition ``(obs, action, next_obs)`` a reward, and may learn
from batches of transitions (a curiosity model, a discriminator). It does not care where
the batch comes from: the on-policy trainer hands it a whole rollout, an off-policy
trainer can hand it each sampled replay minibatch. Observations are in the algorithm's
own representation (what :meth:`rlfleet.algos.base.Algorithm.preprocess` returns), so a
signal sees exactly what the policy sees.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from gymnasium import spaces
from torch import nn

from rlfleet.envs.spaces import describe_space
from rlfleet.errors import CheckpointError, EnvSpecError
from rlfleet.nn.device import resolve_device
from rlfleet.nn.mlp import flat_size
from rlfleet.nn.optim import NanPolicy
from rlfleet.seeding import stream_seed


@dataclass(frozen=True)
class Transitions:
    """A flat batch of ``B`` transitions."""

    obs: torch.Tensor
    """``[B, *obs_shape]`` preprocessed observations."""
    actions: torch.Tensor
    """``[B]`` integer env actions (Discrete, ``start`` included) or ``[B, *action_shape]``
    floats (Box)."""
    next_obs: torch.Tensor
    """``[B, *obs_shape]`` the preprocessed observation that followed each action."""
    env_rewards: torch.Tensor
    """``[B]`` the environment's reward."""
    weights: torch.Tensor
    """``[B]`` 1 for a real transition, 0 for the reset step of next-step autoreset."""

    def __len__(self) -> int:
        return int(self.obs.shape[0])

    def index(self, idx: torch.Tensor) -> Transitions:
        """The transitions at positions ``idx``."""
        return Transitions(
            self.obs[idx], self.actions[idx], self.next_obs[idx], self.env_rewards[idx],
            self.weights[idx],
        )  # fmt: skip


class RewardSignal(ABC):
    """One reward signal with its ``strength`` (reward multiplier) and ``gamma``.

    Subclasses implement :meth:`rewards` and, when they learn, :meth:`update`,
    :meth:`modules` and :meth:`optimizers`.
    """

    name: ClassVar[str]
    """The key under ``reward_signals`` (``extrinsic``, ``curiosity``, ``rnd``, ``gail``)."""
    intrinsic: ClassVar[bool] = True
    """False only for the env's own reward; intrinsic returns are logged separately."""

    def __init__(
        self,
        settings: Any,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        if self.intrinsic:
            check_signal_spaces(self.name, observation_space, action_space)
        self.settings = settings
        self.strength = float(settings.strength)
        self.gamma = float(settings.gamma)
        self.observation_space = observation_space
        self.action_space = action_space
        self.obs_dim = flat_size(tuple(observation_space.shape or ()))
        self.discrete = isinstance(action_space, spaces.Discrete)
        self.action_start = 0
        """First action of a Discrete space (one-hot position 0)."""
        if isinstance(action_space, spaces.Discrete):
            self.action_start = int(action_space.start)
            self.action_dim = int(action_space.n)
        else:
            self.action_dim = flat_size(tuple(action_space.shape or ()))
        self.device = resolve_device(device)
        self.generator = torch.Generator().manual_seed(stream_seed(seed, "reward_signal"))
        """Drives minibatch order and any sampling the signal does."""
        self.nan_policy: NanPolicy = "raise"
        """A non-finite loss or gradient in :meth:`update`: ``raise`` NonFiniteError, or
        ``skip_batch`` (see :mod:`rlfleet.nn.optim`). The trainer sets its own here, as on
        the algorithm (:meth:`rlfleet.rewards.signals.RewardSignals.set_nan_policy`)."""
        self.skipped_batches = 0
        """Minibatches skipped under ``skip_batch``."""

    @abstractmethod
    def rewards(self, batch: Transitions) -> torch.Tensor:
        """``[B]`` rewards of a batch, before ``strength`` is applied; no gradients."""

    def update(self, batch: Transitions, *, batch_size: int, num_epochs: int) -> dict[str, float]:
        """Learn from ``batch`` (``num_epochs`` passes of minibatches); returns metrics."""
        return {}

    def step_label(self) -> str:
        """Names the signal in a NonFiniteError (see :func:`rlfleet.nn.optim.optimizer_step`,
        which every learned signal's update steps through)."""
        return f"reward signal {self.name!r}"

    def modules(self) -> dict[str, nn.Module]:
        """Networks (and normalisers) whose state is saved."""
        return {}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Optimisers whose state is saved."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {
            "modules": {k: m.state_dict() for k, m in self.modules().items()},
            "optimizers": {k: o.state_dict() for k, o in self.optimizers().items()},
            "generator": self.generator.get_state(),
            "skipped_batches": self.skipped_batches,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            for key, module in self.modules().items():
                module.load_state_dict(state["modules"][key])
            for key, optimizer in self.optimizers().items():
                optimizer.load_state_dict(state["optimizers"][key])
            self.generator.set_state(state["generator"])
        except (KeyError, RuntimeError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint does not match the {self.name} reward signal: "
                f"{str(err).splitlines()[0]}"
            ) from err
        self.skipped_batches = int(state.get("skipped_batches", 0))

    # ------------------------------------------------------------- helpers
    def action_indices(self, actions: torch.Tensor) -> torch.Tensor:
        """Discrete env actions as indices ``0..n-1`` (the space's ``start`` taken off)."""
        return actions.long() - self.action_start

    def encode_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """``[B, action_dim]`` floats: one-hot for Discrete, flattened for Box."""
        if self.discrete:
            return nn.functional.one_hot(self.action_indices(actions), self.action_dim).float()
        return actions.reshape(actions.shape[0], -1).float()

    def flat(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, obs_dim]`` float observations."""
        return obs.reshape(obs.shape[0], -1).float()

    def minibatches(
        self, batch: Transitions, batch_size: int, num_epochs: int
    ) -> list[Transitions]:
        """Shuffled minibatches of the real (weight 1) transitions, ``num_epochs`` times over."""
        real = torch.nonzero(batch.weights > 0).squeeze(-1)
        out: list[Transitions] = []
        for _ in range(num_epochs):
            order = real[torch.randperm(real.numel(), generator=self.generator)]
            out += [
                batch.index(order[i : i + batch_size]) for i in range(0, order.numel(), batch_size)
            ]
        return out


def check_signal_spaces(
    name: str, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
) -> None:
    """Learned signals need flat Box observations and Discrete or Box actions."""
    if not isinstance(observation_space, spaces.Box):
        raise EnvSpecError(
            f"reward signal {name!r} needs Box observations, got "
            f"{describe_space(observation_space)}"
        )
    if not isinstance(action_space, spaces.Discrete | spaces.Box):
        raise EnvSpecError(
            f"reward signal {name!r} needs Discrete or Box actions, got "
            f"{describe_space(action_space)}"
        )
