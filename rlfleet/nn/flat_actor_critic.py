"""An actor and a critic over flat observations, with the policy maths as plain methods.

The actor-learner algorithms (IMPALA, APPO) share it: an actor copy samples actions with
:meth:`ActorCritic.act`, the learner re-evaluates a whole rollout (and the observation after
it) in one forward pass with :meth:`ActorCritic.evaluate_rollout`. Both heads run as one
batched matmul (:class:`~rlfleet.nn.twin.TwinMLP`); Discrete actions get a categorical
policy, Box actions a diagonal Gaussian with a state-independent log standard deviation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rlfleet.nn import distributions as D
from rlfleet.nn.mlp import Activation, flat_size, flatten_obs
from rlfleet.nn.twin import TwinMLP
from rlfleet.types import PolicyStep


class FlatActorCritic(nn.Module):
    """Policy logits (or Gaussian means) and a state value from one observation batch.

    Args:
        obs_shape: shape of one observation (flattened before the first layer).
        action_dim: number of discrete actions, or the flat size of a Box action.
        action_shape: shape of one Box action (``()`` for Discrete).
        continuous: Gaussian policy for Box actions instead of a categorical one.
        hidden_sizes / activation: of both MLPs.
        log_std_init: initial log standard deviation of the Gaussian policy.
    """

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        action_dim: int,
        action_shape: tuple[int, ...],
        continuous: bool,
        hidden_sizes: Sequence[int],
        activation: Activation,
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.obs_ndim = len(obs_shape)
        self.action_shape = action_shape
        self.twin = TwinMLP(flat_size(obs_shape), hidden_sizes, (action_dim, 1), activation)
        self.log_std = nn.Parameter(torch.full((action_dim,), log_std_init)) if continuous else None

    def act(
        self, obs: torch.Tensor, generator: torch.Generator, *, deterministic: bool = False
    ) -> PolicyStep:
        """Actions, their log-probabilities and the state values for ``[batch, *obs_shape]``."""
        out, values = self.twin(flatten_obs(obs, self.obs_ndim))
        if self.log_std is None:
            actions, log_probs = (
                D.categorical_greedy(out) if deterministic else D.categorical_sample(out, generator)
            )
        else:
            actions = out if deterministic else D.gaussian_sample(out, self.log_std, generator)
            log_probs, _ = D.gaussian_log_prob_entropy(out, self.log_std, actions)
            actions = actions.reshape(*actions.shape[:-1], *self.action_shape)
        return PolicyStep(actions=actions, log_probs=log_probs, values=values.squeeze(-1))

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_probs, entropy, values)`` of given actions for ``[batch, *obs_shape]``."""
        out, values = self.twin(flatten_obs(obs, self.obs_ndim))
        if self.log_std is None:
            log_probs, entropy = D.categorical_log_prob_entropy(out, actions)
        else:
            flat_actions = actions.reshape(actions.shape[0], -1)
            log_probs, entropy = D.gaussian_log_prob_entropy(out, self.log_std, flat_actions)
        return log_probs, entropy, values.squeeze(-1)

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
        log_probs, entropy, values = self.evaluate(flat_obs, flat_actions)
        n = steps * envs
        all_values = values.reshape(steps + 1, envs)
        return (
            log_probs[:n].reshape(steps, envs),
            entropy[:n].reshape(steps, envs),
            all_values[:steps],
            all_values[1:],
        )
