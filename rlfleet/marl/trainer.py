"""The DecentralizedTrainer: the agents of one PettingZoo game, each with its own learner, on
the training loop every rlfleet trainer shares (:class:`rlfleet.train.loop.TrainingLoop`).

Epochs, training steps, test steps, hooks, stop rules, checkpoints, history and progress are
the single-agent trainers' (the glossary of :mod:`rlfleet.train.trainer` defines them). What a
multi-agent run adds (after rbgame's ``DecentralizedTrainer``):

agents
    :class:`~rlfleet.marl.agents.Agents`: one algorithm per env agent (agents given the same
    algorithm share it), each learning or frozen (``learning_mask``), exploring or greedy
    (``exploration_mask``). It is what the loop trains: ``save_best_fn`` receives it and a
    checkpoint saves it.
agent step
    One action of one agent in one env copy; the step counter (``env_step``, ``max_steps``,
    ``epoch_num_steps``) counts these.
collection step
    ``collection_step_num_episodes`` episodes on the ``num_envs`` training copies (no more
    than ``max_episodes`` has left), collected by
    :class:`~rlfleet.marl.collector.MultiAgentCollector`: each agent's steps reach its
    learner's storage when its trajectory ends.
update step
    On-policy learners: one after every collection step, on the trajectories it completed
    (``algo.update(rollout, batch_size=...)``). Off-policy learners: inside the collection
    step, one every ``collection_step_num_env_steps`` agent steps, of
    ``update_step_num_gradient_steps`` gradient steps on minibatches of ``batch_size`` (once
    the buffer holds ``batch_size`` and ``learning_starts`` transitions). A frozen agent is
    never updated.
test step
    ``test_step_num_episodes`` greedy episodes on the ``num_test_envs`` test copies; their
    returns are ``[episodes, agents]`` (columns in ``possible_agents`` order), scored by
    ``reward_metric(returns) -> float`` or ``compute_score_fn(stats)``; by default,
    ``MultiAgentSettings.return_reduction``: the mean over episodes of the *learning* agents'
    mean return (all agents' when none learns). In a zero-sum game the mean of all agents'
    returns is always 0; the learning agents' mean is what they win.
parameter sharing
    Agents given the same algorithm object share it: its observation is the agent's own,
    flattened, followed by a one-hot of the agent's index among the agents sharing it (build
    such agents with :func:`~rlfleet.marl.agents.make_agents`).
centralized critic / self-play
    See :mod:`rlfleet.marl.mappo` and :mod:`rlfleet.marl.selfplay`.

History rows carry the common columns (``train/return_mean`` and ``test/return_mean``: the
mean over episodes of the learning agents' mean return, as the default score) plus
``train/return_mean/<agent>`` and ``test/return_mean/<agent>``, each learner's update metrics
as ``<learner>/<metric>``, and in self-play ``selfplay/elo``.

rbgame's ``DecentralizedTrainer(env_args, ...)`` and ``train(agents, ...)`` build and run this
same loop: see :class:`DecentralizedTrainer` and ``docs/coming-from-rbgame.md``.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import torch

from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import is_off_policy, is_offline, require_kind
from rlfleet.checkpoint.schema import MultiAgentLoopState
from rlfleet.config.fields import PositiveInt
from rlfleet.config.loader import validate
from rlfleet.errors import ConfigError
from rlfleet.logging.loggers import Logger
from rlfleet.marl.agents import Agents, as_factory, shared_observation_space
from rlfleet.marl.collector import Learner, MultiAgentCollector, MultiAgentTestEpisodes, learners_of
from rlfleet.marl.envs import EnvFactory, MultiAgentVecEnv, check_agent_spaces
from rlfleet.marl.mappo import CentralCriticConfig
from rlfleet.marl.masks import check_mask, check_mask_support
from rlfleet.marl.rbgame import (
    RESULTS_PLOT,
    RUN_DIR_PLOT,
    EnvArgs,
    env_factory,
    plot_reward_metric,
)
from rlfleet.marl.selfplay import SelfPlayOption, self_play_groups
from rlfleet.marl.workers import WorkerMultiAgentVecEnv
from rlfleet.train.loop import (
    ComputeScoreFn,
    ReturnReduction,
    SaveBestFn,
    SaveCheckpointFn,
    StopFn,
    TestFn,
    TestResultFn,
    TrainerConfig,
    TrainingFn,
    TrainingLoop,
)
from rlfleet.train.threads import DEFAULT_TORCH_THREADS, ThreadSetting
from rlfleet.types import CollectStats, EvalStats

_REDUCTIONS = ("learning_mean", "mean", "sum", "min", "max")

RewardMetric = Callable[[np.ndarray], float]
"""``reward_metric(rewards[num_episodes, num_agents]) -> float``: a test step's score."""
Reduction = Literal["learning_mean", "mean", "sum", "min", "max"] | int


@dataclass
class MultiAgentSettings:
    """What a multi-agent run adds to the trainer's settings (the ``multi_agent:`` section of
    a run config)."""

    share_parameters: bool = False
    """One network for all agents (with an agent-id feature) instead of one per agent."""
    learning_mask: list[bool] | None = None
    """One flag per agent, in ``possible_agents`` order: false freezes it (default: all
    learn)."""
    exploration_mask: list[bool] | None = None
    """One flag per agent: false makes it act greedily in training (default: all explore,
    frozen agents too)."""
    collection_step_num_episodes: PositiveInt = 16
    """Training episodes per collection step (all copies counted)."""
    collection_step_num_env_steps: PositiveInt = 16
    """Agent steps (all copies and agents counted) between off-policy update steps."""
    update_step_num_gradient_steps: PositiveInt = 1
    """Gradient steps per off-policy update step (on-policy: the algorithm's ``num_epochs``)."""
    batch_size: PositiveInt | None = 64
    """Minibatch size of every learner's update; None: each learner's own algorithm's
    ``batch_size`` (as ML-Agents run options give it per behavior)."""
    buffer_size: PositiveInt = 50_000
    """Replay capacity (transitions) of each off-policy learner."""
    return_reduction: Reduction = "learning_mean"
    """How a test step's per-agent returns become its score, averaged over episodes: the
    learning agents' mean (``learning_mean``; all agents' when none learns), the ``mean``,
    ``sum``, ``min`` or ``max`` over all agents, or one agent's (its index)."""
    centralized_critic: bool = False
    """PPO learners use a critic over the env's global state (MAPPO)."""
    central_critic: CentralCriticConfig = field(default_factory=CentralCriticConfig)
    """Hyperparameters of the centralized critic."""
    self_play: SelfPlayOption | None = None
    """Self-play against past snapshots: one config for a two-player game with one shared
    learner, or one per learner name for teams with learners of their own (see
    :mod:`rlfleet.marl.selfplay`)."""
    shared_memory: bool = False
    """Step the env copies in subprocess workers, observations in shared memory (rbgame's
    ``shared_memory``)."""


RbgameCountsFn = Callable[[int, int], None]
"""rbgame's ``train_fn`` / ``test_fn(num_collected_episodes, num_collected_steps)``."""
RbgameSaveBestFn = Callable[[int], None]
"""rbgame's ``save_best_fn(num_collected_episodes)``."""
RbgameSaveLastFn = Callable[[], None]
"""rbgame's ``save_last_fn()``."""
RbgameStopFn = Callable[[float, int], bool]
"""rbgame's ``stop_fn(reward_metric, num_collected_episodes) -> bool``."""
UNBOUNDED_STEPS = sys.maxsize
"""``config.max_steps`` of rbgame's form, whose budget is in episodes."""


@dataclass
class RbgameParameters:
    """rbgame's ``DecentralizedTrainer`` parameters, in its order and with its defaults, then
    rlfleet's ``seed``, ``run_dir`` and ``settings`` (see :class:`DecentralizedTrainer`)."""

    env_args: EnvArgs
    num_train_envs: PositiveInt = 16
    num_test_envs: PositiveInt = 16
    batch_size: PositiveInt = 64
    update_freq: PositiveInt = 100
    test_freq: PositiveInt = 100
    episodes_per_train: PositiveInt = 5000
    episodes_per_test: PositiveInt = 50
    train_fn: RbgameCountsFn | None = None
    test_fn: RbgameCountsFn | None = None
    save_best_fn: RbgameSaveBestFn | None = None
    save_last_fn: RbgameSaveLastFn | None = None
    stop_fn: RbgameStopFn | None = None
    reward_metric: RewardMetric | None = None
    shared_memory: bool = True
    seed: int = 0
    run_dir: str | Path | None = None
    settings: MultiAgentSettings | None = None


_RBGAME_POSITIONAL = 15
"""rbgame's parameters, all of which may be given by position (rlfleet's additions may not)."""
_RBGAME_FORM = "DecentralizedTrainer(env_args, ...)"


def _is_rbgame_call(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether a constructor call is rbgame's form (see :class:`DecentralizedTrainer`)."""
    if "env_args" in kwargs:
        return True
    if "agents" in kwargs:
        return False
    return len(args) < 2 or isinstance(args[1], int)


def _rbgame_parameters(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> RbgameParameters:
    """Bind a call in rbgame's form to its parameters and check them.

    Raises:
        ConfigError: too many positional arguments, one given twice, an unknown keyword,
            no ``env_args``, a value out of range, or ``env_args`` that names no env factory.
    """
    names = [f.name for f in fields(RbgameParameters)]
    if len(args) > _RBGAME_POSITIONAL:
        raise ConfigError(
            f"{_RBGAME_FORM}: expected at most {_RBGAME_POSITIONAL} positional arguments "
            f"({', '.join(names[:_RBGAME_POSITIONAL])}), got {len(args)}"
        )
    data = dict(zip(names, args, strict=False))
    twice = sorted(data.keys() & kwargs.keys())
    if twice:
        raise ConfigError(f"{_RBGAME_FORM}: expected each parameter once, got {twice} twice")
    data.update(kwargs)
    if "env_args" not in data:
        raise ConfigError(
            f"{_RBGAME_FORM}: expected env_args (rbgame's form) or env and agents "
            "(rlfleet's form), got neither"
        )
    env_args = data.pop("env_args")
    # Checked apart: validating it would copy a mapping and its values.
    env_factory(env_args)
    params = validate(RbgameParameters, {"env_args": {}, **data}, _RBGAME_FORM)
    return replace(params, env_args=env_args)


def default_reward_metric(rewards: np.ndarray) -> float:
    """Mean over episodes of all agents' mean return (rbgame's default metric). In a zero-sum
    game it is always 0: rlfleet's default score is the learning agents' mean instead
    (``MultiAgentSettings.return_reduction``)."""
    return float(rewards.mean()) if rewards.size else float("nan")


def reduced_return_score(
    reduction: Reduction = "mean", learning_columns: Sequence[int] | None = None
) -> ComputeScoreFn:
    """A ``compute_score_fn`` for test returns that are per agent.

    ``stats.returns`` of shape ``[num_episodes, num_agents]`` is reduced over agents
    (``learning_mean``: the mean of the ``learning_columns``, all columns when not given;
    ``mean``, ``sum``, ``min``, ``max``; or an int: that agent's column), then averaged over
    episodes; 1-D returns (one agent) are simply averaged. (The trainers' Tianshou-style
    ``multi_agent_return_reduction=`` parameter instead takes a function of the returns.)
    """
    if isinstance(reduction, str) and reduction not in _REDUCTIONS:
        raise ConfigError(
            "return_reduction: expected learning_mean, mean, sum, min, max or an agent index, "
            f"got {reduction!r}"
        )
    columns = None if learning_columns is None else list(learning_columns)

    def score(stats: EvalStats) -> float:
        returns = np.asarray(stats.returns, dtype=np.float64)
        if returns.size == 0:
            return float("nan")
        if returns.ndim == 1:
            return float(returns.mean())
        if isinstance(reduction, int):
            if not -returns.shape[1] <= reduction < returns.shape[1]:
                raise ConfigError(
                    f"return_reduction: agent index {reduction} out of range for "
                    f"{returns.shape[1]} agents"
                )
            per_episode = returns[:, reduction]
        elif reduction == "learning_mean":
            per_episode = returns[:, columns].mean(axis=1) if columns else returns.mean(axis=1)
        else:
            per_episode = getattr(np, reduction)(returns, axis=1)
        return float(per_episode.mean())

    return score


def multi_agent_return_reduction(reduction: Reduction = "mean") -> ComputeScoreFn:
    """Deprecated name of :func:`reduced_return_score`: it clashed with the trainers'
    ``multi_agent_return_reduction=`` parameter, which means something else."""
    warnings.warn(
        "rlfleet.marl.trainer.multi_agent_return_reduction(reduction) is now "
        "reduced_return_score(reduction)",
        DeprecationWarning,
        stacklevel=2,
    )
    return reduced_return_score(reduction)


class DecentralizedTrainer(TrainingLoop[Agents, MultiAgentVecEnv]):
    """Trains the agents of one PettingZoo game, each with its own rlfleet algorithm.

    It is built in one of two forms: rlfleet's, ``DecentralizedTrainer(env, agents, config,
    settings, ...)`` then :meth:`run`; or rbgame's, ``DecentralizedTrainer(env_args, ...)``
    then :meth:`train`. The call is rbgame's when it has ``env_args`` by keyword, or neither
    ``agents`` by keyword nor a second positional argument other than an int (rbgame's
    ``num_train_envs``). Both run the same loop.

    Args (rlfleet's form):
        env: a PettingZoo env (AEC or Parallel) or a callable that builds one.
        agents: :class:`~rlfleet.marl.agents.Agents`, or one algorithm per env agent (in
            ``possible_agents`` order, or a mapping by agent name), with
            ``settings.learning_mask`` and ``settings.exploration_mask``.
        config: the loop's settings (:class:`~rlfleet.train.loop.TrainerConfig`).
        settings: the multi-agent settings (:class:`MultiAgentSettings`).
        num_envs / num_test_envs: copies of the env stepped together for training and tests.
        seed: training copy ``i`` is first reset with ``seed + i``; test steps are seeded from
            ``rlfleet.seeding.episode_seed(seed, "test")``.
        reward_metric: ``reward_metric(rewards[num_episodes, num_agents]) -> float``, the test
            score (give it or ``compute_score_fn``, not both; default: the learning agents'
            mean return, see ``MultiAgentSettings.return_reduction``).
        The other arguments and the hooks are :class:`~rlfleet.train.loop.TrainingLoop`'s;
        ``save_best_fn`` receives the :class:`~rlfleet.marl.agents.Agents`.

    Args (rbgame's form, its names, order and defaults; each maps onto the loop's settings):
        env_args: the env factory: a mapping ``{"env": <PettingZoo module path, module or
            callable>, **its keyword arguments}``, or a callable that builds the env (see
            :func:`rlfleet.marl.rbgame.env_factory`).
        num_train_envs (16) / num_test_envs (16): ``num_envs`` / ``num_test_envs``.
        batch_size (64): ``settings.batch_size``.
        update_freq (100): agent steps (all training copies counted) between the off-policy
            learners' updates: ``settings.collection_step_num_env_steps``. In a turn-based
            (AEC) game one agent step is one env step. Each update takes
            ``settings.update_step_num_gradient_steps`` gradient steps; on-policy learners
            update once per collection step, every ``test_freq`` episodes.
        test_freq (100): training episodes between test steps:
            ``settings.collection_step_num_episodes``, with ``config.epoch_num_steps`` 1, so
            that an epoch is one collection step and ends with its test step.
        episodes_per_train (5000): the total training-episode budget: ``config.max_episodes``
            (``config.max_steps`` is unbounded). Training stops at the first step at which the
            count reaches it; copies finishing on that same step may add up to
            ``num_train_envs - 1`` more, as in rbgame. A last, shorter collection step plays
            what the budget has left, and is tested too.
        episodes_per_test (50): ``config.test_step_num_episodes``.
        train_fn: ``train_fn(num_collected_episodes, num_collected_steps)``, before every
            step of the training env copies, as rbgame calls it.
        test_fn: ``test_fn(num_collected_episodes, num_collected_steps)``, before each test
            step, with the training counts so far.
        save_best_fn: ``save_best_fn(num_collected_episodes)``, when a test step's metric is
            the best so far (given, it replaces the run directory's ``best/``).
        save_last_fn: ``save_last_fn()``, once training has stopped.
        stop_fn: ``stop_fn(reward_metric, num_collected_episodes) -> bool``, after each test
            step with its metric (not the best one, as rlfleet's ``stop_fn`` receives).
        reward_metric: as in rlfleet's form.
        shared_memory (True): ``settings.shared_memory``.
        seed / run_dir / settings: rlfleet's additions, by keyword: ``seed`` and ``run_dir``
            as in rlfleet's form; ``settings`` the other multi-agent settings (buffer size,
            gradient steps per update, ...), whose fields above the mapped parameters replace,
            and the masks :meth:`train`'s.

        Then :meth:`train` builds the loop and runs it. Config is checked at construction;
        the envs are built by :meth:`train`, whose result says what it did.

    Raises:
        ConfigError: a setting is out of range; the agents or masks do not match the env's
            agents; rbgame's form gets an unknown keyword or bad ``env_args``.
        EnvSpecError: ``env`` is not a PettingZoo env or a factory of one; an algorithm cannot
            act in its agent's spaces or honour its action masks; a centralized critic on an
            env without ``state()``.
    """

    state_schema = MultiAgentLoopState
    # A frozen random agent draws its test moves from the generator it plays training games
    # with: a skipped test step would change the training games that follow.
    test_steps_independent = False

    collector: MultiAgentCollector
    evaluator: MultiAgentTestEpisodes

    @overload
    def __init__(
        self,
        env_args: EnvArgs,
        num_train_envs: PositiveInt = 16,
        num_test_envs: PositiveInt = 16,
        batch_size: PositiveInt = 64,
        update_freq: PositiveInt = 100,
        test_freq: PositiveInt = 100,
        episodes_per_train: PositiveInt = 5000,
        episodes_per_test: PositiveInt = 50,
        train_fn: RbgameCountsFn | None = None,
        test_fn: RbgameCountsFn | None = None,
        save_best_fn: RbgameSaveBestFn | None = None,
        save_last_fn: RbgameSaveLastFn | None = None,
        stop_fn: RbgameStopFn | None = None,
        reward_metric: RewardMetric | None = None,
        shared_memory: bool = True,
        *,
        seed: int = 0,
        run_dir: str | Path | None = None,
        settings: MultiAgentSettings | None = None,
    ) -> None: ...

    @overload
    def __init__(
        self,
        env: EnvFactory | Any,
        agents: Agents | Sequence[Algorithm[Any]] | Mapping[str, Algorithm[Any]],
        config: TrainerConfig | None = None,
        settings: MultiAgentSettings | None = None,
        *,
        num_envs: PositiveInt = 4,
        num_test_envs: PositiveInt = 4,
        seed: int = 0,
        run_dir: str | Path | None = None,
        run_metadata: dict[str, Any] | None = None,
        torch_threads: ThreadSetting = DEFAULT_TORCH_THREADS,
        training_fn: TrainingFn | None = None,
        train_fn: TrainingFn | None = None,
        test_fn: TestFn | None = None,
        stop_fn: StopFn | None = None,
        compute_score_fn: ComputeScoreFn | None = None,
        save_best_fn: SaveBestFn[Agents] | None = None,
        save_checkpoint_fn: SaveCheckpointFn | None = None,
        test_result_fn: TestResultFn | None = None,
        resume_from_log: bool = False,
        multi_agent_return_reduction: ReturnReduction | None = None,
        logger: Logger | None = None,
        reward_metric: RewardMetric | None = None,
    ) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._rbgame: RbgameParameters | None = None
        """rbgame's form: its parameters, until :meth:`train` builds the loop from them."""
        if _is_rbgame_call(args, kwargs):
            rbgame_names = {f.name for f in fields(RbgameParameters)}
            rlfleet_only = set(inspect.signature(self._build).parameters) - rbgame_names
            if kwargs.keys() & rlfleet_only:
                raise ConfigError(
                    f"DecentralizedTrainer: {sorted(kwargs.keys() & rlfleet_only)} belong to "
                    "rlfleet's form DecentralizedTrainer(env, agents, ...), which needs agents; "
                    "rbgame's form DecentralizedTrainer(env_args, ...) takes them in train()"
                )
            self._rbgame = _rbgame_parameters(args, kwargs)
            return
        self._build(*args, **kwargs)

    def _build(
        self,
        env: EnvFactory | Any,
        agents: Agents | Sequence[Algorithm[Any]] | Mapping[str, Algorithm[Any]],
        config: TrainerConfig | None = None,
        settings: MultiAgentSettings | None = None,
        *,
        num_envs: PositiveInt = 4,
        num_test_envs: PositiveInt = 4,
        seed: int = 0,
        run_dir: str | Path | None = None,
        run_metadata: dict[str, Any] | None = None,
        torch_threads: ThreadSetting = DEFAULT_TORCH_THREADS,
        training_fn: TrainingFn | None = None,
        train_fn: TrainingFn | None = None,
        test_fn: TestFn | None = None,
        stop_fn: StopFn | None = None,
        compute_score_fn: ComputeScoreFn | None = None,
        save_best_fn: SaveBestFn[Agents] | None = None,
        save_checkpoint_fn: SaveCheckpointFn | None = None,
        test_result_fn: TestResultFn | None = None,
        resume_from_log: bool = False,
        multi_agent_return_reduction: ReturnReduction | None = None,
        logger: Logger | None = None,
        reward_metric: RewardMetric | None = None,
    ) -> None:
        """rlfleet's form (see the class docstring)."""
        config = validate(TrainerConfig, config or TrainerConfig(), "config")
        self.settings = validate(MultiAgentSettings, settings or MultiAgentSettings(), "settings")
        for name, value in (("num_envs", num_envs), ("num_test_envs", num_test_envs)):
            if value < 1:
                raise ConfigError(f"{name}: expected an integer >= 1, got {value}")
        if reward_metric is not None and compute_score_fn is not None:
            raise ConfigError("give reward_metric or compute_score_fn, not both")
        factory = as_factory(env)
        vec_env = WorkerMultiAgentVecEnv if self.settings.shared_memory else MultiAgentVecEnv
        train_envs = vec_env(factory, num_envs, seed=seed)
        test_envs = vec_env(factory, num_test_envs)
        if not isinstance(agents, Agents):
            agents = Agents(
                train_envs.possible_agents,
                agents,
                self.settings.learning_mask,
                self.settings.exploration_mask,
            )
        self._check_agents(agents, train_envs)
        state_size = train_envs.state_size() if self.settings.centralized_critic else None
        self.learners = learners_of(
            agents,
            train_envs,
            buffer_size=self.settings.buffer_size,
            critic_state_size=state_size,
            central_critic=self.settings.central_critic,
        )
        """Each agent's learner (agents sharing an algorithm share one)."""
        if reward_metric is not None:
            metric = reward_metric
            compute_score_fn = lambda stats: float(metric(np.asarray(stats.returns)))  # noqa: E731
        super().__init__(
            agents,
            train_envs,
            test_envs,
            config,
            run_dir=run_dir,
            run_metadata=run_metadata,
            seed=seed,
            torch_threads=torch_threads,
            training_fn=training_fn,
            train_fn=train_fn,
            test_fn=test_fn,
            stop_fn=stop_fn,
            compute_score_fn=compute_score_fn or self._settings_score(agents),
            save_best_fn=save_best_fn,
            save_checkpoint_fn=save_checkpoint_fn,
            test_result_fn=test_result_fn,
            resume_from_log=resume_from_log,
            multi_agent_return_reduction=multi_agent_return_reduction,
            logger=logger,
        )

    def _settings_score(self, agents: Agents) -> ComputeScoreFn:
        """The default score: ``settings.return_reduction`` of the per-agent test returns."""
        return reduced_return_score(self.settings.return_reduction, agents.learning_columns)

    # ------------------------------------------------------------ rbgame's form
    def train(
        self,
        agents: Agents | Sequence[Algorithm[Any]] | Mapping[str, Algorithm[Any]],
        learning_mask: Sequence[bool] | None = None,
        exploration_mask: Sequence[bool] | None = None,
        plot: bool = False,
    ) -> dict[str, Any]:
        """rbgame's ``train``: build the loop from the constructor's parameters and these
        agents, run it until ``episodes_per_train`` episodes or ``stop_fn``, call
        ``save_last_fn()``, and return what it did.

        Args:
            agents: one algorithm per env agent (``possible_agents`` order, or a mapping by
                agent name), or :class:`~rlfleet.marl.agents.Agents` (which carries its own
                masks).
            learning_mask: one flag per agent; false freezes it (None: all learn).
            exploration_mask: one flag per agent; false makes it greedy in training (None:
                all explore, frozen agents too).
            plot: write the reward metric of each test step against the training episodes:
                ``<run_dir>/plots/reward_metric.png``, or without a run directory rbgame's
                ``plots/results.png`` under the working directory.

        Returns:
            ``{"reward_metric_stats"``: the metric of each test step, ``"num_collected_steps"``,
            ``"num_collected_episodes"``, ``"num_gradient_steps"``, ``"training_time"``: wall
            seconds, test steps included``}``.

        Raises:
            ConfigError: the trainer was built in rlfleet's form (call :meth:`run`); masks
                given with an ``Agents`` object; bad agents or masks.
        """
        params = self._rbgame
        if params is None:
            raise ConfigError(
                "train(agents, ...) runs a trainer built in rbgame's form, "
                "DecentralizedTrainer(env_args, ...); this one was given its agents: call run()"
            )
        if isinstance(agents, Agents) and (learning_mask, exploration_mask) != (None, None):
            raise ConfigError(
                "learning_mask / exploration_mask: an Agents object carries its own masks; "
                "give one algorithm per agent to set them here"
            )
        settings = replace(
            params.settings or MultiAgentSettings(),
            batch_size=params.batch_size,
            collection_step_num_env_steps=params.update_freq,
            collection_step_num_episodes=params.test_freq,
            shared_memory=params.shared_memory,
            learning_mask=None if learning_mask is None else [bool(f) for f in learning_mask],
            exploration_mask=(
                None if exploration_mask is None else [bool(f) for f in exploration_mask]
            ),
        )
        config = TrainerConfig(
            max_steps=UNBOUNDED_STEPS,
            max_episodes=params.episodes_per_train,
            epoch_num_steps=1,
            test_step_num_episodes=params.episodes_per_test,
            test_in_training=False,
            show_progress=False,
        )
        scores: list[float] = []
        episodes: list[int] = []

        def record(epoch: int, env_step: int, score: float) -> None:
            scores.append(score)
            episodes.append(self.counters.episode)

        self._build(
            env_factory(params.env_args),
            agents,
            config,
            settings,
            num_envs=params.num_train_envs,
            num_test_envs=params.num_test_envs,
            seed=params.seed,
            run_dir=params.run_dir,
            test_result_fn=record,
            reward_metric=params.reward_metric,
            **self._rbgame_hooks(params, scores),
        )
        # rbgame calls train_fn before every env step (an epsilon schedule by episode).
        self.collector.before_step = params.train_fn
        try:
            result = self.run()
        finally:
            self.close()
        if params.save_last_fn is not None:
            params.save_last_fn()
        if plot:
            out = RESULTS_PLOT if self.run_dir is None else self.run_dir / RUN_DIR_PLOT
            plot_reward_metric(episodes, scores, out)
        return {
            "reward_metric_stats": scores,
            "num_collected_steps": result.env_steps,
            "num_collected_episodes": result.episodes,
            "num_gradient_steps": result.gradient_steps,
            "training_time": result.wall_time_s,
        }

    def _rbgame_hooks(self, params: RbgameParameters, scores: list[float]) -> dict[str, Any]:
        """rbgame's hooks as the loop's: the same events, rbgame's arguments."""
        hooks: dict[str, Any] = {}
        counters = lambda: self.counters  # noqa: E731 - the loop replaces them on resume
        if (test_fn := params.test_fn) is not None:
            hooks["test_fn"] = lambda epoch, step: test_fn(counters().episode, step)
        if (save_best_fn := params.save_best_fn) is not None:
            hooks["save_best_fn"] = lambda agents: save_best_fn(counters().episode)
        if (stop_fn := params.stop_fn) is not None:
            hooks["stop_fn"] = lambda best: bool(stop_fn(scores[-1], counters().episode))
        return hooks

    @property
    def agents(self) -> Agents:
        """What this trainer trains (the same object as ``algorithm``)."""
        return self.algorithm

    @property
    def train_returns(self) -> np.ndarray:
        """``[episodes, agents]``: every training episode's return of each agent so far."""
        names = self.algorithm.names
        return np.asarray(self.collector.train_returns, np.float64).reshape(-1, len(names))

    # ---------------------------------------------------------------- checks
    def _check_agents(self, agents: Agents, envs: MultiAgentVecEnv) -> None:
        """Refuse agents that cannot play their seats, before any step is taken."""
        if agents.names != envs.possible_agents:
            raise ConfigError(
                f"agents: expected the env's agents {envs.possible_agents}, got {agents.names}"
            )
        settings = self.settings
        for group in agents.groups:
            algorithm = group.algorithm
            if group.learning and algorithm.kind == "distributed":
                raise ConfigError(
                    f"agent {group.agents[0]!r}: {algorithm.name} learns in the actor-learner "
                    "trainer only; expected an on-policy, off-policy or offline algorithm for a "
                    "learning agent (or freeze it with learning_mask)"
                )
            if group.learning and algorithm.needs_fixed_length_rollouts:
                raise ConfigError(
                    f"agent {group.agents[0]!r}: {algorithm.name} learns from rollouts of "
                    "num_steps vector steps each, and a multi-agent learner's rollouts are its "
                    "finished trajectories; expected another algorithm for a learning agent (or "
                    "freeze it with learning_mask)"
                )
            for agent in group.agents:
                space = envs.observation_spaces[agent]
                if len(group.agents) > 1:
                    space = shared_observation_space(space, len(group.agents))
                check_agent_spaces(envs, agent, group.algorithm, space)
                if envs.has_masks(agent):
                    check_mask_support(group.algorithm, agent)
                    mask_space = envs.raw_observation_spaces[agent]["action_mask"]  # type: ignore[index]
                    check_mask(
                        np.zeros(mask_space.shape, bool),
                        int(envs.action_spaces[agent].n),  # type: ignore[attr-defined]
                        f"agent {agent!r}",
                    )
        if settings.self_play is not None:
            groups = [(g.name, g.agents, g.learning) for g in agents.groups]
            self_play_groups(agents.names, groups, settings.self_play)

    # ------------------------------------------------------------- loop pieces
    def _make_collector(
        self, train_envs: MultiAgentVecEnv, seed: int | None
    ) -> MultiAgentCollector:
        return MultiAgentCollector(
            train_envs,
            self.learners,
            collection_step_num_env_steps=self.settings.collection_step_num_env_steps,
            self_play=self.settings.self_play,
            seed=seed or 0,
        )

    def _make_test_episodes(
        self, test_envs: MultiAgentVecEnv, seed: int | None
    ) -> MultiAgentTestEpisodes:
        return MultiAgentTestEpisodes(test_envs, self.collector, seed)

    def policy_metadata(self) -> dict[str, Any]:
        return {"agents": self.algorithm.names, "learners": self.algorithm.learner_names()}

    def _training_step(self) -> tuple[CollectStats, dict[str, float]]:
        num_episodes = self.settings.collection_step_num_episodes
        if self.config.max_episodes is not None:
            num_episodes = min(num_episodes, self.config.max_episodes - self.counters.episode)
        stats, metrics = self.collector.collect(num_episodes, self._update_off_policy)
        metrics.update(self._update_on_policy())
        return stats, metrics

    def _test_metrics(self, stats: EvalStats) -> dict[str, float]:
        """Each agent's mean test return, and ``test/return_mean`` as the learning agents'
        mean, like ``train/return_mean`` (in a zero-sum game all agents' mean is always 0)."""
        returns = np.asarray(stats.returns).reshape(-1, len(self.algorithm.names))
        per_agent = {
            f"test/return_mean/{agent}": float(returns[:, i].mean())
            for i, agent in enumerate(self.algorithm.names)
        }
        if self.multi_agent_return_reduction is not None or returns.size == 0:
            return per_agent
        learning = returns[:, self.algorithm.learning_columns].mean(axis=1)
        return {"test/return_mean": float(learning.mean()), **per_agent}

    def _clear_buffers(self) -> None:
        """``reset_collector_buffers``: empty every off-policy learner's replay buffer."""
        for learner in self.collector.distinct():
            if learner.buffer is not None:
                learner.buffer.clear()

    # ---------------------------------------------------------------- updates
    def _learning(self) -> list[Learner]:
        return [learner for learner in self.collector.distinct() if learner.learning]

    def _update_off_policy(self) -> dict[str, float]:
        """The off-policy learners' update step (see the module docstring)."""
        metrics: dict[str, float] = {}
        settings = self.settings
        for learner in self._learning():
            algo = learner.algorithm
            # What samples the buffer: an off-policy or offline contract (the random agent
            # declares none: it has nothing to learn); only off-policy ones warm up first.
            sampler = algo if is_off_policy(algo) or is_offline(algo) else None
            if learner.buffer is None or sampler is None:
                continue
            starts = algo.config.learning_starts if is_off_policy(algo) else 0
            batch_size = settings.batch_size or algo.config.batch_size
            if len(learner.buffer) < max(batch_size, starts, 1):
                continue
            out = sampler.update(
                learner.buffer,
                batch_size=batch_size,
                num_gradient_steps=settings.update_step_num_gradient_steps,
            )
            metrics.update({f"{learner.name}/{k}": v for k, v in out.items()})
        return metrics

    def _update_on_policy(self) -> dict[str, float]:
        """The on-policy learners' update step, on the trajectories completed since their
        last one; a centralized critic is fitted to the same returns."""
        metrics: dict[str, float] = {}
        for learner in self._learning():
            if learner.rollout is None or not learner.finished:
                continue
            on_policy = require_kind(
                learner.algorithm, "on_policy", "a rollout learner needs an on-policy algorithm"
            )
            critic_rows = learner.fill_rollout()
            rollout = learner.rollout
            out = on_policy.update(rollout, batch_size=self.settings.batch_size)
            if learner.critic is not None and len(critic_rows) == rollout.num_steps:
                # The critic follows its learner's nan_policy, which the trainer sets.
                learner.critic.nan_policy = learner.algorithm.nan_policy
                hp = on_policy.config
                out.update(
                    learner.critic.update(
                        torch.stack(critic_rows)[:, None], rollout, hp.gamma, hp.gae_lambda
                    )
                )
            metrics.update({f"{learner.name}/{k}": v for k, v in out.items()})
        return metrics

    # ------------------------------------------------------------- persistence
    def checkpoint_state(self) -> dict[str, Any]:
        """The loop's counters, and under ``run`` the collector's: every learner (its
        algorithm's state, replay buffer and centralized critic), self-play and the
        training returns."""
        return {**self.loop_state(), "run": self.collector.state_dict()}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`checkpoint_state` output; every training copy starts a new episode.

        Raises:
            CheckpointError: the checkpoint holds other groups of agents or algorithms.
        """
        self.algorithm.check_learners(state["run"])
        self.collector.load_state_dict(state["run"])
        self.load_loop_state(state)


def agents_state(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """The agents' part of a multi-agent checkpoint's state, for
    :meth:`~rlfleet.marl.agents.Agents.load_state_dict`: ``best/`` saves the agents under
    ``algorithm``, ``checkpoints/`` under ``run`` with the rest of the collector's state."""
    agents: Mapping[str, Any] = state["run"] if "run" in state else state["algorithm"]
    return agents


__all__ = [
    "DecentralizedTrainer",
    "MultiAgentSettings",
    "RbgameParameters",
    "RewardMetric",
    "agents_state",
    "default_reward_metric",
    "multi_agent_return_reduction",
    "reduced_return_score",
]
