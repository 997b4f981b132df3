"""``vector_mode: envpool``: seeding per sub-env, the next-step-autoreset contract the collector
relies on (checked against ``sync`` on CartPole), a PPO run through the CLI, and the errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlfleet.algos import PPO
from rlfleet.cli.main import main
from rlfleet.collect.collector import Collector
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs.envpool import ENVPOOL_IDS, EnvPoolVectorEnv
from rlfleet.envs.make import make_vec_env
from rlfleet.envs.state import get_env_state
from rlfleet.errors import EnvSpecError, EnvWorkerError, MissingDependencyError

# CartPole's reset draws every state variable from U(-0.05, 0.05); an episode ends when the
# cart leaves +-2.4 or the pole passes 12 degrees.
RESET_BOUND = 0.05
X_LIMIT, ANGLE_LIMIT = 2.4, 12 * 2 * np.pi / 360


def _rollout(envs: Any, steps: int, action: int = 0) -> list[np.ndarray]:
    actions = np.full(envs.num_envs, action)
    return [np.asarray(envs.step(actions)[0]).copy() for _ in range(steps)]


def test_it_is_a_gymnasium_vector_env_with_gymnasiums_spaces() -> None:
    for env_id in ENVPOOL_IDS:
        pool = make_vec_env(env_id, 3, seed=0, mode="envpool")
        sync = make_vec_env(env_id, 3, seed=0, mode="sync")
        assert isinstance(pool.unwrapped, EnvPoolVectorEnv)
        assert pool.single_observation_space == sync.single_observation_space, env_id
        assert pool.single_action_space == sync.single_action_space, env_id
        assert pool.observation_space == sync.observation_space, env_id
        assert pool.action_space == sync.action_space, env_id
        pool.close()
        sync.close()


def test_a_seed_repeats_the_episodes_and_seeds_sub_env_i_with_seed_plus_i() -> None:
    first = make_vec_env("CartPole-v1", 3, seed=7, mode="envpool")
    again = make_vec_env("CartPole-v1", 3, seed=7, mode="envpool")
    obs, _ = first.reset(seed=7)
    np.testing.assert_array_equal(obs, again.reset(seed=7)[0])
    for a, b in zip(_rollout(first, 40), _rollout(again, 40), strict=True):
        np.testing.assert_array_equal(a, b)
    # A seeded reset after stepping starts the same episodes again.
    np.testing.assert_array_equal(first.reset(seed=7)[0], obs)
    single = make_vec_env("CartPole-v1", 1, seed=8, mode="envpool")
    np.testing.assert_array_equal(single.reset(seed=8)[0][0], obs[1])
    other = make_vec_env("CartPole-v1", 3, seed=8, mode="envpool")
    assert not np.array_equal(other.reset(seed=8)[0], obs)
    # A list seeds each sub-env as given; EnvPool's seeds are int32, larger ones wrap.
    np.testing.assert_array_equal(first.reset(seed=[9, 8, 7])[0][1], obs[1])
    np.testing.assert_array_equal(first.reset(seed=[9, 2**31 + 8, 7])[0][1], obs[1])
    for envs in (first, again, single, other):
        envs.close()


def test_without_a_seed_each_pool_draws_its_own() -> None:
    one = make_vec_env("CartPole-v1", 2, mode="envpool")
    two = make_vec_env("CartPole-v1", 2, mode="envpool")
    assert not np.array_equal(one.reset()[0], two.reset()[0])
    one.close()
    two.close()


@pytest.mark.parametrize("mode", ["sync", "envpool"])
def test_collection_contract_matches_sync(mode: str) -> None:
    """Both modes flag terminations and truncations apart, return the final observation on
    the step that ends an episode, follow it with an invalid reset step of reward 0, and
    the collector records every episode's return and length."""
    num_envs, num_steps, limit = 4, 96, 20
    envs = make_vec_env(
        "CartPole-v1", num_envs, seed=0, mode=mode, env_kwargs={"max_episode_steps": limit}
    )
    algo = PPO(envs.single_observation_space, envs.single_action_space)
    storage = RolloutStorage(num_steps, num_envs, (4,), ())
    stats = Collector(envs, algo, seed=0).collect_rollout(storage)
    obs = storage.obs.numpy()
    terminated = storage.terminated.numpy().astype(bool)
    truncated = storage.truncated.numpy().astype(bool)
    valid = storage.valid.numpy().astype(bool)
    rewards = storage.rewards.numpy()
    # Apart: some episodes end by termination alone, some by truncation alone (a pole that
    # falls on the limit step raises both, as gymnasium allows).
    assert (terminated & ~truncated).any()
    assert (truncated & ~terminated).any()
    for t, env in zip(*np.nonzero(terminated | truncated), strict=True):
        if t + 2 >= num_steps:
            continue
        final = obs[t + 1, env]
        if terminated[t, env]:
            assert abs(final[0]) > X_LIMIT or abs(final[2]) > ANGLE_LIMIT
        assert not valid[t + 1, env]
        assert rewards[t + 1, env] == 0.0
        assert np.all(np.abs(obs[t + 2, env]) <= RESET_BOUND)  # the new episode's first obs
    ended = int((terminated | truncated)[valid].sum())
    assert len(stats.episode_returns) == ended
    assert stats.episode_returns == [float(n) for n in stats.episode_lengths]
    assert max(stats.episode_lengths) == limit
    assert stats.env_steps == num_envs * num_steps
    envs.close()


def test_truncation_keeps_the_final_observation_for_bootstrapping() -> None:
    envs = make_vec_env(
        "Pendulum-v1", 2, seed=0, mode="envpool", env_kwargs={"max_episode_steps": 3}
    )
    actions = np.zeros((2, 1), dtype=np.float32)
    steps = [envs.step(actions) for _ in range(4)]
    assert [bool(s[3].all()) for s in steps] == [False, False, True, False]
    assert not any(s[2].any() for s in steps)
    # Pendulum's observation is (cos, sin, speed) of the angle: the final one follows on from
    # the step before (the angle moves by at most 8 * 0.05 rad), unlike a fresh reset.
    before, final = steps[1][0], steps[2][0]
    angle = np.arctan2(before[:, 1], before[:, 0])
    nxt = np.arctan2(final[:, 1], final[:, 0])
    assert np.all(np.abs(np.angle(np.exp(1j * (nxt - angle)))) <= 8 * 0.05 + 1e-5)
    assert np.all(steps[3][1] == 0.0)  # the reset step
    envs.close()


def test_auto_never_picks_envpool_and_state_is_not_saved() -> None:
    auto = make_vec_env("CartPole-v1", 4, seed=0)
    assert not isinstance(auto.unwrapped, EnvPoolVectorEnv)
    auto.close()
    pool = make_vec_env("CartPole-v1", 2, seed=0, mode="envpool")
    assert get_env_state(pool) is None  # a resumed run starts new episodes
    pool.close()


def test_an_exception_of_the_pool_is_an_env_worker_error() -> None:
    envs = make_vec_env("CartPole-v1", 2, seed=0, mode="envpool")
    with pytest.raises(EnvWorkerError, match=r"EnvPoolVectorEnv raised RuntimeError: .* step"):
        envs.step(np.zeros((2, 3)))
    envs.close()


def test_ppo_trains_with_envpool_through_the_cli(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["train", "ppo", "--env", "CartPole-v1", "--vector-mode", "envpool"]
    tiny = ["--num-envs", "4", "--num-steps", "32", "--batch-size", "64", "--max-steps", "512"]
    tiny += ["--epoch-num-steps", "256", "--num-test-envs", "2", "--test-step-num-episodes", "2"]
    args += ["--run-dir", str(run_dir), "--no-show-progress", "--no-verbose"]
    assert main([*args, *tiny]) == 0
    assert "vector_mode: envpool" in (run_dir / "config.yaml").read_text()
    assert (run_dir / "history.parquet").exists()


def test_an_env_envpool_does_not_run_gets_the_list_of_those_it_does() -> None:
    with pytest.raises(EnvSpecError, match=r"runs CartPole-v0, CartPole-v1, .*Acrobot-v1") as err:
        make_vec_env("MinAtar/Breakout-v1", 2, mode="envpool")
    assert "got 'MinAtar/Breakout-v1'" in str(err.value)
    assert "\n" not in str(err.value)


def test_env_kwargs_and_wrappers_envpool_cannot_honour_are_refused() -> None:
    with pytest.raises(EnvSpecError, match=r"\['max_episode_steps'\] only; got \['sutton"):
        make_vec_env("CartPole-v1", 2, mode="envpool", env_kwargs={"sutton_barto_reward": True})
    with pytest.raises(EnvSpecError, match="cannot apply per-env wrappers"):
        make_vec_env("CartPole-v1", 2, mode="envpool", wrappers=[lambda env: env])
    with pytest.raises(EnvSpecError, match="restart_failed_envs needs vector mode 'async'"):
        make_vec_env("CartPole-v1", 2, mode="envpool", restart_failed_envs=True)
    envs = make_vec_env("CartPole-v1", 2, mode="envpool")
    with pytest.raises(EnvSpecError, match="got 3 seeds for 2 envs"):
        envs.reset(seed=[1, 2, 3])
    envs.close()


def test_a_missing_envpool_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "envpool", None)  # import envpool raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlfleet\[envpool\]'"):
        make_vec_env("CartPole-v1", 2, mode="envpool")


def test_an_unsupported_env_is_exit_code_2_on_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["train", "ppo", "--env", "FrozenLake-v1", "--vector-mode", "envpool"]
    assert main([*args, "--run-dir", str(tmp_path / "r")]) == 2
    assert "vector mode 'envpool' runs CartPole-v0" in capsys.readouterr().err
