"""Diffusion Policy: an action-chunk planner that denoises ``horizon`` actions with a 1-D U-Net,
with DPPO's exact per-denoising-step log-probabilities for RL fine-tuning.

Conditioning (one vector per decision, "global conditioning" as in Diffusion Policy)::

    cond = concat(image features of every camera and observation step,   # [n_obs * n_cam * E]
                  normalised state of every observation step,           # [n_obs * D]
                  environment state, when configured,                  # [n_obs * D_env]
                  instruction embedding)                                # [E]
    # env_state_encoder="flat": the normalised values; "objects": ObjectStateEncoder's
    # instruction-queried attention over per-object tokens (needs the values' names), [K * E]
    cond = cond_mlp(cond)     # optional (``cond_mlp_dims``); identity by default

Training (``bc_loss``), DDPM on normalised actions ``x_0`` (min/max -> [-1, 1])::

    t ~ U{0..T-1},  eps ~ N(0, I),  x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps
    loss = mean over non-padded (step, dim) of (eps_theta(x_t, t, cond) - eps)^2

(with ``prediction_type="sample"`` the target is ``x_0``). ``ema_update`` keeps an exponential
moving average of the network (``ema_model``, saved with the weights); ``use_ema`` /
``ema_weights()`` make ``act`` and ``log_prob`` use it (keep it off for RL: the EMA copy has no
gradients).

Sampling (``act``), DDIM over ``num_inference_steps`` timesteps ``t`` with ``t_prev = t - T // N``
(diffusers' "leading" spacing; ``abar_prev = 1`` below 0). One denoising step from ``x_t``::

    x0_hat  = clip((x_t - sqrt(1 - abar_t) eps_theta) / sqrt(abar_t), -1, 1)
    eps_hat = (x_t - sqrt(abar_t) x0_hat) / sqrt(1 - abar_t)      # re-derived from the clipped x0
    sigma_t = eta * sqrt((1 - abar_prev) / (1 - abar_t) * (1 - abar_t / abar_prev))   # DDIM (16)
    mu      = sqrt(abar_prev) x0_hat + sqrt(1 - abar_prev - sigma_t^2) eps_hat       # DDIM (12)

This is diffusers' ``DDIMScheduler.step(..., eta, use_clipped_model_output=True)`` without its
noise, written out so it runs with per-sample timesteps and gradients (a test checks the match).

- ``deterministic=True``: ``x_T = 0`` and every step is the ``eta = 0`` update ``x_prev = mu``,
  so the actions are a function of the observation alone (DDIM's deterministic sampler).
- ``deterministic=False`` (the RL mode, DPPO): ``x_T ~ N(0, I)``; the first
  ``N - finetune_steps`` steps are ``eta = 0`` mean updates, and each of the last
  ``K = finetune_steps`` steps is a Gaussian with ``eta = ddim_eta`` (default 1, DPPO's DDIM
  fine-tuning)::

      x_prev ~ N(mu, std_t^2 I),   std_t = max(sigma_t, min_std)

  ``min_std`` is DPPO's exploration floor; it also keeps the last step (``sigma = 0``) a proper
  Gaussian. The decision's log-probability is the exact sum over the K steps and over every
  (horizon, action) dimension of ``log N(x_prev; mu, std_t^2)``. ``policy_outputs`` records
  ``chain`` ``[B, K+1, horizon, A]`` (normalised ``x`` before the first fine-tuned step, then after
  each), ``timesteps`` ``[B, K]`` (the ``t`` of each fine-tuned step) and ``log_probs`` ``[B, K]``.
  In deterministic mode the same keys are recorded, the log-probabilities being those of the
  ``eta = 0`` chain under the stochastic kernel (diagnostics only; sample RL data stochastically).

Executed actions: the last chain element clipped to [-1, 1] (the data's min/max range),
unnormalised, steps ``n_obs_steps - 1 .. n_obs_steps - 2 + n_action_steps`` of the horizon (the
first action at the newest observation, as Diffusion Policy does). Log-probabilities are densities
of the unclipped normalised chain; the clip belongs to the environment.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.core.features import ENV_STATE_KEY, STATE_KEY, ActionSpec, ObservationSpec
from embodied.core.nn import (
    UNKNOWN_WORD,
    ImageEncoder,
    InstructionEncoder,
    ObjectStateEncoder,
    build_vocab,
)
from embodied.core.policy import ActionOutput, register_policy
from embodied.core.sampling import randn
from embodied.policies.augment import PlanarAugment
from embodied.policies.base import (
    NormalizedPolicy,
    check_env_state_encoder,
    config_observation_spec,
    dataset_state_values,
    env_state_values,
)

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class DiffusionConfig:
    """Sizes, schedules and RL settings of ``DiffusionPolicy`` (saved to ``config.json``)."""

    state_dim: int
    action_dim: int
    state_names: list[str] = field(default_factory=list)  # the state values' names, when known
    image_keys: list[str] = field(
        default_factory=list
    )  # e.g. ["observation.image"]; [] = state only
    image_size: int = 96
    env_state_dim: int = 0  # > 0: also condition on the privileged ``environment_state``
    env_state_names: list[str] = field(default_factory=list)  # "object.quantity" per value
    env_state_encoder: str = "flat"  # "flat" values, or "objects": attention over object tokens
    object_queries: int = 4  # "objects": instruction-dependent queries (output K * embed_dim)
    object_heads: int = 4
    object_relative: bool = False  # "objects": add each object's offset from the hand (xyz)
    n_obs_steps: int = 2
    horizon: int = 16
    n_action_steps: int = 8
    vocab: list[str] = field(default_factory=lambda: [UNKNOWN_WORD])  # index 0 = unknown word
    embed_dim: int = 64  # timestep, per-camera image feature and instruction embedding size
    down_dims: list[int] = field(default_factory=lambda: [64, 128, 256])
    kernel_size: int = 5
    n_groups: int = 8
    vision_channels: list[int] = field(default_factory=lambda: [32, 64, 128])
    num_keypoints: int = 32
    cond_mlp_dims: list[int] = field(default_factory=list)  # MLP on the conditioning; [] = none
    state_noise: float = 0.0  # BC augmentation: N(0, s^2) added to the normalised (env) state
    # BC augmentation (state only): the scene turned by up to augment_yaw degrees about the
    # vertical axis and shifted up to augment_shift metres (``PlanarAugment``)
    augment_yaw: float = 0.0
    augment_shift: float = 0.0
    num_train_timesteps: int = 100
    num_inference_steps: int = 10
    beta_schedule: str = "squaredcos_cap_v2"
    prediction_type: str = "epsilon"
    ddim_eta: float = 1.0  # eta of the stochastic (RL) steps
    min_std: float = 0.1  # DPPO exploration floor on each stochastic step's std
    finetune_steps: int | None = None  # last K denoising steps that are stochastic; None = all
    ema_decay: float = 0.995

    def __post_init__(self) -> None:
        """Refuse settings that cannot build a policy, naming the field."""
        self.image_keys = list(self.image_keys)
        self.vocab = list(self.vocab)
        self.down_dims = list(self.down_dims)
        self.vision_channels = list(self.vision_channels)
        self.cond_mlp_dims = list(self.cond_mlp_dims)
        if self.finetune_steps is None:
            self.finetune_steps = self.num_inference_steps
        for name, low in (
            ("state_dim", 1),
            ("action_dim", 1),
            ("env_state_dim", 0),
            ("image_size", 8),
            ("n_obs_steps", 1),
            ("n_action_steps", 1),
            ("embed_dim", 4),
            ("num_keypoints", 1),
            ("num_train_timesteps", 1),
            ("num_inference_steps", 1),
            ("finetune_steps", 1),
            ("object_queries", 1),
            ("object_heads", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise ValueError(
                    f"{type(self).__name__}.{name} must be an int >= {low}, got {value!r}"
                )
        if self.n_obs_steps - 1 + self.n_action_steps > self.horizon:
            raise ValueError(
                f"{type(self).__name__} needs n_obs_steps - 1 + n_action_steps <= horizon, got "
                f"{self.n_obs_steps} - 1 + {self.n_action_steps} > {self.horizon}"
            )
        if self.embed_dim % 2:
            raise ValueError(f"{type(self).__name__}.embed_dim must be even, got {self.embed_dim}")
        check_env_state_encoder(self)
        if self.env_state_encoder == "objects" and self.embed_dim % self.object_heads:
            raise ValueError(
                f"{type(self).__name__}.object_heads ({self.object_heads}) must divide "
                f"embed_dim ({self.embed_dim})"
            )
        if not self.down_dims or any(d % self.n_groups for d in self.down_dims):
            raise ValueError(
                f"{type(self).__name__}.down_dims must be non-empty multiples of n_groups="
                f"{self.n_groups}, got {self.down_dims}"
            )
        if self.horizon % 2 ** (len(self.down_dims) - 1):
            raise ValueError(
                f"{type(self).__name__}.horizon={self.horizon} must be divisible by "
                f"2 ** (len(down_dims) - 1) = {2 ** (len(self.down_dims) - 1)}"
            )
        if self.num_inference_steps > self.num_train_timesteps:
            raise ValueError(
                f"{type(self).__name__}.num_inference_steps={self.num_inference_steps} exceeds "
                f"num_train_timesteps={self.num_train_timesteps}"
            )
        if self.finetune_steps > self.num_inference_steps:
            raise ValueError(
                f"{type(self).__name__}.finetune_steps={self.finetune_steps} exceeds "
                f"num_inference_steps={self.num_inference_steps}"
            )
        if self.prediction_type not in ("epsilon", "sample"):
            raise ValueError(
                f"{type(self).__name__}.prediction_type must be 'epsilon' or 'sample', "
                f"got {self.prediction_type!r}"
            )
        for key in self.image_keys:
            if not key.startswith("observation.image"):
                raise ValueError(
                    f"{type(self).__name__}.image_keys: {key!r} is not 'observation.image' or "
                    "'observation.images.<camera>'"
                )
        for name in ("state_noise", "augment_yaw", "augment_shift"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"{type(self).__name__}.{name} must be >= 0, got {getattr(self, name)}"
                )
        if (self.augment_yaw or self.augment_shift) and (
            self.image_keys
            or self.state_dim < 2
            or self.action_dim < 2
            or len(self.env_state_names) != self.env_state_dim
        ):
            raise ValueError(
                f"{type(self).__name__}.augment_yaw / augment_shift turn and shift states whose "
                "values start with the hand's x, y, environment states with named values "
                "(object.x, object.y) and actions starting with dx, dy; they cannot turn images "
                f"(image_keys={self.image_keys}, state_dim={self.state_dim}, action_dim="
                f"{self.action_dim}, env_state_dim={self.env_state_dim} with "
                f"{len(self.env_state_names)} names)"
            )
        if not 0.0 < self.ema_decay < 1.0 or self.min_std <= 0 or self.ddim_eta < 0:
            raise ValueError(
                f"{type(self).__name__} needs 0 < ema_decay < 1, min_std > 0, ddim_eta >= 0; got "
                f"{self.ema_decay}, {self.min_std}, {self.ddim_eta}"
            )


# --- the conditional 1-D U-Net (Diffusion Policy, Chi et al. 2023) ------------------------------
class SinusoidalPosEmb(nn.Module):
    """Timestep embedding ``[sin(t w_i), cos(t w_i)]``, ``w_i = 10000^(-i / (half - 1))``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """``[B]`` timesteps -> ``[B, dim]``."""
        half = self.dim // 2
        freqs = torch.exp(
            torch.arange(half, device=t.device) * (-math.log(10000.0) / max(half - 1, 1))
        )
        angles = t.float()[:, None] * freqs[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


class Conv1dBlock(nn.Module):
    """``Conv1d -> GroupNorm -> Mish`` (same length)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, n_groups: int):
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2),
            nn.GroupNorm(n_groups, out_channels),
            nn.Mish(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C_in, T] -> [B, C_out, T]``."""
        return self.block(x)


class ConditionalResidualBlock1D(nn.Module):
    """Two conv blocks with FiLM in between: ``h = scale(c) * block1(x) + bias(c)``,
    ``out = block2(h) + skip(x)``, where ``c`` is the timestep embedding ++ global conditioning."""

    def __init__(
        self, in_channels: int, out_channels: int, cond_dim: int, kernel_size: int, n_groups: int
    ) -> None:
        super().__init__()
        self.block1 = Conv1dBlock(in_channels, out_channels, kernel_size, n_groups)
        self.block2 = Conv1dBlock(out_channels, out_channels, kernel_size, n_groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, 2 * out_channels))
        self.skip = (
            nn.Conv1d(in_channels, out_channels, 1)
            if in_channels != out_channels
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """``x [B, C_in, T]``, ``cond [B, cond_dim]`` -> ``[B, C_out, T]``."""
        scale, bias = self.film(cond).unsqueeze(-1).chunk(2, dim=1)  # each [B, C_out, 1]
        h = scale * self.block1(x) + bias
        return self.block2(h) + self.skip(x)


class ConditionalUnet1D(nn.Module):
    """Diffusion Policy's noise predictor over an action sequence ``[B, T, A]``.

    Down path: per level two conditional residual blocks, then a stride-2 conv (except the last
    level); two middle blocks; up path: concatenate the skip, two blocks, transposed-conv
    upsample; a final conv block and 1x1 conv back to ``A`` channels.
    """

    def __init__(
        self,
        action_dim: int,
        global_cond_dim: int,
        embed_dim: int = 64,
        down_dims: Sequence[int] = (64, 128, 256),
        kernel_size: int = 5,
        n_groups: int = 8,
    ) -> None:
        super().__init__()
        self.step_encoder = nn.Sequential(
            SinusoidalPosEmb(embed_dim),
            nn.Linear(embed_dim, 4 * embed_dim),
            nn.Mish(),
            nn.Linear(4 * embed_dim, embed_dim),
        )
        cond_dim = embed_dim + global_cond_dim
        dims = [action_dim, *down_dims]
        levels = list(zip(dims[:-1], dims[1:], strict=True))

        def block(c_in: int, c_out: int) -> ConditionalResidualBlock1D:
            return ConditionalResidualBlock1D(c_in, c_out, cond_dim, kernel_size, n_groups)

        self.down = nn.ModuleList()
        for i, (c_in, c_out) in enumerate(levels):
            last = i == len(levels) - 1
            resample = nn.Identity() if last else nn.Conv1d(c_out, c_out, 3, 2, 1)
            self.down.append(nn.ModuleList([block(c_in, c_out), block(c_out, c_out), resample]))
        self.mid = nn.ModuleList([block(dims[-1], dims[-1]), block(dims[-1], dims[-1])])
        self.up = nn.ModuleList()
        for c_in, c_out in reversed(levels[1:]):
            self.up.append(
                nn.ModuleList(
                    [
                        block(2 * c_out, c_in),
                        block(c_in, c_in),
                        nn.ConvTranspose1d(c_in, c_in, 4, 2, 1),
                    ]
                )
            )
        self.final = nn.Sequential(
            Conv1dBlock(down_dims[0], down_dims[0], kernel_size, n_groups),
            nn.Conv1d(down_dims[0], action_dim, 1),
        )

    def forward(
        self, sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor
    ) -> torch.Tensor:
        """``sample [B, T, A]``, ``timestep [B]``, ``global_cond [B, G]`` -> ``[B, T, A]``."""
        x = sample.transpose(1, 2)  # [B, A, T]: convolve over time
        cond = torch.cat([self.step_encoder(timestep), global_cond], dim=-1)
        skips = []
        for res1, res2, downsample in self.down:
            x = res2(res1(x, cond), cond)
            skips.append(x)
            x = downsample(x)
        for res in self.mid:
            x = res(x, cond)
        for res1, res2, upsample in self.up:
            x = torch.cat([x, skips.pop()], dim=1)
            x = upsample(res2(res1(x, cond), cond))
        return self.final(x).transpose(1, 2)


class DiffusionNet(nn.Module):
    """Everything with learned weights that the EMA averages: encoders and the U-Net."""

    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__()
        self.image_encoders = nn.ModuleList(
            ImageEncoder(config.vision_channels, config.num_keypoints, config.embed_dim)
            for _ in config.image_keys
        )
        self.instruction_encoder = InstructionEncoder(config.vocab, config.embed_dim)
        per_step = len(config.image_keys) * config.embed_dim + config.state_dim
        self.object_encoder = None
        if config.env_state_encoder == "objects":
            self.object_encoder = ObjectStateEncoder(
                config.env_state_names,
                self.instruction_encoder,
                config.embed_dim,
                config.object_queries,
                config.object_heads,
                config.object_relative,
            )
            per_step += self.object_encoder.output_dim
        else:
            per_step += config.env_state_dim
        width = config.n_obs_steps * per_step + config.embed_dim
        # Optional MLP mixing the instruction with the observations (an instruction that picks
        # one object of several needs a product of the two, which FiLM's affine map lacks).
        layers: list[nn.Module] = []
        for size in config.cond_mlp_dims:
            layers += [nn.Linear(width, size), nn.Mish()]
            width = size
        self.cond_mlp = nn.Sequential(*layers)
        self.global_cond_dim = width  # the size of ``DiffusionPolicy.global_cond``'s output
        self.unet = ConditionalUnet1D(
            config.action_dim,
            width,
            config.embed_dim,
            config.down_dims,
            config.kernel_size,
            config.n_groups,
        )


@register_policy("diffusion")
class DiffusionPolicy(NormalizedPolicy):
    """Diffusion Policy (DDPM training, DDIM sampling) with DPPO log-probabilities."""

    config_class = DiffusionConfig
    config: DiffusionConfig

    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__(config)
        self.build_normalizers(config.state_dim, config.env_state_dim, config.action_dim)
        self.model = DiffusionNet(config)
        self.planar_augment = None
        if config.augment_yaw or config.augment_shift:
            self.planar_augment = PlanarAugment(
                config.env_state_names, config.augment_yaw, config.augment_shift
            )
        self.ema_model = copy.deepcopy(self.model).requires_grad_(False)
        self.register_buffer("ema_steps", torch.zeros((), dtype=torch.long))
        self.use_ema = False  # act / log_prob with the EMA weights (evaluation after BC)
        self.build_sampler()

    def build_sampler(self) -> None:
        """DDPM training noise and the DDIM timesteps/``abar`` buffers (a flow variant overrides
        this with its own integrator)."""
        from diffusers import DDIMScheduler, DDPMScheduler  # slow import: only when built

        config = self.config
        self.noise_scheduler = DDPMScheduler(
            num_train_timesteps=config.num_train_timesteps,
            beta_schedule=config.beta_schedule,
            clip_sample=True,
            prediction_type=config.prediction_type,
        )
        ddim = DDIMScheduler(
            num_train_timesteps=config.num_train_timesteps,
            beta_schedule=config.beta_schedule,
            clip_sample=True,
            set_alpha_to_one=True,
            prediction_type=config.prediction_type,
        )
        ddim.set_timesteps(config.num_inference_steps)
        self.step_ratio = config.num_train_timesteps // config.num_inference_steps
        # Derived from the config, so not saved (persistent=False) but moved by .to(device).
        self.register_buffer("ddim_timesteps", ddim.timesteps.long().clone(), persistent=False)
        self.register_buffer(
            "alphas_cumprod", ddim.alphas_cumprod.float().clone(), persistent=False
        )

    # --- normalisation and EMA --------------------------------------------------------------
    @classmethod
    def config_from_dataset(
        cls,
        features: Mapping[str, Mapping[str, Any]],
        tasks: Sequence[str] = (),
        horizon: int | None = None,
        **overrides: Any,
    ) -> DiffusionConfig:
        """A config shaped by a LeRobot dataset (what ``embodied train bc`` calls): its state and
        action sizes, every camera (square images), and a vocabulary of its instructions."""
        missing = [k for k in (STATE_KEY, "action") if k not in features]
        if missing:
            raise ValueError(f"dataset has no {missing} features; features: {sorted(features)}")
        image_keys = [k for k, f in features.items() if f.get("dtype") == "video"]
        sizes = {features[k]["shape"][0] for k in image_keys} | {
            features[k]["shape"][1] for k in image_keys
        }
        if len(sizes) > 1:
            raise ValueError(f"cameras must share one square size, got sizes {sorted(sizes)}")
        env_values, texts = env_state_values(features, tasks)
        values: dict[str, Any] = {
            **dataset_state_values(features),
            "action_dim": int(features["action"]["shape"][-1]),
            "image_keys": image_keys,
            "vocab": build_vocab(texts),
            **env_values,
        }
        if sizes:
            values["image_size"] = int(sizes.pop())
        if horizon is not None:
            values["horizon"] = horizon
        return cls.config_class(**{**values, **overrides})

    def fit_normalizers(self, stats: Mapping[str, Mapping[str, Any]]) -> DiffusionPolicy:
        """State and environment state by mean/std, actions by min/max (dataset statistics;
        with planar augmentation, the statistics of the turned and shifted states)."""
        if self.planar_augment is not None and STATE_KEY in stats:
            center = np.asarray(stats[STATE_KEY]["mean"], dtype=np.float64).reshape(-1)[:2]
            state, env_state = self.planar_augment.turned_stats(
                stats[STATE_KEY], stats.get(ENV_STATE_KEY), center
            )
            stats = {**stats, STATE_KEY: state}
            if env_state is not None:
                stats[ENV_STATE_KEY] = env_state
        return self.fit_state_normalizers(stats)

    @property
    def observation_spec(self) -> ObservationSpec:
        """Cameras, ``observation.state`` and (when configured) the environment state."""
        return config_observation_spec(self.config)

    @property
    def bc_horizon(self) -> int:
        """The predicted chunk: ``horizon`` actions."""
        return self.config.horizon

    @property
    def action_spec(self) -> ActionSpec:
        """``n_action_steps`` actions per decision."""
        return ActionSpec(self.config.action_dim, self.config.n_action_steps)

    @torch.no_grad()
    def ema_update(self) -> None:
        """``ema = d * ema + (1 - d) * model`` with ``d = min(ema_decay, (1 + n) / (10 + n))``
        (warm-up as in diffusers' EMAModel), ``n`` = updates so far; call after each step."""
        n = int(self.ema_steps)
        decay = min(self.config.ema_decay, (1 + n) / (10 + n))
        for ema, live in zip(self.ema_model.parameters(), self.model.parameters(), strict=True):
            ema.lerp_(live, 1.0 - decay)
        for ema, live in zip(self.ema_model.buffers(), self.model.buffers(), strict=True):
            ema.copy_(live)
        self.ema_steps += 1

    @contextlib.contextmanager
    def ema_weights(self) -> Iterator[DiffusionPolicy]:
        """``with policy.ema_weights(): policy.act(...)`` acts with the EMA network."""
        previous, self.use_ema = self.use_ema, True
        try:
            yield self
        finally:
            self.use_ema = previous

    @torch.no_grad()
    def adopt_ema(self) -> DiffusionPolicy:
        """Copy the EMA weights into the live network: what BC saves and RL starts from."""
        self.model.load_state_dict(self.ema_model.state_dict())
        return self

    def _net(self) -> DiffusionNet:
        """The network acting now: the EMA copy when ``use_ema`` is set."""
        return self.ema_model if self.use_ema else self.model

    # --- observations -> global conditioning ----------------------------------------------
    def _feature(self, obs: Mapping[str, Any], key: str, trailing: tuple[int, ...]) -> torch.Tensor:
        """One observation feature ``[B, n_obs, *trailing]`` on our device, shape-checked."""
        if key not in obs:
            raise ValueError(f"observation has no {key!r}; keys: {sorted(obs)}")
        x = torch.as_tensor(obs[key], device=self.device)
        expected = (self.config.n_obs_steps, *trailing)
        if x.ndim != len(expected) + 1 or tuple(x.shape[1:]) != expected:
            raise ValueError(
                f"observation {key!r} has shape {tuple(x.shape)}, the policy expects "
                f"(B, {', '.join(map(str, expected))})"
            )
        return x

    def global_cond(
        self,
        net: DiffusionNet,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        state_noise: float = 0.0,
    ) -> torch.Tensor:
        """``[B, G]``: per-step image features, normalised state (and environment state: its
        values, or the object encoder's output), flattened, ++ instruction."""
        config = self.config
        state = self._feature(obs, STATE_KEY, (config.state_dim,)).float()
        batch = state.shape[0]
        if not torch.isfinite(state).all():
            raise ValueError(f"observation {STATE_KEY!r} holds NaN or infinite values")
        if isinstance(instructions, str) or len(instructions) != batch:
            raise ValueError(
                f"need {batch} instructions (one per observation), got {instructions!r}"
            )
        per_step = []
        for key, encoder in zip(config.image_keys, net.image_encoders, strict=True):
            size = (config.image_size, config.image_size, 3)
            images = self._feature(obs, key, size)
            if images.shape[0] != batch or images.dtype != torch.uint8:
                raise ValueError(
                    f"observation {key!r} must be uint8 with batch {batch}, got "
                    f"{images.dtype} {tuple(images.shape)}"
                )
            features = encoder(images.reshape(-1, *size))  # [B * n_obs, E]
            per_step.append(features.reshape(batch, config.n_obs_steps, -1))
        instruction = net.instruction_encoder(list(instructions))
        states = [self.state_normalizer.normalize(state)]
        if self.env_state_normalizer is not None:
            env_state = self._feature(obs, ENV_STATE_KEY, (config.env_state_dim,)).float()
            if env_state.shape[0] != batch or not torch.isfinite(env_state).all():
                raise ValueError(
                    f"observation {ENV_STATE_KEY!r} must be finite with batch {batch}, got "
                    f"shape {tuple(env_state.shape)}"
                )
            states.append(self.env_state_normalizer.normalize(env_state))
        if state_noise > 0:  # BC augmentation against memorising exact states
            states = [x + state_noise * torch.randn_like(x) for x in states]
        if net.object_encoder is not None:  # per step: [B * n_obs, D_env] -> [B, n_obs, K * E]
            steps_env = states[1].flatten(0, 1)
            queries = instruction.repeat_interleave(config.n_obs_steps, dim=0)
            hand = state[..., :3].flatten(0, 1).float()  # agent_pos starts with the grip site
            objects = net.object_encoder(
                steps_env, queries, net.instruction_encoder, env_state.flatten(0, 1), hand
            )
            states[1] = objects.view(batch, config.n_obs_steps, -1)
        per_step += states
        steps = torch.cat(per_step, dim=-1).flatten(1)  # [B, n_obs * (n_cam * E + D)]
        return net.cond_mlp(torch.cat([steps, instruction], dim=-1))

    # --- training ---------------------------------------------------------------------------
    def bc_inputs(
        self, batch: Mapping[str, Any]
    ) -> tuple[DiffusionNet, torch.Tensor, torch.Tensor, torch.Tensor]:
        """What every planner's BC loss starts from: the live network, its conditioning
        ``[B, G]``, the normalised action chunk ``[B, horizon, A]`` and a keep-mask of the same
        shape (0 where ``action_is_pad``)."""
        config = self.config
        net = self.model
        actions = torch.as_tensor(batch["action"], device=self.device, dtype=torch.float32)
        state = self._feature(batch, STATE_KEY, (config.state_dim,)).float()
        expected = (state.shape[0], config.horizon, config.action_dim)
        if tuple(actions.shape) != expected:
            raise ValueError(
                f"batch 'action' has shape {tuple(actions.shape)}, expected {expected}"
            )
        if self.planar_augment is not None:
            batch, actions = self.augmented(batch, state, actions)
        cond = self.global_cond(net, batch, batch["instruction"], config.state_noise)
        x0 = self.action_normalizer.normalize(actions)
        if self.planar_augment is not None:  # a turned action may leave the data's range
            x0 = x0.clamp(-1.0, 1.0)
        if "action_is_pad" in batch:
            pad = torch.as_tensor(batch["action_is_pad"], device=self.device, dtype=torch.bool)
            keep = (~pad).to(x0.dtype).unsqueeze(-1).expand_as(x0)
        else:
            keep = torch.ones_like(x0)
        return net, cond, x0, keep

    def augmented(
        self, batch: Mapping[str, Any], state: torch.Tensor, actions: torch.Tensor
    ) -> tuple[dict[str, Any], torch.Tensor]:
        """The batch (its checked ``state``) and actions with every window's scene turned and
        shifted on the table."""
        config = self.config
        env_state = None
        if config.env_state_dim:
            env_state = self._feature(batch, ENV_STATE_KEY, (config.env_state_dim,)).float()
        center = self.state_normalizer.shift[:2]  # the data's mean hand position
        state, env_state, actions = self.planar_augment(state, env_state, actions, center)
        batch = {**batch, STATE_KEY: state}
        if env_state is not None:
            batch[ENV_STATE_KEY] = env_state
        return batch, actions

    @staticmethod
    def masked_mse(prediction: torch.Tensor, target: torch.Tensor, keep: torch.Tensor):
        """``sum(keep * (prediction - target)^2) / sum(keep)``."""
        return ((prediction - target) ** 2 * keep).sum() / keep.sum().clamp(min=1.0)

    def bc_loss(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """DDPM loss: MSE between predicted and true noise (or x_0), masked by ``action_is_pad``."""
        net, cond, x0, keep = self.bc_inputs(batch)
        noise = torch.randn_like(x0)
        t = torch.randint(0, self.config.num_train_timesteps, (x0.shape[0],), device=x0.device)
        x_t = self.noise_scheduler.add_noise(x0, noise, t)
        prediction = net.unet(x_t, t, cond)
        target = noise if self.config.prediction_type == "epsilon" else x0
        return self.masked_mse(prediction, target, keep)

    def executed_actions(self, x: torch.Tensor) -> torch.Tensor:
        """Raw actions ``[B, n_action_steps, A]`` of a final normalised chunk ``[B, horizon, A]``:
        steps from the newest observation on, clipped to the data's [-1, 1] range."""
        start = self.config.n_obs_steps - 1
        executed = x[:, start : start + self.config.n_action_steps].clamp(-1.0, 1.0)
        if not torch.isfinite(executed).all():
            raise ValueError(f"the {self.policy_type} policy produced NaN or infinite actions")
        return self.action_normalizer.unnormalize(executed)

    # --- the denoising kernel ---------------------------------------------------------------
    def predict_x0(
        self, net: DiffusionNet, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One U-Net call at ``x_t`` (per-sample ``t`` [B]): clipped ``x0_hat``, re-derived
        ``eps_hat``, ``abar_t`` and ``abar_prev`` (``[B, 1, 1]``)."""
        abar = self.alphas_cumprod[t].view(-1, 1, 1)
        t_prev = t - self.step_ratio
        abar_prev = torch.where(
            t_prev >= 0, self.alphas_cumprod[t_prev.clamp(min=0)], torch.ones_like(abar.view(-1))
        ).view(-1, 1, 1)
        output = net.unet(x, t, cond)
        if self.config.prediction_type == "epsilon":
            x0_hat = (x - (1 - abar).sqrt() * output) / abar.sqrt()
        else:
            x0_hat = output
        x0_hat = x0_hat.clamp(-1.0, 1.0)
        eps_hat = (x - abar.sqrt() * x0_hat) / (1 - abar).sqrt()
        return x0_hat, eps_hat, abar, abar_prev

    @staticmethod
    def ddim_mean(
        x0_hat: torch.Tensor,
        eps_hat: torch.Tensor,
        abar: torch.Tensor,
        abar_prev: torch.Tensor,
        eta: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DDIM mean ``[B, T, A]`` and ``sigma_t`` ``[B, 1, 1]`` (DDIM eqs. 12 and 16)."""
        sigma = eta * ((1 - abar_prev) / (1 - abar) * (1 - abar / abar_prev)).sqrt()
        direction = (1 - abar_prev - sigma**2).clamp(min=0.0).sqrt()
        return abar_prev.sqrt() * x0_hat + direction * eps_hat, sigma

    def denoise_step(
        self, net: DiffusionNet, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, eta: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DDIM step from ``x_t``: mean and ``sigma_t`` (formulas in the module docstring)."""
        return self.ddim_mean(*self.predict_x0(net, x, t, cond), eta=eta)

    @staticmethod
    def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """``sum over (T, A) of log N(x; mean, std^2)``: ``[N, T, A] -> [N]``."""
        z = (x - mean) / std
        return (-0.5 * z**2 - std.log() - _LOG_SQRT_2PI).sum(dim=(1, 2))

    # --- the Policy interface -----------------------------------------------------------------
    def start_chain(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        deterministic: bool,
        generator: torch.Generator | None,
    ) -> tuple[DiffusionNet, torch.Tensor, torch.Tensor]:
        """The acting network, its conditioning ``[B, G]`` and the chain's start
        ``[B, horizon, A]``: zeros when deterministic, else ``N(0, I)`` from ``generator``."""
        net = self._net()
        cond = self.global_cond(net, obs, instructions)
        shape = (cond.shape[0], self.config.horizon, self.config.action_dim)
        if deterministic:
            return net, cond, torch.zeros(shape, device=cond.device)
        return net, cond, randn(shape, generator, device=cond.device)

    def recorded_chain(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        policy_outputs: Mapping[str, Any],
        step_key: str,
        step_dtype: torch.dtype,
    ) -> tuple[DiffusionNet, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """A recorded chain's K steps flattened for one batched network call: the network,
        conditioning repeated per step ``[B*K, G]``, each step's time ``[B*K]`` (``step_key``),
        the states before and after it ``[B*K, horizon, A]``, and K; shapes checked."""
        config = self.config
        for key in ("chain", step_key):
            if key not in policy_outputs:
                raise ValueError(f"policy_outputs has no {key!r}; keys: {sorted(policy_outputs)}")
        net = self._net()
        cond = self.global_cond(net, obs, instructions)
        chain = torch.as_tensor(policy_outputs["chain"], device=cond.device, dtype=torch.float32)
        steps = torch.as_tensor(policy_outputs[step_key], device=cond.device, dtype=step_dtype)
        if steps.ndim != 2 or steps.shape[0] != cond.shape[0]:
            raise ValueError(
                f"policy_outputs {step_key!r} has shape {tuple(steps.shape)}, expected "
                f"({cond.shape[0]}, K)"
            )
        batch, k = steps.shape
        expected = (batch, k + 1, config.horizon, config.action_dim)
        if tuple(chain.shape) != expected:
            raise ValueError(
                f"policy_outputs 'chain' has shape {tuple(chain.shape)}, expected {expected} "
                f"for {cond.shape[0]} observations"
            )
        x = chain[:, :-1].reshape(batch * k, config.horizon, config.action_dim)
        x_next = chain[:, 1:].reshape(batch * k, config.horizon, config.action_dim)
        return net, cond.repeat_interleave(k, dim=0), steps.reshape(-1), x, x_next, k

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActionOutput:
        """Sample a chunk: ``actions [B, n_action_steps, A]`` (raw), ``log_prob [B]``, and the
        denoising ``chain`` / ``timesteps`` / per-step ``log_probs`` in ``policy_outputs``."""
        config = self.config
        net, cond, x = self.start_chain(obs, instructions, deterministic, generator)
        batch, shape = x.shape[0], x.shape
        first_tuned = config.num_inference_steps - config.finetune_steps
        chain, timesteps, log_probs = [], [], []
        for i, t in enumerate(self.ddim_timesteps):
            t_batch = t.expand(batch)
            if i < first_tuned:  # not fine-tuned: eta = 0 mean update
                x, _ = self.denoise_step(net, x, t_batch, cond, eta=0.0)
                continue
            if not chain:
                chain.append(x)
            prediction = self.predict_x0(net, x, t_batch, cond)
            mean, sigma = self.ddim_mean(*prediction, eta=config.ddim_eta)
            std = sigma.clamp(min=config.min_std)
            if deterministic:
                x, _ = self.ddim_mean(*prediction, eta=0.0)
            else:
                noise = randn(shape, generator, device=cond.device)
                x = mean + std * noise
            chain.append(x)
            timesteps.append(t_batch)
            log_probs.append(self.gaussian_log_prob(x, mean, std))
        step_log_probs = torch.stack(log_probs, dim=1)  # [B, K]
        return ActionOutput(
            actions=self.executed_actions(x),
            log_prob=step_log_probs.sum(dim=1),
            policy_outputs={
                "chain": torch.stack(chain, dim=1),  # [B, K + 1, horizon, A]
                "timesteps": torch.stack(timesteps, dim=1),  # [B, K]
                "log_probs": step_log_probs,  # [B, K]
            },
        )

    def log_prob(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        policy_outputs: Mapping[str, Any],
    ) -> torch.Tensor:
        """Per-denoising-step log-densities ``[B, K]`` of a recorded chain, with gradients."""
        net, cond, t, x, x_prev, k = self.recorded_chain(
            obs, instructions, policy_outputs, "timesteps", torch.long
        )
        mean, sigma = self.denoise_step(net, x, t, cond, eta=self.config.ddim_eta)
        std = sigma.clamp(min=self.config.min_std)
        return self.gaussian_log_prob(x_prev, mean, std).reshape(-1, k)


__all__ = [
    "ConditionalUnet1D",
    "DiffusionConfig",
    "DiffusionNet",
    "DiffusionPolicy",
    "SinusoidalPosEmb",
]
