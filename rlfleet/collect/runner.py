"""The :class:`PolicyRunner`: one batch of envs, raw observations in, policy steps out.

Everything between a vector env and :meth:`rlfleet.algos.base.Algorithm.act` that must be
the same in training, evaluation and play lives here:

- observations go through ``algorithm.preprocess`` (packing, normalisation);
- the action mask is found (``info["action_mask"]`` or the Dict observation key
  ``action_mask``) and checked; a wrong shape, or a sub-action with no legal choice, is an
  :class:`~rlfleet.errors.EnvSpecError` naming the env index and step. Envs on a reset
  step (next-step autoreset: the action is ignored) are exempt, since a finished game may
  have no legal move left, and get an all-true mask;
- a recurrent policy's state is carried from step to step and zeroed for envs whose
  episode starts, i.e. whose previous step was a reset step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from rlfleet.algos.base import Algorithm
from rlfleet.nn.masks import MASK_KEY, check_mask, find_mask
from rlfleet.types import PolicyStep


class RunnerStep(NamedTuple):
    """What the policy saw and did for one vector step (a tuple: built once per step)."""

    obs: torch.Tensor
    """Preprocessed observations (what rollouts store)."""
    step: PolicyStep
    mask: torch.Tensor | None
    """The checked bool action mask, when the env gives one."""
    state: torch.Tensor | None
    """The recurrent state the policy acted on (after episode-start resets)."""


class PolicyRunner:
    """Acts for ``num_envs`` envs step after step, carrying masks and recurrent state."""

    def __init__(self, algorithm: Algorithm[Any], num_envs: int) -> None:
        self.algorithm = algorithm
        self.num_envs = num_envs
        self.steps = 0
        """Vector steps acted so far (named in mask errors)."""
        self.mask_in_obs = algorithm.obs_layout.mask_in_obs
        self.reset()

    def reset(self) -> None:
        """Forget recurrent state: every env starts a new episode."""
        self.state = self.algorithm.initial_state(self.num_envs)
        self._was_reset_step = np.zeros(self.num_envs, dtype=bool)

    def act(
        self,
        obs: Any,
        infos: Mapping[str, Any] | None,
        prev_done: np.ndarray,
        *,
        deterministic: bool = False,
        update_stats: bool = False,
        advance: bool = True,
    ) -> RunnerStep:
        """Act on one vector step's raw observations.

        Args:
            obs / infos: what the vector env's last ``reset`` or ``step`` returned.
            prev_done: per env, whether its previous step ended an episode, which makes
                this step a reset step whose action the env ignores.
            deterministic: greedy instead of sampled actions.
            update_stats: fold the observations into normalisation statistics.
            advance: keep the new recurrent state (false for a look-ahead such as the
                bootstrap value at the end of a rollout).
        """
        algo = self.algorithm
        tensor = algo.preprocess(obs, update_stats=update_stats)
        state = self.state
        mask = (
            self._mask(obs, infos, prev_done)
            if self.mask_in_obs or (infos and MASK_KEY in infos)
            else None
        )
        if mask is None and state is None:
            # The common case, kept to one call: this runs once per env step.
            step = algo.act(tensor, deterministic=deterministic)
        else:
            extra: dict[str, torch.Tensor] = {}
            if mask is not None:
                extra["action_mask"] = mask
            if state is not None:
                if self._was_reset_step.any():
                    keep = torch.from_numpy(~self._was_reset_step).to(state.device, state.dtype)
                    state = state * keep.view(-1, *([1] * (state.dim() - 1)))
                extra["state"] = state
            step = algo.act(tensor, deterministic=deterministic, **extra)
        if advance:
            self.steps += 1
            if state is not None:
                self._was_reset_step = np.array(prev_done, dtype=bool)
                self.state = step.state
        return RunnerStep(tensor, step, mask, state)

    def _mask(
        self, obs: Any, infos: Mapping[str, Any] | None, prev_done: np.ndarray
    ) -> torch.Tensor | None:
        found = self.masks(obs, infos, prev_done, self.steps)
        return None if found is None else found[1]

    def masks(
        self, obs: Any, infos: Mapping[str, Any] | None, prev_done: np.ndarray, step: int
    ) -> tuple[np.ndarray, torch.Tensor] | None:
        """One vector step's action mask, None when the env gives none; else, as the env gave
        it (``[num_envs, mask_size]``, what a replay buffer keeps with the observation) and as
        the policy acts on it (checked, bool, envs on a reset step all true).

        Args:
            obs / infos / prev_done: as for :meth:`act`.
            step: the vector step, named in errors.
        """
        found = find_mask(obs if self.mask_in_obs else None, infos, step)
        if found is None:
            return None
        legal = check_mask(
            found, self.num_envs, self.algorithm.mask_segments, step, exempt=prev_done
        )
        return found, torch.from_numpy(np.ascontiguousarray(legal)).to(self.algorithm.device)
