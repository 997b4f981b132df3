"""An in-process env's first outputs are checked: a wrong type or shape names the field."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from rlfleet.envs.make import make_vec_env
from rlfleet.envs.outputs import check_step_output, observation_problem
from rlfleet.errors import EnvSpecError, EnvWorkerError

MISBEHAVING = "tests.envs.toy_envs:MisbehavingEnv"


@pytest.mark.parametrize(
    ("misbehaviour", "error", "message"),
    [
        ("string_reward", EnvSpecError, r"step returned reward '1\.0' \(a str\); expected a num"),
        ("none_reward", EnvSpecError, r"step returned reward None \(None\); expected a number"),
        ("wrong_shape_obs", EnvSpecError, r"reset returned .* shape \(4,\), expected \(3,\)"),
        ("none_obs", EnvSpecError, r"reset returned .*: observation is None"),
        ("string_obs", EnvSpecError, r"observation is a str \(dtype <U3\), expected numbers"),
        ("int_terminated", EnvSpecError, r"step returned terminated 2 \(an int\); expected a bool"),
        ("reset_obs_only", EnvSpecError, r"reset returned an array .*; expected a tuple"),
        ("list_info", EnvWorkerError, r"info"),
        ("short_step", EnvWorkerError, r"not enough values to unpack"),
        ("exit", EnvWorkerError, r"called exit\(4\) in step number 1 .* vector_mode 'async'"),
    ],
)
def test_sync_envs_that_break_the_api_fail_typed_at_the_first_call(
    misbehaviour: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):  # noqa: PT012 (building resets the env)
        envs = make_vec_env(
            MISBEHAVING, 2, seed=0, mode="sync", env_kwargs={"misbehaviour": misbehaviour}
        )
        envs.step(np.zeros(2, np.int64))


@pytest.mark.parametrize(
    ("misbehaviour", "message"),
    [
        ("string_reward", r"^env index 0 \(MisbehavingEnv\) step returned reward '1\.0' \(a str\)"),
        ("none_reward", r"step returned reward None \(None\); expected a number$"),
        ("wrong_shape_obs", r"reset returned .* shape \(4,\), expected \(3,\)$"),
        ("string_obs", r"observation is a str \(dtype <U3\), expected numbers"),
        ("int_terminated", r"step returned terminated 2 \(an int\); expected a bool$"),
        ("reset_obs_only", r"reset returned an array .*; expected a tuple"),
    ],
)
def test_async_workers_check_the_first_outputs_too(misbehaviour: str, message: str) -> None:
    """In subprocess workers the same checks run in the worker: one line, no traceback, and
    no restart (a new worker would return the same), even with restart_failed_envs."""
    with pytest.raises(EnvSpecError, match=message) as raised:  # noqa: PT012
        envs = make_vec_env(
            MISBEHAVING,
            2,
            seed=0,
            mode="async",
            env_kwargs={"misbehaviour": misbehaviour},
            restart_failed_envs=True,
        )
        envs.step(np.zeros(2, np.int64))
    assert "\n" not in str(raised.value)
    assert "Traceback" not in str(raised.value)


def test_an_env_that_keeps_the_api_is_untouched() -> None:
    envs = make_vec_env("tests.envs.toy_envs:FaultyEnv", 2, seed=0, mode="sync")
    obs, reward, terminated, truncated, _ = envs.step(np.zeros(2, np.int64))
    assert obs.shape == (2, 2)
    assert reward.tolist() == [1.0, 1.0]
    assert not terminated.any()
    assert not truncated.any()
    envs.close()


@pytest.mark.parametrize(
    ("space", "obs", "problem"),
    [
        (spaces.Discrete(3), 1, None),
        (spaces.Discrete(3), np.int64(2), None),
        (spaces.Discrete(3), 1.5, "observation is 1.5 (a float), expected an integer"),
        (spaces.Box(0, 1, (2,)), [0.5, 0.5], None),
        (spaces.Box(0, 1, (2,)), [0.5, 0.5, 0.5], "observation has shape (3,), expected (2,)"),
        (spaces.Dict({"a": spaces.Discrete(2)}), {"a": 1}, None),
        (spaces.Dict({"a": spaces.Discrete(2)}), {"b": 1}, "has keys ['b'], expected ['a']"),
        (
            spaces.Dict({"a": spaces.Box(0, 1, (2,))}),
            {"a": None},
            "observation['a'] is None",
        ),
        (spaces.Tuple([spaces.Discrete(2)] * 2), (0,), "expected a tuple of 2"),
    ],
)
def test_observation_problems_name_the_part(
    space: spaces.Space[object], obs: object, problem: str | None
) -> None:
    found = observation_problem(space, obs)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert problem in found


def test_numpy_scalars_and_zero_d_arrays_are_numbers_and_flags() -> None:
    space = spaces.Box(0, 1, (1,))
    check_step_output("env", space, (np.zeros(1), np.float32(1), np.bool_(True), False, {}))
    check_step_output("env", space, (np.zeros(1), np.array(1.0), np.array(False), 0, {}))
    with pytest.raises(EnvSpecError, match="reward True"):
        check_step_output("env", space, (np.zeros(1), True, False, False, {}))
