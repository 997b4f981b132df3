"""Multi-agent env copies in subprocess workers: the same results as in-process copies, and
crashes, hangs and bad envs reported as typed errors with every worker shut down."""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from gymnasium import spaces

pytest.importorskip("pettingzoo")
from pettingzoo import ParallelEnv
from pettingzoo.classic import tictactoe_v3

from rlfleet.algos.ppo import PPO, PPOConfig
from rlfleet.cli.main import main
from rlfleet.errors import ConfigError, EnvSpecError, EnvWorkerError
from rlfleet.marl.agents import make_agents
from rlfleet.marl.envs import MultiAgentVecEnv
from rlfleet.marl.trainer import DecentralizedTrainer, MultiAgentSettings
from rlfleet.marl.workers import WorkerMultiAgentVecEnv
from rlfleet.runs.config import load_run_config, run_config_from_dict
from rlfleet.train.loop import TrainerConfig

TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"


class TwoAgentParallel(ParallelEnv[str, np.ndarray, int]):
    """Two agents with random Box observations and a global state; episodes of
    ``episode_length`` steps. The copy first reset with ``faulty_seed`` misbehaves at its
    ``fail_at``-th step: ``raise``, ``exit``, ``hang``, or a wrongly shaped observation
    (``shape``)."""

    metadata: ClassVar[dict[str, Any]] = {"name": "two_agent_parallel"}

    def __init__(
        self,
        fault: str | None = None,
        fail_at: int = 3,
        faulty_seed: int = 1,
        episode_length: int = 5,
    ) -> None:
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self.fault, self.fail_at, self.faulty_seed = fault, fail_at, faulty_seed
        self.episode_length = episode_length
        self.faulty = False
        self.steps = 0
        self.t = 0
        self.rng = np.random.default_rng()
        self._obs_space = spaces.Box(-1.0, 1.0, (3,), np.float32)

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return spaces.Discrete(2)

    def state(self) -> np.ndarray:
        return np.concatenate([self._last["a"], self._last["b"], [self.t]]).astype(np.float32)

    def _observe(self) -> dict[str, np.ndarray]:
        self._last = {a: self.rng.uniform(-1, 1, 3).astype(np.float32) for a in self.agents}
        return dict(self._last)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
            self.faulty = self.faulty or seed == self.faulty_seed
        self.agents = list(self.possible_agents)
        self.t = 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[Any, Any, Any, Any, Any]:
        self.steps += 1
        self.t += 1
        if self.faulty and self.steps == self.fail_at:
            self._strike()
        obs = self._observe()
        if self.faulty and self.fault == "shape" and self.steps == self.fail_at:
            obs["b"] = np.zeros(4, np.float32)
        rewards = {a: float(actions[a]) + float(obs[a][0]) for a in self.agents}
        done = self.t >= self.episode_length
        terminated = {a: done and a == "a" for a in self.agents}
        truncated = {a: done and a == "b" for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terminated, truncated, {a: {} for a in obs}

    def _strike(self) -> None:
        if self.fault == "raise":
            raise ValueError("TwoAgentParallel broke")
        if self.fault == "exit":
            os._exit(3)
        if self.fault == "hang":
            time.sleep(60)


def _play(envs: MultiAgentVecEnv, num_steps: int, with_state: bool = False) -> list[Any]:
    """Everything the vector env reports over ``num_steps`` random steps, comparable."""
    rng = np.random.default_rng(0)
    envs.reset()
    seen: list[Any] = []

    def report(r: Any) -> tuple[Any, ...]:
        mask = None if r.mask is None else (r.mask.dtype.str, r.mask.tolist())
        obs = (r.obs.dtype.str, r.obs.shape, r.obs.tobytes())
        return (r.env_id, r.agent, obs, r.reward, r.terminated, r.truncated, mask)

    for _ in range(num_steps):
        actions = {}
        for r in envs.acting:
            seen.append(report(r))
            if with_state:
                seen.append(envs.state(r.env_id).tolist())
            legal = np.flatnonzero(r.mask) if r.mask is not None else np.arange(2)
            actions[(r.env_id, r.agent)] = int(rng.choice(legal))
        exits, ended = envs.step(actions)
        seen += [report(r) for r in exits]
        seen += [(e.env_id, e.returns, e.length) for e in ended]
    return seen


def _spread() -> Any:
    simple_spread = pytest.importorskip("mpe2.simple_spread_v3")
    return functools.partial(simple_spread.parallel_env, max_cycles=8)


@pytest.mark.parametrize("game", ["tictactoe", "simple_spread", "custom"])
def test_workers_report_what_in_process_copies_report(game: str) -> None:
    """Same turns, observations, masks, rewards, exits, episode ends and states for a seed."""
    env_fn: Any = {"tictactoe": tictactoe_v3.env, "custom": TwoAgentParallel}.get(game)
    if env_fn is None:
        env_fn = _spread()
    with_state = game != "tictactoe"
    local = MultiAgentVecEnv(env_fn, 3, seed=7)
    expected = _play(local, 60, with_state)
    local.close()
    workers = WorkerMultiAgentVecEnv(env_fn, 3, seed=7)
    pids = workers.pids
    assert workers.aec == local.aec == (game == "tictactoe")
    assert workers.possible_agents == local.possible_agents
    assert workers.observation_spaces == local.observation_spaces
    if with_state:
        assert workers.state_size() == local.state_size()
    received = _play(workers, 60, with_state)
    workers.close()
    assert any(isinstance(item, tuple) and len(item) == 3 for item in expected)  # episodes ended
    assert received == expected
    _assert_all_gone(pids)


def _assert_all_gone(pids: tuple[int | None, ...]) -> None:
    for pid in pids:
        assert pid is not None
        assert _dead(pid), f"worker {pid} outlived the error"


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is dead too; it is its parent's to reap.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _faulty(fault: str, **kwargs: Any) -> Any:
    return functools.partial(TwoAgentParallel, fault=fault, **kwargs)


def _step_until_error(envs: WorkerMultiAgentVecEnv, num_steps: int = 10) -> None:
    for _ in range(num_steps):
        envs.step({(r.env_id, r.agent): 0 for r in envs.acting})


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("raise", r"raised an exception; remote traceback:[\s\S]*ValueError: TwoAgentParallel"),
        ("exit", "exited with code 3"),
        ("hang", r"did not answer within 1 s, so it was killed[\s\S]*in _strike"),
    ],
)
def test_a_failed_worker_raises_naming_it_and_leaves_no_process(fault: str, expected: str) -> None:
    envs = WorkerMultiAgentVecEnv(_faulty(fault), 3, seed=0, step_timeout_s=1.0)
    pids = envs.pids
    envs.reset()
    start = time.monotonic()
    with pytest.raises(EnvWorkerError, match=r"env worker 1 \(pid \d+\) during step") as info:
        _step_until_error(envs)
    assert time.monotonic() - start < 10
    assert info.match(expected)
    assert envs.closed
    _assert_all_gone(pids)
    with pytest.raises(EnvWorkerError, match="closed"):
        _step_until_error(envs, 1)


def test_a_worker_killed_mid_run_is_reported() -> None:
    envs = WorkerMultiAgentVecEnv(TwoAgentParallel, 2, seed=0)
    pids = envs.pids
    envs.reset()
    _step_until_error(envs, 3)
    assert pids[1] is not None
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(EnvWorkerError, match=rf"env worker 1 \(pid {pids[1]}\) during step"):
        _step_until_error(envs, 1)
    assert time.monotonic() - start < 10
    _assert_all_gone(pids)


def test_a_wrongly_shaped_observation_is_an_env_spec_error() -> None:
    envs = WorkerMultiAgentVecEnv(_faulty("shape"), 2, seed=0)
    pids = envs.pids
    envs.reset()
    with pytest.raises(
        EnvSpecError,
        match=r"env copy 1 \(TwoAgentParallel\): expected agent 'b'.*\(3,\), got \(4,\)",
    ):
        _step_until_error(envs)
    _assert_all_gone(pids)


def test_what_is_not_a_pettingzoo_env_is_refused_before_any_worker_starts() -> None:
    with pytest.raises(EnvSpecError, match="expected a PettingZoo Parallel or AEC env"):
        WorkerMultiAgentVecEnv(lambda: object(), 2)
    with pytest.raises(EnvSpecError, match="expected num_envs >= 1"):
        WorkerMultiAgentVecEnv(TwoAgentParallel, 0)
    with pytest.raises(ConfigError, match="step_timeout_s must be a positive"):
        WorkerMultiAgentVecEnv(TwoAgentParallel, 1, step_timeout_s=0)


def test_an_env_that_cannot_be_built_in_a_worker() -> None:
    built: list[int] = []

    def build() -> TwoAgentParallel:
        built.append(1)
        if len(built) > 1:  # fine in this process, broken in the (forked) workers
            raise RuntimeError("no display")
        return TwoAgentParallel()

    with pytest.raises(EnvWorkerError, match=r"env worker 0 .*startup[\s\S]*RuntimeError: no"):
        WorkerMultiAgentVecEnv(build, 2, context="fork")


def test_multi_agent_runs_refuse_restart_failed_envs(capsys: pytest.CaptureFixture[str]) -> None:
    data = {"algo": "ppo", "env": {"id": TICTACTOE, "restart_failed_envs": True}}
    with pytest.raises(ConfigError, match="restart_failed_envs applies to single-agent runs"):
        run_config_from_dict(data, "run.yaml")
    args = ["train", "ppo", "--env", TICTACTOE, "--shared-memory", "--restart-failed-envs"]
    assert main(args) == 2
    assert "restart_failed_envs applies to single-agent runs" in capsys.readouterr().err


def _ppo_agents() -> Any:
    build = lambda o, a, s: PPO(o, a, PPOConfig(num_epochs=1), seed=s)  # noqa: E731
    return make_agents(tictactoe_v3.env, build, share_parameters=True)


def test_a_shared_memory_run_trains_as_the_in_process_run() -> None:
    def train(shared_memory: bool) -> torch.Tensor:
        agents = _ppo_agents()
        settings = MultiAgentSettings(
            batch_size=16, collection_step_num_episodes=6, shared_memory=shared_memory
        )
        config = TrainerConfig(
            max_episodes=12, epoch_num_steps=60, test_step_num_episodes=2,
            show_progress=False, verbose=False,
        )  # fmt: skip
        trainer = DecentralizedTrainer(
            tictactoe_v3.env, agents, config, settings, num_envs=2, num_test_envs=2, seed=5
        )
        kind = WorkerMultiAgentVecEnv if shared_memory else MultiAgentVecEnv
        assert type(trainer.train_envs) is kind
        assert type(trainer.test_envs) is kind
        try:
            trainer.run()
        finally:
            trainer.close()
        return agents[0].parameters_vector()

    assert torch.equal(train(True), train(False))


def test_cli_shared_memory_run_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["train", "ppo", "--env", TICTACTOE, "--shared-memory", "--max-episodes", "10"]
    args += ["--num-envs", "2", "--num-test-envs", "2", "--epoch-num-steps", "1000"]
    args += ["--test-step-num-episodes", "2", "--num-epochs", "1", "--run-dir", str(run_dir)]
    args += ["--no-show-progress", "--no-verbose"]
    assert main(args) == 0
    cfg = load_run_config(run_dir)
    assert cfg.multi_agent is not None
    assert cfg.multi_agent.shared_memory
    resume = ["train", "ppo", "--resume", str(run_dir), "--max-episodes", "20", "--no-verbose"]
    assert main(resume) == 0
    history = pq.read_table(run_dir / "history.parquet").to_pydict()
    assert 20 <= history["episode"][-1] <= 22
    assert load_run_config(run_dir).multi_agent.shared_memory  # type: ignore[union-attr]
