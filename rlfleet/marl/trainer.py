"""The DecentralizedTrainer: several agents in one PettingZoo game, each with its own learner.

After rbgame's ``DecentralizedTrainer``, in rlfleet's trainer vocabulary (see
:mod:`rlfleet.train.trainer`):

training block
    One ``train_fn`` call, then ``episodes_per_train`` episodes on the ``num_train_envs``
    training copies with each agent exploring or greedy (``exploration_mask``). Off-policy
    learners update every ``update_freq`` agent steps; on-policy learners update at the end of
    the block on every trajectory completed since their last update.
agent step
    One action of one agent in one env copy; ``env_step`` in the history counts these.
trajectory
    What one agent saw and did between joining an episode and leaving it. A transition
    reaches its agent's storage when the trajectory ends (the agent terminated, was truncated,
    or its episode ended), so storage always holds whole, correctly ordered trajectories:
    a :class:`~rlfleet.data.rollout.RolloutStorage` (on-policy) or a
    :class:`~rlfleet.data.replay.ReplayBuffer` (off-policy) per learner, with each trajectory
    followed by an invalid row holding its final observation, as next-step autoreset does.
test step
    Every ``test_freq`` training episodes: ``test_fn``, then ``episodes_per_test`` episodes
    on the ``num_test_envs`` test copies with every agent greedy, scored by
    ``reward_metric``; ``save_best_fn`` on a new best score, then ``stop_fn``.
learning_mask / exploration_mask
    One flag per agent. A frozen agent (learning false) stores nothing and is never updated,
    so its weights stay bitwise identical; a greedy agent (exploration false) acts
    deterministically.
parameter sharing
    Agents given the same algorithm object share it: its observation is the agent's own,
    flattened, followed by a one-hot of the agent's index among the agents sharing it
    (build such agents with :func:`make_agents`).

Hooks, each optional:

``train_fn(episode: int, env_step: int) -> None``
    Before every training block.
``test_fn(episode: int, env_step: int) -> None``
    Before every test step.
``stop_fn(score: float) -> bool``
    After every test step: true stops training.
``save_best_fn(agents: list[Algorithm]) -> None``
    When a test score is a new best; default: each distinct agent's weights to
    ``run_dir/best/<agent>``.
``save_last_fn(agents: list[Algorithm]) -> None``
    When training ends; default: to ``run_dir/last/<agent>``.
``reward_metric(rewards: ndarray[num_episodes, num_agents]) -> float``
    Turns test returns (columns in ``possible_agents`` order) into the score; default: the
    mean over episodes of the agents' mean return.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import is_off_policy, is_offline, require_kind
from rlfleet.checkpoint import CheckpointManager
from rlfleet.config.fields import PositiveInt
from rlfleet.config.loader import validate
from rlfleet.data.replay import ReplayBuffer
from rlfleet.data.rollout import RolloutStorage
from rlfleet.errors import CheckpointError, ConfigError, EnvSpecError
from rlfleet.logging.history import History
from rlfleet.logging.progress import ProgressReporter
from rlfleet.marl.envs import (
    AgentReport,
    EnvFactory,
    EpisodeEnd,
    MultiAgentVecEnv,
    agent_names,
    check_agent_spaces,
    is_pettingzoo_env,
)
from rlfleet.marl.mappo import CentralCritic, CentralCriticConfig
from rlfleet.marl.masks import check_mask, check_mask_support, masked_act
from rlfleet.marl.selfplay import SelfPlay, SelfPlayConfig
from rlfleet.nn.mlp import flat_size
from rlfleet.train.threads import DEFAULT_TORCH_THREADS, torch_threads
from rlfleet.types import EvalStats, PolicyStep

RewardMetric = Callable[[np.ndarray], float]
AgentsFn = Callable[[list[Algorithm[Any]]], None]
EpisodeFn = Callable[[int, int], None]
StopFn = Callable[[float], bool]


@dataclass
class DecentralizedTrainerConfig:
    """Budget and schedule of decentralized multi-agent training (rbgame's names)."""

    max_episodes: PositiveInt = 1_000
    """Training episodes (all training copies counted) before training stops."""
    num_train_envs: PositiveInt = 4
    """Copies of the env stepped together for training."""
    num_test_envs: PositiveInt = 4
    """Copies of the env stepped together for tests."""
    batch_size: PositiveInt = 64
    """Minibatch size of every update (on- and off-policy)."""
    update_freq: PositiveInt = 16
    """Agent steps (all copies and agents counted) between off-policy updates."""
    num_gradient_steps: PositiveInt = 1
    """Gradient steps per off-policy update (on-policy: the algorithm's ``num_epochs``)."""
    test_freq: PositiveInt = 100
    """Training episodes between test steps."""
    episodes_per_train: PositiveInt = 16
    """Episodes per training block."""
    episodes_per_test: PositiveInt = 50
    """Episodes per test step."""
    buffer_size: PositiveInt = 50_000
    """Replay capacity (transitions) of each off-policy learner."""
    centralized_critic: bool = False
    """PPO learners use a critic over the env's global state (MAPPO)."""
    central_critic: CentralCriticConfig = field(default_factory=CentralCriticConfig)
    """Hyperparameters of the centralized critic."""
    self_play: SelfPlayConfig | None = None
    """Self-play against past snapshots (a symmetric game with one shared learner)."""
    seed: int = 0
    """Seed of the env copies (train copy ``i``: ``seed + i``; test copies after them)."""
    run_dir: Path | None = None
    """Where history, plot and weights go (a ``str`` is taken as a path); None writes
    nothing."""
    keep_checkpoints: PositiveInt = 2
    """Checkpoints kept in ``run_dir/checkpoints`` (one is written after every test step)."""
    show_progress: bool = True
    """Draw a live progress bar of training episodes (on a terminal)."""
    verbose: bool = True
    """Print a summary line after every test step; false prints nothing."""


@dataclass
class MultiAgentTrainResult:
    """What :meth:`DecentralizedTrainer.train` did."""

    agents: list[str]
    """Agent names, the column order of every per-agent array."""
    episodes: int
    """Training episodes played."""
    env_steps: int
    """Agent steps taken in training."""
    train_returns: np.ndarray
    """``[episodes, num_agents]`` return of each training episode."""
    test_episodes: list[int]
    """Training episodes completed at each test step."""
    test_scores: list[float]
    """``reward_metric`` score of each test step."""
    best_score: float
    """Highest test score (NaN if no test ran)."""
    elo: list[float]
    """Learner's Elo after each training block (empty without self-play)."""
    stop_reason: str
    """``max_episodes`` or ``stop_fn``."""
    duration_s: float
    """Wall-clock seconds."""
    run_dir: Path | None
    """Where the history, plot and weights were written (None: nowhere)."""


def default_reward_metric(rewards: np.ndarray) -> float:
    """Mean over episodes of the agents' mean return."""
    return float(rewards.mean()) if rewards.size else float("nan")


def multi_agent_return_reduction(
    reduction: Literal["mean", "sum", "min", "max"] | int = "mean",
) -> Callable[[EvalStats], float]:
    """A ``compute_score_fn`` for the generic Trainer when test returns are per agent.

    ``stats.returns`` of shape ``[num_episodes, num_agents]`` is reduced over agents
    (``mean``, ``sum``, ``min``, ``max``, or an int: that agent's column), then averaged over
    episodes; 1-D returns (one agent) are simply averaged. As Tianshou's
    ``multi_agent_return_reduction``, this lets one score rank multi-agent checkpoints.
    """
    if isinstance(reduction, str) and reduction not in ("mean", "sum", "min", "max"):
        raise ConfigError(
            f"multi_agent_return_reduction: expected mean, sum, min, max or an agent index, "
            f"got {reduction!r}"
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
                    f"multi_agent_return_reduction: agent index {reduction} out of range for "
                    f"{returns.shape[1]} agents"
                )
            per_episode = returns[:, reduction]
        else:
            per_episode = getattr(np, reduction)(returns, axis=1)
        return float(per_episode.mean())

    return score


def shared_observation_space(space: spaces.Space[Any], group_size: int) -> spaces.Box:
    """The observation space of an algorithm shared by ``group_size`` agents: the agent's
    flattened observation followed by a one-hot agent id."""
    size = flat_size(tuple(space.shape or ()))
    return spaces.Box(-np.inf, np.inf, (size + group_size,), np.float32)


def make_agents(
    env: EnvFactory | Any,
    build: Callable[[spaces.Space[Any], spaces.Space[Any], int], Algorithm[Any]],
    *,
    share_parameters: bool = False,
    seed: int = 0,
) -> list[Algorithm[Any]]:
    """One algorithm per agent, or one shared by all (with the agent-id feature).

    ``build(observation_space, action_space, seed)`` constructs an algorithm; ``env`` is a
    PettingZoo env or a factory of one. Shared parameters need every agent to have the same
    observation and action spaces.
    """
    vec = MultiAgentVecEnv(_as_factory(env), 1)
    agents = vec.possible_agents
    if not share_parameters:
        return [
            build(vec.observation_spaces[a], vec.action_spaces[a], seed + i)
            for i, a in enumerate(agents)
        ]
    first = agents[0]
    for agent in agents[1:]:
        for label, table in (
            ("observation", vec.observation_spaces),
            ("action", vec.action_spaces),
        ):
            if table[agent] != table[first]:
                raise EnvSpecError(
                    f"share_parameters: expected every agent to have {first!r}'s {label} space "
                    f"{table[first]}, got {table[agent]} for {agent!r}"
                )
    shared = build(
        shared_observation_space(vec.observation_spaces[first], len(agents)),
        vec.action_spaces[first],
        seed,
    )
    vec.close()
    return [shared] * len(agents)


def _as_factory(env: EnvFactory | Any) -> EnvFactory:
    if is_pettingzoo_env(env):
        # One object cannot be stepped as several copies: clone it per copy.
        return lambda: copy.deepcopy(env)
    if callable(env):
        return env  # type: ignore[no-any-return]
    raise EnvSpecError(
        "expected a PettingZoo env (Parallel or AEC) or a callable that builds one, got "
        f"{type(env).__name__}"
    )


@dataclass
class _Trajectory:
    """One agent's steps in one episode of one copy, until it leaves."""

    obs: list[Any] = field(default_factory=list)
    steps: list[PolicyStep] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    critic_inputs: list[torch.Tensor] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    """The action mask of each step, for a learner whose replay buffer keeps masks."""


class _Record(NamedTuple):
    """What one agent step adds to its trajectory."""

    obs: Any
    step: PolicyStep
    critic_input: torch.Tensor | None
    mask: np.ndarray | None


@dataclass
class _Finished:
    trajectory: _Trajectory
    final_obs: Any
    final_critic_input: torch.Tensor | None
    terminated: bool
    truncated: bool
    final_mask: np.ndarray | None = None
    """The action mask of ``final_obs``, for a learner whose replay buffer keeps masks."""


class _Learner:
    """One distinct algorithm in the game: the agents it plays for and its storage."""

    def __init__(
        self,
        algorithm: Algorithm[Any],
        agents: list[str],
        learning: bool,
        exploring: bool,
        config: DecentralizedTrainerConfig,
        critic_input_size: int | None,
        mask_size: int | None = None,
    ) -> None:
        self.algorithm = algorithm
        self.agents = agents
        self.index = {agent: i for i, agent in enumerate(agents)}
        self.shared = len(agents) > 1
        self.learning = learning
        self.exploring = exploring
        self.on_policy = algorithm.kind == "on_policy"
        self.name = agents[0] if not self.shared else "+".join(agents)
        self.finished: list[_Finished] = []
        self.critic: CentralCritic | None = None
        if critic_input_size is not None:
            self.critic = CentralCritic(
                critic_input_size,
                config.central_critic,
                seed=algorithm.seed,
                nan_policy=algorithm.nan_policy,
            )
        self.buffer: ReplayBuffer | None = None
        self.rollout: RolloutStorage | None = None
        if learning and self.on_policy:
            self.rollout = RolloutStorage.for_spaces(
                256, 1, algorithm.observation_space, algorithm.action_space
            )
        elif learning:
            # Off-policy targets bootstrap over the legal actions of the next state only.
            self.buffer = ReplayBuffer(
                config.buffer_size,
                algorithm.observation_space,
                algorithm.action_space,
                1,
                mask_size=mask_size,
            )

    def features(self, agent: str, obs: np.ndarray) -> np.ndarray:
        """The observations the algorithm sees: with the agent-id one-hot when shared."""
        if not self.shared:
            return obs
        flat = obs.reshape(obs.shape[0], -1).astype(np.float32)
        one_hot = np.zeros((obs.shape[0], len(self.agents)), np.float32)
        one_hot[:, self.index[agent]] = 1.0
        return np.concatenate([flat, one_hot], axis=1)


class DecentralizedTrainer:
    """Trains several rlfleet algorithms that play one PettingZoo game together.

    Args:
        env: a PettingZoo env (AEC or Parallel) or a callable that builds one.
        config: budget, schedule and options.
        train_fn, test_fn, stop_fn, save_best_fn, save_last_fn, reward_metric: see the module
            docstring.
        torch_threads: CPU threads torch uses while :meth:`train` trains (None: the caller's
            setting); the caller's count is restored when it returns.

    Raises:
        ConfigError: a setting of ``config`` is out of range.
        EnvSpecError: ``env`` is not a PettingZoo env or a factory of one.
    """

    def __init__(
        self,
        env: EnvFactory | Any,
        config: DecentralizedTrainerConfig | None = None,
        *,
        train_fn: EpisodeFn | None = None,
        test_fn: EpisodeFn | None = None,
        stop_fn: StopFn | None = None,
        save_best_fn: AgentsFn | None = None,
        save_last_fn: AgentsFn | None = None,
        reward_metric: RewardMetric | None = None,
        torch_threads: int | None = DEFAULT_TORCH_THREADS,
    ) -> None:
        self.config = validate(
            DecentralizedTrainerConfig, config or DecentralizedTrainerConfig(), "config"
        )
        self.torch_threads = torch_threads
        factory = _as_factory(env)
        cfg = self.config
        self.train_envs = MultiAgentVecEnv(factory, cfg.num_train_envs, seed=cfg.seed)
        self.test_envs = MultiAgentVecEnv(
            factory, cfg.num_test_envs, seed=cfg.seed + cfg.num_train_envs
        )
        self.agents = self.train_envs.possible_agents
        self.train_fn = train_fn
        self.test_fn = test_fn
        self.stop_fn = stop_fn
        self.save_best_fn = save_best_fn
        self.save_last_fn = save_last_fn
        self.reward_metric = reward_metric or default_reward_metric
        if cfg.centralized_critic:
            self.train_envs.state_size()

    # ---------------------------------------------------------------- checks
    def _build_learners(
        self,
        agents: Sequence[Algorithm[Any]] | Mapping[str, Algorithm[Any]],
        learning_mask: Sequence[bool],
        exploration_mask: Sequence[bool] | None,
    ) -> tuple[list[Algorithm[Any]], dict[str, _Learner]]:
        names = self.agents
        if isinstance(agents, Mapping):
            if set(agents) != set(names):
                raise ConfigError(
                    f"agents: expected one algorithm for each of the env's agents "
                    f"[{agent_names(names)}], got [{agent_names(list(agents))}]"
                )
            ordered = [agents[a] for a in names]
        else:
            ordered = list(agents)
        if len(ordered) != len(names) or not all(isinstance(a, Algorithm) for a in ordered):
            raise ConfigError(
                f"agents: expected {len(names)} rlfleet algorithms, one per env agent "
                f"[{agent_names(names)}] in that order, got {len(ordered)} object(s): "
                f"{[type(a).__name__ for a in ordered]}"
            )
        learning = _flags(learning_mask, names, "learning_mask")
        exploring = (
            learning
            if exploration_mask is None
            else _flags(exploration_mask, names, "exploration_mask")
        )
        groups: dict[int, list[str]] = {}
        for agent, algorithm in zip(names, ordered, strict=True):
            groups.setdefault(id(algorithm), []).append(agent)
        learners: dict[str, _Learner] = {}
        state_size = self.train_envs.state_size() if self.config.centralized_critic else None
        for members in groups.values():
            algorithm = ordered[names.index(members[0])]
            flags = {(learning[names.index(a)], exploring[names.index(a)]) for a in members}
            if len(flags) > 1:
                raise ConfigError(
                    f"agents {agent_names(members)} share one algorithm, so expected equal "
                    f"learning_mask and exploration_mask entries for them, got {sorted(flags)}"
                )
            ((is_learning, is_exploring),) = flags
            critic_size = None
            if state_size is not None and is_learning and algorithm.kind == "on_policy":
                critic_size = state_size + (len(members) if len(members) > 1 else 0)
            action_space = self.train_envs.action_spaces[members[0]]
            masked = any(self.train_envs.has_masks(a) for a in members)
            mask_size = int(action_space.n) if masked else None  # type: ignore[attr-defined]
            learner = _Learner(
                algorithm, members, is_learning, is_exploring, self.config, critic_size, mask_size
            )
            for agent in members:
                space = self.train_envs.observation_spaces[agent]
                if learner.shared:
                    space = shared_observation_space(space, len(members))
                check_agent_spaces(self.train_envs, agent, algorithm, space)
                if self.train_envs.has_masks(agent):
                    check_mask_support(algorithm, agent)
                    mask_space = self.train_envs.raw_observation_spaces[agent]["action_mask"]  # type: ignore[index]
                    check_mask(
                        np.zeros(mask_space.shape, bool),
                        int(self.train_envs.action_spaces[agent].n),  # type: ignore[attr-defined]
                        f"agent {agent!r}",
                    )
                learners[agent] = learner
        if self.config.self_play is not None and (
            len(groups) != 1 or not learners[names[0]].learning or len(names) != 2
        ):
            raise ConfigError(
                "self_play: expected a two-player game whose agents all share one learning "
                f"algorithm, got {len(names)} agents and {len(groups)} distinct algorithm(s)"
            )
        return ordered, learners

    # ---------------------------------------------------------------- training
    def train(
        self,
        agents: Sequence[Algorithm[Any]] | Mapping[str, Algorithm[Any]],
        learning_mask: Sequence[bool],
        exploration_mask: Sequence[bool] | None = None,
        plot: bool = True,
        *,
        resume: bool = False,
    ) -> MultiAgentTrainResult:
        """Train the learning agents; returns statistics and, with a ``run_dir``, writes the
        history, the metric plot (``plot``), the weights and a checkpoint after every test
        step.

        ``resume`` continues the run in ``run_dir`` from its latest checkpoint: the agents'
        weights, optimisers and RNGs, replay buffers, the centralized critics, self-play's
        pool and ratings, the counters and the test scores; history rows after the
        checkpoint are dropped. The episodes that were running when it was written are not
        saved: every env copy starts a new one, seeded from the seed and the episode count.

        Raises:
            ConfigError: agents or masks do not match the env's agents; ``resume`` without a
                ``run_dir``.
            EnvSpecError: an algorithm cannot act in its agent's spaces or honour its masks.
            CheckpointError: ``resume`` finds no checkpoint, or one of other agents.
        """
        with torch_threads(self.torch_threads):
            return self._train(agents, learning_mask, exploration_mask, plot, resume)

    def _train(
        self,
        agents: Sequence[Algorithm[Any]] | Mapping[str, Algorithm[Any]],
        learning_mask: Sequence[bool],
        exploration_mask: Sequence[bool] | None,
        plot: bool,
        resume: bool,
    ) -> MultiAgentTrainResult:
        ordered, learners = self._build_learners(agents, learning_mask, exploration_mask)
        cfg = self.config
        run = _Run(self, learners, cfg)
        history = History(cfg.run_dir / "history.parquet") if cfg.run_dir is not None else None
        checkpoints = (
            CheckpointManager(cfg.run_dir / "checkpoints", keep=cfg.keep_checkpoints)
            if cfg.run_dir is not None
            else None
        )
        start = time.perf_counter()
        loop = _LoopState(next_test=cfg.test_freq)
        stop_reason = "max_episodes"
        if resume:
            if checkpoints is None or history is None:
                raise ConfigError("resume: expected a run_dir to continue, got run_dir=None")
            state, _ = checkpoints.load_latest()
            _check_learners(state, run)
            run.load_state_dict(state["run"])
            loop = _LoopState(**state["loop"])
            history.truncate_after(run.env_steps)
            seed = np.random.SeedSequence([cfg.seed, run.episodes]).generate_state(1)[0]
            self.train_envs.reset(seed=int(seed))
        else:
            self.train_envs.reset()
        progress = ProgressReporter(
            cfg.max_episodes, show_progress=cfg.show_progress, verbose=cfg.verbose, unit="episodes"
        )
        progress.start(initial_steps=run.episodes)
        with progress:  # closes the bar on any exit
            while run.episodes < cfg.max_episodes:
                if self.train_fn is not None:
                    self.train_fn(run.episodes, run.env_steps)
                block = min(cfg.episodes_per_train, cfg.max_episodes - run.episodes)
                row = run.collect(block)
                if run.self_play is not None:
                    loop.elo.append(run.self_play.elo)
                progress.update(
                    run.episodes,
                    mean_return=_as_float(row.get("train/return_mean")),
                    best_return=loop.best if loop.test_scores else None,
                    extra="" if run.self_play is None else f"elo {run.self_play.elo:,.0f}",
                )
                if run.episodes >= loop.next_test or run.episodes >= cfg.max_episodes:
                    loop.next_test = run.episodes + cfg.test_freq
                    if self.test_fn is not None:
                        self.test_fn(run.episodes, run.env_steps)
                    returns = run.test()
                    score = float(self.reward_metric(returns))
                    loop.test_episodes.append(run.episodes)
                    loop.test_scores.append(score)
                    row["test/score"] = score
                    for i, agent in enumerate(self.agents):
                        row[f"test/return_mean/{agent}"] = float(returns[:, i].mean())
                    if score > loop.best:
                        loop.best = score
                        self._save(ordered, learners, "best", self.save_best_fn)
                    progress.message(_summary(row, loop.best))
                    if history is not None:
                        history.append(row)
                        history.flush()
                    if checkpoints is not None:
                        # After the history flush: a resumed run keeps every row up to here.
                        checkpoints.save(
                            {"run": run.state_dict(), "loop": asdict(loop)},
                            {"agents": list(self.agents), "learners": _learner_names(run)},
                            step=run.env_steps,
                        )
                    if self.stop_fn is not None and self.stop_fn(score):
                        stop_reason = "stop_fn"
                        break
                elif history is not None:
                    history.append(row)
        self._save(ordered, learners, "last", self.save_last_fn)
        if history is not None and cfg.run_dir is not None:
            history.flush()
            if plot and loop.test_scores:
                metric_png = cfg.run_dir / "plots" / "metric.png"
                plot_metric(loop.test_episodes, loop.test_scores, metric_png)
        return MultiAgentTrainResult(
            agents=list(self.agents),
            episodes=run.episodes,
            env_steps=run.env_steps,
            train_returns=np.asarray(run.train_returns, dtype=np.float64).reshape(
                -1, len(self.agents)
            ),
            test_episodes=loop.test_episodes,
            test_scores=loop.test_scores,
            best_score=loop.best if loop.test_scores else float("nan"),
            elo=loop.elo,
            stop_reason=stop_reason,
            duration_s=time.perf_counter() - start,
            run_dir=cfg.run_dir,
        )

    def _save(
        self,
        ordered: list[Algorithm[Any]],
        learners: dict[str, _Learner],
        which: str,
        hook: AgentsFn | None,
    ) -> None:
        if hook is not None:
            hook(ordered)
            return
        if self.config.run_dir is None:
            return
        saved: set[int] = set()
        for agent, learner in learners.items():
            if id(learner) in saved:
                continue
            saved.add(id(learner))
            metadata = {
                "algorithm": learner.algorithm.name,
                "agents": learner.agents,
                "observation_space": _space_json(learner.algorithm.observation_space),
                "action_space": _space_json(learner.algorithm.action_space),
            }
            CheckpointManager(self.config.run_dir / which / agent, keep=1).save(
                {"algorithm": learner.algorithm.state_dict()}, metadata, step=0
            )

    def close(self) -> None:
        """Close every env copy."""
        self.train_envs.close()
        self.test_envs.close()


@dataclass
class _LoopState:
    """The training loop's own counters, saved in checkpoints."""

    next_test: int
    best: float = -math.inf
    test_episodes: list[int] = field(default_factory=list)
    test_scores: list[float] = field(default_factory=list)
    elo: list[float] = field(default_factory=list)


def _learner_names(run: _Run) -> dict[str, str]:
    """Each distinct learner's name (its agents) -> its algorithm's name."""
    return {learner.name: learner.algorithm.name for learner in run.distinct()}


def _check_learners(state: Mapping[str, Any], run: _Run) -> None:
    saved = {name: learner["algorithm_name"] for name, learner in state["run"]["learners"].items()}
    if saved != _learner_names(run):
        raise CheckpointError(
            f"resume: the checkpoint holds learners {saved} (agents -> algorithm), this run "
            f"has {_learner_names(run)}; resume with the same agents and parameter sharing"
        )


def _as_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _summary(row: Mapping[str, Any], best: float) -> str:
    """One line after a test step, e.g. ``episode 400 | agent steps 3,612 | train/return_mean
    0.2 | test/score 0.85 | best 0.85 | selfplay/elo 1,262``."""
    parts = [f"episode {int(row['episode']):,}", f"agent steps {int(row['env_step']):,}"]
    for key in ("train/return_mean", "test/score"):
        if row.get(key) is not None:
            parts.append(f"{key} {float(row[key]):.3g}")
    parts.append(f"best {best:.3g}")
    if row.get("selfplay/elo") is not None:
        parts.append(f"selfplay/elo {float(row['selfplay/elo']):,.0f}")
    return " | ".join(parts)


def _space_json(space: spaces.Space[Any]) -> Any:
    from rlfleet.envs.spaces import space_to_json

    return space_to_json(space)


def _flags(mask: Sequence[bool], names: list[str], what: str) -> list[bool]:
    values = list(mask)
    if len(values) != len(names):
        raise ConfigError(
            f"{what}: expected {len(names)} flags, one per agent [{agent_names(names)}], "
            f"got {len(values)}"
        )
    return [bool(v) for v in values]


class _Run:
    """The state of one :meth:`DecentralizedTrainer.train` call: trajectories, counters."""

    def __init__(
        self,
        trainer: DecentralizedTrainer,
        learners: dict[str, _Learner],
        config: DecentralizedTrainerConfig,
    ) -> None:
        self.trainer = trainer
        self.learners = learners
        self.config = config
        self.episodes = 0
        self.env_steps = 0
        self.train_returns: list[list[float]] = []
        self.pending: dict[tuple[int, str], _Trajectory] = {}
        self._since_update = 0
        self.self_play: SelfPlay | None = None
        self.seats: list[dict[str, _Learner]] = []
        self.opponent: _Learner | None = None
        if config.self_play is not None:
            learner = learners[trainer.agents[0]]
            self.self_play = SelfPlay(learner.algorithm, config.self_play, seed=config.seed)
            # Opponents sample from their policy, as in ML-Agents: a greedy opponent would
            # make every game against one snapshot the same game.
            self.opponent = _Learner(
                self.self_play.opponent, learner.agents, False, True, config, None
            )
        self.seats = [self._seating(e) for e in range(trainer.train_envs.num_envs)]
        self._games = np.zeros(trainer.train_envs.num_envs, dtype=np.int64)

    def _seating(self, env_id: int, game: int = 0) -> dict[str, _Learner]:
        """Who plays each seat in a copy; in self-play the learner changes seat every game."""
        if self.opponent is None:
            return self.learners
        agents = self.trainer.agents
        learner_seat = agents[(env_id + game) % 2]
        return {a: self.learners[a] if a == learner_seat else self.opponent for a in agents}

    # ------------------------------------------------------------- acting
    def _act(
        self,
        envs: MultiAgentVecEnv,
        seats: list[dict[str, _Learner]] | None,
        training: bool,
    ) -> tuple[dict[tuple[int, str], Any], dict[tuple[int, str], _Record]]:
        """One batched ``act`` per (learner, agent) for every acting report."""
        groups: dict[tuple[int, str], list[AgentReport]] = {}
        owners: dict[tuple[int, str], _Learner] = {}
        for report in envs.acting:
            learner = (seats[report.env_id] if seats else self.learners)[report.agent]
            key = (id(learner), report.agent)
            groups.setdefault(key, []).append(report)
            owners[key] = learner
        actions: dict[tuple[int, str], Any] = {}
        records: dict[tuple[int, str], _Record] = {}
        for key, reports in groups.items():
            learner = owners[key]
            agent = key[1]
            algo = learner.algorithm
            store = training and learner.learning
            features = learner.features(agent, np.stack([r.obs for r in reports]))
            obs = algo.preprocess(torch.from_numpy(features), update_stats=store)
            mask = masks = None
            if reports[0].mask is not None:
                masks = np.stack([r.mask for r in reports])  # type: ignore[misc]
                check_mask(
                    masks,
                    int(envs.action_spaces[agent].n),  # type: ignore[attr-defined]
                    f"agent {agent!r}",
                )
                mask = torch.from_numpy(masks)
            step = masked_act(algo, obs, mask, deterministic=not (training and learner.exploring))
            critic_inputs = None
            if store and learner.critic is not None:
                critic_inputs = self._critic_inputs(envs, learner, agent, reports)
                step = PolicyStep(
                    step.actions, step.log_probs, learner.critic.values(critic_inputs)
                )
            env_actions = algo.env_actions(step.actions)
            for i, report in enumerate(reports):
                action = env_actions[i]
                actions[(report.env_id, agent)] = action.item() if action.ndim == 0 else action
                if store:
                    stored = obs[i] if learner.on_policy else features[i]
                    records[(report.env_id, agent)] = _Record(
                        stored,
                        PolicyStep(
                            step.actions[i],
                            None if step.log_probs is None else step.log_probs[i],
                            None if step.values is None else step.values[i],
                        ),
                        None if critic_inputs is None else critic_inputs[i],
                        None if masks is None else masks[i],
                    )
        return actions, records

    def _critic_inputs(
        self, envs: MultiAgentVecEnv, learner: _Learner, agent: str, reports: list[AgentReport]
    ) -> torch.Tensor:
        states = np.stack([envs.state(r.env_id) for r in reports])
        return torch.from_numpy(learner.features(agent, states) if learner.shared else states)

    # ------------------------------------------------------------- collecting
    def collect(self, num_episodes: int) -> dict[str, float | int | None]:
        """Play ``num_episodes`` training episodes, updating learners on schedule."""
        envs = self.trainer.train_envs
        agents = self.trainer.agents
        start_episodes = self.episodes
        block_returns: list[list[float]] = []
        metrics: dict[str, float | int | None] = {}
        for learner in self.distinct():
            if learner.learning:
                learner.algorithm.set_progress(self.episodes / self.config.max_episodes)
        while self.episodes - start_episodes < num_episodes:
            self._close_steps(envs)
            actions, records = self._act(envs, self.seats, training=True)
            for key, record in records.items():
                trajectory = self.pending.setdefault(key, _Trajectory())
                trajectory.obs.append(record.obs)
                trajectory.steps.append(record.step)
                if record.critic_input is not None:
                    trajectory.critic_inputs.append(record.critic_input)
                if record.mask is not None:
                    trajectory.masks.append(record.mask)
            steps = len(actions)
            exits, ended = envs.step(actions)
            self.env_steps += steps
            self._since_update += steps
            if self.self_play is not None:
                learner_steps = sum(1 for key in actions if key in records)
                self.self_play.on_learner_steps(learner_steps)
            for report in exits:
                self._finish(envs, report.env_id, report.agent, report)
            for end in ended:
                self._end_episode(envs, end, block_returns)
            if self._since_update >= self.config.update_freq:
                self._since_update = 0
                metrics.update(self._update(off_policy=True))
        metrics.update(self._update(off_policy=False))
        returns = np.asarray(block_returns).reshape(-1, len(agents))
        metrics.update(
            {
                "env_step": self.env_steps,
                "episode": self.episodes,
                "train/return_mean": float(returns.mean()),
                **{
                    f"train/return_mean/{a}": float(returns[:, i].mean())
                    for i, a in enumerate(agents)
                },
            }
        )
        if self.self_play is not None:
            metrics["selfplay/elo"] = self.self_play.elo
        return metrics

    def _close_steps(self, envs: MultiAgentVecEnv) -> None:
        """Give each pending trajectory the reward its acting report brings."""
        for report in envs.acting:
            trajectory = self.pending.get((report.env_id, report.agent))
            if trajectory is not None and len(trajectory.rewards) < len(trajectory.steps):
                trajectory.rewards.append(report.reward)

    def _finish(
        self,
        envs: MultiAgentVecEnv,
        env_id: int,
        agent: str,
        report: AgentReport | None,
    ) -> None:
        """Close an agent's trajectory and hand it to its learner's storage."""
        trajectory = self.pending.pop((env_id, agent), None)
        if trajectory is None or not trajectory.steps:
            return
        learner = self.seats[env_id][agent]
        if report is None:
            # The agent vanished without a final report: cut it as truncated, bootstrapping
            # from the last observation it acted on.
            trajectory.rewards.append(0.0)
            final_features = trajectory.obs[-1]
            final_mask = trajectory.masks[-1] if trajectory.masks else None
            terminated, truncated = False, True
            final_critic = trajectory.critic_inputs[-1] if trajectory.critic_inputs else None
        else:
            trajectory.rewards.append(report.reward)
            raw = learner.features(agent, report.obs[None])
            final_features = (
                learner.algorithm.preprocess(torch.from_numpy(raw))[0]
                if learner.on_policy
                else raw[0]
            )
            final_mask = report.mask
            terminated, truncated = report.terminated, report.truncated
            final_critic = (
                self._critic_inputs(envs, learner, agent, [report])[0]
                if learner.critic is not None
                else None
            )
        finished = _Finished(
            trajectory, final_features, final_critic, terminated, truncated, final_mask
        )
        if learner.on_policy:
            learner.finished.append(finished)
        else:
            _write_replay(learner, finished)

    def _end_episode(
        self, envs: MultiAgentVecEnv, end: EpisodeEnd, block_returns: list[list[float]]
    ) -> None:
        for agent in self.trainer.agents:
            if (end.env_id, agent) in self.pending:
                self._finish(envs, end.env_id, agent, None)
        seats = self.seats[end.env_id]
        row = [end.returns.get(a, 0.0) for a in self.trainer.agents]
        if self.self_play is not None and self.opponent is not None:
            learner_seat = next(a for a, s in seats.items() if s is not self.opponent)
            opponent_seat = next(a for a, s in seats.items() if s is self.opponent)
            self.self_play.record_game(
                end.returns.get(learner_seat, 0.0), end.returns.get(opponent_seat, 0.0)
            )
            self._games[end.env_id] += 1
            self.seats[end.env_id] = self._seating(end.env_id, int(self._games[end.env_id]))
        block_returns.append(row)
        self.train_returns.append(row)
        self.episodes += 1

    # ------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Counters, every distinct learner (weights, optimiser, RNG, storage) and
        self-play; the episodes in progress are left out."""
        learners: dict[str, Any] = {}
        for learner in self.distinct():
            entry: dict[str, Any] = {
                "algorithm_name": learner.algorithm.name,
                "algorithm": learner.algorithm.state_dict(),
            }
            if learner.buffer is not None:
                entry["buffer"] = learner.buffer.state_dict()
            if learner.critic is not None:
                entry["critic"] = learner.critic.state_dict()
            learners[learner.name] = entry
        return {
            "episodes": self.episodes,
            "env_steps": self.env_steps,
            "train_returns": np.asarray(self.train_returns, np.float64),
            "since_update": self._since_update,
            "games": self._games,
            "learners": learners,
            "self_play": None if self.self_play is None else self.self_play.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        for learner in self.distinct():
            entry = state["learners"][learner.name]
            learner.algorithm.load_state_dict(entry["algorithm"])
            if learner.buffer is not None:
                learner.buffer.load_state_dict(entry["buffer"])
            if learner.critic is not None:
                learner.critic.load_state_dict(entry["critic"])
        self.episodes = int(state["episodes"])
        self.env_steps = int(state["env_steps"])
        self.train_returns = np.asarray(state["train_returns"]).tolist()
        self._since_update = int(state["since_update"])
        self._games = np.asarray(state["games"], np.int64).copy()
        if self.self_play is not None:
            self.self_play.load_state_dict(state["self_play"])
        self.seats = [self._seating(e, int(self._games[e])) for e in range(len(self.seats))]

    # ------------------------------------------------------------- updating
    def distinct(self) -> list[_Learner]:
        seen: dict[int, _Learner] = {}
        for learner in self.learners.values():
            seen.setdefault(id(learner), learner)
        return list(seen.values())

    def _update(self, *, off_policy: bool) -> dict[str, float]:
        metrics: dict[str, float] = {}
        cfg = self.config
        for learner in self.distinct():
            if not learner.learning:
                continue
            algo = learner.algorithm
            out: dict[str, float] = {}
            # What samples the buffer: an off-policy or offline contract (the random agent
            # declares none: it has nothing to learn); only off-policy ones warm up first.
            sampler = algo if is_off_policy(algo) or is_offline(algo) else None
            if off_policy and learner.buffer is not None and sampler is not None:
                starts = algo.config.learning_starts if is_off_policy(algo) else 0
                if len(learner.buffer) >= max(cfg.batch_size, starts, 1):
                    out = sampler.update(
                        learner.buffer,
                        batch_size=cfg.batch_size,
                        num_gradient_steps=cfg.num_gradient_steps,
                    )
            elif not off_policy and learner.rollout is not None and learner.finished:
                out = self._update_on_policy(learner)
            metrics.update({f"{learner.name}/{k}": v for k, v in out.items()})
        return metrics

    def _update_on_policy(self, learner: _Learner) -> dict[str, float]:
        rollout = learner.rollout
        assert rollout is not None
        algo = learner.algorithm
        no_values = PolicyStep(actions=torch.zeros(()))
        critic_rows: list[torch.Tensor] = []
        t = 0
        one = np.ones(1, np.float32)
        zero = np.zeros(1, np.float32)
        # Actions sampled under a mask have masked log-probabilities: the loss must see the
        # same masks. An agent without masks (sharing a learner with one that has them) may
        # take any action.
        mask_size = next(
            (len(i.trajectory.masks[0]) for i in learner.finished if i.trajectory.masks), None
        )
        legal = None if mask_size is None else torch.ones(1, mask_size, dtype=torch.bool)
        for item in learner.finished:
            trajectory = item.trajectory
            last = len(trajectory.steps) - 1
            for i, (obs, step) in enumerate(zip(trajectory.obs, trajectory.steps, strict=True)):
                rollout.insert(
                    t,
                    obs[None],
                    PolicyStep(
                        step.actions[None],
                        None if step.log_probs is None else step.log_probs[None],
                        None if step.values is None else step.values[None],
                    ),
                    np.array([trajectory.rewards[i]], np.float32),
                    one * (i == last and item.terminated),
                    one * (i == last and item.truncated),
                    one,
                    mask=(
                        torch.from_numpy(trajectory.masks[i])[None] if trajectory.masks else legal
                    ),
                )
                t += 1
            critic_rows.extend(trajectory.critic_inputs)
            if learner.critic is not None and item.final_critic_input is not None:
                final_value = learner.critic.values(item.final_critic_input[None])
                critic_rows.append(item.final_critic_input)
            elif hasattr(algo, "value"):
                final_value = algo.value(item.final_obs[None])
            else:
                final_value = torch.zeros(1)
            rollout.insert(
                t,
                item.final_obs[None],
                PolicyStep(no_values.actions, None, final_value),
                zero,
                zero,
                zero,
                zero,
                mask=legal,  # a row with no action (valid 0)
            )
            t += 1
        rollout.set_length(t)
        rollout.next_value.zero_()
        learner.finished = []
        on_policy = require_kind(
            algo, "on_policy", "a rollout learner needs an on-policy algorithm"
        )
        metrics = on_policy.update(rollout, batch_size=self.config.batch_size)
        if learner.critic is not None and len(critic_rows) == t:
            hp = on_policy.config
            metrics.update(
                learner.critic.update(
                    torch.stack(critic_rows)[:, None], rollout, hp.gamma, hp.gae_lambda
                )
            )
        return metrics

    # ------------------------------------------------------------- testing
    def test(self) -> np.ndarray:
        """``[episodes_per_test, num_agents]`` returns of greedy test episodes."""
        envs = self.trainer.test_envs
        agents = self.trainer.agents
        envs.reset()
        seats = [self._seating(e) for e in range(envs.num_envs)]
        games = np.zeros(envs.num_envs, dtype=np.int64)
        rows: list[list[float]] = []
        while len(rows) < self.config.episodes_per_test:
            actions, _ = self._act(envs, seats, training=False)
            _, ended = envs.step(actions)
            for end in ended:
                rows.append([end.returns.get(a, 0.0) for a in agents])
                games[end.env_id] += 1
                seats[end.env_id] = self._seating(end.env_id, int(games[end.env_id]))
        return np.asarray(rows[: self.config.episodes_per_test], dtype=np.float64)


def _write_replay(learner: _Learner, item: _Finished) -> None:
    """A trajectory into the learner's replay buffer, then its final observation as an
    invalid row: the next observation of the trajectory's last transition."""
    buffer = learner.buffer
    assert buffer is not None
    trajectory = item.trajectory
    last = len(trajectory.steps) - 1
    masks: list[np.ndarray | None] = [None] * (last + 2)
    if buffer.mask_size is not None:
        # An agent without masks (sharing a learner with one that has them) may take any action.
        legal = np.ones(buffer.mask_size, bool)
        masks = [m[None] for m in trajectory.masks or [legal] * (last + 1)]
        masks.append((legal if item.final_mask is None else item.final_mask)[None])
    for i, (obs, step) in enumerate(zip(trajectory.obs, trajectory.steps, strict=True)):
        buffer.add(
            obs[None],
            step.actions.numpy().reshape(1, *buffer.actions.shape[2:]),
            np.array([trajectory.rewards[i]], np.float32),
            np.array([i == last and item.terminated]),
            np.array([i == last and item.truncated]),
            np.ones(1, bool),
            masks[i],
        )
    buffer.add(
        np.asarray(item.final_obs)[None],
        np.zeros((1, *buffer.actions.shape[2:]), buffer.actions.dtype),
        np.zeros(1, np.float32),
        np.zeros(1, bool),
        np.zeros(1, bool),
        np.zeros(1, bool),
        masks[-1],
    )


def plot_metric(episodes: Sequence[int], scores: Sequence[float], out: str | Path) -> Path:
    """PNG of the test score (``reward_metric``) against training episodes."""
    from matplotlib.figure import Figure

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ax.plot(list(episodes), list(scores), marker="o")
    ax.set_xlabel("training episodes")
    ax.set_ylabel("reward metric")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    return out
