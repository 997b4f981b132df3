"""``bench/harness.py``: runs at several torch thread counts are reported per count, each
library is set against the other at its own fastest count, and a run's machine names the CPU's
widest vector extension beside its model."""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

CASE = "SAC Pendulum-v1, identical (20k steps)"


def run(library: str, threads: int | None, pair: int, process_s: float) -> dict[str, Any]:
    row = {
        "case": CASE,
        "library": library,
        "pair": pair,
        "process_s": process_s,
        "train_s": process_s - 3.0,
        "final_return": -120.0,
    }
    if threads is not None:
        row["threads"] = threads
    return row


def test_earlier_runs_at_other_thread_counts_are_kept(harness: ModuleType, tmp_path: Path) -> None:
    # An earlier run at one thread on this machine (written before the count was recorded) ...
    earlier = [
        {**run(library, None, p, t), "machine": harness.machine()}
        for library, t in [("rlfleet", 140.0), ("sb3", 204.0)]
        for p in (0, 1)
    ]
    pq.write_table(pa.Table.from_pylist(earlier), tmp_path / "sac.parquet")
    # ... and a new one at two threads, plus a re-run at one thread for SB3 only.
    new = [run("rlfleet", 2, 0, 100.0), run("sb3", 2, 0, 150.0)]
    rows = harness.with_earlier_runs("sac", new)
    assert sorted((r["library"], harness.threads_of(r)) for r in rows) == [
        ("rlfleet", 1),
        ("rlfleet", 1),
        ("rlfleet", 2),
        ("sb3", 1),
        ("sb3", 1),
        ("sb3", 2),
    ]
    # Runs of a case at a count measured again are replaced, not doubled.
    again = harness.with_earlier_runs("sac", [run("sb3", 1, 0, 200.0), run("rlfleet", 1, 0, 1.0)])
    assert len(again) == 2


def test_each_library_is_compared_at_its_fastest_count(harness: ModuleType, tmp_path: Path) -> None:
    rows = [
        run("rlfleet", 1, 0, 140.0),
        run("sb3", 1, 0, 204.0),
        run("rlfleet", 2, 0, 100.0),
        run("sb3", 2, 0, 150.0),
    ]
    assert harness.fastest_threads(rows, "rlfleet") == 2
    assert harness.fastest_threads(rows, "sb3") == 2
    text = harness.report("t", "d", rows, reference="sb3")
    assert f"## {CASE}, 1 thread\n" in text
    assert f"## {CASE}, 2 threads\n" in text
    assert "**1.46x** (1.46)" in text  # 204 / 140 at one thread each
    assert "Each at its fastest thread count: rlfleet at 2, sb3 at 2: **1.50x** (1.50)." in text

    # SB3 fastest at one thread, rlfleet at two: the table sets those two against each other.
    rows[1]["process_s"] = 120.0
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "sac_pendulum.parquet")
    table = harness.speed_table(tmp_path)
    line = next(x for x in table.splitlines() if x.startswith(f"| {CASE}"))
    assert "| 100.0 s | 120.0 s | **1.20×** (1.20) |" in line
    assert line.endswith("| 2 / 1 | not recorded |")


def test_each_machine_keeps_its_figures_and_each_report_names_it(
    harness: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = "Other CPU, 2 cores"
    monkeypatch.setattr(harness, "machine", lambda: "This CPU, 2 cores")
    elsewhere = [
        {**run(lib, 1, p, t + p), "machine": other}
        for lib, t in [("rlfleet", 140.0), ("sb3", 204.0)]
        for p in (0, 1)
    ]
    solve = [
        {**run(lib, 1, 0, t), "case": "until solved", "machine": other}
        for lib, t in [("rlfleet", 10.0), ("sb3", 30.0)]
    ]
    pq.write_table(pa.Table.from_pylist([*elsewhere, *solve]), tmp_path / "sac_pendulum.parquet")
    # Measured here at two threads: the other machine's runs stay, and every new run names
    # this machine.
    new = [run("rlfleet", 2, 0, 100.0), run("sb3", 2, 0, 150.0)]
    rows = harness.with_earlier_runs("sac_pendulum", new)
    # The file's order first (the other machine's case, its other case), then what is new.
    assert [(r["case"], r["machine"]) for r in rows] == [
        *[(CASE, other)] * 4,
        *[("until solved", other)] * 2,
        *[(CASE, "This CPU, 2 cores")] * 2,
    ]
    # Measured again here: this machine's runs at that count are replaced, not doubled.
    again = harness.with_earlier_runs("sac_pendulum", rows[-2:])
    assert len(again) == len(rows)
    text = harness.report("t", "d", rows, reference="sb3")
    assert "Machines: each comparison names its own." in text
    assert f"{CASE}: measured on This CPU, 2 cores." in text
    assert f"{CASE}: measured on {other}." in text
    # Each machine's table sets its own runs against each other, pair by pair.
    assert f"## {CASE}, Other CPU, 1 thread\n" in text
    assert "**1.46x** (1.46, 1.45)" in text  # 204 / 140 and 205 / 141, on the other CPU
    assert f"## {CASE}, This CPU, 2 threads\n" in text
    assert "**1.50x** (1.50)" in text
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "sac_pendulum.parquet")
    lines = [x for x in harness.speed_table(tmp_path).splitlines() if x.startswith(f"| {CASE}")]
    assert len(lines) == 2
    assert lines[0].endswith("| 1 / 1 | Other CPU |")
    assert "**1.46×** (1.46, 1.45)" in lines[0]
    assert lines[1].endswith("| 2 / 2 | This CPU |")
    assert "**1.50×** (1.50)" in lines[1]


def test_several_thread_counts_alternate_within_each_pair(
    harness: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, int, tuple[str, ...]]] = []

    def worker(script: Path, name: str, seed: int, args: tuple[str, ...]) -> dict[str, Any]:
        calls.append((name, seed, tuple(args)))
        threads = int(args[args.index("--threads") + 1])
        return {"process_s": 10.0 * threads, "train_s": 1.0, "final_return": 0.0}

    monkeypatch.setattr(harness, "run_worker", worker)
    monkeypatch.setattr(harness, "source_commit", lambda: "0123456789ab+changes")
    contenders = [harness.Contender("rlfleet", "rlfleet"), harness.Contender("sb3", "sb3")]
    case = harness.Case(CASE, ("--mode", "identical"))
    rows = harness.run_pairs(Path("x.py"), [case], contenders, 2, (1, 2))
    # Every run names the code it ran.
    assert {r["commit"] for r in rows} == {"0123456789ab+changes"}
    # Pair by pair, every contender at each count in turn: the runs of a cross-count pair are
    # next to each other in time.
    assert [(name, seed, args[-1]) for name, seed, args in calls] == [
        ("rlfleet", 0, "1"),
        ("sb3", 0, "1"),
        ("rlfleet", 0, "2"),
        ("sb3", 0, "2"),
        ("rlfleet", 1, "1"),
        ("sb3", 1, "1"),
        ("rlfleet", 1, "2"),
        ("sb3", 1, "2"),
    ]
    assert [(r["library"], r["pair"], r["threads"], r["interleaved"]) for r in rows[:3]] == [
        ("rlfleet", 0, 1, True),
        ("sb3", 0, 1, True),
        ("rlfleet", 0, 2, True),
    ]
    # rlfleet fastest at 1 thread (10 s), SB3 at 1 too: no cross-count note; make SB3 faster
    # at 2 and the report says the counts alternated.
    for r in rows:
        if r["library"] == "sb3" and r["threads"] == 2:
            r["process_s"] = 5.0
    text = harness.report("t", "d", rows, reference="sb3")
    assert "rlfleet at 1, sb3 at 2: **0.50x** (0.50, 0.50). The counts alternated" in text


def test_counts_measured_apart_are_reported_as_such(harness: ModuleType) -> None:
    rows = [
        run("rlfleet", 1, 0, 100.0),
        run("sb3", 1, 0, 204.0),
        run("rlfleet", 2, 0, 140.0),
        run("sb3", 2, 0, 150.0),
    ]
    text = harness.report("t", "d", rows, reference="sb3")
    assert "rlfleet at 1, sb3 at 2: **1.50x** (1.50). The two counts were measured one" in text


def test_thread_counts_are_parsed_and_bad_ones_refused(harness: ModuleType) -> None:
    parser = harness.argument_parser(None, interleaved_threads=True)
    assert parser.parse_args(["--threads", "1,2"]).threads == (1, 2)
    assert parser.parse_args(["--threads", "2,1,2"]).threads == (2, 1)
    assert parser.parse_args([]).threads == (1,)
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(["--threads", "1,zero"])
    assert refused.value.code == 2
    assert harness.argument_parser(None).parse_args(["--threads", "2"]).threads == 2


def test_a_key_only_new_runs_have_is_saved(harness: ModuleType, tmp_path: Path) -> None:
    # An earlier run first (as with_earlier_runs lists them), without the key a new run has.
    rows = [run("sb3", 1, 0, 200.0), {**run("rlfleet", 2, 0, 100.0), "interleaved": True}]
    harness.save("sac", rows, "text", results=tmp_path)
    stored = harness.stored_runs("sac", tmp_path)
    assert [r["interleaved"] for r in stored] == [None, True]


def test_a_run_names_the_commit_of_its_code(harness: ModuleType) -> None:
    commit = harness.source_commit()
    if (harness.RESULTS.parent.parent / ".git").exists():
        assert re.fullmatch(r"[0-9a-f]{12}(\+changes)?", commit), commit
    else:
        assert commit == "not recorded"


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ("fpu sse2 avx avx2 fma amx_bf16 avx512f avx512_bf16", "AMX"),
        ("avx2 avx512f avx512_bf16", "AVX-512 BF16"),
        ("avx2 avx512f avx512bw", "AVX-512"),
        ("fma avx avx2 sha_ni vaes", "AVX2"),
        ("fp asimd sve", None),
        ("", None),
    ],
)
def test_the_machine_names_the_cpus_widest_vector_extension(
    harness: ModuleType, flags: str, named: str | None
) -> None:
    # Two CPUs of one model name ("AMD EPYC": a Zen 3 or a Zen 4) run other kernels.
    assert harness.vector_extension(set(flags.split())) == named


def test_the_machine_line_carries_the_first_cores_model_and_extension(
    harness: ModuleType, tmp_path: Path
) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cores = [("AMD EPYC", "fpu avx avx2 fma"), ("Another name", "avx2 avx512f avx512_bf16")]
    cpuinfo.write_text(
        "\n\n".join(f"processor\t: {i}\nmodel name\t: {name}\nflags\t\t: {flags}"
                     for i, (name, flags) in enumerate(cores))
    )  # fmt: skip
    assert harness.machine(cpuinfo).startswith("AMD EPYC (AVX2), ")
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2\n")
    assert harness.machine(cpuinfo).startswith("Some CPU, ")
