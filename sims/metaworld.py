"""``MetaWorldEnv``: one Meta-World v3 task behind the same interface as ``TabletopEnv``.

Meta-World (``pip install 'embodied-toolkit[metaworld]'``) is imported lazily, so importing this
module is cheap and works without it. The adapter builds the task the way Meta-World's MT1
benchmark does (``metaworld.MT1``: one env class, 50 sampled goals, goal visible in the state) and
adds what the toolkit needs on top:

- Seeding: MT1 draws its 50 goals (object and goal positions) from a benchmark seed. A reset seed
  ``s`` picks goal ``s % 50`` of ``MT1(task, seed=s // 50)``, so the same seed always gives the
  same initial state, seeds 0-49 are exactly the MT1 goal set of benchmark seed 0, and larger seeds
  keep giving new goals. An unseeded reset picks one of those 50 goals from the env's generator,
  like Meta-World's own random task selection.
- Observations follow LeRobot's gym-env convention: ``pixels`` (the ``corner2`` camera's image,
  or a dict per named camera), ``agent_pos`` (hand xyz, gripper opening in [0, 1]) and, for
  ``obs_mode="state"`` or ``"pixels_state"``, ``environment_state`` (Meta-World's raw 39-d
  observation).
- Images come from our fast offscreen renderer (no shadows, no multisampling, lazy GL context),
  which for Meta-World also drops mirror reflections and renders coarser meshes where the camera
  cannot resolve the difference (``speed_up_rendering``; ``fast_render=False`` keeps Meta-World's
  look). Meta-World's ``corner`` cameras look at the scene upside down; their images are rotated by
  180 degrees (both axes flipped, which keeps left and right correct) so they come out upright.
- Ordered subtask stages (``info["stage"]``, ``info["stage_name"]``, ``env.stages``) and coarse
  privileged progress ``(stage + success) / len(stages)``, as in the tabletop suite, from the rules
  in ``embodied.sims.metaworld_stages`` (every MT10 task has its own; others a default).
- ``render_state=True`` and ``render_images``, as in the tabletop suite: ``info["render_state"]``
  (joint positions and mocap poses) at the reset and every step, ``render_state_image`` to render
  one later, and ``render_images = False`` for one black step (rollouts skip the images no policy
  reads; ``embodied.sims.replay`` renders the others on demand).
- Rewards are Meta-World's own shaped rewards (0-10). Like Meta-World, an episode never terminates;
  it is truncated at Meta-World's max path length (500), or at ``max_path_length``
  (``embodied.sims.make(..., max_episode_steps=N)`` passes N there).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.sims import conventions
from embodied.sims.meshes import pixel_footprint, simplify_meshes
from embodied.sims.metaworld_stages import MT10, StageInputs, stage_rule
from embodied.sims.render import CameraRenderer, set_render_quality

DEFAULT_CAMERA = "corner2"  # Meta-World's own: its single image is ``observation.image``
GOALS_PER_BENCHMARK = 50  # MT1 samples this many goals per benchmark seed
PRESETS: dict[str, tuple[str, ...]] = {"MT10": MT10}  # benchmark task lists, by upper-case name
# Fast rendering (``speed_up_rendering``): mesh detail in pixels at the nearest the robot comes to
# a fixed camera, bounded by the hand's workspace box less this margin for the arm's links (over
# expert episodes of MT10 tasks the arm stayed 0.64-1.3 m from the fixed cameras, the bound gives
# 0.21-0.92 m), and at least MIN_DISTANCE metres.
MESH_DETAIL = 1.0
LINK_MARGIN = 0.25
MIN_DISTANCE = 0.2
# Cameras whose up axis points at the floor (verified by rendering): rotate their images 180 deg.
UPSIDE_DOWN_CAMERAS = frozenset({"corner", "corner2", "corner3", "corner4"})
INSTALL_HINT = "Meta-World is not installed: pip install 'embodied-toolkit[metaworld]'"

# Hand-written instructions for the common tasks; other tasks get one built from their name.
INSTRUCTIONS: dict[str, str] = {
    "reach-v3": "reach the goal position",
    "reach-wall-v3": "reach the goal position behind the wall",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck around the wall to the goal",
    "push-back-v3": "push the puck back to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "pick-place-wall-v3": "pick up the puck and place it at the goal over the wall",
    "door-open-v3": "open the door",
    "door-close-v3": "close the door",
    "door-lock-v3": "lock the door",
    "door-unlock-v3": "unlock the door",
    "drawer-open-v3": "open the drawer",
    "drawer-close-v3": "close the drawer",
    "button-press-v3": "press the button",
    "button-press-topdown-v3": "press the button from the top",
    "window-open-v3": "open the window",
    "window-close-v3": "close the window",
    "faucet-open-v3": "turn the faucet on",
    "faucet-close-v3": "turn the faucet off",
    "coffee-button-v3": "press the button on the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "coffee-pull-v3": "pull the mug away from the coffee machine",
    "handle-press-v3": "press the handle down",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "plate-slide-v3": "slide the plate into the goal",
    "basketball-v3": "put the ball into the basket",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "assembly-v3": "put the ring onto the peg",
    "disassemble-v3": "take the ring off the peg",
    "hammer-v3": "hammer the nail into the wall",
    "shelf-place-v3": "place the puck on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "soccer-v3": "push the ball into the goal",
    "bin-picking-v3": "move the puck from one bin to the other",
    "box-close-v3": "put the lid on the box",
    "dial-turn-v3": "turn the dial",
}


def _import_metaworld() -> Any:
    """Import Meta-World, or explain how to install it."""
    try:
        import metaworld
    except ImportError as err:
        raise ImportError(INSTALL_HINT) from err
    return metaworld


def metaworld_tasks() -> list[str]:
    """All Meta-World v3 task names (``reach-v3``, ``pick-place-v3``, ...), sorted."""
    return sorted(_import_metaworld().ALL_V3_ENVIRONMENTS)


@functools.lru_cache(maxsize=64)
def mt1_goals(task: str, benchmark_seed: int) -> tuple[Any, ...]:
    """The 50 goals (``metaworld.Task``) of ``MT1(task, seed=benchmark_seed)``; ~0.6 s, cached."""
    return tuple(_import_metaworld().MT1(task, seed=benchmark_seed).train_tasks)


def preset_tasks(name: str) -> tuple[str, ...] | None:
    """The task names of a Meta-World benchmark preset (``MT10``, any case), or None."""
    return PRESETS.get(name.upper())


def expand_presets(names: Sequence[str]) -> list[str]:
    """``names`` with each benchmark preset (``MT10``) replaced by its tasks as env names
    (``metaworld/reach-v3``, ...); other names as given."""
    expanded: list[str] = []
    for name in names:
        preset = preset_tasks(name)
        expanded += [f"metaworld/{t}" for t in preset] if preset is not None else [name]
    return expanded


def speed_up_rendering(
    model: Any, env: Any, cameras: Sequence[str], height: int, detail: float = MESH_DETAIL
) -> float:
    """Cut what software OpenGL spends on Meta-World's scene, not what its cameras show.

    - No mirror reflections: the floor and the table's metal rim reflect the scene, each a second
      render pass of every mesh, for under a tenth of a grey level of mean difference at 64 px.
    - Meshes simplified (``embodied.sims.meshes``) on a grid of ``detail`` pixels at the nearest
      the robot comes to a camera: the hand's workspace (Meta-World's mocap limits) less
      ``LINK_MARGIN`` for the links beside and above the hand. Cameras on the robot see it from
      centimetres; with one of them the meshes stay whole.

    Returns the grid cell in metres (0: meshes kept).
    """
    model.mat_reflectance[:] = 0.0
    ids = [model.camera(name).id for name in cameras]
    if any(model.cam_bodyid[c] != 0 for c in ids):
        return 0.0
    low, high = np.asarray(env.mocap_low), np.asarray(env.mocap_high)
    footprints = []
    for c in ids:
        position = model.cam_pos[c]
        nearest = float(np.linalg.norm(position - np.clip(position, low, high))) - LINK_MARGIN
        footprints.append(pixel_footprint(model, c, max(nearest, MIN_DISTANCE), height))
    cell = detail * min(footprints)
    simplify_meshes(model, cell)
    return cell


def vectorize_contact_test(env: Any) -> None:
    """Give Meta-World's ``env`` a ``touching_object`` without its Python loop over contacts.

    Meta-World's ``SawyerXYZEnv.touching_object`` (its grasp test for ``grasp_success`` and the
    shaped rewards of 28 tasks) walks ``data.contact`` attribute by attribute: half of
    pick-place's per-step Python time. This one selects the same contacts (both the finger pad
    and the object among the contact's two geoms) with array tests and adds the same contact
    forces in the same order, so it returns the same answer (tested along expert episodes).
    """
    data = env.data
    pads = (data.geom("leftpad_geom").id, data.geom("rightpad_geom").id)

    def touching_object(object_geom_id: int) -> bool:
        contact, forces = data.contact, data.efc_force
        geoms = contact.geom
        with_object = (geoms == object_geom_id).any(axis=1)
        for pad in pads:
            rows = np.flatnonzero(with_object & (geoms == pad).any(axis=1))
            if not sum(forces[address] for address in contact.efc_address[rows].tolist()) > 0:
                return False
        return True

    env.touching_object = touching_object  # shadows the method for this env only


def task_instruction(task: str) -> str:
    """A short natural-language instruction for a task (``stick-pull-v3`` -> "stick pull")."""
    if task in INSTRUCTIONS:
        return INSTRUCTIONS[task]
    return task.removesuffix("-v3").replace("-", " ")


class MetaWorldEnv(gym.Env):
    """One Meta-World v3 task. Create it with ``embodied.sims.make("metaworld/<task>")``."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}

    def __init__(
        self,
        task: str = "reach-v3",
        obs_mode: str = "pixels",
        cameras: Sequence[str] = (DEFAULT_CAMERA,),
        image_size: int | Sequence[int] = 96,
        render_mode: str | None = "rgb_array",
        fast_render: bool = True,
        max_path_length: int | None = None,
        terminate_on_success: bool = False,
        render_state: bool = False,
    ) -> None:
        metaworld = _import_metaworld()
        from metaworld.policies import ENV_POLICY_MAP

        available = metaworld_tasks()
        if task not in available:
            raise ValueError(f"unknown Meta-World task {task!r}; available: {', '.join(available)}")
        conventions.check_options(obs_mode, render_mode)
        if max_path_length is not None and max_path_length < 1:
            raise ValueError(f"max_path_length must be positive, got {max_path_length}")
        height, width = conventions.image_shape(image_size)

        self.task, self.obs_mode, self.render_mode = task, obs_mode, render_mode
        # Meta-World runs every episode to max_path_length; ending at the first success (as the
        # tabletop suite does) makes evaluation faster and the length a time-to-success.
        self.terminate_on_success = terminate_on_success
        self.render_state = render_state
        self.render_images = True  # False: the next step's camera images are black
        self.instruction = task_instruction(task)
        self._rule = stage_rule(task)
        self.stages = self._rule.names  # ordered subtasks; ``info["stage"]`` indexes them
        # Render through our renderer only: Meta-World's own is never given a render mode.
        self._env = metaworld.ALL_V3_ENVIRONMENTS[task]()
        vectorize_contact_test(self._env)
        if max_path_length is not None:
            self._env.max_path_length = max_path_length  # Meta-World truncates at this length
        self.max_episode_steps = int(self._env.max_path_length)
        self.model, self.data = self._env.model, self._env.data
        self.frame_skip = int(self._env.frame_skip)  # physics substeps per env step

        camera_names = [self.model.camera(i).name for i in range(self.model.ncam)]
        self.cameras = cameras = conventions.checked_cameras(cameras, camera_names)
        set_render_quality(self.model, fast=fast_render)
        # Grid (metres) the render meshes were simplified on; 0: as Meta-World ships them.
        self.mesh_cell = (
            speed_up_rendering(self.model, self._env, cameras, height) if fast_render else 0.0
        )
        self._renderer = CameraRenderer(self.model, height, width)
        self._policy = ENV_POLICY_MAP[task]()

        self.action_space = conventions.action_space()
        state_dim = self._env.observation_space.shape[0]
        self.observation_space = conventions.observation_space(
            obs_mode, cameras, height, width, state_dim, DEFAULT_CAMERA
        )
        self._blow_up = conventions.BlowUpDetector(self.model, self.data, self.frame_skip)
        self._copies = conventions.PhysicsCopies(self.model)  # the reset's view, replays
        self._guard = conventions.EpisodeGuard()

        self._joint_adr = None  # qpos address of the joint the stage rule reads
        if self._rule.joint is not None:
            self._joint_adr = int(self.model.jnt_qposadr[self.model.joint(self._rule.joint).id])
        self._raw: np.ndarray | None = None  # Meta-World's last raw observation
        self._frame: np.ndarray | None = None  # the first camera's image of the current state
        self._view = self.data  # the physics the current observation's images show
        self._obj_start = np.zeros(3)  # the main object's position at the reset
        self._joint_start = 0.0
        self._steps = 0

    # --- Gymnasium API -----------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode on the MT1 goal chosen by ``seed`` (same seed, same initial state)."""
        super().reset(seed=seed)
        if seed is None:
            benchmark_seed, index = 0, int(self.np_random.integers(GOALS_PER_BENCHMARK))
        else:
            benchmark_seed, index = divmod(int(seed), GOALS_PER_BENCHMARK)
        self._env.set_task(mt1_goals(self.task, benchmark_seed)[index])
        raw, _ = self._env.reset()
        # Meta-World's reset moves some bodies (drawer-open's drawer, the windows) after its last
        # position update, so its data still draws them where they were. The reset's images come
        # from a copy with the positions computed: the state the episode starts from, as its
        # render_state replays it. Meta-World's own physics is left untouched (bit for bit).
        self._view = self._copies.pose(conventions.kinematic_state(self.data), "reset")
        self._raw = np.asarray(raw, dtype=np.float64)
        self._obj_start = self._raw[4:7].copy()
        self._joint_start = self._joint_position()
        self._steps = 0
        self._guard.update(terminated=False, truncated=False)
        # Meta-World evaluates nothing at reset: its info for the reset state gives the first
        # stage (the rules read only fields that do not depend on the action). Episodes start
        # unsolved, as in Meta-World.
        mw_info = self._env.evaluate_state(self._raw, np.zeros(4, dtype=np.float32))[1]
        return self._observation(), self._with_render_state(self._info(False, mw_info))

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Apply one 4-D action (hand xyz delta, gripper effort) for 5 Meta-World physics steps."""
        self._guard.check()
        action = conventions.checked_action(action).astype(np.float32)
        render, self.render_images = self.render_images, True

        self._blow_up.before_step()
        try:
            raw, reward, _, truncated, mw_info = self._env.step(action)
        except Exception as err:  # a Meta-World failure ends the episode instead of the program
            error = f"Meta-World step failed: {type(err).__name__}: {err}"
            return self._failed_step(error, render)
        self._steps += 1
        error = self._blow_up.error(self._steps)
        if error is None and not np.isfinite(raw).all():
            error = f"non-finite observation from Meta-World at step {self._steps}"
        if error is not None:
            return self._failed_step(error, render)

        self._raw = np.asarray(raw, dtype=np.float64)
        self._view = self.data  # Meta-World's step ends by computing the positions
        info = self._info(bool(mw_info.get("success", False)), mw_info)
        for key, value in mw_info.items():
            if key not in info and isinstance(value, (int, float, np.number, np.bool_)):
                info[key] = float(value)
        terminated = self.terminate_on_success and info["success"]
        truncated = not terminated and bool(truncated or self._steps >= self.max_episode_steps)
        self._guard.update(terminated, truncated)
        info = self._with_render_state(info)
        return self._observation(render), float(reward), terminated, truncated, info

    def render(self) -> np.ndarray | None:
        """The first camera's image (``render_mode="rgb_array"``): the observation's own when the
        last reset or step rendered it (videos of pixel policies cost no second frame)."""
        if self.render_mode is None:
            return None
        if self._frame is None:
            self._frame = self._render(self.cameras[0])
        return self._frame.copy()

    def render_state_image(self, state: np.ndarray, camera: str | None = None) -> np.ndarray:
        """``camera``'s image (default: the first camera's) of a ``render_state`` recorded in this
        episode (after the same reset: goals and object placements come from the seed), rendered
        from a scratch copy of the physics so the episode's own state is untouched."""
        data = self._copies.pose(state)
        return self._render(self.cameras[0] if camera is None else camera, data)

    def close(self) -> None:
        """Release the renderer's GL context and Meta-World's env."""
        self._renderer.close()
        self._env.close()

    # --- scripted expert hook (runs inside vector-env workers via ``call``) ------------------
    def scripted_action(self, goal: dict[str, str] | None = None) -> np.ndarray:
        """The action of Meta-World's scripted policy for this task on the last raw observation."""
        if goal is not None:
            raise ValueError(
                f"Meta-World tasks have one goal per episode; goal must be None, got {goal!r}"
            )
        if self._raw is None:
            raise RuntimeError("call reset() before scripted_action()")
        with warnings.catch_warnings():
            # Meta-World's policies warn whenever their gains exceed the action range; we clip.
            warnings.filterwarnings("ignore", message=r"Constant\(s\) may be too high")
            action = self._policy.get_action(self._raw)
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    @property
    def feature_names(self) -> dict[str, list[str]]:
        """Names of the state values: Meta-World's 39-d observation is hand, gripper, two object
        poses, the same 18 values one step earlier, and the goal position."""
        frame = ["hand.x", "hand.y", "hand.z", "gripper.gap"]
        for body in ("object_1", "object_2"):
            # The quaternion's component order differs between Meta-World tasks: q0..q3.
            frame += [f"{body}.{q}" for q in ("x", "y", "z", "q0", "q1", "q2", "q3")]
        previous = [f"previous_{name}" for name in frame]
        return {
            "agent_pos": frame[:4],
            "environment_state": frame + previous + ["goal.x", "goal.y", "goal.z"],
        }

    # --- internals -----------------------------------------------------------------------------
    def _render(self, camera: str, data: Any = None) -> np.ndarray:
        """One upright ``uint8 [H, W, 3]`` image of ``camera`` (of ``data``, default the state the
        current observation shows)."""
        state = self._view if data is None else data
        return self._renderer.render(state, camera, rotate_180=camera in UPSIDE_DOWN_CAMERAS)

    def _observation(self, render: bool = True) -> dict[str, Any]:
        raw = self._raw
        obs: dict[str, Any] = {"agent_pos": raw[:4].astype(np.float32)}
        self._frame = None  # the state has changed since the last frame
        if self.obs_mode != "state":
            if render:
                images = {c: self._render(c) for c in self.cameras}
                self._frame = images[self.cameras[0]]
            else:
                shape = (self._renderer.height, self._renderer.width, 3)
                images = {c: np.zeros(shape, dtype=np.uint8) for c in self.cameras}
            obs["pixels"] = conventions.pixels_observation(images, DEFAULT_CAMERA)
        if self.obs_mode != "pixels":
            obs["environment_state"] = raw.astype(np.float32)
        return obs

    def _joint_position(self) -> float:
        return 0.0 if self._joint_adr is None else float(self.data.qpos[self._joint_adr])

    def _stage(self, success: bool, mw_info: Mapping[str, Any]) -> int:
        """Index of the current subtask (``metaworld_stages``); success counts as the last."""
        if success:
            return len(self.stages) - 1
        rule, raw = self._rule, self._raw
        inputs = StageInputs(
            hand=raw[:3],
            tcp=self._env.tcp_center,
            obj=raw[4:7],
            obj_start=self._obj_start,
            goal=raw[36:39],
            moved=rule.direction * (self._joint_position() - self._joint_start),
            info=mw_info,
            extra={site: self.data.site(site).xpos.copy() for site in rule.sites},
        )
        return rule.stage(inputs)

    def _info(self, success: bool, mw_info: Mapping[str, Any]) -> dict[str, Any]:
        stage = self._stage(success, mw_info)
        return {
            "success": success,
            "stage": stage,
            "stage_name": self.stages[stage],
            # Coarse privileged progress, as the tabletop suite's: completed stages over all.
            "progress": np.float32((stage + success) / len(self.stages)),
            "instruction": self.instruction,
            "task": self.task,
            "ee_pos": self._raw[:3].astype(np.float32),
        }

    def _with_render_state(self, info: dict[str, Any]) -> dict[str, Any]:
        """``info`` with the state the observation's images show (``render_state=True``)."""
        if self.render_state:
            info["render_state"] = conventions.kinematic_state(self.data)
        return info

    def _failed_step(
        self, error: str, render: bool
    ) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """End the episode (truncated, no reward) with the last good observation and the reason."""
        self._view = self.data
        info = self._with_render_state(self._info(False, {}))
        info["error"] = error
        self._guard.update(terminated=False, truncated=True)
        return self._observation(render), 0.0, False, True, info
