"""Reports a person opens: markdown tables, matplotlib plots and one self-contained HTML page
(tables, plots as embedded PNGs, MP4 videos beside it) for ``embodied eval`` and ``embodied demo``.
"""

from __future__ import annotations

import base64
import html
import io
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embodied.core.io import atomic_write_bytes, atomic_write_text
from embodied.evaluation.results import write_results_json

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; max-width: 70rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
td, th { border: 1px solid #ccc; padding: 4px 10px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
th { background: #f0f0f0; } .videos { display: flex; flex-wrap: wrap; gap: 1rem; }
figure { margin: 0; } figcaption { font-size: 0.85rem; max-width: 320px; }
img.plot { max-width: 100%; }
"""


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def html_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An HTML table with escaped cells."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def video_cards(videos: Sequence[tuple[str, str]], width: int = 256) -> str:
    """``<video>`` elements (relative MP4 paths) with captions, in a wrapping row."""
    cards = "".join(
        f'<figure><video src="{html.escape(path)}" controls loop muted autoplay playsinline '
        f'width="{width}"></video><figcaption>{html.escape(caption)}</figcaption></figure>'
        for path, caption in videos
    )
    return f'<div class="videos">{cards}</div>'


def image_tag(png: bytes, alt: str) -> str:
    """A PNG embedded as a data URI (the page stays one file apart from its videos)."""
    data = base64.b64encode(png).decode("ascii")
    return f'<img class="plot" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def html_page(title: str, body: str) -> str:
    """A complete HTML document with the shared style."""
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n"
    )


def figure_png(fig: Any) -> bytes:
    """Render a matplotlib figure to PNG bytes and close it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def pyplot() -> Any:
    """matplotlib's pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def success_plot(groups: dict[str, Sequence[Any]]) -> bytes:
    """Bars of success rate per task with Wilson 95% intervals; one bar colour per group (e.g.
    ``{"BC": results, "GRPO": results}``), each result with ``task``, ``success_rate``,
    ``ci_low`` and ``ci_high``."""
    plt = pyplot()
    tasks = list(dict.fromkeys(r.task for results in groups.values() for r in results))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(tasks) * max(len(groups), 1)), 3.2))
    width = 0.8 / max(len(groups), 1)
    for g, (label, results) in enumerate(groups.items()):
        by_task = {r.task: r for r in results}
        xs = [i + (g - (len(groups) - 1) / 2) * width for i, t in enumerate(tasks) if t in by_task]
        rs = [by_task[t] for t in tasks if t in by_task]
        rates = np.array([r.success_rate for r in rs])
        errors = np.array([[r.success_rate - r.ci_low, r.ci_high - r.success_rate] for r in rs]).T
        ax.bar(xs, rates, width, yerr=errors, capsize=3, label=label)
    ax.set_xticks(range(len(tasks)), [t.removeprefix("metaworld/") for t in tasks], rotation=20)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate (Wilson 95%)")
    if len(groups) > 1:
        ax.legend()
    return figure_png(fig)


def progress_plot(panels: Sequence[tuple[str, Sequence[Sequence[float]], Sequence[bool]]]) -> bytes:
    """Progress over time of successful (green) vs failed (red) episodes: one panel per
    ``(title, curves, successes)``."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 2.6), squeeze=False)
    for ax, (title, curves, successes) in zip(axes[0], panels, strict=True):
        for curve, won in zip(curves, successes, strict=True):
            ax.plot(curve, color="tab:green" if won else "tab:red", alpha=0.5, lw=1)
        ax.set_title(title, fontsize=9)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("step")
    axes[0][0].set_ylabel("progress (green: success)")
    return figure_png(fig)


def camera_strip(rows: Sequence[tuple[str, np.ndarray, Sequence[float]]]) -> bytes:
    """What a camera saw along an episode: one row per ``(title, frames uint8 [K, H, W, 3],
    progress [K])``, each frame captioned with the progress scored on it."""
    plt = pyplot()
    width = max(len(frames) for _, frames, _ in rows)
    fig, axes = plt.subplots(
        len(rows), width, figsize=(1.2 * width, 1.5 * len(rows)), squeeze=False
    )
    for row, (title, frames, progress) in zip(axes, rows, strict=True):
        for i, ax in enumerate(row):
            ax.axis("off")
            if i < len(frames):
                ax.imshow(frames[i])
                ax.set_title(f"{progress[i]:.2f}", fontsize=8)
        row[0].text(-0.1, 0.5, title, transform=row[0].transAxes, ha="right", va="center",
                    fontsize=8)  # fmt: skip
    return figure_png(fig)


def result_panels(results: Sequence[Any]) -> list[tuple[str, list[list[float]], list[bool]]]:
    """``progress_plot`` panels of evaluation results' privileged progress, one per task."""
    return [
        (r.task.removeprefix("metaworld/"), r.progress_curves, r.episode_successes) for r in results
    ]


EVAL_HEADERS = (
    "task",
    "episodes",
    "success",
    "95% interval",
    "mean length",
    "collisions/episode",
    "final progress",
)


def eval_table(results: Sequence[Any]) -> tuple[list[str], list[list[str]]]:
    """Headers and one row per task, then the suite average; with repeated states, the states
    solved in any of their episodes, the greedy policy's success (one episode a state), of the
    states it fails those solved, and the sampled success rate on their episodes."""

    def number(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    def share(part: int | None, whole: int | None) -> str:
        return "n/a" if part is None or whole is None else f"{part}/{whole}"

    repeated = any(0 < r.states < r.episodes for r in results)
    headers = list(EVAL_HEADERS) + (
        ["states solved", "greedy fails, sampled solves", "greedy", "sampled where greedy fails"]
        if repeated
        else []
    )
    rows = [
        [
            r.task,
            str(r.episodes),
            f"{r.success_rate:.0%}",
            f"{r.ci_low:.0%}-{r.ci_high:.0%}",
            f"{r.mean_length:.1f}",
            number(r.collisions_per_episode, ".2f"),
            number(r.final_progress, ".2f"),
        ]
        + (
            [
                f"{r.states_solved}/{r.states}",
                share(r.solved_where_greedy_fails, r.greedy_failed),
                number(r.greedy_success_rate, ".0%"),
                number(r.sampled_where_greedy_fails, ".0%"),
            ]
            if repeated
            else []
        )
        for r in results
    ]
    if len(results) > 1:
        mean = float(np.mean([r.success_rate for r in results]))
        rows.append(["suite average", str(sum(r.episodes for r in results)), f"{mean:.0%}"])
        rows[-1] += [""] * (len(headers) - 3)
    return headers, rows


def write_eval_report(
    path: Path, cfg: Any, results: Sequence[Any], seconds: float | None = None
) -> None:
    """``results.json``, ``report.md``, ``success.png``, ``progress.png`` and ``report.html``."""

    path = Path(path)
    created = time.strftime("%Y-%m-%d %H:%M:%S")
    write_results_json(path / "results.json", cfg, results, created=created, seconds=seconds)
    title = f"Evaluation of {cfg.policy} on {cfg.suite}"
    seeds = f"seeds {cfg.seed}..{cfg.seed + cfg.episodes - 1} (held out)"
    per_task = f"{cfg.episodes} episodes per task, {seeds}"
    if cfg.repeats > 1:
        per_task = f"{cfg.episodes} initial states per task, {seeds}, {cfg.repeats} episodes each"
    headers, rows = eval_table(results)
    md = [f"# {title}", "", f"{per_task}.", ""]
    md += [markdown_table(headers, rows), "", "![success](success.png)", ""]
    if any(r.progress_curves for r in results):
        md += ["![progress](progress.png)", ""]
    md += [f"- {r.task}: [{v}]({v})" for r in results for v in r.videos]
    atomic_write_text(path / "report.md", "\n".join(md) + "\n")

    success_png = success_plot({cfg.policy: results})
    atomic_write_bytes(path / "success.png", success_png)
    body = [
        f"<p>{html.escape(per_task)}; generated {created}"
        + (f" in {seconds:.0f} s" if seconds is not None else "")
        + ".</p>",
        html_table(headers, rows),
        image_tag(success_png, "success rate per task"),
    ]
    with_curves = [r for r in results if r.progress_curves]
    if with_curves:
        progress_png = progress_plot(result_panels(with_curves))
        atomic_write_bytes(path / "progress.png", progress_png)
        body += ["<h2>Progress</h2>", image_tag(progress_png, "progress over time")]
    videos = [(v, f"{r.task}: {r.instructions[0]}") for r in results for v in r.videos[:1]]
    if videos:
        body += ["<h2>Rollouts</h2>", video_cards(videos)]
    atomic_write_text(path / "report.html", html_page(title, "\n".join(body)))
