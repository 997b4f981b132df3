"""Torch's CPU thread count while rlfleet trains, with the caller's own restored afterwards.

Trainers (:meth:`rlfleet.train.trainer.Trainer.run`,
:meth:`rlfleet.marl.trainer.DecentralizedTrainer.train`) and :func:`rlfleet.runs.run.train`
run inside :func:`torch_threads`, so a script or notebook that trains gets the thread count
its setting asks for, and keeps its own setting for whatever it does next.

The setting is a number of threads, None (leave torch's count as it is), or ``auto``
(the default): a count chosen from the work of one gradient step (:func:`auto_torch_threads`).
Small networks gain little from a second thread: their kernels are too short to split, and
the synchronisation it adds slows acting (measured on an idle two-core machine, one thread
against two: PPO's 64x64 update 1.10 and 1.03 ms, its act 0.036 and 0.042 ms), and it costs
far more as soon as another process wants the core. A wide network at a large batch, or a
CNN, has kernels long enough for every thread to pay (same machine: SAC's 256x256 update at
batch 256 6.1 and 4.1 ms, a Nature CNN update at batch 256 113 and 55 ms;
``bench/results/profile.md``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import nn

from rlfleet.algos.base import Algorithm
from rlfleet.config.fields import MAX_TORCH_THREADS
from rlfleet.errors import ConfigError

AUTO: Literal["auto"] = "auto"
"""The ``torch_threads`` setting that chooses the count from the work (see
:func:`auto_torch_threads`)."""

ThreadSetting = int | Literal["auto"] | None
"""A ``torch_threads`` setting: a count, ``auto``, or None (torch's count as it is)."""

DEFAULT_TORCH_THREADS: ThreadSetting = AUTO
"""What rlfleet trains with unless told otherwise: the count chosen from the work."""

BUILD_THREADS = 1
"""Threads an ``auto`` setting builds networks with, before the work is known. Initial
weights (orthogonal init) depend on the thread count, so every ``auto`` run builds them the
same way, whatever count it then trains with."""

WORK_PER_THREAD = 16_000_000
"""Multiply-accumulates of one gradient step's forward passes per torch thread that ``auto``
gives it. The 64x64 MLPs of the CartPole and Pendulum presets (5M at most) and the 256x256
DQN network at batch 64 (~4M) stay below it and train on one thread; SAC's 256x256 networks at
batch 256 (~52M) get three threads where there are cores for them, a Nature CNN at batch 256
(~2.4G) one per core. (DQN's 256x256 update measured about 10% faster on a second thread of an
idle machine, which does not cover what a busy second core costs it.)"""


def available_cores() -> int:
    """CPU cores this process may use: its affinity mask where the OS has one, and no more
    than ``OMP_NUM_THREADS`` when that is set to a positive integer (the usual way to give a
    process a share of the machine, as test runners and schedulers do)."""
    if hasattr(os, "sched_getaffinity"):
        cores = max(1, len(os.sched_getaffinity(0)))
    else:
        cores = max(1, os.cpu_count() or 1)
    share = os.environ.get("OMP_NUM_THREADS", "").strip()
    if share.isdigit() and int(share) > 0:
        cores = min(cores, int(share))
    return cores


def _pair(value: Any) -> tuple[int, int]:
    """A layer's kernel size, stride or padding as (height, width)."""
    if isinstance(value, int):
        return value, value
    return int(value[0]), int(value[1])


def _layer_macs(module: nn.Module, image: tuple[int, int] | None) -> int:
    """Multiply-accumulates per sample of ``module``'s weights: one per entry of every weight
    matrix (Linear layers, the stacked weights of rlfleet's twin networks, LSTM gates), and
    for a convolution one per entry per output position. Layers are walked in the order they
    were registered (the forward order of rlfleet's encoders); convolution output sizes
    follow from ``image`` (height, width) through each convolution and pooling layer."""
    total = 0
    size = image
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.MaxPool2d) and size is not None:
            (kh, kw), (sh, sw), (ph, pw) = (
                _pair(layer.kernel_size),
                _pair(layer.stride),
                _pair(layer.padding),
            )
            size = ((size[0] + 2 * ph - kh) // sh + 1, (size[1] + 2 * pw - kw) // sw + 1)
        positions = size[0] * size[1] if isinstance(layer, nn.Conv2d) and size else 1
        total += positions * sum(p.numel() for p in layer.parameters(recurse=False) if p.dim() > 1)
    return total


def update_work(algorithm: object) -> int:
    """Multiply-accumulates of the forward passes of one gradient step of ``algorithm``:
    the per-sample arithmetic of the networks it trains (its ``modules()`` with trainable
    parameters) times its minibatch size (the config's ``batch_size``; 256 when it has none,
    as for an update on a whole rollout). Anything but an :class:`Algorithm` (a multi-agent
    game's agents, for one) counts 0."""
    if not isinstance(algorithm, Algorithm):
        return 0
    shape = algorithm.obs_layout.shape
    image = (int(shape[-2]), int(shape[-1])) if len(shape) == 3 else None
    per_sample = sum(
        _layer_macs(module, image)
        for module in algorithm.modules().values()
        if any(p.requires_grad for p in module.parameters())
    )
    batch = getattr(algorithm.config, "batch_size", None)
    return per_sample * (batch if isinstance(batch, int) else 256)


def auto_torch_threads(algorithm: object, cores: int | None = None) -> int:
    """The thread count ``torch_threads: auto`` trains ``algorithm`` with: one per
    :data:`WORK_PER_THREAD` of its :func:`update_work`, at least 1 and at most ``cores``
    (when None, :func:`available_cores`: the cores this process may use).

    Torch's threads meet at every parallel kernel, so a thread whose core another process
    holds stalls them all: on a two-core machine with other work running,
    ``bench/results/profile.md`` once measured a second thread 3 times slower than one for a
    CNN, and far slower still for small MLPs. Where other jobs share the cores, set
    ``torch_threads: 1`` or cap the count with ``OMP_NUM_THREADS``."""
    cores = available_cores() if cores is None else cores
    return max(1, min(cores, update_work(algorithm) // WORK_PER_THREAD))


def check_thread_setting(setting: object, where: str) -> ThreadSetting:
    """``setting`` when it is a valid ``torch_threads`` setting, else a ConfigError that
    names ``where``."""
    if setting is None or setting == AUTO:
        return setting  # type: ignore[return-value]
    if (
        isinstance(setting, int)
        and not isinstance(setting, bool)
        and 1 <= setting <= MAX_TORCH_THREADS
    ):
        return setting
    raise ConfigError(
        f"{where}: torch_threads must be an integer from 1 to {MAX_TORCH_THREADS}, 'auto' or "
        f"null, got {setting!r}"
    )


def resolve_threads(
    setting: ThreadSetting, algorithm: object = None, cores: int | None = None
) -> int | None:
    """The thread count a setting means: ``auto`` with an algorithm, the count chosen from
    its work on ``cores`` cores (None: :func:`available_cores`); ``auto`` without one
    (networks not built yet), :data:`BUILD_THREADS`."""
    if setting == AUTO:
        return BUILD_THREADS if algorithm is None else auto_torch_threads(algorithm, cores)
    return setting


@contextmanager
def torch_threads(
    setting: ThreadSetting, algorithm: object = None, cores: int | None = None
) -> Iterator[None]:
    """Run the block with torch on the intra-op CPU threads ``setting`` asks for (see
    :func:`resolve_threads`; None: leave the count as it is; ``cores``: the cores ``auto``
    may use, None for all the process may use), then set the caller's count back.

    Inter-op threads are left alone: torch fixes their number at the first inter-op parallel
    work and refuses to change it afterwards.
    """
    num_threads = resolve_threads(setting, algorithm, cores)
    if num_threads is not None and not 1 <= num_threads <= MAX_TORCH_THREADS:
        # torch's thread pool crashes the process (SIGSEGV) when asked for far too many.
        raise ConfigError(f"torch_threads must be from 1 to {MAX_TORCH_THREADS}, got {num_threads}")
    previous = torch.get_num_threads()
    if num_threads is None or num_threads == previous:
        yield
        return
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
