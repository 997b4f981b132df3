"""The README's generated parts match the code."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rlfleet.algos.table import BEGIN, END, support_table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCH = ROOT / "bench"


def test_algorithm_table_is_generated_from_the_registry() -> None:
    text = README.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == support_table(), (
        "README algorithm table is stale: replace it with `python -m rlfleet.algos.table`"
    )


def test_speed_table_is_generated_from_bench_results(monkeypatch: pytest.MonkeyPatch) -> None:
    # The README's speed figures are what the benchmark scripts measured, never typed in.
    spec = importlib.util.spec_from_file_location("harness", BENCH / "harness.py")
    assert spec is not None
    assert spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "harness", harness)  # its dataclasses look it up there
    spec.loader.exec_module(harness)
    text = README.read_text()
    start, end = text.index(harness.BEGIN), text.index(harness.END) + len(harness.END)
    assert text[start:end] == harness.speed_table(), (
        "README speed table is stale: rerun the benchmarks (`make bench`), which rewrite it"
    )
