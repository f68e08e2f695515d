"""``embodied collect`` killed (SIGKILL), interrupted (Ctrl-C), run twice at once, or out of disk:
the episodes finished before are kept exactly, the dataset validates, and the same command
appends again.

The default run kills a few collections; the full sweep is a matter of numbers::

    EMBODIED_FAULT_KILLS=40 EMBODIED_FAULT_CHAIN=2 EMBODIED_FAULT_INTERRUPTS=12 \\
        EMBODIED_FAULT_EPISODES=400 pytest -m "" tests/test_dataset_faults.py -s

(``-m ""``: the fault tests are marked slow, which a plain ``pytest`` leaves out.)

Kills come in chains (``EMBODIED_FAULT_CHAIN``, default 3): the first into a new dataset, the
others into the dataset it left; then the same command runs to the end. Each kill prints one
line: when it came, how many episodes had finished, how many were kept, what validate said.
``EMBODIED_FAULT_SEED`` picks other kill moments.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import wait_until

from embodied.core.trajectory import Trajectory, trajectories_equal
from embodied.datasets import LeRobotDataset, validate_dataset
from embodied.datasets.lerobot.layout import COMMIT_INTERVAL_S

KILLS = int(os.environ.get("EMBODIED_FAULT_KILLS", "3"))
CHAIN = int(os.environ.get("EMBODIED_FAULT_CHAIN", "3"))  # kills per dataset: new, existing...
INTERRUPTS = int(os.environ.get("EMBODIED_FAULT_INTERRUPTS", "2"))
SEED = int(os.environ.get("EMBODIED_FAULT_SEED", "0"))
# An episode finished this long before a SIGKILL must have been committed (the commit interval,
# plus room for a commit and a slow, shared machine).
COMMITTED_AFTER_S = COMMIT_INTERVAL_S + 2.0

# Reach at 16 px: 200 episodes run ~8 s on 2 AVX-512 cores (100 took ~7 s on AVX2-only ones), long
# enough for each chain's late kill to come when some episodes must have been committed (100 ended
# first there); the full sweep runs longer. Some episodes are cut off, some stored rewound too.
EPISODES = int(os.environ.get("EMBODIED_FAULT_EPISODES", "200"))
OPTIONS = ["--task", "Reach", "--episodes", str(EPISODES), "--seed", "3", "--cutoff", "0.3"]
OPTIONS += ["--rewind", "0.2", "image_size=16", "lossless=true"]  # lossless: bit-exact reads

# `embodied collect` with a log of when each episode finished: when its worker handed it to the
# main process, before it reaches the writer.
RUNNER = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's, not a background job's
log = open(sys.argv[1], "a", buffering=1)
from embodied.apps.collect_workers import EpisodeRunner
from embodied.apps.cli import run
handed_back = EpisodeRunner.__iter__
def logged(self):
    for episodes in handed_back(self):
        log.write(f"{time.time()} {episodes[0].traj.seed}\\n")
        yield episodes
EpisodeRunner.__iter__ = logged
log.write(f"{time.time()} started\\n")
run(["collect", *sys.argv[2:]])  # as the console script does
"""


def start(log: Path, root: Path, *options: str, **popen) -> subprocess.Popen:
    """``embodied collect OPTIONS --out root`` in a new process group, logging to ``log``."""
    log.write_text("")
    command = [sys.executable, "-c", RUNNER, str(log), *OPTIONS, *options, "--out", str(root)]
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "MUJOCO_GL": "egl", "EMBODIED_PROGRESS": "0"},
        **popen,
    )


def finished(log: Path) -> list[tuple[float, int]]:
    """(time, seed) of each rollout the logged run finished, in order."""
    lines = [line.split() for line in log.read_text().splitlines()]
    return [(float(t), int(seed)) for t, seed in lines if seed != "started"]


def first_finished(log: Path, process: subprocess.Popen) -> float:
    """When the logged run finished its first episode (waiting for it)."""
    wait_until(lambda: bool(finished(log)), process, "a first finished episode")
    return finished(log)[0][0]


def wait_started(log: Path, process: subprocess.Popen) -> None:
    """Until the runner has imported everything (Ctrl-C before that is Python's own)."""
    wait_until(lambda: "started" in log.read_text(), process, "the runner's 'started' line")


ROLLOUT_S: list[float] = []  # how long the reference run took (in-process, no start-up)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[Trajectory]:
    """The episodes one uninterrupted run writes, in order (collection is deterministic)."""
    from embodied.apps.cli import main

    root = tmp_path_factory.mktemp("reference") / "data"
    started = time.monotonic()
    assert main(["collect", *OPTIONS, "--out", str(root)]) == 0
    ROLLOUT_S.append(time.monotonic() - started)
    dataset = LeRobotDataset(root)
    return [dataset.episode(i) for i in range(dataset.num_episodes)]


def episodes_due(reference: list[Trajectory], log: Path, before: float) -> tuple[int, int]:
    """How many reference episodes had finished by ``before``, and by the end of the log (a
    rewound copy finishes with the episode it copies)."""
    times = {seed: t for t, seed in finished(log)}
    finished_seeds = [t.seed for t in reference if t.seed in times]
    due = [t.seed for t in reference if t.seed in times and times[t.seed] <= before]
    return len(due), len(finished_seeds)


def originals(reference: list[Trajectory]) -> list[Trajectory]:
    """The reference without its rewound copies."""
    return [t for t in reference if t.metadata.get("synthetic") != "rewind"]


def check_kept(root: Path, before: int, reference: list[Trajectory], kept: int) -> None:
    """Episodes ``before..before+kept`` of the dataset are the run's first ``kept``, exactly."""
    dataset = LeRobotDataset(root)
    assert dataset.num_episodes == before + kept
    for k in range(kept):
        assert trajectories_equal(dataset.episode(before + k), reference[k]), k


INTERRUPTED_WRITE = re.compile(r"interrupted write|beyond total_episodes")


@pytest.mark.slow  # subprocess collections killed at random moments
def test_sigkill_keeps_every_episode_finished_before(
    tmp_path: Path, reference: list[Trajectory]
) -> None:
    rng = random.Random(SEED)
    log = tmp_path / "finished.log"
    kills = pending = due_total = completed = 0
    last_moment = ROLLOUT_S[0] + 2.5  # start-up takes about 2 s
    for chain in range((KILLS + CHAIN - 1) // CHAIN):
        root = tmp_path / f"chain{chain}"
        chain_kills, chain_length = 0, min(CHAIN, KILLS - CHAIN * chain)
        while chain_kills < chain_length:  # a new dataset, then that one
            before = LeRobotDataset(root).num_episodes if (root / "meta/info.json").exists() else 0
            launched = time.time()
            process = start(log, root)
            if chain_kills == chain_length - 1:  # late: some episodes must have been committed
                late = first_finished(log, process) + COMMITTED_AFTER_S + rng.uniform(0.2, 1.0)
                time.sleep(max(0.0, late - time.time()))
            else:  # while starting up or collecting
                time.sleep(rng.uniform(0.3, last_moment))
            killed_at = time.time()
            with contextlib.suppress(ProcessLookupError):  # it may have exited already
                os.killpg(process.pid, signal.SIGKILL)
            if process.wait() == 0:  # it had finished: that was no kill, try again
                check_kept(root, before, reference, len(reference))
                completed += 1
                # the reference ran slower than this run (a machine whose load fell): aim earlier
                last_moment = min(last_moment, 0.8 * (finished(log)[-1][0] - launched))
                assert completed <= KILLS, (
                    f"{completed} collections finished before their kill: {EPISODES} episodes are "
                    "too few on this machine; raise EMBODIED_FAULT_EPISODES"
                )
                continue
            process.communicate()
            kills += 1
            chain_kills += 1
            due, done = episodes_due(reference, log, killed_at - COMMITTED_AFTER_S)
            if not (root / "meta/info.json").exists():  # killed before its first commit
                assert due == 0
                note, kept = "no commit yet", 0
            else:
                warnings = validate_dataset(root)  # raises if anything committed is broken
                assert all(INTERRUPTED_WRITE.search(w) for w in warnings), warnings
                kept = LeRobotDataset(root).num_episodes - before
                assert due <= kept <= done
                check_kept(root, before, reference, kept)
                note = f"validate: {len(warnings)} warnings (interrupted write)"
            pending += done - kept
            due_total += due
            print(
                f"kill {kills}: {killed_at - launched:.2f} s after launch "
                f"({'new' if before == 0 else 'existing'} dataset), {done} episodes "
                f"finished, {due} more than {COMMITTED_AFTER_S:.0f} s before, {kept} kept; "
                f"{note}"
            )
        # The same command appends again, runs to the end, and leaves a clean dataset.
        before = LeRobotDataset(root).num_episodes if (root / "meta/info.json").exists() else 0
        process = start(log, root)
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err.decode()
        assert validate_dataset(root) == []
        check_kept(root, before, reference, len(reference))
    assert due_total > 0  # the late kills came when some episodes had to be committed
    print(
        f"{kills} kills ({completed} more runs finished before their kill came): {due_total} "
        f"episodes finished more than {COMMITTED_AFTER_S:.0f} s before a kill, all kept; "
        f"{pending} finished within the last seconds were not committed yet"
    )


@pytest.mark.slow  # subprocess collections killed at random moments
def test_ctrl_c_keeps_every_finished_episode_in_one_line(
    tmp_path: Path, reference: list[Trajectory]
) -> None:
    """SIGINT to the process group, as Ctrl-C in a terminal: the collection commits everything
    finished (async workers included), says how many in one line and exits with 130."""
    rng = random.Random(SEED + 1)
    log = tmp_path / "finished.log"
    reference = originals(reference)  # this run stores no rewound copies
    by_seed = {t.seed: t for t in reference}
    for interrupt in range(INTERRUPTS):
        root = tmp_path / f"data{interrupt // 2}"  # a new dataset, then appending to it
        before = LeRobotDataset(root).num_episodes if (root / "meta/info.json").exists() else 0
        # The two workers finish episodes out of seed order: they are matched by seed.
        process = start(log, root, "--workers", "2", "--rewind", "0")
        if interrupt % 3 == 2:  # while starting up
            wait_started(log, process)
            time.sleep(rng.uniform(0.0, 2.0))
        else:  # while collecting
            first_finished(log, process)
            time.sleep(rng.uniform(0.0, 4.0))
        interrupted_at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=120)
        err = err.decode()
        assert "Traceback" not in err and "Warn" not in err, err
        due, done = episodes_due(reference, log, interrupted_at - 0.5)
        if process.returncode in (0, -signal.SIGINT) and done == EPISODES:
            # It had finished: nothing to interrupt. The console script ignores a Ctrl-C once
            # the command has returned; one in the instant before that ends it by the signal.
            assert validate_dataset(root) == []
            assert LeRobotDataset(root).num_episodes == before + EPISODES
            print(f"interrupt {interrupt + 1}: came after the run had finished")
            continue
        assert process.returncode == 130, err
        line = err.strip()
        if line == "embodied collect: interrupted" or line.startswith(
            "embodied collect: interrupted before the first episode"
        ):  # while starting up: nothing written
            assert due == 0
            if before:
                assert LeRobotDataset(root).num_episodes == before
            else:
                assert not (root / "meta/info.json").exists()
            print(f"interrupt {interrupt + 1}: before the first episode: {line}")
            continue
        match = re.fullmatch(
            r"embodied collect: interrupted: kept the (\d+) episodes finished before the "
            rf"interrupt \((\d+) in {re.escape(str(root))}\)",
            line,
        )
        assert match, err
        kept = int(match.group(1))
        assert kept >= due  # everything finished (but the very last instant's) was kept
        if kept or before:
            assert validate_dataset(root) == []
            dataset = LeRobotDataset(root)
            assert dataset.num_episodes == before + kept == int(match.group(2))
            for k in range(before, before + kept):
                episode = dataset.episode(k)
                assert trajectories_equal(episode, by_seed[episode.seed])
        print(
            f"interrupt {interrupt + 1}: {done} episodes finished, {due} more than 0.5 s "
            f"before, {kept} kept, exit 130: {line}"
        )


@pytest.mark.slow  # subprocess collections killed at random moments
def test_two_runs_at_once_never_lose_episodes(tmp_path: Path) -> None:
    """Two collections into one directory: the one that comes second fails at once naming the
    other's pid, and the dataset holds exactly the episodes the successful run(s) reported."""
    root = tmp_path / "data"
    first = start(tmp_path / "first.log", root, "--episodes", "30")
    wait_started(tmp_path / "first.log", first)
    time.sleep(1.0)
    second = start(tmp_path / "second.log", root, "--seed", "100", "--episodes", "30")
    runs = {"first": first, "second": second}
    outputs = {name: run.communicate(timeout=120) for name, run in runs.items()}
    reported = 0
    for name, run in runs.items():
        out, err = outputs[name]
        if run.returncode == 0:
            summary = re.search(rb"collected (\d+) episodes .* (\d+) rewound copies", out)
            reported += int(summary.group(1)) + int(summary.group(2))
            continue
        other = runs["second" if name == "first" else "first"]
        line = err.decode().strip()
        assert re.fullmatch(
            rf"embodied collect: error: {re.escape(str(root))} is being written by another "
            rf"process \(pid {other.pid} on .*, running .*\); wait for it to finish, or write to "
            "another directory",
            line,
        ), line
        assert "started" in (tmp_path / f"{name}.log").read_text()
        assert not finished(tmp_path / f"{name}.log")  # it failed before any rollout
        print(f"{name} run: exit {run.returncode}: {line}")
    assert first.returncode == 0 or second.returncode == 0
    assert validate_dataset(root) == []
    assert LeRobotDataset(root).num_episodes == reported


def test_full_disk_is_one_line_and_keeps_what_was_committed(tmp_path: Path) -> None:
    """Writes fail (EFBIG under a file-size limit, as ENOSPC on a full disk) part-way through:
    one error line, exit 2 (the CLI's status for an expected error), the committed episodes
    intact and the dataset still appendable."""
    root = tmp_path / "data"

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failing write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))

    # 64 px lossless frames: a few episodes' video outgrows the limit.
    process = start(tmp_path / "log", root, "image_size=64", preexec_fn=small_files)
    out, err = process.communicate(timeout=120)
    line = err.decode().strip()
    assert process.returncode == 2, line
    assert re.fullmatch(r"embodied collect: error: \[Errno 27\] File too large.*", line), line
    warnings = validate_dataset(root)
    assert all(INTERRUPTED_WRITE.search(w) for w in warnings), warnings
    kept = LeRobotDataset(root).num_episodes
    assert kept > 0
    process = start(tmp_path / "log", root, "image_size=64", "--episodes", "2")
    assert process.wait(timeout=120) == 0
    assert validate_dataset(root) == []
    assert LeRobotDataset(root).num_episodes == kept + 2


def test_unwritable_output_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from embodied.apps.cli import main

    (tmp_path / "file").write_text("not a directory")
    for out in (tmp_path / "file" / "data", Path("/proc/embodied-dataset")):
        assert main(["collect", *OPTIONS, "--episodes", "1", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert re.fullmatch(r"embodied collect: error: \[Errno \d+\] .*\n", err), err
