"""ML-Agents' trainer methods on rlfleet's on- and off-policy trainers.

:class:`~rlfleet.train.trainer.OnPolicyTrainer` and
:class:`~rlfleet.train.trainer.OffPolicyTrainer` speak two vocabularies over one loop:
Tianshou's (``run()``, hooks, epochs) and the one of ML-Agents' ``Trainer`` /
``RLTrainer`` / ``OnPolicyTrainer`` / ``OffPolicyTrainer`` classes
(``mlagents.trainers.trainer``), given here by :class:`MLAgentsTrainerAPI` and
:class:`MLAgentsOffPolicyAPI`. Each method keeps ML-Agents' signature and meaning and
delegates to what the trainer already does; none of them holds a loop of its own.

How ML-Agents' words map to rlfleet's:

behavior and policy
    An ML-Agents trainer trains the policy of one behavior, named by a
    ``BehaviorIdentifiers`` (``behavior_id`` ``"Walker?team=0"``, ``brain_name``
    ``"Walker"``) or its ``behavior_id`` string. An rlfleet trainer is built with the
    algorithm it trains, for its envs' spaces: that algorithm is the policy.
    :meth:`~MLAgentsTrainerAPI.create_policy` checks a behavior spec against it and returns
    it, :meth:`~MLAgentsTrainerAPI.add_policy` files it under a behavior id, and
    :meth:`~MLAgentsTrainerAPI.get_policy` finds it again. Another algorithm object cannot
    be added: the collector, storage and test episodes of a trainer are built around its
    own.
behavior spec
    ML-Agents' ``BehaviorSpec`` (``observation_specs``, ``action_spec``) as gymnasium
    spaces (:func:`behavior_spec_to_spaces`), or a pair ``(observation_space,
    action_space)`` of gymnasium spaces.
step
    :attr:`~MLAgentsTrainerAPI.get_step` is the trainer's env-step counter, the one
    ``max_steps`` budgets; :meth:`~MLAgentsTrainerAPI.advance` takes one training step of
    the loop (:meth:`~rlfleet.train.loop.TrainingLoop.training_step`).
model files
    :meth:`~MLAgentsTrainerAPI.save_model` writes a checkpoint through
    ``save_checkpoint_fn`` (by default into ``run_dir/checkpoints``, with the replay buffer
    when ``save_replay_buffer`` is set) and the deterministic policy as ONNX at
    ``run_dir/<brain_name>.onnx``, where ML-Agents writes ``results/<run-id>/<behavior>.onnx``.
threaded
    ``TrainerConfig.threaded`` (ML-Agents' ``threaded``): the off-policy trainer then steps
    the envs on a thread of its own while it updates the model (see
    :mod:`rlfleet.train.threaded`); the on-policy trainer notes once that it has no effect,
    as an on-policy update needs the rollout it trains on.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
from gymnasium import spaces
from gymnasium.vector import VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.data.replay import ReplayBuffer
from rlfleet.envs.spaces import describe_space
from rlfleet.errors import ConfigError
from rlfleet.train.loop import TrainingLoop

REPLAY_BUFFER_FILE = "last_replay_buffer.npz"
"""Where :meth:`MLAgentsOffPolicyAPI.save_replay_buffer` writes in ``run_dir`` (ML-Agents
writes ``last_replay_buffer.hdf5`` in its artifact path)."""


class BehaviorIdentifiersLike(Protocol):
    """What is read of ML-Agents' ``BehaviorIdentifiers``."""

    @property
    def behavior_id(self) -> str:
        """The full name: ``"<brain_name>?team=<team_id>"``."""

    @property
    def brain_name(self) -> str:
        """The behavior's name without its team."""


class ObservationSpecLike(Protocol):
    """What is read of ML-Agents' ``ObservationSpec`` (its ``name`` too, when it has one)."""

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one observation of this sensor."""


class ActionSpecLike(Protocol):
    """What is read of ML-Agents' ``ActionSpec``."""

    @property
    def continuous_size(self) -> int:
        """Number of continuous actions."""

    @property
    def discrete_branches(self) -> tuple[int, ...]:
        """Size of each discrete action branch."""


class BehaviorSpecLike(Protocol):
    """What is read of ML-Agents' ``BehaviorSpec``."""

    @property
    def observation_specs(self) -> Sequence[ObservationSpecLike]:
        """One spec per sensor."""

    @property
    def action_spec(self) -> ActionSpecLike:
        """The actions."""


BehaviorSpecOrSpaces = BehaviorSpecLike | tuple[spaces.Space[Any], spaces.Space[Any]]
"""An ML-Agents ``BehaviorSpec``, or ``(observation_space, action_space)``."""


def behavior_spec_to_spaces(
    behavior_spec: BehaviorSpecOrSpaces,
) -> tuple[spaces.Space[Any], spaces.Space[Any]]:
    """The gymnasium spaces of an ML-Agents ``BehaviorSpec`` (a pair of spaces is returned
    as it is).

    Observations, as ML-Agents' gym wrapper gives them: a sensor of rank 3 (a camera) is
    ``Box(0, 1, shape, float32)``, any other ``Box(-inf, inf, shape, float32)``; several
    sensors make a ``Dict`` keyed by their ``name`` (``obs_<i>`` where names are missing or
    repeat). Actions: ``continuous_size`` n is ``Box(-1, 1, (n,), float32)`` (ML-Agents
    clips continuous actions to [-1, 1]), one discrete branch of n is ``Discrete(n)``,
    several are ``MultiDiscrete(branches)``.

    Raises:
        ConfigError: no observation, no action, or continuous and discrete actions together
            (no rlfleet algorithm acts in a hybrid action space).
    """
    # ML-Agents' BehaviorSpec is a NamedTuple itself: told apart by its fields.
    if not hasattr(behavior_spec, "observation_specs"):
        given_obs, given_act = cast(tuple[Any, Any], behavior_spec)
        if not isinstance(given_obs, spaces.Space) or not isinstance(given_act, spaces.Space):
            raise ConfigError(
                "behavior_spec: expected an ML-Agents BehaviorSpec or a pair of gymnasium "
                f"spaces, got ({type(given_obs).__name__}, {type(given_act).__name__})"
            )
        return given_obs, given_act
    spec = cast(BehaviorSpecLike, behavior_spec)
    obs_specs = list(spec.observation_specs)
    if not obs_specs:
        raise ConfigError("behavior_spec has no observation_specs; a policy needs at least one")
    boxes = [_sensor_box(tuple(int(n) for n in sensor.shape)) for sensor in obs_specs]
    names = [getattr(sensor, "name", "") or "" for sensor in obs_specs]
    if len(set(names)) != len(names) or "" in names:
        names = [f"obs_{i}" for i in range(len(obs_specs))]
    observation_space: spaces.Space[Any] = (
        boxes[0] if len(boxes) == 1 else spaces.Dict(dict(zip(names, boxes, strict=True)))
    )
    action_spec = spec.action_spec
    continuous = int(action_spec.continuous_size)
    branches = tuple(int(n) for n in action_spec.discrete_branches)
    if continuous and branches:
        raise ConfigError(
            f"behavior_spec has {continuous} continuous actions and discrete branches "
            f"{branches}; rlfleet's algorithms act in one kind of action space, not both"
        )
    if continuous:
        action_space: spaces.Space[Any] = spaces.Box(-1.0, 1.0, (continuous,), np.float32)
    elif len(branches) == 1:
        action_space = spaces.Discrete(branches[0])
    elif branches:
        action_space = spaces.MultiDiscrete(list(branches))
    else:
        raise ConfigError("behavior_spec has no actions (continuous_size 0, no branches)")
    return observation_space, action_space


def _sensor_box(shape: tuple[int, ...]) -> spaces.Box:
    if len(shape) == 3:
        return spaces.Box(0.0, 1.0, shape, np.float32)
    return spaces.Box(-np.inf, np.inf, shape, np.float32)


def _same_structure(a: spaces.Space[Any], b: spaces.Space[Any]) -> bool:
    """Same kind of space with the same shape or sizes (Box bounds aside: a behavior spec
    does not carry them, and the policy scales its actions to the env's own)."""
    if isinstance(a, spaces.Dict) and isinstance(b, spaces.Dict):
        return a.keys() == b.keys() and all(_same_structure(a[k], b[k]) for k in a)
    if isinstance(a, spaces.Box) and isinstance(b, spaces.Box):
        return a.shape == b.shape
    if isinstance(a, spaces.Discrete) and isinstance(b, spaces.Discrete):
        return int(a.n) == int(b.n)
    if isinstance(a, spaces.MultiDiscrete) and isinstance(b, spaces.MultiDiscrete):
        return bool(np.array_equal(a.nvec, b.nvec))
    return a == b


def _behavior_id(parsed_behavior_id: BehaviorIdentifiersLike | str) -> tuple[str, str]:
    """``(behavior_id, brain_name)`` of a ``BehaviorIdentifiers`` or a behavior id string
    (``"Walker?team=0"``: brain ``"Walker"``)."""
    if isinstance(parsed_behavior_id, str):
        return parsed_behavior_id, parsed_behavior_id.split("?", 1)[0]
    return str(parsed_behavior_id.behavior_id), str(parsed_behavior_id.brain_name)


class MLAgentsTrainerAPI(TrainingLoop[Algorithm[Any], VectorEnv[Any, Any, Any]]):
    """ML-Agents' trainer methods (``Trainer``, ``RLTrainer``), each a thin delegation to the
    trainer's own loop (see the module docstring for the mapping)."""

    _behaviors: dict[str, str] | None = None
    """Brain name by behavior id, of the behaviors :meth:`add_policy` filed (None: none yet;
    made on first use, so that the trainers' constructors stay as they are)."""

    @property
    def policies(self) -> dict[str, Algorithm[Any]]:
        """Policies by behavior id (ML-Agents' ``policies``), as :meth:`add_policy` filed them:
        a new dict at each call."""
        return dict.fromkeys(self._behaviors or {}, self.algorithm)

    # ------------------------------------------------------------------ policies
    def create_policy(
        self, parsed_behavior_id: BehaviorIdentifiersLike | str, behavior_spec: BehaviorSpecOrSpaces
    ) -> Algorithm[Any]:
        """The policy for ``behavior_spec``: the algorithm this trainer was built with, once
        the spec's spaces (:func:`behavior_spec_to_spaces`) are found to match its own (same
        kinds, shapes and sizes; Box bounds aside). Like ML-Agents' method it does not add
        the policy; :meth:`add_policy` does.

        Raises:
            ConfigError: the spec describes other spaces than the trainer's envs.
        """
        behavior_id, _ = _behavior_id(parsed_behavior_id)
        observation_space, action_space = behavior_spec_to_spaces(behavior_spec)
        algo = self.algorithm
        for what, given, own in (
            ("observations", observation_space, algo.observation_space),
            ("actions", action_space, algo.action_space),
        ):
            if not _same_structure(given, own):
                raise ConfigError(
                    f"behavior {behavior_id!r}: the spec's {what} are {describe_space(given)}, "
                    f"but this trainer's {algo.name} was built for {describe_space(own)}"
                )
        return algo

    def add_policy(
        self, parsed_behavior_id: BehaviorIdentifiersLike | str, policy: Algorithm[Any]
    ) -> None:
        """File ``policy`` under the behavior id, for :meth:`get_policy` and
        :meth:`save_model` (which names the ONNX file after the behavior's brain name).

        Raises:
            ConfigError: ``policy`` is not this trainer's algorithm (from
                :meth:`create_policy`); to start from another algorithm's weights, load its
                ``state_dict()`` into the trainer's, or build the trainer with it.
        """
        behavior_id, brain_name = _behavior_id(parsed_behavior_id)
        if policy is not self.algorithm:
            raise ConfigError(
                f"add_policy({behavior_id!r}, ...): this trainer trains the {self.algorithm.name} "
                "it was built with (create_policy returns it), not another "
                f"{type(policy).__name__} object; load that one's state_dict() into "
                "trainer.algorithm, or build the trainer with it"
            )
        if self._behaviors is None:
            self._behaviors = {}
        self._behaviors[behavior_id] = brain_name

    def get_policy(self, name_behavior_id: str) -> Algorithm[Any]:
        """The policy :meth:`add_policy` filed under ``name_behavior_id``.

        Raises:
            ConfigError: no policy was added under that id (ML-Agents: KeyError).
        """
        behaviors = self._behaviors or {}
        if name_behavior_id not in behaviors:
            known = ", ".join(repr(k) for k in behaviors) or "none"
            raise ConfigError(
                f"no policy was added for behavior {name_behavior_id!r} (added: {known})"
            )
        return self.algorithm

    # -------------------------------------------------------------- progress
    @property
    def get_step(self) -> int:
        """Env steps trained so far (a property, as in ML-Agents)."""
        return self.counters.env_step

    @property
    def get_max_steps(self) -> int:
        """The budget of env steps, ``TrainerConfig.max_steps`` (a property, as in
        ML-Agents)."""
        return self.config.max_steps

    @property
    def should_still_train(self) -> bool:
        """Whether the budget has room for another training step: fewer than ``max_steps``
        env steps taken (and fewer than ``max_episodes`` episodes when set), the rule at
        which :meth:`run` ends its training steps. ML-Agents says "stops if max_steps is
        reached"; its code compares ``step <= max_steps``, which allows one update at
        exactly ``max_steps``; rlfleet stops there, as its ``run()`` does."""
        cfg = self.config
        c = self.counters
        return c.env_step < cfg.max_steps and (
            cfg.max_episodes is None or c.episode < cfg.max_episodes
        )

    @property
    def reward_buffer(self) -> deque[float]:
        """Returns of the most recent training episodes, newest first (as ML-Agents'
        ``appendleft`` keeps them), at most 20: the window ``test_in_training`` and a loop
        without test envs score. A snapshot: changing it does not change the trainer."""
        return deque(reversed(self.recent_returns), maxlen=self.recent_returns.maxlen)

    @property
    def threaded(self) -> bool:
        """Whether the envs step on a thread of their own while the model updates
        (ML-Agents' ``threaded``): ``TrainerConfig.threaded`` on a trainer that supports it
        (off-policy); False when collection and update take turns on the caller's thread."""
        return self.collects_on_thread

    # ---------------------------------------------------------------- training
    def advance(self) -> None:
        """One training step of the loop (:meth:`TrainingLoop.training_step`: ``training_fn``,
        one collection step, one update step, counters, recent returns, curriculum), on
        ``torch_threads`` CPU threads as :meth:`run` trains; nothing once
        :attr:`should_still_train` is false. :meth:`run` adds history rows, test steps and
        checkpoints around the same step; :meth:`save_model` writes a checkpoint when
        asked."""
        if not self.should_still_train:
            return
        with self._compute_settings():  # as run() trains, so both compute the same
            self.training_step()

    def end_episode(self) -> None:
        """Start a new episode in every training env; the episodes in progress end without
        being counted (ML-Agents calls it when the academy resets, to drop the rewards of
        unfinished episodes; an rlfleet trainer owns its envs, so it resets them). A
        recurrent policy's state starts afresh, and a replay buffer never pairs the last
        stored step with the new episodes' first observation."""
        if self.collector is not None:
            self.collector.reset_envs()

    # ----------------------------------------------------------------- saving
    def save_model(self) -> None:
        """Save a checkpoint and the deployable policy: ``save_checkpoint_fn`` (by default
        an atomic checkpoint in ``run_dir/checkpoints``), then ``algorithm.export_onnx`` to
        ``run_dir/<brain_name>.onnx`` for each behavior added (``run_dir/<algorithm>.onnx``
        when none was), replaced at every call. A policy ONNX cannot hold (a recurrent
        one) or a missing ``onnx`` package skips the ONNX file with a RuntimeWarning that
        says why; the checkpoint is written regardless.

        Raises:
            ConfigError: the trainer has no ``run_dir`` to write into.
        """
        if self.run_dir is None:
            raise ConfigError(
                "save_model writes into the run directory: build the trainer with run_dir=..."
            )
        c = self.counters
        self.save_checkpoint_fn(c.epoch, c.env_step, self.algorithm.gradient_steps)
        names = dict.fromkeys((self._behaviors or {}).values()) or {self.algorithm.name: None}
        for name in names:
            try:
                self.algorithm.export_onnx(self.run_dir / f"{name}.onnx")
            except ConfigError as err:
                warnings.warn(
                    f"save_model wrote the checkpoint but no {name}.onnx: {err}",
                    RuntimeWarning,
                    stacklevel=2,
                )


class MLAgentsOffPolicyAPI(MLAgentsTrainerAPI):
    """ML-Agents' ``OffPolicyTrainer`` methods: the replay buffer saved and loaded apart from
    checkpoints (which also hold it when ``save_replay_buffer`` is set)."""

    buffer: ReplayBuffer

    def _replay_buffer_file(self, method: str) -> Path:
        if self.run_dir is None:
            raise ConfigError(
                f"{method} uses the run directory: build the trainer with run_dir=..."
            )
        return self.run_dir / REPLAY_BUFFER_FILE

    def save_replay_buffer(self) -> None:
        """Write the replay buffer to ``run_dir/last_replay_buffer.npz``
        (:meth:`ReplayBuffer.save`: atomic, nothing pickled).

        Raises:
            ConfigError: the trainer has no ``run_dir``.
        """
        self.buffer.save(self._replay_buffer_file("save_replay_buffer"))

    def load_replay_buffer(self) -> None:
        """Replace the replay buffer's contents with ``run_dir/last_replay_buffer.npz``
        (:meth:`ReplayBuffer.load`). The envs' next observation does not follow the loaded
        last step, so that step is never sampled as a transition.

        Raises:
            ConfigError: the trainer has no ``run_dir``.
            CheckpointError: no such file, or one of other spaces or ``num_envs``.
        """
        self.buffer.load(self._replay_buffer_file("load_replay_buffer"))
        self.buffer.mark_stream_break()
