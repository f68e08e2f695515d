"""The shared offscreen renderer (``embodied.sims.render``)."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import weakref
weakref.finalize(weakref, print)  # a finalizer before any GL context, as importing torch makes
import embodied.sims as sims
envs = [sims.make("Reach", image_size=16) for _ in range(2)]
for env in envs:
    env.reset(seed=0)  # renders: each env holds a GL context, and none is closed
print("done")
"""


def test_open_renderers_are_released_cleanly_at_exit() -> None:
    """Envs left open at exit free their GL contexts before EGL is torn down (no EGL errors)."""
    env = {**os.environ, "MUJOCO_GL": "egl"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr
    assert "Error" not in result.stderr, result.stderr


def test_replayed_frames_are_the_frames_the_rollout_showed() -> None:
    """A rollout that records render states instead of images re-renders any of its frames
    later, pixel for pixel, and only the ones read."""
    import numpy as np

    import embodied.sims as sims
    from embodied.rollout.episodes import rollout_vector

    kwargs = {"obs_mode": "pixels_state", "image_size": 32, "render_state": True}
    vec = sims.make_vec_env("DrawerOpen", 2, autoreset_mode="disabled", **kwargs)
    try:
        expert = lambda obs: np.stack(vec.call("scripted_action"))  # noqa: E731
        trajs = list(rollout_vector(vec, expert, [4, 5, 6], "tabletop"))
    finally:
        vec.close()
    sims.attach_replay_frames(trajs, "DrawerOpen", kwargs)
    for traj in trajs:
        shown = traj.observations["pixels"]
        assert isinstance(traj.frames, sims.ReplayFrames) and len(traj.frames) == len(shown)
        replayed = traj.frames[np.arange(len(shown))]
        assert replayed.dtype == np.uint8 and traj.frames.shape == shown.shape
        np.testing.assert_array_equal(replayed, shown)
        np.testing.assert_array_equal(traj.frames[len(shown) // 2], shown[len(shown) // 2])
