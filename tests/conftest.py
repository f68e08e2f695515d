"""Shared pytest setup."""

from __future__ import annotations

import os

import pytest

# Headless offscreen rendering: MuJoCo reads MUJOCO_GL when it is first imported, so this must run
# before any test module imports mujoco (a user's explicit choice wins).
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: tiny convolutions and transformers run fastest that way,
    and results do not depend on the thread count. Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
