"""``embodied bench policy``: sampling decisions/s and actions/s per policy, against DDIM-10."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import embodied.policies  # noqa: F401  (registers the policy types)
from embodied.apps.bench.common import Row, median_rate, random_observation, tabletop_features
from embodied.core.policy import POLICIES, Policy
from embodied.train.loop import resolve_device


@dataclass
class PolicyRow(Row):
    """Sampling speed of one policy at one batch size, against DDIM-10 diffusion at that size."""

    policy: str
    batch: int
    decisions_per_s: float
    actions_per_s: float  # decisions/s x batch x actions per chunk
    baseline: str
    speedup: float  # this actions/s / baseline actions/s


# (label, policy type, config overrides): each policy kind at tabletop shapes.
POLICY_VARIANTS = (
    ("diffusion DDIM-10", "diffusion", {"num_inference_steps": 10}),
    # configs/bc_diffusion.yaml's planner: no camera, the state through the object encoder.
    (
        "diffusion DDIM-10 state+objects",
        "diffusion",
        {"num_inference_steps": 10, "image_keys": [], "env_state_encoder": "objects"},
    ),
    # configs/bc_pixels.yaml's planner: the camera through a FiLM'd ResNet, and the same with the
    # frozen pretrained EfficientNet-Lite0 trunk.
    (
        "diffusion DDIM-10 pixels resnet",
        "diffusion",
        {"num_inference_steps": 10, "vision_channels": [32, 64], "vision_film": True},
    ),
    (
        "diffusion DDIM-10 pixels efficientnet",
        "diffusion",
        {"num_inference_steps": 10, "vision_encoder": "efficientnet_lite0", "vision_film": True},
    ),
    ("flow Euler-4", "flow", {"num_inference_steps": 4}),
    ("flow Euler-1", "flow", {"num_inference_steps": 1}),
    ("vla decoding", "vla", {}),
    # The pixel VLA with keypoint image tokens (configs/bc_vla_pixels.yaml), trained or pretrained.
    ("vla decoding keypoints resnet", "vla", {"vision_encoder": "resnet"}),
    ("vla decoding keypoints efficientnet", "vla", {"vision_encoder": "efficientnet_lite0"}),
    ("mlp gaussian", "mlp", {}),
)


def bench_policy(
    image_size: int = 64,
    batches: tuple[int, ...] = (1, 16),
    decisions: int = 5,
    repeats: int = 5,
    policy_dirs: tuple[str, ...] = (),
    device: str = "cpu",
    progress: Any = None,
) -> list[PolicyRow]:
    """Decisions/s and actions/s of ``act`` (sampling, as in RL rollouts) for each policy type
    at tabletop shapes, untrained weights, plus any saved policies in ``policy_dirs``, on
    ``device`` (``auto``: CUDA when available); observations start on the CPU, as from envs."""

    where = resolve_device(device)

    features = tabletop_features(image_size)
    state_features = tabletop_features(image_size, env_state=True)
    tasks = ["reach the red block", "push the blue block onto the green plate"]
    policies: list[tuple[str, Any]] = []
    for label, kind, overrides in POLICY_VARIANTS:
        if kind in POLICIES:
            cls = POLICIES[kind]
            shape = state_features if "env_state_encoder" in overrides else features
            config = cls.config_from_dataset(shape, tasks, **overrides)
            policies.append((label, cls(config).to(where).eval()))
    for directory in policy_dirs:
        policies.append((str(directory), Policy.from_pretrained(directory, where).eval()))

    rng = np.random.default_rng(0)
    rates: dict[tuple[str, int], tuple[float, float]] = {}
    for label, policy in policies:
        for batch in batches:
            if progress is not None:
                progress(f"policy {label} at batch {batch}")
            obs = random_observation(policy, batch, rng)
            instructions = [tasks[i % len(tasks)] for i in range(batch)]
            generator = torch.Generator().manual_seed(0)
            chunk = policy.act(obs, instructions, generator=generator).actions.shape[1]

            def run(n: int, policy: Any = policy, obs: Any = obs, text: Any = instructions) -> None:
                with torch.no_grad():
                    for _ in range(n):
                        policy.act(obs, text, generator=generator)  # noqa: B023 (used at once)

            per_s = median_rate(run, decisions, repeats, where)
            rates[label, batch] = (per_s, per_s * batch * chunk)
    base = POLICY_VARIANTS[0][0]
    return [
        PolicyRow(
            label,
            batch,
            decisions_per_s,
            actions_per_s,
            f"{base} (batch {batch})",
            actions_per_s / rates[base, batch][1] if (base, batch) in rates else float("nan"),
        )
        for (label, batch), (decisions_per_s, actions_per_s) in rates.items()
    ]
