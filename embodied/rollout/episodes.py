"""Rollouts: run a policy in an environment and record the episode as a ``Trajectory``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from embodied.core.features import ObservationSpec, env_observation_features, one_camera_alias
from embodied.core.policy import Policy
from embodied.core.trajectory import Trajectory
from embodied.core.trajectory_builder import TrajectoryBuilder
from embodied.sims.registry import add_action_noise
from embodied.sims.vector import render_envs

ActFn = Callable[[dict[str, Any]], np.ndarray]
# What a trajectory records as its actions: what the env executed, or the expert's clean labels.
RECORDS = ("executed", "expert")


def numeric_info(info: dict[str, Any]) -> dict[str, Any]:
    """The numeric/bool entries of an env ``info`` as JSON-able values (lists for arrays)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, bool | int | float | np.number | np.bool_ | np.ndarray):
            array = np.asarray(value)
            if array.dtype.kind in "biuf":
                out[key] = array.tolist()
    return out


def rollout_episode(
    env: gym.Env,
    act: ActFn,
    seed: int | None = None,
    max_steps: int | None = None,
    suite: str = "",
    reset_options: dict[str, Any] | None = None,
) -> Trajectory:
    """Run ``act(obs) -> action`` from ``env.reset(seed=seed)`` until the episode ends.

    Per-step numeric ``info`` entries (stage, collisions, poses, success) become the trajectory's
    privileged ``info``; the numeric entries of the reset ``info`` (describing the first
    observation) go to ``metadata["reset_info"]`` as lists, and an ``info["error"]`` (physics
    blow-up) to ``metadata["error"]``.
    """
    obs, info = env.reset(seed=seed, options=reset_options)
    builder = TrajectoryBuilder(
        obs,
        instruction=str(info.get("instruction", "")),
        task=str(info.get("task", "")),
        suite=suite,
        seed=seed,
        metadata={"reset_info": numeric_info(info)},
    )
    limit = max_steps if max_steps is not None else np.inf
    while builder.num_steps < limit:
        action = np.asarray(act(obs), dtype=np.float32)
        obs, reward, terminated, truncated, info = env.step(action)
        truncated = bool(truncated) or builder.num_steps + 1 >= limit  # cut off: truncated
        builder.add_step(action, obs, float(reward), bool(terminated), truncated, info)
        if "error" in info:
            builder.metadata["error"] = str(info["error"])
        if terminated or truncated:
            break
    return builder.build()


def _take(tree: Any, i: int) -> Any:
    """Row ``i`` of a batched observation (arrays or one level of dicts of arrays)."""
    if isinstance(tree, dict):
        return {k: _take(v, i) for k, v in tree.items()}
    return tree[i]


def _env_info(infos: dict[str, Any], i: int) -> dict[str, Any]:
    """The info dict of sub-env ``i`` from a vector env's batched infos (masked entries dropped)."""
    out = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        if mask is None or mask[i]:
            out[key] = _env_info(value, i) if isinstance(value, dict) else value[i]
    return out


def _lanes(
    num_envs: int, episodes: int, env_tasks: Sequence[str] | None,
    episode_tasks: Sequence[str] | None,
) -> tuple[list[str], list[str]] | None:  # fmt: skip
    """``rollout_vector``'s sub-env and episode tasks, checked: every episode's task has a
    sub-env (else it would never run); None when neither is given."""
    if env_tasks is None and episode_tasks is None:
        return None
    if env_tasks is None or episode_tasks is None:
        raise ValueError("give env_tasks and episode_tasks together (or neither)")
    if len(env_tasks) != num_envs or len(episode_tasks) != episodes:
        raise ValueError(f"got {len(env_tasks)} env_tasks for {num_envs} envs and "
                         f"{len(episode_tasks)} episode_tasks for {episodes} seeds")  # fmt: skip
    missing = sorted(set(episode_tasks) - set(env_tasks))
    if missing:
        raise ValueError(f"episode task(s) {missing} have no sub-env; the vector env runs "
                         f"{sorted(set(env_tasks))}")  # fmt: skip
    return list(env_tasks), list(episode_tasks)


def rollout_vector(
    vec: gym.vector.VectorEnv,
    act: Callable[[dict[str, Any]], np.ndarray],
    seeds: Sequence[int],
    suite: str = "",
    step_limits: Sequence[int | None] | None = None,
    capture: int = 0,
    episode_ids: Sequence[int] | None = None,
    skip_unread_images: bool = False,
    env_tasks: Sequence[str] | None = None,
    episode_tasks: Sequence[str] | None = None,
) -> Iterator[Trajectory]:
    """Run one episode per seed on a vector env, yielding each ``Trajectory`` as it finishes.

    ``vec`` must be built with ``autoreset_mode="disabled"`` (e.g. ``make_vec_env(...,
    autoreset_mode="disabled")``): a finished sub-env is reset to the next pending seed at once,
    so every worker stays busy; sub-envs left without an episode at the end keep stepping (reset
    without a seed whenever they finish) but are ignored.
    ``act(batched_obs) -> [num_envs, A]`` gets the whole batch; an ``act`` with a
    ``reset(envs, instructions)`` method is told which sub-envs start a new episode, and on
    what (and their ``episode_ids``, default ``0..len(seeds)-1``: what seeds a ``PolicyActor``'s
    per-episode sampling, so a split of the episodes over workers samples the same). An
    ``act`` that sets ``act.labels`` (``[num_envs, A]``) on each call has the env
    execute the returned actions but the trajectory record the labels (DART-style data); one
    that sets ``act.outputs`` (per sub-env: a dict of arrays, or None) has those recorded as the
    policy's decision at that step (``Trajectory.policy_outputs`` / ``decision_steps``).
    ``step_limits[e]`` cuts episode ``e`` off after that many steps (marked truncated):
    deliberate failure data. The first ``capture`` episodes also get ``frames``: the sub-env's
    ``render()`` after the reset and after every step (for videos).
    ``skip_unread_images`` with an ``act`` that has ``reads_next()`` (per sub-env: does its next
    observation reach the policy?) and sub-envs with a ``render_images`` switch (the tabletop)
    renders camera images only where the policy reads them: the others are black, and the
    trajectory lists their indices in ``metadata["unrendered"]`` (``decision_windows`` refuses
    them; a reward model reads replayed frames instead, ``embodied.sims.replay``).
    On a vector env of several tasks (``env_tasks``, one per sub-env) episode ``e`` runs on a
    sub-env of ``episode_tasks[e]``: a free sub-env takes the next pending episode of its task.
    """
    n = vec.num_envs
    pending = list(range(len(seeds)))
    ids = list(range(len(seeds))) if episode_ids is None else [int(e) for e in episode_ids]
    if len(ids) != len(seeds):
        raise ValueError(f"got {len(ids)} episode_ids for {len(seeds)} seeds")
    lane = _lanes(n, len(seeds), env_tasks, episode_tasks)

    def next_episode(env: int) -> int | None:
        """The first pending episode sub-env ``env`` may run (its task's), taken off the list."""
        if lane is None:
            return pending.pop(0) if pending else None
        mine = next((k for k, e in enumerate(pending) if lane[1][e] == lane[0][env]), None)
        return None if mine is None else pending.pop(mine)

    episode_of: list[int | None] = [None] * n
    builders: list[TrajectoryBuilder | None] = [None] * n
    frames: list[list[np.ndarray] | None] = [None] * n
    unrendered: list[list[int]] = [[] for _ in range(n)]  # black observations, per sub-env
    skip = skip_unread_images and hasattr(act, "reads_next")
    obs: Any = None

    def record_frames(envs: Sequence[int]) -> None:
        """Append the current render of each capturing sub-env among ``envs``."""
        capturing = [i for i in envs if frames[i] is not None]
        for i, image in render_envs(vec, capturing).items():
            frames[i].append(np.asarray(image))

    def start(envs: list[int]) -> Any:
        """Reset ``envs`` to the next pending seeds; return the batched observation."""
        mask = np.zeros(n, dtype=bool)
        mask[envs] = True  # idle envs are reset too: a finished env must not be stepped
        reset_seeds: list[int | None] = [None] * n
        for i in envs:
            episode_of[i] = next_episode(i)
            builders[i], unrendered[i] = None, []
            if episode_of[i] is not None:
                reset_seeds[i] = int(seeds[episode_of[i]])
            frames[i] = [] if episode_of[i] is not None and episode_of[i] < capture else None
        new_obs, infos = vec.reset(seed=reset_seeds, options={"reset_mask": mask})
        env_infos = {i: _env_info(infos, i) for i in envs}
        if hasattr(act, "reset"):  # a stateful actor (observation history, action queue)
            act.reset(
                envs,
                [str(env_infos[i].get("instruction", "")) for i in envs],
                episodes=[None if episode_of[i] is None else ids[episode_of[i]] for i in envs],
            )
        for i in envs:
            if episode_of[i] is None:
                continue
            info = env_infos[i]
            builders[i] = TrajectoryBuilder(
                _take(new_obs, i),
                instruction=str(info.get("instruction", "")),
                task=str(info.get("task", "")),
                suite=suite,
                seed=reset_seeds[i],
                metadata={"reset_info": numeric_info(info), "episode_id": ids[episode_of[i]]},
            )
        record_frames(envs)
        return new_obs

    obs = start(list(range(n)))
    skip = skip and isinstance(obs, dict) and "pixels" in obs  # only camera images are skipped
    while any(b is not None for b in builders):
        actions = np.asarray(act(obs), dtype=np.float32)
        rendered = None
        if skip:  # videos show every frame: their sub-envs render them all
            rendered = [bool(r) or frames[i] is not None for i, r in enumerate(act.reads_next())]
            vec.set_attr("render_images", rendered)
        obs, rewards, terminated, truncated, infos = vec.step(actions)
        recorded = np.asarray(getattr(act, "labels", actions), dtype=np.float32)
        decisions = getattr(act, "outputs", None)
        record_frames(range(n))
        finished = []
        for i, builder in enumerate(builders):
            if builder is None:  # idle: keep it resettable, ignore what it does
                if terminated[i] or truncated[i]:
                    finished.append(i)
                continue
            info = _env_info(infos, i)
            if decisions is not None and decisions[i] is not None:
                builder.add_decision(builder.num_steps, decisions[i])
            limit = None if step_limits is None else step_limits[episode_of[i]]
            cut = limit is not None and builder.num_steps + 1 >= limit
            done_t, done_tr = bool(terminated[i]), bool(truncated[i]) or cut
            builder.add_step(recorded[i], _take(obs, i), float(rewards[i]), done_t, done_tr, info)
            if rendered is not None and not rendered[i]:
                unrendered[i].append(builder.num_steps)  # the observation just added
            if "error" in info:
                builder.metadata["error"] = str(info["error"])
            if done_t or done_tr:
                if unrendered[i]:
                    builder.metadata["unrendered"] = unrendered[i]
                traj = builder.build()
                if frames[i] is not None:
                    traj.frames = np.stack(frames[i])
                    frames[i] = None
                yield traj
                finished.append(i)
        if finished:
            obs = start(finished)


class PolicyActor:
    """Drives a vector env with a ``Policy``: keeps each sub-env's last ``n_obs_steps``
    observations (repeating the first at an episode start) and plays each sampled action chunk
    for ``n_action_steps`` steps before asking the policy again, as Diffusion Policy does. The
    policy is fed only the features its ``observation_spec`` names.

    Stochastic sampling draws each sub-env's noise from its own generator, seeded by ``seed``
    and the episode id ``rollout_vector`` gives, so an episode samples the same whatever else
    shares the batch (other sub-envs, workers, a Ray cluster).

    With ``record=True`` each decision's ``policy_outputs`` (plus the sampling-time
    ``log_prob``) is offered to ``rollout_vector`` through ``outputs``, so the trajectories carry
    what ``Policy.log_prob`` needs (RL); ``decision_windows`` rebuilds the observations.

    A sub-env reset without an episode (``reset`` given ``None``: idle until the others finish)
    gets zero actions and no policy call: the policy runs for the episodes only."""

    def __init__(
        self,
        policy: Policy,
        num_envs: int,
        deterministic: bool = True,
        seed: int = 0,
        record: bool = False,
    ) -> None:
        spec = policy.observation_spec
        self.policy, self.num_envs, self.n_obs_steps = policy, num_envs, spec.n_obs_steps
        self.keys = spec.read_keys()
        self.deterministic, self.record = deterministic, record
        self.outputs: list[dict[str, np.ndarray] | None] | None = None
        self.seed = seed
        self.generators = [torch.Generator().manual_seed(seed) for _ in range(num_envs)]
        self.history: list[list[dict[str, np.ndarray]]] = [[] for _ in range(num_envs)]
        self.queue: list[list[np.ndarray]] = [[] for _ in range(num_envs)]
        self.instructions = [""] * num_envs
        self.idle = [False] * num_envs  # no episode: not worth a policy call
        self.action_dim = policy.action_spec.dim

    def reset(
        self,
        envs: Sequence[int],
        instructions: Sequence[str],
        episodes: Sequence[int | None] | None = None,
    ) -> None:
        """Sub-envs ``envs`` start new episodes on ``instructions``: forget their history and
        queued actions; reseed their noise from ``(seed, episode id)``."""
        for k, (i, instruction) in enumerate(zip(envs, instructions, strict=True)):
            self.history[i], self.queue[i] = [], []
            self.instructions[i] = instruction
            episode = None if episodes is None else episodes[k]
            self.idle[i] = episodes is not None and episode is None
            if episode is not None:
                key = np.random.SeedSequence([self.seed, episode]).generate_state(1)[0]
                self.generators[i] = torch.Generator().manual_seed(int(key))

    def __call__(self, obs: dict[str, Any]) -> np.ndarray:
        """Actions ``[num_envs, A]`` for the batched observation."""
        for i in range(self.num_envs):
            frame = read_features(env_observation_features(_take(obs, i)), self.keys)
            history = self.history[i]
            history.append(frame)
            while len(history) < self.n_obs_steps:
                history.insert(0, frame)
            del history[: len(history) - self.n_obs_steps]
        need = [i for i in range(self.num_envs) if not self.queue[i] and not self.idle[i]]
        if need:
            batch = {
                key: torch.from_numpy(
                    np.stack([np.stack([h[key] for h in self.history[i]]) for i in need])
                )
                for key in self.keys
            }
            with torch.no_grad():
                out = self.policy.act(
                    batch,
                    [self.instructions[i] for i in need],
                    deterministic=self.deterministic,
                    generator=[self.generators[i] for i in need],
                )
            chunks = np.asarray(out.actions.cpu().numpy(), dtype=np.float32)
            for j, i in enumerate(need):
                self.queue[i] = list(chunks[j])
            if self.record:
                self.outputs = [None] * self.num_envs
                recorded = {**out.policy_outputs, "sampled_log_prob": out.log_prob}
                for j, i in enumerate(need):
                    self.outputs[i] = {k: v[j].cpu().numpy() for k, v in recorded.items()}
        elif self.record:
            self.outputs = [None] * self.num_envs
        rest = np.zeros(self.action_dim, dtype=np.float32)
        return np.stack(
            [rest if self.idle[i] else self.queue[i].pop(0) for i in range(self.num_envs)]
        )

    def reads_next(self) -> list[bool]:
        """Per sub-env: whether the policy will read its next observation (the last
        ``n_obs_steps`` before the queued actions run out; ``rollout_vector`` skips rendering the
        others' cameras)."""
        return [
            not self.idle[i] and len(self.queue[i]) < self.n_obs_steps for i in range(self.num_envs)
        ]


def expert_actions(vec: gym.vector.VectorEnv) -> np.ndarray:
    """The scripted experts' actions ``[num_envs, A]`` at the sub-envs' current states (computed
    inside the workers, from privileged state)."""
    return np.stack(vec.call("scripted_action")).astype(np.float32)


class ExpertActor:
    """The scripted experts of a vector env's sub-envs (run inside the workers, privileged), with
    Gaussian action noise added here. ``record="expert"`` keeps the clean actions of each call
    in ``labels``, so ``rollout_vector`` records them while the env executes the noisy ones."""

    def __init__(
        self,
        vec: gym.vector.VectorEnv,
        noise: float = 0.0,
        rng: np.random.Generator | None = None,
        record: str = "executed",
    ) -> None:
        if record not in RECORDS:
            raise ValueError(f"record must be one of {RECORDS}, got {record!r}")
        self.vec, self.noise, self.record = vec, noise, record
        self.rng = rng if rng is not None else np.random.default_rng()

    def __call__(self, obs: Any) -> np.ndarray:
        """Noisy expert actions ``[num_envs, A]``."""
        clean = expert_actions(self.vec)
        if self.record == "expert":
            self.labels = clean
        return add_action_noise(clean, self.noise, self.rng)


class ExpertLabels:
    """Another actor acts; the scripted expert's actions at the states it reaches are recorded
    (``labels``): DAgger data (Ross et al. 2011), the expert's corrections along the learner's
    own mistakes. Everything else (``reset``, ``outputs``) is the wrapped actor's."""

    def __init__(self, actor: Any, vec: gym.vector.VectorEnv) -> None:
        self.actor, self.vec = actor, vec

    def __call__(self, obs: Any) -> np.ndarray:
        """The wrapped actor's actions ``[num_envs, A]``; the expert's in ``labels``."""
        self.labels = expert_actions(self.vec)
        return self.actor(obs)

    def __getattr__(self, name: str) -> Any:
        if name == "actor":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.actor, name)


class RandomActor:
    """Uniform random actions in the vector env's action box."""

    def __init__(self, vec: gym.vector.VectorEnv, rng: np.random.Generator | None = None) -> None:
        space = vec.single_action_space
        self.low, self.high, self.num_envs = space.low, space.high, vec.num_envs
        self.rng = rng if rng is not None else np.random.default_rng()

    def __call__(self, obs: Any) -> np.ndarray:
        """Actions ``[num_envs, A]``."""
        shape = (self.num_envs, *self.low.shape)
        return self.rng.uniform(self.low, self.high, size=shape).astype(np.float32)


def read_features(features: dict[str, np.ndarray], keys: Sequence[str]) -> dict[str, np.ndarray]:
    """The features a policy reads, out of everything an env observation holds (a one-camera
    env's ``observation.image`` serves a policy reading that one named camera); a missing one is
    an error naming what the env gave."""
    alias = one_camera_alias(keys, features)
    missing = [k for k in keys if alias.get(k, k) not in features]
    if missing:
        raise ValueError(f"the observation lacks {missing} that the policy reads; it has "
                         f"{sorted(features)}")  # fmt: skip
    return {k: features[alias.get(k, k)] for k in keys}


def decision_windows(traj: Trajectory, spec: ObservationSpec) -> dict[str, np.ndarray]:
    """The observation windows ``{feature: [K, n_obs_steps, ...]}`` each recorded decision saw
    (the features ``spec`` reads): observations ``s - n + 1 .. s`` for a decision at step ``s``,
    the first repeated before the episode's start (as ``PolicyActor`` keeps them)."""
    n_obs_steps = spec.n_obs_steps
    steps = np.asarray(traj.decision_steps, dtype=np.int64)
    offsets = np.arange(n_obs_steps) - (n_obs_steps - 1)
    index = np.clip(steps[:, None] + offsets[None, :], 0, None)  # [K, n]
    blank = np.intersect1d(index, traj.metadata.get("unrendered", []))
    if len(blank) and spec.cameras:
        raise ValueError(
            f"decisions of the episode (seed {traj.seed}) read observations {blank.tolist()[:5]} "
            "whose camera images the rollout did not render"
        )
    features = read_features(env_observation_features(traj.observations), spec.read_keys())
    return {key: value[index] for key, value in features.items()}


def decision_bc_windows(traj: Trajectory, spec: ObservationSpec, horizon: int) -> dict[str, Any]:
    """The trajectory's recorded decisions cut as ``BCDataset`` cuts a demonstration: each
    decision's observation window (``decision_windows``), the executed actions
    ``s - n + 1 .. s - n + horizon`` (``[K, horizon, A]``, the nearest real one repeated outside
    the episode) and ``action_is_pad`` marking those, so a policy's BC loss can fit its own
    rollout."""
    windows: dict[str, Any] = dict(decision_windows(traj, spec))
    steps = np.asarray(traj.decision_steps, dtype=np.int64)
    index = steps[:, None] - (spec.n_obs_steps - 1) + np.arange(horizon)[None, :]
    executed = len(traj.actions)
    windows["action"] = np.asarray(traj.actions, dtype=np.float32)[np.clip(index, 0, executed - 1)]
    windows["action_is_pad"] = (index < 0) | (index >= executed)
    return windows
