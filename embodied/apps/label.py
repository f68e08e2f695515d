"""``embodied label``: write progress labels (``progress.label``) into a LeRobot v3 dataset.

``procedure`` labels follow ProcVLM: each subtask stage gets a progress budget and spreads it over
its frames in proportion to visual change; ``time`` labels interpolate linearly (the naive
baseline). Budgets come from the dataset's own successful episodes; a task none of whose episodes
succeeded (a policy's own rollouts of a task it cannot do yet) gets uniform budgets over its
stages, so one such task does not stop a whole multi-task dataset from being labelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embodied.core.features import CAMERA_PREFIX, is_image_key
from embodied.datasets import LeRobotDataset, LeRobotDatasetWriter
from embodied.rewards.labels import label_trajectories
from embodied.sims import task_stages

METHODS = ("procedure", "time")


@dataclass
class LabelSummary:
    """What a labelling run wrote."""

    episodes: int
    successes: int
    method: str
    final_success: float  # mean final label of successful episodes
    final_failure: float  # mean final label of failed episodes (nan if none)
    uniform: tuple[str, ...] = ()  # procedure: tasks without a success, labelled on uniform budgets

    def line(self) -> str:
        """One line for the terminal."""

        def mean(value: float, of: str) -> str:
            return f"no {of}" if math.isnan(value) else f"{value:.3f} on {of}"

        uniform = f"; uniform stage budgets (no success) for {', '.join(self.uniform)}"
        return (
            f"labelled {self.episodes} episodes with '{self.method}' progress "
            f"({self.successes} successful): mean final label "
            f"{mean(self.final_success, 'successes')}, {mean(self.final_failure, 'failures')}"
            f"{uniform if self.uniform else ''}"
        )


def run_label(
    root: str | Path, method: str = "procedure", camera: str | None = None
) -> LabelSummary:
    """Label every episode of the dataset at ``root`` and store ``progress.label`` atomically.

    Holds the dataset's writer lock throughout (``DatasetBusyError`` if another process writes
    it); an interrupted run leaves the dataset as it was or fully labelled.
    """

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    # The writer locks the dataset first: no run appends episodes while they are being labelled.
    with LeRobotDatasetWriter.open(root) as writer:
        dataset = LeRobotDataset(root)
        _check_camera(dataset, camera)
        trajs = [dataset.episode(i) for i in range(dataset.num_episodes)]
        counts = {task: _stage_count(task) for task in dict.fromkeys(t.task for t in trajs)}
        stage_counts = {task: n for task, n in counts.items() if n is not None}
        labels = label_trajectories(trajs, method=method, n_stages=stage_counts, camera=camera)
        writer.add_frame_feature(
            "progress.label",
            [np.asarray(lab, dtype=np.float32) for lab in labels],
            info={"method": method},
            overwrite=True,  # labels are derived data: labelling again replaces them
        )
    finals = np.array([lab[-1] for lab in labels], dtype=np.float64)
    success = np.array([t.success for t in trajs], dtype=bool)
    solved = {t.task for t in trajs if t.success}
    return LabelSummary(
        len(trajs),
        int(success.sum()),
        method,
        float(finals[success].mean()) if success.any() else float("nan"),
        float(finals[~success].mean()) if (~success).any() else float("nan"),
        tuple(dict.fromkeys(t.task for t in trajs if t.task not in solved))
        if method == "procedure"
        else (),
    )


def _stage_count(task: str) -> int | None:
    """How many stages the simulators give ``task``; None for a task they do not know (a
    dataset may come from elsewhere)."""
    try:
        return len(task_stages(task))
    except ValueError:
        return None


def _check_camera(dataset: LeRobotDataset, camera: str | None) -> None:
    """Before any frame is decoded: ``camera`` must name one of the dataset's cameras
    (ValueError naming the cameras it has, or saying that its one camera has no name)."""
    videos = [name for name in dataset.features if is_image_key(name)]
    named = [name.removeprefix(CAMERA_PREFIX) for name in videos if name.startswith(CAMERA_PREFIX)]
    if camera is None or camera in named:
        return
    if not named:
        raise ValueError(
            f"camera={camera!r}: the dataset at {dataset.root} has one unnamed camera "
            f"({', '.join(videos) or 'no images at all'}); leave camera unset"
        )
    raise ValueError(f"camera={camera!r}: the dataset at {dataset.root} has the cameras {named}")
