"""Flow-matching action-chunk planner (rectified flow, few Euler steps) with ReinFlow's learned
exploration noise for exact per-step log-probabilities in RL fine-tuning.

``FlowPolicy`` is ``DiffusionPolicy`` with another training target and sampler: the same
conditioning (``global_cond``: image features, normalised state, instruction), the same 1-D U-Net
(``model.unet``, here predicting a velocity), the same normalisers (actions min/max -> [-1, 1]),
EMA (``ema_update`` / ``ema_weights`` / ``adopt_ema``), ``config_from_dataset`` and save/load.
The DDPM/DDIM fields it inherits (``num_train_timesteps``, ``beta_schedule``, ``prediction_type``,
``ddim_eta``) are unused.

Time runs from noise to data: ``tau = 0`` is ``x_0 ~ N(0, I)``, ``tau = 1`` is the normalised
action chunk ``x_1`` (pi0's convention; diffusers' flow schedulers use ``sigma = 1 - tau``). The
U-Net's timestep input is ``tau * timestep_scale`` (default 1000, as diffusers' flow schedulers
feed ``sigma * 1000``) so that the sinusoidal embedding separates nearby ``tau``.

Training (``bc_loss``), flow matching on normalised chunks ``x_1``::

    x_0 ~ N(0, I),  tau ~ p(tau),  x_tau = (1 - tau) x_0 + tau x_1,  v = x_1 - x_0
    loss = mean over non-padded (step, dim) of (v_theta(x_tau, tau, cond) - v)^2

``p(tau)`` (``tau_sampling``): ``"uniform"`` U(0, 1) (default); ``"beta"``, pi0's
``tau = 0.999 (1 - u)``, ``u ~ Beta(1.5, 1)`` (more weight on noisy ``tau``); ``"logit_normal"``,
``tau = sigmoid(n)``, ``n ~ N(0, 1)`` (SD3). The draws use the global RNG, ``x_0`` first, then
``tau``. BC trains only the velocity field; the noise network gets no gradient from it.

Sampling (``act``, the chain of ``policies/sampler.py``): a plain Euler integrator written out
(not diffusers' ``FlowMatchEulerDiscreteScheduler``, whose grid ends at
``sigma = 1 / num_train_timesteps``) over ``K = num_inference_steps`` uniform steps
``tau_k = k / K``, ``dt = 1 / K``::

    mean_k = x_k + v_theta(x_k, tau_k, cond) dt                         # Euler step

- ``deterministic=True``: ``x_0 = 0`` and ``x_{k+1} = mean_k`` (no noise), so the actions are a
  function of the observation alone.
- ``deterministic=False`` (the RL mode, ReinFlow): ``x_0 ~ N(0, init_noise^2 I)``; the first
  ``K - finetune_steps`` steps are Euler steps, and each of the last ``finetune_steps`` (default:
  all K, ReinFlow's ``learn_explore_noise_from = 0``) is a Gaussian::

      x_{k+1} ~ N(mean_k, diag(sigma_theta(x_k, tau_k, cond))^2)
      sigma_theta = min_std + (max_std - min_std) * sigmoid(noise_net(x_k, emb(tau_k), cond))

  ``noise_net`` is a small MLP (``noise_hidden_dims``, Mish) giving one std per
  (horizon, action) entry, initialised to ``init_std`` everywhere. It is a separate module
  (``policy.noise_net``), outside ``model``, so the EMA leaves it alone and ``ema_weights()``
  acts with the EMA velocity field and the live noise network.

  The decision's log-probability is the exact sum over the stochastic steps and over every
  (horizon, action) dimension of ``log N(x_{k+1}; mean_k, sigma_k^2)``. With ``explore_executed``
  (as ``DiffusionPolicy``) the noise, and so the sum, covers only the ``n_action_steps`` rows the
  env executes; the other rows take the Euler mean (std 0). ``log p(x_0)`` is left
  out: it has no parameters, so it is a constant in every policy-gradient ratio.
  ``policy_outputs`` records ``chain`` ``[B, K+1, horizon, A]`` (normalised ``x`` before the first
  stochastic step, then after each), ``taus`` ``[B, K]`` (float ``tau_k`` of each stochastic step)
  and ``log_probs`` ``[B, K]`` (here ``K = finetune_steps``). ``log_prob`` recomputes them with
  gradients reaching the velocity U-Net, the encoders and the noise network. In deterministic
  mode the same keys are recorded, the log-probabilities being those of the noiseless chain under
  the stochastic kernel (diagnostics only; sample RL data stochastically).

Executed actions: the final ``x`` clipped to [-1, 1], unnormalised, steps
``n_obs_steps - 1 .. n_obs_steps - 2 + n_action_steps`` of the horizon (as ``DiffusionPolicy``).
Log-probabilities are densities of the unclipped normalised chain; the clip belongs to the
environment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from embodied.core.nn import Mish
from embodied.core.policy import register_policy
from embodied.policies.base import check_choice
from embodied.policies.diffusion.config import DiffusionConfig
from embodied.policies.diffusion.policy import DiffusionNet, DiffusionPolicy
from embodied.policies.diffusion.unet import SinusoidalPosEmb
from embodied.policies.sampler import Step, euler_step, explore_rows

TAU_SAMPLINGS = ("uniform", "beta", "logit_normal")


@dataclass
class FlowConfig(DiffusionConfig):
    """``DiffusionConfig`` plus the flow-matching and ReinFlow settings (saved to ``config.json``).

    ``num_inference_steps`` is the number K of Euler steps; ``finetune_steps`` the last steps that
    are stochastic in RL mode (None = all); ``min_std`` / ``max_std`` bound the learned noise std.
    """

    num_inference_steps: int = 4
    min_std: float = 0.05
    max_std: float = 0.25
    init_std: float = 0.1  # the noise network's std everywhere before RL
    noise_hidden_dims: list[int] = field(default_factory=lambda: [64, 64])
    tau_sampling: str = "uniform"  # "uniform" | "beta" (pi0) | "logit_normal" (SD3)
    timestep_scale: float = 1000.0  # the U-Net sees tau * timestep_scale

    def __post_init__(self) -> None:
        """Refuse settings that cannot build a policy, naming the field."""
        super().__post_init__()
        self.noise_hidden_dims = list(self.noise_hidden_dims)
        if not self.min_std < self.max_std:
            raise ValueError(
                f"FlowConfig.max_std={self.max_std} must exceed min_std={self.min_std}"
            )
        if not self.min_std < self.init_std < self.max_std:
            raise ValueError(
                f"FlowConfig.init_std={self.init_std} must lie strictly between min_std="
                f"{self.min_std} and max_std={self.max_std}"
            )
        if any(not isinstance(d, int) or d < 1 for d in self.noise_hidden_dims):
            raise ValueError(
                f"FlowConfig.noise_hidden_dims must be ints >= 1, got {self.noise_hidden_dims}"
            )
        check_choice(self, "tau_sampling", TAU_SAMPLINGS)
        if not self.timestep_scale > 0:
            raise ValueError(f"FlowConfig.timestep_scale must be > 0, got {self.timestep_scale}")


class NoiseNet(nn.Module):
    """ReinFlow's exploration-noise head: ``(x_k, tau_k, cond) -> std [B, T, A]`` in
    ``(min_std, max_std)`` (formula in the module docstring)."""

    def __init__(self, config: FlowConfig, global_cond_dim: int) -> None:
        super().__init__()
        self.min_std, self.max_std = config.min_std, config.max_std
        self.shape = (config.horizon, config.action_dim)
        self.step_encoder = SinusoidalPosEmb(config.embed_dim)
        dims = [config.horizon * config.action_dim + config.embed_dim + global_cond_dim]
        dims += config.noise_hidden_dims
        layers: list[nn.Module] = []
        for d_in, d_out in zip(dims[:-1], dims[1:], strict=True):
            layers += [nn.Linear(d_in, d_out), Mish()]
        self.hidden = nn.Sequential(*layers)
        self.out = nn.Linear(dims[-1], config.horizon * config.action_dim)
        with torch.no_grad():  # start at init_std everywhere, still input-dependent (small weights)
            self.out.weight.mul_(0.01)
            p = (config.init_std - config.min_std) / (config.max_std - config.min_std)
            self.out.bias.fill_(math.log(p / (1 - p)))

    def forward(self, x: torch.Tensor, timestep: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """``x [B, T, A]``, scaled ``timestep [B]``, ``cond [B, G]`` -> std ``[B, T, A]``."""
        features = torch.cat([x.flatten(1), self.step_encoder(timestep), cond], dim=-1)
        raw = self.out(self.hidden(features)).view(-1, *self.shape)
        return self.min_std + (self.max_std - self.min_std) * torch.sigmoid(raw)


@register_policy("flow")
class FlowPolicy(DiffusionPolicy):
    """Flow-matching planner (rectified flow, Euler sampling) with ReinFlow log-probabilities."""

    config_class = FlowConfig
    config: FlowConfig
    time_key: ClassVar[str] = "taus"

    def __init__(self, config: FlowConfig) -> None:
        super().__init__(config)
        self.noise_net = NoiseNet(config, self.model.global_cond_dim)

    def build_sampler(self) -> None:
        """Euler grid ``tau_k = k / K`` as ``sampling_times`` (replaces the DDPM/DDIM schedules,
        which do not apply)."""
        k = self.config.num_inference_steps
        times = torch.arange(k, dtype=torch.float32) / k
        self.register_buffer("sampling_times", times, persistent=False)

    # --- the flow ------------------------------------------------------------------------------
    @property
    def dt(self) -> float:
        """The Euler step ``1 / num_inference_steps``."""
        return 1.0 / self.config.num_inference_steps

    def velocity(
        self, net: DiffusionNet, x: torch.Tensor, tau: torch.Tensor, cond: torch.Tensor
    ) -> torch.Tensor:
        """``v_theta(x, tau, cond)`` ``[B, T, A]`` for per-sample ``tau`` ``[B]``."""
        return net.unet(x, tau * self.config.timestep_scale, cond)

    def noise_std(self, x: torch.Tensor, tau: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """ReinFlow's ``sigma_theta(x, tau, cond)`` ``[B, T, A]``."""
        return self.noise_net(x, tau * self.config.timestep_scale, cond)

    def sample_tau(self, batch: int) -> torch.Tensor:
        """Training times ``[batch]`` from ``tau_sampling`` (global RNG)."""
        kind, device = self.config.tau_sampling, self.device
        if kind == "uniform":
            return torch.rand(batch, device=device)
        if kind == "beta":
            beta = torch.distributions.Beta(
                torch.tensor(1.5, device=device), torch.tensor(1.0, device=device)
            )
            return 0.999 * (1.0 - beta.sample((batch,)))
        return torch.sigmoid(torch.randn(batch, device=device))

    # --- training -----------------------------------------------------------------------------
    def bc_loss(self, batch: Mapping[str, Any], auxiliary: bool = True) -> torch.Tensor:
        """Flow-matching loss: MSE between predicted and true velocity, masked by
        ``action_is_pad`` (formula in the module docstring)."""
        net, cond, x1, keep, aux = self.bc_inputs(batch, auxiliary)
        x0 = torch.randn_like(x1)
        tau = self.sample_tau(x1.shape[0])
        t = tau.view(-1, 1, 1)
        x_tau = (1 - t) * x0 + t * x1
        flow = self.masked_mse(self.velocity(net, x_tau, tau, cond), x1 - x0, keep)
        self.bc_terms["flow"] = flow.detach()
        return flow + aux

    # --- the chain steps ---------------------------------------------------------------------
    def noiseless_step(
        self, net: DiffusionNet, x: torch.Tensor, tau: torch.Tensor, cond: torch.Tensor
    ) -> torch.Tensor:
        """A step that is not fine-tuned: the Euler step ``x + v_theta dt``."""
        return euler_step(x, self.velocity(net, x, tau, cond), self.dt)

    def gaussian_step(
        self, net: DiffusionNet, x: torch.Tensor, tau: torch.Tensor, cond: torch.Tensor
    ) -> Step:
        """A fine-tuned step: ``N(x + v_theta dt, sigma_theta^2)`` (its noiseless update is the
        Euler mean); with ``explore_executed`` std 0 on the rows the env does not execute."""
        mean = euler_step(x, self.velocity(net, x, tau, cond), self.dt)
        step = Step(mean, self.noise_std(x, tau, cond), mean)
        return explore_rows(step, self.executed_slice) if self.config.explore_executed else step


__all__ = ["FlowConfig", "FlowPolicy", "NoiseNet"]
