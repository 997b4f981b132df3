"""Fixtures of the benchmark scripts' tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def harness(
    bench_module: Callable[[str], ModuleType], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> ModuleType:
    """``bench/harness.py``, writing its results to ``tmp_path``."""
    module = bench_module("harness")
    monkeypatch.setattr(module, "RESULTS", tmp_path)
    return module
