"""``embodied demo``: roll out the scripted experts on every tabletop task and write a report.

The run directory gets the resolved config, per-task metrics (JSONL + TensorBoard), one MP4 per
task, ``results.json``, ``report.md`` and ``report.html`` (a page with the table and videos).
"""

from __future__ import annotations

import html
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


def markdown_table(results: list[TaskResult]) -> str:
    """The results as a markdown table (also printed as the demo's summary)."""
    lines = [
        "| task | episodes | success | mean length | collisions/episode |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.task} | {r.episodes} | {r.success_rate:.0%} | {r.mean_length:.1f} "
            f"| {r.collisions_per_episode:.2f} |"
        )
    return "\n".join(lines)


def write_report(path: Path, cfg: DemoConfig, results: list[TaskResult]) -> None:
    """Write ``results.json``, ``report.md`` and a self-contained ``report.html``."""
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

    rows = "".join(
        f"<tr><td>{html.escape(r.task)}</td><td>{r.episodes}</td><td>{r.success_rate:.0%}</td>"
        f"<td>{r.mean_length:.1f}</td><td>{r.collisions_per_episode:.2f}</td></tr>"
        for r in results
    )
    cards = "".join(
        f'<figure><video src="{html.escape(v)}" controls loop muted autoplay playsinline '
        f'width="256"></video><figcaption><b>{html.escape(r.task)}</b>: '
        f"{html.escape(r.instructions[i])}</figcaption></figure>"
        for r in results
        for i, v in enumerate(r.videos)
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Embodied demo report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 4px 10px; }}
th {{ background: #f0f0f0; }} .videos {{ display: flex; flex-wrap: wrap; gap: 1rem; }}
figure {{ margin: 0; width: 256px; }} figcaption {{ font-size: 0.85rem; }}
</style></head><body>
<h1>Scripted experts on the tabletop suite</h1>
<p>{cfg.episodes} episodes per task, action noise {cfg.noise}; generated {created}.</p>
<table><tr><th>task</th><th>episodes</th><th>success</th><th>mean length</th>
<th>collisions / episode</th></tr>{rows}</table>
<h2>Rollouts</h2><div class="videos">{cards}</div>
</body></html>
"""
    atomic_write_text(path / "report.html", page)
