"""Tests for embodied.core.run and .io: run directories, metrics, seeding, atomic writes."""

from __future__ import annotations

import io
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from embodied.core.config import load_config
from embodied.core.io import atomic_open, atomic_write_bytes, atomic_write_text
from embodied.core.run import MetricsLogger, RunDir, progress_bar, read_metrics, seed_everything


@dataclass
class Train:
    lr: float = 1e-3
    steps: int = 10


@dataclass
class Cfg:
    train: Train = field(default_factory=Train)
    seed: int = 0


def test_run_dir_names_are_unique_on_collision(tmp_path: Path) -> None:
    first = RunDir.create(tmp_path, "exp", timestamp=False)
    second = RunDir.create(tmp_path, "exp", timestamp=False)
    third = RunDir.create(tmp_path, "exp", timestamp=False)
    assert [first.path.name, second.path.name, third.path.name] == ["exp", "exp-1", "exp-2"]
    assert all(run.path.is_dir() for run in (first, second, third))


def test_run_dir_timestamped_name(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "runs", "demo")
    assert run.path.parent == tmp_path / "runs"
    prefix, date, clock = run.path.name.split("-")[:3]
    assert prefix == "demo" and len(date) == 8 and len(clock) == 6


def test_run_dir_writes_reloadable_config(tmp_path: Path) -> None:
    cfg = load_config(Cfg, overrides=["train.lr=0.25", "seed=4"])
    run = RunDir.create(tmp_path, "cfg", config=cfg, timestamp=False)
    assert run.file("config.yaml") == run.path / "config.yaml" == run / "config.yaml"
    assert load_config(Cfg, run.config_path) == cfg


def test_checkpoints_dir_is_created_lazily(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "ckpt", timestamp=False)
    assert not (run.path / "checkpoints").exists()
    assert run.checkpoints == run.path / "checkpoints"
    assert run.checkpoints.is_dir()


def test_run_name_with_separator_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        RunDir.create(tmp_path, "a/b")


def test_metrics_logger_writes_valid_jsonl_and_tensorboard(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "m", timestamp=False)
    with run.metrics() as logger:
        logger.log({"loss": 0.5, "count": np.int64(3)}, step=0)
        logger.log({"loss": float("nan"), "reward": float("inf")}, step=1)

    lines = run.metrics_path.read_text().splitlines()
    assert len(lines) == 2
    rows = [json.loads(line) for line in lines]  # strict JSON: NaN would not be valid
    assert "NaN" not in lines[1] and "Infinity" not in lines[1]
    assert rows[0]["step"] == 0 and rows[0]["loss"] == 0.5 and rows[0]["count"] == 3
    assert rows[1]["loss"] is None and rows[1]["reward"] is None
    assert isinstance(rows[1]["time"], float)
    assert read_metrics(run.path) == rows == read_metrics(run.metrics_path)
    assert list(run.path.glob("events.out.tfevents.*"))


def test_metrics_logger_without_tensorboard_appends(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log({"a": 1}, step=0)
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        logger.log({"a": 2}, step=1)
    assert [row["a"] for row in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def test_metrics_logger_rejects_bad_input(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, tensorboard=False) as logger:
        with pytest.raises(TypeError):
            logger.log({"a": "text"}, step=0)
        with pytest.raises(ValueError):
            logger.log({"step": 1.0}, step=0)
    with pytest.raises(RuntimeError):
        logger.log({"a": 1.0}, step=1)


def test_read_metrics_skips_a_cut_off_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "lo')
    assert read_metrics(path) == [{"step": 0, "loss": 1.0}]


def test_seed_everything_repeats_draws() -> None:
    torch = pytest.importorskip("torch")

    def draw() -> tuple[float, float, list[float]]:
        numpy_draw = float(np.random.rand())  # noqa: NPY002 - the global generator is the point
        return random.random(), numpy_draw, torch.rand(3).tolist()

    seed_everything(123)
    first = draw()
    seed_everything(123)
    assert draw() == first
    seed_everything(124)
    assert draw() != first


def test_progress_is_quiet_without_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a TTY, like a CI log
    monkeypatch.delenv("EMBODIED_PROGRESS", raising=False)
    with progress_bar(range(3), desc="quiet") as bar:
        assert bar.disable
        assert list(bar) == [0, 1, 2]
    monkeypatch.setenv("EMBODIED_PROGRESS", "1")
    with progress_bar(total=2, desc="forced") as bar:
        assert not bar.disable
    monkeypatch.setenv("EMBODIED_PROGRESS", "0")
    with progress_bar(total=2, desc="off") as bar:
        assert bar.disable
    with progress_bar(total=2, desc="explicit", disable=False) as bar:
        assert not bar.disable


def test_atomic_open_replaces_on_success(tmp_path: Path) -> None:
    target = tmp_path / "file.txt"
    target.write_text("old")
    with atomic_open(target) as f:
        f.write("new")
        assert target.read_text() == "old"  # untouched until the block ends
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["file.txt"]


def test_atomic_open_leaves_nothing_when_body_raises(tmp_path: Path) -> None:
    target = tmp_path / "file.txt"
    with pytest.raises(RuntimeError), atomic_open(target) as f:
        f.write("partial")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_open_keeps_old_file_when_body_raises(tmp_path: Path) -> None:
    target = tmp_path / "file.bin"
    atomic_write_bytes(target, b"old")
    with pytest.raises(RuntimeError), atomic_open(target, "wb") as f:
        f.write(b"new")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]


def test_atomic_write_text(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "t.txt", "héllo")
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "héllo"
