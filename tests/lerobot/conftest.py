"""Set-up of the LeRobot interop tests (``make test-lerobot``): the real LeRobot 0.6 reads and
appends to the toolkit's datasets, the toolkit reads LeRobot's, and policies cross over.

Datasets of every kind the toolkit writes are made once per session from tabletop rollouts
(short expert episodes at 48 px, 65 px for the odd size); tests copy one before changing it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from lerobot_helpers import KINDS, write_kind

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the Hub
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(scope="session")
def toolkit_datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One toolkit dataset of every kind, written once (copy before changing one)."""
    base = tmp_path_factory.mktemp("toolkit")
    return {kind: write_kind(base / kind, kind) for kind in KINDS}


@pytest.fixture
def copy_of(toolkit_datasets: dict[str, Path], tmp_path: Path):
    """``copy_of(kind)``: a private copy of a session dataset."""

    def copy(kind: str) -> Path:
        return Path(shutil.copytree(toolkit_datasets[kind], tmp_path / kind))

    return copy
