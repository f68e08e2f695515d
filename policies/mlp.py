"""A Gaussian MLP policy: the small baseline for fast RL and behaviour-cloning sanity checks.

The policy reads the newest observation's state (``observation.state``, plus the privileged
``observation.environment_state`` when ``env_state_dim > 0``), normalised with dataset mean/std,
and outputs the mean of a diagonal Gaussian over the *normalised* action (min/max mapped to
[-1, 1]). The standard deviation is a learned, state-independent parameter (``log_std``, clamped
to ``[min_log_std, max_log_std]``). There is no tanh squashing.

Decisions made here:

- ``act`` draws ``sample = mean + std * noise`` in normalised space and records it in
  ``policy_outputs["sample"]`` ``[B, A]`` before any clipping, so the recorded ``log_prob`` and the
  one ``log_prob`` recomputes are exact Gaussian densities. The executed action is that sample
  unnormalised and then clipped to the toolkit's action box [-1, 1] (``sims/conventions.py``); the
  clipping is part of the environment, not of the distribution. Log-probabilities are densities of
  the normalised action: they differ from raw-action densities by a constant that does not depend
  on the parameters, so likelihood ratios (PPO / GRPO) are unaffected.
- ``log_prob`` returns per-dimension log-densities ``[B, A]`` (the base class's ``K`` is the number
  of action dimensions); the decision's log-probability is their sum.
- ``bc_loss`` predicts one action per window: the one executed at the newest observation, i.e.
  ``action[:, n_obs - 1]`` where ``n_obs`` is the batch's observation length (``BCDataset`` puts
  actions ``t-n_obs+1 ..`` in the window). Later horizon steps are future actions this one-step
  policy does not predict, so they are ignored; the target is masked by ``action_is_pad``.
- Instructions are ignored: this baseline is not language-conditioned. Use it on single-goal
  settings, or give it the privileged environment state.
- Observations may be ``[B, n_obs, D]`` (dataset windows, rollout history) or ``[B, D]`` (one
  env step); only the last step is used. ``n_obs_steps`` says how many steps to feed it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from embodied.core.config import check_ints, check_scalars
from embodied.core.features import ENV_STATE_KEY, STATE_KEY, ActionSpec, ObservationSpec
from embodied.core.policy import ActionOutput, register_policy
from embodied.core.sampling import randn
from embodied.policies.base import (
    ACTION_HIGH,
    ACTION_LOW,
    NormalizedPolicy,
    dataset_state_values,
    newest_step,
    require_features,
)

_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class MLPConfig:
    """Sizes and distribution bounds of ``MLPPolicy`` (saved to ``config.json``)."""

    state_dim: int
    action_dim: int
    env_state_dim: int = 0
    state_names: list[str] = field(default_factory=list)  # the state values' names, when known
    hidden: list[int] = field(default_factory=lambda: [256, 256])
    n_obs_steps: int = 1
    init_log_std: float = -0.5
    min_log_std: float = -5.0
    max_log_std: float = 1.0

    def __post_init__(self) -> None:
        """Refuse sizes and bounds that cannot build a policy, naming the field."""
        check_scalars(self)
        check_ints(self, {"state_dim": 1, "action_dim": 1, "n_obs_steps": 1, "env_state_dim": 0})
        self.hidden = list(self.hidden)
        if not all(isinstance(h, int) and h >= 1 for h in self.hidden):
            raise ValueError(f"MLPConfig.hidden must be positive ints, got {self.hidden!r}")
        if not self.min_log_std <= self.init_log_std <= self.max_log_std:
            raise ValueError(
                "MLPConfig needs min_log_std <= init_log_std <= max_log_std, got "
                f"{self.min_log_std}, {self.init_log_std}, {self.max_log_std}"
            )


@register_policy("mlp")
class MLPPolicy(NormalizedPolicy):
    """Diagonal Gaussian over normalised actions: MLP mean, learned state-independent std."""

    config_class = MLPConfig
    config: MLPConfig

    def __init__(self, config: MLPConfig) -> None:
        super().__init__(config)
        self.build_normalizers(config.state_dim, config.env_state_dim, config.action_dim)
        layers: list[nn.Module] = []
        width = config.state_dim + config.env_state_dim
        for size in config.hidden:
            layers += [nn.Linear(width, size), nn.SiLU()]
            width = size
        head = nn.Linear(width, config.action_dim)
        with torch.no_grad():  # start near the mean action so early RL samples stay in range
            head.weight.mul_(0.01)
            head.bias.zero_()
        self.mlp = nn.Sequential(*layers, head)
        self.log_std = nn.Parameter(torch.full((config.action_dim,), float(config.init_log_std)))

    @classmethod
    def config_from_dataset(
        cls,
        features: Mapping[str, Mapping[str, Any]],
        tasks: Any = None,
        horizon: int | None = None,
        **overrides: Any,
    ) -> MLPConfig:
        """A config shaped by a LeRobot dataset's features (what ``embodied train bc`` calls).

        Uses the privileged environment state when the dataset has it (the MLP sees no images);
        ``env_state_dim=0`` in ``overrides`` turns that off. ``tasks`` and ``horizon`` are unused.
        """
        require_features(features, (STATE_KEY, "action"))
        sizes = {
            **dataset_state_values(features),
            "action_dim": int(features["action"]["shape"][-1]),
        }
        if ENV_STATE_KEY in features:
            sizes["env_state_dim"] = int(features[ENV_STATE_KEY]["shape"][-1])
        return MLPConfig(**{**sizes, **overrides})

    def fit_normalizers(self, stats: Mapping[str, Mapping[str, Any]]) -> MLPPolicy:
        """State and environment state by mean/std, actions by min/max (dataset statistics)."""
        return self.fit_state_normalizers(stats)

    @property
    def observation_spec(self) -> ObservationSpec:
        """The state (and, when configured, the privileged environment state); no camera."""
        config = self.config
        return ObservationSpec(
            state_dim=config.state_dim,
            state_names=tuple(config.state_names),
            env_state_dim=config.env_state_dim,
            n_obs_steps=config.n_obs_steps,
        )

    @property
    def action_spec(self) -> ActionSpec:
        """One action per decision."""
        return ActionSpec(self.config.action_dim, 1)

    # --- the distribution ---------------------------------------------------------------------
    def _features(self, obs: Mapping[str, Any]) -> torch.Tensor:
        """Normalised MLP input ``[B, state_dim + env_state_dim]``."""
        config = self.config
        state = newest_step(obs, STATE_KEY, (config.state_dim,), torch.float32, self.device)
        parts = [self.state_normalizer.normalize(state)]
        if self.env_state_normalizer is not None:
            trailing = (config.env_state_dim,)
            env_state = newest_step(obs, ENV_STATE_KEY, trailing, torch.float32, self.device)
            if env_state.shape[0] != state.shape[0]:
                raise ValueError(
                    f"{ENV_STATE_KEY} has batch {env_state.shape[0]}, {STATE_KEY} has "
                    f"{state.shape[0]}"
                )
            parts.append(self.env_state_normalizer.normalize(env_state))
        return torch.cat(parts, dim=-1)

    def distribution(self, obs: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean ``[B, A]`` and clamped log-std ``[A]`` of the normalised-action Gaussian."""
        log_std = self.log_std.clamp(self.config.min_log_std, self.config.max_log_std)
        return self.mlp(self._features(obs)), log_std

    @staticmethod
    def _gaussian_log_density(
        x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
    ) -> torch.Tensor:
        """Per-dimension log N(x; mean, exp(log_std)^2)."""
        return -0.5 * ((x - mean) * torch.exp(-log_std)) ** 2 - log_std - _LOG_SQRT_2PI

    # --- the Policy interface -----------------------------------------------------------------
    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Any],
        instructions: list[str] | None = None,
        deterministic: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActionOutput:
        """One action per observation: ``actions [B, 1, A]`` (raw, clipped), ``log_prob [B]``,
        ``policy_outputs`` ``sample`` (before clipping) and per-dimension ``log_probs [B, A]``."""
        self.check_inputs(obs)
        mean, log_std = self.distribution(obs)
        if deterministic:
            sample = mean
        else:
            noise = randn(mean.shape, generator, device=mean.device, dtype=mean.dtype)
            sample = mean + torch.exp(log_std) * noise
        log_probs = self._gaussian_log_density(sample, mean, log_std)
        actions = self.action_normalizer.unnormalize(sample).clamp(ACTION_LOW, ACTION_HIGH)
        return ActionOutput(
            actions=actions[:, None],
            log_prob=log_probs.sum(-1),
            policy_outputs={"sample": sample, "log_probs": log_probs},
        )

    def log_prob(
        self,
        obs: Mapping[str, Any],
        instructions: list[str] | None,
        policy_outputs: Mapping[str, Any],
    ) -> torch.Tensor:
        """Per-dimension log-densities ``[B, A]`` of recorded samples, with gradients."""
        self.check_inputs(obs)
        if "sample" not in policy_outputs:
            raise ValueError(f"policy_outputs has no 'sample'; keys: {sorted(policy_outputs)}")
        mean, log_std = self.distribution(obs)
        sample = torch.as_tensor(policy_outputs["sample"], device=mean.device, dtype=mean.dtype)
        if sample.shape != mean.shape:
            raise ValueError(
                f"policy_outputs['sample'] has shape {tuple(sample.shape)}, expected "
                f"{tuple(mean.shape)}"
            )
        return self._gaussian_log_density(sample, mean, log_std)

    def bc_loss(self, batch: Mapping[str, Any], auxiliary: bool = True) -> torch.Tensor:
        """Mean Gaussian NLL of the action executed at each window's newest observation (no
        auxiliary target)."""
        mean, log_std = self.distribution(batch)
        n_obs = batch[STATE_KEY].shape[1] if batch[STATE_KEY].ndim == 3 else 1
        action = torch.as_tensor(batch["action"], device=self.device, dtype=torch.float32)
        if action.ndim != 3 or action.shape[1] < n_obs or action.shape[2] != self.config.action_dim:
            raise ValueError(
                f"action has shape {tuple(action.shape)}, expected [B, horizon >= {n_obs}, "
                f"{self.config.action_dim}]"
            )
        target = self.action_normalizer.normalize(action[:, n_obs - 1])
        is_pad = batch.get("action_is_pad")
        valid = (
            torch.ones(target.shape[0], device=self.device)
            if is_pad is None
            else (~torch.as_tensor(is_pad, device=self.device).bool()[:, n_obs - 1]).float()
        )
        nll = -self._gaussian_log_density(target, mean, log_std).sum(-1)
        return (nll * valid).sum() / valid.sum().clamp(min=1.0)
