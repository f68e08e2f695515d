"""``embodied bench reward``: progress-model scoring frames/s, batched against one clip of the same
length."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.apps.bench.common import Row, paired_rates
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
    frames: tuple[int, ...] = (8, 100),
    repeats: int = 5,
    model_dirs: tuple[str, ...] = (),
    device: str = "cpu",
    progress: Any = None,
) -> list[RewardRow]:
    """Frames/s of ``ProgressRewardModel.progress`` on batches of clips, each against the same
    model scoring one clip of that length per call, timed in turn (``paired_rates``; batch 1 makes
    as many calls per timing as the largest batch has clips): clips of 8 frames are what GRPO and
    TPO score per rollout (``reward_frames``), 100 a whole rollout's frames. The default
    (configs/reward.yaml-sized) model at ``image_size`` and any saved models, on ``device``
    (``auto``: CUDA when available) with the clips starting on the CPU."""

    where = resolve_device(device)
    tasks = ["put the red block on the green plate", "push the blue block to the purple plate"]
    default = ProgressRewardModel(ProgressConfig(image_size=image_size))
    models: list[tuple[str, Any]] = [("progress (default)", default.to(where).eval())]
    models += [(str(d), ProgressRewardModel.from_pretrained(d, where).eval()) for d in model_dirs]
    rng = np.random.default_rng(0)
    rows = []
    for label, model in models:
        size = model.config.image_size
        for length in frames:
            if progress is not None:
                progress(f"reward {label}, {length} frames, batches {sorted(set(batches) | {1})}")
            runs, calls = {}, {}
            largest = max(set(batches) | {1})
            for batch in sorted(set(batches) | {1}):
                clips = torch.from_numpy(
                    rng.integers(0, 256, (batch, length, size, size, 3), dtype=np.uint8)
                )
                text = [tasks[i % len(tasks)] for i in range(batch)]
                calls[batch] = max(2, 2 * largest // batch)  # about as many clips in every timing

                def run(
                    n: int, model: Any = model, clips: Any = clips, text: Any = text, k: int = 1
                ) -> None:
                    for _ in range(n * k):
                        model.progress(clips, text)

                runs[batch] = functools.partial(run, k=calls[batch])
            rates = paired_rates(runs, 1, repeats, where)
            rates = {b: rates[b] * calls[b] * b * length for b in runs}
            baseline = f"{label} (batch 1, {length} frames)"
            rows += [
                RewardRow(label, b, length, rates[b], baseline, rates[b] / rates[1])
                for b in batches
            ]
    return rows
