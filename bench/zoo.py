"""Learning results of every registered algorithm on a fixed list of standard tasks, over
seeds, beside the figure RL-Baselines3-Zoo publishes for the same algorithm and task.

    PYTHONPATH=$PWD python bench/zoo.py                       # everything, 5 seeds
    python bench/zoo.py --algos ppo,dqn --tasks classic --budget-scale 0.1 --jobs 2
    python bench/zoo.py --ray auto                             # on the running Ray cluster
    python bench/zoo.py --algos a2c --tasks Hopper-v5 --seed-list 5-9   # five seeds more
    python bench/zoo.py --report-only                          # rebuild the page

Each run trains one algorithm on one task with rlfleet's shipped preset for that pair
(:func:`rlfleet.runs.config.default_run_config`; for a pair the presets do not name, the
generic defaults adapted to the env, :mod:`rlfleet.runs.adapt`, reported in a table of their
own) for a fixed budget of env steps, with every
stop rule but the budget off, and a greedy test step of ``--eval-episodes`` episodes every
``budget / --curve-points`` env steps. After the budget, the final policy plays
``--final-episodes`` episodes (100) on start states of their own — greedy, except on Atari,
where its actions are sampled as RL-Zoo's Atari figures were — seeded from the run
seed's ``evaluation`` stream (:func:`rlfleet.seeding.episode_seed`), so that neither the test
steps nor another seed's runs played them: the final return is their mean, a closer match to
RL-Zoo's figure (one agent over about 150k env steps) than the last test step of a few
episodes. It records that final return, the last and the best
test return (the highest test step; a maximum over noisy evaluations, so biased upward),
the wall time (without the final evaluation, timed on its own), the env steps, the
learning curve (test return against env step) and the versions of the packages that built
the env (:data:`SUITE_PACKAGES`: gymnasium, and MuJoCo, Box2D, MinAtar or the ALE).

Tasks need their envs: Box2D the ``box2d`` extra, MuJoCo the ``mujoco`` extra, Atari the
``atari`` extra, MinAtar the ``minatar`` package. A task whose env cannot be made is skipped,
and the page says why; so is an offline algorithm (it needs a dataset), and an algorithm
runs only on the tasks whose spaces it takes. The page is not written where an env that
stored runs trained on cannot be made (exit code 2; the runs stay in the results file).

Budgets: RL-Zoo's ``n_timesteps`` for the pair where the machine allows it, else a reduced
budget (the cap of the task's suite, :data:`SUITE_CAPS`); pairs RL-Zoo's table does not
list get the suite's default budget. ``--uncapped`` lifts the cap for the pairs selected (a
run that takes hours on two cores). ``--budget-scale`` shrinks every budget for a quick run.
The page says which budget each row had.

Every finished run is one row of ``bench/results/zoo.parquet``, written as soon as the run
ends; a rerun skips the runs already there (same algorithm, task, seed and budget, and the
same preset: each row stores a digest of the preset it ran with), so a killed benchmark
resumes where it stopped, and a run that was killed midway starts again from scratch. A
changed preset, or one that newly names the env, makes its pair's earlier runs stale, and so
does, for a pair without a named preset, a change of what the rules adapt for it: the page
leaves them out and lists them, and the file keeps them, so that a preset changed back makes
them current again (the next run of the pair skips them then, as any finished run).
``--rerun`` drops every row of the selected pairs before running them again (after a change
of code rather than of a preset). Runs go in parallel on this machine
(``--jobs N`` processes) or on a Ray cluster (``--ray ADDRESS``). Several ``bench/zoo.py``
commands may run side by side on one machine: each adds its rows under a file lock after
reading the file again, so none loses another's.

Screens: ``--override JSON`` trains the selected pairs with a run-config mapping merged over
the preset (``'{"hyperparameters": {"log_std_init": -1}}'``; the budget, test cadence, seed
and threads stay the zoo's) to judge a change before it goes into a preset. Its runs go to
``bench/results/screens.parquet``, keyed by the override as well, so that a screen resumes as
the zoo does, and never to the zoo's results or page: the command prints each selected pair's
screens instead (final returns, IQM with its interval, best test step, wall time), beside
the zoo's rows of the pair, and a preset comment can cite the command that reproduces them.
Once a screen's override has become the preset, a zoo run whose resolved run config
(:func:`config_digest`: preset, class defaults and the zoo's own settings) and final
evaluation equal a stored screen run's takes that run's result instead of training it again
(:func:`adopt_screens`; not under ``--rerun``, which asks for new runs): the same config
trains the same run on one machine and code. The row keeps the screen's command, commit,
machine and finish time, and names the screen's override in ``adopted_from``; like any stored
run, it stands after a change of code until ``--rerun`` of its pair.

The report (``docs/benchmarks.md``, rebuilt from the parquet; its list of what was not run
covers the whole suite, whatever the filters of the command that writes it, and names a pair
run on fewer than :data:`SEEDS` seeds) gives per
algorithm and task the interquartile mean (IQM) of the final returns over seeds with its 95%
stratified-bootstrap confidence interval, computed with rliable (Agarwal et al. 2021,
"Deep RL at the Edge of the Statistical Precipice"), beside the published figure, and
learning-curve plots (IQM over seeds at each test step, with the 95% bootstrap interval of
that IQM as the band). Beside them, what learning nothing scores on each task: uniformly
random actions and, for continuous actions, the zero action (no torque or force), each over
:data:`BASELINE_EPISODES` episodes, measured once per task and kept in
``bench/results/zoo_baselines.parquet``; the page counts, per row, the seeds whose final
return is no higher than the better of the two.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import functools
import hashlib
import json
import math
import multiprocessing
import os
import shlex
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from gymnasium import spaces
from harness import machine, package_version, rows_table, source_commit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlfleet.algos.registry import algorithm_classes
from rlfleet.collect.evaluator import Evaluator
from rlfleet.config.loader import has_named_preset, merge, preset
from rlfleet.envs.make import make_env, make_vec_env
from rlfleet.envs.probe import EnvProfile, probe_env, zero_action
from rlfleet.errors import ConfigError, EnvSpecError
from rlfleet.marl.agents import RandomAgent
from rlfleet.nn.obs import is_image_space
from rlfleet.runs.adapt import adapted_preset, lookup
from rlfleet.runs.config import RunConfig, default_run_config, run_config_to_dict
from rlfleet.runs.run import evaluate_policy, make_trainer
from rlfleet.seeding import episode_seed
from rlfleet.train.threads import torch_threads
from rlfleet.types import PolicyStep
from rlfleet.version import __version__

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "zoo.parquet"
SCREENS = "screens.parquet"
"""The screens' results (``--override``), beside the zoo's."""
RLZOO = "zoo_rlzoo.parquet"
"""``bench/zoo_rlzoo.py``'s results, beside the zoo's."""
PAGE = ROOT / "docs" / "benchmarks.md"
IMAGES = ROOT / "docs" / "images" / "zoo"
BOOTSTRAP_REPS = 2000
"""Bootstrap resamples behind each confidence interval (fixed seed: the page is repeatable)."""


@dataclass(frozen=True)
class Task:
    """One env of the benchmark."""

    env_id: str
    suite: str
    """``classic``, ``box2d``, ``mujoco``, ``minatar`` or ``atari`` (``--tasks`` takes these)."""


TASKS = (
    Task("CartPole-v1", "classic"),
    Task("MountainCar-v0", "classic"),
    Task("MountainCarContinuous-v0", "classic"),
    Task("Pendulum-v1", "classic"),
    Task("LunarLander-v3", "box2d"),
    Task("LunarLanderContinuous-v3", "box2d"),
    Task("BipedalWalker-v3", "box2d"),
    Task("Hopper-v5", "mujoco"),
    Task("HalfCheetah-v5", "mujoco"),
    Task("Walker2d-v5", "mujoco"),
    Task("Ant-v5", "mujoco"),
    Task("MinAtar/Breakout-v1", "minatar"),
    Task("MinAtar/SpaceInvaders-v1", "minatar"),
    Task("MinAtar/Freeway-v1", "minatar"),
    Task("ALE/Pong-v5", "atari"),
    Task("ALE/Breakout-v5", "atari"),
)

SUITE_PACKAGES: dict[str, tuple[str, ...]] = {
    "classic": ("gymnasium",),
    "box2d": ("gymnasium", "Box2D"),
    "mujoco": ("gymnasium", "mujoco"),
    "minatar": ("gymnasium", "MinAtar"),
    "atari": ("gymnasium", "ale-py"),
}
"""The packages that build each suite's envs: a new version of one (MuJoCo's physics, the
ALE's emulator) can change the returns of a preset that did not change."""


def env_packages(suite: str, installed: Mapping[str, str | None] | None = None) -> str:
    """The versions of the packages that build the envs of ``suite``, as ``gymnasium 1.4.0,
    mujoco 4.0.1`` (one missing: ``not installed``): those of this interpreter, or
    ``installed`` (package: version, None where missing) for another's."""
    version = package_version if installed is None else installed.get
    return ", ".join(
        f"{package} {version(package) or 'not installed'}" for package in SUITE_PACKAGES[suite]
    )


def suite_of(env_id: str) -> str:
    """The suite of the benchmark's task ``env_id``."""
    return next(task.suite for task in TASKS if task.env_id == env_id)


SEEDS = 5
"""Seeds per pair: the default of ``--seeds``, and what the page counts a pair as complete at."""

SUITE_CAPS: dict[str, int | None] = {
    "classic": None,
    "box2d": 1_000_000,
    "mujoco": 300_000,
    "minatar": 1_000_000,
    "atari": 1_000_000,
}
"""The most env steps one run of a suite gets on a two-core machine (None: no cap). Atari
steps are agent steps of 4 frames each (the v5 envs' frame skip): 1M steps are 4M frames,
a tenth of RL-Zoo's 10M steps."""
SUITE_DEFAULTS = {
    "classic": 100_000,
    "box2d": 1_000_000,
    "mujoco": 1_000_000,
    "minatar": 1_000_000,
    "atari": 10_000_000,
}
"""The budget of a pair RL-Zoo's benchmark table does not list (before the cap)."""


_TRPO_ATARI = (
    "at 100k steps a run, scaled by 0.1, its first two runs, on Pong side by side, had not "
    "finished after 25 minutes"
)
TRIED: dict[tuple[str, str], str] = {
    ("trpo", "ALE/Pong-v5"): _TRPO_ATARI,
    ("trpo", "ALE/Breakout-v5"): _TRPO_ATARI,
}
"""What was measured of a pair not run yet, added to its "Not run" entry: why a reduced
budget did not fit on a two-core machine."""


@dataclass(frozen=True)
class Published:
    """A published figure: the mean evaluation return of the trained agent."""

    mean_return: float
    budget: int
    """Env steps it was trained for (RL-Zoo's ``n_timesteps``)."""
    env_id: str
    """The env it was measured on, as the source names it (versions can differ from ours)."""


# RL-Baselines3-Zoo, benchmark.md (github.com/DLR-RM/rl-baselines3-zoo, commit 0088472b8cb6):
# "mean_reward" and "n_timesteps" of each row whose algorithm and env rlfleet runs here. One
# trained agent per row, evaluated on about 150k env steps, deterministic except on Atari.
# RL-Zoo's n_timesteps is also the budget of the pair here. MuJoCo rows are v3 envs, Box2D
# LunarLander rows v2, Atari rows NoFrameskip-v4 (no sticky actions) where ours are v5.
RL_ZOO: dict[tuple[str, str], Published] = {
    ("a2c", "CartPole-v1"): Published(500.000, 500_000, "CartPole-v1"),
    ("a2c", "MountainCar-v0"): Published(-111.263, 1_000_000, "MountainCar-v0"),
    ("a2c", "MountainCarContinuous-v0"): Published(91.166, 100_000, "MountainCarContinuous-v0"),
    ("a2c", "Pendulum-v1"): Published(-162.965, 1_000_000, "Pendulum-v1"),
    ("a2c", "LunarLander-v3"): Published(155.751, 200_000, "LunarLander-v2"),
    ("a2c", "LunarLanderContinuous-v3"): Published(84.225, 5_000_000, "LunarLanderContinuous-v2"),
    ("a2c", "BipedalWalker-v3"): Published(299.754, 5_000_000, "BipedalWalker-v3"),
    ("a2c", "Hopper-v5"): Published(733.454, 1_000_000, "Hopper-v3"),
    ("a2c", "HalfCheetah-v5"): Published(3041.174, 1_000_000, "HalfCheetah-v3"),
    ("a2c", "ALE/Pong-v5"): Published(17.292, 10_000_000, "PongNoFrameskip-v4"),
    ("a2c", "ALE/Breakout-v5"): Published(279.793, 10_000_000, "BreakoutNoFrameskip-v4"),
    ("ddpg", "MountainCarContinuous-v0"): Published(93.512, 300_000, "MountainCarContinuous-v0"),
    ("ddpg", "Pendulum-v1"): Published(-152.099, 20_000, "Pendulum-v1"),
    ("ddpg", "LunarLanderContinuous-v3"): Published(230.217, 300_000, "LunarLanderContinuous-v2"),
    ("ddpg", "BipedalWalker-v3"): Published(197.486, 1_000_000, "BipedalWalker-v3"),
    ("dqn", "CartPole-v1"): Published(500.000, 50_000, "CartPole-v1"),
    ("dqn", "MountainCar-v0"): Published(-100.849, 120_000, "MountainCar-v0"),
    ("dqn", "LunarLander-v3"): Published(154.382, 100_000, "LunarLander-v2"),
    ("dqn", "ALE/Pong-v5"): Published(20.602, 10_000_000, "PongNoFrameskip-v4"),
    ("dqn", "ALE/Breakout-v5"): Published(358.327, 10_000_000, "BreakoutNoFrameskip-v4"),
    ("ppo", "CartPole-v1"): Published(500.000, 100_000, "CartPole-v1"),
    ("ppo", "MountainCar-v0"): Published(-110.423, 1_000_000, "MountainCar-v0"),
    ("ppo", "MountainCarContinuous-v0"): Published(88.343, 20_000, "MountainCarContinuous-v0"),
    ("ppo", "Pendulum-v1"): Published(-172.225, 100_000, "Pendulum-v1"),
    ("ppo", "LunarLander-v3"): Published(242.119, 1_000_000, "LunarLander-v2"),
    ("ppo", "LunarLanderContinuous-v3"): Published(270.863, 1_000_000, "LunarLanderContinuous-v2"),
    ("ppo", "BipedalWalker-v3"): Published(213.299, 5_000_000, "BipedalWalker-v3"),
    ("ppo", "Hopper-v5"): Published(2410.435, 1_000_000, "Hopper-v3"),
    ("ppo", "HalfCheetah-v5"): Published(5819.099, 1_000_000, "HalfCheetah-v3"),
    ("ppo", "Walker2d-v5"): Published(3478.798, 1_000_000, "Walker2d-v3"),
    ("ppo", "Ant-v5"): Published(1327.158, 1_000_000, "Ant-v3"),
    ("ppo", "ALE/Pong-v5"): Published(20.989, 10_000_000, "PongNoFrameskip-v4"),
    ("ppo", "ALE/Breakout-v5"): Published(398.033, 10_000_000, "BreakoutNoFrameskip-v4"),
    ("sac", "MountainCarContinuous-v0"): Published(94.679, 50_000, "MountainCarContinuous-v0"),
    ("sac", "Pendulum-v1"): Published(-156.995, 20_000, "Pendulum-v1"),
    ("sac", "LunarLanderContinuous-v3"): Published(260.390, 500_000, "LunarLanderContinuous-v2"),
    ("sac", "BipedalWalker-v3"): Published(297.668, 500_000, "BipedalWalker-v3"),
    ("sac", "Hopper-v5"): Published(2325.547, 1_000_000, "Hopper-v3"),
    ("sac", "HalfCheetah-v5"): Published(9535.451, 1_000_000, "HalfCheetah-v3"),
    ("sac", "Walker2d-v5"): Published(3863.203, 1_000_000, "Walker2d-v3"),
    ("sac", "Ant-v5"): Published(4615.791, 1_000_000, "Ant-v3"),
    ("td3", "MountainCarContinuous-v0"): Published(93.483, 300_000, "MountainCarContinuous-v0"),
    ("td3", "Pendulum-v1"): Published(-151.855, 20_000, "Pendulum-v1"),
    ("td3", "LunarLanderContinuous-v3"): Published(207.451, 300_000, "LunarLanderContinuous-v2"),
    ("td3", "BipedalWalker-v3"): Published(305.990, 1_000_000, "BipedalWalker-v3"),
    ("td3", "Hopper-v5"): Published(3606.390, 1_000_000, "Hopper-v3"),
    ("td3", "HalfCheetah-v5"): Published(9655.666, 1_000_000, "HalfCheetah-v3"),
    ("td3", "Walker2d-v5"): Published(4717.823, 1_000_000, "Walker2d-v3"),
    ("td3", "Ant-v5"): Published(5813.274, 1_000_000, "Ant-v3"),
    ("trpo", "CartPole-v1"): Published(500.000, 100_000, "CartPole-v1"),
    ("trpo", "MountainCar-v0"): Published(-107.278, 100_000, "MountainCar-v0"),
    ("trpo", "MountainCarContinuous-v0"): Published(92.489, 50_000, "MountainCarContinuous-v0"),
    ("trpo", "Pendulum-v1"): Published(-174.631, 100_000, "Pendulum-v1"),
    ("trpo", "LunarLander-v3"): Published(133.166, 200_000, "LunarLander-v2"),
    ("trpo", "LunarLanderContinuous-v3"): Published(262.387, 200_000, "LunarLanderContinuous-v2"),
    ("trpo", "BipedalWalker-v3"): Published(182.339, 1_000_000, "BipedalWalker-v3"),
    ("trpo", "Hopper-v5"): Published(3618.386, 1_000_000, "Hopper-v3"),
    ("trpo", "HalfCheetah-v5"): Published(1785.476, 1_000_000, "HalfCheetah-v3"),
    ("trpo", "Walker2d-v5"): Published(4933.148, 1_000_000, "Walker2d-v3"),
    ("trpo", "Ant-v5"): Published(4982.301, 1_000_000, "Ant-v3"),
}


RunKey = tuple[str, str, int, int, str, str, str]
"""(algorithm, env, seed, budget, adapted settings, preset digest, screen override)."""


@functools.cache
def preset_digest(algo: str, env_id: str) -> str:
    """A digest of the shipped preset the pair trains with: the ``default`` section laid over
    by the sections that name the env (:func:`rlfleet.config.loader.preset`). A run stored
    under another digest ran with a preset that has changed since, or that did not name the
    env yet: it no longer describes what rlfleet ships for the pair."""
    text = json.dumps(preset(algo, env_id), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def config_digest(cfg: RunConfig) -> str:
    """A digest of everything a run trains with: its resolved run config (the preset, the
    class defaults, the settings adapted to the env and the zoo's own: seed, threads, budget,
    test cadence), without the record of why settings were adapted (their values are in
    their sections)."""
    data = run_config_to_dict(cfg)
    data.pop("adapted", None)
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def row_digest(row: dict[str, Any]) -> str:
    """The preset digest a stored run ran under. A row written before the column existed
    counts as the current preset's: until then, every preset change was followed by
    ``--rerun`` of its pair, and a benchmark run stamps such rows (:func:`stamp_digests`)."""
    return row.get("preset_digest") or preset_digest(row["algo"], row["env_id"])


def stamp_digests(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with the digest of their pair's current preset on every row that has none."""
    return [r if r.get("preset_digest") else {**r, "preset_digest": row_digest(r)} for r in rows]


def is_stale(row: dict[str, Any]) -> bool:
    """Whether the stored run ran with a preset other than the one shipped now or, for a
    pair without a named preset, with other adapted settings than the rules give it now."""
    if row_digest(row) != preset_digest(row["algo"], row["env_id"]):
        return True
    if is_named(row):
        return False
    current = current_adaptation(row["algo"], row["env_id"])
    return current is not None and (row.get("adapted") or "") != current


@functools.cache
def current_adaptation(algo: str, env_id: str) -> str | None:
    """The settings the generic defaults adapt for the pair now, as :func:`adapted_label`
    writes those of a run (empty for a named preset). None where this machine cannot build
    the env (an extra such as Box2D is not installed): the rules read its random-play
    profile, so its stored runs are kept as they are rather than judged (a screen's summary;
    :func:`main` writes no page then)."""
    try:
        profile = probed(env_id)
    except EnvSpecError:
        return None
    merged, record = adapted_preset(algorithm_classes()[algo], env_id, {}, profile=profile)
    return settings_label(merged, record)


@functools.cache
def probed(env_id: str) -> EnvProfile:
    """The env's random-play profile (:func:`rlfleet.envs.probe.probe_env`, seeded, so the
    same each time): probed once per process, whichever algorithms read it."""
    return probe_env(env_id)


@dataclass(frozen=True)
class RunSpec:
    """One training run of the benchmark."""

    algo: str
    env_id: str
    suite: str
    seed: int
    budget: int
    """Env steps of the run."""
    budget_kind: str
    """``rl-zoo`` (RL-Zoo's n_timesteps), ``reduced`` (less than that) or ``default``
    (the suite's budget: the pair is not in RL-Zoo's table)."""
    rl_zoo_budget: int | None
    eval_episodes: int
    curve_points: int
    threads: int
    budget_scale: float
    """``--budget-scale``: the budget is this fraction of the pair's full one."""
    named_preset: bool
    """The presets name the env for the algorithm; otherwise the run has the generic
    defaults, adapted to the env (:mod:`rlfleet.runs.adapt`)."""
    adapted: str
    """The settings adapted to the env, ``name=value, ...`` (empty: none)."""
    final_episodes: int = 0
    """Episodes the final policy plays after the budget, on start states of their own (0:
    none; the final return is then the last test step's)."""
    preset_digest: str = ""
    """:func:`preset_digest` of the pair when the run was planned."""
    final_sampled: bool = False
    """The final episodes sample the policy's actions instead of taking its greedy ones:
    on Atari, as RL-Zoo evaluates there (its ``enjoy`` is deterministic "except for atari
    games")."""
    override: str = ""
    """A screen's run-config mapping merged over the preset (``--override``), as canonical
    JSON (:func:`override_text`); empty for the zoo's runs."""

    @property
    def key(self) -> RunKey:
        """What identifies a finished run in the results: a rerun skips it (a run whose
        preset or adapted settings have changed since runs again)."""
        return (
            self.algo,
            self.env_id,
            self.seed,
            self.budget,
            self.adapted,
            self.preset_digest,
            self.override,
        )

    @property
    def name(self) -> str:
        return f"{self.algo} {self.env_id} seed {self.seed} ({self.budget:,} steps)"


# ----------------------------------------------------------------------------- planning
def override_text(value: str) -> str:
    """``--override``: a JSON mapping of run-config sections, as canonical JSON (:func:`canonical`:
    one screen is one key however it was typed). Raises ``argparse.ArgumentTypeError``
    (argparse prints it) for text that is not such a mapping."""
    try:
        data = json.loads(value)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"expected a JSON mapping: {error}") from None
    if not isinstance(data, dict) or not data:
        raise argparse.ArgumentTypeError(
            f"expected a non-empty JSON mapping of config sections, got {value!r}"
        )
    return canonical(data)


def canonical(data: Any) -> str:
    """JSON with sorted keys, no spaces, and a whole number written as an integer (``-1.0`` as
    ``-1``: the config validates both to the same setting), so that a screen typed either way
    is one key."""

    def whole(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: whole(item) for key, item in value.items()}
        if isinstance(value, list):
            return [whole(item) for item in value]
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    return json.dumps(whole(data), sort_keys=True, separators=(",", ":"))


def run_overrides(spec: RunSpec) -> dict[str, Any]:
    """The overrides a run trains with: a screen's mapping (:attr:`RunSpec.override`) under the
    zoo's own (seed, threads, the budget and test cadence, every stop rule but the budget
    off), which win where both set a key."""
    trainer = {
        "max_steps": spec.budget,
        "epoch_num_steps": max(math.ceil(spec.budget / spec.curve_points), 1),
        "test_step_num_episodes": spec.eval_episodes,
        "target_reward": None,
        "test_in_training": False,
        "early_stop_patience": None,
        "show_progress": False,
        "verbose": False,
    }
    zoo_own = {"seed": spec.seed, "torch_threads": spec.threads, "trainer": trainer}
    return merge(json.loads(spec.override), zoo_own) if spec.override else zoo_own


def budget_for(
    algo: str, task: Task, scale: float, *, capped: bool = True
) -> tuple[int, str, int | None]:
    """The run's budget, what kind it is, and RL-Zoo's budget for the pair (if listed).
    ``capped=False`` (``--uncapped``): the suite's cap does not apply."""
    published = RL_ZOO.get((algo, task.env_id))
    zoo = published.budget if published is not None else None
    budget = zoo if zoo is not None else SUITE_DEFAULTS[task.suite]
    cap = SUITE_CAPS[task.suite]
    if cap is not None and capped:
        budget = min(budget, cap)
    budget = max(int(budget * scale), 1)
    if zoo is None:
        return budget, "default", None
    return budget, "rl-zoo" if budget >= zoo else "reduced", zoo


@functools.cache
def build_error(env_id: str) -> str | None:
    """Why this machine cannot build the env (a missing extra, an unregistered id), in one
    line; None where it can. Cached, as :func:`env_spaces` is: an env that fails is built
    once, not once per pair and once more for the page."""
    try:
        env_spaces(env_id)
    except Exception as error:
        return str(error).splitlines()[0]
    return None


def supports(algo_cls: type[Any], obs_space: Any, action_space: Any) -> bool:
    """Whether the algorithm takes the env's spaces (images need a CNN encoder)."""
    return (
        isinstance(action_space, algo_cls.action_spaces)
        and isinstance(obs_space, algo_cls.observation_spaces)
        and (not is_image_space(obs_space) or bool(getattr(algo_cls, "supports_images", False)))
    )


@dataclass(frozen=True)
class Pair:
    """One algorithm on one task, at the budget a run of it takes."""

    algo: str
    task: Task
    budget: int
    budget_kind: str
    rl_zoo_budget: int | None


@functools.cache
def env_spaces(env_id: str) -> tuple[Any, Any]:
    """The env's observation and action spaces (it is built once per process)."""
    env = make_env(env_id)
    spaces = env.observation_space, env.action_space
    env.close()
    return spaces


def suite_pairs(
    algos: Sequence[str] | None,
    tasks: Sequence[str] | None,
    scale: float,
    *,
    capped: bool = True,
) -> tuple[list[Pair], list[tuple[str, str, str]]]:
    """The pairs of the algorithms and tasks named (None: all of them) that a run can take,
    and (algorithm or ``*``, env id, why) of what was left out."""
    classes = algorithm_classes()
    chosen = [t for t in TASKS if tasks is None or {t.suite, t.env_id} & set(tasks)]
    pairs: list[Pair] = []
    skipped: list[tuple[str, str, str]] = []
    for task in chosen:
        why = build_error(task.env_id)
        if why is not None:
            skipped.append(("*", task.env_id, f"the env cannot be made: {why}"))
            continue
        obs_space, action_space = env_spaces(task.env_id)
        for algo in classes if algos is None else algos:
            cls = classes[algo]
            if cls.kind == "offline":
                skipped.append((algo, task.env_id, "learns offline: needs a dataset"))
            elif supports(cls, obs_space, action_space):
                pairs.append(Pair(algo, task, *budget_for(algo, task, scale, capped=capped)))
    return pairs, skipped


@dataclass(frozen=True)
class Plan:
    runs: list[RunSpec]
    skipped: list[tuple[str, str, str]]
    """(algorithm or ``*``, env id, why) of what was not run."""


def plan(args: argparse.Namespace) -> Plan:
    """The runs the filters select, and what was left out and why."""
    pairs, skipped = suite_pairs(
        args.algos, args.tasks, args.budget_scale, capped=not args.uncapped
    )
    override = args.override or ""
    runs: list[RunSpec] = []
    for pair in pairs:
        algo, env_id = pair.algo, pair.task.env_id
        named = has_named_preset(algo, env_id)
        digest = preset_digest(algo, env_id)
        # The generic defaults adapted to the env (a probe of it: a fraction of a second),
        # those the screen's override leaves to the rules; a config the override makes
        # invalid is refused here, before any run.
        cfg = default_run_config(
            algo, env_id, json.loads(override) if override else None, adapt=True
        )
        adapted = "" if named else adapted_label(cfg)
        runs += [
            RunSpec(
                algo,
                env_id,
                pair.task.suite,
                seed,
                pair.budget,
                pair.budget_kind,
                pair.rl_zoo_budget,
                args.eval_episodes,
                args.curve_points,
                args.threads,
                args.budget_scale,
                named,
                adapted,
                args.final_episodes,
                digest,
                final_sampled=pair.task.suite == "atari",
                override=override,
            )
            for seed in (range(args.seeds) if args.seed_list is None else args.seed_list)
        ]
    return Plan(runs, skipped)


# ----------------------------------------------------------------------------- one run
def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one run (a :class:`RunSpec` as a dict, so it travels to any process or Ray
    worker) and return its result row."""
    s = RunSpec(**spec)
    cfg = default_run_config(s.algo, s.env_id, run_overrides(s), adapt=True)
    steps: list[int] = []
    returns: list[float] = []

    def record(_epoch: int, env_step: int, score: float) -> None:
        steps.append(env_step)
        returns.append(score)

    start = time.perf_counter()
    # make_trainer builds the networks on the config's torch threads and the trainer trains
    # on them, as `rlfleet train` does: a row's seed is the run that
    # `rlfleet train ALGO --env ENV --seed S --torch-threads T` gives.
    trainer = make_trainer(cfg, None, test_result_fn=record)
    try:
        result = trainer.run()
        wall_s = time.perf_counter() - start
        with torch_threads(cfg.torch_threads):  # the final episodes on them too
            evaluated = final_evaluation(
                cfg, trainer.algorithm, s.final_episodes, sampled=s.final_sampled
            )
    finally:
        trainer.close()
    return {
        **asdict(s),
        "final_return": returns[-1] if evaluated is None else evaluated,
        "last_test_return": returns[-1],
        "final_eval_s": time.perf_counter() - start - wall_s,
        "best_return": max(returns),
        "best_env_step": steps[int(np.argmax(returns))],
        "env_steps": result.env_steps,
        "wall_s": wall_s,
        "test_s": result.test_time_s,
        "curve_steps": steps,
        "curve_returns": returns,
        "stop_reason": result.stop_reason,
        "config_digest": config_digest(cfg),
        "env_packages": env_packages(s.suite),  # where the run trained (a Ray worker's own)
    }


def final_evaluation(
    cfg: RunConfig, algorithm: Any, episodes: int, *, sampled: bool = False
) -> float | None:
    """The mean return of ``episodes`` episodes of the trained ``algorithm`` (greedy, or
    ``sampled`` actions) on the run's env as its test steps build it, reset from the run
    seed's ``evaluation`` stream (:func:`rlfleet.seeding.episode_seed`): start states that
    neither the test steps nor another seed's runs played. None for no episodes."""
    if not episodes:
        return None
    seed = episode_seed(cfg.seed, "evaluation")
    stats = evaluate_policy(algorithm, cfg, episodes, seed=seed, deterministic=not sampled)
    return float(stats.mean)


def adapted_label(cfg: RunConfig) -> str:
    """The settings of ``cfg`` adapted to its env, ``name=value, ...``."""
    return settings_label(cfg, cfg.adapted)


def settings_label(config: Any, keys: Iterable[str]) -> str:
    """``name=value, ...`` for the dotted ``keys`` of ``config`` (a run config or the
    sections :func:`rlfleet.runs.adapt.adapted_preset` merges)."""
    return ", ".join(f"{key.split('.')[-1]}={lookup(config, key)}" for key in keys)


# ---------------------------------------------------------------------------- baselines
BASELINE_EPISODES = 100
"""Episodes of each baseline policy on a task (as many as a run's final evaluation)."""


class ZeroAction(RandomAgent):
    """The action 0 in every dimension, clipped into the action space's bounds: no torque
    or force at all (continuous actions only)."""

    name = "zero"
    action_spaces = (spaces.Box,)

    def _build(self) -> None:
        """The one action it plays, made once."""
        assert isinstance(self.action_space, spaces.Box)  # action_spaces: Box only
        self._zero = torch.as_tensor(zero_action(self.action_space), dtype=torch.float32)

    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep:
        return PolicyStep(actions=self._zero.expand(obs.shape[0], *self._zero.shape).clone())


BASELINES: dict[str, type[RandomAgent]] = {"random play": RandomAgent, "zero action": ZeroAction}
"""What a policy that learnt nothing does: uniformly random actions, and (continuous actions
only) none at all."""


def baseline_returns(env_id: str, kind: str, episodes: int) -> list[float] | None:
    """The returns of ``episodes`` episodes of the ``kind`` baseline on the task's env, built
    as the runs' final evaluation builds it (PPO's preset for the env: the Atari wrappers, the
    number of envs) and reset from seed 0's ``evaluation`` stream; None where the baseline
    does not take the env's actions."""
    cfg = default_run_config("ppo", env_id, {"seed": 0})
    vec = make_vec_env(
        cfg.env.id,
        min(cfg.env.num_test_envs, episodes),
        mode=cfg.env.vector_mode,
        env_kwargs=cfg.env.kwargs,
        atari=cfg.env.atari.for_evaluation(),
    )
    try:
        policy_class = BASELINES[kind]
        if not isinstance(vec.single_action_space, policy_class.action_spaces):
            return None
        policy = policy_class(vec.single_observation_space, vec.single_action_space, seed=0)
        evaluator = Evaluator(vec, policy, seed=episode_seed(0, "evaluation"))
        return [float(r) for r in evaluator.run(episodes, deterministic=False).returns]
    finally:
        vec.close()


def baselines_path(results: Path) -> Path:
    """Where the baselines of the results file ``results`` are kept: beside it."""
    return results.with_name(f"{results.stem}_baselines.parquet")


def task_baselines(path: Path, env_ids: Iterable[str]) -> dict[str, dict[str, float]]:
    """The mean return of each baseline on each of ``env_ids``: measured once and kept in
    ``path`` (the envs' dynamics do not change between runs of the benchmark), measured now
    where ``path`` lacks them and the env can be made here."""
    stored = read_rows(path)
    have = {(r["env_id"], r["baseline"]) for r in stored}
    added: list[dict[str, Any]] = []
    for env_id in env_ids:
        if all((env_id, kind) in have for kind in BASELINES):
            continue
        if build_error(env_id) is not None:  # an extra this machine lacks: the page goes without
            continue
        for kind in BASELINES:
            if (env_id, kind) in have:
                continue
            returns = baseline_returns(env_id, kind, BASELINE_EPISODES)
            print(f"baseline: {kind} on {env_id}", flush=True)
            added.append(
                {
                    "env_id": env_id,
                    "baseline": kind,
                    "episodes": BASELINE_EPISODES if returns is not None else 0,
                    "mean_return": float(np.mean(returns)) if returns else None,
                    "returns": returns or [],
                    "machine": machine(),
                    "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                }
            )
    if added:
        stored = change_rows(path, lambda rows: [*rows, *added])
    result: dict[str, dict[str, float]] = {}
    for r in stored:
        if r["mean_return"] is not None:
            result.setdefault(r["env_id"], {})[r["baseline"]] = r["mean_return"]
    return result


# ----------------------------------------------------------------------------- storage
def read_rows(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist() if path.exists() else []


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace the results atomically: a benchmark killed while writing keeps the old file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(rows_table(rows), tmp)
    os.replace(tmp, path)


def change_rows(
    path: Path, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Replace the results file's rows by ``change(rows)`` and return them. Under an exclusive
    lock the file is read again first, so that benchmarks running side by side on one machine
    (each its own ``bench/zoo.py``) keep each other's rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            rows = change(read_rows(path))
            write_rows(path, rows)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return rows


def add_row(path: Path, row: dict[str, Any]) -> list[dict[str, Any]]:
    """Add one finished run to the results file and return every row it then holds."""
    return change_rows(path, lambda rows: [*rows, row])


def drop_pairs(path: Path, pairs: set[tuple[str, str]]) -> list[dict[str, Any]]:
    """Remove every row of the (algorithm, env) ``pairs`` from the results file (``--rerun``:
    their preset changed, so the earlier runs no longer describe it) and return the rest."""
    return change_rows(
        path, lambda rows: [r for r in rows if (r["algo"], r["env_id"]) not in pairs]
    )


def stamp_stored(path: Path) -> list[dict[str, Any]]:
    """Give every stored row without a digest the current one (:func:`stamp_digests`) before
    runs are added, and return the rows. Runs of an earlier preset stay: the page leaves them
    out while they are stale, and a preset changed back to theirs makes them current again."""
    return change_rows(path, stamp_digests)


def adopt_screens(specs: Sequence[RunSpec], screens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Zoo rows for the runs of ``specs`` (the zoo's, no override) that a stored screen run
    already trained: one with the same resolved config (:func:`config_digest`), final
    episodes and action sampling, as after its override became the preset. Each is the
    screen's row (its result, command, commit and finish time: what made it) under the zoo
    run's own planning fields, with the screen's override in ``adopted_from``; where several
    screens match, the last finished. Screen runs stored before rows had a config digest are
    never taken."""
    candidates: dict[tuple[str, str, int, int], list[dict[str, Any]]] = {}
    for row in screens:
        if row.get("config_digest"):
            key = (row["algo"], row["env_id"], row["seed"], row["budget"])
            candidates.setdefault(key, []).append(row)
    adopted: list[dict[str, Any]] = []
    for spec in specs:
        same_run = [
            row
            for row in candidates.get((spec.algo, spec.env_id, spec.seed, spec.budget), [])
            if row["final_episodes"] == spec.final_episodes
            and bool(row.get("final_sampled")) == spec.final_sampled
        ]
        if not same_run:
            continue
        cfg = default_run_config(spec.algo, spec.env_id, run_overrides(spec), adapt=True)
        digest = config_digest(cfg)
        matches = [row for row in same_run if row["config_digest"] == digest]
        if matches:
            screen = max(matches, key=lambda row: str(row.get("finished") or ""))
            adopted.append({**screen, **asdict(spec), "adopted_from": screen["override"]})
    return adopted


def row_key(row: dict[str, Any]) -> RunKey:
    return (
        row["algo"],
        row["env_id"],
        row["seed"],
        row["budget"],
        row.get("adapted") or "",
        row_digest(row),
        canonical(json.loads(row["override"])) if row.get("override") else "",
    )


# ----------------------------------------------------------------------------- execution
Outcome = tuple[RunSpec, dict[str, Any] | BaseException]


def run_serially(specs: Sequence[RunSpec]) -> Iterator[Outcome]:
    for spec in specs:
        try:
            yield spec, run_one(asdict(spec))
        except Exception as error:
            yield spec, error


def exit_with_parent(parent: int) -> None:
    """A worker's initializer: end the worker once the zoo process ``parent`` is gone. A zoo
    stopped by a signal ends at once, and its workers would go on training runs whose rows
    no one writes, beside whatever runs next."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="zoo-parent-watch", daemon=True).start()


def run_in_processes(specs: Sequence[RunSpec], jobs: int) -> Iterator[Outcome]:
    """``jobs`` fresh worker processes (spawned: no torch state is forked), results as they
    finish; the workers end with the zoo process (:func:`exit_with_parent`)."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        jobs, mp_context=context, initializer=exit_with_parent, initargs=(os.getpid(),)
    ) as pool:
        futures = {pool.submit(run_one, asdict(spec)): spec for spec in specs}
        for future in concurrent.futures.as_completed(futures):
            error = future.exception()
            yield futures[future], future.result() if error is None else error


def run_on_ray(specs: Sequence[RunSpec], address: str, threads: int) -> Iterator[Outcome]:
    """One Ray task per run on the cluster at ``address``, each asking for ``threads`` CPUs
    (its torch threads)."""
    import ray  # optional dependency (the ``ray`` extra): imported only when asked for

    ray.init(address=address, ignore_reinit_error=True)
    remote = ray.remote(num_cpus=threads)(run_one)
    pending = {remote.remote(asdict(spec)): spec for spec in specs}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        spec = pending.pop(done[0])
        try:
            yield spec, ray.get(done[0])
        except Exception as error:
            yield spec, error


def execute(
    specs: Sequence[RunSpec],
    rows: list[dict[str, Any]],
    store: Path,
    args: argparse.Namespace,
    command: str,
) -> list[str]:
    """Run ``specs``, adding each finished run to ``rows`` and to the results file ``store`` at
    once; returns the failures. ``command``: the command line, stored with each run."""
    concurrent_runs = 1 if args.ray is None else 0
    where = machine() if args.ray is None else f"the Ray cluster at {args.ray}"
    commit_here = source_commit()
    outcomes: Iterable[Outcome]
    if args.ray is not None:
        outcomes = run_on_ray(specs, args.ray, args.threads)
    elif args.jobs > 1:
        outcomes = run_in_processes(specs, args.jobs)
        concurrent_runs = args.jobs
    else:
        outcomes = run_serially(specs)
    failures: list[str] = []
    for done, (spec, outcome) in enumerate(outcomes, 1):
        if isinstance(outcome, BaseException):
            text = "".join(traceback.format_exception_only(type(outcome), outcome)).strip()
            failures.append(f"{spec.name}: {text}")
            print(f"[{done}/{len(specs)}] FAILED {spec.name}: {text}", flush=True)
            continue
        outcome.update(
            finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            rlfleet=__version__,
            machine=where,
            commit=commit_here,
            concurrent_runs=concurrent_runs,
            note=args.note,
            command=command,
        )
        rows[:] = add_row(store, outcome)
        print(
            f"[{done}/{len(specs)}] {spec.name}: final {outcome['final_return']:.1f}, "
            f"best {outcome['best_return']:.1f}, {outcome['wall_s']:.0f} s",
            flush=True,
        )
    return failures


# ----------------------------------------------------------------------------- report
def env_packages_sentence(rows: Sequence[dict[str, Any]]) -> str:
    """The page's sentence on the versions of the packages that built the runs' envs, per
    suite in :data:`SUITE_PACKAGES`'s order (several sets of one suite joined by ``/``), and
    how many runs were stored before a run recorded them."""
    by_suite: dict[str, set[str]] = {}
    for row in rows:
        if row.get("env_packages"):
            by_suite.setdefault(row["suite"], set()).add(row["env_packages"])
    unrecorded = sum(1 for row in rows if not row.get("env_packages"))
    suites = [
        f"{suite}: {' / '.join(sorted(by_suite[suite]))}" for suite in SUITE_PACKAGES
        if suite in by_suite
    ]  # fmt: skip
    before = "stored before runs recorded the versions of the packages that build their envs"
    if not suites:
        return f"Env packages: not recorded (the runs were {before})."
    recorded = f"Env packages, per suite: {'; '.join(suites)}."
    if not unrecorded:
        return recorded
    return f"{recorded} Not recorded for {unrecorded} of the {len(rows)} runs ({before})."


def iqm_with_ci(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQM over runs of ``scores[runs, points]`` at each point, and its 95% interval
    ``[2, points]``, by rliable's stratified bootstrap (each point a stratum: runs are
    resampled within it)."""
    from rliable import library as rly  # optional dependency (bench extra): the report only
    from scipy import stats

    def iqm(x: np.ndarray) -> np.ndarray:
        # rliable's ``metrics.aggregate_iqm`` of one point's ``[runs, 1]`` scores is scipy's
        # 25% trimmed mean of them; taken along the runs axis, every point of a curve at once
        # (a loop over the points, once per bootstrap sample, made the page take minutes).
        return np.asarray(stats.trim_mean(x[:, 0, :], 0.25, axis=0))

    # rliable draws the resampled runs from NumPy's global generator
    # (StratifiedBootstrap.update_indices), whatever random_state says: seeded here, and
    # put back after, so the page is the same each time it is built.
    global_state = np.random.get_state()  # noqa: NPY002 (the generator rliable uses)
    np.random.seed(0)  # noqa: NPY002
    try:
        with warnings.catch_warnings():
            # arch warns that rliable passes its generator under a deprecated keyword.
            warnings.simplefilter("ignore", FutureWarning)
            point, interval = rly.get_interval_estimates(
                {"runs": scores[:, None, :]},
                iqm,
                reps=BOOTSTRAP_REPS,
                random_state=np.random.RandomState(0),
            )
    finally:
        np.random.set_state(global_state)  # noqa: NPY002
    return point["runs"], interval["runs"]


def steps_label(n: int) -> str:
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if n >= size:
            value = n / size
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return str(n)


def budget_cell(group: list[dict[str, Any]]) -> str:
    r = group[0]
    label = steps_label(r["budget"])
    taken = int(np.median([g["env_steps"] for g in group]))
    if steps_label(taken) != label:
        # Collection steps of several envs go past a budget that is not a multiple of them.
        label += f", ran {steps_label(taken)}"
    scaled = f", scaled by {r['budget_scale']:g}" if r["budget_scale"] != 1 else ""
    if r["budget_kind"] == "rl-zoo":
        return f"{label} (RL-Zoo's)"
    if r["budget_kind"] == "reduced":
        return f"{label} (**reduced**; RL-Zoo {steps_label(r['rl_zoo_budget'])}{scaled})"
    return f"{label} (suite default: not in RL-Zoo's table{scaled})"


def final_cell(group: list[dict[str, Any]]) -> str:
    """What the group's final returns are: episodes played after the budget, or the last test
    step (rows run before the final evaluation existed)."""
    kinds = sorted(
        {(int(r.get("final_episodes") or 0), bool(r.get("final_sampled"))) for r in group}
    )
    labels = [
        (
            f"{n} {'sampled ' if sampled else ''}episodes after"
            if n
            else f"last test step ({group[0]['eval_episodes']})"
        )
        for n, sampled in kinds
    ]
    return " and ".join(labels)


def published_cell(algo: str, env_id: str) -> str:
    p = RL_ZOO.get((algo, env_id))
    if p is None:
        return ""
    env = "" if p.env_id == env_id else f", {p.env_id}"
    return f"{p.mean_return:.1f} ({steps_label(p.budget)}{env})"


def margin_cell(algo: str, env_id: str, iqm: float) -> str:
    """The IQM less the published figure, signed, with enough decimals that a near-tie the
    table's rounding hides (94.65 against 94.68, both "94.7") shows its sign."""
    p = RL_ZOO.get((algo, env_id))
    if p is None:
        return ""
    return signed(iqm - p.mean_return)


def signed(margin: float) -> str:
    """A margin between two figures, signed, with two decimals where it is under 10."""
    return f"{margin:+.2f}" if abs(margin) < 10 else f"{margin:+.0f}"


Group = tuple[str, str, int, str]
"""(algorithm, env, budget, adapted settings)."""


def grouped(rows: list[dict[str, Any]]) -> dict[Group, list[dict[str, Any]]]:
    """Rows by (algorithm, env, budget, adapted settings), in the task list's order, seeds in
    order."""
    order = {t.env_id: i for i, t in enumerate(TASKS)}
    groups: dict[Group, list[dict[str, Any]]] = {}
    for r in sorted(
        rows, key=lambda r: (order.get(r["env_id"], len(order)), r["algo"], r["budget"], r["seed"])
    ):
        key = (r["algo"], r["env_id"], r["budget"], r.get("adapted") or "")
        groups.setdefault(key, []).append(r)
    return groups


def curves(group: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """The group's learning curves on one grid of env steps (the shortest run's test steps;
    the others are interpolated onto it): ``steps[points]``, ``returns[runs, points]``."""
    grid = np.asarray(min((r["curve_steps"] for r in group), key=len), dtype=np.float64)
    values = [np.interp(grid, r["curve_steps"], r["curve_returns"]) for r in group]
    return grid, np.stack(values)


def steps_on_log_scale(ends: list[float]) -> bool:
    """Whether a plot of curves that end at these env steps puts the steps on a log scale:
    where the longest run is four times the shortest or more."""
    return bool(ends) and min(ends) > 0 and max(ends) / min(ends) >= 4


def plot_task(env_id: str, groups: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """One plot of every algorithm's learning curve on ``env_id`` (``groups``: legend label ->
    the runs of one algorithm and budget)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # The legend sits below the axes, clear of the curves, and leaves the axes the figure's
    # whole width. Where the budgets differ fourfold or more, the steps are on a log scale: on
    # a linear one the short runs' curves crowd the left edge.
    fig, ax = plt.subplots(figsize=(8.0, 4.0))
    ends = []
    for label, group in groups.items():
        grid, values = curves(group)
        point, interval = iqm_with_ci(values)
        (line,) = ax.plot(grid, point, label=label)
        ax.fill_between(grid, interval[0], interval[1], color=line.get_color(), alpha=0.2)
        ends.append(float(grid[-1]))
    log_steps = steps_on_log_scale(ends)
    if log_steps:
        ax.set_xscale("log")
    ax.set_title(env_id)
    ax.set_xlabel("env steps (log scale)" if log_steps else "env steps")
    ax.set_ylabel("test return (greedy)")
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def is_named(row: dict[str, Any]) -> bool:
    """Whether the run had a named preset (rows written before the column existed: whether
    the presets name the pair now)."""
    named = row.get("named_preset")
    return has_named_preset(row["algo"], row["env_id"]) if named is None else bool(named)


def result_table(groups: dict[Group, list[dict[str, Any]]], *, adapted: bool = False) -> list[str]:
    """The lines of one results table, a row per (algorithm, task, budget); ``adapted``: with
    a column of the settings adapted to the env."""
    header = (
        "| algorithm | task | budget | seeds | final over | IQM final return [95% CI] "
        "| final, per seed | best, per seed | wall time, median | RL-Zoo published (budget) "
        "| IQM − published |"
    )
    rule = "|---|---|---|---|---|---|---|---|---|---|---|"
    if adapted:
        header += " adapted settings |"
        rule += "---|"
    lines = [header, rule]
    for (algo, env_id, _budget, settings), group in groups.items():
        point, cell = iqm_cell(r["final_return"] for r in group)
        line = (
            f"| {algo} | {env_id} | {budget_cell(group)} | {len(group)} | {final_cell(group)} | "
            f"{cell} | "
            + returns_cell(r["final_return"] for r in group)
            + " | "
            + returns_cell(r["best_return"] for r in group)
            + f" | {np.median([r['wall_s'] for r in group]):.0f} s | "
            f"{published_cell(algo, env_id)} | {margin_cell(algo, env_id, point)} |"
        )
        if adapted:
            line += f" {settings or 'none'} |"
        lines.append(line)
    return [*lines, ""]


def baseline_table(
    groups: dict[Group, list[dict[str, Any]]], baselines: dict[str, dict[str, float]]
) -> list[str]:
    """The lines of the baselines section: per task, what random play and zero action score,
    and per row of the tables the seeds whose final return is no higher than the better of
    the two."""
    lines = [
        "## Learning nothing: random play and zero action",
        "",
        "What a policy that learnt nothing scores on each task: *random play* (uniformly "
        "random actions) and, where the actions are continuous, *zero action* (the action 0 "
        "in every dimension: no torque or force at all). Each is the mean return of "
        f"{BASELINE_EPISODES} episodes on the env as the final evaluation builds it "
        "(`bench/zoo.py`; kept in `bench/results/zoo_baselines.parquet`). A seed whose final "
        "return is no higher than the better of the two learnt nothing that doing nothing "
        "or acting at random does not get: the last column counts those seeds per row of "
        "the tables above (algorithm, budget: seeds at or below, of the row's seeds).",
        "",
        "| task | random play | zero action | seeds at or below the better of the two |",
        "|---|---|---|---|",
    ]
    for env_id in dict.fromkeys(env for _, env, _, _ in groups):
        scores = baselines.get(env_id)
        if not scores:
            continue
        floor = max(scores.values())
        failing = []
        for (algo, env, budget, _settings), group in groups.items():
            below = sum(r["final_return"] <= floor for r in group)
            if env == env_id and below:
                generic = "" if is_named(group[0]) else ", generic"
                failing.append(f"{algo}{generic}, {steps_label(budget)}: {below} of {len(group)}")
        cells = [returns_cell([scores[k]]) if k in scores else "—" for k in BASELINES]
        lines.append(f"| {env_id} | {' | '.join(cells)} | {'; '.join(failing) or 'none'} |")
    return [*lines, ""]


def returns_cell(values: Iterable[float]) -> str:
    return " / ".join(f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}" for v in values)


def shown_command(command: str) -> str:
    """The command line as the page shows it: the note, quoted on the page, elided."""
    words = shlex.split(command)
    for i, word in enumerate(words[:-1]):
        if word == "--note":
            words[i + 1] = "..."
    return " ".join(words)


def rlzoo_table(rows: list[dict[str, Any]], zoo_rows: list[dict[str, Any]]) -> list[str]:
    """The page's lines for the RL-Zoo runs ``rows``: per (algorithm, task, budget), their
    final returns and IQM beside those of the zoo's current rows ``zoo_rows`` of the pair at
    that budget and the published figure. Empty for no rows."""
    if not rows:
        return []
    ours: dict[tuple[str, str, int], list[float]] = {}
    for r in zoo_rows:
        if not is_stale(r):
            ours.setdefault((r["algo"], r["env_id"], r["budget"]), []).append(r["final_return"])
    lines = [
        "## RL-Zoo's own pipeline on this machine",
        "",
        "The published figure is one agent. These rows are Stable-Baselines3 trained by "
        "RL-Zoo's own `train` with RL-Zoo's hyperparameter set for the pair (where RL-Zoo "
        "tunes only an earlier version of the env, that version's set, named in the "
        "versions column), at the budget of "
        "the pair's rlfleet row, on the same seeds, one torch thread, and evaluated as the "
        "rlfleet rows are: the mean return of the final model over episodes played after the "
        "budget, each on a start state of its own (`bench/zoo_rlzoo.py`; kept in "
        "`bench/results/zoo_rlzoo.parquet`). *rlfleet − RL-Zoo here* compares the two IQMs; "
        "wall time is the whole RL-Zoo process and is not a speed comparison.",
        "",
        "| algorithm | task | budget | seeds | final over | RL-Zoo here: IQM [95% CI] "
        "| final, per seed | rlfleet: IQM [95% CI] (seeds) | rlfleet − RL-Zoo here "
        "| RL-Zoo published (budget) | versions (RL-Zoo's set) | wall a run, median |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (algo, env_id, budget, _), group in grouped(rows).items():
        point, cell = iqm_cell(r["final_return"] for r in group)
        mine = ours.get((algo, env_id, budget), [])
        if mine:
            ours_point, ours_cell = iqm_cell(mine)
            ours_cell += f" ({len(mine)})"
            margin = signed(ours_point - point)
        else:
            ours_cell, margin = "not run", ""
        r = group[0]
        kind = "sampled " if r["final_sampled"] else ""
        # The set RL-Zoo has for an earlier version of the env, or its Atari one.
        source = r.get("hyperparams_source") or env_id
        source = "" if source == env_id else f"; {source}'s set"
        kinds = {"rl-zoo": "RL-Zoo's", "reduced": "**reduced**", "default": "suite default"}
        label = f"{steps_label(budget)} ({kinds[r['budget_kind']]})"
        lines.append(
            f"| {algo} | {env_id} | {label} | {len(group)} | {r['final_episodes']} {kind}"
            f"episodes after | {cell} | {returns_cell(g['final_return'] for g in group)} | "
            f"{ours_cell} | {margin} | {published_cell(algo, env_id)} | "
            f"{versions_cell(group)}{source} | {np.median([g['wall_s'] for g in group]):.0f} s |"
        )
    commands = sorted({r["command"] for r in rows})
    machines = sorted({r["machine"] for r in rows})
    lines += ["", f"On {'; '.join(machines)}. Produced by:", ""]
    lines += [f"- `{c}`" for c in commands]
    return [*lines, ""]


def versions_cell(group: Sequence[dict[str, Any]]) -> str:
    """The RL-Zoo table's versions of the runs ``group``: rl_zoo3's, SB3's and the env
    packages' (where stored), each distinct set once, in the order the runs come, joined by
    " / " where the runs of one row did not all have the same."""
    return " / ".join(
        dict.fromkeys(
            f"rl_zoo3 {r['rl_zoo3']}, SB3 {r['stable_baselines3']}"
            + (f"; {r['env_packages']}" if r.get("env_packages") else "")
            for r in group
        )
    )


def iqm_cell(values: Iterable[float]) -> tuple[float, str]:
    """The IQM of ``values`` over seeds, and the table's cell of it with its 95%
    stratified-bootstrap interval (:func:`iqm_with_ci`): ``IQM [low, high]``."""
    point, interval = iqm_with_ci(np.array(list(values), dtype=float)[:, None])
    return float(point[0]), f"{point[0]:.1f} [{interval[0, 0]:.1f}, {interval[1, 0]:.1f}]"


def report(
    rows: list[dict[str, Any]],
    skipped: list[tuple[str, str, str]],
    page: Path,
    images: Path,
    baselines: dict[str, dict[str, float]] | None = None,
    rlzoo_rows: list[dict[str, Any]] | None = None,
) -> str:
    """Write the page (and its plots) from the result rows; returns its text. Runs of an
    earlier preset (:func:`is_stale`) are left out of the tables and plots, and listed.
    ``baselines``: each task's baseline returns (:func:`task_baselines`), a table of their
    own with the seeds that ended at or below them. ``rlzoo_rows``: ``bench/zoo_rlzoo.py``'s
    runs of RL-Zoo's own pipeline, a table of their own (:func:`rlzoo_table`)."""
    stale = [r for r in rows if is_stale(r)]
    rows = [r for r in rows if not is_stale(r)]
    groups = grouped(rows)
    lines = [
        "# Benchmarks: learning results",
        "",
        "<!-- Generated by bench/zoo.py from bench/results/zoo.parquet: do not edit by hand;"
        " rebuild with `python bench/zoo.py --report-only`. -->",
        "",
        "Each row: one algorithm with rlfleet's shipped preset on one task (pairs without a "
        "named preset have a table of their own, below the first), trained for a "
        "fixed budget of env steps on several seeds, with greedy test steps at even "
        "intervals (their episodes and count per run are given below; protocol in "
        "`bench/zoo.py`). *Final* is the mean return of the final policy over "
        "episodes played after the budget on start states of their own (*final over*: how "
        "many; greedy, except that on Atari, as in RL-Zoo's figures, the actions are "
        "sampled), seeded apart from the test steps and from the other seeds' episodes; rows "
        "run before that evaluation existed give the last test step instead, whose start "
        "states neighbouring seeds mostly shared, so that one lucky or unlucky set of "
        "episodes moved every seed alike. *Best* is the highest test step of the run (a "
        "maximum over noisy evaluations, so biased upward). *IQM* is the interquartile "
        "mean of the final returns over seeds, with its "
        "95% stratified-bootstrap confidence interval (rliable). The published figure is "
        "RL-Baselines3-Zoo's `benchmark.md`: one trained agent (evaluated on about 150k env "
        "steps, greedy except on Atari), its training budget, and the env it was measured on "
        "where that is another version than ours. *IQM − published* is the margin by "
        "which the row reaches it (negative: a miss), signed even where the rounded figures "
        "look equal. A budget marked **reduced** is less than "
        "RL-Zoo's, so the row does not compare like with like. An algorithm appears only on "
        "the tasks whose observation and action spaces it takes.",
        "",
    ]
    if not rows:
        lines += ["No results yet: run `python bench/zoo.py`.", ""]
        lines += rlzoo_table(rlzoo_rows or [], rows)
    else:
        notes = sorted({r["note"] for r in rows if r.get("note")})
        commands = sorted({r["command"] for r in rows})
        machines = sorted({r["machine"] for r in rows})
        dates = sorted(r["finished"][:10] for r in rows)
        lengths = [len(r["curve_steps"]) for r in rows]

        def values(column: str) -> str:
            return ", ".join(str(v) for v in sorted({r[column] for r in rows}))

        # What the person who ran it said of the runs (a partial run, a shared machine) first.
        lines += [f"> **Note:** {note}" for note in notes] + ([""] if notes else [])
        lines += [
            f"Runs: {len(rows)}, finished {dates[0]} to {dates[-1]}, rlfleet "
            f"{', '.join(sorted({r['rlfleet'] for r in rows}))}, on {'; '.join(machines)}. "
            f"Test steps per run: {min(lengths)} to {max(lengths)}, of "
            f"{values('eval_episodes')} episodes each. Runs side by side: "
            f"{values('concurrent_runs')} (0: on a Ray cluster). Wall time is the whole run "
            "(env building, training, test steps); it depends on the load of the machine, "
            "the returns do not (except for actor-learner algorithms, whose policy lag "
            "does).",
            "",
            env_packages_sentence(rows),
            "",
        ]
        lines += ["Produced by:", ""] + [f"- `{shown_command(c)}`" for c in commands] + [""]
        named = {k: g for k, g in groups.items() if is_named(g[0])}
        generic = {k: g for k, g in groups.items() if not is_named(g[0])}
        lines += result_table(named) if named else ["No run had a named preset.", ""]
        if generic:
            lines += [
                "## Generic defaults, no named preset",
                "",
                "These pairs have no preset of their own in `rlfleet/config/presets`: they ran "
                "with the `default` section, adapted to what a short random-policy probe "
                "of the env measured (`rlfleet/runs/adapt.py`; the last column lists the "
                "adapted settings).",
                "",
                *result_table(generic, adapted=True),
            ]
        lines += rlzoo_table(rlzoo_rows or [], rows)
        if baselines:
            lines += baseline_table(groups, baselines)
        lines += ["## Learning curves", ""]
        lines.append(
            "Test return against env steps: the line is the IQM over seeds at each test step, "
            "the band its 95% stratified-bootstrap confidence interval (rliable); with few "
            "seeds the band is wide and the IQM is close to the mean of the middle runs. "
            "Where a task's budgets differ fourfold or more, the env steps are on a log scale."
        )
        lines.append("")
        by_task: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for (algo, env_id, budget, settings), group in groups.items():
            generic = "" if is_named(group[0]) else ", generic" + (", adapted" if settings else "")
            label = f"{algo}{generic}, {steps_label(budget)} steps ({len(group)} seeds)"
            by_task.setdefault(env_id, {})[label] = group
        for env_id, task_groups in by_task.items():
            path = images / f"{env_id.replace('/', '-')}.png"
            plot_task(env_id, task_groups, path)
            lines += [f"![{env_id}]({os.path.relpath(path, page.parent)})", ""]
    if stale:
        lines += [
            "## Runs of an earlier preset",
            "",
            "These stored runs trained with a preset that has changed since (or that did not "
            "name the env yet) or, without a named preset, with other adapted settings than "
            "the rules give the pair now, so the tables leave them out; the results file "
            "keeps them, and they count again if the pair's preset and settings return to "
            "theirs.",
            "",
        ]
        counts: dict[tuple[str, str], list[str]] = {}
        for r in stale:
            counts.setdefault((r["algo"], r["env_id"]), []).append(r["finished"][:10])
        lines += [
            f"- {algo} on {env_id}: {len(dates)} run{'s' * (len(dates) > 1)}, finished "
            f"{min(dates)} to {max(dates)}"
            for (algo, env_id), dates in counts.items()
        ]
        lines.append("")
    if skipped:
        lines += ["## Not run", ""]
        lines += [
            f"- {'every algorithm' if algo == '*' else algo} on {env_id}: {why}"
            for algo, env_id, why in skipped
        ]
        lines.append("")
    text = "\n".join(lines)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
    return text


def screen_summary(
    specs: Sequence[RunSpec], screens: list[dict[str, Any]], zoo_rows: list[dict[str, Any]]
) -> str:
    """The screen's runs of each selected pair (those of ``specs``: the same override, budget,
    preset and adapted settings), and beside them the zoo's current runs of the pair at that
    budget: a Markdown table to print."""
    lines = [
        "| pair | runs | seeds | finals | IQM [95% CI] | best test steps | wall a run |",
        "|---|---|---|---|---|---|---|",
    ]
    planned = {s.key for s in specs}
    screened = [r for r in screens if row_key(r) in planned]
    current = [r for r in zoo_rows if not r.get("override") and not is_stale(r)]
    for algo, env_id, budget in sorted({(s.algo, s.env_id, s.budget) for s in specs}):
        label = f"{algo} {env_id} {steps_label(budget)}"
        for what, source in (("screen", screened), ("zoo", current)):
            runs = sorted(
                (
                    r
                    for r in source
                    if (r["algo"], r["env_id"], r["budget"]) == (algo, env_id, budget)
                ),
                key=lambda r: int(r["seed"]),
            )
            if not runs:
                lines.append(f"| {label} | {what} | none | | | | |")
                continue
            finals = np.array([[r["final_return"]] for r in runs], dtype=float)
            iqm, ci = iqm_with_ci(finals) if len(runs) > 1 else (finals[0], None)
            interval = "" if ci is None else f" [{ci[0][0]:.1f}, {ci[1][0]:.1f}]"
            lines.append(
                f"| {label} | {what} | {', '.join(str(r['seed']) for r in runs)} | "
                f"{returns_cell(r['final_return'] for r in runs)} | {iqm[0]:.1f}{interval} | "
                f"{returns_cell(r['best_return'] for r in runs)} | "
                f"{float(np.median([r['wall_s'] for r in runs])):.0f} s |"
            )
    override = specs[0].override if specs else ""
    return "\n".join([f"screen {override}", "", *lines])


def not_run_yet(algo: str, env_id: str, budget: int) -> str:
    """The "Not run" reason of a pair with no finished run: its budget, what :data:`TRIED`
    records of it, and whether its preset's warm-up (``learning_starts``) would outlast a
    budget scaled by 0.1, the scale of the suite's reduced Atari rows."""
    notes = [f"{steps_label(budget)} env steps a run"]
    if (algo, env_id) in TRIED:
        notes.append(TRIED[algo, env_id])
    warmup = getattr(default_run_config(algo, env_id).hyperparameters, "learning_starts", 0)
    if warmup >= budget * 0.1:
        notes.append(
            f"its preset's learning_starts is {steps_label(warmup)} steps, so a budget scaled "
            "by 0.1 would end before its first update"
        )
    return f"not run yet ({'; '.join(notes)})"


def not_run(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The page's "Not run" list, of the whole suite whatever the command's filters and budget
    scale: what it leaves out and why, then every pair with no finished run of its current
    preset (the tables show only those), at the suite's budget for it, and every pair run on
    fewer than :data:`SEEDS` seeds."""
    pairs, skipped = suite_pairs(None, None, 1.0)
    seeds: dict[tuple[str, str], set[int]] = {}
    for r in rows:
        if not is_stale(r):
            seeds.setdefault((r["algo"], r["env_id"]), set()).add(int(r["seed"]))
    entries = skipped + [
        (p.algo, p.task.env_id, not_run_yet(p.algo, p.task.env_id, p.budget))
        for p in pairs
        if (p.algo, p.task.env_id) not in seeds
    ]
    # A pair stopped before its seeds were all run: its table row has fewer seeds.
    entries += [
        (algo, env_id, f"{len(ran)} of {SEEDS} seeds run")
        for (algo, env_id), ran in seeds.items()
        if len(ran) < SEEDS
    ]
    # One entry per algorithm and reason, its envs listed ("every task": all that were made).
    made = [t.env_id for t in TASKS if not any(a == "*" and e == t.env_id for a, e, _ in skipped)]
    envs: dict[tuple[str, str], list[str]] = {}
    for algo, env_id, why in entries:
        envs.setdefault((algo, why), []).append(env_id)
    return [
        (algo, "every task" if len(ids) > 1 and ids == made else ", ".join(ids), why)
        for (algo, why), ids in envs.items()
    ]


# ----------------------------------------------------------------------------- main
def names(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def seed_list(value: str) -> list[int]:
    """``--seed-list``: seeds and inclusive ranges of them, comma-separated (``5-9``,
    ``0,3,7-8``), in the order given without repeats. Raises ``argparse.ArgumentTypeError``
    (argparse prints it) for anything else."""
    seeds: dict[int, None] = {}
    for part in names(value):
        first, dash, last = part.partition("-")
        if not (first.isdigit() and (last.isdigit() if dash else True)):
            raise argparse.ArgumentTypeError(
                f"expected seeds (0 or more) and ranges such as 5-9, got {part!r}"
            )
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise argparse.ArgumentTypeError(f"expected a range low-high, got {part!r}")
        seeds.update(dict.fromkeys(range(low, high + 1)))
    if not seeds:
        raise argparse.ArgumentTypeError(f"expected at least one seed, got {value!r}")
    return list(seeds)


def unknown_tasks(tasks: Sequence[str] | None) -> str | None:
    """The ``--tasks`` error for names that are neither a task's env id nor a suite (None
    where every name is one)."""
    offered = {t.env_id for t in TASKS} | {t.suite for t in TASKS}
    unknown = sorted(set(tasks or ()) - offered)
    if not unknown:
        return None
    return f"--tasks: unknown {unknown} (expected env ids or suites: {sorted(offered)})"


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", type=names, help="comma-separated algorithms (default: all)")
    parser.add_argument(
        "--tasks",
        type=names,
        help="comma-separated env ids or suites: " + ", ".join(dict.fromkeys(SUITE_CAPS)),
    )
    which_seeds = parser.add_mutually_exclusive_group()
    which_seeds.add_argument("--seeds", type=int, default=SEEDS, help="seeds per pair (0..N-1)")
    which_seeds.add_argument(
        "--seed-list",
        type=seed_list,
        metavar="SEEDS",
        help="these seeds per pair instead, comma-separated, ranges inclusive (e.g. 5-9 or "
        "0,3,7-8): more seeds for a pair beside a run of its first ones",
    )
    parser.add_argument(
        "--budget-scale", type=float, default=1.0, help="multiply every budget (quick runs)"
    )
    parser.add_argument(
        "--uncapped",
        action="store_true",
        help="RL-Zoo's budget (or the suite's default) even where the suite's cap would reduce it",
    )
    parser.add_argument("--eval-episodes", type=int, default=10, help="episodes per test step")
    parser.add_argument(
        "--final-episodes",
        type=int,
        default=100,
        help="greedy episodes of the final policy after the budget (0: the last test step)",
    )
    parser.add_argument("--curve-points", type=int, default=20, help="test steps per run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side on this machine")
    parser.add_argument("--ray", metavar="ADDRESS", help="run on the Ray cluster at ADDRESS")
    parser.add_argument(
        "--note", default="", help="a remark stored with each run and shown on the page"
    )
    parser.add_argument(
        "--override",
        type=override_text,
        metavar="JSON",
        help="a screen: train the selected pairs with this run-config mapping merged over the "
        'preset (e.g. \'{"hyperparameters": {"log_std_init": -1}}\'); its runs go to '
        "bench/results/screens.parquet and are printed, not put on the page",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild the page only (with --override: print the screen's runs only)",
    )
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="drop every earlier run of the selected pairs first (after a change of code; "
        "runs of an earlier preset are replaced without it)",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    parser.add_argument("--page", type=Path, default=PAGE, help=argparse.SUPPRESS)
    parser.add_argument("--images", type=Path, default=IMAGES, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    unknown = sorted(set(args.algos or ()) - set(algorithm_classes()))
    if unknown:
        parser.error(f"--algos: unknown {unknown} (registered: {', '.join(algorithm_classes())})")
    if (why := unknown_tasks(args.tasks)) is not None:
        parser.error(why)
    if args.final_episodes < 0:
        parser.error(f"--final-episodes: expected 0 or more episodes, got {args.final_episodes}")
    if args.override and args.rerun:
        parser.error("--rerun: a screen keeps its runs; drop them from the screens file by hand")
    store = args.results.with_name(SCREENS) if args.override else args.results
    rows = read_rows(store)
    failures: list[str] = []
    if not args.report_only or args.override:
        try:
            the_plan = plan(args)
        except ConfigError as error:
            if not args.override:
                raise  # a shipped preset that does not load: the project's bug, not the user's
            parser.error(f"--override: {str(error).splitlines()[0]}")
    if not args.report_only:
        pairs = {(s.algo, s.env_id) for s in the_plan.runs}
        rows = drop_pairs(store, pairs) if args.rerun else stamp_stored(store)
        finished = {row_key(r) for r in rows}
        todo = [s for s in the_plan.runs if s.key not in finished]
        stored = len(the_plan.runs) - len(todo)
        screens = [] if args.override or args.rerun else read_rows(store.with_name(SCREENS))
        adopted = adopt_screens(todo, screens)
        if adopted:
            taken = {row_key(r) for r in adopted}

            def with_taken(stored_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
                # Read under the file's lock: a benchmark beside this one may have taken
                # the same screen runs already.
                have = {row_key(r) for r in stored_rows}
                return [*stored_rows, *(r for r in adopted if row_key(r) not in have)]

            rows = change_rows(store, with_taken)
            todo = [s for s in todo if s.key not in taken]
        print(
            f"{len(the_plan.runs)} runs selected, {stored} already in {store}, "
            + (f"{len(adopted)} taken from screens of the same config, " if adopted else "")
            + f"{len(todo)} to go",
            flush=True,
        )
        for row in adopted:
            print(
                f"taken from the screen {row['adopted_from']}: {row['algo']} {row['env_id']} "
                f"seed {row['seed']}: final {row['final_return']:.1f}",
                flush=True,
            )
        for algo, env_id, why in the_plan.skipped:
            print(f"not run: {algo} on {env_id}: {why}", flush=True)
        command = shlex.join(["python", "bench/zoo.py", *(sys.argv[1:] if argv is None else argv)])
        failures = execute(todo, rows, store, args, command)
    if args.override:
        print(screen_summary(the_plan.runs, rows, read_rows(args.results)), flush=True)
        return finish(failures)
    tasks = [t.env_id for t in TASKS if any(r["env_id"] == t.env_id for r in rows)]
    # Without an env, the rules' settings for it are unknown, so the page could not tell its
    # current runs from stale ones (and would list the env as one that cannot be made).
    missing = [f"{env_id} ({why})" for env_id in tasks if (why := build_error(env_id))]
    if missing:
        finish(failures)
        print(
            f"not writing {args.page}: stored runs trained on envs this machine cannot build: "
            f"{'; '.join(missing)}; install what they need, then run `python bench/zoo.py "
            "--report-only`",
            file=sys.stderr,
        )
        return 2
    baselines = task_baselines(baselines_path(args.results), tasks)
    rlzoo_rows = read_rows(args.results.with_name(RLZOO))
    report(rows, not_run(rows), args.page, args.images, baselines, rlzoo_rows)
    print(f"wrote {args.page}", flush=True)
    return finish(failures)


def finish(failures: list[str]) -> int:
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
