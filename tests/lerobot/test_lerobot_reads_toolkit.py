"""LeRobot 0.6 reads every kind of dataset the toolkit writes, computes the same statistics, and
appends to it; both libraries then read the result."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from lerobot_helpers import BACKENDS, KINDS, frames_equal, lerobot_dataset, rollouts

from embodied.datasets import LeRobotDataset, LeRobotDatasetWriter, validate_dataset


def video_keys(dataset: LeRobotDataset) -> list[str]:
    return [k for k, f in dataset.features.items() if f["dtype"] == "video"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_lerobot_reads_every_frame_as_written(toolkit_datasets, kind: str, backend: str) -> None:
    root = toolkit_datasets[kind]
    ours = LeRobotDataset(root)
    theirs = lerobot_dataset(root, backend)
    assert len(theirs) == ours.num_frames and theirs.num_episodes == ours.num_episodes
    for episode in range(ours.num_episodes):
        frames = ours.episode_frames(episode)
        start = ours.episodes_table()[episode]["dataset_from_index"]
        for offset in range(len(frames["index"])):
            item = theirs[start + offset]
            for name, values in frames.items():
                if name in video_keys(ours):
                    # Pixel-identical to what the toolkit decodes, at the size info.json says.
                    image = item[name].permute(1, 2, 0).numpy()
                    assert image.shape == tuple(ours.features[name]["shape"]), (kind, name)
                    np.testing.assert_array_equal(image, values[offset], err_msg=name)
                else:
                    assert frames_equal(item[name].numpy(), values[offset]), (kind, name)
            assert item["task"] == ours.tasks[int(frames["task_index"][offset])]


def test_lossless_frames_are_the_rendered_ones(toolkit_datasets) -> None:
    root = toolkit_datasets["lossless"]
    theirs = lerobot_dataset(root)
    written = rollouts(KINDS["lossless"][0], [0])[0].observations["pixels"]
    images = torch.stack([theirs[i]["observation.image"] for i in range(len(written))])
    np.testing.assert_array_equal(images.permute(0, 2, 3, 1).numpy(), written)


def lerobot_episode_stats(frames: dict, features: dict, tmp_path: Path) -> dict:
    """LeRobot's ``compute_episode_stats`` of an episode's frames (images handed over as PNG
    files, as LeRobot's writer does)."""
    from lerobot.datasets.compute_stats import compute_episode_stats
    from PIL import Image

    data: dict = {}
    for name, values in frames.items():
        if features[name]["dtype"] == "video":
            paths = []
            for i, image in enumerate(values):
                paths.append(str(tmp_path / f"{name}-{i}.png"))
                Image.fromarray(image).save(paths[-1])
            data[name] = paths
        else:
            data[name] = values
    return compute_episode_stats(data, features)


@pytest.mark.parametrize("kind", ["video", "state-only", "two-cameras", "odd-size"])
def test_stats_are_the_ones_lerobot_computes(toolkit_datasets, kind: str, tmp_path: Path) -> None:
    from lerobot.datasets.compute_stats import aggregate_stats

    root = toolkit_datasets[kind]
    ours = LeRobotDataset(root)
    files = sorted((root / "meta/episodes").rglob("*.parquet"))
    rows = sorted(
        (row for path in files for row in pq.read_table(path).to_pylist()),
        key=lambda row: row["episode_index"],
    )
    # Image stats come from the rendered frames (before lossy encoding): render them again.
    written = rollouts(KINDS[kind][0], list(range(len(rows))))
    per_episode = []
    for episode, row in enumerate(rows):
        frames = ours.episode_frames(episode)
        pixels = written[episode].observations.get("pixels", {})
        for camera, images in pixels.items() if isinstance(pixels, dict) else [("", pixels)]:
            frames[f"observation.images.{camera}" if camera else "observation.image"] = images
        expected = lerobot_episode_stats(frames, ours.features, tmp_path)
        assert set(expected) == set(ours.features)
        for name, stats in expected.items():
            for stat, value in stats.items():
                stored = np.array(row[f"stats/{name}/{stat}"])
                assert stored.shape == value.shape, (name, stat)  # LeRobot's nesting
                np.testing.assert_allclose(stored, value, rtol=1e-6, atol=1e-9, err_msg=name)
        per_episode.append(expected)
    aggregate = aggregate_stats(per_episode)
    on_disk = json.loads((root / "meta/stats.json").read_text())
    for name, stats in aggregate.items():
        for stat, value in stats.items():
            np.testing.assert_allclose(on_disk[name][stat], value, rtol=1e-6, err_msg=name)


def test_lerobot_reads_the_padding_as_padding(toolkit_datasets) -> None:
    from lerobot.utils.feature_utils import dataset_to_policy_features

    root = toolkit_datasets["video"]
    ours = LeRobotDataset(root)
    # Only ``action`` is an action output for LeRobot's policies; no column is named like
    # LeRobot's own <key>_is_pad masks.
    policy_features = dataset_to_policy_features(ours.features)
    assert [k for k, f in policy_features.items() if f.type.name == "ACTION"] == ["action"]
    assert not any(name.endswith("_is_pad") for name in ours.features)

    fps = ours.fps
    theirs = lerobot_dataset(root, delta_timestamps={"action": [i / fps for i in range(4)]})
    frames = ours.episode_frames(0)
    last = len(frames["index"]) - 1
    item = theirs[last - 1]  # the window runs two frames past the episode's end
    np.testing.assert_array_equal(item["action_is_pad"].numpy(), [False, False, True, True])
    # Past the end LeRobot repeats the last frame's action: the last executed one, not zeros.
    executed = frames["action"][frames["has_action"]]
    np.testing.assert_array_equal(item["action"][1:].numpy(), np.repeat(executed[-1:], 3, 0))


def lerobot_append(root: Path, frames: dict, task: str) -> None:
    """Append one episode with LeRobot's ``resume`` / ``add_frame`` / ``save_episode``."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset as Recorder

    recorder = Recorder.resume(repo_id=f"local/{root.name}", root=root, video_backend="pyav")
    defaults = ("timestamp", "frame_index", "episode_index", "index", "task_index")
    for i in range(len(frames["index"])):
        frame = {k: np.asarray(v[i]) for k, v in frames.items() if k not in defaults}
        for name, feature in recorder.meta.features.items():
            if name in frame and feature["dtype"] not in ("video", "image"):
                frame[name] = frame[name].reshape(feature["shape"])
        recorder.add_frame({**frame, "task": task})
    recorder.save_episode()
    recorder.finalize()


def test_lerobot_rereads_after_an_append_with_the_object_stats_patched(copy_of) -> None:
    """The second append error on its own: with ``object_pos`` stats patched to LeRobot's (3,),
    LeRobot's re-read still failed on image stats stored flat ("Couldn't cast list<list<double>>
    to double"); they are nested (3, 1, 1), as LeRobot nests them."""
    root = copy_of("two-cameras")
    path = root / "meta/stats.json"
    stats = json.loads(path.read_text())
    for stat, value in stats["object_pos"].items():
        if stat != "count" and np.ndim(value) == 2:
            stats["object_pos"][stat] = value[0]
    path.write_text(json.dumps(stats))
    before = LeRobotDataset(root).num_episodes
    lerobot_append(root, LeRobotDataset(root).episode_frames(0), "appended by LeRobot")
    assert lerobot_dataset(root).num_episodes == before + 1


@pytest.mark.parametrize("kind", KINDS)
def test_lerobot_appends_and_both_read_the_result(copy_of, kind: str) -> None:
    root = copy_of(kind)
    before = LeRobotDataset(root)
    old = before.num_episodes
    frames = before.episode_frames(0)  # re-record episode 0 through LeRobot
    lerobot_append(root, frames, "a task LeRobot added")

    assert validate_dataset(root) == []
    ours = LeRobotDataset(root)
    assert ours.num_episodes == old + 1 and ours.tasks[-1] == "a task LeRobot added"
    added = ours.episode_frames(old)
    for name, values in frames.items():
        if name in video_keys(ours):  # LeRobot re-encoded them (lossy AV1)
            assert added[name].shape == values.shape
            error = np.abs(added[name].astype(int) - values).mean()
            assert error < 12, (name, error)
        elif name not in ("episode_index", "index", "task_index"):
            np.testing.assert_array_equal(added[name], values, err_msg=name)
    episode = ours.episode(old)  # the writer's episode columns are missing: defaults
    assert episode.length == len(frames["index"]) - 1 and episode.seed is None
    assert ours.episode(0).seed == 0  # earlier episodes keep theirs
    stats = json.loads((root / "meta/stats.json").read_text())
    assert stats["index"]["count"] == [ours.num_frames]

    # The toolkit appends after LeRobot did, and LeRobot reads every frame of the result.
    with LeRobotDatasetWriter.open(root) as writer:
        writer.add_episode(rollouts(KINDS[kind][0], [7])[0])
    assert validate_dataset(root) == []
    theirs = lerobot_dataset(root)
    assert len(theirs) == LeRobotDataset(root).num_frames == len(theirs.hf_dataset)
    for index in (0, len(theirs) - 1):
        assert int(theirs[index]["index"]) == index
