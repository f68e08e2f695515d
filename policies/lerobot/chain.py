"""The sampling chains of LeRobot policies as the toolkit runs them (``LeRobotChain``), and the
diffusion policy's (``DiffusionChain``): the denoising steps of its scheduler (diffusers'
``DDIMScheduler`` or ``DDPMScheduler``), written out for per-sample timesteps and gradients, and
made DPPO Gaussians. The flow-matching SmolVLA's chain is in ``smolvla.py``.

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

from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

from embodied.core.sampling import Generators, randn
from embodied.policies.sampler import Step, explore_rows, gaussian_log_prob

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


class LeRobotChain(nn.Module):
    """What a LeRobot policy type adds to ``LeRobotPolicy``: its sampling chain over the network
    LeRobot built (``model``, a reference: the policy owns it and saves it in LeRobot's format),
    in LeRobot's normalised action space. ``run_chain`` (``policies/sampler.py``) drives it."""

    time_key: ClassVar[str]  # where policy_outputs records the stochastic steps' times
    time_dtype: ClassVar[torch.dtype]
    times: torch.Tensor  # [N] the chain's times, in order

    def __init__(self, model: nn.Module, min_std: float, explore_executed: bool) -> None:
        super().__init__()
        object.__setattr__(self, "model", model)  # not a submodule: no second copy of its weights
        self.min_std = min_std
        self.explore_executed = explore_executed  # noise on the executed rows only

    @property
    def shape(self) -> tuple[int, int]:
        """The chain's ``x`` per decision: ``(chunk length, action values)``."""
        raise NotImplementedError

    def context(self, batch: Mapping[str, torch.Tensor]) -> Any:
        """What every step of one decision reads, from LeRobot's normalised batch (once)."""
        raise NotImplementedError

    def lerobot_step(
        self, x: torch.Tensor, t: torch.Tensor, context: Any, generator: Generators
    ) -> torch.Tensor:
        """LeRobot's own step from ``x`` at per-sample times ``t [B]`` (its noise, if any, from
        ``generator``; none without one)."""
        raise NotImplementedError

    def gaussian_step(self, x: torch.Tensor, t: torch.Tensor, context: Any) -> Step:
        """A fine-tuned (recorded) step: ``N(mean, std^2)`` and its noiseless update; with
        ``explore_executed`` the noise on ``executed_rows`` only."""
        step = self.step_distribution(x, t, context)
        return explore_rows(step, self.executed_rows) if self.explore_executed else step

    def step_distribution(self, x: torch.Tensor, t: torch.Tensor, context: Any) -> Step:
        """The chain's own Gaussian step over the whole chunk, and its noiseless update."""
        raise NotImplementedError

    @property
    def executed_rows(self) -> slice:
        """The chunk's rows a decision executes."""
        raise NotImplementedError

    def log_probs(
        self, context: Any, t: torch.Tensor, x: torch.Tensor, x_next: torch.Tensor, k: int
    ) -> torch.Tensor:
        """Log-densities ``[B * K]`` of recorded steps (``recorded_steps``' flat ``t``, ``x``,
        ``x_next``, K per decision), with gradients."""
        raise NotImplementedError

    def executed(self, x: torch.Tensor) -> torch.Tensor:
        """The normalised actions a decision executes, ``[B, n_action_steps, A]``, of its final
        ``x``."""
        return x[:, self.executed_rows]


class DiffusionChain(LeRobotChain):
    """LeRobot's diffusion policy: its scheduler's steps over the U-Net conditioned on
    ``DiffusionModel._prepare_global_conditioning`` (module docstring)."""

    time_key = "timesteps"
    time_dtype = torch.long

    def __init__(
        self, model: nn.Module, min_std: float, ddim_eta: float, explore_executed: bool
    ) -> None:
        super().__init__(model, min_std, explore_executed)
        diffusion = model.diffusion
        diffusion.noise_scheduler.set_timesteps(diffusion.num_inference_steps)
        self.steps = SchedulerSteps(diffusion.noise_scheduler)
        self.ddim_eta = ddim_eta

    @property
    def times(self) -> torch.Tensor:  # type: ignore[override]
        """The scheduler's timesteps, descending."""
        return self.steps.timesteps

    @property
    def shape(self) -> tuple[int, int]:
        """``(horizon, action size)``."""
        config = self.model.config
        return config.horizon, int(config.output_features["action"].shape[0])

    def context(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """LeRobot's global conditioning ``[B, G]`` (its own encoders; cameras stacked)."""
        batch = dict(batch)
        image_keys = list(self.model.config.image_features)
        if image_keys:
            batch["observation.images"] = torch.stack([batch[key] for key in image_keys], dim=-4)
        return self.model.diffusion._prepare_global_conditioning(batch)

    def _terms(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> StepTerms:
        """One U-Net call at ``x_t`` (per-sample ``t``), as the scheduler's step reads it."""
        output = self.model.diffusion.unet(x, t, global_cond=cond)
        return self.steps.terms(output, x, t)

    def lerobot_step(
        self, x: torch.Tensor, t: torch.Tensor, context: Any, generator: Generators
    ) -> torch.Tensor:
        """DDIM at ``eta = 0``; DDPM's mean plus its noise (none without a ``generator``: the
        noiseless chain of deterministic acting)."""
        mean, sigma = self.steps.mean_std(self._terms(x, t, context), x, t, eta=0.0)
        if self.steps.ddim or generator is None:
            return mean
        return mean + sigma * randn(x.shape, generator, device=x.device)

    def step_distribution(self, x: torch.Tensor, t: torch.Tensor, context: Any) -> Step:
        """``N(mean, max(sigma, min_std)^2)`` (DDIM at ``ddim_eta``) and the noiseless update
        of the same U-Net call."""
        terms = self._terms(x, t, context)
        mean, sigma = self.steps.mean_std(terms, x, t, eta=self.ddim_eta)
        noiseless = mean if not self.steps.ddim else self.steps.mean_std(terms, x, t, 0.0)[0]
        return Step(mean, sigma.clamp(min=self.min_std), noiseless)

    def log_probs(
        self, context: Any, t: torch.Tensor, x: torch.Tensor, x_next: torch.Tensor, k: int
    ) -> torch.Tensor:
        """One batched U-Net call over the ``B * K`` recorded steps."""
        step = self.gaussian_step(x, t, context.repeat_interleave(k, dim=0))
        return gaussian_log_prob(x_next, step.mean, step.std)

    @property
    def executed_rows(self) -> slice:
        """Chunk steps ``n_obs_steps - 1 ..`` (as LeRobot's ``generate_actions``)."""
        config = self.model.config
        start = config.n_obs_steps - 1
        return slice(start, start + config.n_action_steps)
