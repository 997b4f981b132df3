"""Shared fixtures: small torch thread count and no progress bars in tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread() -> None:
    # Small networks run faster on one thread, and tests on 2 cores run two workers.
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """One local Ray cluster per test module, sized for a 2-core machine.

    Trainers see Ray already initialised and reuse it; their actors must ask for fractional
    CPUs (``actor_num_cpus``) to fit more than two on it.
    """
    ray = pytest.importorskip("ray")
    ray.init(
        num_cpus=2,
        object_store_memory=200 * 1024 * 1024,
        include_dashboard=False,
        logging_level=logging.WARNING,
    )
    yield ray
    ray.shutdown()
