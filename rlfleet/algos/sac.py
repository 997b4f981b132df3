"""Soft Actor-Critic for Box and Discrete actions, with automatic entropy tuning.

Box actions: Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications"
(arXiv:1812.05905): a tanh-squashed Gaussian policy, twin Q-networks with Polyak-averaged
targets, and the entropy coefficient tuned towards ``target_entropy`` (``-dim(A)``).
Discrete actions: Christodoulou 2019, "Soft Actor-Critic for Discrete Action Settings"
(arXiv:1910.07207): the policy is a softmax, the critics output Q of every action, and
expectations over actions are exact sums instead of samples; ``target_entropy`` defaults to
``target_entropy_scale * log(num_actions)``, by default half the uniform policy's entropy,
between CleanRL's scale (0.89) and ML-Agents' (0.2). With CleanRL's, greedy play after 100k
steps was worse than random play on LunarLander-v3 and MinAtar/SpaceInvaders-v1 on every
seed run, and with 0.5 better on every one (``rlfleet/config/presets/sac.yaml`` has the runs).

The update follows Stable-Baselines3's order (one policy forward per step, reused by the
entropy-coefficient loss and, after the critic step, by the actor loss); the defaults are
SB3's. Deviations, none of which changes the maths:

- both critics are one :class:`~rlfleet.nn.twin.TwinMLP` (one batched matmul per layer);
- the actor loss back-propagates into the actor's parameters only (``backward(inputs=)``),
  so no gradient is computed for critic weights that the actor step does not use;
- target networks move by one ``torch._foreach_lerp_`` and Adam is the fused kernel;
- discrete actions: the actor loss uses the critic's Q-values from the critic step's
  forward (before that step), saving one forward pass;
- Box actions on a CUDA device with ``trainer.cuda_graphs``: each gradient step (entropy
  coefficient, critics and actor, with their non-finite checks and Adam steps) is captured
  once as a CUDA graph and replayed (:meth:`SAC.capture_update`).

Image observations (uint8 frames such as Atari's) with Discrete actions go through a CNN
(``cnn``, the Nature network by default), and so do binary grids (MinAtar's bool frames)
with ``cnn: minatar``; every other observation is flattened into the MLPs. As in
Stable-Baselines3's SAC, the actor has a CNN of its own and the twin critics share one (their
target a copy of it), so that the critics' loss does not move the policy's features. Box
actions take vector observations only: their critics read the action beside the
observation, which the CNN path does not build.

Discrete actions with action masks: the policy is the softmax over legal actions everywhere,
so the target's expectation over ``pi(a'|s')`` uses the mask of the next state (illegal
actions get probability exactly 0, see :data:`rlfleet.nn.masks.MASK_FILL`), and the actor
and entropy losses the mask of the state itself. The default target entropy is then
``target_entropy_scale * log(number of legal actions)`` per state, the same fraction of the
largest entropy the state allows (a fixed ``log(n)`` fraction could be out of reach and
drive the entropy coefficient up without end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from gymnasium import spaces
from torch import nn

from rlfleet import functional as F
from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import OffPolicyAlgorithm
from rlfleet.algos.registry import algorithms_supporting, algorithms_supporting_images, register
from rlfleet.config.fields import (
    LayerWidth,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    UnitFloat,
)
from rlfleet.data.samplers import Sampler, UniformSampler
from rlfleet.envs.spaces import describe_space
from rlfleet.errors import ConfigError, EnvSpecError
from rlfleet.nn import distributions as D
from rlfleet.nn.actions import box_scale_bias, to_box, to_unit
from rlfleet.nn.cnn import CnnKind
from rlfleet.nn.compile import compile_module
from rlfleet.nn.cuda_graph import CapturedSteps
from rlfleet.nn.deterministic import BoxBatch, box_batch, twin_critic, with_target
from rlfleet.nn.encoders import make_encoder
from rlfleet.nn.entropy import EntropyCoefficient
from rlfleet.nn.masks import apply_mask
from rlfleet.nn.mlp import Activation, flat_size, flatten_obs, mlp
from rlfleet.nn.noise import next_noise
from rlfleet.nn.normalize import make_obs_normalizer, obs_normalizer_modules
from rlfleet.nn.obs import is_binary_grid_space, is_image_space
from rlfleet.nn.optim import (
    adam,
    captured_steps_taken,
    optimizer_step,
    optimizer_step_captured,
)
from rlfleet.seeding import stream_seed
from rlfleet.types import PolicyStep, ReplayBatch

if TYPE_CHECKING:
    from rlfleet.data.source import TransitionSource

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
"""Clamp of the policy's log standard deviation (as in SB3 and the reference code)."""


@dataclass
class SACConfig:
    """SAC hyperparameters (Stable-Baselines3 names and defaults where they exist)."""

    learning_rate: PositiveFloat = 3e-4
    """Adam step size of actor, critics and entropy coefficient."""
    buffer_size: PositiveInt = 1_000_000
    """Replay buffer capacity in transitions."""
    learning_starts: NonNegativeInt = 100
    """Env steps of uniformly random actions before the first update."""
    batch_size: PositiveInt = 256
    """Transitions per gradient step."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    tau: UnitFloat = 0.005
    """Polyak step of the target critics after each target update."""
    train_freq: PositiveInt = 1
    """Env steps collected per training step (all envs counted)."""
    gradient_steps: NonNegativeInt = 1
    """Gradient steps per training step (update-to-data ratio = gradient_steps / train_freq)."""
    n_step: PositiveInt = 1
    """Steps of real rewards before bootstrapping (cut at episode ends; 1: one-step targets)."""
    target_update_interval: PositiveInt = 1
    """Gradient steps between target-critic updates."""
    ent_coef: PositiveFloat | None = None
    """Fixed entropy coefficient; unset: tuned automatically towards ``target_entropy``."""
    ent_coef_init: PositiveFloat = 1.0
    """Initial entropy coefficient when it is tuned."""
    target_entropy: float | None = None
    """Entropy the tuning aims for; unset: -dim(A) (Box) or scale * log(n) (Discrete)."""
    target_entropy_scale: UnitFloat = 0.5
    """Discrete actions: default target entropy as a fraction of the maximum, log(n)."""
    hidden_sizes: tuple[LayerWidth, ...] = (256, 256)
    """Hidden layer widths of the actor and of each critic."""
    activation: Activation = "relu"
    """Hidden-layer activation."""
    adam_eps: PositiveFloat = 1e-8
    """Adam epsilon."""
    normalize_obs: bool = False
    """Normalise observations with running mean/std statistics, updated from every
    collected observation; replay samples are normalised with the current statistics."""
    action_noise_color: NonNegativeFloat = 0.0
    """Exponent ``beta`` of the exploration noise's power spectrum ``1/f**beta`` (Box
    actions): 0 draws the noise independently each step (white), 1 pink, 2 red. Colored
    noise keeps its sign for longer and carries the agent further (:mod:`rlfleet.nn.noise`)."""
    cnn: CnnKind = "nature"
    """CNN for image observations (``nature``, ``impala`` or ``minatar``; Discrete actions);
    binary grids go through a CNN only with ``minatar`` (else they are flattened, as vectors
    are). Its features feed the ``hidden_sizes`` layers (none: linear heads)."""


@register
class SAC(Algorithm[SACConfig], OffPolicyAlgorithm):
    """Soft Actor-Critic for Box (squashed Gaussian) and Discrete (softmax) actions."""

    name = "sac"
    supports_masks = True
    supports_images = True
    kind = "off_policy"
    config_class = SACConfig
    action_spaces = (spaces.Box, spaces.Discrete)

    @classmethod
    def check_spaces(
        cls, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
    ) -> None:
        """The spaces every algorithm checks, then images with Box actions, which SAC refuses
        (its CNN path builds Discrete actions' networks only)."""
        super().check_spaces(observation_space, action_space)
        if isinstance(action_space, spaces.Box) and is_image_space(observation_space):
            images = set(algorithms_supporting_images()) - {cls.name}
            others = [n for n in algorithms_supporting(action_space=action_space) if n in images]
            raise EnvSpecError(
                f"{cls.name} takes image observations with Discrete actions only; got "
                f"observation space {describe_space(observation_space)} with action space "
                f"{describe_space(action_space)}. Algorithms for images with Box actions: "
                f"{', '.join(others)}"
            )

    def _setup(self) -> None:
        self.continuous = isinstance(self.action_space, spaces.Box)
        self.obs_shape: tuple[int, ...] = tuple(self.observation_space.shape or ())
        if isinstance(self.action_space, spaces.Box):
            self.action_shape: tuple[int, ...] = tuple(self.action_space.shape)
            self.action_dim = flat_size(self.action_shape)
            self.action_scale, self.action_bias = box_scale_bias(self.action_space, self.device)
            default_target = -float(self.action_dim)
        else:
            self.action_shape = ()
            self.action_dim = int(self.action_space.n)  # type: ignore[attr-defined]
            # act() returns indices (env_actions shifts them); the replay buffer holds env
            # actions, which the update shifts back.
            self.action_start = int(self.action_space.start)  # type: ignore[attr-defined]
            default_target = self.config.target_entropy_scale * math.log(self.action_dim)
        self.target_entropy = (
            self.config.target_entropy if self.config.target_entropy is not None else default_target
        )

    def _build(self) -> None:
        cfg = self.config
        self.obs_normalizer = make_obs_normalizer(
            self.obs_layout, self.config.normalize_obs, self.name, self.device
        )
        layout = self.obs_layout
        self.encoded = not self.continuous and (
            layout.kind == "image" or (cfg.cnn == "minatar" and is_binary_grid_space(layout.space))
        )
        """Observations go through CNNs (images, or grids with ``cnn: minatar``) rather than
        being flattened into the MLPs."""
        out = 2 * self.action_dim if self.continuous else self.action_dim
        critic_out = 1 if self.continuous else self.action_dim
        self.actor: nn.Module
        self.critic: nn.Module
        self.critic_target: nn.Module
        if self.encoded:
            actor_encoder, critic_encoder = (
                make_encoder(layout, cfg.cnn),
                make_encoder(layout, cfg.cnn),
            )
            width = actor_encoder.out_features
            self.actor = nn.Sequential(
                actor_encoder,
                mlp(width, cfg.hidden_sizes, out, cfg.activation, ortho_init=False),
            ).to(self.device)
            self.critic, self.critic_target = with_target(
                nn.Sequential(
                    critic_encoder,
                    twin_critic(width, cfg.hidden_sizes, cfg.activation, critic_out),
                ).to(self.device)
            )
        else:
            obs_dim = flat_size(self.obs_shape)
            self.actor = mlp(obs_dim, cfg.hidden_sizes, out, cfg.activation, ortho_init=False).to(
                self.device
            )
            critic_in = obs_dim + self.action_dim if self.continuous else obs_dim
            self.critic, self.critic_target = with_target(
                twin_critic(critic_in, cfg.hidden_sizes, cfg.activation, critic_out).to(self.device)
            )
        self.ent_coef = EntropyCoefficient(
            cfg.ent_coef if cfg.ent_coef is not None else cfg.ent_coef_init,
            trainable=cfg.ent_coef is None,
        ).to(self.device)
        self._actor_params: list[torch.Tensor] = list(self.actor.parameters())
        self._critic_params: list[torch.Tensor] = list(self.critic.parameters())
        self._target_params: list[torch.Tensor] = list(self.critic_target.parameters())
        self._ent_coef_params: list[torch.Tensor] = [self.ent_coef.log_value]
        lr, eps = cfg.learning_rate, cfg.adam_eps
        self.actor_optimizer = adam(self._actor_params, lr, eps, self.device)
        self.critic_optimizer = adam(self._critic_params, lr, eps, self.device)
        self.ent_coef_optimizer = (
            adam(self._ent_coef_params, lr, eps, self.device) if cfg.ent_coef is None else None
        )

    def modules(self) -> dict[str, nn.Module]:
        return {
            "actor": self.actor,
            "critic": self.critic,
            "critic_target": self.critic_target,
            "ent_coef": self.ent_coef,
            **obs_normalizer_modules(self.obs_normalizer),
        }

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        found: dict[str, torch.optim.Optimizer] = {
            "actor_optimizer": self.actor_optimizer,
            "critic_optimizer": self.critic_optimizer,
        }
        if self.ent_coef_optimizer is not None:
            found["ent_coef_optimizer"] = self.ent_coef_optimizer
        return found

    # ----------------------------------------------------------------- acting
    def _squashed_sample(
        self, obs: torch.Tensor, deterministic: bool = False, noise: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Box: actions in [-1, 1] and their log-density under the tanh-squashed Gaussian
        (``noise``: the standard-normal draw, when acting with colored noise)."""
        mean, log_std = self.actor(obs).chunk(2, dim=-1)
        log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        if deterministic:
            return torch.tanh(mean), torch.zeros(mean.shape[0], device=mean.device)
        return D.squashed_gaussian_sample(mean, log_std, self.generator, noise)

    @torch.inference_mode()
    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep:
        flat = self._network_input(obs)
        if not self.continuous:
            self.refuse_unsupported_inputs(None, state)
            logits = apply_mask(self.actor(flat), action_mask)
            if deterministic:
                return PolicyStep(actions=logits.argmax(-1))
            index, log_probs = D.categorical_sample(logits, self.generator)
            return PolicyStep(actions=index, log_probs=log_probs)
        self.refuse_unsupported_inputs(action_mask, state)
        noise = next_noise(self.action_noise_process, deterministic, flat.shape[0], self.device)
        squashed, log_prob = self._squashed_sample(flat, deterministic, noise)
        actions = to_box(squashed, self.action_scale, self.action_bias, self.action_shape)
        return PolicyStep(actions=actions, log_probs=log_prob)

    def _network_input(self, obs: torch.Tensor) -> torch.Tensor:
        """A preprocessed observation batch as the networks take it: as it is for the CNNs,
        else flattened."""
        return obs if self.encoded else flatten_obs(obs, len(self.obs_shape))

    # ------------------------------------------------------------ imitation
    def imitation_loss(
        self, obs: torch.Tensor, actions: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        out = self.actor(self._network_input(obs))
        if not self.continuous:
            log_pi = torch.log_softmax(out, dim=-1)
            return -log_pi.gather(1, actions.long().reshape(-1, 1)).mean()
        mean, log_std = out.chunk(2, dim=-1)
        log_std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        noise = torch.randn(mean.shape, generator=generator).to(mean.device)
        sampled = torch.tanh(mean + log_std.exp() * noise)
        # In the squashed [-1, 1] space the actor acts in, as ML-Agents' actions are.
        return (sampled - to_unit(actions, self.action_scale, self.action_bias)).pow(2).mean()

    def imitation_parameters(self) -> list[nn.Parameter]:
        return list(self.actor.parameters())

    # --------------------------------------------------------------- training
    def replay_sampler(self) -> Sampler:
        """Uniform: SAC feeds back no priorities."""
        return UniformSampler(seed=stream_seed(self.seed, "replay"))

    def compile_update(self) -> None:
        """Compile the twin critics and their target (forward and backward); the actor, which
        acting shares, stays eager."""
        compile_module(self.critic)
        compile_module(self.critic_target)

    def capture_update(self) -> None:
        """Capture each gradient step on Box actions as a CUDA graph and replay it from then
        on (:class:`~rlfleet.nn.cuda_graph.CapturedSteps`): the first three steps run eagerly,
        the fourth is captured. A step reads its minibatch, and the standard-normal draws of
        its two policy samples, from tensors it keeps, which each step refills; the draws
        come from the algorithm's generator on the host, as an eager step draws them, so the
        captured step runs the eager step's kernels on the same numbers and trains the
        parameters bitwise as it does (the learning rate is constant). A minibatch of another
        shape (a ``batch_size`` passed to :meth:`update`) is stepped eagerly, as is every step
        while the actor or the critics have hooks (they would run once, at the capture).
        Loading a state drops the capture (the optimisers' state tensors are new) and the
        next steps capture again.

        The three optimiser steps skip themselves inside the graph when their loss or
        gradient norm is not finite, each also when an earlier one of the batch was skipped,
        as the eager step ends its batch there; after the replay one read of the three checks
        applies ``nan_policy`` to the first that failed. The target critics move after the
        replay, as in an eager step."""
        if not self.continuous:
            raise ConfigError(
                f"{self.name}: trainer.cuda_graphs captures the gradient step of Box actions; "
                f"expected a Box action space, got {self.action_space}"
            )
        self._capture_steps()

    def update(
        self,
        source: TransitionSource,
        *,
        batch_size: int | None = None,
        num_gradient_steps: int = 1,
    ) -> dict[str, float]:
        """``num_gradient_steps`` steps of entropy coefficient, critics and actor."""
        cfg = self.config
        batch_size = batch_size or cfg.batch_size
        # critic loss, actor loss, ent_coef loss, ent_coef
        totals = torch.zeros(4, device=self.device)
        captures = self._captures_for(self.actor, self.critic)
        steps = 0
        for _ in range(num_gradient_steps):
            sample: ReplayBatch[torch.Tensor] = source.sample(
                batch_size, gamma=cfg.gamma, n_step=cfg.n_step, progress=self.progress
            ).to(self.device)
            if not self.continuous:
                terms = self._discrete_step(sample)
            else:
                terms = self._box_step(self._box_batch(sample), captures)
            if terms is None:
                continue  # a skipped batch (nan_policy: skip_batch) ends its gradient step
            totals += terms
            steps += 1
            self.gradient_steps += 1
            if self.gradient_steps % cfg.target_update_interval == 0:
                F.polyak_update(self._target_params, self._critic_params, cfg.tau)
        means = (totals / max(steps, 1)).tolist()
        metrics = {
            "loss/critic": means[0],
            "loss/actor": means[1],
            "train/ent_coef": means[3],
        }
        if self.ent_coef_optimizer is not None:
            metrics["loss/ent_coef"] = means[2]
        return metrics

    def _ent_coef_step(
        self, log_prob: torch.Tensor, target_entropy: float | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Tune alpha so the policy's entropy approaches the target; returns (alpha, loss)
        (None: the batch was skipped)."""
        log_alpha = self.ent_coef.log_value
        alpha = log_alpha.detach().exp()
        if self.ent_coef_optimizer is None:
            return alpha, torch.zeros(1, device=self.device)
        loss = self.ent_coef.loss(log_prob, target_entropy)
        if optimizer_step(self, self.ent_coef_optimizer, loss, self._ent_coef_params) is None:
            return None
        return alpha, loss.detach().reshape(1)

    def _critic_step(
        self, q: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor
    ) -> torch.Tensor | None:
        """Half the twin critics' squared error against ``target``, as Stable-Baselines3's
        (None: the batch was skipped)."""
        loss = 0.5 * F.twin_q_loss(q, target)
        if optimizer_step(self, self.critic_optimizer, loss, self._critic_params) is None:
            return None
        return loss.detach()

    def _actor_step(self, loss: torch.Tensor) -> bool:
        params = self._actor_params
        return optimizer_step(self, self.actor_optimizer, loss, params, inputs=params) is not None

    def _box_batch(self, sample: ReplayBatch[torch.Tensor]) -> BoxBatch:
        """What a gradient step on Box actions reads of ``sample``, with the standard-normal
        draws of its policy samples at ``obs`` and then at ``next_obs``."""
        ndim = len(self.obs_shape)
        return box_batch(
            sample,
            lambda obs: flatten_obs(self.preprocess(obs), ndim),
            lambda actions: to_unit(actions, self.action_scale, self.action_bias),
            generator=self.generator,
            noise=True,
            next_noise=True,
        )

    def _soft_target(self, batch: BoxBatch, alpha: torch.Tensor) -> torch.Tensor:
        """The critics' target: reward plus the discounted soft value of the next state under
        the target critics."""
        with torch.no_grad():
            next_obs = batch.next_obs
            next_actions, next_log_prob = self._squashed_sample(next_obs, noise=batch.next_noise)
            next_q1, next_q2 = self.critic_target(torch.cat([next_obs, next_actions], 1))
            next_value = torch.min(next_q1, next_q2).squeeze(1) - alpha * next_log_prob
            target: torch.Tensor = batch.rewards + batch.discounts * next_value
            return target

    def _box_actor_loss(
        self,
        obs: torch.Tensor,
        policy_actions: torch.Tensor,
        log_prob: torch.Tensor,
        alpha: torch.Tensor,
    ) -> torch.Tensor:
        pi_q1, pi_q2 = self.critic(torch.cat([obs, policy_actions], 1))
        loss: torch.Tensor = (alpha * log_prob - torch.min(pi_q1, pi_q2).squeeze(1)).mean()
        return loss

    def _box_step(
        self, batch: BoxBatch, captures: CapturedSteps | None = None
    ) -> torch.Tensor | None:
        """One gradient step of entropy coefficient, critics and actor; returns [critic
        loss, actor loss, ent_coef loss, ent_coef] (None: the batch was skipped). With
        ``captures``, the captured step (:meth:`_captured_box_step`) where ``batch`` fits it,
        then ``nan_policy`` on the first of its optimiser steps whose check failed."""
        if captures is not None:
            outputs = captures("box", batch, self._captured_box_step)
            if outputs is not None:
                terms, *checks = outputs
                return terms if captured_steps_taken(self, checks) == len(checks) // 2 else None
        obs = batch.obs
        policy_actions, log_prob = self._squashed_sample(obs, noise=batch.noise)
        tuned = self._ent_coef_step(log_prob, self.target_entropy)
        if tuned is None:
            return None
        alpha, alpha_loss = tuned
        target = self._soft_target(batch, alpha)
        critic_loss = self._critic_step(self.critic(torch.cat([obs, batch.actions], 1)), target)
        if critic_loss is None:
            return None
        actor_loss = self._box_actor_loss(obs, policy_actions, log_prob, alpha)
        if not self._actor_step(actor_loss):
            return None
        return torch.cat(
            [critic_loss.reshape(1), actor_loss.detach().reshape(1), alpha_loss, alpha]
        )

    def _captured_box_step(self, batch: BoxBatch) -> tuple[torch.Tensor, ...]:
        """:meth:`_box_step` with no value read on the host, as a capture records it: each
        optimiser step checks its loss and gradient norm in a tensor and skips itself on a
        failure there or in an earlier step of the batch. Returns the terms
        :meth:`_box_step` returns, then, for each optimiser step (entropy coefficient when it
        is tuned, critics, actor), its loss and its gradient norm."""
        obs = batch.obs
        policy_actions, log_prob = self._squashed_sample(obs, noise=batch.noise)
        alpha = self.ent_coef.log_value.detach().exp()
        checks: list[torch.Tensor] = []
        skip = None
        alpha_loss = torch.zeros(1, device=self.device)
        if self.ent_coef_optimizer is not None:
            loss = self.ent_coef.loss(log_prob, self.target_entropy)
            skip = optimizer_step_captured(
                self.ent_coef_optimizer, loss, self._ent_coef_params, checks
            )
            alpha_loss = loss.detach().reshape(1)
        target = self._soft_target(batch, alpha)
        critic_loss = 0.5 * F.twin_q_loss(self.critic(torch.cat([obs, batch.actions], 1)), target)
        skip = optimizer_step_captured(
            self.critic_optimizer, critic_loss, self._critic_params, checks, skip=skip
        )
        actor_loss = self._box_actor_loss(obs, policy_actions, log_prob, alpha)
        params = self._actor_params
        optimizer_step_captured(
            self.actor_optimizer, actor_loss, params, checks, skip=skip, inputs=params
        )
        terms = torch.cat(
            [critic_loss.detach().reshape(1), actor_loss.detach().reshape(1), alpha_loss, alpha]
        )
        return terms, *checks

    def _discrete_step(self, sample: ReplayBatch[torch.Tensor]) -> torch.Tensor | None:
        """:meth:`_box_step` for Discrete actions."""
        obs = self._network_input(self.preprocess(sample.obs))
        next_obs = self._network_input(self.preprocess(sample.next_obs))

        log_pi = torch.log_softmax(apply_mask(self.actor(obs), sample.action_masks), dim=-1)
        pi = log_pi.exp()
        # Expected log-probability (minus the entropy) plays the role of a sample's log-prob.
        tuned = self._ent_coef_step(
            (pi * log_pi).sum(-1), self._discrete_target_entropy(sample.action_masks)
        )
        if tuned is None:
            return None
        alpha, alpha_loss = tuned
        target = self._discrete_target(sample, next_obs, alpha)
        q1_all, q2_all = self.critic(obs)
        taken = (sample.actions - self.action_start).unsqueeze(1)
        critic_loss = self._critic_step((q1_all.gather(1, taken), q2_all.gather(1, taken)), target)
        if critic_loss is None:
            return None
        min_q = torch.min(q1_all, q2_all).detach()
        actor_loss = (pi * (alpha * log_pi - min_q)).sum(-1).mean()
        if not self._actor_step(actor_loss):
            return None
        return torch.cat(
            [critic_loss.reshape(1), actor_loss.detach().reshape(1), alpha_loss, alpha]
        )

    @torch.no_grad()
    def _discrete_target(
        self, sample: ReplayBatch[torch.Tensor], next_obs: torch.Tensor, alpha: torch.Tensor
    ) -> torch.Tensor:
        """``r + discount * E_{a' ~ pi(.|s')}[min Q_target(s', a') - alpha log pi(a'|s')]``,
        exact over the legal next actions (illegal ones have probability exactly 0)."""
        next_logits = apply_mask(self.actor(next_obs), sample.next_action_masks)
        next_log_pi = torch.log_softmax(next_logits, dim=-1)
        next_q1, next_q2 = self.critic_target(next_obs)
        soft_q: torch.Tensor = torch.min(next_q1, next_q2) - alpha * next_log_pi
        return sample.rewards + sample.discounts * (next_log_pi.exp() * soft_q).sum(-1)

    def _discrete_target_entropy(self, mask: torch.Tensor | None) -> float | torch.Tensor:
        """The target entropy; per state with masks, unless the config fixes it."""
        if mask is None or self.config.target_entropy is not None:
            return self.target_entropy
        legal = mask.sum(-1).clamp(min=1).to(torch.float32)
        return self.config.target_entropy_scale * torch.log(legal)
