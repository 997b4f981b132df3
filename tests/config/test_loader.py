"""YAML written by rlfleet reads back unchanged, with PyYAML and with the line-aware loader;
glob sections of the presets reach the ids they match."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

import pytest
import yaml

from rlfleet.algos.registry import algorithm_classes, algorithms_supporting_images
from rlfleet.config.loader import (
    _preset_file,
    dump_yaml,
    has_named_preset,
    load_yaml,
    preset,
    yaml_text,
)
from rlfleet.config.located import parse_yaml
from rlfleet.distributed.config import DistributedConfig
from rlfleet.errors import ConfigError, RunDirError
from rlfleet.runs.config import EnvConfig, default_run_config, run_config_from_dict
from rlfleet.train.loop import TrainerConfig


def test_text_that_looks_like_an_exponent_float_stays_text(tmp_path: Path) -> None:
    data = {"key": "1e5", "1E-3": "x", "number": 1e5, "rate": 3e-4, "list": ["2e2", 2e2]}
    assert parse_yaml(yaml_text(data), "x.yaml") == data
    assert yaml.safe_load(yaml_text(data)) == data
    dump_yaml(data, tmp_path / "x.yaml")
    assert load_yaml(tmp_path / "x.yaml") == data


@pytest.mark.parametrize(
    ("section", "setting", "where"),
    [
        ("trainer", {"target_reward": float("nan")}, "trainer.target_reward"),
        ("hyperparameters", {"log_std_init": float("nan")}, "hyperparameters.log_std_init"),
    ],
)
def test_no_setting_is_nan_even_without_a_bound(
    section: str, setting: dict[str, object], where: str
) -> None:
    # YAML's .nan reaches these unbounded floats as a float NaN.
    data = {"algo": "ppo", "env": {"id": "Pendulum-v1"}, section: setting}
    with pytest.raises(ConfigError, match=rf"^f\.yaml: {where}: expected a number, got nan$"):
        run_config_from_dict(data, "f.yaml")


def _holds_a_float(hint: object) -> bool:
    """Whether a field's type takes a float: ``float``, or one inside ``Annotated``, a union
    or ``| None``."""
    if hint is float:
        return True
    return any(_holds_a_float(arg) for arg in typing.get_args(hint))


def _float_fields(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return [f.name for f in dataclasses.fields(cls) if _holds_a_float(hints[f.name])]


NAN_CASES = [
    *[("ppo", "trainer", name) for name in _float_fields(TrainerConfig)],
    *[("ppo", "env", name) for name in _float_fields(EnvConfig)],
    *[("impala", "distributed", name) for name in _float_fields(DistributedConfig)],
    *[
        (algo, "hyperparameters", name)
        for algo, cls in algorithm_classes().items()
        for name in _float_fields(cls.config_class)
    ],
]


@pytest.mark.parametrize(("algo", "section", "name"), NAN_CASES)
def test_no_float_setting_of_any_config_may_be_nan(algo: str, section: str, name: str) -> None:
    """docs/reliability.md: no setting of a config file may be NaN: every float field of
    every algorithm's hyperparameters and of the trainer, env and distributed sections."""
    assert len(NAN_CASES) > 100
    data = {"algo": algo, "env": {"id": "Pendulum-v1"}}
    data[section] = {**data.get(section, {}), name: float("nan")}  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=rf"^f\.yaml: {section}\.{name}: .*nan"):
        run_config_from_dict(data, "f.yaml")


def test_an_envs_own_kwargs_pass_as_they_are_nan_included() -> None:
    data = {"algo": "ppo", "env": {"id": "Pendulum-v1", "kwargs": {"g": float("nan")}}}
    assert math.isnan(run_config_from_dict(data, "f.yaml").env.kwargs["g"])


def test_a_yaml_file_that_cannot_be_written_is_a_run_dir_error(tmp_path: Path) -> None:
    dump_yaml({"a": 1}, tmp_path / "x.yaml")
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    with pytest.raises(RunDirError, match=r"file/x\.yaml: cannot write \(.* free on its file"):
        dump_yaml({"a": 2}, blocked / "x.yaml")
    assert yaml.safe_load((tmp_path / "x.yaml").read_text()) == {"a": 1}


def test_minatar_presets_give_every_image_algorithm_the_minatar_network() -> None:
    # All but SAC, whose section names Freeway alone (docs/spaces.md).
    for algo in sorted(set(algorithms_supporting_images()) - {"sac"}):
        hyperparameters = preset(algo, "MinAtar/Breakout-v1")["hyperparameters"]
        assert hyperparameters["cnn"] == "minatar", algo
    freeway = preset("sac", "MinAtar/Freeway-v1")["hyperparameters"]
    assert (freeway["cnn"], freeway["hidden_sizes"]) == ("minatar", [])
    for game in ("Breakout", "SpaceInvaders"):
        assert "cnn" not in preset("sac", f"MinAtar/{game}-v1")["hyperparameters"], game
    assert preset("ppo", "MinAtar/SpaceInvaders-v0")["hyperparameters"]["hidden_sizes"] == []
    # DQN's sections name Breakout and Freeway (docs/spaces.md): on SpaceInvaders it flattens
    # the grids into the generic default's MLP.
    for game in ("Breakout", "Freeway"):
        hyperparameters = preset("dqn", f"MinAtar/{game}-v1")["hyperparameters"]
        assert (hyperparameters["cnn"], hyperparameters["hidden_sizes"]) == ("minatar", []), game
    assert "cnn" not in preset("dqn", "MinAtar/SpaceInvaders-v1")["hyperparameters"]


@pytest.mark.parametrize("algo", algorithm_classes())
def test_every_preset_section_is_a_valid_run_config(algo: str) -> None:
    # A misspelt key or a value out of range in any section fails here, not on the first
    # user who trains that env; glob sections are checked on an id they match.
    sections = _preset_file(algo)
    for key in sections:
        env_id = key.replace("*", "Example-v1") if "*" in key else key
        if key != "default":
            assert has_named_preset(algo, env_id), key
        default_run_config(algo, "Example-v1" if key == "default" else env_id)


@pytest.mark.parametrize("algo", algorithm_classes())
def test_no_preset_turns_on_compile_bf16_or_cuda_graphs(algo: str) -> None:
    # They stay opt-in for every algorithm (docs/user-guide.md, "Compiled update steps and
    # bf16"): none won whole-process where measured.
    for key, section in _preset_file(algo).items():
        trainer = section.get("trainer") or {}
        assert not trainer.get("compile"), (algo, key)
        assert not trainer.get("cuda_graphs"), (algo, key)
        assert trainer.get("precision", "fp32") == "fp32", (algo, key)


def test_the_pendulum_presets_of_the_gsde_algorithms_use_it() -> None:
    # docs/spaces.md: "The Pendulum-v1 presets of all three use it" (PPO, A2C and TRPO: the
    # algorithms whose config has use_sde).
    with_sde = sorted(
        name
        for name, cls in algorithm_classes().items()
        if "use_sde" in {f.name for f in dataclasses.fields(cls.config_class)}
    )
    assert with_sde == ["a2c", "ppo", "trpo"]
    for name in with_sde:
        assert preset(name, "Pendulum-v1")["hyperparameters"]["use_sde"] is True, name
