"""Action masks: where they come from, how they are checked, and how they reach the logits.

An env masks actions by giving a boolean (or 0/1) array either in ``info["action_mask"]``
or as the ``action_mask`` key of a Dict observation. Its layout per env:

- ``Discrete(n)``: ``n`` entries, true where the action is legal;
- ``MultiDiscrete(nvec)``: ``sum(nvec)`` entries, one block per sub-action;
- ``MultiBinary(n)``: ``2 * n`` entries, ``[may be 0, may be 1]`` per bit.

Every block needs at least one legal entry where an action is taken. The helpers here are
shared by every policy that picks discrete actions (the policy-gradient family through
:class:`rlfleet.nn.action_head.ActionHead`, value-based methods through
:func:`masked_argmax`) and by the learning targets of off-policy methods, which bootstrap
from the legal actions of the next state only (:func:`masked_argmax`, :func:`masked_max`,
:func:`apply_mask`). A next state may have no legal action at all (a finished game): the
helpers stay finite on such a row, and its bootstrap is discounted to 0 anyway.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.errors import EnvSpecError

MASK_KEY = "action_mask"
"""The info key, or Dict observation key, an env gives its action mask under."""

MASK_FILL = -1e8
"""What masked logits are set to. Finite on purpose: ``softmax`` gives such an action
probability exactly 0 in float32, and the entropy term ``p * log p`` is ``0 * -1e8 = 0``;
with ``-inf`` it would be ``0 * -inf = NaN`` and poison the loss."""


def mask_segments(space: spaces.Space[Any]) -> tuple[int, ...] | None:
    """Sizes of the blocks of a mask for ``space`` (None: its actions cannot be masked)."""
    if isinstance(space, spaces.Discrete):
        return (int(space.n),)
    if isinstance(space, spaces.MultiDiscrete):
        return tuple(int(n) for n in space.nvec.reshape(-1))
    if isinstance(space, spaces.MultiBinary):
        return (2,) * int(np.prod(space.shape))
    return None


def apply_mask(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``logits`` with illegal entries (``mask`` false) set to :data:`MASK_FILL`.

    The masked entries get no gradient, so the loss cannot push on actions that were
    never available.
    """
    if mask is None:
        return logits
    return logits.masked_fill(~mask, MASK_FILL)


def masked_argmax(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Index of the largest legal entry along the last dim (greedy action of Q-values).

    A row with no legal entry gives index 0 (every entry ties at ``-inf``).
    """
    if mask is None:
        return values.argmax(-1)
    return values.masked_fill(~mask, -torch.inf).argmax(-1)


def masked_max(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The largest legal entry along the last dim (``max_a Q(s, a)`` over legal ``a``).

    Always one of ``values``' own entries, so finite where they are: a row with no legal
    entry gives its first entry rather than ``-inf``.
    """
    if mask is None:
        return values.max(-1).values
    return values.gather(-1, masked_argmax(values, mask).unsqueeze(-1)).squeeze(-1)


def masked_uniform(mask: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A uniformly random legal index per row of a ``[batch, n]`` mask."""
    noise = torch.rand(mask.shape, generator=generator).to(mask.device)
    return masked_argmax(noise, mask)


def find_mask(obs: Any, infos: Mapping[str, Any] | None, step: int) -> np.ndarray | None:
    """The batch's action mask, from a Dict observation or the vector env's infos (or None).

    Raises:
        EnvSpecError: some envs of the batch gave a mask in their info and env ``i`` did not.
    """
    if isinstance(obs, Mapping) and MASK_KEY in obs:
        return np.asarray(obs[MASK_KEY])
    if not infos or MASK_KEY not in infos:
        return None
    present = infos.get(f"_{MASK_KEY}")
    if present is not None and not np.all(present):
        # Vector envs fill the entries of envs that gave no mask with zeros: name the env
        # rather than report an all-false mask.
        env = int(np.flatnonzero(~np.asarray(present))[0])
        raise EnvSpecError(
            f"env index {env} gave no {MASK_KEY!r} in its info at step {step} while other "
            "envs did; an env that masks actions must give a mask every step, reset included"
        )
    return np.asarray(infos[MASK_KEY])


def check_mask(
    mask: np.ndarray,
    num_envs: int,
    segments: Sequence[int] | None,
    step: int,
    exempt: np.ndarray | None = None,
) -> np.ndarray:
    """Validate a ``[num_envs, sum(segments)]`` mask and return it as a bool array.

    Args:
        mask: the mask as the env gave it.
        num_envs: envs in the batch.
        segments: sizes of the blocks that each need a legal entry (see the module
            docstring); None when the action space cannot be masked.
        step: env step of the batch, for the error message.
        exempt: envs whose action is ignored this step (a next-step-autoreset reset step,
            whose observation may be a finished game with no legal move): their rows become
            all true.

    Raises:
        EnvSpecError: the action space has no masks, the shape is wrong, or a block has no
            legal action; the message names the env index and the step.
    """
    if segments is None:
        raise EnvSpecError(
            f"the env gives an {MASK_KEY!r} at step {step}, but masks apply to Discrete, "
            "MultiDiscrete and MultiBinary actions only"
        )
    width = int(sum(segments))
    if mask.shape != (num_envs, width):
        # A vector env stacks equal shapes only, so every env's mask has this wrong shape.
        raise EnvSpecError(
            f"{MASK_KEY} of env index 0 at step {step}: expected {width} entries "
            f"(shape (num_envs={num_envs}, {width}) for the batch), got shape {mask.shape}"
        )
    legal = mask.astype(bool, copy=False)
    if exempt is not None and exempt.any():
        legal = legal.copy()
        legal[exempt] = True
    offsets = np.cumsum([0, *segments[:-1]])
    has_legal = np.logical_or.reduceat(legal, offsets, axis=1)
    if not has_legal.all():
        env, block = (int(i) for i in np.argwhere(~has_legal)[0])
        where = f" (block {block} of {len(segments)})" if len(segments) > 1 else ""
        raise EnvSpecError(
            f"{MASK_KEY} of env index {env} at step {step} allows no action{where}; "
            "every state needs at least one legal action"
        )
    return legal
