"""Vectorized rollouts and the collection job."""

from __future__ import annotations

import json

import numpy as np
import pytest

import embodied.sims as sims
from embodied.core.trajectory import trajectories_equal
from embodied.rollout.episodes import rollout_episode, rollout_vector


def _expert_batch(vec):
    return lambda obs: np.stack(vec.call("scripted_action"))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_vector_rollouts_equal_single_env_rollouts(asynchronous: bool) -> None:
    kwargs = {"obs_mode": "pixels_state", "image_size": 32}
    vec = sims.make_vec_env(
        "ButtonPress", 2, asynchronous=asynchronous, autoreset_mode="disabled", **kwargs
    )
    seeds = [5, 6, 7]
    trajs = sorted(rollout_vector(vec, _expert_batch(vec), seeds, "tabletop"), key=lambda t: t.seed)
    vec.close()
    assert [t.seed for t in trajs] == seeds
    env = sims.make("ButtonPress", **kwargs)
    for traj in trajs:
        single = rollout_episode(env, sims.make_expert(env), seed=traj.seed, suite="tabletop")
        # The vector rollout also records which of its episodes this was (seed order here).
        assert traj.metadata.pop("episode_id") == seeds.index(traj.seed)
        assert traj.success and trajectories_equal(traj, single)


def test_step_limits_cut_episodes_off_as_failures() -> None:
    vec = sims.make_vec_env("PickPlace", 2, autoreset_mode="disabled", obs_mode="state")
    trajs = list(rollout_vector(vec, _expert_batch(vec), [0, 1, 2], "tabletop", [10, None, 20]))
    by_seed = {t.seed: t for t in trajs}
    assert by_seed[0].length == 10 and by_seed[2].length == 20
    for seed in (0, 2):
        assert by_seed[seed].truncated[-1] and not by_seed[seed].success
    assert by_seed[1].success and by_seed[1].terminated[-1]
    assert by_seed[1].metadata["reset_info"]["stage"] == 0


def test_cutoff_fails_fast_experts_too(tmp_path) -> None:
    """The Reach expert succeeds in about 25 of its 80 allowed steps; a cut-off episode must
    still stop before success, after 30-70% of its own length, and be the clean run's prefix."""
    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.datasets import LeRobotDataset

    common = {"task": "Reach", "episodes": 4, "obs_mode": "state", "seed": 7}
    run_collect(CollectConfig(out=str(tmp_path / "clean"), **common))
    run_collect(CollectConfig(out=str(tmp_path / "cut"), cutoff=1.0, **common))
    clean, cut = (LeRobotDataset(tmp_path / name) for name in ("clean", "cut"))
    clean_rows = {r["seed"]: r for r in clean.episodes_table()}
    for row in cut.episodes_table():
        full = clean_rows[row["seed"]]
        assert full["success"] and not row["success"]
        assert 0.3 * full["length"] - 1 <= row["length"] <= 0.7 * full["length"]
        ours = cut.episode_frames(row["episode_index"], keys=["observation.state"])
        theirs = clean.episode_frames(full["episode_index"], keys=["observation.state"])
        n = len(ours["observation.state"])
        np.testing.assert_array_equal(ours["observation.state"], theirs["observation.state"][:n])


def test_two_workers_collect_the_dataset_one_worker_collects(tmp_path) -> None:
    """Each episode is made from its seed alone (noise, cut, rewind), in worker processes that
    also encode it: one worker or two give the same episodes, stats and order."""
    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.datasets import LeRobotDataset

    common = {"task": "Reach", "episodes": 6, "image_size": 32, "seed": 11, "noise": 0.3}
    common |= {"cutoff": 0.4, "rewind": 0.5, "record": "expert"}
    one = run_collect(CollectConfig(out=str(tmp_path / "one"), workers=1, **common))
    two = run_collect(CollectConfig(out=str(tmp_path / "two"), workers=2, **common))
    assert (one.episodes, one.successes, one.frames) == (two.episodes, two.successes, two.frames)
    assert one.rewound >= 1 and one.rewound == two.rewound
    a, b = LeRobotDataset(tmp_path / "one"), LeRobotDataset(tmp_path / "two")
    assert a.num_episodes == b.num_episodes == 6 + one.rewound
    for index in range(a.num_episodes):
        assert trajectories_equal(a.episode(index), b.episode(index))
    stats = [json.loads((d / "meta" / "stats.json").read_text()) for d in (a.root, b.root)]
    assert stats[0] == stats[1]


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_keeps_every_finished_episode_and_leaves_nothing_running(
    tmp_path, monkeypatch, workers
):
    """Ctrl-C as the second episode comes back, before it reaches the writer: it is written all
    the same, once, with the first and whatever else had finished, and the run returns once the
    workers and the pool's threads are gone. A pool still closing as Python exits races its exit
    hook ("Exception ignored ... Bad file descriptor" under the one-line interrupt message)."""
    import multiprocessing
    import threading

    from embodied.apps import collect_workers
    from embodied.apps.collect import CollectConfig, CollectInterrupted, run_collect
    from embodied.datasets import LeRobotDataset

    handed_back = collect_workers.EpisodeRunner.__iter__

    def interrupted(self):
        episodes = handed_back(self)
        yield next(episodes)
        next(episodes)
        raise KeyboardInterrupt  # with the second in hand, while the workers run the next ones

    monkeypatch.setattr(collect_workers.EpisodeRunner, "__iter__", interrupted)
    # Far more episodes than the workers can run while the main process writes one, however
    # loaded the machine: with 12, two workers sometimes finished them all before the Ctrl-C.
    cfg = CollectConfig(task="Reach", episodes=100, workers=workers, image_size=32, rewind=0.0,
                        seed=5, out=str(tmp_path / "data"))  # fmt: skip
    with pytest.raises(CollectInterrupted) as stop:
        run_collect(cfg)
    assert multiprocessing.active_children() == []
    main = threading.main_thread()  # Python's exit waits for the others that are not daemons
    assert [t.name for t in threading.enumerate() if not t.daemon and t is not main] == []
    dataset = LeRobotDataset(tmp_path / "data")
    seeds = [dataset.episode(i).seed for i in range(dataset.num_episodes)]
    assert seeds[:2] == [5, 6] and len(set(seeds)) == len(seeds) == stop.value.kept < 100
    if workers == 1:
        assert seeds == [5, 6]


@pytest.mark.usefixtures("ctrl_c_handled")
@pytest.mark.parametrize("moment", ["summary", "return"])
def test_ctrl_c_after_the_last_commit_leaves_the_run_complete(
    tmp_path, monkeypatch, capsys, moment
):
    """A Ctrl-C once every episode is committed, while the summary is printed or as the command
    returns, does not turn the complete run into an "interrupted" one (exit 130)."""
    import contextlib
    import signal

    from embodied.apps import cli, collect

    summary = collect.CollectSummary(3, 2, 60, 1.5, 0, tmp_path / "data")
    monkeypatch.setattr(collect, "run_collect", lambda cfg: summary)
    if moment == "summary":
        line = collect.CollectSummary.line

        def ctrl_c_in_line(self):
            signal.raise_signal(signal.SIGINT)
            return line(self)

        monkeypatch.setattr(collect.CollectSummary, "line", ctrl_c_in_line)
    else:  # once the command has returned and Ctrl-C's usual handler is back
        handled = cli._ctrl_c_outside_finalisers

        @contextlib.contextmanager
        def then_ctrl_c():
            with handled():
                yield
            signal.raise_signal(signal.SIGINT)

        monkeypatch.setattr(cli, "_ctrl_c_outside_finalisers", then_ctrl_c)
    assert cli.main(["collect", "--task", "Reach", "--out", str(tmp_path / "data")]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("collected 3 episodes (2 successful, 67%)") and err == ""


CRASHING_TASK = """
import multiprocessing, os

from embodied.sims import register_task
from embodied.sims.tasks.reach import Reach


@register_task
class CrashInWorkers(Reach):
    name = "CrashInWorkers"

    def expert(self, scene, goal):
        if multiprocessing.parent_process() is not None:
            os._exit(3)  # as a worker killed by the OOM killer or a segfault
        return super().expert(scene, goal)
"""


def test_a_worker_that_dies_is_an_error_not_a_hang(tmp_path, monkeypatch) -> None:
    from embodied.apps.collect import CollectConfig, run_collect

    monkeypatch.syspath_prepend(str(tmp_path))  # importable by name in the workers
    (tmp_path / "crash_in_workers.py").write_text(CRASHING_TASK)
    __import__("crash_in_workers")
    try:
        cfg = CollectConfig(task="CrashInWorkers", episodes=4, workers=2, obs_mode="state",
                            out=str(tmp_path / "data"))  # fmt: skip
        with pytest.raises(RuntimeError, match="a collection worker died .* from seed 0"):
            run_collect(cfg)
    finally:
        sims.unregister_task("CrashInWorkers")


def test_cutoff_stops_before_the_first_success() -> None:
    """Meta-World episodes run on after success: the cut is a fraction of the way to it."""
    from embodied.apps.collect_workers import cut_off
    from embodied.core.trajectory import Trajectory

    steps = 30
    success = np.arange(steps) >= 9  # first success after step 10
    traj = Trajectory(
        observations={"agent_pos": np.zeros((steps + 1, 4), np.float32)},
        actions=np.zeros((steps, 4), np.float32),
        rewards=np.zeros(steps, np.float32),
        terminated=np.zeros(steps, bool),
        truncated=np.eye(1, steps, steps - 1, dtype=bool)[0],
        success=True,
        info={"success": success},
    )
    for fraction, length in ((0.5, 5), (0.99, 9), (0.01, 1)):
        part = cut_off(traj, fraction)
        assert part.length == length and not part.success and not part.info["success"].any()
        assert part.truncated[-1] and part.truncated.sum() == 1 and not part.terminated.any()


@pytest.fixture(scope="module")
def collected(tmp_path_factory: pytest.TempPathFactory):
    """A small PickPlace dataset with deliberate failures, collected and labelled by the CLI."""
    from embodied.apps.cli import main

    root = tmp_path_factory.mktemp("collect") / "data"
    args = ["collect", "--task", "PickPlace", "--episodes", "6", "--out", str(root)]
    args += ["--cutoff", "0.34", "--rewind", "1.0", "--seed", "3", "image_size=48"]
    assert main(args) == 0
    assert main(["label", str(root)]) == 0
    return root


def test_label_names_the_cameras_before_decoding(collected, capsys) -> None:
    from embodied.apps.cli import main

    assert main(["label", str(collected), "--camera", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    # One camera is stored as observation.image: its name is not in the dataset.
    assert err == (
        f"embodied label: error: camera='nope': the dataset at {collected} has one unnamed "
        "camera (observation.image); leave camera unset"
    )


def test_label_names_the_cameras_of_a_multi_camera_dataset(tmp_path) -> None:
    from test_lerobot import make_trajectory, write

    from embodied.apps.label import run_label

    write(tmp_path / "data", [make_trajectory(0)])
    with pytest.raises(
        ValueError, match=r"camera='side': .* has the cameras \['front', 'wrist'\]$"
    ):
        run_label(tmp_path / "data", camera="side")


def test_collect_writes_a_valid_dataset_with_failures(collected, capsys) -> None:
    from embodied.apps.cli import main
    from embodied.datasets import LeRobotDataset

    assert main(["dataset", "validate", str(collected)]) == 0
    assert "valid LeRobot v3.0 dataset" in capsys.readouterr().out
    dataset = LeRobotDataset(collected)
    table = dataset.episodes_table()
    rewound = [r for r in table if '"synthetic": "rewind"' in r["metadata"]]
    cut = [r for r in table if not r["success"] and '"synthetic"' not in r["metadata"]]
    assert len(rewound) >= 1 and len(cut) >= 1  # both kinds of failure were recorded
    assert all(not r["success"] for r in rewound)
    stages = [
        dataset.episode_frames(row["episode_index"], keys=["stage"])["stage"] for row in rewound
    ]  # a copy rewound from past the first stage records its true stages going back down
    assert any(np.diff(s).min() < 0 for s in stages)
    assert sorted({r["seed"] for r in table}) == list(range(3, 9))

    assert main(["dataset", "info", str(collected), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["episodes"] == len(table)
    assert info["success_rate"] == pytest.approx(np.mean([r["success"] for r in table]))
    assert "progress.label" in info["features"]


def test_labels_end_at_one_on_successes_and_below_on_failures(collected) -> None:
    from embodied.datasets import LeRobotDataset

    dataset = LeRobotDataset(collected)
    for row in dataset.episodes_table():
        label = dataset.episode_frames(row["episode_index"], keys=["progress.label"])
        final = label["progress.label"][-1]
        assert final == 1.0 if row["success"] else final < 1.0


def test_collect_appends_and_rejects_bad_input(collected, tmp_path, capsys) -> None:
    from embodied.apps.cli import main

    assert main(["collect", "--task", "Fly", "--out", str(tmp_path / "x")]) == 2
    assert "unknown task 'Fly'" in capsys.readouterr().err
    assert main(["collect", "--task", "Reach", "--cutoff", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "config key 'cutoff' = 2.0 is out of range: expected in [0.0, 1.0]" in err
    assert not (tmp_path / "x").exists()


def test_validate_fails_with_exit_code_1_naming_the_problem(collected, tmp_path, capsys) -> None:
    import shutil

    from embodied.apps.cli import main

    broken = tmp_path / "broken"
    shutil.copytree(collected, broken)
    (broken / "data" / "chunk-000" / "file-000.parquet").unlink()
    assert main(["dataset", "validate", str(broken)]) == 1
    assert "file-000.parquet" in capsys.readouterr().err


def test_bench_collect_reports_throughput_against_one_worker(capsys) -> None:
    from embodied.apps.cli import main

    args = ["bench", "collect", "--task", "Reach", "--workers", "1", "--episodes", "2"]
    assert main([*args, "--repeats", "1", "--image-size", "32", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["workers"] == 1 and row["baseline"] == "1 worker(s)" and row["speedup"] == 1.0
    assert row["episodes_per_min"] > 0 and row["frames_per_s"] > row["episodes_per_min"] / 60


def test_bench_dataset_reports_reads_against_raw_video_decode(capsys) -> None:
    from embodied.apps.cli import main

    args = ["bench", "dataset", "--task", "Reach", "--episodes", "2", "--image-size", "32"]
    assert main([*args, "--repeats", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["read"] for r in rows] == ["every feature", "camera only"]
    for row in rows:
        assert row["baseline"] == "raw mp4 decode (no colour conversion)"
        assert row["frames_per_s"] > row["episodes_per_s"] > 0
        assert row["ratio"] == pytest.approx(row["baseline_frames_per_s"] / row["frames_per_s"])


def test_suite_and_eval_env_options_follow_the_policy_inputs() -> None:
    from embodied.core.features import ObservationSpec
    from embodied.rollout.matching import env_options

    assert sims.suite_of("metaworld/reach-v3") == "metaworld"
    assert sims.suite_of("PickPlace") == "tabletop"
    # One unnamed image: the env's default camera made it (works for Meta-World's too).
    single = ObservationSpec(cameras={"observation.image": (64, 64)}, state_dim=4)
    assert env_options(single) == {"obs_mode": "pixels", "image_size": (64, 64)}
    two = ObservationSpec(
        cameras={"observation.images.front": (64, 64), "observation.images.wrist": (64, 64)},
        env_state_dim=5,
    )
    assert env_options(two) == {
        "obs_mode": "pixels_state",
        "image_size": (64, 64),
        "cameras": ["front", "wrist"],
    }
    assert env_options(ObservationSpec(state_dim=4)) == {"obs_mode": "state"}
    # A policy trained with the goal in the state gets it again.
    goal = ObservationSpec(env_state_dim=2, env_state_names=("drawer.opening", "goal.object_x"))
    assert env_options(goal) == {"obs_mode": "state", "goal_state": True}
