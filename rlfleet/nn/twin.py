"""Two MLPs of the same hidden shape evaluated as one batched matmul.

An actor and a critic with separate weights (no sharing, as in the PPO reference
implementation) but one ``baddbmm`` per layer for both: half the kernel launches and
autograd nodes of two ``nn.Sequential`` stacks, which is what dominates the cost of
small networks on a CPU.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

from rlfleet.nn.mlp import Activation

_ACTIVATIONS = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "elu": nn.functional.elu,
    "gelu": nn.functional.gelu,
    "silu": nn.functional.silu,
}


class TwinMLP(nn.Module):
    """``first`` and ``second`` MLPs: ``in_features -> hidden_sizes -> out_features[i]``.

    Layer weights are stored as ``[2, fan_in, fan_out]``; the narrower output head is
    padded, and its padding columns are never read, so they get no gradient and never change.
    Initialisation matches two separate orthogonally initialised MLPs: hidden layers with
    gain sqrt(2), output layers with ``output_gains``; with ``ortho_init=False`` it matches
    two stacks of ``nn.Linear`` with PyTorch's default init instead (as Stable-Baselines3's
    SAC/TD3 critics use), and ``output_gains`` is ignored.
    """

    def __init__(
        self,
        in_features: int,
        hidden_sizes: Sequence[int],
        out_features: tuple[int, int],
        activation: Activation = "tanh",
        output_gains: tuple[float, float] = (0.01, 1.0),
        *,
        ortho_init: bool = True,
    ) -> None:
        super().__init__()
        self.out_features = out_features
        self.activation = _ACTIVATIONS[activation]
        sizes = [in_features, *hidden_sizes, max(out_features)]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        last = len(sizes) - 2
        for layer, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes)):
            weight = torch.zeros(2, fan_in, fan_out)
            bias = torch.zeros(2, 1, fan_out)
            for net in range(2):
                width = out_features[net] if layer == last else fan_out
                block = torch.empty(width, fan_in)
                if ortho_init:
                    gain = output_gains[net] if layer == last else math.sqrt(2)
                    nn.init.orthogonal_(block, gain)
                else:
                    nn.init.kaiming_uniform_(block, a=math.sqrt(5))
                    bound = 1.0 / math.sqrt(fan_in)
                    nn.init.uniform_(bias[net, :, :width], -bound, bound)
                weight[net, :, :width] = block.t()
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(bias))
        # The same Parameter objects in a plain list: iterating a ParameterList goes through
        # its string-keyed __getitem__, a measurable share of a small network's forward.
        # (Module.to and load_state_dict update parameters in place, so the list stays valid.)
        self._layers = list(zip(self.weights, self.biases, strict=True))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[batch, in] -> ([batch, out[0]], [batch, out[1]])``."""
        h = x.unsqueeze(0).expand(2, *x.shape)
        last = len(self._layers) - 1
        for layer, (weight, bias) in enumerate(self._layers):
            h = torch.baddbmm(bias, h, weight)
            if layer < last:
                h = self.activation(h)
        return h[0, :, : self.out_features[0]], h[1, :, : self.out_features[1]]

    def forward_latent(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`forward`, and the first MLP's last hidden features ``[batch, width]`` (the
        input itself when there are no hidden layers): what a gSDE policy's noise reads."""
        h = x.unsqueeze(0).expand(2, *x.shape)
        last = len(self._layers) - 1
        latent = x
        for layer, (weight, bias) in enumerate(self._layers):
            if layer == last:
                latent = h[0]
            h = torch.baddbmm(bias, h, weight)
            if layer < last:
                h = self.activation(h)
        return h[0, :, : self.out_features[0]], h[1, :, : self.out_features[1]], latent
