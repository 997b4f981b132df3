"""Soak test: training runs killed with SIGKILL at random moments, resumed after every kill.

    PYTHONPATH=$PWD python bench/soak.py --kills 200

Four small runs with frequent checkpoints are used: PPO and DQN on CartPole-v1, SAC on
Pendulum-v1, and PPO agents on PettingZoo's tic-tac-toe (a multi-agent run). Each algorithm
first trains once, never killed: its reference run. Then, run after run, it starts the same
command (same seed) as a fresh ``rlfleet train`` process and sends it SIGKILL after a
delay drawn uniformly between zero and the reference run's wall time. After each kill the
next process is ``rlfleet train ... --resume RUN_DIR``, or, when the kill came before the
run's first checkpoint (nothing to resume from), the original command with ``--force``, as
rlfleet's own interrupt message advises. After a run's share of kills its last process
trains to the end. The kills are spread evenly over the four algorithms.

What the report counts:

- **survived**: every process after a kill started (no resume failed) and the run trained
  to its end (exit code 0).
- **history rows lost**: after each kill, the interval rows (not per-episode rows) on disk up
  to the checkpoint the next process resumes from are committed: the run must keep them. A
  row lost is a committed row that the run's final history lacks (``time/`` columns left
  out of the comparison).
- **against the unkilled run**: **rows missing**, interval rows of the reference run whose
  ``env_step`` the killed run's final history lacks; **rows changed**, rows at the same
  ``env_step`` in both with other values; **rows extra**, rows only the killed run has (a
  duplicate would be one). A run that resumes exactly has none of these.
- **bitwise exact**: the killed run's final checkpoint has the reference run's name and
  every tensor of it (parameters, optimiser state) is byte for byte the reference's.
- **time to recover**: wall time from the start of a resume process to the moment
  ``latest.json`` first names a checkpoint newer than the one it resumed from (Python
  start-up, imports, loading, and training back to the next epoch boundary). Resumes killed
  again before that are left out of this figure.

Results go to ``bench/results/soak.md`` and ``soak.parquet`` (one row per run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from harness import RESULTS, machine
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from safetensors.numpy import load_file

from rlfleet.checkpoint import read_metadata
from rlfleet.checkpoint.manager import CheckpointManager
from rlfleet.logging.history import is_episode_row, read_history

COMMON = ["--torch-threads", "1", "--deterministic", "--no-show-progress", "--no-verbose"]
CARTPOLE = ["--env", "CartPole-v1"]
ALGORITHMS: dict[str, list[str]] = {
    "PPO CartPole-v1": [
        "train", "ppo", *CARTPOLE, "--max-steps", "3840", "--epoch-num-steps", "256",
        "--num-steps", "64", "--num-envs", "2", "--batch-size", "64", "--num-epochs", "2",
    ],
    "DQN CartPole-v1": [
        "train", "dqn", *CARTPOLE, "--max-steps", "3000", "--epoch-num-steps", "250",
        "--learning-starts", "500", "--num-envs", "2", "--buffer-size", "5000",
    ],
    "SAC Pendulum-v1": [
        "train", "sac", "--env", "Pendulum-v1", "--max-steps", "1200",
        "--epoch-num-steps", "200", "--learning-starts", "200", "--batch-size", "64",
    ],
    "PPO tic-tac-toe (multi-agent)": [
        "train", "ppo", "--env", "pettingzoo:pettingzoo.classic.tictactoe_v3",
        "--max-episodes", "120", "--epoch-num-steps", "150", "--num-envs", "4",
    ],
}  # fmt: skip
"""Each algorithm's command, without seed and run directory."""

KILLS_PER_RUN = 5
"""Kills before a run's last process is left to finish."""
POLL_S = 0.01
CLI = "import sys; from rlfleet.cli.main import main; sys.exit(main(sys.argv[1:]))"


@dataclass
class RunResult:
    """One killed-and-resumed run."""

    algorithm: str
    run: str
    kills: int = 0
    restarts: int = 0
    """Processes started afresh because a kill came before the first checkpoint."""
    resumes: int = 0
    failed: str = ""
    """The first process after a kill that exited with an error: its exit code and output."""
    survived: bool = False
    rows_committed: int = 0
    """Interval rows on disk up to a resumed-from checkpoint after some kill (distinct)."""
    rows_lost: int = 0
    """Committed rows the final history lacks."""
    lost: str = ""
    """The first committed rows lost, and when each was committed (for the report)."""
    rows_reference: int = 0
    rows_missing: int = 0
    rows_changed: int = 0
    rows_extra: int = 0
    bitwise_exact: bool = False
    recover_s: list[float] = field(default_factory=list)


def latest_name(run_dir: Path) -> str | None:
    """The checkpoint ``latest.json`` names, or None."""
    try:
        return str(json.loads((run_dir / "checkpoints" / "latest.json").read_text())["name"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def spawn(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-c", CLI, *argv], stdout=out, stderr=out)


def watch(
    process: subprocess.Popen[bytes], kill_after: float | None, run_dir: Path, before: str | None
) -> tuple[int | None, float | None]:
    """Wait for ``process``, sending SIGKILL after ``kill_after`` seconds unless it ended;
    returns its exit code (None: killed) and when ``latest.json`` first moved off
    ``before`` (seconds after the start), if it did."""
    start = time.perf_counter()
    moved: float | None = None
    while True:
        now = time.perf_counter() - start
        code = process.poll()
        if moved is None and latest_name(run_dir) not in (before, None):
            moved = now
        if code is not None:
            return code, moved
        if kill_after is not None and now >= kill_after:
            process.send_signal(signal.SIGKILL)
            process.wait()
            return None, moved
        time.sleep(POLL_S)


def interval_rows(run_dir: Path) -> dict[int, list[tuple[tuple[str, Any], ...]]]:
    """The history's interval rows by env_step, each without its ``time/`` columns."""
    rows: dict[int, list[tuple[tuple[str, Any], ...]]] = {}
    if not (run_dir / "history.parquet").exists():
        return rows
    for row in read_history(run_dir / "history.parquet"):
        if is_episode_row(row):
            continue
        # repr: exact for floats, and a NaN equals itself.
        kept = tuple(sorted((k, repr(v)) for k, v in row.items() if not k.startswith("time/")))
        rows.setdefault(int(row["env_step"] or 0), []).append(kept)
    return rows


def digest(run_dir: Path) -> str:
    """The final checkpoint's name and a hash of every tensor in it."""
    latest = CheckpointManager(run_dir / "checkpoints", readonly=True).latest()
    if latest is None:
        return "no checkpoint"
    h = hashlib.sha256()
    for path in sorted(latest.rglob("*.safetensors")):
        tensors = load_file(str(path))
        for key in sorted(tensors):
            h.update(str(path.relative_to(latest)).encode() + key.encode())
            h.update(tensors[key].tobytes())
    return f"{latest.name}:{h.hexdigest()}"


@dataclass(frozen=True)
class Reference:
    wall_s: float
    rows: dict[int, list[tuple[tuple[str, Any], ...]]]
    digest: str


def reference(algorithm: str, seed: int, root: Path) -> Reference:
    run_dir = root / "reference"
    argv = [*ALGORITHMS[algorithm], "--seed", str(seed), *COMMON, "--run-dir", str(run_dir)]
    start = time.perf_counter()
    code, _ = watch(spawn(argv, root / "reference.log"), None, run_dir, None)
    wall = time.perf_counter() - start
    if code != 0:
        log = (root / "reference.log").read_text()[-2000:]
        raise RuntimeError(f"{algorithm}: the reference run exited with {code}:\n{log}")
    return Reference(wall, interval_rows(run_dir), digest(run_dir))


def soak(
    algorithm: str, run: str, kills: int, seed: int, ref: Reference, root: Path, rng: random.Random,
    on_kill: Callable[[], None],
) -> RunResult:  # fmt: skip
    """Train one run to its end, killing it ``kills`` times on the way."""
    result = RunResult(algorithm, run)
    run_dir = root / f"run{run}"
    fresh = [*ALGORITHMS[algorithm], "--seed", str(seed), *COMMON, "--run-dir", str(run_dir)]
    argv = fresh
    resuming = False
    committed: dict[tuple[tuple[str, Any], ...], str] = {}
    for attempt in range(kills + 1):
        kill_after = rng.uniform(0.0, ref.wall_s) if result.kills < kills else None
        before = latest_name(run_dir)
        log = root / f"run{run}-{attempt}.log"
        code, moved = watch(spawn(argv, log), kill_after, run_dir, before)
        if resuming and moved is not None:
            result.recover_s.append(moved)
        if code is not None and code != 0:
            result.failed = f"exit code {code}: {log.read_text()[-1500:]}"
            return result
        if code == 0:
            break
        result.kills += 1
        on_kill()
        latest = CheckpointManager(run_dir / "checkpoints", readonly=True).latest()
        if latest is None:
            argv, resuming = [*fresh, "--force"], False
            result.restarts += 1
        else:
            step = int(read_metadata(latest)["counters"]["env_step"])
            on_disk = interval_rows(run_dir)
            when = f"kill {result.kills}, checkpoint {latest.name}"
            for at, rows in on_disk.items():
                for row in rows:
                    if at <= step:
                        committed.setdefault(row, when)
            resume = [*ALGORITHMS[algorithm][:2], "--resume", str(run_dir), *COMMON]
            argv, resuming = resume, True
            result.resumes += 1
    result.survived = True
    rows = interval_rows(run_dir)
    final = {row for got in rows.values() for row in got}
    result.rows_committed = len(committed)
    lost = [(row, when) for row, when in committed.items() if row not in final]
    result.rows_lost = len(lost)
    result.lost = "; ".join(f"{dict(row)} (at {when})" for row, when in lost[:3])
    result.rows_reference = sum(len(v) for v in ref.rows.values())
    for step, expected in ref.rows.items():
        got = rows.get(step, [])
        result.rows_missing += max(0, len(expected) - len(got))
        result.rows_changed += sum(a != b for a, b in zip(expected, got, strict=False))
    for step, got in rows.items():
        result.rows_extra += max(0, len(got) - len(ref.rows.get(step, [])))
    result.bitwise_exact = digest(run_dir) == ref.digest
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def plan(kills: int) -> list[tuple[str, int, int]]:
    """(algorithm, run index, kills) of every run: kills spread evenly, KILLS_PER_RUN a run."""
    out: list[tuple[str, int, int]] = []
    names = list(ALGORITHMS)
    for i, algorithm in enumerate(names):
        share = kills // len(names) + (i < kills % len(names))
        run = 0
        while share > 0:
            out.append((algorithm, run, min(KILLS_PER_RUN, share)))
            share -= KILLS_PER_RUN
            run += 1
    return out


def _median_max(values: list[float]) -> str:
    if not values:
        return "— | —"
    return f"{statistics.median(values):.2f} | {max(values):.2f}"


def report(
    results: list[RunResult], refs: dict[str, Reference], args: argparse.Namespace, wall_s: float
) -> str:
    lines = [
        f"# Soak test: random SIGKILLs and resumes ({time.strftime('%Y-%m-%d')})",
        "",
        f"`python bench/soak.py --kills {args.kills}"
        + (f' --only "{args.only}"' if args.only else "")
        + f" --seed {args.seed} --jobs {args.jobs}`: "
        f"{len(results)} runs, up to {KILLS_PER_RUN} kills each at a random moment (uniform "
        "over the reference run's wall time), each followed by `rlfleet train --resume "
        "RUN_DIR` (or a fresh start with `--force` when the kill came before the first "
        "checkpoint). Compared with an unkilled reference run of the same seed. "
        f"Total wall time {wall_s:.0f} s.",
        "",
        f"Machine: {machine()}. Reference runs' wall time: "
        + ", ".join(f"{a} {ref.wall_s:.1f} s" for a, ref in refs.items())
        + ".",
        "",
        "| algorithm | runs | kills | resumes | fresh restarts | survived | committed rows "
        "lost | rows missing vs unkilled | rows changed | rows extra | bitwise exact | "
        "recover, median s | recover, max s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups = [*dict.fromkeys(r.algorithm for r in results), "total"]
    for group in groups:
        rs = [r for r in results if group in ("total", r.algorithm)]
        recover = [s for r in rs for s in r.recover_s]
        label = f"**{group}**" if group == "total" else group
        lines.append(
            f"| {label} | {len(rs)} | {sum(r.kills for r in rs)} | "
            f"{sum(r.resumes for r in rs)} | {sum(r.restarts for r in rs)} | "
            f"{sum(r.survived for r in rs)}/{len(rs)} | {sum(r.rows_lost for r in rs)} "
            f"(of {sum(r.rows_committed for r in rs)}) | {sum(r.rows_missing for r in rs)} "
            f"(of {sum(r.rows_reference for r in rs)}) | {sum(r.rows_changed for r in rs)} | "
            f"{sum(r.rows_extra for r in rs)} | {sum(r.bitwise_exact for r in rs)}/{len(rs)} | "
            f"{_median_max(recover)} |"
        )
    for r in results:
        if r.lost:
            lines += ["", f"Committed rows lost in {r.algorithm}, run {r.run}: {r.lost}"]
    failures = [r for r in results if r.failed]
    lines += ["", f"Failed resumes: {len(failures)}."]
    for r in failures:
        lines_out = r.failed.strip().splitlines()
        last = next((x for x in lines_out if "rror" in x), lines_out[-1] if lines_out else "")
        lines += ["", f"- {r.algorithm}, run {r.run}: {last}"]
    lines += [
        "",
        "Survived: no process after a kill failed and the run trained to its end. Committed "
        "rows lost: interval rows on disk, up to the checkpoint a resume continued from, that "
        "the final history lacks. Against the unkilled run of the same seed: missing, its "
        "interval rows at an `env_step` the killed run lacks; changed, same `env_step`, other "
        "values (`time/` columns aside); extra, rows only the killed run has. Bitwise exact: "
        "the final checkpoint (name and every tensor, "
        "optimiser state included) equals the reference run's. Recover: from the start of a "
        "resume process until `latest.json` names a newer checkpoint (start-up, loading, and "
        "training to the next epoch boundary); resumes killed again before that are left out.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200, help="kills over all algorithms")
    parser.add_argument("--seed", type=int, default=0, help="training seed and kill timing")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel")
    parser.add_argument("--out", type=Path, default=RESULTS / "soak.md", help="report file")
    parser.add_argument(
        "--only", choices=list(ALGORITHMS), default=None, help="soak one algorithm only"
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    runs = [run for run in plan(args.kills) if args.only in (None, run[0])]
    algorithms = list(dict.fromkeys(a for a, _, _ in runs))
    lock = threading.Lock()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="rlfleet-soak-") as tmp, Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    ) as progress:  # fmt: skip
        root = Path(tmp)
        for a in algorithms:
            (root / a.split()[0] / a.split()[1]).mkdir(parents=True, exist_ok=True)

        def where(a: str) -> Path:
            return root / a.split()[0] / a.split()[1]

        refs_task = progress.add_task("reference runs", total=len(algorithms))
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = {a: pool.submit(reference, a, args.seed, where(a)) for a in algorithms}
            refs = {}
            for a, f in futures.items():
                refs[a] = f.result()
                progress.advance(refs_task)
        kills_task = progress.add_task("kills", total=sum(k for _, _, k in runs))
        runs_task = progress.add_task("runs", total=len(runs))

        def on_kill() -> None:
            with lock:
                progress.advance(kills_task)

        def one(a: str, run: int, kills: int, run_rng: random.Random) -> list[RunResult]:
            """The planned run, then, while it ended before its share of kills, more runs."""
            done: list[RunResult] = []
            n = 0
            while kills > 0 and not (done and done[-1].failed):
                result = soak(
                    a, f"{run}.{n}", kills, args.seed, refs[a], where(a), run_rng, on_kill
                )
                n += 1
                # A run that ended before its first kill was never killed: it is not counted.
                if result.kills or result.failed:
                    done.append(result)
                    kills -= result.kills
            progress.advance(runs_task)
            return done

        with ThreadPoolExecutor(args.jobs) as pool:
            jobs = [pool.submit(one, a, r, k, random.Random(rng.random())) for a, r, k in runs]
            results = [r for j in jobs for r in j.result()]
    wall = time.perf_counter() - start
    text = report(results, refs, args, wall)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    pq.write_table(
        pa.Table.from_pylist([asdict(r) for r in results]), args.out.with_suffix(".parquet")
    )
    print(text)
    if any(not r.survived or r.rows_lost for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
