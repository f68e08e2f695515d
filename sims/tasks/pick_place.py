"""PickPlace: grasp the named block, carry it and set it down on the named plate."""

from __future__ import annotations

import numpy as np

from embodied.sims.registry import register_task
from embodied.sims.scene import BLOCK_HALF, Scene, xy_dist
from embodied.sims.tasks.base import (
    CLOSE,
    HOVER_Z,
    OPEN,
    BlockToPlate,
    Evaluation,
    Goal,
    move,
    travel,
)


@register_task
class PickPlace(BlockToPlate):
    name = "PickPlace"
    stages = ("approach", "grasp", "lift", "carry", "place")
    templates = (
        "put the {block} block on the {plate} plate",
        "pick up the {block} block and place it on the {plate} plate",
        "place the {block} block onto the {plate} plate",
    )
    episode_steps = 150
    TOLERANCE = 0.04  # block centre within this of the plate centre (plate radius 0.05)
    LIFTED = 0.03  # block raised this much above resting height counts as lifted

    def place_target(self, scene: Scene, goal: Goal) -> np.ndarray:
        """Where the block's centre rests when the task is done."""
        return scene.plate_pos(goal["plate"]) + np.array([0.0, 0.0, BLOCK_HALF])

    def placed(self, scene: Scene, goal: Goal, target: np.ndarray | None = None) -> bool:
        """The block rests at ``target`` (computed from the scene when not given)."""
        target = self.place_target(scene, goal) if target is None else target
        block = scene.block_pos(goal["block"])
        return xy_dist(block, target) < self.TOLERANCE and bool(
            scene.resting_on_table(goal["block"])
        )

    def evaluate(self, scene: Scene, goal: Goal) -> Evaluation:
        color = goal["block"]
        target = self.place_target(scene, goal)
        block, ee = scene.block_pos(color), scene.ee_pos()
        grasped = scene.grasped(color)
        lifted = block[2] > BLOCK_HALF + self.LIFTED
        success = self.placed(scene, goal, target) and not grasped
        if success or (xy_dist(block, target) < self.TOLERANCE and (grasped or lifted)):
            stage = 4
        elif grasped and lifted:
            stage = 3
        elif grasped:
            stage = 2
        elif xy_dist(ee, block) < 0.02 and abs(ee[2] - block[2]) < 0.03:
            stage = 1
        else:
            stage = 0
        return Evaluation(stage, success, target)

    def expert(self, scene: Scene, goal: Goal) -> np.ndarray:
        """Grasp the block, carry it over ``place_target``, set it down (subclasses reuse it)."""
        color = goal["block"]
        block, ee = scene.block_pos(color), scene.ee_pos()
        target = self.place_target(scene, goal)
        if self.placed(scene, goal) and not scene.grasped(color):
            return move(scene, (ee[0], ee[1], block[2] + 0.08), OPEN)  # let go and back off
        if not scene.grasped(color):
            if xy_dist(ee, block) > 0.012 or ee[2] > block[2] + 0.006:
                return travel(scene, block, OPEN)
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
