"""Trajectory preference optimisation (GRAPE's TPO): ``embodied train tpo CONFIG [key=value]``.

Rounds of roll out -> rank -> optimise, reading top to bottom:

1. Roll out ``group_size`` episodes from each of ``groups`` initial states (stochastic sampling,
   every decision recorded), as GRPO does: on one task, or on several (``tasks``, e.g. ``MT10``:
   one multi-task policy, the groups taking the tasks in turn, stepped in one vector env).
2. Rank each group by the trajectory score (``embodied.rewards.returns``, the one GRPO's returns
   come from: success, progress from any reward model (privileged by default), keypoint
   distances, collisions, steps; weighted for the objective: success, safety or efficiency) and
   pair the best with the worst (or every ordered pair beyond ``margin``).
3. ``epochs`` passes over the pairs with the trajectory-level DPO loss, where
   ``log pi(tau) = sum over the trajectory's decisions and their elements (tokens / denoising
   steps / action dimensions)`` and the reference is the policy that sampled the round
   (iterative, on-policy DPO; ``reference=initial`` keeps the starting policy instead)::

       L = -log sigmoid(beta * [(log pi(tau_w) - log pi_ref(tau_w))
                                - (log pi(tau_l) - log pi_ref(tau_l))])

   ``length_normalize`` divides each ``log pi(tau)`` by its number of elements (Tulu 3's
   length-normalised DPO): a diffusion planner's trajectory sums ~10^4 Gaussian elements, so a
   single small step moves the summed margin by hundreds of nats and saturates the sigmoid.
   ``sft_weight`` adds ``sft_weight * -log pi(tau_w)`` (RPO, Pang et al. 2024): DPO can widen the
   margin by pushing the losers down alone, which moves a Gaussian policy away from its own
   samples in no useful direction; the NLL term keeps the winners likely. ``anchor_coef`` adds
   ``anchor_coef * L_BC(expert windows of anchor_dataset)``, GRPO's BC anchor
   (``embodied.train.anchor``): it holds a multi-task policy's tasks that no pair trains.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import embodied.sims as sims
from embodied.core.config import seed_setting, setting
from embodied.core.run import RunDir
from embodied.evaluation.results import collisions_per_episode
from embodied.rewards.models import REWARD_TYPES, make_reward_model
from embodied.rewards.returns import OBJECTIVES, TrajectoryScore, preference_pairs
from embodied.train import onpolicy
from embodied.train.anchor import demo_anchor
from embodied.train.loop import Trainer, begin, load_policy
from embodied.train.onpolicy import OnPolicyConfig


@dataclass
class TPOConfig(OnPolicyConfig):
    """A TPO run: the shared on-policy settings (``OnPolicyConfig``) and TPO's own."""

    name: str = "tpo"
    reward: str = setting("privileged", choices=REWARD_TYPES)  # the progress term's source
    group_size: int = setting(4, low=2)
    train_seed: int = seed_setting(20_000)
    objective: str = setting("success", choices=tuple(OBJECTIVES))  # rewards.returns.OBJECTIVES
    score_weights: dict[str, float] = field(default_factory=dict)  # overrides the objective's
    pairs: str = setting("best-worst", choices=("best-worst", "all"))  # all: every pair > margin
    margin: float = setting(0.0, low=0.0)
    beta: float = setting(0.1, low=0.0)
    # log pi(tau) as the mean over its elements instead of the sum; beta then weighs a
    # per-element margin (on the PickPlace planner beta 20 saturated in one round, beta 2 did not)
    length_normalize: bool = False
    sft_weight: float = setting(0.0, low=0.0)  # weight of the winners' NLL added (RPO)
    reference: str = setting("round", choices=("round", "initial"))  # the policy that sampled
    rounds: int = setting(10, low=1)
    pairs_per_batch: int = setting(4, low=1)


def tpo_loss(
    log_pi_w: torch.Tensor,
    ref_w: torch.Tensor,
    log_pi_l: torch.Tensor,
    ref_l: torch.Tensor,
    beta: float,
    sft_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Trajectory DPO over ``[P]`` pairs of trajectory log-probs, plus ``sft_weight`` times the
    winners' mean NLL; also the mean implicit reward margin and the fraction of pairs the policy
    already ranks right."""
    margin = beta * ((log_pi_w - ref_w) - (log_pi_l - ref_l))
    nll = -log_pi_w.mean()
    loss = -F.logsigmoid(margin).mean() + sft_weight * nll
    stats = {
        "loss": float(loss.detach()),
        "winner_nll": float(nll.detach()),
        "reward_margin": float(margin.detach().mean()),
        "accuracy": float((margin.detach() > 0).float().mean()),
    }
    return loss, stats


def per_trajectory(
    element_values: torch.Tensor, batch: Any, size: int, normalize: bool = False
) -> torch.Tensor:
    """``[size]``: the masked sum of ``element_values`` ``[N, K]`` over each trajectory's decisions
    (``batch.trajectory`` says whose), or their mean over the elements with ``normalize``."""
    mask = batch.mask.to(element_values.device, element_values.dtype)
    totals = onpolicy.trajectory_totals((element_values * mask).sum(-1), batch.trajectory, size)
    if normalize:
        totals = totals / onpolicy.trajectory_totals(mask.sum(-1), batch.trajectory, size).clamp(
            min=1
        )
    return totals


def decisions_of(data: Any, trajectories: list[int]) -> Any:
    """The decisions (``Decisions`` rows) of the listed trajectories."""
    index = torch.as_tensor(trajectories, dtype=torch.long)
    return data.take(torch.nonzero(torch.isin(data.trajectory, index)).squeeze(-1).numpy())


def probe_env(env: Any) -> tuple[int | None, set[str]]:
    """The step limit of a task's ``env`` as the run built it (``env.max_episode_steps`` or the
    task's own: the ``steps`` score term's denominator) and the keys of its step info (which
    score terms it can give), from a reset and one zero action."""
    _, info = env.reset(seed=0)
    info = {**info, **env.step(np.zeros(env.action_space.shape, env.action_space.dtype))[-1]}
    return sims.episode_limit(env), set(info)


def train_tpo(cfg: TPOConfig) -> RunDir:
    """Run TPO; return the run directory (final policy in ``policy/``)."""
    device = begin(cfg, exact_float32=True)
    policy = load_policy(cfg.policy, cfg.policy_overrides, device).eval()
    initial = copy.deepcopy(policy).requires_grad_(False) if cfg.reference == "initial" else None
    anchor = demo_anchor(cfg, policy)
    reward_model = make_reward_model(cfg.reward, cfg.reward_model, cfg.reward_frames, device)
    envs = {task: onpolicy.env_kwargs(task, policy, reward_model, cfg.env)
            for task in onpolicy.task_names(cfg)}  # fmt: skip
    score_of: dict[str, TrajectoryScore] = {}  # each task's score (its own step limit)
    for task, kwargs in envs.items():
        with onpolicy.checked_env(policy, task, kwargs, reward_model) as env:
            limit, info = probe_env(env)
        score_of[task] = TrajectoryScore.objective(cfg.objective, cfg.score_weights, limit)
        score_of[task].check_info(info, f"{task} (objective={cfg.objective!r})")
    with Trainer(cfg, policy, "rounds") as trainer:
        # After the checkpoint: Ray workers copy the weights they are built with.
        rollouts = onpolicy.TaskGroups(cfg, envs, policy, cfg.groups)
        try:
            if trainer.start == 0 and cfg.eval_episodes > 0:
                trainer.metrics.log(onpolicy.evaluate_online(cfg, policy, envs), 0)
            for round_ in trainer.steps("tpo"):
                t0 = time.perf_counter()
                base = cfg.train_seed + round_ * cfg.groups
                seeds = list(range(base, base + cfg.groups))  # group g on rollouts.task_of(g)
                trajs = rollouts.run(seeds, cfg.group_size, cfg.seed * 7919 + round_)
                progress = reward_model.score(trajs)
                task_of = np.array(rollouts.episode_tasks(cfg.groups, cfg.group_size))
                scored = zip(task_of, trajs, progress, strict=True)
                scores = np.array([score_of[task](t, p) for task, t, p in scored])
                pairs = preference_pairs(scores, cfg.group_size, cfg.pairs, cfg.margin)
                success = np.array([t.ever_succeeded for t in trajs], dtype=float)
                log = {
                    "rollout/success_rate": float(success.mean()),
                    "rollout/mean_length": float(np.mean([t.length for t in trajs])),
                    "rank/score_mean": float(scores.mean()),
                    "rank/pairs": float(len(pairs)),
                    "time/rollout": time.perf_counter() - t0,
                }
                if len(envs) > 1:  # per task: where it succeeds, what it learns from
                    for task in dict.fromkeys(task_of):  # the tasks this round's groups ran
                        mine = task_of == task
                        log[f"rollout/{task}/success_rate"] = float(success[mine].mean())
                        log[f"rank/{task}/pairs"] = float(sum(mine[w] for w, _ in pairs))
                collisions = collisions_per_episode(trajs)
                if collisions is not None:  # not logged as 0 when the env does not count them
                    log["rollout/collisions"] = collisions
                t1 = time.perf_counter()
                if pairs:
                    data = onpolicy.collect_decisions(
                        trajs, np.zeros(len(trajs)), policy.observation_spec
                    )
                    # reference log pi(tau): the sampling log-probs, or the initial policy's
                    norm = cfg.length_normalize
                    if initial is None:
                        ref = per_trajectory(data.old_log_prob, data, len(trajs), norm)
                    else:
                        with torch.no_grad():
                            element = onpolicy.element_log_probs(initial, data, device)
                            ref = per_trajectory(element, data, len(trajs), norm).cpu()
                    rng = np.random.default_rng([cfg.seed, round_])
                    stats, first = [], True
                    for _ in range(cfg.epochs):
                        order = rng.permutation(len(pairs))
                        for s in range(0, len(order), cfg.pairs_per_batch):
                            chosen = [pairs[i] for i in order[s : s + cfg.pairs_per_batch]]
                            w = [p[0] for p in chosen]
                            lo = [p[1] for p in chosen]
                            batch = decisions_of(data, w + lo)
                            element = onpolicy.element_log_probs(policy, batch, device)
                            if first:  # recomputation must match sampling before any update
                                log["update/first_ratio_error"] = onpolicy.check_ratio(
                                    element, batch, cfg.ratio_tolerance
                                )
                                first = False
                            # log pi(tau) of the winners, then the losers
                            totals = per_trajectory(element, batch, len(trajs), norm)
                            both = totals[torch.as_tensor(w + lo, device=totals.device)]
                            loss, st = tpo_loss(
                                both[: len(w)],
                                ref[w].to(device),
                                both[len(w) :],
                                ref[lo].to(device),
                                cfg.beta,
                                cfg.sft_weight,
                            )
                            if anchor is not None:
                                loss = anchor.added_to(loss, policy, rng, st)
                            where = f"TPO loss in round {round_}"
                            st["grad_norm"] = trainer.update(loss, where, step_schedule=False)
                            stats.append(st)
                    log.update(onpolicy.mean_stats(stats))
                else:
                    log["update/skipped"] = 1.0
                trainer.step_schedule()
                rollouts.set_weights(policy)
                log["time/update"] = time.perf_counter() - t1
                onpolicy.finish_iteration(trainer, envs, round_ + 1, log)
        finally:
            rollouts.close()
    policy.save_pretrained(trainer.run.path / "policy")
    return trainer.run
