"""tyro's command-line errors as one line: ``rlfleet`` reports bad input in one line on stderr.

tyro answers a flag it cannot parse (unknown, misspelt, of the wrong type, missing, not one
of the choices) with a box of several lines drawn on stderr, then exits with code 2. tyro
has no option for a terse error, and its hook for parse errors is private and marked
unstable (``tyro._errors``), so :func:`one_line_parse_errors` captures what tyro writes to
stderr while it parses and turns the box into a :class:`~rlfleet.errors.ConfigError` of one
line that keeps what the box says: the flag, what was expected and what was given, the
flags it suggests, and the command whose ``--help`` lists the flags. Anything else written
to stderr meanwhile (a warning while a preset is probed) goes out unchanged.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

from rlfleet.errors import ConfigError

T = TypeVar("T")

ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")
"""A terminal colour code."""
_HELP = re.compile(r"(rlfleet\b[^`]*?--help)")
_FLAG_LINE = re.compile(r"^ {4}(\S.*)$")
"""An entry of a box's list (a flag and its metavar); its description is indented further."""
_WIDE = "100000"
"""Terminal width tyro lays its box out for while rlfleet reads it: one box line per entry."""


def one_line_parse_errors(parse: Callable[[], T], *, asks_help: bool) -> T:
    """``parse()``, with a tyro error box turned into a one-line :class:`ConfigError`.
    ``asks_help``: the command line asks for help, which tyro lays out for the terminal."""
    captured = io.StringIO()
    try:
        with _wide_layout(not asks_help), contextlib.redirect_stderr(captured):
            return parse()
    except SystemExit as stop:
        line = box_line(captured.getvalue()) if stop.code == 2 else None
        if line is None:
            raise
        captured = io.StringIO()
        raise ConfigError(line) from None
    finally:
        if captured.getvalue():
            sys.stderr.write(captured.getvalue())


@contextlib.contextmanager
def _wide_layout(wide: bool) -> Iterator[None]:
    """A terminal as wide as a box's longest line, so that no entry wraps."""
    before = os.environ.get("COLUMNS")
    if wide:
        os.environ["COLUMNS"] = _WIDE
    try:
        yield
    finally:
        if wide:
            if before is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = before


def box_line(text: str) -> str | None:
    """One line saying what tyro's error box in ``text`` says (None: ``text`` holds no box)."""
    parts = _box(ANSI_CODE.sub("", text).strip("\n").splitlines())
    if parts is None:
        return None
    title, sections = parts
    first, rest = sections[0], sections[1:]
    help_command = next(
        (m[1] for section in rest for m in map(_HELP.search, section) if m is not None), None
    )
    suffix = f" (see `{help_command}`)" if help_command else ""
    if title == "Required options" and first:
        entries = [m[1] for m in map(_FLAG_LINE.match, first[1:]) if m is not None]
        return f"{first[0].removeprefix('Missing from ').rstrip(':')}: missing " + (
            ", ".join(entries) + suffix
        )
    message = " ".join(line.strip() for line in first)
    if title == "Unrecognized options":
        suggested = [
            m[1].split()[0]
            for section in rest
            if section and section[0].startswith("Perhaps you meant")
            for m in map(_FLAG_LINE.match, section[1:])
            if m is not None and m[1].startswith("-")
        ]
        # A flag suggested for itself belongs to another command, which the help named
        # at the end of the line is.
        given = set(re.findall(r"--[\w-]+", message))
        others = [flag for flag in dict.fromkeys(suggested) if flag not in given]
        if others:
            message = f"{message.rstrip('.')}; did you mean {' or '.join(others)}?"
        return _lower_first(message) + suffix
    parsing = re.match(r"Error parsing (\S+): (.*)$", message)
    if parsing is not None:
        flag, reason = parsing.groups()
        helptext = next((s for s in rest if s and s[0] == "Argument helptext:"), [])
        expected = helptext[1].split(maxsplit=1)[1:] if len(helptext) > 1 else []
        return f"{flag}: {reason}" + (f" (expected {expected[0]})" if expected else "")
    return _lower_first(message) + suffix


def _box(lines: list[str]) -> tuple[str, list[list[str]]] | None:
    """The title of a box and its sections of text (split at its rules), as tyro draws it:
    with line-drawing characters where stdout's encoding is UTF-8, else with dashes."""
    if len(lines) < 3:
        return None
    if lines[0].startswith("╭"):
        title = lines[0].strip("╭╮─ ")
        inner = [line.strip().removeprefix("│").removesuffix("│") for line in lines[1:-1]]
        rule = "─"
    elif lines[1].strip() and set(lines[1].strip()) == {"-"}:
        title = lines[0].strip()
        inner = [line.removeprefix(" ") for line in lines[2:]]
        rule = "-"
    else:
        return None
    sections: list[list[str]] = [[]]
    for line in inner:
        line = line.removeprefix(" ").rstrip()
        if line and set(line) == {rule}:
            sections.append([])
        elif line:
            sections[-1].append(line)
    return title, sections


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
