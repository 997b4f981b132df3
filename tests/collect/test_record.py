"""Recording datasets with a policy: what the policy and the random actions may choose, and
how the episodes the recording's end cuts short are counted."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.algos import PPO, get_algorithm
from rlfleet.algos.registry import algorithms_supporting_masks
from rlfleet.collect.record import record_dataset
from rlfleet.data.dataset import OfflineDataset
from tests.toy_envs import MaskedPick

MASKED_ID = "rlfleet-tests/MaskedPickInfo-v0"


@pytest.mark.parametrize("name", algorithms_supporting_masks())
def test_recorded_actions_are_legal_under_the_env_mask(name: str) -> None:
    """docs/spaces.md: every algorithm that supports masks honours them in ``rlfleet
    collect`` (the policy's actions and the random ones of epsilon)."""
    if MASKED_ID not in gym.registry:
        gym.register(MASKED_ID, entry_point=MaskedPick)
    env = MaskedPick()
    algo = get_algorithm(name)(env.observation_space, env.action_space)
    dataset = record_dataset(algo, MASKED_ID, 600, epsilon=0.5, deterministic=False, seed=3)
    # MaskedPick's observation is the mask of the step: each recorded action must be legal.
    legal = dataset.observations[np.arange(len(dataset)), dataset.actions.astype(int)]
    assert len(dataset) == 600
    assert legal.all(), f"{int((legal == 0).sum())} illegal actions recorded"


def _pendulum_recording(num_steps: int) -> tuple[OfflineDataset, list[int]]:
    """Random play on 4 Pendulum envs (200-step episodes, ended by the env's time limit),
    and the length of each episode the dataset holds."""
    env = gym.make("Pendulum-v1")
    algo = PPO(env.observation_space, env.action_space)
    dataset = record_dataset(algo, "Pendulum-v1", num_steps, epsilon=1.0, num_envs=4, seed=0)
    ends = dataset.episode_ends()
    return dataset, list(np.diff(np.concatenate([[-1], ends])))


def test_episodes_cut_short_by_the_end_of_a_recording_are_counted_apart(
    tmp_path: Path,
) -> None:
    # 1,000 steps on 4 envs: each env plays one whole episode (200 steps) and 50 more.
    dataset, lengths = _pendulum_recording(1000)
    assert sorted(lengths) == [50] * 4 + [200] * 4
    stats = dataset.stats()
    assert (stats.num_episodes, stats.num_cut_episodes) == (4, 4)
    whole = dataset.episode_returns()[np.array(lengths) == 200]
    assert stats.return_mean == pytest.approx(whole.mean())
    assert stats.return_min == pytest.approx(whole.min())
    assert "4 whole episodes and 4 cut short by the start or end of the data" in stats.describe()
    assert "return of the 4 whole mean" in stats.describe()
    # Saved and loaded, the dataset still knows which episodes were cut.
    loaded = OfflineDataset.load(dataset.save(tmp_path / "data"))
    assert loaded.stats() == stats
    assert loaded.metadata()["num_cut_episodes"] == 4


def test_a_recording_with_no_whole_episode_describes_the_cut_ones() -> None:
    dataset, lengths = _pendulum_recording(200)
    assert lengths == [50] * 4
    stats = dataset.stats()
    assert (stats.num_episodes, stats.num_cut_episodes) == (0, 4)
    assert stats.return_mean == pytest.approx(dataset.episode_returns().mean())
    assert "0 whole episodes and 4 cut short" in stats.describe()
    assert "return of the 4 cut short mean" in stats.describe()


def test_a_policy_whose_spaces_no_dataset_holds_is_refused_before_a_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gymnasium import spaces

    import rlfleet.collect.record as record
    from rlfleet.errors import DatasetError

    monkeypatch.setattr(record, "make_vec_env", lambda *a, **k: pytest.fail("envs were built"))
    multi = PPO(spaces.Box(-1, 1, (3,), np.float32), spaces.MultiDiscrete([2, 3]))
    with pytest.raises(DatasetError, match=r"action space MultiDiscrete.*Box or Discrete"):
        record_dataset(multi, "CartPole-v1", 10)


def test_an_env_whose_spaces_differ_from_the_policys_is_refused() -> None:
    from rlfleet.errors import EnvSpecError

    env = gym.make("CartPole-v1")
    algo = PPO(env.observation_space, env.action_space)
    with pytest.raises(EnvSpecError, match=r"Pendulum-v1's observation space .* does not match"):
        record_dataset(algo, "Pendulum-v1", 10)
