"""DrawerOpen: hook the gripper behind the drawer's handle and pull the drawer out."""

from __future__ import annotations

import numpy as np

from embodied.sims.registry import register_task
from embodied.sims.scene import Scene, xy_dist
from embodied.sims.tasks.base import CLOSE, Evaluation, Goal, Task, move, travel


@register_task
class DrawerOpen(Task):
    name = "DrawerOpen"
    stages = ("approach", "hook", "pull")
    templates = ("open the drawer", "pull the drawer open", "pull out the drawer")
    episode_steps = 120
    keep_clear_of_drawer_path = True
    OPEN = 0.1  # metres pulled out that count as open (the drawer travels 0.16)
    PULLED = 0.02  # metres out from which the drawer counts as being pulled

    def all_goals(self) -> list[Goal]:
        return [{}]

    def sample_goal(self, rng: np.random.Generator) -> Goal:
        return {}

    def evaluate(self, scene: Scene, goal: Goal) -> Evaluation:
        opening, hook, ee = scene.drawer_opening(), scene.hook_pos(), scene.ee_pos()
        success = opening >= self.OPEN
        hooked = xy_dist(ee, hook) < 0.025 and ee[2] < hook[2] + 0.03
        # Once the drawer is out, it stays pulled (stage and progress do not fall back to
        # "approach" when the hand leads or leaves the handle mid-pull).
        if success or opening > self.PULLED:
            stage = 2
        elif hooked:
            stage = 1
        else:
            stage = 0
        return Evaluation(stage, success, hook)

    def target_bodies(self, goal: Goal) -> tuple[str, ...]:
        return ("drawer",)

    def expert(self, scene: Scene, goal: Goal) -> np.ndarray:
        hook, ee = scene.hook_pos(), scene.ee_pos()
        if scene.drawer_opening() >= self.OPEN + 0.02:
            return move(scene, ee, CLOSE)
        if xy_dist(ee, hook) < 0.02 and ee[2] < hook[2] + 0.01:
            # Hooked behind the handle: pull toward the robot, keeping x and z on the handle.
            return move(scene, (hook[0], ee[1] - 0.03, hook[2]), CLOSE)
        return travel(scene, hook, CLOSE, hover=0.17)
