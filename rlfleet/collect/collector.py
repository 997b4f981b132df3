"""The Collector steps a vector env with an algorithm's policy and fills storage.

It works in whole batches: one ``preprocess`` + ``act`` call per vector step for all envs
(through a :class:`~rlfleet.collect.runner.PolicyRunner`, which also carries action masks
and recurrent state), observations moved to tensors once per step, written in place into
preallocated storage: a rollout (on-policy) or a replay buffer (off-policy).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import VectorEnv

from rlfleet.algos.base import Algorithm
from rlfleet.collect.runner import PolicyRunner
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.spaces import describe_space
from rlfleet.envs.state import get_env_state, set_env_state
from rlfleet.envs.stats import EpisodeTracker
from rlfleet.envs.workers import WorkerVectorEnv
from rlfleet.errors import ConfigError, EnvSpecError, NonFiniteError
from rlfleet.nn.masks import MASK_KEY, find_mask, masked_uniform
from rlfleet.types import CollectStats


class TransitionSink(Protocol):
    """Where :meth:`Collector.collect_transitions` writes vector steps: a
    :class:`~rlfleet.data.replay.ReplayBuffer`, or what carries them to one from a collection
    thread (:mod:`rlfleet.train.threaded`)."""

    @property
    def mask_size(self) -> int | None:
        """Entries of the action mask kept per transition (None: none)."""

    def add(
        self,
        obs: np.ndarray | Mapping[str, Any],
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        valid: np.ndarray,
        action_mask: np.ndarray | None = None,
    ) -> None:
        """Write one vector step (see :meth:`rlfleet.data.replay.ReplayBuffer.add`)."""

    def mark_stream_break(self) -> None:
        """The newest row has no next observation (see
        :meth:`rlfleet.data.replay.ReplayBuffer.mark_stream_break`)."""


class Collector:
    """Keeps the vector env's current observations between collection steps.

    Args:
        envs: a next-step-autoreset vector env (see :func:`rlfleet.envs.make_vec_env`).
        algorithm: the policy that acts.
        seed: seed of the first reset (sub-env ``i`` gets ``seed + i``).
    """

    def __init__(
        self, envs: VectorEnv[Any, Any, Any], algorithm: Algorithm[Any], seed: int | None = None
    ) -> None:
        self.envs = envs
        self.algorithm = algorithm
        self.num_envs = envs.num_envs
        self.obs, self.infos = envs.reset(seed=seed)
        self.prev_done = np.zeros(self.num_envs, dtype=bool)
        self.runner = PolicyRunner(algorithm, self.num_envs)
        self.tracker = EpisodeTracker(self.num_envs)
        self.env_steps = 0
        self._replay: TransitionSink | None = None
        self._stream_restored = False
        """A resume restored the envs where the replay stream left off (no break to mark)."""

    @property
    def env_restarts(self) -> int:
        """Env worker restarts so far (see :class:`~rlfleet.envs.workers.WorkerVectorEnv`).

        A restarted env's episode arrives as truncated, followed by a reset step, so the
        collection loop needs nothing special for it.
        """
        envs = self.envs.unwrapped
        return sum(envs.restarts) if isinstance(envs, WorkerVectorEnv) else 0

    def collect_rollout(
        self, storage: RolloutStorage, num_episodes: int | None = None
    ) -> CollectStats:
        """Fill ``storage`` with vector steps of the exploring policy.

        By default exactly ``storage.capacity`` steps; with ``num_episodes``, as many steps
        as it takes for that many episodes to end (the storage grows if needed).
        """
        stats = CollectStats()
        algo = self.algorithm
        t = 0
        while t < storage.capacity if num_episodes is None else stats.episodes < num_episodes:
            acted = self.runner.act(self.obs, self.infos, self.prev_done, update_stats=True)
            next_obs, rewards, terminated, truncated, self.infos = self.envs.step(
                algo.env_actions(acted.step.actions)
            )
            env_step = self.env_steps + (t + 1) * self.num_envs
            check_finite(rewards, "reward", env_step)
            if isinstance(next_obs, np.ndarray):
                check_finite(next_obs, "observation", env_step)
            valid = ~self.prev_done
            storage.insert(
                t,
                acted.obs,
                acted.step,
                rewards,
                terminated,
                truncated,
                valid,
                mask=acted.mask,
                state=acted.state,
            )
            done = terminated | truncated
            self.tracker.step(rewards, done, valid, stats.episode_returns, stats.episode_lengths)
            self.prev_done = done
            self.obs = next_obs
            t += 1
        storage.set_length(t)
        last = self.runner.act(
            self.obs, self.infos, self.prev_done, deterministic=True, advance=False
        )
        storage.next_obs.copy_(last.obs)
        if last.mask is not None and storage.next_mask is not None:
            storage.next_mask.copy_(last.mask)
        if last.step.values is not None:
            storage.next_value.copy_(last.step.values)
        stats.env_steps = storage.num_steps * self.num_envs
        self.env_steps += stats.env_steps
        return stats

    def collect_transitions(
        self,
        buffer: TransitionSink,
        num_steps: int,
        *,
        random_actions: bool = False,
        num_episodes: int | None = None,
        policy: Algorithm[Any] | None = None,
    ) -> CollectStats:
        """Step all envs ``num_steps`` times with the exploring policy, into ``buffer``; with
        ``num_episodes``, as many times as it takes for that many episodes to end instead.

        ``random_actions`` draws uniformly from the action space instead (the warm-up before
        ``learning_starts``), from the algorithm's generator so that seeds repeat. Every
        vector step is stored, reset steps included (they hold the final observation of the
        episode before), flagged invalid so they are never sampled as transitions.

        When the env masks actions, both the policy and the random warm-up pick legal actions
        only, and each row's mask is stored with it (the buffer needs a matching
        ``mask_size``, see :meth:`mask_size`).

        ``policy`` acts instead of the collector's algorithm (a threaded trainer's acting copy,
        see :mod:`rlfleet.train.threaded`); its observation statistics and generator are the
        ones used and updated.

        Raises:
            ConfigError: the buffer keeps action masks and the env gives none, or the reverse.
        """
        if buffer is not self._replay:
            # The envs were reset when this collector started: whatever the buffer held last
            # did not lead to the observation we write next — unless a resume restored the
            # envs exactly where the buffer's stream left off.
            if not self._stream_restored:
                buffer.mark_stream_break()
            self._replay = buffer
            self._stream_restored = False
        masked = self.check_buffer_masks(buffer)
        stats = CollectStats()
        algo = self.algorithm if policy is None else policy
        mask = legal = None
        vector_steps = 0
        while vector_steps < num_steps if num_episodes is None else stats.episodes < num_episodes:
            vector_steps += 1
            obs = np.asarray(self.obs)
            if masked:
                mask, legal = self._step_masks(stats.env_steps)
            if random_actions:
                if algo.obs_normalizer is not None:
                    # The warm-up's observations fill the buffer too: the statistics the
                    # update normalises them with include them.
                    algo.preprocess(torch.from_numpy(obs), update_stats=True)
                actions = random_env_actions(
                    self.envs.single_action_space, self.num_envs, algo.generator, legal
                )
            else:
                tensor = algo.preprocess(torch.from_numpy(obs), update_stats=True)
                step = algo.act(tensor) if legal is None else algo.act(tensor, action_mask=legal)
                actions = algo.env_actions(step.actions)
            next_obs, rewards, terminated, truncated, self.infos = self.envs.step(actions)
            env_step = self.env_steps + stats.env_steps + self.num_envs
            check_finite(rewards, "reward", env_step)
            if isinstance(next_obs, np.ndarray):
                check_finite(next_obs, "observation", env_step)
            valid = ~self.prev_done
            buffer.add(obs, actions, rewards, terminated, truncated, valid, mask)
            done = terminated | truncated
            self.tracker.step(rewards, done, valid, stats.episode_returns, stats.episode_lengths)
            self.prev_done = done
            self.obs = next_obs
            stats.env_steps += self.num_envs
        self.env_steps += stats.env_steps
        return stats

    def mask_size(self) -> int | None:
        """Entries of the action mask the envs give with their current observations (None:
        they give no mask): the ``mask_size`` of a replay buffer this collector fills."""
        found = find_mask(
            self.obs if self.runner.mask_in_obs else None,
            self.infos,
            self.env_steps // self.num_envs,
        )
        return None if found is None else int(found.shape[-1])

    def check_buffer_masks(self, buffer: TransitionSink) -> bool:
        """Whether transitions collected into ``buffer`` now carry masks.

        Raises:
            ConfigError: the buffer's ``mask_size`` is not :meth:`mask_size`.
        """
        size = self.mask_size()
        if size != buffer.mask_size:
            gives = f"an action mask of {size} entries" if size is not None else "no action mask"
            keeps = (
                f"a mask of {buffer.mask_size} entries per transition"
                if buffer.mask_size is not None
                else "no masks"
            )
            fix = "without mask_size" if size is None else f"with mask_size={size}"
            raise ConfigError(
                f"the env gives {gives}, but the replay buffer keeps {keeps}; build the buffer "
                f"{fix} (see Collector.mask_size)"
            )
        return size is not None

    def _step_masks(self, env_steps: int) -> tuple[np.ndarray, torch.Tensor]:
        """The current step's mask as the env gave it (stored) and as the policy may act."""
        step = (self.env_steps + env_steps) // self.num_envs
        found = self.runner.masks(self.obs, self.infos, self.prev_done, step)
        if found is None:
            raise EnvSpecError(
                f"the envs gave no {MASK_KEY!r} at step {step} after giving one before; an env "
                "that masks actions must give a mask every step, reset included"
            )
        return found

    def reset_envs(self) -> None:
        """Start a new episode in every env now; episodes in progress end uncounted.

        A recurrent policy's state starts afresh, and the replay buffer being filled, if any,
        is told that its newest row has no next observation (the reset took none)."""
        self.obs, self.infos = self.envs.reset()
        self.prev_done[:] = False
        self.tracker.returns[:] = 0.0
        self.tracker.lengths[:] = 0
        self.runner.reset()
        if self._replay is not None:
            self._replay.mark_stream_break()

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue collecting exactly where this one stopped.

        ``env`` is None for envs whose state cannot be saved (see :mod:`rlfleet.envs.state`).
        """
        env_state = get_env_state(self.envs)
        mask = self.infos.get(MASK_KEY) if env_state is not None and self.infos else None
        return {
            "env_steps": self.env_steps,
            "env": env_state,
            "obs": np.asarray(self.obs).copy() if env_state is not None else None,
            # The mask of those observations, from the infos of the step that returned them.
            "action_mask": None if mask is None else np.asarray(mask).copy(),
            "prev_done": self.prev_done.copy(),
            "episode_returns": self.tracker.returns.copy(),
            "episode_lengths": self.tracker.lengths.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`; envs that cannot be restored start new episodes."""
        self.env_steps = int(state["env_steps"])
        if state["env"] is None:
            return
        set_env_state(self.envs, state["env"])
        self._stream_restored = True
        self.obs = state["obs"]
        mask = state.get("action_mask")
        self.infos = {} if mask is None else {MASK_KEY: mask}
        self.prev_done = np.asarray(state["prev_done"], dtype=bool)
        self.tracker.returns[:] = state["episode_returns"]
        self.tracker.lengths[:] = state["episode_lengths"]


def check_finite(values: np.ndarray, field: str, env_step: int) -> None:
    """Raise NonFiniteError naming the env index if a float batch holds NaN or inf.

    ``values`` is ``[num_envs, ...]`` as returned by one vector step. Integer arrays (images,
    discrete observations) cannot hold NaN and pass for free.
    """
    if values.dtype.kind != "f" or np.isfinite(values).all():
        return
    bad = ~np.isfinite(values.reshape(values.shape[0], -1)).all(axis=1)
    env = int(np.flatnonzero(bad)[0])
    raise NonFiniteError(
        f"non-finite {field} from env index {env} at env step {env_step}: "
        f"{values[env].tolist() if values[env].size <= 8 else 'NaN/inf among its values'}"
        " (run `rlfleet check-env` on the env to find where it comes from)"
    )


def random_env_actions(
    space: spaces.Space[Any],
    num_envs: int,
    generator: torch.Generator,
    mask: torch.Tensor | None = None,
) -> np.ndarray:
    """``num_envs`` uniform actions, ready for ``env.step`` (Discrete and bounded Box);
    with a bool ``[num_envs, n]`` ``mask``, uniform over each env's legal actions."""
    if isinstance(space, spaces.Discrete):
        if mask is not None:
            return (masked_uniform(mask, generator) + int(space.start)).numpy()
        draws = torch.randint(int(space.n), (num_envs,), generator=generator) + int(space.start)
        return draws.numpy()
    if isinstance(space, spaces.Box):
        low = torch.as_tensor(space.low, dtype=torch.float64)
        high = torch.as_tensor(space.high, dtype=torch.float64)
        unit = torch.rand((num_envs, *space.shape), generator=generator, dtype=torch.float64)
        return (low + unit * (high - low)).numpy().astype(space.dtype)
    raise EnvSpecError(
        f"random warm-up actions: unsupported action space {describe_space(space)} "
        "(expected Discrete or Box)"
    )
