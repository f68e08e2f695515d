"""Tiny untrained policies of every type, and normalisation stats for Reach, for CPU tests of
what works through the ``Policy`` interface (a plain module: test modules import it by name)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from embodied.core.nn import build_vocab
from embodied.policies import Policy, make_policy

TASK_WORDS = build_vocab(
    ["reach the red block", "touch the blue block", "move to the yellow block"]
)
STATS = {
    "observation.state": {"mean": np.zeros(4), "std": np.full(4, 0.1)},
    "observation.environment_state": {"mean": np.zeros(39), "std": np.ones(39)},
    "action": {"min": -np.ones(4), "max": np.ones(4), "q01": -np.ones(4), "q99": np.ones(4)},
}


def tiny_policies(**diffusion: Any) -> dict[str, Policy]:
    """An MLP, a camera diffusion planner (its config updated by ``diffusion``), a flow planner
    and a VLA for Reach's 4-dim state and action, built fresh (seed torch first to repeat them)."""
    mlp = make_policy("mlp", state_dim=4, action_dim=4, hidden=[32])
    planner = make_policy(
        "diffusion", state_dim=4, action_dim=4, image_keys=["observation.image"], image_size=32,
        n_obs_steps=2, horizon=8, n_action_steps=4, vocab=TASK_WORDS, embed_dim=16,
        down_dims=[16, 32], vision_channels=[8, 16], num_keypoints=8, num_train_timesteps=20,
        num_inference_steps=5, finetune_steps=3, **diffusion,
    )  # fmt: skip
    flow = make_policy(
        "flow", state_dim=4, action_dim=4, image_keys=["observation.image"], image_size=32,
        n_obs_steps=2, horizon=8, n_action_steps=4, vocab=TASK_WORDS, embed_dim=16,
        down_dims=[16, 32], vision_channels=[8, 16], num_keypoints=8, noise_hidden_dims=[32],
        num_inference_steps=2,
    )  # fmt: skip
    vla = make_policy(
        "vla", action_dim=4, state_dim=4, image_size=32, patch_size=16, horizon=2,
        n_action_steps=2, n_bins=16, vocab=TASK_WORDS[1:], max_instruction_tokens=6,
        vision_hidden_size=32, vision_layers=1, vision_heads=2, vision_intermediate_size=64,
        hidden_size=32, text_layers=1, text_heads=2, text_intermediate_size=64,
    )  # fmt: skip
    return {"mlp": mlp, "diffusion": planner, "flow": flow, "vla": vla}


def unexecuted_rows_scored(
    policy: Any, obs: Any, instructions: list[str], executed: slice = slice(1, 5)
) -> bool:
    """Sample a chunk planner's decision, check its log-prob recomputes, then move the final
    chunk's rows outside ``executed`` (a horizon-8 planner from 2 observations executing 4
    actions: rows 1-4): does the log-prob change?"""
    out = policy.act(obs, instructions, generator=torch.Generator().manual_seed(0))
    recomputed = policy.log_prob(obs, instructions, out.policy_outputs)
    torch.testing.assert_close(recomputed, out.policy_outputs["log_probs"], atol=1e-4, rtol=0)
    chain = out.policy_outputs["chain"].clone()
    others = torch.ones(chain.shape[2], dtype=torch.bool)
    others[executed] = False
    chain[:, -1, others] += 0.5
    moved = policy.log_prob(obs, instructions, dict(out.policy_outputs, chain=chain))
    return not torch.allclose(moved, recomputed)
