"""The ``rlfleet`` command line: subcommands, --version, python -m rlfleet, completion."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.cli.main import COMMANDS, main
from rlfleet.version import __version__
from tests.cli.test_bad_input import _env


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


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_script_covers_commands_and_flags(shell: str, tmp_path: Path) -> None:
    script = tmp_path / f"rlfleet.{shell}"
    with pytest.raises(SystemExit) as stop:
        main(["--tyro-write-completion", shell, str(script)])
    assert stop.value.code in (0, None)
    text = script.read_text()
    for word in ("check-env", "td3_bc", "num-steps", "dataset", "episodes"):
        assert word in text, word


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
