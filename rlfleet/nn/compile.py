"""``torch.compile`` of an update step, with its compiled code kept on disk between runs.

Inductor (the compiler behind ``torch.compile``) caches compiled graphs (its FX graph cache
and AOTAutograd cache) under ``TORCHINDUCTOR_CACHE_DIR``; torch's default is a folder in the
system's temporary directory, which a reboot or a tmp cleaner empties. :func:`compile_function`
points that cache at rlfleet's cache directory first (:func:`compile_cache_dir`), so a second
run of the same networks on the same machine loads the compiled kernels instead of building
them again: it still traces the Python code (seconds), but skips the C++ compilation (tens of
seconds on a small CPU).

Where the cache goes, first match wins:

1. ``TORCHINDUCTOR_CACHE_DIR``, when the user has set it (torch's own setting is honoured);
2. ``$RLFLEET_CACHE_DIR/torch-compile/<capability>``;
3. ``<user cache dir>/rlfleet/torch-compile/<capability>``: the platform's cache directory
   as ``platformdirs`` names it where that package is installed (``~/.cache`` on Linux,
   ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows), else ``~/.cache``.

``<capability>`` is the CPU kernel set torch runs with (``avx512``, ``avx2``, ``default``...:
``torch.backends.cpu.get_cpu_capability()``, which ``ATEN_CPU_CAPABILITY`` lowers). Inductor's
cache key does not cover it: a cache filled under AVX-512 and read under
``ATEN_CPU_CAPABILITY=default`` gave vectorised C++ that no longer compiled, and a cache
directory shared by machines with different CPUs could do the same.

:func:`use_deterministic_algorithms` is here for the same import cost: torch's own switch
imports Inductor's configuration to set a flag that only compiled code reads.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import torch

CACHE_ENV = "RLFLEET_CACHE_DIR"
"""Environment variable naming rlfleet's cache directory (the compile cache goes inside it)."""
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
"""Torch's own setting of Inductor's cache directory; when set, it is used as it is."""
COMPILE_SUBDIR = "torch-compile"

F = TypeVar("F", bound=Callable[..., Any])


def cache_dir() -> Path:
    """rlfleet's cache directory: ``$RLFLEET_CACHE_DIR``, else the platform's user cache
    directory for ``rlfleet`` (``platformdirs`` where installed, else ``~/.cache/rlfleet``)."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given).expanduser()
    try:
        # Optional: the one well-kept source of each platform's conventions, when present.
        import platformdirs
    except ImportError:
        return Path.home() / ".cache" / "rlfleet"
    return Path(platformdirs.user_cache_dir("rlfleet", appauthor=False))


def compile_cache_dir() -> Path:
    """Where compiled update steps are cached (see the module docstring for the order)."""
    given = os.environ.get(INDUCTOR_CACHE_ENV)
    if given:
        return Path(given).expanduser()
    return cache_dir() / COMPILE_SUBDIR / torch.backends.cpu.get_cpu_capability().lower()


def use_compile_cache() -> Path:
    """Point Inductor's on-disk caches at :func:`compile_cache_dir` (created if missing) and
    switch them on; returns the directory. Call it before the first compilation of the
    process: Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` when it first compiles."""
    path = compile_cache_dir().absolute()
    path.mkdir(parents=True, exist_ok=True)
    os.environ[INDUCTOR_CACHE_ENV] = str(path)
    # Imported here: the compiler's modules take a second to import, which runs that never
    # compile (the default) should not pay at start-up.
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    # Both are on by default in current torch; set here so that the warm start never
    # depends on the torch version's defaults.
    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    # A deterministic run (see :func:`use_deterministic_algorithms`) also keeps Inductor from
    # autotuning by timing, as ``torch.use_deterministic_algorithms`` would have.
    if torch.are_deterministic_algorithms_enabled():
        inductor_config.deterministic = True
    return path


def use_deterministic_algorithms() -> None:
    """Make torch refuse nondeterministic kernels, without importing the compiler.

    ``torch.use_deterministic_algorithms(True)`` also sets Inductor's ``deterministic`` flag,
    and importing Inductor's config for that costs seconds of every start, compiled or not;
    ``torch.set_deterministic_debug_mode`` sets the same kernel switch alone, and
    :func:`use_compile_cache` sets Inductor's flag before anything is compiled."""
    torch.set_deterministic_debug_mode("error")
    inductor_config: Any = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:  # something was compiled already
        inductor_config.deterministic = True


def compile_function(fn: F) -> F:
    """``torch.compile(fn)`` with the compiled code cached on disk (:func:`use_compile_cache`)."""
    use_compile_cache()
    return cast(F, torch.compile(fn))


def compile_module(module: torch.nn.Module) -> torch.nn.Module:
    """Compile ``module``'s forward in place (``Module.compile``: parameter names and
    ``state_dict`` keys stay as they are), with the compiled code cached on disk."""
    use_compile_cache()
    module.compile()
    return module
