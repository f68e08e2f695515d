"""The tabletop suite refusing bad input (unknown tasks, impossible image sizes and cameras, bad
actions and goals, stepping without a reset) and surviving physics blow-ups, alone or vectorised."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gymnasium.error import ResetNeeded
from test_tabletop import TASKS, run_until_done

import embodied.sims as sims


# --- Bad input ------------------------------------------------------------------------------------
def test_unknown_task_lists_available_tasks():
    with pytest.raises(ValueError, match="unknown task") as excinfo:
        sims.make("OpenTheFridge")
    for task in TASKS:
        assert task in str(excinfo.value)


def test_invalid_env_kwargs_are_rejected():
    with pytest.raises(ValueError, match="obs_mode"):
        sims.make("Reach", obs_mode="depth")
    with pytest.raises(ValueError, match="cameras"):
        sims.make("Reach", cameras=("top",))
    # An option no env takes is named with the ones it does, not a TypeError from Gymnasium.
    with pytest.raises(
        ValueError, match=r"Reach takes no env option colour; its options: .*obs_mode"
    ):
        sims.make("Reach", colour="red")
    with pytest.raises(ValueError, match="Push takes no env option nope"):
        sims.make_vec_env("Push", 2, nope=1)


@pytest.mark.parametrize(
    "image_size", [0, 4, 5000, -96, 32.0, True, "96", (32,), (32, 0), (32, 32, 3)]
)
def test_impossible_image_size_is_rejected(image_size):
    with pytest.raises(ValueError, match=r"image_size must be .* in \[8, 4096\] pixels, got"):
        sims.make("Reach", image_size=image_size)


def test_image_size_accepts_an_int_or_a_pair():
    for image_size, shape in [(8, (8, 8)), (np.int64(24), (24, 24)), ([16, 24], (16, 24))]:
        env = sims.make("Reach", image_size=image_size)
        assert env.observation_space["pixels"].shape == (*shape, 3)
        env.close()


@pytest.mark.parametrize(
    ("cameras", "problem"),
    [
        ("front", r"a list of names is needed \(one camera: \['front'\]\)"),
        (("front", "front"), r"repeated: \['front'\]"),
        (("front", "top"), r"unknown: \['top'\]"),
        ((), "no camera given"),
    ],
)
def test_bad_cameras_are_rejected(cameras, problem):
    with pytest.raises(ValueError, match=r"cameras must be .* from \['front', 'wrist'\]") as error:
        sims.make("Reach", cameras=cameras)
    assert re.search(problem, str(error.value))


def test_step_before_reset_or_after_the_end_needs_a_reset():
    env = sims.make("Reach", obs_mode="state")
    try:
        with pytest.raises(ResetNeeded, match=r"before calling env\.reset\(\)"):
            env.unwrapped.step(np.zeros(4, dtype=np.float32))  # past the OrderEnforcing wrapper
        obs, _ = env.reset(seed=0)
        infos = run_until_done(env, sims.make_expert(env), obs)
        assert infos[-1]["success"]
        for stepper in (env, env.unwrapped):
            with pytest.raises(ResetNeeded, match=r"after the episode ended \(terminated=True\)"):
                stepper.step(np.zeros(4, dtype=np.float32))
        env.reset(seed=1)
        env.step(np.zeros(4, dtype=np.float32))
    finally:
        env.close()


def test_step_after_a_blow_up_needs_a_reset(state_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MuJoCo appends its warning to ./MUJOCO_LOG.TXT
    state_env.reset(seed=0)
    state_env.unwrapped.data.qvel[:] = 1e12
    assert state_env.step(np.zeros(4, dtype=np.float32))[3]
    with pytest.raises(ResetNeeded, match=r"truncated=True"):
        state_env.step(np.zeros(4, dtype=np.float32))


def test_wrong_action_shape_is_rejected(state_env):
    state_env.reset(seed=0)
    with pytest.raises(ValueError, match=r"\(3,\)"):
        state_env.step(np.zeros(3, dtype=np.float32))


def test_non_finite_action_is_rejected(state_env):
    state_env.reset(seed=0)
    with pytest.raises(ValueError, match="non-finite"):
        state_env.step(np.array([0.0, np.nan, 0.0, 0.0], dtype=np.float32))


def test_goal_of_another_task_is_rejected(state_env):
    with pytest.raises(ValueError, match="not a goal of PickPlace"):
        state_env.reset(seed=0, options={"goal": {"button": "red"}})
    with pytest.raises(ValueError, match="not a goal"):
        state_env.reset(seed=0, options={"goal": {"block": "green", "plate": "purple"}})


@pytest.mark.parametrize("bad_value", [1e12, np.nan])
@pytest.mark.parametrize("steps_before", [0, 3])
def test_physics_blow_up_truncates_with_error(
    state_env, bad_value, steps_before, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # MuJoCo appends its warning to ./MUJOCO_LOG.TXT
    state_env.reset(seed=0)
    for _ in range(steps_before):
        state_env.step(np.zeros(4, dtype=np.float32))
    state_env.unwrapped.data.qvel[:] = bad_value
    obs, reward, terminated, truncated, info = state_env.step(np.zeros(4, dtype=np.float32))
    assert truncated and not terminated
    assert "error" in info and "instability" in info["error"]
    assert info["success"] is False and reward == 0.0
    assert np.isfinite(obs["agent_pos"]).all() and np.isfinite(obs["environment_state"]).all()
    # The env is usable again after a reset.
    state_env.reset(seed=0)
    info = state_env.step(np.zeros(4, dtype=np.float32))[4]
    assert "error" not in info


def test_physics_blow_up_in_one_vector_env_spares_the_other(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # MuJoCo appends its warning to ./MUJOCO_LOG.TXT
    vec = sims.make_vec_env("PickPlace", 2, obs_mode="state")
    try:
        vec.reset(seed=[0, 1])
        vec.envs[0].unwrapped.data.qvel[:] = 1e12
        obs, _, terminated, truncated, infos = vec.step(np.zeros((2, 4), dtype=np.float32))
        assert truncated.tolist() == [True, False] and not terminated.any()
        assert infos["_error"].tolist() == [True, False]
        assert "instability" in infos["error"][0]
        positions = [obs["agent_pos"][1].copy()]
        actions = np.tile(np.array([1.0, 1.0, 0.0, 0.0], dtype=np.float32), (2, 1))
        for _ in range(5):
            obs, _, terminated, truncated, infos = vec.step(actions)
            assert not truncated.any() and not terminated.any()
            assert "error" not in infos
            positions.append(obs["agent_pos"][1].copy())
        assert positions[-1][0] > positions[0][0] + 0.03  # env 1 kept moving
    finally:
        vec.close()
