"""LeRobot v3.0 datasets: exact round trips, on-disk layout, random access, value names, appends,
labels. Bad trajectories, corrupted datasets and killed writers are in test_lerobot_errors.py."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from embodied.core.trajectory import Trajectory, trajectories_equal
from embodied.datasets import (
    LeRobotDataset,
    LeRobotDatasetWriter,
    dataset_summary,
    validate_dataset,
)

CAMERAS = ("front", "wrist")


def make_trajectory(index: int, steps: int = 12, size: int = 48) -> Trajectory:
    """A synthetic episode (fixed rng per index) with two cameras, info, decisions, reset info."""
    rng = np.random.default_rng(index)
    yy, xx = np.mgrid[0:size, 0:size]
    pixels = {}
    for offset, camera in enumerate(CAMERAS):
        frames = np.empty((steps + 1, size, size, 3), dtype=np.uint8)
        for t in range(steps + 1):
            frames[t, ..., 0] = (2 * xx + 3 * t) % 256
            frames[t, ..., 1] = (2 * yy + 40 * offset) % 256
            frames[t, ..., 2] = (50 * index) % 256
            frames[t, 8 + t : 16 + t, 10:18] = (230, 40, 40)
        pixels[camera] = frames
    decision_steps = np.arange(0, steps, 3, dtype=np.int64)
    terminated = np.zeros(steps, dtype=bool)
    terminated[-1] = index % 2 == 0
    return Trajectory(
        observations={
            "agent_pos": rng.normal(size=(steps + 1, 4)).astype(np.float32),
            "environment_state": rng.normal(size=(steps + 1, 10)).astype(np.float32),
            "pixels": pixels,
        },
        actions=rng.uniform(-1, 1, size=(steps, 4)).astype(np.float32),
        rewards=rng.normal(size=steps).astype(np.float32),
        terminated=terminated,
        truncated=~terminated & (np.arange(steps) == steps - 1),
        success=bool(terminated[-1]),
        instruction=f"synthetic task {index % 2}",
        task="Synthetic",
        suite="synthetic",
        seed=index if index % 3 else None,
        info={
            "stage": np.minimum(np.arange(1, steps + 1) // 4, 2).astype(np.int64),
            "progress": np.linspace(0.1, 1.0, steps, dtype=np.float32),
            "ee_pos": rng.normal(size=(steps, 3)).astype(np.float32),
        },
        policy_outputs={
            "tokens": rng.integers(0, 256, size=(len(decision_steps), 4)),
            "log_prob": rng.normal(size=len(decision_steps)).astype(np.float32),
        },
        decision_steps=decision_steps,
        metadata={"reset_info": {"stage": 0, "progress": 0.0, "ee_pos": [0.5, -0.25, 0.125]}},
    )


@pytest.fixture(scope="module")
def sim_trajectories() -> list[Trajectory]:
    """Tabletop rollouts (two 48 px cameras, environment_state, privileged info, reset info)."""
    import embodied.sims as sims
    from embodied.rollout.episodes import rollout_episode

    env = sims.make("PickPlace", image_size=48, obs_mode="pixels_state", cameras=CAMERAS)
    expert = sims.make_expert(env)
    trajectories = [
        rollout_episode(env, expert, seed=0, suite="tabletop", max_steps=30),
        rollout_episode(env, expert, seed=1, suite="tabletop", max_steps=40),
        rollout_episode(env, expert, seed=2, suite="tabletop"),  # runs to success
    ]
    env.close()
    # Per-decision policy outputs (a decision every 5 steps), and one episode without a seed.
    for index, traj in enumerate(trajectories):
        decisions = np.arange(0, traj.length, 5, dtype=np.int64)
        trajectories[index] = dataclasses.replace(
            traj,
            policy_outputs={"log_prob": np.linspace(-1, 0, len(decisions), dtype=np.float32)},
            decision_steps=decisions,
            seed=None if index == 1 else traj.seed,
        )
    return trajectories


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 image stacks, in dB."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255**2 / mse))


def without_pixels(traj: Trajectory) -> Trajectory:
    """The trajectory with its camera images left out (compared separately, with a tolerance)."""
    observations = {k: v for k, v in traj.observations.items() if k != "pixels"}
    return dataclasses.replace(traj, observations=observations)


def write(root: Path, trajectories: list[Trajectory], **options) -> None:
    """Write trajectories into a new dataset."""
    with LeRobotDatasetWriter(root, **options) as writer:
        for traj in trajectories:
            writer.add_episode(traj)


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "min_psnr"),
    [
        # The default keeps full colour resolution (yuv444p, crf 20): 33-37 dB on 48 px renders.
        # yuv420p halves colour resolution: on these renders the RGB->YUV conversion alone caps
        # PSNR at 26-29 dB, whatever the crf.
        ({}, 32.0),
        ({"pix_fmt": "yuv420p"}, 24.0),
        ({"crf": 15}, 35.0),
        ({"lossless": True}, float("inf")),
    ],
    ids=["default-yuv444p", "yuv420p", "yuv444p-crf15", "lossless"],
)
def test_round_trip_is_exact_except_for_lossy_images(
    tmp_path: Path, sim_trajectories: list[Trajectory], options: dict, min_psnr: float
) -> None:
    root = tmp_path / "dataset"
    num_frames = sum(t.length + 1 for t in sim_trajectories)
    start = time.perf_counter()
    write(root, sim_trajectories, **options)
    write_time = time.perf_counter() - start
    assert validate_dataset(root) == []

    dataset = LeRobotDataset(root)
    assert dataset.num_episodes == len(sim_trajectories)
    assert len(dataset) == dataset.num_frames == num_frames
    assert dataset.tasks == list(dict.fromkeys(t.instruction for t in sim_trajectories))
    start = time.perf_counter()
    episodes = [dataset.episode(i) for i in range(dataset.num_episodes)]
    read_time = time.perf_counter() - start
    print(
        f"\n{options or 'yuv444p crf 20'}: write {num_frames / write_time:.0f} frames/s, "
        f"read {num_frames / read_time:.0f} frames/s (2 cameras, 48x48)"
    )
    for written, read in zip(sim_trajectories, episodes, strict=True):
        assert trajectories_equal(without_pixels(written), without_pixels(read))
        for camera in CAMERAS:
            original = written.observations["pixels"][camera]
            decoded = read.observations["pixels"][camera]
            assert decoded.dtype == np.uint8 and decoded.shape == original.shape
            quality = psnr(original, decoded)
            print(f"  episode {written.seed} {camera}: PSNR {quality:.2f} dB")
            assert quality >= min_psnr
        if min_psnr == float("inf"):
            assert trajectories_equal(written, read)


def test_on_disk_layout_follows_lerobot_v3(tmp_path: Path, sim_trajectories) -> None:
    root = tmp_path / "dataset"
    traj = sim_trajectories[0]
    write(root, [traj], lossless=True)

    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert (info["fps"], info["robot_type"], info["chunks_size"]) == (16, "embodied-gantry", 1000)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["splits"] == {"train": "0:1"}
    assert info["total_frames"] == traj.length + 1 and info["total_tasks"] == 1
    features = info["features"]
    assert features["observation.images.front"]["dtype"] == "video"
    assert features["observation.images.front"]["shape"] == [48, 48, 3]
    assert features["observation.state"]["trajectory_field"] == "observations/agent_pos"
    assert features["progress.privileged"]["trajectory_field"] == "info/progress"
    assert features["timestamp"] == {"dtype": "float32", "shape": [1], "names": None}
    assert (root / "videos/observation.images.wrist/chunk-000/file-000.mp4").is_file()

    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks.column("task").to_pylist() == [traj.instruction]
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["task"]
    episode = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()[0]
    assert episode["length"] == traj.length + 1 and episode["tasks"] == [traj.instruction]
    assert episode["videos/observation.images.front/to_timestamp"] == (traj.length + 1) / 16
    assert episode["seed"] == 0 and episode["task_name"] == "PickPlace"
    assert len(episode["stats/observation.state/mean"]) == 4
    # LeRobot's nesting: images per channel (3, 1, 1), counts as a one-element list.
    assert np.array(episode["stats/observation.images.front/mean"]).shape == (3, 1, 1)
    assert episode["stats/object_pos/count"] == [traj.length + 1]

    frames = LeRobotDataset(root).episode_frames(0)
    steps = traj.length
    np.testing.assert_array_equal(frames["frame_index"], np.arange(steps + 1))
    np.testing.assert_array_equal(frames["timestamp"], np.arange(steps + 1, dtype=np.float32) / 16)
    assert frames["timestamp"].dtype == np.float32
    # The final observation's action repeats the last one executed; has_action marks it.
    np.testing.assert_array_equal(frames["action"][-1], traj.actions[-1])
    np.testing.assert_array_equal(frames["has_action"], np.arange(steps + 1) < steps)
    assert "action_is_pad" not in frames
    np.testing.assert_array_equal(frames["next.done"][:steps], traj.terminated | traj.truncated)
    assert not frames["next.done"][steps] and not frames["next.reward"][steps]
    # info[t] describes the observation after step t (frame t+1); frame 0 is the reset info.
    np.testing.assert_array_equal(frames["stage"][1:], traj.info["stage"])
    reset = traj.metadata["reset_info"]
    assert frames["progress.privileged"][0] == np.float32(reset["progress"])
    np.testing.assert_array_equal(frames["ee_pos"][0], np.float32(reset["ee_pos"]))
    np.testing.assert_array_equal(frames["object_pos"][0], np.float32(reset["object_pos"]))
    np.testing.assert_array_equal(np.flatnonzero(frames["decision_mask"]), traj.decision_steps)
    np.testing.assert_array_equal(
        frames["observation.images.wrist"][5], traj.observations["pixels"]["wrist"][5]
    )

    stats = LeRobotDataset(root).stats
    assert stats["observation.images.front"]["mean"].shape == (3, 1, 1)
    assert stats["observation.state"]["q50"].shape == (4,)
    # LeRobot's shapes: a [N, 8, 3] feature's stats run over its last axis; every frame counts.
    assert stats["object_pos"]["max"].shape == (3,)
    np.testing.assert_allclose(
        stats["object_pos"]["max"], frames["object_pos"].reshape(-1, 3).max(axis=0)
    )
    assert stats["next.reward"]["count"][0] == steps + 1
    assert stats["observation.state"]["count"][0] == steps + 1
    np.testing.assert_allclose(
        stats["observation.state"]["mean"], traj.observations["agent_pos"].mean(axis=0), rtol=1e-5
    )

    summary = dataset_summary(root)
    assert (summary["episodes"], summary["frames"], summary["fps"]) == (1, steps + 1, 16)
    assert summary["success_rate"] == float(traj.success)
    assert summary["video_codec"] == "h264 (gbrp)" and summary["size_bytes"] > 0
    assert summary["features"]["object_pos"] == "float32 [8, 3]"


def test_frame_random_access_lands_on_the_right_frame(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    trajectories = [make_trajectory(i, steps=10 + 3 * i) for i in range(5)]
    # Tiny size limits: the episodes spread over several data and video files.
    write(root, trajectories, lossless=True, data_file_size_mb=0.004, video_file_size_mb=0.004)
    assert len(list((root / "data").rglob("*.parquet"))) > 1
    dataset = LeRobotDataset(root)
    assert validate_dataset(root) == []

    for episode, traj in enumerate(trajectories):
        frames = dataset.episode_frames(episode)
        start = dataset.episodes_table()[episode]["dataset_from_index"]
        for k in sorted({0, 1, traj.length // 2, traj.length}):
            frame = dataset.frame(start + k)
            assert frame.keys() == frames.keys()
            for name, values in frames.items():
                np.testing.assert_array_equal(frame[name], values[k], err_msg=name)
            for camera in CAMERAS:  # the k-th image written, bit-exact (lossless)
                written = traj.observations["pixels"][camera][k]
                np.testing.assert_array_equal(frame[f"observation.images.{camera}"], written)
            assert frame["index"] == start + k and frame["episode_index"] == episode
    with pytest.raises(IndexError):
        dataset.frame(len(dataset))


def test_lossy_frames_decode_in_order(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    trajectories = [make_trajectory(i, steps=20) for i in range(3)]
    write(root, trajectories)
    dataset = LeRobotDataset(root)
    written = np.concatenate([t.observations["pixels"]["front"] for t in trajectories])
    decoded = np.concatenate(
        [dataset.episode_frames(e)["observation.images.front"] for e in range(3)]
    )
    # Each decoded frame is closest to the frame written at its position (no off-by-one).
    for i in range(0, len(written), 7):
        errors = [np.abs(decoded[i].astype(int) - w).mean() for w in written]
        assert int(np.argmin(errors)) == i


@pytest.mark.parametrize("lossless", [True, False], ids=["lossless", "yuv444p"])
def test_single_camera_with_odd_size(tmp_path: Path, lossless: bool) -> None:
    import av

    trajectories = []
    for i in range(2):
        traj = make_trajectory(i, size=45)
        traj.observations["pixels"] = traj.observations["pixels"]["front"]
        trajectories.append(traj)
    write(tmp_path / "dataset", trajectories, lossless=lossless)
    dataset = LeRobotDataset(tmp_path / "dataset")
    assert dataset.features["observation.image"]["shape"] == [45, 45, 3]
    # Encoded at the size info.json records, not padded: any reader gets 45x45 frames.
    video = tmp_path / "dataset/videos/observation.image/chunk-000/file-000.mp4"
    with av.open(str(video)) as container:
        context = container.streams.video[0].codec_context
        assert (context.height, context.width) == (45, 45)
    for written, read in zip(trajectories, map(dataset.episode, range(2)), strict=True):
        assert read.observations["pixels"].shape == (13, 45, 45, 3)
        assert trajectories_equal(without_pixels(read), without_pixels(written))
        assert trajectories_equal(read, written) == lossless


def test_odd_sizes_in_yuv420p_are_refused_not_padded(tmp_path: Path) -> None:
    traj = make_trajectory(0, size=45)
    with pytest.raises(ValueError, match=r"observation.images.front: yuv420p .* got 45x45"):
        write(tmp_path / "dataset", [traj], pix_fmt="yuv420p")


def test_value_names_are_recorded_and_checked(tmp_path: Path) -> None:
    """``names=`` labels state values in info.json (LeRobot's ``names``); a wrong count or an
    observation the episodes lack fails before anything is written, naming the feature."""
    labels = [f"object_{i // 2}.{'xy'[i % 2]}" for i in range(10)]
    root = tmp_path / "named"
    write(root, [make_trajectory(0)], names={"environment_state": labels}, lossless=True)
    features = LeRobotDataset(root).features
    assert features["observation.environment_state"]["names"] == labels
    assert features["observation.state"]["names"] is None
    with LeRobotDatasetWriter.open(root) as writer:  # appending keeps them
        writer.add_episode(make_trajectory(1))
    assert LeRobotDataset(root).features["observation.environment_state"]["names"] == labels

    with pytest.raises(ValueError, match=r"3 names given for 'observation.state'"):
        write(tmp_path / "short", [make_trajectory(0)], names={"agent_pos": ["a", "b", "c"]})
    with pytest.raises(ValueError, match=r"names given for \['observation.gripper'\]"):
        write(tmp_path / "unknown", [make_trajectory(0)], names={"gripper": ["gap"]})


# ---------------------------------------------------------------------------------------------
# Appending and labelling
# ---------------------------------------------------------------------------------------------


def file_bytes(root: Path) -> dict[str, bytes]:
    """Contents of every data and video file."""
    paths = [*(root / "data").rglob("*.parquet"), *(root / "videos").rglob("*.mp4")]
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in paths}


def test_open_appends_and_keeps_earlier_episodes(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    first = [make_trajectory(i) for i in range(2)]
    write(root, first, lossless=True)
    before = file_bytes(root)

    with LeRobotDatasetWriter.open(root) as writer:
        assert writer.num_episodes == 2
        for i in range(2, 4):
            assert writer.add_episode(make_trajectory(i)) == i
    after = file_bytes(root)
    assert all(after[name] == content for name, content in before.items())  # untouched
    assert len(after) == 2 * len(before)  # one new data file and one new video per camera

    assert validate_dataset(root) == []
    dataset = LeRobotDataset(root)
    assert dataset.num_episodes == 4 and dataset.tasks == ["synthetic task 0", "synthetic task 1"]
    for i in range(4):
        assert trajectories_equal(dataset.episode(i), make_trajectory(i))
    assert [row["dataset_from_index"] for row in dataset.episodes_table()] == [0, 13, 26, 39]
    np.testing.assert_array_equal(dataset.episode_lengths(), [12] * 4)
    np.testing.assert_array_equal(dataset.episode_success(), [True, False, True, False])
    np.testing.assert_array_equal(dataset.episode_frames(2)["index"], np.arange(26, 39))
    assert dataset.stats["index"]["count"][0] == 52
    states = np.concatenate([make_trajectory(i).observations["agent_pos"] for i in range(4)])
    stats = dataset.stats["observation.state"]  # aggregated from per-episode stats
    np.testing.assert_allclose(stats["mean"], states.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(stats["std"], states.std(axis=0), rtol=1e-5)
    np.testing.assert_array_equal(stats["min"], states.min(axis=0))

    (root / "data/chunk-000/file-099.parquet").write_bytes(b"stray")
    assert validate_dataset(root) == [
        "data/chunk-000/file-099.parquet: not referenced by the metadata (interrupted write?)"
    ]


def test_add_frame_feature_round_trip(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    trajectories = [make_trajectory(i, steps=8 + i) for i in range(3)]
    write(root, trajectories, lossless=True, data_file_size_mb=0.004)
    dataset = LeRobotDataset(root)
    labels = [np.linspace(0, 1, t.length + 1, dtype=np.float32) for t in trajectories]

    with pytest.raises(ValueError, match="one per frame"):
        dataset.add_frame_feature("progress.label", [label[:-1] for label in labels])
    with pytest.raises(ValueError, match="has a feature 'stage' already"):
        dataset.add_frame_feature("stage", labels, overwrite=True)
    dataset.add_frame_feature("progress.label", [2 * label for label in labels])
    with pytest.raises(ValueError, match="overwrite=True"):
        dataset.add_frame_feature("progress.label", labels)
    # A labeller may also go through an opened writer; this relabels, and closes the writer.
    writer = LeRobotDatasetWriter.open(root)
    writer.add_frame_feature("progress.label", labels, info={"method": "linear"}, overwrite=True)
    with pytest.raises(ValueError, match="closed"):
        writer.add_episode(make_trajectory(5))

    assert validate_dataset(root) == []
    dataset = LeRobotDataset(root)
    feature = dataset.features["progress.label"]
    assert feature == {
        "dtype": "float32",
        "shape": [1],
        "names": None,
        "info": {"method": "linear"},
    }
    for episode, label in enumerate(labels):
        np.testing.assert_array_equal(dataset.episode_frames(episode)["progress.label"], label)
        assert dataset.episode_frames(episode, keys=["progress.label"]).keys() == {"progress.label"}
    assert dataset.frame(1)["progress.label"] == labels[0][1]
    assert dataset.stats["progress.label"]["max"][0] == 1.0
    assert trajectories_equal(dataset.episode(2), trajectories[2])  # Trajectories are unchanged
    with pytest.raises(KeyError, match="progress.other"):
        dataset.episode_frames(0, keys=["progress.other"])
    with (
        LeRobotDatasetWriter.open(root) as writer,
        pytest.raises(ValueError, match="progress.label"),
    ):
        writer.add_episode(make_trajectory(5))  # trajectories cannot carry the label
