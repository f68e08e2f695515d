"""What the on-policy trainers (GRPO, TPO) share: their common settings, the starting policy
with RL overrides, env options, grouped rollouts (over one task or several) that record every
decision, the decisions flattened for minibatches, their log-probs recomputed with gradients, the
drift check before the first update, and what ends an iteration (evaluation, the metrics line, a
checkpoint)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

import embodied.sims as sims
from embodied.core.config import seed_setting, setting
from embodied.core.features import CAMERA_PREFIX, ObservationSpec
from embodied.core.reward import RewardModel
from embodied.evaluation.suite import evaluate_policy
from embodied.policies import Policy
from embodied.rewards.models import REWARD_TYPES
from embodied.rollout.backends import DistributedConfig, make_rollouts
from embodied.rollout.episodes import decision_windows
from embodied.rollout.matching import camera_name, check_policy_env, env_options
from embodied.sims import grouped_seeds
from embodied.sims.metaworld import expand_presets
from embodied.train.optim import OptimConfig


def rl_optim() -> OptimConfig:
    """RL fine-tuning's optimiser: a small constant-from-the-start rate, no weight decay."""
    return OptimConfig(lr=1e-5, weight_decay=0.0, warmup_steps=0)


@dataclass
class OnPolicyConfig:
    """The settings GRPO and TPO share; every field can be overridden as ``key=value``."""

    policy: str = "???"  # a saved policy directory (e.g. a BC run's policy/)
    task: str = "PickPlace"  # a tabletop task, metaworld/<name>, or a preset (MT10: its ten tasks)
    tasks: list[str] = field(default_factory=list)  # several tasks, one policy; empty: task alone
    name: str = "onpolicy"
    out: str = "runs"
    policy_overrides: dict[str, Any] = field(default_factory=dict)  # e.g. min_std, temperature
    env: dict[str, Any] = field(default_factory=dict)  # env options on top of the policy's, e.g.
    # goal_state=true for a LeRobot policy trained on the goal in the state (it saves no names)
    reward: str = setting("learned", choices=REWARD_TYPES)  # learned | judge | privileged | success
    reward_model: str = ""  # learned: a saved progress model; judge: a local VLM directory
    reward_frames: int = setting(8, low=2)  # observations a learned model or judge scores
    groups: int = setting(4, low=1)  # initial states per iteration
    group_size: int = setting(8, low=2)  # rollouts per initial state (a group compares them)
    epochs: int = setting(2, low=1)
    ratio_tolerance: float = setting(1e-3, low=0.0)
    optim: OptimConfig = field(default_factory=rl_optim)
    num_envs: int = setting(0, low=0)  # local sub-envs in one batched call; 0 = groups * group_size
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    seed: int = seed_setting()
    train_seed: int = seed_setting(10_000)  # initial states for training; evaluation: eval_seed..
    eval_every: int = setting(5, low=1)
    eval_episodes: int = setting(20, low=0)
    eval_seed: int = seed_setting(100_000)
    eval_sampled: bool = False  # also evaluate the sampling policy (what the update optimises)
    eval_envs: int = setting(10, low=1)  # evaluation sub-envs in one process, one batched call
    save_every: int = setting(5, low=0)  # 0: only at the end
    # > 0: stop after the last iteration (round) that fits in this many minutes; saved as the end
    max_minutes: float = setting(0.0, low=0.0)
    # The BC anchor (embodied.train.anchor): every update also fits expert windows
    anchor_dataset: str = ""  # expert demonstrations (LeRobot) for the BC anchor
    anchor_coef: float = setting(0.0, low=0.0)  # its weight; 0: no anchor
    anchor_batch_size: int = setting(32, low=1)  # its windows per minibatch
    anchor_episodes_per_task: int = setting(0, low=0)  # the first k demos of each task (as BC's
    # episodes_per_task, for a policy trained on a subset); 0: all
    device: str = "auto"
    resume: str = ""

    def check(self) -> None:
        """A model-based reward needs its directory; the BC anchor needs its data and weight."""
        if self.reward in ("learned", "judge") and not self.reward_model:
            raise ValueError(f"reward={self.reward} needs reward_model=<its directory>")
        if bool(self.anchor_dataset) != (self.anchor_coef > 0):
            raise ValueError(
                f"the BC anchor needs both anchor_dataset and anchor_coef > 0; got "
                f"anchor_dataset={self.anchor_dataset!r}, anchor_coef={self.anchor_coef}"
            )
        if self.anchor_episodes_per_task and not self.anchor_dataset:
            raise ValueError(
                f"anchor_episodes_per_task = {self.anchor_episodes_per_task} picks demos of the BC "
                "anchor: set anchor_dataset and anchor_coef too"
            )


def task_names(cfg: OnPolicyConfig) -> list[str]:
    """The env tasks a run trains on: ``tasks`` (or ``task`` alone), a Meta-World preset such as
    ``MT10`` expanded to ``metaworld/<name>`` for each of its tasks."""
    names = expand_presets(cfg.tasks or [cfg.task])
    if len(set(names)) != len(names):
        raise ValueError(f"tasks {names} name a task more than once")
    return names


def env_kwargs(
    task: str, policy: Any, reward_model: RewardModel, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Env options giving the policy its inputs (plus ``extra``, the config's ``env``) and a
    frame-reading reward model its camera (the one it was trained on; the first one for a model
    that does not say: ``front`` on the tabletop) at its size. A state policy's rollouts (tabletop
    and Meta-World) record render states and render only the frames the reward model or judge
    reads (``embodied.sims.replay``); a camera policy's render only the images it reads, the reward
    model's frames replayed; envs without render states render every step. A pixel policy's
    env must render the reward model's camera (``check_task`` refuses one that does not).
    Episodes end at the first success, as in evaluation (Meta-World would run on to 500 steps)."""
    kwargs = env_options(policy.observation_spec) | {"terminate_on_success": True}
    if kwargs["obs_mode"] != "state" and sims.supports_render_state(task):
        kwargs["render_state"] = True  # only the images the policy reads render (replay.py)
    kwargs |= dict(extra or {})
    size = reward_model.image_size
    key = reward_model.image_key or ""
    if size is not None:
        if kwargs["obs_mode"] == "state":
            if sims.supports_render_state(task):
                kwargs.update(render_state=True, image_size=tuple(size))
            else:
                kwargs.update(obs_mode="pixels_state", image_size=tuple(size))
            if key.startswith(CAMERA_PREFIX):  # else the env's default camera
                kwargs["cameras"] = [camera_name(key)]
        elif tuple(kwargs["image_size"]) != tuple(size):
            raise ValueError(
                f"the policy reads {kwargs.get('cameras', 'the default camera')} at "
                f"{kwargs['image_size']} but the reward model scores "
                f"{key or 'the first camera'} at {tuple(size)}; train them on the same frames"
            )
    elif kwargs["obs_mode"] == "state" and reward_model.reward_type == "judge":
        # The judge resizes whatever camera it gets: the env's default one at its size.
        if sims.supports_render_state(task):
            kwargs.update(render_state=True)
        else:
            kwargs.update(obs_mode="pixels_state")
    return kwargs


@contextmanager
def checked_env(
    policy: Policy, task: str, options: dict[str, Any], reward_model: RewardModel | None = None
) -> Iterator[Any]:
    """``task``'s env built with ``options``, after refusing, before any rollout or output, one
    that cannot feed ``policy`` or take its actions, or does not render the camera
    ``reward_model`` scores (frames replayed from render states come from the camera
    ``env_kwargs`` gave the env); closed on exit, so a trainer that reads more off it builds it
    once."""
    env = sims.make(task, **options)
    try:
        check_policy_env(policy.observation_spec, policy.action_spec, env, task)
        key, size = (reward_model.image_key, reward_model.image_size) if reward_model else (0, 0)
        if key and size and not (options.get("render_state") and options["obs_mode"] == "state"):
            reads = ObservationSpec(cameras={key: tuple(size)})
            check_policy_env(reads, policy.action_spec, env, task, what="the reward model")
        yield env
    finally:
        env.close()


def check_task(
    policy: Policy, task: str, options: dict[str, Any], reward_model: RewardModel | None = None
) -> None:
    """Refuse a task ``checked_env`` refuses; build nothing that outlives the check."""
    with checked_env(policy, task, options, reward_model):
        pass


def rollout_groups(rollouts: Any, seeds: list[int], group_size: int, sample_seed: int,
                   tasks: Sequence[str] | None = None) -> list:  # fmt: skip
    """``group_size`` stochastic rollouts from each seed (on ``tasks[g]`` where the backend runs
    several), group by group, decisions recorded, on a ``embodied.rollout.backends`` backend
    (local or Ray: the same trajectories either way)."""
    each = None if tasks is None else [t for t in tasks for _ in range(group_size)]
    return rollouts.run(grouped_seeds(seeds, group_size), sample_seed, deterministic=False,
                        tasks=each)  # fmt: skip


def share_envs(envs: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The tasks that can step in one vector env: one suite's, built with the same options (so
    their observations share their spaces), in the given order."""
    lanes: list[list[str]] = []
    for task, options in envs.items():
        for lane in lanes:
            if sims.suite_of(lane[0]) == sims.suite_of(task) and envs[lane[0]] == options:
                lane.append(task)
                break
        else:
            lanes.append([task])
    return lanes


class TaskGroups:
    """Grouped stochastic rollouts of one policy over one task or several: group ``g`` of a call
    runs on ``tasks[g % len(tasks)]``. Tasks whose envs share their options (``share_envs``) run
    on one backend with sub-envs for each task's share of ``groups``, so a multi-task policy steps
    all their episodes with one batched call; the backends of other options take turns."""

    def __init__(
        self,
        cfg: OnPolicyConfig,
        envs: dict[str, dict[str, Any]],
        policy: Any,
        groups: int,
    ) -> None:
        self.tasks = list(envs)
        share = math.ceil(groups / len(self.tasks)) * cfg.group_size
        lanes = share_envs(envs)
        self.backends: list[tuple[list[str], Any]] = []
        try:
            for lane in lanes:
                backend = make_rollouts(cfg.distributed, lane, envs[lane[0]], policy,
                                        cfg.num_envs or share, len(lanes))  # fmt: skip
                self.backends.append((lane, backend))
        except BaseException:
            self.close()
            raise

    def task_of(self, group: int) -> str:
        """The task group ``group`` of a call runs on."""
        return self.tasks[group % len(self.tasks)]

    def episode_tasks(self, groups: int, group_size: int) -> list[str]:
        """The task of each episode ``run`` returns for ``groups`` seeds, in its order."""
        return [self.task_of(g) for g in range(groups) for _ in range(group_size)]

    def run(self, seeds: Sequence[int], group_size: int, sample_seed: int) -> list[Any]:
        """``group_size`` rollouts from each seed (group ``g`` from ``seeds[g]``), group by group;
        each backend's episodes sample with their own noise (``sample_seed`` on the first)."""
        out: list[Any] = [None] * len(seeds)
        for k, (lane, backend) in enumerate(self.backends):
            mine = [g for g in range(len(seeds)) if self.task_of(g) in lane]
            if not mine:
                continue
            tasks = [self.task_of(g) for g in mine]
            trajs = rollout_groups(backend, [seeds[g] for g in mine], group_size,
                                   sample_seed + 7_919 * k, tasks)  # fmt: skip
            for i, g in enumerate(mine):
                out[g] = trajs[i * group_size : (i + 1) * group_size]
        return [t for group in out for t in group]

    def hard_seeds(self, need: int, first: int, candidates: int) -> tuple[list[int], dict]:
        """Initial states for ``need`` groups (group ``g`` on ``task_of(g)``) that the greedy
        policy fails: each task runs ``candidates`` states per group (seeds ``first, first + 1,
        ...``) once deterministically and gives its groups the failed ones in seed order, then
        solved ones where too few fail. Also each task's greedy success rate on its candidates.

        A sampled group from a state the greedy policy solves mostly teaches the policy to keep
        that success under its sampling noise, which the greedy policy already has."""
        seeds, greedy = [0] * need, {}
        groups = {task: [g for g in range(need) if self.task_of(g) == task] for task in self.tasks}
        for lane, backend in self.backends:
            pools = {task: list(range(first, first + candidates * len(groups[task])))
                     for task in lane if groups[task]}  # fmt: skip
            if not pools:
                continue
            tasks = [task for task, pool in pools.items() for _ in pool]
            trajs = iter(backend.run([s for pool in pools.values() for s in pool], 0, True, tasks))
            for task, pool in pools.items():
                solved = [next(trajs).ever_succeeded for _ in pool]
                failed_first = sorted(pool, key=lambda seed: solved[seed - first])  # stable
                for g, seed in zip(groups[task], failed_first[: len(groups[task])], strict=True):
                    seeds[g] = seed
                greedy[task] = float(np.mean(solved))
        return seeds, greedy

    def set_weights(self, policy: Any) -> None:
        """Act with ``policy``'s weights on every task."""
        for _, backend in self.backends:
            backend.set_weights(policy)

    def close(self) -> None:
        """Close every task's envs (or Ray workers)."""
        for _, backend in self.backends:
            backend.close()


@dataclass
class Decisions:
    """Every recorded decision of the kept trajectories, flattened for minibatches."""

    obs: dict[str, torch.Tensor]  # feature -> [N, n_obs_steps, ...]
    instructions: list[str]
    outputs: dict[str, torch.Tensor]  # policy_outputs -> [N, ...]
    old_log_prob: torch.Tensor  # [N, K] recorded at sampling time
    mask: torch.Tensor  # [N, K]
    sampled_log_prob: torch.Tensor  # [N]
    advantages: torch.Tensor  # [N]
    trajectory: torch.Tensor  # [N] index of the decision's trajectory

    def __len__(self) -> int:
        return len(self.instructions)

    def take(self, index: np.ndarray) -> Decisions:
        """The decisions at ``index``."""
        i = torch.as_tensor(index, dtype=torch.long)
        return Decisions(
            {k: v[i] for k, v in self.obs.items()},
            [self.instructions[j] for j in index],
            {k: v[i] for k, v in self.outputs.items()},
            self.old_log_prob[i],
            self.mask[i],
            self.sampled_log_prob[i],
            self.advantages[i],
            self.trajectory[i],
        )

    def step_blocks(self, size: int, rng: np.random.Generator) -> Decisions:
        """These decisions with each recorded denoising chain cut to one block of ``size``
        consecutive steps of its K, the block drawn uniformly from the K / size that tile the chain
        (DanceGRPO's timestep selection): a policy recomputes only those steps, and each step's
        expected weight in a token-mean loss is the whole chain's."""
        n, k = self.old_log_prob.shape
        if "chain" not in self.outputs or k % size:
            raise ValueError(
                f"update_steps = {size} needs recorded denoising chains whose K steps it divides "
                f"(got K = {k}, outputs {sorted(self.outputs)})"
            )
        first = torch.as_tensor(rng.integers(0, k // size, n) * size)[:, None]
        rows = torch.arange(n)[:, None]
        steps = first + torch.arange(size)  # [N, size]
        states = first + torch.arange(size + 1)  # the chain's states before and after them
        outputs = {key: v[rows, steps] if v.shape[1:2] == (k,) else v
                   for key, v in self.outputs.items()}  # fmt: skip
        outputs["chain"] = self.outputs["chain"][rows, states]
        return replace(
            self, outputs=outputs, old_log_prob=self.old_log_prob[rows, steps],
            mask=self.mask[rows, steps],
        )  # fmt: skip


def trajectory_totals(
    per_decision: torch.Tensor, trajectory: torch.Tensor, size: int
) -> torch.Tensor:
    """``[size]``: the sum of ``per_decision`` ``[N]`` over each trajectory's decisions
    (``trajectory [N]`` says whose); 0 for a trajectory with none."""
    zeros = torch.zeros(size, device=per_decision.device, dtype=per_decision.dtype)
    return zeros.index_add(0, trajectory.to(per_decision.device), per_decision)


def collect_decisions(trajs: list[Any], advantages: np.ndarray, spec: ObservationSpec) -> Decisions:
    """Flatten the trajectories' decisions, each with its trajectory's advantage."""
    obs: dict[str, list[np.ndarray]] = {}
    outputs: dict[str, list[np.ndarray]] = {}
    instructions: list[str] = []
    adv: list[float] = []
    owner: list[int] = []
    for index, (traj, a) in enumerate(zip(trajs, advantages, strict=True)):
        for key, value in decision_windows(traj, spec).items():
            obs.setdefault(key, []).append(value)
        for key, value in traj.policy_outputs.items():
            outputs.setdefault(key, []).append(np.asarray(value))
        instructions += [traj.instruction] * traj.num_decisions
        adv += [float(a)] * traj.num_decisions
        owner += [index] * traj.num_decisions
    flat = {k: torch.from_numpy(np.concatenate(v)) for k, v in outputs.items()}
    old = flat.pop("log_probs").float()
    sampled = flat.pop("sampled_log_prob").float()
    return Decisions(
        obs={k: torch.from_numpy(np.concatenate(v)) for k, v in obs.items()},
        instructions=instructions,
        outputs=flat,
        old_log_prob=old,
        mask=torch.ones_like(old, dtype=torch.bool),
        sampled_log_prob=sampled,
        advantages=torch.tensor(adv, dtype=torch.float32),
        trajectory=torch.tensor(owner, dtype=torch.long),
    )


def element_log_probs(policy: Any, batch: Decisions, device: torch.device) -> torch.Tensor:
    """``Policy.log_prob`` of a minibatch's recorded decisions ``[N, K]``, with gradients."""
    obs = {k: v.to(device) for k, v in batch.obs.items()}
    outputs = {k: v.to(device) for k, v in batch.outputs.items()}
    return policy.log_prob(obs, batch.instructions, outputs).reshape(len(batch), -1)


def check_step_blocks(policy: Policy, size: int) -> None:
    """Refuse ``update_steps = size`` before any rollout unless ``policy`` samples a denoising
    chain of K recorded steps that ``size`` divides."""
    if not size:
        return
    k = policy.chain_steps
    if k is None:
        raise ValueError(
            f"update_steps = {size} recomputes blocks of denoising steps; the "
            f"{policy.policy_type} policy samples no chain (set update_steps=0)"
        )
    if k % size:
        raise ValueError(
            f"update_steps = {size} must divide the policy's finetune_steps = {k} (the recorded "
            "steps it tiles into blocks)"
        )


def check_ratio(log_prob: torch.Tensor, batch: Decisions, tolerance: float) -> float:
    """Max |ratio - 1| between the recomputed and the recorded log-probs before any update;
    stop with a clear message when it exceeds ``tolerance`` (the policy drifted)."""
    ratio = torch.exp(log_prob.detach().cpu() - batch.old_log_prob)
    worst = float((ratio - 1).abs().max())
    if not np.isfinite(worst) or worst > tolerance:
        raise RuntimeError(
            f"log-prob recomputation drifted from sampling: max |ratio - 1| = {worst:.3g} > "
            f"{tolerance} before any update (is the policy deterministic in eval mode, dropout "
            "off, the same weights used to act and to recompute?)"
        )
    return worst


def mean_stats(stats: list[dict[str, float]], prefix: str = "update/") -> dict[str, float]:
    """The mean of each statistic over an update's minibatches, keys prefixed."""
    return {f"{prefix}{key}": float(np.mean([s[key] for s in stats])) for key in stats[0]}


def evaluate_online(
    cfg: OnPolicyConfig, policy: Policy, envs: dict[str, dict[str, Any]]
) -> dict[str, float]:
    """Success on ``eval_episodes`` held-out seeds of every task in ``envs`` (task -> env
    options; one batched vector env each): deterministic (``eval/<task>/``) and, with
    ``cfg.eval_sampled``, sampling as the rollouts do (``eval_sampled/``: what RL optimises).
    Over several tasks, their mean success too (``eval/success_rate``)."""
    out: dict[str, float] = {}
    for deterministic in [True, False] if cfg.eval_sampled else [True]:
        prefix = "eval" if deterministic else "eval_sampled"
        rates = []
        for task, env in envs.items():
            result = evaluate_policy(
                policy, task, cfg.eval_episodes, cfg.eval_seed, env, cfg.eval_envs,
                asynchronous=False, deterministic=deterministic,
            )  # fmt: skip
            out |= result.metrics(prefix)
            rates.append(result.success_rate)
        if len(envs) > 1:
            out[f"{prefix}/success_rate"] = float(np.mean(rates))
    return out


def finish_iteration(
    trainer: Any, envs: dict[str, dict[str, Any]], done: int, log: dict[str, float]
) -> None:
    """Evaluate (on every task in ``envs``) and checkpoint when due; log iteration ``done``."""
    cfg = trainer.cfg
    if cfg.eval_episodes > 0 and trainer.due(done, cfg.eval_every):
        log.update(evaluate_online(cfg, trainer.model, envs))
    trainer.metrics.log(log, done)
    if trainer.due(done, cfg.save_every):
        trainer.save(done)
