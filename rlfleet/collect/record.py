"""Recording an offline dataset from a policy (``rlfleet collect``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlfleet.algos.base import Algorithm
from rlfleet.collect.collector import check_finite, random_env_actions
from rlfleet.collect.runner import PolicyRunner
from rlfleet.data.dataset import COLUMNS, OfflineDataset, check_dataset_spaces
from rlfleet.envs.atari import AtariConfig
from rlfleet.envs.make import make_vec_env
from rlfleet.envs.spaces import space_mismatch
from rlfleet.errors import ConfigError, EnvSpecError
from rlfleet.logging.progress import ProgressReporter


def record_dataset(
    algorithm: Algorithm[Any],
    env_id: str,
    num_steps: int,
    *,
    epsilon: float = 0.0,
    deterministic: bool = True,
    num_envs: int = 4,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
    show_progress: bool = False,
    atari: AtariConfig | None = None,
) -> OfflineDataset:
    """Step ``num_envs`` envs with ``algorithm``'s policy until exactly ``num_steps``
    transitions are recorded.

    Each action is the policy's (greedy with ``deterministic``, else sampled) or, with
    probability ``epsilon``, a uniformly random one; both are legal under the env's action
    mask, and a recurrent policy carries its state through each episode. Reset steps of
    next-step autoreset are not transitions and are skipped. Episodes still running at the
    end are kept, ended as truncated, and their last rows listed in the dataset's
    ``source["cut_episode_ends"]`` (its statistics count them apart). ``source`` is merged
    into the dataset's ``source`` metadata. ``show_progress`` draws a progress bar of
    recorded transitions (on a terminal). ``atari``: the preprocessing of an ALE env (the
    run's, as its test episodes have it: whole games, the game's own rewards).

    Raises:
        ConfigError: ``num_steps`` or ``epsilon`` out of range.
        DatasetError: the policy's spaces are not ones a dataset holds (before any env is
            built).
        EnvSpecError: the env's spaces differ from the policy's.
    """
    if num_steps < 1:
        raise ConfigError(f"record_dataset: num_steps must be >= 1, got {num_steps}")
    if not 0.0 <= epsilon <= 1.0:
        raise ConfigError(f"record_dataset: epsilon must be in [0, 1], got {epsilon}")
    # Before a step is taken: a policy whose spaces no dataset holds records nothing.
    check_dataset_spaces(algorithm.observation_space, algorithm.action_space, "record_dataset")
    envs = make_vec_env(
        env_id, num_envs, seed=seed, mode="sync", env_kwargs=dict(env_kwargs or {}), atari=atari
    )
    mismatch = space_mismatch(
        (algorithm.observation_space, algorithm.action_space),
        (envs.single_observation_space, envs.single_action_space),
    )
    if mismatch is not None:
        envs.close()
        label, trained, found = mismatch
        raise EnvSpecError(
            f"record_dataset: {env_id}'s {label} space {found} does not match the policy's "
            f"{trained}"
        )
    generator = torch.Generator().manual_seed(seed)
    runner = PolicyRunner(algorithm, num_envs)
    streams: list[dict[str, list[Any]]] = [{name: [] for name in COLUMNS} for _ in range(num_envs)]
    progress = ProgressReporter(
        num_steps,
        show_progress=show_progress,
        description="recording",
        unit="transitions",
        returns=False,
    )
    progress.start()
    try:
        obs, infos = envs.reset(seed=seed)
        prev_done = np.zeros(num_envs, dtype=bool)
        recorded = 0
        while recorded < num_steps:
            # The runner carries a recurrent policy's state and honours the env's action masks,
            # as in training and evaluation.
            acted = runner.act(obs, infos, prev_done, deterministic=deterministic)
            policy = algorithm.env_actions(acted.step.actions)
            random = random_env_actions(envs.single_action_space, num_envs, generator, acted.mask)
            explore = (torch.rand(num_envs, generator=generator) < epsilon).numpy()
            actions = np.where(explore.reshape(-1, *[1] * (policy.ndim - 1)), random, policy)
            next_obs, rewards, terminated, truncated, infos = envs.step(actions)
            check_finite(np.asarray(rewards), "reward", recorded)
            # Next-step autoreset: after an episode's end, a step only resets that env.
            for env in np.flatnonzero(~prev_done)[: num_steps - recorded]:
                stream = streams[env]
                stream["observations"].append(obs[env])
                stream["actions"].append(actions[env])
                stream["rewards"].append(rewards[env])
                stream["terminations"].append(terminated[env])
                stream["truncations"].append(truncated[env])
                stream["next_observations"].append(next_obs[env])
                recorded += 1
            prev_done = terminated | truncated
            obs = next_obs
            progress.update(recorded)
    finally:
        progress.close()
        envs.close()
    columns: dict[str, np.ndarray] = {}
    for name in COLUMNS:
        parts = [np.asarray(stream[name]) for stream in streams if stream[name]]
        columns[name] = np.concatenate(parts)
    # Each env's last transition ends its stream: the next env's rows are another episode.
    ends = np.cumsum([len(stream["rewards"]) for stream in streams if stream["rewards"]]) - 1
    cut = ends[~(columns["terminations"][ends] | columns["truncations"][ends])]
    columns["truncations"][ends] |= ~columns["terminations"][ends]
    return OfflineDataset(
        *(columns[name] for name in COLUMNS),
        observation_space=envs.single_observation_space,
        action_space=envs.single_action_space,
        env_id=env_id,
        source={
            "kind": "collect",
            "algorithm": algorithm.name,
            "epsilon": epsilon,
            "deterministic": deterministic,
            "num_envs": num_envs,
            "seed": seed,
            # The episodes the recording's end cut short, by their last row: the dataset's
            # statistics count them apart (OfflineDataset.stats).
            "cut_episode_ends": [int(row) for row in cut],
            **(source or {}),
        },
    )
