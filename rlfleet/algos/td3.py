"""Twin Delayed DDPG (Fujimoto et al. 2018, "Addressing Function Approximation Error in
Actor-Critic Methods", arXiv:1802.09477).

DDPG with three changes: twin critics and the minimum of their targets (against
overestimation), target-policy smoothing (clipped noise on the target action), and delayed
actor and target updates (every ``policy_delay`` critic steps). Exploration is Gaussian
noise of ``action_noise`` (a fraction of the half-range of each action dimension) on the
deterministic policy. Defaults and update order are Stable-Baselines3's.

Deviations, none of which changes the maths: both critics are one
:class:`~rlfleet.nn.twin.TwinMLP` (one batched matmul per layer); the actor loss
back-propagates into the actor's parameters only; target networks move by one
``torch._foreach_lerp_``; Adam is the fused kernel. The networks are DDPG's
:class:`~rlfleet.nn.deterministic.DeterministicActorCritic` with twin critics; the critic loss,
:func:`~rlfleet.functional.td3_critic_loss`, is shared with TD3+BC. On a CUDA device with
``trainer.cuda_graphs``, the gradient steps with and without the actor's are each captured
once as a CUDA graph and replayed (:meth:`TD3.capture_update`).
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
class TD3Config:
    """TD3 hyperparameters (Stable-Baselines3 names and defaults where they exist)."""

    learning_rate: PositiveFloat = 1e-3
    """Adam step size of actor and critics."""
    buffer_size: PositiveInt = 1_000_000
    """Replay buffer capacity in transitions."""
    learning_starts: NonNegativeInt = 100
    """Env steps of uniformly random actions before the first update."""
    batch_size: PositiveInt = 256
    """Transitions per gradient step."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    tau: UnitFloat = 0.005
    """Polyak step of the target networks after each delayed update."""
    train_freq: PositiveInt = 1
    """Env steps collected per training step (all envs counted)."""
    gradient_steps: NonNegativeInt = 1
    """Gradient steps per training step (update-to-data ratio = gradient_steps / train_freq)."""
    n_step: PositiveInt = 1
    """Steps of real rewards before bootstrapping (cut at episode ends; 1: one-step targets)."""
    policy_delay: PositiveInt = 2
    """Critic steps per actor (and target) update."""
    target_policy_noise: NonNegativeFloat = 0.2
    """Std of the smoothing noise on target actions (in units of half the action range)."""
    target_noise_clip: NonNegativeFloat = 0.5
    """Clip of that smoothing noise."""
    action_noise: NonNegativeFloat = 0.1
    """Std of the Gaussian exploration noise (in units of half the action range)."""
    action_noise_color: NonNegativeFloat = 0.0
    """Exponent ``beta`` of the exploration noise's power spectrum ``1/f**beta`` (Box
    actions): 0 draws the noise independently each step (white), 1 pink, 2 red. Colored
    noise keeps its sign for longer and carries the agent further (:mod:`rlfleet.nn.noise`)."""
    hidden_sizes: tuple[LayerWidth, ...] = (256, 256)
    """Hidden layer widths of the actor and of each critic."""
    activation: Activation = "relu"
    """Hidden-layer activation."""
    adam_eps: PositiveFloat = 1e-8
    """Adam epsilon."""
    normalize_obs: bool = False
    """Normalise observations with running mean/std statistics, updated from every
    collected observation; replay samples are normalised with the current statistics."""


@register
class TD3(Algorithm[TD3Config], OffPolicyAlgorithm):
    """Twin Delayed DDPG for Box actions."""

    name = "td3"
    kind = "off_policy"
    config_class = TD3Config
    action_spaces = (spaces.Box,)

    def _setup(self) -> None:
        self.obs_shape: tuple[int, ...] = tuple(self.observation_space.shape or ())

    def _build(self) -> None:
        assert isinstance(self.action_space, spaces.Box)  # check_spaces accepted only Box
        self.obs_normalizer = make_obs_normalizer(
            self.obs_layout, self.config.normalize_obs, self.name, self.device
        )
        self.nets = DeterministicActorCritic(
            flat_size(self.obs_shape), self.action_space, self.config, twin=True, device=self.device
        )
        """Actor and twin critics, their targets and optimisers."""

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
        """Uniform: TD3 feeds back no priorities."""
        return UniformSampler(seed=stream_seed(self.seed, "replay"))

    def capture_update(self) -> None:
        """Capture the gradient steps as CUDA graphs and replay them from then on
        (:class:`~rlfleet.nn.cuda_graph.CapturedSteps`): one for a step of the critics alone,
        one for a step of the critics and the actor, each run eagerly for its first three
        calls and captured on the fourth. A step reads its minibatch, and the standard-normal
        draw of its target-policy smoothing, from tensors it keeps, which each step refills;
        the draw comes from the algorithm's generator on the host, as an eager step draws it,
        so the captured steps run the eager steps' kernels on the same numbers and train the
        parameters bitwise as they do (the learning rate is constant). A minibatch of another
        shape is stepped eagerly, as is every step while the actor or the critics have hooks
        (they would run once, at the capture). Loading a state drops the captures (the
        optimisers' state tensors are new) and the next steps capture again.

        The actor's optimiser step skips itself inside the graph when its loss or gradient
        norm is not finite, or when the critics' step was skipped; after the replay one read
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
        """``num_gradient_steps`` critic steps; actor and targets every ``policy_delay``."""
        cfg, nets = self.config, self.nets
        batch_size = batch_size or cfg.batch_size
        critic_total = torch.zeros((), device=self.device)
        actor_total = torch.zeros((), device=self.device)
        critic_updates = actor_updates = 0
        ndim = len(self.obs_shape)
        captures = self._captures_for(nets.actor, nets.critic)
        for _ in range(num_gradient_steps):
            sample: ReplayBatch[torch.Tensor] = source.sample(
                batch_size, gamma=cfg.gamma, n_step=cfg.n_step, progress=self.progress
            ).to(self.device)
            batch = box_batch(
                sample,
                lambda obs: flatten_obs(self.preprocess(obs), ndim),
                nets.to_unit,
                generator=self.generator,
                next_noise=True,
            )
            # The step that makes the gradient-step count a multiple of policy_delay has the
            # actor's too (if its critic step is taken).
            with_actor = (self.gradient_steps + 1) % cfg.policy_delay == 0
            losses = self._step(batch, with_actor, captures)
            if len(losses) < (2 if with_actor else 1):
                # A skipped batch (nan_policy: skip_batch) ends its gradient step, uncounted
                # and with no target update; a critic step it took before the actor's stays.
                continue
            critic_total += losses[0]
            critic_updates += 1
            self.gradient_steps += 1
            if with_actor:
                F.polyak_update(nets.target_params, nets.online_params, cfg.tau)
                actor_total += losses[1]
                actor_updates += 1
        metrics = {"loss/critic": float(critic_total) / max(critic_updates, 1)}
        if actor_updates:
            metrics["loss/actor"] = float(actor_total) / actor_updates
        return metrics

    def _actor_loss(self, obs: torch.Tensor) -> torch.Tensor:
        """``-Q_1(s, mu(s))``: the first critic alone drives the actor, as in the paper."""
        loss: torch.Tensor = -self.nets.critic(torch.cat([obs, self.nets.policy(obs)], 1))[0].mean()
        return loss

    def _step(
        self, batch: BoxBatch, with_actor: bool, captures: CapturedSteps | None
    ) -> tuple[torch.Tensor, ...]:
        """One critic step on ``batch``, and the actor's after it ``with_actor``; returns the
        losses of the optimiser steps taken (the critics', then the actor's; none: the batch
        was skipped at the critics). With ``captures``, the captured step where ``batch``
        fits it, then ``nan_policy`` on the first of its checks that failed."""
        nets = self.nets
        if captures is not None:
            step = self._captured_actor_step if with_actor else self._captured_critic_step
            outputs = captures(with_actor, batch, step)
            if outputs is not None:
                steps = 2 if with_actor else 1  # the outputs: the losses, then the checks
                return outputs[: captured_steps_taken(self, outputs[steps:])]
        critic_loss = F.td3_critic_loss(nets, batch, self.config)
        if not nets.step_critic(self, critic_loss):
            return ()
        if not with_actor:
            return (critic_loss.detach(),)
        actor_loss = self._actor_loss(batch.obs)
        if not nets.step_actor(self, actor_loss):
            return (critic_loss.detach(),)
        return critic_loss.detach(), actor_loss.detach()

    def _captured_critic_step(self, batch: BoxBatch) -> tuple[torch.Tensor, ...]:
        """A critic step as a capture records it: the loss, then the loss and the gradient
        norm of its check (:meth:`DeterministicActorCritic.critic_step_captured`)."""
        checks: list[torch.Tensor] = []
        loss = F.td3_critic_loss(self.nets, batch, self.config)
        self.nets.critic_step_captured(loss, checks)
        return loss.detach(), *checks

    def _captured_actor_step(self, batch: BoxBatch) -> tuple[torch.Tensor, ...]:
        """A critic step and the actor's after it, as a capture records them: the two
        losses, then the loss and the gradient norm of each step's check."""
        checks: list[torch.Tensor] = []
        critic_loss = F.td3_critic_loss(self.nets, batch, self.config)
        skip = self.nets.critic_step_captured(critic_loss, checks)
        actor_loss = self._actor_loss(batch.obs)
        self.nets.actor_step_captured(actor_loss, checks, skip)
        return critic_loss.detach(), actor_loss.detach(), *checks
