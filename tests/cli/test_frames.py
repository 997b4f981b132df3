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


def test_a_failed_video_leaves_the_earlier_one_and_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    videos = tmp_path / "videos"
    FrameWriter(videos, None, fps=30).write(1, FRAMES)
    earlier = (videos / "episode-001.mp4").read_bytes()

    def half_then_full(path: Path, *args: object, **kwargs: object) -> None:
        Path(path).write_bytes(b"half a video")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(imageio, "mimwrite", half_then_full)
    with pytest.raises(RunDirError, match="No space left on device"):
        FrameWriter(videos, None, fps=30).write(1, FRAMES)
    assert (videos / "episode-001.mp4").read_bytes() == earlier
    assert sorted(p.name for p in videos.iterdir()) == ["episode-001.mp4"]


def test_a_failed_frame_folder_leaves_the_earlier_one_and_no_partial_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    frames = tmp_path / "frames"
    FrameWriter(None, frames, fps=30).write(1, FRAMES)
    saved = Image.Image.save
    calls = 0

    def fail_on_the_second(self: Image.Image, fp: Path, *args: object, **kwargs: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        saved(self, fp, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Image.Image, "save", fail_on_the_second)
    with pytest.raises(RunDirError, match="No space left on device"):
        FrameWriter(None, frames, fps=30).write(1, FRAMES)
    assert sorted(p.name for p in frames.iterdir()) == ["episode-001"]
    assert len(list((frames / "episode-001").iterdir())) == len(FRAMES)
