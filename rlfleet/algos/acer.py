"""Actor-Critic with Experience Replay, discrete actions (Wang et al. 2017, arXiv:1611.01224).

Every update trains on the rollout just collected, then on ``Poisson(replay_ratio)``
rollouts drawn from a small replay of recent rollouts (``replay_size`` of them, replay
starting once ``replay_start`` are stored). Rollouts are replayed whole, with the
behaviour policy's probabilities ``mu`` stored beside them. Per rollout:

- **Retrace Q targets** ``Q_ret`` (:func:`rlfleet.functional.retrace`, lambda = 1,
  traces ``min(1, rho)``) from the network's Q-values and ``V = sum_a pi(a) Q(a)``;
- **truncated importance sampling with bias correction**: the policy gradient is
  ``min(c, rho_t) * grad log pi(a_t) * (Q_ret - V)`` plus, over all actions,
  ``[1 - c / rho(a)]_+ * pi(a) * grad log pi(a) * (Q(a) - V)``, with
  ``rho = pi / mu`` and ``c = truncation_clip``, plus an entropy bonus;
- **efficient trust region**: the gradient with respect to the policy's probabilities is
  projected per sample so that its inner product with the gradient of
  ``KL(pi_avg || pi)`` stays within ``trust_region_delta``, where ``pi_avg`` is a Polyak
  average of the network (decay ``average_decay``);
- the Q head learns ``0.5 * (Q_ret - Q(x_t, a_t))^2`` (weight ``q_coef``).

The network is :class:`rlfleet.nn.twin.TwinMLP` on the shared observation encoder: a
policy MLP and a Q MLP with one output per action. Details follow OpenAI Baselines' ACER
(RMSprop, gradient clip 10, probabilities ``+ 1e-6`` inside logarithms and ratios).

Deviations: truncated episodes bootstrap from the value of their final observation
(Baselines cuts every episode end); losses are means weighted by the ``valid`` mask (reset
steps of next-step autoreset carry no weight); an env's action mask is stored with each
step and applied whenever the policy is recomputed, so masked actions keep probability 0
in the ratios, the bias correction and the trust region.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from rlfleet import functional as F
from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import OnPolicyAlgorithm
from rlfleet.algos.policy_gradient import (
    OBSERVATION_SPACES,
    make_normalizers,
    normalizer_modules,
    scaled_rewards,
)
from rlfleet.algos.registry import register
from rlfleet.config.fields import (
    LayerWidth,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    UnitFloat,
)
from rlfleet.data.rollout import RolloutStorage
from rlfleet.errors import ConfigError
from rlfleet.nn.cnn import CnnKind
from rlfleet.nn.encoders import EncoderFactory, make_encoder
from rlfleet.nn.masks import apply_mask
from rlfleet.nn.mlp import Activation
from rlfleet.nn.obs import ObsLayout
from rlfleet.nn.optim import optimizer_step, step_if_finite
from rlfleet.nn.twin import TwinMLP
from rlfleet.schedules import ScheduleKind, scheduled
from rlfleet.types import PolicyStep

_EPS = 1e-6


@dataclass
class ACERConfig:
    """ACER hyperparameters (defaults: OpenAI Baselines')."""

    learning_rate: PositiveFloat = 7e-4
    """RMSprop step size (the initial value when ``lr_schedule`` is linear)."""
    lr_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay to 0 over the training budget."""
    num_steps: PositiveInt = 20
    """Steps collected per env per rollout (the length of replayed trajectories)."""
    batch_size: None = None
    """None: ACER learns from whole rollouts, never minibatches (see ``replay_ratio``)."""
    num_epochs: None = None
    """None: one pass over the fresh rollout, then ``replay_ratio`` replayed ones."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    gae_lambda: UnitFloat = 0.95
    """GAE lambda of a multi-agent centralized critic's advantages (ACER's own targets are
    Retrace's)."""
    ent_coef: NonNegativeFloat = 0.01
    """Weight of the entropy bonus."""
    q_coef: NonNegativeFloat = 0.5
    """Weight of the Q-value loss."""
    max_grad_norm: PositiveFloat = 10.0
    """Global gradient-norm clip."""
    replay_ratio: NonNegativeFloat = 4.0
    """Mean of the Poisson number of replayed rollouts per collected rollout (0: on-policy)."""
    replay_size: PositiveInt = 50
    """Rollouts kept in the replay."""
    replay_start: PositiveInt = 10
    """Rollouts stored before replay starts."""
    truncation_clip: PositiveFloat = 10.0
    """``c``: importance weights above it are truncated (the rest goes to bias correction)."""
    trust_region: bool = True
    """Project policy gradients into the trust region around the average policy."""
    trust_region_delta: PositiveFloat = 1.0
    """``delta``: the largest step in KL(average policy || policy) per sample."""
    average_decay: UnitFloat = 0.99
    """Polyak decay of the average policy network."""
    optimizer_eps: PositiveFloat = 1e-5
    """RMSprop epsilon."""
    normalize_obs: bool = False
    """Normalise vector observations with running statistics (saved with the model)."""
    normalize_reward: bool = False
    """Divide rewards by the running std of the discounted return (saved with the model)."""
    hidden_sizes: tuple[LayerWidth, ...] = (64, 64)
    """Hidden layer widths of the policy MLP and of the Q MLP."""
    activation: Activation = "tanh"
    """Hidden-layer activation."""
    cnn: CnnKind = "nature"
    """Encoder of image observations: ``nature`` (Mnih et al. 2015), ``impala`` or
    ``minatar`` (Young and Tian 2019: for small grids such as MinAtar's)."""


class _PolicyQ(nn.Module):
    def __init__(
        self,
        layout: ObsLayout,
        num_actions: int,
        cfg: ACERConfig,
        encoder: EncoderFactory | None,
    ) -> None:
        super().__init__()
        self.encoder = make_encoder(layout, cfg.cnn, encoder)
        self.twin = TwinMLP(
            self.encoder.out_features,
            cfg.hidden_sizes,
            (num_actions, num_actions),
            cfg.activation,
            output_gains=(0.01, 1.0),
        )

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy logits and Q-values, ``[batch, num_actions]`` each."""
        logits, q_values = self.twin(self.encoder(obs))
        return logits, q_values


class _Replay:
    """The last ``capacity`` rollouts, preallocated on first use, overwritten oldest first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.size = 0
        self.next = 0
        self.fields: dict[str, torch.Tensor] = {}

    def add(self, rollout: dict[str, torch.Tensor]) -> None:
        if not self.fields:
            self.fields = {
                name: torch.empty((self.capacity, *t.shape), dtype=t.dtype)
                for name, t in rollout.items()
            }
        first = self.fields["rewards"][0]
        if rollout["rewards"].shape != first.shape:
            raise ConfigError(
                f"acer replays whole rollouts of one length: expected {tuple(first.shape)} "
                f"(num_steps, num_envs), got {tuple(rollout['rewards'].shape)}; collect by "
                "env steps, not by episode count"
            )
        for name, tensor in rollout.items():
            self.fields[name][self.next].copy_(tensor)
        self.next = (self.next + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def get(self, index: int) -> dict[str, torch.Tensor]:
        return {name: t[index] for name, t in self.fields.items()}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The stored rollouts, oldest first (``[rollouts, *rollout shape]`` per field)."""
        oldest = self.next if self.size == self.capacity else 0
        return {
            name: torch.roll(t[: self.size], -oldest, dims=0) for name, t in self.fields.items()
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Refill from :meth:`state_dict` output; the newest ``capacity`` rollouts are kept."""
        self.size = self.next = 0
        count = len(next(iter(state.values()))) if state else 0
        for index in range(max(count - self.capacity, 0), count):
            self.add({name: t[index] for name, t in state.items()})


@register
class ACER(Algorithm[ACERConfig], OnPolicyAlgorithm):
    """ACER for Discrete actions, action masks included."""

    name = "acer"
    supports_masks = True
    supports_images = True
    supports_custom_encoder = True
    needs_fixed_length_rollouts = True
    kind = "on_policy"
    config_class = ACERConfig
    action_spaces = (spaces.Discrete,)
    observation_spaces = OBSERVATION_SPACES

    def _setup(self) -> None:
        self.num_actions = int(self.action_space.n)  # type: ignore[attr-defined]
        self.replay = _Replay(self.config.replay_size)

    def _build(self) -> None:
        cfg = self.config
        self.net = _PolicyQ(self.obs_layout, self.num_actions, cfg, self.encoder_factory).to(
            self.device
        )
        self.average_net = copy.deepcopy(self.net).requires_grad_(False)
        self.obs_normalizer, self.reward_scaler = make_normalizers(
            self.obs_layout, cfg, self.name, self.device
        )
        self._params: list[torch.Tensor] = list(self.net.parameters())
        self.optimizer = torch.optim.RMSprop(
            self._params, lr=cfg.learning_rate, alpha=0.99, eps=cfg.optimizer_eps
        )

    def modules(self) -> dict[str, nn.Module]:
        return {
            "net": self.net,
            "average_net": self.average_net,
            **normalizer_modules(self.obs_normalizer, self.reward_scaler),
        }

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    def state_dict(self) -> dict[str, Any]:
        # The replayed rollouts are part of the training state: a resumed run replays the
        # same ones, instead of waiting for replay_start new rollouts.
        return {**super().state_dict(), "replay": self.replay.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.replay.load_state_dict(state.get("replay", {}))

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
        logits, q_values = self.net(obs)
        log_p = torch.log_softmax(apply_mask(logits, action_mask), dim=-1)
        if deterministic:
            log_probs, actions = log_p.max(dim=-1)
        else:
            noise = torch.empty_like(log_p, device="cpu").exponential_(generator=self.generator)
            noise = noise.to(log_p.device)
            actions = torch.argmax(log_p - noise.log_(), dim=-1)
            log_probs = log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        values = (log_p.exp() * q_values).sum(-1)
        return PolicyStep(actions=actions, log_probs=log_probs, values=values)

    # --------------------------------------------------------------- training
    def _probabilities(
        self, net: nn.Module, obs: torch.Tensor, masks: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits, q_values = net(obs)
        return torch.softmax(apply_mask(logits, masks), dim=-1), q_values

    def update(
        self,
        batch: RolloutStorage,
        *,
        batch_size: int | None = None,
        num_repetitions: int | None = None,
    ) -> dict[str, float]:
        """Train on the fresh rollout, then on ``Poisson(replay_ratio)`` replayed ones."""
        if batch_size is not None or num_repetitions is not None:
            raise ConfigError(
                "acer trains on whole rollouts: batch_size and update_step_num_repetitions "
                "do not apply (use num_steps and replay_ratio)"
            )
        cfg = self.config
        lr = scheduled(cfg.learning_rate, cfg.lr_schedule, self.progress) * self.lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        rewards = scaled_rewards(batch, self.reward_scaler)
        steps, envs = batch.num_steps, batch.num_envs
        masks = None if batch.masks is None else batch.masks.reshape(steps * envs, -1)
        with torch.no_grad():
            # The parameters have not moved since collection: these are the behaviour
            # policy's probabilities, stored for replay.
            obs = batch.obs.reshape(steps * envs, *batch.obs.shape[2:]).to(self.device)
            masks = None if masks is None else masks.to(self.device)
            mu = self._probabilities(self.net, obs, masks)[0]
        rollout = {
            "obs": batch.obs,
            "next_obs": batch.next_obs,
            "actions": batch.actions,
            "rewards": rewards,
            "terminated": batch.terminated,
            "truncated": batch.truncated,
            "valid": batch.valid,
            "mu": mu.reshape(steps, envs, -1),
        }
        if batch.masks is not None and batch.next_mask is not None:
            rollout["masks"] = batch.masks
            rollout["next_mask"] = batch.next_mask
        stats = self._train(rollout)
        if stats is not None:  # a skipped rollout (nan_policy: skip_batch) is not replayed
            self.replay.add(rollout)
        replays = 0
        if cfg.replay_ratio > 0 and self.replay.size >= cfg.replay_start:
            replays = int(torch.poisson(torch.tensor(cfg.replay_ratio), self.generator))
            for _ in range(replays):
                index = int(torch.randint(self.replay.size, (), generator=self.generator))
                self._train(self.replay.get(index))
        names = ("loss/policy", "loss/q", "loss/entropy", "train/trust_region_adjustment")
        metrics = {} if stats is None else dict(zip(names, stats.tolist(), strict=True))
        metrics["train/learning_rate"] = lr
        metrics["train/replayed_rollouts"] = float(replays)
        return metrics

    def _train(self, rollout: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """One gradient step on one rollout; returns [policy, q, entropy, adjustment] (None:
        the rollout was skipped)."""
        cfg = self.config
        # On the networks' device (the rollout and the replay are kept on the CPU).
        rollout = {key: value.to(self.device) for key, value in rollout.items()}
        steps, envs = rollout["rewards"].shape
        n = steps * envs
        obs = torch.cat([rollout["obs"].reshape(n, *rollout["obs"].shape[2:]), rollout["next_obs"]])
        masks = (
            torch.cat([rollout["masks"].reshape(n, -1), rollout["next_mask"]])
            if "masks" in rollout
            else None
        )
        probs_all, q_all = self._probabilities(self.net, obs, masks)
        with torch.no_grad():
            average_probs = self._probabilities(
                self.average_net, obs[:n], None if masks is None else masks[:n]
            )[0]
        values_all = (probs_all * q_all).sum(-1).detach()
        probs, q_values = probs_all[:n], q_all[:n]
        actions = rollout["actions"].reshape(n, 1).long()
        mu = rollout["mu"].reshape(n, -1)
        rho_all = probs.detach() / (mu + _EPS)
        rho = rho_all.gather(1, actions).squeeze(1)
        q_taken = q_values.gather(1, actions).squeeze(1)
        q_ret = F.retrace(
            rollout["rewards"],
            q_taken.detach().view(steps, envs),
            values_all.view(steps + 1, envs),
            rho.clamp(max=1.0).view(steps, envs),
            rollout["terminated"],
            rollout["truncated"],
            cfg.gamma,
        ).reshape(n)
        values = values_all[:n]
        valid = rollout["valid"].reshape(n)
        num_valid = valid.sum().clamp(min=1.0)
        weights = valid / num_valid

        log_probs = torch.log(probs + _EPS)
        taken_gain = log_probs.gather(1, actions).squeeze(1) * (
            (q_ret - values) * rho.clamp(max=cfg.truncation_clip)
        )
        correction = (1.0 - cfg.truncation_clip / (rho_all + _EPS)).clamp(min=0.0)
        bias_gain = (
            log_probs * ((q_values.detach() - values.unsqueeze(1)) * correction * probs.detach())
        ).sum(-1)
        policy_gain = torch.dot(taken_gain + bias_gain, weights)
        entropy = torch.dot(-(probs * log_probs).sum(-1), weights)
        q_loss = 0.5 * torch.dot((q_ret - q_taken).pow(2), weights)
        objective = policy_gain + cfg.ent_coef * entropy
        loss = cfg.q_coef * q_loss - objective

        params = self._params
        adjustment = torch.zeros((), device=self.device)
        if cfg.trust_region:
            for p in params:
                p.grad = None
            # Per-sample gradient with respect to the probabilities (the weights are
            # 1 / num_valid), projected so that k . g <= delta, k = grad_f KL(avg || f).
            grad = torch.autograd.grad(objective, probs, retain_graph=True)[0] * num_valid
            k = -average_probs / (probs.detach() + _EPS)
            excess = ((k * grad).sum(-1) - cfg.trust_region_delta).clamp(min=0.0)
            scale = excess / (k.pow(2).sum(-1) + _EPS)
            grad = grad - scale.unsqueeze(1) * k
            adjustment = torch.dot(scale, weights)
            torch.autograd.backward(
                [probs, cfg.q_coef * q_loss],
                [-grad / num_valid, torch.ones((), device=self.device)],
            )
            # The projected gradient replaces the policy part of ``loss``'s: the same check
            # and step as every other update, on the gradients already computed.
            norm = step_if_finite(
                self, self.optimizer, loss, params, max_grad_norm=cfg.max_grad_norm
            )
        else:
            norm = optimizer_step(
                self, self.optimizer, loss, params, max_grad_norm=cfg.max_grad_norm
            )
        if norm is None:  # a skipped batch (nan_policy: skip_batch)
            return None
        self.gradient_steps += 1
        with torch.no_grad():
            # Polyak average: avg <- decay * avg + (1 - decay) * current.
            torch._foreach_lerp_(
                list(self.average_net.parameters()),
                list(self.net.parameters()),
                1.0 - cfg.average_decay,
            )
        return torch.stack([-policy_gain, q_loss, entropy, adjustment]).detach()
