"""How a policy network's output row becomes actions of a given action space.

One :class:`ActionHead` per action space, shared by the policy-gradient algorithms:

=====================  ===========================  =================================
action space           network output per env       distribution
=====================  ===========================  =================================
``Discrete(n)``        ``n`` logits                 categorical
``MultiDiscrete(nv)``  ``sum(nv)`` logits           one categorical per sub-action
``MultiBinary(n)``     ``n`` logits                 independent Bernoulli bits
``Box(shape)``         ``prod(shape)`` means        diagonal Gaussian (``log_std``
                                                    is a separate parameter)
=====================  ===========================  =================================

Log-probabilities and entropies are summed over sub-actions, so a MultiDiscrete or
MultiBinary action is one joint action to the loss. Actions are kept in the policy's own
representation (0-based indices, float bits, unclipped Gaussian samples in the Box's shape)
and converted for the env by :func:`env_actions`. Masks (see :mod:`rlfleet.nn.masks`) apply
to every head but the Gaussian.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.errors import EnvSpecError
from rlfleet.nn import distributions as D
from rlfleet.nn.masks import MASK_FILL, apply_mask, mask_segments

HeadKind = Literal["categorical", "multi_categorical", "bernoulli", "gaussian"]


def stored_action_spec(space: spaces.Space[Any]) -> tuple[tuple[int, ...], torch.dtype]:
    """Per-env shape and dtype of an action as rollouts store it."""
    if isinstance(space, spaces.Discrete):
        return (), torch.int64
    if isinstance(space, spaces.MultiDiscrete):
        return (int(space.nvec.size),), torch.int64
    if isinstance(space, spaces.MultiBinary):
        return (math.prod(space.shape),), torch.float32
    if isinstance(space, spaces.Box):
        return tuple(space.shape), torch.float32
    raise EnvSpecError(f"no action representation for {type(space).__name__} spaces")


def env_actions(space: spaces.Space[Any], actions: torch.Tensor) -> np.ndarray:
    """Policy actions ``[batch, ...]`` as the env takes them: Box actions clipped to the
    bounds, indices shifted by the space's ``start``, shapes and dtypes of the space."""
    array: np.ndarray = actions.detach().cpu().numpy()
    batch = array.shape[0]
    if isinstance(space, spaces.Box):
        clipped: np.ndarray = np.clip(array.reshape(batch, *space.shape), space.low, space.high)
        return clipped.astype(space.dtype, copy=False)
    if isinstance(space, spaces.Discrete):
        shifted = array if int(space.start) == 0 else array + int(space.start)
        return shifted.astype(space.dtype, copy=False)
    if isinstance(space, spaces.MultiDiscrete):
        shifted = array.reshape(batch, *space.shape) + space.start
        return shifted.astype(space.dtype, copy=False)
    if isinstance(space, spaces.MultiBinary):
        bits: np.ndarray = array.reshape(batch, *space.shape).astype(space.dtype, copy=False)
        return bits
    return array


class ActionHead:
    """Sampling, greedy actions, log-probabilities and entropies for one action space.

    ``log_std`` is only read by the Gaussian head; ``mask`` (bool, ``[batch,
    mask_size]``) only by the others.
    """

    def __init__(self, space: spaces.Space[Any]) -> None:
        self.space = space
        self.kind: HeadKind
        self.mask_segments = mask_segments(space)
        """Sizes of the mask blocks that each need a legal entry (None: cannot be masked)."""
        if isinstance(space, spaces.Discrete):
            self.kind = "categorical"
            self.num_outputs = int(space.n)
        elif isinstance(space, spaces.MultiDiscrete):
            self.kind = "multi_categorical"
            nvec = [int(n) for n in space.nvec.reshape(-1)]
            self.num_outputs = sum(nvec)
            self._num_sub = len(nvec)
            self._width = max(nvec)
            # Sub-actions of different sizes are laid out in a [num_sub, width] grid whose
            # spare cells hold MASK_FILL: one batched softmax for all sub-actions, no loop.
            self._pad_index: torch.Tensor | None = (
                None
                if len(set(nvec)) == 1
                else torch.tensor(
                    [i * self._width + j for i, n in enumerate(nvec) for j in range(n)]
                )
            )
        elif isinstance(space, spaces.MultiBinary):
            self.kind = "bernoulli"
            self.num_outputs = math.prod(space.shape)
        elif isinstance(space, spaces.Box):
            self.kind = "gaussian"
            self.num_outputs = math.prod(space.shape)
            # Means come flat from the network; a Box of rank other than 1 gets its shape back.
            self._box_shape: tuple[int, ...] | None = (
                None if len(space.shape) == 1 else tuple(space.shape)
            )
        else:
            raise EnvSpecError(f"no action head for {type(space).__name__} spaces")

    @property
    def mask_size(self) -> int | None:
        """Entries of one env's mask (None: masks do not apply)."""
        return None if self.mask_segments is None else sum(self.mask_segments)

    # ------------------------------------------------------------------ public
    def sample(
        self,
        out: torch.Tensor,
        generator: torch.Generator | None,
        *,
        mask: torch.Tensor | None = None,
        log_std: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled actions and their log-probabilities (``noise``: a Gaussian head's
        standard-normal draw, instead of a fresh one from ``generator``)."""
        if self.kind == "categorical":
            return D.categorical_sample(apply_mask(out, mask), generator)
        if self.kind == "multi_categorical":
            actions, log_p = D.categorical_sample(self._grid(out, mask), generator)
            return actions, log_p.sum(-1)
        if self.kind == "bernoulli":
            return D.bernoulli_sample(self._bernoulli_logits(out, mask), generator)
        assert log_std is not None
        actions = D.gaussian_sample(out, log_std, generator, noise)
        return self._shaped(actions), D.gaussian_log_prob_entropy(out, log_std, actions)[0]

    def shifted(
        self, out: torch.Tensor, shift: torch.Tensor, log_std: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A Gaussian head's means moved by ``shift`` (a gSDE policy's state-dependent noise,
        :mod:`rlfleet.nn.sde`), and their log-probabilities under ``log_std``."""
        actions = out + shift
        return self._shaped(actions), D.gaussian_log_prob_entropy(out, log_std, actions)[0]

    def greedy(
        self,
        out: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        log_std: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The most likely actions (the Gaussian mean) and their log-probabilities."""
        if self.kind == "categorical":
            return D.categorical_greedy(apply_mask(out, mask))
        if self.kind == "multi_categorical":
            actions, log_p = D.categorical_greedy(self._grid(out, mask))
            return actions, log_p.sum(-1)
        if self.kind == "bernoulli":
            return D.bernoulli_greedy(self._bernoulli_logits(out, mask))
        assert log_std is not None
        return self._shaped(out), D.gaussian_log_prob_entropy(out, log_std, out)[0]

    def log_prob_entropy(
        self,
        out: torch.Tensor,
        actions: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        log_std: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``actions`` and entropies (over legal actions only)."""
        if self.kind == "categorical":
            return D.categorical_log_prob_entropy(apply_mask(out, mask), actions)
        if self.kind == "multi_categorical":
            log_p, entropy = D.categorical_log_prob_entropy(self._grid(out, mask), actions)
            return log_p.sum(-1), entropy.sum(-1)
        if self.kind == "bernoulli":
            return D.bernoulli_log_prob_entropy(self._bernoulli_logits(out, mask), actions)
        assert log_std is not None
        return D.gaussian_log_prob_entropy(out, log_std, actions.reshape(out.shape))

    def log_prob(
        self,
        out: torch.Tensor,
        actions: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        log_std: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The log-probabilities of :meth:`log_prob_entropy`, the same numbers, without
        computing the entropies."""
        if self.kind == "categorical":
            return D.categorical_log_prob(apply_mask(out, mask), actions)
        if self.kind == "multi_categorical":
            return D.categorical_log_prob(self._grid(out, mask), actions).sum(-1)
        return self.log_prob_entropy(out, actions, mask=mask, log_std=log_std)[0]

    def kl(
        self,
        old: torch.Tensor,
        new: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        old_log_std: torch.Tensor | None = None,
        new_log_std: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``KL(old || new)`` per row, between the distributions of two output batches."""
        if self.kind == "categorical":
            return D.categorical_kl(apply_mask(old, mask), apply_mask(new, mask))
        if self.kind == "multi_categorical":
            return D.categorical_kl(self._grid(old, mask), self._grid(new, mask)).sum(-1)
        if self.kind == "bernoulli":
            old, new = self._bernoulli_logits(old, mask), self._bernoulli_logits(new, mask)
            return D.bernoulli_kl(old, new)
        assert old_log_std is not None
        assert new_log_std is not None
        return D.gaussian_kl(old, old_log_std, new, new_log_std)

    # --------------------------------------------------------------- internals
    def _shaped(self, actions: torch.Tensor) -> torch.Tensor:
        """Flat Gaussian actions ``[batch, prod(shape)]`` as ``[batch, *shape]``."""
        if self._box_shape is None:
            return actions
        return actions.reshape(*actions.shape[:-1], *self._box_shape)

    def _grid(self, out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """MultiDiscrete logits ``[batch, sum(nvec)]`` as a masked ``[batch, num_sub, width]``."""
        batch = out.shape[0]
        if self._pad_index is None:
            return apply_mask(out, mask).view(batch, self._num_sub, self._width)
        grid = out.new_full((batch, self._num_sub * self._width), MASK_FILL)
        grid = grid.index_copy(1, self._pad_index.to(out.device), apply_mask(out, mask))
        return grid.view(batch, self._num_sub, self._width)

    @staticmethod
    def _bernoulli_logits(out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Force masked bits: only-0 allowed -> logit -inf-like, only-1 allowed -> +inf-like."""
        if mask is None:
            return out
        pairs = mask.view(*out.shape, 2)
        out = out.masked_fill(~pairs[..., 1], MASK_FILL)
        return out.masked_fill(~pairs[..., 0], -MASK_FILL)
