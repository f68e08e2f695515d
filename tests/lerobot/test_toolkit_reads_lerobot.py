"""The toolkit reads datasets that LeRobot 0.6 itself wrote (``LeRobotDataset.create`` /
``add_frame`` / ``save_episode`` / ``finalize``) with none of the toolkit's own columns: a video
camera and the state ("plain"), plus an image camera stored as PNG structs ("image"), plus a
2-D feature ("2d"). Each problem the toolkit had with such datasets fails a test of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_helpers import frames_equal, lerobot_dataset

from embodied.apps.cli import main
from embodied.core.policy import Policy
from embodied.datasets import DatasetError, LeRobotDataset, dataset_summary, validate_dataset

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SIZE = 32
TASKS = ["pick up the cube", "push the cube", "pick up the cube"]
LENGTHS = [9, 11, 10]
IMAGE = {"shape": (SIZE, SIZE, 3), "names": ["height", "width", "channels"]}
FEATURES = {
    "observation.images.top": {"dtype": "video", **IMAGE},
    "observation.state": {"dtype": "float32", "shape": (4,), "names": list("abcd")},
    "action": {"dtype": "float32", "shape": (4,), "names": None},
    "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
    "next.done": {"dtype": "bool", "shape": (1,), "names": None},
}
EXTRA = {
    "image": {"observation.images.wrist": {"dtype": "image", **IMAGE}},
    "2d": {"observation.keypoints": {"dtype": "float32", "shape": (2, 3), "names": None}},
}


def lerobot_frames(episode: int, features: dict) -> list[dict]:
    """The frames LeRobot records for an episode (fixed rng per episode)."""
    rng = np.random.default_rng(episode)
    frames = []
    for t in range(LENGTHS[episode]):
        top = np.zeros((SIZE, SIZE, 3), dtype=np.uint8)
        top[..., 0] = 8 * t
        top[4 + t : 12 + t, 6:14] = (200, 60, 30)  # a moving square: smooth enough for AV1
        frame = {
            "observation.images.top": top,
            "observation.images.wrist": rng.integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8),
            "observation.state": rng.normal(size=4).astype(np.float32),
            "observation.keypoints": rng.normal(size=(2, 3)).astype(np.float32),
            "action": rng.uniform(-1, 1, size=4).astype(np.float32),
            "next.reward": np.array([t / 10], dtype=np.float32),
            "next.done": np.array([t == LENGTHS[episode] - 1]),
        }
        frames.append({**{k: v for k, v in frame.items() if k in features}, "task": TASKS[episode]})
    return frames


def features_of(kind: str) -> dict:
    """The features of a recorded kind: "plain", "image" or "2d" (each adds to plain)."""
    return {**FEATURES, **EXTRA.get(kind, {})}


@pytest.fixture(scope="module", params=["plain", "image", "2d"])
def recorded(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A dataset recorded by LeRobot, of each kind."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset as Recorder

    kind, features = request.param, features_of(request.param)
    root = tmp_path_factory.mktemp("recorded") / f"lerobot-{kind}"
    recorder = Recorder.create(repo_id=f"local/{kind}", fps=10, features=features, root=root)
    for episode in range(len(LENGTHS)):
        for frame in lerobot_frames(episode, features):
            recorder.add_frame(frame)
        recorder.save_episode()
    recorder.finalize()
    return kind, root


def test_info_and_validate(recorded, capsys) -> None:
    kind, root = recorded
    assert validate_dataset(root) == []
    summary = dataset_summary(root)
    assert (summary["episodes"], summary["frames"]) == (3, sum(LENGTHS))
    assert summary["tasks"] == ["pick up the cube", "push the cube"]
    assert summary["success_rate"] is None  # LeRobot recorded no success
    for name, feature in EXTRA.get(kind, {}).items():
        assert summary["features"][name] == f"{feature['dtype']} {list(feature['shape'])}"
    assert main(["dataset", "info", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 3
    assert main(["dataset", "validate", str(root)]) == 0
    with pytest.raises(DatasetError, match="episode 0 records no success"):
        LeRobotDataset(root).episode_success()


@pytest.mark.parametrize("recorded", ["2d"], indirect=True)
@pytest.mark.parametrize("command", ["validate", "info"])
def test_a_fresh_cli_process_reads_a_2d_feature(recorded, command: str) -> None:
    """As a user runs it: without Hugging Face ``datasets`` imported (its Array2D type is then
    unknown to pyarrow) the 2-D column was refused as ``object [1]``."""
    _, root = recorded
    code = f"import sys; from embodied.apps.cli import main; sys.exit(main(['dataset', '{command}', sys.argv[1]]))"  # noqa: E501
    done = subprocess.run(
        [sys.executable, "-P", "-c", code, str(root)], capture_output=True, text=True
    )  # noqa: E501
    assert done.returncode == 0, done.stderr[-300:]
    assert "object [1]" not in done.stdout + done.stderr


def test_frames_are_what_lerobot_recorded_and_reads(recorded) -> None:
    kind, root = recorded
    ours, theirs = LeRobotDataset(root), lerobot_dataset(root)
    np.testing.assert_array_equal(ours.episode_lengths(), LENGTHS)  # an action every frame
    start = 0
    for episode, length in enumerate(LENGTHS):
        frames = ours.episode_frames(episode)
        written = lerobot_frames(episode, features_of(kind))
        for name, values in frames.items():
            assert len(values) == length
            if name in written[0] and name != "observation.images.top":  # the video is lossy
                expected = np.stack([f[name] for f in written])
                np.testing.assert_array_equal(values.reshape(expected.shape), expected, name)
        for t in range(length):  # and what LeRobot reads back, video frames included
            item = theirs[start + t]
            for name in features_of(kind):
                value = item[name]
                if name.startswith("observation.images."):
                    value = value.permute(1, 2, 0)  # image features come as floats in [0, 1]
                    if value.is_floating_point():
                        value = (value * 255).round().to(torch.uint8)
                assert frames_equal(frames[name][t], value.numpy()), name
        start += length


def test_episode_maps_lerobot_names_to_a_trajectory(recorded) -> None:
    kind, root = recorded
    dataset = LeRobotDataset(root)
    cameras = {"top", "wrist"} if kind == "image" else {"top"}
    for episode, length in enumerate(LENGTHS):
        traj = dataset.episode(episode)
        frames = lerobot_frames(episode, features_of(kind))
        # N frames hold N observations; the last action has no observation after it.
        assert traj.length == length - 1 and traj.instruction == TASKS[episode]
        assert traj.seed is None and not traj.success and traj.task == ""
        assert set(traj.observations["pixels"]) == cameras
        assert traj.observations["pixels"]["top"].shape == (length, SIZE, SIZE, 3)
        if kind == "2d":
            assert traj.observations["keypoints"].shape == (length, 2, 3)
        np.testing.assert_array_equal(traj.observations["agent_pos"],
                                      [f["observation.state"] for f in frames])  # fmt: skip
        np.testing.assert_array_equal(traj.actions, [f["action"] for f in frames[:-1]])
        np.testing.assert_array_equal(traj.rewards, [f["next.reward"][0] for f in frames[:-1]])
        np.testing.assert_array_equal(traj.terminated, np.zeros(length - 1, dtype=bool))


@pytest.mark.parametrize("recorded", ["image"], indirect=True)  # a video and an image camera
def test_bc_trains_on_a_dataset_lerobot_wrote(recorded, tmp_path: Path) -> None:
    _, root = recorded
    cameras = "[observation.images.top,observation.images.wrist]"
    code = main(
        [
            "train", "bc", str(CONFIGS / "bc_diffusion.yaml"), f"dataset={root}",
            f"out={tmp_path}", "steps=2", "batch_size=4", "horizon=8", "eval_episodes=0",
            "save_every=2", "log_every=1", "policy_overrides.env_state_encoder=flat",
            f"policy_overrides.image_keys={cameras}", "policy_overrides.vision_channels=[8,8,8]",
        ]
    )  # fmt: skip
    assert code == 0
    policy = Policy.from_pretrained(next(tmp_path.glob("*/policy")))
    spec = policy.observation_spec
    assert spec.cameras == {
        "observation.images.top": (SIZE, SIZE),
        "observation.images.wrist": (SIZE, SIZE),
    }
    assert (spec.state_dim, list(spec.state_names), spec.privileged) == (4, list("abcd"), False)
