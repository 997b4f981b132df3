"""FrameWriter: a video or frame folder that cannot be written is a RunDirError."""

from __future__ import annotations

import errno
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest

from rlfleet.cli.frames import FrameWriter
from rlfleet.errors import RunDirError

FRAMES = [np.zeros((8, 8, 3), np.uint8) for _ in range(3)]


def test_a_video_that_cannot_be_written_is_a_run_dir_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(imageio, "mimwrite", no_space)
    writer = FrameWriter(tmp_path / "videos", None, fps=30)
    with pytest.raises(
        RunDirError, match=r"episode-001\.mp4: cannot write \(No space left on device; .* free"
    ):
        writer.write(1, FRAMES)


def test_a_frame_folder_that_cannot_be_made_is_a_run_dir_error(tmp_path: Path) -> None:
    (tmp_path / "frames").write_text("a file where the folder goes")
    writer = FrameWriter(None, tmp_path / "frames", fps=30)
    with pytest.raises(RunDirError, match=r"frames/episode-001: cannot write \("):
        writer.write(1, FRAMES)
