"""The arithmetic precision of the update step: fp32, or bf16 matrix products where the
hardware has bf16 dot products.

``bf16`` runs the matrix products and convolutions of the update step (forward and backward)
in bfloat16: their inputs are rounded to bf16, the products accumulate in fp32, and their
results come back as fp32. Everything else stays fp32: weights, gradients, optimiser state,
activations, softmax, log-probabilities, losses and norms. Acting (collection and test steps)
stays fp32.

Why not ``torch.autocast`` as it is: on CPUs it leaves the outputs of products in bf16 and
runs what follows in bf16 too (``log_softmax`` included, so PPO's probability ratio would
carry bf16 rounding of about 1%), and mixes dtypes into ops that refuse them (``torch.dot``);
its weight-cast cache would also hand the second optimiser step of an update the first
one's stale bf16 weights. So the products are intercepted here (a
:class:`torch.overrides.TorchFunctionMode`), cast to bf16 on the way in and to fp32 on the
way out, and no cast is cached.

bf16 is refused where it would be emulated rather than native: a CPU needs AVX-512 BF16 or
AMX instructions (on other CPUs oneDNN converts to fp32 and the products get slower, not
faster); a CUDA device needs native bf16 support (Ampere or later).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Literal

import torch
from torch.overrides import TorchFunctionMode

from rlfleet.errors import ConfigError

Precision = Literal["fp32", "bf16"]
"""``fp32``: full precision throughout; ``bf16``: the update step's matrix products in bfloat16."""


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX-512 BF16 or AMX), as torch's
    CPU feature detection (cpuinfo) reports them."""
    cpu: Any = torch.cpu
    return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())


def bf16_support(device: torch.device) -> str | None:
    """Why ``device`` cannot run bf16 natively (None: it can)."""
    if device.type == "cpu":
        if cpu_has_bf16():
            return None
        capability = torch.backends.cpu.get_cpu_capability()
        return (
            f"this CPU has no bf16 dot-product instructions (AVX-512 BF16 or AMX; torch's "
            f"CPU capability: {capability})"
        )
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return None
        return f"{device} has no native bf16 support (needs compute capability 8.0 or later)"
    return f"bf16 products are offered on cpu and cuda devices, not on {device.type}"


def check_precision(precision: Precision, device: torch.device, where: str) -> None:
    """Refuse a precision ``device`` cannot run natively.

    Raises:
        ConfigError: ``bf16`` on a device without native bf16, or a value that is not one
            of ``fp32``, ``bf16``.
    """
    if precision == "fp32":
        return
    if precision != "bf16":
        raise ConfigError(f"{where}: expected 'fp32' or 'bf16', got {precision!r}")
    reason = bf16_support(device)
    if reason is not None:
        raise ConfigError(f"{where}: bf16 refused on {device}: {reason}; use fp32")


PRODUCTS: frozenset[Callable[..., Any]] = frozenset(
    {
        torch.nn.functional.linear,
        torch.matmul,
        torch.Tensor.matmul,
        torch.Tensor.__matmul__,
        torch.mm,
        torch.Tensor.mm,
        torch.bmm,
        torch.Tensor.bmm,
        torch.addmm,
        torch.baddbmm,
        torch.nn.functional.conv1d,
        torch.nn.functional.conv2d,
        torch.nn.functional.conv3d,
    }
)
"""The torch functions that run in bf16 under ``precision: bf16``."""


class Bf16Products(TorchFunctionMode):
    """Matrix products and convolutions in bf16 with fp32 results (see the module docstring)."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func not in PRODUCTS:
            return func(*args, **kwargs)
        out = func(*[_bf16(a) for a in args], **{k: _bf16(v) for k, v in kwargs.items()})
        return out.float() if isinstance(out, torch.Tensor) else out


def _bf16(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
        return value.to(torch.bfloat16)
    return value


def update_precision(precision: Precision) -> AbstractContextManager[Any]:
    """The context an update step runs in: nothing for fp32, :class:`Bf16Products` for
    bf16."""
    if precision == "fp32":
        return nullcontext()
    return Bf16Products()
