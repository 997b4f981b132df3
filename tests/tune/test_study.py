"""Studies end to end on a tiny budget: pruning, failures, outputs, parallel workers, resume.

Trials train PPO on ``TuneScore-v0`` (tests/tune/envs.py), whose return is set by an env
argument the search space chooses: a trial is good (return 5), bad (0) or broken (a NaN
reward) by construction, so pruning and failures do not hang on what PPO learns in a few
hundred steps.
"""

from __future__ import annotations

import importlib.util
import math
import multiprocessing
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
import types
from pathlib import Path
from typing import Any

import optuna
import pyarrow.parquet as pq
import pytest
import yaml

from rlfleet.cli.main import main
from rlfleet.errors import ConfigError, EnvSpecError, MissingDependencyError, StorageError
from rlfleet.runs.config import load_run_config
from rlfleet.tune import TuneConfig, tune
from rlfleet.tune.objective import TrialPlan
from rlfleet.tune.storage import mask_url, open_storage, sqlite_url
from rlfleet.tune.study import (
    _base_run_config,
    _claim_queued_trial,
    _fail_stale_trials,
    _Heartbeat,
    _requeue,
    _sampler,
    sampler_seed,
)
from tests.processes import python_module
from tests.tune.envs import ENV_ID

REPO = Path(__file__).resolve().parents[2]
GOOD, BAD, BROKEN = {"reward": 1.0}, {"reward": 0.0}, {"reward": math.nan}


def _space(tmp: Path, outcomes: list[dict[str, float]]) -> Path:
    path = tmp / "space.yaml"
    space = {
        "extend_default": False,
        "hyperparameters": {
            "learning_rate": {"low": 1e-4, "high": 1e-3, "log": True},
            "num_steps": 32,
            "batch_size": 64,
            "num_epochs": 2,
            "hidden_sizes": [16, 16],
        },
        "env": {"kwargs": {"choices": outcomes}, "num_test_envs": 2},
    }
    path.write_text(yaml.safe_dump(space))
    return path


def _flags(tmp: Path, outcomes: list[dict[str, float]], **flags: Any) -> list[str]:
    """CLI flags of a tiny study in ``tmp/study``."""
    settings: dict[str, Any] = {
        "seeds": 1,
        "max-steps": 512,
        "epoch-num-steps": 128,
        "test-episodes": 2,
        "num-envs": 4,
        "study-dir": tmp / "study",
        "search-space": _space(tmp, outcomes),
        "heartbeat-interval": 1,
        "pruner": "none",
        **flags,
    }
    return [f"--{key}={value}" for key, value in settings.items()]


def _config(tmp: Path, outcomes: list[dict[str, float]], **settings: Any) -> TuneConfig:
    return TuneConfig(
        **{
            "seeds": 1,
            "max_steps": 512,
            "epoch_num_steps": 128,
            "test_episodes": 2,
            "num_envs": 4,
            "study_dir": tmp / "study",
            "search_space": _space(tmp, outcomes),
            "heartbeat_interval": 1,
            "pruner": "none",
            "verbose": False,
            **settings,
        }
    )


def _rows(study_dir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(study_dir / "trials.parquet").to_pylist()
    return rows


# ------------------------------------------------------------- a tiny study
@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight trials of two seeds through the CLI, median pruning from the second trial."""
    tmp = tmp_path_factory.mktemp("tiny")
    flags = _flags(
        tmp,
        [GOOD, BAD, BROKEN],
        trials=8,
        seeds=2,
        pruner="median",
        **{"prune-startup-trials": 1, "prune-warmup-steps": 0},
    )
    assert main(["tune", "ppo", "--env", ENV_ID, *flags]) == 0
    return tmp / "study"


def test_tiny_study_completes_prunes_and_survives_a_crashing_trial(tiny_study: Path) -> None:
    rows = _rows(tiny_study)
    states = [row["state"] for row in rows]
    assert len(rows) == 8
    assert set(states) == {"COMPLETE", "PRUNED", "FAIL"}
    for row in rows:
        reward = row["params/env.kwargs"]
        if row["state"] == "FAIL":  # the NaN reward: failed, and the study went on
            assert reward == "{reward: .nan}"
            assert row["error"].startswith("NonFiniteError")
            assert (Path(row["run_dir"]) / "error.txt").is_file()
        if row["state"] == "PRUNED":  # worse than the median at its first test step
            assert reward == "{reward: 0.0}"
            assert row["last_step"] == 128
        if row["state"] == "COMPLETE":
            assert len(row["seed_scores"]) == 2
            # Seed 1's last test step is reported at 1 x max_steps + its env step, 512.
            assert row["last_step"] == 2 * 512
            assert row["value"] == (5.0 if reward == "{reward: 1.0}" else 0.0)


def test_trials_are_normal_run_directories(tiny_study: Path) -> None:
    for row in _rows(tiny_study):
        if row["state"] == "FAIL":
            continue
        run_dir = Path(row["run_dir"]) / "seed-0"
        assert load_run_config(run_dir).env.kwargs in (GOOD, BAD)
        assert (run_dir / "history.parquet").is_file()
        assert (run_dir / "checkpoints").is_dir()
        # a pruned run keeps the test step that pruned it in its history
        test_rows = [
            r
            for r in pq.read_table(run_dir / "history.parquet").to_pylist()
            if r["test/score"] is not None
        ]
        assert test_rows, run_dir


def test_all_trials_use_the_same_seeds(tiny_study: Path) -> None:
    # docs/tuning.md: a trial trains on seeds --seed, --seed + 1, ... (--seed: 0 here), and
    # all trials use the same seeds.
    seen = 0
    for row in _rows(tiny_study):
        if row["state"] != "COMPLETE":
            continue
        seeds = [load_run_config(Path(row["run_dir"]) / f"seed-{k}").seed for k in range(2)]
        assert seeds == [0, 1], row["run_dir"]
        seen += 1
    assert seen >= 2


def test_no_two_trials_draw_from_the_same_stream(tmp_path: Path) -> None:
    # docs/tuning.md: samplers are seeded per trial, from --seed and the trial number.
    for study_seed in (0, 1, 12345):
        seeds = {sampler_seed(study_seed, number) for number in range(10_000)}
        assert len(seeds) == 10_000
    assert sampler_seed(0, 7) == sampler_seed(0, 7)
    config = _config(tmp_path, [GOOD], sampler="random", seed=3)
    unit = optuna.distributions.FloatDistribution(0.0, 1.0)

    def draw(number: int) -> float:
        sampler = _sampler(config, number)
        return float(sampler.sample_independent(None, None, "x", unit))  # type: ignore[arg-type]

    draws = [draw(0), draw(1)]
    again = draw(0)
    assert draws[0] != draws[1]
    assert again == draws[0]


def test_study_writes_plots_and_a_best_config_that_trains(tiny_study: Path, tmp_path: Path) -> None:
    assert (tiny_study / "plots" / "optimization_history.png").stat().st_size > 0
    assert (tiny_study / "plots" / "param_importances.png").stat().st_size > 0
    best = tiny_study / "best.yaml"
    cfg = load_run_config_file(best)
    assert cfg["env"]["kwargs"] == GOOD
    assert cfg["seed"] == 0
    assert main(["train", "ppo", "--config", str(best), "--run-dir", str(tmp_path / "run")]) == 0
    trained = load_run_config(tmp_path / "run")
    assert trained.hyperparameters.learning_rate == cfg["hyperparameters"]["learning_rate"]
    assert (tmp_path / "run" / "best").is_dir()
    # best.yaml is a run config, which `rlfleet train FILE` takes as it is.
    assert main(["train", str(best), "--run-dir", str(tmp_path / "again")]) == 0
    assert load_run_config(tmp_path / "again") == trained


def load_run_config_file(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def test_rerunning_a_finished_study_runs_nothing_and_keeps_outputs(tiny_study: Path) -> None:
    before = _rows(tiny_study)
    result = tune(
        "ppo",
        ENV_ID,
        _config(
            tiny_study.parent,
            [GOOD, BAD, BROKEN],
            trials=8,
            seeds=2,
            pruner="median",
            prune_startup_trials=1,
            prune_warmup_steps=0,
        ),
    )
    assert [r["number"] for r in _rows(tiny_study)] == [r["number"] for r in before]
    assert result.complete + result.pruned + result.failed == 8
    assert result.unfinished == 0
    assert result.best_value == 5.0


# ------------------------------------------------------------------ workers
def _claim_all(url: str, start: Any, claimed: Any) -> None:
    """Claim queued trials of study ``s`` at ``url`` until none is left, starting when every
    worker is ready; put their numbers."""
    storage = open_storage(url, heartbeat_interval=60, grace_period=180)
    study = optuna.load_study(study_name="s", storage=storage)
    study_id = storage.get_study_id_from_name("s")
    numbers = []
    start.wait(timeout=120)
    while (claim := _claim_queued_trial(study, storage, study_id)) is not None:
        numbers.append(claim[0])
    claimed.put(numbers)


def _fail_stale(url: str, start: Any, done: Any) -> None:
    """Fail the stale trials of study ``s`` at ``url`` once every worker is ready."""
    storage = open_storage(url, heartbeat_interval=1, grace_period=1, stale_trial_callback=_requeue)
    study = optuna.load_study(study_name="s", storage=storage)
    start.wait(timeout=120)
    _fail_stale_trials(study, url)
    done.put(True)


def test_two_processes_queue_one_retry_of_each_lost_trial(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "study.db")
    storage = open_storage(url, heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(study_name="s", storage=storage)
    for _ in range(40):  # running trials whose worker was lost after one heartbeat
        trial_id = study.ask()._trial_id
        storage.record_heartbeat(trial_id)
    time.sleep(2.5)
    context = multiprocessing.get_context("spawn")
    start, done = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_fail_stale, args=(url, start, done)) for _ in range(2)]
    for worker in workers:
        worker.start()
    done.get(timeout=120), done.get(timeout=120)
    for worker in workers:
        worker.join(timeout=30)
    retries = [t.user_attrs.get("rlfleet:retry_of") for t in study.get_trials(deepcopy=False)]
    assert sorted(r for r in retries if r is not None) == list(range(40))


def test_two_processes_never_claim_the_same_queued_trial(tmp_path: Path) -> None:
    # Optuna reads a trial's state, then writes RUNNING; on SQLite, without rlfleet's claim
    # lock, two processes both took the same trial about five times in sixty.
    url = sqlite_url(tmp_path / "study.db")
    study = optuna.create_study(
        study_name="s", storage=open_storage(url, heartbeat_interval=60, grace_period=180)
    )
    for _ in range(60):
        study.enqueue_trial({})
    context = multiprocessing.get_context("spawn")
    start, claimed = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_claim_all, args=(url, start, claimed)) for _ in range(2)]
    for worker in workers:
        worker.start()
    first, second = claimed.get(timeout=120), claimed.get(timeout=120)
    for worker in workers:
        worker.join(timeout=30)
    assert sorted(first + second) == list(range(60))


def test_two_worker_processes_share_one_sqlite_study(tmp_path: Path) -> None:
    # A heartbeat interval a loaded machine cannot miss: no trial of this test may go stale.
    # (With 10 s, and so 30 s of grace, a trial went stale in 2 of about 6 full runs with
    # two test workers and the study's two worker processes on two cores.)
    config = _config(tmp_path, [GOOD, BAD], trials=5, jobs=2, heartbeat_interval=30)
    result = tune("ppo", ENV_ID, config)
    assert (result.complete, result.pruned, result.failed, result.unfinished) == (5, 0, 0, 0)
    rows = _rows(tmp_path / "study")
    assert sorted(r["number"] for r in rows) == [0, 1, 2, 3, 4]
    assert all(r["retry_of"] is None for r in rows)
    # each trial ran once, in its own directory, with its own draw
    assert len({r["run_dir"] for r in rows}) == 5
    assert len({r["params/learning_rate"] for r in rows}) == 5
    assert all(r["worker"] for r in rows)


def test_a_heartbeat_that_fails_once_goes_on_beating(caplog: pytest.LogCaptureFixture) -> None:
    """A busy database must not end a trial's heartbeat: a silent trial would go stale."""
    beats: list[int] = []
    third = threading.Event()

    class BusyOnce:
        def record_heartbeat(self, trial_id: int) -> None:
            beats.append(trial_id)
            if len(beats) == 1:
                raise RuntimeError("database is locked")
            if len(beats) == 3:
                third.set()

    with _Heartbeat(BusyOnce(), 7, 0):  # type: ignore[arg-type]
        assert third.wait(10)
    assert beats[:3] == [7, 7, 7]
    assert "heartbeat not recorded (RuntimeError: database is locked)" in caplog.text


def test_a_trial_failed_as_stale_while_running_does_not_stop_its_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = TrialPlan.run

    def late_heartbeat(plan: TrialPlan, trial: optuna.Trial) -> float:
        value = run(plan, trial)
        if trial.number == 0:  # what another worker does when this trial's heartbeat is late
            other = optuna.storages.RDBStorage(sqlite_url(tmp_path / "study" / "study.db"))
            other.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
            trial.study.enqueue_trial(trial.params, user_attrs={"rlfleet:retry_of": 0})
        return value

    monkeypatch.setattr(TrialPlan, "run", late_heartbeat)
    result = tune("ppo", ENV_ID, _config(tmp_path, [GOOD], trials=2))
    assert (result.complete, result.failed, result.unfinished) == (2, 0, 0)
    rows = {r["number"]: r for r in _rows(tmp_path / "study")}
    assert rows[0]["state"] == "FAIL"
    assert rows[rows[0]["retried_as"]]["state"] == "COMPLETE"


def test_a_trial_failed_as_stale_before_it_records_its_scores_does_not_stop_its_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failed by another worker while it trains: recording its seed scores then raises, and
    the worker must go on to the retry rather than die."""
    run = TrialPlan.run

    def stale_while_training(plan: TrialPlan, trial: optuna.Trial) -> float:
        if trial.number == 0:
            other = optuna.storages.RDBStorage(sqlite_url(tmp_path / "study" / "study.db"))
            other.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
            trial.study.enqueue_trial(trial.params, user_attrs={"rlfleet:retry_of": 0})
        return run(plan, trial)

    monkeypatch.setattr(TrialPlan, "run", stale_while_training)
    result = tune("ppo", ENV_ID, _config(tmp_path, [GOOD], trials=2))
    assert (result.complete, result.failed, result.unfinished) == (2, 0, 0)
    rows = {r["number"]: r for r in _rows(tmp_path / "study")}
    assert rows[0]["state"] == "FAIL"
    assert rows[rows[0]["retried_as"]]["state"] == "COMPLETE"


def _cli(tmp: Path, trials: int) -> list[str]:
    flags = _flags(tmp, [GOOD, BAD], trials=trials, **{"max-steps": 2048})
    return python_module("rlfleet.cli.main", "tune", "ppo", "--env", ENV_ID, *flags)


def _env() -> dict[str, str]:
    """The environment of a CLI subprocess: it must import this checkout's rlfleet."""
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _start_and_stop_mid_trial(tmp: Path, trials: int, running: int, sig: signal.Signals) -> int:
    """Start the study in a new process; send it ``sig`` once trial ``running`` has begun."""
    process = subprocess.Popen(
        _cli(tmp, trials), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    started = tmp / "study" / "trials" / f"{running:04d}" / "seed-0" / "config.yaml"
    deadline = time.monotonic() + 90
    while not started.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    # Checked before the signal: a Ctrl-C that lands while the trial's run is still starting
    # (its config written, the run not yet begun) removes the run directory it created.
    began = started.exists()
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=60)
    assert began, stderr.decode()
    return process.returncode


def test_an_invocation_on_a_shared_storage_writes_the_whole_study(tmp_path: Path) -> None:
    # Two machines' study dirs, one database: the second's table lists the first's trial too.
    url = sqlite_url(tmp_path / "shared.db")
    for name, trials in (("a", 1), ("b", 2)):
        (tmp_path / name).mkdir()
        tune("ppo", ENV_ID, _config(tmp_path / name, [GOOD], trials=trials, storage=url))
    assert [r["number"] for r in _rows(tmp_path / "a" / "study")] == [0]
    rows = _rows(tmp_path / "b" / "study")
    assert [r["number"] for r in rows] == [0, 1]
    assert all(r["state"] == "COMPLETE" for r in rows)
    assert Path(rows[0]["run_dir"]).is_relative_to(tmp_path / "a")


def test_after_the_timeout_no_new_trial_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/tuning.md: --timeout S: "seconds after which no new trial starts (running ones
    # finish)". The clock reads 0 until the first trial has started, then 1000.
    from rlfleet.tune import study as study_module

    readings = iter([0.0, 0.0])
    clock = types.SimpleNamespace(time=lambda: next(readings, 1000.0), sleep=time.sleep)
    monkeypatch.setattr(study_module, "time", clock)
    tune("ppo", ENV_ID, _config(tmp_path, [GOOD], trials=3, timeout=10.0))
    # The first trial ran to the end; the other two stay queued for a rerun to resume.
    assert [r["state"] for r in _rows(tmp_path / "study")] == ["COMPLETE", "WAITING", "WAITING"]


def test_no_trial_is_pruned_in_its_warmup_or_at_its_last_test_step(
    tmp_path: Path,
) -> None:
    # docs/tuning.md: --prune-warmup-steps N: "no trial is pruned at a step below N", nor at
    # its last seed's last test step. The tiny study prunes its bad trials at their first
    # test step (128) with no warm-up; with a warm-up up to the last test step (512), the same
    # trials all run to the end and complete.
    config = _config(
        tmp_path,
        [GOOD, BAD],
        trials=4,
        pruner="median",
        prune_startup_trials=1,
        prune_warmup_steps=512,
    )
    tune("ppo", ENV_ID, config)
    rows = _rows(tmp_path / "study")
    assert len(rows) == 4
    assert {r["params/env.kwargs"] for r in rows} == {"{reward: 1.0}", "{reward: 0.0}"}
    assert all(r["state"] == "COMPLETE" for r in rows)


def test_interrupted_study_resumes_to_the_requested_total(tmp_path: Path) -> None:
    # Ctrl-C: the running trial fails at once and its parameters are queued again.
    assert _start_and_stop_mid_trial(tmp_path, 4, 1, signal.SIGINT) == 130
    storage = optuna.storages.RDBStorage(sqlite_url(tmp_path / "study" / "study.db"))
    trials = optuna.load_study(study_name=f"ppo-{ENV_ID.replace(':', '-')}", storage=storage).trials
    interrupted = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert [t.number for t in interrupted] == [1]
    retry = [t for t in trials if t.user_attrs.get("rlfleet:retry_of") == 1]
    assert [t.state for t in retry] == [optuna.trial.TrialState.WAITING]

    # A killed worker leaves its trial running; the next run finds its heartbeat stale.
    # It runs the queued trials 2 and 3 before the retry, trial 4.
    assert _start_and_stop_mid_trial(tmp_path, 4, 3, signal.SIGKILL) == -signal.SIGKILL
    done = subprocess.run(_cli(tmp_path, 4), env=_env(), capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()

    rows = _rows(tmp_path / "study")
    counted = [r for r in rows if r["retried_as"] is None]
    assert len(counted) == 4
    assert all(r["state"] == "COMPLETE" for r in counted)
    replaced = [r for r in rows if r["retried_as"] is not None]
    assert len(replaced) == 2
    by_number = {r["number"]: r for r in rows}
    for row in replaced:  # a retry repeats the replaced trial's parameters
        retry_row = by_number[row["retried_as"]]
        assert retry_row["params/learning_rate"] == row["params/learning_rate"]


# ---------------------------------------------------------------- bad input
def test_unreachable_database_fails_fast(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(StorageError, match=r"cannot reach the study database at 127\.0\.0\.1:1"):
        tune(
            "ppo", ENV_ID, _config(tmp_path, [GOOD], storage="postgresql://u:secret@127.0.0.1:1/x")
        )
    assert time.monotonic() - start < 10


@pytest.mark.parametrize(
    "storage",
    [
        "postgresql://u:s3cr3tpw@127.0.0.1:1/x",  # unreachable
        "postgresql//u:s3cr3tpw@127.0.0.1/x",  # no "://"
        "postgresql://u:s3cr3tpw@127.0.0.1:port/x",  # a port that is not a number
        "postgresql://u:s3cr@3tpw@127.0.0.1:port/x",  # an "@" in the password
    ],
)
def test_password_is_not_shown(tmp_path: Path, storage: str) -> None:
    with pytest.raises((StorageError, ConfigError)) as info:
        tune("ppo", ENV_ID, _config(tmp_path, [GOOD], storage=storage))
    assert "s3cr" not in str(info.value)
    assert "3tpw" not in str(info.value)
    assert mask_url(storage).count("***") == 1


@pytest.mark.parametrize(
    ("storage", "error", "message"),
    [
        ("sqlite:////no/such/dir/study.db", StorageError, "directory /no/such/dir does not exist"),
        ("sqlite:///:memory:", ConfigError, "in-memory"),
        ("not a url", ConfigError, "expected a database URL"),
        ("nosuchdb://host/x", ConfigError, "unknown database kind 'nosuchdb'"),
    ],
)
def test_bad_storage_urls(
    tmp_path: Path, storage: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        tune("ppo", ENV_ID, _config(tmp_path, [GOOD], storage=storage))


def test_missing_database_driver_is_named(tmp_path: Path) -> None:
    if importlib.util.find_spec("psycopg2") is not None:
        pytest.skip("psycopg2 is installed; this checks the message without it")
    with socket.create_server(("127.0.0.1", 0)) as server:  # something listens at the port
        url = f"postgresql://u@127.0.0.1:{server.getsockname()[1]}/x"
        with pytest.raises(MissingDependencyError, match="pip install psycopg2-binary"):
            tune("ppo", ENV_ID, _config(tmp_path, [GOOD], storage=url))


def test_bad_search_space_fails_before_any_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    space = tmp_path / "bad.yaml"
    space.write_text("hyperparameters:\n  learnig_rate: {low: 1.0e-4, high: 1.0e-3}\n")
    study_dir = tmp_path / "study"
    code = main(
        [
            "tune",
            "ppo",
            "--env",
            ENV_ID,
            "--search-space",
            str(space),
            "--study-dir",
            str(study_dir),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown ppo hyperparameter 'learnig_rate'; did you mean 'learning_rate'?" in err
    assert len(err.strip().splitlines()) == 1
    assert not study_dir.exists()


def test_unknown_env_fails_before_any_trial(tmp_path: Path) -> None:
    with pytest.raises(EnvSpecError, match="unknown environment id"):
        tune("ppo", "CartPol-v1", _config(tmp_path, [GOOD]))


def test_resuming_with_other_settings_is_refused(tmp_path: Path) -> None:
    tune("ppo", ENV_ID, _config(tmp_path, [GOOD], trials=1))
    with pytest.raises(
        ConfigError, match=r"created with other settings.*seeds: study has 1, asked 2"
    ):
        tune("ppo", ENV_ID, _config(tmp_path, [GOOD], trials=1, seeds=2))


# -------------------------------------------------------- a corrupted storage
@pytest.mark.parametrize("table", ["study_user_attributes", "trial_user_attributes"])
def test_an_attribute_corrupted_in_study_db_is_a_storage_error(
    table: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tune("ppo", ENV_ID, _config(tmp_path, [GOOD], trials=1))
    with sqlite3.connect(tmp_path / "study" / "study.db") as db:
        db.execute(f"UPDATE {table} SET value_json = '{{broken'")
    with pytest.raises(StorageError, match=r"study\.db: a study or trial attribute is not valid"):
        tune("ppo", ENV_ID, _config(tmp_path, [GOOD], trials=2))
    assert main(["tune", "ppo", "--env", ENV_ID, *_flags(tmp_path, [GOOD], trials=2)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err


def test_trials_start_from_the_defaults_adapted_to_an_env_no_preset_names() -> None:
    adapted = _base_run_config("ppo", "MountainCar-v0", TuneConfig(max_steps=1000))
    assert adapted.hyperparameters.normalize_obs
    assert "hyperparameters.normalize_obs" in adapted.adapted
    assert adapted.trainer.max_steps == 1000
    plain = _base_run_config("ppo", "MountainCar-v0", TuneConfig(adapt_defaults=False))
    assert plain.adapted == {}
    assert not plain.hyperparameters.normalize_obs
    named = _base_run_config("ppo", "CartPole-v1", TuneConfig())
    assert named.adapted == {}


def test_each_trial_holds_its_run_directorys_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/reliability.md: each trial of ``rlfleet tune`` holds its run directory's lock
    while it trains, and releases it when done."""
    import json
    import os

    from rlfleet.runs.run_dir import LOCK_FILE
    from rlfleet.train.trainer import OnPolicyTrainer

    held: list[tuple[Path, int]] = []
    step = OnPolicyTrainer._training_step

    def checking_step(self: OnPolicyTrainer) -> Any:
        assert self.run_dir is not None
        held.append((self.run_dir, json.loads((self.run_dir / LOCK_FILE).read_text())["pid"]))
        return step(self)

    monkeypatch.setattr(OnPolicyTrainer, "_training_step", checking_step)
    assert main(["tune", "ppo", "--env", ENV_ID, *_flags(tmp_path, [GOOD], trials=2)]) == 0
    run_dirs = {run_dir for run_dir, _ in held}
    assert len(run_dirs) == 2  # one per trial (one seed each)
    assert {pid for _, pid in held} == {os.getpid()}
    assert not any((run_dir / LOCK_FILE).exists() for run_dir in run_dirs)
