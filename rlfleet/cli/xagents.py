"""xagents' flag names on ``rlfleet train``: the flags of an xagents command line that have
another name in rlfleet, each translated onto the run config or the run directory.

``xagents train ppo --env CartPole-v1 --n-envs 16 --n-steps 1024 --checkpoints ppo.tf
--history-checkpoint ppo.parquet --seed 123`` runs as it is under ``rlfleet train``. The
flags that keep their name in rlfleet (``--env``, ``--seed``, ``--target-reward``,
``--max-steps``, ``--gamma``, ``--plateau-reduce-factor``, ``--plateau-reduce-patience``,
``--early-stop-patience``, ``--divergence-monitoring-steps``, ``--reward-buffer-size``) are
rlfleet's own; docs/coming-from-xagents.md has the whole table.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from rlfleet.algos.base import Algorithm
from rlfleet.cli.common import err
from rlfleet.config.fields import PositiveInt
from rlfleet.errors import ConfigError
from rlfleet.runs.config import RunConfig

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


ALIASES = {"--n-envs": "--num-envs", "--n-steps": ("--num-steps", "--n-step")}
"""xagents' flag -> the rlfleet flag(s) it stands for (given together, they are refused)."""


def check_alias_conflicts(args: Sequence[str]) -> None:
    """Refuse an xagents flag given together with the rlfleet flag it stands for."""
    given = {arg.partition("=")[0] for arg in args if arg.startswith("--")}
    for alias, names in ALIASES.items():
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
    """Refuse a ``--history-checkpoint`` that is not a parquet file path or would replace
    another run's history, before training starts."""
    path = flags.history_checkpoint
    if path is None:
        return
    if path.suffix != ".parquet":
        raise ConfigError(f"--history-checkpoint: expected a .parquet file path, got {path}")
    if path.is_dir():
        raise ConfigError(f"--history-checkpoint {path} is a directory; expected a file path")
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
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
