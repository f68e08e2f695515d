"""What every tabletop task shares: the ``Task`` base class, its ``Evaluation``, expert motions.

A task is a small object: it draws a goal (which block, which plate, which button) from the reset
seed, phrases it as an instruction, reads stage and success off the privileged ``Scene`` and
scripts an expert. The stage is the highest subtask whose entry condition holds *now*, so it goes
back down when a stage is undone (a dropped block returns to ``approach``).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from embodied.sims.scene import BLOCKS, PLATES, Scene, xy_dist

Goal = dict[str, str]

OPEN, CLOSE = -1.0, 1.0  # gripper commands
HOVER_Z = 0.1  # expert travel height above the table (blocks are 4 cm tall)


@dataclass(frozen=True)
class Evaluation:
    """What a task reads off the scene each step."""

    stage: int
    success: bool
    goal_pos: np.ndarray  # privileged point the task is about (target block, plate, handle, cap)


class Task(abc.ABC):
    """Base class: subclasses set the class attributes and implement the abstract methods."""

    name: ClassVar[str]  # registry name: ``embodied.sims.make(name)``, ``embodied/<name>-v0``
    stages: ClassVar[tuple[str, ...]]  # ordered subtasks; ``info["stage"]`` indexes them
    templates: ClassVar[tuple[str, ...]]  # instruction templates, formatted with the goal
    episode_steps: ClassVar[int]  # time limit in env steps (16 Hz control)
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

    def expert(self, scene: Scene, goal: Goal) -> np.ndarray:
        """The scripted expert's command now: grip-site displacement in metres, then the grip.

        Experts are closed-loop, stateless rules on the privileged scene (like Meta-World's
        ``metaworld.policies``), so they recover from noise: a dropped block is approached again.
        The env scales the displacement into the [-1, 1] action box.
        """
        raise NotImplementedError(f"task {self.name!r} has no scripted expert")


class BlockToPlate(Task):
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


def move(scene: Scene, target: np.ndarray, grip: float) -> np.ndarray:
    """Command to move the grip site straight toward ``target``: (dx, dy, dz) in metres, grip."""
    return np.append(np.asarray(target, dtype=np.float64) - scene.ee_pos(), grip)


def travel(scene: Scene, target: np.ndarray, grip: float, hover: float = HOVER_Z) -> np.ndarray:
    """Go to ``target`` via the travel height: rise, move over it, then descend."""
    ee = scene.ee_pos()
    if xy_dist(ee, target) > 0.012:
        if ee[2] < hover - 0.02 and xy_dist(ee, target) > 0.03:
            return move(scene, (ee[0], ee[1], hover), grip)
        return move(scene, (target[0], target[1], max(hover, target[2])), grip)
    return move(scene, target, grip)
