"""Random draws for policies that reproduce per episode: one ``torch.Generator`` per batch row.

A rollout gives each sub-env its own generator, seeded by the episode, so a row's noise does not
depend on which other rows share the batch: episodes repeat across batch sizes, workers and
backends. Noise is drawn on the generator's device and moved, so a CPU generator drives a CUDA
policy with the same numbers as on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

Generators = torch.Generator | Sequence[torch.Generator] | None


def randn(shape: Sequence[int], generator: Generators, device: Any = None, dtype: Any = None):
    """``torch.randn(shape)`` from ``generator``, or, given one generator per row (a sequence of
    ``shape[0]``), each row from its own."""
    if generator is None:
        return torch.randn(tuple(shape), device=device, dtype=dtype)
    if isinstance(generator, torch.Generator):
        noise = torch.randn(tuple(shape), generator=generator, device=generator.device, dtype=dtype)
        return noise.to(device)
    if len(generator) != shape[0]:
        raise ValueError(f"got {len(generator)} generators for a batch of {shape[0]}")
    rows = [torch.randn(tuple(shape[1:]), generator=g, dtype=dtype) for g in generator]
    return torch.stack(rows).to(device)


def multinomial(probs: torch.Tensor, generator: Generators) -> torch.Tensor:
    """One sample per row of ``probs [B, V]`` -> ``[B]``, per-row generators as in ``randn``."""
    if generator is None or isinstance(generator, torch.Generator):
        device = generator.device if generator is not None else probs.device
        choice = torch.multinomial(probs.to(device), 1, generator=generator)
        return choice.squeeze(1).to(probs.device)
    if len(generator) != probs.shape[0]:
        raise ValueError(f"got {len(generator)} generators for a batch of {probs.shape[0]}")
    rows = [
        torch.multinomial(p.cpu(), 1, generator=g) for p, g in zip(probs, generator, strict=True)
    ]
    return torch.cat(rows).to(probs.device)
