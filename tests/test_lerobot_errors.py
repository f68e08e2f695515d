"""LeRobot datasets gone wrong: trajectories that do not match the dataset, corrupted files and
metadata that fail with a clear message, and a writer killed mid-write leaving a valid dataset."""

from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from processes import wait_until
from test_lerobot import make_trajectory, without_pixels, write

from embodied.core.trajectory import trajectories_equal
from embodied.datasets import DatasetError, LeRobotDataset, LeRobotDatasetWriter, validate_dataset

# ---------------------------------------------------------------------------------------------
# Errors: bad trajectories, corrupted datasets, killed writers
# ---------------------------------------------------------------------------------------------


def test_mismatched_trajectories_raise_naming_the_key(tmp_path: Path) -> None:
    base = make_trajectory(0)
    small_wrist = make_trajectory(1, size=32)
    small_wrist.observations["pixels"]["front"] = make_trajectory(1).observations["pixels"]["front"]
    no_state = make_trajectory(2)
    del no_state.observations["environment_state"]
    extra_info = make_trajectory(3)
    extra_info.info["collisions"] = np.zeros(extra_info.length, dtype=np.int64)

    with LeRobotDatasetWriter(tmp_path / "dataset") as writer:
        writer.add_episode(base)
        with pytest.raises(
            ValueError, match=r"observations/pixels/wrist.*\(32, 32, 3\).*\(48, 48, 3\)"
        ):
            writer.add_episode(small_wrist)
        with pytest.raises(ValueError, match="lacks observations/environment_state"):
            writer.add_episode(no_state)
        with pytest.raises(ValueError, match="has info/collisions"):
            writer.add_episode(extra_info)
        with pytest.raises(ValueError, match="seed"):
            writer.add_episode(dataclasses.replace(base, seed=-1))
        writer.add_episode(make_trajectory(4))  # the writer is still usable
    assert LeRobotDataset(tmp_path / "dataset").num_episodes == 2

    with pytest.raises(FileExistsError):
        LeRobotDatasetWriter(tmp_path / "dataset")


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> Path:
    """A valid dataset with two data files and two video files per camera."""
    root = tmp_path_factory.mktemp("small") / "dataset"
    write(root, [make_trajectory(i) for i in range(4)], data_file_size_mb=0.005)
    assert len(list((root / "data").rglob("*.parquet"))) == 2
    return root


def truncate(path: Path) -> None:
    """Cut a file in half."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def edit_info(root: Path, change) -> None:
    """Apply ``change`` to meta/info.json."""
    info = json.loads((root / "meta/info.json").read_text())
    change(info)
    (root / "meta/info.json").write_text(json.dumps(info))


CORRUPTIONS = {
    "deleted data file": (
        lambda root: (root / "data/chunk-000/file-001.parquet").unlink(),
        r"data/chunk-000/file-001\.parquet: missing",
    ),
    "truncated parquet": (
        lambda root: truncate(root / "data/chunk-000/file-000.parquet"),
        r"data/chunk-000/file-000\.parquet: unreadable or truncated parquet",
    ),
    "edited total_frames": (
        lambda root: edit_info(
            root, lambda info: info.update(total_frames=info["total_frames"] + 1)
        ),
        r"meta/info\.json: total_frames = 53 but the episodes metadata holds 52 frames",
    ),
    "unsupported version": (
        lambda root: edit_info(root, lambda info: info.update(codebase_version="v2.1")),
        r"reads v3\.0, got v2\.1",
    ),
    "feature shape": (
        lambda root: edit_info(
            root, lambda info: info["features"]["observation.state"].update(shape=[5])
        ),
        r"file-000\.parquet: column 'observation\.state' holds float32 \[4\] but .* \[5\]",
    ),
    "deleted video": (
        lambda root: (root / "videos/observation.images.wrist/chunk-000/file-001.mp4").unlink(),
        r"videos/observation\.images\.wrist/chunk-000/file-001\.mp4: missing",
    ),
    "truncated video": (
        lambda root: truncate(root / "videos/observation.images.front/chunk-000/file-000.mp4"),
        r"file-000\.mp4: unreadable video",
    ),
    "missing stats": (
        lambda root: (root / "meta/stats.json").unlink(),
        r"meta/stats\.json: missing",
    ),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupted_datasets_fail_with_a_clear_message(
    tmp_path: Path, small_dataset: Path, corruption: str
) -> None:
    root = tmp_path / "dataset"
    shutil.copytree(small_dataset, root)
    corrupt, message = CORRUPTIONS[corruption]
    corrupt(root)
    with pytest.raises(DatasetError, match=message):
        validate_dataset(root)
    with pytest.raises(DatasetError, match=message):
        LeRobotDataset(root)


KILLED_WRITER = """
import sys
sys.path.insert(0, {tests!r})
from test_lerobot import make_trajectory
from embodied.datasets import LeRobotDatasetWriter

writer = LeRobotDatasetWriter.open({root!r}, data_file_size_mb=0.003, video_file_size_mb=0.003)
index = {first}
while True:
    writer.add_episode(make_trajectory(index))
    index += 1
"""


def kill_writer_after(root: Path, first: int, new_data_files: int, delay: float) -> None:
    """Append episodes first, first+1, ... in a subprocess; SIGKILL it mid-write.

    The kill comes ``delay`` seconds after the ``new_data_files``-th new data file appeared.
    """

    def data_files() -> int:
        return len(list((root / "data").rglob("*.parquet")))

    target = data_files() + new_data_files
    script = KILLED_WRITER.format(tests=str(Path(__file__).parent), root=str(root), first=first)
    process = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    try:
        wait_until(lambda: data_files() >= target, process, f"{new_data_files} new data files")
        time.sleep(delay)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
        process.stderr.close()


def test_killed_writer_leaves_a_valid_dataset(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    write(root, [make_trajectory(i) for i in range(3)])
    sources = [0, 1, 2]  # make_trajectory index of each episode

    for round_number, (first, delay) in enumerate([(100, 0.0), (200, 0.03)]):
        kill_writer_after(root, first, new_data_files=3, delay=delay)
        warnings = validate_dataset(root)  # raises if the metadata references broken files
        print(f"\nafter kill {round_number + 1}: warnings {warnings}")
        dataset = LeRobotDataset(root)
        # Two batches at least were committed before the third new data file appeared.
        assert dataset.num_episodes >= len(sources) + 2
        sources += [first + j for j in range(dataset.num_episodes - len(sources))]
        for episode, source in enumerate(sources):
            read = without_pixels(dataset.episode(episode))
            assert trajectories_equal(read, without_pixels(make_trajectory(source))), episode

    with LeRobotDatasetWriter.open(root) as writer:  # appending after a crash works
        writer.add_episode(make_trajectory(300))
    dataset = LeRobotDataset(root)
    assert dataset.num_episodes == len(sources) + 1
    last = without_pixels(dataset.episode(len(sources)))
    assert trajectories_equal(last, without_pixels(make_trajectory(300)))
    # open() dropped the killed writer's uncommitted episodes files; orphans may remain.
    assert not [w for w in validate_dataset(root) if "beyond total_episodes" in w]
