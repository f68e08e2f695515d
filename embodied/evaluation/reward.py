"""``embodied eval reward``: score a labelled dataset's episodes with a progress reward model and
its baselines (time interpolation, the same model untrained, a zero-shot VLM judge) and report
the metrics the field compares them by, in one table.

Per method: VOC on successful episodes (mean / median / std) and on failed ones (the blind spot:
time interpolation scores 1 there by construction), success AUROC of the final progress,
median final progress of failed episodes, MAE against the dataset's labels, and for a model with
a success head its AUROC and calibration error. Judge answers that cannot be parsed are counted
(``missing``), never filled in.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.core.config import setting, validate
from embodied.core.features import is_image_key
from embodied.core.io import atomic_write_text
from embodied.core.reward import ProgressScore, RewardModel, evenly_spaced
from embodied.core.trajectory import Trajectory
from embodied.datasets import LeRobotDataset
from embodied.evaluation.report import markdown_table
from embodied.rewards.metrics import calibration_error, success_auroc, value_order_correlation
from embodied.rewards.models import NEEDS_PATH, REWARD_TYPES, LearnedProgress, make_reward_model
from embodied.rewards.progress import ProgressRewardModel

LOADS_NOTHING = tuple(t for t in REWARD_TYPES if t not in NEEDS_PATH)  # privileged, success


@dataclass
class RewardEvalRange:
    """What ``embodied eval reward`` accepts for its counts (checked like every job's config)."""

    frames: int = setting(8, low=2)  # VOC and progress need at least two frames an episode
    episodes: int = setting(0, low=0)  # 0: every episode


@dataclass
class Scored:
    """One method's output on one episode (time order, at the evaluated frames)."""

    progress: np.ndarray  # [F] in [0, 1]; NaN where a judge gave no answer
    success_prob: float | None  # the success head at the last frame, if the method has one
    label: np.ndarray  # [F] the dataset's progress labels at those frames
    success: bool
    missing: int = 0


class TimeProgress(RewardModel):
    """The baseline every progress model must beat: observation i of T+1 gets i / T, whatever
    happened (it scores every failure as complete)."""

    reward_type = "time"

    def score(self, trajectories: Sequence[Trajectory]) -> list[ProgressScore]:
        return [ProgressScore(np.linspace(0.0, 1.0, t.length + 1)) for t in trajectories]


def reward_models(methods: Sequence[str], frames: int) -> list[tuple[str, RewardModel]]:
    """The named methods: ``time``, a reward type that loads nothing (``privileged``: the
    simulator's progress the dataset recorded; ``success``: none), ``judge:<local VLM
    directory>``, or a saved progress model directory (then also the same architecture
    untrained, to show what training added)."""
    models: list[tuple[str, RewardModel]] = []
    for method in methods:
        if method == "time":
            models.append(("time interpolation", TimeProgress()))
        elif method in LOADS_NOTHING:
            models.append((method, make_reward_model(method, "", frames)))
        elif method.startswith("judge:"):
            models.append((method, make_reward_model("judge", method[len("judge:") :], frames)))
        elif (Path(method) / "config.json").is_file():
            learned = make_reward_model("learned", method, frames)
            torch.manual_seed(0)
            untrained = ProgressRewardModel(dataclasses.replace(learned.model.config))
            models += [(str(method), learned), ("untrained", LearnedProgress(untrained, frames))]
        else:
            named = ", ".join(repr(m) for m in ("time", *LOADS_NOTHING, "judge:<dir>"))
            raise ValueError(f"method {method!r} is not {named} or a saved reward model directory")
    return models


def summarize(name: str, scored: Sequence[Scored]) -> dict[str, Any]:
    """The table row of one method."""

    def voc(s: Scored) -> float:
        ok = np.isfinite(s.progress)
        return value_order_correlation(s.progress[ok]) if ok.sum() >= 2 else float("nan")

    wins = [s for s in scored if s.success]
    fails = [s for s in scored if not s.success]
    finals = np.array([s.progress[np.isfinite(s.progress)][-1] if np.isfinite(s.progress).any()
                       else np.nan for s in scored])  # fmt: skip
    outcomes = np.array([s.success for s in scored])
    row: dict[str, Any] = {"method": name, "episodes": len(scored), "failed": len(fails)}
    vocs = np.array([voc(s) for s in wins])
    vocs = vocs[np.isfinite(vocs)]
    row |= {
        "voc_success_mean": float(vocs.mean()) if len(vocs) else float("nan"),
        "voc_success_median": float(np.median(vocs)) if len(vocs) else float("nan"),
        "voc_success_std": float(vocs.std()) if len(vocs) else float("nan"),
    }
    fail_vocs = np.array([voc(s) for s in fails])
    fail_vocs = fail_vocs[np.isfinite(fail_vocs)]
    row["voc_failed_mean"] = float(fail_vocs.mean()) if len(fail_vocs) else float("nan")
    ok = np.isfinite(finals)
    both = outcomes[ok].any() and not outcomes[ok].all()
    row["success_auroc"] = success_auroc(finals[ok], outcomes[ok]) if both else float("nan")
    failed_finals = finals[~outcomes & ok]
    row["failed_median_final"] = (
        float(np.median(failed_finals)) if len(failed_finals) else float("nan")
    )
    errors = np.concatenate([np.abs(s.progress - s.label)[np.isfinite(s.progress)] for s in scored])
    row["mae"] = float(errors.mean()) if len(errors) else float("nan")
    probs = [s.success_prob for s in scored]
    if all(p is not None for p in probs):
        p = np.array(probs, dtype=np.float64)
        row["success_head_auroc"] = (
            success_auroc(p, outcomes) if outcomes.any() and not outcomes.all() else float("nan")
        )
        row["success_head_ece"] = calibration_error(p, outcomes.astype(float))
    row["missing"] = int(sum(s.missing for s in scored))
    return row


def evaluate_reward(
    dataset_dir: str,
    methods: Sequence[str],
    max_frames: int = 8,
    episodes: int = 0,
    label_key: str = "progress.label",
) -> list[dict[str, Any]]:
    """One row per method: a saved model directory (plus the same model untrained), ``time``,
    or ``judge:<local VLM directory>``, each scoring the dataset's first camera at ``max_frames``
    evenly spaced frames; on a dataset of several tasks also one row per method and task
    (``task`` is "all" on the rows over every episode)."""
    validate(RewardEvalRange(frames=max_frames, episodes=episodes))
    dataset = LeRobotDataset(dataset_dir)
    if label_key not in dataset.features:
        raise ValueError(
            f"dataset {dataset_dir} has no {label_key!r} labels: run `embodied label {dataset_dir}`"
        )
    if not any(is_image_key(k) for k in dataset.features):
        raise ValueError(f"dataset {dataset_dir} has no camera to score; features: "
                         f"{sorted(dataset.features)}")  # fmt: skip
    table = dataset.episodes_table()
    chosen = [int(r["episode_index"]) for r in table][: episodes or None]
    models = reward_models(methods, max_frames)
    data = [(e, dataset.episode(e)) for e in chosen]
    success = {int(r["episode_index"]): bool(r["success"]) for r in table}
    task_of = {int(r["episode_index"]): str(r["task_name"]) for r in table}
    tasks = list(dict.fromkeys(task_of[e] for e in chosen))
    labels = {e: dataset.episode_frames(e, keys=[label_key])[label_key] for e in chosen}
    rows = []
    for name, model in models:
        scored = []
        for (episode, traj), result in zip(data, model.score([t for _, t in data]), strict=True):
            picks = evenly_spaced(traj.length + 1, max_frames)
            scored.append(Scored(result.progress[picks], result.success_prob,
                                 labels[episode][picks].astype(np.float64), success[episode],
                                 result.missing))  # fmt: skip
        rows.append({"method": name, "task": "all", **summarize(name, scored)})
        if len(tasks) > 1:  # a multi-task dataset: each task's own row as well
            for task in tasks:
                mine = [s for (e, _), s in zip(data, scored, strict=True) if task_of[e] == task]
                rows.append({"method": name, "task": task, **summarize(name, mine)})
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table (n/a where a method has no such output)."""

    keys = list(dict.fromkeys(k for r in rows for k in r))

    def show(v: Any) -> str:
        if v is None or (isinstance(v, float) and not np.isfinite(v)):
            return "n/a"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    return markdown_table(keys, [[show(r.get(k)) for k in keys] for r in rows])


def write_json(path: str | Path, rows: Sequence[dict[str, Any]]) -> None:
    """The rows as JSON (NaN as null), atomically."""
    clean = [
        {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()}
        for r in rows
    ]
    atomic_write_text(path, json.dumps(clean, indent=2) + "\n")
