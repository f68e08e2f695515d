"""The training loop every job shares (bc, reward, grpo, tpo); each algorithm's own file keeps
its formulas and calls these pieces in order:

    device = begin(cfg)                 # check the config, seed every generator, pick the device
    model = ...                         # built after seeding, so its init repeats
    with Trainer(cfg, model, "steps") as trainer:  # run dir, optimiser, resume
        for step in trainer.steps():    # from where a resumed run stopped
            trainer.update(loss, f"BC loss at step {step}")  # NaN stop, clip, step
            if trainer.due(step + 1, cfg.save_every): trainer.save(step + 1)

``Trainer`` opens a new run directory or, with ``cfg.resume``, an existing one of the same job whose
settings match (a changed setting is an error naming it; where the run writes, the device and
the resume path itself may change) and restores its newest readable checkpoint, falling back past a
corrupt one with a warning. Under a constant schedule the run's length may change too: nothing
learned before a step depends on how many follow, so a finished run can be extended.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch

from embodied.core.config import ConfigError, config_to_dict, load_config, save_config, validate
from embodied.core.run import CONFIG_FILE, MetricsLogger, RunDir, progress_bar, seed_everything
from embodied.policies import Policy
from embodied.train.checkpoints import (
    checkpoints_by_step,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from embodied.train.optim import make_optimizer

# Settings a resumed run may change: where and on what it runs, not what it learns.
MAY_CHANGE_ON_RESUME = ("resume", "out", "name", "device")


def begin(cfg: Any, exact_float32: bool = False) -> torch.device:
    """Check ``cfg`` (``embodied.core.config.validate``), seed every generator, resolve the
    device: what every job does before it builds anything.

    ``exact_float32`` (the RL jobs): on CUDA, convolutions run in full float32 rather than
    cuDNN's default TF32. A policy's log-probs at sampling and at recomputation (other batch
    shapes, other kernels) must agree to ~1e-3; TF32's 10-bit mantissa moved a pixel planner's
    ratio by 0.04 before any update. Matrix products are full float32 by torch's default."""
    validate(cfg)
    seed_everything(cfg.seed)
    device = resolve_device(cfg.device)
    if exact_float32 and device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = False
    return device


def resolve_device(device: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; anything else is passed to torch. ValueError
    naming the setting for a device torch does not know or this machine does not have."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device={device!r} is not a device: {error}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}, but CUDA is not available here (use auto or cpu)")
    return resolved


def load_policy(path: str, overrides: dict[str, Any], device: torch.device) -> Any:
    """A saved policy to train on (GRPO, TPO, BC's ``init_policy``), with ``overrides`` applied
    to its config (weights unchanged); an override its config lacks is an error naming it."""
    policy = Policy.from_pretrained(path).with_overrides(overrides)
    return policy.to(device)


def open_run(cfg: Any, length: str, recorded: Any) -> tuple[RunDir, bool]:
    """A new run directory for ``cfg`` (saving ``recorded``, the settings as trained), or the one
    ``cfg.resume`` names after checking that it is a run of the same job with the same settings,
    except for its ``length`` (the setting counting its steps) under a constant schedule; and
    whether that length changed."""
    if not cfg.resume:
        return RunDir.create(cfg.out, cfg.name, config=recorded), False
    path = Path(cfg.resume)
    if not (path / CONFIG_FILE).is_file():
        raise ValueError(f"resume={cfg.resume!r} is not a run directory (no {CONFIG_FILE})")
    try:
        saved = config_to_dict(load_config(type(cfg), path / CONFIG_FILE))
    except ConfigError as error:
        raise ValueError(
            f"resume={cfg.resume!r} is not a run of this job ({type(cfg).__name__}): {error}"
        ) from None
    now = config_to_dict(recorded)
    changed = [key for key in _changed(saved, now) if key.split(".")[0] not in MAY_CHANGE_ON_RESUME]
    # The learning rate at a step depends on the run's length only under a cosine schedule.
    extended = changed == [length] and cfg.optim.schedule == "constant"
    if changed and not extended:
        shown = ", ".join(f"{k} ({_get(saved, k)!r} -> {_get(now, k)!r})" for k in changed)
        if length in changed:
            shown += f" ({length} may change only under optim.schedule=constant)"
        raise ValueError(
            f"resume={cfg.resume!r} was run with other settings: {shown}; resume with the run's "
            f"own settings (its {CONFIG_FILE}) or start a new run"
        )
    return RunDir(path), extended


def _changed(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two nested dicts."""
    keys = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            keys += _changed(x, y, f"{prefix}{key}.")
        elif x != y:
            keys.append(prefix + key)
    return keys


def _get(tree: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


class Trainer:
    """A job's run directory, optimiser and schedule, resume, checkpoints and metrics (see the
    module docstring). ``length`` names the setting that counts the steps (or iterations, rounds)
    the schedule spans: ``total``. The config's ``max_minutes`` (> 0) ends the run earlier, after
    the last step expected to finish within that many minutes of this process: ``end`` is then
    that step's count."""

    def __init__(self, cfg: Any, model: Any, length: str, recorded: Any = None) -> None:
        self.cfg, self.model, self.total = cfg, model, int(getattr(cfg, length))
        self.optimizer, self.scheduler = make_optimizer(model.parameters(), cfg.optim, self.total)
        recorded = cfg if recorded is None else recorded
        self.run, extended = open_run(cfg, length, recorded)
        self.extra: dict[str, Any] = {}  # an engine's own state (JSON), saved in each checkpoint
        self.start = self.restore() if cfg.resume else 0
        if extended:
            if self.start > self.total:
                raise ValueError(
                    f"resume={cfg.resume!r} has a checkpoint at step {self.start}, past "
                    f"{length}={self.total}; resume with {length} >= {self.start}"
                )
            save_config(recorded, self.run.config_path)
        self.metrics: MetricsLogger = self.run.metrics()
        self.end = self.total
        minutes = float(cfg.max_minutes)
        self._deadline = time.monotonic() + 60.0 * minutes if minutes > 0 else None

    def restore(self) -> int:
        """Load the newest readable checkpoint (older ones if the newest is corrupt, with a
        warning) and its ``extra``; return its step (0 when there is none)."""
        found = list(reversed(checkpoints_by_step(self.run.checkpoints).values()))
        for path in found:
            try:
                step, self.extra = load_checkpoint(path, self.model, self.optimizer, self.scheduler)
                return step
            except (OSError, ValueError, KeyError, json.JSONDecodeError) as error:
                warnings.warn(f"checkpoint {path} is unreadable ({error}); trying an older one",
                              stacklevel=2)  # fmt: skip
        if found:
            raise ValueError(f"no readable checkpoint in {self.run.checkpoints}")
        return 0

    def steps(self, desc: str = "") -> Iterator[int]:
        """The remaining steps, with a progress bar. Under ``max_minutes``, a step is the last
        when another of the mean length so far would end past the budget (``end``, where
        ``due`` logs, evaluates and saves as at the schedule's end)."""
        remaining = range(self.start, self.total)
        bar = progress_bar(remaining, total=len(remaining), desc=desc or self.run.path.name)
        began = time.monotonic()
        for done, step in enumerate(bar):
            now = time.monotonic()
            budget = self._deadline
            if budget is not None and done and now + 2 * (now - began) / done > budget:
                self.end = step + 1
            yield step
            if step + 1 >= self.end:
                break
        bar.close()
        if self.end < self.total:
            minutes = float(self.cfg.max_minutes)
            print(f"max_minutes={minutes:g}: stopped after step {self.end} of {self.total}",
                  file=sys.stderr)  # fmt: skip

    def due(self, done: int, every: int) -> bool:
        """Whether a thing done every ``every`` steps is due after ``done`` (always at the end;
        ``every`` 0: only there)."""
        return (every > 0 and done % every == 0) or done == self.end

    def update(self, loss: torch.Tensor, where: str, step_schedule: bool = True) -> float:
        """One clipped gradient step on ``loss``; the gradient norm before clipping. A non-finite
        loss stops the run, saying ``where`` and which checkpoint is the last good one."""
        if not torch.isfinite(loss):
            last = self.last_checkpoint()
            raise FloatingPointError(f"non-finite {where}; the last good checkpoint is {last}")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.max_grad_norm)
        self.optimizer.step()
        if step_schedule:
            self.scheduler.step()
        return float(norm)

    def step_schedule(self) -> None:
        """Advance the schedule by one iteration, also one that took no update (nothing to learn
        from still uses its place in the schedule; torch's warning about it is not the user's)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step")
            self.scheduler.step()

    def save(self, step: int) -> Path:
        """A checkpoint of the model, optimiser, schedule, RNG states and ``extra`` at ``step``."""
        return save_checkpoint(
            self.run.checkpoints, step, self.model, self.optimizer, self.scheduler, self.extra
        )

    def last_checkpoint(self) -> Path | None:
        """The newest checkpoint written so far."""
        return latest_checkpoint(self.run.checkpoints)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.metrics.close()


def batch_indices(num_items: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Indices of the batch for ``step``: a pure function of (seed, step), so a resumed run sees
    exactly the batches the uninterrupted run would have seen."""
    return np.random.default_rng([seed, step]).integers(0, num_items, size=batch_size)


def collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack tensors and keep lists of strings/ints (torch's default collate)."""
    return torch.utils.data.default_collate(items)


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Move every tensor of a batch to ``device``."""
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def load_batch(windows: Any, indices: Any, device: torch.device) -> dict[str, Any]:
    """The items ``indices`` of a dataset of windows (e.g. ``BCDataset``), collated onto
    ``device``: a BC step's batch, and the GRPO anchor's."""
    return to_device(collate([windows[int(i)] for i in indices]), device)
