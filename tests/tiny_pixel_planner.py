"""A tiny two-frame camera planner, its batches and statistics, shared by the diffusion,
pixel-planner and auxiliary-state tests (a plain helper module, not a test file)."""

from __future__ import annotations

import numpy as np
import torch

from embodied.core.features import ENV_STATE_KEY
from embodied.core.nn import build_vocab
from embodied.core.policy import Policy
from embodied.policies.diffusion import DiffusionConfig, DiffusionPolicy

INSTRUCTIONS = ["reach the red block", "reach the blue block", "go to the red block", ""]
NAMES = ["block_red.x", "block_red.y", "block_blue.x", "block_blue.y", "drawer.opening"]
STATS = {
    "observation.state": {"mean": np.zeros(3), "std": np.ones(3)},
    "observation.environment_state": {"mean": np.zeros(5), "std": 2 * np.ones(5)},
    "action": {"min": -np.ones(2), "max": np.ones(2)},
}


def tiny_diffusion_config(**overrides) -> DiffusionConfig:
    """A planner small enough for CPU tests: one 32 px camera, horizon 8, 5 DDIM steps."""
    values = dict(
        state_dim=3,
        action_dim=2,
        image_keys=["observation.image"],
        image_size=32,
        n_obs_steps=2,
        horizon=8,
        n_action_steps=4,
        embed_dim=16,
        down_dims=[16, 32],
        vision_channels=[8, 16],
        num_keypoints=8,
        num_train_timesteps=20,
        num_inference_steps=5,
        finetune_steps=3,
    )
    return DiffusionConfig(**{**values, **overrides})


def pixel_config(**overrides) -> DiffusionConfig:
    """The tiny planner on the front camera, predicting a 5-value environment state from its
    keypoints."""
    values = dict(
        image_keys=["observation.images.front"],
        vocab=build_vocab([*INSTRUCTIONS, "block_red", "block_blue", "drawer"]),
        vision_film=True,
        aux_state_dim=5,
        aux_state_names=NAMES,
        aux_state_weight=1.0,
        aux_state_encoder="objects",
    )
    return tiny_diffusion_config(**{**values, **overrides})


def pixel_policy(**overrides) -> DiffusionPolicy:
    torch.manual_seed(0)
    return DiffusionPolicy(pixel_config(**overrides)).fit_normalizers(STATS)


def batch(size: int = 4, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (size, 2, 32, 32, 3), generator=g).to(torch.uint8)
    return {
        "observation.images.front": images,
        "observation.state": torch.randn(size, 2, 3, generator=g),
        ENV_STATE_KEY: torch.randn(size, 2, 5, generator=g),
        "action": torch.rand(size, 8, 2, generator=g) * 2 - 1,
        "action_is_pad": torch.zeros(size, 8, dtype=torch.bool),
        "instruction": INSTRUCTIONS[:size],
    }


def inputs(data: dict, policy: Policy) -> dict:
    """Only what the policy reads at inference."""
    return {k: data[k] for k in policy.observation_spec.read_keys()}
