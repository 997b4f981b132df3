"""Torch's CPU thread count while rlfleet trains, with the caller's own restored afterwards.

Trainers (:meth:`rlfleet.train.trainer.Trainer.run`,
:meth:`rlfleet.marl.trainer.DecentralizedTrainer.train`) and :func:`rlfleet.runs.run.train`
run inside :func:`torch_threads`, so a script or notebook that trains gets the thread count
rlfleet measured to be fastest, and keeps its own setting for whatever it does next.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from rlfleet.config.fields import MAX_TORCH_THREADS
from rlfleet.errors import ConfigError

DEFAULT_TORCH_THREADS = 1
"""Intra-op CPU threads torch uses while rlfleet trains, unless told otherwise. One thread is
fastest for small networks: their kernels are too short to split, and a second thread only
adds synchronisation (measured: 2x slower PPO on CartPole on two cores)."""


@contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with torch on ``num_threads`` intra-op CPU threads (None: leave the
    count as it is), then set the caller's count back.

    Inter-op threads are left alone: torch fixes their number at the first inter-op parallel
    work and refuses to change it afterwards.
    """
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
