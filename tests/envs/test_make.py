"""make_env / make_vec_env: vector mode choice, seeding, autoreset mode, bad ids."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from rlfleet.envs.make import VectorMode, choose_vector_mode, env_spec, make_env, make_vec_env
from rlfleet.envs.workers import WorkerVectorEnv
from rlfleet.errors import EnvSpecError
from tests.envs.toy_envs import FaultyEnv

MODULE_FORMS = ["tests.envs.toy_envs:rlfleet-test/FaultyEnv-v0", "tests.envs.toy_envs:FaultyEnv"]
"""One env named as ``module:EnvId`` (the module registers it) and as ``module:EnvClass``."""


def test_native_vector_entry_point_is_preferred() -> None:
    assert choose_vector_mode("CartPole-v1", 8) == "native"
    envs = make_vec_env("CartPole-v1", 4, seed=0)
    assert not isinstance(envs, SyncVectorEnv | AsyncVectorEnv)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    envs.close()


@pytest.mark.parametrize("mode", ["native", "sync", "async", "envpool"])
def test_every_vector_mode_resets_on_the_step_after_an_episode_ends(mode: VectorMode) -> None:
    """docs/user-guide.md: all vector envs use Gymnasium's next-step autoreset: the step after
    an episode ends is a reset step (no reward, not done, a fresh start)."""
    if mode == "envpool":
        pytest.importorskip("envpool")
    envs = make_vec_env("CartPole-v1", 2, seed=0, mode=mode)
    try:
        assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        for _ in range(500):
            _, _, terminated, truncated, _ = envs.step(np.ones(2, dtype=np.int64))
            if (terminated | truncated).any():
                break
        ended = terminated | truncated
        assert ended.any()
        obs, reward, terminated, truncated, _ = envs.step(np.ones(2, dtype=np.int64))
        assert (reward[ended] == 0).all()
        assert not (terminated[ended] | truncated[ended]).any()
        assert (np.abs(obs[ended]) <= 0.05).all()  # CartPole starts within 0.05 of upright
    finally:
        envs.close()


def test_a_vector_env_of_another_autoreset_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import gymnasium as gym

    def same_step(fns: Any, **kwargs: Any) -> SyncVectorEnv:
        return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)

    monkeypatch.setattr(gym.vector, "SyncVectorEnv", same_step)
    with pytest.raises(
        EnvSpecError, match=r"autoreset mode .*SAME_STEP.*rlfleet expects NEXT_STEP"
    ):
        make_vec_env("Pendulum-v1", 2, mode="sync")


def test_env_without_native_vectorisation_runs_in_process() -> None:
    assert choose_vector_mode("Pendulum-v1", 8) == "sync"
    envs = make_vec_env("Pendulum-v1", 2)
    assert isinstance(envs, SyncVectorEnv)
    envs.close()


def test_async_workers_on_request() -> None:
    envs = make_vec_env("Pendulum-v1", 2, seed=3, mode="async", step_timeout_s=5.0)
    assert isinstance(envs, WorkerVectorEnv)
    assert envs.step_timeout_s == 5.0
    assert not envs.restart_failed_envs
    obs, *_ = envs.step(np.zeros((2, 1), np.float32))
    assert obs.shape == (2, 3)
    envs.close()


def test_restarting_failed_envs_needs_worker_processes() -> None:
    envs = make_vec_env("CartPole-v1", 2, restart_failed_envs=True)
    assert isinstance(envs, WorkerVectorEnv)
    assert envs.restart_failed_envs
    envs.close()
    with pytest.raises(EnvSpecError, match="restart_failed_envs needs vector mode 'async'"):
        make_vec_env("CartPole-v1", 2, mode="sync", restart_failed_envs=True)


def test_same_seed_same_first_observations() -> None:
    first = make_vec_env("CartPole-v1", 3, seed=7, mode="sync")
    second = make_vec_env("CartPole-v1", 3, seed=7, mode="sync")
    a, _ = first.reset(seed=7)
    b, _ = second.reset(seed=7)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a[0], a[1])  # sub-envs get distinct seeds


def test_unknown_env_id_lists_close_matches() -> None:
    with pytest.raises(EnvSpecError, match="did you mean CartPole-v1"):
        make_vec_env("CartPole-v9", 2)
    with pytest.raises(EnvSpecError, match="unknown environment id"):
        make_env("NoSuchThingAtAll-v0")


def test_module_prefix_is_imported() -> None:
    env = make_env("gymnasium.envs.classic_control:MountainCar-v0")
    assert env.observation_space.shape == (2,)
    with pytest.raises(EnvSpecError, match="cannot import module"):
        make_env("no_such_module_xyz:Foo-v0")


@pytest.mark.parametrize("env_id", MODULE_FORMS)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_module_env_id_and_module_class_build_the_same_env(env_id: str, mode: VectorMode) -> None:
    assert env_spec(env_id).vector_entry_point is None
    env = make_env(env_id, episode_length=3)
    assert isinstance(env.unwrapped, FaultyEnv)
    assert env.unwrapped.episode_length == 3
    env.close()
    # Async workers resolve the id again in their own process.
    envs = make_vec_env(env_id, 2, seed=0, mode=mode, env_kwargs={"episode_length": 3})
    try:
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (2, 2)
        _, rewards, *_ = envs.step(np.zeros(2, dtype=np.int64))
        np.testing.assert_array_equal(rewards, [1.0, 1.0])
    finally:
        envs.close()


def test_module_form_that_names_nothing_lists_what_the_module_offers() -> None:
    with pytest.raises(EnvSpecError, match=r"did you mean .*FaultyEnv") as info:
        env_spec("tests.envs.toy_envs:FaultyEnvv")
    assert "module 'tests.envs.toy_envs' neither registers the env id 'FaultyEnvv'" in str(
        info.value
    )
    with pytest.raises(EnvSpecError, match=r"is a str, expected a gymnasium\.Env subclass"):
        env_spec("tests.envs.toy_envs:__name__")


def test_invalid_arguments() -> None:
    with pytest.raises(EnvSpecError, match="num_envs"):
        make_vec_env("CartPole-v1", 0)
    with pytest.raises(EnvSpecError, match="vector mode"):
        make_vec_env("CartPole-v1", 2, mode="threads")  # type: ignore[arg-type]
    with pytest.raises(EnvSpecError, match="no native"):
        make_vec_env("Pendulum-v1", 2, mode="native")


@pytest.mark.parametrize("mode", ["native", "sync"])
def test_env_kwargs_the_env_does_not_take_are_bad_input(mode: VectorMode) -> None:
    with pytest.raises(EnvSpecError, match=r"'CartPole-v1' cannot be built with env kwargs"):
        make_vec_env("CartPole-v1", 2, mode=mode, env_kwargs={"gravity_typo": 1.0})
    with pytest.raises(EnvSpecError, match="cannot be built with env kwargs"):
        make_env("CartPole-v1", gravity_typo=1.0)
