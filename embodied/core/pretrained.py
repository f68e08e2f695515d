"""Hugging Face style save/load of a model directory: ``config.json`` + ``model.safetensors``.

Both files are written atomically. Loading refuses weights that do not match the config (naming
the tensor and both shapes) and config keys the dataclass does not have. Nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodied.core.io import atomic_open, atomic_write_text, read_json_object

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def save_pretrained(
    module: nn.Module, config: dict[str, Any], directory: str | os.PathLike[str]
) -> Path:
    """Write ``config.json`` (``config``, JSON-able) and ``model.safetensors`` (the module's
    state dict) into ``directory``, each atomically."""
    from safetensors.torch import save

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}
    with atomic_open(directory / WEIGHTS_NAME, "wb") as file:
        file.write(save(state))
    atomic_write_text(directory / CONFIG_NAME, json.dumps(config, indent=2) + "\n")
    return directory


def read_pretrained(
    directory: str | os.PathLike[str], what: str = "model"
) -> tuple[dict[str, Any], Path]:
    """``(config dict, weights path)`` of a saved directory; a missing file, unreadable JSON or a
    config that is not a JSON object is a ``ValueError`` naming the file."""
    directory = Path(directory)
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} is not a saved {what}: {name} is missing")
    return read_json_object(directory / CONFIG_NAME), directory / WEIGHTS_NAME


def config_from_dict(config_class: type, values: dict[str, Any], directory: Path) -> Any:
    """The config dataclass from ``config.json``, naming unknown keys."""
    names = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(
            f"{Path(directory) / CONFIG_NAME}: unknown keys {unknown} for {config_class.__name__}"
        )
    try:
        return config_class(**values)
    except TypeError as error:  # a required field is missing
        raise ValueError(f"{Path(directory) / CONFIG_NAME}: {error}") from None


def load_exact(module: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """Load weights that match the module exactly: missing, extra or reshaped tensors are errors
    naming the tensor and both shapes (a config that does not match its weights)."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing or extra:
        raise ValueError(
            f"{path}: weights do not match the config: missing {missing}, extra {extra}"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise ValueError(
                f"{path}: weight {name!r} has shape {tuple(tensor.shape)} but the config builds "
                f"{tuple(own[name].shape)}"
            )
    module.load_state_dict(state, strict=True)


def load_weights(module: nn.Module, path: str | os.PathLike[str]) -> None:
    """Load ``model.safetensors`` at ``path`` into ``module`` exactly (see ``load_exact``); a
    corrupt file is a ``ValueError`` naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{path}: not a readable safetensors file ({error})") from None
    load_exact(module, state, Path(path))
