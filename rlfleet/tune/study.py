"""A study: its settings, its storage, the worker loop, parallel workers, and resuming.

Layout of a study directory (``studies/<study>/`` unless ``study_dir`` says otherwise)::

    study.db               the Optuna storage (SQLite, unless --storage names a database)
    study.db.claim-lock    held while a worker claims or fails a trial (SQLite storage only)
    search_space.yaml      the resolved search space of the latest invocation
    trials/0007/seed-0/    trial 7's run directory for seed 0 (a normal rlfleet run)
    best.yaml              the best trial's run config: `rlfleet train best.yaml`
    trials.parquet         one row per trial: state, value, seed scores, parameters, ...
    plots/                 optimization_history.png, param_importances.png

How exactly ``trials`` trials run, however many workers share the study: preparing a study
queues one empty trial (state WAITING) for each trial still missing, and a worker only
ever takes a queued trial — claiming it is a WAITING → RUNNING transition in the
database that only one worker can make (under the row lock of PostgreSQL or MySQL; with
SQLite, which has none, under an ``fcntl.flock`` on ``study.db.claim-lock`` beside the
file) — and never creates one. The sampler chooses a queued trial's parameters when a
worker claims it. Workers leave once nothing is queued or running.

How a study resumes: a queued trial stays queued across an interruption. A running trial
whose worker is stopped by Ctrl-C is failed and its parameters are queued again at once; a
trial whose worker was killed or lost stops recording its heartbeat, and ``3 x
heartbeat_interval`` seconds later any worker fails it and queues its parameters again.
Rerunning the same command picks all of this up; a larger ``--trials`` queues more trials.
A retried trial keeps a ``rlfleet:retry_of`` attribute naming the one it replaces, and the
replaced one no longer counts toward the total.

A study remembers the settings that make its trials comparable (algorithm, env, seeds,
scoring, the base run config with its budget); resuming it with different ones is refused.
The search space may change between invocations.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfleet.algos.registry import get_algorithm
from rlfleet.config.loader import dump_yaml, load_yaml, merge, validate
from rlfleet.envs.make import make_vec_env
from rlfleet.errors import ConfigError, MissingDependencyError, RlfleetError, StorageError, option
from rlfleet.runs.config import (
    RunConfig,
    default_run_config,
    run_config_from_dict,
    run_config_to_dict,
)
from rlfleet.tune import attrs
from rlfleet.tune.objective import TrialPlan
from rlfleet.tune.report import TrialLog, TuneResult, counted_trials, finish_study
from rlfleet.tune.setup import StudySetup, TuneConfig
from rlfleet.tune.space import load_search_space
from rlfleet.tune.storage import mask_url, open_storage, sqlite_claim_lock, sqlite_url

_log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import optuna

GRACE_PERIODS = 3
"""Heartbeat intervals without a heartbeat before a running trial counts as lost."""
_IDLE_POLL_S = 1.0
"""Seconds between looks at the study while only other workers' trials are running."""
_SETUP_WAIT_S = 2.0
"""Seconds to wait for the settings of a study another process is creating right now."""
_QUIET_TRAINER_KEYS = ("show_progress", "verbose", "tensorboard")
"""Trainer settings that do not change results, left out of the study's identity."""


def tune(algo: str, env_id: str, config: TuneConfig | None = None) -> TuneResult:
    """Search hyperparameters of ``algo`` on ``env_id``; returns where the results are.

    Validates everything first (run config, env, search space, storage), then runs the
    study's missing trials in ``config.jobs`` worker processes (in this process when 1),
    and writes ``best.yaml``, ``trials.parquet`` and the plots to the study directory.

    Raises:
        ConfigError, EnvSpecError, StorageError, MissingDependencyError: bad input, before
            any trial starts.
        KeyboardInterrupt: interrupted; running trials are queued again, so rerunning the
            same call resumes the study.
    """
    config = validate(TuneConfig, config or TuneConfig(), "tune")
    with _readable_storage(config):
        setup = prepare_study(algo, env_id, config)
        deadline = None if config.timeout is None else time.time() + config.timeout
        if config.jobs == 1:
            run_worker(setup, deadline)
        else:
            _run_worker_processes(setup, deadline)
        return finish_study(setup.study_name, _open(setup), setup.study_dir, config.trials)


@contextmanager
def _readable_storage(config: TuneConfig) -> Iterator[None]:
    """Optuna keeps study and trial attributes as JSON text in its storage; one that was
    changed outside Optuna (a corrupted ``study.db``) fails to parse wherever it is read.
    That is a StorageError naming the storage, not a traceback."""
    try:
        yield
    except json.JSONDecodeError as err:
        if config.storage:
            where = mask_url(config.storage)
        elif config.study_dir is not None:
            where = str(config.study_dir / "study.db")
        else:
            where = "the study's study.db"
        raise StorageError(
            f"{where}: a study or trial attribute is not valid JSON ({err}); the storage was "
            f"changed outside Optuna — restore it, or start a new study with "
            f"{option('study', 'NAME')}"
        ) from None


# ------------------------------------------------------------------ preparing
def prepare_study(algo: str, env_id: str, config: TuneConfig) -> StudySetup:
    """Validate the inputs, create or load the study and queue its missing trials.

    Raises:
        MissingDependencyError: optuna is not installed.
    """
    try:
        import optuna
    except ImportError as err:
        raise MissingDependencyError(
            "hyperparameter tuning needs optuna: pip install 'rlfleet[optuna]'"
        ) from err

    base = _base_run_config(algo, env_id, config)
    # Built the way training builds it, so a bad env id fails here and not in every trial.
    make_vec_env(base.env.id, 1, mode=base.env.vector_mode, env_kwargs=base.env.kwargs).close()
    space = load_search_space(base, config.search_space)
    if not space.searched:
        raise ConfigError(f"{space.source}: nothing to search, every entry is a fixed value")
    name = config.study or f"{base.algo}-{base.env.id.replace('/', '-').replace(':', '-')}"
    study_dir = config.study_dir or Path("studies") / name
    if config.storage is None:
        study_dir.mkdir(parents=True, exist_ok=True)
    url = config.storage or sqlite_url(study_dir / "study.db")
    plan = TrialPlan(
        base=base,
        space=space,
        seeds=config.seeds,
        first_seed=config.seed,
        score=config.score,
        aggregate=config.aggregate,
        trials_dir=study_dir / "trials",
    )
    setup = StudySetup(name, url, study_dir, plan, config)
    storage = _open(setup)
    # One line per finished trial (TrialLog) replaces Optuna's own per-trial log lines.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    identity = _study_identity(plan)
    try:
        study = optuna.create_study(
            study_name=name, storage=storage, direction="maximize", load_if_exists=False
        )
        study.set_user_attr(attrs.SETUP, identity)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage)
        _check_same_setup(study, identity, url)
    study_dir.mkdir(parents=True, exist_ok=True)
    dump_yaml(space.to_dict(), study_dir / "search_space.yaml")
    _fail_stale_trials(study, url)
    counted = len(counted_trials(study.get_trials(deepcopy=False)))
    for _ in range(config.trials - counted):
        study.enqueue_trial({})
    if config.verbose:
        TrialLog().start(setup, mask_url(url), queued=max(config.trials - counted, 0))
    return setup


def _base_run_config(algo: str, env_id: str, config: TuneConfig) -> RunConfig:
    """The run config trials start from: --config, or the preset (adapted to an env it does
    not name, unless ``adapt_defaults`` is off), then the budget flags."""
    overrides: dict[str, Any] = {"env": {"id": env_id}, "trainer": {}}
    budget = {
        "max_steps": config.max_steps,
        "epoch_num_steps": config.epoch_num_steps,
        "test_step_num_episodes": config.test_episodes,
    }
    overrides["trainer"] = {key: value for key, value in budget.items() if value is not None}
    if config.num_envs is not None:
        overrides["env"]["num_envs"] = config.num_envs
    if config.config is None:
        adapt = {"adapt_defaults": config.adapt_defaults}
        return default_run_config(algo, env_id, {**overrides, **adapt}, adapt=True)
    data = load_yaml(config.config)
    base = run_config_from_dict(data, str(config.config))
    if base.algo != get_algorithm(algo).name:
        raise ConfigError(f"{config.config} is a {base.algo} run config, not {algo}")
    return run_config_from_dict(merge(data, overrides), str(config.config))


def _study_identity(plan: TrialPlan) -> dict[str, Any]:
    base = run_config_to_dict(plan.base)
    for key in _QUIET_TRAINER_KEYS:
        base["trainer"].pop(key, None)
    identity = {
        "seeds": plan.seeds,
        "seed": plan.first_seed,
        "score": plan.score,
        "aggregate": plan.aggregate,
        "run_config": base,
    }
    # The JSON round trip makes it compare equal to what the storage gives back.
    loaded: dict[str, Any] = json.loads(json.dumps(identity))
    return loaded


def _check_same_setup(study: optuna.Study, identity: dict[str, Any], url: str) -> None:
    stored = study.user_attrs.get(attrs.SETUP)
    if stored is None:
        # Another machine may have created the study an instant ago and not yet stored its
        # settings.
        time.sleep(_SETUP_WAIT_S)
        stored = study.user_attrs.get(attrs.SETUP)
    if stored is None:
        raise ConfigError(
            f"study {study.study_name!r} in {mask_url(url)} was not created by rlfleet tune; "
            f"choose another {option('study', None)} name"
        )
    differences = _differences(stored, identity)
    if differences:
        shown = "; ".join(f"{key}: study has {a!r}, asked {b!r}" for key, a, b in differences[:4])
        raise ConfigError(
            f"study {study.study_name!r} was created with other settings ({shown}); resume it "
            f"with its original settings, or start a new study with {option('study', 'NAME')}"
        )


def _differences(a: Any, b: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return [
            diff
            for key in sorted(set(a) | set(b))
            for diff in _differences(a.get(key), b.get(key), f"{prefix}{key}.")
        ]
    return [] if a == b else [(prefix.rstrip("."), a, b)]


# -------------------------------------------------------------------- workers
def run_worker(setup: StudySetup, deadline: float | None = None) -> None:
    """Run queued trials of the study until none is queued or running, or ``deadline``.

    Raises:
        KeyboardInterrupt: after failing the running trial and queueing it again.
    """
    import optuna

    # One line per finished trial (TrialLog) replaces Optuna's own per-trial log lines.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = _open(setup)
    study = optuna.load_study(
        study_name=setup.study_name,
        storage=storage,
        pruner=_pruner(setup.config, setup.plan.base.trainer.max_steps),
    )
    study_id: int = storage.get_study_id_from_name(setup.study_name)
    log = TrialLog() if setup.config.verbose else None
    while deadline is None or time.time() < deadline:
        _fail_stale_trials(study, setup.storage_url)
        claimed = _claim_queued_trial(study, storage, study_id)
        if claimed is None:
            running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            if not running:
                return
            # Another worker's trial is running: wait, in case its worker is lost and the
            # trial is queued again.
            time.sleep(_IDLE_POLL_S)
            continue
        number, trial_id = claimed
        study.sampler = _sampler(setup.config, number)
        frozen = _run_trial(setup, study, storage, optuna.Trial(study, trial_id), trial_id)
        if log is not None:
            log.trial(frozen, counted_trials(study.get_trials(deepcopy=False)), setup)


def _run_trial(
    setup: StudySetup,
    study: optuna.Study,
    storage: optuna.storages.RDBStorage,
    trial: optuna.Trial,
    trial_id: int,
) -> optuna.trial.FrozenTrial:
    import optuna

    trial.set_user_attr(attrs.WORKER, f"{socket.gethostname()}:{os.getpid()}")
    value: float | None = None
    state = optuna.trial.TrialState.COMPLETE
    with _Heartbeat(storage, trial_id, setup.config.heartbeat_interval):
        try:
            value = setup.plan.run(trial)
        except optuna.TrialPruned:
            state = optuna.trial.TrialState.PRUNED
        except KeyboardInterrupt:
            _requeue(study, study.tell(trial, state=optuna.trial.TrialState.FAIL))
            raise
        except optuna.exceptions.UpdateFinishedTrialError:
            # Another worker failed it as stale while it ran (see below) and queued its
            # parameters again: the retry counts, and this worker goes on.
            return storage.get_trial(trial_id)
        except Exception as err:
            # Any error of one trial (NaN loss, a sampled config the algorithm refuses, ...)
            # fails that trial only; its traceback is kept next to its runs.
            trial.set_user_attr(attrs.ERROR, f"{type(err).__name__}: {err}")
            trial_dir = setup.plan.trials_dir / f"{trial.number:04d}"
            trial_dir.mkdir(parents=True, exist_ok=True)
            (trial_dir / "error.txt").write_text(traceback.format_exc())
            state = optuna.trial.TrialState.FAIL
    try:
        if state == optuna.trial.TrialState.COMPLETE:
            return study.tell(trial, value, skip_if_finished=True)
        return study.tell(trial, state=state, skip_if_finished=True)
    except optuna.exceptions.UpdateFinishedTrialError:
        # Its heartbeat went missing long enough (a starved machine) that another worker
        # failed it as stale and queued its parameters again: the retry counts, not this.
        return storage.get_trial(trial_id)


def _claim_queued_trial(
    study: optuna.Study, storage: optuna.storages.RDBStorage, study_id: int
) -> tuple[int, int] | None:
    """Take one queued trial for this worker: its number and storage id, or None when
    nothing is queued.

    Unlike ``Study.ask``, never creates a trial, so workers together run exactly the
    queued number.
    """
    import optuna

    # Listed through the study, whose storage cache must know a trial before the trial can
    # record parameters.
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    for frozen in waiting:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
        # A heartbeat before the claim, so that a worker killed right after claiming still
        # leaves a trial that goes stale (trials without any heartbeat never do).
        storage.record_heartbeat(trial_id)
        try:
            with sqlite_claim_lock(storage.url):
                claimed = storage.set_trial_state_values(
                    trial_id, state=optuna.trial.TrialState.RUNNING
                )
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        if claimed:
            return frozen.number, trial_id
    return None


def _requeue(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """Queue an interrupted or lost trial's parameters again as a new trial."""
    study.enqueue_trial(trial.params, user_attrs={attrs.RETRY_OF: trial.number})


def _fail_stale_trials(study: optuna.Study, url: str) -> None:
    """Fail the study's running trials whose heartbeat went missing, and queue each again.

    Optuna reads a trial's state, then writes FAIL; on SQLite two workers could both fail
    the same trial and both queue a retry, so this holds the claim lock too.
    """
    import optuna

    with sqlite_claim_lock(url), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _open(setup: StudySetup) -> optuna.storages.RDBStorage:
    interval = setup.config.heartbeat_interval
    return open_storage(
        setup.storage_url,
        heartbeat_interval=interval,
        grace_period=GRACE_PERIODS * interval,
        stale_trial_callback=_requeue,
    )


def sampler_seed(study_seed: int, trial_number: int) -> int:
    """The seed of the sampler that draws trial ``trial_number``'s parameters: a stream of
    its own per trial, whichever worker runs it."""
    return int(np.random.SeedSequence([study_seed, trial_number]).generate_state(1)[0])


def _sampler(config: TuneConfig, trial_number: int) -> optuna.samplers.BaseSampler:
    """The sampler that draws trial ``trial_number``'s parameters, seeded by the study seed
    and the trial number (:func:`sampler_seed`): parallel and resumed workers never draw
    from the same stream, and a trial's draw depends only on the seed and the trials before
    it."""
    import optuna

    seed = sampler_seed(config.seed, trial_number)
    if config.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # constant_liar: running trials count as bad guesses, so parallel workers spread out.
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def _pruner(config: TuneConfig, max_steps: int) -> optuna.pruners.BasePruner:
    import optuna

    if config.pruner == "median":
        warmup = max_steps // 3 if config.prune_warmup_steps is None else config.prune_warmup_steps
        return optuna.pruners.MedianPruner(
            n_startup_trials=config.prune_startup_trials, n_warmup_steps=warmup
        )
    if config.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


class _Heartbeat:
    """Records a running trial's heartbeat every ``interval`` seconds in a thread, so other
    workers can tell a trial that is running from one whose worker is gone."""

    def __init__(self, storage: optuna.storages.RDBStorage, trial_id: int, interval: int) -> None:
        self._storage = storage
        self._trial_id = trial_id
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="rlfleet-heartbeat", daemon=True)

    def __enter__(self) -> None:
        self._thread.start()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while True:
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception as err:
                # A database that is briefly busy or unreachable must not end the beating:
                # a silent trial would go stale and run twice. The next beat tries again.
                _log.warning("trial heartbeat not recorded (%s: %s)", type(err).__name__, err)
            if self._stop.wait(self._interval):
                return


def _run_worker_processes(setup: StudySetup, deadline: float | None) -> None:
    """Run ``setup.config.jobs`` workers as new processes and wait for them."""
    # spawn, not fork: a forked child would inherit torch's thread pools and open database
    # connections of this process.
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(
            target=_worker_process, args=(setup, index, deadline), name=f"rlfleet-tune-{index}"
        )
        for index in range(setup.config.jobs)
    ]
    for process in processes:
        process.start()
    try:
        for process in processes:
            process.join()
    except KeyboardInterrupt:
        # Ctrl-C reaches the workers too when they share the terminal; signal them anyway in
        # case only this process was interrupted, so each re-queues its running trial.
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGINT)
        for process in processes:
            process.join()
        raise


def _worker_process(setup: StudySetup, worker: int, deadline: float | None) -> None:
    """Entry point of a worker process: errors become one line and an exit code."""
    from rich.console import Console

    try:
        run_worker(setup, deadline)
    except RlfleetError as err:
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"[bold red]worker {worker} error:[/] {err}"
        )
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
