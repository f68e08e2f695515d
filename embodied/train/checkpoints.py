"""Checkpoints that resume exactly and are never half-written.

A checkpoint is a directory ``checkpoints/step-NNNNNNN/`` written under a temporary name and
renamed, holding the model (``save_pretrained``), the optimizer's tensors and the torch RNG state
(safetensors), and every scalar (JSON): nothing is unpickled when a run resumes.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.core.io import atomic_write_text, read_json_object

CHECKPOINT_PREFIX = "step-"


def save_checkpoint(
    directory: Path,
    step: int,
    policy: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``directory/step-NNNNNNN`` atomically (temporary directory, then rename)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{CHECKPOINT_PREFIX}{step:07d}"
    tmp = directory / f".tmp-{CHECKPOINT_PREFIX}{step:07d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(tmp / "policy")
    tensors, scalars = _flatten_optimizer(optimizer.state_dict())
    tensors["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_initialized():  # noise drawn on the GPU (diffusion's training noise)
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = state
    save_file(tensors, str(tmp / "trainer.safetensors"))
    numpy_state = np.random.get_state()  # noqa: NPY002 (the global RNG seed_everything seeds)
    state = {
        "step": step,
        "optimizer": scalars,
        "scheduler": scheduler.state_dict(),
        "rng": {
            "python": _jsonable(random.getstate()),
            "numpy": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]],
        },
        "extra": extra or {},
    }
    atomic_write_text(tmp / "trainer.json", json.dumps(state) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def checkpoints_by_step(directory: Path) -> dict[int, Path]:
    """The complete checkpoints in ``directory``, step -> folder, oldest first (temporary ones
    and folders that are not ``step-<number>`` are ignored)."""
    found = directory.glob(f"{CHECKPOINT_PREFIX}*") if directory.is_dir() else []
    steps = {int(p.name.removeprefix(CHECKPOINT_PREFIX)): p for p in found
             if p.name.removeprefix(CHECKPOINT_PREFIX).isdigit()}  # fmt: skip
    return dict(sorted(steps.items()))


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint in ``directory`` (temporary ones are ignored)."""
    found = checkpoints_by_step(directory)
    return found[max(found)] if found else None


def load_checkpoint(
    path: Path,
    policy: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[int, dict[str, Any]]:
    """Restore policy weights, optimizer, schedule and RNG states; return (step, extra)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    for name in ("policy", "trainer.safetensors", "trainer.json"):
        if not (path / name).exists():
            raise FileNotFoundError(f"{path} is not a complete checkpoint: {name} is missing")
    saved = type(policy).from_pretrained(path / "policy", device=policy.device)
    policy.load_state_dict(saved.state_dict())
    state = read_json_object(path / "trainer.json")
    try:
        tensors = load_file(str(path / "trainer.safetensors"))
        torch.set_rng_state(tensors.pop("rng.torch"))
        for name in [k for k in tensors if k.startswith("rng.cuda.")]:
            rng, device = tensors.pop(name), int(name.removeprefix("rng.cuda."))
            if torch.cuda.is_available() and device < torch.cuda.device_count():
                torch.cuda.set_rng_state(rng, device)
        optimizer.load_state_dict(_unflatten_optimizer(tensors, state["optimizer"]))
        scheduler.load_state_dict(state["scheduler"])
        version, internal, gauss = state["rng"]["python"]
        random.setstate((version, tuple(internal), gauss))
        name, keys, pos, has_gauss, cached = state["rng"]["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))  # noqa: NPY002
        return int(state["step"]), state["extra"]
    except (OSError, KeyError, TypeError, ValueError, RuntimeError, SafetensorError) as error:
        raise ValueError(f"{path}: trainer state does not fit this run ({error!r})") from None


def _flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Optimizer state -> (named tensors for safetensors, JSON-able rest)."""
    tensors, per_param = {}, {}
    for pid, values in state["state"].items():
        per_param[str(pid)] = {}
        for key, value in values.items():
            if torch.is_tensor(value):
                tensors[f"optim.{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                per_param[str(pid)][key] = value
    return tensors, {"param_groups": state["param_groups"], "state": per_param}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> dict:
    """Inverse of ``_flatten_optimizer``."""
    state: dict[int, dict[str, Any]] = {
        int(pid): dict(values) for pid, values in scalars["state"].items()
    }
    for name, tensor in tensors.items():
        _, pid, key = name.split(".", 2)
        state.setdefault(int(pid), {})[key] = tensor
    return {"state": state, "param_groups": scalars["param_groups"]}


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value
