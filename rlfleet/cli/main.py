"""The ``rlfleet`` command (also ``python -m rlfleet``): its subcommands, parsed by tyro.

``rlfleet train | collect | eval | play | export | plot | tune | check-env``, each a dataclass whose
fields are its flags and whose ``run()`` does its work (:mod:`rlfleet.cli.train`,
:mod:`rlfleet.cli.play`, :mod:`rlfleet.cli.commands`). ``rlfleet --version`` prints the
version; ``--tyro-write-completion {bash,zsh,tcsh,fish} FILE`` writes tyro's shell completion
script (docs/cli.md).

A command's modules (and torch with them) are imported only when that command runs: the
overview (``rlfleet``, ``rlfleet --help``, ``rlfleet train --help``, ``rlfleet --version``) is
:func:`overview_type`, the same command line built from the commands' and algorithms' one-line
descriptions (:data:`COMMAND_SUMMARIES`, :data:`ALGORITHM_SUMMARIES`).

Bad input is one line on stderr and exit code 2, with the flag it concerns named as a flag
(:func:`rlfleet.errors.cli_wording`), tyro's own parse errors included
(:mod:`rlfleet.cli.parse_errors`); Ctrl-C exits with 130. A Python warning raised while the
command runs (gymnasium's env checker warns before rlfleet's own check refuses a bad step)
is one line on stderr too, ``warning: MESSAGE``, with no source line and no terminal
colour codes (:func:`one_line_warning`).
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Union

import tyro
from rich.markup import escape

from rlfleet.cli.common import err, out
from rlfleet.cli.parse_errors import ANSI_CODE, one_line_parse_errors
from rlfleet.errors import ConfigError, RlfleetError, RunDirError, cli_wording, replacing
from rlfleet.version import __version__

if TYPE_CHECKING:
    from rlfleet.cli.train import TrainBase

COMMANDS = ("train", "collect", "eval", "play", "export", "plot", "tune", "check-env")
TRAIN_HELP = (
    "Train an agent: `rlfleet train ALGO --env ENV [flags]` (`rlfleet train ALGO --help` lists "
    "every flag with the preset value for the env), or `rlfleet train FILE.yaml [flags]` with "
    "a run config (a run's config.yaml, tune's best.yaml) or ML-Agents run options."
)

ROOT_HELP = (
    "Deep reinforcement learning with PyTorch: train agents, evaluate, play and plot them, "
    "tune their hyperparameters. `rlfleet COMMAND --help` lists a command's flags; "
    "`rlfleet --version` prints the version."
)


COMMAND_SUMMARIES = {
    "collect": "Record an offline dataset with a trained run's policy.",
    "eval": "Evaluate a trained run's policy on test episodes.",
    "play": "Play a trained policy: on screen, to video files, or to PNG frames.",
    "export": (
        "Export a trained run's deterministic policy for deployment (ONNX: needs the `onnx`\n"
        "    extra), with observation normalisation and action scaling inside the graph."
    ),
    "plot": (
        "Plot one run's learning curve, or compare runs: the seeds of one config are drawn as\n"
        "    their IQM (or mean) with a 95% bootstrap confidence band, one panel per env, titled\n"
        "    with the env."
    ),
    "tune": (
        "Search hyperparameters with Optuna: each trial trains several seeds, unpromising\n"
        "    trials are pruned, and the best config is written as YAML for `rlfleet train`."
    ),
    "check-env": "Check an env against the Gymnasium / PettingZoo API and measure its step time.",
}
"""What ``rlfleet --help`` says of each command other than train and help: the docstring of
its class, which the overview shows without importing it (tests/cli/test_main.py checks that
both agree)."""

ALGORITHM_SUMMARIES = {
    "a2c": "Synchronous advantage actor-critic for every action space PPO handles.",
    "acer": "ACER for Discrete actions, action masks included.",
    "appo": "PPO-clipped actor-critic on V-trace targets, for Discrete and Box actions.",
    "bc": "Behavior cloning for Discrete and Box actions.",
    "cql": "Conservative Q-learning for Discrete (DQN-style) and Box (SAC-style) actions.",
    "ddpg": "Deep Deterministic Policy Gradient for Box actions.",
    "dqn": "Deep Q-learning for Discrete actions (double, dueling, n-step, prioritized flags).",
    "impala": "V-trace actor-critic for Discrete and Box actions, trained from lagging actors.",
    "iql": "Implicit Q-learning for Box actions.",
    "ppo": "Clipped-surrogate PPO for every action space but continuous-discrete mixtures.",
    "sac": "Soft Actor-Critic for Box (squashed Gaussian) and Discrete (softmax) actions.",
    "td3": "Twin Delayed DDPG for Box actions.",
    "td3_bc": "TD3 with a behavior-cloning term in the actor loss, for Box actions.",
    "trpo": "Natural-gradient policy steps in a KL trust region, for every action space.",
}
"""What ``rlfleet train --help`` says of each registered algorithm: the first paragraph of its
class's docstring, listed without importing the algorithms (tests/cli/test_main.py checks
that both agree)."""


@dataclass(frozen=True)
class HelpCommand:
    """List the commands (what `rlfleet` alone does)."""

    def run(self) -> int:
        try:
            tyro.cli(overview_type(), args=["--help"], prog="rlfleet")
        except SystemExit as stop:  # how tyro ends after printing the help
            return stop.code if isinstance(stop.code, int) else 0
        return 0


def root_type(selected: TrainBase | None) -> Any:
    """The ``rlfleet`` command line as one type: version flag and subcommands."""
    # Imported here, not at module level: they import torch and the trainers, which the
    # overview (`rlfleet`, `rlfleet --help`, `rlfleet train --help`) does without.
    from rlfleet.cli import train
    from rlfleet.cli.commands import (
        CheckEnvCommand,
        CollectCommand,
        EvalCommand,
        ExportCommand,
        PlotCommand,
        TuneCommand,
    )
    from rlfleet.cli.play import PlayCommand

    commands = {
        "collect": CollectCommand,
        "eval": EvalCommand,
        "play": PlayCommand,
        "export": ExportCommand,
        "plot": PlotCommand,
        "tune": TuneCommand,
        "check-env": CheckEnvCommand,
    }
    return _command_line(train.subcommands(selected), commands)


def overview_type() -> Any:
    """The ``rlfleet`` command line as :func:`root_type` shows it in the overview: the same
    commands and algorithms with the same descriptions, but without their flags, so that
    printing it imports none of them (nor torch)."""
    algorithms = [
        Annotated[_placeholder(name, summary), tyro.conf.subcommand(name, description=summary)]
        for name, summary in ALGORITHM_SUMMARIES.items()
    ]
    commands = {name: _placeholder(name, summary) for name, summary in COMMAND_SUMMARIES.items()}
    return _command_line(algorithms, commands)


def _placeholder(name: str, summary: str) -> type:
    """A command without flags that stands for ``name`` in the overview."""
    return make_dataclass(name.replace("-", "_").title(), [], namespace={"__doc__": summary})


def _command_line(algorithms: list[Any], commands: dict[str, Any]) -> Any:
    """The root type: ``train`` with ``algorithms`` as its subcommands, ``commands`` by name
    (in the overview's order), ``help`` and ``--version``."""
    train_group = make_dataclass(
        "Train",
        [
            (
                "algorithm",
                Annotated[Union[tuple(algorithms)], tyro.conf.OmitSubcommandPrefixes],  # noqa: UP007
            )
        ],
        namespace={"__doc__": TRAIN_HELP, "run": lambda self: self.algorithm.run()},
    )
    members = [
        Annotated[train_group, tyro.conf.subcommand("train")],
        *(Annotated[cls, tyro.conf.subcommand(name)] for name, cls in commands.items()),
        Annotated[HelpCommand, tyro.conf.subcommand("help")],
    ]
    command: Any = Union[tuple(members)]  # noqa: UP007

    # Built here, not declared at module level: the train subcommands' defaults depend on
    # the algorithm and base run config the command line names.
    root = make_dataclass(
        "Rlfleet",
        [
            (
                "command",
                Annotated[command, tyro.conf.OmitSubcommandPrefixes],
                field(default=HelpCommand()),
            ),
            (
                "version",
                Annotated[
                    bool,
                    tyro.conf.FlagCreatePairsOff,
                    tyro.conf.arg(help="Print rlfleet's version and exit."),
                ],
                field(default=False),
            ),
        ],
        namespace={"__doc__": ROOT_HELP},
    )
    return Annotated[root, tyro.conf.OmitArgPrefixes]


HELP_FLAGS = ("-h", "--help")


def is_overview(args: list[str]) -> bool:
    """Whether ``args`` ask only for the overview or the version (`rlfleet`, `rlfleet help`,
    `rlfleet --help`, `rlfleet --version`, `rlfleet train --help`), which
    :func:`overview_type` answers as :func:`root_type` would."""
    if args[:1] == ["train"]:
        return len(args) > 1 and all(arg in HELP_FLAGS for arg in args[1:])
    rest = args[1:] if args[:1] == ["help"] else args
    return all(arg in (*HELP_FLAGS, "--version") for arg in rest)


WRITE_COMPLETION = "--tyro-write-completion"
PRINT_COMPLETION = "--tyro-print-completion"
COMPLETION_SHELLS = ("bash", "zsh", "tcsh", "fish")
"""The shells tyro writes completion scripts for."""


@dataclass
class CompletionScript:
    """``rlfleet --tyro-write-completion SHELL FILE``: tyro's completion script of the whole
    command line, written whole or not at all (an earlier FILE stays until the new one is
    complete); FILE ``-``, or ``rlfleet --tyro-print-completion SHELL``, prints it."""

    shell: str
    path: Path

    def run(self) -> int:
        if str(self.path) == "-":
            self._write("-")
            return 0
        with replacing(self.path, RunDirError, "write the completion script") as tmp:
            self._write(str(tmp))
        return 0

    def _write(self, target: str) -> None:
        args = [WRITE_COMPLETION, self.shell, target]
        try:
            tyro.cli(root_type(None), args=args, prog="rlfleet")
        except SystemExit as stop:  # tyro exits once the script is written
            if stop.code not in (0, None):
                raise ConfigError(f"{WRITE_COMPLETION}: no {self.shell} script written") from None


def completion_request(args: list[str]) -> CompletionScript | None:
    """The completion script ``args`` ask for, if they ask for one (checked here: tyro
    asserts on another shell).

    Raises:
        ConfigError: the flag among other arguments, a shell tyro does not write for, or
            ``--tyro-write-completion`` without FILE.
    """
    for flag, operands in ((WRITE_COMPLETION, " SHELL FILE"), (PRINT_COMPLETION, " SHELL")):
        if flag not in args:
            continue
        wanted = 1 + len(operands.split())
        if len(args) != wanted or args[0] != flag or args[1] not in COMPLETION_SHELLS:
            raise ConfigError(
                f"{flag}: expected `rlfleet {flag}{operands}` with SHELL one of "
                f"{', '.join(COMPLETION_SHELLS)}, got `rlfleet {shlex.join(args)}`"
            )
        return CompletionScript(args[1], Path(args[2] if flag == WRITE_COMPLETION else "-"))
    return None


def parse(args: list[str]) -> Any:
    """The command ``args`` ask for, its flags parsed once."""
    if args and not args[0].startswith("-") and args[0] not in (*COMMANDS, "help"):
        raise ConfigError(f"unknown command {args[0]!r} (expected one of: {', '.join(COMMANDS)})")
    completion = completion_request(args)
    if completion is not None:
        return completion
    if is_overview(args):
        root = tyro.cli(overview_type(), args=args, prog="rlfleet")
        return Version() if root.version else root.command
    # Imported here: they import torch (see root_type).
    from rlfleet.algos.registry import get_algorithm
    from rlfleet.cli import train
    from rlfleet.cli.xagents import TUNE_ALIASES, check_alias_conflicts, refuse_search_flags
    from rlfleet.runs.run_file import read_run_file

    if args[:1] == ["tune"]:
        refuse_search_flags(args)
        check_alias_conflicts(args, TUNE_ALIASES)
    selected = None
    if args[:1] == ["train"] and len(args) > 1 and not args[1].startswith("-"):
        if train.is_run_file(args[1]):
            return train.file_command(read_run_file(args[1]), args[2:])
        selected = train.train_base(get_algorithm(args[1]), args[2:])
    root = tyro.cli(root_type(selected), args=args, prog="rlfleet")
    if root.version:
        return Version()
    return root.command


def _paths(value: object, seen: set[int]) -> Iterator[Path]:
    """The paths in a parsed command: its ``Path`` fields, in nested dataclasses and in
    lists and tuples too."""
    if isinstance(value, Path):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _paths(item, seen)
    elif is_dataclass(value) and not isinstance(value, type) and id(value) not in seen:
        seen.add(id(value))
        for item in fields(value):
            yield from _paths(getattr(value, item.name, None), seen)


def refuse_unusable_paths(command: object) -> None:
    """Refuse a path flag the operating system cannot even look up (a name longer than the
    file system allows, a symlink loop), before the command reads or writes anything: a
    path that merely does not exist yet is left to the command."""
    for path in _paths(command, set()):
        try:
            path.stat()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise ConfigError(
                f"{path}: the operating system refuses this path ({exc.strerror}) — expected "
                "a path to a file or directory"
            ) from None


@dataclass
class Version:
    """``rlfleet --version``."""

    def run(self) -> int:
        out.print(f"rlfleet {__version__}")
        return 0


def one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """Show a warning as one line on stderr: its message, without the source line Python
    prints below it, colour codes or gymnasium's ``WARN:`` prefix (a replacement of
    :func:`warnings.showwarning`, which the filters still decide on)."""
    text = ANSI_CODE.sub("", str(message)).strip()
    text = " ".join(text.removeprefix("WARN:").split())
    err.print(f"[yellow]warning:[/] {escape(text)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlfleet`` command; returns the exit code. Errors name
    command-line flags, not the Python parameters behind them."""
    args = list(sys.argv[1:] if argv is None else argv)
    with cli_wording(), warnings.catch_warnings():
        warnings.showwarning = one_line_warning
        try:
            asks_help = args[:1] == ["help"] or any(arg in HELP_FLAGS for arg in args)
            command = one_line_parse_errors(lambda: parse(args), asks_help=asks_help)
            refuse_unusable_paths(command)
            code: int = command.run()
            return code
        except RlfleetError as error:
            # Escaped: messages quote code (a worker's traceback), whose [index] is no markup.
            err.print(f"[bold red]error:[/] {escape(str(error))}")
            return 2
        except KeyboardInterrupt:
            # `train` names its resume command itself; anything else has nothing to resume.
            err.print("interrupted")
            return 130
        except BrokenPipeError:
            # The reader of stdout went away (`rlfleet train ppo --help | head`): stop quietly,
            # with stdout pointed at devnull so the interpreter's final flush cannot fail too.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0


if __name__ == "__main__":
    sys.exit(main())
