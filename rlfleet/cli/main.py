"""The ``rlfleet`` command (also ``python -m rlfleet``): its subcommands, parsed by tyro.

``rlfleet train | collect | eval | play | export | plot | tune | check-env``, each a dataclass whose
fields are its flags and whose ``run()`` does its work (:mod:`rlfleet.cli.train`,
:mod:`rlfleet.cli.play`, :mod:`rlfleet.cli.commands`). ``rlfleet --version`` prints the
version; tyro's ``--tyro-write-completion {bash,zsh,tcsh} FILE`` writes a shell completion
script (docs/cli.md).

Bad input is one line on stderr and exit code 2, with the flag it concerns named as a flag
(:func:`rlfleet.errors.cli_wording`); Ctrl-C exits with 130.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, make_dataclass
from typing import Annotated, Any, Union

import tyro
from rich.markup import escape

from rlfleet.algos.registry import get_algorithm
from rlfleet.cli import train
from rlfleet.cli.commands import (
    CheckEnvCommand,
    CollectCommand,
    EvalCommand,
    ExportCommand,
    PlotCommand,
    TuneCommand,
)
from rlfleet.cli.common import err, out
from rlfleet.cli.play import PlayCommand
from rlfleet.cli.xagents import TUNE_ALIASES, check_alias_conflicts, refuse_search_flags
from rlfleet.errors import ConfigError, RlfleetError, cli_wording
from rlfleet.runs.run_file import read_run_file
from rlfleet.version import __version__

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


@dataclass(frozen=True)
class HelpCommand:
    """List the commands (what `rlfleet` alone does)."""

    def run(self) -> int:
        try:
            tyro.cli(root_type(None), args=["--help"], prog="rlfleet")
        except SystemExit as stop:  # how tyro ends after printing the help
            return stop.code if isinstance(stop.code, int) else 0
        return 0


def root_type(selected: train.TrainBase | None) -> Any:
    """The ``rlfleet`` command line as one type: version flag and subcommands."""
    algorithms: Any = Union[tuple(train.subcommands(selected))]  # noqa: UP007
    train_group = make_dataclass(
        "Train",
        [("algorithm", Annotated[algorithms, tyro.conf.OmitSubcommandPrefixes])],
        namespace={"__doc__": TRAIN_HELP, "run": lambda self: self.algorithm.run()},
    )
    command: Any = Union[  # noqa: UP007
        Annotated[train_group, tyro.conf.subcommand("train")],
        Annotated[CollectCommand, tyro.conf.subcommand("collect")],
        Annotated[EvalCommand, tyro.conf.subcommand("eval")],
        Annotated[PlayCommand, tyro.conf.subcommand("play")],
        Annotated[ExportCommand, tyro.conf.subcommand("export")],
        Annotated[PlotCommand, tyro.conf.subcommand("plot")],
        Annotated[TuneCommand, tyro.conf.subcommand("tune")],
        Annotated[CheckEnvCommand, tyro.conf.subcommand("check-env")],
        Annotated[HelpCommand, tyro.conf.subcommand("help")],
    ]

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


def parse(args: list[str]) -> Any:
    """The command ``args`` ask for, its flags parsed once."""
    if args and not args[0].startswith("-") and args[0] not in (*COMMANDS, "help"):
        raise ConfigError(f"unknown command {args[0]!r} (expected one of: {', '.join(COMMANDS)})")
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


@dataclass
class Version:
    """``rlfleet --version``."""

    def run(self) -> int:
        out.print(f"rlfleet {__version__}")
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlfleet`` command; returns the exit code. Errors name
    command-line flags, not the Python parameters behind them."""
    args = list(sys.argv[1:] if argv is None else argv)
    with cli_wording():
        try:
            code: int = parse(args).run()
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
