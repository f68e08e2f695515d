"""The writer's safety: commits as episodes finish, one writer at a time, Ctrl-C and failures
mid-write, leftovers of killed writers, appends that must match the dataset's settings."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_lerobot import make_trajectory, write

import embodied.datasets.lerobot.writer as writer_module
from embodied.apps.cli import main
from embodied.core.trajectory import trajectories_equal
from embodied.datasets import (
    DatasetBusyError,
    LeRobotDataset,
    LeRobotDatasetWriter,
    validate_dataset,
)
from embodied.datasets.lerobot.videos import _VideoEncoder


def episodes_on_disk(root: Path) -> int:
    """Committed episodes, as a reader sees them while the writer is still open."""
    return LeRobotDataset(root).num_episodes if (root / "meta/info.json").exists() else 0


def all_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".embodied.lock"
    }


# ---------------------------------------------------------------------------------------------
# When episodes are committed
# ---------------------------------------------------------------------------------------------


def test_every_episode_is_committed_when_the_interval_is_zero(tmp_path: Path) -> None:
    root = tmp_path / "data"
    with LeRobotDatasetWriter(root, lossless=True, commit_interval_s=0) as writer:
        for index in range(3):
            writer.add_episode(make_trajectory(index))
            assert episodes_on_disk(root) == index + 1  # readable while the writer goes on
    assert validate_dataset(root) == []
    # One data, episodes and video file per commit; files of earlier commits never change.
    assert len(list((root / "data").rglob("*.parquet"))) == 3


def test_fast_episodes_wait_for_the_interval_slow_ones_do_not(tmp_path: Path) -> None:
    fast = tmp_path / "fast"
    with LeRobotDatasetWriter(fast, lossless=True, commit_interval_s=60) as writer:
        for index in range(4):
            writer.add_episode(make_trajectory(index))
        # The first episode is committed at once (the dataset exists from then on); the others
        # arrive faster than the interval and wait for it, or for close.
        assert episodes_on_disk(fast) == 1
        writer.flush()
        assert episodes_on_disk(fast) == 4
        writer.add_episode(make_trajectory(4))
        assert episodes_on_disk(fast) == 4
    assert episodes_on_disk(fast) == 5

    slow = tmp_path / "slow"
    with LeRobotDatasetWriter(slow, lossless=True, commit_interval_s=0.2) as writer:
        for index in range(3):
            time.sleep(0.25)  # episodes slower than the interval: each is committed as it comes
            writer.add_episode(make_trajectory(index))
            assert episodes_on_disk(slow) == index + 1


def test_lossy_frames_do_not_depend_on_where_files_were_cut(tmp_path: Path) -> None:
    # The writer cuts files by wall-clock time; an episode must decode to the same frames in any
    # file and after any episodes (progress labels come from decoded frames).
    trajectories = [make_trajectory(index, steps=40) for index in range(3)]
    one_file, per_episode = tmp_path / "one", tmp_path / "each"
    write(one_file, trajectories, commit_interval_s=60)
    write(per_episode, trajectories, commit_interval_s=0)
    # The first episode is committed at once, the other two together (per camera).
    assert len(list((one_file / "videos").rglob("*.mp4"))) == 4
    assert len(list((per_episode / "videos").rglob("*.mp4"))) == 6
    together, alone = LeRobotDataset(one_file), LeRobotDataset(per_episode)
    for index in range(3):
        a, b = together.episode(index), alone.episode(index)
        for camera, frames in a.observations["pixels"].items():
            assert np.array_equal(frames, b.observations["pixels"][camera]), (index, camera)
    assert validate_dataset(one_file) == []


# ---------------------------------------------------------------------------------------------
# One writer at a time
# ---------------------------------------------------------------------------------------------


def test_a_second_writer_fails_naming_the_first(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write(root, [make_trajectory(0)], lossless=True)
    writer = LeRobotDatasetWriter.open(root)
    busy = rf"{root} is being written by another process \(pid \d+ on .*\)"
    with pytest.raises(DatasetBusyError, match=busy):
        LeRobotDatasetWriter.open(root)
    dataset = LeRobotDataset(root)  # readers take no lock
    with pytest.raises(DatasetBusyError, match=busy):
        dataset.add_frame_feature("progress.label", [np.zeros(13, np.float32)])
    writer.add_episode(make_trajectory(1))
    writer.close()
    with LeRobotDatasetWriter.open(root) as again:  # released on close
        again.add_episode(make_trajectory(2))
    assert LeRobotDataset(root).num_episodes == 3


HOLD_LOCK = """
import sys, time
from embodied.datasets import LeRobotDatasetWriter
writer = LeRobotDatasetWriter.open(sys.argv[1])
print("locked", flush=True)
time.sleep(60)
"""


def test_the_lock_dies_with_its_process(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = tmp_path / "data"
    write(root, [make_trajectory(0)], lossless=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(DatasetBusyError, match=rf"pid {holder.pid} on .*, running"):
            LeRobotDatasetWriter.open(root)
        # `embodied label` writes the dataset too: it waits for no one and overwrites nothing.
        assert main(["label", str(root)]) == 2
        err = capsys.readouterr().err.strip()
        assert re.fullmatch(rf"embodied label: error: .* \(pid {holder.pid} on .*", err), err
        assert "progress.label" not in LeRobotDataset(root).features
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    with LeRobotDatasetWriter.open(root) as writer:  # no stale lock to remove by hand
        writer.add_episode(make_trajectory(1))


# ---------------------------------------------------------------------------------------------
# Ctrl-C and failures while writing
# ---------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("ctrl_c_handled")
def test_ctrl_c_during_add_episode_keeps_the_episode(tmp_path: Path, monkeypatch) -> None:
    """SIGINT while an episode's frames are encoded (or while a commit writes files) is raised
    once that is done: the episode is in, and closing commits it."""
    root = tmp_path / "data"
    add = _VideoEncoder.add
    calls = []

    def interrupted_add(self, frames, encoded=None):
        calls.append(1)
        if len(calls) == 3:  # the second episode's first camera
            signal.raise_signal(signal.SIGINT)
        return add(self, frames, encoded)

    monkeypatch.setattr(_VideoEncoder, "add", interrupted_add)
    trajectories = [make_trajectory(i) for i in range(2)]
    with pytest.raises(KeyboardInterrupt), LeRobotDatasetWriter(root, lossless=True) as writer:
        for traj in trajectories:
            writer.add_episode(traj)
        pytest.fail("the interrupt must stop the loop")
    assert len(calls) == 4  # both cameras of the second episode were encoded
    dataset = LeRobotDataset(root)
    assert dataset.num_episodes == 2 and validate_dataset(root) == []
    for index, traj in enumerate(trajectories):
        assert trajectories_equal(dataset.episode(index), traj)

    write_parquet = writer_module._write_parquet

    def interrupted_write(path, table, compact=False):
        signal.raise_signal(signal.SIGINT)
        return write_parquet(path, table, compact)

    monkeypatch.setattr(writer_module, "_write_parquet", interrupted_write)
    with (
        pytest.raises(KeyboardInterrupt),
        LeRobotDatasetWriter.open(root, commit_interval_s=0) as writer,
    ):
        writer.add_episode(make_trajectory(2))
    monkeypatch.setattr(writer_module, "_write_parquet", write_parquet)
    assert LeRobotDataset(root).num_episodes == 3 and validate_dataset(root) == []


def test_a_failing_write_keeps_the_episodes_finished_before(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "data"
    add = _VideoEncoder.add
    calls = []

    def full_disk(self, frames, encoded=None):
        calls.append(1)
        if len(calls) == 7:  # the fourth episode's first camera
            raise OSError(28, "No space left on device")
        return add(self, frames, encoded)

    monkeypatch.setattr(_VideoEncoder, "add", full_disk)
    writer = LeRobotDatasetWriter(root, lossless=True, commit_interval_s=60)
    for index in range(3):  # the first is committed at once, two wait for the interval
        writer.add_episode(make_trajectory(index))
    with pytest.raises(OSError, match="No space left"):
        writer.add_episode(make_trajectory(3))
    with pytest.raises(ValueError, match="closed"):
        writer.add_episode(make_trajectory(4))
    dataset = LeRobotDataset(root)  # the buffered episodes were committed before it closed
    assert dataset.num_episodes == 3 and validate_dataset(root) == []
    assert trajectories_equal(dataset.episode(2), make_trajectory(2))


def test_an_interrupted_commit_is_cleaned_when_reopened(tmp_path: Path, monkeypatch) -> None:
    """A commit stopped before info.json (here by an error writing it; a kill is the same) leaves
    files that validate names and that ``open`` deletes; the committed episodes stay as they
    were, byte for byte."""
    root = tmp_path / "data"
    write(root, [make_trajectory(i) for i in range(2)], lossless=True)
    committed = all_files(root)
    write_json = writer_module._write_json

    def no_info(path, data):
        if path.name == "info.json":
            raise OSError(5, "Input/output error")
        write_json(path, data)

    monkeypatch.setattr(writer_module, "_write_json", no_info)
    new_task = make_trajectory(2)
    new_task.instruction = "a third task"
    with pytest.raises(OSError), LeRobotDatasetWriter.open(root, commit_interval_s=0) as writer:
        writer.add_episode(new_task)
    monkeypatch.setattr(writer_module, "_write_json", write_json)
    # Leftovers of writers killed at other moments: temporary files.
    (root / "videos/observation.images.front/chunk-000/.file-009.mp4.0123abcd.tmp").write_bytes(
        b"half a video"
    )
    (root / "meta/.info.json.89abcdef.tmp").write_text("{")

    warnings = validate_dataset(root)
    assert len(warnings) == 8, warnings
    expected = [  # the two episodes were committed in two commits (files 000 and 001)
        r"meta/episodes/chunk-000/file-002\.parquet: holds only episodes 2\.\.2, beyond "
        r"total_episodes = 2 .*: episodes of an interrupted write",
        r"meta/tasks\.parquet: 3 tasks but total_tasks = 2 \(an interrupted write",
        r"meta/stats\.json: computed over 39 frames but the dataset has 26",
        r"meta/\.info\.json\.89abcdef\.tmp: a temporary file of an interrupted write",
        r"data/chunk-000/file-002\.parquet: not referenced",
        r"videos/observation\.images\.front/chunk-000/\.file-009\.mp4\.0123abcd\.tmp: a temporary",
        r"videos/observation\.images\.front/chunk-000/file-002\.mp4: not referenced",
        r"videos/observation\.images\.wrist/chunk-000/file-002\.mp4: not referenced",
    ]
    for pattern in expected:
        assert any(re.search(pattern, w) for w in warnings), (pattern, warnings)
    assert LeRobotDataset(root).num_episodes == 2

    LeRobotDatasetWriter.open(root).close()  # cleans, and repairs tasks and stats
    assert validate_dataset(root) == []
    after = all_files(root)
    assert set(after) == set(committed)
    for name in after:  # what was committed is untouched (the metadata rewritten the same)
        assert after[name] == committed[name], name
    with LeRobotDatasetWriter.open(root) as writer:
        writer.add_episode(make_trajectory(2))
    assert trajectories_equal(LeRobotDataset(root).episode(2), make_trajectory(2))


def test_a_new_dataset_takes_over_what_a_killed_writer_left(tmp_path: Path) -> None:
    """A writer killed before its first commit leaves no info.json: the directory is not a
    dataset, but a new writer (``embodied collect`` run again) starts afresh there."""
    root = tmp_path / "data"
    (root / "videos/observation.image/chunk-000").mkdir(parents=True)
    (root / "videos/observation.image/chunk-000/.file-000.mp4.0123abcd.tmp").write_bytes(b"x")
    (root / "data/chunk-000").mkdir(parents=True)
    (root / "data/chunk-000/file-000.parquet").write_bytes(b"x")
    (root / ".embodied.lock").write_text("")
    write(root, [make_trajectory(0)], lossless=True)
    assert validate_dataset(root) == []

    with pytest.raises(FileExistsError, match="holds a dataset already; use .*open"):
        LeRobotDatasetWriter(root)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"notes\.txt is not part of a dataset"):
        LeRobotDatasetWriter(other)
    assert (other / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------------------------------------
# Appends must match the dataset
# ---------------------------------------------------------------------------------------------


def test_appending_to_a_dataset_without_episodes_keeps_this_runs_video_settings(
    tmp_path: Path,
) -> None:
    """A run stopped before its first episode leaves a dataset with no video feature; the run
    appending to it encodes as it asks (lossless: bit-exact frames), not with lossy defaults."""
    root = tmp_path / "data"
    LeRobotDatasetWriter(root, lossless=True).close()  # committed, no episodes
    traj = make_trajectory(0)
    with LeRobotDatasetWriter.open(root, lossless=True) as writer:
        writer.add_episode(traj)
    assert trajectories_equal(LeRobotDataset(root).episode(0), traj)
    features = json.loads((root / "meta" / "info.json").read_text())["features"]
    videos = [f["info"] for f in features.values() if f["dtype"] == "video"]
    assert videos and all(info["video.lossless"] for info in videos)


def test_appends_with_other_settings_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write(root, [make_trajectory(0)], lossless=True)
    with pytest.raises(ValueError, match=r"^fps: .* recorded at 16 fps but this run asks for 30"):
        LeRobotDatasetWriter.open(root, fps=30)
    with pytest.raises(
        ValueError,
        match=r"^lossless: .* stores lossless videos \(lossless=true\) but this run asks for "
        "lossless=false",
    ):
        LeRobotDatasetWriter.open(root, lossless=False)
    with LeRobotDatasetWriter.open(root, fps=16, lossless=True) as writer:  # the same: fine
        writer.add_episode(make_trajectory(1))
    traj = make_trajectory(2)
    traj.seed = 2**63
    with (
        pytest.raises(ValueError, match=r"seed must be None or in \[0, 2\*\*63\)"),
        LeRobotDatasetWriter.open(root) as writer,
    ):
        writer.add_episode(traj)
    assert json.loads((root / "meta/info.json").read_text())["total_episodes"] == 2


def test_an_episode_prepared_for_other_settings_is_refused(tmp_path: Path) -> None:
    """Workers prepare episodes (stats, encoded video) for the writer's settings; one prepared
    for another frame rate or encoding is refused, not written with the wrong video."""
    from embodied.datasets.lerobot.prepared import prepare_episode

    with LeRobotDatasetWriter(tmp_path / "a", fps=16) as writer:
        other = writer.settings._replace(fps=30)
        with pytest.raises(ValueError, match=r"prepared for another frame rate or video encoding"):
            writer.add_episode(prepare_episode(make_trajectory(0), other))
        assert writer.add_episode(prepare_episode(make_trajectory(1), writer.settings)) == 0
    assert json.loads((tmp_path / "a/meta/info.json").read_text())["total_episodes"] == 1


def test_collect_checks_its_settings_before_any_rollout(tmp_path: Path, capsys) -> None:
    from embodied.apps.cli import main

    root = tmp_path / "data"
    args = ["collect", "--task", "Reach", "--episodes", "1", "--out", str(root), "image_size=32"]
    assert main(args) == 0
    capsys.readouterr()
    for extra, message in [
        (
            ["image_size=48"],
            r"image_size: this run records observation\.image with shape "
            r"\[48, 48, 3\] but the dataset at .* has \[32, 32, 3\]",
        ),
        (["fps=30"], r"fps: the dataset at .* is recorded at 16 fps but this run asks for 30"),
        (["lossless=true"], r"lossless: the dataset at .* stores lossy videos"),
        (
            ["obs_mode=pixels"],
            r"obs_mode/cameras: this run records the observations .* missing "
            r"\['observation\.environment_state'\], extra \[\] \(obs_mode=pixels_state records it",
        ),
        (
            ["--seed", "4294967295", "--episodes", "2"],
            r"seed = 4294967295: episodes use seeds up to seed \+ episodes - 1, which must be "
            r"<= 4294967295",
        ),
    ]:
        started = time.perf_counter()
        assert main([*args, *extra]) == 2
        err = capsys.readouterr().err
        assert re.match(rf"embodied collect: error: {message}", err), err
        assert err.count("\n") == 1
        assert time.perf_counter() - started < 30
    assert LeRobotDataset(root).num_episodes == 1


def test_running_stats_totals_equal_the_aggregate() -> None:
    """Commits add episodes to running totals instead of aggregating all episodes again: the
    same numbers, at a cost that does not grow with the dataset."""
    from embodied.datasets.lerobot.stats import (
        STAT_NAMES,
        _aggregate_stats,
        _episode_stats,
        _StatsTotals,
    )

    rng = np.random.default_rng(0)
    episodes = [
        {"x": _episode_stats(rng.normal(i, 1 + i, size=(5 + 3 * i, 4)), video=False)}
        for i in range(7)
    ]
    totals = _StatsTotals()
    for episode in episodes:
        totals.add(episode)
    expected = _aggregate_stats([episode["x"] for episode in episodes])
    for stat in STAT_NAMES:
        np.testing.assert_allclose(totals.json()["x"][stat], expected[stat], rtol=1e-10)


def test_appending_drops_added_labels_and_a_killed_drop_is_finished_on_reopen(
    tmp_path: Path, monkeypatch
) -> None:
    """Labels come from the whole dataset and appended episodes do not carry them, so an append
    may drop them (with a warning); a drop killed after its commit point (info.json) is finished
    by the next append, so the data files keep one schema (LeRobot reads them as one table)."""
    import pyarrow.parquet as pq

    import embodied.datasets.lerobot.drop_feature as drop_module

    root = tmp_path / "labelled"
    trajectories = [make_trajectory(i, steps=8) for i in range(3)]
    write(root, trajectories[:2], lossless=True, data_file_size_mb=0.004)
    labels = [np.linspace(0, 1, 9, dtype=np.float32)] * 2
    LeRobotDataset(root).add_frame_feature("progress.label", labels)
    with (
        pytest.raises(ValueError, match="drop_added_features=True"),
        LeRobotDatasetWriter.open(root) as writer,
    ):
        writer.add_episode(trajectories[2])

    def killed(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(drop_module, "_finish_drops", killed)  # after info.json, before the rest
    with pytest.raises(KeyboardInterrupt):
        LeRobotDatasetWriter.open(root, drop_added_features=True)
    monkeypatch.undo()
    data_files = sorted((root / "data").rglob("*.parquet"))
    assert "progress.label" not in LeRobotDataset(root).features
    assert all("progress.label" in pq.read_schema(p).names for p in data_files)  # left behind

    with LeRobotDatasetWriter.open(root) as writer:  # finishes the drop, then appends
        writer.add_episode(trajectories[2])
    assert validate_dataset(root) == []
    schemas = {tuple(pq.read_schema(p).names) for p in sorted((root / "data").rglob("*.parquet"))}
    assert len(schemas) == 1 and "progress.label" not in next(iter(schemas))
    for path in (root / "meta" / "episodes").rglob("*.parquet"):
        assert not [c for c in pq.read_schema(path).names if c.startswith("stats/progress.label/")]
    assert "progress.label" not in json.loads((root / "meta" / "stats.json").read_text())
    dataset = LeRobotDataset(root)
    assert all(trajectories_equal(dataset.episode(i), t) for i, t in enumerate(trajectories))

    dataset.add_frame_feature("progress.label", [np.zeros(9, np.float32)] * 3)
    with pytest.warns(UserWarning, match=r"dropped \['progress.label'\].*embodied label"):
        writer = LeRobotDatasetWriter.open(root, drop_added_features=True)
    with writer:
        writer.add_episode(make_trajectory(3, steps=8))
    assert validate_dataset(root) == [] and LeRobotDataset(root).num_episodes == 4
    assert "progress.label" not in LeRobotDataset(root).features
