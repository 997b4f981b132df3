"""Error messages name settings as the caller knows them: Python parameters or CLI flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.cli.main import main
from rlfleet.data.dataset import check_output_dir
from rlfleet.errors import DatasetError, cli_wording, option


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
