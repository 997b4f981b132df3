"""xagents' flag names on ``rlfleet train`` and ``rlfleet tune``: the flags of an xagents
command line that have another name in rlfleet, each translated onto the run config, the
run directory or the study's settings.

``xagents train ppo --env CartPole-v1 --n-envs 16 --n-steps 1024 --checkpoints ppo.tf
--history-checkpoint ppo.parquet --seed 123`` runs as it is under ``rlfleet train``. The
flags that keep their name in rlfleet (``--env``, ``--seed``, ``--target-reward``,
``--max-steps``, ``--gamma``, ``--plateau-reduce-factor``, ``--plateau-reduce-patience``,
``--early-stop-patience``, ``--divergence-monitoring-steps``, ``--reward-buffer-size``) are
rlfleet's own; docs/coming-from-xagents.md has the whole table.

``xagents tune ppo --env CartPole-v1 --study ppo-test --storage sqlite:///ppo.db --n-trials
10 --n-jobs 2 --trial-steps 30000 --warmup-trials 3 --non-silent`` runs as it is under
``rlfleet tune``. xagents' tune also reads search ranges from hyperparameter flags
(``--lr 1e-5 1e-2``); rlfleet reads them from ``--search-space FILE``, and says so when it
meets one of those flags (:func:`refuse_search_flags`).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Any

import tyro

from rlfleet.algos.base import Algorithm
from rlfleet.cli.common import err
from rlfleet.config.fields import EnvCount, NonNegativeInt, PositiveInt
from rlfleet.errors import ConfigError, refuse_special_file, replacing
from rlfleet.runs.config import RunConfig
from rlfleet.tune.setup import TuneConfig

HISTORY_FILE = "history.parquet"
"""The run directory's history, which ``--history-checkpoint`` copies."""


@dataclass
class XAgentsFlags:
    """xagents' names for rlfleet settings (docs/coming-from-xagents.md)."""

    n_envs: PositiveInt | None = None
    """Alias of --num-envs (xagents' name)."""
    n_steps: PositiveInt | None = None
    """Alias of num_steps (steps per env per rollout) or, for an algorithm without it, of
    n_step (n-step returns): what xagents' n_steps means for the algorithm."""
    checkpoints: list[Path] | None = None
    """Alias of --run-dir (xagents' weights files): the run directory is the first PATH, and
    its checkpoints/ and best/ hold the weights of every network of the run (rlfleet keeps
    them together, so a second PATH is not needed)."""
    history_checkpoint: Path | None = None
    """Also write the run's training history to this parquet file (a copy of the run
    directory's history.parquet, written when training stops)."""


ALIASES: dict[str, str | tuple[str, ...]] = {
    "--n-envs": "--num-envs",
    "--n-steps": ("--num-steps", "--n-step"),
}
"""xagents' flag -> the rlfleet flag(s) it stands for (given together, they are refused)."""


def check_alias_conflicts(
    args: Sequence[str], aliases: dict[str, str | tuple[str, ...]] | None = None
) -> None:
    """Refuse an xagents flag given together with the rlfleet flag it stands for (``aliases``:
    those of ``train``, :data:`ALIASES`, by default)."""
    given = {arg.partition("=")[0] for arg in args if arg.startswith("--")}
    for alias, names in (ALIASES if aliases is None else aliases).items():
        for name in (names,) if isinstance(names, str) else names:
            if alias in given and name in given:
                raise ConfigError(f"{alias} is xagents' name for {name}; give one of them")


def apply_flags(
    flags: XAgentsFlags, cfg: RunConfig, algo_cls: type[Algorithm[Any]] | None
) -> RunConfig:
    """``cfg`` with the settings the xagents flags stand for."""
    if flags.n_envs is not None:
        cfg = replace(cfg, env=replace(cfg.env, num_envs=flags.n_envs))
    if flags.n_steps is not None:
        names = {item.name for item in fields(cfg.hyperparameters)}
        field_name = next((name for name in ("num_steps", "n_step") if name in names), None)
        if field_name is None:
            algo = algo_cls.name if algo_cls is not None else cfg.algo
            raise ConfigError(
                f"--n-steps: {algo} has neither a rollout length (--num-steps) nor n-step "
                "returns (--n-step); drop the flag"
            )
        cfg = replace(
            cfg, hyperparameters=replace(cfg.hyperparameters, **{field_name: flags.n_steps})
        )
    return cfg


def run_dir_of(flags: XAgentsFlags, run_dir: Path | None, resume: Path | None) -> Path | None:
    """The run directory ``--checkpoints`` names (None: it is not given)."""
    if not flags.checkpoints:
        return None
    chosen = flags.checkpoints[0]
    for flag, other in (("--run-dir", run_dir), ("--resume", resume)):
        if other is not None and Path(other) != chosen:
            raise ConfigError(
                f"--checkpoints {chosen} names the run directory, and {flag} names another "
                f"({other}); give one of them"
            )
    if len(flags.checkpoints) > 1:
        extra = " ".join(str(path) for path in flags.checkpoints[1:])
        err.print(
            f"note: --checkpoints: every network of the run is saved under {chosen}; "
            f"{extra} is not written"
        )
    return chosen


def check_history_checkpoint(flags: XAgentsFlags, *, resume: bool, force: bool) -> None:
    """Refuse a ``--history-checkpoint`` that is not a parquet file path, is a device or a
    FIFO, or would replace another run's history, before training starts."""
    path = flags.history_checkpoint
    if path is None:
        return
    if path.suffix != ".parquet":
        raise ConfigError(f"--history-checkpoint: expected a .parquet file path, got {path}")
    if path.is_dir():
        raise ConfigError(f"--history-checkpoint {path} is a directory; expected a file path")
    refuse_special_file(path, ConfigError, "write --history-checkpoint")
    if path.exists() and not (resume or force):
        raise ConfigError(
            f"--history-checkpoint {path} exists; pass --force to replace it (or --resume "
            "RUN_DIR to continue the run it came from)"
        )


def write_history_checkpoint(flags: XAgentsFlags, run_dir: Path) -> None:
    """Copy the run's history to ``--history-checkpoint``, atomically (nothing to copy
    before the first history row is written)."""
    path = flags.history_checkpoint
    source = run_dir / HISTORY_FILE
    if path is None or not source.is_file():
        return
    with replacing(path) as tmp:
        shutil.copyfile(source, tmp)


# ------------------------------------------------------------------------------ tune
@dataclass
class XAgentsTuneFlags:
    """xagents' names for rlfleet tune settings (docs/coming-from-xagents.md); --study and
    --storage keep their names."""

    n_trials: PositiveInt | None = None
    """Alias of --trials (xagents' name)."""
    n_jobs: PositiveInt | None = None
    """Alias of --jobs (xagents' name)."""
    trial_steps: PositiveInt | None = None
    """Alias of --max-steps (xagents' name): env steps of each training run of a trial."""
    warmup_trials: NonNegativeInt | None = None
    """Alias of --prune-startup-trials (xagents' name): trials that finish before any is
    pruned."""
    non_silent: Annotated[bool, tyro.conf.FlagCreatePairsOff] = False
    """Alias of --verbose (xagents' name), which is on by default: one line per finished
    trial (the trials' own training stays quiet)."""
    n_envs: EnvCount | None = None
    """Alias of --num-envs (xagents' name): training envs per run. One value: to search
    over several, give env.num_envs choices in --search-space."""


TUNE_ALIASES: dict[str, str | tuple[str, ...]] = {
    "--n-trials": "--trials",
    "--n-jobs": "--jobs",
    "--trial-steps": "--max-steps",
    "--warmup-trials": "--prune-startup-trials",
    "--non-silent": ("--verbose", "--no-verbose"),
    "--n-envs": "--num-envs",
}
"""xagents' tune flag -> the rlfleet flag(s) it stands for (given together, they are refused)."""

SEARCH_FLAGS: dict[str, str] = {
    "--lr": "hyperparameters.learning_rate",
    "--opt-epsilon": "hyperparameters.adam_eps",
    "--beta1": "",
    "--beta2": "",
    "--gamma": "hyperparameters.gamma",
    "--n-steps": "hyperparameters.num_steps (or n_step)",
    "--buffer-max-size": "hyperparameters.buffer_size",
    "--buffer-initial-size": "hyperparameters.learning_starts",
    "--buffer-batch-size": "hyperparameters.batch_size",
    "--entropy-coef": "hyperparameters.ent_coef",
    "--value-loss-coef": "hyperparameters.vf_coef",
    "--grad-norm": "hyperparameters.max_grad_norm",
    "--lam": "hyperparameters.gae_lambda",
    "--clip-norm": "hyperparameters.clip_range",
    "--n-epochs": "hyperparameters.num_epochs",
    "--tau": "hyperparameters.tau",
    "--preprocess": "",
    "--max-frame": "",
}
"""xagents' hyperparameter flags, which on ``xagents tune`` give the values or range to
search -> the search-space entry that does it in rlfleet ("" where rlfleet has none)."""


def refuse_search_flags(args: Sequence[str]) -> None:
    """Refuse xagents' hyperparameter flags on ``tune``, naming the search-space entry that
    takes their values (ConfigError: a one-line error, exit code 2)."""
    for i, arg in enumerate(args):
        flag = arg.partition("=")[0]
        if flag == "--n-envs" and len(list(_values_after(args, i))) > 1:
            raise ConfigError(
                "rlfleet tune: xagents' --n-envs with several values searches over them; "
                "rlfleet tune reads what to search from --search-space FILE: give "
                "env.num_envs there as {choices: [...]} (docs/tuning.md)"
            )
        if flag not in SEARCH_FLAGS:
            continue
        entry = SEARCH_FLAGS[flag]
        if flag in ("--preprocess", "--max-frame"):
            why = "ALE ids get the Atari preprocessing (frame skip and max included) by themselves"
        elif not entry:
            why = "rlfleet's Adam keeps torch's betas, so there is nothing to search"
        else:
            why = (
                f"rlfleet tune reads what to search from --search-space FILE: give {entry} "
                "there as a value, {low: L, high: H} or {choices: [...]} (docs/tuning.md)"
            )
        raise ConfigError(f"rlfleet tune: xagents' {flag} has no tune flag in rlfleet: {why}")


def _values_after(args: Sequence[str], i: int) -> Iterator[str]:
    """The values that follow the flag ``args[i]`` (up to the next flag)."""
    for arg in args[i + 1 :]:
        if arg.startswith("--"):
            return
        yield arg


def apply_tune_flags(flags: XAgentsTuneFlags, options: TuneConfig) -> TuneConfig:
    """``options`` with the settings the xagents flags stand for."""
    changes: dict[str, Any] = {
        name: value
        for name, value in (
            ("trials", flags.n_trials),
            ("jobs", flags.n_jobs),
            ("max_steps", flags.trial_steps),
            ("prune_startup_trials", flags.warmup_trials),
            ("num_envs", flags.n_envs),
        )
        if value is not None
    }
    if flags.non_silent:
        changes["verbose"] = True
    return replace(options, **changes)
