"""Writing a played episode's frames: one MP4 per episode and/or one PNG per frame.

A write that fails (a full disk) is a :class:`~rlfleet.errors.RunDirError` naming the file or
folder and the free space."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlfleet.errors import MissingDependencyError, RunDirError, write_error


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
            try:
                self.video_dir.mkdir(parents=True, exist_ok=True)
                imageio.mimwrite(path, frames, fps=self.fps, macro_block_size=1)  # type: ignore[arg-type]
            except OSError as error:
                raise write_error(RunDirError, path, error) from error
            written.append(path)
        if self.frame_dir is not None:
            from PIL import Image  # only needed for frames, and slow to import

            folder = self.frame_dir / f"episode-{episode:03d}"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                for i in range(0, len(frames), self.frame_frequency):
                    frame = frames[i]
                    Image.fromarray(frame).save(folder / f"frame-{i:05d}.png")
            except OSError as error:
                raise write_error(RunDirError, folder, error) from error
            written.append(folder)
        return written
