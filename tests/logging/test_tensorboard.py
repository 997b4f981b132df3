"""TensorBoardWriter: a clear MissingDependencyError when tensorboard is not installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlfleet.errors import MissingDependencyError
from rlfleet.logging import TensorBoardWriter


def test_missing_tensorboard_raises_missing_dependency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A None entry in sys.modules makes the import fail even where tensorboard is installed.
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlfleet\[tensorboard\]'"):
        TensorBoardWriter(tmp_path / "tb")
    assert not (tmp_path / "tb").exists()
