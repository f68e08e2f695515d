"""Tests for the tabletop task registry (embodied.sims.registry): built-in tasks keep their
episodes, a user's own task module registers with one decorator, bad registrations are refused."""

from __future__ import annotations

import importlib.util
import itertools
import sys
import textwrap
import warnings
from pathlib import Path

import gymnasium as gym
import mujoco
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import embodied.sims as sims
from embodied.sims.registry import get_task
from embodied.sims.tasks.reach import Reach

# Seed 7 of each built-in task with its noise-free expert, recorded before the tasks moved into
# one module each: instruction, block_red's start xyz, episode length, stages visited, summed
# actions. Any change to a scene, an instruction, a stage rule or an expert shows up here. The
# length and summed actions are exact physics, checked on the MuJoCo they were recorded on (the
# project's environment pins it); on another MuJoCo the episode must still succeed through the
# same stages.
RECORDED_ON = "3.3.0"
EPISODES = {
    "Reach": ("go to the yellow block", (0.0023, -0.0672, 0.02), 19, [0], (7.472, 4.662, -19, -19)),
    "Push": (
        "slide the yellow block onto the purple plate",
        (0.0049, 0.0033, 0.02),
        69,
        [0, 1],
        (-2.948, 6.115, -23.728, 69),
    ),
    "PickPlace": (
        "put the yellow block on the purple plate",
        (-0.1108, -0.1388, 0.02),
        98,
        [0, 1, 2, 3, 4],
        (-1.305, 8.321, -23.564, 12),
    ),
    "Stack": (
        "put the blue block on top of the yellow block",
        (-0.1108, -0.1388, 0.02),
        105,
        [0, 1, 2, 3, 4],
        (-31.006, -0.637, -18.172, 17),
    ),
    "DrawerOpen": (
        "open the drawer",
        (0.2478, -0.0098, 0.02),
        74,
        [0, 1, 2],
        (-25.305, 21.802, -25.655, 74),
    ),
    "ButtonPress": (
        "hit the blue button",
        (0.0023, -0.0672, 0.02),
        70,
        [0, 1],
        (32.295, 61.018, -22.265, 70),
    ),
}
EPISODE_STEPS = {
    "Reach": 80,
    "Push": 150,
    "PickPlace": 150,
    "Stack": 150,
    "DrawerOpen": 120,
    "ButtonPress": 100,
}

TOY_MODULE = '''
"""A user's own task, written outside the package: hover over the named plate."""

import numpy as np

from embodied.sims import Task, register_task
from embodied.sims.scene import PLATES
from embodied.sims.tasks.base import OPEN, Evaluation, move


@register_task
class ToyHover(Task):
    name = "ToyHover"
    stages = ("hover",)
    templates = ("hover over the {plate} plate",)
    episode_steps = 60

    def all_goals(self):
        return [{"plate": p} for p in PLATES]

    def sample_goal(self, rng):
        return {"plate": PLATES[int(rng.integers(len(PLATES)))]}

    def evaluate(self, scene, goal):
        point = scene.plate_pos(goal["plate"]) + np.array([0.0, 0.0, 0.08])
        return Evaluation(0, float(np.linalg.norm(scene.ee_pos() - point)) < 0.02, point)

    def target_bodies(self, goal):
        return ()

    def expert(self, scene, goal):
        return move(scene, self.evaluate(scene, goal).goal_pos, OPEN)
'''


# --- the built-in tasks -------------------------------------------------------------------------
def test_built_in_tasks_in_their_order():
    assert sims.list_tasks() == list(EPISODES)
    for name, steps in EPISODE_STEPS.items():
        assert get_task(name).episode_steps == steps
        assert gym.spec(sims.task_id(name)).max_episode_steps == steps


@pytest.mark.parametrize("task", list(EPISODES))
def test_expert_episode_is_unchanged(task):
    instruction, start, length, stages, action_sum = EPISODES[task]
    env = sims.make(task, obs_mode="state")
    try:
        obs, info = env.reset(seed=7)
        np.testing.assert_allclose(obs["environment_state"][:3], start, atol=1e-4)
        expert, actions, visited = sims.make_expert(env), [], [info["stage"]]
        while True:
            actions.append(expert(obs))
            obs, _, terminated, truncated, info = env.step(actions[-1])
            visited.append(info["stage"])
            if terminated or truncated:
                break
    finally:
        env.close()
    assert info["instruction"] == instruction and info["success"]
    assert [k for k, _ in itertools.groupby(visited)] == stages
    if mujoco.__version__ == RECORDED_ON:  # contacts move these by a few steps across versions
        assert len(actions) == length
        np.testing.assert_allclose(np.sum(actions, axis=0), action_sum, atol=2e-3)


def test_stack_uses_the_pick_place_expert():
    assert get_task("Stack").expert is get_task("PickPlace").expert


# --- a user's own task ----------------------------------------------------------------------------
@pytest.fixture
def toy_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Import a task module written to ``tmp_path`` (as a user's would be); unregister it after."""
    monkeypatch.syspath_prepend(str(tmp_path))  # importable by name, as in vector-env workers
    path = tmp_path / "toy_hover_task.py"
    path.write_text(textwrap.dedent(TOY_MODULE))
    spec = importlib.util.spec_from_file_location("toy_hover_task", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module.ToyHover
    sims.unregister_task("ToyHover")
    del sys.modules[spec.name]


def test_a_task_module_registers_its_task(toy_task, capsys):
    from embodied.apps.cli import main

    assert "ToyHover" in sims.list_tasks()
    assert main(["tasks"]) == 0
    assert "ToyHover" in capsys.readouterr().out.split()

    env = gym.make("embodied/ToyHover-v0", obs_mode="state")
    assert env.spec.max_episode_steps == 60
    env.close()

    env = sims.make("ToyHover", image_size=32)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped, skip_render_check=False)
        assert not [str(w.message) for w in caught if "infinity" not in str(w.message)]
        obs, info = env.reset(seed=3)
        assert info["instruction"].startswith("hover over the") and info["task"] == "ToyHover"
        expert = sims.make_expert(env)
        for _ in range(60):
            obs, _, terminated, truncated, info = env.step(expert(obs))
            if terminated or truncated:
                break
        assert terminated and info["success"]
    finally:
        env.close()


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_registered_task_runs_in_vector_envs(toy_task, asynchronous):
    # A fresh ("spawn") worker process has never imported the task's module: it imports it.
    context = "spawn" if asynchronous else None
    vec = sims.make_vec_env("ToyHover", 2, asynchronous, context=context, obs_mode="state")
    try:
        vec.reset(seed=[0, 1])
        _, _, _, _, info = vec.step(np.stack(vec.call("scripted_action")))
        assert list(info["task"]) == ["ToyHover", "ToyHover"]
    finally:
        vec.close()


def test_unregister_removes_the_task(toy_task):
    sims.unregister_task("ToyHover")
    assert "ToyHover" not in sims.list_tasks()
    assert "embodied/ToyHover-v0" not in gym.registry
    with pytest.raises(ValueError, match="unknown task 'ToyHover'"):
        sims.make("ToyHover")
    sims.register_task(toy_task)  # back, for the fixture to remove


def test_registering_the_same_class_again_is_harmless(toy_task):
    assert sims.register_task(toy_task) is toy_task
    assert sims.list_tasks().count("ToyHover") == 1


# --- bad registrations ----------------------------------------------------------------------------
def _reach_like(**attrs):
    """A fresh ``Reach`` subclass with ``attrs`` set (defined here, so another module's class)."""
    return type("Custom", (Reach,), {"name": "Custom", **attrs})


def test_a_taken_name_is_refused():
    with pytest.raises(ValueError, match=r"'Reach' is taken by .*tasks\.reach\.Reach"):
        sims.register_task(_reach_like(name="Reach"))
    with pytest.raises(ValueError, match="clashes with the Gymnasium id"):
        sims.register_task(_reach_like(name="MetaWorld"))
    assert get_task("Reach") is Reach


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"name": "my task"}, "name must be an identifier"),
        ({"stages": ()}, "stages must be a non-empty tuple"),
        ({"templates": ["reach the {block} block"]}, "templates must be a non-empty tuple"),
        ({"episode_steps": 0}, "episode_steps must be a positive int"),
        ({"episode_steps": 80.0}, "episode_steps must be a positive int"),
    ],
)
def test_a_malformed_task_is_refused(attrs, message):
    with pytest.raises(ValueError, match=message):
        sims.register_task(_reach_like(**attrs))
    assert "Custom" not in sims.list_tasks()


def test_what_is_not_a_task_is_refused():
    with pytest.raises(TypeError, match="subclass of"):
        sims.register_task(dict)
    with pytest.raises(TypeError, match="does not implement"):
        sims.register_task(type("Half", (sims.Task,), {"name": "Half"}))
    with pytest.raises(ValueError, match="unknown task"):
        sims.unregister_task("NoSuchTask")
