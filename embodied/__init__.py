"""Embodied and vision-language trajectory learning toolkit.

Kept light on purpose: importing ``embodied`` (or ``embodied.sims``) must not import torch models.
"""

from embodied.core.trajectory import Trajectory

__version__ = "0.1.0"
__all__ = ["Trajectory", "__version__"]
