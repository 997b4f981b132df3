"""Writing a played episode's frames: one MP4 per episode and/or one PNG per frame.

A write that fails (a full disk) is a :class:`~rlfleet.errors.RunDirError` naming the file or
folder and the free space."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import numpy as np

from rlfleet.errors import MissingDependencyError, RunDirError, replacing, write_error


class FrameWriter:
    """Writes an episode's frames as an MP4 (``video_dir``) and/or PNG files (``frame_dir``,
    ``episode-NNN/frame-NNNNN.png``, every ``frame_frequency``-th frame, numbered by its
    place in the episode)."""

    def __init__(
        self, video_dir: Path | None, frame_dir: Path | None, fps: int, frame_frequency: int = 1
    ) -> None:
        self.video_dir = video_dir
        self.frame_dir = frame_dir
        self.fps = fps
        self.frame_frequency = frame_frequency

    def write(self, episode: int, frames: list[np.ndarray]) -> list[Path]:
        """Write one episode; returns the video file and frame folder written."""
        written: list[Path] = []
        if self.video_dir is not None:
            # Imported here: an optional dependency (rlfleet[video]), needed only for videos.
            try:
                import imageio.v2 as imageio
            except ImportError as err:
                raise MissingDependencyError(
                    "writing videos needs imageio and imageio-ffmpeg: pip install 'rlfleet[video]'"
                ) from err
            path = self.video_dir / f"episode-{episode:03d}.mp4"
            # Written whole or not at all: a failed write leaves no truncated video behind,
            # and an earlier one of that name intact.
            with replacing(path) as tmp:
                imageio.mimwrite(tmp, frames, fps=self.fps, macro_block_size=1)  # type: ignore[arg-type]
            written.append(path)
        if self.frame_dir is not None:
            from PIL import Image  # only needed for frames, and slow to import

            folder = self.frame_dir / f"episode-{episode:03d}"
            # The same for an episode's frames: a temporary folder, renamed once complete.
            tmp_folder = folder.with_name(f".{folder.name}.{secrets.token_hex(4)}.tmp")
            try:
                tmp_folder.mkdir(parents=True)
                for i in range(0, len(frames), self.frame_frequency):
                    frame = frames[i]
                    Image.fromarray(frame).save(tmp_folder / f"frame-{i:05d}.png")
                if folder.is_dir() and not folder.is_symlink():
                    shutil.rmtree(folder)
                os.replace(tmp_folder, folder)
            except OSError as error:
                raise write_error(RunDirError, folder, error) from error
            finally:
                shutil.rmtree(tmp_folder, ignore_errors=True)
            written.append(folder)
        return written
