"""Reach: bring the gripper just above the named block."""

from __future__ import annotations

import numpy as np

from embodied.sims.registry import register_task
from embodied.sims.scene import BLOCKS, Scene
from embodied.sims.tasks.base import OPEN, Evaluation, Goal, Task, move


@register_task
class Reach(Task):
    name = "Reach"
    stages = ("reach",)
    templates = (
        "reach the {block} block",
        "move the gripper to the {block} block",
        "go to the {block} block",
    )
    episode_steps = 80
    HOVER = 0.04  # success point: grip site this far above the block centre
    TOLERANCE = 0.025

    def all_goals(self) -> list[Goal]:
        return [{"block": b} for b in BLOCKS]

    def sample_goal(self, rng: np.random.Generator) -> Goal:
        return {"block": BLOCKS[int(rng.integers(len(BLOCKS)))]}

    def evaluate(self, scene: Scene, goal: Goal) -> Evaluation:
        point = self._point(scene, goal)
        success = float(np.linalg.norm(scene.ee_pos() - point)) < self.TOLERANCE
        return Evaluation(0, success, point)

    def target_bodies(self, goal: Goal) -> tuple[str, ...]:
        return (f"block_{goal['block']}",)

    def expert(self, scene: Scene, goal: Goal) -> np.ndarray:
        return move(scene, self._point(scene, goal), OPEN)

    def _point(self, scene: Scene, goal: Goal) -> np.ndarray:
        """The success point above the goal block."""
        return scene.block_pos(goal["block"]) + np.array([0.0, 0.0, self.HOVER])
