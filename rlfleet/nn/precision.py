"""The arithmetic precision of the update step: fp32, or bf16 matrix products where the
hardware has bf16 dot products.

``bf16`` runs the matrix products and convolutions of the update step (forward and backward)
in bfloat16: their inputs are rounded to bf16, the products accumulate in fp32, and their
results are rounded to bf16. Everything else stays fp32: weights, gradients, optimiser state,
softmax, log-probabilities, losses and norms. Acting (collection and test steps) stays fp32.

A product's result stays in bf16 while only operations that are exact on it come between it
and the next product: ReLU and reshapes (:data:`KEEP_BF16`). Any other operation gets it in
fp32. The numbers are those of casting every result to fp32 and back (rounding to bf16 and
back is exact, and ReLU and reshapes commute with it), in the forward pass and in the
gradients alike, but a ReLU network's hidden activations are never converted: those casts,
two each way per layer, cost more than the bf16 products save on a 256-wide layer. Two
exceptions: a result read both by a product and by another operation gets its two
gradients summed in bf16 rather than in fp32; and a result that leaves the update step
untouched (returned as it is, with no operation after the product) is a bf16 tensor.

Why not ``torch.autocast`` as it is: on CPUs it leaves the outputs of products in bf16 and
runs what follows in bf16 too (``log_softmax`` included, so PPO's probability ratio would
carry bf16 rounding of about 1%), and mixes dtypes into ops that refuse them (``torch.dot``);
its weight-cast cache would also hand the second optimiser step of an update the first
one's stale bf16 weights. So the products are intercepted here (a
:class:`torch.overrides.TorchFunctionMode`), cast to bf16 on the way in, and no cast is
cached.

bf16 is refused where it would be emulated rather than native: a CPU needs AVX-512 BF16 or
AMX instructions (on other CPUs oneDNN converts to fp32 and the products get slower, not
faster); a CUDA device needs native bf16 support (Ampere or later).
"""

from __future__ import annotations

import threading
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
        # torch answers for the current CUDA device: make it the one named, where one is.
        named = torch.cuda.device(device) if device.index is not None else nullcontext()
        with named:
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


KEEP_BF16: frozenset[Callable[..., Any]] = frozenset(
    {
        torch.relu,
        torch.relu_,
        torch.Tensor.relu,
        torch.Tensor.relu_,
        torch.nn.functional.relu,
        torch.reshape,
        torch.Tensor.reshape,
        torch.Tensor.view,
        torch.permute,
        torch.Tensor.permute,
        torch.flatten,
        torch.Tensor.flatten,
    }
)
"""Operations exact on bf16 values: applied to a product's result, they keep it in bf16."""

HELD = "_rlfleet_bf16_result"
"""The attribute that marks a tensor as a product's result held in bf16; its value is the
tensor's fp32 copy once something has asked for one, else None."""

IN_PLACE_DUNDERS = frozenset(
    {
        "__setitem__",
        "__iadd__",
        "__isub__",
        "__imul__",
        "__itruediv__",
        "__ifloordiv__",
        "__imod__",
        "__ipow__",
        "__imatmul__",
        "__iand__",
        "__ior__",
        "__ixor__",
        "__ilshift__",
        "__irshift__",
    }
)

_NOT_HELD = object()

_active = threading.local()
"""How many :class:`Bf16Products` contexts this thread is in (torch's modes are per thread
too: a collector thread acting meanwhile is not in the update step's)."""


def bf16_products_active() -> bool:
    """Whether this thread runs inside :class:`Bf16Products`: the products of an update
    step under ``precision: bf16`` read bf16 inputs."""
    return bool(getattr(_active, "depth", 0))


class Bf16Products(TorchFunctionMode):
    """Matrix products and convolutions in bf16, their results held in bf16 through the
    operations of :data:`KEEP_BF16` and given to any other in fp32 (see the module
    docstring)."""

    def __enter__(self) -> Bf16Products:
        _active.depth = getattr(_active, "depth", 0) + 1
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        _active.depth -= 1
        super().__exit__(*exc)

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in PRODUCTS:
            out = func(*[_bf16(a) for a in args], **{k: _bf16(v) for k, v in kwargs.items()})
            return _hold(out) if isinstance(out, torch.Tensor) else out
        if not (any(map(_is_held, args)) or any(map(_is_held, kwargs.values()))):
            return func(*args, **kwargs)
        first_held = bool(args) and _is_held(args[0])
        if first_held and func in KEEP_BF16:
            # In place (relu_) or not, the result is held anew: an fp32 copy made before an
            # in-place change would be stale.
            return _hold(func(*args, **kwargs))
        name = getattr(func, "__name__", "")
        if first_held and (
            (name.endswith("_") and not name.endswith("__")) or name in IN_PLACE_DUNDERS
        ):
            raise RuntimeError(
                f"precision bf16: {name} would change a matrix product's result in place, "
                "and that result is held in bf16; write it out of place (or use precision "
                "fp32)"
            )
        return func(*[_fp32(a) for a in args], **{k: _fp32(v) for k, v in kwargs.items()})


def _hold(tensor: torch.Tensor) -> torch.Tensor:
    setattr(tensor, HELD, None)
    return tensor


def _is_held(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return getattr(value, HELD, _NOT_HELD) is not _NOT_HELD
    if isinstance(value, list | tuple):
        return any(map(_is_held, value))
    return False


def _fp32(value: Any) -> Any:
    """``value`` with every held product result replaced by its fp32 copy (made once)."""
    if isinstance(value, torch.Tensor):
        copy = getattr(value, HELD, _NOT_HELD)
        if copy is _NOT_HELD:
            return value
        if copy is None:
            copy = value.float()
            setattr(value, HELD, copy)
        return copy
    if isinstance(value, list | tuple):
        return type(value)(_fp32(v) for v in value)
    return value


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
