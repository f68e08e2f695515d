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
