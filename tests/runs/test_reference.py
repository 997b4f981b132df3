"""docs/run-options.md is generated from the typed run options and kept in sync."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from rlfleet.algos import get_algorithm, list_algorithms
from rlfleet.runs.reference import field_docs, format_type, render
from rlfleet.runs.run_options import BehaviorSettings, EnvSettings
from rlfleet.train.loop import TrainerConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "run-options.md"


def test_committed_page_equals_the_generated_one() -> None:
    assert PAGE.read_text() == render(), (
        "docs/run-options.md is stale: regenerate it with "
        "`python -m rlfleet.runs.reference > docs/run-options.md`"
    )


def test_every_field_of_the_options_has_a_docstring() -> None:
    for cls in (EnvSettings, BehaviorSettings):
        docs = field_docs(cls)
        assert set(docs) == set(cls.__dataclass_fields__), cls


@pytest.mark.parametrize("name", [*list_algorithms(), "trainer"])
def test_every_algorithm_and_trainer_field_has_a_docstring(name: str) -> None:
    cls = TrainerConfig if name == "trainer" else get_algorithm(name).config_class
    docs = field_docs(cls)
    assert not [f.name for f in fields(cls) if not docs.get(f.name)]


def test_types_are_readable() -> None:
    from typing import Annotated, Literal

    from annotated_types import Gt

    assert format_type(Annotated[int, Gt(0)]) == "int > 0"
    assert format_type(int | None) == "int or null"
    assert format_type(Literal["a", "b"]) == "`a` \\| `b`"
    assert format_type(tuple[int, ...]) == "list of int"
    # A union stays one table cell: no bare "|", each kind named once.
    assert format_type(BehaviorSettings | EnvSettings | None) == "mapping or null"
    assert format_type(int | str) == "int or str"
