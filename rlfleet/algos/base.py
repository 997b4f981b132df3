"""The :class:`Algorithm` interface every rlfleet algorithm implements.

An algorithm owns its networks, optimisers and RNG; it does not own data collection.
Collectors call :meth:`Algorithm.preprocess` and :meth:`Algorithm.act` on whole batches of
observations, trainers call ``update`` with collected data. ``update`` is not declared
here: its signature depends on the algorithm's kind, and each algorithm declares the
contract of its kind (:mod:`rlfleet.algos.kinds`) next to this base. Spaces are checked at
construction, never deep inside training.

Observations of any supported space reach networks through ``self.obs_layout``
(:class:`rlfleet.nn.obs.ObsLayout`: Dicts flattened once, images kept as uint8) and
:func:`rlfleet.nn.encoders.make_encoder`. Action masks (:mod:`rlfleet.nn.masks`) and
recurrent state reach :meth:`Algorithm.act` as keyword arguments; the
:class:`~rlfleet.collect.runner.PolicyRunner` finds, checks and carries them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, NoReturn, Protocol, Self, TypeVar

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rlfleet.algos.export import export_onnx
from rlfleet.algos.registry import (
    algorithm_classes,
    algorithms_supporting,
    algorithms_supporting_custom_encoders,
    algorithms_supporting_images,
    algorithms_supporting_masks,
    get_algorithm,
)
from rlfleet.checkpoint import load_checkpoint, save_checkpoint
from rlfleet.checkpoint.schema import (
    AlgorithmState,
    PolicyMetadata,
    PolicyState,
    state_dict_mismatch,
    validate_part,
)
from rlfleet.config.loader import to_dict, validate
from rlfleet.envs.spaces import describe_space, space_from_json, space_to_json
from rlfleet.errors import CheckpointError, ConfigError, EnvSpecError
from rlfleet.nn.action_head import env_actions, stored_action_spec
from rlfleet.nn.cuda_graph import CapturedSteps, refuse_uncapturable
from rlfleet.nn.device import resolve_device
from rlfleet.nn.encoders import EncoderFactory, describe_factory
from rlfleet.nn.masks import MASK_KEY, mask_segments
from rlfleet.nn.mlp_grad import has_hooks
from rlfleet.nn.noise import ColoredNoise
from rlfleet.nn.normalize import RunningNormalizer, normalize_obs
from rlfleet.nn.obs import ObsLayout, batch_of_one, is_batched, is_image_space
from rlfleet.nn.optim import NanPolicy
from rlfleet.nn.sde import StateDependentNoise
from rlfleet.seeding import stream_seed
from rlfleet.types import PolicyStep
from rlfleet.version import __version__

ConfigT = TypeVar("ConfigT")
AlgorithmKind = Literal["on_policy", "off_policy", "offline", "distributed"]
EnvSource = str | gym.Env[Any, Any]
"""What ``Algorithm(env, **hyperparameters)`` accepts: a registered env id (see
:func:`rlfleet.envs.make.env_spec`) or an env made by ``gymnasium.make`` (rebuilt from its
``spec`` for the vector envs training steps)."""


# --------------------------------------------------------------- training backend
# An algorithm sits below the trainers and the run composition (see docs/architecture.md),
# yet ``PPO("CartPole-v1").learn(10_000)`` must train it with the same trainer and presets as
# `rlfleet train`. So the algorithm depends on this small interface, and the composition root
# (``rlfleet/__init__.py``, which every import of rlfleet runs first) installs the
# implementation, :class:`rlfleet.runs.learn.RunBackend`: imports keep pointing down.


@dataclass(frozen=True)
class EnvTarget:
    """The env an algorithm built from an env trains on in :meth:`Algorithm.learn`."""

    env_id: str
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvBinding:
    """What the training backend makes of ``Algorithm(env, **hyperparameters)``."""

    target: EnvTarget
    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]
    config: Any
    """The algorithm's config: the shipped preset for the env, the keywords on top."""


class LearnResult(Protocol):
    """What :meth:`Algorithm.learn` keeps of a run (a :class:`rlfleet.TrainResult`)."""

    @property
    def best_score(self) -> float: ...
    @property
    def env_steps(self) -> int: ...
    @property
    def gradient_steps(self) -> int: ...
    @property
    def stop_reason(self) -> str: ...
    @property
    def run_dir(self) -> Path | None: ...


class TrainingBackend(Protocol):
    """Builds configs from presets and trains: what :meth:`Algorithm.learn` stands on."""

    def bind(
        self,
        algorithm: type[Algorithm[Any]],
        env: EnvSource,
        hyperparameters: Mapping[str, Any],
        *,
        seed: int,
        device: str,
    ) -> EnvBinding:
        """The spaces of ``env`` and the validated config (preset + ``hyperparameters``)."""
        ...

    def learn(
        self,
        algorithm: Algorithm[Any],
        target: EnvTarget,
        total_steps: int,
        *,
        run_dir: str | Path | None,
        dataset: str | Path | None,
    ) -> LearnResult:
        """Train ``algorithm`` in place on ``target`` for ``total_steps``."""
        ...


_backend: list[TrainingBackend] = []


def install_training_backend(backend: TrainingBackend) -> None:
    """Make ``backend`` the one :meth:`Algorithm.learn` and env construction use."""
    _backend[:] = [backend]


def training_backend() -> TrainingBackend:
    """The installed backend (``import rlfleet`` installs it)."""
    if not _backend:
        raise ConfigError(
            "no training backend is installed: import rlfleet (its __init__ installs "
            "rlfleet.runs.learn.RunBackend) before building an algorithm from an env"
        )
    return _backend[0]


class Algorithm(ABC, Generic[ConfigT]):
    """Base class: construction checks spaces; subclasses build networks and implement
    :meth:`act`, :meth:`modules` / :meth:`optimizers` and the ``update`` of their kind's
    contract (:mod:`rlfleet.algos.kinds`)."""

    name: ClassVar[str]
    """Registry name, as typed on the command line (``ppo``)."""
    kind: ClassVar[AlgorithmKind]
    """Which trainer loop drives it."""
    config_class: ClassVar[type[Any]]
    """The dataclass of its hyperparameters."""
    action_spaces: ClassVar[tuple[type[spaces.Space[Any]], ...]]
    """Action space types it supports."""
    observation_spaces: ClassVar[tuple[type[spaces.Space[Any]], ...]] = (spaces.Box,)
    """Observation space types it supports."""
    supports_masks: ClassVar[bool] = False
    """Honours action masks (never picks an action whose mask entry is false)."""
    supports_images: ClassVar[bool] = False
    """Has a CNN encoder for image observations (uint8 HWC/CHW Box, alone or in a Dict)."""
    supports_custom_encoder: ClassVar[bool] = False
    """Builds its networks on an ``encoder`` factory's module when given one (see
    :mod:`rlfleet.nn.encoders`); the others refuse one at construction."""
    needs_fixed_length_rollouts: ClassVar[bool] = False
    """Learns only from rollouts of ``num_steps`` vector steps each, in whole (ACER replays
    them): the trainers refuse to collect its rollouts by episode count, and the
    multi-agent trainer, whose rollouts are finished trajectories, refuses it as a learner."""
    obs_normalizer: RunningNormalizer | None = None
    """Running observation statistics :meth:`preprocess` normalises with (None: raw
    observations); an algorithm with a ``normalize_obs`` option sets it in ``_build`` and
    saves it among its :meth:`modules`."""

    def __init__(
        self,
        observation_space: spaces.Space[Any] | EnvSource,
        action_space: spaces.Space[Any] | None = None,
        config: ConfigT | None = None,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
        encoder: EncoderFactory | None = None,
        **hyperparameters: Any,
    ) -> None:
        """Build from spaces and a config (``None``: the config's defaults), or from an env.

        ``PPO(observation_space, action_space, config)`` is how trainers and runs build an
        algorithm. ``PPO(env, **hyperparameters)``, with an env id or a ``gymnasium.make``
        env, starts from the shipped preset for that env (``rlfleet/config/presets``, as
        ``rlfleet train ppo --env ID`` does), sets the keywords on top (validated like config
        fields: an unknown name or a bad value raises ConfigError), and remembers the env for
        :meth:`learn`. ``encoder`` plugs in a custom network (see
        :mod:`rlfleet.nn.encoders`); algorithms without ``supports_custom_encoder`` refuse it.

        One signature covers both forms (``typing.overload`` would make mypy refuse every
        call through a ``type[Algorithm]`` variable, as the class is abstract); a call that
        mixes them raises ConfigError.
        """
        self.env_target: EnvTarget | None = None
        """The env :meth:`learn` trains on (None: built from spaces)."""
        if not isinstance(observation_space, spaces.Space):
            if action_space is not None or config is not None:
                raise ConfigError(
                    f"{type(self).__name__}(env, ...) takes hyperparameters as keywords, not "
                    "an action space or config; build from spaces as "
                    f"{type(self).__name__}(observation_space, action_space, config)"
                )
            binding = training_backend().bind(
                type(self), observation_space, hyperparameters, seed=seed, device=str(device)
            )
            self.env_target = binding.target
            observation_space, action_space = binding.observation_space, binding.action_space
            config = binding.config
        elif hyperparameters:
            raise ConfigError(
                f"{type(self).__name__}: hyperparameter keywords "
                f"({', '.join(sorted(hyperparameters))}) go with an env, as in "
                f"{type(self).__name__}('CartPole-v1', ...); with spaces, pass "
                f"config={self.config_class.__name__}(...)"
            )
        if action_space is None:
            raise ConfigError(
                f"{type(self).__name__}: got an observation space but no action space"
            )
        if encoder is not None and not self.supports_custom_encoder:
            raise ConfigError(
                f"{self.name} builds its networks on flattened observations and takes no "
                "custom encoder; algorithms that do: "
                f"{', '.join(algorithms_supporting_custom_encoders())}"
            )
        self.check_spaces(observation_space, action_space)
        self.observation_space = observation_space
        self.action_space = action_space
        self.obs_layout = ObsLayout(observation_space)
        """How observations are stored and fed to networks."""
        self.action_shape, self.action_dtype = stored_action_spec(action_space)
        """Per-env shape and dtype of actions in rollouts and replay."""
        self.mask_segments = mask_segments(action_space)
        """Blocks of an action mask for this action space (None: actions cannot be masked)."""
        # A config built in Python is checked as one read from YAML is (bounds, NaN).
        self._config: ConfigT = (
            self.config_class()
            if config is None
            else validate(self.config_class, config, self.config_class.__name__)
        )
        self.encoder_factory = encoder
        """Builds the network that reads observations (None: the built-in encoder)."""
        self.seed = seed
        self.device = resolve_device(device)
        self.generator = torch.Generator().manual_seed(stream_seed(seed, "algorithm"))
        """Drives every random draw the algorithm makes (sampling, minibatch order)."""
        self.progress = 0.0
        """Fraction of the training budget used, in [0, 1]; drives schedules."""
        self.lr_scale = 1.0
        """Multiplier on the scheduled learning rate (reduce-on-plateau lowers it)."""
        self.gradient_steps = 0
        self.nan_policy: NanPolicy = "raise"
        """A non-finite loss or gradient: ``raise`` NonFiniteError, or ``skip_batch`` (the
        trainer sets it from ``TrainerConfig.nan_policy``); see :mod:`rlfleet.nn.optim`."""
        self.skipped_batches = 0
        """Optimiser steps skipped under ``skip_batch`` (see :mod:`rlfleet.nn.optim`)."""
        self.learn_result: LearnResult | None = None
        """What the last :meth:`learn` returned from its trainer (a TrainResult)."""
        self.exploration: StateDependentNoise | None = None
        """gSDE's exploration matrices (:mod:`rlfleet.nn.sde`), for algorithms that build them
        with their network (None: the policy does not explore with gSDE)."""
        self._captures: CapturedSteps | None = None
        """The gradient steps captured as CUDA graphs (:meth:`_capture_steps`), or None:
        steps run eagerly."""
        self._setup()
        self.action_noise_process = self._colored_noise()
        """Colored exploration noise of the ``action_noise_color`` setting (None: white)."""
        self.build_networks()

    def _colored_noise(self) -> ColoredNoise | None:
        """The noise process of ``action_noise_color``, for algorithms whose config has the
        setting; it colors the noise of Box actions, and is refused for any other space."""
        beta = float(getattr(self.config, "action_noise_color", 0.0))
        if not beta:
            return None
        if not isinstance(self.action_space, spaces.Box):
            raise ConfigError(
                f"{self.name}: action_noise_color colors the exploration noise of Box actions; "
                f"got {beta:g} for action space {describe_space(self.action_space)} (use 0)"
            )
        return ColoredNoise(beta, int(np.prod(self.action_shape)), self.seed)

    @property
    def config(self) -> ConfigT:
        """The hyperparameters (an instance of :attr:`config_class`); read-only, so that the
        contract of the algorithm's kind (:mod:`rlfleet.algos.kinds`) can read it covariantly."""
        return self._config

    @classmethod
    def check_spaces(
        cls, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
    ) -> None:
        """Refuse spaces this algorithm cannot handle, naming algorithms that can."""
        if not cls.supports_images and _has_images(observation_space):
            raise EnvSpecError(
                f"{cls.name} has no image encoder for observation space "
                f"{describe_space(observation_space)}; algorithms with one: "
                f"{', '.join(algorithms_supporting_images())}"
            )
        if not isinstance(action_space, cls.action_spaces):
            others = algorithms_supporting(action_space=action_space)
            raise EnvSpecError(
                f"{cls.name} does not support action space {describe_space(action_space)}; "
                f"it supports {_names(cls.action_spaces)}"
                + (f". Algorithms for this space: {', '.join(others)}" if others else "")
            )
        if not isinstance(observation_space, cls.observation_spaces):
            others = algorithms_supporting(observation_space=observation_space)
            raise EnvSpecError(
                f"{cls.name} does not support observation space "
                f"{describe_space(observation_space)}; it supports "
                f"{_names(cls.observation_spaces)}"
                + (f". Algorithms for this space: {', '.join(others)}" if others else "")
            )
        if isinstance(action_space, spaces.Box) and not (
            np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))
        ):
            raise EnvSpecError(
                f"{cls.name}: Box action space {describe_space(action_space)} has infinite "
                "bounds; rlfleet needs finite action bounds to clip and scale actions"
            )

    def build_networks(self) -> None:
        """Run :meth:`_build` with the global torch RNG seeded from ``seed``.

        The global RNG state is restored afterwards, so constructing an algorithm never
        changes randomness elsewhere, and the same seed gives the same initial weights.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self._build()

    def _setup(self) -> None:
        """Derive from spaces and config what :meth:`_build` needs (runs before it, outside
        its seeded RNG); refuse a config that cannot work with a ConfigError."""

    @abstractmethod
    def _build(self) -> None:
        """Create networks and optimisers."""

    # ----------------------------------------------------------------- acting
    def preprocess(self, obs: Any, *, update_stats: bool = False) -> torch.Tensor:
        """Turn a batch of raw env observations (array, dict of arrays, or tensor) into what
        :meth:`act` and the update see and what rollouts store.

        ``obs_layout.to_tensor`` (float32 vectors, uint8 images, packed Dict rows), then,
        for an algorithm with an :attr:`obs_normalizer`, normalised with its running
        statistics, into which the batch is first folded when ``update_stats`` is true.
        """
        tensor = self.obs_layout.to_tensor(obs).to(self.device)
        if self.obs_normalizer is None:
            return tensor
        return normalize_obs(self.obs_normalizer, tensor, update_stats=update_stats)

    @abstractmethod
    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep:
        """Choose actions for a batch of preprocessed observations (no gradients).

        ``action_mask`` (bool ``[batch, mask_size]``, see :mod:`rlfleet.nn.masks`): an
        action whose entry is false is never chosen. ``state``: a recurrent policy's state
        (see :meth:`initial_state`); the new one is returned in ``PolicyStep.state``.
        """

    def refuse_unsupported_inputs(
        self, action_mask: torch.Tensor | None, state: torch.Tensor | None
    ) -> None:
        """For an algorithm without action masks or recurrent state: refuse them rather than
        silently act as if every action were legal."""
        if action_mask is not None:
            raise EnvSpecError(
                f"{self.name} does not support action masks, but the env provides one; "
                f"algorithms that do: {', '.join(algorithms_supporting_masks())}"
            )
        if state is not None:
            raise EnvSpecError(f"{self.name} has no recurrent state, but one was passed")

    def initial_state(self, num_envs: int) -> torch.Tensor | None:
        """A recurrent policy's state for ``num_envs`` fresh episodes (None: not recurrent)."""
        return None

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        """Policy actions as the env takes them: Box actions clipped to the bounds, discrete
        indices shifted by the space's ``start``, the space's shape and dtype."""
        return env_actions(self.action_space, actions)

    @torch.inference_mode()
    def predict(
        self, obs: Any, *, deterministic: bool = True, action_mask: Any | None = None
    ) -> np.ndarray:
        """Actions for raw env observations, ready for ``env.step``.

        ``obs`` is one observation (what ``env.reset``/``env.step`` return) or a batch of
        them (what a vector env returns), told apart by comparing its shape with the
        observation space, as Stable-Baselines3 does: one observation gives one action
        (no batch dim), a batch a batch of actions. ``action_mask`` (see
        :mod:`rlfleet.nn.masks`) is one mask or a batch of them likewise; without it, the
        ``action_mask`` key of a Dict observation is used.

        Stateless: a recurrent policy starts from a fresh state on every call; to play
        whole episodes use :class:`rlfleet.collect.runner.PolicyRunner`.

        Raises:
            EnvSpecError: ``obs`` fits the observation space neither as one observation nor
                as a batch.
        """
        batched = is_batched(obs, self.observation_space)
        if not batched:
            obs = batch_of_one(obs)
            action_mask = None if action_mask is None else np.asarray(action_mask)[None]
        if action_mask is None and self.obs_layout.mask_in_obs:
            action_mask = obs[MASK_KEY]
        tensor = self.preprocess(obs)
        extra: dict[str, torch.Tensor] = {}
        if action_mask is not None:
            mask = torch.as_tensor(np.asarray(action_mask), dtype=torch.bool)
            extra["action_mask"] = mask.to(self.device)
        state = self.initial_state(tensor.shape[0])
        if state is not None:
            extra["state"] = state
        actions = self.env_actions(self.act(tensor, deterministic=deterministic, **extra).actions)
        return actions if batched else actions[0, ...]

    # --------------------------------------------------------------- training
    def step_label(self) -> str:
        """Names the algorithm and its gradient step in a NonFiniteError (see
        :func:`rlfleet.nn.optim.optimizer_step`, which every update steps through)."""
        return f"{self.name} at gradient step {self.gradient_steps}"

    def compile_update(self) -> None:
        """Run the tensor maths of :meth:`update` through ``torch.compile`` from now on.

        Algorithms that keep their loss a pure function of fixed-shape tensors override this;
        the rest refuse, naming themselves.
        """
        self._refuse_option(
            "compile_update",
            "compiling its update (trainer.compile, distributed.th_compile)",
        )

    def capture_update(self) -> None:
        """Capture each gradient step of :meth:`update` as a CUDA graph and replay it from
        then on (``trainer.cuda_graphs``; see :mod:`rlfleet.nn.cuda_graph`).

        Algorithms whose gradient step reads no value on the host override this; the rest
        refuse, naming themselves.
        """
        self._refuse_option(
            "capture_update", "capturing its update as a CUDA graph (trainer.cuda_graphs)"
        )

    def _capture_steps(self) -> None:
        """:meth:`capture_update` of an algorithm whose captured steps a
        :class:`~rlfleet.nn.cuda_graph.CapturedSteps` holds: refuse a device or optimiser a
        capture cannot take, then capture afresh (loading a state captures afresh again: the
        captures read the optimisers' state tensors, which loading replaces)."""
        refuse_uncapturable(self.name, self.device, self.optimizers())
        self._captures = CapturedSteps(self.device)

    def _captures_for(self, *networks: nn.Module) -> CapturedSteps | None:
        """The captured steps to use for the next update, or None: none are on, or one of
        ``networks`` (those the step calls) has hooks, which would run once, at the capture."""
        if self._captures is None or any(has_hooks(network) for network in networks):
            return None
        return self._captures

    def _refuse_option(self, method: str, what: str) -> NoReturn:
        """Raise the ConfigError of an algorithm that does not offer ``what``, naming the
        algorithms that do: those that override ``method``."""
        offering = sorted(
            name
            for name, cls in algorithm_classes().items()
            if getattr(cls, method) is not getattr(Algorithm, method)
        )
        raise ConfigError(
            f"{self.name} does not support {what}; algorithms that do: {', '.join(offering)}"
        )

    def set_progress(self, progress: float) -> None:
        """Tell the algorithm how much of the training budget is used (for schedules)."""
        self.progress = min(max(progress, 0.0), 1.0)

    def learn(
        self,
        total_steps: int,
        *,
        run_dir: str | Path | None = None,
        dataset: str | Path | None = None,
    ) -> Self:
        """Train in place for ``total_steps`` env steps (offline: gradient steps); returns
        ``self``, as Stable-Baselines3's ``learn`` does, and keeps the trainer's
        :class:`~rlfleet.TrainResult` in :attr:`learn_result`.

        The trainer of the algorithm's kind runs it (OnPolicyTrainer, OffPolicyTrainer,
        OfflineTrainer or DistributedTrainer, as for ``rlfleet train``) on the env the
        algorithm was built from, with the preset's env and trainer settings (so it stops
        early when the preset's ``target_reward`` is reached). Each call is a run of its own:
        weights and optimiser carry over, counters and schedules start again.

        Nothing is written unless ``run_dir`` is given: then it becomes a run directory
        (config, history, checkpoints, plots; it must not exist yet) that ``rlfleet eval``,
        ``rlfleet play`` and :func:`rlfleet.load` read. ``dataset``: the dataset directory an
        offline algorithm learns from.
        """
        if self.env_target is None:
            raise ConfigError(
                f"{type(self).__name__}.learn needs the env to train on: build it as "
                f"{type(self).__name__}(env_id, **hyperparameters) (this one was built "
                "from spaces; train it with a trainer, see rlfleet.OnPolicyTrainer)"
            )
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ConfigError(f"learn: total_steps must be an int >= 1, got {total_steps!r}")
        self.learn_result = training_backend().learn(
            self, self.env_target, total_steps, run_dir=run_dir, dataset=dataset
        )
        return self

    # ------------------------------------------------------------ persistence
    @abstractmethod
    def modules(self) -> dict[str, nn.Module]:
        """Networks (and normalisers) whose state is saved."""

    @abstractmethod
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Optimisers whose state is saved."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly: weights, optimisers, RNG, counters
        (and the name of a custom encoder's factory, which loading needs again)."""
        state = {
            "modules": {k: m.state_dict() for k, m in self.modules().items()},
            "optimizers": {k: o.state_dict() for k, o in self.optimizers().items()},
            "generator": self.generator.get_state(),
            "progress": self.progress,
            "lr_scale": self.lr_scale,
            "gradient_steps": self.gradient_steps,
            "skipped_batches": self.skipped_batches,
        }
        if self.encoder_factory is not None:
            state["encoder"] = describe_factory(self.encoder_factory)
        if self.action_noise_process is not None:
            state["action_noise_step"] = self.action_noise_process.step
        if self.exploration is not None:
            state["exploration_step"] = self.exploration.step
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; a missing or mistyped key, or a network of
        another shape, gives a CheckpointError that names it."""
        validate_part(AlgorithmState, state, f"{self.name} state")
        saved_encoder = state.get("encoder")
        if saved_encoder is not None and self.encoder_factory is None:
            raise CheckpointError(
                f"this {self.name} was saved with the custom encoder {saved_encoder}; pass the "
                "same factory again (encoder=...) to load it"
            )
        if saved_encoder is None and self.encoder_factory is not None:
            raise CheckpointError(
                f"this {self.name} was saved with the built-in encoder, but a custom encoder "
                f"({describe_factory(self.encoder_factory)}) was given; load it without one"
            )
        for key, module in self.modules().items():
            if key not in state["modules"]:
                raise CheckpointError(
                    f"checkpoint does not match this {self.name} model: it holds no {key!r} "
                    f"network (it holds {sorted(state['modules'])})"
                )
            try:
                module.load_state_dict(state["modules"][key])
            except RuntimeError as err:
                detail = state_dict_mismatch(
                    state["modules"][key], module.state_dict(), prefix=f"{key}."
                )
                raise CheckpointError(
                    f"checkpoint does not match this {self.name} model: "
                    f"{detail or ' '.join(str(err).split())}"
                ) from err
        try:
            for key, optimizer in self.optimizers().items():
                if key in state.get("optimizers", {}):
                    optimizer.load_state_dict(state["optimizers"][key])
            self.generator.set_state(state["generator"])
        except (KeyError, RuntimeError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint does not match this {self.name} model: {str(err).splitlines()[0]}"
            ) from err
        self.progress = float(state["progress"])
        self.lr_scale = float(state["lr_scale"])
        self.gradient_steps = int(state["gradient_steps"])
        self.skipped_batches = int(state.get("skipped_batches", 0))
        if self.action_noise_process is not None:
            self.action_noise_process.step = int(state.get("action_noise_step", 0))
        if self._captures is not None:  # they read the optimisers' old state tensors
            self._capture_steps()
        if self.exploration is not None:
            self.exploration.step = int(state.get("exploration_step", 0))

    def save(self, path: str | Path) -> Path:
        """Write the algorithm as a checkpoint directory ``path`` (see
        :mod:`rlfleet.checkpoint`: safetensors and JSON, written atomically, nothing
        pickled); :func:`rlfleet.load` reads it back. ``path`` must not exist yet: a
        checkpoint is never overwritten. A custom encoder is saved by its weights and the
        name of its factory; loading needs the factory again."""
        metadata: dict[str, Any] = {
            "rlfleet_version": __version__,
            "algorithm": self.name,
            "observation_space": space_to_json(self.observation_space),
            "action_space": space_to_json(self.action_space),
            "config": to_dict(self.config),
            "run": {"seed": self.seed},
        }
        if self.env_target is not None:
            metadata["run"]["env_id"] = self.env_target.env_id
            metadata["run"]["env_kwargs"] = dict(self.env_target.env_kwargs)
        return save_checkpoint(path, {"algorithm": self.state_dict()}, metadata)

    def export_onnx(self, path: str | Path, *, action_mask: bool | None = None) -> Path:
        """Write the deterministic policy as an ONNX graph at ``path`` (needs the ``onnx``
        extra): observation normalisation, greedy action and the conversion to env actions
        (scaled and clipped to Box bounds, shifted discrete indices) all inside the graph.
        Input ``obs`` is the observation laid out by :attr:`obs_layout`; ``action_mask``
        adds a mask input (default: when the observation carries one). The layout and the
        inputs are written as the model's metadata; see :mod:`rlfleet.algos.export`.

        Raises:
            ConfigError: a recurrent policy, a mask input this algorithm or action space
                cannot honour, or the ``onnx`` package missing.
        """
        return export_onnx(self, path, action_mask=action_mask)

    def parameters_vector(self) -> torch.Tensor:
        """All trainable parameters as one flat tensor (for comparisons in tests and tools)."""
        return torch.cat(
            [p.detach().reshape(-1) for m in self.modules().values() for p in m.parameters()]
        )


def load_saved(
    path: str | Path,
    *,
    encoder: EncoderFactory | None = None,
    device: str | torch.device = "cpu",
) -> Algorithm[Any]:
    """The algorithm in checkpoint directory ``path`` (one :meth:`Algorithm.save` or a
    trainer wrote), on ``device``; ``encoder``: the factory it was saved with, if any.

    Raises:
        CheckpointError: not a checkpoint, or one that does not describe an algorithm.
    """
    state, metadata = load_checkpoint(
        path, state_schema=PolicyState, metadata_schema=PolicyMetadata
    )
    try:
        cls = get_algorithm(str(metadata["algorithm"]))
        observation_space = space_from_json(metadata["observation_space"])
        action_space = space_from_json(metadata["action_space"])
        config = validate(cls.config_class, metadata["config"], f"{path}: config")
        run = metadata.get("run") or {}
        weights = state["algorithm"]
    except (KeyError, TypeError) as err:
        raise CheckpointError(
            f"{path}: not an algorithm checkpoint (missing {err}); expected a directory "
            "written by algo.save or a trainer"
        ) from err
    algo: Algorithm[Any] = cls(
        observation_space,
        action_space,
        config,
        seed=int(run.get("seed", 0)),
        device=device,
        encoder=encoder,
    )
    algo.load_state_dict(weights)
    if "env_id" in run:
        algo.env_target = EnvTarget(str(run["env_id"]), dict(run.get("env_kwargs") or {}))
    return algo


def _names(types: tuple[type[Any], ...]) -> str:
    return ", ".join(t.__name__ for t in types)


def _has_images(space: spaces.Space[Any]) -> bool:
    if isinstance(space, spaces.Dict):
        return any(_has_images(sub) for sub in space.spaces.values())
    return is_image_space(space)
