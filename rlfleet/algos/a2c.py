"""Advantage Actor-Critic (A2C), the synchronous variant of A3C (Mnih et al. 2016,
arXiv:1602.01783).

Short rollouts (``num_steps`` = 5 per env), one gradient step on the whole rollout,
RMSprop: the defaults are Stable-Baselines3's, which match OpenAI Baselines' A2C. The loss
is ``-A * log pi(a|s) + vf_coef * (R - V(s))^2 - ent_coef * H[pi(.|s)]`` with advantages
from GAE (``gae_lambda`` = 1 gives the paper's n-step returns).

Deviations from the paper:

- truncated episodes bootstrap from the value of their final observation, terminated ones
  do not (the paper treats every episode end as terminal);
- losses are means weighted by the ``valid`` mask, so the reset steps of next-step
  autoreset carry no gradient;
- ``batch_size`` and ``num_epochs`` can split the rollout into minibatches and repeat
  passes (Tianshou's A2C does too); unset, they give the paper's single step per rollout.

Spaces, masks, observation/reward normalisation and the LSTM option are those of
:mod:`rlfleet.algos.ppo` (shared through :class:`rlfleet.nn.actor_critic.ActorCritic` and
:mod:`rlfleet.algos.policy_gradient`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from rlfleet import functional as F
from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import OnPolicyAlgorithm
from rlfleet.algos.policy_gradient import (
    ACTION_SPACES,
    OBSERVATION_SPACES,
    check_sde,
    make_exploration,
    make_normalizers,
    normalizer_modules,
    rollout_advantages,
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
from rlfleet.nn.optim import optimizer_step
from rlfleet.schedules import ScheduleKind, scheduled
from rlfleet.types import PolicyStep


@dataclass
class A2CConfig:
    """A2C hyperparameters (defaults: Stable-Baselines3's)."""

    learning_rate: PositiveFloat = 7e-4
    """Optimiser step size (the initial value when ``lr_schedule`` is linear)."""
    lr_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay to 0 over the training budget."""
    num_steps: PositiveInt = 5
    """Steps collected per env per rollout."""
    batch_size: PositiveInt | None = None
    """Minibatch size (env steps); unset: the whole rollout in one gradient step."""
    num_epochs: PositiveInt = 1
    """Passes over the rollout per update."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    gae_lambda: UnitFloat = 1.0
    """GAE bias/variance trade-off (1: plain n-step returns, as in the paper)."""
    time_horizon: PositiveInt | None = None
    """Cut each env's steps into trajectory segments of this many steps, each bootstrapped
    from the value of the observation where it is cut, as ML-Agents' ``time_horizon`` does
    (unset: cut at episode ends and at the end of the rollout only)."""
    ent_coef: NonNegativeFloat = 0.0
    """Weight of the entropy bonus."""
    vf_coef: NonNegativeFloat = 0.5
    """Weight of the value loss."""
    max_grad_norm: PositiveFloat = 0.5
    """Global gradient-norm clip."""
    normalize_advantage: bool = False
    """Standardise advantages over the rollout."""
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """``rmsprop`` (the paper's, alpha 0.99) or ``adam``."""
    optimizer_eps: PositiveFloat = 1e-5
    """Epsilon of the optimiser's denominator."""
    normalize_obs: bool = False
    """Normalise vector observations with running statistics (saved with the model)."""
    normalize_reward: bool = False
    """Divide rewards by the running std of the discounted return (saved with the model)."""
    hidden_sizes: tuple[LayerWidth, ...] = (64, 64)
    """Hidden layer widths of the actor and of the critic (empty: linear heads)."""
    activation: Activation = "tanh"
    """Hidden-layer activation."""
    cnn: CnnKind = "nature"
    """Encoder of image observations: ``nature`` (Mnih et al. 2015), ``impala`` or
    ``minatar`` (Young and Tian 2019: for small grids such as MinAtar's)."""
    lstm_hidden_size: LayerWidth | None = None
    """Width of an LSTM between encoder and heads (unset: a feed-forward policy)."""
    ortho_init: bool = True
    """Initialise the actor's and critic's layers orthogonally (hidden gain sqrt(2), outputs
    0.01 and 1); false: PyTorch's default ``nn.Linear`` initialisation (Stable-Baselines3's
    ``ortho_init=False``). Image encoders keep their own initialisation."""
    log_std_init: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions)."""
    action_noise_color: NonNegativeFloat = 0.0
    """Exponent ``beta`` of the exploration noise's power spectrum ``1/f**beta`` (Box
    actions): 0 draws the noise independently each step (white), 1 pink, 2 red. Colored
    noise keeps its sign for longer and carries the agent further (:mod:`rlfleet.nn.noise`)."""
    use_sde: bool = False
    """Explore with generalized state-dependent noise (gSDE, Box actions,
    :mod:`rlfleet.nn.sde`): a learned ``[features, action dims]`` log std, noise that is a
    function of the state, held for ``sde_sample_freq`` steps; ``log_std_init`` starts it."""
    sde_sample_freq: int = -1
    """Steps between draws of gSDE's exploration matrices (-1: once per rollout)."""


@register
class A2C(Algorithm[A2CConfig], OnPolicyAlgorithm):
    """Synchronous advantage actor-critic for every action space PPO handles."""

    name = "a2c"
    supports_masks = True
    supports_images = True
    supports_custom_encoder = True
    kind = "on_policy"
    config_class = A2CConfig
    action_spaces = ACTION_SPACES
    observation_spaces = OBSERVATION_SPACES

    def _setup(self) -> None:
        check_sde(self.config, self.name, self.action_space)
        self.head = ActionHead(self.action_space)

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
            encoder=self.encoder_factory,
            sde=cfg.use_sde,
            ortho_init=cfg.ortho_init,
        ).to(self.device)
        self.exploration = make_exploration(
            cfg, self.net.latent_dim, self.head.num_outputs, self.seed
        )
        self.obs_normalizer, self.reward_scaler = make_normalizers(
            self.obs_layout, cfg, self.name, self.device
        )
        self.optimizer: torch.optim.Optimizer
        if cfg.optimizer == "adam":
            self.optimizer = torch.optim.Adam(
                self.net.parameters(), lr=cfg.learning_rate, eps=cfg.optimizer_eps
            )
        else:
            self.optimizer = torch.optim.RMSprop(
                self.net.parameters(), lr=cfg.learning_rate, alpha=0.99, eps=cfg.optimizer_eps
            )

    def modules(self) -> dict[str, nn.Module]:
        return {"net": self.net, **normalizer_modules(self.obs_normalizer, self.reward_scaler)}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    # ----------------------------------------------------------------- acting
    def initial_state(self, num_envs: int) -> torch.Tensor | None:
        return self.net.initial_state(num_envs, self.device)

    @torch.inference_mode()
    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep:
        return self.net.act(
            obs,
            self.generator,
            deterministic=deterministic,
            mask=action_mask,
            state=state,
            noise=self.action_noise_process,
            exploration=self.exploration,
        )

    # --------------------------------------------------------------- training
    def compile_update(self) -> None:
        """Compile the network's evaluation of a minibatch (forward, log-probabilities,
        entropies, values and their backward); the loss arithmetic stays eager."""
        self.net.evaluate = compile_function(self.net.evaluate)  # type: ignore[method-assign]

    def update(
        self,
        batch: RolloutStorage,
        *,
        batch_size: int | None = None,
        num_repetitions: int | None = None,
    ) -> dict[str, float]:
        """Advantages by GAE, then one gradient step per minibatch (by default one in all)."""
        cfg = self.config
        rollout_size = batch.num_steps * batch.num_envs
        batch_size = batch_size or cfg.batch_size or rollout_size
        advantages, returns = rollout_advantages(batch, self.reward_scaler, cfg)
        lr = scheduled(cfg.learning_rate, cfg.lr_schedule, self.progress) * self.lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        minibatches = rollout_minibatches(
            batch, advantages, returns, batch_size, self.generator, device=self.device
        )
        stats = torch.zeros(3, device=self.device)
        steps = 0
        for _ in range(num_repetitions or cfg.num_epochs):
            stats.zero_()
            count = 0
            for mb in minibatches.epoch():
                log_probs, entropy, values = self.net.evaluate(mb)
                policy_loss = -torch.dot(mb.advantages * log_probs, mb.weights)
                value_loss = torch.dot((mb.returns - values).pow(2), mb.weights)
                entropy_mean = torch.dot(entropy, mb.weights)
                loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy_mean
                norm = optimizer_step(
                    self, self.optimizer, loss, params, max_grad_norm=cfg.max_grad_norm
                )
                if norm is None:  # a skipped batch (nan_policy: skip_batch)
                    continue
                stats += torch.stack([policy_loss, value_loss, entropy_mean]).detach()
                count += 1
            stats /= max(count, 1)
            steps += count
        self.gradient_steps += steps
        policy, value, entropy_value = stats.tolist()
        return {
            "loss/policy": policy,
            "loss/value": value,
            "loss/entropy": entropy_value,
            "train/explained_variance": F.explained_variance(batch.values, returns),
            "train/learning_rate": lr,
            "train/gradient_steps_per_update": float(steps),
        }
