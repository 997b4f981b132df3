"""Minibatches of an on-policy rollout, for feed-forward and recurrent policies.

:func:`rollout_minibatches` cuts a :class:`~rlfleet.data.rollout.RolloutStorage` and its
advantages and returns into shuffled :class:`Minibatch` es, one pass per
:meth:`~RolloutMinibatches.epoch` call:

- feed-forward policies get single steps, shuffled (not shuffled when one minibatch holds
  the whole rollout: the loss is a mean, so the order cannot matter);
- recurrent policies get whole sequences of one env, replayed from the state stored at
  their first step (see :class:`SequenceMinibatches`).

The rollout is moved to the network's device once per update (nothing moves on the CPU);
the shuffles are drawn on the CPU from the algorithm's generator, so a seed gives the same
minibatches on every device.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Protocol

import torch

from rlfleet.data.rollout import RolloutStorage
from rlfleet.types import Minibatch


class RolloutMinibatches(Protocol):
    """What :func:`rollout_minibatches` returns: a rollout, cut anew on every epoch."""

    def epoch(self) -> Iterator[Minibatch]:
        """One pass over the rollout in shuffled minibatches."""
        ...


def rollout_minibatches(
    batch: RolloutStorage,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    batch_size: int,
    generator: torch.Generator,
    sequence_length: int | None = None,
    device: torch.device | None = None,
) -> RolloutMinibatches:
    """Minibatches of about ``batch_size`` env steps on ``device`` (None: the rollout's):
    single steps, or sequences of ``sequence_length`` steps when the rollout stored
    recurrent states."""
    device = device or batch.obs.device
    if batch.states is None:
        return StepMinibatches(batch, advantages, returns, batch_size, generator, device)
    return SequenceMinibatches(
        batch, advantages, returns, batch_size, generator, sequence_length, device
    )


class StepMinibatches:
    """Shuffled minibatches of single steps (no shuffle when one minibatch holds them all)."""

    def __init__(
        self,
        batch: RolloutStorage,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        batch_size: int,
        generator: torch.Generator,
        device: torch.device,
    ) -> None:
        n = batch.num_steps * batch.num_envs
        self.n, self.batch_size, self.generator = n, batch_size, generator
        self.device = device
        self.obs = batch.obs.reshape(n, *batch.obs.shape[2:]).to(device)
        self.masks = None if batch.masks is None else batch.masks.reshape(n, -1).to(device)
        self.flat = [
            t.to(device)
            for t in (
                batch.actions.reshape(n, *batch.actions.shape[2:]),
                batch.log_probs.reshape(n),
                batch.values.reshape(n),
                advantages.reshape(n),
                returns.reshape(n),
                batch.valid.reshape(n),
            )
        ]

    def epoch(self) -> Iterator[Minibatch]:
        order = (
            torch.randperm(self.n, generator=self.generator) if self.batch_size < self.n else None
        )
        if order is None:
            yield _minibatch(self.obs, self.masks, self.flat)
            return
        order = order.to(self.device)
        for start in range(0, self.n, self.batch_size):
            idx = order[start : start + self.batch_size]
            # index_select copies whole rows: ~9x faster than advanced indexing for a batch
            # of uint8 images.
            masks = None if self.masks is None else self.masks.index_select(0, idx)
            flat = [t.index_select(0, idx) for t in self.flat]
            yield _minibatch(self.obs.index_select(0, idx), masks, flat)


class SequenceMinibatches:
    """Shuffled minibatches of whole sequences of ``sequence_length`` steps of one env.

    A ``[T, N]`` rollout is cut into ``T / L`` chunks per env: ``T / L * N`` sequences of
    ``L`` steps, each replayed from the recurrent state stored at its first step. A rollout
    whose length ``L`` does not divide (collection by episode count) is one sequence per env.
    """

    def __init__(
        self,
        batch: RolloutStorage,
        advantages: torch.Tensor,
        returns: torch.Tensor,
        batch_size: int,
        generator: torch.Generator,
        sequence_length: int | None,
        device: torch.device,
    ) -> None:
        assert batch.states is not None
        steps = batch.num_steps
        length = sequence_length or steps
        if steps % length:
            length = steps
        chunks = steps // length
        self.num_sequences = chunks * batch.num_envs
        self.per_batch = max(1, batch_size // length)
        self.generator = generator
        self.device = device

        def arrange(x: torch.Tensor) -> torch.Tensor:
            """[T, N, ...] -> [L, chunks * N, ...], sequence-major, on ``device``."""
            x = x.reshape(chunks, length, batch.num_envs, *x.shape[2:]).transpose(0, 1)
            return x.reshape(length, self.num_sequences, *x.shape[3:]).to(device)

        self.obs = arrange(batch.obs)
        self.masks = None if batch.masks is None else arrange(batch.masks)
        self.states = arrange(batch.states)[0]
        self.starts = arrange(batch.episode_starts())
        self.flat = [
            arrange(t)
            for t in (
                batch.actions,
                batch.log_probs,
                batch.values,
                advantages,
                returns,
                batch.valid,
            )
        ]

    def epoch(self) -> Iterator[Minibatch]:
        order = torch.randperm(self.num_sequences, generator=self.generator).to(self.device)
        for start in range(0, self.num_sequences, self.per_batch):
            idx = order[start : start + self.per_batch]
            masks = None if self.masks is None else _flat_steps(self.masks.index_select(1, idx))
            flat = [_flat_steps(t.index_select(1, idx)) for t in self.flat]
            mb = _minibatch(self.obs.index_select(1, idx), masks, flat)
            yield replace(
                mb, states=self.states.index_select(0, idx), starts=self.starts.index_select(1, idx)
            )


def _flat_steps(x: torch.Tensor) -> torch.Tensor:
    """[L, sequences, ...] -> [L * sequences, ...]."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _minibatch(
    obs: torch.Tensor, masks: torch.Tensor | None, flat: list[torch.Tensor]
) -> Minibatch:
    actions, log_probs, values, advantages, returns, valid = flat
    weights = valid / valid.sum().clamp(min=1.0)
    return Minibatch(obs, actions, log_probs, values, advantages, returns, weights, masks)
