"""``bench/zoo_rlzoo.py``'s own work, with a stand-in for RL-Zoo's interpreter (RL-Zoo is not
in rlfleet's environment): which pairs it runs, what it asks RL-Zoo to train and evaluate,
what it stores, that it resumes, that it reports a failed run, and the page's table."""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pyarrow.parquet as pq
import pytest

# Answers as RL-Zoo's interpreter would: ``-m rl_zoo3.train`` exits with 3 for the seed
# ``FAILING_SEED``; ``rlzoo_agent.py`` has a set for PPO only (CartPole-v0's, as for an env
# version RL-Zoo does not tune) and "evaluates" each episode seed to ``seed % 100``. Each call
# is logged, one JSON line of its arguments and, for training, the config file it was given.
STAND_IN = """
import json, sys
from pathlib import Path

args = sys.argv[1:]
conf = args[args.index("--conf-file") + 1] if "--conf-file" in args else None
with open(Path(__file__).with_name("calls.jsonl"), "a") as log:
    log.write(json.dumps([*args, json.loads(Path(conf).read_text()) if conf else None]) + "\\n")
if args[:2] == ["-m", "rl_zoo3.train"]:
    print("training")
    sys.exit(3 if int(args[args.index("--seed") + 1]) == FAILING_SEED else 0)
command = args[1]
print("a line of RL-Zoo's chatter")
if command == "versions":
    packages = {"gymnasium": "9.6", "Box2D": None, "mujoco": "9.5"}
    print(json.dumps({"rl_zoo3": "9.9", "stable_baselines3": "9.8", "torch": "9.7",
                      "packages": packages}))
elif command == "hyperparams":
    found = {"source": "CartPole-v0", "set": {"n_envs": 8, "policy": "MlpPolicy"}}
    print(json.dumps([found if pair.startswith("ppo:") else None for pair in args[2:]]))
elif command == "evaluate":
    seeds = [int(s) for s in args[args.index("--seeds") + 1].split(",")]
    print(json.dumps([s % 100 for s in seeds]))
"""


@pytest.fixture
def rlzoo(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    pytest.importorskip("rliable")
    return bench_module("zoo_rlzoo")


def stand_in(tmp_path: Path, failing_seed: int = -1) -> Path:
    """An executable that answers as RL-Zoo's interpreter (:data:`STAND_IN`). A shell script
    that runs this interpreter on it: a ``#!`` line of a long interpreter path would not run."""
    script = tmp_path / "rlzoo_stand_in.py"
    script.write_text(STAND_IN.replace("FAILING_SEED", str(failing_seed)))
    path = tmp_path / "rlzoo-python"
    path.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(script))} "$@"\n'
    )
    path.chmod(0o755)
    return path


def calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def trained(tmp_path: Path) -> list[list[str]]:
    return [c for c in calls(tmp_path) if c[:2] == ["-m", "rl_zoo3.train"]]


def arguments(tmp_path: Path, python: Path) -> list[str]:
    # CartPole: PPO's RL-Zoo budget of 100k scaled to 1,000 steps.
    return [
        *("--python", str(python), "--algos", "ppo,dqn,acer", "--tasks", "CartPole-v1"),
        *("--seeds", "2", "--final-episodes", "3", "--budget-scale", "0.01"),
        *("--results", str(tmp_path / "zoo.parquet")),
        *("--page", str(tmp_path / "benchmarks.md"), "--images", str(tmp_path / "images")),
    ]


def test_runs_rl_zoo_on_the_pairs_it_has_a_set_for_and_stores_each_run(
    rlzoo: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python = stand_in(tmp_path)
    assert rlzoo.main(arguments(tmp_path, python)) == 0
    out = capsys.readouterr().out
    assert "not run: acer on *: RL-Zoo has no such algorithm" in out
    assert "not run: dqn on CartPole-v1: RL-Zoo has no hyperparameter set for it" in out

    # Every pair's set is asked for in one process (RL-Zoo takes seconds to import).
    asked = [c[2:-1] for c in calls(tmp_path) if c[1:2] == ["hyperparams"]]
    assert asked == [["ppo:CartPole-v1", "dqn:CartPole-v1"]]

    runs = trained(tmp_path)
    assert sorted(r[r.index("--seed") + 1] for r in runs) == ["0", "1"]
    for run in runs:
        assert run[run.index("--algo") + 1] == "ppo"
        assert run[run.index("--env") + 1] == "CartPole-v1"
        assert run[run.index("-n") + 1] == "1000"  # the zoo's budget for the pair, scaled
        assert run[run.index("--num-threads") + 1] == "1"
        assert run[run.index("--eval-freq") + 1] == "-1"
        assert not os.path.exists(run[run.index("-f") + 1])  # the scratch folder is gone
        # RL-Zoo's set, under the env's own id: RL-Zoo reads it for CartPole-v1.
        assert run[-1] == {"CartPole-v1": {"n_envs": 8, "policy": "MlpPolicy"}}

    rows = sorted(
        pq.read_table(tmp_path / "zoo_rlzoo.parquet").to_pylist(), key=lambda r: r["seed"]
    )
    assert [r["seed"] for r in rows] == [0, 1]
    for row in rows:
        seeds = rlzoo.evaluation_seeds(row["seed"], 3)
        assert seeds[0] == rlzoo.episode_seed(row["seed"], "evaluation")
        assert row["episode_returns"] == [s % 100 for s in seeds]
        assert row["final_return"] == pytest.approx(statistics.mean(s % 100 for s in seeds))
        assert json.loads(row["hyperparams"]) == {"n_envs": 8, "policy": "MlpPolicy"}
        assert row["hyperparams_source"] == "CartPole-v0"
        assert (row["rl_zoo3"], row["stable_baselines3"], row["budget"]) == ("9.9", "9.8", 1000)
        # The env packages of RL-Zoo's interpreter, for the task's suite (classic control).
        assert row["env_packages"] == "gymnasium 9.6"
    # The two seeds play start states of their own.
    assert not set(rlzoo.evaluation_seeds(0, 3)) & set(rlzoo.evaluation_seeds(1, 3))

    page = (tmp_path / "benchmarks.md").read_text()
    assert "## RL-Zoo's own pipeline on this machine" in page
    line = next(x for x in page.splitlines() if x.startswith("| ppo | CartPole-v1 | 1k"))
    iqm = statistics.mean(r["final_return"] for r in rows)  # of two seeds: their mean
    assert f"| {iqm:.1f} [" in line
    assert "| not run |" in line  # no rlfleet runs of the pair stored
    assert "rl_zoo3 9.9, SB3 9.8; gymnasium 9.6; CartPole-v0's set" in line

    # A second command finds both runs stored and trains nothing.
    assert rlzoo.main(arguments(tmp_path, python)) == 0
    assert "2 runs selected, 2 already in" in capsys.readouterr().out
    assert len(trained(tmp_path)) == 2


def test_rl_zoos_interpreter_reports_every_package_that_builds_the_zoos_envs(
    rlzoo: ModuleType, bench_module: Callable[[str], ModuleType]
) -> None:
    agent = bench_module("rlzoo_agent")
    needed = {package for packages in rlzoo.zoo.SUITE_PACKAGES.values() for package in packages}
    assert needed == set(agent.ENV_PACKAGES)
    installed = {"gymnasium": "1.0", "mujoco": None}
    assert rlzoo.zoo.env_packages("mujoco", installed) == "gymnasium 1.0, mujoco not installed"


def test_the_versions_cell_names_every_set_of_versions_a_row_ran_with(rlzoo: ModuleType) -> None:
    first = {"rl_zoo3": "2.9.2", "stable_baselines3": "2.9.2", "env_packages": "gymnasium 1.4.0"}
    older = {"rl_zoo3": "2.9.2", "stable_baselines3": "2.9.2", "env_packages": None}
    cell = rlzoo.zoo.versions_cell([first, older, dict(first)])
    # Each distinct set once, in the order of the runs: no run's versions hidden by another's.
    assert cell == "rl_zoo3 2.9.2, SB3 2.9.2; gymnasium 1.4.0 / rl_zoo3 2.9.2, SB3 2.9.2"
    assert rlzoo.zoo.versions_cell([first, first]) == "rl_zoo3 2.9.2, SB3 2.9.2; gymnasium 1.4.0"


def test_a_failed_run_is_reported_and_stores_nothing(
    rlzoo: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert rlzoo.main(arguments(tmp_path, stand_in(tmp_path, failing_seed=1))) == 1
    err = capsys.readouterr().err
    assert "FAILED RL-Zoo ppo CartPole-v1 seed 1 (1,000 steps): rl_zoo3.train exited 3" in err
    rows = pq.read_table(tmp_path / "zoo_rlzoo.parquet").to_pylist()
    assert [r["seed"] for r in rows] == [0]


@pytest.mark.parametrize(
    ("python", "why"),
    [
        (Path(sys.executable), "No module named 'rl_zoo3'"),  # rlfleet's own interpreter
        (Path("/no/such/python"), "cannot run /no/such/python: No such file or directory"),
    ],
)
def test_an_interpreter_without_rl_zoo_is_refused_in_one_line(
    rlzoo: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    python: Path,
    why: str,
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        rlzoo.main(arguments(tmp_path, python))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error: --python: " in err[-1]
    assert why in err[-1]
    assert not (tmp_path / "zoo_rlzoo.parquet").exists()


def test_the_page_sets_rlfleet_beside_rl_zoo_on_this_machine(rlzoo: ModuleType) -> None:
    zoo = rlzoo.zoo
    digest = zoo.preset_digest("a2c", "LunarLander-v3")
    ours = [
        {
            "algo": "a2c",
            "env_id": "LunarLander-v3",
            "budget": 200_000,
            "seed": seed,
            "final_return": value,
            "named_preset": True,
            "preset_digest": digest,
        }
        for seed, value in enumerate([60.0, 70.0, 80.0, 90.0, 100.0])
    ]
    stale = {**ours[0], "seed": 5, "final_return": 1000.0, "preset_digest": "another"}
    theirs = [
        {
            "algo": "a2c",
            "env_id": "LunarLander-v3",
            "budget": 200_000,
            "seed": seed,
            "final_return": value,
            "final_episodes": 100,
            "final_sampled": False,
            "budget_kind": "rl-zoo",
            "rl_zoo3": "2.9.2",
            "stable_baselines3": "2.9.2",
            "wall_s": 46.0,
            "machine": "here",
            "command": "python bench/zoo_rlzoo.py --algos a2c",
        }
        for seed, value in enumerate([20.0, 30.0, 40.0, 50.0, 60.0])
    ]
    lines = zoo.rlzoo_table(theirs, [*ours, stale])
    line = next(x for x in lines if x.startswith("| a2c | LunarLander-v3 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2] == "200k (RL-Zoo's)"
    assert cells[4] == "100 episodes after"
    assert cells[5].startswith("40.0 [")  # IQM of 20..60
    assert cells[7].startswith("80.0 [")
    assert cells[7].endswith("(5)")
    assert cells[8] == "+40"
    assert cells[9] == zoo.published_cell("a2c", "LunarLander-v3")
    assert zoo.rlzoo_table([], ours) == []
