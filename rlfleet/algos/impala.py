"""IMPALA: importance-weighted actor-learner training with V-trace (Espeholt et al. 2018,
arXiv:1802.01561).

Rollout actors run copies of the policy that lag behind the learner's; every learner update
re-evaluates the collected fragments with the current weights and corrects for the lag with
V-trace (:func:`rlfleet.functional.vtrace`): value targets ``v_s`` for the critic and
clipped importance-weighted advantages for the policy gradient, one gradient step per batch
of fragments (the paper's). With ``num_epochs`` above 1 the learner takes that many steps on
each batch, every one re-evaluating V-trace on the whole batch with the weights as they are,
so each step's importance weights correct for the lag its own earlier steps added (RLlib's
IMPALA can pass over a batch several times too).
:class:`rlfleet.distributed.DistributedTrainer` drives it.

Deviations from the paper:

- Adam (fused) instead of RMSProp, and losses are means over the batch rather than sums,
  so the learning rate does not depend on the batch size;
- losses are weighted by the ``valid`` mask, so the reset steps that next-step autoreset
  inserts after an episode end carry no gradient;
- separate actor and critic MLPs (no shared torso) for vector observations; image
  observations go through one CNN (``cnn``) shared by both, as in PPO;
- observation normalisation (``normalize_obs``) has statistics that only the learner
  updates, from each batch before it learns on it (see
  :class:`~rlfleet.algos.policy_gradient.LearnerObsStats`); the actors normalise with the
  copy that comes with the weights. The network evaluates the batch with the current
  statistics, so a fragment collected under older ones is one more source of the lag that
  V-trace corrects.

With ``lstm_hidden_size`` the policy is recurrent (an LSTM between encoder and heads, as
PPO's): the actor carries the state from fragment to fragment, stores the state of every
step, and the learner unrolls each fragment from the state at its first step (in sequences
of ``sequence_length`` steps, each from the stored state at its first step, when set).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from gymnasium import spaces
from torch import nn

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
from rlfleet.data.rollout import RolloutStorage
from rlfleet.nn.action_head import ActionHead
from rlfleet.nn.actor_critic import ActorCritic
from rlfleet.nn.cnn import CnnKind
from rlfleet.nn.compile import compile_function
from rlfleet.nn.mlp import Activation
from rlfleet.nn.normalize import make_obs_normalizer
from rlfleet.nn.optim import adam, optimizer_step
from rlfleet.schedules import ScheduleKind, scheduled
from rlfleet.types import PolicyStep

LossTerms = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""loss, policy loss, value loss, entropy, mean clipped importance weight"""


@dataclass
class IMPALAConfig:
    """IMPALA hyperparameters (names follow the paper and TorchBeast where they exist)."""

    learning_rate: PositiveFloat = 1e-3
    """Adam step size (the initial value when ``lr_schedule`` is linear)."""
    lr_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay to 0 over the training budget."""
    num_steps: PositiveInt = 32
    """Steps per env in one rollout fragment (the unroll length)."""
    batch_fragments: PositiveInt = 2
    """Fragments per learner update (per learner when there are several)."""
    num_epochs: PositiveInt = 1
    """Gradient steps per learner batch, each on the whole batch with V-trace re-evaluated by
    the current weights (1: the paper's single step)."""
    batch_size: None = None
    """None: every gradient step is on the whole learner batch, never minibatches."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    rho_bar: PositiveFloat = 1.0
    """Clip of the importance weight in the value targets and the policy gradient."""
    c_bar: PositiveFloat = 1.0
    """Clip of the importance weight that carries the trace (the paper's c-bar)."""
    vtrace_lambda: UnitFloat = 1.0
    """V-trace's lambda (the paper's remark 2): the trace is carried by ``lambda x c``, so
    below 1 the value targets and advantages lean more on the critic, as PPO's ``gae_lambda``
    does; 1 is plain V-trace."""
    ent_coef: NonNegativeFloat = 0.01
    """Weight of the entropy bonus."""
    vf_coef: NonNegativeFloat = 0.5
    """Weight of the value loss."""
    max_grad_norm: PositiveFloat = 40.0
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
    """Steps per learner unroll of a recurrent policy, each from the state the actor stored
    at its first step (unset: num_steps, the whole fragment); divides num_steps."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions)."""
    action_noise_color: NonNegativeFloat = 0.0
    """Exponent ``beta`` of the exploration noise's power spectrum ``1/f**beta`` (Box
    actions): 0 draws the noise independently each step (white), 1 pink, 2 red. Each actor
    draws streams of its own, one per env (:mod:`rlfleet.nn.noise`)."""
    adam_eps: PositiveFloat = 1e-5
    """Adam epsilon."""


@register
class IMPALA(Algorithm[IMPALAConfig], ActorLearnerAlgorithm):
    """V-trace actor-critic for Discrete and Box actions, trained from lagging actors."""

    name = "impala"
    kind = "distributed"
    config_class = IMPALAConfig
    action_spaces = (spaces.Discrete, spaces.Box)
    supports_images = True

    def _setup(self) -> None:
        check_sequence_length(self.name, self.config)
        self.head = ActionHead(self.action_space)
        self._loss: Callable[[LearnerBatch], LossTerms] = self._compute_loss

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
        self._loss = compile_function(self._compute_loss)

    def _compute_loss(self, batch: LearnerBatch) -> LossTerms:
        cfg = self.config
        log_probs, entropy, values, vs, advantages = vtrace_targets(self.net, batch, cfg)
        with torch.no_grad():
            rho = (log_probs.detach() - batch.behaviour_log_probs).exp().clamp(max=cfg.rho_bar)
        weights = batch.valid / batch.valid.sum().clamp(min=1.0)
        policy_loss = -(advantages * log_probs * weights).sum()
        value_loss = 0.5 * ((vs - values).pow(2) * weights).sum()
        entropy_mean = (entropy * weights).sum()
        loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy_mean
        return loss, policy_loss, value_loss, entropy_mean, (rho * weights).sum()

    def update(self, batch: RolloutStorage) -> dict[str, float]:
        """``num_epochs`` gradient steps on a ``[num_steps, envs]`` batch of fragments (see
        module doc); the metrics are the means over the steps taken."""
        cfg = self.config
        lr = scheduled(cfg.learning_rate, cfg.lr_schedule, self.progress) * self.lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.obs_stats.fold(batch)
        fragments = LearnerBatch.of(batch, self.device, self.obs_stats.normalizer)
        totals = torch.zeros(5, device=self.device)  # policy, value, entropy, rho, grad norm
        steps = 0
        for _ in range(cfg.num_epochs):
            loss, *terms = self._loss(fragments)
            grad_norm = optimizer_step(
                self, self.optimizer, loss, self._params, max_grad_norm=cfg.max_grad_norm
            )
            if grad_norm is None:  # a skipped step (nan_policy: skip_batch); the epochs go
                continue  # on, as every learner of a group must join each all-reduce
            totals += torch.stack([*terms, grad_norm]).detach()
            steps += 1
        if steps == 0:
            return {"train/learning_rate": lr}
        self.gradient_steps += steps
        means = (totals / steps).tolist()
        return {
            "loss/policy": means[0],
            "loss/value": means[1],
            "loss/entropy": means[2],
            "train/mean_rho": means[3],
            "train/grad_norm": means[4],
            "train/learning_rate": lr,
        }
