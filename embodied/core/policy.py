"""The policy contract every planner and VLA implements, its registry, and save/load.

A policy is a ``torch.nn.Module`` with a dataclass config. Callers (rollouts, evaluation, GRPO,
TPO, benches) read only what this class declares: ``observation_spec`` (cameras and sizes, state
size and value names, history length, whether it reads privileged state), ``action_spec``
(action size and chunk length), ``act``, ``log_prob``, ``bc_loss`` and save/load.
``save_pretrained`` writes ``config.json`` (with the policy type) and ``model.safetensors``
atomically; ``from_pretrained`` rebuilds the registered class and refuses weights that do not
match the config.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from embodied.core.features import ENV_STATE_KEY, ActionSpec, ObservationSpec
from embodied.core.pretrained import (
    CONFIG_NAME,
    config_from_dict,
    load_weights,
    read_pretrained,
    save_pretrained,
)
from embodied.core.sampling import Generators

POLICIES: dict[str, type[Policy]] = {}
# Directories saved in another library's layout: policy type -> a test of their config.json
# (which has no ``policy_type``), e.g. LeRobot's (``embodied.policies.lerobot``).
FOREIGN_FORMATS: dict[str, Callable[[dict[str, Any]], bool]] = {}


def register_policy(name: str, recognizes: Callable[[dict[str, Any]], bool] | None = None):
    """Class decorator: make a policy type loadable by name (``config.json``'s ``policy_type``);
    ``recognizes`` also claims saved directories whose config.json has no ``policy_type`` (the
    class then overrides ``load_saved`` to read them)."""

    def register(cls: type[Policy]) -> type[Policy]:
        if name in POLICIES:
            raise ValueError(f"policy type {name!r} is already registered by {POLICIES[name]}")
        cls.policy_type = name
        POLICIES[name] = cls
        if recognizes is not None:
            FOREIGN_FORMATS[name] = recognizes
        return cls

    return register


def policy_class(policy_type: str) -> type[Policy]:
    """The registered class of a policy type, or a ``ValueError`` listing the known types."""
    if policy_type not in POLICIES:
        raise ValueError(
            f"unknown policy type {policy_type!r}; available: {', '.join(sorted(POLICIES))}"
        )
    return POLICIES[policy_type]


@dataclass
class ActionOutput:
    """What ``Policy.act`` returns for a batch of B observations.

    ``actions`` is ``[B, chunk, A]`` (the env executes them in order), ``log_prob`` is ``[B]``: the
    log-probability of this decision under the sampling policy (summed over its tokens or
    denoising steps), and ``policy_outputs`` holds what ``Policy.log_prob`` needs to recompute it
    under new parameters (e.g. the sampled denoising chain), each entry with a leading B axis.
    """

    actions: Any
    log_prob: Any
    policy_outputs: dict[str, Any] = field(default_factory=dict)


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
        # The parts of the last ``bc_loss`` (detached scalars, e.g. an auxiliary loss), logged.
        self.bc_terms: dict[str, torch.Tensor] = {}

    # --- what callers read ----------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def observation_spec(self) -> ObservationSpec:
        """The features ``act`` reads (cameras, state, history length)."""

    @property
    @abc.abstractmethod
    def action_spec(self) -> ActionSpec:
        """Action size and the number of actions per decision."""

    @abc.abstractmethod
    def act(
        self,
        obs: Mapping[str, torch.Tensor],
        instructions: Sequence[str],
        deterministic: bool = False,
        generator: Generators = None,
    ) -> ActionOutput:
        """Sample an action chunk ``[B, chunk, A]`` for a batch of observation windows
        ``{feature: [B, n_obs_steps, ...]}``; ``generator`` (one, or one per row) draws noise."""

    @abc.abstractmethod
    def log_prob(
        self,
        obs: Mapping[str, torch.Tensor],
        instructions: Sequence[str],
        policy_outputs: Mapping[str, torch.Tensor],
    ) -> torch.Tensor:
        """Per-token / per-denoising-step log-probabilities ``[B, K]`` of recorded decisions."""

    @abc.abstractmethod
    def bc_loss(self, batch: Mapping[str, Any], auxiliary: bool = True) -> torch.Tensor:
        """Behaviour-cloning loss of a batch from ``embodied.datasets.training.BCDataset``;
        ``auxiliary=False`` leaves out any training-only target (e.g. the environment state a
        pixel policy learns to predict), for windows that hold none: the policy's own rollouts."""

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

    @property
    def bc_horizon(self) -> int:
        """Actions a behaviour-cloning window holds, from its oldest observation on: the whole
        predicted chunk for a planner, the observation history for a one-step policy."""
        return self.observation_spec.n_obs_steps

    @property
    def chain_steps(self) -> int | None:
        """K when ``log_prob`` scores a recorded denoising chain (``policy_outputs['chain']``,
        K Gaussian steps, any consecutive block of which it can recompute alone); None for a
        policy whose log-probs are not such a chain (e.g. a VLA's tokens)."""
        return None

    def training_keys(self) -> list[str]:
        """The features a BC batch must hold: the observed ones, plus any a training-only loss
        reads (e.g. an auxiliary target). Never fed to ``act``."""
        return self.observation_spec.read_keys()

    def check_inputs(self, obs: Mapping[str, Any]) -> None:
        """Refuse privileged state offered to a policy that was not trained to read it: a
        policy acts on what a robot has unless it says otherwise."""
        if ENV_STATE_KEY in obs and not self.observation_spec.privileged:
            raise ValueError(
                f"the {self.policy_type} policy does not read {ENV_STATE_KEY!r} (privileged "
                f"simulator state); it reads {self.observation_spec.read_keys()}"
            )

    @property
    def device(self) -> torch.device:
        """Where the parameters live."""
        return next(self.parameters()).device

    # --- save / load ----------------------------------------------------------------------------
    def with_overrides(self, overrides: Mapping[str, Any]) -> Policy:
        """This policy rebuilt with ``overrides`` applied to its config and the same weights
        (e.g. ``min_std`` to sample as GRPO does); a key its config lacks is an error naming it."""
        if not overrides:
            return self
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self.config)}
        if unknown:
            raise ValueError(
                f"policy_overrides names {sorted(unknown)}, which the {self.policy_type} "
                "config does not have"
            )
        rebuilt = type(self)(dataclasses.replace(self.config, **overrides))
        rebuilt.load_state_dict(self.state_dict())
        return rebuilt.to(self.device)

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory`` (atomically)."""
        config = {"policy_type": self.policy_type, **dataclasses.asdict(self.config)}
        return save_pretrained(self, config, directory)

    @classmethod
    def from_pretrained(
        cls, directory: str | os.PathLike[str], device: str | torch.device = "cpu"
    ) -> Policy:
        """Rebuild a saved policy; the class comes from ``config.json``'s ``policy_type`` (its
        module must be imported: ``embodied.policies`` registers the built-in ones)."""
        directory = Path(directory)
        config, weights = read_pretrained(directory, "policy")
        policy_type = config.pop("policy_type", None)
        if policy_type is None:
            policy_type = next((n for n, test in FOREIGN_FORMATS.items() if test(config)), None)
        if policy_type not in POLICIES:
            raise ValueError(
                f"{directory / CONFIG_NAME}: unknown policy_type {policy_type!r}; "
                f"available: {', '.join(sorted(POLICIES))}"
            )
        policy_cls = POLICIES[policy_type]
        if cls is not Policy and not issubclass(policy_cls, cls):
            raise ValueError(f"{directory} holds a {policy_type!r} policy, not a {cls.__name__}")
        return policy_cls.load_saved(directory, config, weights).to(device)

    @classmethod
    def load_saved(cls, directory: Path, config: dict[str, Any], weights: Path) -> Policy:
        """The policy saved in ``directory`` from its config.json values (``policy_type``
        removed) and weights file; classes whose ``save_pretrained`` writes another layout
        override this to read it."""
        policy = cls(config_from_dict(cls.config_class, config, directory))
        load_weights(policy, weights)
        return policy


def make_policy(policy_type: str, config: Any = None, **overrides: Any) -> Policy:
    """Build a registered policy from its type name (and a config or config overrides)."""
    cls = policy_class(policy_type)
    if config is None:
        config = cls.config_class(**overrides)
    elif overrides:
        config = dataclasses.replace(config, **overrides)
    return cls(config)
