"""The actor-critic network of the policy-gradient family (PPO, A2C, IMPALA, APPO).

``encoder -> [LSTM] -> actor head and critic head``:

- the encoder comes from :func:`rlfleet.nn.encoders.make_encoder` (or a custom
  ``encoder`` factory, shared by actor and critic). For vector
  observations it only flattens, so actor and critic are the two separate MLPs of
  :class:`rlfleet.nn.twin.TwinMLP` (the PPO reference design); a CNN or a Dict encoder is
  shared by both, as in Stable-Baselines3's ``CnnPolicy``;
- the optional LSTM (:class:`rlfleet.nn.recurrent.LSTMCore`) is shared too;
- the heads are a :class:`~rlfleet.nn.twin.TwinMLP` with ``hidden_sizes`` (empty: linear
  heads), the actor's output sized by the :class:`~rlfleet.nn.action_head.ActionHead`,
  initialised orthogonally or, with ``ortho_init`` false, as PyTorch's ``nn.Linear`` is;
  a Gaussian policy adds a state-independent ``log_std`` parameter, or with ``sde`` a
  ``[features, action dims]`` one whose noise depends on the state (gSDE,
  :mod:`rlfleet.nn.sde`: the actor's last hidden features are its input).

On-policy algorithms evaluate :class:`~rlfleet.types.Minibatch` es of a rollout
(:meth:`ActorCritic.evaluate`); the actor-learner ones re-evaluate a whole batch of actor
fragments, and the observation after it, in one forward pass
(:meth:`ActorCritic.evaluate_rollout`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rlfleet.nn.action_head import ActionHead
from rlfleet.nn.cnn import CnnKind
from rlfleet.nn.encoders import EncoderFactory, FlatEncoder, make_encoder
from rlfleet.nn.mlp import Activation
from rlfleet.nn.noise import ColoredNoise, next_noise
from rlfleet.nn.obs import ObsLayout
from rlfleet.nn.recurrent import LSTMCore
from rlfleet.nn.sde import StateDependentNoise, sde_log_std
from rlfleet.nn.twin import TwinMLP
from rlfleet.types import Minibatch, PolicyStep


class ActorCritic(nn.Module):
    """Policy outputs and state values from stored observations."""

    def __init__(
        self,
        layout: ObsLayout,
        head: ActionHead,
        hidden_sizes: Sequence[int],
        activation: Activation,
        *,
        cnn: CnnKind = "nature",
        lstm_hidden_size: int | None = None,
        log_std_init: float = 0.0,
        encoder: EncoderFactory | None = None,
        sde: bool = False,
        ortho_init: bool = True,
    ) -> None:
        super().__init__()
        self.head = head
        self.encoder = make_encoder(layout, cnn, encoder)
        # Vector observations skip the encoder call on the hot path: it would only flatten.
        self.flat_input = isinstance(self.encoder, FlatEncoder) and len(layout.shape) == 1
        width = self.encoder.out_features
        self.core = LSTMCore(width, lstm_hidden_size) if lstm_hidden_size else None
        self.twin = TwinMLP(
            lstm_hidden_size or width,
            hidden_sizes,
            (head.num_outputs, 1),
            activation,
            ortho_init=ortho_init,
        )
        self.sde = sde and head.kind == "gaussian"
        """The Gaussian policy's noise depends on the state (gSDE)."""
        self.latent_dim = hidden_sizes[-1] if hidden_sizes else lstm_hidden_size or width
        """Width of the actor's last hidden features (what gSDE's noise reads)."""
        std_shape = (self.latent_dim, head.num_outputs) if self.sde else (head.num_outputs,)
        self.log_std = (
            nn.Parameter(torch.full(std_shape, log_std_init)) if head.kind == "gaussian" else None
        )

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """Encoder features of a ``[batch, *stored_shape]`` batch."""
        if self.flat_input:
            return obs
        features: torch.Tensor = self.encoder(obs)
        return features

    def initial_state(self, batch: int, device: torch.device) -> torch.Tensor | None:
        """The LSTM's zero state for ``batch`` fresh episodes (None: a feed-forward policy)."""
        return None if self.core is None else self.core.initial_state(batch, device)

    def forward(
        self, obs: torch.Tensor, state: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One step: ``(policy outputs, values, new recurrent state or None)``."""
        features, new_state = self._features(obs, state)
        out, values = self.twin(features)
        return out, values.squeeze(-1), new_state

    def _features(
        self, obs: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the heads read for one step, and the new recurrent state (or None)."""
        features = obs if self.flat_input else self.encoder(obs)
        if self.core is None:
            return features, None
        assert state is not None, "a recurrent policy needs its state"
        return self.core.step(features, state)

    def _heads(
        self, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Policy outputs, values, the Gaussian's log std (per row with gSDE; None for other
        heads) and, with gSDE, the actor's last hidden features."""
        if not self.sde:
            out, values = self.twin(features)
            return out, values.squeeze(-1), self.log_std, None
        assert self.log_std is not None
        out, values, latent = self.twin.forward_latent(features)
        return out, values.squeeze(-1), sde_log_std(latent, self.log_std), latent

    def policy(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A feed-forward batch's policy outputs and the Gaussian's log std (per row with
        gSDE; None for other heads)."""
        features, _ = self._features(obs, None)
        out, _, log_std, _ = self._heads(features)
        return out, log_std

    def sequence(
        self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Recurrent replay: obs ``[L, batch, ...]`` from ``state`` with resets at ``starts``
        ``[L, batch]``; returns policy outputs, values and the Gaussian's log std (see
        :meth:`policy`) flattened to ``[L * batch, ...]``."""
        assert self.core is not None
        steps, batch = obs.shape[:2]
        features = self.encode(obs.reshape(steps * batch, *obs.shape[2:]))
        hidden = self.core.sequence(features.view(steps, batch, -1), state, starts)
        out, values, log_std, _ = self._heads(hidden.reshape(steps * batch, -1))
        return out, values, log_std

    def act(
        self,
        obs: torch.Tensor,
        generator: torch.Generator,
        *,
        deterministic: bool = False,
        mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
        noise: ColoredNoise | None = None,
        exploration: StateDependentNoise | None = None,
    ) -> PolicyStep:
        """Sampled (or greedy) actions with their log-probabilities and values (``noise``: a
        Gaussian policy's colored noise, instead of independent draws; ``exploration``: a
        gSDE policy's exploration matrices, without which it draws independently from the
        same per-state distribution)."""
        # Methods directly, not nn.Module.__call__: its hook handling costs as much as a
        # small MLP here, once per env step and per gradient step, and no hooks are used.
        features, new_state = self._features(obs, state)
        out, values, log_std, latent = self._heads(features)
        if deterministic:
            actions, log_probs = self.head.greedy(out, mask=mask, log_std=log_std)
        elif exploration is not None and latent is not None:
            assert self.log_std is not None
            assert log_std is not None
            shift = exploration.perturbation(latent, self.log_std)
            actions, log_probs = self.head.shifted(out, shift, log_std)
        else:
            draw = next_noise(noise, False, out.shape[0], out.device)
            actions, log_probs = self.head.sample(
                out, generator, mask=mask, log_std=log_std, noise=draw
            )
        return PolicyStep(actions=actions, log_probs=log_probs, values=values, state=new_state)

    def evaluate(self, mb: Minibatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities and entropies of the minibatch's actions, and values."""
        out, values, log_std = self._minibatch_outputs(mb)
        log_probs, entropy = self.head.log_prob_entropy(
            out, mb.actions, mask=mb.masks, log_std=log_std
        )
        return log_probs, entropy, values

    def evaluate_log_probs(self, mb: Minibatch) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`evaluate` without the entropies, for a loss without an entropy bonus."""
        out, values, log_std = self._minibatch_outputs(mb)
        log_probs = self.head.log_prob(out, mb.actions, mask=mb.masks, log_std=log_std)
        return log_probs, values

    def _minibatch_outputs(
        self, mb: Minibatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if mb.states is None:
            features, _ = self._features(mb.obs, None)
            out, values, log_std, _ = self._heads(features)
            return out, values, log_std
        assert mb.starts is not None
        return self.sequence(mb.obs, mb.states, mb.starts)

    def evaluate_actions(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_probs, entropy, values)`` of given actions for a feed-forward ``[batch, ...]``
        batch of observations."""
        features, _ = self._features(obs, None)
        out, values, log_std, _ = self._heads(features)
        log_probs, entropy = self.head.log_prob_entropy(out, actions, log_std=log_std)
        return log_probs, entropy, values

    def evaluate_rollout(
        self, obs: torch.Tensor, actions: torch.Tensor, next_obs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Evaluate a ``[T, N]`` rollout and the ``[N]`` observations after it in one pass.

        Returns ``[T, N]`` log-probabilities, entropies and values, and the ``[T, N]`` values
        of the observation that followed each step (next row, then ``next_obs``).
        """
        steps, envs = obs.shape[0], obs.shape[1]
        # The observations after the rollout need only a value; giving their rows the first
        # step's actions keeps everything one batched forward pass (those log-probs are dropped).
        flat_obs = torch.cat([obs.reshape(steps * envs, *obs.shape[2:]), next_obs])
        flat_actions = torch.cat([actions.reshape(steps * envs, *actions.shape[2:]), actions[0]])
        log_probs, entropy, values = self.evaluate_actions(flat_obs, flat_actions)
        n = steps * envs
        all_values = values.reshape(steps + 1, envs)
        return (
            log_probs[:n].reshape(steps, envs),
            entropy[:n].reshape(steps, envs),
            all_values[:steps],
            all_values[1:],
        )
