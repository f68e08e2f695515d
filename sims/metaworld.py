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
- Observations follow LeRobot's gym-env convention: ``pixels`` (one image, or a dict per camera),
  ``agent_pos`` (hand xyz, gripper opening in [0, 1]) and, for ``obs_mode="state"`` or
  ``"pixels_state"``, ``environment_state`` (Meta-World's raw 39-d observation).
- Images come from our fast offscreen renderer (no shadows, no multisampling, lazy GL context).
  Meta-World's ``corner`` cameras look at the scene upside down; their images are rotated by 180
  degrees (both axes flipped, which keeps left and right correct) so they come out upright.
- Rewards are Meta-World's own shaped rewards (0-10). Like Meta-World, an episode never terminates;
  it is truncated at Meta-World's max path length (500), or at ``max_path_length``
  (``embodied.sims.make(..., max_episode_steps=N)`` passes N there).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from embodied.sims import conventions
from embodied.sims.render import CameraRenderer, set_render_quality

GOALS_PER_BENCHMARK = 50  # MT1 samples this many goals per benchmark seed
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


def task_instruction(task: str) -> str:
    """A short natural-language instruction for a task, e.g. ``peg-insert-side-v3``."""
    if task in INSTRUCTIONS:
        return INSTRUCTIONS[task]
    return task.removesuffix("-v3").replace("-", " ")


class MetaWorldEnv(gym.Env):
    """One Meta-World v3 task. Create it with ``embodied.sims.make("metaworld/<task>")``."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}
    stages = ("task",)  # Meta-World has no subtask stages

    def __init__(
        self,
        task: str = "reach-v3",
        obs_mode: str = "pixels",
        cameras: Sequence[str] = ("corner2",),
        image_size: int | Sequence[int] = 96,
        render_mode: str | None = "rgb_array",
        fast_render: bool = True,
        max_path_length: int | None = None,
        terminate_on_success: bool = False,
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
        self.instruction = task_instruction(task)
        # Render through our renderer only: Meta-World's own is never given a render mode.
        self._env = metaworld.ALL_V3_ENVIRONMENTS[task]()
        if max_path_length is not None:
            self._env.max_path_length = max_path_length  # Meta-World truncates at this length
        self.max_episode_steps = int(self._env.max_path_length)
        self.model, self.data = self._env.model, self._env.data
        self.frame_skip = int(self._env.frame_skip)  # physics substeps per env step

        camera_names = [self.model.camera(i).name for i in range(self.model.ncam)]
        self.cameras = cameras = conventions.checked_cameras(cameras, camera_names)
        set_render_quality(self.model, fast=fast_render)
        self._renderer = CameraRenderer(self.model, height, width)
        self._policy = ENV_POLICY_MAP[task]()

        self.action_space = conventions.action_space()
        state_dim = self._env.observation_space.shape[0]
        self.observation_space = conventions.observation_space(
            obs_mode, cameras, height, width, state_dim
        )
        self._blow_up = conventions.BlowUpDetector(self.model, self.data, self.frame_skip)
        self._guard = conventions.EpisodeGuard()

        self._raw: np.ndarray | None = None  # Meta-World's last raw observation
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
        self._raw = np.asarray(raw, dtype=np.float64)
        self._steps = 0
        self._guard.update(terminated=False, truncated=False)
        # Meta-World does not evaluate success at reset; episodes start unsolved.
        return self._observation(), self._info(success=False)

    def step(self, action: np.ndarray) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """Apply one 4-D action (hand xyz delta, gripper effort) for 5 Meta-World physics steps."""
        self._guard.check()
        action = conventions.checked_action(action).astype(np.float32)

        self._blow_up.before_step()
        try:
            raw, reward, _, truncated, mw_info = self._env.step(action)
        except Exception as err:  # a Meta-World failure ends the episode instead of the program
            return self._failed_step(f"Meta-World step failed: {type(err).__name__}: {err}")
        self._steps += 1
        error = self._blow_up.error(self._steps)
        if error is None and not np.isfinite(raw).all():
            error = f"non-finite observation from Meta-World at step {self._steps}"
        if error is not None:
            return self._failed_step(error)

        self._raw = np.asarray(raw, dtype=np.float64)
        info = self._info(success=bool(mw_info.get("success", False)))
        for key, value in mw_info.items():
            if key not in info and isinstance(value, (int, float, np.number, np.bool_)):
                info[key] = float(value)
        terminated = self.terminate_on_success and info["success"]
        truncated = not terminated and bool(truncated or self._steps >= self.max_episode_steps)
        self._guard.update(terminated, truncated)
        return self._observation(), float(reward), terminated, truncated, info

    def render(self) -> np.ndarray | None:
        """The first camera's image (``render_mode="rgb_array"``)."""
        if self.render_mode is None:
            return None
        return self._render(self.cameras[0])

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
    def _render(self, camera: str) -> np.ndarray:
        """One upright ``uint8 [H, W, 3]`` image of ``camera``."""
        image = self._renderer.render(self.data, camera)
        if camera in UPSIDE_DOWN_CAMERAS:
            image = np.ascontiguousarray(image[::-1, ::-1])
        return image

    def _observation(self) -> dict[str, Any]:
        raw = self._raw
        obs: dict[str, Any] = {"agent_pos": raw[:4].astype(np.float32)}
        if self.obs_mode != "state":
            images = {c: self._render(c) for c in self.cameras}
            obs["pixels"] = images[self.cameras[0]] if len(self.cameras) == 1 else images
        if self.obs_mode != "pixels":
            obs["environment_state"] = raw.astype(np.float32)
        return obs

    def _info(self, success: bool) -> dict[str, Any]:
        return {
            "success": success,
            "stage": 0,
            "stage_name": self.stages[0],
            "progress": np.float32(success),  # Meta-World has no stages: done or not
            "instruction": self.instruction,
            "task": self.task,
            "ee_pos": self._raw[:3].astype(np.float32),
        }

    def _failed_step(self, error: str) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        """End the episode (truncated, no reward) with the last good observation and the reason."""
        info = self._info(success=False)
        info["error"] = error
        self._guard.update(terminated=False, truncated=True)
        return self._observation(), 0.0, False, True, info
