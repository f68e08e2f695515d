"""ButtonPress: press the named button's cap down from above."""

from __future__ import annotations

import numpy as np

from embodied.sims.registry import register_task
from embodied.sims.scene import BUTTON_PRESSED, BUTTONS, Scene, xy_dist
from embodied.sims.tasks.base import CLOSE, Evaluation, Goal, Task, travel


@register_task
class ButtonPress(Task):
    name = "ButtonPress"
    stages = ("approach", "press")
    templates = ("press the {button} button", "push the {button} button", "hit the {button} button")
    episode_steps = 100

    def all_goals(self) -> list[Goal]:
        return [{"button": b} for b in BUTTONS]

    def sample_goal(self, rng: np.random.Generator) -> Goal:
        return {"button": BUTTONS[int(rng.integers(len(BUTTONS)))]}

    def evaluate(self, scene: Scene, goal: Goal) -> Evaluation:
        color = goal["button"]
        cap, ee = scene.cap_top(color), scene.ee_pos()
        success = scene.button_press(color) <= BUTTON_PRESSED
        on_cap = xy_dist(ee, cap) < 0.02 and ee[2] < cap[2] + 0.03
        return Evaluation(int(success or on_cap), success, cap)

    def target_bodies(self, goal: Goal) -> tuple[str, ...]:
        return (f"button_{goal['button']}", f"button_{goal['button']}_cap")

    def expert(self, scene: Scene, goal: Goal) -> np.ndarray:
        cap = scene.cap_top(goal["button"])
        # Finger tips sit 1.5 cm below the grip site: aim them 2.5 cm into the cap to press it.
        return travel(scene, cap + np.array([0.0, 0.0, 0.015 - 0.025]), CLOSE, hover=cap[2] + 0.07)
