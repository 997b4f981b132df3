"""Multi-layer perceptrons with orthogonal initialisation."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import nn

Activation = Literal["tanh", "relu", "elu", "gelu", "silu"]
_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
}


def mlp(
    in_features: int,
    hidden_sizes: Sequence[int],
    out_features: int,
    activation: Activation = "tanh",
    *,
    output_gain: float = 1.0,
    ortho_init: bool = True,
    activate_output: bool = False,
) -> nn.Sequential:
    """``Linear -> act -> ... -> Linear`` (``-> act`` too with ``activate_output``, for a
    feature trunk that heads build on).

    With ``ortho_init`` hidden layers get orthogonal weights with gain sqrt(2) and the output
    layer ``output_gain`` (0.01 for a policy head, 1 for a value head), as in the PPO
    implementation details study (Huang et al. 2022, ICLR blog track): a near-uniform
    initial policy and well-scaled value predictions.
    """
    layers: list[nn.Module] = []
    sizes = [in_features, *hidden_sizes]
    for fan_in, fan_out in itertools.pairwise(sizes):
        layers += [_linear(fan_in, fan_out, math.sqrt(2), ortho_init), _ACTIVATIONS[activation]()]
    layers.append(_linear(sizes[-1], out_features, output_gain, ortho_init))
    if activate_output:
        layers.append(_ACTIVATIONS[activation]())
    return nn.Sequential(*layers)


def _linear(fan_in: int, fan_out: int, gain: float, ortho_init: bool) -> nn.Linear:
    layer = nn.Linear(fan_in, fan_out)
    if ortho_init:
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


def flat_size(shape: Sequence[int]) -> int:
    """Number of features of a flattened observation of this shape."""
    return int(math.prod(shape))


def flatten_obs(obs: torch.Tensor, obs_ndim: int) -> torch.Tensor:
    """Flatten the observation dims of a ``[batch, *obs_shape]`` tensor to ``[batch, features]``."""
    if obs_ndim == 1:
        return obs
    return obs.reshape(*obs.shape[: obs.dim() - obs_ndim], -1)
