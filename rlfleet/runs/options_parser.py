"""Reading run options: YAML (plus ``--set`` overrides) into :class:`RunOptions`.

Everything is checked before anything runs, and every error is one
:class:`~rlfleet.errors.ConfigError` naming the file, the line and the key, e.g.::

    cartpole.yaml line 7: behaviors.CartPole.hyperparameters.learnin_rate: unknown key;
    did you mean 'learning_rate'?

Checks: unknown keys (closest valid key suggested; ML-Agents keys that rlfleet names
differently get a hint), wrong types, values out of range, sampler bounds, curricula
naming unknown behaviors or lessons that can never end, more behaviors than the env has,
an unregistered env id, parameters a built-in env does not have, a missing demonstration
file, ``resume`` together with ``force``.

The reward-signal and environment-parameter parsers are also what
:func:`rlfleet.runs.run.run_config_from_dict` uses for those sections of ``config.yaml``.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

import gymnasium as gym
import pydantic

from rlfleet.algos.registry import get_algorithm, list_algorithms
from rlfleet.config.loader import merge
from rlfleet.config.located import LocatedDict, line_of, parse_yaml
from rlfleet.envs.curriculum import CompletionCriteria, EnvironmentParameterSettings, Lesson
from rlfleet.envs.parameters import (
    SAMPLER_ALIASES,
    SAMPLER_CLASSES,
    ConstantSampler,
    Sampler,
    unknown_builtin_parameters,
)
from rlfleet.errors import ConfigError
from rlfleet.rewards.settings import RewardSignalsSettings, default_reward_signals
from rlfleet.runs.run_options import (
    OWNED_HYPERPARAMETERS,
    OWNED_TRAINER_SETTINGS,
    BehaviorSettings,
    CheckpointSettings,
    EnvSettings,
    RunOptions,
    TorchSettings,
)
from rlfleet.train.trainer import TrainerConfig

T = TypeVar("T")
KeyPath = tuple[Any, ...]

HINTS: dict[str, str] = {
    "engine_settings": "Unity engine settings have no Gymnasium equivalent; remove the section",
    "env_path": "rlfleet names a Gymnasium env by id: use env_settings.env_id",
    "env_args": "use env_settings.env_kwargs",
    "lambd": "ML-Agents' lambd is hyperparameters.gae_lambda",
    "beta": "ML-Agents' beta (entropy bonus) is hyperparameters.ent_coef",
    "epsilon": "ML-Agents' epsilon (clip range) is hyperparameters.clip_range",
    "num_epoch": "ML-Agents' num_epoch is hyperparameters.num_epochs",
    "learning_rate_schedule": "ML-Agents' learning_rate_schedule is hyperparameters.lr_schedule",
    "epsilon_schedule": "ML-Agents' epsilon_schedule is hyperparameters.clip_range_schedule",
    "buffer_size": (
        "PPO updates after time_horizon x env_settings.num_envs steps: set time_horizon"
    ),
    "buffer_init_steps": "ML-Agents' buffer_init_steps is hyperparameters.learning_starts",
    "init_entcoef": "ML-Agents' init_entcoef is hyperparameters.ent_coef_init",
    "steps_per_update": (
        "ML-Agents' steps_per_update is hyperparameters.train_freq (env steps per update) "
        "with gradient_steps"
    ),
    "reward_signal_steps_per_update": (
        "off-policy reward signals learn from every sampled minibatch; remove the key"
    ),
    "save_replay_buffer": "use trainer_settings.save_replay_buffer",
    "init_path": "use checkpoint_settings.initialize_from",
    "torch_device": "use torch_settings.device",
}
"""ML-Agents keys that rlfleet spells differently or does not have -> what to write."""
_SECTIONS = {f.name for f in dataclasses.fields(RunOptions)}
_OPTIONAL_SECTION_TYPES: dict[str, type[Any]] = {
    "torch_settings": TorchSettings,
    "checkpoint_settings": CheckpointSettings,
}


class _Reader:
    """Builds typed configs from located YAML data; errors name file, line and key."""

    def __init__(self, root: Any, source: str, overrides: Mapping[KeyPath, str]) -> None:
        self.root = root
        self.source = source
        self.overrides = dict(overrides)

    # -------------------------------------------------------------- errors
    def where(self, path: KeyPath) -> str:
        for i in range(len(path), 0, -1):
            if path[:i] in self.overrides:
                return self.overrides[path[:i]]
        candidates = [path]
        if len(path) >= 2 and path[0] == "behaviors":
            candidates.append(("default_settings", *path[2:]))
        best: tuple[int | None, int] = line_of(self.root, path)
        for candidate in candidates:
            line, found = line_of(self.root, candidate)
            if found == len(candidate) and line is not None:
                best = (line, found)
                break
        line = best[0]
        return f"{self.source} line {line}" if line is not None else self.source

    def error(self, path: KeyPath, message: str) -> ConfigError:
        key = dotted(path)
        return ConfigError(f"{self.where(path)}: {key + ': ' if key else ''}{message}")

    def unknown_key(self, path: KeyPath, key: Any, valid: Sequence[str]) -> ConfigError:
        if str(key) in HINTS:
            return self.error((*path, key), f"unknown key; {HINTS[str(key)]}")
        close = difflib.get_close_matches(str(key), list(valid), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
        return self.error((*path, key), f"unknown key; {hint}")

    # ------------------------------------------------------------ building
    def mapping(self, data: Any, path: KeyPath, what: str) -> Mapping[Any, Any]:
        if data is None:
            return {}
        if not isinstance(data, Mapping):
            raise self.error(path, f"expected a mapping of {what}, got {describe(data)}")
        return data

    def build(self, cls: type[T], data: Any, path: KeyPath, **built: Any) -> T:
        """A ``cls`` dataclass from a mapping; ``built`` fields are given already built."""
        data = self.mapping(data, path, f"{cls.__name__} settings")
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        for key in data:
            if key not in names:
                raise self.unknown_key(path, key, names)
        hints = get_type_hints(cls, include_extras=True)
        payload = {str(k): v for k, v in data.items()}
        for name, value in payload.items():
            if name not in built:
                self.precheck(hints[name], value, (*path, name))
        payload.update(built)
        try:
            return _adapter(cls).validate_python(payload)  # type: ignore[no-any-return]
        except pydantic.ValidationError as err:
            first = err.errors()[0]
            loc = tuple(p for p in first["loc"] if isinstance(p, int) or str(p).isidentifier())
            message = first["msg"]
            got = f" (got {first['input']!r})" if first["type"] != "missing" else ""
            text = (
                "required key missing"
                if first["type"] == "missing"
                else message[0].lower() + message[1:]
            )
            raise self.error((*path, *loc), text + got) from None

    def precheck(self, hint: Any, value: Any, path: KeyPath) -> None:
        """What pydantic would let through: unknown keys in nested settings, and booleans
        where numbers belong (pydantic reads ``true`` as 1)."""
        hint = _strip_annotated(hint)
        if value is None:
            return
        if _is_union(hint):
            members = [m for m in get_args(hint) if m is not type(None)]
            if len(members) == 1:
                self.precheck(members[0], value, path)
            return
        if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
            names = [f.name for f in dataclasses.fields(hint)]
            hints = get_type_hints(hint, include_extras=True)
            for key, item in value.items():
                if key not in names:
                    raise self.unknown_key(path, key, names)
                self.precheck(hints[key], item, (*path, key))
            return
        if hint in (int, float) and isinstance(value, bool):
            raise self.error(path, f"expected a number, got {value!r}")
        if get_origin(hint) in (tuple, list) and isinstance(value, list):
            args = [a for a in get_args(hint) if a is not Ellipsis]
            for i, item in enumerate(value):
                if args:
                    self.precheck(args[min(i, len(args) - 1)], item, (*path, i))

    # ----------------------------------------------------- reward signals
    def reward_signals(self, data: Any, path: KeyPath) -> RewardSignalsSettings:
        if data is None:
            return default_reward_signals()
        signals = self.build(RewardSignalsSettings, data, path)
        if signals.gail is not None and not Path(signals.gail.demo_path).is_file():
            raise self.error(
                (*path, "gail", "demo_path"),
                f"demonstration file {signals.gail.demo_path!r} not found (relative paths "
                "start at the working directory)",
            )
        return signals

    # --------------------------------------------- environment parameters
    def environment_parameters(
        self, data: Any, path: KeyPath, behaviors: Sequence[str] | None
    ) -> dict[str, EnvironmentParameterSettings]:
        """Parameters by name; ``behaviors`` None accepts any behavior name in criteria."""
        data = self.mapping(data, path, "environment parameters")
        out: dict[str, EnvironmentParameterSettings] = {}
        for name, value in data.items():
            where = (*path, name)
            if not isinstance(name, str) or not name:
                raise self.error(where, "a parameter name must be a non-empty string")
            if isinstance(value, Mapping) and "curriculum" in value:
                extra = [k for k in value if k != "curriculum"]
                if extra:
                    raise self.unknown_key(where, extra[0], ["curriculum"])
                out[name] = self.curriculum(value["curriculum"], (*where, "curriculum"), behaviors)
            else:
                sampler = self.sampler(value, where)
                out[name] = EnvironmentParameterSettings([Lesson(sampler.sampler_type, sampler)])
        return out

    def sampler(self, value: Any, path: KeyPath) -> Sampler:
        """A number (constant) or ``{sampler_type: ..., sampler_parameters: {...}}``."""
        if isinstance(value, int | float) and not isinstance(value, bool):
            return ConstantSampler(float(value))
        if not isinstance(value, Mapping):
            raise self.error(
                path,
                "expected a number, a sampler {sampler_type, sampler_parameters} or "
                f"{{curriculum: [lessons]}}, got {describe(value)}",
            )
        for key in value:
            if key not in ("sampler_type", "sampler_parameters"):
                raise self.unknown_key(path, key, ["sampler_type", "sampler_parameters"])
        kind = value.get("sampler_type")
        kind = SAMPLER_ALIASES.get(kind, kind) if isinstance(kind, str) else kind
        if not isinstance(kind, str) or kind not in SAMPLER_CLASSES:
            raise self.error(
                (*path, "sampler_type"),
                f"expected one of {', '.join(SAMPLER_CLASSES)}, got {kind!r}",
            )
        params_path = (*path, "sampler_parameters")
        sampler = self.build(SAMPLER_CLASSES[kind], value.get("sampler_parameters"), params_path)
        problem = sampler.problem()
        if problem:
            first_key = next(
                iter(self.mapping(value.get("sampler_parameters"), params_path, "")), None
            )
            raise self.error(
                params_path if first_key is None else (*params_path, first_key), problem
            )
        return sampler

    def curriculum(
        self, data: Any, path: KeyPath, behaviors: Sequence[str] | None
    ) -> EnvironmentParameterSettings:
        if not isinstance(data, list) or not data:
            raise self.error(path, f"expected a non-empty list of lessons, got {describe(data)}")
        lessons: list[Lesson] = []
        for i, raw in enumerate(data):
            where = (*path, i)
            raw = self.mapping(raw, where, "lesson settings (name, value, completion_criteria)")
            for key in raw:
                if key not in ("name", "value", "completion_criteria"):
                    raise self.unknown_key(where, key, ["name", "value", "completion_criteria"])
            for key in ("name", "value"):
                if key not in raw:
                    raise self.error((*where, key), "required key missing")
            if not isinstance(raw["name"], str):
                raise self.error(
                    (*where, "name"), f"expected a string, got {describe(raw['name'])}"
                )
            criteria = None
            if raw.get("completion_criteria") is not None:
                criteria = self.build(
                    CompletionCriteria, raw["completion_criteria"], (*where, "completion_criteria")
                )
                self.check_criteria(criteria, (*where, "completion_criteria"), behaviors)
            elif i < len(data) - 1:
                raise self.error(
                    where, "needs completion_criteria (only the last lesson may omit them)"
                )
            lessons.append(
                Lesson(raw["name"], self.sampler(raw["value"], (*where, "value")), criteria)
            )
        return EnvironmentParameterSettings(lessons)

    def check_criteria(
        self, criteria: CompletionCriteria, path: KeyPath, behaviors: Sequence[str] | None
    ) -> None:
        if behaviors is not None and criteria.behavior not in behaviors:
            raise self.error(
                (*path, "behavior"),
                f"{criteria.behavior!r} is not a behavior of this run (behaviors: "
                f"{', '.join(behaviors)})",
            )
        if criteria.measure == "progress" and not 0.0 <= criteria.threshold <= 1.0:
            raise self.error(
                (*path, "threshold"),
                f"{criteria.threshold} is outside [0, 1], the range of measure 'progress' "
                "(the fraction of max_steps done)",
            )

    # ---------------------------------------------------------- behaviors
    def behavior(self, data: Any, path: KeyPath) -> BehaviorSettings:
        data = self.mapping(data, path, "behavior settings")
        names = [f.name for f in dataclasses.fields(BehaviorSettings)]
        for key in data:
            if key not in names:
                raise self.unknown_key(path, key, names)
        trainer_type = data.get("trainer_type", "ppo")
        if not isinstance(trainer_type, str):
            raise self.error(
                (*path, "trainer_type"), f"expected a string, got {describe(trainer_type)}"
            )
        try:
            algo_cls = get_algorithm(trainer_type)
        except ConfigError:
            close = difflib.get_close_matches(trainer_type.lower(), list_algorithms(), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise self.error(
                (*path, "trainer_type"),
                f"unknown algorithm {trainer_type!r}{hint} "
                f"(available: {', '.join(list_algorithms())})",
            ) from None
        hp = self.owned_free(
            algo_cls.config_class, data.get("hyperparameters"), (*path, "hyperparameters"),
            OWNED_HYPERPARAMETERS,
        )  # fmt: skip
        trainer = self.owned_free(
            TrainerConfig, data.get("trainer_settings"), (*path, "trainer_settings"),
            OWNED_TRAINER_SETTINGS,
        )  # fmt: skip
        signals = self.reward_signals(data.get("reward_signals"), (*path, "reward_signals"))
        rest = {
            k: v
            for k, v in data.items()
            if k not in ("hyperparameters", "trainer_settings", "reward_signals")
        }
        return self.build(
            BehaviorSettings, rest, path,
            trainer_type=algo_cls.name, hyperparameters=hp, trainer_settings=trainer,
            reward_signals=signals,
        )  # fmt: skip

    def owned_free(self, cls: type[T], data: Any, path: KeyPath, owned: Mapping[str, str]) -> T:
        """``cls`` from a section that may not set the fields behavior keys own."""
        data = self.mapping(data, path, f"{cls.__name__} settings")
        for key in data:
            if key in owned:
                raise self.error((*path, key), f"set by the behavior key {owned[key]}, not here")
        return self.build(cls, data, path)


# ---------------------------------------------------------------- the file
def parse_run_options(
    data: Any,
    source: str = "<run options>",
    *,
    overrides: Sequence[str] = (),
    flags: Mapping[str, Any] | None = None,
) -> RunOptions:
    """Validate parsed YAML (or a plain dict) into :class:`RunOptions`.

    Args:
        data: the parsed document (:func:`~rlfleet.config.located.parse_yaml` output keeps
            line numbers for the errors).
        source: the file name errors start with.
        overrides: ``--set`` arguments, ``dotted.key=value`` (the value is read as YAML).
        flags: command-line flags for ``checkpoint_settings`` (``run_id``, ``results_dir``,
            ``resume``, ``force``, ``initialize_from``); None values are left alone.
    """
    if data is None:
        data = LocatedDict()
        data.line, data.lines = 1, {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{source}: expected a mapping with sections {', '.join(sorted(_SECTIONS))}, "
            f"got {describe(data)}"
        )
    root: dict[Any, Any] = _copy(data)
    override_where: dict[KeyPath, str] = {}
    for text in overrides:
        path = apply_override(root, text)
        override_where[path] = f"--set {text}"
    for key, value in (flags or {}).items():
        section = root.setdefault("checkpoint_settings", {})
        if value is not None and isinstance(section, dict):  # else validation reports it
            section[key] = value
            override_where[("checkpoint_settings", key)] = f"--{key.replace('_', '-')}"
    reader = _Reader(data, source, override_where)
    for key in root:
        if key not in _SECTIONS:
            raise reader.unknown_key((), key, sorted(_SECTIONS))
    if root.get("env_settings") is None:
        raise reader.error(("env_settings",), "required section missing (it names env_id)")
    env = reader.build(EnvSettings, root["env_settings"], ("env_settings",))
    check_env_id(reader, env.env_id)
    sections = {
        name: reader.build(cls, root.get(name), (name,))
        for name, cls in _OPTIONAL_SECTION_TYPES.items()
    }
    checkpoint: CheckpointSettings = sections["checkpoint_settings"]
    check_checkpoint_settings(reader, checkpoint)

    default_raw = reader.mapping(
        root.get("default_settings"), ("default_settings",), "behavior settings"
    )
    default = (
        reader.behavior(default_raw, ("default_settings",))
        if root.get("default_settings") is not None
        else None
    )
    behaviors_raw = reader.mapping(root.get("behaviors"), ("behaviors",), "behaviors")
    if len(behaviors_raw) > 1:
        second = list(behaviors_raw)[1]
        raise reader.error(
            ("behaviors", second),
            f"a Gymnasium env has one behavior, and behaviors names {len(behaviors_raw)} "
            f"({', '.join(map(str, behaviors_raw))}); multi-behavior runs come with "
            "PettingZoo envs",
        )
    if not behaviors_raw:
        behaviors_raw = {env.env_id: None}
    behaviors: dict[str, BehaviorSettings] = {}
    for name, raw in behaviors_raw.items():
        if not isinstance(name, str) or not name:
            raise reader.error(("behaviors", name), "a behavior name must be a non-empty string")
        own = reader.mapping(raw, ("behaviors", name), "behavior settings")
        behaviors[name] = reader.behavior(merge(default_raw, own), ("behaviors", name))
        check_behavior(reader, behaviors[name], ("behaviors", name), env)
    parameters = reader.environment_parameters(
        root.get("environment_parameters"), ("environment_parameters",), list(behaviors)
    )
    check_builtin_parameters(reader, env.env_id, parameters)
    return RunOptions(
        env_settings=env,
        behaviors=behaviors,
        default_settings=default,
        environment_parameters=parameters,
        torch_settings=sections["torch_settings"],
        checkpoint_settings=checkpoint,
    )


def load_run_options(
    path: str | Path, *, overrides: Sequence[str] = (), flags: Mapping[str, Any] | None = None
) -> RunOptions:
    """Read and validate a run options file (see :func:`parse_run_options`)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise ConfigError(f"{path}: cannot read run options file ({reason})") from None
    return parse_run_options(
        parse_yaml(text, str(path)), str(path), overrides=overrides, flags=flags
    )


def parse_reward_signals(data: Any, where: str) -> RewardSignalsSettings:
    """The ``reward_signals`` section of a run config (``where`` starts error messages)."""
    return _Reader(data, where, {}).reward_signals(data, ())


def parse_environment_parameters(data: Any, where: str) -> dict[str, EnvironmentParameterSettings]:
    """The ``environment_parameters`` section of a run config; completion criteria may name
    any behavior (a run config trains one)."""
    return _Reader(data, where, {}).environment_parameters(data, (), None)


# ----------------------------------------------------------------- checks
def check_env_id(reader: _Reader, env_id: str) -> None:
    """A plain id must be registered; ``module:EnvId`` is checked when the env is built
    (checking would mean importing the module now)."""
    if ":" in env_id:
        return
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise reader.error(("env_settings", "env_id"), f"unknown Gymnasium env id {env_id!r}{hint}")


def check_checkpoint_settings(reader: _Reader, settings: CheckpointSettings) -> None:
    if settings.resume and settings.force:
        raise reader.error(
            ("checkpoint_settings", "force"),
            "resume and force contradict each other (continue the run, or replace it)",
        )
    run_id = settings.run_id
    if run_id is not None and (not run_id.strip() or "/" in run_id or run_id in (".", "..")):
        raise reader.error(
            ("checkpoint_settings", "run_id"),
            f"{run_id!r} is not a directory name (no '/', not empty, not '.' or '..')",
        )


def check_behavior(
    reader: _Reader, behavior: BehaviorSettings, path: KeyPath, env: EnvSettings
) -> None:
    if behavior.network_settings.memory is not None:
        raise reader.error(
            (*path, "network_settings", "memory"),
            f"{behavior.trainer_type} has no recurrent policy in rlfleet yet; set memory: null",
        )
    hp = behavior.hyperparameters
    if hasattr(hp, "num_steps") and hasattr(hp, "batch_size"):
        rollout = behavior.time_horizon * env.num_envs
        if hp.batch_size > rollout:
            raise reader.error(
                (*path, "hyperparameters", "batch_size"),
                f"{hp.batch_size} is larger than the rollout (time_horizon x num_envs = "
                f"{behavior.time_horizon} x {env.num_envs} = {rollout})",
            )
    signals = behavior.reward_signals
    gamma = signals.discount()
    differing = [name for name in signals.enabled() if getattr(signals, name).gamma != gamma]
    if differing:
        warnings.warn(
            f"{reader.where((*path, 'reward_signals'))}: reward signal(s) {differing} have a "
            f"gamma other than {gamma}; rlfleet discounts the combined reward with one gamma "
            f"({gamma}) — see docs/reward-signals-and-curricula.md",
            UserWarning,
            stacklevel=3,
        )


def check_builtin_parameters(
    reader: _Reader, env_id: str, parameters: Mapping[str, EnvironmentParameterSettings]
) -> None:
    if not parameters or ":" in env_id:
        return
    entry_point = gym.registry[env_id].entry_point
    if not isinstance(entry_point, str):
        return
    unknown, known = unknown_builtin_parameters(entry_point, list(parameters))
    if unknown:
        raise reader.error(
            ("environment_parameters", unknown[0]),
            f"{env_id} has no settable parameter {unknown[0]!r} (it has: {', '.join(known)})",
        )


# ---------------------------------------------------------------- helpers
def apply_override(root: dict[Any, Any], text: str) -> KeyPath:
    """Apply ``dotted.key=value`` to ``root`` in place; returns the key path."""
    key, sep, raw = text.partition("=")
    path = tuple(part for part in key.strip().split("."))
    if not sep or not all(path):
        raise ConfigError(
            f"--set {text}: expected dotted.key=value, e.g. "
            "behaviors.CartPole.hyperparameters.learning_rate=3e-4"
        )
    value = parse_yaml(raw, f"--set {text}") if raw.strip() else None
    node = root
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(
                f"--set {text}: {dotted(path[: i + 1])} is {describe(child)}, not a section"
            )
        node = child
    node[path[-1]] = value
    return path


def _copy(data: Any) -> Any:
    """Plain nested dicts/lists (overrides must not touch the located original)."""
    if isinstance(data, Mapping):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data


def dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(value: Any) -> str:
    """``a mapping``, ``a list``, ``null`` or ``int 3`` (for error messages)."""
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


_ADAPTERS: dict[type[Any], pydantic.TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> pydantic.TypeAdapter[Any]:
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = pydantic.TypeAdapter(cls)
    return _ADAPTERS[cls]


def _strip_annotated(hint: Any) -> Any:
    while get_origin(hint) is typing.Annotated:
        hint = get_args(hint)[0]
    return hint


def _is_union(hint: Any) -> bool:
    return get_origin(hint) in (typing.Union, types.UnionType)
