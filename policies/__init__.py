"""Policies: VLA and diffusion/flow planners and small baselines (see DESIGN.md).

Every policy is a ``torch.nn.Module`` registered by name (``register_policy``); ``make_policy``
builds one from its type and config, ``Policy.from_pretrained`` loads a saved one. This package
imports only the core (``embodied.core.types``, ``embodied.core.io``), torch, numpy and model libraries
(diffusers), never the other peers (sims, datasets, rewards).
"""

from embodied.policies.base import POLICIES, Normalizer, Policy, make_policy, register_policy
from embodied.policies.diffusion import DiffusionConfig, DiffusionPolicy
from embodied.policies.flow import FlowConfig, FlowPolicy
from embodied.policies.mlp import MLPConfig, MLPPolicy
from embodied.policies.vla import VLAConfig, VLAPolicy

__all__ = [
    "POLICIES",
    "DiffusionConfig",
    "DiffusionPolicy",
    "FlowConfig",
    "FlowPolicy",
    "MLPConfig",
    "MLPPolicy",
    "Normalizer",
    "Policy",
    "VLAConfig",
    "VLAPolicy",
    "make_policy",
    "register_policy",
]
