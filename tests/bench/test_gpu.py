"""``bench/gpu.py``: its page is generated from the stored runs, never typed by hand, and a
machine without CUDA is told so instead of being timed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pyarrow.parquet as pq

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_the_gpu_page_is_the_report_of_the_stored_results(
    bench_module: Callable[[str], ModuleType],
) -> None:
    gpu = bench_module("gpu")
    checks = json.loads((RESULTS / "gpu_checks.json").read_text())
    runs = pq.read_table(RESULTS / "gpu.parquet").to_pylist()
    page = (RESULTS / "gpu.md").read_text().splitlines()
    where = page[2].removeprefix("Machine: ").removesuffix(".")
    # Everything but the date in the title.
    assert gpu.report(checks, runs, where).splitlines()[1:] == page[1:]
    # Every check of the page passed each of its commands.
    assert checks
    assert all(c["trained"] and c["eval_on_cpu"] and c["play_on_cpu"] for c in checks)


def test_without_cuda_the_script_stops_with_a_message() -> None:
    script = Path(__file__).resolve().parents[2] / "bench" / "gpu.py"
    done = subprocess.run(
        [sys.executable, str(script), "--device", "cuda"],
        capture_output=True,
        text=True,
        check=False,
        env={"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "bench/gpu.py: expected a CUDA GPU for --device cuda, found none"
    )
