"""``embodied demo``: the whole pipeline on a laptop CPU, ending in one report.

For each task (``DemoConfig`` holds the recipe; override any setting as ``key=value``):

1. collect expert demonstrations (state observations) and failure data for the reward model
   (noisy, cut-off and ReWiND-rewound camera episodes);
2. label the failure data with procedure-grounded progress;
3. train the progress reward model;
4. behaviour-clone the diffusion planner on the demonstrations;
5. evaluate it on held-out seeds;
6. fine-tune it with trajectory-level GRPO on the learned reward plus success;
7. evaluate again on the same seeds;

then write ``report.html``: success before/after with Wilson intervals, learning curves,
progress curves of successful vs failed episodes, the reward-hacking monitor and rollout videos.
Every stage is an ordinary ``embodied`` job whose run directory sits inside the demo's.
"""

from __future__ import annotations

import html
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from embodied.core.config import config_from, seed_setting, setting, validate
from embodied.core.io import atomic_write_bytes, atomic_write_text
from embodied.core.run import RunDir, read_metrics, seed_everything

STAGES = ("collect", "label", "reward model", "bc", "eval bc", "grpo", "eval grpo")

# `embodied demo --quick`: the same pipeline at toy sizes, for CI and a first look (minutes).
QUICK = [
    "demos=10",
    "failures.episodes=8",
    "reward.steps=20",
    "reward.eval_every=10",
    "reward.log_every=5",
    "bc.steps=40",
    "bc.log_every=5",
    "grpo.iterations=2",
    "grpo.groups=2",
    "grpo.group_size=4",
    "eval_episodes=10",
    "videos=1",
]


def _failures() -> dict[str, Any]:
    return {"episodes": 60, "noise": 0.1, "cutoff": 0.3, "rewind": 0.3, "image_size": 64}


def _reward() -> dict[str, Any]:
    return {"steps": 400, "batch_size": 32, "eval_every": 200, "save_every": 200}


def _bc() -> dict[str, Any]:
    return {
        "policy": "diffusion",
        "policy_overrides": {
            "image_keys": [],
            "env_state_encoder": "objects",
            "cond_mlp_dims": [256, 256],
            "n_action_steps": 4,
        },
        "steps": 1000,
        "batch_size": 64,
        "optim": {"lr": 1e-3, "warmup_steps": 100},
        "eval_episodes": 0,
        "save_every": 500,
    }


def _grpo() -> dict[str, Any]:
    return {
        "iterations": 12,
        "groups": 8,
        "group_size": 4,
        "max_refills": 0,
        "policy_overrides": {"min_std": 0.05, "finetune_steps": 10},
        "optim": {"lr": 3e-5, "weight_decay": 0.0, "warmup_steps": 0},
        "eval_episodes": 0,
        "save_every": 5,
    }


# Settings of each stage that the demo wires itself (datasets, policies, the reward model).
WIRED = {
    "failures": ("task", "out", "seed"),
    "reward": ("dataset", "out"),
    "bc": ("dataset", "out"),
    "grpo": ("policy", "reward_model", "task"),
}


@dataclass
class DemoConfig:
    """What the demo runs; every field can be overridden as ``key=value`` (sections with dotted
    keys, e.g. ``grpo.iterations=30``): ``failures`` are ``embodied collect`` settings, ``reward``
    ``embodied train reward``'s, ``bc`` ``embodied train bc``'s, ``grpo`` ``embodied train grpo``'s.
    """

    name: str = "demo"
    out: str = "runs"
    tasks: list[str] = field(default_factory=lambda: ["DrawerOpen"])
    seed: int = seed_setting()
    demos: int = setting(100, low=1)  # clean expert demonstrations per task, for BC
    failures: dict[str, Any] = field(default_factory=_failures)
    reward: dict[str, Any] = field(default_factory=_reward)
    bc: dict[str, Any] = field(default_factory=_bc)
    grpo: dict[str, Any] = field(default_factory=_grpo)
    eval_episodes: int = setting(100, low=1)  # held-out seeds, the same before and after GRPO
    eval_seed: int = seed_setting(100_000)
    eval_envs: int = setting(50, low=1)  # sub-envs in one batched call: 1.6x faster than 10
    videos: int = setting(2, low=0)  # per task and policy
    fps: int = setting(8, low=1)

    def check(self) -> None:
        """Tabletop tasks, videos of episodes that run, and no stage setting the demo wires."""
        import embodied.sims as sims

        unknown = [t for t in self.tasks if t not in sims.list_tasks("tabletop")]
        if unknown or not self.tasks:
            raise ValueError(
                f"tasks = {list(self.tasks)}: expected tabletop tasks from "
                f"{', '.join(sims.list_tasks('tabletop'))}"
            )
        if self.videos > self.eval_episodes:
            raise ValueError(
                f"videos = {self.videos}: expected at most eval_episodes = {self.eval_episodes}"
            )
        for section, keys in WIRED.items():
            fixed = sorted(set(getattr(self, section)) & set(keys))
            if fixed:
                raise ValueError(f"{section}.{fixed[0]} is set by the demo itself; remove it")


@dataclass
class TaskOutcome:
    """One task's pipeline: its stage runs, both evaluations and the time each stage took."""

    task: str
    bc: Any  # EvalResult
    grpo: Any  # EvalResult
    runs: dict[str, str]
    seconds: dict[str, float]
    learned_curves: dict[str, list[list[float]]] = field(repr=False, default_factory=dict)

    @property
    def separated(self) -> bool:
        """GRPO's Wilson interval lies wholly above BC's."""
        return self.grpo.ci_low > self.bc.ci_high


def stage_configs(cfg: DemoConfig, task: str, root: Path) -> dict[str, Any]:
    """The demo's stages for ``task`` as the configs of the ordinary jobs (checked up front, so
    a bad key fails before minutes of work)."""
    from embodied.apps.collect import CollectConfig
    from embodied.train.bc import BCConfig
    from embodied.train.grpo import GRPOConfig
    from embodied.train.reward import RewardTrainConfig

    data, runs = root / "data", root / task
    demos = config_from(
        CollectConfig,
        {"task": task, "episodes": cfg.demos, "out": data / f"{task}-demos", "seed": cfg.seed,
         "obs_mode": "state"},
    )  # fmt: skip
    failures = config_from(
        CollectConfig,
        {"seed": cfg.seed + 50_000, **cfg.failures, "task": task, "out": data / f"{task}-failures"},
        "in the demo's failures section",
    )
    reward = config_from(
        RewardTrainConfig,
        {"seed": cfg.seed, **cfg.reward, "dataset": failures.out, "out": runs, "name": "reward"},
        "in the demo's reward section",
    )
    bc = config_from(
        BCConfig, {"seed": cfg.seed, **cfg.bc, "dataset": demos.out, "out": runs, "name": "bc"},
        "in the demo's bc section",
    )  # fmt: skip
    # policy and reward_model are filled in once the bc and reward stages have saved them
    grpo = config_from(
        GRPOConfig,
        {"seed": cfg.seed, **cfg.grpo, "task": task, "policy": "(bc)", "reward": "learned",
         "reward_model": "(reward)", "out": runs, "name": "grpo"},
        "in the demo's grpo section",
    )  # fmt: skip
    return {"demos": demos, "failures": failures, "reward": reward, "bc": bc, "grpo": grpo}


def run_demo(cfg: DemoConfig, echo: Any = print) -> tuple[RunDir, list[TaskOutcome]]:
    """Run the pipeline on every task, write the report; return the run and the outcomes.
    ``echo`` gets one line as each stage starts."""
    validate(cfg)
    for task in cfg.tasks:  # a bad key fails here, before a run directory or minutes of work
        stage_configs(cfg, task, Path(cfg.out))
    run = RunDir.create(cfg.out, cfg.name, config=cfg)
    plans = {task: stage_configs(cfg, task, run.path) for task in cfg.tasks}
    seed_everything(cfg.seed)
    started = time.perf_counter()
    outcomes = [_run_task(cfg, task, plans[task], run, echo) for task in cfg.tasks]
    write_report(run.path, cfg, outcomes, time.perf_counter() - started)
    return run, outcomes


def _run_task(
    cfg: DemoConfig, task: str, plan: dict[str, Any], run: RunDir, echo: Any
) -> TaskOutcome:
    """The seven stages on one task."""
    from embodied.apps.collect import run_collect
    from embodied.apps.label import run_label
    from embodied.policies import Policy
    from embodied.rewards import make_reward_model
    from embodied.train.bc import train_bc
    from embodied.train.grpo import train_grpo
    from embodied.train.reward import train_reward

    runs: dict[str, str] = {}
    marks: list[tuple[str, float]] = []  # (stage, start time)

    def stage(name: str) -> None:
        marks.append((name, time.perf_counter()))
        echo(f"[{task}] {STAGES.index(name) + 1}/{len(STAGES)} {name}")

    stage("collect")
    run_collect(plan["demos"])
    run_collect(plan["failures"])
    stage("label")
    run_label(plan["failures"].out)
    stage("reward model")
    runs["reward"] = str(train_reward(plan["reward"]).path)
    stage("bc")
    runs["bc"] = str(train_bc(plan["bc"]).path)
    reward_model = make_reward_model(
        "learned", str(Path(runs["reward"]) / "model"), plan["grpo"].reward_frames
    )
    curves: dict[str, list[list[float]]] = {}

    stage("eval bc")
    policy = Policy.from_pretrained(Path(runs["bc"]) / "policy").eval()
    bc_result, curves["BC"] = _evaluate(cfg, run.path, task, policy, reward_model, "bc")
    stage("grpo")
    grpo_cfg = plan["grpo"]
    grpo_cfg.policy, grpo_cfg.reward_model = runs["bc"] + "/policy", runs["reward"] + "/model"
    runs["grpo"] = str(train_grpo(grpo_cfg).path)
    stage("eval grpo")
    policy = Policy.from_pretrained(Path(runs["grpo"]) / "policy").eval()
    grpo_result, curves["GRPO"] = _evaluate(cfg, run.path, task, policy, reward_model, "grpo")
    marks.append(("end", time.perf_counter()))
    seconds = {name: end - start for (name, start), (_, end) in itertools.pairwise(marks)}
    return TaskOutcome(task, bc_result, grpo_result, runs, seconds, curves)


def _evaluate(
    cfg: DemoConfig,
    root: Path,
    task: str,
    policy: Any,
    reward_model: Any,
    prefix: str,
) -> tuple[Any, list[list[float]]]:
    """Greedy evaluation on the held-out seeds, with videos; the reward model's progress of every
    episode comes back beside the privileged result."""
    from embodied.evaluation.suite import evaluate_task, policy_check
    from embodied.rollout.episodes import PolicyActor
    from embodied.train.onpolicy import env_kwargs

    result, trajs = evaluate_task(
        root,
        task,
        lambda vec: PolicyActor(policy, vec.num_envs, deterministic=True, seed=cfg.eval_seed),
        cfg.eval_episodes,
        cfg.eval_seed,
        env_kwargs(policy, reward_model),  # the reward model's camera: scores and videos
        workers=min(cfg.eval_envs, cfg.eval_episodes),
        videos=cfg.videos,
        fps=cfg.fps,
        asynchronous=False,
        prefix=f"{prefix}-",
        check=policy_check(policy, task),
    )
    return result, [score.progress.tolist() for score in reward_model.score(trajs)]


# --- the report --------------------------------------------------------------------------------

SUMMARY_HEADERS = ("task", "BC success", "GRPO success", "change", "intervals separate",
                   "collisions/episode", "final progress")  # fmt: skip


def _pct(result: Any) -> str:
    return f"{result.success_rate:.0%} ({result.ci_low:.0%}-{result.ci_high:.0%})"


def _pair(before: float | None, after: float | None) -> str:
    if before is None or after is None:
        return "n/a"
    return f"{before:.2f} -> {after:.2f}"


def summary_rows(outcomes: Sequence[TaskOutcome]) -> list[list[str]]:
    """One row per task: success before/after with Wilson 95% intervals and the change."""
    return [
        [
            o.task,
            _pct(o.bc),
            _pct(o.grpo),
            f"{(o.grpo.success_rate - o.bc.success_rate) * 100:+.0f} points",
            "yes" if o.separated else "no",
            _pair(o.bc.collisions_per_episode, o.grpo.collisions_per_episode),
            _pair(o.bc.final_progress, o.grpo.final_progress),
        ]
        for o in outcomes
    ]


def markdown_summary(outcomes: Sequence[TaskOutcome]) -> str:
    """The before/after table as markdown (the demo's one-screen summary)."""
    from embodied.evaluation.report import markdown_table

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
    from embodied.evaluation.report import _pyplot, figure_png

    plt = _pyplot()
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
    from embodied.evaluation.report import _pyplot, figure_png

    plt = _pyplot()
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


def write_report(
    path: Path, cfg: DemoConfig, outcomes: Sequence[TaskOutcome], seconds: float
) -> None:
    """``results.json``, ``report.md``, the plots and a self-contained ``report.html``."""
    from embodied.evaluation.report import (
        html_page,
        html_table,
        image_tag,
        markdown_table,
        progress_plot,
        success_plot,
        video_cards,
    )

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
    intro = (
        f"{cfg.demos} expert demonstrations per task; the diffusion planner behaviour-cloned on "
        f"them, then fine-tuned with GRPO on the learned progress reward plus success. Both "
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
            "<h3>Reward-hacking monitor</h3>",
            image_tag(pngs["monitor"], f"{o.task} reward monitor"),
            "<h3>Rollouts (same seeds before and after)</h3>",
            video_cards(videos),
        ]
    body += ["<h2>Time per stage (seconds)</h2>", html_table(timing_headers, timing_rows(outcomes))]
    atomic_write_text(path / "report.md", "\n".join(md))
    atomic_write_text(path / "report.html", html_page("embodied demo", "\n".join(body)))
