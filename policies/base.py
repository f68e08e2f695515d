"""What the built-in policies share beyond the contract in ``embodied.core.policy``: config checks,
the dataset values and observation spec their configs describe, reading the newest step of an
observation, and normalisers fitted from dataset statistics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from embodied.core.config import check_choice
from embodied.core.features import (
    ENV_STATE_KEY,
    STATE_KEY,
    ActionSpec,
    ObservationSpec,
    feature_value_names,
    is_image_key,
)
from embodied.core.nn import Normalizer, object_groups
from embodied.core.policy import Policy

ACTION_LOW, ACTION_HIGH = -1.0, 1.0  # the env action box (sims/conventions.py: Box(-1, 1))
ENV_STATE_ENCODERS = ("flat", "objects")


# --- config checks --------------------------------------------------------------------------------
def check_chunk(config: Any) -> None:
    """The executed chunk starts at the newest observation and must fit in the horizon."""
    if config.n_obs_steps - 1 + config.n_action_steps > config.horizon:
        raise ValueError(
            f"{type(config).__name__} needs n_obs_steps - 1 + n_action_steps <= horizon, got "
            f"{config.n_obs_steps} - 1 + {config.n_action_steps} > {config.horizon}"
        )


def check_image_keys(config: Any) -> None:
    """Camera keys follow LeRobot: ``observation.image`` or ``observation.images.<camera>``."""
    for key in config.image_keys:
        if not is_image_key(key):
            raise ValueError(
                f"{type(config).__name__}.image_keys: {key!r} is not 'observation.image' or "
                "'observation.images.<camera>'"
            )


def check_env_state_encoder(config: Any) -> None:
    """Validate a config's ``env_state_encoder`` / ``env_state_names`` / ``env_state_dim``:
    ``"objects"`` needs one ``object.quantity`` name per environment-state value."""
    owner = type(config).__name__
    config.env_state_names = [str(n) for n in config.env_state_names]
    check_choice(config, "env_state_encoder", ENV_STATE_ENCODERS)
    names = len(config.env_state_names)
    if config.env_state_encoder == "objects" and (
        config.env_state_dim == 0 or names != config.env_state_dim
    ):
        raise ValueError(
            f"{owner}.env_state_encoder='objects' needs one name per environment-state value: "
            f"env_state_dim is {config.env_state_dim}, env_state_names has {names} (datasets "
            "collected by `embodied collect` record them in info.json)"
        )


# --- dataset-shaped configs -----------------------------------------------------------------------
def require_features(features: Mapping[str, Any], keys: Sequence[str]) -> None:
    """Name the features a policy needs that a dataset lacks."""
    missing = [k for k in keys if k not in features]
    if missing:
        raise ValueError(f"dataset has no {missing} features; features: {sorted(features)}")


def dataset_cameras(features: Mapping[str, Mapping[str, Any]]) -> tuple[list[str], int | None]:
    """A dataset's camera keys (video features, and image features as LeRobot may store them)
    and their one square size (None: no camera)."""
    keys = [k for k, f in features.items() if f.get("dtype") in ("video", "image")]
    sizes = {features[k]["shape"][0] for k in keys} | {features[k]["shape"][1] for k in keys}
    if len(sizes) > 1:
        raise ValueError(f"cameras must share one square size, got sizes {sorted(sizes)}")
    return keys, (int(sizes.pop()) if sizes else None)


def env_state_values(features: Mapping[str, Any], tasks: Any) -> tuple[dict[str, Any], list[str]]:
    """Config values for a dataset's environment state (size and value names) and the texts a
    vocabulary must cover: the instructions plus the objects' names (``block_red``)."""
    texts = list(tasks)
    if ENV_STATE_KEY not in features:
        return {}, texts
    values: dict[str, Any] = {"env_state_dim": int(features[ENV_STATE_KEY]["shape"][-1])}
    names = feature_value_names(features[ENV_STATE_KEY])
    if names:
        values["env_state_names"] = names
        texts += [name for name, _ in object_groups(names)]
    return values, texts


def dataset_state_values(features: Mapping[str, Any]) -> dict[str, Any]:
    """Config values for a dataset's proprioceptive state: its size and value names."""
    if STATE_KEY not in features:
        return {}
    return {
        "state_dim": int(features[STATE_KEY]["shape"][-1]),
        "state_names": feature_value_names(features[STATE_KEY]),
    }


def config_observation_spec(
    config: Any, reads_state: bool = True, reads_env_state: bool = True
) -> ObservationSpec:
    """The ``ObservationSpec`` of a config with the usual fields (``image_keys``,
    ``image_size``, ``state_dim``, ``state_names``, ``env_state_dim``, ``env_state_names``,
    ``n_obs_steps``); ``reads_*=False`` leaves out a state the model was configured without."""
    size = (config.image_size, config.image_size)
    return ObservationSpec(
        cameras={key: size for key in config.image_keys},
        state_dim=config.state_dim if reads_state else 0,
        state_names=tuple(config.state_names) if reads_state else (),
        env_state_dim=config.env_state_dim if reads_env_state else 0,
        env_state_names=tuple(config.env_state_names) if reads_env_state else (),
        n_obs_steps=config.n_obs_steps,
    )


# --- observations and statistics ------------------------------------------------------------------
def newest_step(
    obs: Mapping[str, Any],
    key: str,
    trailing: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """The newest step ``[B, *trailing]`` of a feature given as ``[B, n_obs, *trailing]`` or
    ``[B, *trailing]``, on ``device``; shape, dtype (uint8 images stay uint8) and finiteness
    checked, naming the key. Policies that read one step take windows and single steps alike."""
    if key not in obs:
        raise ValueError(f"observation has no {key!r}; keys: {sorted(obs)}")
    x = torch.as_tensor(obs[key], device=device)
    shape = tuple(x.shape)
    n = len(trailing)
    if x.ndim not in (n + 1, n + 2) or shape[-n:] != trailing:
        expected = ", ".join(map(str, trailing))
        raise ValueError(
            f"observation {key!r} has shape {shape}, the policy expects [B, {expected}] or "
            f"[B, n_obs, {expected}]"
        )
    if dtype == torch.uint8 and x.dtype != torch.uint8:
        raise ValueError(f"observation {key!r} must be uint8 images, got {x.dtype} {shape}")
    x = x[:, -1] if x.ndim == n + 2 else x
    if dtype != torch.uint8:
        x = x.to(dtype)
        if not torch.isfinite(x).all():
            raise ValueError(f"observation {key!r} holds NaN or infinite values")
    return x


def check_instructions(instructions: Sequence[str], batch: int) -> None:
    """One instruction per observation (a lone string is refused, not split into letters)."""
    if isinstance(instructions, str) or len(instructions) != batch:
        got = "a single string" if isinstance(instructions, str) else f"{len(instructions)}"
        raise ValueError(f"need {batch} instructions (one per observation), got {got}")


def fit_normalizers(
    stats: Mapping[str, Mapping[str, Any]],
    normalizers: Mapping[str, Normalizer | None],
    needed: Sequence[str] = (),
) -> None:
    """Fit each normaliser (``None``: not built) from its feature's dataset statistics, naming
    any feature the statistics lack (those of the normalisers and ``needed``)."""
    keys = [k for k, n in normalizers.items() if n is not None]
    missing = [k for k in [*keys, *needed] if k not in stats]
    if missing:
        raise ValueError(f"statistics lack {missing}; given: {sorted(stats)}")
    for key in keys:
        normalizers[key].fit(stats[key])


class ChunkedPolicy(Policy):
    """A policy that predicts ``config.horizon`` actions per training window and executes
    ``config.n_action_steps`` of ``config.action_dim`` values per decision."""

    @property
    def bc_horizon(self) -> int:
        """The predicted chunk: ``horizon`` actions."""
        return self.config.horizon

    @property
    def action_spec(self) -> ActionSpec:
        """``n_action_steps`` actions per decision."""
        return ActionSpec(self.config.action_dim, self.config.n_action_steps)


class NormalizedPolicy(Policy):
    """A policy whose state, environment state and actions are scaled by dataset statistics."""

    def build_normalizers(self, state_dim: int, env_state_dim: int, action_dim: int) -> None:
        """The usual normalisers: state and (when ``env_state_dim > 0``) environment state by
        mean/std, actions by min/max onto [-1, 1]."""
        self.state_normalizer = Normalizer(state_dim, "mean_std")
        self.env_state_normalizer = (
            Normalizer(env_state_dim, "mean_std") if env_state_dim > 0 else None
        )
        self.action_normalizer = Normalizer(action_dim, "min_max")

    def fit_state_normalizers(self, stats: Mapping[str, Mapping[str, Any]]) -> Policy:
        """Fit the normalisers of ``build_normalizers`` from dataset statistics."""
        fit_normalizers(
            stats,
            {
                STATE_KEY: self.state_normalizer,
                "action": self.action_normalizer,
                ENV_STATE_KEY: self.env_state_normalizer,
            },
        )
        return self
