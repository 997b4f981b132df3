"""How much memory the networks a config asks for need at least, known before any is built.

A typo such as ``--hidden-sizes 100000000`` or ``--lstm-hidden-size 100000`` would otherwise
end in ``MemoryError`` or the kernel's OOM killer after the run has started (or hang the
machine while it swaps). The estimate reads only the settings (the env's spaces are not
known yet), so it is a lower bound: a config it refuses cannot fit, and one it accepts may
still be refused later by the allocation itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

BYTES_PER_PARAMETER = 4 * 4
"""float32 weights, their gradients and Adam's two moment estimates."""


def parameter_lower_bound(settings: Any) -> int:
    """The fewest parameters the networks described by ``settings`` (a config dataclass,
    mapping or list of them, searched recursively) can have.

    Counted: the weights and biases of every ``hidden_sizes`` chain (at least one input and
    one output feature), ``hidden_units`` × ``num_layers`` MLPs, and an LSTM's recurrent
    weights for ``lstm_hidden_size``. One network per setting: an algorithm that builds
    several (actor, critic, target copies) needs a multiple of it.
    """
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    elif isinstance(settings, Mapping):
        values = {str(k): v for k, v in settings.items()}
    elif isinstance(settings, list | tuple):
        return sum(parameter_lower_bound(item) for item in settings)
    else:
        return 0
    total = 0
    sizes = values.get("hidden_sizes")
    if isinstance(sizes, list | tuple) and _ints(sizes):
        total += _mlp(list(sizes))
    width, layers = values.get("hidden_units"), values.get("num_layers")
    if isinstance(width, int) and isinstance(layers, int) and _ints([width, layers]):
        # _mlp([width] * layers), without building the list.
        total += width * width * (layers - 1) + 2 * width + width * layers + 1
    lstm = values.get("lstm_hidden_size")
    if isinstance(lstm, int) and _ints([lstm]):
        total += 4 * lstm * (lstm + 1) + 8 * lstm  # weight_hh, weight_ih (≥ 1 input), biases
    for name, value in values.items():
        if name not in ("hidden_sizes", "hidden_units", "num_layers", "lstm_hidden_size"):
            total += parameter_lower_bound(value)
    return total


def _ints(values: Any) -> bool:
    return isinstance(values, list | tuple) and all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values
    )


def _mlp(sizes: list[int]) -> int:
    """Parameters of an MLP with these hidden layers, one input and one output feature."""
    if not sizes:
        return 0
    between = sum(a * b for a, b in pairwise(sizes))
    return sizes[0] + between + sizes[-1] + sum(sizes) + 1
