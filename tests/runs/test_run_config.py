"""A run config round-trips losslessly: Python -> YAML -> Python, and Python -> the flags of
``rlfleet train ALGO`` -> Python, for generated configs of every algorithm (hyperparameters,
trainer settings, env settings, seed, device, threads, actor-learner and offline settings)."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import replace
from typing import Any

import annotated_types
import pytest
import tyro
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rlfleet.algos.registry import get_algorithm, list_algorithms
from rlfleet.cli.train import command_class, command_line, default_command
from rlfleet.cli.xagents import XAgentsFlags
from rlfleet.config.fields import MAX_SEED
from rlfleet.config.loader import dump_yaml, load_yaml, yaml_text
from rlfleet.config.located import parse_yaml
from rlfleet.distributed.config import DistributedConfig
from rlfleet.errors import ConfigError
from rlfleet.runs.adapt import lookup
from rlfleet.runs.config import (
    EnvConfig,
    RunConfig,
    check_run_config,
    default_run_config,
    run_config_from_dict,
    run_config_to_dict,
)
from rlfleet.train.loop import TrainerConfig

ENV_IDS = ["CartPole-v1", "Pendulum-v1", "ALE/Pong-v5", "tests.envs.toy_envs:FaultyEnv"]
TEXT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_:/.0123456789", min_size=1, max_size=12)
"""Strings a flag can carry as they are (not "None", not starting with a dash)."""
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "id": st.sampled_from(ENV_IDS),
    "kwargs": st.dictionaries(
        TEXT, st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT, max_size=3
    ),
    "ray_address": st.none() | st.sampled_from(["auto", "ray://head:10001", "10.0.0.1:6379"]),
    # Network sizes that fit in memory (larger ones are refused before anything is built).
    "hidden_sizes": st.lists(st.integers(1, 4096), max_size=4).map(tuple),
    "hidden_units": st.integers(1, 1024),
    "num_layers": st.integers(1, 8),
    "lstm_hidden_size": st.none() | st.integers(1, 1024),
}
"""Fields whose values come from a set of sensible ones rather than from their type."""


def values(hint: Any) -> st.SearchStrategy[Any]:
    """Values of a config field's type, within its ``annotated_types`` constraints."""
    low: float | None = None
    high: float | None = None
    exclusive = False
    high_exclusive = False
    if typing.get_origin(hint) is typing.Annotated:
        hint, *metadata = typing.get_args(hint)
        for marker in metadata:
            if isinstance(marker, annotated_types.Gt):
                low, exclusive = marker.gt, True  # type: ignore[assignment]
            elif isinstance(marker, annotated_types.Ge):
                low = marker.ge  # type: ignore[assignment]
            elif isinstance(marker, annotated_types.Le):
                high = marker.le  # type: ignore[assignment]
            elif isinstance(marker, annotated_types.Interval):
                if marker.gt is not None:
                    low, exclusive = marker.gt, True  # type: ignore[assignment]
                else:
                    low = marker.ge  # type: ignore[assignment]
                if marker.lt is not None:
                    high, high_exclusive = marker.lt, True  # type: ignore[assignment]
                else:
                    high = marker.le  # type: ignore[assignment]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(st.none() if a is type(None) else values(a) for a in args))
    if origin is tuple:
        return st.lists(values(args[0]), max_size=4).map(tuple)
    if hint is type(None):
        return st.none()
    if hint is bool:
        return st.booleans()
    if hint is int:
        start = None if low is None else int(low) + int(exclusive)
        stop = None if high is None else int(high) - int(high_exclusive)
        return st.integers(min_value=start, max_value=stop)
    if hint is float:
        return st.floats(
            min_value=low,
            max_value=high,
            exclude_min=exclusive,
            exclude_max=high_exclusive,
            allow_nan=False,
            allow_infinity=False,
        )
    if hint is str:
        return TEXT
    if dataclasses.is_dataclass(hint):
        return section(hint)
    raise AssertionError(f"no strategy for {hint!r}")


def section(cls: Any) -> st.SearchStrategy[Any]:
    """Instances of a config dataclass with every field generated."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return st.builds(
        cls,
        **{
            f.name: FIELD_VALUES[f.name] if f.name in FIELD_VALUES else values(hints[f.name])
            for f in dataclasses.fields(cls)
        },
    )


@st.composite
def run_configs(draw: st.DrawFn) -> RunConfig:
    """Valid run configs of any algorithm (invalid combinations are rejected)."""
    algo_cls = get_algorithm(draw(st.sampled_from(list_algorithms())))
    cfg = RunConfig(
        algo=algo_cls.name,
        env=draw(section(EnvConfig)),
        hyperparameters=draw(section(algo_cls.config_class)),
        trainer=draw(section(TrainerConfig)),
        seed=draw(st.integers(min_value=0, max_value=MAX_SEED)),
        device=draw(st.sampled_from(["cpu", "cuda", "cuda:1", "mps"])),
        torch_threads=draw(st.none() | st.integers(min_value=1, max_value=64)),
        deterministic=draw(st.booleans()),
        adapt_defaults=draw(st.booleans()),
        adapted=draw(
            st.dictionaries(
                st.sampled_from(["hyperparameters.gamma", "env.num_envs"]),
                st.sampled_from(["episodes run to a 999-step time limit", "a: b (c)"]),
                max_size=2,
            )
        ),
        distributed=(draw(section(DistributedConfig)) if algo_cls.kind == "distributed" else None),
        dataset=(
            draw(st.none() | st.sampled_from(["data/cartpole", "datasets/pendulum v1"]))
            if algo_cls.kind == "offline"
            else None
        ),
    )
    try:
        return check_run_config(cfg, "generated", algorithm_class=algo_cls)
    except ConfigError:
        assume(False)
        raise


ROUND_TRIPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@ROUND_TRIPS
@given(run_configs())
def test_yaml_round_trip(cfg: RunConfig) -> None:
    text = yaml_text(run_config_to_dict(cfg))  # as config.yaml is written
    # As `rlfleet train FILE.yaml` reads it (line-aware), and as `--config FILE` does.
    assert run_config_from_dict(parse_yaml(text, "config.yaml"), "config.yaml") == cfg
    assert run_config_from_dict(yaml.safe_load(text), "config.yaml") == cfg


def test_yaml_round_trip_through_a_file(tmp_path: Any) -> None:
    cfg = default_run_config("sac", "Pendulum-v1")
    path = tmp_path / "config.yaml"
    dump_yaml(run_config_to_dict(cfg), path)
    assert run_config_from_dict(load_yaml(path), str(path)) == cfg


@ROUND_TRIPS
@given(run_configs())
def test_command_line_round_trip(cfg: RunConfig) -> None:
    algo_cls = get_algorithm(cfg.algo)
    # Laid over the preset of another env, so that every value must come from a flag; the
    # settings without flags come from the base, as from a --config file.
    preset = default_run_config(algo_cls, "Acrobot-v1")
    base = replace(
        preset,
        env=replace(preset.env, kwargs=cfg.env.kwargs, atari=cfg.env.atari),
        reward_signals=cfg.reward_signals,
        environment_parameters=cfg.environment_parameters,
        adapted=cfg.adapted,
    )
    command = tyro.cli(
        command_class(algo_cls),
        args=command_line(cfg, algo_cls),
        default=default_command(algo_cls, base, None),
    )
    parsed = command.laid_over()
    # A setting a flag changes is the user's: the record keeps only what the flags left.
    kept = {k: why for k, why in cfg.adapted.items() if lookup(base, k) == lookup(cfg, k)}
    expected = replace(cfg, adapted=kept)
    assert check_run_config(parsed, "command line", algorithm_class=algo_cls) == expected


@pytest.mark.parametrize("name", list_algorithms())
def test_every_flag_of_the_command_is_written(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """command_line leaves out no flag, so the round trip covers every one."""
    monkeypatch.setenv("COLUMNS", "200")
    algo_cls = get_algorithm(name)
    cfg = default_run_config(algo_cls, "CartPole-v1")
    default = default_command(algo_cls, cfg, None)
    with pytest.raises(SystemExit):
        tyro.cli(command_class(algo_cls), args=["--help"], default=default)
    listed = set(re.findall(r"(?<![\w-])--(?:no-)?([a-z][a-z0-9-]*)", capsys.readouterr().out))
    written = {
        re.sub("^no-", "", arg[2:]) for arg in command_line(cfg, algo_cls) if arg.startswith("--")
    }
    # xagents' names are aliases of flags that are written (rlfleet.cli.xagents).
    aliases = {item.name.replace("_", "-") for item in dataclasses.fields(XAgentsFlags)}
    unwritten = {"help", "run-dir", "resume", "schedule-on-resume", "force", "config"}
    assert written == listed - unwritten - aliases


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("adapt_defaults", "no", "adapt_defaults must be true or false, got 'no'"),
        ("adapted", {"hyperparameters.gamma": 0.9}, "adapted must map setting names to reasons"),
        ("adapted", ["gamma"], "adapted must map setting names to reasons"),
    ],
)
def test_bad_adaptation_settings_are_refused(key: str, value: Any, message: str) -> None:
    data = {"algo": "ppo", "env": {"id": "CartPole-v1"}, key: value}
    with pytest.raises(ConfigError, match=re.escape(message)):
        run_config_from_dict(data, "config.yaml")
