"""Torch device strings: the one place a ``--device`` flag or ``device:`` setting is checked.

``torch.device("gpu")`` raises a RuntimeError listing twenty device types, and
``torch.device("cuda")`` on a CPU-only build only fails at the first tensor moved there,
deep inside training. :func:`resolve_device` turns both into a one-line
:class:`~rlfleet.errors.ConfigError` that names the devices this machine has.
"""

from __future__ import annotations

from types import ModuleType

import torch

from rlfleet.errors import ConfigError

ACCELERATORS = ("cuda", "mps", "xpu")
"""Device types besides ``cpu`` that rlfleet trains on, where torch finds the hardware."""


def _backend(kind: str) -> ModuleType | None:
    module = getattr(torch, kind, None)
    return module if isinstance(module, ModuleType) else None


def _device_count(kind: str) -> int:
    """How many devices of ``kind`` this machine has (0: none, or torch built without it)."""
    if kind == "mps":
        # One Apple GPU at most; torch.mps has no is_available of its own.
        return int(torch.backends.mps.is_available())
    backend = _backend(kind)
    if backend is None or not backend.is_available():
        return 0
    return int(backend.device_count())


def available_devices() -> list[str]:
    """The device strings that work here: ``cpu``, then e.g. ``cuda``, ``cuda:0``, ``cuda:1``."""
    found = ["cpu"]
    for kind in ACCELERATORS:
        count = _device_count(kind)
        if count:
            found.append(kind)
            if count > 1 or kind != "mps":
                found.extend(f"{kind}:{index}" for index in range(count))
    return found


def resolve_device(
    device: str | torch.device, where: str = "device", *, check_available: bool = True
) -> torch.device:
    """The torch device ``device`` names, refusing what this machine cannot train on.

    Args:
        device: ``cpu``, ``cuda``, ``cuda:N``, ``mps``, ``xpu`` (or a ``torch.device``).
        where: the flag or setting the string came from, for the error message.
        check_available: also require the device to exist on this machine (off for a
            config that is only read, such as a GPU run's ``config.yaml`` on a laptop).

    Raises:
        ConfigError: not a device string, a device type rlfleet does not train on, or (with
            ``check_available``) a device this machine does not have.
    """
    expected = ", ".join(available_devices())
    if isinstance(device, torch.device):
        parsed = device
    elif isinstance(device, str):
        try:
            parsed = torch.device(device)
        except RuntimeError:
            raise ConfigError(
                f"{where}: {device!r} is not a torch device (expected one of: {expected}; "
                f"device types: cpu, {', '.join(ACCELERATORS)})"
            ) from None
    else:
        raise ConfigError(f"{where}: expected a device string such as 'cpu', got {device!r}")
    if parsed.type != "cpu" and parsed.type not in ACCELERATORS:
        raise ConfigError(
            f"{where}: rlfleet does not train on {parsed.type!r} devices (expected one of: "
            f"{expected}; device types: cpu, {', '.join(ACCELERATORS)})"
        )
    if check_available and parsed.type != "cpu":
        count = _device_count(parsed.type)
        index = 0 if parsed.index is None else parsed.index
        if index >= count:
            reason = (
                f"this machine has {count} {parsed.type} device(s)"
                if count
                else f"this torch {torch.__version__} finds no {parsed.type} device"
            )
            raise ConfigError(
                f"{where}: device {str(device)!r} is not available ({reason}); "
                f"expected one of: {expected}"
            )
    return parsed
