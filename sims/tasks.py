"""The built-in tabletop tasks: goals, language instructions, ordered subtask stages, success.

A task is a small object: it draws a goal (which block, which plate, which button) from the reset
seed, phrases it as an instruction, and reads stage and success off the privileged ``Scene``. The
stage is the highest subtask whose entry condition holds *now*, so it goes back down when a stage is
undone (a dropped block returns to ``approach``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from embodied.sims.scene import (
    BLOCK_HALF,
    BLOCKS,
    BUTTON_PRESSED,
    BUTTONS,
    PLATES,
    Scene,
    xy_dist,
)

Goal = dict[str, str]


@dataclass(frozen=True)
class Evaluation:
    """What a task reads off the scene each step."""

    stage: int
    success: bool
    goal_pos: np.ndarray  # privileged point the task is about (target block, plate, handle, cap)


class Task(abc.ABC):
    """Base class: subclasses set the class attributes and implement the abstract methods."""

    name: ClassVar[str]
    stages: ClassVar[tuple[str, ...]]
    templates: ClassVar[tuple[str, ...]]
    # Whether blocks must start clear of the path the drawer sweeps when it opens.
    keep_clear_of_drawer_path: ClassVar[bool] = False

    @abc.abstractmethod
    def sample_goal(self, rng: np.random.Generator) -> Goal:
        """Draw the episode's goal (named targets) from the reset seed."""

    def alternative_goals(self, goal: Goal) -> list[Goal]:
        """Every other goal possible in the same scene: what a wrong instruction would ask for."""
        return [g for g in self.all_goals() if g != goal]

    @abc.abstractmethod
    def all_goals(self) -> list[Goal]:
        """All goals of this task (the cross product of its target choices)."""

    def layout_ok(self, scene: Scene, goal: Goal) -> bool:
        """Whether a freshly sampled layout leaves the task feasible (the env resamples if not)."""
        return True

    def on_reset(self, scene: Scene, goal: Goal) -> None:  # noqa: B027 (optional hook)
        """Record what stage predicates need from the episode's initial state (default: none)."""

    @abc.abstractmethod
    def evaluate(self, scene: Scene, goal: Goal) -> Evaluation:
        """Stage index, success, and the privileged goal position for the current state."""

    @abc.abstractmethod
    def target_bodies(self, goal: Goal) -> tuple[str, ...]:
        """Bodies the robot is meant to touch; contacts with any other object are collisions."""

    def instruction(self, goal: Goal, rng: np.random.Generator) -> str:
        """Phrase the goal with one of the task's templates."""
        template = self.templates[int(rng.integers(len(self.templates)))]
        return template.format(**goal)


class Reach(Task):
    name = "Reach"
    stages = ("reach",)
    templates = (
        "reach the {block} block",
        "move the gripper to the {block} block",
        "go to the {block} block",
    )
    HOVER = 0.04  # success point: grip site this far above the block centre
    TOLERANCE = 0.025

    def all_goals(self) -> list[Goal]:
        return [{"block": b} for b in BLOCKS]

    def sample_goal(self, rng: np.random.Generator) -> Goal:
        return {"block": BLOCKS[int(rng.integers(len(BLOCKS)))]}

    def evaluate(self, scene: Scene, goal: Goal) -> Evaluation:
        point = scene.block_pos(goal["block"]) + np.array([0.0, 0.0, self.HOVER])
        success = float(np.linalg.norm(scene.ee_pos() - point)) < self.TOLERANCE
        return Evaluation(0, success, point)

    def target_bodies(self, goal: Goal) -> tuple[str, ...]:
        return (f"block_{goal['block']}",)


class _BlockToPlate(Task):
    """Goals that name one block and one plate; only the named block is meant to be touched."""

    def all_goals(self) -> list[Goal]:
        return [{"block": b, "plate": p} for b in BLOCKS for p in PLATES]

    def sample_goal(self, rng: np.random.Generator) -> Goal:
        return {
            "block": BLOCKS[int(rng.integers(len(BLOCKS)))],
            "plate": PLATES[int(rng.integers(len(PLATES)))],
        }

    def target_bodies(self, goal: Goal) -> tuple[str, ...]:
        return (f"block_{goal['block']}",)


class Push(_BlockToPlate):
    name = "Push"
    stages = ("approach", "push")
    templates = (
        "push the {block} block to the {plate} plate",
        "slide the {block} block onto the {plate} plate",
        "push the {block} block onto the {plate} plate",
    )
    TOLERANCE = 0.04

    def layout_ok(self, scene: Scene, goal: Goal) -> bool:
        """No other block on the corridor the pusher sweeps (from behind the block to the plate)."""
        block, plate = scene.block_pos(goal["block"])[:2], scene.plate_pos(goal["plate"])[:2]
        direction = (plate - block) / max(float(np.linalg.norm(plate - block)), 1e-9)
        start = block - 0.07 * direction
        others = [c for c in BLOCKS if c != goal["block"]]
        return all(_segment_dist(scene.block_pos(c)[:2], start, plate) >= 0.07 for c in others)

    MOVED = 0.01  # the block has been pushed once it is this far from where it started

    def on_reset(self, scene: Scene, goal: Goal) -> None:
        self._start = {color: scene.block_pos(color) for color in BLOCKS}

    def evaluate(self, scene: Scene, goal: Goal) -> Evaluation:
        # "push" starts when the block has moved, not when the hand is near it: the pusher
        # backs off to realign mid-push, and a hand-based stage would flicker back to approach.
        block, plate = scene.block_pos(goal["block"]), scene.plate_pos(goal["plate"])
        success = xy_dist(block, plate) < self.TOLERANCE and scene.resting_on_table(goal["block"])
        pushed = xy_dist(block, self._start[goal["block"]]) > self.MOVED
        return Evaluation(int(pushed or success), success, plate)


class PickPlace(_BlockToPlate):
    name = "PickPlace"
    stages = ("approach", "grasp", "lift", "carry", "place")
    templates = (
        "put the {block} block on the {plate} plate",
        "pick up the {block} block and place it on the {plate} plate",
        "place the {block} block onto the {plate} plate",
    )
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


class Stack(PickPlace):
    name = "Stack"
    templates = (
        "stack the {block} block on the {base} block",
        "put the {block} block on top of the {base} block",
        "place the {block} block onto the {base} block",
    )
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


class DrawerOpen(Task):
    name = "DrawerOpen"
    stages = ("approach", "hook", "pull")
    templates = ("open the drawer", "pull the drawer open", "pull out the drawer")
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


class ButtonPress(Task):
    name = "ButtonPress"
    stages = ("approach", "press")
    templates = ("press the {button} button", "push the {button} button", "hit the {button} button")

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


def _segment_dist(point: np.ndarray, start: np.ndarray, end: np.ndarray) -> float:
    """Distance from a 2-D point to the segment [start, end]."""
    segment = end - start
    t = np.clip((point - start) @ segment / max(float(segment @ segment), 1e-12), 0.0, 1.0)
    return float(np.linalg.norm(point - (start + t * segment)))


TASKS: dict[str, type[Task]] = {
    cls.name: cls for cls in (Reach, Push, PickPlace, Stack, DrawerOpen, ButtonPress)
}
