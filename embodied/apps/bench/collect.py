"""``embodied bench collect``: collection episodes/min and frames/s per worker count."""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from typing import Any

from embodied.apps.bench.common import Row
from embodied.apps.collect import CollectConfig, run_collect


@dataclass
class CollectRow(Row):
    """Collection throughput with images for one worker count, against one worker."""

    task: str
    workers: int
    image_size: int
    episodes_per_min: float
    frames_per_s: float
    baseline: str
    speedup: float  # baseline time / this time (2.0 = twice as fast)


def bench_collect(
    task: str = "PickPlace",
    workers: tuple[int, ...] = (1, 2),
    episodes: int = 8,
    image_size: int = 96,
    repeats: int = 3,
    progress: Any = None,
) -> list[CollectRow]:
    """Episodes/min and frames/s of ``embodied collect`` (expert, images, written to a LeRobot
    dataset) per worker count; median of ``repeats`` runs, each into a fresh temporary dir."""

    rates: dict[int, tuple[float, float]] = {}
    for count in workers:
        if progress is not None:
            progress(f"collect {task} with {count} worker(s)")
        runs = []
        for r in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                cfg = CollectConfig(
                    task=task,
                    episodes=episodes,
                    out=f"{tmp}/data",
                    workers=count,
                    image_size=image_size,
                    seed=1000 * r,
                )
                summary = run_collect(cfg)
            runs.append((summary.episodes / summary.seconds * 60, summary.frames / summary.seconds))
        rates[count] = (
            statistics.median(e for e, _ in runs),
            statistics.median(f for _, f in runs),
        )
    base = rates[workers[0]][0]
    return [
        CollectRow(task, n, image_size, e, f, f"{workers[0]} worker(s)", e / base)
        for n, (e, f) in rates.items()
    ]
