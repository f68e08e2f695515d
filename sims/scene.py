"""Privileged read access to the tabletop scene: object poses, joint states and grasp predicates.

Tasks (stages, success) and scripted experts are written against this class, never against raw
MuJoCo indices, so both read the same facts the same way.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # MuJoCo itself is imported by the envs: task modules import this one cheaply
    import mujoco

ASSET = Path(__file__).parent / "assets" / "tabletop.xml"

BLOCKS = ("red", "blue", "yellow")
PLATES = ("green", "purple")
BUTTONS = ("red", "blue")

BLOCK_HALF = 0.02  # blocks are 4 cm cubes
PLATE_RADIUS = 0.05
FINGER_MAX = 0.04  # each finger travels 4 cm: the gripper opens to 8 cm
HANDLE_TO_HOOK = np.array([0.0, 0.024, -0.025])  # the gap behind the drawer handle, from the handle
CAP_HALF = 0.01
BUTTON_PRESSED = -0.01  # cap travel (m) that counts as a press


def xy_dist(a: np.ndarray, b: np.ndarray) -> float:
    """Horizontal distance between two points (math.hypot on floats: cheap in per-step code)."""
    return math.hypot(float(a[0] - b[0]), float(a[1] - b[1]))


class Scene:
    """Named views into one ``MjModel``/``MjData`` pair of the tabletop scene."""

    def __init__(self, model: mujoco.MjModel, data: mujoco.MjData) -> None:
        self.model, self.data = model, data
        # Views of MjData's buffers (MuJoCo updates them in place): cheaper than attribute lookups.
        self.qpos, self.mocap_pos = data.qpos, data.mocap_pos
        self.xpos, self.geom_xpos = data.xpos, data.geom_xpos
        body = lambda name: model.body(name).id  # noqa: E731
        joint = lambda name: model.joint(name).id  # noqa: E731
        geom = lambda name: model.geom(name).id  # noqa: E731

        self.arm_qpos = np.array([model.jnt_qposadr[joint(f"robot_{a}")] for a in "xyz"])
        assert np.array_equal(np.diff(self.arm_qpos), [1, 1]), "gantry joints must be consecutive"
        self.arm = slice(int(self.arm_qpos[0]), int(self.arm_qpos[0]) + 3)
        self.finger_qpos = np.array(
            [model.jnt_qposadr[joint("finger_left")], model.jnt_qposadr[joint("finger_right")]]
        )
        self._left, self._right = (int(i) for i in self.finger_qpos)
        self.block_body = {c: body(f"block_{c}") for c in BLOCKS}
        self.block_qpos = {c: model.jnt_qposadr[joint(f"block_{c}")] for c in BLOCKS}
        self.plate_mocap = {c: model.body_mocapid[body(f"plate_{c}")] for c in PLATES}
        self.cabinet_mocap = model.body_mocapid[body("cabinet")]
        self.drawer_qpos = model.jnt_qposadr[joint("drawer")]
        self.drawer_body = body("drawer")
        self.handle_geom = geom("drawer_handle")
        self.button_mocap = {c: model.body_mocapid[body(f"button_{c}")] for c in BUTTONS}
        self.button_qpos = {c: model.jnt_qposadr[joint(f"button_{c}")] for c in BUTTONS}
        self.cap_body = {c: body(f"button_{c}_cap") for c in BUTTONS}
        # Flat index arrays so the per-step privileged reads are single numpy gathers.
        self._block_xyz = np.array([[self.block_qpos[c] + i for i in range(3)] for c in BLOCKS])
        self._block_pose = np.array([[self.block_qpos[c] + i for i in range(7)] for c in BLOCKS])
        self._plate_ids = np.array([self.plate_mocap[c] for c in PLATES])
        self._static_ids = np.array(
            [*self._plate_ids, self.cabinet_mocap, *(self.button_mocap[c] for c in BUTTONS)]
        )
        self._cap_ids = np.array([self.cap_body[c] for c in BUTTONS])
        self._button_q = np.array([self.button_qpos[c] for c in BUTTONS])
        self.object_names = (
            [f"block_{c}" for c in BLOCKS]
            + [f"plate_{c}" for c in PLATES]
            + ["drawer_handle"]
            + [f"button_{c}" for c in BUTTONS]
        )

    # --- robot -------------------------------------------------------------------------------
    def ee_pos(self) -> np.ndarray:
        """Grip-site position (between the finger tips): the gantry joints are its coordinates."""
        return self.qpos[self.arm].copy()

    def gripper_gap(self) -> float:
        """Distance between the finger pads in metres (0 closed, 0.08 fully open)."""
        return float(self.qpos[self._left] + self.qpos[self._right])

    # --- objects -----------------------------------------------------------------------------
    def block_pos(self, color: str) -> np.ndarray:
        """Centre of a block in world coordinates."""
        adr = self.block_qpos[color]
        return self.qpos[adr : adr + 3].copy()

    def block_quat(self, color: str) -> np.ndarray:
        """Orientation quaternion (w, x, y, z) of a block."""
        adr = self.block_qpos[color]
        return self.qpos[adr + 3 : adr + 7].copy()

    def plate_pos(self, color: str) -> np.ndarray:
        """Centre of a goal plate on the table (z = 0)."""
        return self.mocap_pos[self.plate_mocap[color]].copy()

    def drawer_opening(self) -> float:
        """How far the drawer is pulled out, in metres (0 closed, 0.16 fully open)."""
        return float(self.qpos[self.drawer_qpos])

    def handle_pos(self) -> np.ndarray:
        """Centre of the drawer's bar handle."""
        return self.geom_xpos[self.handle_geom].copy()

    def hook_pos(self) -> np.ndarray:
        """Where the grip site goes to hook the handle: the gap between handle and drawer face."""
        return self.handle_pos() + HANDLE_TO_HOOK

    def button_press(self, color: str) -> float:
        """Cap displacement of a button (0 released, negative when pressed)."""
        return float(self.qpos[self.button_qpos[color]])

    def cap_top(self, color: str) -> np.ndarray:
        """Centre of the top face of a button's cap."""
        return self.xpos[self.cap_body[color]] + np.array([0.0, 0.0, CAP_HALF])

    # --- predicates --------------------------------------------------------------------------
    def grasped(self, color: str) -> bool:
        """A block is grasped when it sits between the finger pads and the fingers close on it.

        The pads sink up to ~7 mm per side into the block for a few steps when they close on it
        (soft contacts), so the lower bound on the gap is generous; a block between the pads keeps
        them well apart anyway.
        """
        block, ee = self.block_pos(color), self.ee_pos()
        gap = self.gripper_gap()
        return bool(
            xy_dist(block, ee) < 0.02
            and abs(block[2] - ee[2]) < 0.02
            and 2 * BLOCK_HALF - 0.016 < gap < 2 * BLOCK_HALF + 0.006
        )

    def resting_on_table(self, color: str) -> bool:
        """The block lies on the table (not lifted, not stacked)."""
        return bool(self.block_pos(color)[2] < BLOCK_HALF + 0.006)

    def object_positions(self) -> np.ndarray:
        """``float32 [N, 3]`` positions of ``object_names`` (privileged, for info and datasets)."""
        caps = self.xpos[self._cap_ids]
        caps[:, 2] += CAP_HALF
        return np.concatenate(
            [
                self.qpos[self._block_xyz],
                self.mocap_pos[self._plate_ids],
                self.geom_xpos[self.handle_geom][None],
                caps,
            ],
            dtype=np.float32,
        )

    def environment_state_names(self) -> list[str]:
        """One ``object.quantity`` name per ``environment_state`` value, in its order: what a
        dataset records as the feature's ``names`` and object-centric encoders group by."""
        pose = ("x", "y", "z", "qw", "qx", "qy", "qz")
        names = [f"block_{c}.{q}" for c in BLOCKS for q in pose]
        for body in [f"plate_{c}" for c in PLATES] + ["cabinet"]:
            names += [f"{body}.{q}" for q in "xyz"]
        names.append("drawer.opening")
        for c in BUTTONS:
            names += [f"button_{c}.{q}" for q in "xyz"]
        return names + [f"button_{c}.press" for c in BUTTONS]

    def environment_state(self) -> np.ndarray:
        """Flat privileged state for state-based baselines (39 values): block poses, plate,
        cabinet and button positions, drawer opening, button presses."""
        return np.concatenate(
            [
                self.qpos[self._block_pose].ravel(),
                self.mocap_pos[self._static_ids[:3]].ravel(),
                self.qpos[self.drawer_qpos, None],
                self.mocap_pos[self._static_ids[3:]].ravel(),
                self.qpos[self._button_q],
            ],
            dtype=np.float32,
        )
