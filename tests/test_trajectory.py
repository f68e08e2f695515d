"""Tests for embodied.core.trajectory: builder, validation, slicing and serialisation."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest

from embodied.core.trajectory import Trajectory, trajectories_equal
from embodied.core.trajectory_builder import TrajectoryBuilder


def make_trajectory(
    seed: int = 0, steps: int = 12, action_dim: int = 4, every: int = 3, success: bool = True
) -> Trajectory:
    """A valid generated episode with nested pixels, info and one decision every `every` steps."""
    rng = np.random.default_rng(seed)
    decision_steps = np.arange(0, steps, every, dtype=np.int64)
    num = len(decision_steps)
    terminated = np.zeros(steps, dtype=bool)
    terminated[-1] = success
    return Trajectory(
        observations={
            "agent_pos": rng.normal(size=(steps + 1, 5)).astype(np.float32),
            "pixels": {
                "front": rng.integers(0, 256, size=(steps + 1, 6, 6, 3), dtype=np.uint8),
                "wrist": rng.integers(0, 256, size=(steps + 1, 4, 4, 3), dtype=np.uint8),
            },
        },
        actions=rng.uniform(-1, 1, size=(steps, action_dim)).astype(np.float32),
        rewards=rng.normal(size=steps).astype(np.float32),
        terminated=terminated,
        truncated=np.zeros(steps, dtype=bool),
        success=success,
        instruction="put the red cube in the bowl",
        task="pick_place",
        suite="tabletop",
        seed=seed,
        info={
            "stage": np.minimum(np.arange(steps) // 4, 2).astype(np.int64),
            "collisions": rng.integers(0, 2, size=steps).astype(np.int64),
            "ee_pos": rng.normal(size=(steps, 3)).astype(np.float32),
        },
        policy_outputs={
            "log_prob": rng.normal(size=num).astype(np.float32),
            "tokens": rng.integers(0, 256, size=(num, 2, action_dim)).astype(np.int64),
        },
        decision_steps=decision_steps,
        metadata={"source": "test", "episode": seed},
    )


# ---------------------------------------------------------------------------------------------
# TrajectoryBuilder
# ---------------------------------------------------------------------------------------------


def _obs(rng: np.random.Generator) -> dict:
    return {
        "agent_pos": rng.normal(size=3).astype(np.float32),
        "pixels": {"front": rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)},
    }


def test_builder_produces_shapes_dtypes_and_success_from_info() -> None:
    rng = np.random.default_rng(1)
    builder = TrajectoryBuilder(_obs(rng), instruction="open", task="drawer", suite="s", seed=3)
    for step in range(5):
        if step % 3 == 0:
            builder.add_decision(step, {"log_prob": np.float32(-step), "chain": np.ones((2, 2))})
        info = {
            "success": step == 4,
            "stage": step // 2,
            "ee_pos": np.arange(3, dtype=np.float32) + step,
            "message": "a string is skipped",
            "nothing": None,
        }
        builder.add_step(rng.normal(size=2), _obs(rng), 1.0, step == 4, False, info)
    trajectory = builder.build()

    assert trajectory.length == 5 and trajectory.action_dim == 2 and trajectory.num_decisions == 2
    assert trajectory.observations["agent_pos"].shape == (6, 3)
    assert trajectory.observations["pixels"]["front"].shape == (6, 4, 4, 3)
    assert trajectory.observations["pixels"]["front"].dtype == np.uint8
    assert trajectory.actions.dtype == np.float32 and trajectory.actions.shape == (5, 2)
    assert trajectory.rewards.dtype == np.float32 and trajectory.rewards.shape == (5,)
    assert trajectory.terminated.tolist() == [False, False, False, False, True]
    assert set(trajectory.info) == {"success", "stage", "ee_pos"}
    assert trajectory.info["ee_pos"].shape == (5, 3)
    assert trajectory.info["stage"].tolist() == [0, 0, 1, 1, 2]
    assert trajectory.decision_steps.dtype == np.int64
    assert trajectory.decision_steps.tolist() == [0, 3]
    assert trajectory.policy_outputs["chain"].shape == (2, 2, 2)
    assert trajectory.success is True
    assert (trajectory.instruction, trajectory.task, trajectory.seed) == ("open", "drawer", 3)


def test_builder_success_default_and_override() -> None:
    rng = np.random.default_rng(2)
    builder = TrajectoryBuilder(_obs(rng))
    builder.add_step(np.zeros(2), _obs(rng), 0.0, False, True, {"stage": 0})
    assert builder.build().success is False  # no "success" info key
    assert builder.build(success=True).success is True
    assert builder.build().policy_outputs == {} and builder.build().decision_steps.shape == (0,)


def test_builder_copies_reused_buffers() -> None:
    buffer = {"agent_pos": np.zeros(2, dtype=np.float32)}
    builder = TrajectoryBuilder(buffer)
    action = np.zeros(1, dtype=np.float32)
    for step in range(3):
        buffer["agent_pos"][:] = step + 1  # env writes into the same array every step
        action[:] = step
        builder.add_step(action, buffer, 0.0, False, False)
    trajectory = builder.build()
    assert trajectory.observations["agent_pos"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert trajectory.actions[:, 0].tolist() == [0.0, 1.0, 2.0]


def test_builder_rejects_changing_keys_and_nan_action() -> None:
    rng = np.random.default_rng(3)
    builder = TrajectoryBuilder(_obs(rng))
    with pytest.raises(ValueError, match="agent_pos"):
        builder.add_step(np.zeros(2), {"pixels": {"front": np.zeros((4, 4, 3))}}, 0, False, False)
    builder.add_step(np.zeros(2), _obs(rng), 0.0, False, False, {"stage": 0})
    with pytest.raises(ValueError, match="info keys must be the same"):
        builder.add_step(np.zeros(2), _obs(rng), 0.0, False, False, {"other": 1})
    builder.add_step(np.array([0.0, np.nan]), _obs(rng), 0.0, False, False, {"stage": 1})
    with pytest.raises(ValueError, match=r"Trajectory.actions .*nan at index \(1, 1\)"):
        builder.build()


# ---------------------------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------------------------


def test_validate_accepts_valid_trajectory_and_returns_self() -> None:
    trajectory = make_trajectory()
    assert trajectory.validate() is trajectory


def test_validate_wrong_observation_length_names_field_and_shapes() -> None:
    good = make_trajectory(steps=10)
    bad = dataclasses.replace(
        good, observations={**good.observations, "agent_pos": np.zeros((12, 5), np.float32)}
    )
    with pytest.raises(ValueError) as error:
        bad.validate()
    assert str(error.value) == (
        "Trajectory.actions has 10 steps but observations['agent_pos'] has 12 entries "
        "(expected T+1 = 11)"
    )

    pixels = {**good.observations["pixels"], "wrist": np.zeros((3, 4, 4, 3), np.uint8)}
    nested = dataclasses.replace(good, observations={**good.observations, "pixels": pixels})
    with pytest.raises(ValueError, match=r"observations\['pixels'\]\['wrist'\] has 3 entries"):
        nested.validate()


def test_validate_nan_action_names_field_and_first_index() -> None:
    good = make_trajectory()
    actions = good.actions.copy()
    actions[3, 1] = np.nan
    actions[5, 0] = np.inf
    with pytest.raises(ValueError) as error:
        dataclasses.replace(good, actions=actions).validate()
    assert "Trajectory.actions" in str(error.value)
    assert "nan at index (3, 1)" in str(error.value)

    rewards = good.rewards.copy()
    rewards[7] = np.inf
    with pytest.raises(ValueError, match="Trajectory.rewards .*inf at index 7"):
        dataclasses.replace(good, rewards=rewards).validate()


def test_validate_decision_steps_out_of_range_or_unordered() -> None:
    good = make_trajectory(steps=12, every=3)  # decisions at 0, 3, 6, 9
    with pytest.raises(ValueError) as error:
        dataclasses.replace(good, decision_steps=np.array([0, 3, 6, 12])).validate()
    assert "decision_steps[3] = 12 is outside [0, T) = [0, 12)" in str(error.value)
    with pytest.raises(ValueError, match="strictly increasing"):
        dataclasses.replace(good, decision_steps=np.array([0, 6, 6, 9])).validate()


def test_validate_policy_outputs_length_mismatch_names_both_sizes() -> None:
    good = make_trajectory(steps=12, every=3)
    outputs = {**good.policy_outputs, "log_prob": np.zeros(3, np.float32)}
    with pytest.raises(ValueError) as error:
        dataclasses.replace(good, policy_outputs=outputs).validate()
    message = str(error.value)
    assert "policy_outputs['log_prob'] has 3 entries" in message
    assert "decision_steps has 4 decisions" in message


def test_validate_info_and_dtype_errors_name_the_field() -> None:
    good = make_trajectory(steps=12)
    with pytest.raises(ValueError, match=r"info\['stage'\] has 11 entries \(expected T = 12\)"):
        dataclasses.replace(good, info={**good.info, "stage": np.zeros(11, np.int64)}).validate()
    with pytest.raises(ValueError, match="Trajectory.terminated must be bool"):
        dataclasses.replace(good, terminated=np.zeros(12, np.int64)).validate()
    with pytest.raises(ValueError, match=r"Trajectory.rewards has shape \(11,\)"):
        dataclasses.replace(good, rewards=np.zeros(11, np.float32)).validate()


# ---------------------------------------------------------------------------------------------
# slice / concat
# ---------------------------------------------------------------------------------------------


def test_slice_restricts_and_shifts_decisions() -> None:
    trajectory = make_trajectory(steps=12, every=3)  # decisions at 0, 3, 6, 9
    segment = trajectory.slice(4, 10).validate()
    assert segment.length == 6
    assert segment.observations["pixels"]["front"].shape[0] == 7
    np.testing.assert_array_equal(
        segment.observations["agent_pos"], trajectory.observations["agent_pos"][4:11]
    )
    assert segment.decision_steps.tolist() == [2, 5]
    np.testing.assert_array_equal(
        segment.policy_outputs["log_prob"], trajectory.policy_outputs["log_prob"][2:4]
    )
    assert segment.success is False  # a prefix has not reached the end of the episode
    assert trajectory.slice(4, 12).success is True
    with pytest.raises(ValueError, match="out of range"):
        trajectory.slice(5, 13)


def test_to_dict_from_dict_exact_round_trip_including_npz() -> None:
    trajectory = make_trajectory()
    flat = trajectory.to_dict()
    assert "observations/pixels/front" in flat and "info/stage" in flat
    assert "policy_outputs/log_prob" in flat
    assert trajectories_equal(Trajectory.from_dict(flat), trajectory)

    buffer = io.BytesIO()
    np.savez(buffer, **flat)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as loaded:
        restored = Trajectory.from_dict(loaded)
    assert trajectories_equal(restored, trajectory)
    assert restored.metadata == {"source": "test", "episode": 0}


def test_from_dict_handles_no_seed_and_no_decisions_and_rejects_unknown_keys() -> None:
    trajectory = dataclasses.replace(
        make_trajectory(),
        seed=None,
        policy_outputs={},
        decision_steps=np.zeros(0, np.int64),
    )
    flat = trajectory.to_dict()
    assert "seed" not in flat
    restored = Trajectory.from_dict(flat)
    assert restored.seed is None and restored.policy_outputs == {}
    assert trajectories_equal(restored, trajectory)
    with pytest.raises(ValueError, match="unknown key 'bogus'"):
        Trajectory.from_dict({**flat, "bogus": 1})
    with pytest.raises(ValueError, match="missing key 'actions'"):
        Trajectory.from_dict({k: v for k, v in flat.items() if k != "actions"})


def test_trajectories_equal_detects_any_difference() -> None:
    a, b = make_trajectory(), make_trajectory()
    assert trajectories_equal(a, b)
    b.observations["pixels"]["wrist"][2, 0, 0, 0] ^= 1
    assert not trajectories_equal(a, b)
    assert not trajectories_equal(a, dataclasses.replace(a, actions=a.actions.astype(np.float64)))
    assert not trajectories_equal(a, dataclasses.replace(a, seed=99))
