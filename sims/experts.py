"""Scripted experts for the tabletop tasks: closed-loop, stateless rules on the privileged scene.

Each expert maps the current state to an action (like Meta-World's ``metaworld.policies``), so it
recovers from perturbations and noise: a dropped block is simply approached again. The rules read
the same ``Scene`` predicates the tasks use for stages and success.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from embodied.sims.scene import BLOCK_HALF, Scene, xy_dist
from embodied.sims.tasks import ButtonPress, DrawerOpen, Goal, PickPlace, Push, Reach, Task

OPEN, CLOSE = -1.0, 1.0
HOVER_Z = 0.1  # travel height above the table (blocks are 4 cm tall)


def move(scene: Scene, target: np.ndarray, grip: float) -> np.ndarray:
    """Command to move the grip site straight toward ``target``: (dx, dy, dz) in metres, grip."""
    return np.append(np.asarray(target, dtype=np.float64) - scene.ee_pos(), grip)


def _travel(scene: Scene, target: np.ndarray, grip: float, hover: float = HOVER_Z) -> np.ndarray:
    """Go to ``target`` via the travel height: rise, move over it, then descend."""
    ee = scene.ee_pos()
    if xy_dist(ee, target) > 0.012:
        if ee[2] < hover - 0.02 and xy_dist(ee, target) > 0.03:
            return move(scene, (ee[0], ee[1], hover), grip)
        return move(scene, (target[0], target[1], max(hover, target[2])), grip)
    return move(scene, target, grip)


def reach(task: Reach, scene: Scene, goal: Goal) -> np.ndarray:
    point = scene.block_pos(goal["block"]) + np.array([0.0, 0.0, task.HOVER])
    return move(scene, point, OPEN)


def push(task: Push, scene: Scene, goal: Goal) -> np.ndarray:
    block, plate, ee = (
        scene.block_pos(goal["block"]),
        scene.plate_pos(goal["plate"]),
        scene.ee_pos(),
    )
    to_goal = plate[:2] - block[:2]
    distance = float(np.linalg.norm(to_goal))
    if distance < 0.012:  # done: lift off so the block is left in place
        return move(scene, (ee[0], ee[1], 0.08), CLOSE)
    direction = to_goal / distance
    behind = np.append(block[:2] - direction * 0.045, BLOCK_HALF)
    rel = ee[:2] - block[:2]
    along = float(rel @ direction)
    lateral = rel - along * direction
    aligned = np.linalg.norm(lateral) < 0.012 and -0.06 < along < -0.02
    if aligned and ee[2] < 0.035:
        # Push through the block's centre line, correcting sideways drift as we go.
        step = direction * min(distance + 0.01, 0.02) - lateral
        return move(scene, (ee[0] + step[0], ee[1] + step[1], BLOCK_HALF), CLOSE)
    return _travel(scene, behind, CLOSE)


def pick_place(task: PickPlace, scene: Scene, goal: Goal) -> np.ndarray:
    """Shared by PickPlace and Stack: grasp the block, carry it over the target, set it down."""
    color = goal["block"]
    block, ee = scene.block_pos(color), scene.ee_pos()
    target = task.place_target(scene, goal)
    if task.placed(scene, goal) and not scene.grasped(color):
        return move(scene, (ee[0], ee[1], block[2] + 0.08), OPEN)  # let go and back off
    if not scene.grasped(color):
        if xy_dist(ee, block) > 0.012 or ee[2] > block[2] + 0.006:
            return _travel(scene, block, OPEN)
        return move(scene, block, CLOSE)
    # Holding the block: move so that the *block* (not the hand) lands on the target.
    carry_z = max(HOVER_Z + 0.02, target[2] + 0.06)
    offset = ee - block
    if xy_dist(block, target) > 0.015:
        if block[2] < carry_z - 0.03:
            return move(scene, (ee[0], ee[1], carry_z + offset[2]), CLOSE)
        return move(scene, (target[0], target[1], carry_z) + offset, CLOSE)
    if block[2] > target[2] + 0.004:
        return move(scene, np.append(target[:2], target[2] - 0.005) + offset, CLOSE)
    return move(scene, ee, OPEN)


def drawer_open(task: DrawerOpen, scene: Scene, goal: Goal) -> np.ndarray:
    hook, ee = scene.hook_pos(), scene.ee_pos()
    if scene.drawer_opening() >= task.OPEN + 0.02:
        return move(scene, ee, CLOSE)
    if xy_dist(ee, hook) < 0.02 and ee[2] < hook[2] + 0.01:
        # Hooked behind the handle: pull toward the robot, keeping x and z on the handle.
        return move(scene, (hook[0], ee[1] - 0.03, hook[2]), CLOSE)
    return _travel(scene, hook, CLOSE, hover=0.17)


def button_press(task: ButtonPress, scene: Scene, goal: Goal) -> np.ndarray:
    cap = scene.cap_top(goal["button"])
    # Finger tips sit 1.5 cm below the grip site: aim them 2.5 cm into the cap to press it down.
    return _travel(scene, cap + np.array([0.0, 0.0, 0.015 - 0.025]), CLOSE, hover=cap[2] + 0.07)


EXPERTS: dict[type[Task], Callable[..., np.ndarray]] = {
    Reach: reach,
    Push: push,
    PickPlace: pick_place,  # Stack inherits PickPlace and uses the same rule
    DrawerOpen: drawer_open,
    ButtonPress: button_press,
}


def expert_action(task: Task, scene: Scene, goal: Goal, action_scale: float) -> np.ndarray:
    """The scripted action in [-1, 1] for ``task`` with ``goal`` in the current ``scene``.

    Rules produce a displacement in metres; dividing by the env's ``action_scale`` and clipping
    gives full speed when far and an exact stop on the target when close.
    """
    for cls in type(task).__mro__:
        if cls in EXPERTS:
            command = EXPERTS[cls](task, scene, goal)
            command[:3] /= action_scale
            return np.clip(command, -1.0, 1.0)
    raise ValueError(f"no scripted expert for task {task.name!r}")
