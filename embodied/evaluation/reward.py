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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodied.core.io import atomic_write_text


@dataclass
class Scored:
    """One method's output on one episode (time order, at the evaluated frames)."""

    progress: np.ndarray  # [F] in [0, 1]; NaN where a judge gave no answer
    success_prob: float | None  # the success head at the last frame, if the method has one
    label: np.ndarray  # [F] the dataset's progress labels at those frames
    success: bool
    missing: int = 0


def episode_frames(dataset: Any, episode: int, image_key: str, label_key: str, max_frames: int):
    """(frames uint8 [F, H, W, 3], labels [F], instruction) at evenly spaced frames."""
    from embodied.train.reward import eval_indices

    columns = dataset.episode_frames(episode, keys=[image_key, label_key, "task_index"])
    sel = eval_indices(len(columns[label_key]), max_frames)
    instruction = dataset.tasks[int(columns["task_index"][0])]
    return columns[image_key][sel], columns[label_key][sel].astype(np.float64), instruction


def model_scorer(model: Any) -> Callable[[np.ndarray, str], tuple[np.ndarray, float | None, int]]:
    """Score an episode causally with a ``ProgressRewardModel``."""
    import torch

    def score(frames: np.ndarray, instruction: str) -> tuple[np.ndarray, float | None, int]:
        with torch.no_grad():
            out = model(torch.from_numpy(np.ascontiguousarray(frames))[None], [instruction])
        prob = float(torch.sigmoid(out["success_logits"][0, -1]))
        return out["progress"][0].cpu().numpy().astype(np.float64), prob, 0

    return score


def time_scorer(frames: np.ndarray, instruction: str) -> tuple[np.ndarray, float | None, int]:
    """Time interpolation: frame i of F gets i / (F - 1), whatever happened."""
    return np.linspace(0.0, 1.0, len(frames)), None, 0


def judge_scorer(judge: Any) -> Callable[[np.ndarray, str], tuple[np.ndarray, float | None, int]]:
    """A ``VLMJudge``: its parsed answers, NaN (and counted) where missing."""

    def score(frames: np.ndarray, instruction: str) -> tuple[np.ndarray, float | None, int]:
        result = judge.judge(frames, instruction)
        return np.asarray(result.progress, dtype=np.float64), None, int(result.n_missing)

    return score


def summarize(name: str, scored: Sequence[Scored]) -> dict[str, Any]:
    """The table row of one method."""
    from embodied.rewards.metrics import calibration_error, success_auroc, value_order_correlation

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
    image_key: str = "",
    label_key: str = "progress.label",
) -> list[dict[str, Any]]:
    """One row per method: a saved model directory (plus the same model untrained), ``time``,
    or ``judge:<local VLM directory>``; on a dataset of several tasks also one per method and task
    (``task`` is "all" on the rows over every episode)."""
    from embodied.datasets import LeRobotDataset

    dataset = LeRobotDataset(dataset_dir)
    if label_key not in dataset.features:
        raise ValueError(
            f"dataset {dataset_dir} has no {label_key!r} labels: run `embodied label {dataset_dir}`"
        )
    images = [k for k in dataset.features if dataset.features[k].get("dtype") in ("video", "image")]
    image_key = image_key or (images[0] if images else "")
    if image_key not in dataset.features:
        raise ValueError(
            f"dataset {dataset_dir} has no image feature {image_key!r}; it has {images}"
        )
    table = dataset.episodes_table()
    chosen = [int(r["episode_index"]) for r in table][: episodes or None]
    scorers: list[tuple[str, Callable]] = []
    for method in methods:
        if method == "time":
            scorers.append(("time interpolation", time_scorer))
        elif method.startswith("judge:"):
            from embodied.rewards import VLMJudge

            scorers.append(
                (method, judge_scorer(VLMJudge.from_pretrained(method[len("judge:") :])))
            )
        elif (Path(method) / "config.json").is_file():
            import torch

            from embodied.rewards import ProgressRewardModel

            model = ProgressRewardModel.from_pretrained(method).eval()
            torch.manual_seed(0)
            untrained = ProgressRewardModel(dataclasses.replace(model.config)).eval()
            scorers += [(str(method), model_scorer(model)), ("untrained", model_scorer(untrained))]
        else:
            raise ValueError(
                f"method {method!r} is not 'time', 'judge:<dir>' or a saved reward model directory"
            )
    data = [(e, *episode_frames(dataset, e, image_key, label_key, max_frames)) for e in chosen]
    success = {int(r["episode_index"]): bool(r["success"]) for r in table}
    task_of = {int(r["episode_index"]): str(r["task_name"]) for r in table}
    tasks = list(dict.fromkeys(task_of[e] for e in chosen))
    rows = []
    for name, scorer in scorers:
        scored = []
        for episode, frames, labels, instruction in data:
            progress, prob, missing = scorer(frames, instruction)
            scored.append(Scored(progress, prob, labels, success[episode], missing))
        rows.append({"method": name, "task": "all", **summarize(name, scored)})
        if len(tasks) > 1:  # a multi-task dataset: each task's own row as well
            for task in tasks:
                mine = [s for (e, *_), s in zip(data, scored, strict=True) if task_of[e] == task]
                rows.append({"method": name, "task": task, **summarize(name, mine)})
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table (n/a where a method has no such output)."""
    from embodied.evaluation.report import markdown_table

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
