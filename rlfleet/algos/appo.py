"""APPO: asynchronous PPO, the clipped surrogate of PPO on V-trace targets.

The actor-learner layout of IMPALA (Espeholt et al. 2018, arXiv:1802.01561) with the update
of PPO (Schulman et al. 2017, arXiv:1707.06347), as popularised by RLlib's APPO and Sample
Factory. At the start of an update the learner evaluates the batch once with its current
weights: V-trace (:func:`rlfleet.functional.vtrace`) turns the lagging actors' data into
value targets ``v_s`` and importance-weighted advantages. Then, as in PPO, ``num_epochs``
passes over minibatches maximise the clipped surrogate, whose ratio is taken against the
learner's policy at the start of the update: V-trace corrects for the actors' lag, the
clipping keeps the several gradient steps on one batch inside a trust region.

Deviations from RLlib's APPO: no target network and no KL penalty (the ratio's reference is
the policy at the start of each update, not a periodically copied target); losses are means
weighted by the ``valid`` mask (reset steps carry no gradient). No KL-based early stop of the
epochs either: every learner of a multi-learner group must take the same number of gradient
steps, or their gradient averaging would wait forever.

Observation normalisation, the CNN encoders and the recurrent policy work as in
:mod:`rlfleet.algos.impala`. A recurrent policy's minibatches are whole sequences of
``sequence_length`` steps of one env (``num_steps`` when unset), each replayed from the state
the actor stored at its first step, as PPO's are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import torch
from gymnasium import spaces
from torch import nn

from rlfleet import functional as F
from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import ActorLearnerAlgorithm
from rlfleet.algos.policy_gradient import (
    LearnerBatch,
    LearnerObsStats,
    check_sequence_length,
    vtrace_targets,
)
from rlfleet.algos.registry import register
from rlfleet.config.fields import (
    LayerWidth,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    UnitFloat,
)
from rlfleet.data.minibatches import rollout_minibatches
from rlfleet.data.rollout import RolloutStorage
from rlfleet.nn.action_head import ActionHead
from rlfleet.nn.actor_critic import ActorCritic
from rlfleet.nn.cnn import CnnKind
from rlfleet.nn.compile import compile_function
from rlfleet.nn.mlp import Activation
from rlfleet.nn.normalize import make_obs_normalizer
from rlfleet.nn.optim import adam, optimizer_step
from rlfleet.schedules import ScheduleKind, scheduled
from rlfleet.types import Minibatch, PolicyStep

LossTerms = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""loss, policy loss, value loss, entropy, clip fraction"""


@dataclass
class APPOConfig:
    """APPO hyperparameters (PPO's names for the PPO parts, IMPALA's for V-trace)."""

    learning_rate: PositiveFloat = 5e-4
    """Adam step size (the initial value when ``lr_schedule`` is linear)."""
    lr_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay to 0 over the training budget."""
    num_steps: PositiveInt = 32
    """Steps per env in one rollout fragment (the unroll length)."""
    batch_fragments: PositiveInt = 2
    """Fragments per learner update (per learner when there are several)."""
    num_epochs: PositiveInt = 4
    """Passes over the batch per update."""
    batch_size: PositiveInt = 256
    """Minibatch size (samples) of each gradient step."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    rho_bar: PositiveFloat = 1.0
    """Clip of the importance weight in the value targets and the advantages."""
    c_bar: PositiveFloat = 1.0
    """Clip of the importance weight that carries the trace."""
    vtrace_lambda: UnitFloat = 1.0
    """V-trace's lambda (the paper's remark 2): the trace is carried by ``lambda x c``, so
    below 1 the value targets and advantages lean more on the critic, as PPO's ``gae_lambda``
    does; 1 is plain V-trace."""
    clip_range: PositiveFloat = 0.2
    """Clipping of the probability ratio."""
    normalize_advantage: bool = True
    """Standardise advantages over the batch."""
    ent_coef: NonNegativeFloat = 0.0
    """Weight of the entropy bonus."""
    vf_coef: NonNegativeFloat = 0.5
    """Weight of the value loss."""
    max_grad_norm: PositiveFloat = 0.5
    """Global gradient-norm clip."""
    hidden_sizes: tuple[LayerWidth, ...] = (64, 64)
    """Hidden layer widths of the actor and of the critic."""
    activation: Activation = "tanh"
    """Hidden-layer activation."""
    normalize_obs: bool = False
    """Normalise vector observations with running statistics that the learner updates and
    ships to the actors with the weights (saved with the model)."""
    cnn: CnnKind = "nature"
    """Encoder of image observations: ``nature`` (Mnih et al. 2015), ``impala`` or
    ``minatar`` (Young and Tian 2019: for small grids such as MinAtar's)."""
    lstm_hidden_size: LayerWidth | None = None
    """Width of an LSTM between encoder and heads (unset: a feed-forward policy)."""
    sequence_length: PositiveInt | None = None
    """Steps per training sequence of a recurrent policy (unset: num_steps); divides
    num_steps."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions)."""
    action_noise_color: NonNegativeFloat = 0.0
    """Exponent ``beta`` of the exploration noise's power spectrum ``1/f**beta`` (Box
    actions): 0 draws the noise independently each step (white), 1 pink, 2 red. Each actor
    draws streams of its own, one per env (:mod:`rlfleet.nn.noise`)."""
    adam_eps: PositiveFloat = 1e-5
    """Adam epsilon."""


@register
class APPO(Algorithm[APPOConfig], ActorLearnerAlgorithm):
    """PPO-clipped actor-critic on V-trace targets, for Discrete and Box actions."""

    name = "appo"
    kind = "distributed"
    config_class = APPOConfig
    action_spaces = (spaces.Discrete, spaces.Box)
    supports_images = True

    def _setup(self) -> None:
        check_sequence_length(self.name, self.config)
        self.head = ActionHead(self.action_space)
        self._loss: Callable[..., LossTerms] = self._minibatch_loss
        self._sequence_loss: Callable[[Minibatch], LossTerms] = self._sequence_minibatch_loss
        self._reference: RolloutStorage | None = None

    def _build(self) -> None:
        cfg = self.config
        self.net = ActorCritic(
            self.obs_layout,
            self.head,
            cfg.hidden_sizes,
            cfg.activation,
            cnn=cfg.cnn,
            lstm_hidden_size=cfg.lstm_hidden_size,
            log_std_init=cfg.log_std_init,
        ).to(self.device)
        self.obs_stats = LearnerObsStats(
            make_obs_normalizer(self.obs_layout, cfg.normalize_obs, self.name, self.device)
        )
        self._params: list[torch.Tensor] = list(self.net.parameters())
        self.optimizer = adam(self._params, cfg.learning_rate, cfg.adam_eps, self.device)

    def modules(self) -> dict[str, nn.Module]:
        return {"net": self.net, **self.obs_stats.modules()}

    def initial_state(self, num_envs: int) -> torch.Tensor | None:
        return self.net.initial_state(num_envs, self.device)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    @torch.inference_mode()
    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep:
        recurrent = self.net.core is not None
        self.refuse_unsupported_inputs(action_mask, None if recurrent else state)
        return self.net.act(
            self.obs_stats.normalized(obs),
            self.generator,
            deterministic=deterministic,
            state=state,
            noise=self.action_noise_process,
        )

    def compile_update(self) -> None:
        self._loss = compile_function(self._minibatch_loss)
        self._sequence_loss = compile_function(self._sequence_minibatch_loss)

    def _minibatch_loss(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        value_targets: torch.Tensor,
        weights: torch.Tensor,
    ) -> LossTerms:
        log_probs, entropy, values = self.net.evaluate_actions(obs, actions)
        weights = weights / weights.sum().clamp(min=1.0)
        return self._surrogate(
            log_probs, entropy, values, old_log_probs, advantages, value_targets, weights
        )

    def _sequence_minibatch_loss(self, mb: Minibatch) -> LossTerms:
        """The loss of a minibatch of recurrent sequences (``returns``: the V-trace targets;
        ``weights`` already sum to 1)."""
        log_probs, entropy, values = self.net.evaluate(mb)
        return self._surrogate(
            log_probs, entropy, values, mb.old_log_probs, mb.advantages, mb.returns, mb.weights
        )

    def _surrogate(
        self,
        log_probs: torch.Tensor,
        entropy: torch.Tensor,
        values: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        value_targets: torch.Tensor,
        weights: torch.Tensor,
    ) -> LossTerms:
        cfg = self.config
        ratio = (log_probs - old_log_probs).exp()
        clip = cfg.clip_range
        surrogate = torch.min(advantages * ratio, advantages * ratio.clamp(1.0 - clip, 1.0 + clip))
        policy_loss = -torch.dot(surrogate, weights)
        value_loss = torch.dot((values - value_targets).pow(2), weights)
        entropy_mean = torch.dot(entropy, weights)
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy_mean
        clip_fraction = torch.dot(((ratio.detach() - 1.0).abs() > clip).float(), weights)
        return loss, policy_loss, value_loss, entropy_mean, clip_fraction

    def update(self, batch: RolloutStorage) -> dict[str, float]:
        """V-trace targets once, then ``num_epochs`` passes of clipped minibatch steps."""
        cfg = self.config
        self.obs_stats.fold(batch)
        fragments = LearnerBatch.of(batch, self.device, self.obs_stats.normalizer)
        with torch.no_grad():
            log_probs, _, values, value_targets, advantages = vtrace_targets(
                self.net, fragments, cfg
            )
        n = batch.num_steps * batch.num_envs
        obs = fragments.obs.reshape(n, *fragments.obs.shape[2:])
        actions = fragments.actions.reshape(n, *fragments.actions.shape[2:])
        log_probs, advantages = log_probs.reshape(n), advantages.reshape(n)
        value_targets, weights = value_targets.reshape(n), fragments.valid.reshape(n)
        if cfg.normalize_advantage:
            advantages = F.standardize(advantages, weights)

        lr = scheduled(cfg.learning_rate, cfg.lr_schedule, self.progress) * self.lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch_size = min(cfg.batch_size, n)
        if fragments.states is None:
            tensors = (obs, actions, log_probs, advantages, value_targets, weights)

            def epoch() -> Iterator[LossTerms]:
                order = torch.randperm(n, generator=self.generator) if batch_size < n else None
                for start in range(0, n, batch_size):
                    idx = None if order is None else order[start : start + batch_size]
                    yield self._loss(*(t if idx is None else t[idx] for t in tensors))

        else:
            shape = (batch.num_steps, batch.num_envs)
            sequences = rollout_minibatches(
                self._reference_batch(batch, fragments.obs, log_probs.view(shape), values),
                advantages.view(shape).cpu(),
                value_targets.view(shape).cpu(),
                batch_size,
                self.generator,
                cfg.sequence_length,
            )

            def epoch() -> Iterator[LossTerms]:
                for mb in sequences.epoch():
                    yield self._sequence_loss(_on_device(mb, self.device))

        totals = torch.zeros(4, device=self.device)  # policy, value, entropy, clip fraction
        steps = 0
        for _ in range(cfg.num_epochs):
            for loss, *terms in epoch():
                norm = optimizer_step(
                    self, self.optimizer, loss, self._params, max_grad_norm=cfg.max_grad_norm
                )
                if norm is None:  # a skipped batch (nan_policy: skip_batch)
                    continue
                totals += torch.stack(terms).detach()
                steps += 1
        self.gradient_steps += steps
        means = (totals / max(steps, 1)).tolist()
        return {
            "loss/policy": means[0],
            "loss/value": means[1],
            "loss/entropy": means[2],
            "train/clip_fraction": means[3],
            "train/explained_variance": F.explained_variance(values.reshape(n), value_targets),
            "train/learning_rate": lr,
        }

    def _reference_batch(
        self,
        batch: RolloutStorage,
        obs: torch.Tensor,
        log_probs: torch.Tensor,
        values: torch.Tensor,
    ) -> RolloutStorage:
        """The batch as the recurrent minibatches replay it: normalised observations, and the
        learner's log-probabilities (the ratio's reference) and values at the update's start."""
        ref = self._reference
        if ref is None or ref.obs.shape != batch.obs.shape:
            assert batch.states is not None
            ref = self._reference = RolloutStorage(
                batch.num_steps,
                batch.num_envs,
                tuple(batch.obs.shape[2:]),
                tuple(batch.actions.shape[2:]),
                obs_dtype=batch.obs.dtype,
                action_dtype=batch.actions.dtype,
                state_shape=tuple(batch.states.shape[2:]),
            )
        assert ref.states is not None
        assert batch.states is not None
        for mine, source in (
            (ref.obs, obs),
            (ref.actions, batch.actions),
            (ref.log_probs, log_probs),
            (ref.values, values),
            (ref.valid, batch.valid),
            (ref.states, batch.states),
        ):
            mine.copy_(source)
        return ref


def _on_device(mb: Minibatch, device: torch.device) -> Minibatch:
    """``mb`` with every tensor on ``device``."""
    if device.type == "cpu":
        return mb
    moved: dict[str, Any] = {
        f.name: None if (v := getattr(mb, f.name)) is None else v.to(device) for f in fields(mb)
    }
    return Minibatch(**moved)
