"""tyro's error boxes become one line, in both of the ways tyro draws them; what else is
written to stderr while the command line is parsed still comes out."""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import pytest

from rlfleet.cli.main import main
from rlfleet.cli.parse_errors import box_line, one_line_parse_errors
from rlfleet.errors import ConfigError

UTF8_BOX = """\
╭─ Unrecognized options ───────────────────────────────────────╮
│ Unrecognized options: --num-env, 3                           │
│ ──────────────────────────────────────────────────────────── │
│ Perhaps you meant:                                           │
│     --num-envs INT                                           │
│         Training envs stepped together. (default: 8)         │
│         in rlfleet train ppo --help                          │
│     [...]                                                    │
│     --n-envs {None}|INT                                      │
│         Alias of --num-envs (xagents' name). (default: None) │
│ ──────────────────────────────────────────────────────────── │
│ For full helptext, run rlfleet train ppo --help              │
╰──────────────────────────────────────────────────────────────╯
"""
ASCII_BOX = "\n".join(
    # tyro pads each line of the box to its width
    line.ljust(64)
    for line in [
        " Value error",
        " " + "-" * 62,
        "  Error parsing --num-envs: invalid literal for int() with base 10: 'many'",
        "  " + "-" * 62,
        "  Argument helptext:",
        "      --num-envs INT",
        "      Training envs stepped together. (default: 8)",
        "  " + "-" * 62,
        "  For full helptext, see rlfleet --help",
        "",
    ]
)


def test_a_box_drawn_with_line_characters_is_one_line_with_the_suggested_flags() -> None:
    assert box_line(UTF8_BOX) == (
        "unrecognized options: --num-env, 3; did you mean --num-envs or --n-envs? "
        "(see `rlfleet train ppo --help`)"
    )


def test_a_box_drawn_with_dashes_is_one_line_naming_the_flag_and_its_type() -> None:
    assert box_line(ASCII_BOX) == (
        "--num-envs: invalid literal for int() with base 10: 'many' (expected INT)"
    )


def test_text_that_is_no_box_is_left_alone() -> None:
    assert box_line("warning: something\n") is None
    assert box_line("") is None


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["collect", "run"], "error: rlfleet collect: missing --steps INT, --out PATH"),
        (["eval"], "error: rlfleet eval: missing PATH"),
        (["export", "run", "--format", "tflite"], "error: invalid choice 'tflite' for argument"),
    ],
)
def test_tyros_errors_reach_the_user_as_one_line(
    args: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(line)
    assert len(err.strip().splitlines()) == 1


def test_what_else_goes_to_stderr_while_parsing_comes_out_and_the_width_is_restored(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "77")

    def parse() -> str:
        print("warning: a preset's env warned", file=sys.stderr)
        return "parsed"

    assert one_line_parse_errors(parse, asks_help=False) == "parsed"
    assert capsys.readouterr().err == "warning: a preset's env warned\n"
    assert os.environ["COLUMNS"] == "77"

    def fails() -> NoReturn:
        print(UTF8_BOX, file=sys.stderr)
        raise SystemExit(2)

    with pytest.raises(ConfigError, match=r"^unrecognized options: --num-env, 3;"):
        one_line_parse_errors(fails, asks_help=False)
    assert capsys.readouterr().err == ""
    assert os.environ["COLUMNS"] == "77"


def test_help_is_laid_out_for_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["eval", "--help"])
    assert stop.value.code in (0, None)
    widest = max(len(line) for line in capsys.readouterr().out.splitlines())
    assert widest <= 200
