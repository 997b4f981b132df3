"""``rlfleet collect | eval | export | plot | check-env | tune``: one dataclass per command, its
fields the flags, its :meth:`run` what the command does (``rlfleet train`` is in
:mod:`rlfleet.cli.train`, ``rlfleet play`` in :mod:`rlfleet.cli.play`).

What a command needs beyond its flags is imported inside its ``run``: the ``rlfleet`` command
builds every subcommand's flags at start-up, and only the command that runs should pay for
its imports (Optuna, matplotlib, the collectors, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import tyro

from rlfleet.cli.common import check_flags, device_flag, err, out, seed_flag
from rlfleet.cli.xagents import XAgentsTuneFlags, apply_tune_flags
from rlfleet.config.fields import MAX_ENVS
from rlfleet.errors import ConfigError, RunDirError
from rlfleet.tune.setup import TuneConfig


@dataclass
class CollectCommand:
    """Record an offline dataset with a trained run's policy."""

    run_dir: tyro.conf.Positional[Path]
    """Run directory written by `rlfleet train`."""
    steps: int
    """Transitions to record."""
    out: Path
    """Dataset directory to write."""
    epsilon: float = 0.0
    """Probability of a uniformly random action instead of the policy's."""
    stochastic: bool = False
    """Sample the policy's actions instead of taking the greedy action."""
    checkpoint: Literal["best", "latest"] = "best"
    """Which policy: the best-scoring one or the latest checkpoint."""
    num_envs: int = 4
    """Envs stepped together."""
    seed: int = 0
    """Seed of the env resets and random actions."""
    force: bool = False
    """Overwrite an existing dataset directory."""
    device: str | None = None
    """Torch device to run the policy on (default: the one the run trained on)."""
    show_progress: bool = True
    """Draw a bar of the transitions recorded (only ever on a terminal)."""

    def run(self) -> int:
        seed_flag(self.seed)
        check_flags(
            ("--steps", self.steps, 1, None),
            ("--num-envs", self.num_envs, 1, MAX_ENVS),
            ("--epsilon", self.epsilon, 0, 1),
        )
        from rlfleet.collect.record import record_dataset
        from rlfleet.data.dataset import check_output_dir
        from rlfleet.runs.run import load_algorithm

        # Refuse a taken output directory before spending time on recording.
        check_output_dir(self.out, overwrite=self.force)
        algo, cfg = load_algorithm(
            self.run_dir, which=self.checkpoint, device=device_flag(self.device)
        )
        dataset = record_dataset(
            algo,
            cfg.env.id,
            self.steps,
            epsilon=self.epsilon,
            deterministic=not self.stochastic,
            num_envs=self.num_envs,
            seed=self.seed,
            env_kwargs=cfg.env.kwargs,
            source={"run_dir": str(self.run_dir), "checkpoint": self.checkpoint},
            show_progress=self.show_progress,
            atari=cfg.env.atari.for_evaluation(),
        )
        path = dataset.save(self.out, overwrite=self.force)
        out.print(f"wrote {path}\n{dataset.stats().describe()}")
        return 0


@dataclass
class EvalCommand:
    """Evaluate a trained run's policy on test episodes."""

    run_dir: tyro.conf.Positional[Path]
    """Run directory written by `rlfleet train`."""
    episodes: int = 20
    """Number of test episodes."""
    checkpoint: Literal["best", "latest"] = "best"
    """Which policy: the best-scoring one or the latest checkpoint."""
    seed: int = 12345
    """Seed of the evaluation envs."""
    stochastic: bool = False
    """Sample actions instead of taking the greedy action."""
    device: str | None = None
    """Torch device to run the policy on (default: the one the run trained on)."""
    show_progress: bool = True
    """Draw a bar of the episodes ended (only ever on a terminal)."""

    def run(self) -> int:
        seed_flag(self.seed)
        check_flags(("--episodes", self.episodes, 1, None))
        from rlfleet.runs.run import evaluate

        stats, cfg = evaluate(
            self.run_dir,
            self.episodes,
            seed=self.seed,
            deterministic=not self.stochastic,
            which=self.checkpoint,
            device=device_flag(self.device),
            show_progress=self.show_progress,
        )
        out.print(
            f"{cfg.algo} on {cfg.env.id}: mean return {stats.mean:.2f} ± {stats.std:.2f} over "
            f"{stats.lengths.size} episodes (min {stats.returns.min():.1f}, "
            f"max {stats.returns.max():.1f}; "
            f"mean length {np.mean(stats.lengths):.1f})"
        )
        return 0


@dataclass
class ExportCommand:
    """Export a trained run's deterministic policy for deployment (ONNX: needs the `onnx`
    extra), with observation normalisation and action scaling inside the graph."""

    run_dir: tyro.conf.Positional[Path]
    """Run directory written by `rlfleet train`."""
    format: Literal["onnx"] = "onnx"
    """File format of the exported policy."""
    out: Path | None = None
    """File to write (default: RUN_DIR/export/policy.onnx)."""
    checkpoint: Literal["best", "latest"] = "best"
    """Which policy: the best-scoring one or the latest checkpoint."""
    action_mask: Literal["auto", "on", "off"] = "auto"
    """Give the graph an action_mask input (auto: when the observation carries one)."""
    force: bool = False
    """Overwrite an existing output file."""

    def run(self) -> int:
        from rlfleet.runs.run import load_algorithm

        path = self.out or self.run_dir / "export" / "policy.onnx"
        if path.exists() and not self.force:
            raise ConfigError(f"--out {path} exists; pass --force to overwrite it")
        algo, cfg = load_algorithm(self.run_dir, which=self.checkpoint, device="cpu")
        mask = {"auto": None, "on": True, "off": False}[self.action_mask]
        algo.export_onnx(path, action_mask=mask)
        out.print(f"wrote {path} ({cfg.algo} on {cfg.env.id}, {self.checkpoint} policy)")
        return 0


@dataclass
class CheckEnvCommand:
    """Check an env against the Gymnasium / PettingZoo API and measure its step time."""

    target: tyro.conf.Positional[str]
    """Registered env id (CartPole-v1), package.module:EnvId or package.module:EnvClass."""
    steps: int = 2000
    """Random steps to run."""
    seed: int = 0
    """Seed of the resets and random actions."""

    def run(self) -> int:
        seed_flag(self.seed)
        check_flags(("--steps", self.steps, 1, None))
        from rich.markup import escape
        from rich.table import Table

        from rlfleet.envs.check import check_env
        from rlfleet.envs.make import env_spec

        # A target that names no env is bad input (exit 2), not an env that fails its checks.
        env_spec(self.target)
        report = check_env(self.target, num_steps=self.steps, seed=self.seed)
        table = Table(title=f"rlfleet check-env {self.target}", show_lines=False)
        table.add_column("", no_wrap=True)
        table.add_column("check", no_wrap=True)
        table.add_column("finding")
        style = {
            "error": "[bold red]error[/]",
            "warning": "[yellow]warning[/]",
            "info": "[green]ok[/]",
        }
        for finding in report.findings:
            table.add_row(style[finding.level], finding.check, escape(finding.message))
        out.print(table)
        errors, warnings = len(report.errors()), len(report.warnings())
        out.print(f"{errors} error(s), {warnings} warning(s)")
        return 0 if report.ok else 1


@dataclass
class PlotCommand:
    """Plot one run's learning curve, or compare runs: the seeds of one config are drawn as
    their IQM (or mean) with a 95% bootstrap confidence band, one panel per env, titled
    with the env."""

    run_dirs: tyro.conf.Positional[list[Path]]
    """Run directories written by `rlfleet train`."""
    out: Path | None = None
    """Output PNG (default: the first run's plots/compare.png; for one run its learning curve)."""
    metric: str = "test/return_mean"
    """History column to plot."""
    statistic: Literal["iqm", "mean"] = "iqm"
    """Across the seeds of a config: interquartile mean (rliable's; with under 4 runs it is
    the mean) or mean."""
    smooth: int = 1
    """Rolling mean over this many logged values of each run (1: no smoothing)."""
    labels: list[str] | None = None
    """One name per run directory, in their order, for the legend (one run: the title);
    runs given the same label are drawn as seeds of one config."""
    history_interval: int = 1
    """Draw every N-th logged value of each run (xagents' history_interval; 1: all)."""

    def run(self) -> int:
        from rlfleet.logging.plots import plot_learning_curve, plot_runs, run_title

        if not self.run_dirs:
            raise ConfigError(
                "rlfleet plot needs one or more run directories: rlfleet plot RUN_DIR "
                "[RUN_DIR ...] (directories written by `rlfleet train`)"
            )
        check_flags(
            ("--smooth", self.smooth, 1, None),
            ("--history-interval", self.history_interval, 1, None),
        )
        if self.labels is not None and len(self.labels) != len(self.run_dirs):
            raise ConfigError(
                f"--labels: expected one per run directory ({len(self.run_dirs)}), got "
                f"{len(self.labels)}"
            )
        first = self.run_dirs[0]
        if len(self.run_dirs) == 1 and self.metric == "test/return_mean":
            path = self.out or first / "plots" / "learning_curve.png"
            history = first / "history.parquet"
            if not history.is_file():
                raise RunDirError(
                    f"{first}: no history.parquet — expected a run directory written by "
                    "`rlfleet train`"
                )
            label = self.labels[0] if self.labels else None
            plot_learning_curve(
                history,
                path,
                title=run_title(first, label),
                smooth=self.smooth,
                every=self.history_interval,
            )
        else:
            path = self.out or first / "plots" / "compare.png"
            plot_runs(
                self.run_dirs,
                path,
                self.metric,
                statistic=self.statistic,
                smooth=self.smooth,
                labels=self.labels,
                every=self.history_interval,
            )
        out.print(f"wrote {path}")
        return 0


@dataclass
class TuneCommand:
    """Search hyperparameters with Optuna: each trial trains several seeds, unpromising
    trials are pruned, and the best config is written as YAML for `rlfleet train`."""

    algo: tyro.conf.Positional[str]
    """Registered algorithm name (e.g. ppo)."""
    env: str
    """Gymnasium env id (e.g. CartPole-v1), module:EnvId or module:EnvClass."""
    options: Annotated[TuneConfig, tyro.conf.OmitArgPrefixes] = field(default_factory=TuneConfig)
    xagents: Annotated[XAgentsTuneFlags, tyro.conf.OmitArgPrefixes] = field(
        default_factory=XAgentsTuneFlags
    )

    def run(self) -> int:
        from rlfleet.algos.registry import get_algorithm
        from rlfleet.tune import tune  # Optuna: slow to import, and optional

        name = get_algorithm(self.algo).name
        options = apply_tune_flags(self.xagents, self.options)
        try:
            result = tune(name, self.env, options)
        except KeyboardInterrupt:
            err.print(
                "interrupted; running trials were queued again — rerun the same command to "
                "resume the study"
            )
            return 130
        lines = [
            f"study {result.study_name!r}: {result.complete} complete, {result.pruned} pruned, "
            f"{result.failed} failed of {result.requested} trials"
            + (
                f" ({result.unfinished} not finished yet; rerun the same command to continue)"
                if result.unfinished
                else ""
            ),
        ]
        if result.best_config is not None and result.best_value is not None:
            lines.append(
                f"best: trial {result.best_trial}, value {result.best_value:.2f} — train it "
                f"with `rlfleet train {result.best_config}`"
            )
        lines.append(f"trials: {result.trials_table}")
        lines.extend(f"plot: {path}" for path in result.plots)
        lines.extend(f"note: {note}" for note in result.notes)
        out.print("\n".join(lines))
        return 0
