"""Deep Q-Network (Mnih et al. 2015, "Human-level control through deep reinforcement
learning") with the usual improvements as flags:

- ``double``: the online network picks the next action, the target network values it
  (van Hasselt et al. 2016, arXiv:1509.06461);
- ``dueling``: separate value and advantage heads, ``Q = V + A - mean(A)``
  (Wang et al. 2016, arXiv:1511.06581);
- ``n_step``: n-step returns, cut at episode ends (Sutton 1988; Hessel et al. 2018);
- ``prioritized``: proportional prioritized replay with importance weights
  (Schaul et al. 2016, arXiv:1511.05952), priorities = absolute TD errors.

As in Stable-Baselines3: Huber loss, gradient-norm clipping, epsilon-greedy exploration
falling linearly over ``exploration_fraction`` of the budget, and PyTorch's default layer
init. Deviation: ``target_update_interval`` counts gradient steps (as Tianshou's
``target_update_freq`` does), not env steps, so the target lag does not change with
``train_freq``; with ``tau < 1`` each of those updates is a Polyak step instead of a copy.

Speed: with a plain MLP Q-network (no dueling heads) the update writes the gradients out
(:class:`~rlfleet.nn.mlp_grad.PlainMLP`): the kernels ``loss.backward()`` would run, in its
order, without the autograd engine, so the parameters are bitwise those of the autograd
update. Hooks on the Q-network, ``precision: bf16`` and a compiled update take autograd.

Image observations (uint8 frames such as Atari's, see :func:`rlfleet.nn.obs.is_image_space`)
go through a CNN (``cnn``, the Nature network by default) whose features feed the
Q-network's layers (``hidden_sizes``; none for Nature DQN's linear head); its gradients go
through autograd. Vector observations are flattened into the MLP, and so are binary grids
(MinAtar's bool frames, :func:`rlfleet.nn.obs.is_binary_grid_space`) unless ``cnn`` is
``minatar``, which takes them through the MinAtar paper's network, as the policy-gradient
algorithms do.

Action masks: acting picks legal actions only (greedy and random alike), and the target
bootstraps over the legal actions of the state it bootstraps from (``next_action_masks`` of
the batch, the state ``n_step`` steps on): the max, or with ``double`` the online argmax, is
taken over legal actions, so an illegal action's (never trained) Q-value cannot leak in.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
from rlfleet.data.samplers import PrioritizedSampler, Sampler, UniformSampler
from rlfleet.errors import ConfigError
from rlfleet.nn import distributions as D
from rlfleet.nn.cnn import CnnKind
from rlfleet.nn.compile import compile_function
from rlfleet.nn.cuda_graph import GraphedStep, fill_static, refuse_uncapturable, to_static
from rlfleet.nn.encoders import Encoder, FlatEncoder, make_encoder
from rlfleet.nn.masks import apply_mask, masked_argmax
from rlfleet.nn.mlp import Activation, mlp
from rlfleet.nn.mlp_grad import PlainMLP, has_hooks
from rlfleet.nn.normalize import make_obs_normalizer, obs_normalizer_modules
from rlfleet.nn.obs import is_binary_grid_space
from rlfleet.nn.optim import (
    adam,
    finite_or_skip,
    optimizer_step,
    step_if_finite,
    step_if_finite_captured,
)
from rlfleet.nn.precision import bf16_products_active
from rlfleet.schedules import ScheduleKind, linear_decay, scheduled
from rlfleet.seeding import stream_seed
from rlfleet.types import PolicyStep, ReplayBatch

if TYPE_CHECKING:
    from rlfleet.data.source import TransitionSource


@dataclass
class DQNConfig:
    """DQN hyperparameters (Stable-Baselines3 names and defaults where they exist)."""

    learning_rate: PositiveFloat = 1e-4
    """Adam step size (the initial value when ``lr_schedule`` is linear)."""
    lr_schedule: ScheduleKind = "constant"
    """``constant`` or ``linear`` decay to 0 over the training budget."""
    buffer_size: PositiveInt = 1_000_000
    """Replay buffer capacity in transitions."""
    learning_starts: NonNegativeInt = 100
    """Env steps of uniformly random actions before the first update."""
    batch_size: PositiveInt = 32
    """Transitions per gradient step."""
    gamma: UnitFloat = 0.99
    """Discount factor."""
    train_freq: PositiveInt = 4
    """Env steps collected per training step (all envs counted)."""
    gradient_steps: NonNegativeInt = 1
    """Gradient steps per training step (update-to-data ratio = gradient_steps / train_freq)."""
    target_update_interval: PositiveInt = 2500
    """Gradient steps between target-network updates."""
    tau: PositiveFloat = 1.0
    """Target update: 1 copies the online network, less moves the target that fraction."""
    exploration_fraction: UnitFloat = 0.1
    """Fraction of the budget over which epsilon falls from its initial to its final value."""
    exploration_initial_eps: UnitFloat = 1.0
    """Initial probability of a random action."""
    exploration_final_eps: UnitFloat = 0.05
    """Final probability of a random action."""
    max_grad_norm: PositiveFloat = 10.0
    """Global gradient-norm clip."""
    double: bool = False
    """Double DQN: the online network chooses the next action, the target network values it."""
    dueling: bool = False
    """Dueling heads: Q = V + A - mean(A)."""
    n_step: PositiveInt = 1
    """Steps of real rewards before bootstrapping (cut at episode ends)."""
    prioritized: bool = False
    """Prioritized replay by absolute TD error."""
    prioritized_alpha: NonNegativeFloat = 0.6
    """How strongly priorities skew sampling (0: uniform)."""
    prioritized_beta: UnitFloat = 0.4
    """Initial importance-weight exponent, annealed to 1 over training."""
    hidden_sizes: tuple[LayerWidth, ...] = (64, 64)
    """Hidden layer widths of the Q-network."""
    activation: Activation = "relu"
    """Hidden-layer activation."""
    adam_eps: PositiveFloat = 1e-8
    """Adam epsilon."""
    normalize_obs: bool = False
    """Normalise observations with running mean/std statistics, updated from every
    collected observation; replay samples are normalised with the current statistics."""
    cnn: CnnKind = "nature"
    """CNN for image observations (``nature``, ``impala`` or ``minatar``); binary grids go
    through a CNN only with ``minatar`` (else they are flattened, as vectors are)."""


class _QNetwork(nn.Module):
    """Q-values of every action; with ``dueling``, from a value and an advantage head.

    Takes the preprocessed observation batch through ``encoder``: a CNN for images (and
    for binary grids with ``cnn: minatar``), else the flattening of vectors (no parameters)."""

    def __init__(
        self,
        encoder: Encoder,
        num_actions: int,
        cfg: DQNConfig,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        obs_dim = encoder.out_features
        self.dueling = cfg.dueling
        if cfg.dueling:
            *inner, width = cfg.hidden_sizes
            self.trunk = mlp(
                obs_dim, inner, width, cfg.activation, ortho_init=False, activate_output=True
            )
            self.value = nn.Linear(width, 1)
            self.advantage = nn.Linear(width, num_actions)
        else:
            self.q = mlp(obs_dim, cfg.hidden_sizes, num_actions, cfg.activation, ortho_init=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        obs = self.encoder.forward(obs)  # as _sequential: no hook dispatch per call
        if not self.dueling:
            return _sequential(self.q, obs)
        hidden = _sequential(self.trunk, obs)
        advantage: torch.Tensor = self.advantage(hidden)
        value: torch.Tensor = self.value(hidden)
        return value + advantage - advantage.mean(-1, keepdim=True)


def _sequential(layers: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """``layers(x)`` calling each layer's ``forward`` directly: the same result without the
    per-module hook dispatch, which costs more than a small layer's arithmetic."""
    for layer in layers:
        x = layer.forward(x)
    return x


@register
class DQN(Algorithm[DQNConfig], OffPolicyAlgorithm):
    """Deep Q-learning for Discrete actions (double, dueling, n-step, prioritized flags)."""

    name = "dqn"
    supports_masks = True
    supports_images = True
    kind = "off_policy"
    config_class = DQNConfig
    action_spaces = (spaces.Discrete,)

    def _setup(self) -> None:
        self.num_actions = int(self.action_space.n)  # type: ignore[attr-defined]
        self.action_start = int(self.action_space.start)  # type: ignore[attr-defined]
        """First action of the Discrete space: Q-value ``i`` is for env action ``start + i``.
        ``act`` returns indices, as every algorithm does (``env_actions`` shifts them); the
        replay buffer holds env actions, which the update shifts back."""
        if self.config.dueling and not self.config.hidden_sizes:
            raise ConfigError("dqn: dueling heads need at least one hidden layer (hidden_sizes)")

    def _build(self) -> None:
        cfg = self.config
        self.obs_normalizer = make_obs_normalizer(
            self.obs_layout, self.config.normalize_obs, self.name, self.device
        )
        # make_encoder's CNN for images, and for binary grids when cnn is minatar; every other
        # vector observation, binary grids included, is flattened into the MLP.
        layout = self.obs_layout
        image = layout.kind == "image"
        grid = cfg.cnn == "minatar" and is_binary_grid_space(layout.space)
        encoder = make_encoder(layout, cfg.cnn) if image or grid else FlatEncoder(layout.shape)
        self.q_net = _QNetwork(encoder, self.num_actions, cfg).to(self.device)
        self.target_q_net = copy.deepcopy(self.q_net).requires_grad_(False)
        self._online_params: list[torch.Tensor] = list(self.q_net.parameters())
        self._target_params: list[torch.Tensor] = list(self.target_q_net.parameters())
        self.optimizer = adam(self._online_params, cfg.learning_rate, cfg.adam_eps, self.device)
        self._plain_q: PlainMLP | None = (
            None if cfg.dueling or image or grid else PlainMLP.of(self.q_net.q)
        )
        """The Q-network as a :class:`PlainMLP` (its gradients written out, bitwise those of
        autograd), or None: dueling heads, a CNN, or after :meth:`compile_update`."""
        self._graphed: GraphedStep[tuple[torch.Tensor, ...]] | None = None
        """The captured gradient step (:meth:`capture_update`), or None: steps run eagerly."""
        self._graph_batch: ReplayBatch[torch.Tensor] | None = None
        """The batch the captured step reads, refilled in place before each step."""
        self._graph_lr = torch.zeros((), device=self.device)
        """The learning rate the captured step's Adam reads with a scheduled learning rate
        (set by each update)."""
        self._graph_fixed_lr: float | None = None
        """The learning rate a capture holds as a number (a constant schedule), or None."""
        self._graphs_on = False

    def modules(self) -> dict[str, nn.Module]:
        return {
            "q_net": self.q_net,
            "target_q_net": self.target_q_net,
            **obs_normalizer_modules(self.obs_normalizer),
        }

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"optimizer": self.optimizer}

    # ----------------------------------------------------------------- acting
    def exploration_rate(self) -> float:
        """Epsilon at the current training progress."""
        cfg = self.config
        return linear_decay(
            cfg.exploration_initial_eps,
            cfg.exploration_final_eps,
            cfg.exploration_fraction,
            self.progress,
        )

    @torch.inference_mode()
    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep:
        """Epsilon-greedy actions; with ``action_mask`` both the greedy and the random choice
        are among legal actions only."""
        if state is not None:
            self.refuse_unsupported_inputs(None, state)
        q_values = self.q_net(obs)
        greedy = masked_argmax(q_values, action_mask)
        if not deterministic:
            n = greedy.shape[0]
            explore = torch.rand(n, generator=self.generator) < self.exploration_rate()
            if action_mask is None:
                random = torch.randint(self.num_actions, (n,), generator=self.generator)
                random = random.to(greedy.device)
            else:  # uniform over the legal actions
                random, _ = D.categorical_sample(
                    apply_mask(torch.zeros_like(q_values), action_mask), self.generator
                )
            greedy = torch.where(explore.to(greedy.device), random, greedy)
        return PolicyStep(actions=greedy)

    # --------------------------------------------------------------- training
    def replay_sampler(self) -> Sampler:
        """Prioritized by absolute TD error with ``prioritized``, else uniform."""
        cfg = self.config
        if cfg.prioritized:
            return PrioritizedSampler(
                alpha=cfg.prioritized_alpha,
                beta=cfg.prioritized_beta,
                seed=stream_seed(self.seed, "replay"),
            )
        return UniformSampler(seed=stream_seed(self.seed, "replay"))

    def compile_update(self) -> None:
        """Compile the loss of a minibatch (target, Q-values, Huber loss and its backward)."""
        self._loss = compile_function(self._loss)  # type: ignore[method-assign]
        self._plain_q = None

    def capture_update(self) -> None:
        """Capture each gradient step as a CUDA graph and replay it from then on
        (:class:`~rlfleet.nn.cuda_graph.GraphedStep`): the first three steps run eagerly,
        the fourth is captured. A step reads its minibatch from tensors it keeps, which each
        step refills; a minibatch of another shape (a ``batch_size`` passed to
        :meth:`update`) is stepped eagerly, as is every step while the Q-network has hooks
        (they would run once, at the capture). Loading a state drops the capture (the
        optimiser's state tensors are new) and the next steps capture again.

        The captured step runs the eager step's kernels on the same numbers. With a constant
        learning rate the capture holds it as the number the eager step passes Adam, so the
        parameters are bitwise the eager step's; a learning rate that changes anyway
        (``lr_scale``) is captured again. A linear schedule changes it every update, so the
        capture reads it from a tensor, which CUDA's fused Adam takes in float32 (1e-3
        becomes 1.0000000475e-3) where the eager step passes a double: the parameters may
        then differ from the eager step's in their last bits (on an H200 they did not, over
        2,000 gradient steps; ``tests/nn/test_cuda_graph.py`` allows for it)."""
        refuse_uncapturable(self.name, self.device, self.optimizers())
        self._graphs_on = True
        self._drop_capture()

    def _drop_capture(self) -> None:
        """Forget the capture: the next steps warm up and capture again."""
        self._graphed = None
        self._graph_batch = None
        self._graph_fixed_lr = None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self._graphs_on:  # the capture read the optimiser's old state tensors
            self.capture_update()

    def _graph_step(self) -> tuple[torch.Tensor, ...]:
        """One gradient step on :attr:`_graph_batch` with no value read on the host (the
        captured step): loss, gradients, clip, and an Adam step that skips itself when the
        loss or the gradient norm is not finite. Returns the loss, the Q-values and targets
        of the batch, and the gradient norm."""
        cfg = self.config
        sample = self._graph_batch
        assert sample is not None
        if self._plain_q is None:
            loss, q, target = self._loss(sample)
            for p in self._online_params:
                p.grad = None
            loss.backward()
        else:
            loss, q, target = self._loss_and_gradients(self._plain_q, sample)
        lr = None if self._graph_fixed_lr is not None else self._graph_lr
        norm, _ = step_if_finite_captured(
            self.optimizer,  # type: ignore[arg-type]
            loss,
            self._online_params,
            max_grad_norm=cfg.max_grad_norm,
            lr=lr,
        )
        return loss.detach(), q, target, norm

    def _graphed_step(self, sample: ReplayBatch[torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
        """The captured step on ``sample`` (capturing it first if needed); None when
        ``sample`` does not fit the capture (step eagerly)."""
        if self._graph_batch is None:
            self._graph_batch = to_static(sample, self.device)
            self._graphed = GraphedStep(self._graph_step, self.device)
        elif not fill_static(self._graph_batch, sample):
            return None
        assert self._graphed is not None
        return self._graphed()

    def update(
        self,
        source: TransitionSource,
        *,
        batch_size: int | None = None,
        num_gradient_steps: int = 1,
    ) -> dict[str, float]:
        """``num_gradient_steps`` gradient steps, each on a fresh minibatch from the buffer."""
        cfg = self.config
        batch_size = batch_size or cfg.batch_size
        lr = scheduled(cfg.learning_rate, cfg.lr_schedule, self.progress) * self.lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self._graphs_on:
            if cfg.lr_schedule != "constant":
                self._graph_lr.fill_(lr)
            elif self._graph_fixed_lr != lr:
                self._drop_capture()
                self._graph_fixed_lr = lr
        losses: list[torch.Tensor] = []
        q_means: list[torch.Tensor] = []
        # Gradients written out (bitwise autograd's) unless something needs autograd itself:
        # hooks on the Q-network, bf16 products, a compiled loss.
        hooked = has_hooks(self.q_net)
        plain_q = self._plain_q
        if plain_q is not None and (bf16_products_active() or hooked):
            plain_q = None
        # Hooks would run once, at the capture: a hooked Q-network steps eagerly.
        graphs = self._graphs_on and not hooked
        for _ in range(num_gradient_steps):
            sample: ReplayBatch[torch.Tensor] = source.sample(
                batch_size, gamma=cfg.gamma, n_step=cfg.n_step, progress=self.progress
            )
            norm: torch.Tensor | None
            graphed = self._graphed_step(sample) if graphs else None
            if graphed is not None:
                # The next replay overwrites the outputs; Q-values and targets are read
                # before it (priorities, q_means), the loss is kept past it.
                loss, q, target = graphed[0].clone(), graphed[1], graphed[2]
                norm = graphed[3] if finite_or_skip(self, loss, graphed[3]) else None
            elif plain_q is None:
                sample = sample.to(self.device)
                loss, q, target = self._loss(sample)
                norm = optimizer_step(
                    self, self.optimizer, loss, self._online_params, max_grad_norm=cfg.max_grad_norm
                )
            else:
                sample = sample.to(self.device)
                loss, q, target = self._loss_and_gradients(plain_q, sample)
                norm = step_if_finite(
                    self, self.optimizer, loss, self._online_params, max_grad_norm=cfg.max_grad_norm
                )
            if norm is None:  # a skipped batch (nan_policy: skip_batch)
                continue
            if cfg.prioritized:
                source.update_priorities(sample.indices, (q - target).abs().cpu().numpy())
            self.gradient_steps += 1
            if self.gradient_steps % cfg.target_update_interval == 0:
                F.polyak_update(self._target_params, self._online_params, cfg.tau)
            losses.append(loss.detach())
            q_means.append(q.mean())
        if not losses:  # every batch was skipped
            return {"train/exploration_rate": self.exploration_rate(), "train/learning_rate": lr}
        means = torch.stack([torch.stack(losses).mean(), torch.stack(q_means).mean()]).tolist()
        return {
            "loss/q": means[0],
            "train/q_mean": means[1],
            "train/exploration_rate": self.exploration_rate(),
            "train/learning_rate": lr,
        }

    def _targets(self, sample: ReplayBatch[torch.Tensor]) -> torch.Tensor:
        """The bootstrapped targets of a batch (no gradient): its n-step returns plus the
        discounted value of the state they bootstrap from, by the target network, with the
        online network choosing the action under ``double``."""
        next_obs = self.preprocess(sample.next_obs)
        with torch.no_grad():
            next_q = self.target_q_net(next_obs)
            chooser = self.q_net(next_obs) if self.config.double else next_q
            best = masked_argmax(chooser, sample.next_action_masks)
            next_value = next_q.gather(1, best.unsqueeze(1)).squeeze(1)
            target: torch.Tensor = sample.rewards + sample.discounts * next_value
        return target

    def _taken(self, sample: ReplayBatch[torch.Tensor]) -> torch.Tensor:
        """Q-value indices of the batch's actions (the buffer holds env actions)."""
        return sample.actions - self.action_start if self.action_start else sample.actions

    def _loss(
        self, sample: ReplayBatch[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Huber loss (importance-weighted with prioritized replay), and the Q-values of the
        taken actions and their targets, detached."""
        target = self._targets(sample)
        q = (
            self.q_net(self.preprocess(sample.obs))
            .gather(1, self._taken(sample).unsqueeze(1))
            .squeeze(1)
        )
        if self.config.prioritized:
            errors = nn.functional.smooth_l1_loss(q, target, reduction="none")
            loss = torch.dot(errors, sample.weights) / errors.shape[0]
        else:
            loss = nn.functional.smooth_l1_loss(q, target)
        return loss, q.detach(), target

    def _loss_and_gradients(
        self, q_net: PlainMLP, sample: ReplayBatch[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What :meth:`_loss` returns, with the loss's gradients set on the online
        parameters: :meth:`_loss` and ``loss.backward()`` kernel for kernel (the backward
        of the Huber loss, the importance weights and the action gather as autograd's
        nodes compute them, then :meth:`PlainMLP.backward`), without the autograd engine."""
        target = self._targets(sample)
        obs = self.q_net.encoder.forward(self.preprocess(sample.obs))  # flattened vectors
        q_all, inputs = q_net.forward(obs)
        index = self._taken(sample).unsqueeze(1)
        q = q_all.gather(1, index).squeeze(1)
        seed = torch.ones((), dtype=q.dtype, device=q.device)  # loss.backward()'s
        if self.config.prioritized:
            errors = nn.functional.smooth_l1_loss(q, target, reduction="none")
            loss = torch.dot(errors, sample.weights) / errors.shape[0]
            grad_errors = (seed / errors.shape[0]) * sample.weights
            grad_q = torch.ops.aten.smooth_l1_loss_backward(grad_errors, q, target, 0, 1.0)
        else:
            loss = nn.functional.smooth_l1_loss(q, target)
            grad_q = torch.ops.aten.smooth_l1_loss_backward(seed, q, target, 1, 1.0)
        grad_q_all = torch.zeros_like(q_all).scatter_add_(1, index, grad_q.unsqueeze(1))
        for param, grad in zip(
            self._online_params, q_net.backward(grad_q_all, inputs), strict=True
        ):
            param.grad = grad
        return loss, q, target
