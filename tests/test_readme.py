"""The README's generated parts match the code."""

from __future__ import annotations

from pathlib import Path

from rlfleet.algos.table import BEGIN, END, support_table

README = Path(__file__).resolve().parent.parent / "README.md"


def test_algorithm_table_is_generated_from_the_registry() -> None:
    text = README.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == support_table(), (
        "README algorithm table is stale: replace it with `python -m rlfleet.algos.table`"
    )
