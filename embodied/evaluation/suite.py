"""Evaluation on manipulation suites: success rates with Wilson intervals on held-out seeds,
episode lengths, collisions and final (privileged) progress per task, videos, and a report.

``evaluate_policy`` serves behaviour cloning's periodic evaluation; ``run_eval`` is
``embodied eval``: a policy directory, the scripted ``expert`` or ``random`` actions on every task
of a suite, written to ``results.json``, ``report.md``, plots and ``report.html``.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embodied.core.io import atomic_write_text

SUITES = ("tabletop", "metaworld")
# Meta-World's MT10 benchmark (its ``MT10_V3`` task list), by name so that listing it needs no
# Meta-World import.
MT10 = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)


def wilson_interval(successes: int, episodes: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a success rate (scipy's ``binomtest``); (0, 1) with no episodes."""
    if episodes == 0:
        return 0.0, 1.0
    from scipy.stats import binomtest

    ci = binomtest(int(successes), int(episodes)).proportion_ci(confidence, method="wilson")
    return float(ci.low), float(ci.high)


def episode_success(traj: Any) -> bool:
    """Whether the success flag was raised at any step (Meta-World's convention; tabletop
    episodes end there, so it equals the final flag)."""
    flags = traj.info.get("success") if isinstance(traj.info, dict) else None
    if flags is not None and len(flags):
        return bool(np.any(flags))
    return bool(traj.success)


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
    instructions: list[str] = field(default_factory=list)
    videos: list[str] = field(default_factory=list)
    # Per-episode privileged progress curves and outcomes, for the report's plots.
    progress_curves: list[list[float]] = field(default_factory=list, repr=False)
    episode_successes: list[bool] = field(default_factory=list, repr=False)

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
        return out


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
    outcomes = [episode_success(t) for t in trajectories]
    wins = int(sum(outcomes))
    low, high = wilson_interval(wins, len(outcomes))
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
        instructions=[t.instruction for t in trajectories],
        progress_curves=curves,
        episode_successes=outcomes,
    )


def env_kwargs_for_features(features: dict[str, Any]) -> dict[str, Any]:
    """Env options that reproduce a dataset's observation features (cameras, size, state).

    A single ``observation.image`` recorded no camera name: the env's default camera (tabletop
    ``front``, Meta-World ``corner2``) is the one that produced it, so no camera is passed."""
    single = "observation.image" in features
    cameras = [k.split(".", 2)[2] for k in features if k.startswith("observation.images.")]
    image_keys = ["observation.image"] if single else [f"observation.images.{c}" for c in cameras]
    has_state = "observation.environment_state" in features
    if not image_keys:
        return {"obs_mode": "state"}
    height, width = features[image_keys[0]]["shape"][:2]
    kwargs: dict[str, Any] = {
        "obs_mode": "pixels_state" if has_state else "pixels",
        "image_size": (int(height), int(width)),
    }
    if not single:
        kwargs["cameras"] = cameras
    return kwargs


def env_kwargs_for_policy(policy: Any) -> dict[str, Any]:
    """Env options giving a saved policy the observations its config says it reads."""
    config = policy.config
    size = int(getattr(config, "image_size", 96))
    features: dict[str, Any] = {
        key: {"shape": [size, size, 3]} for key in getattr(config, "image_keys", []) or []
    }
    if getattr(config, "env_state_dim", 0) > 0:
        features["observation.environment_state"] = {"shape": [config.env_state_dim]}
    return env_kwargs_for_features(features)


def check_action_space(policy: Any, task: str, env_shape: tuple[int, ...]) -> None:
    """Refuse a policy whose actions the task's env cannot take, naming both shapes."""
    policy_dim = getattr(getattr(policy, "config", None), "action_dim", None)
    if policy_dim is not None and env_shape != (policy_dim,):
        raise ValueError(
            f"the policy outputs actions of shape ({policy_dim},) but {task} takes actions of "
            f"shape {env_shape}"
        )


def rollout_task(
    task: str,
    make_actor: Callable[[Any], Any],
    episodes: int,
    seed: int,
    env_kwargs: dict[str, Any],
    workers: int = 1,
    videos: int = 0,
    check: Callable[[tuple[int, ...]], None] | None = None,
    asynchronous: bool | None = None,
) -> list[Any]:
    """Trajectories of ``episodes`` rollouts on seeds ``seed..``, in seed order; ``make_actor(vec)``
    builds the batched actor, ``check(action_shape)`` may refuse the env before any step.
    ``workers`` sub-envs run in their own processes unless ``asynchronous=False`` (one process,
    still one batched policy call for all of them)."""
    import embodied.sims as sims
    from embodied.rollout.episodes import rollout_vector

    asynchronous = workers > 1 if asynchronous is None else asynchronous
    vec = sims.make_vec_env(
        task, workers, asynchronous=asynchronous, autoreset_mode="disabled", **env_kwargs
    )
    try:
        if check is not None:
            check(tuple(vec.single_action_space.shape))
        seeds = [seed + e for e in range(episodes)]
        trajs = list(
            rollout_vector(vec, make_actor(vec), seeds, sims.suite_of(task), capture=videos)
        )
    finally:
        vec.close()
    return sorted(trajs, key=lambda t: t.seed)


def evaluate_policy(
    policy: Any,
    task: str,
    episodes: int,
    seed: int,
    env_kwargs: dict[str, Any],
    n_obs_steps: int = 1,
    workers: int = 1,
    asynchronous: bool | None = None,
    deterministic: bool = True,
) -> EvalResult:
    """Roll ``policy`` out on seeds ``seed..seed+episodes-1``: deterministically (the policy's
    mean action / noise-free chain), or sampling as in RL rollouts (each episode's noise seeded
    by its index, so the result is reproducible)."""
    from embodied.rollout.episodes import PolicyActor

    was_training = policy.training
    policy.eval()
    try:
        trajs = rollout_task(
            task,
            lambda vec: PolicyActor(
                policy, vec.num_envs, n_obs_steps, deterministic=deterministic, seed=seed
            ),
            episodes,
            seed,
            env_kwargs,
            workers,
            check=lambda shape: check_action_space(policy, task, shape),
            asynchronous=asynchronous,
        )
    finally:
        policy.train(was_training)
    return summarize(task, trajs)


def evaluate_task(
    out: Path,
    task: str,
    make_actor: Callable[[Any], Any],
    episodes: int,
    seed: int,
    env_kwargs: dict[str, Any],
    workers: int = 1,
    videos: int = 0,
    fps: int = 16,
    asynchronous: bool | None = None,
    prefix: str = "",
    check: Callable[[tuple[int, ...]], None] | None = None,
) -> tuple[EvalResult, list[Any]]:
    """``rollout_task`` then ``summarize``; the first ``videos`` episodes are written to
    ``out/videos/<prefix><task>-<seed>.mp4`` with the instruction and privileged progress drawn
    on them (paths relative to ``out`` in ``result.videos``). Returns the result and the
    trajectories; ``check`` as in ``rollout_task``. Without an H.264 encoder it warns and writes
    no videos."""
    from embodied.evaluation.video import annotate_frames, encoder_available, write_video

    if videos > 0 and not encoder_available():
        warnings.warn("no H.264 encoder (PyAV/FFmpeg): the report has no videos", stacklevel=2)
        videos = 0
    if videos > 0:
        (Path(out) / "videos").mkdir(parents=True, exist_ok=True)
    trajs = rollout_task(
        task, make_actor, episodes, seed, env_kwargs, workers, videos, check, asynchronous
    )
    result = summarize(task, trajs)
    for traj in trajs[:videos]:
        frames = annotate_frames(traj.frames, traj.instruction, traj.info.get("progress"))
        name = f"videos/{prefix}{task.replace('/', '_')}-{traj.seed}.mp4"
        write_video(Path(out) / name, frames, fps=fps)
        result.videos.append(name)
    return result, trajs


# --- embodied eval --------------------------------------------------------------------------


@dataclass
class EvalConfig:
    """What ``embodied eval`` runs; every field can be overridden as ``key=value``."""

    policy: str = "expert"  # a saved policy directory, "expert" or "random"
    suite: str = "tabletop"
    tasks: list[str] = field(default_factory=list)  # empty: the whole suite (Meta-World: MT10)
    episodes: int = 50
    seed: int = 100_000  # held out: demonstrations use seeds from 0
    videos: int = 1  # episodes per task saved as MP4 (with instruction and progress overlaid)
    sample: bool = False  # a saved policy samples as in RL rollouts instead of acting greedily
    workers: int = 1
    image_size: int = 128  # video size for state-only policies, expert and random
    fps: int = 16
    out: str = "runs"
    name: str = "eval"


def suite_tasks(suite: str, tasks: Sequence[str] = ()) -> list[str]:
    """Env task names of ``tasks`` in ``suite`` (all tabletop tasks, or MT10, when empty).

    Meta-World names may be given with or without ``metaworld/``; ``MT10`` expands to the
    benchmark's ten tasks."""
    import embodied.sims as sims

    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; available: {', '.join(SUITES)}")
    if suite == "tabletop":
        names = list(tasks) or sims.list_tasks("tabletop")
        unknown = [t for t in names if t not in sims.list_tasks("tabletop")]
        if unknown:
            raise ValueError(
                f"unknown tabletop task(s) {unknown}; available: {', '.join(sims.list_tasks())}"
            )
        return names
    expanded: list[str] = []
    for name in tasks or ["MT10"]:
        expanded += list(MT10) if name.upper() == "MT10" else [name.removeprefix("metaworld/")]
    available = [t.removeprefix("metaworld/") for t in sims.list_tasks("metaworld")]
    unknown = [t for t in expanded if t not in available]
    if unknown:
        raise ValueError(f"unknown Meta-World task(s) {unknown}; available: {', '.join(available)}")
    return ["metaworld/" + t for t in expanded]


def _actor_factory(cfg: EvalConfig) -> tuple[Callable[[Any], Any], Any]:
    """``make_actor(vec)`` for the configured policy, and the loaded policy (None for the
    scripted expert and random actions)."""
    from embodied.rollout.episodes import ExpertActor, PolicyActor, RandomActor

    if cfg.policy == "expert":
        return lambda vec: ExpertActor(vec), None
    if cfg.policy == "random":
        return lambda vec: RandomActor(vec, np.random.default_rng(cfg.seed)), None
    from embodied.policies import Policy

    if not (Path(cfg.policy) / "config.json").is_file():
        raise ValueError(
            f"policy must be 'expert', 'random' or a saved policy directory; {cfg.policy!r} "
            "has no config.json"
        )
    policy = Policy.from_pretrained(cfg.policy).eval()
    n_obs = int(getattr(policy.config, "n_obs_steps", 1))
    return (
        lambda vec: PolicyActor(
            policy, vec.num_envs, n_obs, deterministic=not cfg.sample, seed=cfg.seed
        ),
        policy,
    )


def run_eval(cfg: EvalConfig) -> tuple[Any, list[EvalResult]]:
    """Evaluate on every task; write ``results.json``, ``report.md``, plots, videos and
    ``report.html`` into a new run directory. Return the run and the per-task results."""
    from embodied.core.run import RunDir, progress, seed_everything
    from embodied.evaluation.report import write_eval_report

    for name in ("episodes", "workers", "image_size", "fps"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if not 0 <= cfg.videos <= cfg.episodes:
        raise ValueError(f"videos must be in [0, episodes={cfg.episodes}], got {cfg.videos}")
    tasks = suite_tasks(cfg.suite, cfg.tasks)
    make_actor, policy = _actor_factory(cfg)
    env_kwargs = (
        env_kwargs_for_policy(policy)
        if policy is not None
        else {"obs_mode": "state", "image_size": cfg.image_size}
    )
    if env_kwargs.get("obs_mode") == "state":
        env_kwargs["image_size"] = cfg.image_size  # only renders for the videos
    env_kwargs["terminate_on_success"] = True  # Meta-World would run on to 500 steps
    if policy is not None:  # refuse every task up front, before any rollout
        import embodied.sims as sims

        for task in tasks:
            env = sims.make(task, **env_kwargs)
            try:
                check_action_space(policy, task, tuple(env.action_space.shape))
            finally:
                env.close()

    seed_everything(cfg.seed)
    run = RunDir.create(cfg.out, cfg.name, config=cfg)
    (run.path / "videos").mkdir()
    results: list[EvalResult] = []
    started = time.perf_counter()
    bar = progress(total=len(tasks), desc=f"eval {cfg.policy}")
    with run.metrics() as metrics:
        for step, task in enumerate(tasks):
            result, _ = evaluate_task(
                run.path,
                task,
                make_actor,
                cfg.episodes,
                cfg.seed,
                env_kwargs,
                cfg.workers,
                videos=cfg.videos,
                fps=cfg.fps,
            )
            results.append(result)
            metrics.log(result.metrics(), step)
            bar.update(1)
    bar.close()
    write_eval_report(run.path, cfg, results, seconds=time.perf_counter() - started)
    return run, results


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
