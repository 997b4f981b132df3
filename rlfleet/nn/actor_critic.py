"""The actor-critic network of the policy-gradient family (PPO, A2C, IMPALA, APPO).

``encoder -> [LSTM] -> actor head and critic head``:

- the encoder comes from :func:`rlfleet.nn.encoders.make_encoder` (or a custom
  ``encoder`` factory, shared by actor and critic). For vector
  observations it only flattens, so actor and critic are the two separate MLPs of
  :class:`rlfleet.nn.twin.TwinMLP` (the PPO reference design); a CNN or a Dict encoder is
  shared by both, as in Stable-Baselines3's ``CnnPolicy``;
- the optional LSTM (:class:`rlfleet.nn.recurrent.LSTMCore`) is shared too;
- the heads are a :class:`~rlfleet.nn.twin.TwinMLP` with ``hidden_sizes`` (empty: linear
  heads), the actor's output sized by the :class:`~rlfleet.nn.action_head.ActionHead`;
  a Gaussian policy adds a state-independent ``log_std`` parameter.

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
    ) -> None:
        super().__init__()
        self.head = head
        self.encoder = make_encoder(layout, cnn, encoder)
        # Vector observations skip the encoder call on the hot path: it would only flatten.
        self.flat_input = isinstance(self.encoder, FlatEncoder) and len(layout.shape) == 1
        width = self.encoder.out_features
        self.core = LSTMCore(width, lstm_hidden_size) if lstm_hidden_size else None
        self.twin = TwinMLP(
            lstm_hidden_size or width, hidden_sizes, (head.num_outputs, 1), activation
        )
        self.log_std = (
            nn.Parameter(torch.full((head.num_outputs,), log_std_init))
            if head.kind == "gaussian"
            else None
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
        features = obs if self.flat_input else self.encoder(obs)
        new_state = None
        if self.core is not None:
            assert state is not None, "a recurrent policy needs its state"
            features, new_state = self.core.step(features, state)
        out, values = self.twin(features)
        return out, values.squeeze(-1), new_state

    def sequence(
        self, obs: torch.Tensor, state: torch.Tensor, starts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent replay: obs ``[L, batch, ...]`` from ``state`` with resets at ``starts``
        ``[L, batch]``; returns policy outputs and values flattened to ``[L * batch, ...]``."""
        assert self.core is not None
        steps, batch = obs.shape[:2]
        features = self.encode(obs.reshape(steps * batch, *obs.shape[2:]))
        hidden = self.core.sequence(features.view(steps, batch, -1), state, starts)
        out, values = self.twin(hidden.reshape(steps * batch, -1))
        return out, values.squeeze(-1)

    def act(
        self,
        obs: torch.Tensor,
        generator: torch.Generator,
        *,
        deterministic: bool = False,
        mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
        noise: ColoredNoise | None = None,
    ) -> PolicyStep:
        """Sampled (or greedy) actions with their log-probabilities and values (``noise``: a
        Gaussian policy's colored noise, instead of independent draws)."""
        # forward() directly: nn.Module.__call__'s hook handling costs as much as a small
        # MLP here, once per env step and per gradient step, and no hooks are used.
        out, values, new_state = self.forward(obs, state)
        if deterministic:
            actions, log_probs = self.head.greedy(out, mask=mask, log_std=self.log_std)
        else:
            draw = next_noise(noise, False, out.shape[0], out.device)
            actions, log_probs = self.head.sample(
                out, generator, mask=mask, log_std=self.log_std, noise=draw
            )
        return PolicyStep(actions=actions, log_probs=log_probs, values=values, state=new_state)

    def evaluate(self, mb: Minibatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities and entropies of the minibatch's actions, and values."""
        out, values = self._minibatch_outputs(mb)
        log_probs, entropy = self.head.log_prob_entropy(
            out, mb.actions, mask=mb.masks, log_std=self.log_std
        )
        return log_probs, entropy, values

    def evaluate_log_probs(self, mb: Minibatch) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`evaluate` without the entropies, for a loss without an entropy bonus."""
        out, values = self._minibatch_outputs(mb)
        log_probs = self.head.log_prob(out, mb.actions, mask=mb.masks, log_std=self.log_std)
        return log_probs, values

    def _minibatch_outputs(self, mb: Minibatch) -> tuple[torch.Tensor, torch.Tensor]:
        if mb.states is None:
            out, values, _ = self.forward(mb.obs)
            return out, values
        assert mb.starts is not None
        return self.sequence(mb.obs, mb.states, mb.starts)

    def evaluate_actions(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_probs, entropy, values)`` of given actions for a feed-forward ``[batch, ...]``
        batch of observations."""
        out, values, _ = self.forward(obs)
        log_probs, entropy = self.head.log_prob_entropy(out, actions, log_std=self.log_std)
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
