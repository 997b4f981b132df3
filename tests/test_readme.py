"""The README's generated parts match the code."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from rlfleet.algos.table import BEGIN, END, support_table

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_algorithm_table_is_generated_from_the_registry() -> None:
    text = README.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == support_table(), (
        "README algorithm table is stale: replace it with `python -m rlfleet.algos.table`"
    )


def test_speed_table_is_generated_from_bench_results(
    bench_module: Callable[[str], ModuleType],
) -> None:
    # The README's speed figures are what the benchmark scripts measured, never typed in.
    harness = bench_module("harness")
    text = README.read_text()
    start, end = text.index(harness.BEGIN), text.index(harness.END) + len(harness.END)
    assert text[start:end] == harness.speed_table(), (
        "README speed table is stale: rerun the benchmarks (`make bench`), which rewrite it"
    )
