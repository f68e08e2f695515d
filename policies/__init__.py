"""Policies: VLA and diffusion/flow planners, small baselines, and LeRobot's policies.

Every policy is a ``torch.nn.Module`` implementing ``embodied.core.policy.Policy`` and registered
by name (``register_policy``); importing this package registers the built-in ones, so
``Policy.from_pretrained(dir)`` rebuilds any saved policy and ``make_policy(type, ...)`` a new one.
This package imports only the core, torch, numpy and model libraries (diffusers, transformers),
never the other peers (sims, datasets, rewards).
"""

from embodied.core.policy import POLICIES, ActionOutput, Policy, make_policy, register_policy
from embodied.policies.diffusion import DiffusionConfig, DiffusionPolicy
from embodied.policies.flow import FlowConfig, FlowPolicy
from embodied.policies.lerobot import LeRobotPolicy, LeRobotPolicyConfig
from embodied.policies.mlp import MLPConfig, MLPPolicy
from embodied.policies.vla import VLAConfig, VLAPolicy

__all__ = [
    "POLICIES",
    "ActionOutput",
    "DiffusionConfig",
    "DiffusionPolicy",
    "FlowConfig",
    "FlowPolicy",
    "LeRobotPolicy",
    "LeRobotPolicyConfig",
    "MLPConfig",
    "MLPPolicy",
    "Policy",
    "VLAConfig",
    "VLAPolicy",
    "make_policy",
    "register_policy",
]
