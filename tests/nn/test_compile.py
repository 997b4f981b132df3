"""Where compiled update steps are cached: rlfleet's cache directory, or torch's own setting."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rlfleet.nn import compile as compile_module
from rlfleet.nn.compile import (
    CACHE_ENV,
    COMPILE_SUBDIR,
    INDUCTOR_CACHE_ENV,
    cache_dir,
    compile_cache_dir,
    use_compile_cache,
)

CAPABILITY = torch.backends.cpu.get_cpu_capability().lower()
"""The kernel set this process runs with, which names the compile cache's last folder."""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Recorded by monkeypatch, so whatever use_compile_cache sets is undone afterwards.
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)


def test_rlfleet_cache_dir_variable_is_honoured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    assert cache_dir() == tmp_path / "cache"
    assert compile_cache_dir() == tmp_path / "cache" / COMPILE_SUBDIR / CAPABILITY
    assert use_compile_cache() == tmp_path / "cache" / COMPILE_SUBDIR / CAPABILITY
    assert (tmp_path / "cache" / COMPILE_SUBDIR / CAPABILITY).is_dir()
    assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "cache" / COMPILE_SUBDIR / CAPABILITY)


def test_torchs_own_setting_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "ignored"))
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "inductor"))
    assert use_compile_cache() == tmp_path / "inductor"
    assert not (tmp_path / "ignored").exists()


def test_default_is_the_platform_cache_dir_or_home_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    platformdirs = pytest.importorskip("platformdirs")
    monkeypatch.setattr(platformdirs, "user_cache_dir", lambda *a, **k: str(tmp_path / "plat"))
    assert compile_cache_dir() == tmp_path / "plat" / COMPILE_SUBDIR / CAPABILITY

    real_import = builtins.__import__

    def no_platformdirs(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "platformdirs":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_platformdirs)
    monkeypatch.setattr(Path, "home", lambda: tmp_path / "home")
    assert (
        compile_cache_dir()
        == tmp_path / "home" / ".cache" / "rlfleet" / COMPILE_SUBDIR / CAPABILITY
    )


def test_compile_function_uses_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    used: list[Path] = []
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(compile_module.torch, "compile", lambda fn: fn)
    real = compile_module.use_compile_cache
    monkeypatch.setattr(compile_module, "use_compile_cache", lambda: used.append(real()) or used[0])
    assert compile_module.compile_function(abs)(-2) == 2
    assert used == [tmp_path / COMPILE_SUBDIR / CAPABILITY]


def test_each_cpu_capability_has_a_cache_of_its_own(tmp_path: Path) -> None:
    """Inductor's cache key does not cover the kernel set: a cache filled under AVX-512 and
    read under ``ATEN_CPU_CAPABILITY=default`` gave C++ that did not compile."""
    env = {**os.environ, CACHE_ENV: str(tmp_path)}
    env.pop(INDUCTOR_CACHE_ENV, None)
    env["ATEN_CPU_CAPABILITY"] = "default"
    code = "from rlfleet.nn.compile import compile_cache_dir; print(compile_cache_dir())"
    found = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(found) == tmp_path / COMPILE_SUBDIR / "default"


def test_the_deterministic_switch_reaches_compiled_code_without_importing_the_compiler(
    tmp_path: Path,
) -> None:
    """In a fresh process: the kernel switch is on and Inductor is not imported; once a
    compile cache is set up, Inductor's own flag follows it, as it does when the compiler
    was imported first."""
    code = (
        "import sys, torch\n"
        "from rlfleet.nn.compile import use_compile_cache, use_deterministic_algorithms\n"
        "use_deterministic_algorithms()\n"
        "print(torch.are_deterministic_algorithms_enabled(), 'torch._inductor' in sys.modules)\n"
        "use_compile_cache()\n"
        "import torch._inductor.config as inductor_config\n"
        "print(inductor_config.deterministic)\n"
        "torch.set_deterministic_debug_mode('default')\n"
        "inductor_config.deterministic = False\n"
        "use_deterministic_algorithms()\n"
        "print(inductor_config.deterministic)\n"
    )
    env = {**os.environ, CACHE_ENV: str(tmp_path)}
    env.pop(INDUCTOR_CACHE_ENV, None)
    printed = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert printed == ["True", "False", "True", "True"]
