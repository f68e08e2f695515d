"""Simulators: the built-in MuJoCo tabletop suite, a Meta-World adapter, vector envs.

Importing this package registers the built-in tabletop tasks (one module each in
``embodied.sims.tasks``) with their Gymnasium ids ``embodied/<Task>-v0`` (and
``embodied/MetaWorld-v0``) without importing MuJoCo; environments are built on ``gymnasium.make``.
A task of one's own is a ``Task`` subclass decorated with ``register_task``.
"""

from __future__ import annotations

import os

# Headless machines have no display: EGL (Mesa's software EGL on a CPU) works everywhere and
# MuJoCo reads this variable when it is first imported. A user's explicit choice wins.
if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
    os.environ.setdefault("MUJOCO_GL", "egl")

from embodied.sims.registry import (  # noqa: E402
    check_env_options,
    episode_limit,
    list_tasks,
    make,
    make_expert,
    register_task,
    suite_of,
    task_id,
    task_stages,
    unregister_task,
)
from embodied.sims.replay import (  # noqa: E402
    ReplayFrames,
    attach_replay_frames,
    skips_unread_images,
    supports_render_state,
)
from embodied.sims.tasks.base import Task  # noqa: E402
from embodied.sims.vector import (  # noqa: E402
    enter_worker,
    grouped_seeds,
    make_vec_env,
    render_envs,
    task_module,
)
from embodied.sims.workers import (  # noqa: E402
    WorkerPool,
    start_forkserver_without_sigint,
    worker_context,
)

# isort: split
# Importing a task module registers its task; this order is ``list_tasks()``'s (easiest first).
from embodied.sims.tasks import reach, push, pick_place, stack, drawer_open, button_press  # noqa: E402, F401, I001

__all__ = [
    "ReplayFrames",
    "Task",
    "WorkerPool",
    "attach_replay_frames",
    "check_env_options",
    "enter_worker",
    "episode_limit",
    "grouped_seeds",
    "list_tasks",
    "make",
    "make_expert",
    "make_vec_env",
    "register_task",
    "render_envs",
    "start_forkserver_without_sigint",
    "suite_of",
    "skips_unread_images",
    "supports_render_state",
    "task_id",
    "task_stages",
    "task_module",
    "unregister_task",
    "worker_context",
]
