"""Shared pytest setup."""

from __future__ import annotations

import os

# Headless offscreen rendering: MuJoCo reads MUJOCO_GL when it is first imported, so this must run
# before any test module imports mujoco (a user's explicit choice wins).
os.environ.setdefault("MUJOCO_GL", "egl")
