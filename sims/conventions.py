"""What every simulator wrapper shares: observation spaces, action checks, blow-up detection.

One place for LeRobot's gym-env observation convention (``pixels`` + ``agent_pos`` [+
``environment_state``]), Meta-World's 4-D action convention, and MuJoCo's failure signals, so the
tabletop suite and the Meta-World adapter behave the same way on good and bad input.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np
from gymnasium import spaces

OBS_MODES = ("pixels", "state", "pixels_state")
ACTION_DIM = 4  # dx, dy, dz (end effector), gripper
# MuJoCo warnings raised (with an automatic reset of the state) when the simulation blows up;
# they are consecutive in mjtWarning, so one slice of the counters reads them all.
_BAD_STATE = ("mjWARN_BADQPOS", "mjWARN_BADQVEL", "mjWARN_BADQACC")
_FIRST_BAD = int(mujoco.mjtWarning.mjWARN_BADQPOS)
assert [int(getattr(mujoco.mjtWarning, n)) for n in _BAD_STATE] == [
    _FIRST_BAD + i for i in range(3)
]


def image_shape(image_size: int | tuple[int, int]) -> tuple[int, int]:
    """(height, width) from an int (square) or a pair."""
    return (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)


def check_options(obs_mode: str, render_mode: str | None) -> None:
    """Reject an unknown ``obs_mode`` or ``render_mode`` with a message naming the valid ones."""
    if obs_mode not in OBS_MODES:
        raise ValueError(f"obs_mode must be one of {OBS_MODES}, got {obs_mode!r}")
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")


def observation_space(
    obs_mode: str, cameras: tuple[str, ...], height: int, width: int, state_dim: int
) -> spaces.Dict:
    """``pixels`` (one image, or a dict per camera), ``agent_pos`` (ee xyz + gripper) and, for
    the state modes, the privileged ``environment_state``."""
    obs_spaces: dict[str, spaces.Space] = {
        "agent_pos": spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
    }
    if obs_mode in ("pixels", "pixels_state"):
        image = spaces.Box(0, 255, shape=(height, width, 3), dtype=np.uint8)
        obs_spaces["pixels"] = (
            image if len(cameras) == 1 else spaces.Dict({c: image for c in cameras})
        )
    if obs_mode in ("state", "pixels_state"):
        obs_spaces["environment_state"] = spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)
    return spaces.Dict(obs_spaces)


def action_space() -> spaces.Box:
    """Meta-World's action convention: 4 values in [-1, 1]."""
    return spaces.Box(-1.0, 1.0, shape=(ACTION_DIM,), dtype=np.float32)


def checked_action(action: np.ndarray) -> np.ndarray:
    """The action as float64 clipped to [-1, 1]; wrong shape or NaN/inf is a ValueError."""
    action = np.asarray(action, dtype=np.float64)
    if action.shape != (ACTION_DIM,):
        raise ValueError(
            f"action must have shape (4,) [dx, dy, dz, gripper], got shape {action.shape}"
        )
    if not np.isfinite(action).all():
        raise ValueError(f"action has non-finite values: {action.tolist()}")
    # np.minimum/np.maximum rather than np.clip: same result, a fraction of the overhead.
    return np.minimum(np.maximum(action, -1.0), 1.0)


class BlowUpDetector:
    """Detects a physics blow-up across one env step.

    MuJoCo resets the state by itself on NaN or huge accelerations and counts a warning. A reset
    shows as simulation time going back, except in the first step after an episode starts, so
    the warning counters (which survive the reset) are compared too.
    """

    def __init__(self, model: mujoco.MjModel, data: mujoco.MjData, substeps: int) -> None:
        self.data = data
        self._counters = data.warning.number  # a view: MuJoCo updates it in place
        self._half_step = 0.5 * model.opt.timestep * substeps
        self._time = 0.0
        self._warnings = self._counts()

    def _counts(self) -> list[int]:
        return self._counters[_FIRST_BAD : _FIRST_BAD + 3].tolist()

    def before_step(self) -> None:
        """Remember the clock and the warning counters."""
        self._time, self._warnings = self.data.time, self._counts()

    def error(self, step: int) -> str | None:
        """After the step: ``None``, or a message saying what went wrong at ``step``."""
        counts = self._counts()
        if (
            self.data.time >= self._time + self._half_step
            and counts == self._warnings
            and math.isfinite(self.data.qpos.sum())
        ):
            return None
        hits = [n for n, a, b in zip(_BAD_STATE, counts, self._warnings, strict=True) if a > b]
        return f"physics instability at step {step} ({', '.join(hits) or 'non-finite state'})"
