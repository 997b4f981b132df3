"""RL-Baselines3-Zoo's own pipeline on this machine, beside ``bench/zoo.py``'s rows: whether a
row that misses RL-Zoo's published figure misses it against Stable-Baselines3 itself.

    python -m venv /tmp/zoo3
    /tmp/zoo3/bin/pip install --constraint constraints.txt rl_zoo3==2.9.2 'gymnasium[box2d,mujoco]'
    python bench/zoo_rlzoo.py --python /tmp/zoo3/bin/python --algos a2c --tasks LunarLander-v3
    python bench/zoo_rlzoo.py --report-only

The published figure (RL-Zoo's ``benchmark.md``) is one trained agent per pair. Each run here
trains Stable-Baselines3 with RL-Zoo's ``train`` (``python -m rl_zoo3.train``) for the budget
of the zoo's row of the pair, on the zoo's seeds, with RL-Zoo's hyperparameter set for the
pair (on an env version RL-Zoo does not tune, the set of the latest earlier version:
``Hopper-v4``'s for ``Hopper-v5``), its env wrappers and normalisation, one torch thread as
the zoo's runs have, and no evaluation callback. It then evaluates the final model as the
zoo evaluates rlfleet's: the mean return of ``--final-episodes`` greedy episodes (sampled on
Atari), each reset with its own seed from the run seed's ``evaluation`` stream
(:func:`rlfleet.seeding.episode_seed`, then the next seeds one by one). The start states are
of the same kind as the zoo's, not the same ones: rlfleet's final evaluation runs several
envs that reset on their own.

RL-Zoo runs in an interpreter of its own (``--python``), where ``rl_zoo3`` and its
dependencies are installed: installed beside rlfleet's dev set, they would replace Pillow and
python-dateutil with older versions. That interpreter runs ``bench/rlzoo_agent.py`` to read
the hyperparameter set and to evaluate; nothing of rlfleet is imported there. A pair RL-Zoo
has no set for is not run.

Rows go to ``bench/results/zoo_rlzoo.parquet`` (one per run, written as it ends, under the
zoo's file lock; a rerun skips the runs already there: same algorithm, task, seed, budget,
final evaluation and RL-Zoo set), with the versions of RL-Zoo, Stable-Baselines3, torch and
the packages that built the env in RL-Zoo's interpreter, which may differ from rlfleet's
(the zoo's :data:`SUITE_PACKAGES`). ``docs/benchmarks.md`` (``bench/zoo.py``'s page, rebuilt at
the end) shows them in a table of their own beside the zoo's row of each pair. Wall time is
the whole ``rl_zoo3.train`` process, imports included, so it is not comparable with the
zoo's (training only), and no speed is claimed from it: speed is ``bench/ppo_cartpole.py``'s
and its siblings'.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import zoo
from harness import machine, source_commit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlfleet.seeding import episode_seed

AGENT = Path(__file__).resolve().parent / "rlzoo_agent.py"
ALGOS = ("a2c", "ddpg", "dqn", "ppo", "sac", "td3", "trpo")
"""rlfleet's algorithms that RL-Zoo trains under the same name."""


@dataclass(frozen=True)
class RLZooRun:
    """One run of RL-Zoo's pipeline."""

    algo: str
    env_id: str
    seed: int
    budget: int
    budget_kind: str
    rl_zoo_budget: int | None
    threads: int
    final_episodes: int
    final_sampled: bool
    hyperparams: str
    """RL-Zoo's set for the pair, as canonical JSON (:func:`zoo.canonical`)."""
    hyperparams_source: str = ""
    """The key of RL-Zoo's ``hyperparams/ALGO.yml`` the set is under: the env id, ``atari``,
    or an earlier version of the env (``Hopper-v4`` for ``Hopper-v5``)."""

    @property
    def key(self) -> tuple[Any, ...]:
        return (
            self.algo,
            self.env_id,
            self.seed,
            self.budget,
            self.final_episodes,
            self.final_sampled,
            self.hyperparams,
        )

    @property
    def name(self) -> str:
        return f"RL-Zoo {self.algo} {self.env_id} seed {self.seed} ({self.budget:,} steps)"


def row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return RLZooRun(**{f: row[f] for f in RLZooRun.__dataclass_fields__ if f in row}).key


def agent(python: str, *words: str) -> Any:
    """Run ``bench/rlzoo_agent.py`` in RL-Zoo's interpreter and return the JSON of its last
    line. Raises RuntimeError with the agent's last lines of output where it fails."""
    try:
        done = subprocess.run(
            [python, str(AGENT), *words], capture_output=True, text=True, check=False
        )
    except OSError as error:  # no such interpreter, or not one that can run
        raise RuntimeError(f"cannot run {python}: {error.strerror}") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        raise RuntimeError(f"{python} {AGENT.name} {' '.join(words)} failed: {tail}")
    return json.loads(lines[-1])


def evaluation_seeds(seed: int, episodes: int) -> list[int]:
    """One reset seed per final episode: the run seed's ``evaluation`` stream and the next."""
    first = episode_seed(seed, "evaluation")
    return [first + i for i in range(episodes)]


def plan(args: argparse.Namespace) -> tuple[list[RLZooRun], list[tuple[str, str, str]]]:
    """The runs the filters select (each pair at the zoo's budget for it), and (algorithm,
    env id, why) of the pairs left out."""
    chosen = [a for a in (args.algos or ALGOS) if a in ALGOS]
    skipped = [(a, "*", "RL-Zoo has no such algorithm") for a in args.algos or () if a not in ALGOS]
    pairs, left = zoo.suite_pairs(chosen, args.tasks, args.budget_scale, capped=not args.uncapped)
    skipped += left
    runs: list[RLZooRun] = []
    asked = [f"{pair.algo}:{pair.task.env_id}" for pair in pairs]
    sets = agent(args.python, "hyperparams", *asked) if asked else []
    for pair, found in zip(pairs, sets, strict=True):
        env_id = pair.task.env_id
        if found is None:
            skipped.append((pair.algo, env_id, "RL-Zoo has no hyperparameter set for it"))
            continue
        runs += [
            RLZooRun(
                pair.algo,
                env_id,
                seed,
                pair.budget,
                pair.budget_kind,
                pair.rl_zoo_budget,
                args.threads,
                args.final_episodes,
                pair.task.suite == "atari",
                zoo.canonical(found["set"]),
                found["source"],
            )
            for seed in range(args.seeds)
        ]
    return runs, skipped


def run_one(run: RLZooRun, python: str) -> dict[str, Any]:
    """Train ``run`` with ``rl_zoo3.train`` in a scratch folder and evaluate its final model;
    returns its result row. Raises RuntimeError where either step fails."""
    with tempfile.TemporaryDirectory(prefix="rlzoo-") as folder:
        log = Path(folder) / "train.log"
        # RL-Zoo's set under the env's own id: RL-Zoo reads it as it reads its own file
        # (JSON is YAML), also where the set is an earlier version's.
        conf = Path(folder) / "hyperparams.yml"
        conf.write_text(json.dumps({run.env_id: json.loads(run.hyperparams)}))
        command = [
            python,
            "-m",
            "rl_zoo3.train",
            *("--algo", run.algo, "--env", run.env_id, "--seed", str(run.seed)),
            *("-n", str(run.budget), "-f", folder, "--conf-file", str(conf)),
            *("--eval-freq", "-1"),
            *("--num-threads", str(run.threads), "--vec-env", "dummy", "--verbose", "0"),
        ]
        start = time.perf_counter()
        with open(log, "w") as out:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
        wall_s = time.perf_counter() - start
        if code.returncode != 0:
            tail = " | ".join(log.read_text().strip().splitlines()[-3:])
            raise RuntimeError(f"rl_zoo3.train exited {code.returncode}: {tail}")
        start = time.perf_counter()
        returns = agent(
            python,
            "evaluate",
            run.algo,
            run.env_id,
            folder,
            "--seeds",
            ",".join(map(str, evaluation_seeds(run.seed, run.final_episodes))),
            *(["--sampled"] if run.final_sampled else []),
        )
    return {
        **asdict(run),
        "final_return": float(sum(returns) / len(returns)),
        "episode_returns": [float(r) for r in returns],
        "wall_s": wall_s,
        "final_eval_s": time.perf_counter() - start,
    }


def execute(
    runs: Sequence[RLZooRun], store: Path, args: argparse.Namespace, command: str
) -> list[str]:
    """Run ``runs``, ``--jobs`` at a time (each is its own processes), adding each finished
    one to ``store`` at once; returns the failures."""
    versions = agent(args.python, "versions")
    where, commit = machine(), source_commit()
    failures: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(run_one, run, args.python): run for run in runs}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            run = futures[future]
            error = future.exception()
            if error is not None:
                failures.append(f"{run.name}: {error}")
                print(f"[{done}/{len(runs)}] FAILED {run.name}: {error}", flush=True)
                continue
            row = future.result()
            row.update(
                rl_zoo3=versions["rl_zoo3"],
                stable_baselines3=versions["stable_baselines3"],
                torch=versions["torch"],
                env_packages=zoo.env_packages(zoo.suite_of(run.env_id), versions["packages"]),
                machine=where,
                commit=commit,
                concurrent_runs=args.jobs,
                finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                command=command,
            )
            zoo.add_row(store, row)
            print(
                f"[{done}/{len(runs)}] {run.name}: final {row['final_return']:.1f}, "
                f"{row['wall_s']:.0f} s",
                flush=True,
            )
    return failures


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--python", help="the interpreter where rl_zoo3 is installed (not needed to report)"
    )
    parser.add_argument(
        "--algos", type=zoo.names, help=f"comma-separated algorithms (default: {','.join(ALGOS)})"
    )
    parser.add_argument("--tasks", type=zoo.names, help="comma-separated env ids or suites")
    parser.add_argument("--seeds", type=int, default=zoo.SEEDS, help="seeds per pair (0..N-1)")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="as bench/zoo.py's")
    parser.add_argument("--uncapped", action="store_true", help="as bench/zoo.py's")
    parser.add_argument(
        "--final-episodes", type=int, default=100, help="episodes of the final model (1 or more)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side on this machine")
    parser.add_argument("--report-only", action="store_true", help="rebuild the page only")
    parser.add_argument("--results", type=Path, default=zoo.RESULTS, help=argparse.SUPPRESS)
    parser.add_argument("--page", type=Path, default=zoo.PAGE, help=argparse.SUPPRESS)
    parser.add_argument("--images", type=Path, default=zoo.IMAGES, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = argument_parser()
    args = parser.parse_args(argv)
    if not args.report_only and not args.python:
        parser.error("--python: expected the interpreter where rl_zoo3 is installed")
    if args.final_episodes < 1:
        parser.error(f"--final-episodes: expected 1 or more episodes, got {args.final_episodes}")
    if (why := zoo.unknown_tasks(args.tasks)) is not None:
        parser.error(why)
    store = args.results.with_name(zoo.RLZOO)
    failures: list[str] = []
    if not args.report_only:
        try:
            runs, skipped = plan(args)
        except RuntimeError as error:
            parser.error(f"--python: {error}")
        finished = {row_key(r) for r in zoo.read_rows(store)}
        todo = [r for r in runs if r.key not in finished]
        print(f"{len(runs)} runs selected, {len(runs) - len(todo)} already in {store}", flush=True)
        for algo, env_id, why in skipped:
            print(f"not run: {algo} on {env_id}: {why}", flush=True)
        command = shlex.join(
            ["python", "bench/zoo_rlzoo.py", *(sys.argv[1:] if argv is None else argv)]
        )
        failures = execute(todo, store, args, command)
    report = ["--report-only", "--results", str(args.results), "--page", str(args.page)]
    code = zoo.main([*report, "--images", str(args.images)])
    return zoo.finish(failures) or code


if __name__ == "__main__":
    sys.exit(main())
