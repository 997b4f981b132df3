"""In-process envs: an exception becomes EnvWorkerError naming env index and step."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlfleet.envs.faults import VectorEnvFaultWrapper
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import EnvWorkerError, NonFiniteError
from tests.envs.toy_envs import FaultyEnv

FAULTY_ID = "tests.envs.toy_envs:rlfleet-test/FaultyEnv-v0"


def test_sync_mode_names_the_env_index_and_its_step() -> None:
    envs = make_vec_env(FAULTY_ID, 2, seed=0, mode="sync", env_kwargs={"fail_at": 8})
    actions = np.zeros(2, np.int64)
    for _ in range(8):  # 7 good steps and one reset step (episodes last 5 steps)
        envs.step(actions)
    with pytest.raises(EnvWorkerError) as info:
        envs.step(actions)
    assert info.match(
        r"env index 0 raised ValueError: FaultyEnv broke on purpose at step 8 in step number 8 "
        r"of its life \(step 3 of its episode\), at .*toy_envs.py:\d+ in _strike"
    )
    assert isinstance(info.value.__cause__, ValueError)
    envs.close()


def test_errors_in_reset_are_labelled_too() -> None:
    def broken_reset(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no reset today")

    envs = make_vec_env(FAULTY_ID, 2, mode="sync")
    envs.unwrapped.envs[1].unwrapped.reset = broken_reset  # type: ignore[attr-defined]
    with pytest.raises(EnvWorkerError, match="env index 1 raised RuntimeError: no reset today"):
        envs.reset(seed=0)
    envs.close()


def test_rlfleet_errors_pass_through_unchanged() -> None:
    def non_finite(action: object) -> None:
        raise NonFiniteError("reward is nan")

    envs = make_vec_env(FAULTY_ID, 1, seed=0, mode="sync")
    envs.unwrapped.envs[0].unwrapped.step = non_finite  # type: ignore[attr-defined]
    with pytest.raises(NonFiniteError, match="reward is nan"):
        envs.step(np.zeros(1, np.int64))
    envs.close()


def test_native_vector_envs_say_the_index_is_unknown() -> None:
    assert isinstance(make_vec_env("CartPole-v1", 2, mode="native"), VectorEnvFaultWrapper)
    inner = SyncVectorEnv(
        [functools.partial(FaultyEnv, fail_at=2)] * 3, autoreset_mode=AutoresetMode.NEXT_STEP
    )
    envs = VectorEnvFaultWrapper(inner)
    envs.reset(seed=0)
    envs.step(np.zeros(3, np.int64))
    with pytest.raises(
        EnvWorkerError, match=r"SyncVectorEnv raised ValueError.* step number 2,"
    ) as info:
        envs.step(np.zeros(3, np.int64))
    assert info.match("which env failed is not known")
    assert isinstance(info.value.__cause__, ValueError)
