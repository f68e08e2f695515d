"""The tabletop suite's scripted experts (clean and noisy), the instruction's goal, the subtask
stages an expert episode goes through, and collisions with the wrong block."""

from __future__ import annotations

import itertools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from test_tabletop import TASKS, run_until_done

import embodied.sims as sims

MULTI_GOAL_TASKS = [t for t in TASKS if t != "DrawerOpen"]


def expert_episode(env: gym.Env, reset_seed: int, **expert_kwargs: Any) -> list[dict[str, Any]]:
    """Reset to ``reset_seed`` and run the scripted expert; return reset info + step infos."""
    obs, info = env.reset(seed=reset_seed)
    return [info, *run_until_done(env, sims.make_expert(env, **expert_kwargs), obs)]


def collapse(seq: list[int]) -> list[int]:
    """Drop consecutive repeats: [0, 0, 1, 1, 2] -> [0, 1, 2]."""
    return [k for k, _ in itertools.groupby(seq)]


# --- 1. Scripted experts --------------------------------------------------------------------------
@pytest.mark.parametrize("state_env", TASKS, indirect=True)
def test_expert_solves_task(state_env):
    successes = [expert_episode(state_env, seed)[-1]["success"] for seed in range(20)]
    assert sum(successes) >= 19, successes


@pytest.mark.parametrize("state_env", TASKS, indirect=True)
def test_noisy_expert_mostly_succeeds_and_differs(state_env):
    successes = [
        expert_episode(state_env, seed, noise=0.1, seed=seed)[-1]["success"] for seed in range(20)
    ]
    assert sum(successes) >= 15, successes

    obs, _ = state_env.reset(seed=0)
    clean = sims.make_expert(state_env)
    noisy = sims.make_expert(state_env, noise=0.1, seed=0)
    twin = sims.make_expert(state_env, noise=0.1, seed=0)
    differences = []
    for _ in range(10):
        a_clean, a_noisy = clean(obs), noisy(obs)
        assert state_env.action_space.contains(a_noisy)
        np.testing.assert_array_equal(a_noisy, twin(obs))  # seeded noise is reproducible
        differences.append(np.abs(a_noisy - a_clean).max())
        obs = state_env.step(a_noisy)[0]
    # Saturated components can clip back to the clean action, but not on most steps.
    assert sum(d > 1e-3 for d in differences) >= 7, differences


# --- 2. The instruction matters -------------------------------------------------------------------
@pytest.mark.parametrize("state_env", MULTI_GOAL_TASKS, indirect=True)
def test_expert_following_another_instruction_does_not_succeed(state_env):
    env = state_env.unwrapped
    for seed in range(3):
        obs, _ = state_env.reset(seed=seed)
        goal = env.goal
        alternative = env.task.alternative_goals(goal)[0]
        assert alternative != goal
        infos = run_until_done(state_env, sims.make_expert(state_env, goal=alternative), obs)
        assert infos[-1]["success"] is False, (seed, goal, alternative)
        assert env.task.evaluate(env.scene, alternative).success, (seed, goal, alternative)
        assert not env.task.evaluate(env.scene, goal).success


def test_drawer_open_has_a_single_goal():
    task = sims.make("DrawerOpen", obs_mode="state").unwrapped.task
    assert task.all_goals() == [{}]
    assert task.alternative_goals({}) == []


@pytest.mark.parametrize("state_env", TASKS, indirect=True)
def test_instruction_names_the_goal(state_env):
    env = state_env.unwrapped
    for goal in env.task.all_goals():
        _, info = state_env.reset(seed=0, options={"goal": goal})
        assert env.goal == goal
        assert info["instruction"] == env.instruction != ""
        words = env.instruction.split()
        for color in goal.values():
            assert color in words, (env.instruction, goal)
        if env.task.name == "Stack":  # moved block named before the base block
            assert words.index(goal["block"]) < words.index(goal["base"])
    if env.task.name == "DrawerOpen":
        assert "drawer" in env.instruction


# --- 3. Stages ------------------------------------------------------------------------------------
@pytest.mark.parametrize("state_env", ["PickPlace"], indirect=True)
def test_pick_place_stages(state_env):
    stages = state_env.unwrapped.task.stages
    assert len(stages) == 5
    for seed in range(3):
        infos = expert_episode(state_env, seed)
        for info in infos:
            assert info["stage_name"] == stages[info["stage"]]
        sequence = [info["stage"] for info in infos]
        assert sequence[0] == 0
        assert max(sequence) == len(stages) - 1
        # A clean expert episode goes through every subtask in order, never back.
        assert collapse(sequence) == [0, 1, 2, 3, 4], collapse(sequence)
        assert infos[-1]["success"] and infos[-1]["stage"] == 4


@pytest.mark.parametrize("state_env", ["DrawerOpen"], indirect=True)
def test_drawer_open_stages(state_env):
    stages = state_env.unwrapped.task.stages
    for seed in range(3):
        infos = expert_episode(state_env, seed)
        assert all(info["stage_name"] == stages[info["stage"]] for info in infos)
        assert collapse([info["stage"] for info in infos]) == [0, 1, 2]
        assert infos[-1]["success"]


@pytest.mark.parametrize("state_env", ["DrawerOpen"], indirect=True)
def test_a_half_open_drawer_stays_pulled_after_the_hand_lets_go(state_env):
    env = state_env.unwrapped
    obs, _ = state_env.reset(seed=0)
    expert = sims.make_expert(state_env)
    while env.scene.drawer_opening() < 0.05:  # pull it half way with the expert
        obs, _, _, _, info = state_env.step(expert(obs))
    up = np.array([0.0, 0.0, 1.0, 1.0], dtype=np.float32)
    for _ in range(5):  # then lift the hand off the handle
        obs, _, _, _, info = state_env.step(up)
    assert env.scene.drawer_opening() > 0.02 and not info["success"]
    assert info["stage"] == 2 and info["stage_name"] == "pull"


# --- 4. Collisions --------------------------------------------------------------------------------
@pytest.mark.parametrize("state_env", ["PickPlace"], indirect=True)
def test_touching_the_wrong_block_counts_as_collision(state_env):
    env = state_env.unwrapped
    correct_total = 0
    for seed in range(5):
        correct = expert_episode(state_env, seed)
        correct_total += sum(info["collisions"] for info in correct)
        assert correct[-1]["success"]

        obs, _ = state_env.reset(seed=seed)
        goal = env.goal
        wrong = next(g for g in env.task.alternative_goals(goal) if g["block"] != goal["block"])
        infos = run_until_done(state_env, sims.make_expert(state_env, goal=wrong), obs)
        assert sum(info["collisions"] for info in infos) > 0, seed
    assert correct_total <= 5
