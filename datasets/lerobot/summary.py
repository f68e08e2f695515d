"""``dataset_summary``: the figures ``embodied dataset info`` prints for a dataset."""

from __future__ import annotations

import os
from typing import Any

from embodied.datasets.lerobot.layout import DatasetError
from embodied.datasets.lerobot.reader import LeRobotDataset


def dataset_summary(root: str | os.PathLike[str]) -> dict[str, Any]:
    """Episodes, frames, fps, tasks, features, success rate, size, codec: ``dataset info``."""
    dataset = LeRobotDataset(root)
    try:
        successes = dataset.episode_success()
        success_rate = float(successes.mean()) if len(successes) else None
    except DatasetError:  # not recorded (a dataset LeRobot wrote, without next.success)
        success_rate = None
    codecs = sorted(
        {
            f"{feature.get('info', {}).get('video.codec')} "
            f"({feature.get('info', {}).get('video.pix_fmt')})"
            for feature in dataset.features.values()
            if feature["dtype"] == "video"
        }
    )
    size = sum(path.stat().st_size for path in dataset.root.rglob("*") if path.is_file())
    return {
        "root": str(dataset.root),
        "codebase_version": dataset.info["codebase_version"],
        "robot_type": dataset.info.get("robot_type"),
        "episodes": dataset.num_episodes,
        "frames": dataset.num_frames,
        "fps": dataset.fps,
        "tasks": dataset.tasks,
        "success_rate": success_rate,
        "size_bytes": size,
        "video_codec": ", ".join(codecs) if codecs else None,
        "features": {
            name: f"{feature['dtype']} {list(feature['shape'])}"
            for name, feature in dataset.features.items()
        },
    }
