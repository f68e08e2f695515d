"""AdamW with a warm-up, then cosine decay (Diffusion Policy's recipe) or a constant rate (as RL
fine-tuning usually runs): the optimiser every training job uses."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from embodied.core.config import setting

SCHEDULES = ("cosine", "constant")


@dataclass
class OptimConfig:
    """``optim.*`` of every job."""

    lr: float = setting(1e-4, low=0.0)
    weight_decay: float = setting(1e-6, low=0.0)
    betas: tuple[float, float] = (0.95, 0.999)
    warmup_steps: int = setting(100, low=0)
    max_grad_norm: float = setting(1.0, low=0.0)
    schedule: str = setting("cosine", choices=SCHEDULES)

    def check(self) -> None:
        """Adam's betas are probabilities."""
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"optim.betas = {list(self.betas)}: expected each in [0, 1)")


def make_optimizer(
    params: Any, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its schedule: lr ramps up over ``warmup_steps``, then follows a cosine to 0 at
    ``total_steps`` or stays at ``lr`` (``cfg.schedule``)."""
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
    )

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
