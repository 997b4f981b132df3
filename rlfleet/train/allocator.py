"""Freed memory kept in the process while rlfleet trains (glibc's ``malloc``).

A gradient step allocates and frees the same tensors each time. By default glibc serves an
allocation above its mmap threshold (128 KiB at first, raised as such blocks are freed) with a
fresh mapping from the kernel, and returns freed memory at the top of its heap once more than
its trim threshold (128 KiB at first, twice the mmap threshold once that is raised) is free
there. Either way the next step's tensors land on pages the kernel must map and zero again:
a minor page fault per 4 KiB. SAC's update on Pendulum (256x256 networks, batch 256) faulted
220-240 pages a step this way: 700,000 faults and 1.8-2.2 s of kernel time in 3,000 steps at
2 threads, against 51,000 faults and 0.4 s with the settings below (``/usr/bin/time``, same
run, same seed, same returns).

:func:`retained_heap` raises glibc's mmap threshold to 32 MiB (the highest its own dynamic
threshold reaches on 64-bit machines) and its trim threshold to 1 GiB, so freed blocks
stay in the heap for the next step. On the way out the trim threshold becomes twice the mmap
threshold, 64 MiB, both where glibc's own adjustment leaves them once it has raised the mmap
threshold that far; leaving costs one ``mallopt`` call, so a scope entered for every training
step (the ML-Agents API's ``advance``) costs two calls a step (3 us together). The memory the
heap holds goes back to the kernel when a training session ends
(:func:`release_free_memory`), once, not at every exit.

Written here because nothing installable does it in-process: jemalloc or tcmalloc (what
PyTorch's CPU performance guide suggests) replace the allocator only through ``LD_PRELOAD``
before the process starts; glibc's ``mallopt(3)`` changes it from inside. On other C
libraries (musl, macOS, Windows) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024
"""Blocks below this size come from the heap while training (glibc's dynamic maximum)."""
TRIM_THRESHOLD = 1024 * 1024 * 1024
"""Free memory at the heap's top kept while training, up to this much."""
TRIM_THRESHOLD_AFTER = 2 * MMAP_THRESHOLD
"""The trim threshold once the last training scope ends: glibc's own rule for it, twice the
mmap threshold, when it raises that threshold itself."""

_lock = threading.Lock()
_depth = 0


@cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, where this process runs on it and it has ``mallopt``; else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    return libc


def available() -> bool:
    """Whether :func:`retained_heap` changes anything here (the process runs on glibc)."""
    return _glibc() is not None


@contextmanager
def retained_heap() -> Iterator[None]:
    """Keep freed memory in the heap while the block runs (see the module's docstring).

    Scopes nest and may be entered from several threads: the settings apply from the first
    entry to the last exit."""
    global _depth
    libc = _glibc()
    if libc is None:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_AFTER)


def release_free_memory() -> None:
    """Hand the free memory of glibc's heaps back to the kernel (``malloc_trim``), where the
    process runs on glibc; the trainers call it when a training session ends."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
