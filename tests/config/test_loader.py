"""YAML written by rlfleet reads back unchanged, with PyYAML and with the line-aware loader;
glob sections of the presets reach the ids they match."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlfleet.algos.registry import algorithms_supporting_images
from rlfleet.config.loader import dump_yaml, load_yaml, preset, yaml_text
from rlfleet.config.located import parse_yaml
from rlfleet.errors import RunDirError


def test_text_that_looks_like_an_exponent_float_stays_text(tmp_path: Path) -> None:
    data = {"key": "1e5", "1E-3": "x", "number": 1e5, "rate": 3e-4, "list": ["2e2", 2e2]}
    assert parse_yaml(yaml_text(data), "x.yaml") == data
    assert yaml.safe_load(yaml_text(data)) == data
    dump_yaml(data, tmp_path / "x.yaml")
    assert load_yaml(tmp_path / "x.yaml") == data


def test_a_yaml_file_that_cannot_be_written_is_a_run_dir_error(tmp_path: Path) -> None:
    dump_yaml({"a": 1}, tmp_path / "x.yaml")
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.raises(RunDirError, match=r"file/x\.yaml: cannot write \(.* free on its file"):
        dump_yaml({"a": 2}, blocked / "x.yaml")
    assert yaml.safe_load((tmp_path / "x.yaml").read_text()) == {"a": 1}


def test_minatar_presets_give_every_image_algorithm_the_minatar_network() -> None:
    for algo in algorithms_supporting_images():
        hyperparameters = preset(algo, "MinAtar/Breakout-v1")["hyperparameters"]
        assert hyperparameters["cnn"] == "minatar", algo
    assert preset("ppo", "MinAtar/SpaceInvaders-v0")["hyperparameters"]["hidden_sizes"] == []
