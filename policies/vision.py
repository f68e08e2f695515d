"""Observation and instruction encoders for the planners (re-exported from ``embodied.core.nn``).

The encoders live in the core (``embodied/nn.py``) so that reward models can use them too without
importing this peer; see that module for what they do. Every public name here keeps working.
"""

from __future__ import annotations

from embodied.core.nn import (
    UNKNOWN_WORD,
    ImageEncoder,
    InstructionEncoder,
    ObjectStateEncoder,
    ObjectTokens,
    ResidualBlock2d,
    SpatialSoftmax,
    build_vocab,
    group_norm,
    object_groups,
    tokenize_words,
)

_group_norm = group_norm  # the old private name

__all__ = [
    "UNKNOWN_WORD",
    "ImageEncoder",
    "InstructionEncoder",
    "ObjectStateEncoder",
    "ObjectTokens",
    "ResidualBlock2d",
    "SpatialSoftmax",
    "build_vocab",
    "object_groups",
    "tokenize_words",
]
