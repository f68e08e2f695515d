"""The policy interface every planner and VLA implements, its registry, and save/load.

A policy is a ``torch.nn.Module`` with a dataclass config. ``save_pretrained`` writes
``config.json`` (with the policy type) and ``model.safetensors`` (weights and the normalisation
statistics, as buffers) atomically; ``from_pretrained`` rebuilds the right class from the registry
and refuses weights that do not match the config, naming both shapes.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from embodied.core.nn import (
    CONFIG_NAME,
    WEIGHTS_NAME,  # noqa: F401  (re-exported)
    config_from_dict,
    load_exact,
    load_weights,
    object_groups,
    read_pretrained,
    save_pretrained,
)
from embodied.core.types import ActionOutput, feature_value_names

STATE_KEY = "observation.state"
ENV_STATE_KEY = "observation.environment_state"

POLICIES: dict[str, type[Policy]] = {}


def register_policy(name: str):
    """Class decorator: make a policy type loadable by name (``config.json``'s ``policy_type``)."""

    def register(cls: type[Policy]) -> type[Policy]:
        if name in POLICIES:
            raise ValueError(f"policy type {name!r} is already registered by {POLICIES[name]}")
        cls.policy_type = name
        POLICIES[name] = cls
        return cls

    return register


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


Generators = torch.Generator | Sequence[torch.Generator] | None


def randn(shape: Sequence[int], generator: Generators, device: Any = None, dtype: Any = None):
    """``torch.randn(shape)`` from ``generator``, or, given one generator per row (a sequence of
    ``shape[0]``), each row from its own: a row's noise then does not depend on which other rows
    share the batch (rollouts reproduce across batch sizes, workers and backends). Noise is drawn
    on the generator's device and moved to ``device``: a CPU generator drives a CUDA policy, with
    the same noise as on the CPU."""
    if generator is None:
        return torch.randn(tuple(shape), device=device, dtype=dtype)
    if isinstance(generator, torch.Generator):
        noise = torch.randn(tuple(shape), generator=generator, device=generator.device, dtype=dtype)
        return noise.to(device)
    if len(generator) != shape[0]:
        raise ValueError(f"got {len(generator)} generators for a batch of {shape[0]}")
    rows = [torch.randn(tuple(shape[1:]), generator=g, dtype=dtype) for g in generator]
    return torch.stack(rows).to(device)


def multinomial(probs: torch.Tensor, generator: Generators) -> torch.Tensor:
    """One sample per row of ``probs [B, V]`` -> ``[B]``, per-row generators as in ``randn``."""
    if generator is None or isinstance(generator, torch.Generator):
        device = generator.device if generator is not None else probs.device
        choice = torch.multinomial(probs.to(device), 1, generator=generator)
        return choice.squeeze(1).to(probs.device)
    if len(generator) != probs.shape[0]:
        raise ValueError(f"got {len(generator)} generators for a batch of {probs.shape[0]}")
    rows = [
        torch.multinomial(p.cpu(), 1, generator=g) for p, g in zip(probs, generator, strict=True)
    ]
    return torch.cat(rows).to(probs.device)


class Normalizer(nn.Module):
    """Feature scaling from dataset statistics, stored as buffers so it travels with the weights.

    ``mode="mean_std"``: ``(x - mean) / std``; ``mode="min_max"``: maps [min, max] to [-1, 1] (the
    Diffusion Policy convention for actions). Constant dimensions are left unscaled.
    """

    def __init__(self, dim: int, mode: str = "mean_std") -> None:
        super().__init__()
        if mode not in ("mean_std", "min_max"):
            raise ValueError(f"mode must be 'mean_std' or 'min_max', got {mode!r}")
        self.mode = mode
        self.register_buffer("shift", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))

    @torch.no_grad()
    def fit(self, stats: Mapping[str, Any]) -> Normalizer:
        """Set the buffers from a feature's statistics (``mean``/``std`` or ``min``/``max``)."""
        get = lambda k: torch.as_tensor(np.asarray(stats[k], dtype=np.float32).reshape(-1))  # noqa: E731
        if self.mode == "mean_std":
            shift, scale = get("mean"), get("std")
        else:
            low, high = get("min"), get("max")
            shift, scale = (high + low) / 2, (high - low) / 2
        if shift.shape != self.shift.shape:
            raise ValueError(
                f"statistics have shape {tuple(shift.shape)}, the policy expects "
                f"{tuple(self.shift.shape)}"
            )
        self.shift.copy_(shift)
        self.scale.copy_(torch.where(scale > 1e-6, scale, torch.ones_like(scale)))
        return self

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Raw -> normalised."""
        return (x - self.shift) / self.scale

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised -> raw."""
        return x * self.scale + self.shift


class Policy(nn.Module, abc.ABC):
    """Base class: ``act`` samples action chunks with their log-probabilities, ``log_prob``
    recomputes them with gradients, ``bc_loss`` trains by behaviour cloning."""

    policy_type: ClassVar[str] = ""
    config_class: ClassVar[type]

    def __init__(self, config: Any) -> None:
        super().__init__()
        if not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} needs a {self.config_class.__name__}")
        self.config = config

    @abc.abstractmethod
    def act(
        self, obs: Mapping[str, torch.Tensor], instructions: list[str], deterministic: bool = False
    ) -> ActionOutput:
        """Sample an action chunk ``[B, chunk, A]`` for a batch of observations."""

    @abc.abstractmethod
    def log_prob(
        self,
        obs: Mapping[str, torch.Tensor],
        instructions: list[str],
        policy_outputs: Mapping[str, torch.Tensor],
    ) -> torch.Tensor:
        """Per-token / per-denoising-step log-probabilities ``[B, K]`` of recorded decisions."""

    @abc.abstractmethod
    def bc_loss(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Behaviour-cloning loss of a batch from ``embodied.datasets.training.BCDataset``."""

    @classmethod
    @abc.abstractmethod
    def config_from_dataset(
        cls,
        features: Mapping[str, Mapping[str, Any]],
        tasks: Any = (),
        horizon: int | None = None,
        **overrides: Any,
    ) -> Any:
        """A config shaped by a LeRobot dataset's features and instructions (for training)."""

    @abc.abstractmethod
    def fit_normalizers(self, stats: Mapping[str, Mapping[str, Any]]) -> Policy:
        """Set the normalisation buffers from ``embodied.datasets.training.normalization_stats``."""

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

    def input_keys(self) -> list[str] | None:
        """The observation features the policy reads (what a training dataset must decode);
        None = all of them."""
        return None

    @property
    def device(self) -> torch.device:
        """Where the parameters live."""
        return next(self.parameters()).device

    # --- save / load -------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory`` (atomically)."""
        config = {"policy_type": self.policy_type, **dataclasses.asdict(self.config)}
        return save_pretrained(self, config, directory)

    @classmethod
    def from_pretrained(
        cls, directory: str | os.PathLike[str], device: str | torch.device = "cpu"
    ) -> Policy:
        """Rebuild a saved policy; the class comes from ``config.json``'s ``policy_type``."""
        directory = Path(directory)
        config, weights = read_pretrained(directory, "policy")
        policy_type = config.pop("policy_type", None)
        if policy_type not in POLICIES:
            raise ValueError(
                f"{directory / CONFIG_NAME}: unknown policy_type {policy_type!r}; "
                f"available: {', '.join(sorted(POLICIES))}"
            )
        policy_cls = POLICIES[policy_type]
        if cls is not Policy and not issubclass(policy_cls, cls):
            raise ValueError(f"{directory} holds a {policy_type!r} policy, not a {cls.__name__}")
        policy = policy_cls(_config_from_dict(policy_cls.config_class, config, directory))
        load_weights(policy, weights)
        return policy.to(device)


_config_from_dict = config_from_dict  # shared with the reward models (embodied.core.nn)
_load_exact = load_exact


def make_policy(policy_type: str, config: Any = None, **overrides: Any) -> Policy:
    """Build a registered policy from its type name (and a config or config overrides)."""
    if policy_type not in POLICIES:
        raise ValueError(
            f"unknown policy type {policy_type!r}; available: {', '.join(sorted(POLICIES))}"
        )
    cls = POLICIES[policy_type]
    if config is None:
        config = cls.config_class(**overrides)
    elif overrides:
        config = dataclasses.replace(config, **overrides)
    return cls(config)
