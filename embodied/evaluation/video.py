"""MP4 (H.264) writing with PyAV for reports and rollout videos, atomically."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def encoder_available(codec: str = "libx264") -> bool:
    """Whether PyAV is installed and its FFmpeg has an encoder for ``codec``."""
    try:
        import av

        av.codec.Codec(codec, "w")
    except Exception:  # ImportError, or FFmpeg built without the encoder
        return False
    return True


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


def annotate_frames(
    frames: np.ndarray,
    text: str = "",
    progress: Sequence[float] | np.ndarray | None = None,
    min_height: int = 160,
) -> np.ndarray:
    """Copies of ``uint8 [T, H, W, 3]`` frames with ``text`` (the instruction) on a dark band at
    the top and, when ``progress`` gives one value in [0, 1] per frame (or per step: the first
    frame then shows 0), a progress bar at the bottom. Frames shorter than ``min_height`` are
    first enlarged by a whole factor, so the text stays legible on small camera images."""
    import cv2

    frames = np.array(frames, dtype=np.uint8, copy=True)
    factor = -(-min_height // frames.shape[1])
    if factor > 1:
        size = (frames.shape[2] * factor, frames.shape[1] * factor)
        frames = np.stack([cv2.resize(f, size, interpolation=cv2.INTER_NEAREST) for f in frames])
    count, height, width = frames.shape[:3]
    values = None
    if progress is not None:
        values = np.clip(np.asarray(progress, dtype=float).reshape(-1), 0.0, 1.0)
        if len(values) == count - 1:
            values = np.concatenate([[0.0], values])
        if len(values) != count:
            raise ValueError(f"progress has {len(values)} values for {count} frames")
    font, scale = cv2.FONT_HERSHEY_SIMPLEX, max(0.3, height / 400)
    lines = _wrap(text, width - 8, font, scale) if text else []
    line_h = cv2.getTextSize("Ag", font, scale, 1)[0][1] + 6
    band, bar = line_h * len(lines) + 2, max(height // 40, 3)
    for t, frame in enumerate(frames):
        if lines:
            frame[:band] = (frame[:band] * 0.35).astype(np.uint8)
            for i, line in enumerate(lines):
                y = (i + 1) * line_h - 3
                cv2.putText(frame, line, (4, y), font, scale, (255, 255, 255), 1, cv2.LINE_AA)
        if values is not None:
            frame[height - bar :] = (frame[height - bar :] * 0.35).astype(np.uint8)
            frame[height - bar :, : int(round(values[t] * width))] = (60, 200, 90)
    return frames


def _wrap(text: str, width: int, font: int, scale: float) -> list[str]:
    """Greedy word wrap of ``text`` into lines at most ``width`` pixels wide."""
    import cv2

    lines: list[str] = []
    for word in text.split():
        candidate = f"{lines[-1]} {word}" if lines else word
        if lines and cv2.getTextSize(candidate, font, scale, 1)[0][0] <= width:
            lines[-1] = candidate
        else:
            lines.append(word)
    return lines
