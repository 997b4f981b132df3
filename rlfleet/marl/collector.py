"""Collecting in a multi-agent game: the collection step and the test episodes of
:class:`rlfleet.marl.trainer.DecentralizedTrainer`.

:class:`MultiAgentCollector` steps the training copies of a PettingZoo game
(:class:`~rlfleet.marl.envs.MultiAgentVecEnv`) with every agent's algorithm, one batched
``act`` per (algorithm, agent) and step, and routes what each agent saw and did to the storage
of its learner (:class:`Learner`: one per distinct algorithm):

trajectory
    What one agent saw and did between joining an episode and leaving it. A transition
    reaches its learner's storage when the trajectory ends (the agent terminated, was
    truncated, or its episode ended), so storage always holds whole, correctly ordered
    trajectories: a :class:`~rlfleet.data.rollout.RolloutStorage` (on-policy) or a
    :class:`~rlfleet.data.replay.ReplayBuffer` (off-policy), with each trajectory followed by
    an invalid row holding its final observation, as next-step autoreset does.
agent step
    One action of one agent in one env copy; the loop's step counter counts these.

:class:`MultiAgentTestEpisodes` plays greedy test episodes on the test copies and returns
their per-agent returns (``EvalStats.returns`` of shape ``[episodes, agents]``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from rlfleet.algos.base import Algorithm
from rlfleet.data.replay import ReplayBuffer
from rlfleet.data.rollout import RolloutStorage
from rlfleet.errors import CheckpointError
from rlfleet.marl.agents import AgentGroup, Agents
from rlfleet.marl.envs import AgentReport, EpisodeEnd, MultiAgentVecEnv
from rlfleet.marl.mappo import CentralCritic, CentralCriticConfig
from rlfleet.marl.masks import check_mask, masked_act
from rlfleet.marl.selfplay import SelfPlay, SelfPlayOption, SelfPlayTeams, self_play_groups
from rlfleet.types import CollectStats, EvalStats, PolicyStep

OffPolicyUpdate = Callable[[], dict[str, float]]
"""The off-policy update step the collector calls every ``collection_step_num_env_steps``
agent steps (see :meth:`MultiAgentCollector.collect`)."""


@dataclass
class _Trajectory:
    """One agent's steps in one episode of one copy, until it leaves."""

    obs: list[Any] = field(default_factory=list)
    steps: list[PolicyStep] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    critic_inputs: list[torch.Tensor] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    """The action mask of each step, for a learner whose storage keeps masks."""


class _Record(NamedTuple):
    """What one agent step adds to its trajectory."""

    obs: Any
    step: PolicyStep
    critic_input: torch.Tensor | None
    mask: np.ndarray | None


@dataclass
class Finished:
    """A trajectory that ended, with what follows its last step."""

    trajectory: _Trajectory
    final_obs: Any
    final_critic_input: torch.Tensor | None
    terminated: bool
    truncated: bool
    final_mask: np.ndarray | None = None
    """The action mask of ``final_obs``, for a learner whose replay buffer keeps masks."""


class Learner:
    """One distinct algorithm of the game: the agents it plays for and its storage.

    Args:
        group: the algorithm, its agents and its learning and exploration flags.
        buffer_size: replay capacity of an off-policy learner.
        critic_input_size: size of the centralized critic's input (None: no critic).
        central_critic: the critic's hyperparameters.
        mask_size: actions of the agents' action masks (None: no masks).
    """

    def __init__(
        self,
        group: AgentGroup,
        buffer_size: int,
        critic_input_size: int | None = None,
        central_critic: CentralCriticConfig | None = None,
        mask_size: int | None = None,
    ) -> None:
        algorithm = group.algorithm
        self.algorithm = algorithm
        self.agents = group.agents
        self.name = group.name
        self.index = {agent: i for i, agent in enumerate(group.agents)}
        self.shared = len(group.agents) > 1
        self.learning = group.learning
        self.exploring = group.exploring
        self.on_policy = algorithm.kind == "on_policy"
        self.finished: list[Finished] = []
        """Ended trajectories of an on-policy learner, until its next update step."""
        self.critic: CentralCritic | None = None
        if critic_input_size is not None:
            self.critic = CentralCritic(
                critic_input_size,
                central_critic or CentralCriticConfig(),
                seed=algorithm.seed,
                nan_policy=algorithm.nan_policy,
            )
        self.buffer: ReplayBuffer | None = None
        self.rollout: RolloutStorage | None = None
        if group.learning and self.on_policy:
            self.rollout = RolloutStorage.for_spaces(
                256, 1, algorithm.observation_space, algorithm.action_space
            )
        elif group.learning:
            # Off-policy targets bootstrap over the legal actions of the next state only.
            self.buffer = ReplayBuffer(
                buffer_size,
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

    def fill_rollout(self) -> list[torch.Tensor]:
        """Write the finished trajectories into the rollout (each followed by a row of its
        final observation and bootstrap value) and forget them; returns the centralized
        critic's input of every row (empty without a critic)."""
        rollout = self.rollout
        assert rollout is not None
        algo = self.algorithm
        no_values = PolicyStep(actions=torch.zeros(()))
        critic_rows: list[torch.Tensor] = []
        t = 0
        one = np.ones(1, np.float32)
        zero = np.zeros(1, np.float32)
        # Actions sampled under a mask have masked log-probabilities: the loss must see the
        # same masks. An agent without masks (sharing a learner with one that has them) may
        # take any action.
        mask_size = next(
            (len(i.trajectory.masks[0]) for i in self.finished if i.trajectory.masks), None
        )
        legal = None if mask_size is None else torch.ones(1, mask_size, dtype=torch.bool)
        for item in self.finished:
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
            if self.critic is not None and item.final_critic_input is not None:
                final_value = self.critic.values(item.final_critic_input[None])
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
        self.finished = []
        return critic_rows

    def write_replay(self, item: Finished) -> None:
        """A trajectory into the replay buffer, then its final observation as an invalid
        row: the next observation of the trajectory's last transition."""
        buffer = self.buffer
        assert buffer is not None
        trajectory = item.trajectory
        last = len(trajectory.steps) - 1
        masks: list[np.ndarray | None] = [None] * (last + 2)
        if buffer.mask_size is not None:
            # An agent without masks (sharing a learner with one that has them) may take any
            # action.
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


Seats = dict[str, Learner]
"""Which learner plays each agent in one env copy."""


class MultiAgentCollector:
    """Steps the training copies with every agent's policy and fills its learner's storage.

    Args:
        envs: the training copies.
        learners: each agent's learner (agents sharing an algorithm share one).
        collection_step_num_env_steps: agent steps (all copies and agents counted) between
            the off-policy learners' update steps.
        self_play: self-play settings (see :mod:`rlfleet.marl.selfplay`): one config for a
            two-player game whose agents share one learner, or a config per learner name.
        seed: seed of the first reset (copy ``i``: ``seed + i``), of self-play's opponent
            choices, and, with the episode count, of the reset after a resume.
    """

    env_restarts = 0
    """PettingZoo copies run in this process: no worker is ever restarted."""

    def __init__(
        self,
        envs: MultiAgentVecEnv,
        learners: dict[str, Learner],
        *,
        collection_step_num_env_steps: int,
        self_play: SelfPlayOption | None = None,
        seed: int = 0,
    ) -> None:
        self.envs = envs
        self.agents = envs.possible_agents
        self.learners = learners
        self.collection_step_num_env_steps = collection_step_num_env_steps
        self.seed = seed
        self.episodes = 0
        self.env_steps = 0
        self.train_returns: list[list[float]] = []
        """``[episodes, agents]``: every training episode's return of each agent."""
        learning = [i for i, a in enumerate(self.agents) if learners[a].learning]
        self.learning_columns = learning or list(range(len(self.agents)))
        """The agents (columns of :attr:`train_returns`) whose mean is an episode's return:
        the learning ones, or all when none learns (in a zero-sum game the mean of all is 0)."""
        self.pending: dict[tuple[int, str], _Trajectory] = {}
        self.before_step: Callable[[int, int], None] | None = None
        """Called as ``before_step(episodes, env_steps)`` (the counts so far) before every
        training step of the env copies (rbgame's ``train_fn``); None: nothing."""
        self.since_update = 0
        """Agent steps since the off-policy learners' last update step."""
        self.teams: SelfPlayTeams | None = None
        """Self-play's teams, learning team and learners (None without self-play)."""
        self.self_play_learners: dict[str, SelfPlay] = {}
        """Each self-play learner's pool and ratings, by learner name."""
        self.ghosts: dict[str, Learner] = {}
        """What plays a self-play learner's agents when their team is not learning."""
        if self_play is not None:
            distinct = self.distinct()
            configs, teams = self_play_groups(
                self.agents, [(g.name, g.agents, g.learning) for g in distinct], self_play
            )
            for i, learner in enumerate(distinct):
                play = SelfPlay(learner.algorithm, configs[learner.name], seed=seed + i)
                self.self_play_learners[learner.name] = play
                # Ghosts sample from their policy, as in ML-Agents: a greedy opponent would
                # make every game against one snapshot the same game.
                self.ghosts[learner.name] = Learner(
                    AgentGroup(learner.name, learner.agents, play.opponent, False, True), 1
                )
            owners = [self.self_play_learners[learners[team[0]].name] for team in teams]
            self.teams = SelfPlayTeams(teams, owners)
        self.seats = [self.seating(e) for e in range(envs.num_envs)]
        self._games = np.zeros(envs.num_envs, dtype=np.int64)
        envs.reset()

    def distinct(self) -> list[Learner]:
        """Each learner once, in order of its first agent."""
        return list({id(learner): learner for learner in self.learners.values()}.values())

    @property
    def self_play(self) -> SelfPlay | None:
        """The first self-play learner's pool and ratings (None without self-play)."""
        return next(iter(self.self_play_learners.values()), None)

    def seating(self, env_id: int = 0, game: int = 0) -> Seats:
        """Who plays each seat of copy ``env_id`` in its game number ``game``: in
        self-play the learning team's learners and the other teams' ghosts (a copy takes a new
        seating when its episode ends)."""
        teams = self.teams
        if teams is None:
            return self.learners
        return {
            a: self.learners[a] if teams.learning(a) else self.ghosts[self.learners[a].name]
            for a in self.agents
        }

    # ------------------------------------------------------------- acting
    def act(
        self, envs: MultiAgentVecEnv, seats: list[Seats], *, training: bool
    ) -> tuple[dict[tuple[int, str], Any], dict[tuple[int, str], _Record]]:
        """One batched ``act`` per (learner, agent) for every acting report; in training,
        the records of the steps learning agents store."""
        groups: dict[tuple[int, str], list[AgentReport]] = {}
        owners: dict[tuple[int, str], Learner] = {}
        for report in envs.acting:
            learner = seats[report.env_id][report.agent]
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
                mask = torch.from_numpy(masks).to(algo.device)
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
        self, envs: MultiAgentVecEnv, learner: Learner, agent: str, reports: list[AgentReport]
    ) -> torch.Tensor:
        states = np.stack([envs.state(r.env_id) for r in reports])
        return torch.from_numpy(learner.features(agent, states) if learner.shared else states)

    # ------------------------------------------------------------- collecting
    def collect(
        self, num_episodes: int, update_off_policy: OffPolicyUpdate
    ) -> tuple[CollectStats, dict[str, float]]:
        """One collection step: play ``num_episodes`` training episodes (all copies
        counted; copies that finish together may add one or two more), calling
        ``update_off_policy`` every ``collection_step_num_env_steps`` agent steps.

        Returns the episodes' statistics (each episode's return: the mean of its learning
        agents', see :attr:`learning_columns`),
        with per-agent mean returns (``train/return_mean/<agent>``) and the update metrics
        among the metrics.
        """
        envs = self.envs
        start_episodes = self.episodes
        start_steps = self.env_steps
        block: list[list[float]] = []
        lengths: list[int] = []
        metrics: dict[str, float] = {}
        while self.episodes - start_episodes < num_episodes:
            if self.before_step is not None:
                self.before_step(self.episodes, self.env_steps)
            self._close_steps()
            actions, records = self.act(envs, self.seats, training=True)
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
            if self.teams is not None:
                self._count_self_play_steps(actions)
            for report in exits:
                self._finish(report.env_id, report.agent, report)
            for end in ended:
                block.append(self._end_episode(end))
                lengths.append(end.length)
            self.since_update += steps
            if self.since_update >= self.collection_step_num_env_steps:
                # The count starts again from zero: a step past the interval is not carried.
                self.since_update = 0
                metrics.update(update_off_policy())
        returns = np.asarray(block).reshape(-1, len(self.agents))
        metrics.update(
            {
                f"train/return_mean/{a}": float(returns[:, i].mean())
                for i, a in enumerate(self.agents)
            }
        )
        if self.teams is not None:
            plays = self.self_play_learners
            for name, play in plays.items():
                metrics["selfplay/elo" if len(plays) == 1 else f"selfplay/elo/{name}"] = play.elo
            metrics["selfplay/learning_team"] = float(self.teams.learning_team)
        stats = CollectStats(
            env_steps=self.env_steps - start_steps,
            episode_returns=[float(r) for r in returns[:, self.learning_columns].mean(axis=1)],
            episode_lengths=lengths,
        )
        return stats, metrics

    def _count_self_play_steps(self, actions: Mapping[tuple[int, str], Any]) -> None:
        """Each self-play learner's learner and ghost steps in one env step (see
        :meth:`SelfPlayTeams.on_steps`)."""
        teams = self.teams
        assert teams is not None
        learner_steps: dict[int, int] = {}
        ghost_steps: dict[int, int] = {}
        for env_id, agent in actions:
            counts = learner_steps if self.seats[env_id][agent].learning else ghost_steps
            key = id(teams.owner(agent))
            counts[key] = counts.get(key, 0) + 1
        teams.on_steps(learner_steps, ghost_steps)

    def _close_steps(self) -> None:
        """Give each pending trajectory the reward its acting report brings."""
        for report in self.envs.acting:
            trajectory = self.pending.get((report.env_id, report.agent))
            if trajectory is not None and len(trajectory.rewards) < len(trajectory.steps):
                trajectory.rewards.append(report.reward)

    def _finish(self, env_id: int, agent: str, report: AgentReport | None) -> None:
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
                self._critic_inputs(self.envs, learner, agent, [report])[0]
                if learner.critic is not None
                else None
            )
            if self.teams is not None and learner.learning and (terminated or truncated):
                # ML-Agents rates a learning agent's finished trajectory by its last reward.
                self.teams.record_result(report.reward, self.teams.team_of[agent])
        finished = Finished(
            trajectory, final_features, final_critic, terminated, truncated, final_mask
        )
        if learner.on_policy:
            learner.finished.append(finished)
        else:
            learner.write_replay(finished)

    def _end_episode(self, end: EpisodeEnd) -> list[float]:
        for agent in self.agents:
            if (end.env_id, agent) in self.pending:
                self._finish(end.env_id, agent, None)
        row = [end.returns.get(a, 0.0) for a in self.agents]
        if self.teams is not None:
            self._games[end.env_id] += 1
            self.seats[end.env_id] = self.seating(end.env_id, int(self._games[end.env_id]))
        self.train_returns.append(row)
        self.episodes += 1
        return row

    def reset_envs(self) -> None:
        """Start a new episode in every copy, seeded from the seed and the episode count;
        trajectories in progress are dropped."""
        self.pending = {}
        for learner in self.distinct():
            learner.finished = []
        seed = np.random.SeedSequence([self.seed, self.episodes]).generate_state(1)[0]
        self.envs.reset(seed=int(seed))

    # ------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Counters, every learner (its algorithm's state, replay buffer and centralized
        critic), self-play and the seats; the episodes in progress are left out."""
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
            "since_update": self.since_update,
            "games": self._games,
            "learners": learners,
            "self_play": (
                None
                if self.teams is None
                else {
                    "teams": self.teams.state_dict(),
                    "learners": {n: p.state_dict() for n, p in self.self_play_learners.items()},
                }
            ),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output; every copy then starts a new episode (see
        :meth:`reset_envs`)."""
        for learner in self.distinct():
            entry = state["learners"][learner.name]
            learner.algorithm.load_state_dict(entry["algorithm"])
            if learner.buffer is not None:
                learner.buffer.load_state_dict(entry["buffer"])
            if learner.critic is not None:
                learner.critic.load_state_dict(entry["critic"])
        self.episodes = int(state["episodes"])
        self.env_steps = int(state["env_steps"])
        self.since_update = int(state["since_update"])
        self.train_returns = (
            np.asarray(state["train_returns"]).reshape(-1, len(self.agents)).tolist()
        )
        self._games = np.asarray(state["games"], np.int64).copy()
        if self.teams is not None:
            saved = state.get("self_play")
            if not isinstance(saved, Mapping) or "teams" not in saved:
                raise CheckpointError(
                    "self_play: expected the checkpoint to hold self-play's teams, pools and "
                    "ratings, got none (a run without self-play, or one saved before teams "
                    "and team_change existed); start a new run"
                )
            self.teams.load_state_dict(saved["teams"])
            for name, play in self.self_play_learners.items():
                play.load_state_dict(saved["learners"][name])
        self.seats = [self.seating(e, int(self._games[e])) for e in range(len(self.seats))]
        self.reset_envs()


class MultiAgentTestEpisodes:
    """Greedy test episodes on the test copies, every agent played by its learner (in
    self-play, the learning team's learners against the other teams' current snapshots).

    Args:
        envs: the test copies.
        collector: the training collector, whose learners and seating the tests use.
        seed: seed of the first test step; each test step resets the copies with a fresh
            one (``seed`` + test episodes run so far), so test episodes differ across test
            steps but are repeatable.
    """

    def __init__(
        self, envs: MultiAgentVecEnv, collector: MultiAgentCollector, seed: int | None
    ) -> None:
        self.envs = envs
        self.collector = collector
        self.seed = seed
        self._episodes_run = 0

    def state_dict(self) -> dict[str, Any]:
        return {"episodes_run": self._episodes_run}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._episodes_run = int(state["episodes_run"])

    def run(
        self, num_episodes: int, *, on_episode: Callable[[int], object] | None = None
    ) -> EvalStats:
        """``num_episodes`` greedy episodes; ``returns`` is ``[episodes, agents]`` (columns in
        ``possible_agents`` order), ``lengths`` counts agent steps. ``on_episode`` is called
        with the number of episodes ended so far (at most ``num_episodes``) after each step
        that ends one."""
        envs = self.envs
        agents = envs.possible_agents
        envs.reset(seed=None if self.seed is None else self.seed + self._episodes_run)
        self._episodes_run += num_episodes
        seats = [self.collector.seating(e) for e in range(envs.num_envs)]
        games = np.zeros(envs.num_envs, dtype=np.int64)
        rows: list[list[float]] = []
        lengths: list[int] = []
        while len(rows) < num_episodes:
            actions, _ = self.collector.act(envs, seats, training=False)
            _, ended = envs.step(actions)
            for end in ended:
                rows.append([end.returns.get(a, 0.0) for a in agents])
                lengths.append(end.length)
                games[end.env_id] += 1
                seats[end.env_id] = self.collector.seating(end.env_id, int(games[end.env_id]))
            if on_episode is not None and ended:
                on_episode(min(len(rows), num_episodes))
        return EvalStats(
            returns=np.asarray(rows[:num_episodes], dtype=np.float64).reshape(-1, len(agents)),
            lengths=np.asarray(lengths[:num_episodes], dtype=np.int64),
        )


def learner_for(
    group: AgentGroup,
    envs: MultiAgentVecEnv,
    *,
    buffer_size: int,
    critic_state_size: int | None,
    central_critic: CentralCriticConfig,
) -> Learner:
    """The learner of one group of agents: its storage follows the agents' action masks,
    and a learning on-policy group gets a centralized critic when ``critic_state_size`` is
    given (the env's global state size)."""
    algorithm: Algorithm[Any] = group.algorithm
    critic_size = None
    if critic_state_size is not None and group.learning and algorithm.kind == "on_policy":
        critic_size = critic_state_size + (len(group.agents) if len(group.agents) > 1 else 0)
    action_space = envs.action_spaces[group.agents[0]]
    masked = any(envs.has_masks(a) for a in group.agents)
    mask_size = int(action_space.n) if masked else None  # type: ignore[attr-defined]
    return Learner(group, buffer_size, critic_size, central_critic, mask_size)


def learners_of(agents: Agents, envs: MultiAgentVecEnv, **options: Any) -> dict[str, Learner]:
    """Each agent's learner (see :func:`learner_for`; agents of a group share one)."""
    learners: dict[str, Learner] = {}
    for group in agents.groups:
        learner = learner_for(group, envs, **options)
        for agent in group.agents:
            learners[agent] = learner
    return learners
