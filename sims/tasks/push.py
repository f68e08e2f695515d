"""Push: slide the named block across the table onto the named plate."""

from __future__ import annotations

import numpy as np

from embodied.sims.registry import register_task
from embodied.sims.scene import BLOCK_HALF, BLOCKS, Scene, xy_dist
from embodied.sims.tasks.base import CLOSE, BlockToPlate, Evaluation, Goal, move, travel


@register_task
class Push(BlockToPlate):
    name = "Push"
    stages = ("approach", "push")
    templates = (
        "push the {block} block to the {plate} plate",
        "slide the {block} block onto the {plate} plate",
        "push the {block} block onto the {plate} plate",
    )
    episode_steps = 150
    TOLERANCE = 0.04
    MOVED = 0.01  # the block has been pushed once it is this far from where it started

    def layout_ok(self, scene: Scene, goal: Goal) -> bool:
        """No other block on the corridor the pusher sweeps (from behind the block to the plate)."""
        block, plate = scene.block_pos(goal["block"])[:2], scene.plate_pos(goal["plate"])[:2]
        direction = (plate - block) / max(float(np.linalg.norm(plate - block)), 1e-9)
        start = block - 0.07 * direction
        others = [c for c in BLOCKS if c != goal["block"]]
        return all(_segment_dist(scene.block_pos(c)[:2], start, plate) >= 0.07 for c in others)

    def on_reset(self, scene: Scene, goal: Goal) -> None:
        self._start = {color: scene.block_pos(color) for color in BLOCKS}

    def evaluate(self, scene: Scene, goal: Goal) -> Evaluation:
        # "push" starts when the block has moved, not when the hand is near it: the pusher
        # backs off to realign mid-push, and a hand-based stage would flicker back to approach.
        block, plate = scene.block_pos(goal["block"]), scene.plate_pos(goal["plate"])
        success = xy_dist(block, plate) < self.TOLERANCE and scene.resting_on_table(goal["block"])
        pushed = xy_dist(block, self._start[goal["block"]]) > self.MOVED
        return Evaluation(int(pushed or success), success, plate)

    def expert(self, scene: Scene, goal: Goal) -> np.ndarray:
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
        return travel(scene, behind, CLOSE)


def _segment_dist(point: np.ndarray, start: np.ndarray, end: np.ndarray) -> float:
    """Distance from a 2-D point to the segment [start, end]."""
    segment = end - start
    t = np.clip((point - start) @ segment / max(float(segment @ segment), 1e-12), 0.0, 1.0)
    return float(np.linalg.norm(point - (start + t * segment)))
