"""ML-Agents' own names in run options, read with ML-Agents' meanings.

A trainer config copied from ML-Agents (``config/ppo/3DBall.yaml``, ``config/sac/Walker.yaml``)
loads as it is: this module rewrites the ML-Agents names of a behavior into rlfleet's before
the behavior is validated, so the typed settings, the run directory's ``run_options.yaml`` and
training speak one vocabulary. Where a name differs, the rewrite keeps ML-Agents' meaning:

- PPO: ``beta`` is ``ent_coef``, ``epsilon`` is ``clip_range``, ``lambd`` is ``gae_lambda``,
  ``num_epoch`` is ``num_epochs``, ``learning_rate_schedule`` / ``beta_schedule`` /
  ``epsilon_schedule`` are ``lr_schedule`` / ``ent_coef_schedule`` / ``clip_range_schedule``
  (the last two default to the learning-rate schedule, as in ML-Agents), and ``buffer_size``,
  the experiences collected across all envs before an update, sets the rollout length
  ``time_horizon`` to ``ceil(buffer_size / num_envs)`` steps per env; ML-Agents'
  ``time_horizon`` then becomes ``hyperparameters.time_horizon``, where each env's
  trajectory is cut and bootstrapped (where it is shorter than the rollout: a rollout end
  cuts it anyway).
- SAC: ``init_entcoef`` is ``ent_coef_init``, ``buffer_init_steps`` is ``learning_starts``,
  ``steps_per_update`` (env steps per gradient step) becomes ``train_freq`` /
  ``gradient_steps`` with the same ratio, ``save_replay_buffer`` is
  ``trainer_settings.save_replay_buffer``.
- A ``hyperparameters`` section that uses any of these ML-Agents names takes ML-Agents'
  defaults for the keys it leaves out (:data:`MLAGENTS_DEFAULTS`), as ML-Agents would (for
  SAC also ML-Agents' fixed discrete target entropy, ``target_entropy_scale: 0.2``); one in
  rlfleet's names keeps rlfleet's defaults, so an rlfleet file trains exactly as before.
- Giving both names of one setting is an error naming both.

Keys that only mean something to a Unity build (``engine_settings``, ``env_settings.env_path``
of a build, ``base_port``, ...) are accepted and each is reported once, in one warning line of
the ``rlfleet.runs`` logger, as ignored with the reason (:class:`Notes`). The translation is
plain dictionary work on the parsed YAML, written here rather than with a schema library
because each key's rewrite depends on its neighbours (a schedule defaults to another key, a
buffer size divides by the env count).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import gymnasium as gym
import torch

from rlfleet.errors import ConfigError
from rlfleet.runs.options_reader import KeyPath, OptionsReader, dotted
from rlfleet.runs.run_options import VIS_ENCODERS

log = logging.getLogger("rlfleet.runs")

RENAMES: dict[str, dict[str, str]] = {
    "ppo": {
        "beta": "ent_coef",
        "epsilon": "clip_range",
        "lambd": "gae_lambda",
        "num_epoch": "num_epochs",
        "learning_rate_schedule": "lr_schedule",
        "beta_schedule": "ent_coef_schedule",
        "epsilon_schedule": "clip_range_schedule",
    },
    "sac": {
        "init_entcoef": "ent_coef_init",
        "buffer_init_steps": "learning_starts",
    },
}
"""trainer_type -> {ML-Agents hyperparameter: rlfleet hyperparameter} (same meaning)."""

MLAGENTS_ONLY: dict[str, tuple[str, ...]] = {
    "ppo": ("buffer_size", "shared_critic"),
    "sac": (
        "steps_per_update",
        "reward_signal_steps_per_update",
        "save_replay_buffer",
        "learning_rate_schedule",
    ),
}
"""ML-Agents hyperparameters rlfleet's algorithm config has no field for (rewritten elsewhere)."""

MLAGENTS_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {
        "batch_size": 1024,
        "buffer_size": 10240,
        "learning_rate": 3.0e-4,
        "learning_rate_schedule": "linear",
        "beta": 5.0e-3,
        "epsilon": 0.2,
        "lambd": 0.95,
        "num_epoch": 3,
        "shared_critic": False,
    },
    "sac": {
        "batch_size": 128,
        "buffer_size": 50000,
        "learning_rate": 3.0e-4,
        "learning_rate_schedule": "constant",
        "buffer_init_steps": 0,
        "tau": 0.005,
        "steps_per_update": 1,
        "save_replay_buffer": False,
        "init_entcoef": 1.0,
        # Not a setting in ML-Agents: its SAC optimizer fixes the discrete target entropy at
        # 0.2 * log(n) per branch (rlfleet's default is 0.5).
        "target_entropy_scale": 0.2,
    },
}
"""ML-Agents' defaults (``mlagents/trainers/settings.py``), by ML-Agents name, and the one
value its SAC optimizer fixes that rlfleet exposes, by rlfleet's name."""

ENV_SETTINGS_UNITY: tuple[str, ...] = (
    "env_args",
    "base_port",
    "num_areas",
    "timeout_wait",
    "max_lifetime_restarts",
    "restarts_rate_limit_n",
    "restarts_rate_limit_period_s",
)
"""``env_settings`` keys that configure a Unity executable or its connection."""

ENGINE_SETTINGS: tuple[str, ...] = (
    "width",
    "height",
    "quality_level",
    "time_scale",
    "target_frame_rate",
    "capture_frame_rate",
    "no_graphics",
    "no_graphics_monitor",
)
"""ML-Agents' ``engine_settings`` keys (the Unity player's window, quality and clock)."""

CHECKPOINT_SETTINGS_MLAGENTS: tuple[str, ...] = ("load_model", "train_model", "inference")
"""ML-Agents ``checkpoint_settings`` keys rlfleet does not name itself."""


class Notes:
    """What a file asks for that rlfleet ignores: each note is logged once, one line
    (``emit=False`` collects without logging: ``default_settings`` is read once on its own
    and again merged under each behavior, whose reading logs)."""

    def __init__(self, *, emit: bool = True) -> None:
        self.lines: list[str] = []
        self.emit = emit

    def add(self, text: str) -> None:
        if text not in self.lines:
            self.lines.append(text)
            if self.emit:
                log.warning("%s", text)


# ---------------------------------------------------------------------- sections
def translate_root(reader: OptionsReader, root: dict[Any, Any], notes: Notes) -> None:
    """Top-level ML-Agents sections and keys, in place: ``engine_settings`` and ``debug``
    are dropped (with a note), ``env_settings``, ``torch_settings`` and
    ``checkpoint_settings`` rewritten."""
    if "engine_settings" in root:
        engine = reader.mapping(root.pop("engine_settings"), ("engine_settings",), "settings")
        for key in engine:
            if key not in ENGINE_SETTINGS:
                raise reader.unknown_key(("engine_settings",), key, ENGINE_SETTINGS)
        keys = f" ({', '.join(map(str, engine))})" if engine else ""
        notes.add(
            f"{reader.where(('engine_settings',))}: engine_settings{keys} ignored: it sets up "
            "the Unity player, and a Gymnasium env has none"
        )
    if "debug" in root:
        root.pop("debug")
        notes.add(
            f"{reader.where(('debug',))}: debug ignored: rlfleet logs through Python's "
            "logging module (configure the 'rlfleet' logger)"
        )
    if isinstance(root.get("env_settings"), Mapping):
        root["env_settings"] = _env_settings(reader, dict(root["env_settings"]), notes)
    if isinstance(root.get("torch_settings"), Mapping):
        torch_settings = dict(root["torch_settings"])
        if "device" in torch_settings and torch_settings["device"] is None:
            # ML-Agents: no device means CUDA where there is one.
            torch_settings["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        root["torch_settings"] = torch_settings
    if isinstance(root.get("checkpoint_settings"), Mapping):
        root["checkpoint_settings"] = _checkpoint_settings(
            reader, dict(root["checkpoint_settings"]), notes
        )


def _env_settings(reader: OptionsReader, env: dict[Any, Any], notes: Notes) -> dict[Any, Any]:
    path: KeyPath = ("env_settings",)
    ignored = [key for key in ENV_SETTINGS_UNITY if key in env]
    for key in ignored:
        env.pop(key)
    if ignored:
        notes.add(
            f"{reader.where(path)}: env_settings {', '.join(ignored)} ignored: they configure "
            "a Unity executable, and rlfleet builds Gymnasium envs in this process"
        )
    if "env_path" not in env:
        return env
    env_path = env.pop("env_path")
    if env_path is None:
        return env
    if not isinstance(env_path, str):
        raise reader.error((*path, "env_path"), f"expected a string, got {env_path!r}")
    if ":" in env_path or env_path in gym.registry:
        if env.get("env_id") is not None:
            raise both_names(reader, path, "env_path", "env_id")
        env["env_id"] = env_path
    elif env.get("env_id") is not None:
        notes.add(
            f"{reader.where((*path, 'env_path'))}: env_settings.env_path {env_path!r} ignored: "
            f"it is not a Gymnasium env id (a Unity build?); training env_id "
            f"{env['env_id']!r}"
        )
    else:
        raise reader.error(
            (*path, "env_path"),
            f"{env_path!r} is not a registered Gymnasium env id; rlfleet trains Gymnasium envs, "
            "not Unity builds: name one by env_id (or env_path), e.g. CartPole-v1",
        )
    return env


def _checkpoint_settings(
    reader: OptionsReader, settings: dict[Any, Any], notes: Notes
) -> dict[Any, Any]:
    path: KeyPath = ("checkpoint_settings",)
    if "load_model" in settings:
        load_model = settings.pop("load_model")
        if "resume" in settings and settings["resume"] != load_model:
            raise both_names(reader, path, "load_model", "resume")
        settings["resume"] = load_model
    if settings.pop("inference", False):
        raise reader.error(
            (*path, "inference"),
            "rlfleet trains here; to run a trained policy use `rlfleet play RUN_DIR`",
        )
    if "train_model" in settings:
        settings.pop("train_model")
        notes.add(
            f"{reader.where((*path, 'train_model'))}: checkpoint_settings.train_model "
            "ignored: ML-Agents deprecated it, and rlfleet train always trains"
        )
    return settings


# ---------------------------------------------------------------------- behaviors
def translate_behavior(
    reader: OptionsReader,
    data: Mapping[Any, Any],
    path: KeyPath,
    algo: str,
    hp_fields: set[str],
    num_envs: int,
    notes: Notes,
) -> dict[Any, Any]:
    """One behavior's settings with ML-Agents' names rewritten into rlfleet's (see the module
    docstring); ``algo`` is the registered algorithm name, ``hp_fields`` its config's fields,
    ``num_envs`` the training envs."""
    out = dict(data)
    hp_path = (*path, "hyperparameters")
    raw_hp = out.get("hyperparameters")
    hp = dict(raw_hp) if isinstance(raw_hp, Mapping) else None
    renames = RENAMES.get(algo, {})
    if hp is not None and renames:
        for ml_name, name in renames.items():
            if ml_name in hp and name in hp:
                raise both_names(reader, hp_path, ml_name, name)
        if any(key in hp for key in (*renames, *MLAGENTS_ONLY[algo])):
            for ml_name, value in MLAGENTS_DEFAULTS[algo].items():
                if ml_name not in hp and renames.get(ml_name) not in hp:
                    hp[ml_name] = value
            if algo == "ppo":
                schedule = hp.get("learning_rate_schedule", hp.get("lr_schedule"))
                for ml_name in ("beta_schedule", "epsilon_schedule"):
                    if ml_name not in hp and renames[ml_name] not in hp:
                        hp[ml_name] = schedule
        hp = {renames.get(k, k): v for k, v in hp.items()}
        if algo == "ppo":
            _ppo(reader, hp, out, path, num_envs, notes)
        else:
            _sac(reader, hp, out, path)
    signals = out.get("reward_signals")
    if isinstance(signals, Mapping):
        out["reward_signals"] = _reward_signals(reader, signals, (*path, "reward_signals"), notes)
    network = out.get("network_settings")
    if isinstance(network, Mapping):
        network = dict(network)
        net_path = (*path, "network_settings")
        if "goal_conditioning_type" in network:
            if "conditioning_type" in network:
                raise both_names(reader, net_path, "goal_conditioning_type", "conditioning_type")
            network["conditioning_type"] = network.pop("goal_conditioning_type")
        out["network_settings"] = network
        if hp is None and raw_hp is None:
            hp = {}
        if hp is not None:
            _network_into_hyperparameters(reader, network, hp, net_path, hp_fields)
    if hp is not None:
        out["hyperparameters"] = hp
    return out


SIGNAL_NETWORK_ONLY: dict[str, tuple[Any, str]] = {
    "memory": (None, "ML-Agents ignores memory in a reward signal's network too"),
    "vis_encode_type": (
        "simple",
        "rlfleet's reward-signal networks are MLPs on the flattened observation",
    ),
    "goal_conditioning_type": (
        "hyper",
        "a reward-signal network takes no goal observations in rlfleet",
    ),
    "deterministic": (False, "a reward-signal network chooses no actions"),
}
"""Keys of ML-Agents' ``NetworkSettings`` that a reward signal's ``network_settings`` may
carry and rlfleet's signals have no use for: each -> (ML-Agents' default, why it is
ignored). A value other than the default gets a note."""


def _yaml_scalar(value: Any) -> str:
    """``value`` as YAML writes it (``null``, ``false``, ``hyper``)."""
    return {None: "null", False: "false", True: "true"}.get(value, str(value))


def _reward_signals(
    reader: OptionsReader, signals: Mapping[Any, Any], path: KeyPath, notes: Notes
) -> dict[Any, Any]:
    """ML-Agents' reward-signal settings: every signal may carry ML-Agents' whole
    ``NetworkSettings`` as ``network_settings``. The extrinsic signal has no network, so its
    ``network_settings`` is dropped with a note; curiosity, RND and GAIL keep
    ``hidden_units`` and ``num_layers`` (their networks' size) and drop the keys of
    :data:`SIGNAL_NETWORK_ONLY`, with a note where one is set to something else than
    ML-Agents' default. ``normalize``: rlfleet's learned signals always normalise their
    inputs with running statistics, so ``normalize: false`` gets a note."""
    out = dict(signals)
    for name, settings in signals.items():
        if not isinstance(settings, Mapping) or "network_settings" not in settings:
            continue
        signal_path = (*path, name)
        net_path = (*signal_path, "network_settings")
        settings = dict(settings)
        if name == "extrinsic":
            settings.pop("network_settings")
            notes.add(
                f"{reader.where(net_path)}: reward_signals.extrinsic.network_settings "
                "ignored: the extrinsic reward is the env's own and has no network (as in "
                "ML-Agents)"
            )
            out[name] = settings
            continue
        network = settings["network_settings"]
        if isinstance(network, Mapping):
            network = dict(network)
            for key, (default, why) in SIGNAL_NETWORK_ONLY.items():
                if key in network and network.pop(key) != default:
                    notes.add(
                        f"{reader.where((*net_path, key))}: reward_signals.{name}."
                        f"network_settings.{key} ignored: {why}"
                    )
            if "normalize" in network and not network.pop("normalize"):
                notes.add(
                    f"{reader.where((*net_path, 'normalize'))}: reward_signals.{name}."
                    "network_settings.normalize: false ignored: rlfleet's learned reward "
                    "signals always normalise their inputs with running statistics"
                )
            settings["network_settings"] = network
        out[name] = settings
    if isinstance(out.get("gail"), Mapping):
        out["gail"] = _gail(reader, out["gail"], (*path, "gail"), notes)
    return out


def _gail(
    reader: OptionsReader, gail: Mapping[Any, Any], path: KeyPath, notes: Notes
) -> dict[Any, Any]:
    """ML-Agents' GAIL keys: ``encoding_size`` is the discriminator's width where
    ``network_settings`` is not given (ML-Agents' own rule, which ignores it otherwise);
    ``use_vail`` must be false."""
    gail = dict(gail)
    if gail.pop("use_vail", False):
        raise reader.error(
            (*path, "use_vail"), "rlfleet's GAIL has no variational bottleneck; set use_vail: false"
        )
    if "encoding_size" in gail:
        size = gail.pop("encoding_size")
        if "network_settings" in gail:
            notes.add(
                f"{reader.where((*path, 'encoding_size'))}: reward_signals.gail.encoding_size "
                "ignored: network_settings is given (as in ML-Agents)"
            )
        elif size is not None:
            gail["network_settings"] = {"hidden_units": size}
    return gail


def _network_into_hyperparameters(
    reader: OptionsReader,
    network: Mapping[Any, Any],
    hp: dict[Any, Any],
    net_path: KeyPath,
    hp_fields: set[str],
) -> None:
    """``memory`` and ``vis_encode_type`` set the algorithm's recurrent and image-encoder
    fields (a value given in both places must agree)."""
    derived: dict[str, tuple[str, Any]] = {}
    memory = network.get("memory")
    if isinstance(memory, Mapping) and "lstm_hidden_size" in hp_fields:
        size = memory.get("memory_size", 128)
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            if size % 2:
                raise reader.error(
                    (*net_path, "memory", "memory_size"),
                    f"must be even (it holds the LSTM's hidden and cell states), got {size}",
                )
            derived["lstm_hidden_size"] = ("memory.memory_size", size // 2)
        derived["sequence_length"] = ("memory.sequence_length", memory.get("sequence_length", 64))
    encoder = network.get("vis_encode_type")
    if encoder in VIS_ENCODERS and "cnn" in hp_fields:
        derived["cnn"] = ("vis_encode_type", VIS_ENCODERS[encoder])
    for name, (source, value) in derived.items():
        if name in hp and hp[name] != value:
            raise reader.error(
                (*net_path, *source.split(".")),
                f"network_settings.{source} sets hyperparameters.{name} to {value!r}, and "
                f"hyperparameters.{name} is {hp[name]!r}; keep one",
            )
        hp[name] = value


def _ppo(
    reader: OptionsReader,
    hp: dict[Any, Any],
    behavior: dict[Any, Any],
    path: KeyPath,
    num_envs: int,
    notes: Notes,
) -> None:
    hp_path = (*path, "hyperparameters")
    if hp.pop("shared_critic", False):
        raise reader.error(
            (*hp_path, "shared_critic"),
            "ppo's actor and critic are separate networks in rlfleet; set shared_critic: false",
        )
    if "buffer_size" not in hp:
        return
    buffer_size = hp.pop("buffer_size")
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
        raise reader.error(
            (*hp_path, "buffer_size"), f"expected a positive integer, got {buffer_size!r}"
        )
    rollout = math.ceil(buffer_size / num_envs)
    horizon = behavior.get("time_horizon", 64)
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise reader.error((*path, "time_horizon"), f"expected a positive integer, got {horizon!r}")
    if "time_horizon" in hp:
        raise reader.error(
            (*hp_path, "time_horizon"),
            f"set by the behavior key time_horizon when {dotted(hp_path)}.buffer_size is "
            "given; keep that one",
        )
    behavior["time_horizon"] = rollout
    if horizon < rollout:
        hp["time_horizon"] = horizon
    elif horizon > rollout:
        notes.add(
            f"{reader.where((*path, 'time_horizon'))}: time_horizon {horizon} is longer than "
            f"the rollout ({dotted(hp_path)}.buffer_size {buffer_size} over {num_envs} envs = "
            f"{rollout} steps per env); rlfleet bootstraps at every rollout end, so "
            f"trajectories are cut every {rollout} steps"
        )


def _sac(
    reader: OptionsReader, hp: dict[Any, Any], behavior: dict[Any, Any], path: KeyPath
) -> None:
    hp_path = (*path, "hyperparameters")
    schedule = hp.pop("learning_rate_schedule", "constant")
    if schedule != "constant":
        raise reader.error(
            (*hp_path, "learning_rate_schedule"),
            f"sac keeps its learning rate constant in rlfleet; got {schedule!r}",
        )
    if "steps_per_update" in hp:
        steps = hp.pop("steps_per_update")
        for name in ("train_freq", "gradient_steps"):
            if name in hp:
                raise both_names(reader, hp_path, "steps_per_update", name)
        if isinstance(steps, bool) or not isinstance(steps, int | float) or steps <= 0:
            raise reader.error(
                (*hp_path, "steps_per_update"), f"expected a positive number, got {steps!r}"
            )
        ratio = Fraction(steps).limit_denominator(1000)
        hp["train_freq"], hp["gradient_steps"] = ratio.numerator, ratio.denominator
        signal_steps = hp.pop("reward_signal_steps_per_update", steps)
        if signal_steps != steps:
            raise reader.error(
                (*hp_path, "reward_signal_steps_per_update"),
                f"rlfleet updates reward signals with every policy update: it must equal "
                f"steps_per_update ({steps}), got {signal_steps!r}",
            )
    elif "reward_signal_steps_per_update" in hp:
        raise reader.error(
            (*hp_path, "reward_signal_steps_per_update"),
            "rlfleet updates reward signals with every policy update; remove the key or set "
            "steps_per_update to the same value",
        )
    if "save_replay_buffer" in hp:
        save = hp.pop("save_replay_buffer")
        trainer = behavior.get("trainer_settings")
        trainer = dict(trainer) if isinstance(trainer, Mapping) else {}
        if "save_replay_buffer" in trainer:
            raise reader.error(
                (*hp_path, "save_replay_buffer"),
                "given twice, here and as trainer_settings.save_replay_buffer; keep one",
            )
        trainer["save_replay_buffer"] = save
        behavior["trainer_settings"] = trainer


def both_names(reader: OptionsReader, path: KeyPath, ml_name: str, name: str) -> ConfigError:
    """The error for one setting given under both its names."""
    return reader.error(
        (*path, ml_name),
        f"{ml_name} (ML-Agents' name) and {name} (rlfleet's) are the same setting; keep one",
    )


# ---------------------------------------------------------------------- reference
_SAME = "="
MLAGENTS_NAMES: dict[str, dict[str, str]] = {
    "env_settings": {"env_id": "env_path (a Gymnasium id)", "num_envs": _SAME, "seed": _SAME},
    "behavior": {
        key: _SAME
        for key in (
            "trainer_type",
            "hyperparameters",
            "network_settings",
            "reward_signals",
            "max_steps",
            "time_horizon",
            "summary_freq",
            "checkpoint_interval",
            "keep_checkpoints",
            "even_checkpoints",
            "init_path",
            "threaded",
            "self_play",
            "behavioral_cloning",
        )
    },
    "network_settings": {
        "hidden_units": _SAME,
        "num_layers": _SAME,
        "normalize": _SAME,
        "memory": _SAME,
        "vis_encode_type": _SAME,
        "conditioning_type": "conditioning_type, goal_conditioning_type",
        "deterministic": _SAME,
    },
    "memory": {"sequence_length": _SAME, "memory_size": _SAME},
    "ppo": {
        "learning_rate": _SAME,
        "batch_size": _SAME,
        "time_horizon": "time_horizon (the behavior key beside buffer_size)",
        **{name: ml_name for ml_name, name in RENAMES["ppo"].items()},
    },
    "sac": {
        "learning_rate": _SAME,
        "buffer_size": _SAME,
        "batch_size": _SAME,
        "tau": _SAME,
        "train_freq": "steps_per_update",
        "gradient_steps": "steps_per_update",
        **{name: ml_name for ml_name, name in RENAMES["sac"].items()},
    },
    "trainer_settings": {"save_replay_buffer": "hyperparameters.save_replay_buffer (sac)"},
    "behavioral_cloning": {
        key: _SAME
        for key in (
            "demo_path",
            "strength",
            "steps",
            "batch_size",
            "num_epoch",
            "samples_per_update",
        )
    },
    "self_play": {
        key: _SAME
        for key in (
            "save_steps",
            "team_change",
            "swap_steps",
            "window",
            "play_against_latest_model_ratio",
            "initial_elo",
        )
    },
    "torch_settings": {"device": _SAME},
    "checkpoint_settings": {
        "run_id": _SAME,
        "results_dir": _SAME,
        "resume": "resume, load_model",
        "force": _SAME,
        "initialize_from": _SAME,
    },
    "reward_signal": {
        key: _SAME
        for key in (
            "gamma",
            "strength",
            "learning_rate",
            "encoding_size",
            "use_actions",
            "demo_path",
            "network_settings",
            "hidden_units",
            "num_layers",
        )
    },
}
MLAGENTS_NAMES["gail"] = MLAGENTS_NAMES["extrinsic"] = MLAGENTS_NAMES["reward_signal"]
MLAGENTS_NAMES["signal_network"] = {"hidden_units": _SAME, "num_layers": _SAME}
"""Reference section -> {rlfleet key: ML-Agents key} (``=``: the same name)."""

_UNITY = "ignored (noted in the log): it configures a Unity build"
MLAGENTS_EXTRA: dict[str, list[tuple[str, str]]] = {
    "env_settings": [
        (
            "env_path",
            "A registered Gymnasium id (or `module:EnvId`) is the env to train, like "
            "`env_id`; a Unity build's path is ignored (noted in the log) when `env_id` is "
            "given, an error otherwise.",
        ),
        *((key, _UNITY + " or its connection.") for key in ENV_SETTINGS_UNITY),
    ],
    "ppo": [
        (
            "buffer_size",
            "Experiences collected across all envs before an update: sets `time_horizon` to "
            "`buffer_size / num_envs`, rounded up (ML-Agents' default: 10240); the section's "
            "ML-Agents `time_horizon` then sets `hyperparameters.time_horizon` (where it is "
            "shorter than the rollout).",
        ),
        (
            "shared_critic",
            "`false` only: rlfleet's actor and critic are separate networks.",
        ),
    ],
    "sac": [
        (
            "steps_per_update",
            "Env steps per gradient step: sets `train_freq` / `gradient_steps` to the same "
            "ratio (`10` → 10 / 1, `0.25` → 1 / 4; ML-Agents' default: 1).",
        ),
        (
            "reward_signal_steps_per_update",
            "Must equal `steps_per_update` (its default): rlfleet updates reward signals "
            "with every policy update.",
        ),
        (
            "save_replay_buffer",
            "`trainer_settings.save_replay_buffer` (ML-Agents' default: false).",
        ),
        ("learning_rate_schedule", "`constant` only: rlfleet's SAC keeps its learning rate."),
    ],
    "checkpoint_settings": [
        ("load_model", "ML-Agents' older name of `resume`."),
        ("train_model", "ignored (noted in the log): ML-Agents deprecated it."),
        ("inference", "`false` only: `rlfleet play RUN_DIR` runs a trained policy."),
    ],
    "gail": [
        (
            "encoding_size",
            "The discriminator's `network_settings.hidden_units` where `network_settings` is "
            "not given (ignored otherwise, as in ML-Agents).",
        ),
        ("use_vail", "`false` only: rlfleet's GAIL has no variational bottleneck."),
    ],
    "engine_settings": [(key, _UNITY + " player.") for key in ENGINE_SETTINGS],
    "extrinsic": [
        (
            "network_settings",
            "ignored (noted in the log): the extrinsic reward is the env's own and has no network.",
        )
    ],
    "signal_network": [
        (
            "normalize",
            "rlfleet's curiosity, RND and GAIL always normalise their inputs with running "
            "statistics; `false` is noted in the log as ignored.",
        ),
        *(
            (key, f"ignored (noted in the log unless `{_yaml_scalar(default)}`): {why}.")
            for key, (default, why) in SIGNAL_NETWORK_ONLY.items()
        ),
    ],
}
"""Reference section -> ML-Agents keys with no rlfleet key of their own, and what they do."""
