"""Observation encoders: stored observation rows (see :class:`rlfleet.nn.obs.ObsLayout`) to
feature vectors.

:func:`make_encoder` is the one factory every algorithm calls: vector and image-free
packed observations pass through flattened (the MLP after them does the work), images and
binary grids (:func:`rlfleet.nn.obs.is_binary_grid_space`, MinAtar's frames) go through a
CNN, packed rows with images through one CNN per image plus the float features.
Each encoder has ``out_features``.

A custom network takes the encoder's place through an :data:`EncoderFactory` (see
``docs/custom-networks.md``): called with the :class:`~rlfleet.nn.obs.ObsLayout`, it returns a
``torch.nn.Module`` that maps a ``[batch, *layout.shape]`` tensor of ``layout.dtype`` (float32
vectors, uint8 images or packed rows) to ``[batch, out_features]`` float32 features, and has
an int attribute ``out_features``. The algorithm's heads are built on top of it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from rlfleet.errors import ConfigError
from rlfleet.nn.cnn import CnnKind, make_cnn
from rlfleet.nn.mlp import flat_size, flatten_obs
from rlfleet.nn.obs import ObsLayout, channels_first, grid_channels_first, is_binary_grid_space
from rlfleet.nn.precision import bf16_products_active

_SCALE = 1.0 / 255.0


class FlatEncoder(nn.Module):
    """``[batch, *shape]`` floats -> ``[batch, prod(shape)]``; no parameters."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.ndim = len(shape)
        self.out_features = flat_size(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return flatten_obs(x, self.ndim)


class ImageEncoder(nn.Module):
    """uint8 images ``[batch, C, H, W]`` or ``[batch, H, W, C]`` -> CNN features."""

    def __init__(self, shape: tuple[int, ...], cnn: CnnKind) -> None:
        super().__init__()
        self.shape = shape
        self.channels_first = channels_first(shape)
        c, h, w = shape if self.channels_first else (shape[2], shape[0], shape[1])
        self.cnn = make_cnn(cnn, c, h, w)
        self.out_features = self.cnn.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        images = x.reshape(x.shape[0], *self.shape)
        if self.channels_first:
            # Reorder the uint8 bytes, a quarter of the floats' size, for the channels-last
            # CNN (see rlfleet.nn.cnn).
            images = images.contiguous(memory_format=torch.channels_last)
        else:
            # A permuted HWC batch already has channels-last strides: no copy.
            images = images.permute(0, 3, 1, 2)
        # uint8 times a Python float promotes to float32 (keeping the layout): conversion
        # and scaling in one pass. Under precision: bf16 the first convolution reads bf16:
        # bytes are exact in bf16, and scaling there rounds each to the bf16 value of the
        # fp32 scaling, so one pass over half the bytes gives it the same input.
        bf16 = bf16_products_active()
        scaled = (images.to(torch.bfloat16) if bf16 else images) * _SCALE
        out: torch.Tensor = self.cnn(scaled)
        return out


class GridEncoder(nn.Module):
    """Binary grids stored as float32 0/1 ``[batch, H, W, C]`` (or ``[batch, C, H, W]``, see
    :func:`rlfleet.nn.obs.grid_channels_first`) -> CNN features; no scaling."""

    def __init__(self, shape: tuple[int, ...], cnn: CnnKind) -> None:
        super().__init__()
        self.shape = shape
        self.channels_first = grid_channels_first(shape)
        c, h, w = shape if self.channels_first else (shape[2], shape[0], shape[1])
        self.cnn = make_cnn(cnn, c, h, w)
        self.out_features = self.cnn.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grids = x.reshape(x.shape[0], *self.shape)
        if self.channels_first:
            grids = grids.contiguous(memory_format=torch.channels_last)
        else:
            grids = grids.permute(0, 3, 1, 2)
        out: torch.Tensor = self.cnn(grids)
        return out


class MixedEncoder(nn.Module):
    """Packed uint8 rows: float features (bit-cast in the first bytes) + one CNN per image."""

    def __init__(self, layout: ObsLayout, cnn: CnnKind) -> None:
        super().__init__()
        self.num_float_bytes = layout.num_floats * 4
        encoders = [
            ImageEncoder(tuple(leaf.space.shape or ()), cnn) for leaf in layout.image_leaves
        ]
        self.images = nn.ModuleList(encoders)
        self.slices = [(leaf.offset, leaf.offset + leaf.size) for leaf in layout.image_leaves]
        self.out_features = layout.num_floats + sum(e.out_features for e in encoders)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = []
        if self.num_float_bytes:
            float_bytes = x[:, : self.num_float_bytes]
            # ONNX has no bit-cast before opset 26 (and the tracer fails on a dtype view):
            # an exported graph decodes the bytes with arithmetic, to the same bits.
            exporting = torch.onnx.is_in_onnx_export()
            parts.append(
                float32_from_bytes(float_bytes) if exporting else float_bytes.view(torch.float32)
            )
        for encoder, (start, stop) in zip(self.images, self.slices, strict=True):
            parts.append(encoder(x[:, start:stop]))
        return torch.cat(parts, dim=-1)


def float32_from_bytes(x: torch.Tensor) -> torch.Tensor:
    """``[batch, 4 * k]`` uint8, each 4 bytes a little-endian IEEE-754 float32, to the
    ``[batch, k]`` float32 values they hold, by arithmetic: what ``x.view(torch.float32)``
    gives (same bits, signed zeros, subnormals, infinities; any NaN stays a NaN) in ops that
    ONNX's opset 17 has. Sign, exponent and mantissa are cut from the bytes with integer
    division and remainder; a normal number is ``(1 + mantissa / 2**23) * 2**(exponent -
    127)``, each factor and the product exact in float32."""
    b0, b1, b2, b3 = x.reshape(x.shape[0], -1, 4).to(torch.int32).unbind(-1)
    sign = 1.0 - 2.0 * torch.div(b3, 128, rounding_mode="floor").to(torch.float32)
    exponent = torch.remainder(b3, 128) * 2 + torch.div(b2, 128, rounding_mode="floor")
    mantissa = (torch.remainder(b2, 128) * 65536 + b1 * 256 + b0).to(torch.float32)
    two = torch.full_like(mantissa, 2.0)
    normal = (mantissa * 2.0**-23 + 1.0) * torch.pow(two, (exponent - 127).to(torch.float32))
    subnormal = mantissa * 2.0**-149
    special = torch.where(mantissa == 0, torch.full_like(mantissa, torch.inf), mantissa * torch.nan)
    value = torch.where(exponent == 0, subnormal, torch.where(exponent == 255, special, normal))
    return value * sign  # -0.0 too: a product keeps the sign of zero


EncoderFactory = Callable[[ObsLayout], nn.Module]
"""Builds a custom encoder for observations stored as the layout says (see the module
docstring for what the module must take and return)."""


class CustomEncoder(nn.Module):
    """A user's encoder module (``module``), with the width of its features checked once."""

    def __init__(self, factory: EncoderFactory, layout: ObsLayout) -> None:
        super().__init__()
        module = factory(layout)
        name = describe_factory(factory)
        if not isinstance(module, nn.Module):
            raise ConfigError(
                f"encoder factory {name} returned a {type(module).__name__}; expected a "
                "torch.nn.Module"
            )
        width = getattr(module, "out_features", None)
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ConfigError(
                f"encoder factory {name}: its {type(module).__name__} needs an int attribute "
                f"out_features >= 1 (the width of its [batch, out_features] output), got "
                f"{width!r}"
            )
        _check_output(module, layout, width, name)
        self.module = module
        self.out_features = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.module(x)
        return out


def _check_output(module: nn.Module, layout: ObsLayout, width: int, name: str) -> None:
    """Refuse a module whose output for a batch of two zero observations is not
    ``[2, width]`` float32. The probe runs in eval mode (no batch statistics move) on a fork
    of the random state (the weights built after it are those of an unchecked build)."""
    expected = f"a [2, {width}] float32 tensor (out_features {width})"
    # On the module's device: a factory may build it where it will run.
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        training = module.training
        module.eval()
        try:
            out = module(torch.zeros((2, *layout.shape), dtype=layout.dtype, device=device))
        except Exception as error:
            raise ConfigError(
                f"encoder factory {name}: its {type(module).__name__} failed on a batch of "
                f"shape {[2, *layout.shape]} ({layout.dtype}): {type(error).__name__}: {error}; "
                f"expected {expected}"
            ) from None
        finally:
            module.train(training)
    if not isinstance(out, torch.Tensor):
        raise ConfigError(
            f"encoder factory {name}: its {type(module).__name__} returned a "
            f"{type(out).__name__}; expected {expected}"
        )
    if tuple(out.shape) != (2, width) or out.dtype != torch.float32:
        raise ConfigError(
            f"encoder factory {name}: its {type(module).__name__} maps a batch of shape "
            f"{[2, *layout.shape]} to a {list(out.shape)} {out.dtype} tensor; expected {expected}"
        )


def describe_factory(factory: EncoderFactory) -> str:
    """``module.qualname`` of a factory function or class (its repr for other callables)."""
    qualname = getattr(factory, "__qualname__", None)
    if qualname is None:
        return repr(factory)
    return f"{getattr(factory, '__module__', '?')}.{qualname}"


Encoder = FlatEncoder | ImageEncoder | GridEncoder | MixedEncoder | CustomEncoder


def make_encoder(
    layout: ObsLayout, cnn: CnnKind = "nature", custom: EncoderFactory | None = None
) -> Encoder:
    """The encoder for observations stored as ``layout`` says: ``custom``'s module when a
    factory is given, else the built-in one."""
    if custom is not None:
        return CustomEncoder(custom, layout)
    if layout.kind == "image":
        return ImageEncoder(layout.shape, cnn)
    if layout.kind == "packed" and layout.has_images:
        return MixedEncoder(layout, cnn)
    if layout.kind == "vector" and is_binary_grid_space(layout.space):
        return GridEncoder(layout.shape, cnn)
    return FlatEncoder(layout.shape)
