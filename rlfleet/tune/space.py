"""Search spaces: which run-config values a study varies, and over which ranges.

A search space is YAML with the sections of a run config. Each entry names a field of
that section's config dataclass and says how to choose it::

    hyperparameters:                        # the algorithm's config (e.g. PPOConfig)
      learning_rate: {low: 1.0e-5, high: 1.0e-2, log: true}   # float range, log-uniform
      num_epochs: {low: 1, high: 20}        # int range: the field is an int
      batch_size: {choices: [64, 128, 256]} # categorical
      hidden_sizes: {choices: [[64, 64], [256, 256]]}          # choices may be lists
      ent_coef: 0.0                         # fixed: set in every trial, not searched
    env:
      num_envs: {choices: [4, 8, 16]}
      kwargs: {value: {max_episode_steps: 200}}   # fix a mapping-valued field
    trainer:
      plateau_reduce_patience: {choices: [null, 3]}
    extend_default: true                    # start from the shipped space (the default)

Ranges are ``{low, high}`` with optional ``log: true`` or ``step``; whether a range is
sampled as int or float follows the field's type. A user file is laid over the space
shipped for the algorithm (``rlfleet/tune/spaces/<algo>.yaml``) entry by entry: an entry
replaces the shipped entry of the same name as a whole. ``extend_default: false`` starts
from an empty space instead.

Everything is checked before a study starts: unknown fields (with the closest name
suggested), empty ranges and choices, and every bound and choice against the field's own
constraints (``gamma`` above 1 is refused here, not in trial 7).
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from rlfleet.algos.registry import get_algorithm
from rlfleet.config.loader import load_yaml, merge, to_dict, validate
from rlfleet.errors import ConfigError, option
from rlfleet.runs.config import EnvConfig, RunConfig, run_config_from_dict, run_config_to_dict
from rlfleet.train.loop import TrainerConfig

if TYPE_CHECKING:
    import optuna

Section = Literal["hyperparameters", "env", "trainer"]
SECTIONS: tuple[Section, ...] = ("hyperparameters", "env", "trainer")
EXTEND_KEY = "extend_default"
_FIXED_KEY = "value"
_RANGE_KEYS = frozenset({"low", "high", "log", "step"})
_UNTUNABLE = {("env", "id"): "the env is the study's, one per study"}

Primitive = None | bool | int | float | str
SPACES = resources.files("rlfleet.tune") / "spaces"
"""The shipped default spaces, one ``<algo>.yaml`` each: a new file needs no code."""


@dataclass(frozen=True)
class FloatRange:
    """Floats in ``[low, high]``, log-uniform when ``log``, on a grid of ``step`` if set."""

    low: float
    high: float
    log: bool = False
    step: float | None = None


@dataclass(frozen=True)
class IntRange:
    """Integers in ``[low, high]``, log-uniform when ``log``, every ``step``-th one."""

    low: int
    high: int
    log: bool = False
    step: int = 1


@dataclass(frozen=True)
class Choice:
    """One of ``choices``; a choice that is a list or mapping is sampled by its YAML label."""

    choices: tuple[Any, ...]

    def labels(self) -> list[Primitive]:
        """What the sampler sees: the choices themselves, or YAML labels for lists/mappings
        (Optuna stores categorical values as primitives)."""
        return [_label(choice) for choice in self.choices]


@dataclass(frozen=True)
class Fixed:
    """A value set in every trial and not searched."""

    value: Any


Dimension = FloatRange | IntRange | Choice | Fixed


@dataclass(frozen=True)
class Param:
    """One entry of a search space: a field of one run-config section and its dimension."""

    section: Section
    field: str
    dimension: Dimension

    @property
    def name(self) -> str:
        """The parameter's name in the study: the field name for hyperparameters,
        ``section.field`` for the env and trainer sections."""
        return self.field if self.section == "hyperparameters" else f"{self.section}.{self.field}"


@dataclass(frozen=True)
class SearchSpace:
    """A validated search space for one algorithm."""

    algo: str
    params: tuple[Param, ...]
    source: str
    """Where it came from, for messages (``default ppo space`` and/or a file path)."""

    @property
    def searched(self) -> list[Param]:
        """The parameters that vary between trials (not the fixed ones)."""
        return [p for p in self.params if not isinstance(p.dimension, Fixed)]

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Sample every parameter for ``trial``; returns run-config overrides by section."""
        overrides: dict[str, Any] = {}
        for param in self.params:
            overrides.setdefault(param.section, {})[param.field] = _sample(trial, param)
        return overrides

    def to_dict(self) -> dict[str, Any]:
        """The space in its YAML format (fully resolved, ``extend_default: false``)."""
        out: dict[str, Any] = {}
        for param in self.params:
            out.setdefault(param.section, {})[param.field] = _dimension_to_yaml(param.dimension)
        out[EXTEND_KEY] = False
        return out

    def describe(self) -> str:
        """One line naming the searched parameters and their ranges."""
        parts = [f"{p.name} {_describe(p.dimension)}" for p in self.searched]
        return "; ".join(parts) if parts else "nothing (every entry is fixed)"


def shipped_spaces() -> list[str]:
    """Algorithms that have a default search space in the package."""
    return sorted(
        p.name.removesuffix(".yaml") for p in SPACES.iterdir() if p.name.endswith(".yaml")
    )


def load_search_space(base: RunConfig, path: str | Path | None = None) -> SearchSpace:
    """The search space for ``base.algo``: the shipped default, with ``path`` laid over it.

    Every bound, choice and fixed value is validated against ``base`` (the run config each
    trial starts from), so a space that cannot produce a valid run config is refused here.

    Raises:
        ConfigError: no space exists for the algorithm (none shipped, no file given), the
            file is not a valid search space, or a value breaks its field's constraints.
    """
    algo = get_algorithm(base.algo).name
    default_file = SPACES / f"{algo}.yaml"
    if not default_file.is_file() and path is None:
        raise ConfigError(
            f"no default search space for {algo!r} (shipped: {', '.join(shipped_spaces())}); "
            f"write one and pass {option('search_space', 'FILE')} (format: docs/tuning.md)"
        )
    # Each entry remembers the file it came from, so that an error names that file.
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if default_file.is_file():
        layers.append((f"default {algo} space", yaml.safe_load(default_file.read_text()) or {}))
    if path is not None:
        user = load_yaml(path) or {}
        if not isinstance(user, Mapping):
            raise ConfigError(
                f"{path}: expected a mapping with sections {', '.join(SECTIONS)}, "
                f"got {type(user).__name__}"
            )
        _check_names(user, [*SECTIONS, EXTEND_KEY], str(path), "key")
        extend = user.get(EXTEND_KEY, True)
        if not isinstance(extend, bool):
            raise ConfigError(f"{path}: {EXTEND_KEY} must be true or false, got {extend!r}")
        layers = [*layers, (str(path), user)] if extend else [(str(path), user)]
    # A later layer's entry replaces an earlier one of the same name as a whole.
    entries: dict[tuple[Section, str], tuple[Any, str]] = {}
    for source, data in layers:
        for section in SECTIONS:
            for name, entry in _section_entries(data, section, source).items():
                entries[section, name] = (entry, source)
    params = [
        _parse_param(section, name, entry, base, source)
        for (section, name), (entry, source) in entries.items()
    ]
    return SearchSpace(
        algo=algo, params=tuple(params), source=" over the ".join(s for s, _ in reversed(layers))
    )


def apply_overrides(base: RunConfig, overrides: Mapping[str, Any], where: str) -> RunConfig:
    """``base`` with sampled ``overrides`` (from :meth:`SearchSpace.suggest`) merged in."""
    return run_config_from_dict(merge(run_config_to_dict(base), overrides), where)


# --------------------------------------------------------------------- parsing
def _section_entries(data: Mapping[str, Any], section: str, where: str) -> dict[str, Any]:
    entries = data.get(section) or {}
    if not isinstance(entries, Mapping):
        raise ConfigError(
            f"{where}: {section} must be a mapping of field: range/choices/value, "
            f"got {type(entries).__name__}"
        )
    return dict(entries)


def _section_class(section: Section, base: RunConfig) -> type[Any]:
    if section == "hyperparameters":
        cls: type[Any] = get_algorithm(base.algo).config_class
        return cls
    return EnvConfig if section == "env" else TrainerConfig


def _section_values(section: Section, base: RunConfig) -> dict[str, Any]:
    config = {"hyperparameters": base.hyperparameters, "env": base.env, "trainer": base.trainer}
    return to_dict(config[section])


def _parse_param(section: Section, name: Any, entry: Any, base: RunConfig, source: str) -> Param:
    cls = _section_class(section, base)
    owner = f"{base.algo} hyperparameter" if section == "hyperparameters" else f"{section} field"
    _check_names([name], [f.name for f in fields(cls)], f"{source}: {section}", owner)
    if (section, name) in _UNTUNABLE:
        raise ConfigError(
            f"{source}: {section}.{name} cannot be searched ({_UNTUNABLE[section, name]})"
        )
    where = f"{source}: {section}.{name}"
    dimension = _parse_dimension(entry, _numeric_kind(cls, name), where)
    param = Param(section=section, field=name, dimension=dimension)
    for value in _extreme_values(dimension):
        validate(cls, {**_section_values(section, base), name: value}, f"{source}: {section}")
    return param


def _parse_dimension(entry: Any, kind: type[int] | type[float] | None, where: str) -> Dimension:
    if not isinstance(entry, Mapping):
        return Fixed(entry)
    keys = set(entry)
    if keys == {_FIXED_KEY}:
        return Fixed(entry[_FIXED_KEY])
    if keys == {"choices"}:
        return _parse_choices(entry["choices"], where)
    if {"low", "high"} <= keys <= _RANGE_KEYS:
        return _parse_range(entry, kind, where)
    raise ConfigError(
        f"{where}: expected {{low, high}} (with optional log, step), {{choices: [...]}}, "
        f"{{value: ...}} or a plain value; got keys {sorted(map(str, keys))}"
    )


def _parse_choices(choices: Any, where: str) -> Choice:
    if not isinstance(choices, list) or not choices:
        raise ConfigError(f"{where}: choices must be a non-empty list, got {choices!r}")
    choice = Choice(tuple(choices))
    labels = choice.labels()
    duplicates = sorted({str(x) for x in labels if labels.count(x) > 1})
    if duplicates:
        raise ConfigError(f"{where}: choices repeat {', '.join(duplicates)}; list each once")
    return choice


def _parse_range(
    entry: Mapping[str, Any], kind: type[int] | type[float] | None, where: str
) -> FloatRange | IntRange:
    if kind is None:
        raise ConfigError(
            f"{where}: a low/high range needs an int or float field; list the values to try "
            "as {choices: [...]} instead"
        )
    low, high, log, step = entry["low"], entry["high"], entry.get("log", False), entry.get("step")
    if not isinstance(log, bool):
        raise ConfigError(f"{where}: log must be true or false, got {log!r}")
    for label, value in (("low", low), ("high", high), ("step", step)):
        if value is None and label == "step":
            continue
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{where}: {label} must be an integer (an int field), got {value!r}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: {label} must be a number, got {value!r}")
    if low > high:
        raise ConfigError(f"{where}: empty range: low ({low}) is greater than high ({high})")
    if log and low <= 0:
        raise ConfigError(f"{where}: a log range needs low > 0, got low = {low}")
    if step is not None and step <= 0:
        raise ConfigError(f"{where}: step must be positive, got {step}")
    if log and step is not None:
        raise ConfigError(f"{where}: a range is either log or stepped, not both")
    if kind is int:
        return IntRange(low=low, high=high, log=log, step=1 if step is None else step)
    return FloatRange(low=float(low), high=float(high), log=log, step=step)


def _numeric_kind(cls: type[Any], name: str) -> type[int] | type[float] | None:
    """``int`` or ``float`` when the field holds one of them (optionally ``None``), else None."""
    hint = typing.get_type_hints(cls)[name]
    members = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    if len(members) == 1 and members[0] in (int, float):
        kind: type[int] | type[float] = members[0]
        return kind
    return None


def _extreme_values(dimension: Dimension) -> list[Any]:
    """Values that together exercise every constraint of the field: bounds of a range (the
    constraints are monotone), every choice, the fixed value."""
    if isinstance(dimension, FloatRange | IntRange):
        return [dimension.low, dimension.high]
    if isinstance(dimension, Choice):
        return list(dimension.choices)
    return [dimension.value]


def _check_names(names: Iterable[Any], valid: list[str], where: str, what: str) -> None:
    for key in names:
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (valid: {', '.join(valid)})"
            raise ConfigError(f"{where}: unknown {what} {key!r}{hint}")


# -------------------------------------------------------------------- sampling
def _label(value: Any) -> Primitive:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(yaml.safe_dump(value, default_flow_style=True, width=10_000).strip())


def _sample(trial: optuna.Trial, param: Param) -> Any:
    dim, name = param.dimension, param.name
    if isinstance(dim, Fixed):
        return dim.value
    if isinstance(dim, FloatRange):
        return trial.suggest_float(name, dim.low, dim.high, log=dim.log, step=dim.step)
    if isinstance(dim, IntRange):
        return trial.suggest_int(name, dim.low, dim.high, log=dim.log, step=dim.step)
    labels = dim.labels()
    picked = trial.suggest_categorical(name, labels)
    return dim.choices[labels.index(picked)]


def _dimension_to_yaml(dim: Dimension) -> Any:
    if isinstance(dim, Fixed):
        return {_FIXED_KEY: dim.value} if isinstance(dim.value, Mapping) else dim.value
    if isinstance(dim, Choice):
        return {"choices": list(dim.choices)}
    out: dict[str, Any] = {"low": dim.low, "high": dim.high}
    if dim.log:
        out["log"] = True
    # An int range always has a step; 1 is the default and goes unsaid.
    if dim.step is not None and not (isinstance(dim, IntRange) and dim.step == 1):
        out["step"] = dim.step
    return out


def _describe(dim: Dimension) -> str:
    if isinstance(dim, Choice):
        return "{" + ", ".join(str(label) for label in dim.labels()) + "}"
    if isinstance(dim, FloatRange | IntRange):
        scale = " log" if dim.log else ""
        return f"[{dim.low:g}, {dim.high:g}]{scale}"
    return f"= {dim.value!r}"
