"""``TabletopEnv``: the built-in MuJoCo manipulation suite as a Gymnasium environment.

Actions follow Meta-World's 4-D convention in [-1, 1]: a Cartesian end-effector delta (scaled by
``action_scale`` metres) and a gripper command (-1 open, +1 close). The end-effector setpoint is
the *measured* position plus the delta, so a zero action holds the arm still and there is no hidden
controller state: the observation is the whole robot state.

Observations follow LeRobot's gym-env convention: ``pixels`` (the ``front`` camera's image, or a
dict per named camera) and ``agent_pos`` (grip-site xyz, gripper gap); ``obs_mode="state"`` replaces
pixels by the privileged ``environment_state`` and ``"pixels_state"`` gives all three.
``goal_state=True`` appends what the instruction names, as Meta-World's observations do: the
position of the object to act on (the task's first target body) and of the point the task is about
(``goal_pos``: the plate, the spot on the base block, the cap), values ``goal.object_x ..
goal.target_z``. It serves state policies that read no language (LeRobot's diffusion policy).

``render_state=True`` adds ``info["render_state"]`` at the reset and every step: the kinematic
state (joint positions, mocap poses) that the step's camera images show, so ``render_state_image``
re-renders them exactly later without rendering every step (``embodied.sims.replay``).

``render_images`` (an attribute, True by default) set to False makes the next ``step`` skip its
camera images: they come back black. A rollout clears it before the steps no policy reads (a
diffusion planner reads one observation in ``n_action_steps``); each step sets it back to True, so
every other step and every reset renders.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np

from embodied.core.features import GOAL_PREFIX
from embodied.sims.conventions import (
    BlowUpDetector,
    EpisodeGuard,
    PhysicsCopies,
    action_space,
    check_options,
    checked_action,
    checked_cameras,
    image_shape,
    kinematic_state,
    observation_space,
    pixels_observation,
)
from embodied.sims.registry import get_task
from embodied.sims.render import CameraRenderer, set_render_quality
from embodied.sims.scene import ASSET, BLOCKS, BUTTONS, FINGER_MAX, PLATES, Scene
from embodied.sims.tasks.base import Evaluation, Task

CAMERAS = ("front", "wrist")
DEFAULT_CAMERA = "front"  # its single image is ``observation.image``; other cameras keep names
DEFAULT_IMAGE_SIZE = 96  # camera pixels per side unless image_size says otherwise
# goal_state's values: the object to act on, then the point the task is about.
GOAL_NAMES = [f"{GOAL_PREFIX}{what}_{q}" for what in ("object", "target") for q in "xyz"]
WORKSPACE_LOW = np.array([-0.3, -0.28, 0.015])
WORKSPACE_HIGH = np.array([0.3, 0.28, 0.3])
TABLE_FORCE_LIMIT = 10.0  # newtons: robot-table contacts above this count as collisions

# Object classes for the per-step collision count.
_OTHER, _ROBOT, _TABLE, _TARGET, _OBSTACLE = range(5)


class TabletopEnv(gym.Env):
    """One task of the tabletop suite. Create it with ``gymnasium.make("embodied/<Task>-v0")``."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 16}

    def __init__(
        self,
        task: str | Task = "PickPlace",
        obs_mode: str = "pixels",
        cameras: Sequence[str] = (DEFAULT_CAMERA,),
        image_size: int | Sequence[int] = DEFAULT_IMAGE_SIZE,
        render_mode: str | None = "rgb_array",
        fast_render: bool = True,
        frame_skip: int = 5,
        action_scale: float = 0.02,
        terminate_on_success: bool = True,
        goal_cycle: bool = False,
        goal_state: bool = False,
        render_state: bool = False,
    ) -> None:
        if isinstance(task, str):
            task = get_task(task)()
        check_options(obs_mode, render_mode)
        if goal_state and obs_mode == "pixels":
            raise ValueError(
                "goal_state=True adds the goal to environment_state, which obs_mode='pixels' "
                "does not give; use obs_mode='state' or 'pixels_state'"
            )
        cameras = checked_cameras(cameras, CAMERAS)
        height, width = image_shape(image_size)

        self.task, self.obs_mode, self.cameras = task, obs_mode, cameras
        self.render_mode, self.frame_skip, self.action_scale = render_mode, frame_skip, action_scale
        self.terminate_on_success = terminate_on_success
        # Seed s -> layout of seed s // G with goal s % G (G goals): consecutive seeds show one
        # scene with every goal, so demonstrations only differ by what the instruction asks.
        self.goal_cycle = goal_cycle
        self.goal_state = goal_state
        self.render_state = render_state
        self.render_images = True  # False: the next step's camera images are black (see above)

        self.model = mujoco.MjModel.from_xml_path(str(ASSET))
        set_render_quality(self.model, fast=fast_render)
        self.data = mujoco.MjData(self.model)
        self._copies = PhysicsCopies(self.model)  # render_state_image's
        self.scene = Scene(self.model, self.data)
        self._renderer = CameraRenderer(self.model, height, width)
        self._blow_up = BlowUpDetector(self.model, self.data, frame_skip)
        self._guard = EpisodeGuard()
        self._ctrl = self.data.ctrl  # a view of MjData's buffer
        self._geom_class = self._classify_geoms()
        self._robot_geom = self._geom_class == _ROBOT

        self.action_space = action_space()
        state_dim = len(self.scene.environment_state()) + len(GOAL_NAMES) * goal_state
        self.observation_space = observation_space(
            obs_mode, cameras, height, width, state_dim, DEFAULT_CAMERA
        )

        self.goal: dict[str, str] = {}
        self.instruction = ""
        self._steps = 0

    # --- Gymnasium API -----------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Draw a scene layout, goal and instruction from ``seed`` (same seed, same episode)."""
        goal = (options or {}).get("goal")
        if self.goal_cycle and seed is not None and goal is None:
            goals = self.task.all_goals()
            seed, goal = seed // len(goals), goals[seed % len(goals)]
        super().reset(seed=seed)
        rng = self.np_random
        mujoco.mj_resetData(self.model, self.data)
        self.goal = dict(goal) if goal is not None else self.task.sample_goal(rng)
        if self.goal not in self.task.all_goals():
            raise ValueError(
                f"goal {self.goal} is not a goal of {self.task.name}; "
                f"valid goals: {self.task.all_goals()}"
            )
        for _ in range(100):
            self._place_objects(rng)
            if self.task.layout_ok(self.scene, self.goal):
                break
        self.instruction = self.task.instruction(self.goal, rng)
        if self.goal_state:  # its object is fixed for the episode: look it up once, not per step
            bodies = self.task.target_bodies(self.goal)
            if not bodies:
                raise ValueError(f"goal_state=True: {self.task.name} names no target body")
            self._goal_body = self.model.body(bodies[0]).id
        self._mark_targets()
        self.task.on_reset(self.scene, self.goal)
        mujoco.mj_forward(self.model, self.data)
        self._steps = 0
        self._guard.update(terminated=False, truncated=False)
        evaluation = self.task.evaluate(self.scene, self.goal)
        info = self._info(evaluation, collisions=0)
        if self.render_state:
            info["render_state"] = kinematic_state(self.data)
        return self._observation(evaluation), info

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Apply one 4-D action for ``frame_skip`` physics steps."""
        self._guard.check()
        action = checked_action(action)
        render, self.render_images = self.render_images, True

        ctrl = self._ctrl
        setpoint = self.scene.qpos[self.scene.arm] + action[:3] * self.action_scale
        ctrl[:3] = np.minimum(np.maximum(setpoint, WORKSPACE_LOW), WORKSPACE_HIGH)
        ctrl[3:5] = FINGER_MAX * (1.0 - float(action[3])) / 2.0
        self._blow_up.before_step()
        shown = None
        if self.render_state:
            # MuJoCo's step computes positions before it integrates, so the images show the
            # state before the last substep: record that one (the steps are the same).
            if self.frame_skip > 1:
                mujoco.mj_step(self.model, self.data, self.frame_skip - 1)
            shown = kinematic_state(self.data)
            mujoco.mj_step(self.model, self.data, 1)
        else:
            mujoco.mj_step(self.model, self.data, self.frame_skip)
        self._steps += 1

        error = self._blow_up.error(self._steps)
        if error is not None:
            # MuJoCo has already reset the state; end the episode and say why.
            evaluation = self.task.evaluate(self.scene, self.goal)
            info = self._info(evaluation, collisions=0)
            info["success"] = False
            info["error"] = error
            self._guard.update(terminated=False, truncated=True)
            if self.render_state:  # MuJoCo reset the state: the images show the reset one
                info["render_state"] = kinematic_state(self.data)
            return self._observation(evaluation, render), 0.0, False, True, info

        evaluation = self.task.evaluate(self.scene, self.goal)
        reward = float(evaluation.success)
        terminated = bool(evaluation.success and self.terminate_on_success)
        self._guard.update(terminated, truncated=False)
        info = self._info(evaluation, collisions=self._count_collisions())
        if shown is not None:
            info["render_state"] = shown
        return self._observation(evaluation, render), reward, terminated, False, info

    @property
    def feature_names(self) -> dict[str, list[str]]:
        """Names of the values of each state observation (what datasets record as ``names``)."""
        return {
            "agent_pos": ["ee.x", "ee.y", "ee.z", "gripper.gap"],
            "environment_state": self.scene.environment_state_names()
            + (GOAL_NAMES if self.goal_state else []),
        }

    def render(self) -> np.ndarray | None:
        """The first camera's image (``render_mode="rgb_array"``)."""
        if self.render_mode is None:
            return None
        return self._renderer.render(self.data, self.cameras[0])

    def render_state_image(self, state: np.ndarray, camera: str | None = None) -> np.ndarray:
        """``camera``'s image (default: the first camera's) of a ``render_state`` recorded in this
        episode (after the same reset: the layout and colours come from the seed), rendered from
        a scratch copy of the physics so the episode's own state is untouched."""
        camera = self.cameras[0] if camera is None else camera
        return self._renderer.render(self._copies.pose(state), camera)

    def close(self) -> None:
        """Release the renderer's GL context."""
        self._renderer.close()

    # --- scripted expert hook (runs inside vector-env workers via ``call``) ------------------
    def scripted_action(self, goal: dict[str, str] | None = None) -> np.ndarray:
        """The scripted expert's action for the current state (privileged information).

        ``goal`` overrides the episode's goal: the expert then follows a different instruction.
        The task's command is a displacement in metres; dividing by ``action_scale`` and clipping
        gives full speed when far and an exact stop on the target when close.
        """
        command = self.task.expert(self.scene, self.goal if goal is None else goal)
        command[:3] /= self.action_scale
        return np.clip(command, -1.0, 1.0).astype(np.float32)

    # --- internals -----------------------------------------------------------------------------
    def _observation(self, evaluation: Evaluation, render: bool = True) -> dict[str, Any]:
        scene = self.scene
        agent_pos = np.empty(4, dtype=np.float32)
        agent_pos[:3], agent_pos[3] = scene.ee_pos(), scene.gripper_gap()
        obs: dict[str, Any] = {"agent_pos": agent_pos}
        if self.obs_mode != "state":
            if render:
                images = {c: self._renderer.render(self.data, c) for c in self.cameras}
            else:
                shape = (self._renderer.height, self._renderer.width, 3)
                images = {c: np.zeros(shape, dtype=np.uint8) for c in self.cameras}
            obs["pixels"] = pixels_observation(images, DEFAULT_CAMERA)
        if self.obs_mode != "pixels":
            state = scene.environment_state()
            if self.goal_state:
                goal = [self.data.xpos[self._goal_body], evaluation.goal_pos]
                state = np.concatenate([state, *goal], dtype=np.float32)
            obs["environment_state"] = state
        return obs

    def _info(self, evaluation, collisions: int) -> dict[str, Any]:
        scene = self.scene
        return {
            "success": evaluation.success,
            "stage": evaluation.stage,
            "stage_name": self.task.stages[evaluation.stage],
            # Coarse privileged progress: completed stages (and success) over the stage count.
            "progress": np.float32((evaluation.stage + evaluation.success) / len(self.task.stages)),
            "collisions": collisions,
            "ee_pos": np.asarray(scene.qpos[scene.arm], dtype=np.float32),
            "gripper_gap": np.float32(scene.gripper_gap()),
            "object_pos": scene.object_positions(),
            "goal_pos": evaluation.goal_pos.astype(np.float32),
            "instruction": self.instruction,
            "task": self.task.name,
        }

    def _place_objects(self, rng: np.random.Generator) -> None:
        """Randomise the layout: cabinet and buttons at the back, blocks and plates in front."""
        scene, data = self.scene, self.data
        cabinet_x = rng.uniform(-0.24, -0.14)
        data.mocap_pos[scene.cabinet_mocap] = (cabinet_x, 0.2, 0.0)

        left = rng.uniform(0.08, 0.14)
        xs = (left, left + rng.uniform(0.1, 0.13))
        order = rng.permutation(len(BUTTONS))
        for x, i in zip(xs, order, strict=True):
            data.mocap_pos[scene.button_mocap[BUTTONS[i]]] = (x, rng.uniform(0.16, 0.22), 0.0)

        # Keep-out boxes (x_min, x_max, y_min, y_max): cabinet (and its opening path), buttons.
        # Blocks stay out of the back strip, so a pusher always has room behind them.
        drawer_front = -0.15 if self.task.keep_clear_of_drawer_path else -0.06
        keep_out = [(cabinet_x - 0.12, cabinet_x + 0.12, drawer_front, 1.0)]
        placed: list[np.ndarray] = []

        def sample(min_dist: float) -> np.ndarray:
            for _ in range(1000):
                xy = rng.uniform((-0.25, -0.2), (0.25, 0.04))
                if any(x0 < xy[0] < x1 and y0 < xy[1] < y1 for x0, x1, y0, y1 in keep_out):
                    continue
                if all(np.linalg.norm(xy - p) >= min_dist for p in placed):
                    placed.append(xy)
                    return xy
            raise RuntimeError("could not place the tabletop objects without overlap")

        for color in PLATES:
            data.mocap_pos[scene.plate_mocap[color]] = (*sample(0.11), 0.0)
        for color in BLOCKS:
            x, y = sample(0.09)
            yaw = rng.uniform(-0.4, 0.4)
            adr = scene.block_qpos[color]
            data.qpos[adr : adr + 7] = (x, y, 0.02, math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2))

        start = rng.uniform((-0.1, -0.26, 0.15), (0.1, -0.18, 0.22))
        data.qpos[scene.arm] = start
        data.qpos[scene.finger_qpos] = FINGER_MAX
        data.ctrl[:3], data.ctrl[3:5] = start, FINGER_MAX

    def _classify_geoms(self) -> np.ndarray:
        model = self.model
        classes = np.full(model.ngeom, _OTHER, dtype=np.int8)
        for g in range(model.ngeom):
            name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_GEOM, g) or ""
            if name.startswith("robot_"):
                classes[g] = _ROBOT
            elif name == "table":
                classes[g] = _TABLE
        return classes

    def _mark_targets(self) -> None:
        """Tag every non-robot, non-table geom as target or obstacle for this episode's goal."""
        model, targets = self.model, set(self.task.target_bodies(self.goal))
        for g in range(model.ngeom):
            if self._geom_class[g] in (_ROBOT, _TABLE):
                continue
            body = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, model.geom_bodyid[g])
            self._geom_class[g] = _TARGET if body in targets else _OBSTACLE

    def _count_collisions(self) -> int:
        """Unwanted robot contacts now: any non-target object, or the table above a force limit."""
        data = self.data
        if data.ncon == 0:
            return 0
        pairs = data.contact.geom[: data.ncon]
        if not self._robot_geom[pairs].any():  # the common case: the robot touches nothing
            return 0
        classes = self._geom_class[pairs]
        robot = classes == _ROBOT
        involves_robot = robot[:, 0] ^ robot[:, 1]
        other = np.where(robot[:, 0], classes[:, 1], classes[:, 0])
        bad = involves_robot & (other == _OBSTACLE)
        count = len(np.unique(pairs[bad], axis=0)) if bad.any() else 0
        force = np.zeros(6)
        for i in np.flatnonzero(involves_robot & (other == _TABLE)):
            mujoco.mj_contactForce(self.model, data, int(i), force)
            if force[0] > TABLE_FORCE_LIMIT:
                count += 1
        return count
