"""Shared fixtures: small torch thread count and no progress bars in tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread() -> None:
    # Small networks run faster on one thread, and tests on 2 cores run two workers.
    torch.set_num_threads(1)
