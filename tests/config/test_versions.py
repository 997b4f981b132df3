"""Versioned files of a run directory: which one is current, where the next one goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.config.versions import current_version, next_version, versions
from rlfleet.errors import RunDirError


def test_the_file_itself_until_a_numbered_version_exists(tmp_path: Path) -> None:
    assert current_version(tmp_path, "config.yaml") == tmp_path / "config.yaml"
    assert next_version(tmp_path, "config.yaml") == tmp_path / "config.yaml"
    (tmp_path / "config.yaml").write_text("a: 1\n")
    assert current_version(tmp_path, "config.yaml") == tmp_path / "config.yaml"
    assert next_version(tmp_path, "config.yaml") == tmp_path / "config.1.yaml"


def test_the_highest_number_is_current_in_numeric_order(tmp_path: Path) -> None:
    for name in ("config.yaml", "config.1.yaml", "config.2.yaml", "config.10.yaml"):
        (tmp_path / name).write_text("a: 1\n")
    # Not versions: another file's, a zero, a leading zero, a stray suffix, a directory.
    for name in ("run_options.3.yaml", "config.0.yaml", "config.011.yaml", "config.5.yml"):
        (tmp_path / name).write_text("a: 1\n")
    (tmp_path / "config.20.yaml").mkdir()
    assert [n for n, _ in versions(tmp_path, "config.yaml")] == [0, 1, 2, 10]
    assert current_version(tmp_path, "config.yaml") == tmp_path / "config.10.yaml"
    assert next_version(tmp_path, "config.yaml") == tmp_path / "config.11.yaml"
    assert current_version(tmp_path, "run_options.yaml") == tmp_path / "run_options.3.yaml"


def test_a_missing_directory_has_no_versions(tmp_path: Path) -> None:
    assert versions(tmp_path / "nowhere", "config.yaml") == []


def test_a_directory_the_os_refuses_is_a_run_dir_error(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match=r"cannot be read .*expected a run directory"):
        current_version(tmp_path / ("x" * 300), "config.yaml")
