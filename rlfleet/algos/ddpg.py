"""Deep Deterministic Policy Gradient (Lillicrap et al. 2016, "Continuous control with deep
reinforcement learning", arXiv:1509.02971).

A deterministic tanh policy trained to maximise one critic's Q-value, the critic trained
towards ``r + gamma * Q'(s', mu'(s'))`` with Polyak-averaged target networks. Exploration is
Gaussian noise of ``action_noise`` (a fraction of the half-range of each action dimension)
rather than the paper's Ornstein-Uhlenbeck process, which later work found no better
(Fujimoto et al. 2018). Defaults and update order are Stable-Baselines3's.

Deviations, none of which changes the maths: the actor loss back-propagates into the
actor's parameters only; target networks move by one ``torch._foreach_lerp_``; Adam is the
fused kernel. The networks, targets and optimisers are a
:class:`~rlfleet.nn.deterministic.DeterministicActorCritic`, as TD3's and TD3+BC's. On a CUDA
device with ``trainer.cuda_graphs``, each gradient step (critic and actor) is captured once as
a CUDA graph and replayed (:meth:`DDPG.capture_update`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from gymnasium import spaces
from torch import nn

from rlfleet import functional as F
from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import OffPolicyAlgorithm
from rlfleet.algos.registry import register
from rlfleet.config.fields import (
    LayerWidth,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    UnitFloat,
)
from rlfleet.data.samplers import Sampler, UniformSampler
from rlfleet.nn.cuda_graph import CapturedSteps
from rlfleet.nn.deterministic import BoxBatch, DeterministicActorCritic, box_batch
from rlfleet.nn.mlp import Activation, flat_size, flatten_obs
from rlfleet.nn.noise import next_noise
from rlfleet.nn.normalize import make_obs_normalizer, obs_normalizer_modules
from rlfleet.nn.optim import captured_steps_taken
from rlfleet.seeding import stream_seed
from rlfleet.types import PolicyStep, ReplayBatch

if TYPE_CHECKING:
    from rlfleet.data.source import TransitionSource


@dataclass
class DDPGConfig:
    """DDPG hyperparameters (Stable-Baselines3 names and defaults where they exist)."""

    learning_rate: PositiveFloat = 1e-3
    """Adam step size of actor and critic."""
    buffer_size: PositiveInt = 1_000_000
    """Replay buffer capacity in transitions."""
    learning_starts: NonNegativeInt = 100
    """Env steps of uniformly random actions before the first update."""
    batch_size: PositiveInt = 256
    """Transitions per gradient step."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    tau: UnitFloat = 0.005
    """Polyak step of the target networks after each gradient step."""
    train_freq: PositiveInt = 1
    """Env steps collected per training step (all envs counted)."""
    gradient_steps: NonNegativeInt = 1
    """Gradient steps per training step (update-to-data ratio = gradient_steps / train_freq)."""
    n_step: PositiveInt = 1
    """Steps of real rewards before bootstrapping (cut at episode ends; 1: one-step targets)."""
    action_noise: NonNegativeFloat = 0.1
    """Std of the Gaussian exploration noise (in units of half the action range)."""
    action_noise_color: NonNegativeFloat = 0.0
    """Exponent ``beta`` of the exploration noise's power spectrum ``1/f**beta`` (Box
    actions): 0 draws the noise independently each step (white), 1 pink, 2 red. Colored
    noise keeps its sign for longer and carries the agent further (:mod:`rlfleet.nn.noise`)."""
    hidden_sizes: tuple[LayerWidth, ...] = (256, 256)
    """Hidden layer widths of the actor and of the critic."""
    activation: Activation = "relu"
    """Hidden-layer activation."""
    adam_eps: PositiveFloat = 1e-8
    """Adam epsilon."""
    normalize_obs: bool = False
    """Normalise observations with running mean/std statistics, updated from every
    collected observation; replay samples are normalised with the current statistics."""


@register
class DDPG(Algorithm[DDPGConfig], OffPolicyAlgorithm):
    """Deep Deterministic Policy Gradient for Box actions."""

    name = "ddpg"
    kind = "off_policy"
    config_class = DDPGConfig
    action_spaces = (spaces.Box,)

    def _setup(self) -> None:
        self.obs_shape: tuple[int, ...] = tuple(self.observation_space.shape or ())

    def _build(self) -> None:
        assert isinstance(self.action_space, spaces.Box)  # check_spaces accepted only Box
        self.obs_normalizer = make_obs_normalizer(
            self.obs_layout, self.config.normalize_obs, self.name, self.device
        )
        self.nets = DeterministicActorCritic(
            flat_size(self.obs_shape),
            self.action_space,
            self.config,
            twin=False,
            device=self.device,
        )
        """Actor and one critic, their targets and optimisers."""

    def modules(self) -> dict[str, nn.Module]:
        return {**self.nets.modules(), **obs_normalizer_modules(self.obs_normalizer)}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return self.nets.optimizers()

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
        noise_std = 0.0 if deterministic else self.config.action_noise
        flat = flatten_obs(obs, len(self.obs_shape))
        noise = next_noise(self.action_noise_process, deterministic, flat.shape[0], self.device)
        return PolicyStep(actions=self.nets.act(flat, noise_std, self.generator, noise))

    # --------------------------------------------------------------- training
    def replay_sampler(self) -> Sampler:
        """Uniform: DDPG feeds back no priorities."""
        return UniformSampler(seed=stream_seed(self.seed, "replay"))

    def capture_update(self) -> None:
        """Capture each gradient step (critic, then actor) as a CUDA graph and replay it from
        then on (:class:`~rlfleet.nn.cuda_graph.CapturedSteps`): the first three steps run
        eagerly, the fourth is captured. A step reads its minibatch from tensors it keeps,
        which each step refills, and runs the eager step's kernels on the same numbers, so it
        trains the parameters bitwise as the eager step does (the learning rate is constant).
        A minibatch of another shape is stepped eagerly, as is every step while the actor or
        the critic has hooks (they would run once, at the capture). Loading a state drops the
        capture (the optimisers' state tensors are new) and the next steps capture again.

        The actor's optimiser step skips itself inside the graph when its loss or gradient
        norm is not finite, or when the critic's step was skipped; after the replay one read
        of the checks applies ``nan_policy`` to the first that failed. The targets move after
        the replay, as in an eager step."""
        self._capture_steps()

    def update(
        self,
        source: TransitionSource,
        *,
        batch_size: int | None = None,
        num_gradient_steps: int = 1,
    ) -> dict[str, float]:
        """``num_gradient_steps`` steps of critic, actor and targets."""
        cfg, nets = self.config, self.nets
        batch_size = batch_size or cfg.batch_size
        totals = torch.zeros(2, device=self.device)  # critic loss, actor loss
        steps = 0
        ndim = len(self.obs_shape)
        captures = self._captures_for(nets.actor, nets.critic)
        for _ in range(num_gradient_steps):
            sample: ReplayBatch[torch.Tensor] = source.sample(
                batch_size, gamma=cfg.gamma, n_step=cfg.n_step, progress=self.progress
            ).to(self.device)
            batch = box_batch(
                sample, lambda obs: flatten_obs(self.preprocess(obs), ndim), nets.to_unit
            )
            losses = self._step(batch, captures)
            if losses is None:
                continue  # a skipped batch (nan_policy: skip_batch) ends its gradient step
            F.polyak_update(nets.target_params, nets.online_params, cfg.tau)
            self.gradient_steps += 1
            steps += 1
            totals += losses
        means = (totals / max(steps, 1)).tolist()
        return {"loss/critic": means[0], "loss/actor": means[1]}

    def _critic_loss(self, batch: BoxBatch) -> torch.Tensor:
        """The critic's squared error against ``r + discount * Q'(s', mu'(s'))``."""
        nets = self.nets
        with torch.no_grad():
            next_actions = nets.target_policy(batch.next_obs)
            next_q = nets.critic_target(torch.cat([batch.next_obs, next_actions], 1)).squeeze(1)
            target = batch.rewards + batch.discounts * next_q
        q = nets.critic(torch.cat([batch.obs, batch.actions], 1)).squeeze(1)
        return nn.functional.mse_loss(q, target)

    def _actor_loss(self, obs: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = -self.nets.critic(torch.cat([obs, self.nets.policy(obs)], 1)).mean()
        return loss

    def _step(self, batch: BoxBatch, captures: CapturedSteps | None) -> torch.Tensor | None:
        """A critic step and an actor step on ``batch``; returns their losses (None: the batch
        was skipped). With ``captures``, the captured step where ``batch`` fits it, then
        ``nan_policy`` on the first of its checks that failed."""
        nets = self.nets
        if captures is not None:
            outputs = captures("step", batch, self._captured_step)
            if outputs is not None:
                losses, *checks = outputs
                return losses if captured_steps_taken(self, checks) == 2 else None
        critic_loss = self._critic_loss(batch)
        if not nets.step_critic(self, critic_loss):
            return None
        actor_loss = self._actor_loss(batch.obs)
        if not nets.step_actor(self, actor_loss):
            return None
        return torch.stack([critic_loss.detach(), actor_loss.detach()])

    def _captured_step(self, batch: BoxBatch) -> tuple[torch.Tensor, ...]:
        """:meth:`_step` as a capture records it: the two losses, then the loss and the
        gradient norm of each optimiser step's check."""
        checks: list[torch.Tensor] = []
        critic_loss = self._critic_loss(batch)
        skip = self.nets.critic_step_captured(critic_loss, checks)
        actor_loss = self._actor_loss(batch.obs)
        self.nets.actor_step_captured(actor_loss, checks, skip)
        return torch.stack([critic_loss.detach(), actor_loss.detach()]), *checks
