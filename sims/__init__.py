"""Simulators: the built-in MuJoCo tabletop suite, a Meta-World adapter, vector envs.

Importing this package registers the Gymnasium ids ``embodied/<Task>-v0`` (and
``embodied/MetaWorld-v0``) without importing MuJoCo; environments are built on ``gymnasium.make``.
"""

from __future__ import annotations

import os

# Headless machines have no display: EGL (Mesa's software EGL on a CPU) works everywhere and
# MuJoCo reads this variable when it is first imported. A user's explicit choice wins.
if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
    os.environ.setdefault("MUJOCO_GL", "egl")

from embodied.sims.registry import (  # noqa: E402
    TABLETOP_TASKS,
    list_tasks,
    make,
    make_expert,
    suite_of,
    task_id,
)
from embodied.sims.vector import grouped_seeds, make_vec_env  # noqa: E402

__all__ = [
    "TABLETOP_TASKS",
    "grouped_seeds",
    "list_tasks",
    "make",
    "make_expert",
    "make_vec_env",
    "suite_of",
    "task_id",
]
