"""Trust Region Policy Optimization (Schulman et al. 2015, arXiv:1502.05477).

Each update takes one natural-gradient step on the policy under a KL constraint and fits
the value function separately:

1. advantages by GAE (Schulman et al. 2016), standardised;
2. the gradient ``g`` of the surrogate ``E[pi(a|s) / pi_old(a|s) * A]``;
3. the search direction ``x ~ F^-1 g`` by conjugate gradient, where ``F v`` is the
   Fisher-vector product computed as the Hessian-vector product of the mean
   ``KL(pi_old || pi)`` (double backward, with ``cg_damping * v`` added);
4. the largest step along ``x`` with quadratic-model KL ``target_kl``:
   ``sqrt(2 * target_kl / x^T F x) * x``, shrunk by ``line_search_shrinking_factor``
   until the exact KL is within ``target_kl`` and the surrogate improves
   (``line_search_max_iter`` tries; no step is taken if none qualifies);
5. ``num_epochs`` passes of Adam over minibatches of the value loss.

Names and defaults follow sb3-contrib's TRPO. Actor and critic are separate networks,
each with its own encoder, so fitting the value function never moves the policy outside
its trust region. Losses are means weighted by the ``valid`` mask (reset steps of
next-step autoreset carry no weight); truncated episodes bootstrap from the value of their
final observation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
from rlfleet.nn.cnn import CnnKind
from rlfleet.nn.encoders import EncoderFactory, make_encoder
from rlfleet.nn.mlp import Activation, mlp
from rlfleet.nn.noise import next_noise
from rlfleet.nn.obs import ObsLayout
from rlfleet.nn.optim import finite_or_skip, optimizer_step
from rlfleet.nn.sde import sde_log_std
from rlfleet.schedules import ScheduleKind, scheduled
from rlfleet.types import PolicyStep


@dataclass
class TRPOConfig:
    """TRPO hyperparameters (names and defaults follow sb3-contrib)."""

    learning_rate: PositiveFloat = 1e-3
    """Adam step size of the value function (initial value when ``lr_schedule`` is linear)."""
    lr_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay to 0 over the training budget."""
    num_steps: PositiveInt = 2048
    """Steps collected per env per rollout."""
    batch_size: PositiveInt = 128
    """Minibatch size of the value-function fit."""
    num_epochs: PositiveInt = 10
    """Passes of the value-function fit over the rollout per update."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    gae_lambda: UnitFloat = 0.95
    """GAE bias/variance trade-off."""
    time_horizon: PositiveInt | None = None
    """Cut each env's steps into trajectory segments of this many steps, each bootstrapped
    from the value of the observation where it is cut, as ML-Agents' ``time_horizon`` does
    (unset: cut at episode ends and at the end of the rollout only)."""
    target_kl: PositiveFloat = 0.01
    """Trust-region size: the largest mean KL(old || new) of one policy step (the initial
    value when ``target_kl_schedule`` is linear)."""
    target_kl_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay of the trust region to 0 over the training budget:
    ever smaller policy steps, so that the policy settles as the budget ends."""
    cg_max_steps: PositiveInt = 15
    """Conjugate-gradient iterations for the search direction."""
    cg_damping: PositiveFloat = 0.1
    """Added to the Fisher-vector product (times the vector) for a stable solve."""
    line_search_shrinking_factor: UnitFloat = 0.8
    """Step-size multiplier between line-search tries."""
    line_search_max_iter: PositiveInt = 10
    """Line-search tries before the step is abandoned."""
    normalize_advantage: bool = True
    """Standardise advantages over the rollout."""
    normalize_obs: bool = False
    """Normalise vector observations with running statistics (saved with the model)."""
    normalize_reward: bool = False
    """Divide rewards by the running std of the discounted return (saved with the model)."""
    hidden_sizes: tuple[LayerWidth, ...] = (64, 64)
    """Hidden layer widths of the policy and of the value network."""
    activation: Activation = "tanh"
    """Hidden-layer activation."""
    cnn: CnnKind = "nature"
    """Encoder of image observations: ``nature`` (Mnih et al. 2015), ``impala`` or
    ``minatar`` (Young and Tian 2019: for small grids such as MinAtar's)."""
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


class _Policy(nn.Module):
    def __init__(
        self,
        layout: ObsLayout,
        head: ActionHead,
        hidden_sizes: Sequence[int],
        activation: Activation,
        cnn: CnnKind,
        log_std_init: float,
        encoder: EncoderFactory | None,
        sde: bool = False,
    ) -> None:
        super().__init__()
        self.encoder = make_encoder(layout, cnn, encoder)
        self.mlp = mlp(
            self.encoder.out_features, hidden_sizes, head.num_outputs, activation, output_gain=0.01
        )
        self.sde = sde and head.kind == "gaussian"
        """The Gaussian policy's noise depends on the state (gSDE, :mod:`rlfleet.nn.sde`)."""
        self.latent_dim = hidden_sizes[-1] if hidden_sizes else self.encoder.out_features
        """Width of the last hidden features (what gSDE's noise reads)."""
        # The hidden layers and the output layer in a plain tuple (not registered again as
        # submodules): gSDE reads the features between them, without slicing the Sequential
        # (a new module) on every step.
        self._split = (tuple(self.mlp)[:-1], self.mlp[-1])
        std_shape = (self.latent_dim, head.num_outputs) if self.sde else (head.num_outputs,)
        self.log_std = (
            nn.Parameter(torch.full(std_shape, log_std_init)) if head.kind == "gaussian" else None
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mlp(self.encoder(obs))
        return out

    def distribution(
        self, obs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Policy outputs, the Gaussian's log std (per row with gSDE; None for other heads)
        and, with gSDE, the last hidden features."""
        features = self.encoder(obs)
        if not self.sde:
            out: torch.Tensor = self.mlp(features)
            return out, self.log_std, None
        assert self.log_std is not None
        hidden, output = self._split
        latent = features
        for layer in hidden:
            latent = layer(latent)
        out = output(latent)
        return out, sde_log_std(latent, self.log_std), latent


class _Value(nn.Module):
    def __init__(
        self,
        layout: ObsLayout,
        hidden_sizes: Sequence[int],
        activation: Activation,
        cnn: CnnKind,
        encoder: EncoderFactory | None,
    ) -> None:
        super().__init__()
        self.encoder = make_encoder(layout, cnn, encoder)
        self.mlp = mlp(self.encoder.out_features, hidden_sizes, 1, activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        values: torch.Tensor = self.mlp(self.encoder(obs))
        return values.squeeze(-1)


@register
class TRPO(Algorithm[TRPOConfig], OnPolicyAlgorithm):
    """Natural-gradient policy steps in a KL trust region, for every action space."""

    name = "trpo"
    supports_masks = True
    supports_images = True
    supports_custom_encoder = True
    kind = "on_policy"
    config_class = TRPOConfig
    action_spaces = ACTION_SPACES
    observation_spaces = OBSERVATION_SPACES

    def _setup(self) -> None:
        check_sde(self.config, self.name, self.action_space)
        self.head = ActionHead(self.action_space)

    def _build(self) -> None:
        cfg = self.config
        self.actor = _Policy(
            self.obs_layout,
            self.head,
            cfg.hidden_sizes,
            cfg.activation,
            cfg.cnn,
            cfg.log_std_init,
            self.encoder_factory,
            sde=cfg.use_sde,
        ).to(self.device)
        self.exploration = make_exploration(
            cfg, self.actor.latent_dim, self.head.num_outputs, self.seed
        )
        self.critic = _Value(
            self.obs_layout, cfg.hidden_sizes, cfg.activation, cfg.cnn, self.encoder_factory
        ).to(self.device)
        self.obs_normalizer, self.reward_scaler = make_normalizers(
            self.obs_layout, cfg, self.name, self.device
        )
        self._critic_params: list[torch.Tensor] = list(self.critic.parameters())
        self.critic_optimizer = torch.optim.Adam(self._critic_params, lr=cfg.learning_rate)

    def modules(self) -> dict[str, nn.Module]:
        return {
            "actor": self.actor,
            "critic": self.critic,
            **normalizer_modules(self.obs_normalizer, self.reward_scaler),
        }

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"critic_optimizer": self.critic_optimizer}

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
        out, log_std, latent = self.actor.distribution(obs)
        if deterministic:
            actions, log_probs = self.head.greedy(out, mask=action_mask, log_std=log_std)
        elif self.exploration is not None and latent is not None:
            assert self.actor.log_std is not None
            assert log_std is not None
            shift = self.exploration.perturbation(latent, self.actor.log_std)
            actions, log_probs = self.head.shifted(out, shift, log_std)
        else:
            noise = next_noise(self.action_noise_process, False, out.shape[0], self.device)
            actions, log_probs = self.head.sample(
                out, self.generator, mask=action_mask, log_std=log_std, noise=noise
            )
        return PolicyStep(actions=actions, log_probs=log_probs, values=self.critic(obs))

    # --------------------------------------------------------------- training
    def update(
        self,
        batch: RolloutStorage,
        *,
        batch_size: int | None = None,
        num_repetitions: int | None = None,
    ) -> dict[str, float]:
        """One trust-region policy step, then ``num_epochs`` passes of the value fit."""
        advantages, returns = rollout_advantages(batch, self.reward_scaler, self.config)
        metrics = self._policy_step(batch, advantages)
        metrics.update(self._fit_value(batch, advantages, returns, batch_size, num_repetitions))
        metrics["train/explained_variance"] = F.explained_variance(batch.values, returns)
        return metrics

    def _policy_step(self, batch: RolloutStorage, advantages: torch.Tensor) -> dict[str, float]:
        cfg = self.config
        n = batch.num_steps * batch.num_envs
        # The whole rollout on the networks' device (no copy on the CPU).
        device = self.device
        obs = batch.obs.reshape(n, *batch.obs.shape[2:]).to(device)
        actions = batch.actions.reshape(n, *batch.actions.shape[2:]).to(device)
        masks = None if batch.masks is None else batch.masks.reshape(n, -1).to(device)
        valid = batch.valid.reshape(n).to(device)
        weights = valid / valid.sum().clamp(min=1.0)
        advantages = advantages.reshape(n).to(device)
        actor, head = self.actor, self.head
        params = [p for p in actor.parameters() if p.requires_grad]
        with torch.no_grad():
            old_out, old_log_std, _ = actor.distribution(obs)
            old_log_std = None if old_log_std is None else old_log_std.detach().clone()
            old_log_probs = head.log_prob_entropy(
                old_out, actions, mask=masks, log_std=old_log_std
            )[0]

        def surrogate_and_kl() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            out, log_std, _ = actor.distribution(obs)
            log_probs, entropy = head.log_prob_entropy(out, actions, mask=masks, log_std=log_std)
            surrogate = torch.dot((log_probs - old_log_probs).exp() * advantages, weights)
            kl = head.kl(old_out, out, mask=masks, old_log_std=old_log_std, new_log_std=log_std)
            return surrogate, torch.dot(kl, weights), torch.dot(entropy, weights)

        surrogate, kl, entropy = surrogate_and_kl()
        gradient = _flat(torch.autograd.grad(surrogate, params, retain_graph=True))
        kl_gradient = _flat(torch.autograd.grad(kl, params, create_graph=True))

        def fisher_product(vector: torch.Tensor) -> torch.Tensor:
            hessian_vector = torch.autograd.grad(kl_gradient.dot(vector), params, retain_graph=True)
            return _flat(hessian_vector) + cfg.cg_damping * vector

        direction = F.conjugate_gradient(fisher_product, gradient, cfg.cg_max_steps)
        # The step meets no optimiser: the shared check keeps a non-finite surrogate or
        # direction out of the weights (a skipped batch takes no step, as a failed search).
        finite = finite_or_skip(self, surrogate, torch.linalg.vector_norm(direction))
        curvature = float(direction.dot(fisher_product(direction))) if finite else 0.0
        target_kl = scheduled(cfg.target_kl, cfg.target_kl_schedule, self.progress)
        max_step = math.sqrt(2.0 * target_kl / curvature) if curvature > 0 else 0.0
        old_params = _flat([p.detach() for p in params])
        coefficient = max_step
        accepted = False
        tries = 0
        new_kl = torch.zeros((), device=self.device)
        with torch.no_grad():
            while tries < cfg.line_search_max_iter and max_step > 0:
                tries += 1
                _assign(params, old_params + coefficient * direction)
                new_surrogate, new_kl, _ = surrogate_and_kl()
                if float(new_kl) <= target_kl and float(new_surrogate) > float(surrogate):
                    accepted = True
                    break
                coefficient *= cfg.line_search_shrinking_factor
            if not accepted:
                _assign(params, old_params)
                new_kl = torch.zeros((), device=self.device)
        return {
            "loss/policy": -float(surrogate.detach()),
            "loss/entropy": float(entropy.detach()),
            "train/kl": float(new_kl),
            "train/target_kl": target_kl,
            "train/line_search_tries": float(tries),
            "train/step_accepted": float(accepted),
        }

    def _fit_value(
        self,
        batch: RolloutStorage,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        batch_size: int | None,
        num_repetitions: int | None,
    ) -> dict[str, float]:
        cfg = self.config
        lr = scheduled(cfg.learning_rate, cfg.lr_schedule, self.progress) * self.lr_scale
        for group in self.critic_optimizer.param_groups:
            group["lr"] = lr
        minibatches = rollout_minibatches(
            batch,
            advantages,
            returns,
            batch_size or cfg.batch_size,
            self.generator,
            device=self.device,
        )
        total = torch.zeros((), device=self.device)
        count = 0
        for _ in range(num_repetitions or cfg.num_epochs):
            total.zero_()
            count = 0
            for mb in minibatches.epoch():
                loss = torch.dot((self.critic(mb.obs) - mb.returns).pow(2), mb.weights)
                if optimizer_step(self, self.critic_optimizer, loss, self._critic_params) is None:
                    continue  # a skipped batch (nan_policy: skip_batch)
                total += loss.detach()
                count += 1
                self.gradient_steps += 1
        return {"loss/value": float(total) / max(count, 1), "train/learning_rate": lr}


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _assign(params: Sequence[torch.Tensor], vector: torch.Tensor) -> None:
    """Copy consecutive slices of ``vector`` into ``params`` (keeping their memory layout,
    e.g. a CNN's channels-last weights)."""
    offset = 0
    for p in params:
        p.copy_(vector[offset : offset + p.numel()].view(p.shape))
        offset += p.numel()
