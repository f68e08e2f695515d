"""An episode made ready for a dataset away from its writer: columns checked, their stats
computed and camera images encoded, the costly part of adding it (about 0.1 s for 100 frames
at 96 px).

``prepare_episode`` reads no writer state, only its ``EpisodeSettings``, so episodes can be
prepared in other processes (or threads: numpy and the video encoder release the GIL) while the
writer adds them, in order, with ``LeRobotDatasetWriter.add_episode``. The result is the same as
adding the trajectory itself.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from embodied.core.trajectory import Trajectory
from embodied.datasets.lerobot.frames import (
    _check_episode_scalars,
    _Column,
    _trajectory_columns,
)
from embodied.datasets.lerobot.stats import _episode_stats
from embodied.datasets.lerobot.videos import encode_episode


class EpisodeSettings(NamedTuple):
    """What preparing an episode depends on in its writer (``LeRobotDatasetWriter.settings``)."""

    fps: int
    video_info: dict[str, Any]  # a video feature's encoding
    legacy_pad: bool  # the older ``action_is_pad`` column instead of ``has_action``


@dataclass(frozen=True)
class PreparedEpisode:
    """A trajectory with its dataset columns, their stats and (lossy) encoded videos, made for
    a writer with ``settings``."""

    traj: Trajectory
    columns: list[_Column]
    metadata_json: str
    stats: dict[str, dict[str, np.ndarray]]  # per column
    videos: dict[str, io.BytesIO]  # per camera column: the episode's mp4 (lossy videos only)
    settings: EpisodeSettings


def prepare_episode(traj: Trajectory, settings: EpisodeSettings) -> PreparedEpisode:
    """Check ``traj`` (ValueError naming what is wrong), compute its columns' stats and encode
    its camera images (lossless ones are encoded when added: they share one stream per file)."""
    columns = _trajectory_columns(traj, settings.legacy_pad)  # validates the trajectory
    metadata_json = _check_episode_scalars(traj)
    stats = {column.name: _episode_stats(column.values, column.video) for column in columns}
    videos = {}
    if not settings.video_info["video.lossless"]:
        for column in columns:
            if column.video:
                videos[column.name] = encode_episode(
                    column.values, settings.fps, settings.video_info, column.name
                )
    return PreparedEpisode(traj, columns, metadata_json, stats, videos, settings)
