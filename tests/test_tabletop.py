"""Tests for the built-in MuJoCo tabletop suite (embodied.sims): Gymnasium conformance, seeding,
info and observations, vector envs. Scripted experts, instructions, stages and collisions are in
test_tabletop_experts.py; bad input and physics blow-ups in test_tabletop_errors.py."""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import embodied.sims as sims
from embodied.sims.tasks.reach import Reach

TASKS = sims.list_tasks()
INFO_KEYS = (
    "success",
    "stage",
    "stage_name",
    "collisions",
    "ee_pos",
    "object_pos",
    "goal_pos",
    "instruction",
    "task",
)


# --- helpers --------------------------------------------------------------------------------------
def run_until_done(env: gym.Env, policy, obs: Any) -> list[dict[str, Any]]:
    """Step ``policy`` from ``obs`` until the episode ends; return the step infos."""
    infos = []
    while True:
        obs, _, terminated, truncated, info = env.step(policy(obs))
        infos.append(info)
        if terminated or truncated:
            return infos


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Exact equality of nested dicts / arrays / scalars."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, tuple | list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray | np.generic):
        assert np.array_equal(a, b), where
    else:
        assert a == b, where


# --- 1. Gymnasium conformance ---------------------------------------------------------------------
@pytest.mark.parametrize("task", TASKS)
def test_check_env_passes(task):
    env = sims.make(task, image_size=48)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped, skip_render_check=False)
    finally:
        env.close()
    # check_env reports most problems as warnings; only the unbounded state boxes are expected.
    unexpected = [str(w.message) for w in caught if "infinity" not in str(w.message)]
    assert not unexpected


def test_make_returns_time_limited_env():
    env = sims.make("embodied/Reach-v0", obs_mode="state")
    try:
        assert env.spec.id == "embodied/Reach-v0"
        assert env.spec.max_episode_steps == Reach.episode_steps
        assert env.unwrapped.task.name == "Reach"
    finally:
        env.close()


# --- 2. Determinism -------------------------------------------------------------------------------
def _random_rollout(task: str, seed: int, steps: int = 30) -> list[tuple]:
    env = sims.make(task, obs_mode="pixels_state", image_size=48)
    try:
        obs, info = env.reset(seed=seed)
        record = [(obs, info)]
        rng = np.random.default_rng(1234)
        for _ in range(steps):
            out = env.step(rng.uniform(-1.0, 1.0, size=4).astype(np.float32))
            record.append(out)
            if out[2] or out[3]:
                break
        return record
    finally:
        env.close()


@pytest.mark.parametrize("task", TASKS)
def test_same_seed_same_actions_is_deterministic(task):
    first, second = _random_rollout(task, seed=11), _random_rollout(task, seed=11)
    assert len(first) == len(second) > 1
    for t, (a, b) in enumerate(zip(first, second, strict=True)):
        assert_same(a[0]["pixels"], b[0]["pixels"], f"step {t} pixels")
        assert_same(a[0]["agent_pos"], b[0]["agent_pos"], f"step {t} agent_pos")
        assert_same(a[0], b[0], f"step {t} obs")
        assert_same(a[1:], b[1:], f"step {t} reward/flags/info")
    # The actions really moved the robot (otherwise the equality above says little).
    assert not np.array_equal(first[0][0]["agent_pos"], first[-1][0]["agent_pos"])


def test_reset_with_same_seed_restores_initial_state(state_env):
    obs, info = state_env.reset(seed=5)
    for _ in range(10):
        state_env.step(state_env.action_space.sample())
    again, info_again = state_env.reset(seed=5)
    assert_same(obs, again)
    assert_same(info, info_again)


def test_different_seeds_give_different_layouts_and_instructions(state_env):
    states, instructions, goals = [], set(), set()
    for seed in range(6):
        obs, info = state_env.reset(seed=seed)
        states.append(obs["environment_state"])
        instructions.add(info["instruction"])
        goals.add(tuple(sorted(state_env.unwrapped.goal.items())))
    for a, b in itertools.combinations(states, 2):
        assert not np.allclose(a, b)
    assert len(instructions) >= 3
    assert len(goals) >= 2


def test_goal_cycle_shows_one_layout_with_every_goal():
    env = sims.make("PickPlace", obs_mode="state", goal_cycle=True)
    goals = env.unwrapped.task.all_goals()
    layouts, seen = [], []
    for seed in range(len(goals) + 1):
        obs, info = env.reset(seed=seed)
        layouts.append(obs["environment_state"])
        seen.append(dict(env.unwrapped.goal))
    # Seeds 0..G-1: one scene, each goal once, in all_goals order; seed G: the next scene.
    assert seen[: len(goals)] == goals
    for layout in layouts[1 : len(goals)]:
        np.testing.assert_array_equal(layout, layouts[0])
    assert not np.allclose(layouts[len(goals)], layouts[0])
    env.close()


def test_goal_state_says_in_the_state_what_the_instruction_names():
    """For policies that read no language, as Meta-World's observations: where the named object
    is and where it must go, followed step by step."""
    env = sims.make("PickPlace", obs_mode="state", goal_state=True)
    plain = sims.make("PickPlace", obs_mode="state")
    names = env.unwrapped.feature_names["environment_state"]
    assert names[:-6] == plain.unwrapped.feature_names["environment_state"]
    assert names[-6:] == [f"goal.{w}_{q}" for w in ("object", "target") for q in "xyz"]
    assert env.observation_space["environment_state"].shape == (len(names),)
    for seed in range(3):
        obs, info = env.reset(seed=seed)
        reference, _ = plain.reset(seed=seed)
        np.testing.assert_array_equal(obs["environment_state"][:-6], reference["environment_state"])
        expert, start = sims.make_expert(env), obs["environment_state"][-6:-3]
        done = False
        while not done:  # the expert carries the block to the plate: the object values follow
            obs, _, terminated, truncated, info = env.step(expert(obs))
            goal, done = obs["environment_state"][-6:], terminated or truncated
            block = env.unwrapped.scene.block_pos(env.unwrapped.goal["block"])
            np.testing.assert_allclose(goal[:3], block, atol=2e-3)
            np.testing.assert_allclose(goal[3:], info["goal_pos"], atol=1e-6)
        assert info["success"] and np.linalg.norm(goal[:3] - start) > 0.05
    with pytest.raises(ValueError, match="goal_state=True adds the goal to environment_state"):
        sims.make("PickPlace", obs_mode="pixels", goal_state=True)
    env.close()
    plain.close()


def test_different_seeds_give_different_images():
    env = sims.make("PickPlace", image_size=48)
    try:
        a = env.reset(seed=0)[0]["pixels"]
        b = env.reset(seed=1)[0]["pixels"]
    finally:
        env.close()
    assert not np.array_equal(a, b)


# --- 3. Info and observations ---------------------------------------------------------------------
@pytest.mark.parametrize("state_env", TASKS, indirect=True)
def test_info_keys_every_step(state_env):
    env = state_env.unwrapped
    n_objects = len(env.scene.object_names)
    _, info = state_env.reset(seed=2)
    infos = [info]
    for _ in range(10):
        obs, _, _, _, info = state_env.step(state_env.action_space.sample())
        infos.append(info)
        np.testing.assert_array_equal(info["ee_pos"], obs["agent_pos"][:3])
    for info in infos:
        assert set(INFO_KEYS) <= info.keys()
        assert isinstance(info["success"], bool)
        assert 0 <= info["stage"] < len(env.task.stages)
        assert info["stage_name"] == env.task.stages[info["stage"]]
        assert info["collisions"] >= 0
        assert info["ee_pos"].shape == (3,) and info["goal_pos"].shape == (3,)
        assert info["object_pos"].shape == (n_objects, 3)
        assert info["instruction"] == env.instruction
        assert info["task"] == env.task.name


def test_two_cameras_give_a_dict_of_images():
    env = sims.make("PickPlace", cameras=("front", "wrist"), image_size=(40, 56))
    try:
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs)
        pixels = obs["pixels"]
        assert isinstance(pixels, dict) and set(pixels) == {"front", "wrist"}
        for image in pixels.values():
            assert image.shape == (40, 56, 3) and image.dtype == np.uint8
            assert image.std() > 0
        assert not np.array_equal(pixels["front"], pixels["wrist"])
        obs = env.step(np.zeros(4, dtype=np.float32))[0]
        assert set(obs["pixels"]) == {"front", "wrist"}
    finally:
        env.close()


def test_one_camera_other_than_front_keeps_its_name():
    """``front`` alone is ``observation.image``; ``wrist`` alone stays ``observation.images.wrist``,
    so a policy trained on it is given the wrist camera, not the default one."""
    from embodied.core.features import ActionSpec, ObservationSpec, env_observation_features
    from embodied.rollout.matching import check_policy_env, env_options, env_spec

    for cameras, key in (("front", "observation.image"), ("wrist", "observation.images.wrist")):
        env = sims.make("Reach", cameras=[cameras], image_size=24)
        try:
            obs, _ = env.reset(seed=0)
            assert env.observation_space.contains(obs)
            assert set(env_observation_features(obs)) == {key, "observation.state"}
            spec = env_spec(env)[0]
            assert list(spec.cameras) == [key]
        finally:
            env.close()
    spec = ObservationSpec(cameras={"observation.images.wrist": (24, 24)}, state_dim=4)
    options = env_options(spec)
    assert options["cameras"] == ["wrist"]
    env = sims.make("Reach", **options)
    try:
        check_policy_env(spec, ActionSpec(dim=4), env, "Reach")
    finally:
        env.close()


def test_state_mode_has_no_pixels(state_env):
    obs, _ = state_env.reset(seed=0)
    assert "pixels" not in obs and "pixels" not in state_env.observation_space.spaces
    assert obs["environment_state"].dtype == np.float32
    assert obs["environment_state"].shape == state_env.observation_space["environment_state"].shape
    assert obs["agent_pos"].shape == (4,)
    assert state_env.observation_space.contains(obs)


def test_gripper_gap_follows_the_gripper_command(state_env):
    obs, _ = state_env.reset(seed=0)  # starts high above the table with the gripper open
    close, open_ = np.array([0, 0, 0, 1], np.float32), np.array([0, 0, 0, -1], np.float32)
    gaps = [obs["agent_pos"][3]]
    for _ in range(8):
        gaps.append(state_env.step(close)[0]["agent_pos"][3])
    assert gaps[0] > 0.075 and gaps[0] > gaps[1] > gaps[2]  # shrinks while closing
    assert gaps[-1] < 0.01
    gaps = gaps[-1:]
    for _ in range(8):
        gaps.append(state_env.step(open_)[0]["agent_pos"][3])
    assert gaps[0] < gaps[1] < gaps[2]  # grows while opening
    assert gaps[-1] > 0.075


def test_render_returns_an_image():
    env = sims.make("Stack", image_size=48)
    try:
        obs, _ = env.reset(seed=0)
        frame = env.render()
        assert frame.dtype == np.uint8 and frame.shape == (48, 48, 3)
        assert frame.std() > 0
        np.testing.assert_array_equal(frame, obs["pixels"])  # render shows the current state
    finally:
        env.close()


def test_fast_render_false_builds_and_renders():
    pretty = sims.make("PickPlace", image_size=48, fast_render=False)
    fast = sims.make("PickPlace", image_size=48)
    try:
        obs, _ = pretty.reset(seed=0)
        assert obs["pixels"].shape == (48, 48, 3) and obs["pixels"].std() > 0
        frame = pretty.render()
        assert frame.dtype == np.uint8 and frame.std() > 0
        obs = pretty.step(np.zeros(4, dtype=np.float32))[0]
        assert obs["pixels"].std() > 0
        assert pretty.unwrapped.model.vis.quality.shadowsize > 0
        # Same state, different rendering quality.
        fast.reset(seed=0)
        fast.step(np.zeros(4, dtype=np.float32))
        assert not np.array_equal(fast.render(), pretty.render())
    finally:
        pretty.close()
        fast.close()


# --- 4. Vector envs -------------------------------------------------------------------------------
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_vector_env_refuses_a_wrong_number_of_actions(asynchronous):
    vec = sims.make_vec_env("Reach", 2, asynchronous=asynchronous, obs_mode="state")
    try:
        vec.reset(seed=[0, 1])
        for actions in (np.zeros((3, 4), np.float32), [np.zeros(4, np.float32)]):
            with pytest.raises(ValueError, match=f"got {len(actions)} actions for 2 envs"):
                vec.step(actions)
        with pytest.raises(ValueError, match="a batch of 2 actions"):
            vec.step(0.0)
        assert vec.step(np.zeros((2, 4), np.float32))[1].shape == (2,)  # still usable
    finally:
        vec.close()


def test_grouped_seeds():
    assert sims.grouped_seeds([3, 7], 2) == [3, 3, 7, 7]
    assert sims.grouped_seeds([5], 1) == [5]
    with pytest.raises(ValueError):
        sims.grouped_seeds([1], 0)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_vector_env_groups_share_initial_state(asynchronous):
    vec = sims.make_vec_env("Reach", 4, asynchronous=asynchronous, obs_mode="state")
    try:
        obs, infos = vec.reset(seed=sims.grouped_seeds([3, 7], 2))
        for key in ("agent_pos", "environment_state"):
            x = obs[key]
            assert x.shape[0] == 4
            assert np.array_equal(x[0], x[1]) and np.array_equal(x[2], x[3])
            assert not np.array_equal(x[0], x[2])
        assert infos["instruction"][0] == infos["instruction"][1]
        assert infos["instruction"][2] == infos["instruction"][3]
        assert list(vec.get_attr("instruction")) == list(infos["instruction"])

        for _ in range(5):
            actions = np.stack(vec.call("scripted_action"))
            assert actions.shape == (4, 4)
            obs, rewards, terminated, truncated, infos = vec.step(actions)
            assert obs["agent_pos"].shape == (4, 4) and obs["environment_state"].shape[0] == 4
            assert rewards.shape == terminated.shape == truncated.shape == (4,)
            assert all(isinstance(s, str) and s for s in infos["instruction"])
            assert infos["success"].shape == (4,)
        # Same seed and same (expert) actions: the groups are still identical.
        assert np.array_equal(obs["environment_state"][0], obs["environment_state"][1])
        assert np.array_equal(obs["agent_pos"][2], obs["agent_pos"][3])
    finally:
        vec.close()


def test_async_vector_env_renders_in_workers():
    # The parent has rendered (it holds a GL context) before the workers start: a worker that
    # inherits that state by fork can hang on its first render, so wait with timeouts.
    parent = sims.make("Reach", image_size=32)
    parent.reset(seed=0)
    assert parent.render().std() > 0
    vec = sims.make_vec_env("Reach", 2, asynchronous=True, image_size=32)
    try:
        vec.reset_async(seed=[0, 1])
        obs, _ = vec.reset_wait(timeout=60)
        assert obs["pixels"].shape == (2, 32, 32, 3) and obs["pixels"].dtype == np.uint8
        np.testing.assert_array_equal(obs["pixels"][0], parent.render())
        vec.step_async(np.zeros((2, 4), dtype=np.float32))
        obs = vec.step_wait(timeout=60)[0]
        assert obs["pixels"].shape == (2, 32, 32, 3)
        assert all(image.std() > 0 for image in obs["pixels"])
        assert not np.array_equal(obs["pixels"][0], obs["pixels"][1])
    except BaseException:
        vec.close(terminate=True)  # a hung worker would never answer a clean close
        raise
    else:
        vec.close()
    finally:
        parent.close()


def _run_alone(script: str, timeout: float) -> str:
    """Run ``script`` in a fresh Python (its own fork server); its stdout, once it exits 0."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MUJOCO_GL": "egl"}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=timeout, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run.stdout


IGNORES_CTRL_C = """
import os, signal
import numpy as np
import embodied.sims as sims

signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's, not a background job's
vec = sims.make_vec_env("Reach", 2, asynchronous=True, obs_mode="state")
vec.reset(seed=[0, 1])
for worker in vec.processes:  # what Ctrl-C sends the whole process group
    os.kill(worker.pid, signal.SIGINT)
vec.step(np.zeros((2, 4), dtype=np.float32))
print("stepped")
vec.close()
"""


def test_async_vector_env_workers_leave_ctrl_c_to_the_main_process():
    """Ctrl-C in a terminal signals every process of the group: the workers ignore it and keep
    stepping, so the main process alone handles it (and closes them) instead of each worker
    dying with a KeyboardInterrupt traceback that ``embodied eval`` printed as warnings."""
    assert _run_alone(IGNORES_CTRL_C, timeout=300).split() == ["stepped"]


HALF_READ_CALL = """
import embodied.sims as sims

vec = sims.make_vec_env("Reach", 2, asynchronous=True, obs_mode="state")
vec.reset(seed=[0, 1])
vec.call_async("render")
vec.parent_pipes[0].recv()  # as a Ctrl-C inside call_wait, between the two workers' answers
vec.close()
print("closed")
"""


def test_async_vector_env_closes_with_a_call_half_answered():
    """An interrupt can leave a call with some workers' answers read: closing then terminates
    the workers (Gymnasium waited for every answer, forever)."""
    assert _run_alone(HALF_READ_CALL, timeout=60).split() == ["closed"]


@pytest.mark.parametrize("mode", ["next_step", "same_step", "disabled"])
def test_vector_env_autoreset_modes(mode):
    vec = sims.make_vec_env("Reach", 1, autoreset_mode=mode, obs_mode="state")
    try:
        assert vec.metadata["autoreset_mode"] == gym.vector.AutoresetMode[mode.upper()]
        vec.reset(seed=0)
        vec.step(np.zeros((1, 4), dtype=np.float32))
    finally:
        vec.close()
    with pytest.raises(ValueError, match="autoreset_mode"):
        sims.make_vec_env("Reach", 1, autoreset_mode="sometimes")


def test_feature_names_label_the_state_values(state_env):
    """``feature_names`` says which value is which: datasets record it, object encoders read it."""
    obs, _ = state_env.reset(seed=4)
    names = state_env.get_wrapper_attr("feature_names")
    assert len(names["agent_pos"]) == len(obs["agent_pos"])
    assert len(names["environment_state"]) == len(obs["environment_state"])
    value = dict(zip(names["environment_state"], obs["environment_state"], strict=True))
    scene = state_env.unwrapped.scene
    for color in ("red", "blue", "yellow"):
        xyz = [value[f"block_{color}.{q}"] for q in "xyz"]
        np.testing.assert_allclose(xyz, scene.block_pos(color), atol=1e-6)
    for color in ("green", "purple"):
        xyz = [value[f"plate_{color}.{q}"] for q in "xyz"]
        np.testing.assert_allclose(xyz, scene.plate_pos(color), atol=1e-6)
    assert value["drawer.opening"] == pytest.approx(scene.drawer_opening())
