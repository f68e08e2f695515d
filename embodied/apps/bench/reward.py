"""``embodied bench reward``: progress-model scoring frames/s, batched against one clip."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.apps.bench.common import Row, median_rate
from embodied.rewards import ProgressConfig, ProgressRewardModel
from embodied.train.loop import resolve_device


@dataclass
class RewardRow(Row):
    """Scoring speed of a progress reward model on rollouts, against one clip at a time."""

    model: str
    batch: int  # clips scored per call
    frames: int  # frames per clip
    frames_per_s: float
    baseline: str
    speedup: float  # frames/s / baseline frames/s


def bench_reward(
    image_size: int = 64,
    batches: tuple[int, ...] = (1, 16),
    frames: int = 100,
    repeats: int = 5,
    model_dirs: tuple[str, ...] = (),
    device: str = "cpu",
    progress: Any = None,
) -> list[RewardRow]:
    """Frames/s of ``ProgressRewardModel.progress`` on batches of rollout-length clips (GRPO's
    scoring step): the default (configs/reward.yaml-sized) model at ``image_size`` and any saved
    models, each against the same model scoring one clip per call, on ``device`` (``auto``: CUDA
    when available) with the clips starting on the CPU."""

    where = resolve_device(device)
    tasks = ["put the red block on the green plate", "push the blue block to the purple plate"]
    default = ProgressRewardModel(ProgressConfig(image_size=image_size))
    models: list[tuple[str, Any]] = [("progress (default)", default.to(where).eval())]
    models += [(str(d), ProgressRewardModel.from_pretrained(d, where).eval()) for d in model_dirs]
    rng = np.random.default_rng(0)
    rows = []
    for label, model in models:
        size = model.config.image_size
        rates = {}
        for batch in sorted(set(batches) | {1}):
            if progress is not None:
                progress(f"reward {label} at batch {batch}")
            clips = torch.from_numpy(
                rng.integers(0, 256, (batch, frames, size, size, 3), dtype=np.uint8)
            )
            text = [tasks[i % len(tasks)] for i in range(batch)]

            def run(n: int, model: Any = model, clips: Any = clips, text: Any = text) -> None:
                for _ in range(n):
                    model.progress(clips, text)

            rates[batch] = median_rate(run, 2, repeats, where) * batch * frames
        rows += [
            RewardRow(label, b, frames, rates[b], f"{label} (batch 1)", rates[b] / rates[1])
            for b in batches
        ]
    return rows
