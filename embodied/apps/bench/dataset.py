"""``embodied bench dataset``: LeRobot dataset reads against raw video decoding."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av

from embodied.apps.bench.common import Row, median_rate
from embodied.apps.collect import CollectConfig, run_collect
from embodied.datasets import LeRobotDataset


@dataclass
class DatasetRow(Row):
    """Reading a LeRobot dataset's episodes, against decoding the same videos with no colour
    conversion (the decoder's own rate)."""

    read: str
    image_size: int
    episodes_per_s: float
    frames_per_s: float
    baseline: str
    baseline_frames_per_s: float
    ratio: float  # time per frame read / time per frame decoded raw (1.0 = no overhead)


def bench_dataset(
    task: str = "PickPlace",
    episodes: int = 8,
    image_size: int = 64,
    repeats: int = 3,
    progress: Any = None,
) -> list[DatasetRow]:
    """Episodes/s and frames/s of ``LeRobotDataset.episode_frames`` (what labelling, reward and
    BC training read) on freshly collected expert episodes: every feature, and the camera alone.
    The baseline decodes the same mp4 files to raw YUV planes in this process."""

    if progress is not None:
        progress(f"dataset reads of {episodes} {task} episodes at {image_size}x{image_size}")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = CollectConfig(task=task, episodes=episodes, out=f"{tmp}/data", image_size=image_size)
        run_collect(cfg)
        dataset = LeRobotDataset(cfg.out)
        image_key = next(k for k, f in dataset.features.items() if f["dtype"] == "video")
        frames = sum(length + 1 for length in dataset.episode_lengths())
        videos = sorted(Path(cfg.out, "videos").rglob("*.mp4"))

        def raw_decode() -> None:
            for path in videos:
                with av.open(str(path)) as container:
                    for frame in container.decode(video=0):
                        frame.to_ndarray()  # the decoder's planes, no conversion

        def read(keys: list[str] | None) -> Any:
            def run(_: int) -> None:
                for episode in range(dataset.num_episodes):
                    dataset.episode_frames(episode, keys=keys)

            return run

        # Reads of the whole dataset per second (median; a warm-up read opens the files first).
        base = median_rate(lambda _: raw_decode(), 1, repeats)
        rows = []
        for label, keys in (("every feature", None), ("camera only", [image_key])):
            rate = median_rate(read(keys), 1, repeats)
            rows.append(
                DatasetRow(
                    label,
                    image_size,
                    dataset.num_episodes * rate,
                    frames * rate,
                    "raw mp4 decode (no colour conversion)",
                    frames * base,
                    base / rate,
                )
            )
    return rows
