"""Evaluation on manipulation suites: success rates with Wilson intervals on held-out seeds,
episode lengths, collisions and final (privileged) progress per task, videos, and a report.

``evaluate_policy`` serves behaviour cloning's periodic evaluation; ``run_eval`` is
``embodied eval``: a policy directory, the scripted ``expert`` or ``random`` actions on every task
of a suite, written to ``results.json``, ``report.md``, plots and ``report.html``.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import embodied.policies  # noqa: F401  (registers the built-in policy types)
import embodied.sims as sims
from embodied.core.config import SEED_MAX, seed_setting, setting, validate
from embodied.core.policy import Policy
from embodied.core.run import RunDir, progress_bar, seed_everything
from embodied.datasets import LeRobotDataset
from embodied.evaluation.report import write_eval_report
from embodied.evaluation.results import EvalResult, summarize
from embodied.evaluation.task_workers import map_tasks
from embodied.evaluation.video import annotate_frames, encoder_available, write_video
from embodied.rollout.episodes import (
    RECORDS,
    ExpertActor,
    ExpertLabels,
    PolicyActor,
    RandomActor,
    rollout_vector,
)
from embodied.rollout.matching import check_policy_env, env_options
from embodied.rollout.recording import open_episode_writer, recorded_env_options
from embodied.sims.metaworld import expand_presets

SUITES = ("tabletop", "metaworld")


def rollout_task(
    task: str,
    make_actor: Callable[[Any], Any],
    episodes: int,
    seed: int,
    env_kwargs: dict[str, Any],
    workers: int = 1,
    videos: int = 0,
    check: Callable[[Any], None] | None = None,
    asynchronous: bool | None = None,
    skip_unread_images: bool = False,
    repeats: int = 1,
) -> list[Any]:
    """Trajectories of ``episodes`` rollouts on seeds ``seed..``, each seed ``repeats`` times, in
    seed order; ``make_actor(vec)`` builds the batched actor, ``check(vec)`` may refuse the env
    before any step (a sampling actor draws each repeat's noise from its own episode id).
    ``workers`` sub-envs run in their own processes unless ``asynchronous=False`` (one process,
    still one batched policy call for all of them). ``skip_unread_images`` as in
    ``rollout_vector`` (tabletop and Meta-World envs have the switch)."""
    skip_unread_images = skip_unread_images and sims.supports_render_state(task)
    asynchronous = workers > 1 if asynchronous is None else asynchronous
    vec = sims.make_vec_env(
        task, workers, asynchronous=asynchronous, autoreset_mode="disabled", **env_kwargs
    )
    try:
        if check is not None:
            check(vec)
        seeds = [seed + e for e in range(episodes) for _ in range(repeats)]
        trajs = list(
            rollout_vector(
                vec,
                make_actor(vec),
                seeds,
                sims.suite_of(task),
                capture=videos,
                skip_unread_images=skip_unread_images,
            )
        )
    finally:
        vec.close()
    sims.attach_replay_frames(trajs, task, env_kwargs)
    return sorted(trajs, key=lambda t: t.seed)  # stable: a seed's repeats stay in episode order


def policy_check(policy: Policy, task: str) -> Callable[[Any], None]:
    """``check(env)`` refusing an env that cannot feed ``policy`` or take its actions."""
    return lambda env: check_policy_env(policy.observation_spec, policy.action_spec, env, task)


def evaluate_policy(
    policy: Policy,
    task: str,
    episodes: int,
    seed: int,
    env_kwargs: dict[str, Any],
    workers: int = 1,
    asynchronous: bool | None = None,
    deterministic: bool = True,
) -> EvalResult:
    """Roll ``policy`` out on seeds ``seed..seed+episodes-1``: deterministically (the policy's
    mean action / noise-free chain), or sampling as in RL rollouts (each episode's noise seeded
    by its index, so the result is reproducible)."""
    was_training = policy.training
    policy.eval()
    try:
        trajs = rollout_task(
            task,
            lambda vec: PolicyActor(policy, vec.num_envs, deterministic=deterministic, seed=seed),
            episodes,
            seed,
            env_kwargs,
            workers,
            check=policy_check(policy, task),
            asynchronous=asynchronous,
            skip_unread_images=True,  # only the outcome is kept
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
    check: Callable[[Any], None] | None = None,
    skip_unread_images: bool = False,
    repeats: int = 1,
) -> tuple[EvalResult, list[Any]]:
    """``rollout_task`` then ``summarize``; the first ``videos`` episodes are written to
    ``out/videos/<prefix><task>-<seed>.mp4`` (``-<seed>-<repeat>`` with repeats) with the
    instruction and privileged progress drawn on them (paths relative to ``out`` in
    ``result.videos``). Returns the result and the trajectories; ``check``,
    ``skip_unread_images`` and ``repeats`` as in ``rollout_task``. Without an H.264 encoder it
    warns and writes no videos."""
    if videos > 0 and not encoder_available():
        warnings.warn("no H.264 encoder (PyAV/FFmpeg): the report has no videos", stacklevel=2)
        videos = 0
    if videos > 0:
        (Path(out) / "videos").mkdir(parents=True, exist_ok=True)
    trajs = rollout_task(
        task, make_actor, episodes, seed, env_kwargs, workers, videos, check, asynchronous,
        skip_unread_images, repeats,
    )  # fmt: skip
    result = summarize(task, trajs)
    for e, traj in enumerate(trajs[:videos]):
        frames = annotate_frames(traj.frames, traj.instruction, traj.info.get("progress"))
        repeat = f"-{e % repeats}" if repeats > 1 else ""
        name = f"videos/{prefix}{task.replace('/', '_')}-{traj.seed}{repeat}.mp4"
        write_video(Path(out) / name, frames, fps=fps)
        result.videos.append(name)
    return result, trajs


# --- embodied eval --------------------------------------------------------------------------


@dataclass
class EvalConfig:
    """What ``embodied eval`` runs; every field can be overridden as ``key=value``."""

    policy: str = "expert"  # a saved policy directory, "expert" or "random"
    suite: str = setting("tabletop", choices=SUITES)
    tasks: list[str] = field(default_factory=list)  # empty: the whole suite (Meta-World: MT10)
    episodes: int = setting(50, low=1)
    seed: int = seed_setting(100_000)  # held out: demonstrations use seeds from 0
    videos: int = setting(1, low=0)  # episodes per task saved as MP4 (instruction, progress)
    # A LeRobot dataset to write every episode to (e.g. reward data), or to append to: the env then
    # records its cameras, image size and environment state unless env.* says otherwise
    record: str = ""
    # The actions --record writes: the executed ones, or the scripted expert's at each state the
    # policy reaches (DAgger data for `embodied train bc ... init_policy=<this policy>`)
    record_actions: str = setting("executed", choices=RECORDS)
    sample: bool = False  # a saved policy samples as in RL rollouts instead of acting greedily
    # Episodes per initial state: with sample=true, each seed's success rate under the sampling
    # noise, how many states it ever solves, and (one greedy episode per state more) how many of
    # the states the greedy policy fails: where GRPO's groups can find a success that the
    # evaluated policy lacks (the Wilson interval counts what a state's repeats are worth)
    repeats: int = setting(1, low=1)
    # A saved policy's config changes, weights unchanged: e.g. GRPO's policy_overrides, to
    # evaluate (or record reward data from) the distribution GRPO samples
    policy_overrides: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)  # env options on top of the policy's
    # Sub-envs, each in its own process when > 1; with envs, processes that take whole tasks
    workers: int = setting(1, low=1)
    # A task's sub-envs in one process, one batched policy call for all (0: workers). Where the
    # policy takes the time (a pixel diffusion planner), batching is what pays: 25 episodes of
    # the MT10 planner on 2 cores, --envs 25 2.6x faster than --workers 2, and --workers 2
    # --envs 25 (two tasks at a time) 1.6x faster than --envs 25 on two tasks
    envs: int = setting(0, low=0)
    image_size: int = setting(128, low=8, high=4096)  # video size for state-only policies
    fps: int = setting(16, low=1)
    out: str = "runs"
    name: str = "eval"

    def check(self) -> None:
        """Videos of episodes that run, seeds that stay in range, overrides for a saved policy."""
        if self.videos > self.episodes * self.repeats:
            raise ValueError(f"videos = {self.videos}: expected at most episodes x repeats = "
                             f"{self.episodes * self.repeats}")  # fmt: skip
        if self.repeats > 1 and not (self.sample and self.policy not in ("expert", "random")):
            raise ValueError(f"repeats = {self.repeats} runs each initial state again, which "
                             "only differs when a saved policy samples (sample=true)")  # fmt: skip
        if self.seed + self.episodes - 1 > SEED_MAX:
            raise ValueError(f"seed = {self.seed}: seed + episodes - 1 must be <= {SEED_MAX}")
        if self.policy_overrides and self.policy in ("expert", "random"):
            raise ValueError(
                f"policy_overrides apply to a saved policy, not policy={self.policy!r}"
            )
        if self.record_actions == "expert" and not self.record:
            raise ValueError("record_actions = 'expert' labels the episodes --record writes: "
                             "name the dataset with --record")  # fmt: skip

    def vector(self) -> tuple[int, bool | None]:
        """The sub-envs of a task's vector env and whether they run in processes (None: each
        in its own when there are several; with ``envs`` never)."""
        if self.envs:
            return min(self.envs, self.episodes * self.repeats), False
        return self.workers, None


def suite_tasks(suite: str, tasks: Sequence[str] = ()) -> list[str]:
    """Env task names of ``tasks`` in ``suite`` (all tabletop tasks, or MT10, when empty).

    Meta-World names may be given with or without ``metaworld/``; ``MT10`` expands to the
    benchmark's ten tasks."""
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
    expanded = [t.removeprefix("metaworld/") for t in expand_presets(tasks or ["MT10"])]
    available = [t.removeprefix("metaworld/") for t in sims.list_tasks("metaworld")]
    unknown = [t for t in expanded if t not in available]
    if unknown:
        raise ValueError(f"unknown Meta-World task(s) {unknown}; available: {', '.join(available)}")
    return ["metaworld/" + t for t in expanded]


def _actor_factory(cfg: EvalConfig) -> tuple[Callable[[Any], Any], Any]:
    """``make_actor(vec)`` for the configured policy, and the loaded policy (None for the
    scripted expert and random actions)."""
    if cfg.policy == "expert":
        return lambda vec: ExpertActor(vec), None
    if cfg.policy == "random":
        return lambda vec: RandomActor(vec, np.random.default_rng(cfg.seed)), None
    if not (Path(cfg.policy) / "config.json").is_file():
        raise ValueError(
            f"policy must be 'expert', 'random' or a saved policy directory; {cfg.policy!r} "
            "has no config.json"
        )
    policy = Policy.from_pretrained(cfg.policy).with_overrides(cfg.policy_overrides).eval()
    return (
        lambda vec: PolicyActor(policy, vec.num_envs, deterministic=not cfg.sample, seed=cfg.seed),
        policy,
    )


def _expert_labelled(make_actor: Callable[[Any], Any], vec: Any) -> ExpertLabels:
    """``make_actor(vec)``'s actor acting, the scripted expert labelling (DAgger)."""
    return ExpertLabels(make_actor(vec), vec)


def _actors(cfg: EvalConfig) -> tuple[Callable[[Any], Any], Any]:
    """``_actor_factory`` with the scripted expert's labels where ``record_actions`` asks."""
    make_actor, policy = _actor_factory(cfg)
    if cfg.record_actions == "expert":
        make_actor = partial(_expert_labelled, make_actor)
    return make_actor, policy


@dataclass(frozen=True)
class TaskJob:
    """One task of ``run_eval`` as this process or a worker process runs it: its rollouts and
    videos, with repeats the greedy comparison; the trajectories come back for a recording."""

    cfg: EvalConfig
    env_kwargs: dict[str, Any]
    out: Path
    keep: bool

    def __call__(self, task: str, actors: tuple[Any, Any] | None = None) -> tuple[EvalResult, list]:
        """``actors``: ``_actors(cfg)`` already built (a worker builds its own)."""
        cfg = self.cfg
        make_actor, policy = actors or _actors(cfg)
        num_envs, asynchronous = cfg.vector()
        result, trajs = evaluate_task(
            self.out,
            task,
            make_actor,
            cfg.episodes,
            cfg.seed,
            self.env_kwargs,
            num_envs,
            videos=cfg.videos,
            fps=cfg.fps,
            asynchronous=asynchronous,
            skip_unread_images=not self.keep,  # a recording keeps every image
            repeats=cfg.repeats,
        )
        if cfg.repeats > 1:
            _compare_with_greedy(result, task, policy, cfg, self.env_kwargs)
        return result, trajs if self.keep else []


def run_eval(
    cfg: EvalConfig, echo: Callable[[str], None] | None = None
) -> tuple[Any, list[EvalResult]]:
    """Evaluate on every task; write ``results.json``, ``report.md``, plots, videos and
    ``report.html`` into a new run directory. Return the run and the per-task results.
    ``echo`` gets one line as each task finishes (a long suite can be read as it goes)."""
    validate(cfg)
    tasks = suite_tasks(cfg.suite, cfg.tasks)
    make_actor, policy = _actors(cfg)
    env_kwargs = (
        env_options(policy.observation_spec)
        if policy is not None
        else {"obs_mode": "state", "image_size": cfg.image_size}
    )
    if cfg.record and (Path(cfg.record) / "meta" / "info.json").is_file():
        # Appending records what the dataset holds (e.g. DAgger: its cameras and the state);
        # the policy still reads only its own inputs.
        env_kwargs |= recorded_env_options(LeRobotDataset(cfg.record).features)
    env_kwargs |= dict(cfg.env)
    if env_kwargs.get("obs_mode") == "state":
        env_kwargs["image_size"] = cfg.image_size  # only renders for the videos
    env_kwargs["terminate_on_success"] = True  # Meta-World would run on to 500 steps
    for task in tasks:  # refuse bad options and every task up front, before the run directory
        sims.check_env_options(task, env_kwargs)
    if policy is not None:
        for task in tasks:
            env = sims.make(task, **env_kwargs)
            try:
                policy_check(policy, task)(env)
            finally:
                env.close()

    with contextlib.ExitStack() as stack:
        writer = stack.enter_context(_recorder(cfg, tasks[0], env_kwargs))  # refused up front too
        seed_everything(cfg.seed)
        run = RunDir.create(cfg.out, cfg.name, config=cfg)
        (run.path / "videos").mkdir()
        started = time.perf_counter()
        bar = stack.enter_context(progress_bar(total=len(tasks), desc=f"eval {cfg.policy}"))
        metrics = stack.enter_context(run.metrics())
        job = TaskJob(cfg, env_kwargs, run.path, keep=writer is not None)
        if cfg.envs and cfg.workers > 1 and len(tasks) > 1:
            finished = map_tasks(job, tasks, cfg.workers)  # whole tasks in worker processes
        else:
            finished = ((i, job(task, (make_actor, policy))) for i, task in enumerate(tasks))
        by_index: dict[int, EvalResult] = {}
        unwritten: dict[int, list[Any]] = {}  # a recording writes the tasks in order
        written = 0
        for count, (index, (result, trajs)) in enumerate(finished):
            by_index[index] = result
            if writer is not None:
                unwritten[index] = trajs
                while written in unwritten:
                    for traj in unwritten.pop(written):
                        writer.add_episode(traj)
                    written += 1
            metrics.log(result.metrics(), index)
            if echo is not None:
                with bar.external_write_mode():  # the line above a drawn bar, not through it
                    echo(_task_line(result, count, len(tasks), time.perf_counter() - started))
            bar.update(1)
        results = [by_index[i] for i in range(len(tasks))]
    write_eval_report(run.path, cfg, results, seconds=time.perf_counter() - started)
    return run, results


def _task_line(result: EvalResult, step: int, total: int, seconds: float) -> str:
    """``[2/10] metaworld/push-v3: 4% (1%-14%) of 50 episodes, 6.1 min in``."""
    return (
        f"[{step + 1}/{total}] {result.task}: {result.success_text()} "
        f"of {result.episodes} episodes, {seconds / 60:.1f} min in"
    )


def _compare_with_greedy(
    result: EvalResult, task: str, policy: Policy, cfg: EvalConfig, env_kwargs: dict[str, Any]
) -> None:
    """Run each state once greedily and record in ``result`` its success rate, the states it
    fails, those of them the sampled repeats solve and the sampled success rate on them: where RL
    can improve the evaluated policy."""
    num_envs, asynchronous = cfg.vector()
    greedy = evaluate_policy(
        policy, task, cfg.episodes, cfg.seed, env_kwargs, min(num_envs, cfg.episodes), asynchronous
    )
    failed = {
        s for s, won in zip(greedy.episode_seeds, greedy.episode_successes, strict=True) if not won
    }
    solved = {
        s for s, won in zip(result.episode_seeds, result.episode_successes, strict=True) if won
    }
    result.greedy_failed, result.solved_where_greedy_fails = len(failed), len(failed & solved)
    result.greedy_success_rate = greedy.success_rate
    there = [won for s, won in zip(result.episode_seeds, result.episode_successes, strict=True)
             if s in failed]  # fmt: skip
    result.sampled_where_greedy_fails = float(np.mean(there)) if there else None


@contextlib.contextmanager
def _recorder(cfg: EvalConfig, task: str, env_kwargs: dict[str, Any]) -> Iterator[Any]:
    """The dataset writer for ``cfg.record`` (None without one), checked against ``task``'s env
    before any episode runs; it commits what was added when the run ends, or is interrupted."""
    if not cfg.record:
        yield None
        return
    probe = sims.make(task, **env_kwargs)
    try:
        writer = open_episode_writer(Path(cfg.record), probe, env_kwargs["obs_mode"], cfg.fps)
    finally:
        probe.close()
    with writer:
        yield writer
