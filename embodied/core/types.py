"""Small types shared by the peers: what a policy returns, and env <-> dataset feature names.

Observations reach policies under LeRobot's feature names (``observation.state``,
``observation.image``, ``observation.images.<camera>``) whether they come from a dataset or
straight from an env, so one name mapping serves the datasets, the policies and the rollouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def observation_feature(path: tuple[str, ...]) -> str:
    """Feature name of an env observation key (``agent_pos`` -> ``observation.state``,
    ``pixels`` -> ``observation.image``, ``pixels/front`` -> ``observation.images.front``)."""
    if path == ("agent_pos",):
        return "observation.state"
    if path[0] == "pixels":
        return "observation.image" if len(path) == 1 else f"observation.images.{path[1]}"
    return "observation." + ".".join(path)


def env_observation_features(obs: dict[str, Any]) -> dict[str, np.ndarray]:
    """An env observation (one level of dicts) keyed by feature names."""
    out: dict[str, np.ndarray] = {}
    for key, value in obs.items():
        if isinstance(value, dict):
            for sub, array in value.items():
                out[observation_feature((key, sub))] = np.asarray(array)
        else:
            out[observation_feature((key,))] = np.asarray(value)
    return out


def feature_value_names(spec: dict[str, Any]) -> list[str]:
    """The per-value names of a LeRobot feature spec (info.json's ``names``: a list, or a dict
    holding one list such as ``{"motors": [...]}``); [] when it has none."""
    names = spec.get("names")
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return []
    return list(names)


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
