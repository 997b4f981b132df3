"""Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347).

The clipped-surrogate variant with the details of the reference implementation
(Huang et al. 2022, "The 37 Implementation Details of PPO"): separate actor and critic
MLPs with orthogonal init, advantage normalisation, optional value clipping, entropy
bonus, global gradient clipping, linear learning-rate and clip-range schedules, and an
optional early stop of the epochs on an approximate-KL target.

Deviations from the reference:

- advantages are normalised once over the whole rollout rather than per minibatch
  (identical when one minibatch covers the rollout, less noisy otherwise);
- losses are means weighted by the ``valid`` mask, so the reset steps that next-step
  autoreset inserts after an episode end carry no gradient;
- actor and critic are evaluated as one batched matmul (:class:`rlfleet.nn.twin.TwinMLP`)
  and Adam is the fused kernel: the same maths with far fewer kernel launches;
- for a categorical policy on vector observations the gradients are written out
  (:meth:`PPO._written_out_losses`): the numbers of ``loss.backward()``, bitwise the same
  parameters, without the autograd engine's bookkeeping;
- when one minibatch covers the whole rollout it is not shuffled (the loss is a mean,
  so the order cannot matter).

Spaces: Discrete, Box, MultiDiscrete and MultiBinary actions
(:class:`rlfleet.nn.action_head.ActionHead`), action masks, vector, image and Dict
observations (:class:`rlfleet.nn.actor_critic.ActorCritic`). With ``lstm_hidden_size``
the policy is recurrent: minibatches are whole sequences of ``sequence_length`` steps of
one env, replayed from the state stored at their first step with the state zeroed at
every episode start, as in CleanRL's ``ppo_atari_lstm``.
"""

from __future__ import annotations

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
from rlfleet.errors import ConfigError
from rlfleet.nn.action_head import ActionHead
from rlfleet.nn.actor_critic import ActorCritic
from rlfleet.nn.cnn import CnnKind
from rlfleet.nn.compile import compile_function
from rlfleet.nn.mlp import Activation
from rlfleet.nn.mlp_grad import PlainTwinMLP, has_hooks
from rlfleet.nn.optim import adam, optimizer_step, step_if_finite
from rlfleet.nn.precision import bf16_products_active
from rlfleet.schedules import ScheduleKind, scheduled
from rlfleet.types import Minibatch, PolicyStep


@dataclass
class PPOConfig:
    """PPO hyperparameters (names follow Stable-Baselines3 / CleanRL where they exist)."""

    learning_rate: PositiveFloat = 3e-4
    """Adam step size (the initial value when ``lr_schedule`` is linear)."""
    lr_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay to 0 over the training budget."""
    num_steps: PositiveInt = 128
    """Steps collected per env per rollout (rollout size = num_steps * num_envs)."""
    batch_size: PositiveInt = 256
    """Minibatch size (env steps) for each gradient step."""
    num_epochs: PositiveInt = 10
    """Passes over the rollout per update."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    gae_lambda: UnitFloat = 0.95
    """GAE bias/variance trade-off."""
    time_horizon: PositiveInt | None = None
    """Cut each env's steps into trajectory segments of this many steps, each bootstrapped
    from the value of the observation where it is cut, as ML-Agents' ``time_horizon`` does
    (unset: cut at episode ends and at the end of the rollout only)."""
    clip_range: PositiveFloat = 0.2
    """Clipping of the probability ratio (initial value when ``clip_range_schedule`` is linear)."""
    clip_range_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay of the clip range."""
    clip_range_vf: PositiveFloat | None = None
    """If set, clip value predictions to within this distance of the old values."""
    ent_coef: NonNegativeFloat = 0.0
    """Weight of the entropy bonus (initial value when ``ent_coef_schedule`` is linear)."""
    ent_coef_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay of the entropy weight to 0 over the training budget."""
    vf_coef: NonNegativeFloat = 0.5
    """Weight of the value loss."""
    max_grad_norm: PositiveFloat = 0.5
    """Global gradient-norm clip."""
    normalize_advantage: bool = True
    """Standardise advantages over the rollout."""
    target_kl: PositiveFloat | None = None
    """Stop the epochs early once approximate KL exceeds 1.5 x this."""
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
    sequence_length: PositiveInt | None = None
    """Steps per training sequence of a recurrent policy (unset: num_steps); divides num_steps."""
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
    adam_eps: PositiveFloat = 1e-5
    """Adam epsilon."""


@register
class PPO(Algorithm[PPOConfig], OnPolicyAlgorithm):
    """Clipped-surrogate PPO for every action space but continuous-discrete mixtures."""

    name = "ppo"
    supports_masks = True
    supports_images = True
    supports_custom_encoder = True
    kind = "on_policy"
    config_class = PPOConfig
    action_spaces = ACTION_SPACES
    observation_spaces = OBSERVATION_SPACES

    def _setup(self) -> None:
        cfg = self.config
        if cfg.sequence_length is not None and cfg.num_steps % cfg.sequence_length:
            raise ConfigError(
                f"ppo: sequence_length ({cfg.sequence_length}) must divide num_steps "
                f"({cfg.num_steps})"
            )
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
        self.optimizer = adam(self.net.parameters(), cfg.learning_rate, cfg.adam_eps, self.device)
        self._plain_twin: PlainTwinMLP | None = None
        """The network as a :class:`PlainTwinMLP` (its gradients written out, bitwise those
        of autograd: :meth:`_written_out_losses`), or None: a policy it does not cover
        (other heads, image or Dict observations, a custom encoder, an LSTM), or after
        :meth:`compile_update`."""
        if (
            self.head.kind == "categorical"
            and self.net.flat_input
            and self.net.core is None
            and len(list(self.net.parameters())) == len(list(self.net.twin.parameters()))
        ):
            self._plain_twin = PlainTwinMLP.of(self.net.twin)

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

    # ------------------------------------------------------------ imitation
    def imitation_loss(
        self, obs: torch.Tensor, actions: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        if self.net.core is not None:
            raise ConfigError("ppo: behavioral cloning needs a feed-forward policy")
        out, log_std = self.net.policy(obs)
        if self.head.kind != "gaussian":
            log_probs, _ = self.head.log_prob_entropy(out, actions, log_std=log_std)
            return -log_probs.mean()
        assert log_std is not None
        noise = torch.randn(out.shape, generator=generator).to(out.device)
        sampled = out + log_std.exp() * noise
        return (sampled - actions.reshape(out.shape)).pow(2).mean()

    def imitation_parameters(self) -> list[nn.Parameter]:
        # Actor and critic share the TwinMLP's stacked weights; the loss only reaches the
        # actor's half, so the critic's half gets zero gradients and does not move.
        return list(self.net.parameters())

    # --------------------------------------------------------------- training
    def _gradient_step(
        self,
        mb: Minibatch,
        clip: float,
        ent_coef: float,
        params: list[torch.Tensor],
        track: bool,
        plain: PlainTwinMLP | None,
    ) -> torch.Tensor | None:
        """One clipped-surrogate gradient step; returns [policy, value, entropy, approx_kl,
        clip_fraction] when ``track``. With ``plain`` the gradients are written out
        (:meth:`_written_out_losses`), else ``loss.backward()`` computes them."""
        cfg = self.config
        if plain is not None and mb.masks is None:
            losses = self._written_out_losses(plain, mb, clip, ent_coef, track)
            loss, policy_loss, value_loss, entropy, log_ratio, ratio = losses
            norm = step_if_finite(
                self, self.optimizer, loss, params, max_grad_norm=cfg.max_grad_norm
            )
        else:
            # Entropies only where something reads them: the bonus, or the logged statistics.
            entropy = None
            if ent_coef or track:
                log_probs, entropy, values = self.net.evaluate(mb)
            else:
                log_probs, values = self.net.evaluate_log_probs(mb)
            log_ratio = log_probs - mb.old_log_probs
            ratio = log_ratio.exp()
            surrogate = torch.min(
                mb.advantages * ratio, mb.advantages * ratio.clamp(1.0 - clip, 1.0 + clip)
            )
            policy_loss = -torch.dot(surrogate, mb.weights)
            if cfg.clip_range_vf is not None:
                clipped = mb.old_values + (values - mb.old_values).clamp(
                    -cfg.clip_range_vf, cfg.clip_range_vf
                )
                value_err = torch.max((values - mb.returns).pow(2), (clipped - mb.returns).pow(2))
            else:
                value_err = (values - mb.returns).pow(2)
            value_loss = torch.dot(value_err, mb.weights)
            loss = policy_loss + cfg.vf_coef * value_loss
            if ent_coef:
                assert entropy is not None
                loss = loss - ent_coef * torch.dot(entropy, mb.weights)
            norm = optimizer_step(
                self, self.optimizer, loss, params, max_grad_norm=cfg.max_grad_norm
            )
        if norm is None:  # a skipped batch (nan_policy: skip_batch)
            return None
        self.gradient_steps += 1
        if not track:
            return None
        assert entropy is not None
        with torch.no_grad():
            # http://joschu.net/blog/kl-approx.html: unbiased, low-variance estimator.
            approx_kl = torch.dot((ratio - 1.0) - log_ratio, mb.weights)
            clip_fraction = torch.dot(((ratio - 1.0).abs() > clip).float(), mb.weights)
            return torch.stack(
                [
                    policy_loss.detach(),
                    value_loss.detach(),
                    torch.dot(entropy.detach(), mb.weights),
                    approx_kl,
                    clip_fraction,
                ]
            )

    def _written_out_losses(
        self, plain: PlainTwinMLP, mb: Minibatch, clip: float, ent_coef: float, track: bool
    ) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor
    ]:
        """The loss of :meth:`_gradient_step`'s autograd branch with its gradients set on the
        network's parameters: the numbers ``loss.backward()`` computes, node by node (each
        node's formula, and a tensor's gradients summed in the order the engine sums them;
        a factor of exactly 1 or -1 is applied as the identity or a negation), without the
        autograd engine. Returns the loss, the policy and value losses, the entropies (when
        ``ent_coef`` or ``track``), the log-ratios and the ratios.

        A categorical policy on vector observations without action masks: the network is
        the :class:`~rlfleet.nn.twin.TwinMLP` alone (``tests/algos/test_ppo.py`` checks
        the parameters against autograd's, bitwise).
        """
        cfg = self.config
        with torch.no_grad():
            # Forward, as ActorCritic.evaluate and the autograd branch compute it.
            h, inputs = plain.forward(mb.obs)
            num_outputs = plain.twin.out_features[0]
            log_p = torch.log_softmax(h[0, :, :num_outputs], dim=-1)
            index = mb.actions.long().unsqueeze(-1)
            log_probs = log_p.gather(-1, index).squeeze(-1)
            values = h[1, :, :1].squeeze(-1)
            entropy = probs = None
            if ent_coef or track:
                probs = log_p.exp()
                entropy = -(probs * log_p).sum(-1)
            log_ratio = log_probs - mb.old_log_probs
            ratio = log_ratio.exp()
            unclipped = mb.advantages * ratio
            clipped = mb.advantages * ratio.clamp(1.0 - clip, 1.0 + clip)
            policy_loss = -torch.dot(torch.min(unclipped, clipped), mb.weights)
            error = values - mb.returns
            # (clip range, shift, clipped error, squared error, squared clipped error)
            value_clip = None
            if cfg.clip_range_vf is not None:
                vf_clip = cfg.clip_range_vf
                shift = values - mb.old_values
                clipped_error = (mb.old_values + shift.clamp(-vf_clip, vf_clip)) - mb.returns
                value_clip = (vf_clip, shift, clipped_error, error.pow(2), clipped_error.pow(2))
                value_err = torch.max(value_clip[3], value_clip[4])
            else:
                value_err = error.pow(2)
            value_loss = torch.dot(value_err, mb.weights)
            loss = policy_loss + cfg.vf_coef * value_loss
            if ent_coef:
                assert entropy is not None
                loss = loss - ent_coef * torch.dot(entropy, mb.weights)

            # Backward: loss.backward()'s seed, then each node's gradient formula.
            one = torch.ones_like(loss)
            grad_value_err = (one * cfg.vf_coef) * mb.weights
            if value_clip is None:
                grad_values = grad_value_err * (2.0 * error)
            else:
                vf_clip, shift, clipped_error, squared, clipped_squared = value_clip
                grad_squared, grad_clipped_squared = _min_max_backward(
                    grad_value_err, clipped_squared, squared
                )
                grad_shift = _clamp_backward(
                    grad_clipped_squared * (2.0 * clipped_error),
                    shift,
                    -vf_clip,
                    vf_clip,
                )
                grad_values = grad_squared * (2.0 * error) + grad_shift
            # -dot(surrogate, weights): the seed negated, times the weights.
            grad_unclipped, grad_clipped = _min_max_backward(mb.weights.neg(), unclipped, clipped)
            grad_ratio = grad_unclipped * mb.advantages + _clamp_backward(
                grad_clipped * mb.advantages, ratio, 1.0 - clip, 1.0 + clip
            )
            grad_log_p = torch.zeros_like(log_p).scatter_add_(
                -1, index, (grad_ratio * ratio).unsqueeze(-1)
            )
            if ent_coef:
                assert probs is not None
                # -(p * log_p).sum(-1) with p = log_p.exp(): the engine sums log_p's
                # gradient from the product, then from exp, then from the gather.
                grad_terms = ((one.neg() * ent_coef) * mb.weights).neg().unsqueeze(-1)
                grad_terms = grad_terms.expand_as(log_p)
                grad_log_p = (grad_terms * probs + (grad_terms * log_p) * probs) + grad_log_p
            grad_logits = torch._log_softmax_backward_data(grad_log_p, log_p, -1, log_p.dtype)
            # The outputs are slices of the twin's [2, batch, width] output: each slice's
            # gradient is zeros around it, and the engine adds the two.
            grad_h = torch.zeros_like(h)
            grad_h[0, :, :num_outputs] = grad_logits
            grad_values_h = torch.zeros_like(h)
            grad_values_h[1, :, :1] = grad_values.unsqueeze(-1)
            grad_h = grad_h + grad_values_h
        # Every parameter of the network is the twin's (see _build): each gets its gradient.
        for (weight, bias), (grad_weight, grad_bias) in zip(
            plain.twin._layers, plain.backward(grad_h, inputs), strict=True
        ):
            weight.grad, bias.grad = grad_weight, grad_bias
        return loss, policy_loss, value_loss, entropy, log_ratio, ratio

    def compile_update(self) -> None:
        """Compile the network's evaluation of a minibatch (forward, log-probabilities,
        entropies, values and their backward), with and without the entropies; the loss
        arithmetic stays eager."""
        self._plain_twin = None
        self.net.evaluate = compile_function(self.net.evaluate)  # type: ignore[method-assign]
        self.net.evaluate_log_probs = compile_function(  # type: ignore[method-assign]
            self.net.evaluate_log_probs
        )

    def update(
        self,
        batch: RolloutStorage,
        *,
        batch_size: int | None = None,
        num_repetitions: int | None = None,
    ) -> dict[str, float]:
        """Advantages by GAE, then ``num_repetitions`` epochs of minibatch gradient steps.

        Logged losses and statistics are means over the last epoch run.
        """
        cfg = self.config
        batch_size = batch_size or cfg.batch_size
        num_repetitions = num_repetitions or cfg.num_epochs
        advantages, returns = rollout_advantages(batch, self.reward_scaler, cfg)
        minibatches = rollout_minibatches(
            batch,
            advantages,
            returns,
            batch_size,
            self.generator,
            cfg.sequence_length,
            device=self.device,
        )

        lr = scheduled(cfg.learning_rate, cfg.lr_schedule, self.progress) * self.lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        clip = scheduled(cfg.clip_range, cfg.clip_range_schedule, self.progress)
        ent_coef = scheduled(cfg.ent_coef, cfg.ent_coef_schedule, self.progress)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        # Gradients written out (bitwise autograd's) unless something needs autograd itself:
        # hooks on the network, bf16 products, a compiled evaluation.
        plain = self._plain_twin
        if plain is not None and (bf16_products_active() or has_hooks(self.net)):
            plain = None

        # policy, value, entropy, approx_kl, clip_fraction
        stats = torch.zeros(5, device=self.device)
        num_minibatches = 0
        for epoch in range(num_repetitions):
            # Statistics cost a few ops per minibatch: gather them for the last epoch only
            # (what is logged), or for every epoch when target_kl needs the KL to stop early.
            track = cfg.target_kl is not None or epoch == num_repetitions - 1
            epoch_stats = torch.zeros(5, device=self.device)
            epoch_tracked = 0
            for mb in minibatches.epoch():
                step_stats = self._gradient_step(mb, clip, ent_coef, params, track, plain)
                num_minibatches += 1
                if step_stats is not None:
                    epoch_stats += step_stats
                    epoch_tracked += 1
            if track and epoch_tracked:
                stats = epoch_stats / epoch_tracked
            if cfg.target_kl is not None and float(stats[3]) > 1.5 * cfg.target_kl:
                break

        means = stats.tolist()
        return {
            "loss/policy": means[0],
            "loss/value": means[1],
            "loss/entropy": means[2],
            "train/approx_kl": means[3],
            "train/clip_fraction": means[4],
            "train/explained_variance": F.explained_variance(batch.values, returns),
            "train/learning_rate": lr,
            "train/clip_range": clip,
            "train/gradient_steps_per_update": float(num_minibatches),
        }


def _min_max_backward(
    grad: torch.Tensor, first: torch.Tensor, second: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of ``torch.min(first, second)`` (or of ``torch.max(second, first)``)
    as autograd's ``MinimumBackward`` computes them: to the smaller, halved on a tie."""
    shared = torch.where(first == second, grad / 2, grad)
    return shared.masked_fill(first > second, 0), shared.masked_fill_(first < second, 0)


def _clamp_backward(grad: torch.Tensor, x: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """The gradient of ``x.clamp(low, high)`` as autograd's ``ClampBackward1`` computes it:
    ``grad`` where ``x`` is within the bounds (bounds included), else 0."""
    return torch.where((x >= low).logical_and_(x <= high), grad, 0.0)
