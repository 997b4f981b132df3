"""Ways to make a learner's losses or gradients non-finite, for the tests of ``nan_policy``
(see :mod:`rlfleet.nn.optim`), and what to compare before and after."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from rlfleet.nn.optim import NanPolicy


class Owner:
    """The smallest learner a shared optimiser step answers to."""

    def __init__(self, nan_policy: NanPolicy = "raise") -> None:
        self.nan_policy: NanPolicy = nan_policy
        self.skipped_batches = 0

    def step_label(self) -> str:
        return "owner at gradient step 7"


def nan_outputs(modules: Iterable[nn.Module]) -> None:
    """From now on every floating-point tensor that ``modules`` or any of their submodules
    return is NaN, so every loss computed from them is."""
    for module in modules:
        for sub in module.modules():
            sub.register_forward_hook(_nan_output)


def nan_gradients(params: Iterable[torch.Tensor]) -> None:
    """From now on the gradient reaching each of ``params`` (those that require one) is NaN;
    the loss stays finite."""
    for p in (p for p in params if p.requires_grad):
        # A product, not a fresh tensor: TRPO differentiates its KL gradient again.
        p.register_hook(lambda grad: grad * float("nan"))


def optimizer_state(optimizers: Iterable[torch.optim.Optimizer]) -> list[torch.Tensor]:
    """Copies of every tensor in the optimisers' state (moments, step counters)."""
    return [
        value.clone()
        for optimizer in optimizers
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ]


def assert_unchanged(before: list[torch.Tensor], after: list[torch.Tensor], what: str) -> None:
    """Bitwise equal, entry by entry (a NaN that crept in counts as a change)."""
    assert len(before) == len(after), f"{what} gained or lost entries"
    changed = [
        i for i, (a, b) in enumerate(zip(before, after, strict=True)) if not torch.equal(a, b)
    ]
    assert not changed, f"{what} changed (entries {changed})"


def _nan_output(module: nn.Module, inputs: Any, output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output * float("nan") if output.is_floating_point() else output
    if isinstance(output, tuple):
        return tuple(_nan_output(module, inputs, item) for item in output)
    return output
