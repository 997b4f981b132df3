"""Convolutional torsos for image observations.

All take float ``[batch, channels, height, width]`` input in [0, 1] and return features;
:class:`rlfleet.nn.encoders.ImageEncoder` does the uint8 -> float conversion once per
batch. Everything runs in channels-last memory format (weights, and the input the encoder
hands over): oneDNN's convolutions are faster with it on a CPU and it changes no result.
The last feature map is flattened in its channels-last (``H, W, C``) order, which is
free, instead of ``C, H, W``, which would copy it forwards and backwards; the dense layer
after it just learns its weights in that order. Together, about 1.3x faster training steps
of the Nature network at batch 256 on one thread than the default layout (measured).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from rlfleet.errors import EnvSpecError

CnnKind = Literal["nature", "impala", "minatar"]


def _ortho(module: nn.Sequential, gain: float = math.sqrt(2)) -> nn.Sequential:
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear):
            nn.init.orthogonal_(layer.weight, gain)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    return module


def _conv_out(size: int, kernel: int, stride: int, padding: int = 0) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _flatten_channels_last(x: torch.Tensor) -> torch.Tensor:
    """``[batch, C, H, W]`` -> ``[batch, H * W * C]``: a view for a channels-last tensor."""
    return x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)


class NatureCNN(nn.Module):
    """The DQN Nature paper's network (Mnih et al. 2015): three convolutions and a 512-unit
    dense layer, orthogonally initialised as in Stable-Baselines3 and CleanRL."""

    def __init__(self, channels: int, height: int, width: int, features: int = 512) -> None:
        super().__init__()
        h, w = height, width
        for kernel, stride in ((8, 4), (4, 2), (3, 1)):
            h, w = _conv_out(h, kernel, stride), _conv_out(w, kernel, stride)
        if h < 1 or w < 1:
            raise EnvSpecError(
                f"images of {height}x{width} are too small for the Nature CNN (it needs at "
                "least 36x36); set cnn: minatar (small grids such as MinAtar's) or cnn: impala, "
                "which take images of any size"
            )
        self.convs = _ortho(
            nn.Sequential(
                # In place: a convolution's backward needs its input, not its output.
                nn.Conv2d(channels, 32, 8, 4),
                nn.ReLU(inplace=True),
                nn.Conv2d(32, 64, 4, 2),
                nn.ReLU(inplace=True),
                nn.Conv2d(64, 64, 3, 1),
                nn.ReLU(inplace=True),
            )
        )
        self.convs.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.dense = _ortho(nn.Sequential(nn.Linear(64 * h * w, features), nn.ReLU()))
        self.out_features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dense(_flatten_channels_last(self.convs(x)))
        return out


class _Residual(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.conv1(torch.relu(self.conv0(torch.relu(x))))
        return out


class ImpalaCNN(nn.Module):
    """IMPALA's residual network (Espeholt et al. 2018, arXiv:1802.01561): per stage a
    convolution, a 3x3 max-pool of stride 2 and two residual blocks; stages of 16, 32 and
    32 channels, then a 256-unit dense layer."""

    def __init__(
        self,
        channels: int,
        height: int,
        width: int,
        features: int = 256,
        stages: tuple[int, ...] = (16, 32, 32),
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        h, w, c = height, width, channels
        for out in stages:
            layers += [
                nn.Conv2d(c, out, 3, padding=1),
                nn.MaxPool2d(3, 2, padding=1),
                _Residual(out),
                _Residual(out),
            ]
            h, w, c = _conv_out(h, 3, 2, 1), _conv_out(w, 3, 2, 1), out
        layers.append(nn.ReLU())
        self.convs = _ortho(nn.Sequential(*layers))
        self.convs.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.dense = _ortho(nn.Sequential(nn.Linear(c * h * w, features), nn.ReLU()))
        self.out_features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dense(_flatten_channels_last(self.convs(x)))
        return out


class MinAtarCNN(nn.Module):
    """The MinAtar paper's network (Young and Tian 2019, arXiv:1903.03176): one 3x3
    convolution of 16 channels with stride 1 and a 128-unit dense layer, for small grids."""

    def __init__(self, channels: int, height: int, width: int, features: int = 128) -> None:
        super().__init__()
        h, w = _conv_out(height, 3, 1), _conv_out(width, 3, 1)
        if h < 1 or w < 1:
            raise EnvSpecError(
                f"images of {height}x{width} are too small for the MinAtar CNN (it needs at "
                "least 3x3)"
            )
        self.convs = _ortho(nn.Sequential(nn.Conv2d(channels, 16, 3, 1), nn.ReLU(inplace=True)))
        self.convs.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.dense = _ortho(nn.Sequential(nn.Linear(16 * h * w, features), nn.ReLU()))
        self.out_features = features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dense(_flatten_channels_last(self.convs(x)))
        return out


def make_cnn(
    kind: CnnKind, channels: int, height: int, width: int
) -> NatureCNN | ImpalaCNN | MinAtarCNN:
    """The named CNN for images of this shape."""
    if kind == "minatar":
        return MinAtarCNN(channels, height, width)
    if kind == "impala":
        return ImpalaCNN(channels, height, width)
    return NatureCNN(channels, height, width)
