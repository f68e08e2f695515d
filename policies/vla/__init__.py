"""The VLA policy: ``config.py`` (``VLAConfig``), ``backbone.py`` (tiny Llava or a local model,
tokenizers, image tokens) and ``policy.py`` (``VLAPolicy``: prompt, action tokens, constrained
KV-cache decoding, log-probs, BC)."""

from embodied.policies.vla.config import VLAConfig
from embodied.policies.vla.policy import VLAPolicy

__all__ = ["VLAConfig", "VLAPolicy"]
