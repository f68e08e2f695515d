"""Sampling chains of the action-chunk planners (``policies/diffusion``, ``policies/flow.py``): the
DDIM and Euler steps, the Gaussian log-density of a chain step, and the chain loop both ``act``s
run, with exact per-step log-probabilities for RL (DPPO for DDIM, ReinFlow for flow matching).

DDIM step (diffusion), over timesteps ``t`` with ``t_prev = t - T // N`` (diffusers' "leading"
spacing; ``abar_prev = 1`` below 0), from ``x_t`` and the network's output ``eps_theta``::

    x0_hat  = clip((x_t - sqrt(1 - abar_t) eps_theta) / sqrt(abar_t), -1, 1)   # or the output
    eps_hat = (x_t - sqrt(abar_t) x0_hat) / sqrt(1 - abar_t)      # re-derived from the clipped x0
    sigma_t = eta * sqrt((1 - abar_prev) / (1 - abar_t) * (1 - abar_t / abar_prev))   # DDIM (16)
    mu      = sqrt(abar_prev) x0_hat + sqrt(1 - abar_prev - sigma_t^2) eps_hat       # DDIM (12)

This is diffusers' ``DDIMScheduler.step(..., eta, use_clipped_model_output=True)`` without its
noise, written out so it runs with per-sample timesteps and gradients (a test checks the match).
With ``prediction_type="sample"`` the network's output is ``x0_hat`` before the clip.

Euler step (flow matching), over ``K`` uniform times ``tau_k = k / K``, ``dt = 1 / K``::

    mean_k = x_k + v_theta(x_k, tau_k, cond) dt

Chain (``run_chain``): from ``x`` (zeros when deterministic, else the planner's draw), the first
``N - K`` steps are noiseless (DDIM with ``eta = 0``; Euler), and each of the last
``K = finetune_steps`` steps is a Gaussian ``x_next ~ N(mean, std^2 I)`` given by the planner
(DDIM: ``mean = mu`` with ``eta = ddim_eta``, ``std = max(sigma_t, min_std)``; flow: the Euler mean
and ReinFlow's learned std). A deterministic chain takes each step's noiseless update instead
(DDIM ``eta = 0``; the Euler mean). The decision's log-probability is the exact sum over the K
steps and over every (horizon, action) dimension of::

    log N(x_next; mean, std^2) = -(x_next - mean)^2 / (2 std^2) - log std - log(2 pi) / 2

(in deterministic mode, that of the noiseless chain under the stochastic kernel: diagnostics
only). The record is ``chain`` ``[B, K+1, horizon, A]`` (``x`` before the first stochastic step,
then after each), the times ``[B, K]`` of the stochastic steps and their ``log_probs`` ``[B, K]``;
``recorded_steps`` turns it back into ``(x, t, x_next)`` triples for one batched recomputation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from embodied.core.sampling import Generators, randn

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


# --- DDIM -----------------------------------------------------------------------------------------
def ddim_alphas(
    alphas_cumprod: torch.Tensor, t: torch.Tensor, step_ratio: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``abar_t`` and ``abar_prev`` ``[B, 1, 1]`` for per-sample timesteps ``t [B]``."""
    abar = alphas_cumprod[t].view(-1, 1, 1)
    t_prev = t - step_ratio
    abar_prev = torch.where(
        t_prev >= 0, alphas_cumprod[t_prev.clamp(min=0)], torch.ones_like(abar.view(-1))
    ).view(-1, 1, 1)
    return abar, abar_prev


def ddim_x0(
    output: torch.Tensor, x: torch.Tensor, abar: torch.Tensor, prediction_type: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped ``x0_hat`` and re-derived ``eps_hat`` of the network's ``output`` at ``x_t``."""
    if prediction_type == "epsilon":
        x0_hat = (x - (1 - abar).sqrt() * output) / abar.sqrt()
    else:
        x0_hat = output
    x0_hat = x0_hat.clamp(-1.0, 1.0)
    eps_hat = (x - abar.sqrt() * x0_hat) / (1 - abar).sqrt()
    return x0_hat, eps_hat


def ddim_mean(
    x0_hat: torch.Tensor,
    eps_hat: torch.Tensor,
    abar: torch.Tensor,
    abar_prev: torch.Tensor,
    eta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DDIM mean ``mu`` ``[B, T, A]`` and ``sigma_t`` ``[B, 1, 1]`` (DDIM eqs. 12 and 16)."""
    sigma = eta * ((1 - abar_prev) / (1 - abar) * (1 - abar / abar_prev)).sqrt()
    direction = (1 - abar_prev - sigma**2).clamp(min=0.0).sqrt()
    return abar_prev.sqrt() * x0_hat + direction * eps_hat, sigma


# --- Euler and the Gaussian step ------------------------------------------------------------------
def euler_step(x: torch.Tensor, v: torch.Tensor, dt: float) -> torch.Tensor:
    """``x + v dt``."""
    return x + v * dt


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``sum over (T, A) of log N(x; mean, std^2)``: ``[N, T, A] -> [N]``. Entries whose std is 0
    are deterministic (``x`` is the mean there: a chunk's padding) and add nothing."""
    noisy = std > 0
    safe = torch.where(noisy, std, torch.ones_like(std))  # finite everywhere, gradients too
    z = (x - mean) / safe
    terms = -0.5 * z**2 - safe.log() - LOG_SQRT_2PI
    return torch.where(noisy, terms, torch.zeros_like(terms)).sum(dim=(1, 2))


class Step(NamedTuple):
    """One stochastic chain step from ``x``: ``x_next ~ N(mean, std^2)``, and the ``noiseless``
    ``x_next`` a deterministic chain takes instead."""

    mean: torch.Tensor
    std: torch.Tensor
    noiseless: torch.Tensor


def explore_rows(step: Step, rows: slice) -> Step:
    """``step`` with its noise on the chunk rows ``rows`` only (the rows a decision executes):
    elsewhere std 0 and the noiseless update, so a log-density scores those rows alone."""
    mask = torch.zeros(step.mean.shape[1], dtype=torch.bool, device=step.mean.device)
    mask[rows] = True
    mask = mask.view(1, -1, 1)
    return Step(torch.where(mask, step.mean, step.noiseless), step.std * mask, step.noiseless)


class Chain(NamedTuple):
    """A sampled chain: its final ``x`` ``[B, T, A]`` and the record of its stochastic steps."""

    x: torch.Tensor
    chain: torch.Tensor  # [B, K + 1, T, A]
    times: torch.Tensor  # [B, K]
    log_probs: torch.Tensor  # [B, K]


# --- the chain ------------------------------------------------------------------------------------
def run_chain(
    x: torch.Tensor,
    times: torch.Tensor,
    finetune_steps: int,
    noiseless_step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    gaussian_step: Callable[[torch.Tensor, torch.Tensor], Step],
    deterministic: bool,
    generator: Generators,
) -> Chain:
    """Run the chain from ``x`` over ``times`` ``[N]`` (each step called with ``x`` and the time
    expanded to ``[B]``): noiseless steps, then the last ``finetune_steps`` Gaussian ones (noise
    from ``generator``, or their noiseless update when ``deterministic``), recording those."""
    batch, shape = x.shape[0], x.shape
    first_tuned = len(times) - finetune_steps
    chain, steps, log_probs = [], [], []
    for i, t in enumerate(times):
        t_batch = t.expand(batch)
        if i < first_tuned:
            x = noiseless_step(x, t_batch)
            continue
        if not chain:
            chain.append(x)
        step = gaussian_step(x, t_batch)
        if deterministic:
            x = step.noiseless
        else:
            x = step.mean + step.std * randn(shape, generator, device=x.device)
        chain.append(x)
        steps.append(t_batch)
        log_probs.append(gaussian_log_prob(x, step.mean, step.std))
    return Chain(
        x, torch.stack(chain, dim=1), torch.stack(steps, dim=1), torch.stack(log_probs, dim=1)
    )


def recorded_steps(
    policy_outputs: Mapping[str, Any],
    time_key: str,
    time_dtype: torch.dtype,
    batch: int,
    shape: Sequence[int],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """A recorded chain (``chain`` and the times under ``time_key``) of ``batch`` decisions of
    chunks ``shape`` flattened for one batched recomputation: each step's time ``[B*K]``, the
    states before and after it ``[B*K, *shape]``, and K; keys and shapes checked."""
    for key in ("chain", time_key):
        if key not in policy_outputs:
            raise ValueError(f"policy_outputs has no {key!r}; keys: {sorted(policy_outputs)}")
    chain = torch.as_tensor(policy_outputs["chain"], device=device, dtype=torch.float32)
    times = torch.as_tensor(policy_outputs[time_key], device=device, dtype=time_dtype)
    if times.ndim != 2 or times.shape[0] != batch:
        raise ValueError(
            f"policy_outputs {time_key!r} has shape {tuple(times.shape)}, expected ({batch}, K)"
        )
    k = times.shape[1]
    expected = (batch, k + 1, *shape)
    if tuple(chain.shape) != expected:
        raise ValueError(
            f"policy_outputs 'chain' has shape {tuple(chain.shape)}, expected {expected} "
            f"for {batch} observations"
        )
    x = chain[:, :-1].reshape(batch * k, *shape)
    x_next = chain[:, 1:].reshape(batch * k, *shape)
    return times.reshape(-1), x, x_next, k
