"""Progress labels (procedure vs. time), ReWiND rewinds and reward metrics, on tabletop episodes."""

from __future__ import annotations

import numpy as np
import pytest

import embodied.sims as sims
from embodied.core.trajectory import Trajectory
from embodied.rewards import (
    calibration_error,
    label_trajectories,
    median_stage_change,
    observation_stages,
    procedure_labels,
    rewind,
    stage_budgets,
    success_auroc,
    time_labels,
    trajectory_frames,
    value_order_correlation,
    visual_change,
    voc_summary,
)
from embodied.rollout.episodes import rollout_episode

IMAGE_SIZE = 48
SEEDS = (0, 1, 2)
TASKS = ("PickPlace", "Push", "ButtonPress")


def _env(task: str):
    return sims.make(task, image_size=IMAGE_SIZE)


@pytest.fixture(scope="module")
def experts() -> dict[str, list[Trajectory]]:
    """Successful expert episodes, a few seeds per task."""
    episodes = {}
    for task in TASKS:
        env = _env(task)
        episodes[task] = [
            rollout_episode(env, sims.make_expert(env), seed=seed, suite="tabletop")
            for seed in SEEDS
        ]
        env.close()
    return episodes


@pytest.fixture(scope="module")
def pick_failures() -> list[Trajectory]:
    """PickPlace failures: a noisy expert that does not finish, and experts cut off early."""
    env = _env("PickPlace")
    noisy = rollout_episode(env, sims.make_expert(env, noise=0.3, seed=2), seed=2, suite="tabletop")
    cut = [
        rollout_episode(env, sims.make_expert(env), seed=seed, suite="tabletop", max_steps=steps)
        for seed, steps in ((0, 30), (1, 60))
    ]
    env.close()
    return [noisy, *cut]


def _is_monotone(stages: np.ndarray) -> bool:
    return bool(np.all(np.diff(stages) >= 0))


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def test_observation_stages_prepend_reset_stage(experts):
    traj = experts["PickPlace"][0]
    stages = observation_stages(traj)
    assert stages.dtype == np.int64
    assert stages.shape == (traj.length + 1,)
    assert stages[0] == traj.metadata["reset_info"]["stage"]
    np.testing.assert_array_equal(stages[1:], traj.info["stage"])
    assert stages.max() == 4  # the expert reaches "place"


def test_observation_stages_need_stage_info(experts):
    traj = experts["Push"][0]
    no_reset = Trajectory(**{**traj.__dict__, "metadata": {}})
    with pytest.raises(ValueError, match="reset_info"):
        observation_stages(no_reset)
    with pytest.raises(ValueError, match="stage"):
        observation_stages(Trajectory(**{**traj.__dict__, "info": {}}))


@pytest.mark.parametrize("method", ["diff", "flow"])
def test_visual_change_zero_for_identical_frames_positive_for_motion(experts, method):
    frames = trajectory_frames(experts["PickPlace"][0])
    still = np.repeat(frames[10:11], 5, axis=0)
    np.testing.assert_array_equal(visual_change(still, method), np.zeros(5))
    # +-1 grey level of sensor noise is below the noise floor.
    noise = np.random.default_rng(0).integers(-1, 2, size=still.shape)
    noisy = np.clip(still.astype(np.int64) + noise, 0, 255).astype(np.uint8)
    assert not np.array_equal(noisy, still)
    np.testing.assert_array_equal(visual_change(noisy, method), np.zeros(5))
    change = visual_change(frames[:20], method)
    assert change.shape == (20,) and change.dtype == np.float64
    assert change[0] == 0.0
    assert np.all(change[1:] > 0)  # the expert arm moves every step


def test_visual_change_rejects_bad_input():
    with pytest.raises(ValueError, match="uint8"):
        visual_change(np.zeros((3, 8, 8, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="method"):
        visual_change(np.zeros((3, 8, 8, 3), dtype=np.uint8), method="sift")


def test_stage_budgets_duration_and_uniform():
    budgets = stage_budgets([np.array([0, 0, 1, 1, 1, 1])], n_stages=3)
    # durations 2, 4 and an unseen stage counted as one frame
    np.testing.assert_allclose(budgets, np.array([2.0, 4.0, 1.0]) / 7.0)
    two = stage_budgets([np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1, 1, 1])], n_stages=2)
    np.testing.assert_allclose(two, np.array([1.5, 3.5]) / 5.0)
    np.testing.assert_allclose(stage_budgets([], n_stages=4, method="uniform"), np.full(4, 0.25))
    with pytest.raises(ValueError, match="successful"):
        stage_budgets([], n_stages=2)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        stage_budgets([np.array([0, 2])], n_stages=2)


def test_median_stage_change_per_stage():
    stages = [np.array([0, 0, 1]), np.array([0, 1, 1]), np.array([0, 0, 0])]
    changes = [np.array([0.0, 1.0, 2.0]), np.array([0.0, 3.0, 3.0]), np.array([0.0, 5.0, 5.0])]
    typical = median_stage_change(stages, changes, n_stages=3)
    np.testing.assert_allclose(typical[:2], [1.0, 4.0])  # stage 0: median(1, 0, 10)
    assert np.isnan(typical[2])


# ---------------------------------------------------------------------------------------------
# Procedure vs. time labels
# ---------------------------------------------------------------------------------------------


def test_time_labels_are_linear():
    np.testing.assert_allclose(time_labels(5, True), [0.0, 0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(time_labels(3, False), [0.0, 0.25, 0.5])
    np.testing.assert_allclose(time_labels(3, False, final=0.2), [0.0, 0.1, 0.2])
    assert time_labels(4, True).dtype == np.float32
    with pytest.raises(ValueError, match="final"):
        time_labels(3, False, final=1.5)


@pytest.mark.parametrize("task", TASKS)
def test_expert_procedure_labels_start_0_end_1_rise_with_stages(experts, task):
    trajs = experts[task]
    labels = label_trajectories(trajs)
    vocs = []
    for traj, label in zip(trajs, labels, strict=True):
        stages = observation_stages(traj)
        assert traj.success
        assert label.dtype == np.float32 and label.shape == (traj.length + 1,)
        assert label[0] == 0.0
        assert label[-1] == 1.0
        assert np.all(label[:-1] < 1.0)  # 1.0 only at the success frame
        # Expert stages never go back, so the labels never go down.
        assert _is_monotone(stages)
        assert np.all(np.diff(label) >= 0)
        vocs.append(value_order_correlation(label))
    assert np.mean(vocs) >= 0.95


def test_expert_voc_average_over_tasks(experts):
    trajs = [traj for task in TASKS for traj in experts[task]]
    procedure = voc_summary(label_trajectories(trajs))
    time = voc_summary(label_trajectories(trajs, method="time"))
    assert procedure["n"] == len(trajs)
    assert procedure["mean"] >= 0.95
    assert time["mean"] == pytest.approx(1.0)


def test_mixed_task_datasets_are_labelled_task_by_task(experts, pick_failures):
    # PickPlace has five stages and Push two: pooled budgets would stretch Push's two stages over
    # PickPlace's durations (and a Push failure would be scored on PickPlace's stage scale).
    push_failure = experts["Push"][0].slice(0, 12)
    mixed = [experts["Push"][1], pick_failures[1], experts["PickPlace"][0], push_failure]
    for traj in experts["PickPlace"][1:] + experts["Push"][2:]:
        mixed.append(traj)
    labels = label_trajectories(mixed)
    for task in ("PickPlace", "Push"):
        members = [i for i, t in enumerate(mixed) if t.task == task]
        alone = label_trajectories([mixed[i] for i in members])
        for i, expected in zip(members, alone, strict=True):
            np.testing.assert_array_equal(labels[i], expected)
    with pytest.raises(ValueError, match="PickPlace"):
        label_trajectories([experts["Push"][0], *pick_failures])
    # Given its stage count, a task without a success is labelled on uniform budgets.
    labels = label_trajectories([experts["Push"][0], *pick_failures], n_stages={"PickPlace": 5})
    uniform = label_trajectories(pick_failures, budgets=stage_budgets([], 5, method="uniform"))
    for got, expected in zip(labels[1:], uniform, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("change_method", ["diff", "flow"])
def test_pause_is_flat_for_procedure_labels_but_not_for_time(experts, change_method):
    traj = experts["PickPlace"][0]
    stages = observation_stages(traj)
    frames = trajectory_frames(traj)
    budgets = stage_budgets([stages], n_stages=5)
    middle = len(stages) // 2
    copies = 15
    paused_frames = np.concatenate(
        [
            frames[: middle + 1],
            np.repeat(frames[middle : middle + 1], copies, 0),
            frames[middle + 1 :],
        ]
    )
    paused_stages = np.concatenate(
        [stages[: middle + 1], np.repeat(stages[middle], copies), stages[middle + 1 :]]
    )

    change = visual_change(frames, change_method)
    paused_change = visual_change(paused_frames, change_method)
    original = procedure_labels(stages, change, True, budgets)
    paused = procedure_labels(paused_stages, paused_change, True, budgets)
    pause = paused[middle : middle + copies + 1]
    assert np.all(pause == pause[0])  # exactly flat
    assert pause[0] == original[middle]
    # The frames around the pause keep exactly their labels.
    np.testing.assert_array_equal(paused[: middle + 1], original[: middle + 1])
    np.testing.assert_array_equal(paused[middle + copies + 1 :], original[middle + 1 :])

    times = time_labels(len(paused_stages), True)[middle : middle + copies + 1]
    assert np.all(np.diff(times) > 0)


def test_failures_end_below_one(experts, pick_failures):
    successes = experts["PickPlace"]
    trajs = successes + pick_failures
    labels = label_trajectories(trajs, n_stages=5)
    for traj, label in zip(pick_failures, labels[len(successes) :], strict=True):
        assert not traj.success
        assert label[-1] < 1.0
        assert label.max() < 1.0
    finals = np.array([label[-1] for label in labels])
    outcome = np.array([t.success for t in trajs])
    assert success_auroc(finals, outcome) == 1.0
    time = label_trajectories(pick_failures, method="time")
    assert all(label[-1] == pytest.approx(0.5) for label in time)


def test_stage_going_down_drops_the_label():
    stages = np.array([0, 0, 1, 1, 2, 2, 0, 0])
    change = np.array([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    labels = procedure_labels(stages, change, False, np.full(3, 1 / 3))
    third = 1 / 3
    expected = [
        0.0,
        third,  # stage 0 completed
        third + third * 0.5,
        2 * third,  # stage 1 completed
        2 * third + third * 0.5,
        2 * third + third * 0.9,  # stage 2 undone: its own change, capped at 0.9
        third * 0.5,  # back to stage 0's base
        third * 0.9,  # failed final run: capped at 0.9
    ]
    np.testing.assert_allclose(labels, expected, rtol=1e-6)
    assert labels[6] < labels[5]


def test_failed_final_run_uses_typical_change_and_cap():
    stages = np.array([0, 0, 1, 1])
    change = np.array([0.0, 2.0, 1.0, 1.0])
    budgets = np.array([0.5, 0.5])
    labels = procedure_labels(stages, change, False, budgets, typical_stage_change=np.array([2, 4]))
    np.testing.assert_allclose(labels, [0.0, 0.5, 0.5 + 0.5 * 0.25, 0.5 + 0.5 * 0.5])
    success = procedure_labels(stages, change, True, budgets, typical_stage_change=np.array([2, 4]))
    np.testing.assert_allclose(success, [0.0, 0.5, 0.75, 1.0])


def test_label_trajectories_errors(experts, pick_failures):
    with pytest.raises(ValueError, match="successful"):
        label_trajectories(pick_failures)
    labels = label_trajectories(pick_failures, budgets=stage_budgets([], 5, method="uniform"))
    assert all(label[-1] < 1.0 for label in labels)
    with pytest.raises(ValueError, match="depth"):
        label_trajectories(experts["Push"], frames_key="depth")
    with pytest.raises(ValueError, match="method"):
        label_trajectories(experts["Push"], method="vlm")


def test_label_trajectories_picks_a_camera(experts):
    traj = experts["ButtonPress"][0]
    pixels = traj.observations["pixels"]
    cameras = {"front": pixels, "wrist": np.zeros_like(pixels)}
    multi = Trajectory(
        **{**traj.__dict__, "observations": {**traj.observations, "pixels": cameras}}
    )
    expected = label_trajectories([traj])[0]
    np.testing.assert_array_equal(label_trajectories([multi])[0], expected)
    np.testing.assert_array_equal(label_trajectories([multi], camera="front")[0], expected)
    with pytest.raises(ValueError, match="camera"):
        label_trajectories([multi], camera="side")


# ---------------------------------------------------------------------------------------------
# ReWiND
# ---------------------------------------------------------------------------------------------


def test_rewind_shape_and_content(experts):
    traj = experts["PickPlace"][0]
    split = 80
    rewound = rewind(traj, split)
    steps = split // 2
    assert rewound.validate() is rewound
    assert rewound.length == split + steps
    pixels, original = rewound.observations["pixels"], traj.observations["pixels"]
    assert pixels.shape == (split + steps + 1, *original.shape[1:])
    np.testing.assert_array_equal(pixels[: split + 1], original[: split + 1])
    np.testing.assert_array_equal(pixels[split + 1 :], original[split - 1 : split - steps - 1 : -1])
    np.testing.assert_array_equal(rewound.actions[:split], traj.actions[:split])
    backward = traj.actions[split - 1 : split - steps - 1 : -1]
    np.testing.assert_array_equal(rewound.actions[split:, :3], -backward[:, :3])
    np.testing.assert_array_equal(rewound.actions[split:, 3], backward[:, 3])
    stages = observation_stages(rewound)
    np.testing.assert_array_equal(
        stages, observation_stages(traj)[np.r_[0 : split + 1, split - 1 : split - steps - 1 : -1]]
    )
    assert not rewound.success
    assert np.all(rewound.rewards == 0)
    assert not rewound.terminated.any()
    assert rewound.truncated[-1] and not rewound.truncated[:-1].any()
    assert rewound.metadata["synthetic"] == "rewind"
    assert rewound.metadata["rewind_split"] == split
    assert rewound.metadata["reset_info"] == traj.metadata["reset_info"]


def test_rewind_to_the_start_uses_reset_info(experts):
    traj = experts["Push"][0]
    rewound = rewind(traj, split=10, rewind_steps=10)
    assert rewound.length == 20
    np.testing.assert_array_equal(
        rewound.observations["pixels"][-1], traj.observations["pixels"][0]
    )
    assert rewound.info["stage"][-1] == traj.metadata["reset_info"]["stage"]
    with pytest.raises(ValueError, match="rewind_steps"):
        rewind(traj, split=10, rewind_steps=11)
    with pytest.raises(ValueError, match="split"):
        rewind(traj, split=traj.length + 1)


def test_rewound_labels_go_down(experts):
    successes = experts["PickPlace"]
    traj = successes[0]
    split = int(traj.length * 0.8)
    rewound = rewind(traj, split)
    labels = label_trajectories([*successes, rewound], n_stages=5)[-1]
    assert labels.shape == (rewound.length + 1,)
    assert labels[-1] < labels[split]
    assert np.all(np.diff(labels[split:]) <= 0)
    assert labels.max() < 1.0
    # The rewound part retraces the forward labels: each frame keeps the label of the frame shown.
    np.testing.assert_array_equal(
        labels[split + 1 :], labels[split - 1 : 2 * split - len(labels) : -1]
    )
    assert value_order_correlation(labels) < value_order_correlation(labels[: split + 1])


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def test_value_order_correlation():
    assert value_order_correlation(np.arange(10.0)) == pytest.approx(1.0)
    assert value_order_correlation(np.arange(10.0)[::-1]) == pytest.approx(-1.0)
    assert value_order_correlation(np.full(10, 0.3)) == 0.0
    assert value_order_correlation(np.array([0.5])) == 0.0
    assert value_order_correlation(np.array([0.0, 2.0, 1.0, 3.0])) == pytest.approx(0.8)
    summary = voc_summary([np.arange(5.0), np.arange(5.0)[::-1], np.ones(5)])
    assert summary == {"mean": 0.0, "median": 0.0, "std": pytest.approx(np.sqrt(2 / 3)), "n": 3}
    with pytest.raises(ValueError):
        voc_summary([])


def test_success_auroc():
    assert success_auroc(np.array([0.1, 0.2, 0.9, 1.0]), np.array([0, 0, 1, 1], bool)) == 1.0
    assert success_auroc(np.array([0.9, 1.0, 0.1, 0.2]), np.array([0, 0, 1, 1], bool)) == 0.0
    # Pairs (success, failure): 0.35 > 0.1, 0.35 < 0.4, 0.8 > both -> 3 of 4.
    scores = np.array([0.1, 0.4, 0.35, 0.8])
    assert success_auroc(scores, np.array([0, 0, 1, 1], bool)) == pytest.approx(0.75)
    assert success_auroc(np.array([0.5, 0.5]), np.array([1, 0], bool)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="both"):
        success_auroc(np.array([0.5, 0.7]), np.array([1, 1], bool))


def test_calibration_error():
    probs = np.array([0.25] * 4 + [0.75] * 4)
    outcome = np.array([1, 0, 0, 0, 1, 1, 1, 0], bool)
    assert calibration_error(probs, outcome) == pytest.approx(0.0, abs=1e-12)
    assert calibration_error(np.full(4, 0.9), np.zeros(4, bool)) == pytest.approx(0.9)
    # Two bins: (0.2 vs 0/2) and (1.0 vs 1/2), each half the samples.
    half = calibration_error(np.array([0.2, 0.2, 1.0, 1.0]), np.array([0, 0, 1, 0], bool))
    assert half == pytest.approx(0.5 * 0.2 + 0.5 * 0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        calibration_error(np.array([1.5]), np.array([True]))


def test_the_summary_line_says_when_a_kind_of_episode_is_missing():
    """A dataset of successes only has no mean final label of failures: the line says so
    instead of printing 'nan on failures'."""
    from embodied.apps.label import LabelSummary

    line = LabelSummary(3, 3, "procedure", 1.0, float("nan")).line()
    assert line.endswith("mean final label 1.000 on successes, no failures"), line
    line = LabelSummary(2, 0, "time", float("nan"), 0.25).line()
    assert line.endswith("mean final label no successes, 0.250 on failures"), line
