"""The denoising steps of a LeRobot diffusion policy's scheduler (diffusers' ``DDIMScheduler`` or
``DDPMScheduler``), written out for per-sample timesteps and gradients, and made DPPO Gaussians.

LeRobot samples with ``scheduler.step(model_output, t, x)`` for ``t`` in ``scheduler.timesteps``.
The formulas here are that code's, term by term, with ``alphas_cumprod`` indexed per sample, so the
noiseless chain reproduces LeRobot's ``conditional_sample`` (a test compares them) and a recorded
step can be recomputed in one batch with the network's gradients:

DDIM (``t_prev = t - T // N``, ``abar_prev`` = ``final_alpha_cumprod`` below 0)::

    epsilon prediction:  x0 = (x - sqrt(1 - abar) eps) / sqrt(abar)
    sample prediction:   eps = (x - sqrt(abar) x0) / sqrt(1 - abar)
    x0 = clip(x0, -r, r)   (clip_sample with range r; eps stays unclipped: LeRobot calls step
                            without use_clipped_model_output)
    sigma = eta sqrt((1 - abar_prev) / (1 - abar) (1 - abar / abar_prev))
    mean  = sqrt(abar_prev) x0 + sqrt(1 - abar_prev - sigma^2) eps

DDPM (``t_prev`` = the next timestep of the schedule, -1 after the last; ``abar_prev = 1`` there)::

    alpha = abar / abar_prev,  beta = 1 - alpha
    mean  = sqrt(abar_prev) beta / (1 - abar) x0 + sqrt(alpha) (1 - abar_prev) / (1 - abar) x
    sigma = sqrt(max((1 - abar_prev) / (1 - abar) beta, 1e-20))  for t > 0, else 0   (fixed_small)

A fine-tuned (stochastic) step is ``N(mean, max(sigma, min_std)^2)``, with DDIM's mean and sigma at
``eta = ddim_eta``; LeRobot's own step is the ``eta = 0`` DDIM update, or the DDPM mean plus
``sigma`` noise.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn

PREDICTION_TYPES = ("epsilon", "sample")


class StepTerms(NamedTuple):
    """One step's quantities at ``x_t`` for per-sample ``t`` (``[B, 1, 1]`` scalars)."""

    x0: torch.Tensor  # clipped prediction of the clean chunk
    eps: torch.Tensor  # predicted noise (unclipped, as LeRobot's step uses it)
    abar: torch.Tensor
    abar_prev: torch.Tensor


class SchedulerSteps(nn.Module):
    """Per-sample DDIM / DDPM steps of one diffusers scheduler (as LeRobot configured it); its
    tables are non-persistent buffers, so they follow the policy's ``.to(device)``."""

    def __init__(self, scheduler: Any) -> None:
        super().__init__()
        name = type(scheduler).__name__
        if name not in ("DDIMScheduler", "DDPMScheduler"):
            raise ValueError(f"LeRobot noise scheduler {name} is not supported (DDIM or DDPM)")
        config = scheduler.config
        if config.prediction_type not in PREDICTION_TYPES or config.thresholding:
            raise ValueError(
                f"the scheduler's prediction_type={config.prediction_type!r} (thresholding="
                f"{config.thresholding}) is not supported; LeRobot's diffusion policy uses "
                f"{' or '.join(PREDICTION_TYPES)} without thresholding"
            )
        if name == "DDPMScheduler" and config.variance_type != "fixed_small":
            raise ValueError(f"DDPM variance_type {config.variance_type!r} is not supported")
        self.ddim = name == "DDIMScheduler"
        self.prediction_type = config.prediction_type
        self.clip = float(config.clip_sample_range) if config.clip_sample else None
        final = scheduler.final_alpha_cumprod if self.ddim else scheduler.one
        self.final = float(final)
        timesteps = scheduler.timesteps.long().clone()
        # The timestep after each one: DDIM steps by T // N; DDPM goes to the next in the list.
        if self.ddim:
            prev = timesteps - config.num_train_timesteps // scheduler.num_inference_steps
        else:
            prev = torch.cat([timesteps[1:], torch.tensor([-1])])
        self.alphas_cumprod: torch.Tensor
        self.timesteps: torch.Tensor
        self.prev: torch.Tensor
        self.register_buffer("alphas_cumprod", scheduler.alphas_cumprod.float().clone(), False)
        self.register_buffer("timesteps", timesteps, persistent=False)
        self.register_buffer("prev", prev, persistent=False)

    def _alphas(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``abar_t`` and ``abar_prev`` ``[B, 1, 1]`` of per-sample timesteps ``t [B]``."""
        index = torch.searchsorted(-self.timesteps, -t)  # timesteps are descending
        t_prev = self.prev[index]
        abar = self.alphas_cumprod[t]
        final = torch.full_like(abar, self.final)
        abar_prev = torch.where(t_prev >= 0, self.alphas_cumprod[t_prev.clamp(min=0)], final)
        return abar.view(-1, 1, 1), abar_prev.view(-1, 1, 1)

    def terms(self, output: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> StepTerms:
        """The predictions of the network's ``output`` at ``x_t`` (per-sample ``t``)."""
        abar, abar_prev = self._alphas(t)
        if self.prediction_type == "epsilon":
            x0 = (x - (1 - abar) ** 0.5 * output) / abar**0.5
            eps = output
        else:
            x0 = output
            eps = (x - abar**0.5 * x0) / (1 - abar) ** 0.5
        if self.clip is not None:
            x0 = x0.clamp(-self.clip, self.clip)
        return StepTerms(x0, eps, abar, abar_prev)

    def mean_std(
        self, terms: StepTerms, x: torch.Tensor, t: torch.Tensor, eta: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's mean ``[B, T, A]`` and its own std ``[B, 1, 1]`` (DDIM at ``eta``; DDPM's
        ``fixed_small`` std, 0 at ``t = 0``)."""
        x0, eps, abar, abar_prev = terms
        if self.ddim:
            variance = (1 - abar_prev) / (1 - abar) * (1 - abar / abar_prev)
            sigma = eta * variance**0.5
            mean = abar_prev**0.5 * x0 + (1 - abar_prev - sigma**2) ** 0.5 * eps
            return mean, sigma
        alpha = abar / abar_prev
        beta = 1 - alpha
        mean = (abar_prev**0.5 * beta / (1 - abar)) * x0 + (
            alpha**0.5 * (1 - abar_prev) / (1 - abar)
        ) * x
        variance = ((1 - abar_prev) / (1 - abar) * beta).clamp(min=1e-20)
        noisy = (t > 0).view(-1, 1, 1)
        return mean, torch.where(noisy, variance**0.5, torch.zeros_like(variance))
