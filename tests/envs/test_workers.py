"""WorkerVectorEnv: same outputs as SyncVectorEnv, loud and bounded failures, restarts."""

from __future__ import annotations

import faulthandler
import functools
import multiprocessing
import os
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rlfleet.algos import DQN, PPO
from rlfleet.collect.collector import Collector
from rlfleet.data.replay import ReplayBuffer
from rlfleet.data.rollout import RolloutStorage
from rlfleet.envs import processes, workers
from rlfleet.envs.workers import WorkerVectorEnv
from rlfleet.errors import EnvWorkerError
from tests.envs.toy_envs import DictObsEnv, FaultyEnv

ROOT = Path(__file__).resolve().parents[2]


def _assert_same(a: Any, b: Any, where: str) -> None:
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, tuple):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{k}]")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype, where
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, where


def _dead(pid: int | None) -> bool:
    """Gone or a zombie (an orphan's zombie is init's to reap, which a container may not)."""
    assert pid is not None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _assert_all_gone(pids: tuple[int | None, ...]) -> None:
    for pid in pids:
        assert _dead(pid), f"worker {pid} outlived the error"


def _faulty(n: int, index: int, **kwargs: Any) -> list[Any]:
    """``n`` FaultyEnv functions; the one at ``index`` gets ``kwargs``."""
    return [functools.partial(FaultyEnv, **(kwargs if i == index else {})) for i in range(n)]


# ------------------------------------------------------------------ equivalence
@pytest.mark.parametrize(
    ("make", "num_steps"),
    [
        (functools.partial(gym.make, "CartPole-v1"), 300),
        (functools.partial(gym.make, "Pendulum-v1"), 230),
        (DictObsEnv, 40),
    ],
    ids=["cartpole", "pendulum", "dict-obs"],
)
def test_same_outputs_as_sync_vector_env(make: Any, num_steps: int) -> None:
    reference = SyncVectorEnv([make] * 3, autoreset_mode=AutoresetMode.NEXT_STEP)
    envs = WorkerVectorEnv([make] * 3)
    try:
        assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
        assert envs.observation_space == reference.observation_space
        assert envs.action_space == reference.action_space
        _assert_same(envs.reset(seed=11), reference.reset(seed=11), "reset")
        reference.action_space.seed(5)
        ended = 0
        for t in range(num_steps):
            actions = reference.action_space.sample()
            expected = reference.step(actions)
            _assert_same(envs.step(actions), expected, f"step {t}")
            ended += int(np.sum(expected[2] | expected[3]))
        assert ended >= 3, "the comparison should cover autoreset"
        assert envs.restarts == (0, 0, 0)
    finally:
        envs.close()
        reference.close()


def test_attribute_access_and_calls() -> None:
    envs = WorkerVectorEnv(_faulty(2, 0))
    try:
        assert envs.get_attr("episode_length") == (5, 5)
        envs.set_attr("episode_length", [2, 3])
        assert envs.call("_obs")[0].tolist() == [0.0, 0.0]
        assert envs.get_attr("episode_length") == (2, 3)
        with pytest.raises(EnvWorkerError, match="AttributeError"):
            envs.get_attr("no_such_attribute")
        envs.reset(seed=0)
        _, _, terminated, _, _ = envs.step(np.zeros(2, np.int64))
        _, _, terminated, _, _ = envs.step(np.zeros(2, np.int64))
        assert terminated.tolist() == [True, False]  # the workers survived the failed call
    finally:
        envs.close()


# ------------------------------------------------------------------ faults
@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("raise", r"raised an exception; remote traceback:[\s\S]*ValueError: FaultyEnv broke"),
        ("exit", "exited with code 3"),
        ("segfault", r"killed by signal SIGSEGV[\s\S]*in _strike"),
        ("hang", r"did not answer within 1 s, so it was killed[\s\S]*in _strike"),
    ],
)
def test_a_failed_worker_raises_quickly_and_leaves_no_process(fault: str, expected: str) -> None:
    envs = WorkerVectorEnv(_faulty(3, 1, fault=fault, fail_at=3), step_timeout_s=1.0)
    pids = envs.pids
    envs.reset(seed=0)
    envs.step(np.zeros(3, np.int64))
    envs.step(np.zeros(3, np.int64))
    start = time.monotonic()
    with pytest.raises(EnvWorkerError, match=r"env worker 1 \(pid \d+\) during step") as info:
        envs.step(np.zeros(3, np.int64))
    assert time.monotonic() - start < 10
    assert info.match(expected)
    assert info.match("restart_failed_envs=True")
    assert envs.closed
    _assert_all_gone(pids)
    with pytest.raises(EnvWorkerError, match="closed"):
        envs.step(np.zeros(3, np.int64))


def _forked(target: Any) -> tuple[multiprocessing.process.BaseProcess, Any]:
    """Run ``target(conn)`` in a forked process; return it and the first thing it sends."""
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=target, args=(sender,))
    process.start()
    assert receiver.poll(60)
    return process, receiver.recv()


def _segfault_under_a_replaced_handler(conn: Connection) -> None:
    faulthandler.enable()
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)  # as a library might, over faulthandler
    envs = WorkerVectorEnv(_faulty(2, 1, fault="segfault", fail_at=2), context="fork")
    envs.reset(seed=0)
    envs.step(np.zeros(2, np.int64))
    try:
        envs.step(np.zeros(2, np.int64))
    except EnvWorkerError as err:
        conn.send(str(err))


def test_a_crash_dump_survives_a_signal_handler_installed_over_faulthandler() -> None:
    # A forked worker inherits the replaced handler while faulthandler still counts itself
    # enabled; the worker must install its own again. Run in a forked process of its own,
    # so the test process keeps its handlers.
    process, message = _forked(_segfault_under_a_replaced_handler)
    process.join()
    assert "killed by signal SIGSEGV" in message
    assert "in _strike" in message


def test_a_worker_killed_from_outside_is_reported() -> None:
    envs = WorkerVectorEnv(_faulty(2, 0))
    pids = envs.pids
    envs.reset(seed=0)
    envs.step(np.zeros(2, np.int64))
    assert pids[1] is not None
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EnvWorkerError, match=r"env worker 1 .*killed by signal SIGKILL"):
        envs.step(np.zeros(2, np.int64))
    assert time.monotonic() - start < 10
    _assert_all_gone(pids)


def test_an_env_that_cannot_be_built_in_the_worker() -> None:
    with pytest.raises(EnvWorkerError, match=r"env worker 1 .*startup[\s\S]*TypeError"):
        WorkerVectorEnv([FaultyEnv, functools.partial(FaultyEnv, no_such_argument=1)])


def test_spawned_workers_import_this_checkout() -> None:
    envs = WorkerVectorEnv(_faulty(1, 0, fail_at=2), context="spawn")
    envs.reset(seed=0)
    envs.step(np.zeros(1, np.int64))
    with pytest.raises(EnvWorkerError) as info:
        envs.step(np.zeros(1, np.int64))
    message = str(info.value)
    assert f"{ROOT}/rlfleet/envs/workers.py" in message
    assert f"{ROOT}/tests/envs/toy_envs.py" in message


def _hold_workers(conn: Connection) -> None:
    envs = WorkerVectorEnv([FaultyEnv, FaultyEnv])
    conn.send(envs.pids)
    time.sleep(60)


def test_workers_exit_when_their_parent_is_killed() -> None:
    # A forked parent, so that the test pays for no second import of rlfleet.
    parent, pids = _forked(_hold_workers)
    assert parent.pid is not None
    os.kill(parent.pid, signal.SIGKILL)
    parent.join()
    deadline = time.monotonic() + 3 * processes.ORPHAN_CHECK_S + 2
    while not all(_dead(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    _assert_all_gone(pids)


def test_close_never_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "_CLOSE_TIMEOUT_S", 0.3)
    envs = WorkerVectorEnv(_faulty(2, 1, fault="hang", fail_at=1), step_timeout_s=30)
    pids = envs.pids
    envs.reset(seed=0)
    envs._send(1, "step", None)  # leave worker 1 stuck in a step
    start = time.monotonic()
    envs.close()
    assert time.monotonic() - start < 5
    _assert_all_gone(pids)


# ------------------------------------------------------------------ restarts
def test_restart_truncates_the_episode_then_gives_a_reset_step() -> None:
    envs = WorkerVectorEnv(
        _faulty(2, 1, fail_at=3, episode_length=10), restart_failed_envs=True, step_timeout_s=5
    )
    try:
        old_pid = envs.pids[1]
        envs.reset(seed=7)
        actions = np.zeros(2, np.int64)
        for _ in range(2):
            envs.step(actions)
        with pytest.warns(RuntimeWarning, match=r"restarting env worker 1[\s\S]*ValueError"):
            obs, rewards, terminated, truncated, infos = envs.step(actions)
        assert envs.restarts == (0, 1)
        assert envs.pids[1] != old_pid
        assert _dead(old_pid)
        # The failing step ends the episode as truncated, with the new episode's first obs.
        assert truncated.tolist() == [False, True]
        assert terminated.tolist() == [False, False]
        assert rewards.tolist() == [1.0, 0.0]
        assert obs[1].tolist() == [0.0, 0.0]
        assert infos["_env_restarted"].tolist() == [False, True]
        # Then the usual reset step: action ignored, same first obs, reward 0, reseeded.
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        assert obs[1].tolist() == [0.0, 0.0]
        assert rewards.tolist() == [1.0, 0.0]
        assert not truncated.any()
        assert not terminated.any()
        assert infos["seed"][1] == 7 + 1 + 1000
        obs, *_ = envs.step(actions)
        assert obs[1].tolist() == [1.0, 1.0]
    finally:
        envs.close()


def test_a_failed_reset_step_restarts_without_truncating() -> None:
    # The worker dies after its episode ended, so its next command is a reset step: the
    # restart stands in for that reset, with no truncation and no extra reset step.
    envs = WorkerVectorEnv(_faulty(1, 0, episode_length=2), restart_failed_envs=True)
    try:
        envs.reset(seed=0)
        actions = np.zeros(1, np.int64)
        envs.step(actions)
        _, _, terminated, _, _ = envs.step(actions)
        assert terminated.tolist() == [True]
        assert envs.pids[0] is not None
        os.kill(envs.pids[0], signal.SIGKILL)
        with pytest.warns(RuntimeWarning, match="SIGKILL"):
            obs, rewards, terminated, truncated, infos = envs.step(actions)
        assert (terminated.tolist(), truncated.tolist(), rewards.tolist()) == (
            [False],
            [False],
            [0],
        )
        assert infos["env_restarted"].tolist() == [True]
        obs, *_ = envs.step(actions)
        assert obs[0].tolist() == [1.0, 1.0]  # no extra reset step
    finally:
        envs.close()


@pytest.mark.filterwarnings("ignore:restarting env worker 0:RuntimeWarning")
def test_a_worker_that_keeps_failing_raises_anyway() -> None:
    envs = WorkerVectorEnv(
        _faulty(2, 0, fault="exit", fail_at=1), restart_failed_envs=True, max_restarts_in_a_row=2
    )
    envs.reset(seed=0)
    pids = set(envs.pids)
    actions = np.zeros(2, np.int64)
    # Every life fails on its first step; each restart is followed by a reset step.
    for _ in range(4):
        envs.step(actions)
        pids.update(envs.pids)
    with pytest.raises(
        EnvWorkerError, match=r"failed 3 times in a row[\s\S]*max_restarts_in_a_row=2"
    ):
        envs.step(actions)
    assert envs.restarts == (2, 0)
    _assert_all_gone(tuple(pids))


@pytest.mark.filterwarnings("ignore:restarting env worker 0:RuntimeWarning")
def test_the_collector_sees_a_truncated_episode_and_a_masked_reset_step() -> None:
    envs = WorkerVectorEnv(_faulty(1, 0, fail_at=3, episode_length=10), restart_failed_envs=True)
    try:
        algo = PPO(envs.single_observation_space, envs.single_action_space)
        storage = RolloutStorage(6, 1, (2,), ())
        collector = Collector(envs, algo, seed=0)
        stats = collector.collect_rollout(storage)
        assert collector.env_restarts == 1
        np.testing.assert_array_equal(storage.truncated[:, 0].numpy(), [0, 0, 1, 0, 0, 0])
        np.testing.assert_array_equal(storage.valid[:, 0].numpy(), [1, 1, 1, 0, 1, 1])
        np.testing.assert_array_equal(storage.rewards[:, 0].numpy(), [1, 1, 0, 0, 1, 1])
        # The truncated episode bootstraps from the row after it: the new first observation.
        np.testing.assert_array_equal(storage.obs[3, 0].numpy(), [0, 0])
        np.testing.assert_array_equal(storage.obs[5, 0].numpy(), [1, 1])
        assert stats.episode_lengths == [3]
        assert stats.episode_returns == [2.0]
    finally:
        envs.close()


def test_transition_collection_sees_the_truncation_and_never_samples_the_reset_step() -> None:
    envs = WorkerVectorEnv(_faulty(1, 0, fail_at=3, episode_length=10), restart_failed_envs=True)
    try:
        algo = DQN(envs.single_observation_space, envs.single_action_space)
        buffer = ReplayBuffer(16, envs.single_observation_space, envs.single_action_space, 1)
        stats = Collector(envs, algo, seed=0).collect_transitions(buffer, 6, random_actions=True)
        assert stats.episode_lengths == [3]
        assert stats.episode_returns == [2.0]
        np.testing.assert_array_equal(buffer.truncated[:6, 0], [0, 0, 1, 0, 0, 0])
        np.testing.assert_array_equal(buffer.valid[:6, 0], [1, 1, 1, 0, 1, 1])
        np.testing.assert_array_equal(buffer.rewards[:6, 0], [1, 1, 0, 0, 1, 1])
        batch = buffer.sample(256, gamma=0.5)
        obs, next_obs = batch.obs[:, 0], batch.next_obs[:, 0]
        # Never the reset step (the first observation with reward 0) as a transition; the
        # truncated step bootstraps from the new episode's first observation.
        assert not bool(((obs == 0) & (batch.rewards == 0)).any())
        cut = obs == 2
        assert bool(cut.any())
        assert bool((next_obs[cut] == 0).all())
        torch.testing.assert_close(next_obs[~cut], obs[~cut] + 1)
        assert bool((batch.discounts == 0.5).all())
    finally:
        envs.close()
