"""Offscreen MuJoCo rendering for every simulator wrapper: fast CPU defaults, lazy GL contexts."""

from __future__ import annotations

import atexit
import weakref

import mujoco
import numpy as np


def set_render_quality(model: mujoco.MjModel, fast: bool = True) -> None:
    """Configure a model for fast CPU rendering (no shadow maps, no multisampling, coarse meshes).

    Shadow maps and multisampling dominate render cost with software OpenGL (a 128x128 frame goes
    from ~30 ms to ~1 ms). ``fast=False`` restores MuJoCo's defaults for pretty videos.
    """
    quality = model.vis.quality
    if fast:
        quality.shadowsize, quality.offsamples = 0, 0
        quality.numslices, quality.numstacks, quality.numquads = 12, 6, 1
    else:
        quality.shadowsize, quality.offsamples = 4096, 4
        quality.numslices, quality.numstacks, quality.numquads = 28, 16, 4
    model.light_castshadow[:] = not fast


_OPEN: weakref.WeakSet[CameraRenderer] = weakref.WeakSet()  # renderers holding a GL context
_exit_hook: list[bool] = []  # [True] once ``_close_open`` is registered to run at exit


def _close_open() -> None:
    """Release every open renderer's GL context (at interpreter exit)."""
    for renderer in list(_OPEN):
        renderer.close()


class CameraRenderer:
    """Renders named cameras of one model at one resolution.

    The GL context is created on the first ``render`` call, in the process that renders, so an env
    built in a parent process can be forked into vector-env workers safely.
    """

    def __init__(self, model: mujoco.MjModel, height: int, width: int) -> None:
        self.model, self.height, self.width = model, int(height), int(width)
        if self.width > model.vis.global_.offwidth or self.height > model.vis.global_.offheight:
            model.vis.global_.offwidth = max(self.width, model.vis.global_.offwidth)
            model.vis.global_.offheight = max(self.height, model.vis.global_.offheight)
        self._renderer: mujoco.Renderer | None = None
        self._finalizer: weakref.finalize | None = None

    def render(self, data: mujoco.MjData, camera: str | int) -> np.ndarray:
        """Return an ``uint8 [H, W, 3]`` image of ``camera`` for the current state of ``data``."""
        if self._renderer is None:
            self._renderer = mujoco.Renderer(self.model, self.height, self.width)
            # Free the GL context when the renderer is collected, and at exit before EGL is torn
            # down under it: exit handlers run last-registered first and MuJoCo registers EGL's
            # teardown with its first context, so a handler registered after that runs first. A
            # weakref.finalize alone runs after it whenever some finalizer existed before the
            # first context (importing torch makes one), and then prints EGL errors.
            self._finalizer = weakref.finalize(self, self._renderer.close)
            self._finalizer.atexit = False
            _OPEN.add(self)
            if not _exit_hook:
                atexit.register(_close_open)
                _exit_hook.append(True)
        self._renderer.update_scene(data, camera)
        return self._renderer.render()

    def close(self) -> None:
        """Release the GL context (safe to call twice)."""
        if self._finalizer is not None:
            self._finalizer()
        _OPEN.discard(self)
        self._renderer, self._finalizer = None, None
