"""``bench/zoo.py`` end to end on one task at a tiny budget: runs in parallel processes, stores
each run, skips finished runs on a rerun, retries a failed one, and builds its page."""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rlfleet.algos import PPO
from rlfleet.errors import EnvSpecError
from rlfleet.runs import run as run_module


@pytest.fixture
def zoo(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    """bench/zoo.py as the module ``zoo``, importable by name (as worker processes need)."""
    pytest.importorskip("rliable")
    return bench_module("zoo")


def arguments(tmp_path: Path, *more: str) -> list[str]:
    # CartPole PPO: RL-Zoo's 100k steps scaled to 1,000; it runs four collections of 256 steps.
    return [
        "--algos",
        "ppo,bc",
        "--tasks",
        "CartPole-v1,NoSuchEnv-v0",
        "--budget-scale",
        "0.01",
        "--eval-episodes",
        "2",
        "--curve-points",
        "2",
        "--final-episodes",
        "3",
        "--results",
        str(tmp_path / "zoo.parquet"),
        "--page",
        str(tmp_path / "docs" / "benchmarks.md"),
        "--images",
        str(tmp_path / "docs" / "images"),
        *more,
    ]


def rows(tmp_path: Path) -> list[dict[str, Any]]:
    return pq.read_table(tmp_path / "zoo.parquet").to_pylist()


def not_run_line(page: str, algo: str, env_id: str) -> str:
    """The entry of the page's "Not run" list (``- ALGO on ENV, ENV: why``) that names
    ``algo`` on ``env_id`` ("" if none)."""
    for line in page.split("## Not run", 1)[-1].splitlines():
        named, _, envs = line.removeprefix("- ").partition(" on ")
        if named == algo and env_id in envs.split(": ", 1)[0].split(", "):
            return line
    return ""


def counted_runs(zoo: ModuleType, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The seeds of the runs the zoo trains from now on (it runs them serially, in this
    process), in the order it trains them."""
    calls: list[int] = []
    run_one = zoo.run_one

    def counted(spec: dict[str, Any]) -> dict[str, Any]:
        calls.append(spec["seed"])
        return run_one(spec)  # type: ignore[no-any-return]

    monkeypatch.setattr(zoo, "run_one", counted)
    return calls


def test_a_seed_list_plans_those_seeds_in_its_order_and_refuses_what_is_not_one(
    zoo: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = zoo.argument_parser()
    cartpole = ("--tasks", "CartPole-v1", "--algos", "ppo")
    args = parser.parse_args(arguments(tmp_path, *cartpole, "--seed-list", "7-8, 3,7"))
    assert [run.seed for run in zoo.plan(args).runs] == [7, 8, 3]
    args = parser.parse_args(arguments(tmp_path, *cartpole, "--seeds", "2"))
    assert [run.seed for run in zoo.plan(args).runs] == [0, 1]
    for bad, why in [
        (("--seed-list", "5-3"), "expected a range low-high, got '5-3'"),
        (("--seed-list", "-1"), "expected seeds (0 or more) and ranges such as 5-9, got '-1'"),
        (("--seed-list", " , "), "expected at least one seed, got ' , '"),
        (("--seeds", "2", "--seed-list", "3"), "not allowed with argument --seeds"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(arguments(tmp_path, *cartpole, *bad))
        assert exit_info.value.code == 2
        assert why in capsys.readouterr().err


def test_runs_resume_and_report(
    zoo: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(zoo, "TASKS", (*zoo.TASKS, zoo.Task("NoSuchEnv-v0", "classic")))
    assert zoo.main(arguments(tmp_path, "--seeds", "2", "--jobs", "2")) == 0
    first = rows(tmp_path)
    assert sorted((r["algo"], r["env_id"], r["seed"]) for r in first) == [
        ("ppo", "CartPole-v1", 0),
        ("ppo", "CartPole-v1", 1),
    ]
    for r in first:
        assert r["budget"] == 1_000
        assert r["budget_kind"] == "reduced"
        assert r["rl_zoo_budget"] == 100_000
        assert r["env_steps"] >= 1_000
        assert r["curve_steps"][-1] == r["env_steps"]
        # The final return is the policy's own evaluation after the budget; the last test
        # step is kept beside it.
        assert r["final_episodes"] == 3
        assert r["last_test_return"] == r["curve_returns"][-1]
        assert r["final_return"] >= 8  # CartPole episodes last at least 8 steps
        assert r["final_eval_s"] > 0
        assert r["best_return"] == max(r["curve_returns"])
        assert r["commit"]  # the code the run came from
        # ... and the packages that built its env (classic control: gymnasium alone).
        assert r["env_packages"] == f"gymnasium {metadata.version('gymnasium')}"
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert f"Env packages, per suite: classic: {first[0]['env_packages']}.\n" in page
    budget = "1k, ran 1.02k (**reduced**; RL-Zoo 100k, scaled by 0.01)"
    assert f"| ppo | CartPole-v1 | {budget} | 2 | 3 episodes after |" in page
    assert "500.0 (100k)" in page  # RL-Zoo's published figure and budget
    # The page's "Not run" list is the whole suite's, whatever the command's filters and
    # budget scale: an algorithm or a task the command left out is listed too, at the suite's
    # budget, and an offline algorithm once.
    assert "- bc on every task: learns offline: needs a dataset" in page
    assert "- cql on every task: learns offline: needs a dataset" in page
    assert "every algorithm on NoSuchEnv-v0: the env cannot be made" in page
    assert not_run_line(page, "dqn", "CartPole-v1").endswith("not run yet (50k env steps a run)")
    assert not_run_line(page, "ppo", "MountainCar-v0").endswith("(1M env steps a run)")
    # Why a reduced budget would not do is said beside the budget: a warm-up read from the
    # preset, and what was tried.
    assert not_run_line(page, "dqn", "ALE/Pong-v5").endswith(
        "(1M env steps a run; its preset's learning_starts is 100k steps, so a budget scaled "
        "by 0.1 would end before its first update)"
    )
    tried = zoo.TRIED["trpo", "ALE/Pong-v5"]
    assert not_run_line(page, "trpo", "ALE/Pong-v5").endswith(f"(1M env steps a run; {tried})")
    # It ran, on fewer seeds than a pair counts as complete at (5).
    assert not_run_line(page, "ppo", "CartPole-v1") == "- ppo on CartPole-v1: 2 of 5 seeds run"
    assert (tmp_path / "docs" / "images" / "CartPole-v1.png").stat().st_size > 0
    assert "](images/CartPole-v1.png)" in page
    # Random play on each task run, measured once and kept beside the results; CartPole's
    # actions are discrete, so it has no zero action.
    baselines = pq.read_table(tmp_path / "zoo_baselines.parquet").to_pylist()
    assert [(b["env_id"], b["baseline"], b["episodes"]) for b in baselines] == [
        ("CartPole-v1", "random play", 100),
        ("CartPole-v1", "zero action", 0),
    ]
    assert 15 < baselines[0]["mean_return"] < 35  # random CartPole episodes: about 22 steps
    # (whether 1,000 steps of PPO beat random play is the runs' business)
    assert f"| CartPole-v1 | {baselines[0]['mean_return']:.1f} | — | " in page

    # A selected pair with no finished run is named on the page, not left out silently.
    assert zoo.main(arguments(tmp_path, "--algos", "ppo,a2c", "--report-only")) == 0
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert not_run_line(page, "a2c", "CartPole-v1").endswith("not run yet (500k env steps a run)")
    assert not_run_line(page, "ppo", "CartPole-v1") == "- ppo on CartPole-v1: 2 of 5 seeds run"

    # A rerun skips every finished run; a third seed runs alone, and fails here.
    calls: list[int] = []
    run_one = zoo.run_one

    def failing(spec: dict[str, Any]) -> dict[str, Any]:
        calls.append(spec["seed"])
        raise RuntimeError("killed")

    monkeypatch.setattr(zoo, "run_one", failing)
    assert zoo.main(arguments(tmp_path, "--seeds", "3")) == 1
    assert calls == [2]
    assert rows(tmp_path) == first

    # The next rerun runs the failed seed again, from the start, and keeps the others.
    monkeypatch.setattr(zoo, "run_one", run_one)
    assert zoo.main(arguments(tmp_path, "--seeds", "3")) == 0
    after = rows(tmp_path)
    assert after[:2] == first
    assert [r["seed"] for r in after[2:]] == [2]
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert f"| ppo | CartPole-v1 | {budget} | 3 | 3 episodes after |" in page

    # The page is rebuilt from the results alone, the same.
    (tmp_path / "docs" / "benchmarks.md").unlink()
    assert zoo.main(arguments(tmp_path, "--seeds", "3", "--report-only")) == 0
    assert (tmp_path / "docs" / "benchmarks.md").read_text() == page


def test_the_page_names_the_env_packages_of_each_suite_and_the_runs_without(
    zoo: ModuleType,
) -> None:
    gym, mujoco = "gymnasium 1.4.0", "gymnasium 1.4.0, mujoco 4.0.1"
    runs = [
        {"suite": "mujoco", "env_packages": mujoco},
        {"suite": "mujoco", "env_packages": "gymnasium 1.4.0, mujoco 3.3.0"},
        {"suite": "classic", "env_packages": gym},
        {"suite": "classic", "env_packages": gym},
        {"suite": "box2d"},  # stored before runs recorded them
    ]
    assert zoo.env_packages_sentence(runs) == (
        f"Env packages, per suite: classic: {gym}; mujoco: gymnasium 1.4.0, mujoco 3.3.0 / "
        f"{mujoco}. Not recorded for 1 of the 5 runs (stored before runs recorded the "
        "versions of the packages that build their envs)."
    )
    assert zoo.env_packages_sentence(runs[:4]).endswith(f"mujoco 3.3.0 / {mujoco}.")
    assert zoo.env_packages_sentence(runs[4:]).startswith("Env packages: not recorded (the ")
    # Every suite's packages are named, gymnasium first; one not installed says so.
    assert set(zoo.SUITE_PACKAGES) == {task.suite for task in zoo.TASKS}
    assert all(packages[0] == "gymnasium" for packages in zoo.SUITE_PACKAGES.values())
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(zoo.SUITE_PACKAGES, "classic", ("gymnasium", "no-such-package"))
        assert zoo.env_packages("classic").endswith(", no-such-package not installed")


def test_pairs_without_a_named_preset_have_a_table_of_their_own(
    zoo: ModuleType, tmp_path: Path
) -> None:
    def row(algo: str, env_id: str, named: bool | None, adapted: str | None) -> dict[str, Any]:
        out = {
            "algo": algo, "env_id": env_id, "seed": 0, "budget": 1000, "budget_kind": "default",
            "rl_zoo_budget": None, "budget_scale": 1.0, "final_return": -150.0,
            "best_return": -120.0, "env_steps": 1000, "wall_s": 3.0, "curve_steps": [500, 1000],
            "curve_returns": [-200.0, -150.0], "note": "", "command": "python bench/zoo.py",
            "machine": "here", "finished": "2026-01-01T00:00:00", "rlfleet": "0",
            "eval_episodes": 2, "concurrent_runs": 1,
        }  # fmt: skip
        if named is not None:
            out.update(named_preset=named, adapted=adapted)
        return out

    rows = [
        row("ppo", "CartPole-v1", True, ""),
        row("ppo", "MountainCar-v0", False, "normalize_obs=True, normalize_reward=True"),
        # Written before the columns existed: counted as unadapted, which is current where
        # the rules adapt nothing (a pair they adapt would be stale).
        row("impala", "LunarLanderContinuous-v3", None, None),
    ]
    # Rows without the new columns are written with them, empty.
    zoo.write_rows(tmp_path / "zoo.parquet", rows)
    stored = pq.read_table(tmp_path / "zoo.parquet").to_pylist()
    assert stored[2]["adapted"] is None
    digest = zoo.preset_digest("impala", "LunarLanderContinuous-v3")
    key = ("impala", "LunarLanderContinuous-v3", 0, 1000, "", digest, "")
    assert zoo.row_key(stored[2]) == key  # no override: a zoo run, not a screen
    page = tmp_path / "benchmarks.md"
    text = zoo.report(stored, [], page, tmp_path / "images")
    named, generic = text.split("## Generic defaults, no named preset")
    assert "| ppo | CartPole-v1 |" in named
    assert "MountainCar" not in named.split("## Learning curves")[0]
    assert "LunarLander" not in named.split("## Learning curves")[0]
    generic = generic.split("## Learning curves")[0]
    assert "adapted settings |" in generic
    assert "| normalize_obs=True, normalize_reward=True |" in generic
    old = next(line for line in generic.splitlines() if line.startswith("| impala |"))
    assert old.endswith("| none |")
    # Rows run before the final evaluation existed say their final is the last test step.
    assert "| 1 | last test step (2) | -150.0 [" in old


def test_seeds_no_better_than_random_play_or_zero_action_are_counted(zoo: ModuleType) -> None:
    def row(algo: str, seed: int, final: float) -> dict[str, Any]:
        return {
            "algo": algo, "env_id": "Pendulum-v1", "seed": seed, "budget": 20_000,
            "budget_kind": "rl-zoo", "rl_zoo_budget": 20_000, "budget_scale": 1.0,
            "final_return": final, "best_return": final, "env_steps": 20_000, "wall_s": 3.0,
            "curve_steps": [20_000], "curve_returns": [final], "note": "",
            "command": "python bench/zoo.py", "machine": "here",
            "finished": "2026-01-01T00:00:00", "rlfleet": "0", "eval_episodes": 2,
            "concurrent_runs": 1, "named_preset": True, "adapted": "",
        }  # fmt: skip

    rows = [row("sac", 0, -150.0), row("sac", 1, -1170.0), row("td3", 0, -150.0)]
    baselines = {"Pendulum-v1": {"random play": -1200.0, "zero action": -1170.0}}
    groups = zoo.grouped(rows)
    # The better of the two is zero action's -1170: sac's seed 1 ends there, td3 above it.
    # (The page's section is this table: the end-to-end test above finds CartPole's line.)
    section = zoo.baseline_table(groups, baselines)
    assert section[0] == "## Learning nothing: random play and zero action"
    assert "| Pendulum-v1 | -1200 | -1170 | sac, 20k: 1 of 2 |" in section
    # A task whose rows all end above both says so; one without baselines has no line.
    baselines["Pendulum-v1"]["zero action"] = -1180.0
    assert "| Pendulum-v1 | -1200 | -1180 | none |" in zoo.baseline_table(groups, baselines)
    assert not any("Pendulum" in line for line in zoo.baseline_table(groups, {}))


def test_benchmarks_side_by_side_keep_each_others_rows(zoo: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "zoo.parquet"
    mine = zoo.add_row(path, {"algo": "ppo", "seed": 0})
    zoo.add_row(path, {"algo": "sac", "seed": 0})  # another bench/zoo.py, meanwhile
    rows = zoo.add_row(path, {"algo": "ppo", "seed": 1})
    assert mine == [{"algo": "ppo", "seed": 0}]
    assert [(r["algo"], r["seed"]) for r in rows] == [("ppo", 0), ("sac", 0), ("ppo", 1)]
    assert zoo.read_rows(path) == rows


def test_rerun_drops_the_selected_pairs_earlier_rows_only(zoo: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "zoo.parquet"
    for algo, env_id, seed in [
        ("trpo", "A", 0),
        ("trpo", "A", 1),
        ("trpo", "B", 0),
        ("ppo", "A", 0),
    ]:
        zoo.add_row(path, {"algo": algo, "env_id": env_id, "seed": seed})
    kept = zoo.drop_pairs(path, {("trpo", "A")})
    assert [(r["algo"], r["env_id"]) for r in kept] == [("trpo", "B"), ("ppo", "A")]
    assert zoo.read_rows(path) == kept


def test_a_negative_final_evaluation_is_refused(zoo: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        zoo.main(arguments(tmp_path, "--final-episodes", "-1", "--report-only"))
    assert exit_info.value.code == 2
    assert not (tmp_path / "docs" / "benchmarks.md").exists()


def test_uncapped_runs_take_rl_zoos_budget_past_the_suites_cap(zoo: ModuleType) -> None:
    hopper = next(task for task in zoo.TASKS if task.env_id == "Hopper-v5")
    assert zoo.budget_for("ppo", hopper, 1.0) == (300_000, "reduced", 1_000_000)
    assert zoo.budget_for("ppo", hopper, 1.0, capped=False) == (1_000_000, "rl-zoo", 1_000_000)
    # A pair RL-Zoo does not list gets the suite's default budget, uncapped too.
    assert zoo.budget_for("appo", hopper, 1.0, capped=False) == (1_000_000, "default", None)


def test_steps_go_on_a_log_scale_where_a_tasks_budgets_differ_fourfold_or_more(
    zoo: ModuleType,
) -> None:
    assert zoo.steps_on_log_scale([20_000.0, 1_000_000.0])
    assert zoo.steps_on_log_scale([250_000.0, 1_000_000.0])
    assert not zoo.steps_on_log_scale([300_000.0, 1_000_000.0])
    assert not zoo.steps_on_log_scale([1_000_000.0])
    assert not zoo.steps_on_log_scale([])


def test_the_margin_to_the_published_figure_keeps_its_sign_where_rounding_hides_it(
    zoo: ModuleType,
) -> None:
    published = zoo.RL_ZOO[("sac", "MountainCarContinuous-v0")].mean_return  # 94.679
    assert zoo.margin_cell("sac", "MountainCarContinuous-v0", 94.651) == "-0.03"
    assert zoo.margin_cell("sac", "MountainCarContinuous-v0", published + 0.012) == "+0.01"
    assert zoo.margin_cell("sac", "MountainCarContinuous-v0", published - 120.4) == "-120"
    assert zoo.margin_cell("sac", "NoSuchEnv-v0", 1.0) == ""


def test_a_run_is_built_on_the_threads_it_trains_on_as_rlfleet_train_builds_it(
    zoo: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The initial weights depend on the thread count: a row's seed must be the run that
    # `rlfleet train --torch-threads 1` gives, whatever the process's own count.
    built_on: list[int] = []

    class Recording(PPO):
        def _build(self) -> None:
            built_on.append(torch.get_num_threads())
            super()._build()

    monkeypatch.setattr(run_module, "get_algorithm", lambda name: Recording)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        args = arguments(tmp_path, "--seeds", "1", "--jobs", "1", "--threads", "1")
        args[1], args[3] = "ppo", "CartPole-v1"
        assert zoo.main(args) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
    assert built_on == [1]


def test_runs_of_other_adapted_settings_are_stale(zoo: ModuleType) -> None:
    # A pair without a named preset trains with what the rules adapt from a probe of the
    # env: a run stored under other adapted settings (before a rule changed) is stale.
    algo, env_id = "impala", "MountainCarContinuous-v0"
    now = zoo.current_adaptation(algo, env_id)
    assert now == zoo.adapted_label(zoo.default_run_config(algo, env_id, adapt=True))
    assert "action_noise_color=1.0" in now
    row = {
        "algo": algo,
        "env_id": env_id,
        "named_preset": False,
        "preset_digest": zoo.preset_digest(algo, env_id),
        "adapted": now,
    }
    assert not zoo.is_stale(row)
    assert zoo.is_stale({**row, "adapted": ""})
    # A named preset is never adapted: its rows are judged by the preset's digest alone.
    named = ("ppo", "CartPole-v1")
    assert zoo.current_adaptation(*named) == ""


def test_runs_of_an_env_this_machine_cannot_build_are_kept(
    zoo: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where an extra (Box2D, MuJoCo) is missing, the env cannot be probed, so the rules'
    # settings for it are unknown: its stored runs are kept rather than judged (a screen's
    # summary reads them so; the page is not written then: see the next test).
    def missing(env_id: str) -> NoReturn:
        raise EnvSpecError(f"{env_id!r} needs gymnasium's 'box2d' extra, which is not installed")

    zoo.current_adaptation.cache_clear()
    monkeypatch.setattr(zoo, "probed", missing)
    algo, env_id = "impala", "LunarLander-v3"
    row = {
        "algo": algo,
        "env_id": env_id,
        "named_preset": False,
        "preset_digest": zoo.preset_digest(algo, env_id),
        "adapted": "normalize_obs=True",
    }
    try:
        assert zoo.current_adaptation(algo, env_id) is None
        assert not zoo.is_stale(row)
        assert not zoo.is_stale({**row, "adapted": None})
        # The preset's digest is still read: a changed preset is stale without the env.
        assert zoo.is_stale({**row, "preset_digest": "0" * 12})
    finally:
        zoo.current_adaptation.cache_clear()


def test_no_page_is_written_without_an_env_that_stored_runs_trained_on(
    zoo: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The page could not tell which of that env's runs are current (the rules' settings come
    # from a probe of it), and would list the env as one that cannot be made beside its rows.
    monkeypatch.setattr(zoo, "TASKS", (*zoo.TASKS, zoo.Task("NoSuchEnv-v0", "classic")))
    zoo.add_row(tmp_path / "zoo.parquet", {"algo": "ppo", "env_id": "NoSuchEnv-v0", "seed": 0})
    assert zoo.main(arguments(tmp_path, "--report-only")) == 2
    assert not (tmp_path / "docs" / "benchmarks.md").exists()
    error = capsys.readouterr().err
    assert "stored runs trained on envs this machine cannot build: NoSuchEnv-v0 (" in error
    assert "--report-only" in error
    assert len(rows(tmp_path)) == 1  # the runs stay


def test_runs_of_a_changed_preset_are_left_out_and_kept(
    zoo: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def row(algo: str, env_id: str, seed: int, digest: str | None) -> dict[str, Any]:
        out = {
            "algo": algo, "env_id": env_id, "seed": seed, "budget": 1000, "budget_kind": "default",
            "rl_zoo_budget": None, "budget_scale": 1.0, "final_return": 100.0 + seed,
            "best_return": 120.0, "env_steps": 1000, "wall_s": 3.0, "curve_steps": [500, 1000],
            "curve_returns": [50.0, 100.0], "note": "", "command": "python bench/zoo.py",
            "machine": "here", "finished": f"2026-01-0{seed + 1}T00:00:00",
            "rlfleet": "0", "eval_episodes": 2, "concurrent_runs": 1, "named_preset": True,
            "adapted": "",
        }  # fmt: skip
        if digest is not None:
            out["preset_digest"] = digest
        return out

    current = zoo.preset_digest("ppo", "CartPole-v1")
    assert current == zoo.preset_digest("ppo", "CartPole-v1")
    assert current != zoo.preset_digest("ppo", "MountainCar-v0")  # a named section counts
    path = tmp_path / "zoo.parquet"
    zoo.write_rows(
        path,
        [
            row("ppo", "CartPole-v1", 0, "0ld0ld0ld0ld"),  # trained with an earlier preset
            row("ppo", "CartPole-v1", 1, current),
            row("ppo", "CartPole-v1", 2, None),  # stored before rows had a digest
        ],
    )
    stored = zoo.read_rows(path)
    assert [zoo.is_stale(r) for r in stored] == [True, False, False]
    assert zoo.row_key(stored[2])[5] == current

    # The page leaves the stale run out of the table and names it.
    text = zoo.report(stored, [], tmp_path / "benchmarks.md", tmp_path / "images")
    table = next(line for line in text.splitlines() if line.startswith("| ppo | CartPole-v1 |"))
    assert "| 2 |" in table
    assert "| 101 / 102 |" in table
    assert "- ppo on CartPole-v1: 1 run, finished 2026-01-01 to 2026-01-01" in text

    # Before runs are added, the undigested run gets the current digest; the stale runs stay
    # in the file, so that a preset changed back makes them current again.
    zoo.add_row(path, row("a2c", "CartPole-v1", 0, "0ld0ld0ld0ld"))
    kept = zoo.stamp_stored(path)
    assert [(r["algo"], r["seed"]) for r in kept] == [
        ("ppo", 0),
        ("ppo", 1),
        ("ppo", 2),
        ("a2c", 0),
    ]
    assert [r["preset_digest"] for r in kept] == ["0ld0ld0ld0ld", current, current, "0ld0ld0ld0ld"]
    assert zoo.read_rows(path) == kept

    # End to end: a finished run is skipped while its preset stays; once the preset changes,
    # the pair's seed runs again beside the old run, which the page leaves out; and once the
    # preset is changed back, the old run counts again and nothing runs.
    calls = counted_runs(zoo, monkeypatch)
    one_task = ("--tasks", "CartPole-v1")
    for _ in range(2):
        assert zoo.main(arguments(tmp_path / "e2e", "--seeds", "1", *one_task)) == 0
    assert calls == [0]
    (first,) = rows(tmp_path / "e2e")
    assert first["preset_digest"] == current
    monkeypatch.setattr(zoo, "preset_digest", lambda algo, env_id: "c4anged00000")
    assert zoo.main(arguments(tmp_path / "e2e", "--seeds", "1", *one_task)) == 0
    assert calls == [0, 0]
    old, again = rows(tmp_path / "e2e")
    assert old == first
    assert again["preset_digest"] == "c4anged00000"
    page = (tmp_path / "e2e" / "docs" / "benchmarks.md").read_text()
    assert "- ppo on CartPole-v1: 1 run, finished" in page  # the old run, left out
    monkeypatch.setattr(zoo, "preset_digest", lambda algo, env_id: current)
    assert zoo.main(arguments(tmp_path / "e2e", "--seeds", "1", *one_task)) == 0
    assert calls == [0, 0]
    assert rows(tmp_path / "e2e") == [old, again]


def test_atari_final_episodes_sample_actions_as_rl_zoos_figures_do(zoo: ModuleType) -> None:
    pytest.importorskip("ale_py")
    args = zoo.argument_parser().parse_args(
        ["--algos", "ppo", "--tasks", "ALE/Pong-v5,CartPole-v1", "--seeds", "1"]
    )
    sampled = {run.env_id: run.final_sampled for run in zoo.plan(args).runs}
    assert sampled == {"ALE/Pong-v5": True, "CartPole-v1": False}
    rows = [{"final_episodes": 100, "final_sampled": True, "eval_episodes": 10}]
    assert zoo.final_cell(rows) == "100 sampled episodes after"
    rows = [{"final_episodes": 100, "eval_episodes": 10}]  # a row from before the column
    assert zoo.final_cell(rows) == "100 episodes after"


def test_an_algorithm_is_paired_only_with_the_tasks_whose_spaces_it_takes(
    zoo: ModuleType,
) -> None:
    pairs, _ = zoo.suite_pairs(["dqn", "td3"], ["CartPole-v1", "Pendulum-v1"], 1.0)
    assert sorted((p.algo, p.task.env_id) for p in pairs) == [
        ("dqn", "CartPole-v1"),
        ("td3", "Pendulum-v1"),
    ]


def test_zero_action_plays_zero_in_every_dimension(zoo: ModuleType) -> None:
    from gymnasium import spaces

    agent = zoo.ZeroAction(spaces.Box(-1, 1, (3,), np.float32), spaces.Box(0.5, 2, (2,)))
    actions = agent.act(torch.zeros(4, 3)).actions
    # 0 in every dimension, clipped into the bounds where 0 lies outside them.
    assert actions.shape == (4, 2)
    assert bool((actions == 0.5).all())
    free = zoo.ZeroAction(spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-2, 2, (2,)))
    assert bool((free.act(torch.zeros(4, 3)).actions == 0).all())
    assert zoo.baseline_returns("CartPole-v1", "zero action", 2) is None


def test_workers_end_when_the_zoo_process_is_killed(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    bench = Path(__file__).resolve().parents[2] / "bench"
    script = (
        "import concurrent.futures, multiprocessing, os, sys, time\n"
        f"sys.path.insert(0, {str(bench)!r})\n"
        "import zoo\n"
        "pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing"
        ".get_context('spawn'), initializer=zoo.exit_with_parent, initargs=(os.getpid(),))\n"
        "print(pool.submit(os.getpid).result(), flush=True)\n"
        "time.sleep(120)\n"
    )
    zoo_process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    assert zoo_process.stdout is not None
    worker = int(zoo_process.stdout.readline())
    zoo_process.send_signal(signal.SIGKILL)
    zoo_process.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        try:  # a zombie of init's: reaped elsewhere, gone for our purpose once it exited
            with open(f"/proc/{worker}/stat") as stat:
                if stat.read().split(")")[-1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.2)
    os.kill(worker, signal.SIGKILL)
    raise AssertionError("the worker outlived the zoo process by 30 s")


def test_a_screen_runs_with_its_override_apart_from_the_zoos_results(
    zoo: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    built: list[Any] = []
    default_run_config = zoo.default_run_config

    def spied(*args: Any, **kwargs: Any) -> Any:
        cfg = default_run_config(*args, **kwargs)
        built.append(cfg)
        return cfg

    monkeypatch.setattr(zoo, "default_run_config", spied)
    # Typed in any key order or spacing, a screen is one key; the zoo's budget wins over one
    # the override sets.
    override = '{"trainer": {"max_steps": 99999}, "hyperparameters": {"learning_rate": 0.0007}}'
    screen = ("--tasks", "CartPole-v1", "--seeds", "2", "--override", override)
    assert zoo.main(arguments(tmp_path, *screen)) == 0
    stored = pq.read_table(tmp_path / "screens.parquet").to_pylist()
    canonical = '{"hyperparameters":{"learning_rate":0.0007},"trainer":{"max_steps":99999}}'
    assert [(r["seed"], r["override"], r["budget"]) for r in stored] == [
        (0, canonical, 1000),
        (1, canonical, 1000),
    ]
    trained = [c for c in built if c.seed in (0, 1) and c.trainer.max_steps == 1000]
    assert len(trained) == 2
    assert all(c.hyperparameters.learning_rate == 0.0007 for c in trained)
    # Neither the zoo's results nor its page are touched; the screen is printed, with the
    # pair's zoo runs (none here) beside it.
    assert not (tmp_path / "zoo.parquet").exists()
    assert not (tmp_path / "docs" / "benchmarks.md").exists()
    out = capsys.readouterr().out
    assert f"screen {canonical}" in out
    line = next(x for x in out.splitlines() if x.startswith("| ppo CartPole-v1 1k | screen |"))
    assert "| 0, 1 |" in line
    assert "| ppo CartPole-v1 1k | zoo | none |" in out

    # Run again, in another key order and with a whole number written as a float, it
    # resumes: nothing left to run.
    runs_before = len(built)
    reordered = '{"hyperparameters": {"learning_rate": 7e-4}, "trainer": {"max_steps": 99999.0}}'
    again = ("--tasks", "CartPole-v1", "--seeds", "2", "--override", reordered)
    assert zoo.main(arguments(tmp_path, *again)) == 0
    assert pq.read_table(tmp_path / "screens.parquet").to_pylist() == stored
    assert all(c.trainer.max_steps != 1000 for c in built[runs_before:])  # planned, not run
    # A run stored with the float spelling is the same screen's.
    as_typed = {**stored[0], "override": canonical.replace("99999", "99999.0")}
    assert zoo.row_key(as_typed) == zoo.row_key(stored[0])


def test_a_zoo_run_takes_the_result_of_a_screen_of_the_same_config(
    zoo: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One screen sets what the preset already has, as once its override has become the
    # preset; the other trains another config.
    gamma = zoo.default_run_config("ppo", "CartPole-v1").hyperparameters.gamma
    same = json.dumps({"hyperparameters": {"gamma": gamma}})
    other = '{"hyperparameters": {"gamma": 0.9}}'
    cartpole = ("--tasks", "CartPole-v1")
    assert zoo.main(arguments(tmp_path, *cartpole, "--seeds", "1", "--override", same)) == 0
    assert zoo.main(arguments(tmp_path, *cartpole, "--seeds", "2", "--override", other)) == 0
    screens = pq.read_table(tmp_path / "screens.parquet").to_pylist()
    (taken,) = [r for r in screens if r["override"] == zoo.override_text(same)]

    calls = counted_runs(zoo, monkeypatch)
    assert zoo.main(arguments(tmp_path, *cartpole, "--seeds", "2")) == 0
    assert calls == [1]  # seed 0 is the screen's; gamma 0.9 is another config
    first, second = rows(tmp_path)
    assert (first["seed"], first["override"], first["adopted_from"]) == (0, "", taken["override"])
    for key in ("final_return", "curve_returns", "wall_s", "command", "commit", "finished"):
        assert first[key] == taken[key]
    assert first["preset_digest"] == zoo.preset_digest("ppo", "CartPole-v1")
    assert second["adopted_from"] is None
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    assert "| ppo | CartPole-v1 | " in page
    assert zoo.shown_command(taken["command"]) in page  # the command that trained it
    # The taken run counts as the zoo's own: the next zoo command trains nothing.
    assert zoo.main(arguments(tmp_path, *cartpole, "--seeds", "2")) == 0
    assert calls == [1]

    # What was taken is what the zoo trains: --rerun trains seed 0 again (no screen is
    # taken then), to the same curve and final return on this machine.
    calls.clear()
    assert zoo.main(arguments(tmp_path, *cartpole, "--seeds", "1", "--rerun")) == 0
    assert calls == [0]
    (again,) = rows(tmp_path)
    assert again.get("adopted_from") is None
    assert again["config_digest"] == taken["config_digest"]
    assert (again["curve_returns"], again["final_return"]) == (
        taken["curve_returns"],
        taken["final_return"],
    )

    # A screen run stored before rows had a config digest is never taken.
    specs = zoo.plan(zoo.argument_parser().parse_args(arguments(tmp_path, *cartpole))).runs
    assert [r["seed"] for r in zoo.adopt_screens(specs, screens)] == [0]
    assert zoo.adopt_screens(specs, [{**r, "config_digest": None} for r in screens]) == []


def test_a_screen_run_another_zoo_took_meanwhile_is_stored_once(
    zoo: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two zoo commands side by side plan the same pair: both find the screen run, and the
    # other one stores it between this one's reading of the results and its writing.
    gamma = zoo.default_run_config("ppo", "CartPole-v1").hyperparameters.gamma
    same = json.dumps({"hyperparameters": {"gamma": gamma}})
    cartpole = ("--tasks", "CartPole-v1")
    assert zoo.main(arguments(tmp_path, *cartpole, "--seeds", "1", "--override", same)) == 0
    adopt = zoo.adopt_screens

    def taken_meanwhile(specs: Any, screens: Any) -> list[dict[str, Any]]:
        adopted: list[dict[str, Any]] = adopt(specs, screens)
        for row in adopted:
            zoo.add_row(tmp_path / "zoo.parquet", row)  # the other command's write
        return adopted

    monkeypatch.setattr(zoo, "adopt_screens", taken_meanwhile)
    calls = counted_runs(zoo, monkeypatch)
    assert zoo.main(arguments(tmp_path, *cartpole, "--seeds", "2")) == 0
    assert calls == [1]
    assert sorted(r["seed"] for r in rows(tmp_path)) == [0, 1]
    (taken,) = [r for r in rows(tmp_path) if r["seed"] == 0]
    assert taken["adopted_from"] == zoo.override_text(same)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("{nope", "expected a JSON mapping"),
        ("[1, 2]", "expected a non-empty JSON mapping"),
        ('{"hyperparameters": {"learning_rat": 0.1}}', "learning_rat"),
    ],
)
def test_a_bad_override_is_one_line_before_any_run(
    zoo: ModuleType,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    override: str,
    expected: str,
) -> None:
    with pytest.raises(SystemExit) as stop:
        zoo.main(arguments(tmp_path, "--tasks", "CartPole-v1", "--override", override))
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--override" in error
    assert expected in error
    assert not (tmp_path / "screens.parquet").exists()
