"""Weight averaging of a run's checkpoints: ``embodied average RUN --first K``.

The policy saved is the uniform mean of the policies the run checkpointed from step ``first`` to
step ``last`` (stochastic weight averaging's tail average, Izmailov et al. 2018, computed by
``torch.optim.swa_utils.AveragedModel``). Where a run's last steps walk noisily around what it
has learned, their average sits nearer the walk's centre than the last step does; where the run
still improves, the average trails it, so compare both. Checkpoints every step (``save_every=1``)
average every iteration; training is untouched, so any range can be averaged after the run.
Parameters are averaged; buffers (normalisation statistics, counters) come from the last one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

from torch.optim.swa_utils import AveragedModel

from embodied.policies import Policy
from embodied.train.checkpoints import checkpoints_by_step


def checkpoint_steps(run: str | os.PathLike[str]) -> dict[int, Path]:
    """The complete checkpoints of a run directory (temporary ones ignored), step -> folder; a
    folder that is not a run with checkpoints is an error naming it."""
    folder = Path(run) / "checkpoints"
    if not folder.is_dir():
        raise FileNotFoundError(f"{run} is not a run directory with checkpoints (no {folder})")
    return checkpoints_by_step(folder)


def average_policies(directories: Sequence[Path]) -> Policy:
    """The uniform mean of the saved policies in ``directories`` (same type and config, or an
    error naming the first one that differs and its differing keys)."""
    if not directories:
        raise ValueError("no policies to average")
    first = Policy.from_pretrained(directories[0])
    config = _config(first)
    averaged = AveragedModel(first)
    averaged.update_parameters(first)
    for directory in directories[1:]:
        policy = Policy.from_pretrained(directory)
        other = _config(policy)
        if other != config:
            keys = sorted(k for k in config.keys() | other.keys() if config.get(k) != other.get(k))
            raise ValueError(
                f"{directory} is not the policy of {directories[0]} (config differs in {keys}): "
                "only one policy's checkpoints can be averaged"
            )
        averaged.update_parameters(policy)
    return averaged.module


def average_run(
    run: str | os.PathLike[str],
    first: int = 1,
    last: int | None = None,
    out: str | os.PathLike[str] | None = None,
) -> tuple[Path, list[int]]:
    """Save the mean of the policies ``run`` checkpointed at steps ``first..last`` (inclusive;
    ``last`` None: the newest) to ``out`` (default ``RUN/policy-average-FIRST-LAST``); return
    that folder and the steps averaged."""
    found = checkpoint_steps(run)
    end = max(found, default=0) if last is None else last
    steps = [step for step in found if first <= step <= end]
    if not steps:
        raise ValueError(
            f"{run} has no checkpoint at steps {first}..{end} (it has {list(found) or 'none'})"
        )
    policy = average_policies([found[step] / "policy" for step in steps])
    folder = Path(out) if out else Path(run) / f"policy-average-{steps[0]}-{steps[-1]}"
    policy.save_pretrained(folder)
    return folder, steps


def _config(policy: Policy) -> dict:
    """A policy's type and config values, as its ``config.json`` holds them."""
    return {"policy_type": policy.policy_type, **dataclasses.asdict(policy.config)}
