"""``embodied bench vision``: what seeing costs. Camera encoders' frames/s (each against the small
ResNet the planners train from scratch), and behaviour-cloning steps/s of the pixel planner with
each encoder, a frozen pretrained trunk with and without its per-frame feature cache, each
against the state-only planner in the same run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.apps.bench.common import Row, median_rate, random_observation, tabletop_features
from embodied.core.vision import build_image_encoder
from embodied.policies import DiffusionPolicy

# (label, vision_encoder, vision_channels): configs/bc_pixels.yaml's ResNet first.
ENCODERS = (
    ("resnet [32, 64]", "resnet", [32, 64]),
    ("resnet [32, 64, 128]", "resnet", [32, 64, 128]),
    ("efficientnet_lite0 (frozen, 4 blocks)", "efficientnet_lite0", [64]),
)
TASKS = ["reach the red block", "push the blue block onto the green plate"]


@dataclass
class VisionRow(Row):
    """One encoder's or planner's rate against the first row of its part."""

    part: str  # "encode" (frames/s) or "bc step" (training steps/s)
    variant: str
    batch: int
    per_s: float
    baseline: str
    ratio: float  # per_s / baseline per_s


def bench_vision(
    image_size: int = 64,
    batch: int = 64,
    steps: int = 3,
    repeats: int = 3,
    progress: Any = None,
) -> list[VisionRow]:
    """Frames/s of each encoder (``ENCODERS``, inference) and BC steps/s of the planner on
    cameras with each, against the small ResNet and the state-only planner respectively."""
    rng = np.random.default_rng(0)
    frames = torch.from_numpy(rng.integers(0, 256, (batch, image_size, image_size, 3), np.uint8))
    rows: list[VisionRow] = []
    for label, name, channels in ENCODERS:
        if progress is not None:
            progress(f"encoder {label}")
        encoder = build_image_encoder(name, channels, 32, 64).eval()

        def encode(n: int, encoder: Any = encoder) -> None:
            with torch.inference_mode():
                for _ in range(n):
                    encoder(frames)

        rows.append(VisionRow("encode", label, batch, batch * median_rate(encode, steps, repeats),
                              ENCODERS[0][0], 0.0))  # fmt: skip
    pixels = {"env_state_dim": 0, "env_state_names": []}  # cameras only, no privileged state
    planners = [
        ("state planner (objects)", {"image_keys": [], "env_state_encoder": "objects"}, True)
    ]
    for label, name, channels in ENCODERS:
        overrides = {**pixels, "vision_encoder": name, "vision_channels": channels}
        if name == "resnet":
            planners.append((f"pixels {label}", overrides, True))
        else:  # a frozen trunk: with its per-frame cache (later epochs) and without (the first)
            planners += [(f"pixels {label}, cached", overrides, True),
                         (f"pixels {label}, no cache", overrides, False)]  # fmt: skip
    for label, overrides, cache in planners:
        if progress is not None:
            progress(f"bc step {label}")
        rate = _bc_rate(overrides, cache, image_size, batch, steps, repeats, rng)
        rows.append(VisionRow("bc step", label, batch, rate, planners[0][0], 0.0))
    for part in ("encode", "bc step"):
        mine = [r for r in rows if r.part == part]
        for row in mine:
            row.ratio = row.per_s / mine[0].per_s
    return rows


def _bc_rate(overrides: dict[str, Any], cache: bool, image_size: int, batch: int, steps: int,
             repeats: int, rng: np.random.Generator) -> float:  # fmt: skip
    """BC steps/s (forward, backward, AdamW) of one planner variant on a fixed batch."""
    features = tabletop_features(image_size, env_state=True)
    config = DiffusionPolicy.config_from_dataset(
        features, TASKS, cond_mlp_dims=[256, 256], n_action_steps=4, **overrides
    )
    planner = DiffusionPolicy(config).train()
    for encoder in planner.model.image_encoders:
        if hasattr(encoder, "cache_trunk"):
            encoder.cache_trunk = cache
    data = {
        **random_observation(planner, batch, rng),
        "action": torch.zeros(batch, config.horizon, config.action_dim),
        "action_is_pad": torch.zeros(batch, config.horizon, dtype=torch.bool),
        "instruction": [TASKS[i % 2] for i in range(batch)],
    }
    optimizer = torch.optim.AdamW(planner.parameters(), lr=1e-4)

    def run(n: int) -> None:
        for _ in range(n):
            optimizer.zero_grad()
            planner.bc_loss(data).backward()
            optimizer.step()

    return median_rate(run, steps, repeats)
