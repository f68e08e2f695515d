"""MP4 (H.264) writing with PyAV for reports and rollout videos, atomically."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def write_video(
    path: str | os.PathLike[str],
    frames: np.ndarray | Sequence[np.ndarray],
    fps: float = 16,
    codec: str = "libx264",
    crf: int = 23,
) -> Path:
    """Encode ``uint8 [T, H, W, 3]`` RGB frames to an MP4 that browsers play (H.264, yuv420p).

    The file is written under a temporary name and renamed, so a crash never leaves a truncated
    video that looks valid. Odd frame sizes are padded by one pixel (yuv420p needs even sizes).
    """
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(
            f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {list(frames.shape)}"
        )
    if len(frames) == 0:
        raise ValueError("cannot write a video with no frames")
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")

    import av

    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex[:8]}{path.suffix}")
    try:
        with av.open(str(tmp), mode="w") as container:
            stream = container.add_stream(codec, rate=round(fps))
            stream.width, stream.height = frames.shape[2], frames.shape[1]
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": str(crf)} if codec == "libx264" else {}
            for frame in frames:
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(stream.encode())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
