"""Trajectory-level GRPO: ``embodied train grpo CONFIG [key=value ...]``.

One implementation for every ``Policy``: a decision's log-probability is a vector of elements
(VLA action tokens, diffusion/flow denoising steps, MLP action dimensions) that
``Policy.log_prob`` recomputes from the recorded ``policy_outputs``. Each iteration reads top to
bottom:

1. Roll out ``group_size`` episodes from each of ``groups`` initial states (same seed = same
   state), sampling stochastically; every decision records its outputs and log-probs. With
   several ``tasks`` (a multi-task policy, e.g. ``MT10``) the groups take the tasks in turn.
   With ``hard_states=k`` each group's state is one of ``k`` candidates that the greedy policy
   (the one evaluated) fails, found by running each candidate once deterministically.
2. Score: the trajectory return combines success and progress from any reward model (learned,
   VLM judge, privileged labels, or none), the potential-based reward summed (it telescopes;
   ``embodied.rewards.returns``)::

       R_i = w_success * success_i + w_progress * (p_T - p_0)_i

   The log's ``score/success_ranking`` is how often a group's returns rank a success above a
   failure: 1 wherever ``w_success`` outweighs the progress term, so it speaks of a model when
   the return is the model's alone (``success_weight=0``), per task where it is weak.
3. Dynamic sampling: groups whose success rate is outside ``[keep_low, keep_high]`` (or whose
   returns have no variance) carry no signal; they are dropped and refilled from new seeds.
4. Group-relative advantage, broadcast to every decision and element of the trajectory, scaled
   as ``scale_rewards`` says (TRL's setting of that name)::

       A_i = (R_i - mean_group(R)) / (std_group(R) + eps)     group (GRPO)
       A_i = (R_i - mean_group(R)) / (std_batch(R) + eps)     batch (the kept groups' returns)
       A_i =  R_i - mean_group(R)                             none (Dr. GRPO)

   ``group`` gives every kept group the same weight, so returns that differ by a sliver of
   progress (a group that all failed, ranked by a reward model) weigh as much as a success does
   against a failure; ``batch`` and ``none`` weigh each group by how far its returns spread.

5. ``epochs`` passes of minibatches of decisions (with ``update_steps`` a denoising chain's
   decision recomputes one random block of that many of its steps, each step equally likely:
   DanceGRPO's timestep selection, cheaper in proportion); with ``rho = exp(logp - logp_old)``
   per element and the asymmetric clip of SimpleVLA-RL::

       L_clip = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)
       k3     = exp(logp_ref - logp) - (logp_ref - logp) - 1       (KL to the frozen start)
       L      = agg(L_clip) + kl_coef * agg(k3) + anchor_coef * L_BC(demos)
                + imitate_coef * L_BC(own windows with A > 0)

   With ``target_kl`` the iteration's update ends at the first minibatch whose estimated KL to
   the sampling policy, ``mean(rho - 1 - log rho)``, exceeds it (Stable-Baselines3's early
   stop, which waits for 1.5 x ``target_kl``): Adam moves every weight by about ``lr`` a step
   whatever the gradient's scale, so the optimizer steps, not the loss, set how far one
   iteration goes.

   ``L_BC(demos)`` is the policy's BC loss on a batch of expert windows of ``anchor_dataset``
   (``embodied.train.anchor``; DAPG's augmented gradient): it keeps a multi-task policy's
   untrained tasks where the demonstrations put them while shared weights move for the others.
   ``L_BC(own windows)`` is self-imitation: the BC loss on the iteration's decisions whose
   trajectory beat its group, which moves the greedy action toward the sampled successes.

   ``agg`` is ``token-mean`` (over all elements), ``seq-mean-token-mean`` (elements of a
   decision, then decisions), ``traj-mean`` (elements of a trajectory, then trajectories:
   GRPO's 1/|o_i| with the trajectory as the sequence, so a group's advantages, which sum to
   zero, push up and down equally however long each rollout ran) or ``holder``: the decision's
   ratio is the Hölder mean ``(mean_j rho_j^p)^(1/p)`` of its element ratios (p = 0: geometric
   mean), clipped as above.

Before the first update of every iteration the recomputed log-probs must equal the ones recorded
at sampling time (ratio 1 within ``ratio_tolerance``): otherwise the run stops with a message
instead of training on a policy that drifted from what it sampled.
"""

from __future__ import annotations

import copy
import time
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from embodied.core.config import setting
from embodied.core.reward import ProgressScore
from embodied.core.run import RunDir
from embodied.rewards.models import PrivilegedProgress, make_reward_model
from embodied.rewards.returns import TrajectoryScore
from embodied.train.anchor import SelfImitation, demo_anchor
from embodied.train.loop import Trainer, begin, load_policy
from embodied.train.monitor import RewardMonitor, reward_correlation, success_ranking
from embodied.train.onpolicy import (
    OnPolicyConfig,
    TaskGroups,
    check_ratio,
    check_step_blocks,
    check_task,
    collect_decisions,
    element_log_probs,
    env_kwargs,
    evaluate_online,
    finish_iteration,
    mean_stats,
    task_names,
    trajectory_totals,
)

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "traj-mean", "holder")
SCALINGS = ("group", "batch", "none")


@dataclass
class GRPOConfig(OnPolicyConfig):
    """A GRPO run: the shared on-policy settings (``OnPolicyConfig``) and GRPO's own."""

    name: str = "grpo"
    success_weight: float = 1.0
    progress_weight: float = 1.0
    success_prob_weight: float = 0.0  # the learned reward model's success head at the end
    iterations: int = setting(20, low=1)
    keep_low: float = setting(0.1, low=0.0, high=1.0)  # dynamic sampling: keep groups whose
    keep_high: float = setting(0.9, low=0.0, high=1.0)  # success rate is in [low, high]
    max_refills: int = setting(2, low=0)  # extra rounds of new initial states for dropped groups
    minibatch_size: int = setting(64, low=1)  # decisions per minibatch
    update_steps: int = setting(0, low=0)  # denoising steps of each decision a minibatch
    # recomputes, one random block of them (0: all K); the update's cost scales with it
    clip_low: float = setting(0.2, low=0.0)
    clip_high: float = setting(0.28, low=0.0)
    kl_coef: float = setting(0.0, low=0.0)
    target_kl: float = setting(0.0, low=0.0)  # > 0: end an iteration's update (after its first
    # step) at a minibatch whose KL to the sampling policy exceeds it, before that step
    imitate_coef: float = setting(0.0, low=0.0)  # self-imitation: the BC loss on decisions of
    # the iteration's trajectories with a positive advantage; 0: none
    imitate_batch_size: int = setting(32, low=1)  # its windows per minibatch
    hard_states: int = setting(0, low=0)  # k: each group's initial state is one of k candidates
    # the greedy policy fails, found by running them once deterministically (0: as drawn)
    loss_agg: str = setting("token-mean", choices=AGGREGATIONS)
    holder_p: float = 1.0
    scale_rewards: str = setting("group", choices=SCALINGS)  # the advantage's divisor (step 4)
    adv_eps: float = setting(1e-6, low=0.0)
    monitor_warn: float = 0.3  # warn when the learned/privileged per-step correlation falls below
    # it (the mean of the last 5 iterations; see RewardMonitor)

    def check(self) -> None:
        """The shared rules, a success head to read where it is weighted, and a keep range that
        is a range."""
        super().check()
        if self.success_prob_weight and self.reward != "learned":
            raise ValueError(
                f"success_prob_weight = {self.success_prob_weight} reads a learned reward "
                f"model's success head: set reward=learned (got reward={self.reward!r})"
            )
        if self.keep_low > self.keep_high:
            raise ValueError(
                f"keep_low = {self.keep_low} > keep_high = {self.keep_high}: no group could be kept"
            )


# --- the formulas (pure functions on tensors; the tests check them by hand) ------------------


def group_advantages(
    returns: np.ndarray, group_size: int, eps: float = 1e-6, scale: str = "group"
) -> np.ndarray:
    """``R - mean_group`` on ``returns [G * group_size]`` laid out group by group (RLinf's
    ``rewards.view(-1, group_size)``), divided by ``std_group + eps`` (``scale="group"``), by
    ``std + eps`` of all the returns (``"batch"``) or by nothing (``"none"``); population std."""
    r = np.asarray(returns, dtype=np.float64).reshape(-1, group_size)
    centred = r - r.mean(1, keepdims=True)
    if scale == "group":
        centred = centred / (r.std(1, keepdims=True) + eps)
    elif scale == "batch":
        centred = centred / (r.std() + eps)
    elif scale != "none":
        raise ValueError(f"scale must be one of {SCALINGS}, got {scale!r}")
    return centred.reshape(-1)


def kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref) per element: ``e^d - d - 1``, d = ref - new."""
    d = ref_log_prob - log_prob
    return torch.exp(d) - d - 1


def holder_mean(ratio: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """Hölder (power) mean over the last axis of positive ``ratio [N, K]`` where ``mask``:
    ``(mean rho^p)^(1/p)``; the geometric mean ``exp(mean log rho)`` for p = 0."""
    count = mask.sum(-1).clamp(min=1)
    if p == 0:
        return torch.exp((torch.log(ratio) * mask).sum(-1) / count)
    return ((ratio.pow(p) * mask).sum(-1) / count).pow(1.0 / p)


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> torch.Tensor:
    """``-min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A)`` elementwise."""
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * advantages, clipped * advantages)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the True entries of ``mask``."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def grpo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    agg: str = "token-mean",
    holder_p: float = 1.0,
    ref_log_prob: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO loss of a minibatch of decisions: log-probs ``[N, K]`` (K elements, ``mask``
    marks the real ones), advantages ``[N]``; and its statistics (clip fraction, ratio, KL to the
    reference, ``sampling_kl``: the k3 estimate of KL(pi_old || pi) per element).
    ``traj-mean`` needs ``weights [N]``: 1 / (real elements of the decision's trajectory)."""
    mask = mask.to(log_prob.dtype)
    ratio = torch.exp(log_prob - old_log_prob)
    adv = advantages.to(log_prob.dtype)
    if agg == "holder":
        seq_ratio = holder_mean(ratio, mask, holder_p)
        per = clipped_surrogate(seq_ratio, adv, clip_low, clip_high)
        policy_loss = per.mean()
        clipped = ((seq_ratio < 1 - clip_low) | (seq_ratio > 1 + clip_high)).float().mean()
    else:
        per = clipped_surrogate(ratio, adv[:, None], clip_low, clip_high)
        if agg == "token-mean":
            policy_loss = masked_mean(per, mask)
        elif agg == "seq-mean-token-mean":
            policy_loss = ((per * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
        elif agg == "traj-mean":
            if weights is None:
                raise ValueError("loss_agg='traj-mean' needs per-decision weights")
            w = mask * weights.to(log_prob.dtype)[:, None]
            policy_loss = (per * w).sum() / w.sum().clamp(min=1e-12)
        else:
            raise ValueError(f"loss_agg must be one of {AGGREGATIONS}, got {agg!r}")
        outside = (ratio < 1 - clip_low) | (ratio > 1 + clip_high)
        clipped = masked_mean(outside.float(), mask)
    loss = policy_loss
    kl = torch.zeros((), dtype=log_prob.dtype)
    if ref_log_prob is not None:
        kl = masked_mean(kl_k3(log_prob, ref_log_prob), mask)
        loss = loss + kl_coef * kl
    stats = {
        "policy_loss": float(policy_loss.detach()),
        # k3 with the roles swapped: samples come from pi_old, so rho - 1 - log rho
        "sampling_kl": float(masked_mean(kl_k3(old_log_prob, log_prob.detach()), mask)),
        "clip_fraction": float(clipped.detach()),
        "ratio_mean": float(masked_mean(ratio.detach(), mask)),
        "kl": float(kl.detach()),
    }
    return loss, stats


# --- rollouts and scoring ----------------------------------------------------------------------


def keep_group(successes: np.ndarray, returns: np.ndarray, low: float, high: float) -> bool:
    """Dynamic sampling: a group teaches something when its success rate is within
    [low, high] and its returns differ."""
    rate = float(np.mean(successes))
    return low <= rate <= high and float(np.std(returns)) > 0


# --- the training loop -------------------------------------------------------------------------


def train_grpo(cfg: GRPOConfig) -> RunDir:
    """Run GRPO; return the run directory (final policy in ``policy/``)."""

    device = begin(cfg, exact_float32=True)
    policy = load_policy(cfg.policy, cfg.policy_overrides, device)
    policy.eval()  # no dropout: sampling and recomputation must see the same network
    check_step_blocks(policy, cfg.update_steps)
    reference = copy.deepcopy(policy).requires_grad_(False) if cfg.kl_coef > 0 else None
    anchor = demo_anchor(cfg, policy)
    reward_model = make_reward_model(cfg.reward, cfg.reward_model, cfg.reward_frames, device)
    returns_of = TrajectoryScore(
        {
            "success": cfg.success_weight,
            "progress": cfg.progress_weight,
            "success_prob": cfg.success_prob_weight,
        }
    )
    # The monitor compares a model's progress with the simulator's, where the env records it.
    monitored = cfg.reward in ("learned", "judge")
    envs = {task: env_kwargs(task, policy, reward_model, cfg.env) for task in task_names(cfg)}
    for task, kwargs in envs.items():
        check_task(policy, task, kwargs, reward_model)
    # The schedule advances once per iteration (warm-up and cosine over iterations).
    with Trainer(cfg, policy, "iterations") as trainer:
        monitor = RewardMonitor(cfg.monitor_warn, state=trainer.extra.get("monitor"))
        # After the checkpoint: Ray workers copy the weights they are built with.
        rollouts = TaskGroups(cfg, envs, policy, cfg.groups)
        try:
            if trainer.start == 0 and cfg.eval_episodes > 0:
                trainer.metrics.log(evaluate_online(cfg, policy, envs), 0)
            for iteration in trainer.steps("grpo"):
                log: dict[str, float] = {}
                t0 = time.perf_counter()
                # 1-3. roll out groups from fresh initial states, keep the informative ones
                kept: list[Any] = []
                kept_returns: list[np.ndarray] = []
                kept_tasks: list[str] = []  # the task of each kept group
                all_trajs: list[Any] = []
                all_tasks: list[str] = []  # the task of each of all_trajs
                all_scores: list[ProgressScore] = []  # the model's progress, for the monitor
                all_returns: list[np.ndarray] = []
                score_time = 0.0
                dropped = 0
                group_rates: list[tuple[str, float]] = []  # each group's task and success rate
                greedy: dict[str, list[float]] = {}  # hard_states: greedy success per round
                for round_ in range(cfg.max_refills + 1):
                    need = cfg.groups - len(kept) // cfg.group_size
                    if need <= 0:
                        break
                    stride = cfg.groups * max(cfg.hard_states, 1)  # the seeds a round may use
                    base = cfg.train_seed + (iteration * (cfg.max_refills + 1) + round_) * stride
                    if cfg.hard_states:
                        seeds, rates = rollouts.hard_seeds(need, base, cfg.hard_states)
                        for task, rate in rates.items():
                            greedy.setdefault(task, []).append(rate)
                    else:
                        seeds = list(range(base, base + need))
                    sample_seed = cfg.seed * 1_000_003 + iteration * 101 + round_
                    trajs = rollouts.run(seeds, cfg.group_size, sample_seed)
                    all_trajs += trajs
                    all_tasks += rollouts.episode_tasks(need, cfg.group_size)
                    t1 = time.perf_counter()
                    scores = reward_model.score(trajs)
                    all_scores += scores
                    returns = returns_of.batch(trajs, scores)
                    all_returns.append(returns)
                    score_time += time.perf_counter() - t1
                    for g in range(need):
                        part = slice(g * cfg.group_size, (g + 1) * cfg.group_size)
                        success = np.array([t.ever_succeeded for t in trajs[part]], dtype=float)
                        group_rates.append((rollouts.task_of(g), float(success.mean())))
                        if keep_group(success, returns[part], cfg.keep_low, cfg.keep_high):
                            kept += trajs[part]
                            kept_returns.append(returns[part])
                            kept_tasks.append(rollouts.task_of(g))
                        else:
                            dropped += 1
                rollout_time = time.perf_counter() - t0 - score_time
                successes = np.array([t.ever_succeeded for t in all_trajs], dtype=float)
                every_return = np.concatenate(all_returns)
                log.update(
                    {
                        "rollout/success_rate": float(successes.mean()),
                        "rollout/episodes": float(len(all_trajs)),
                        "rollout/mean_length": float(np.mean([t.length for t in all_trajs])),
                        "rollout/groups_kept": float(len(kept) // cfg.group_size),
                        "rollout/groups_dropped": float(dropped),
                        # all-fail and all-success groups: states the sampling never tells apart
                        "rollout/groups_failed": float(sum(r == 0 for _, r in group_rates)),
                        "rollout/groups_solved": float(sum(r == 1 for _, r in group_rates)),
                        "time/rollout": rollout_time,
                        "time/score": score_time,
                        "score/success_ranking": success_ranking(
                            successes, every_return, cfg.group_size
                        ),
                    }
                )
                if greedy:  # the candidates are fresh states: a held-out estimate
                    rates = {task: float(np.mean(r)) for task, r in greedy.items()}
                    log["rollout/greedy_success"] = float(np.mean(list(rates.values())))
                    if len(envs) > 1:
                        log |= {f"rollout/{task}/greedy_success": r for task, r in rates.items()}
                task_of = np.array(all_tasks)
                if len(envs) > 1:  # per task: where the policy still fails, where it learns
                    for task in sorted(set(all_tasks)):
                        mine = task_of == task  # whole groups: a group is one task's
                        log[f"rollout/{task}/success_rate"] = float(successes[mine].mean())
                        log[f"rollout/{task}/groups_kept"] = float(kept_tasks.count(task))
                        log[f"rollout/{task}/groups_failed"] = float(group_rates.count((task, 0.0)))
                        log[f"score/{task}/success_ranking"] = success_ranking(
                            successes[mine], every_return[mine], cfg.group_size
                        )
                errors = sum("error" in t.metadata for t in all_trajs)
                if errors:
                    log["rollout/env_errors"] = float(errors)
                # reward-hacking monitor: learned reward vs privileged progress on these rollouts
                if monitored and all("progress" in t.info for t in all_trajs):
                    learned = [s.progress for s in all_scores]  # the rounds' scores
                    privileged = [s.progress for s in PrivilegedProgress().score(all_trajs)]
                    corr = reward_correlation(learned, privileged)
                    log["monitor/reward_corr"] = corr
                    log["monitor/learned_final_progress"] = float(np.mean([c[-1] for c in learned]))
                    log["monitor/privileged_final_progress"] = float(
                        np.mean([c[-1] for c in privileged])
                    )
                    for task in sorted(set(all_tasks)) if len(envs) > 1 else ():
                        mine = np.flatnonzero(task_of == task)
                        log[f"monitor/{task}/reward_corr"] = reward_correlation(
                            [learned[i] for i in mine], [privileged[i] for i in mine]
                        )
                    if message := monitor.update(iteration, corr):
                        warnings.warn(message, stacklevel=2)
                    trainer.extra["monitor"] = monitor.state()

                if not kept:  # nothing to learn from: no update, the schedule still advances
                    log["update/skipped"] = 1.0
                    trainer.step_schedule()
                    finish_iteration(trainer, envs, iteration + 1, log)
                    continue
                # 4. group-relative advantages, broadcast to every decision and element
                returns = np.concatenate(kept_returns)
                advantages = group_advantages(
                    returns, cfg.group_size, cfg.adv_eps, cfg.scale_rewards
                )
                data = collect_decisions(kept, advantages, policy.observation_spec)
                log["score/return_mean"] = float(returns.mean())
                log["score/return_std"] = float(returns.std())
                log["score/advantage_abs_mean"] = float(np.abs(advantages).mean())
                log["update/decisions"] = float(len(data))
                log["update/entropy_proxy"] = float(-data.old_log_prob.sum(-1).mean())
                # traj-mean's weights: 1 / the real elements of the decision's trajectory
                elements = trajectory_totals(data.mask.sum(-1).float(), data.trajectory, len(kept))
                imitation = None
                if cfg.imitate_coef > 0:  # kept groups' returns differ: some beat their mean
                    imitation = SelfImitation(kept, advantages, policy, cfg.imitate_batch_size,
                                              cfg.imitate_coef)  # fmt: skip
                    log["update/imitate_decisions"] = float(len(imitation))
                    imitation = imitation if len(imitation) else None

                # 5. epochs of minibatches
                t2 = time.perf_counter()
                rng = np.random.default_rng([cfg.seed, iteration])
                stats: list[dict[str, float]] = []
                planned = cfg.epochs * -(-len(data) // cfg.minibatch_size)
                batches = (
                    order[s : s + cfg.minibatch_size]
                    for order in (rng.permutation(len(data)) for _ in range(cfg.epochs))
                    for s in range(0, len(order), cfg.minibatch_size)
                )
                for rows in batches:
                    batch = data.take(rows)
                    if cfg.update_steps:
                        batch = batch.step_blocks(cfg.update_steps, rng)
                    log_prob = element_log_probs(policy, batch, device)
                    if not stats:  # the first minibatch, before any step
                        log["update/first_ratio_error"] = check_ratio(
                            log_prob, batch, cfg.ratio_tolerance
                        )
                    ref = None
                    if reference is not None:
                        with torch.no_grad():
                            ref = element_log_probs(reference, batch, device)
                    loss, st = grpo_loss(
                        log_prob,
                        batch.old_log_prob.to(device),
                        batch.advantages.to(device),
                        batch.mask.to(device),
                        cfg.clip_low,
                        cfg.clip_high,
                        cfg.loss_agg,
                        cfg.holder_p,
                        ref,
                        cfg.kl_coef,
                        (1.0 / elements[batch.trajectory]).to(device),
                    )
                    if stats and cfg.target_kl and st["sampling_kl"] > cfg.target_kl:
                        log["update/stop_kl"] = st["sampling_kl"]  # this step is not taken
                        break
                    if anchor is not None:
                        loss = anchor.added_to(loss, policy, rng, st)
                    if imitation is not None:
                        loss = imitation.added_to(loss, policy, rng, st)
                    where = f"GRPO loss at iteration {iteration}"
                    st["grad_norm"] = trainer.update(loss, where, step_schedule=False)
                    stats.append(st)
                trainer.step_schedule()
                log["update/steps"] = float(len(stats))
                log["update/planned_steps"] = float(planned)
                log.update(mean_stats(stats))
                log["time/update"] = time.perf_counter() - t2
                log["update/lr"] = trainer.scheduler.get_last_lr()[0]
                rollouts.set_weights(policy)
                finish_iteration(trainer, envs, iteration + 1, log)
        finally:
            rollouts.close()
    policy.save_pretrained(trainer.run.path / "policy")
    return trainer.run
