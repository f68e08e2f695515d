"""``embodied demo``: roll out the scripted experts on every tabletop task and write a report.

The run directory gets the resolved config, per-task metrics (JSONL + TensorBoard), one MP4 per
task, ``results.json``, ``report.md`` and ``report.html`` (a page with the table and videos).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embodied.io import atomic_write_text
from embodied.run import RunDir, progress, seed_everything
from embodied.sims.registry import TABLETOP_TASKS


@dataclass
class DemoConfig:
    """What the demo runs; every field can be overridden as ``key=value`` on the command line."""

    name: str = "demo"
    out: str = "runs"
    tasks: list[str] = field(default_factory=lambda: list(TABLETOP_TASKS))
    episodes: int = 10
    seed: int = 0
    noise: float = 0.0
    image_size: int = 128
    videos: int = 1
    fps: int = 16


@dataclass
class TaskResult:
    """Aggregate of one task's expert episodes."""

    task: str
    episodes: int
    success_rate: float
    mean_length: float
    collisions_per_episode: float
    instructions: list[str]
    videos: list[str]


def run_demo(cfg: DemoConfig) -> tuple[RunDir, list[TaskResult]]:
    """Roll out the experts, log metrics, write videos and the report; return the run and table."""
    import embodied.sims as sims
    from embodied.rollout import rollout_episode
    from embodied.video import write_video

    unknown = [t for t in cfg.tasks if t not in sims.list_tasks()]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; available: {', '.join(sims.list_tasks())}")
    seed_everything(cfg.seed)
    run = RunDir.create(cfg.out, cfg.name, config=cfg)
    (run.path / "videos").mkdir()
    results = []
    bar = progress(total=len(cfg.tasks) * cfg.episodes, desc="expert rollouts")
    with run.metrics() as metrics:
        for step, task in enumerate(cfg.tasks):
            env = sims.make(task, image_size=cfg.image_size)
            expert = sims.make_expert(env, noise=cfg.noise, seed=cfg.seed)
            successes, lengths, collisions, instructions, videos = [], [], [], [], []
            for episode in range(cfg.episodes):
                traj = rollout_episode(env, expert, seed=cfg.seed + episode, suite="tabletop")
                successes.append(traj.success)
                lengths.append(traj.length)
                collisions.append(int(traj.info["collisions"].sum()))
                instructions.append(traj.instruction)
                if episode < cfg.videos:
                    path = run.path / "videos" / f"{task}-{episode}.mp4"
                    write_video(path, traj.observations["pixels"], fps=cfg.fps)
                    videos.append(str(path.relative_to(run.path)))
                bar.update(1)
            env.close()
            result = TaskResult(
                task,
                cfg.episodes,
                float(np.mean(successes)),
                float(np.mean(lengths)),
                float(np.mean(collisions)),
                instructions,
                videos,
            )
            results.append(result)
            metrics.log(
                {
                    f"{task}/success_rate": result.success_rate,
                    f"{task}/mean_length": result.mean_length,
                    f"{task}/collisions": result.collisions_per_episode,
                },
                step=step,
            )
    bar.close()
    write_report(run.path, cfg, results)
    return run, results


DEMO_HEADERS = ("task", "episodes", "success", "mean length", "collisions/episode")


def _rows(results: list[TaskResult]) -> list[list[str]]:
    return [
        [r.task, str(r.episodes), f"{r.success_rate:.0%}", f"{r.mean_length:.1f}",
         f"{r.collisions_per_episode:.2f}"]
        for r in results
    ]  # fmt: skip


def markdown_table(results: list[TaskResult]) -> str:
    """The results as a markdown table (also printed as the demo's summary)."""
    from embodied.report import markdown_table as table

    return table(DEMO_HEADERS, _rows(results))


def write_report(path: Path, cfg: DemoConfig, results: list[TaskResult]) -> None:
    """Write ``results.json``, ``report.md`` and a self-contained ``report.html``."""
    from embodied.report import html_page, html_table, video_cards

    created = time.strftime("%Y-%m-%d %H:%M:%S")
    payload = {"created": created, "results": [r.__dict__ for r in results]}
    atomic_write_text(path / "results.json", json.dumps(payload, indent=2) + "\n")
    md = [
        "# Scripted experts on the tabletop suite",
        "",
        f"{cfg.episodes} episodes per task, seeds {cfg.seed}..{cfg.seed + cfg.episodes - 1}, "
        f"action noise {cfg.noise}.",
        "",
        markdown_table(results),
        "",
    ]
    for r in results:
        md += [f"## {r.task}", "", f"Example instruction: *{r.instructions[0]}*", ""]
        md += [f"- video: [{v}]({v})" for v in r.videos] + [""]
    atomic_write_text(path / "report.md", "\n".join(md))

    videos = [
        (v, f"{r.task}: {r.instructions[i]}") for r in results for i, v in enumerate(r.videos)
    ]
    body = (
        f"<p>{cfg.episodes} episodes per task, action noise {cfg.noise}; generated {created}.</p>"
        + html_table(DEMO_HEADERS, _rows(results))
        + "<h2>Rollouts</h2>"
        + video_cards(videos)
    )
    title = "Scripted experts on the tabletop suite"
    atomic_write_text(path / "report.html", html_page(title, body))
