"""The diffusion planner: ``config.py`` (``DiffusionConfig``), ``unet.py`` (the conditional 1-D
U-Net), ``conditioning.py`` (observations and instruction -> one conditioning vector) and
``policy.py`` (``DiffusionPolicy``: normalisers, EMA, BC, DDIM sampling with DPPO log-probs)."""

from embodied.policies.diffusion.config import DiffusionConfig
from embodied.policies.diffusion.policy import DiffusionPolicy

__all__ = ["DiffusionConfig", "DiffusionPolicy"]
