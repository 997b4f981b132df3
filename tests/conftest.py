"""Shared fixtures: small torch thread count and no progress bars in tests."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from rlfleet.distributed.cluster import local_cluster_settings

# One core per test worker (tests on 2 cores run two workers): ``torch_threads: auto`` counts
# no more cores than OMP_NUM_THREADS, here and in the CLI runs tests start as subprocesses, so
# a test's thread count, and with it its trajectory, does not depend on the machine's cores.
os.environ["OMP_NUM_THREADS"] = "1"


BENCH = Path(__file__).resolve().parent.parent / "bench"
"""The benchmark scripts, which are not a package: tests load them with ``bench_module``."""


@pytest.fixture
def bench_module(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """A loader of ``bench/<name>.py`` as the module ``name``, with ``bench/`` on the path for
    its sibling imports (``harness``) and the module in ``sys.modules`` (its dataclasses and
    worker processes look it up by name); both are undone after the test."""

    def load(name: str) -> ModuleType:
        monkeypatch.syspath_prepend(str(BENCH))
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(autouse=True)
def _single_thread() -> None:
    # Small networks run faster on one thread, and tests on 2 cores run two workers.
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """One local Ray cluster per test module, sized for a 2-core machine.

    Trainers see Ray already initialised and reuse it; their actors must ask for fractional
    CPUs (``actor_num_cpus``) to fit more than two on it. Its workers run at the niceness of
    a cluster rlfleet starts (not Ray's 15), so the other test worker does not starve them.
    """
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=2,
        object_store_memory=200 * 1024 * 1024,
        include_dashboard=False,
        logging_level=logging.WARNING,
        **local_cluster_settings(),
    )
    yield ray
    ray.shutdown()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A parametrised case that skips itself from inside the test is an empty case: it shows up
    as a test of something that was never checked. Parametrise over the cases that apply
    instead. (Skips of a missing optional dependency, via ``pytest.importorskip``, and skip
    markers are not empty cases.)"""
    report = yield
    callspec = getattr(item, "callspec", None)
    if (
        callspec is not None
        and call.when == "call"
        and report.skipped
        and call.excinfo is not None
        # importorskip raises its skip with allow_module_level set; pytest.skip() does not.
        and not getattr(call.excinfo.value, "allow_module_level", False)
    ):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid}: a parametrised case skipped itself ({call.excinfo.value}); "
            "parametrise only over the cases the test applies to"
        )
    return report
