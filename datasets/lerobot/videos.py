"""Episode images as mp4: encoding settings, the encoder that packs many episodes into one
file (crash-safe), and decoding a frame range back; distinct from ``embodied.evaluation.video``."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import uuid
from fractions import Fraction
from pathlib import Path
from typing import Any, NamedTuple

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from embodied.datasets.lerobot.layout import DatasetError

LOSSY_CRF = 20
# yuv420p plays everywhere but halves colour resolution: on 64x64 renders the conversion alone
# caps PSNR near 29 dB. yuv444p (H.264 High 4:4:4) keeps it; crf 20 gives about 37 dB there.
LOSSY_PIX_FMTS = ("yuv420p", "yuv444p")
CODEC, PIX_FMT = "libx264", "yuv444p"  # a new dataset's lossy videos (the writer's defaults)
LOSSLESS_ENCODER = "libx264rgb"  # H.264 in RGB with qp 0: bit-exact, and any H.264 decoder reads it
# Pixel formats with chroma subsampled in both directions: frames must have even sizes. Frames are
# encoded at their exact size (never padded), so readers, LeRobot's included, get what was written.
EVEN_PIX_FMTS = ("yuv420p",)
X264_ENCODERS = ("libx264", LOSSLESS_ENCODER)
CODEC_NAMES = {"libx264": "h264", "libx264rgb": "h264", "libsvtav1": "av1", "libopenh264": "h264"}


def _video_info(
    fps: int, video_codec: str, crf: int, lossless: bool, pix_fmt: str
) -> dict[str, Any]:
    """The ``info`` block of a video feature: LeRobot's keys plus how it was encoded."""
    if pix_fmt not in LOSSY_PIX_FMTS:
        raise ValueError(f"pix_fmt must be one of {LOSSY_PIX_FMTS}, got {pix_fmt!r}")
    encoder = LOSSLESS_ENCODER if lossless else video_codec
    return {
        "video.codec": CODEC_NAMES.get(encoder, encoder),
        "video.pix_fmt": "gbrp" if lossless else pix_fmt,
        "video.is_depth_map": False,
        "video.fps": fps,
        "video.channels": 3,
        "has_audio": False,
        "video.encoder": encoder,
        "video.crf": None if lossless else crf,
        "video.lossless": lossless,
    }


def _add_stream(
    container: av.container.OutputContainer, fps: int, size: tuple[int, int], info: dict
) -> av.video.stream.VideoStream:
    """A video stream in ``container`` with the encoder settings of a feature's info."""
    stream = container.add_stream(info["video.encoder"], rate=fps)
    stream.height, stream.width = size
    if info["video.lossless"]:
        stream.pix_fmt = "rgb24"
        options = {"qp": "0"}
    else:
        stream.pix_fmt = info["video.pix_fmt"]
        options = {"crf": str(info["video.crf"])}
    if info["video.encoder"] in X264_ENCODERS:
        # x264's macroblock-tree rate control reads memory it never set: the same frames gave
        # up to 8 different files in 30 writes. Without it, one file.
        options["x264-params"] = "mbtree=0"
    stream.options = options
    stream.codec_context.gop_size = fps  # a keyframe every second for random access
    return stream


def _encode(stream: av.video.stream.VideoStream, frames: np.ndarray, first: int) -> list:
    """Encode ``uint8 [n, H, W, 3]`` frames at pts first, first + 1, ...; the packets so far."""
    packets = []
    for index, image in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts = first + index
        packets += stream.encode(frame)
    return packets


def _check_size(camera: str, size: tuple[int, int], info: dict) -> None:
    """ValueError naming the camera for odd image sizes in a format that needs even ones."""
    height, width = size
    subsampled = not info["video.lossless"] and info["video.pix_fmt"] in EVEN_PIX_FMTS
    if subsampled and (height % 2 or width % 2):
        raise ValueError(
            f"{camera}: {info['video.pix_fmt']} stores colour at half resolution and needs even "
            f"image sizes, got {height}x{width}; use pix_fmt='yuv444p' (the default) or "
            "lossless=True, which store any size"
        )


def encode_episode(frames: np.ndarray, fps: int, info: dict, camera: str = "") -> io.BytesIO:
    """One lossy episode's ``uint8 [n, H, W, 3]`` frames as an mp4 of their own, in memory,
    with a feature's encoder settings (``info``). Touches no shared state: episodes can be
    encoded on several threads at once (the encoder runs without the GIL)."""
    _check_size(camera or "the camera", frames.shape[1:3], info)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = _add_stream(container, fps, frames.shape[1:3], info)
        container.mux(_encode(stream, frames, 0))
        container.mux(stream.encode())
    buffer.seek(0)
    return buffer


class _VideoEncoder:
    """Packs the frames of consecutive episodes into one mp4 under a temporary name.

    Each lossy episode is encoded on its own (a fresh encoder, a keyframe first) and its packets
    are copied after the file's, as LeRobot concatenates episode videos. An episode's decoded frames
    are then the same whichever file it lands in and whatever came before it there; the writer
    cuts files by wall-clock time, so one continuous stream would decode differently from run to
    run. ``finish`` renames the file to its final name, so a crash never leaves a truncated video
    there. Frame i of the file has pts i (time base 1/fps), i.e. it plays at time i / fps.
    """

    def __init__(
        self, path: Path, location: tuple[int, int], fps: int, frame_shape: tuple, info: dict
    ) -> None:
        """Open ``path``'s temporary file with the encoder settings from a feature's info;
        ValueError (naming the camera) for odd sizes in a format that needs even ones."""
        height, width = frame_shape[:2]
        _check_size(path.parent.parent.name, (height, width), info)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.location = location  # (chunk_index, file_index) of ``path``
        self.tmp_path = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        self.num_frames = 0
        self.encoded_bytes = 0
        self._fps, self._size, self._info = fps, (height, width), info
        self._container = av.open(str(self.tmp_path), mode="w", format="mp4")
        # Lossless frames decode to exactly what was written in any context, so lossless
        # episodes go into one stream (PyAV < 16, which LeRobot 0.6 pins, opens H.264's default
        # encoder for a stream copied from a template, and that encoder takes no gbrp frames).
        self._lossless = info["video.lossless"]
        self._stream = (
            _add_stream(self._container, fps, self._size, info) if self._lossless else None
        )

    def add(self, frames: np.ndarray, encoded: io.BytesIO | None = None) -> int:
        """Append ``uint8 [n, H, W, 3]`` frames; return the file frame index of the first one.
        ``encoded``: the same frames already encoded on their own (``encode_episode`` with this
        file's settings), as a lossy episode is; lossless ones go into the file's one stream."""
        first = self.num_frames
        if self._lossless:
            self._mux(_encode(self._stream, frames, first))
        else:
            if encoded is None:
                encoded = encode_episode(frames, self._fps, self._info)
            self._copy_episode(encoded, first)
        self.num_frames += len(frames)
        return first

    def _copy_episode(self, encoded: io.BytesIO, first: int) -> None:
        """Copy an episode's packets in (an mp4 of its own), shifted to start at ``first``."""
        encoded.seek(0)
        with av.open(encoded, mode="r", format="mp4") as episode:
            source = episode.streams.video[0]
            if self._stream is None:
                self._stream = self._container.add_stream_from_template(source)
            shift = round(Fraction(first, self._fps) / source.time_base)
            for packet in episode.demux(source):
                if packet.dts is None:  # the demuxer's empty end-of-stream packet
                    continue
                packet.pts += shift
                packet.dts += shift
                packet.stream = self._stream
                self._mux([packet])

    def _mux(self, packets: list) -> None:
        """Write packets and count their bytes (the file on disk lags behind the encoder)."""
        self.encoded_bytes += sum(packet.size for packet in packets)
        self._container.mux(packets)

    def finish(self) -> str:
        """Flush the encoder, close the file, sync it, move it to its final name; its sha256."""
        if self._lossless:
            self._mux(self._stream.encode())
        self._container.close()
        with open(self.tmp_path, "rb") as file:
            digest = _sha256(file)
            os.fsync(file.fileno())
        os.replace(self.tmp_path, self.path)
        return digest

    def abort(self) -> None:
        """Drop the temporary file (best effort: the writer is failing already)."""
        with contextlib.suppress(av.FFmpegError, OSError, ValueError):
            self._container.close()  # closing a broken encoder may fail; the file goes anyway
        self.tmp_path.unlink(missing_ok=True)


def _decode_frames(path: Path, start: int, stop: int, fps: int) -> np.ndarray:
    """Frames [start, stop) of an mp4 as ``uint8 [n, H, W, 3]``.

    Seeks to the keyframe at or before ``start`` and decodes forward; if the seek lands after
    ``start`` (possible with B-frames), decodes from the beginning of the file instead.
    One reformatter serves every frame: ``frame.to_ndarray(format=...)`` sets up a new colour
    converter per frame, which cost 5-6 ms per 64x64 frame in processes that had also collected
    (torch, MuJoCo and EGL loaded), against about 0.2 ms reused (``embodied bench dataset``).
    """
    to_rgb = VideoReformatter()
    frames: list[np.ndarray] = []
    for seek_frame in (start, 0):
        frames = []
        with _open_video(path) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            try:
                if seek_frame > 0:
                    container.seek(int(Fraction(seek_frame, fps) / stream.time_base), stream=stream)
                for frame in container.decode(stream):
                    if frame.pts is None:
                        break
                    index = round(frame.pts * stream.time_base * fps)
                    if index < start:
                        continue
                    if index >= stop or index != start + len(frames):
                        break
                    frames.append(to_rgb.reformat(frame, format="rgb24").to_ndarray())
            except (av.FFmpegError, OSError, ValueError) as error:
                raise DatasetError(
                    f"{path}: corrupt video: decoding frames {start}..{stop - 1} failed ({error})"
                ) from error
        if len(frames) == stop - start:
            return np.stack(frames)
    raise DatasetError(
        f"{path}: corrupt or truncated video: cannot decode frames {start}..{stop - 1} "
        f"(got {len(frames)} of them)"
    )


def _open_video(path: Path, name: str | None = None) -> av.container.InputContainer:
    """Open an mp4 for reading; DatasetError naming it (``name``, default the path) when it is
    missing or unreadable."""
    name = name or str(path)
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError, ValueError) as error:
        raise DatasetError(f"{name}: unreadable video ({error})") from error
    if not container.streams.video:
        container.close()
        raise DatasetError(f"{name}: has no video stream")
    return container


class _VideoHeader(NamedTuple):
    """What an mp4's header says about its (first) video stream."""

    num_frames: int
    height: int
    width: int
    fps: float | None  # None when the header does not say


def _video_header(path: Path, name: str | None = None) -> _VideoHeader:
    """Frame count, frame size and frame rate from an mp4's header (nothing is decoded)."""
    with _open_video(path, name) as container:
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.base_rate
        fps = float(rate) if rate else None
        if stream.frames:
            num_frames = int(stream.frames)
        elif stream.duration and fps:
            num_frames = round(stream.duration * stream.time_base * fps)
        else:
            num_frames = 0
        context = stream.codec_context
        return _VideoHeader(num_frames, int(context.height), int(context.width), fps)


def _decode_all(path: Path, name: str, fps: int) -> tuple[int, tuple[int, int]]:
    """Decode every frame of an mp4 as a reader would; (frames, (height, width)) or DatasetError.

    Frames must come at pts 0, 1, 2, ... (in frames, at ``fps``) with one size throughout.
    """
    count, size = 0, None
    with _open_video(path, name) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for frame in container.decode(stream):
                index = None if frame.pts is None else round(frame.pts * stream.time_base * fps)
                if index != count:
                    raise DatasetError(
                        f"{name}: frame {count} has timestamp {frame.time} s, not "
                        f"{count / fps:.4f} s (frame {index} at {fps} fps)"
                    )
                if size is None:
                    size = (frame.height, frame.width)
                elif (frame.height, frame.width) != size:
                    raise DatasetError(
                        f"{name}: frame {count} is {frame.height}x{frame.width} but frame 0 is "
                        f"{size[0]}x{size[1]}"
                    )
                count += 1
        except (av.FFmpegError, OSError, ValueError) as error:
            if isinstance(error, DatasetError):
                raise
            raise DatasetError(
                f"{name}: corrupt video: decoding failed after {count} frames ({error})"
            ) from error
    return count, size or (0, 0)


def _sha256(file: Any) -> str:
    """Hex sha256 of an open binary file, from its start."""
    file.seek(0)
    digest = hashlib.sha256()
    while chunk := file.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def _file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    with open(path, "rb") as file:
        return _sha256(file)
