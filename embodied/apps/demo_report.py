"""The demo's report: the one-screen summary, learning curves, progress curves, the reward-hacking
monitor, ``results.json``, ``report.md`` and a self-contained ``report.html``."""

from __future__ import annotations

import html
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from embodied.core.io import atomic_write_bytes, atomic_write_text
from embodied.core.run import read_metrics
from embodied.evaluation.report import (
    camera_strip,
    figure_png,
    html_page,
    html_table,
    image_tag,
    markdown_table,
    progress_plot,
    pyplot,
    success_plot,
    video_cards,
)

STAGES = ("collect", "label", "reward model", "bc", "eval bc", "grpo", "eval grpo")


@dataclass
class TaskOutcome:
    """One task's pipeline: its stage runs, both evaluations and the time each stage took."""

    task: str
    bc: Any  # EvalResult
    grpo: Any  # EvalResult
    runs: dict[str, str]
    seconds: dict[str, float]
    learned_curves: dict[str, list[list[float]]] = field(repr=False, default_factory=dict)
    # the first evaluation episode's camera frames that the reward model scored, and its scores
    views: dict[str, tuple[Any, list[float]]] = field(repr=False, default_factory=dict)

    @property
    def separated(self) -> bool:
        """GRPO's Wilson interval lies wholly above BC's."""
        return self.grpo.ci_low > self.bc.ci_high


SUMMARY_HEADERS = ("task", "BC success", "GRPO success", "change", "intervals separate",
                   "collisions/episode", "final progress")  # fmt: skip


def _pair(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "n/a"
    return f"{before:.2f} -> {after:.2f}"


def summary_rows(outcomes: Sequence[TaskOutcome]) -> list[list[str]]:
    """One row per task: success before/after with Wilson 95% intervals and the change."""
    return [
        [
            o.task,
            o.bc.success_text(),
            o.grpo.success_text(),
            f"{(o.grpo.success_rate - o.bc.success_rate) * 100:+.0f} points",
            "yes" if o.separated else "no",
            _pair(o.bc.collisions_per_episode, o.grpo.collisions_per_episode),
            _pair(o.bc.final_progress, o.grpo.final_progress),
        ]
        for o in outcomes
    ]


def markdown_summary(outcomes: Sequence[TaskOutcome]) -> str:
    """The before/after table as markdown (the demo's one-screen summary)."""

    return markdown_table(SUMMARY_HEADERS, summary_rows(outcomes))


def summary_text(outcomes: Sequence[TaskOutcome]) -> str:
    """The one-screen summary: the before/after table, then each task's time per stage."""
    lines = [markdown_summary(outcomes), ""]
    for o in outcomes:
        stages = ", ".join(f"{name} {sec:.0f} s" for name, sec in o.seconds.items())
        lines.append(f"{o.task}: {sum(o.seconds.values()) / 60:.1f} min ({stages})")
    return "\n".join(lines)


def timing_rows(outcomes: Sequence[TaskOutcome]) -> list[list[str]]:
    """Seconds per stage and task."""
    return [[o.task, *(f"{o.seconds.get(s, 0.0):.0f}" for s in STAGES),
             f"{sum(o.seconds.values()):.0f}"] for o in outcomes]  # fmt: skip


def learning_curves_plot(outcome: TaskOutcome) -> bytes:
    """Reward model (loss, validation AUROC), BC loss, GRPO rollout success and return."""

    plt = pyplot()
    reward = read_metrics(outcome.runs["reward"])
    bc = read_metrics(outcome.runs["bc"])
    grpo = read_metrics(outcome.runs["grpo"])
    fig, axes = plt.subplots(1, 3, figsize=(11, 2.8))

    def series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
        rows = [(r["step"], r[key]) for r in records if key in r]
        return [s for s, _ in rows], [v for _, v in rows]

    ax = axes[0]
    ax.plot(*series(reward, "train/loss"), label="train loss")
    ax.set_title("progress reward model", fontsize=9)
    ax.set_xlabel("step")
    twin = ax.twinx()
    twin.plot(*series(reward, "val/success_auroc"), "o-", color="tab:green", label="val AUROC")
    twin.set_ylim(0, 1.05)
    twin.set_ylabel("val success AUROC", fontsize=8)
    axes[1].plot(*series(bc, "bc/loss"))
    axes[1].set_yscale("log")
    axes[1].set_title("behaviour cloning loss", fontsize=9)
    axes[1].set_xlabel("step")
    ax = axes[2]
    ax.plot(*series(grpo, "rollout/success_rate"), "o-", label="rollout success")
    ax.plot(*series(grpo, "score/return_mean"), "s--", label="mean return (kept groups)")
    ax.set_title("GRPO (sampling policy, training seeds)", fontsize=9)
    ax.set_xlabel("iteration")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return figure_png(fig)


def monitor_plot(outcome: TaskOutcome) -> bytes:
    """The reward-hacking monitor: learned vs privileged progress on each GRPO iteration's
    rollouts (their per-step correlation, and both mean final values)."""

    plt = pyplot()
    grpo = [r for r in read_metrics(outcome.runs["grpo"]) if "monitor/reward_corr" in r]
    steps = [r["step"] for r in grpo]
    fig, axes = plt.subplots(1, 2, figsize=(8, 2.6))
    axes[0].plot(steps, [r["monitor/reward_corr"] for r in grpo], "o-")
    axes[0].set_ylim(-1.05, 1.05)
    axes[0].axhline(0, color="grey", lw=0.5)
    axes[0].set_title("corr(learned, privileged) progress, every step", fontsize=9)
    axes[0].set_xlabel("iteration")
    axes[1].plot(steps, [r["monitor/learned_final_progress"] for r in grpo], "o-", label="learned")
    axes[1].plot(
        steps, [r["monitor/privileged_final_progress"] for r in grpo], "s--", label="privileged"
    )
    axes[1].set_ylim(-0.05, 1.05)
    axes[1].set_title("mean final progress of the rollouts", fontsize=9)
    axes[1].set_xlabel("iteration")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return figure_png(fig)


def write_report(path: Path, cfg: Any, outcomes: Sequence[TaskOutcome], seconds: float) -> None:
    """``results.json``, ``report.md``, the plots and a self-contained ``report.html``."""

    created = time.strftime("%Y-%m-%d %H:%M:%S")
    payload = {
        "created": created,
        "seconds": seconds,
        "tasks": [
            {"task": o.task, "bc": asdict(o.bc), "grpo": asdict(o.grpo), "separated": o.separated,
             "runs": o.runs, "seconds": o.seconds, "learned_progress": o.learned_curves}
            for o in outcomes
        ],
    }  # fmt: skip
    atomic_write_text(path / "results.json", json.dumps(payload, indent=2) + "\n")
    seeds = f"seeds {cfg.eval_seed}..{cfg.eval_seed + cfg.eval_episodes - 1}"
    reads = {
        "cameras": f"the front camera ({cfg.image_size} px), agent_pos and the instruction",
        "state": "the simulator's object state",
    }[cfg.inputs]
    dart = f" + {cfg.dart} DART" if cfg.dart else ""
    intro = (
        f"{cfg.demos}{dart} expert demonstrations per task; the diffusion planner, reading "
        f"{reads}, behaviour-cloned on them, then fine-tuned with GRPO on the learned progress "
        f"reward plus success. Both "
        f"evaluated greedily on the same {cfg.eval_episodes} held-out {seeds}; intervals are "
        f"Wilson 95%. Whole pipeline: {seconds / 60:.1f} minutes."
    )
    success_png = success_plot({"BC": [o.bc for o in outcomes], "GRPO": [o.grpo for o in outcomes]})
    atomic_write_bytes(path / "success.png", success_png)
    timing_headers = ("task", *STAGES, "total")
    timing = markdown_table(timing_headers, timing_rows(outcomes))
    md = ["# embodied demo: BC then GRPO with a learned progress reward", "", intro, "",
          markdown_summary(outcomes), "", "![success](success.png)", "",
          "Seconds per stage:", "", timing, ""]  # fmt: skip
    body = [
        f"<p>{html.escape(intro)} Generated {created}.</p>",
        html_table(SUMMARY_HEADERS, summary_rows(outcomes)),
        image_tag(success_png, "success rate before and after GRPO"),
    ]
    for o in outcomes:
        slug = o.task
        pngs = {
            "curves": learning_curves_plot(o),
            "progress": progress_plot(
                [
                    (f"{o.task} BC: privileged", o.bc.progress_curves, o.bc.episode_successes),
                    (
                        f"{o.task} GRPO: privileged",
                        o.grpo.progress_curves,
                        o.grpo.episode_successes,
                    ),
                    (f"{o.task} BC: learned", o.learned_curves["BC"], o.bc.episode_successes),
                    (f"{o.task} GRPO: learned", o.learned_curves["GRPO"], o.grpo.episode_successes),
                ]
            ),  # fmt: skip
            "monitor": monitor_plot(o),
            "camera": camera_strip(
                [(f"{name}, episode 1", *o.views[name]) for name in ("BC", "GRPO")]
            ),
        }
        for kind, png in pngs.items():
            atomic_write_bytes(path / f"{slug}-{kind}.png", png)
        md += [f"## {o.task}", "", *(f"![{k}]({slug}-{k}.png)" for k in pngs), ""]
        md += [f"- video: [{v}]({v})" for v in o.bc.videos + o.grpo.videos] + [""]
        videos = [(v, f"BC: {o.bc.instructions[i]}") for i, v in enumerate(o.bc.videos)]
        videos += [(v, f"GRPO: {o.grpo.instructions[i]}") for i, v in enumerate(o.grpo.videos)]
        body += [
            f"<h2>{html.escape(o.task)}</h2>",
            "<h3>Learning curves</h3>",
            image_tag(pngs["curves"], f"{o.task} learning curves"),
            "<h3>Progress of successful (green) and failed (red) evaluation episodes</h3>",
            image_tag(pngs["progress"], f"{o.task} progress curves"),
            "<h3>What the camera sees: the planner's input, with the learned progress of each "
            "frame</h3>",
            image_tag(pngs["camera"], f"{o.task} camera frames"),
            "<h3>Reward-hacking monitor</h3>",
            image_tag(pngs["monitor"], f"{o.task} reward monitor"),
            "<h3>Rollouts (same seeds before and after)</h3>",
            video_cards(videos),
        ]
    body += ["<h2>Time per stage (seconds)</h2>", html_table(timing_headers, timing_rows(outcomes))]
    atomic_write_text(path / "report.md", "\n".join(md))
    atomic_write_text(path / "report.html", html_page("embodied demo", "\n".join(body)))
