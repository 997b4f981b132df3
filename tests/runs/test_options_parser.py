"""Fuzzing the run options loader: whatever the YAML, the only error is a ConfigError."""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlfleet.config.located import parse_yaml
from rlfleet.errors import ConfigError
from rlfleet.runs.from_options import run_config_from_options
from rlfleet.runs.options_parser import parse_run_options
from tests.runs.test_run_options import FULL

KEYS = [
    "env_settings", "behaviors", "default_settings", "environment_parameters",
    "torch_settings", "checkpoint_settings", "env_id", "num_envs", "seed", "CartPole",
    "trainer_type", "hyperparameters", "network_settings", "reward_signals", "max_steps",
    "time_horizon", "extrinsic", "curiosity", "rnd", "gail", "gamma", "strength",
    "learning_rate", "batch_size", "curriculum", "name", "value", "completion_criteria",
    "behavior", "measure", "threshold", "sampler_type", "sampler_parameters", "min_value",
    "max_value", "intervals", "memory", "resume", "force", "run_id", "length", "uniform",
    "trainer_settings", "demo_path", "hidden_units",
]  # fmt: skip
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(KEYS),
)
structures = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(
            st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), children, max_size=5
        ),
    ),
    max_leaves=25,
)


def _load_only_config_errors(text: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            options = parse_run_options(parse_yaml(text, "fuzz.yaml"), "fuzz.yaml")
            run_config_from_options(options)
        except ConfigError:
            pass


@FUZZ
@given(st.text(max_size=300))
def test_random_text(text: str) -> None:
    _load_only_config_errors(text)


@FUZZ
@given(st.dictionaries(st.sampled_from(KEYS[:6]), structures, max_size=6))
def test_random_structures(document: dict[str, Any]) -> None:
    _load_only_config_errors(yaml.safe_dump(document))


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += _paths(value, (*prefix, i))
    return out


def _at(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


VALID = yaml.safe_load(FULL)
VALID_PATHS = _paths(VALID)


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(VALID_PATHS), structures), min_size=1, max_size=3))
def test_valid_file_with_random_values(mutations: list[tuple[tuple[Any, ...], Any]]) -> None:
    document = copy.deepcopy(VALID)
    for path, value in mutations:
        node = document
        for key in path[:-1]:
            if not isinstance(node, dict | list):
                break
            try:
                node = node[key]
            except (KeyError, IndexError, TypeError):
                break
        else:
            last = path[-1]
            if isinstance(node, dict) or (
                isinstance(node, list) and isinstance(last, int) and last < len(node)
            ):
                node[last] = value
    _load_only_config_errors(yaml.safe_dump(document))


NUMBER_PATHS = [
    path
    for path in VALID_PATHS
    if isinstance(_at(VALID, path), int | float) and not isinstance(_at(VALID, path), bool)
]


@pytest.mark.parametrize("path", NUMBER_PATHS, ids=[".".join(map(str, p)) for p in NUMBER_PATHS])
def test_no_number_of_a_run_options_file_may_be_nan(path: tuple[Any, ...]) -> None:
    """docs/reliability.md: no setting of a run options file may be NaN: each number of a
    file that sets every section, made NaN, is refused, naming its line."""
    document = copy.deepcopy(VALID)
    parent = _at(document, path[:-1])
    parent[path[-1]] = float("nan")
    text = yaml.safe_dump(document, sort_keys=False)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if row.endswith(".nan"))
    with pytest.raises(ConfigError, match=rf"^f\.yaml line {line}: nan is not a finite number"):
        parse_run_options(parse_yaml(text, "f.yaml"), "f.yaml")
