"""Results of evaluation rollouts: success rates with Wilson intervals, lengths, collisions and
final (privileged) progress per task, and the ``results.json`` they are written to."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embodied.core.io import atomic_write_text


def wilson_interval(successes: int, episodes: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a success rate (scipy's ``binomtest``); (0, 1) with no episodes."""
    if episodes == 0:
        return 0.0, 1.0
    from scipy.stats import binomtest

    ci = binomtest(int(successes), int(episodes)).proportion_ci(confidence, method="wilson")
    return float(ci.low), float(ci.high)


@dataclass
class EvalResult:
    """Outcome of ``episodes`` rollouts of one task."""

    task: str
    episodes: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    mean_length: float
    collisions_per_episode: float | None = None  # None: the env does not report collisions
    final_progress: float | None = None  # mean privileged progress at the end; None: no labels
    # Initial states (distinct seeds) and those with a success in any of their episodes: with
    # eval's repeats > 1 and sample=true, where the sampled policy ever succeeds (RL's signal)
    states: int = 0
    states_solved: int = 0
    # With repeats: the greedy policy's success rate (one episode per state), the states it
    # fails, how many of them sampling solves, and the sampled success rate on their episodes
    greedy_success_rate: float | None = None
    greedy_failed: int | None = None
    solved_where_greedy_fails: int | None = None
    sampled_where_greedy_fails: float | None = None
    instructions: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    # Per-episode privileged progress curves and outcomes, for the report's plots.
    progress_curves: list[list[float]] = field(default_factory=list, repr=False)
    episode_successes: list[bool] = field(default_factory=list, repr=False)
    episode_seeds: list[int | None] = field(default_factory=list, repr=False)

    def success_text(self) -> str:
        """``62% (48%-74%)``: the success rate and its Wilson interval, for a line or a cell."""
        return f"{self.success_rate:.0%} ({self.ci_low:.0%}-{self.ci_high:.0%})"

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        """Flat metrics for the logger."""
        out = {
            f"{prefix}/{self.task}/success_rate": self.success_rate,
            f"{prefix}/{self.task}/success_ci_low": self.ci_low,
            f"{prefix}/{self.task}/success_ci_high": self.ci_high,
            f"{prefix}/{self.task}/mean_length": self.mean_length,
        }
        if self.collisions_per_episode is not None:
            out[f"{prefix}/{self.task}/collisions"] = self.collisions_per_episode
        if self.final_progress is not None:
            out[f"{prefix}/{self.task}/final_progress"] = self.final_progress
        if self.greedy_success_rate is not None:
            out[f"{prefix}/{self.task}/greedy_success_rate"] = self.greedy_success_rate
        if self.sampled_where_greedy_fails is not None:
            out[f"{prefix}/{self.task}/sampled_where_greedy_fails"] = (
                self.sampled_where_greedy_fails
            )
        return out


def design_effect(states: Sequence[Any], outcomes: Sequence[bool]) -> float:
    """Kish's design effect ``1 + (m - 1) * ICC`` of outcomes clustered by initial state (``m``
    episodes per state on average, ICC from one-way ANOVA, floored at 0): how many times fewer
    independent episodes the repeats of a state are worth. 1 when every state ran once."""
    groups: dict[Any, list[float]] = {}
    for state, won in zip(states, outcomes, strict=True):
        groups.setdefault(state, []).append(float(won))
    n, g = len(outcomes), len(groups)
    m = n / g
    if m == 1:
        return 1.0
    if g < 2:
        return m  # one state: its repeats are one observation of it, at worst
    means = {state: np.mean(ys) for state, ys in groups.items()}
    grand = float(np.mean(outcomes))
    between = sum(len(ys) * (means[s] - grand) ** 2 for s, ys in groups.items()) / (g - 1)
    within = sum(sum((y - means[s]) ** 2 for y in ys) for s, ys in groups.items()) / (n - g)
    if between + (m - 1) * within == 0:
        return m  # every episode alike: no evidence the repeats are independent
    icc = max(0.0, (between - within) / (between + (m - 1) * within))
    return 1.0 + (m - 1) * icc


def collisions_per_episode(trajectories: Sequence[Any]) -> float | None:
    """Mean collision steps per episode; None when some episode's env recorded no collisions
    (Meta-World), rather than a made-up 0."""
    if not all("collisions" in t.info for t in trajectories):
        return None
    return float(np.mean([np.sum(t.info["collisions"]) for t in trajectories]))


def summarize(task: str, trajectories: Sequence[Any]) -> EvalResult:
    """Aggregate one task's trajectories (their privileged ``info``) into an ``EvalResult``."""
    if not trajectories:
        raise ValueError(f"no episodes to summarise for {task}")
    outcomes = [t.ever_succeeded for t in trajectories]
    wins = int(sum(outcomes))
    seeds = [None if t.seed is None else int(t.seed) for t in trajectories]
    states = [(i,) if seed is None else seed for i, seed in enumerate(seeds)]  # unseeded: its own
    solved = {state for state, won in zip(states, outcomes, strict=True) if won}
    # Repeats of a state are not independent episodes: Wilson on the effective sample size
    effective = max(1, round(len(outcomes) / design_effect(states, outcomes)))
    low, high = wilson_interval(round(wins / len(outcomes) * effective), effective)
    curves = (
        [np.asarray(t.info["progress"], dtype=float).tolist() for t in trajectories]
        if all("progress" in t.info for t in trajectories)
        else []
    )
    return EvalResult(
        task=task,
        episodes=len(outcomes),
        successes=wins,
        success_rate=wins / len(outcomes),
        ci_low=low,
        ci_high=high,
        mean_length=float(np.mean([t.length for t in trajectories])),
        collisions_per_episode=collisions_per_episode(trajectories),
        final_progress=float(np.mean([c[-1] for c in curves if c])) if curves else None,
        states=len(set(states)),
        states_solved=len(solved),
        instructions=[t.instruction for t in trajectories],
        progress_curves=curves,
        episode_successes=outcomes,
        episode_seeds=seeds,
    )


def results_json(cfg: Any, results: Sequence[EvalResult], **extra: Any) -> str:
    """``results.json``: the config, each task's result and the suite average."""
    payload = {
        "config": asdict(cfg) if hasattr(cfg, "__dataclass_fields__") else cfg,
        "suite_success_rate": float(np.mean([r.success_rate for r in results])),
        "results": [asdict(r) for r in results],
        **extra,
    }
    return json.dumps(payload, indent=2) + "\n"


def write_results_json(path: Path, cfg: Any, results: Sequence[EvalResult], **extra: Any) -> None:
    """Write ``results_json`` atomically."""
    atomic_write_text(path, results_json(cfg, results, **extra))
