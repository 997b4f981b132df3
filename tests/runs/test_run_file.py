"""``rlfleet train FILE.yaml`` reads a run config or ML-Agents run options, recognised by the
file's top-level keys; errors say which format the file was read as."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.errors import ConfigError
from rlfleet.runs.config import run_config_from_dict
from rlfleet.runs.run_file import RUN_CONFIG, RUN_OPTIONS, read_run_file, reading_as


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("algo: ppo\nenv: {id: CartPole-v1}\n", RUN_CONFIG),
        ("algo: ppo\nenv: {id: CartPole-v1}\nenvironment_parameters: {}\n", RUN_CONFIG),
        ("env_settings: {env_id: CartPole-v1}\n", RUN_OPTIONS),
        ("behaviors: {}\nenvironment_parameters: {}\n", RUN_OPTIONS),
        ("engine_settings: {width: 84}\n", RUN_OPTIONS),
    ],
)
def test_the_top_level_keys_decide_the_format(text: str, expected: str, tmp_path: Path) -> None:
    path = tmp_path / "file.yaml"
    path.write_text(text)
    assert read_run_file(path).format == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "found no top-level keys"),
        ("- a list\n", "found no top-level keys"),
        ("environment_parameters: {}\nlearning_rate: 3\n", "found top-level keys"),
        ("algo: ppo\nbehaviors: {}\n", "not a mix of both (found ['algo', 'behaviors'])"),
    ],
)
def test_a_file_of_neither_format_names_the_keys_of_both(
    text: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "file.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_run_file(path)
    assert message in str(caught.value)
    assert "a run config (keys algo, env, hyperparameters" in str(caught.value)
    assert "ML-Agents run options (keys env_settings, behaviors" in str(caught.value)


def test_errors_say_which_format_the_file_was_read_as(tmp_path: Path) -> None:
    path = tmp_path / "best.yaml"
    path.write_text("algo: ppo\nenv: {id: CartPole-v1}\nhyperparameters: {learnin_rate: 1}\n")
    run_file = read_run_file(path)
    with (
        pytest.raises(ConfigError, match=r"^read as a run config: .*best\.yaml: hyperparam"),
        reading_as(run_file),
    ):
        run_config_from_dict(run_file.data, str(path))


def test_an_unreadable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        read_run_file(tmp_path / "missing.yaml")
