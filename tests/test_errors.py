"""Error messages name settings as the caller knows them: Python parameters or CLI flags;
a failed write names its path and the free space; the fault hook of the write boundaries."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import pytest

from rlfleet import errors
from rlfleet.cli.main import main
from rlfleet.data.dataset import check_output_dir
from rlfleet.errors import (
    CheckpointError,
    DatasetError,
    RunDirError,
    cli_wording,
    option,
    write_boundary,
    write_error,
)


def test_option_names_the_parameter_in_python_and_the_flag_in_the_cli() -> None:
    assert option("force") == "force=True"
    assert option("study", "NAME") == "study=NAME"
    assert option("ray_address", None) == "ray_address"
    assert option("overwrite", flag="--force") == "overwrite=True"
    with cli_wording():
        assert option("force") == "--force"
        assert option("study", "NAME") == "--study NAME"
        assert option("ray_address", None) == "--ray-address"
        assert option("overwrite", flag="--force") == "--force"
    assert option("force") == "force=True"


def test_a_taken_directory_names_the_python_parameter_or_the_cli_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = tmp_path / "data"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match=r"overwrite it \(overwrite=True\)$"):
        check_output_dir(taken, overwrite=False)
    assert main(["collect", str(tmp_path / "run"), "--steps", "10", "--out", str(taken)]) == 2
    assert capsys.readouterr().err.rstrip().endswith("overwrite it (--force)")
    assert main(["train", "ppo", "--env", "CartPole-v1", "--run-dir", str(taken)]) == 2
    assert "pass --resume to continue it or --force to overwrite it" in capsys.readouterr().err
    assert (taken / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("out", ["", ".", "..", "/"])
def test_an_output_path_with_no_name_is_refused_before_anything_is_written(
    out: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out ''`` is the working directory: writing a dataset there would move it aside."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(DatasetError, match="has no name of its own; expected the path"):
        check_output_dir(out, overwrite=True)
    with pytest.raises(RunDirError, match="expected a file path"), errors.replacing(out):
        pass
    assert main(["collect", str(tmp_path / "run"), "--steps", "10", "--out", out]) == 2
    assert "has no name of its own" in capsys.readouterr().err
    assert sorted(tmp_path.iterdir()) == [work]
    assert not any(work.iterdir())


def test_a_failed_write_names_the_path_the_cause_and_the_free_space(tmp_path: Path) -> None:
    target = tmp_path / "not" / "yet" / "there.bin"
    error = write_error(RunDirError, target, OSError(errno.ENOSPC, "No space left on device"))
    assert isinstance(error, RunDirError)
    free = shutil.disk_usage(tmp_path).free
    message = str(error)
    assert message.startswith(f"{target}: cannot write (No space left on device; ")
    shown = re.search(r"; ([\d.]+) (B|KiB|MiB|GiB|TiB) free on its file system\)$", message)
    assert shown is not None
    scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
    assert float(shown[1]) * scale[shown[2]] == pytest.approx(free, rel=0.05)
    other = write_error(CheckpointError, target, ValueError("  bad\n value "), "save")
    assert str(other).startswith(f"{target}: cannot save (bad value; ")


def test_write_boundaries_call_the_fault_hook_only_when_one_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_boundary("history.renamed", tmp_path)  # no hook: nothing happens
    seen: list[tuple[str, Path]] = []
    monkeypatch.setattr(errors, "FAULT_HOOK", lambda name, path: seen.append((name, path)))
    write_boundary("history.renamed", tmp_path)
    assert seen == [("history.renamed", tmp_path)]


def _write_then_fail(target: Path, error: Exception) -> None:
    from rlfleet.errors import replacing

    with replacing(target) as tmp:
        tmp.write_text("half")
        raise error


def test_replacing_writes_whole_or_not_at_all(tmp_path: Path) -> None:
    from rlfleet.errors import RunDirError, replacing

    target = tmp_path / "sub" / "report.yaml"
    with replacing(target) as tmp:
        assert tmp.parent == target.parent
        assert tmp.suffix == ".yaml"
        tmp.write_text("first")
    assert target.read_text() == "first"
    no_space = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(RunDirError, match=r"report\.yaml: cannot write \(No space left on dev"):
        _write_then_fail(target, no_space)
    with pytest.raises(ValueError, match="not an OSError"):
        _write_then_fail(target, ValueError("not an OSError"))
    assert target.read_text() == "first"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.yaml"]


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_replacing_refuses_a_special_file_and_leaves_it(tmp_path: Path, kind: str) -> None:
    """A FIFO or a socket (as a device such as /dev/null) is not replaced by a file: the
    write is refused before anything is written."""
    import socket
    import stat

    from rlfleet.errors import RunDirError, replacing

    target = tmp_path / "plot.png"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(target))
        server.close()
    name = "a FIFO" if kind == "fifo" else "a socket"
    message = rf"plot\.png: cannot write \(expected a regular file or a new path, got {name}\)"
    with pytest.raises(RunDirError, match=message), replacing(target) as tmp:
        tmp.write_text("never")
    mode = os.lstat(target).st_mode
    assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISSOCK(mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_replacing_replaces_a_symbolic_link_not_its_target(tmp_path: Path) -> None:
    from rlfleet.errors import replacing

    kept = tmp_path / "kept.txt"
    kept.write_text("kept")
    link = tmp_path / "link.txt"
    link.symlink_to(kept)
    with replacing(link) as tmp:
        tmp.write_text("new")
    assert not link.is_symlink()
    assert link.read_text() == "new"
    assert kept.read_text() == "kept"


INTERNAL_RAISES: dict[tuple[str, str], str] = {
    ("rlfleet/nn/precision.py", "RuntimeError"): "a custom network changing a bf16 input in place",
    (
        "rlfleet/nn/cuda_graph.py",
        "ValueError",
    ): "GraphedStep built on a CPU device (the callers check first)",
    ("rlfleet/tune/objective.py", "ValueError"): "an aggregate of no values: a broken invariant",
    ("rlfleet/envs/workers.py", "ValueError"): "an unknown command on the worker pipe",
    ("rlfleet/marl/workers.py", "ValueError"): "an unknown command on the worker pipe",
    ("rlfleet/logging/history.py", "TypeError"): "a logger API given a value it cannot store",
    ("rlfleet/logging/progress.py", "RuntimeError"): "a reporter started twice",
    ("rlfleet/functional.py", "ValueError"): "a functional helper given an argument out of range",
    ("rlfleet/train/cadence.py", "ValueError"): "the cadence helper given no choices",
    ("rlfleet/train/threaded.py", "RuntimeError"): "the collection thread's protocol broken",
    ("rlfleet/algos/registry.py", "ValueError"): "an algorithm class registered twice",
    ("rlfleet/data/rollout.py", "ValueError"): "a fragment that does not fit the learner's storage",
    ("rlfleet/checkpoint/codec.py", "ValueError"): "caught and raised again as CheckpointError",
}
"""The modules that raise one of Python's own exceptions, and why that is never a user's bad
input: a misused internal API or a broken invariant. Everything else rlfleet raises derives
from RlfleetError (the user guide's "Errors"); AttributeError (a module's lazy
``__getattr__``), NotImplementedError, StopIteration and KeyboardInterrupt are Python's
protocols, not errors of input."""


def test_builtin_exceptions_are_raised_only_for_internal_misuse() -> None:
    import ast
    import builtins

    root = Path(errors.__file__).parent
    builtin_errors = {
        name
        for name, value in vars(builtins).items()
        if isinstance(value, type) and issubclass(value, Exception)
    } - {"AttributeError", "NotImplementedError", "StopIteration", "KeyboardInterrupt"}
    found: set[tuple[str, str]] = set()
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(exc, ast.Name) and exc.id in builtin_errors:
                    found.add((f"rlfleet/{path.relative_to(root)}", exc.id))
    assert found == set(INTERNAL_RAISES)
