"""Offscreen MuJoCo rendering for every simulator wrapper: fast CPU defaults, one lazy GL context
per process that every renderer shares, and one MuJoCo render context that the renderers of
models with the same assets share."""

from __future__ import annotations

import atexit
import hashlib
import os
import threading
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


_OPEN: weakref.WeakSet[CameraRenderer] = weakref.WeakSet()  # renderers holding GL resources
_CONTEXTS: dict[tuple[int, int], mujoco.GLContext] = {}  # (process, thread) -> its shared context
# (process, thread, asset digest) -> [MuJoCo render context, renderers using it]
_ASSETS: dict[tuple[int, int, bytes], list] = {}
_exit_hook: list[bool] = []  # [True] once ``_close_open`` is registered to run at exit
MIN_GEOM = 1_000  # a scene's first capacity (it doubles when a frame fills it)


def _close_open() -> None:
    """Release every open renderer's GL resources, then the shared contexts (at exit)."""
    for renderer in list(_OPEN):
        renderer.close()
    for key in [k for k in _ASSETS if k[0] == os.getpid()]:  # none once every renderer closed
        _ASSETS.pop(key)[0].free()
    for key in [k for k in _CONTEXTS if k[0] == os.getpid()]:
        _CONTEXTS.pop(key).free()


def shared_context() -> mujoco.GLContext:
    """The GL context every renderer of this process and thread draws in, made current.

    One context, not one per renderer: with software OpenGL a fresh context costs ~0.15 s before
    its first frame and switching between contexts ~5 ms a frame, where a renderer's own MuJoCo
    context (its framebuffer, textures and meshes) in a shared one costs ~10 ms to make. Keyed
    by process too, so a forked worker makes its own instead of using its parent's.
    """
    key = (os.getpid(), threading.get_ident())
    context = _CONTEXTS.get(key)
    if context is None:
        context = _CONTEXTS[key] = mujoco.GLContext(64, 64)  # renders go to MuJoCo's framebuffer
        # Free GL resources at exit before EGL is torn down under them: exit handlers run
        # last-registered first and MuJoCo registers EGL's teardown with its first context, so a
        # handler registered after that runs first. A weakref.finalize alone runs after it
        # whenever some finalizer existed before the first context (importing torch makes one),
        # and then prints EGL errors.
        if not _exit_hook:
            atexit.register(_close_open)
            _exit_hook.append(True)
    context.make_current()
    return context


class CameraRenderer:
    """Renders named cameras of one model at one resolution, in the process's shared context.

    GL resources are made on the first ``render`` call, in the process that renders, so an env
    built in a parent process can be forked into vector-env workers safely.
    """

    def __init__(self, model: mujoco.MjModel, height: int, width: int) -> None:
        self.model, self.height, self.width = model, int(height), int(width)
        if self.width > model.vis.global_.offwidth or self.height > model.vis.global_.offheight:
            model.vis.global_.offwidth = max(self.width, model.vis.global_.offwidth)
            model.vis.global_.offheight = max(self.height, model.vis.global_.offheight)
        self._context: mujoco.MjrContext | None = None
        self._finalizer: weakref.finalize | None = None
        self._scene = self._camera = self._rect = None
        self._option = mujoco.MjvOption()

    def _open(self) -> None:
        """A scene, and MuJoCo's render context for this model's assets in the shared GL context
        (made by the first renderer of such a model in this process and thread)."""
        # mujoco.Renderer's 10,000 geoms take ~25-100 ms to allocate; a scene that fills grows
        self._scene = mujoco.MjvScene(self.model, maxgeom=max(MIN_GEOM, 2 * self.model.ngeom))
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self._rect = mujoco.MjrRect(0, 0, self.width, self.height)
        key = (os.getpid(), threading.get_ident(), asset_digest(self.model))
        shared = _ASSETS.get(key)
        if shared is None:
            context = mujoco.MjrContext(self.model, mujoco.mjtFontScale.mjFONTSCALE_150)
            shared = _ASSETS[key] = [context, 0]
        shared[1] += 1
        self._context = shared[0]
        self._finalizer = weakref.finalize(self, _release, key)
        self._finalizer.atexit = False  # _close_open frees it, before EGL's teardown
        _OPEN.add(self)

    def render(
        self, data: mujoco.MjData, camera: str | int, rotate_180: bool = False
    ) -> np.ndarray:
        """Return an ``uint8 [H, W, 3]`` image of ``camera`` for the current state of ``data``;
        ``rotate_180`` turns it upside down (for a camera whose up axis points at the floor)."""
        shared_context()
        if self._context is None:
            self._open()
        camera_id = camera
        if isinstance(camera, str):
            camera_id = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if not 0 <= camera_id < self.model.ncam:
            names = [self.model.camera(i).name for i in range(self.model.ncam)]
            raise ValueError(f"camera {camera!r} is not in the model; it has {names}")
        self._camera.fixedcamid = camera_id
        self._update_scene(data)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self._context)
        mujoco.mjr_render(self._rect, self._scene, self._context)
        image = np.empty((self.height, self.width, 3), dtype=np.uint8)
        mujoco.mjr_readPixels(image, None, self._rect, self._context)
        # OpenGL's rows run bottom-up, so the upright image flips the rows and the rotated one
        # the columns. One copy, not a negative-stride view (torch.from_numpy and LeRobot's
        # observation preprocessing refuse those).
        return np.ascontiguousarray(image[:, ::-1] if rotate_180 else image[::-1])

    def _update_scene(self, data: mujoco.MjData) -> None:
        """The scene of ``data`` from the camera; a full scene (geoms left out) grows and is made
        again, so no frame ever misses a geom."""
        while True:
            mujoco.mjv_updateScene(
                self.model, data, self._option, None, self._camera, mujoco.mjtCatBit.mjCAT_ALL,
                self._scene,
            )  # fmt: skip
            if self._scene.ngeom < self._scene.maxgeom:
                return
            self._scene = mujoco.MjvScene(self.model, maxgeom=2 * self._scene.maxgeom)

    def close(self) -> None:
        """Release the GL resources (safe to call twice)."""
        if self._finalizer is not None:
            self._finalizer()
        _OPEN.discard(self)
        self._context, self._finalizer = None, None


def _release(key: tuple[int, int, bytes]) -> None:
    """A renderer is done with the MuJoCo context under ``key``: the last one frees it, in the
    shared GL context of the process that made it."""
    shared = _ASSETS.get(key)
    if shared is None or os.getpid() != key[0]:
        return
    shared[1] -= 1
    if shared[1] == 0:
        del _ASSETS[key]
        shared_context()
        shared[0].free()


# What MuJoCo's render context copies from a model: textures, material texture maps, meshes,
# height fields, skins and flexes (their buffers), and the visual settings and statistics that
# size its framebuffers, shadows, fog and built-in shapes.
_ASSET_PREFIXES = ("tex_", "mat_tex", "mesh_", "hfield_", "skin_", "flex_")
_VISUAL = ("global_", "quality", "headlight", "map", "scale", "rgba")


def asset_digest(model: mujoco.MjModel) -> bytes:
    """A digest of what a MuJoCo render context takes from ``model``: renderers of models that
    agree on it (the sub-envs of a vector env) draw with one context. Each context holds the
    model's meshes, textures and a framebuffer; one per Meta-World env was ~36 MB of a 64 px
    env's ~44 MB of rendering memory."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(dir(model)):
        if name.startswith(_ASSET_PREFIXES):
            value = getattr(model, name)
            if isinstance(value, np.ndarray):
                h.update(name.encode())
                h.update(str(value.shape).encode())
                h.update(np.ascontiguousarray(value).tobytes())
    for name in _VISUAL:
        h.update(repr(getattr(model.vis, name)).encode())
    h.update(repr(model.stat).encode())
    return h.digest()
