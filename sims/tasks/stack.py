"""Stack: pick the named block up and set it on top of another block (PickPlace's expert)."""

from __future__ import annotations

import numpy as np

from embodied.sims.registry import register_task
from embodied.sims.scene import BLOCK_HALF, BLOCKS, Scene, xy_dist
from embodied.sims.tasks.base import Goal
from embodied.sims.tasks.pick_place import PickPlace


@register_task
class Stack(PickPlace):
    name = "Stack"
    templates = (
        "stack the {block} block on the {base} block",
        "put the {block} block on top of the {base} block",
        "place the {block} block onto the {base} block",
    )
    episode_steps = 150
    TOLERANCE = 0.02

    def all_goals(self) -> list[Goal]:
        return [{"block": b, "base": c} for b in BLOCKS for c in BLOCKS if b != c]

    def sample_goal(self, rng: np.random.Generator) -> Goal:
        top, base = rng.choice(len(BLOCKS), size=2, replace=False)
        return {"block": BLOCKS[int(top)], "base": BLOCKS[int(base)]}

    def place_target(self, scene: Scene, goal: Goal) -> np.ndarray:
        return scene.block_pos(goal["base"]) + np.array([0.0, 0.0, 2 * BLOCK_HALF])

    def placed(self, scene: Scene, goal: Goal, target: np.ndarray | None = None) -> bool:
        target = self.place_target(scene, goal) if target is None else target
        block = scene.block_pos(goal["block"])
        return bool(
            xy_dist(block, target) < self.TOLERANCE
            and abs(block[2] - target[2]) < 0.008
            and scene.resting_on_table(goal["base"])
        )

    def target_bodies(self, goal: Goal) -> tuple[str, ...]:
        return (f"block_{goal['block']}", f"block_{goal['base']}")
