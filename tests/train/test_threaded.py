"""Threaded collection (``threaded: true``): the off-policy trainer steps its envs on a thread
of its own; the staleness bound holds, errors surface in the caller's thread, checkpoints and
resume work, and threaded runs learn as unthreaded ones do."""

from __future__ import annotations

import faulthandler
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

from rlfleet.checkpoint import CheckpointManager
from rlfleet.envs.curriculum import EnvironmentParameterSettings
from rlfleet.runs.config import default_run_config
from rlfleet.runs.run import make_trainer
from rlfleet.train.trainer import OffPolicyTrainer
from tests.train.test_offpolicy_trainer import QUIET, _cfg

HANG_S = 120
"""A test that has not finished by then hangs: faulthandler dumps every thread and exits."""


@pytest.fixture(autouse=True)
def _no_hang() -> Iterator[None]:
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _collector_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rlfleet-collector"]


def _dqn(max_steps: int, trainer: dict[str, Any] | None = None, **hp: Any) -> Any:
    return _cfg(max_steps, {"threaded": True, **(trainer or {})}, **hp)


def test_off_by_default_no_thread_and_the_mlagents_property_says_so() -> None:
    cfg = _dqn(200)
    cfg.trainer.threaded = False
    trainer = make_trainer(cfg, None)
    trainer.run()
    assert trainer.collection_thread is None
    assert trainer.threaded is False
    assert trainer.collects_on_thread is False


def test_staleness_bound_holds_and_the_update_to_data_ratio_is_kept() -> None:
    # Collection steps of 4 env steps (2 envs x 2), 2 gradient steps each; the thread may run
    # 3 collection steps ahead and the weights are published every 5 gradient steps.
    cfg = _dqn(
        1200,
        {"threaded_max_lead_steps": 12, "threaded_sync_interval": 5},
        train_freq=4,
        gradient_steps=2,
    )
    trainer = make_trainer(cfg, None)
    assert isinstance(trainer, OffPolicyTrainer)
    assert trainer.threaded
    assert trainer.threaded_max_lead_chunks == 3
    assert trainer.threaded_update_lag_bound == 3 * 4 * 2 // 4 + 5 - 1
    result = trainer.run()
    thread = trainer.collection_thread
    assert thread is not None
    assert 0 < thread.max_update_lag <= trainer.threaded_update_lag_bound
    assert 4 <= thread.max_lead_env_steps <= 3 * 4
    # Every collected step is counted and in the buffer; the ratio holds exactly, as
    # unthreaded: updates start with the collection step that reaches learning_starts (the
    # one that begins at 96).
    assert result.env_steps == trainer.collector.env_steps == 1200
    assert trainer.algorithm.gradient_steps == (1200 - 96) * 2 // 4
    assert not thread.running
    assert not _collector_threads()


def test_a_stop_rule_mid_epoch_counts_what_the_thread_collected_ahead() -> None:
    cfg = _dqn(
        4000,
        {"threaded_max_lead_steps": 40, "target_reward": 1.0, "target_reward_episodes": "training"},
    )
    trainer = make_trainer(cfg, None)
    result = trainer.run()
    assert result.stop_reason.startswith("stop_fn")
    assert result.env_steps == trainer.collector.env_steps < 4000
    assert trainer.collection_thread is not None
    assert trainer.collection_thread.outstanding == 0


class _FaultyEnv(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole that raises on its 150th step."""

    steps = 0

    def step(self, action: Any) -> Any:
        type(self).steps += 1
        if type(self).steps == 150:
            raise OSError("simulator lost")
        return super().step(action)


def test_an_env_error_on_the_thread_surfaces_in_the_caller_and_stops_it() -> None:
    from gymnasium.vector import SyncVectorEnv

    _FaultyEnv.steps = 0
    cfg = _dqn(2000)
    trainer = make_trainer(cfg, None)
    trainer.train_envs.close()
    envs = SyncVectorEnv(
        [lambda: _FaultyEnv(gym.make("CartPole-v1")) for _ in range(2)],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )
    trainer.collector.envs = envs
    trainer.collector.obs, trainer.collector.infos = envs.reset(seed=0)
    with pytest.raises(OSError, match="simulator lost"):
        trainer.run()
    assert not _collector_threads()
    assert trainer.collection_thread is not None
    assert not trainer.collection_thread.running


def test_an_interrupt_in_the_caller_stops_the_thread() -> None:
    def interrupt(epoch: int, env_step: int) -> None:
        if env_step >= 300:
            raise KeyboardInterrupt

    trainer = make_trainer(_dqn(2000), None)
    trainer.training_fn = interrupt
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    assert not _collector_threads()


def test_checkpoints_are_consistent_and_a_resume_carries_on(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    trainer = make_trainer(_dqn(600), run_dir)
    trainer.run()
    state, meta = CheckpointManager(run_dir / "checkpoints", readonly=True).load_latest()
    assert meta["counters"]["env_step"] == state["collector"]["env_steps"] == 600
    assert state["trainer"]["env_step"] == 600
    gradient_steps = trainer.algorithm.gradient_steps
    trainer.close()

    resumed = make_trainer(_dqn(1000), run_dir, resume=True)
    assert resumed.counters.env_step == 600
    assert resumed.algorithm.gradient_steps == gradient_steps
    assert len(resumed.buffer) == len(trainer.buffer)
    result = resumed.run()
    assert result.env_steps == resumed.collector.env_steps == 1000
    assert resumed.algorithm.gradient_steps == (1000 - 96) // 4
    assert not _collector_threads()


def test_mlagents_advance_and_save_model_with_the_thread(tmp_path: Path) -> None:
    trainer = make_trainer(_dqn(400), tmp_path / "run")
    for _ in range(30):
        trainer.advance()
    assert trainer.collection_thread is not None
    assert trainer.collection_thread.running
    trainer.save_model()
    # The checkpoint took what the thread had collected ahead: counters and envs agree.
    assert trainer.counters.env_step == trainer.collector.env_steps
    trainer.close()
    assert not _collector_threads()


def test_on_policy_notes_once_that_threaded_has_no_effect(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cfg = default_run_config(
        "ppo",
        "CartPole-v1",
        {"trainer": {"show_progress": False, "verbose": True, "threaded": True, "max_steps": 64}},
    )
    trainer = make_trainer(cfg, None)
    out = capsys.readouterr().out
    assert out.count("threaded: no effect on OnPolicyTrainer: an on-policy update needs") == 1
    assert trainer.threaded is False


def test_curricula_and_whole_episode_collection_keep_collection_on_the_callers_thread(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/off-policy.md: environment parameters (curricula) and collection steps of whole
    episodes keep collection on the caller's thread, with the same note, and the run trains."""
    cfg = _dqn(200, {"verbose": True})
    cfg.environment_parameters = {"masspole": EnvironmentParameterSettings.constant(0.2)}
    curriculum = make_trainer(cfg, None)
    note = "threaded: no effect on OffPolicyTrainer: environment parameters change the envs"
    assert capsys.readouterr().out.count(note) == 1
    assert curriculum.collects_on_thread is False
    assert curriculum.run().env_steps >= 200
    curriculum.close()
    plain = make_trainer(_dqn(200), None)  # quiet: its own note is the one above
    episodes = OffPolicyTrainer(
        plain.algorithm, plain.train_envs, None, cfg.trainer, collection_step_num_episodes=2,
        seed=1,
    )  # fmt: skip
    note = "threaded: no effect on OffPolicyTrainer: collection steps of whole episodes vary"
    assert capsys.readouterr().out.count(note) == 1
    assert episodes.collects_on_thread is False
    assert episodes.run().env_steps >= 200
    episodes.close()
    assert not _collector_threads()


@pytest.mark.slow
def test_threaded_sac_learns_pendulum() -> None:
    # The unthreaded SAC test asks -250 at this budget; the threaded run gets a margin, as
    # its weights lag by a gradient step and its trajectory differs across numerics.
    cfg = default_run_config(
        "sac",
        "Pendulum-v1",
        {
            "seed": 0,
            "trainer": {**QUIET, "max_steps": 8000, "target_reward": -300, "threaded": True},
        },
    )
    result = make_trainer(cfg, None).run()
    assert result.best_score >= -300, result


@pytest.mark.slow
def test_threaded_dqn_learns_cartpole() -> None:
    # Half the preset's budget, stopping at the bar: run to 24k steps, seed 0's best test step
    # reached 280-290 under the default numerics, MKL_CBWR=AVX2 or COMPATIBLE and
    # ATEN_CPU_CAPABILITY=default (random play: about 22); tests/algos/test_dqn.py trains the
    # preset on to 475 without the thread.
    cfg = default_run_config(
        "dqn",
        "CartPole-v1",
        {
            "seed": 0,
            "trainer": {**QUIET, "target_reward": 200, "threaded": True, "max_steps": 24_000},
        },
    )
    result = make_trainer(cfg, None).run()
    assert result.best_score >= 200, result


def test_auto_threads_leave_the_collector_thread_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rlfleet.train.loop.available_cores", lambda: 4)
    threaded = make_trainer(_dqn(64), None)
    plain = make_trainer(_dqn(64, {"threaded": False}), None)
    try:
        assert threaded.collects_on_thread
        assert threaded.cores_for_learning() == 3
        assert plain.cores_for_learning() == 4
    finally:
        threaded.close()
        plain.close()
