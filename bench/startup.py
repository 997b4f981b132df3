"""Start-up time: how long a user waits for ``import rlfleet`` and ``rlfleet --help``, next to
``import torch``, which any rlfleet run pays anyway.

    PYTHONPATH=$PWD python bench/startup.py --pairs 7
    git archive COMMIT rlfleet | tar -x -C DIR  # another commit's package, to compare with
    PYTHONPATH=$PWD python bench/startup.py --pairs 7 --tree "main COMMIT=DIR"

Each measurement is one fresh process, timed from spawn to exit (whole-process wall time):
``python -c "import torch"``, ``python -c "import rlfleet"``, ``python -c "from rlfleet import
PPO"`` (an algorithm, and torch with it) and ``rlfleet --help`` (the console script beside
the interpreter, its output discarded), each from an empty working directory. One pair runs
every command once, in turn, so that drift in machine load hits each of them alike; the
report gives each command's median and spread over the pairs, and the median over pairs of
its time minus the same pair's ``import torch``. Each ``--tree LABEL=DIR`` adds the rlfleet
commands again with ``PYTHONPATH=DIR`` (another checkout of rlfleet, e.g. an older commit),
in the same alternation; the checkout this script belongs to is always measured, as ``this
checkout``. One unrecorded run of every command comes first, so that no pair pays for a cold
file cache.

Results go to ``bench/results/startup.md`` and ``startup.parquet`` (one row per process).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from harness import RESULTS, machine_line

ROOT = Path(__file__).resolve().parent.parent
THIS_CHECKOUT = "this checkout"
TORCH = "import torch"
IMPORT = "import rlfleet"
ALGORITHM = "from rlfleet import PPO"
HELP = "rlfleet --help"
RLFLEET_COMMANDS = (IMPORT, ALGORITHM, HELP)


def commands() -> dict[str, list[str]]:
    """Each measured command line (the console script if the interpreter's environment has
    one, else ``python -m rlfleet``)."""
    script = Path(sys.executable).with_name("rlfleet")
    help_command = [str(script)] if script.exists() else [sys.executable, "-m", "rlfleet"]
    return {
        TORCH: [sys.executable, "-c", "import torch"],
        IMPORT: [sys.executable, "-c", "import rlfleet"],
        ALGORITHM: [sys.executable, "-c", "from rlfleet import PPO"],
        HELP: [*help_command, "--help"],
    }


def timed(argv: list[str], tree: Path) -> float:
    """Wall time of one process running ``argv`` with ``tree`` first on its import path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # A neutral working directory: `python -c` puts it first on the import path.
    with tempfile.TemporaryDirectory() as cwd:
        t0 = time.perf_counter()
        done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, check=False)
        elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} (PYTHONPATH={tree}) exited with {done.returncode}")
    return elapsed


def measure(trees: dict[str, Path], pairs: int) -> list[dict[str, Any]]:
    """``pairs`` rounds of every command (the rlfleet ones once per tree), in turn."""
    lines = commands()
    plan = [(TORCH, THIS_CHECKOUT)] + [
        (command, label) for label in trees for command in RLFLEET_COMMANDS
    ]
    for command, label in plan:
        timed(lines[command], trees[label])
    rows: list[dict[str, Any]] = []
    for pair in range(pairs):
        for command, label in plan:
            seconds = timed(lines[command], trees[label])
            rows.append({"command": command, "tree": label, "pair": pair, "process_s": seconds})
            print(f"pair {pair} | {label:15s} | {command:15s} {seconds:6.3f} s", flush=True)
    return rows


def report(
    rows: list[dict[str, Any]],
    trees: dict[str, Path],
    invocation: str,
    load: tuple[float, float],
) -> str:
    """Markdown: per command and tree, the median and spread of the process times, and the
    per-pair cost over ``import torch``; ``load``: the 1-minute load average before and after
    (the machine may be shared)."""
    pairs = 1 + max(r["pair"] for r in rows)
    torch_by_pair = {r["pair"]: r["process_s"] for r in rows if r["command"] == TORCH}
    lines = [
        f"# Start-up time ({time.strftime('%Y-%m-%d')})",
        "",
        f"`{invocation}`: whole-process wall time of each command, spawn to exit. "
        f"{pairs} alternating pairs (each pair runs every row once, in turn).",
        "",
        machine_line(load),
        "",
        "| checkout | command | median s | min s | max s | over `import torch`, median of "
        "pairs s |",
        "|---|---|---|---|---|---|",
    ]
    for command, label in [(TORCH, THIS_CHECKOUT)] + [
        (command, label) for label in trees for command in RLFLEET_COMMANDS
    ]:
        times = [r["process_s"] for r in rows if r["command"] == command and r["tree"] == label]
        over = [
            r["process_s"] - torch_by_pair[r["pair"]]
            for r in rows
            if r["command"] == command and r["tree"] == label
        ]
        over_cell = "—" if command == TORCH else f"{statistics.median(over):+.3f}"
        shown = "—" if command == TORCH else label
        lines.append(
            f"| {shown} | `{command}` | {statistics.median(times):.3f} | {min(times):.3f} | "
            f"{max(times):.3f} | {over_cell} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=7, help="alternating pairs")
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="also measure the rlfleet checkout in DIR (repeatable)",
    )
    args = parser.parse_args()
    trees = {THIS_CHECKOUT: ROOT}
    for item in args.tree:
        label, equals, path = item.partition("=")
        if not equals or not label or not path:
            parser.error(f"--tree: expected LABEL=DIR, got {item!r}")
        trees[label] = Path(path).resolve()
    load = os.getloadavg()[0]
    rows = measure(trees, args.pairs)
    invocation = shlex.join(["python", "bench/startup.py", *sys.argv[1:]])
    text = report(rows, trees, invocation, (load, os.getloadavg()[0]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), RESULTS / "startup.parquet")
    (RESULTS / "startup.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
