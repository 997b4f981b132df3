"""The ``rlfleet`` command line: subcommands, --version, python -m rlfleet, completion, and the
overview that prints without importing the commands."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tyro

from rlfleet.algos.registry import algorithm_classes
from rlfleet.cli.commands import (
    CheckEnvCommand,
    CollectCommand,
    EvalCommand,
    ExportCommand,
    PlotCommand,
    TuneCommand,
)
from rlfleet.cli.main import (
    ALGORITHM_SUMMARIES,
    COMMAND_SUMMARIES,
    COMMANDS,
    main,
    overview_type,
    root_type,
)
from rlfleet.cli.play import PlayCommand
from rlfleet.version import __version__
from tests.cli.test_bad_input import _env, _flags


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"rlfleet {__version__}"


def test_python_dash_m_rlfleet_is_the_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rlfleet", "--version"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"rlfleet {__version__}"


@pytest.mark.parametrize("args", [[], ["help"], ["--help"]])
def test_the_overview_lists_every_command(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(args)
    except SystemExit as stop:  # tyro's --help
        code = stop.code if isinstance(stop.code, int) else 1
    assert code == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out, command
    assert "--version" in out


@pytest.fixture(scope="module")
def every_flag() -> set[str]:
    """Every flag of every command and of ``train`` with every algorithm, from their
    ``--help``."""
    commands = [["train", name] for name in algorithm_classes()]
    commands += [[name] for name in COMMAND_SUMMARIES]
    return {"--help", *(flag for command in commands for flag in _flags(command))}


@pytest.mark.parametrize("shell", ["bash", "zsh", "tcsh", "fish"])
def test_completion_script_covers_commands_and_flags(
    shell: str, tmp_path: Path, every_flag: set[str]
) -> None:
    """docs/cli.md: a completion script for bash, zsh, tcsh or fish, in which subcommands,
    algorithms and every flag complete."""
    script = tmp_path / f"rlfleet.{shell}"
    assert main(["--tyro-write-completion", shell, str(script)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [script.name]  # no temporary left
    text = script.read_text()
    words = ["train", *COMMAND_SUMMARIES, *algorithm_classes()]
    assert [word for word in words if word not in text] == []
    if shell == "tcsh":  # one list of the flags' names, completed after "--"
        listed = re.search(r"'c/--/\(([^)]*)\)/'", text)
        assert listed is not None
        completed = {f"--{name}" for name in listed.group(1).split()}
    else:  # each flag quoted where its command's flags are listed
        completed = {flag for flag in every_flag if f"'{flag}'" in text}
    assert len(every_flag) > 150
    assert sorted(every_flag - completed) == []


def test_a_completion_script_that_cannot_be_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["--tyro-write-completion", "bash", str(blocker / "rlfleet.bash")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {blocker / 'rlfleet.bash'}: cannot write the completion script")
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_completion_script_can_be_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tyro-print-completion", "bash"]) == 0
    printed = capsys.readouterr().out
    assert main(["--tyro-write-completion", "bash", "-"]) == 0
    assert capsys.readouterr().out == printed
    assert "'--num-steps'" in printed


@pytest.mark.parametrize(
    "args",
    [
        ["--tyro-write-completion", "csh", "out"],
        ["--tyro-write-completion", "bash"],
        ["--tyro-write-completion"],
        ["--tyro-write-completion", "bash", "out", "more"],
        ["train", "--tyro-write-completion", "bash", "out"],
        ["--tyro-print-completion", "csh"],
        ["--tyro-print-completion"],
        ["--tyro-print-completion", "zsh", "out"],
    ],
)
def test_a_bad_completion_request_is_one_line_and_writes_nothing(
    args: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert re.match(r"error: --tyro-(write|print)-completion: expected `rlfleet", err), err
    assert "bash, zsh, tcsh, fish" in err
    assert len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_closed_stdout_ends_the_command_quietly(tmp_path: Path) -> None:
    """`rlfleet train ppo --help | head -1`: the reader leaves before the help is written."""
    child = subprocess.Popen(
        [sys.executable, "-m", "rlfleet", "train", "ppo", "--help"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env=_env(),
    )
    assert child.stdout is not None
    assert child.stderr is not None
    child.stdout.close()
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=60) == 0
    assert "Traceback" not in stderr


OVERVIEWS = [[], ["help"], ["--help"], ["train", "--help"], ["--version"]]
"""What the ``rlfleet`` command answers without importing its commands (nor torch)."""

HEAVY = ("torch", "gymnasium", "pydantic", "pyarrow", "matplotlib", "optuna", "ray")
"""What printing the overview must not import."""


@pytest.mark.parametrize("args", OVERVIEWS, ids=lambda args: " ".join(args) or "bare")
def test_the_overview_imports_no_command(args: list[str], tmp_path: Path) -> None:
    # A fresh interpreter runs the command's entry function, then lists what it imported.
    code = (
        "import sys\n"
        "from rlfleet.cli.main import main\n"
        "try:\n"
        "    code = main(sys.argv[1:])\n"
        "except SystemExit as stop:  # tyro's --help\n"
        "    code = stop.code\n"
        "print('imported:', *sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY}))\n"
        "sys.exit(code)\n"
    ).replace("{HEAVY}", repr(set(HEAVY)))
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    *text, imported = done.stdout.rstrip("\n").splitlines()
    assert imported == "imported:"
    if args == ["--version"]:
        assert text == [f"rlfleet {__version__}"]
    elif args[:1] == ["train"]:
        assert "usage: rlfleet train" in text[0]
        assert all(name in "\n".join(text) for name in ALGORITHM_SUMMARIES)
    else:
        assert all(command in text[0] for command in COMMANDS)


def _help(command_line: Any, args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        tyro.cli(command_line, args=args, prog="rlfleet")
    assert stop.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"]], ids=["root", "train"])
def test_the_overview_reads_as_the_full_command_line(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    overview = _help(overview_type(), args, capsys)
    assert overview == _help(root_type(None), args, capsys)
    assert "usage: rlfleet" in overview


def test_the_overview_describes_each_command_as_its_class_does() -> None:
    classes = {
        "collect": CollectCommand,
        "eval": EvalCommand,
        "play": PlayCommand,
        "export": ExportCommand,
        "plot": PlotCommand,
        "tune": TuneCommand,
        "check-env": CheckEnvCommand,
    }
    assert list(COMMAND_SUMMARIES) == [c for c in COMMANDS if c != "train"]
    assert {name: cls.__doc__ for name, cls in classes.items()} == COMMAND_SUMMARIES


def test_the_overview_lists_every_algorithm_as_its_class_describes_it() -> None:
    described = {
        name: (cls.__doc__ or "").strip().split("\n\n")[0]
        for name, cls in algorithm_classes().items()
    }
    assert described == ALGORITHM_SUMMARIES
    assert list(ALGORITHM_SUMMARIES) == list(described)  # the registry's (sorted) order
