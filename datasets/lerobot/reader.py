"""``LeRobotDataset``: reads a LeRobot v3.0 dataset back as Trajectories, per-frame columns
or single frames, decoding only the video frames asked for."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from embodied.core.trajectory import Trajectory
from embodied.datasets.lerobot.add_feature import _add_frame_feature
from embodied.datasets.lerobot.arrow import _from_arrow
from embodied.datasets.lerobot.file_checks import _check_index_columns
from embodied.datasets.lerobot.files import _read_table
from embodied.datasets.lerobot.frames import (
    ACTION_MASK,
    LEGACY_ACTION_PAD,
    SUCCESS_FEATURES,
    _frames_to_trajectory,
)
from embodied.datasets.lerobot.layout import (
    DatasetError,
    _data_path,
    _episodes_path,
    _group_by_file,
    _video_path,
)
from embodied.datasets.lerobot.lock import DatasetLock
from embodied.datasets.lerobot.metadata import _load_metadata
from embodied.datasets.lerobot.recovery import _read_episode_stats
from embodied.datasets.lerobot.videos import _decode_frames, _file_sha256


def _as_arrays(stats: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, np.ndarray]]:
    """stats.json content (lists) as {feature: {stat: array}}."""
    return {name: {stat: np.array(value) for stat, value in s.items()} for name, s in stats.items()}


class LeRobotDataset:
    """Reads a LeRobot v3.0 dataset: Trajectories, per-frame columns and single frames.

    Opening runs the checks that need no decoding (``validate_dataset`` adds column and
    leftover-file checks) and raises DatasetError on a corrupted dataset. Every read raises
    DatasetError naming the file when what it reads is corrupt: parquet pages carry checksums,
    and a video file whose episode rows record its sha256 is checked against it the first time
    this object reads from it (``verify_checksums=False`` skips that), so a damaged video is an
    error rather than frames with garbage in them.
    """

    _CACHED_TABLES = 4  # data files kept in memory for random access

    def __init__(self, root: str | os.PathLike[str], verify_checksums: bool = True) -> None:
        """Open and check the dataset at ``root``."""
        self.root = Path(root)
        self.verify_checksums = verify_checksums
        self._verified: set[str] = set()  # video files whose checksum matched
        self._load()

    def _load(self) -> None:
        """(Re)read the metadata and forget cached data files."""
        self._meta = _load_metadata(self.root)
        self._rows_of = _group_by_file(self._meta.episodes)  # data file -> its episodes
        self._starts = np.array([row["dataset_from_index"] for row in self._meta.episodes])
        self._tables: dict[str, tuple[pa.Table, np.ndarray]] = {}

    @property
    def num_episodes(self) -> int:
        """Number of episodes."""
        return len(self._meta.episodes)

    @property
    def num_frames(self) -> int:
        """Number of frames over all episodes (T+1 per episode of T steps)."""
        return int(self._meta.info["total_frames"])

    @property
    def fps(self) -> int:
        """Frames per second."""
        return int(self._meta.info["fps"])

    @property
    def features(self) -> dict[str, Any]:
        """The feature specs of info.json ({name: {dtype, shape, names, ...}})."""
        return self._meta.info["features"]

    @property
    def tasks(self) -> list[str]:
        """Instructions, ordered by task_index."""
        return list(self._meta.tasks)

    @property
    def info(self) -> dict[str, Any]:
        """The content of meta/info.json."""
        return self._meta.info

    @property
    def stats(self) -> dict[str, dict[str, np.ndarray]]:
        """meta/stats.json as {feature: {stat: array}}."""
        return _as_arrays(self._meta.stats)

    def stats_of(self, episodes: Sequence[int]) -> dict[str, dict[str, np.ndarray]]:
        """Like ``stats``, over the given episodes only: their per-episode stats aggregated as
        stats.json aggregates every episode's (training on part of a dataset sees nothing of the
        rest)."""
        for index in episodes:
            self._row(index)  # an IndexError naming an episode out of range
        return _as_arrays(_read_episode_stats(self.root, self._meta, episodes).json())

    def __len__(self) -> int:
        """Number of frames."""
        return self.num_frames

    def episodes_table(self) -> list[dict[str, Any]]:
        """The episodes metadata: one dict per episode (without per-episode stats)."""
        return [dict(row) for row in self._meta.episodes]

    def episode_lengths(self) -> np.ndarray:
        """Executed actions per episode, frames ``0 .. n-1`` of each: the T steps of a Trajectory
        the toolkit wrote (T+1 frames, the last one holding the final observation, which
        ``has_action`` marks), and every frame of an episode LeRobot recorded (LeRobot records an
        action with each frame)."""
        final = 1 if ACTION_MASK in self.features or LEGACY_ACTION_PAD in self.features else 0
        return np.array([row["length"] - final for row in self._meta.episodes], dtype=np.int64)

    def episode_success(self) -> np.ndarray:
        """Whether each episode succeeded: the writer's ``success`` episode column, else, for
        episodes LeRobot wrote, the last frame of a ``next.success`` or ``success`` feature.
        DatasetError naming the episode when neither records it."""
        return np.array([self._success(index) for index in range(self.num_episodes)], dtype=bool)

    def _success(self, index: int) -> bool:
        """Episode ``index``'s success (``episode_success``)."""
        row = self._row(index)
        if row.get("success") is not None:
            return bool(row["success"])
        for key in SUCCESS_FEATURES:
            if key in self.features and self.features[key]["dtype"] == "bool":
                return bool(self.episode_frames(index, keys=[key])[key][-1])
        raise DatasetError(
            f"{_episodes_path(row)}: episode {index} records no success (no 'success' episode "
            f"column, no {' or '.join(map(repr, SUCCESS_FEATURES))} feature)"
        )

    def episode(self, index: int) -> Trajectory:
        """Episode ``index`` as the Trajectory that was written (images decoded); for episodes
        LeRobot wrote, what ``frames._frames_to_trajectory`` maps of it."""
        frames = self.episode_frames(index)
        try:
            success = self._success(index)
        except DatasetError:
            success = None
        return _frames_to_trajectory(frames, self.features, self._row(index), success)

    def episode_frames(
        self, index: int, keys: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Per-frame columns of an episode ([T+1, ...]), extras and decoded images included.

        ``keys`` picks features (videos not asked for are not decoded); default all of them.
        """
        row = self._row(index)
        table = self._episode_rows(row)
        frames = {}
        for name in self.features if keys is None else keys:
            if name not in self.features:
                raise KeyError(f"no feature {name!r}; the dataset has {list(self.features)}")
            if self.features[name]["dtype"] == "video":
                frames[name] = self._decode(row, name, 0, row["length"])
            else:
                frames[name] = self._column(row, table, name)
        return frames

    def frame(self, index: int) -> dict[str, np.ndarray]:
        """Frame ``index`` (global) as {feature: value}; decodes only that frame of each video."""
        if not 0 <= index < self.num_frames:
            raise IndexError(f"frame {index} is out of range for {self.num_frames} frames")
        episode = int(np.searchsorted(self._starts, index, side="right")) - 1
        row = self._row(episode)
        offset = index - row["dataset_from_index"]
        table = self._episode_rows(row).slice(offset, 1)
        frame = {}
        for name, feature in self.features.items():
            if feature["dtype"] == "video":
                frame[name] = self._decode(row, name, offset, offset + 1)[0]
            else:
                frame[name] = self._column(row, table, name)[0]
        return frame

    def _column(self, row: Mapping[str, Any], table: pa.Table, name: str) -> np.ndarray:
        """Feature ``name`` of an episode's rows as an array (images decoded); DatasetError
        naming the data file and the column when the column cannot be one."""
        try:
            return _from_arrow(table[name])
        except (ValueError, OSError, pa.ArrowException) as error:
            raise DatasetError(f"{_data_path(row)}: column {name!r}: {error}") from None

    def add_frame_feature(
        self,
        name: str,
        values_per_episode: Sequence[np.ndarray],
        info: dict[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        """Add a per-frame column (e.g. ``progress.label``) to every episode, on disk.

        ``values_per_episode[e]`` holds one entry per frame of episode e ([T+1, ...]); ``info``
        goes to the feature's info.json entry. ``overwrite=True`` replaces a feature added this
        way before. Data files and episodes files are rewritten atomically, then stats.json,
        then info.json: until info.json names the feature, readers ignore the column.
        """
        lock = DatasetLock(self.root, "add_frame_feature")
        lock.acquire()
        try:
            meta = _load_metadata(self.root)  # as it is now, under the lock
            _add_frame_feature(self.root, meta, name, values_per_episode, info, overwrite)
        finally:
            lock.release()
        self._load()

    def _row(self, index: int) -> dict[str, Any]:
        """The metadata row of episode ``index``."""
        if not 0 <= index < self.num_episodes:
            raise IndexError(f"episode {index} is out of range for {self.num_episodes} episodes")
        return self._meta.episodes[index]

    def _episode_rows(self, row: Mapping[str, Any]) -> pa.Table:
        """The data rows of one episode, from a (cached) data file."""
        relative = _data_path(row)
        if relative not in self._tables:
            if len(self._tables) >= self._CACHED_TABLES:
                del self._tables[next(iter(self._tables))]
            table = _read_table(self.root, relative, f"episode {row['episode_index']}")
            _check_index_columns(relative, table, self._rows_of[relative], self._meta)
            self._tables[relative] = (table, _from_arrow(table["index"]))
        table, index = self._tables[relative]
        start = int(np.searchsorted(index, row["dataset_from_index"]))
        stop = start + row["length"]
        if (
            stop > len(index)
            or index[start] != row["dataset_from_index"]
            or (index[stop - 1] != row["dataset_to_index"] - 1)
        ):
            raise DatasetError(
                f"{relative}: the rows of episode {row['episode_index']} are not where the "
                "episodes metadata says"
            )
        return table.slice(start, row["length"])

    def _decode(self, row: Mapping[str, Any], key: str, start: int, stop: int) -> np.ndarray:
        """Frames [start, stop) of an episode's video ``key``, cropped to the feature's size."""
        relative = _video_path(row, key)
        expected = row.get(f"videos/{key}/sha256")
        if self.verify_checksums and expected and relative not in self._verified:
            try:
                digest = _file_sha256(self.root / relative)
            except OSError as error:
                raise DatasetError(f"{relative}: unreadable ({error})") from error
            if digest != expected:
                raise DatasetError(
                    f"{relative}: corrupt video: its sha256 is {digest[:12]}... but the episodes "
                    f"metadata recorded {expected[:12]}... when it was written"
                )
            self._verified.add(relative)
        first = round(row[f"videos/{key}/from_timestamp"] * self.fps)
        frames = _decode_frames(self.root / relative, first + start, first + stop, self.fps)
        height, width = self.features[key]["shape"][:2]
        if frames.shape[1] < height or frames.shape[2] < width:
            raise DatasetError(
                f"{relative}: decoded frames are {frames.shape[1]}x{frames.shape[2]} but "
                f"meta/info.json says {key!r} has shape {self.features[key]['shape']}"
            )
        return frames[:, :height, :width]
