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
    ``reward_metric(returns) -> float`` (default: the mean over episodes of the agents' mean
    return, or ``MultiAgentSettings.return_reduction``). ``compute_score_fn(stats)`` may be
    given instead.
parameter sharing
    Agents given the same algorithm object share it: its observation is the agent's own,
    flattened, followed by a one-hot of the agent's index among the agents sharing it (build
    such agents with :func:`~rlfleet.marl.agents.make_agents`).
centralized critic / self-play
    See :mod:`rlfleet.marl.mappo` and :mod:`rlfleet.marl.selfplay`.

History rows carry the common columns plus ``train/return_mean/<agent>`` and
``test/return_mean/<agent>``, each learner's update metrics as ``<learner>/<metric>``, and in
self-play ``selfplay/elo``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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
from rlfleet.marl.selfplay import SelfPlayConfig
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
from rlfleet.train.threads import DEFAULT_TORCH_THREADS
from rlfleet.types import CollectStats, EvalStats

RewardMetric = Callable[[np.ndarray], float]
"""``reward_metric(rewards[num_episodes, num_agents]) -> float``: a test step's score."""
Reduction = Literal["mean", "sum", "min", "max"] | int


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
    """One flag per agent: false makes it act greedily in training (default:
    ``learning_mask``)."""
    collection_step_num_episodes: PositiveInt = 16
    """Training episodes per collection step (all copies counted)."""
    collection_step_num_env_steps: PositiveInt = 16
    """Agent steps (all copies and agents counted) between off-policy update steps."""
    update_step_num_gradient_steps: PositiveInt = 1
    """Gradient steps per off-policy update step (on-policy: the algorithm's ``num_epochs``)."""
    batch_size: PositiveInt = 64
    """Minibatch size of every learner's update."""
    buffer_size: PositiveInt = 50_000
    """Replay capacity (transitions) of each off-policy learner."""
    return_reduction: Reduction = "mean"
    """How a test step's per-agent returns become its score: their ``mean``, ``sum``,
    ``min`` or ``max`` over agents, or one agent's (its index), averaged over episodes."""
    centralized_critic: bool = False
    """PPO learners use a critic over the env's global state (MAPPO)."""
    central_critic: CentralCriticConfig = field(default_factory=CentralCriticConfig)
    """Hyperparameters of the centralized critic."""
    self_play: SelfPlayConfig | None = None
    """Self-play against past snapshots (a symmetric game with one shared learner)."""
    shared_memory: bool = False
    """Step the env copies in subprocess workers, observations in shared memory (rbgame's
    ``shared_memory``)."""


def default_reward_metric(rewards: np.ndarray) -> float:
    """Mean over episodes of the agents' mean return."""
    return float(rewards.mean()) if rewards.size else float("nan")


def reduced_return_score(reduction: Reduction = "mean") -> ComputeScoreFn:
    """A ``compute_score_fn`` for test returns that are per agent.

    ``stats.returns`` of shape ``[num_episodes, num_agents]`` is reduced over agents
    (``mean``, ``sum``, ``min``, ``max``, or an int: that agent's column), then averaged over
    episodes; 1-D returns (one agent) are simply averaged. (The trainers' Tianshou-style
    ``multi_agent_return_reduction=`` parameter instead takes a function of the returns.)
    """
    if isinstance(reduction, str) and reduction not in ("mean", "sum", "min", "max"):
        raise ConfigError(
            f"return_reduction: expected mean, sum, min, max or an agent index, got {reduction!r}"
        )

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

    Args:
        env: a PettingZoo env (AEC or Parallel) or a callable that builds one.
        agents: :class:`~rlfleet.marl.agents.Agents`, or one algorithm per env agent (in
            ``possible_agents`` order, or a mapping by agent name), with
            ``settings.learning_mask`` and ``settings.exploration_mask``.
        config: the loop's settings (:class:`~rlfleet.train.loop.TrainerConfig`).
        settings: the multi-agent settings (:class:`MultiAgentSettings`).
        num_envs / num_test_envs: copies of the env stepped together for training and tests.
        seed: training copy ``i`` is first reset with ``seed + i``; test steps are seeded from
            ``seed + 10_000``.
        reward_metric: ``reward_metric(rewards[num_episodes, num_agents]) -> float``, the test
            score (give it or ``compute_score_fn``, not both).
        The other arguments and the hooks are :class:`~rlfleet.train.loop.TrainingLoop`'s;
        ``save_best_fn`` receives the :class:`~rlfleet.marl.agents.Agents`.

    Raises:
        ConfigError: a setting is out of range; the agents or masks do not match the env's
            agents.
        EnvSpecError: ``env`` is not a PettingZoo env or a factory of one; an algorithm cannot
            act in its agent's spaces or honour its action masks; a centralized critic on an
            env without ``state()``.
    """

    state_schema = MultiAgentLoopState

    collector: MultiAgentCollector
    evaluator: MultiAgentTestEpisodes

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
        torch_threads: int | None = DEFAULT_TORCH_THREADS,
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
            compute_score_fn=compute_score_fn or self._settings_score(),
            save_best_fn=save_best_fn,
            save_checkpoint_fn=save_checkpoint_fn,
            test_result_fn=test_result_fn,
            resume_from_log=resume_from_log,
            multi_agent_return_reduction=multi_agent_return_reduction,
            logger=logger,
        )

    def _settings_score(self) -> ComputeScoreFn:
        """The default score: ``settings.return_reduction`` of the per-agent test returns."""
        return reduced_return_score(self.settings.return_reduction)

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
        names = agents.names
        if settings.self_play is not None and (
            len(agents.groups) != 1 or not agents.groups[0].learning or len(names) != 2
        ):
            raise ConfigError(
                "self_play: expected a two-player game whose agents all share one learning "
                f"algorithm, got {len(names)} agents and {len(agents.groups)} distinct "
                "algorithm(s)"
            )

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
        returns = np.asarray(stats.returns).reshape(-1, len(self.algorithm.names))
        return {
            f"test/return_mean/{agent}": float(returns[:, i].mean())
            for i, agent in enumerate(self.algorithm.names)
        }

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
            if len(learner.buffer) < max(settings.batch_size, starts, 1):
                continue
            out = sampler.update(
                learner.buffer,
                batch_size=settings.batch_size,
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
    "RewardMetric",
    "agents_state",
    "default_reward_metric",
    "multi_agent_return_reduction",
    "reduced_return_score",
]
