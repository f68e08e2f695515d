"""Run directories, seeding, metric logging and progress bars: the bookkeeping every job shares.

A run lives in its own directory, ``runs/<name>-<YYYYmmdd-HHMMSS>/``, holding the resolved
``config.yaml``, ``metrics.jsonl`` (one JSON object per logged step), TensorBoard event files,
``checkpoints/`` and whatever report the job writes.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import random
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from embodied.core.config import save_config

__all__ = ["MetricsLogger", "RunDir", "progress_bar", "read_metrics", "seed_everything"]

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (if installed) to repeat runs.

    Deterministic torch kernels are not forced (``torch.use_deterministic_algorithms``): they are
    slower and some ops lack them; turn them on yourself when you need bit-exact GPU runs.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - code that uses the global generator relies on this
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(seed)  # also seeds every CUDA device


class RunDir:
    """One run's output directory: config, metrics, TensorBoard events, checkpoints, report."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Wrap an existing run directory (use ``RunDir.create`` to make a new one)."""
        self.path = Path(path)

    @classmethod
    def create(
        cls,
        root: str | os.PathLike[str] = "runs",
        name: str = "demo",
        config: Any = None,
        timestamp: bool = True,
    ) -> RunDir:
        """Make ``root/<name>-<YYYYmmdd-HHMMSS>`` (``-1``, ``-2``... if taken); save ``config``."""
        if not name or "/" in name or os.sep in name:
            raise ValueError(f"run name must be a non-empty name without path separators: {name!r}")
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        base = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}" if timestamp else name
        path = root / base
        suffix = 0
        while True:
            try:
                path.mkdir()  # fails if it exists, so two jobs never share a directory
                break
            except FileExistsError:
                suffix += 1
                path = root / f"{base}-{suffix}"
        run = cls(path)
        if config is not None:
            save_config(config, run.config_path)
        return run

    def file(self, name: str) -> Path:
        """Path of a file inside the run directory (not created)."""
        return self.path / name

    def __truediv__(self, name: str) -> Path:
        """``run / "report.md"`` is ``run.file("report.md")``."""
        return self.file(name)

    @property
    def config_path(self) -> Path:
        """Path of the resolved ``config.yaml``."""
        return self.path / CONFIG_FILE

    @property
    def metrics_path(self) -> Path:
        """Path of ``metrics.jsonl``."""
        return self.path / METRICS_FILE

    @property
    def checkpoints(self) -> Path:
        """The ``checkpoints/`` subdirectory, created on first use."""
        directory = self.path / CHECKPOINTS_DIR
        directory.mkdir(exist_ok=True)
        return directory

    def metrics(self, tensorboard: bool = True) -> MetricsLogger:
        """Open a ``MetricsLogger`` writing into this run directory."""
        return MetricsLogger(self.path, tensorboard=tensorboard)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"


class MetricsLogger:
    """Append scalar metrics to ``metrics.jsonl`` and TensorBoard; use as a context manager."""

    def __init__(
        self, directory: str | os.PathLike[str] | RunDir, tensorboard: bool = True
    ) -> None:
        """Log into ``directory`` (created if needed); ``tensorboard=False`` writes only JSONL."""
        if isinstance(directory, RunDir):
            directory = directory.path
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / METRICS_FILE
        self.tensorboard = tensorboard
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._writer: Any = None  # SummaryWriter, created on the first log (importing it is slow)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record scalar ``metrics`` at ``step``; NaN/inf are null in JSON, raw in TensorBoard."""
        if self._file.closed:
            raise RuntimeError(f"MetricsLogger for {self.path} is closed")
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise TypeError(f"step must be an int, got {step!r}")
        values = {key: _scalar(key, value) for key, value in metrics.items()}

        record: dict[str, Any] = {"step": int(step), "time": time.time()}
        for key, value in values.items():
            if key in record:
                raise ValueError(f"metric name {key!r} is reserved")
            finite = isinstance(value, int) or math.isfinite(value)
            record[key] = value if finite else None
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

        if self.tensorboard:
            writer = self._tensorboard_writer()
            for key, value in values.items():
                writer.add_scalar(key, value, int(step))

    def flush(self) -> None:
        """Push buffered TensorBoard events to disk (the JSONL file is flushed on every log)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Close the JSONL file and the TensorBoard writer; safe to call twice."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._file.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _tensorboard_writer(self) -> Any:
        """Create the SummaryWriter on first use; its event files go in the run directory."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.directory))
        return self._writer


def _scalar(key: Any, value: Any) -> int | float:
    """Turn a metric into a Python int or float (bools, NumPy scalars, 1-element tensors too)."""
    if not isinstance(key, str):
        raise TypeError(f"metric names must be strings, got {key!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {key!r} must be a number, got {value!r}") from None


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` file (or the one in a run directory) into a list of dicts.

    A cut-off last line (the job was killed mid-write) is skipped; other bad lines raise.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: invalid JSON line: {error}") from None
    return records


def progress_bar(
    iterable: Iterable[Any] | None = None,
    total: int | None = None,
    desc: str | None = None,
    disable: bool | None = None,
    **kwargs: Any,
) -> tqdm:
    """A tqdm progress bar that stays quiet in CI logs.

    Unless ``disable`` is given, the bar shows when stderr is a terminal, inside Jupyter, or when
    ``EMBODIED_PROGRESS=1``; ``EMBODIED_PROGRESS=0`` hides it everywhere.
    """
    if disable is None:
        disable = not _progress_wanted()
    return tqdm(iterable, total=total, desc=desc, disable=disable, **kwargs)


def _progress_wanted() -> bool:
    """Decide whether progress bars should be drawn in this process."""
    setting = os.environ.get("EMBODIED_PROGRESS")
    if setting == "1":
        return True
    if setting == "0":
        return False
    if "ipykernel" in sys.modules:  # a notebook: stderr is not a TTY but tqdm.auto draws a widget
        return True
    stderr = sys.stderr
    return stderr is not None and hasattr(stderr, "isatty") and stderr.isatty()
