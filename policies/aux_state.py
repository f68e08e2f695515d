"""The environment state as a camera policy's training-only target: a head predicts it from the
cameras' spatial-softmax keypoints, BC adds the MSE of the normalised prediction, and the policy
may read the *prediction* (``aux_state_encoder``), never the observed state. The diffusion
planner and the VLA share these settings (``aux_state_dim``, ``aux_state_names``,
``aux_state_weight``, ``aux_state_encoder``, ``aux_state_quantities``) and their checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from embodied.core.config import check_choice
from embodied.core.features import ENV_STATE_KEY
from embodied.core.nn import Mish, Normalizer, value_quantity

AUX_STATE_ENCODERS = ("none", "flat", "objects")  # how the policy reads the predicted state
AUX_HIDDEN = 256  # hidden width of the state head
# The smallest scale of a target value, in the state's units (1 cm, 0.01 of a quaternion or of a
# joint's travel), about a pixel of a 64 px camera. A value that barely varies (a resting block's
# height, std 0.9 mm; a fixed cabinet's 0.1 mm jitter) divided by its own std becomes unit-variance
# noise no camera can predict: such values made most of the loss and its gradient.
AUX_MIN_SCALE = 0.01


def wants_aux_state(settings: Mapping[str, Any]) -> bool:
    """Whether config values (or overrides) ask for the auxiliary state target."""
    return bool(settings.get("aux_state_weight", 0)) or (
        settings.get("aux_state_encoder", "none") != "none"
    )


def aux_state_values(env_values: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict:
    """A dataset's environment-state config values, renamed to the auxiliary target's
    (``aux_state_dim`` / ``aux_state_names``) when ``overrides`` ask for one: the state is then
    a training label and never an input."""
    if not wants_aux_state(overrides):
        return dict(env_values)
    return {
        "aux_state_dim": env_values.get("env_state_dim", 0),
        "aux_state_names": env_values.get("env_state_names", []),
    }


def check_aux_state(config: Any) -> None:
    """The auxiliary settings of a config that can work together, naming the field."""
    name = type(config).__name__
    config.aux_state_names = [str(n) for n in config.aux_state_names]
    check_choice(config, "aux_state_encoder", AUX_STATE_ENCODERS)
    if config.aux_state_weight < 0:
        raise ValueError(f"{name}.aux_state_weight must be >= 0, got {config.aux_state_weight}")
    if wants_aux_state(vars(config)) and (not config.image_keys or config.aux_state_dim == 0):
        raise ValueError(
            f"{name}.aux_state_weight / aux_state_encoder predict the environment state "
            f"from the cameras: they need image_keys (got {config.image_keys}) and "
            f"aux_state_dim > 0 (got {config.aux_state_dim})"
        )
    if config.aux_state_encoder != "none" and config.env_state_dim:
        raise ValueError(
            f"{name}.aux_state_encoder conditions on the predicted environment state; it "
            f"cannot be combined with the observed one (env_state_dim={config.env_state_dim})"
        )
    if config.aux_state_names and len(config.aux_state_names) != config.aux_state_dim:
        raise ValueError(
            f"{name}.aux_state_names has {len(config.aux_state_names)} names for "
            f"aux_state_dim={config.aux_state_dim}"
        )
    if config.aux_state_encoder == "objects" and not config.aux_state_names:
        raise ValueError(
            f"{name}.aux_state_encoder='objects' needs aux_state_names (object.quantity)"
        )
    config.aux_state_quantities = [str(q) for q in config.aux_state_quantities]
    if config.aux_state_quantities:
        present = {value_quantity(n) for n in config.aux_state_names}
        missing = sorted(set(config.aux_state_quantities) - present)
        if missing:
            raise ValueError(
                f"{name}.aux_state_quantities names {missing}, which no aux_state_names value "
                f"has (its quantities: {sorted(present)})"
            )


def kept_columns(config: Any) -> torch.Tensor:
    """``[aux_state_dim]``: 1 for the values the target holds (those whose quantity, the name
    after the dot, is in ``aux_state_quantities``; all when it is empty), else 0."""
    if not config.aux_state_quantities:
        return torch.ones(config.aux_state_dim)
    wanted = set(config.aux_state_quantities)
    return torch.tensor([float(value_quantity(n) in wanted) for n in config.aux_state_names])


class AuxStateHead(nn.Sequential):
    """Every camera's keypoints ``[N, cameras * num_keypoints * 2]`` (x, y each) -> the
    normalised environment state ``[N, aux_state_dim]``. Values left out of the target
    (``aux_state_quantities``) are predicted as 0, the dataset's mean, so a policy reading the
    prediction sees a constant there."""

    def __init__(self, config: Any) -> None:
        keypoints = 2 * config.num_keypoints * len(config.image_keys)
        super().__init__(
            nn.Linear(keypoints, AUX_HIDDEN), Mish(), nn.Linear(AUX_HIDDEN, config.aux_state_dim)
        )
        self.register_buffer("kept", kept_columns(config), persistent=False)

    def forward(self, keypoints: torch.Tensor) -> torch.Tensor:
        return super().forward(keypoints) * self.kept

    def loss(
        self, predicted: torch.Tensor, target: torch.Tensor, normalizer: Normalizer, weight: float
    ) -> torch.Tensor:
        """``weight * mean((predicted - normalize(target))^2)`` over the kept values:
        ``predicted`` is normalised, ``target`` raw (the dataset's environment state)."""
        error = (predicted - normalizer.normalize(target)) * self.kept
        return weight * error.pow(2).sum(-1).mean() / self.kept.sum()


def aux_state_head(config: Any) -> AuxStateHead | None:
    """The config's state head, or None when it asks for no auxiliary target."""
    return AuxStateHead(config) if wants_aux_state(vars(config)) else None


def fit_aux_normalizer(normalizer: Normalizer, stats: Mapping[str, Mapping[str, Any]]) -> None:
    """Scale the target by the dataset's environment-state mean and std, the std floored at
    ``AUX_MIN_SCALE``: a near-constant value then stays near zero instead of becoming noise."""
    if ENV_STATE_KEY not in stats:
        raise ValueError(
            f"the auxiliary state target needs {ENV_STATE_KEY!r} statistics; given: {sorted(stats)}"
        )
    normalizer.fit(stats[ENV_STATE_KEY], min_scale=AUX_MIN_SCALE)


class AuxStateTarget:
    """Policy mixin: with an ``aux_state_normalizer`` (the target's scaling), BC batches also
    carry the environment state, a training label only that ``act`` never reads."""

    aux_state_normalizer: Normalizer | None

    def training_keys(self) -> list[str]:
        """The observed features plus the environment state when it is the auxiliary target."""
        aux = [ENV_STATE_KEY] if self.aux_state_normalizer is not None else []
        return list(dict.fromkeys([*self.observation_spec.read_keys(), *aux]))
