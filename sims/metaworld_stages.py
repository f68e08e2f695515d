"""Ordered subtask stages of Meta-World tasks, read off Meta-World's step info and privileged state.

Meta-World scores its tasks with shaped rewards and a success flag but names no subtasks. The
toolkit's procedure labels, privileged progress and progress reward model need them
(``info["stage"]``, as the tabletop tasks give in ``sims/tasks/``). Each rule here follows the
same convention as a tabletop task's ``evaluate``: the stage is the highest subtask whose entry
condition holds *now* (a dropped peg goes back to an earlier stage), computed from:

- Meta-World's own ``evaluate_state`` info (``near_object``, ``grasp_success``; only the fields
  that depend on the state alone, not on the action just taken),
- the hand, finger-pad centre (``tcp``) and main object point of Meta-World's observation, and
  where that object started,
- how far the task's articulated joint (door hinge, drawer or window slide, button) has moved
  since the reset, in the direction that does the task.

Thresholds come from the tasks' code in Meta-World (``metaworld/envs/sawyer_*_v3.py``) and its
scripted policies (``metaworld/policies``), whose phases the stages follow. Success always counts
as the last stage (the env applies it), so an expert reaches the last stage when it succeeds.

The ten MT10 tasks (``MT10``) have their own rules. ``reach-wall-v3`` uses reach's. Every other
task gets ``DEFAULT``: ``approach`` until the finger pads come within 5 cm of the main object or
the object has moved 2 cm, then ``manipulate``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

# Meta-World's MT10 benchmark (its ``MT10_V3`` task list), by name so that listing it needs no
# Meta-World import. Every task here has its own stage rule in ``RULES``.
MT10 = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)
MOVED = 0.02  # metres: an object or slide this far from where it started has been moved
LIFTED = 0.02  # metres above its start: a grasped object is off the table (Meta-World's margin)
INSERTING = 0.1  # metres: a peg head this close to the hole along x is on its way in


@dataclass(frozen=True)
class StageInputs:
    """What a stage rule reads: one step's privileged state and Meta-World's info for it."""

    hand: np.ndarray  # end-effector position (observation 0:3)
    tcp: np.ndarray  # centre between the finger pads
    obj: np.ndarray  # the task's main object point (observation 4:7)
    obj_start: np.ndarray  # that point at the reset
    goal: np.ndarray  # Meta-World's target position
    moved: float  # joint travel since the reset in the task's direction (0 without a joint)
    info: Mapping[str, float]  # Meta-World's evaluate_state info
    extra: Mapping[str, np.ndarray]  # task-specific sites (``StageRule.sites``)

    def near(self, key: str = "near_object") -> bool:
        """A 0/1 flag of Meta-World's info as a bool."""
        return bool(self.info.get(key, 0.0) >= 1.0)

    def tcp_to_obj(self) -> float:
        """Distance from the finger pads' centre to the main object point."""
        return float(np.linalg.norm(self.tcp - self.obj))

    def obj_moved(self) -> float:
        """How far the main object point is from where it started."""
        return float(np.linalg.norm(self.obj - self.obj_start))


@dataclass(frozen=True)
class StageRule:
    """A task's ordered stage names and the function giving the stage index before success."""

    names: tuple[str, ...]
    stage: Callable[[StageInputs], int]
    joint: str | None = None  # the articulated joint ``moved`` measures
    direction: float = 1.0  # sign of the joint's travel that does the task
    sites: tuple[str, ...] = ()  # extra MuJoCo sites the rule reads (``StageInputs.extra``)


def _at(hand: np.ndarray, point: np.ndarray, xy: float, z: float) -> bool:
    """The hand is within ``xy`` of ``point`` horizontally and ``z`` vertically."""
    return bool(np.linalg.norm(hand[:2] - point[:2]) <= xy and abs(hand[2] - point[2]) <= z)


def _reach(s: StageInputs) -> int:
    return 0  # one stage: moving the hand to the goal is the whole task


def _push(s: StageInputs) -> int:
    # The scripted pusher closes its fingers around the puck and drags it to the goal.
    if s.obj_moved() > MOVED:
        return 2
    return int(s.near())  # pads within 3 cm of the puck (Meta-World's near_object)


def _pick_place(s: StageInputs) -> int:
    if s.near("grasp_success"):  # both pads touch the puck and it is 2 cm up (Meta-World)
        return 2
    return int(s.near())


def _door_open(s: StageInputs) -> int:
    # Meta-World's door reward counts the door as being opened past pi/90 rad.
    if s.moved > math.pi / 90:
        return 2
    # The scripted policy drops beside the handle (x - 0.05) and pushes once within these bounds.
    handle = s.obj - np.array([0.05, 0.0, 0.0])
    return int(_at(s.hand, handle, xy=0.12, z=0.04))


def _drawer_open(s: StageInputs) -> int:
    if s.moved > MOVED:
        return 2
    # Hooked: over the handle (the scripted policy aims 2 cm below its centre) and down on it.
    return int(_at(s.hand, s.obj - np.array([0.0, 0.0, 0.02]), xy=0.06, z=0.04))


def _drawer_close(s: StageInputs) -> int:
    if s.moved > MOVED:
        return 1
    # Aligned: in front of the handle (smaller y) at its height, ready to push it in.
    handle = s.obj - np.array([0.0, 0.0, 0.02])
    in_front = -0.12 <= s.hand[1] - handle[1] <= 0.0
    return int(
        in_front and abs(s.hand[0] - handle[0]) <= 0.05 and abs(s.hand[2] - handle[2]) <= 0.04
    )


def _button_press_topdown(s: StageInputs) -> int:
    # Pressing: pads within 5 cm of the button top (Meta-World's near_object) or pressed 1 cm.
    return int(s.near() or s.moved > 0.01)


def _peg_insert_side(s: StageInputs) -> int:
    head = s.extra["pegHead"]
    held = s.tcp_to_obj() <= 0.05
    lifted = held and s.obj[2] > s.obj_start[2] + LIFTED
    # Inserting: in line with the hole (the scripted policy pushes the peg in once within 3 cm
    # of its axis) and on its way in, within INSERTING of the hole along x. The scripted policy
    # lines the peg up 40 cm out and may lower it and lift it again there, so lining up alone is
    # not yet the last stage.
    aligned = np.linalg.norm(head[1:] - s.goal[1:]) <= 0.03
    if lifted and aligned and head[0] - s.goal[0] <= INSERTING:
        return 2
    # Grasped: held, or the pads within 3 cm of the peg (Meta-World's near_object); being off
    # the table is not a stage of its own, since the expert sometimes sets the peg down again.
    return int(held or s.near())


def _window(direction: float) -> Callable[[StageInputs], int]:
    """Window open (+1) or close (-1): the hand goes down beside the handle, then slides it."""

    def stage(s: StageInputs) -> int:
        if s.moved > MOVED:
            return 2
        # The scripted policy stands 3 cm behind the handle (x against the push), 3 cm in front
        # (y) and 8 cm below the handle's reference site, then pushes along x.
        beside = s.obj + np.array([-0.03 * direction, -0.03, -0.08])
        return int(_at(s.hand, beside, xy=0.04, z=0.03))

    return stage


def _default(s: StageInputs) -> int:
    # Tasks without their own rule: approach until the hand is at the object or it has moved.
    return int(s.tcp_to_obj() <= 0.05 or s.obj_moved() > MOVED)


REACH = StageRule(("reach",), _reach)
DEFAULT = StageRule(("approach", "manipulate"), _default)
RULES: dict[str, StageRule] = {
    "reach-v3": REACH,
    "reach-wall-v3": REACH,
    "push-v3": StageRule(("approach", "grasp", "push"), _push),
    "pick-place-v3": StageRule(("approach", "grasp", "carry"), _pick_place),
    "door-open-v3": StageRule(("approach", "hook", "pull"), _door_open, "doorjoint", -1.0),
    "drawer-open-v3": StageRule(("approach", "hook", "pull"), _drawer_open, "goal_slidey", -1.0),
    "drawer-close-v3": StageRule(("approach", "push"), _drawer_close, "goal_slidey", 1.0),
    "button-press-topdown-v3": StageRule(
        ("approach", "press"), _button_press_topdown, "btnbox_joint", -1.0
    ),
    "peg-insert-side-v3": StageRule(
        ("approach", "grasp", "insert"), _peg_insert_side, sites=("pegHead",)
    ),
    "window-open-v3": StageRule(("approach", "align", "slide"), _window(1.0), "window_slide", 1.0),
    "window-close-v3": StageRule(
        ("approach", "align", "slide"), _window(-1.0), "window_slide", -1.0
    ),
}


def stage_rule(task: str) -> StageRule:
    """The stage rule of a Meta-World task name (``DEFAULT`` for tasks without their own)."""
    return RULES.get(task, DEFAULT)
