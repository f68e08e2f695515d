"""Corrupted datasets: every damage to parquet, mp4, info.json, stats or the episodes metadata is
one error naming the file, from ``validate`` (exit 1), the reader, ``label``, ``train bc`` and
``dataset info``; never a traceback, never silently different data."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embodied.apps.cli import main
from embodied.datasets import DatasetError, LeRobotDataset, validate_dataset

DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
VIDEO = "videos/observation.image/chunk-000/file-000.mp4"
# The camera planner's recipe at toy size, reading the dataset's one camera.
PIXELS = Path(__file__).parents[1] / "configs" / "bc_pixels.yaml"
TINY_PIXELS = ["steps=1", "batch_size=2", "device=cpu",
               "policy_overrides.image_keys=[observation.image]",
               "policy_overrides.vision_channels=[8]"]  # fmt: skip


@pytest.fixture(scope="module")
def reach(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three Reach episodes with 32 px images (two commits: two data and two video files)."""
    from embodied.apps.collect import CollectConfig, run_collect

    root = tmp_path_factory.mktemp("reach") / "data"
    run_collect(CollectConfig(task="Reach", episodes=3, out=str(root), image_size=32, seed=5))
    assert validate_dataset(root) == []
    assert (root / DATA).is_file() and (root / VIDEO).is_file()
    return root


# ---------------------------------------------------------------------------------------------
# Ways to damage a dataset
# ---------------------------------------------------------------------------------------------


def overwrite(path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` over the bytes of ``path`` at ``offset``."""
    content = bytearray(path.read_bytes())
    content[offset : offset + len(data)] = data
    path.write_bytes(bytes(content))


def random_bytes(count: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, count, dtype=np.uint8).tobytes()


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbage(path: Path) -> None:
    path.write_bytes(random_bytes(path.stat().st_size))


def bytes_mid_column(root: Path) -> None:
    """Random bytes in the middle of the values of the widest column of the first data file:
    a valid-looking file whose numbers changed (caught by the pages' checksums)."""
    path = root / DATA
    metadata = pq.ParquetFile(path).metadata.row_group(0)
    chunks = [metadata.column(i) for i in range(metadata.num_columns)]
    widest = max(chunks, key=lambda c: c.total_compressed_size)
    overwrite(path, widest.data_page_offset + widest.total_compressed_size // 2, random_bytes(8))


def bytes_mid_video(root: Path) -> None:
    """64 random bytes in the middle of an mp4: the decoder would mostly hide the damage."""
    path = root / VIDEO
    overwrite(path, path.stat().st_size // 2, random_bytes(64))


def edit_info(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        info = json.loads((root / "meta/info.json").read_text())
        change(info)
        (root / "meta/info.json").write_text(json.dumps(info))

    return corrupt


def edit_stats(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        stats = json.loads((root / "meta/stats.json").read_text())
        change(stats)
        (root / "meta/stats.json").write_text(json.dumps(stats))

    return corrupt


def edit_parquet(relative: str, change: Callable[[pa.Table], pa.Table]) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        pq.write_table(change(pq.read_table(root / relative)), root / relative)

    return corrupt


def replace_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.column_names.index(name), name, values)


def shift_ints(name: str, by: int) -> Callable[[pa.Table], pa.Table]:
    return lambda t: replace_column(t, name, pa.array(np.asarray(t[name]) + by))


def image_struct(table: pa.Table) -> pa.Table:
    """``observation.state`` as LeRobot's image struct ({bytes, path}) instead of floats."""
    struct = pa.array(
        [{"bytes": b"\x89PNG", "path": None}] * len(table),
        type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
    )
    return replace_column(table, "observation.state", struct)


def delete(relative: str) -> Callable[[Path], None]:
    return lambda root: (root / relative).unlink()


def on(relative: str, damage: Callable[[Path], None]) -> Callable[[Path], None]:
    return lambda root: damage(root / relative)


def duplicate_episodes_file(root: Path) -> None:
    shutil.copy(root / EPISODES, root / "meta/episodes/chunk-000/file-007.parquet")


def other_video(root: Path) -> None:
    """A valid mp4, but not the one written there (another file's frames)."""
    shutil.copy(root / "videos/observation.image/chunk-000/file-001.mp4", root / VIDEO)


def feature(name: str, change: Callable[[dict], None]) -> Callable[[dict], None]:
    return lambda info: change(info["features"][name])


# case -> (damage, regex the error message must match: it names the file at fault)
CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    # parquet
    "truncated data parquet": (on(DATA, truncate), rf"^{DATA}: unreadable or truncated parquet"),
    "garbage data parquet": (on(DATA, garbage), rf"^{DATA}: unreadable or truncated parquet"),
    "random bytes in a data page": (bytes_mid_column, rf"^{DATA}: unreadable or truncated"),
    "deleted data file": (delete(DATA), rf"^{DATA}: missing"),
    "column of another dtype": (
        edit_parquet(
            DATA,
            lambda t: replace_column(
                t, "next.reward", pa.array(np.asarray(t["next.reward"]), pa.float64())
            ),
        ),
        rf"^{DATA}: column 'next.reward' holds float64 \[1\] but meta/info.json says float32",
    ),
    "image struct column": (
        edit_parquet(DATA, image_struct),
        rf"^{DATA}: column 'observation.state' holds struct<bytes: binary, path: string>",
    ),
    "image feature of a vector's shape": (
        edit_info(feature("observation.state", lambda f: f.update(dtype="image"))),
        r"^meta/info.json: feature 'observation.state': an image's shape must be \[height, "
        r"width, 3\], got \[4\]",
    ),
    "string feature": (
        edit_info(feature("observation.state", lambda f: f.update(dtype="string"))),
        r"^meta/info.json: feature 'observation.state' has dtype 'string', which this toolkit",
    ),
    "index column shifted": (
        edit_parquet(DATA, shift_ints("index", 1)),
        rf"^{DATA}: (column 'index' disagrees|the rows of episode 0 are not where)",
    ),
    "task_index out of range": (
        edit_parquet(DATA, shift_ints("task_index", 5)),
        rf"^{DATA}: episode 0 has frames whose task_index is not one of its tasks",
    ),
    "truncated episodes parquet": (on(EPISODES, truncate), rf"^{EPISODES}: unreadable"),
    "garbage tasks parquet": (on("meta/tasks.parquet", garbage), r"^meta/tasks.parquet: unread"),
    # mp4
    "random bytes mid-mp4": (bytes_mid_video, rf"^{VIDEO}: corrupt video: its sha256 is"),
    "truncated mp4": (on(VIDEO, truncate), rf"^{VIDEO}: unreadable video"),
    "garbage mp4": (on(VIDEO, garbage), rf"^{VIDEO}: unreadable video"),
    "deleted mp4": (delete(VIDEO), rf"^{VIDEO}: missing"),
    "another valid mp4": (other_video, rf"^{VIDEO}: "),
    "info shape vs decoded video": (
        edit_info(feature("observation.image", lambda f: f.update(shape=[64, 64, 3]))),
        rf"^{VIDEO}: frames are 32x32 \(height x width\) but meta/info.json says "
        r"'observation.image' has shape \[64, 64, 3\]",
    ),
    "fps edited everywhere": (
        edit_info(
            lambda info: [
                info.update(fps=30),
                info["features"]["observation.image"]["info"].update({"video.fps": 30}),
            ]
        ),
        rf"^{VIDEO}: plays at 16 fps but meta/info.json says fps = 30",
    ),
    # info.json
    "fps as a string": (
        edit_info(lambda info: info.update(fps="16")),
        r"^meta/info.json: 'fps' must be a positive integer, got \"16\" \(a string\)",
    ),
    "fps edited only at the top": (
        edit_info(lambda info: info.update(fps=30)),
        r"^meta/info.json: feature 'observation.image': info 'video.fps' is 16",
    ),
    "feature without dtype": (
        edit_info(feature("action", lambda f: f.pop("dtype"))),
        r"^meta/info.json: feature 'action' has no 'dtype'",
    ),
    "shape as a string": (
        edit_info(feature("action", lambda f: f.update(shape="4"))),
        r"^meta/info.json: feature 'action': 'shape' must be a non-empty list",
    ),
    "missing total_frames": (
        edit_info(lambda info: info.pop("total_frames")),
        r"^meta/info.json: missing key 'total_frames'",
    ),
    "negative total_episodes": (
        edit_info(lambda info: info.update(total_episodes=-1)),
        r"^meta/info.json: 'total_episodes' must be an integer >= 0",
    ),
    "features as a list": (
        edit_info(lambda info: info.update(features=[])),
        r"^meta/info.json: 'features' must be an object",
    ),
    "truncated info.json": (on("meta/info.json", truncate), r"^meta/info.json: not valid JSON"),
    "unsupported version": (
        edit_info(lambda info: info.update(codebase_version="v2.1")),
        r"^meta/info.json: unsupported codebase_version",
    ),
    # stats
    "stats of the wrong shape": (
        edit_stats(lambda stats: stats["observation.state"].update(mean=[0.0, 1.0])),
        r"^meta/stats.json: observation.state/mean has shape \[2\] but feature "
        r"'observation.state' needs \[4\]",
    ),
    "stats of a feature missing": (
        edit_stats(lambda stats: stats.pop("action")),
        r"^meta/stats.json: no 'min' statistic for 'action'",
    ),
    "stats not numbers": (
        edit_stats(lambda stats: stats["action"].update(max="big")),
        r"^meta/stats.json: action/max is not an array of numbers",
    ),
    "garbage stats.json": (on("meta/stats.json", garbage), r"^meta/stats.json: not valid JSON"),
    # episodes metadata
    "negative episode index": (
        edit_parquet(EPISODES, shift_ints("episode_index", -1)),
        rf"^{EPISODES}: column 'episode_index' has a negative entry",
    ),
    "inconsistent episode indices": (
        edit_parquet(EPISODES, shift_ints("dataset_from_index", 1)),
        rf"^{EPISODES}: episode 0 starts at index 1",
    ),
    "episode row without length": (
        edit_parquet(EPISODES, lambda t: t.drop_columns(["length"])),
        rf"^{EPISODES}: missing the episode column 'length'",
    ),
    "length as strings": (
        edit_parquet(
            EPISODES, lambda t: replace_column(t, "length", pa.array(map(str, t["length"])))
        ),
        rf"^{EPISODES}: column 'length' must hold integers",
    ),
    "duplicated episodes file": (
        duplicate_episodes_file,
        r"^meta/episodes/chunk-000/file-007.parquet: episode 0 is also in "
        rf"{EPISODES}",
    ),
    "episode past the end of its video": (
        edit_parquet(
            EPISODES,
            lambda t: replace_column(
                replace_column(
                    t,
                    "videos/observation.image/to_timestamp",
                    pa.array(np.asarray(t["videos/observation.image/to_timestamp"]) + 100),
                ),
                "videos/observation.image/from_timestamp",
                pa.array(np.asarray(t["videos/observation.image/from_timestamp"]) + 100),
            ),
        ),
        rf"^{VIDEO}: episode 0 ends at",
    ),
}


def one_line(text: str) -> str:
    """The only line of ``text`` (fails if there are more, or a traceback)."""
    assert "Traceback" not in text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize("case", list(CASES))
def test_corruption_is_one_error_naming_the_file(
    reach: Path, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "data"
    shutil.copytree(reach, root)
    damage, message = CASES[case]
    damage(root)

    with pytest.raises(DatasetError, match=message):
        validate_dataset(root)
    assert main(["dataset", "validate", str(root)]) == 1
    line = one_line(capsys.readouterr().err)
    assert re.search(message[1:], line), line

    # Reading everything training reads fails, naming the file, whether at open or while reading.
    with pytest.raises(DatasetError, match=message):
        dataset = LeRobotDataset(root)
        for episode in range(dataset.num_episodes):
            dataset.episode(episode)
    # Labelling reads every episode: one line, exit 2 (the CLI's status for an expected error).
    assert main(["label", str(root)]) == 2
    assert re.search(message[1:], one_line(capsys.readouterr().err))
    # Training the camera planner reads the frames and the stats: one line naming the file,
    # exit 2, and no run directory.
    runs = tmp_path / "runs"
    runs.mkdir()
    assert main(["train", "bc", str(PIXELS), f"dataset={root}", f"out={runs}", *TINY_PIXELS]) == 2
    assert re.search(message[1:], one_line(capsys.readouterr().err))
    assert not any(runs.iterdir())
    # `dataset info` reads the metadata only: it fails the same way, or (damage inside frame
    # data, which only decoding finds) succeeds.
    code = main(["dataset", "info", str(root)])
    captured = capsys.readouterr()
    if code != 0:
        assert code == 2 and re.search(message[1:], one_line(captured.err))
    else:
        assert case in {
            "random bytes in a data page",
            "random bytes mid-mp4",
            "another valid mp4",
            "index column shifted",
            "task_index out of range",
        }, captured


def test_quick_validation_reads_headers_only(reach: Path, tmp_path: Path, capsys) -> None:
    """``--quick`` skips decoding: damage inside the frames passes it, the full check finds it."""
    root = tmp_path / "data"
    shutil.copytree(reach, root)
    bytes_mid_video(root)
    assert validate_dataset(root, quick=True) == []
    assert main(["dataset", "validate", "--quick", str(root)]) == 0
    assert main(["dataset", "validate", str(root)]) == 1
    assert VIDEO in capsys.readouterr().err


def test_reader_names_the_video_it_cannot_decode(reach: Path, tmp_path: Path) -> None:
    """Without a recorded checksum (verification off, as for a dataset made elsewhere), a video
    the decoder rejects is still a DatasetError naming the file, not an av error."""
    root = tmp_path / "data"
    shutil.copytree(reach, root)
    path = root / VIDEO
    size = path.stat().st_size
    # Overwrite most of the file's frame data: no decoder hides that.
    overwrite(path, size // 8, random_bytes(size // 2, seed=1))
    dataset = LeRobotDataset(root, verify_checksums=False)
    with pytest.raises(DatasetError, match=rf"{VIDEO}: corrupt"):
        for episode in range(dataset.num_episodes):
            dataset.episode(episode)


def test_broken_pipe_exits_quietly(reach: Path) -> None:
    """``embodied dataset info DIR | head -1``: no BrokenPipeError traceback."""
    script = "import sys; from embodied.apps.cli import main; sys.exit(main(sys.argv[1:]))"
    process = subprocess.Popen(
        [sys.executable, "-c", script, "dataset", "info", str(reach)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()  # the reader is gone before anything is written
    stderr = process.stderr.read().decode()
    assert process.wait() == 141 and stderr == ""
