"""What the built-in policies share beyond the contract in ``embodied.core.policy``: normalisers
fitted from dataset statistics, the observation spec their configs describe, and the checks of a
privileged environment-state encoder (state-only baselines)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from embodied.core.features import (
    ENV_STATE_KEY,
    STATE_KEY,
    ObservationSpec,
    feature_value_names,
)
from embodied.core.nn import Normalizer, object_groups
from embodied.core.policy import Policy

ENV_STATE_ENCODERS = ("flat", "objects")


def check_env_state_encoder(config: Any) -> None:
    """Validate a config's ``env_state_encoder`` / ``env_state_names`` / ``env_state_dim``:
    ``"objects"`` needs one ``object.quantity`` name per environment-state value."""
    owner = type(config).__name__
    config.env_state_names = [str(n) for n in config.env_state_names]
    if config.env_state_encoder not in ENV_STATE_ENCODERS:
        raise ValueError(
            f"{owner}.env_state_encoder must be 'flat' or 'objects', got "
            f"{config.env_state_encoder!r}"
        )
    names = len(config.env_state_names)
    if config.env_state_encoder == "objects" and (
        config.env_state_dim == 0 or names != config.env_state_dim
    ):
        raise ValueError(
            f"{owner}.env_state_encoder='objects' needs one name per environment-state value: "
            f"env_state_dim is {config.env_state_dim}, env_state_names has {names} (datasets "
            "collected by `embodied collect` record them in info.json)"
        )


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
        """Fit the normalisers of ``build_normalizers`` from dataset statistics, naming any
        feature the statistics lack."""
        has_env = self.env_state_normalizer is not None
        needed = [STATE_KEY, "action"] + ([ENV_STATE_KEY] if has_env else [])
        missing = [k for k in needed if k not in stats]
        if missing:
            raise ValueError(f"statistics lack {missing}; given: {sorted(stats)}")
        self.state_normalizer.fit(stats[STATE_KEY])
        if has_env:
            self.env_state_normalizer.fit(stats[ENV_STATE_KEY])
        self.action_normalizer.fit(stats["action"])
        return self

    def state_keys(self) -> list[str]:
        """``observation.state`` and, when normalised, the environment state."""
        return [STATE_KEY] + ([ENV_STATE_KEY] if self.env_state_normalizer is not None else [])
