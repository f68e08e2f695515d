"""``embodied bench train``: training steps/s, glibc's default malloc against kept memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.apps.allocator import keep_freed_memory
from embodied.apps.bench.common import Row, median_rate, random_observation, tabletop_features
from embodied.policies import DiffusionPolicy
from embodied.rewards import ProgressConfig, ProgressRewardModel
from embodied.train.loop import resolve_device, to_device


@dataclass
class TrainRow(Row):
    """Training steps/s (forward, backward, AdamW) of a model with one malloc setting, against
    glibc's default setting in the same process."""

    model: str
    batch: int
    allocator: str  # "glibc default" or "keep freed memory" (embodied.apps.allocator)
    steps_per_s: float
    baseline: str
    speedup: float  # steps/s / baseline steps/s


def bench_train(
    image_size: int = 96,
    batch_size: int = 32,
    steps: int = 3,
    repeats: int = 3,
    device: str = "cpu",
    progress: Any = None,
) -> list[TrainRow]:
    """Training steps/s of the default progress reward model (clips of 8 frames) and the diffusion
    planner (BC) at ``image_size`` on ``device`` (``auto``: CUDA when available; batches already
    there), with glibc's default malloc and with ``keep_freed_memory``, the default first. Off
    glibc the one row per model is the system's malloc."""

    where = resolve_device(device)
    rng = np.random.default_rng(0)
    tasks = ["put the red block on the green plate", "push the blue block to the purple plate"]
    text = [tasks[i % len(tasks)] for i in range(batch_size)]
    reward = ProgressRewardModel(ProgressConfig(image_size=image_size)).to(where)
    reward_batch = {
        "frames": torch.from_numpy(
            rng.integers(0, 256, (batch_size, 8, image_size, image_size, 3), dtype=np.uint8)
        ),
        "progress": torch.rand(batch_size, 8),
        "success": torch.zeros(batch_size),
        "instruction": text,
    }
    config = DiffusionPolicy.config_from_dataset(tabletop_features(image_size), tasks)
    planner = DiffusionPolicy(config).to(where)
    planner_batch = {
        **random_observation(planner, batch_size, rng),
        "action": torch.zeros(batch_size, config.horizon, 4),
        "action_is_pad": torch.zeros(batch_size, config.horizon, dtype=torch.bool),
        "instruction": text,
    }
    reward_batch, planner_batch = to_device(reward_batch, where), to_device(planner_batch, where)
    jobs = [
        ("progress (default)", reward, lambda: reward.loss(reward_batch)),
        ("diffusion BC", planner, lambda: planner.bc_loss(planner_batch)),
    ]
    glibc = keep_freed_memory(False, respect_environment=False)
    settings = [("glibc default", False), ("keep freed memory", True)] if glibc else []
    rows = []
    try:
        for label, model, loss in jobs:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def run(n: int, loss: Any = loss, optimizer: Any = optimizer) -> None:
                for _ in range(n):
                    optimizer.zero_grad()
                    loss().backward()
                    optimizer.step()

            if not glibc:  # one row: whatever malloc this system has
                rate = median_rate(run, steps, repeats, where)
                rows.append(TrainRow(label, batch_size, "system malloc", rate, "itself", 1.0))
            base = None
            for name, keep in settings:
                keep_freed_memory(keep, respect_environment=False)
                if progress is not None:
                    progress(f"train {label} at batch {batch_size}, {name}")
                rate = median_rate(run, steps, repeats, where)
                base = base or rate
                rows.append(TrainRow(label, batch_size, name, rate, settings[0][0], rate / base))
    finally:
        keep_freed_memory(True)  # as `embodied` runs (glibc defaults if the user set malloc's)
    return rows
