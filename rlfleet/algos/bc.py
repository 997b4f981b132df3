"""Behavior cloning: supervised learning of the dataset's actions (Pomerleau 1991, "Efficient
Training of Artificial Neural Networks for Autonomous Navigation"; the baseline of every
offline-RL paper since).

Discrete actions: cross-entropy of the policy's logits against the recorded action.
Box actions, ``policy: deterministic``: a tanh-squashed action regressed onto the recorded
one by mean squared error in the action space scaled to [-1, 1] (the BC term of TD3+BC).
Box actions, ``policy: gaussian``: a diagonal Gaussian (state-independent log standard
deviation) fitted by maximum likelihood; the greedy action is its mean, clipped to bounds.

Rewards are ignored: on a dataset of mixed quality BC copies the mixture, which is what the
offline RL algorithms (CQL, IQL, TD3+BC) improve on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from gymnasium import spaces
from torch import nn

from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import OfflineAlgorithm
from rlfleet.algos.registry import register
from rlfleet.config.fields import LayerWidth, PositiveFloat, PositiveInt
from rlfleet.nn import distributions as D
from rlfleet.nn.actions import box_scale_bias, to_box, to_unit
from rlfleet.nn.mlp import Activation, flat_size, flatten_obs, mlp
from rlfleet.nn.optim import optimizer_step
from rlfleet.types import PolicyStep, ReplayBatch

if TYPE_CHECKING:
    from rlfleet.data.source import TransitionSource


@dataclass
class BCConfig:
    """Behavior-cloning hyperparameters."""

    learning_rate: PositiveFloat = 1e-3
    """Adam step size."""
    batch_size: PositiveInt = 256
    """Transitions per gradient step."""
    policy: Literal["deterministic", "gaussian"] = "deterministic"
    """Box actions: regress the action (MSE) or fit a Gaussian (log-likelihood)."""
    hidden_sizes: tuple[LayerWidth, ...] = (256, 256)
    """Hidden layer widths of the policy."""
    activation: Activation = "relu"
    """Hidden-layer activation."""
    adam_eps: PositiveFloat = 1e-8
    """Adam epsilon."""


@register
class BC(Algorithm[BCConfig], OfflineAlgorithm):
    """Behavior cloning for Discrete and Box actions."""

    name = "bc"
    kind = "offline"
    config_class = BCConfig
    action_spaces = (spaces.Discrete, spaces.Box)

    def _setup(self) -> None:
        self.continuous = isinstance(self.action_space, spaces.Box)
        self.obs_shape: tuple[int, ...] = tuple(self.observation_space.shape or ())
        if isinstance(self.action_space, spaces.Box):
            self.action_shape: tuple[int, ...] = tuple(self.action_space.shape)
            self.action_dim = flat_size(self.action_shape)
            self.action_scale, self.action_bias = box_scale_bias(self.action_space, self.device)
        else:
            self.action_shape = ()
            self.action_dim = int(self.action_space.n)  # type: ignore[attr-defined]

    def _build(self) -> None:
        cfg = self.config
        self.policy = mlp(
            flat_size(self.obs_shape), cfg.hidden_sizes, self.action_dim, cfg.activation
        ).to(self.device)
        self._params: list[torch.Tensor] = list(self.policy.parameters())
        self.log_std: nn.Parameter | None = None
        if self.continuous and cfg.policy == "gaussian":
            self.log_std = nn.Parameter(torch.zeros(self.action_dim, device=self.device))
            self._params.append(self.log_std)
        self.optimizer = torch.optim.Adam(
            self._params, lr=cfg.learning_rate, eps=cfg.adam_eps, fused=self.device.type == "cpu"
        )

    def modules(self) -> dict[str, nn.Module]:
        found: dict[str, nn.Module] = {"policy": self.policy}
        if self.log_std is not None:
            found["log_std"] = nn.ParameterList([self.log_std])
        return found

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    # ----------------------------------------------------------------- acting
    @torch.inference_mode()
    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep:
        self.refuse_unsupported_inputs(action_mask, state)
        out = self.policy(flatten_obs(obs, len(self.obs_shape)))
        if not self.continuous:
            if deterministic:
                return PolicyStep(actions=out.argmax(-1))
            actions, log_probs = D.categorical_sample(out, self.generator)
            return PolicyStep(actions=actions, log_probs=log_probs)
        unit = torch.tanh(out) if self.log_std is None else out
        if self.log_std is not None and not deterministic:
            unit = D.gaussian_sample(unit, self.log_std, self.generator)
        actions = to_box(unit, self.action_scale, self.action_bias, self.action_shape)
        return PolicyStep(actions=actions)

    # --------------------------------------------------------------- training
    def update(
        self,
        source: TransitionSource,
        *,
        batch_size: int | None = None,
        num_gradient_steps: int = 1,
    ) -> dict[str, float]:
        """``num_gradient_steps`` supervised steps, each on a fresh minibatch."""
        batch_size = batch_size or self.config.batch_size
        total = torch.zeros((), device=self.device)
        steps = 0
        for _ in range(num_gradient_steps):
            sample: ReplayBatch[torch.Tensor] = source.sample(batch_size, gamma=1.0).to(self.device)
            loss = self._loss(sample)
            if optimizer_step(self, self.optimizer, loss, self._params) is None:
                continue  # a skipped batch (nan_policy: skip_batch)
            self.gradient_steps += 1
            steps += 1
            total += loss.detach()
        return {"loss/bc": float(total) / max(steps, 1)}

    def _loss(self, sample: ReplayBatch[torch.Tensor]) -> torch.Tensor:
        obs = flatten_obs(self.preprocess(sample.obs), len(self.obs_shape))
        out = self.policy(obs)
        if not self.continuous:
            return nn.functional.cross_entropy(out, sample.actions)
        target = to_unit(sample.actions, self.action_scale, self.action_bias)
        if self.log_std is None:
            return nn.functional.mse_loss(torch.tanh(out), target)
        log_prob, _ = D.gaussian_log_prob_entropy(out, self.log_std, target)
        return -log_prob.mean()
