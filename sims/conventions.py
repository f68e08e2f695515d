"""What every simulator wrapper shares: observation spaces, action checks, blow-up detection.

One place for LeRobot's gym-env observation convention (``pixels`` + ``agent_pos`` [+
``environment_state``]), Meta-World's 4-D action convention, and MuJoCo's failure signals, so the
tabletop suite and the Meta-World adapter behave the same way on good and bad input.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np
from gymnasium import spaces
from gymnasium.error import ResetNeeded

OBS_MODES = ("pixels", "state", "pixels_state")
ACTION_DIM = 4  # dx, dy, dz (end effector), gripper
IMAGE_SIZE_RANGE = (8, 4096)  # pixels per side: smaller says nothing, larger exhausts GL buffers
# MuJoCo warnings raised (with an automatic reset of the state) when the simulation blows up;
# they are consecutive in mjtWarning, so one slice of the counters reads them all.
_BAD_STATE = ("mjWARN_BADQPOS", "mjWARN_BADQVEL", "mjWARN_BADQACC")
_FIRST_BAD = int(mujoco.mjtWarning.mjWARN_BADQPOS)
assert [int(getattr(mujoco.mjtWarning, n)) for n in _BAD_STATE] == [
    _FIRST_BAD + i for i in range(3)
]


def image_shape(image_size: int | Sequence[int]) -> tuple[int, int]:
    """(height, width) from an int (square) or a (height, width) pair, each in IMAGE_SIZE_RANGE."""
    low, high = IMAGE_SIZE_RANGE
    if _is_int(image_size):
        sides: tuple[Any, ...] = (image_size, image_size)
    elif isinstance(image_size, Sequence) and not isinstance(image_size, str):
        sides = tuple(image_size)
    else:
        sides = ()
    if len(sides) != 2 or not all(_is_int(s) and low <= s <= high for s in sides):
        raise ValueError(
            f"image_size must be an int or a (height, width) pair of ints in [{low}, {high}] "
            f"pixels, got {image_size!r}"
        )
    return int(sides[0]), int(sides[1])


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def checked_cameras(cameras: Sequence[str], available: Sequence[str]) -> tuple[str, ...]:
    """The camera names as a tuple; a plain string, no camera, an unknown name or a repeated one
    is a ValueError naming the available cameras."""
    problem = None
    if isinstance(cameras, str) or not isinstance(cameras, Sequence):
        problem = f"a list of names is needed (one camera: [{cameras!r}])"
    elif not cameras:
        problem = "no camera given"
    elif unknown := [c for c in cameras if c not in available]:
        problem = f"unknown: {unknown}"
    elif repeated := sorted({c for c in cameras if list(cameras).count(c) > 1}):
        problem = f"repeated: {repeated}"
    if problem is not None:
        raise ValueError(
            f"cameras must be a list of distinct names from {list(available)}, "
            f"got {cameras!r} ({problem})"
        )
    return tuple(cameras)


def check_options(obs_mode: str, render_mode: str | None) -> None:
    """Reject an unknown ``obs_mode`` or ``render_mode`` with a message naming the valid ones."""
    if obs_mode not in OBS_MODES:
        raise ValueError(f"obs_mode must be one of {OBS_MODES}, got {obs_mode!r}")
    if render_mode not in (None, "rgb_array"):
        raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")


def named_pixels(cameras: tuple[str, ...], default: str) -> bool:
    """Whether ``pixels`` is a dict per camera: always but for the env's default camera alone,
    whose one image is LeRobot's ``observation.image``. Any other camera keeps its name
    (``observation.images.<name>``), so a dataset says which camera it saw and a policy trained
    on it is given that camera, not the default."""
    return cameras != (default,)


def pixels_observation(images: dict[str, np.ndarray], default: str) -> Any:
    """``pixels`` from the rendered ``images`` (camera -> image, in the env's camera order)."""
    return images if named_pixels(tuple(images), default) else images[default]


def observation_space(
    obs_mode: str,
    cameras: tuple[str, ...],
    height: int,
    width: int,
    state_dim: int,
    default_camera: str,
) -> spaces.Dict:
    """``pixels`` (the default camera's image, or a dict per camera: ``named_pixels``),
    ``agent_pos`` (ee xyz + gripper) and, for the state modes, the privileged
    ``environment_state``."""
    obs_spaces: dict[str, spaces.Space] = {
        "agent_pos": spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float32)
    }
    if obs_mode in ("pixels", "pixels_state"):
        image = spaces.Box(0, 255, shape=(height, width, 3), dtype=np.uint8)
        obs_spaces["pixels"] = (
            spaces.Dict({c: image for c in cameras})
            if named_pixels(cameras, default_camera)
            else image
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


class EpisodeGuard:
    """Gymnasium's order rule on the bare env: no step before ``reset()`` or after the episode
    ended. Gymnasium's OrderEnforcing wrapper covers the first only; a step after the end would
    run on from a terminal state and report it as part of a finished episode."""

    def __init__(self) -> None:
        self._why: str | None = "before calling env.reset()"

    def check(self) -> None:
        """Raise ``gymnasium.error.ResetNeeded`` when ``step`` may not be called now."""
        if self._why is not None:
            raise ResetNeeded(f"Cannot call env.step() {self._why}; call env.reset() first")

    def update(self, terminated: bool, truncated: bool) -> None:
        """After ``reset`` (both False) or ``step``: remember whether the episode has ended."""
        ended = "terminated" if terminated else "truncated" if truncated else None
        self._why = ended and f"after the episode ended ({ended}=True)"


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


def kinematic_state(data: mujoco.MjData) -> np.ndarray:
    """Joint positions and mocap poses: what a scene's camera images show during an episode (a
    ``render_state``; ``pose_kinematic_state`` puts one back)."""
    return np.concatenate([data.qpos, data.mocap_pos.ravel(), data.mocap_quat.ravel()])


class PhysicsCopies:
    """Scratch copies of an env's physics, one per name, each posed at a recorded kinematic state
    to render it while the episode's own physics stays untouched."""

    def __init__(self, model: mujoco.MjModel) -> None:
        self.model = model
        self._copies: dict[str, mujoco.MjData] = {}

    def pose(self, state: np.ndarray, name: str = "replay") -> mujoco.MjData:
        """Copy ``name`` (made on first use) set to ``state``, positions computed."""
        if name not in self._copies:
            self._copies[name] = mujoco.MjData(self.model)
        pose_kinematic_state(self.model, self._copies[name], state)
        return self._copies[name]


def pose_kinematic_state(model: mujoco.MjModel, data: mujoco.MjData, state: np.ndarray) -> None:
    """Set ``data`` (a scratch copy, after the episode's reset) to a recorded
    ``kinematic_state`` and compute its positions, ready to render; ValueError naming both
    sizes when the state is not one of this model's."""
    nq, nmocap = model.nq, model.nmocap
    state = np.asarray(state, dtype=np.float64)
    if state.shape != (nq + 7 * nmocap,):
        raise ValueError(f"a render_state has {nq + 7 * nmocap} values, got {state.shape}")
    data.qpos[:] = state[:nq]
    data.mocap_pos[:] = state[nq : nq + 3 * nmocap].reshape(nmocap, 3)
    data.mocap_quat[:] = state[nq + 3 * nmocap :].reshape(nmocap, 4)
    mujoco.mj_forward(model, data)
