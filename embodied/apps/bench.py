"""``embodied bench``: speed of the toolkit's parts, each beside a baseline from the same run.

Every figure is the median of ``repeats`` timed runs. For simulators the baseline is the raw
``mj_step`` rate of the very same model with the same number of substeps per env step, replaying
the controls (and mocap targets) the env produced from the same start states: the same physics
with no wrapper around it, so ``ratio`` is what the env costs on top of the physical limit.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


class _Row:
    """A bench table row (the dataclasses below): ``as_dict`` gives it to JSON and the table."""

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON output."""
        return asdict(self)  # subclasses are dataclasses


@dataclass
class BenchRow(_Row):
    """One measured figure and the baseline it is compared against."""

    suite: str
    task: str
    mode: str  # "state" or "camera <H>x<W>"
    steps_per_s: float
    baseline: str
    baseline_steps_per_s: float
    ratio: float  # time per env step / time per baseline step (1.0 = no overhead)


def _median_rate(run: Any, steps: int, repeats: int, device: Any = None) -> float:
    """Median steps/s of ``run(steps)`` over ``repeats`` timed calls (after one warm-up); on a
    CUDA ``device`` each timed call ends when the GPU has finished its queued work."""
    import torch

    def timed(n: int) -> None:
        run(n)
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)

    timed(min(steps, 20))
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        timed(steps)
        rates.append(steps / (time.perf_counter() - start))
    return statistics.median(rates)


def _env_runner(env: Any, seed: int) -> Any:
    """A closure stepping ``env`` with fixed random actions, resetting when an episode ends."""
    rng = np.random.default_rng(seed)
    actions = rng.uniform(-1.0, 1.0, size=(4096, *env.action_space.shape)).astype(np.float32)
    state = {"i": 0, "seed": seed}
    env.reset(seed=seed)

    def run(steps: int) -> bool:
        """Take ``steps`` env steps; return whether the last one ended an episode."""
        ended = False
        for _ in range(steps):
            _, _, terminated, truncated, _ = env.step(actions[state["i"] % len(actions)])
            state["i"] += 1
            ended = terminated or truncated
            if ended:
                state["seed"] += 1
                env.reset(seed=state["seed"])
        return ended

    return run


def _raw_runner(env: Any, seed: int, steps: int) -> Any:
    """A closure replaying, with bare ``mj_step`` calls, the physics of ``steps`` env steps.

    The env is run once with the same fixed random actions as ``_env_runner``, recording the
    full physics state at every episode start and the controls and mocap targets of every step.
    """
    import mujoco

    inner = env.unwrapped
    model, data, substeps = inner.model, inner.data, int(inner.frame_skip)
    kind = mujoco.mjtState.mjSTATE_FULLPHYSICS
    size = mujoco.mj_stateSize(model, kind)

    def snapshot() -> np.ndarray:
        state = np.empty(size)
        mujoco.mj_getState(model, data, state, kind)
        return state

    starts: dict[int, np.ndarray] = {}
    ctrl, mocap_pos, mocap_quat = [], [], []
    record = _env_runner(env, seed)  # resets the env to ``seed``
    starts[0] = snapshot()
    for i in range(steps):
        if record(1):
            starts[i + 1] = snapshot()
        ctrl.append(data.ctrl.copy())
        mocap_pos.append(data.mocap_pos.copy())
        mocap_quat.append(data.mocap_quat.copy())
    replay = mujoco.MjData(model)

    def run(n: int) -> None:
        for i in range(n):
            j = i % steps
            if j in starts:
                mujoco.mj_setState(model, replay, starts[j], kind)
            replay.ctrl[:] = ctrl[j]
            replay.mocap_pos[:], replay.mocap_quat[:] = mocap_pos[j], mocap_quat[j]
            mujoco.mj_step(model, replay, substeps)

    return run


def bench_env(
    suite: str,
    task: str,
    make: Any,
    resolutions: tuple[int, ...],
    steps: int,
    repeats: int,
    seed: int = 0,
) -> list[BenchRow]:
    """Rows for one task: state-only and per camera resolution, each against raw ``mj_step``."""
    env = make(obs_mode="state")
    raw = _median_rate(_raw_runner(env, seed, steps), steps, repeats)
    baseline = f"raw mj_step x{env.unwrapped.frame_skip}"
    rows = []
    state_rate = _median_rate(_env_runner(env, seed), steps, repeats)
    rows.append(BenchRow(suite, task, "state", state_rate, baseline, raw, raw / state_rate))
    env.close()
    for res in resolutions:
        env = make(obs_mode="pixels", image_size=res)
        rate = _median_rate(_env_runner(env, seed), steps, repeats)
        rows.append(BenchRow(suite, task, f"camera {res}x{res}", rate, baseline, raw, raw / rate))
        env.close()
    return rows


def bench_sim(
    tasks: list[str] | None = None,
    resolutions: tuple[int, ...] = (64, 96, 128, 224),
    steps: int = 300,
    repeats: int = 5,
    metaworld: bool = True,
    progress: Any = None,
) -> list[BenchRow]:
    """Env steps/s of every tabletop task (and Meta-World reach/pick-place when installed)."""
    import functools

    import embodied.sims as sims

    jobs = [("tabletop", t, functools.partial(sims.make, t)) for t in (tasks or sims.list_tasks())]
    if metaworld and _metaworld_available():
        for name in ("reach-v3", "pick-place-v3"):
            jobs.append(("metaworld", name, functools.partial(sims.make, f"metaworld/{name}")))
    rows: list[BenchRow] = []
    for suite, task, make in jobs:
        if progress is not None:
            progress(f"{suite}/{task}")
        rows.extend(bench_env(suite, task, make, resolutions, steps, repeats))
    return rows


def _metaworld_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("metaworld") is not None


@dataclass
class CollectRow(_Row):
    """Collection throughput with images for one worker count, against one worker."""

    task: str
    workers: int
    image_size: int
    episodes_per_min: float
    frames_per_s: float
    baseline: str
    speedup: float  # baseline time / this time (2.0 = twice as fast)


def bench_collect(
    task: str = "PickPlace",
    workers: tuple[int, ...] = (1, 2),
    episodes: int = 8,
    image_size: int = 96,
    repeats: int = 3,
    progress: Any = None,
) -> list[CollectRow]:
    """Episodes/min and frames/s of ``embodied collect`` (expert, images, written to a LeRobot
    dataset) per worker count; median of ``repeats`` runs, each into a fresh temporary dir."""
    import tempfile

    from embodied.apps.collect import CollectConfig, run_collect

    rates: dict[int, tuple[float, float]] = {}
    for count in workers:
        if progress is not None:
            progress(f"collect {task} with {count} worker(s)")
        runs = []
        for r in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                cfg = CollectConfig(
                    task=task,
                    episodes=episodes,
                    out=f"{tmp}/data",
                    workers=count,
                    image_size=image_size,
                    seed=1000 * r,
                )
                summary = run_collect(cfg)
            runs.append((summary.episodes / summary.seconds * 60, summary.frames / summary.seconds))
        rates[count] = (
            statistics.median(e for e, _ in runs),
            statistics.median(f for _, f in runs),
        )
    base = rates[workers[0]][0]
    return [
        CollectRow(task, n, image_size, e, f, f"{workers[0]} worker(s)", e / base)
        for n, (e, f) in rates.items()
    ]


@dataclass
class DatasetRow(_Row):
    """Reading a LeRobot dataset's episodes, against decoding the same videos with no colour
    conversion (the decoder's own rate)."""

    read: str
    image_size: int
    episodes_per_s: float
    frames_per_s: float
    baseline: str
    baseline_frames_per_s: float
    ratio: float  # time per frame read / time per frame decoded raw (1.0 = no overhead)


def bench_dataset(
    task: str = "PickPlace",
    episodes: int = 8,
    image_size: int = 64,
    repeats: int = 3,
    progress: Any = None,
) -> list[DatasetRow]:
    """Episodes/s and frames/s of ``LeRobotDataset.episode_frames`` (what labelling, reward and
    BC training read) on freshly collected expert episodes: every feature, and the camera alone.
    The baseline decodes the same mp4 files to raw YUV planes in this process."""
    import tempfile
    from pathlib import Path

    import av

    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.datasets import LeRobotDataset

    if progress is not None:
        progress(f"dataset reads of {episodes} {task} episodes at {image_size}x{image_size}")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = CollectConfig(task=task, episodes=episodes, out=f"{tmp}/data", image_size=image_size)
        run_collect(cfg)
        dataset = LeRobotDataset(cfg.out)
        image_key = next(k for k, f in dataset.features.items() if f["dtype"] == "video")
        frames = sum(length + 1 for length in dataset.episode_lengths())
        videos = sorted(Path(cfg.out, "videos").rglob("*.mp4"))

        def raw_decode() -> None:
            for path in videos:
                with av.open(str(path)) as container:
                    for frame in container.decode(video=0):
                        frame.to_ndarray()  # the decoder's planes, no conversion

        def read(keys: list[str] | None) -> Any:
            def run(_: int) -> None:
                for episode in range(dataset.num_episodes):
                    dataset.episode_frames(episode, keys=keys)

            return run

        # Reads of the whole dataset per second (median; a warm-up read opens the files first).
        base = _median_rate(lambda _: raw_decode(), 1, repeats)
        rows = []
        for label, keys in (("every feature", None), ("camera only", [image_key])):
            rate = _median_rate(read(keys), 1, repeats)
            rows.append(
                DatasetRow(
                    label,
                    image_size,
                    dataset.num_episodes * rate,
                    frames * rate,
                    "raw mp4 decode (no colour conversion)",
                    frames * base,
                    base / rate,
                )
            )
    return rows


@dataclass
class PolicyRow(_Row):
    """Sampling speed of one policy at one batch size, against DDIM-10 diffusion at that size."""

    policy: str
    batch: int
    decisions_per_s: float
    actions_per_s: float  # decisions/s x batch x actions per chunk
    baseline: str
    speedup: float  # this actions/s / baseline actions/s


# (label, policy type, config overrides): the figures issue 4 asks for, at tabletop shapes.
POLICY_VARIANTS = (
    ("diffusion DDIM-10", "diffusion", {"num_inference_steps": 10}),
    # configs/bc_diffusion.yaml's planner: no camera, the state through the object encoder.
    (
        "diffusion DDIM-10 state+objects",
        "diffusion",
        {"num_inference_steps": 10, "image_keys": [], "env_state_encoder": "objects"},
    ),
    ("flow Euler-4", "flow", {"num_inference_steps": 4}),
    ("flow Euler-1", "flow", {"num_inference_steps": 1}),
    ("vla decoding", "vla", {}),
    ("mlp gaussian", "mlp", {}),
)


def tabletop_features(image_size: int, env_state: bool = False) -> dict[str, dict[str, Any]]:
    """Dataset features of a tabletop recording (one camera, agent_pos, 4-D actions, and with
    ``env_state`` the named privileged state)."""
    features: dict[str, dict[str, Any]] = {
        "observation.image": {"dtype": "video", "shape": [image_size, image_size, 3]},
        "observation.state": {"dtype": "float32", "shape": [4]},
        "action": {"dtype": "float32", "shape": [4]},
    }
    if env_state:
        import embodied.sims as sims

        env = sims.make("Reach", obs_mode="state")
        names = env.get_wrapper_attr("feature_names")["environment_state"]
        env.close()
        features["observation.environment_state"] = {
            "dtype": "float32",
            "shape": [len(names)],
            "names": names,
        }
    return features


def _random_observation(policy: Any, batch: int, rng: np.random.Generator) -> dict[str, Any]:
    """A batch ``[B, n_obs, ...]`` of every feature ``policy`` reads (uint8 images)."""
    import torch

    spec = policy.observation_spec
    n_obs = spec.n_obs_steps
    obs = {}
    for key, (height, width) in spec.cameras.items():
        shape = (batch, n_obs, height, width, 3)
        obs[key] = torch.from_numpy(rng.integers(0, 256, shape, dtype=np.uint8))
    for key, dim in (("observation.state", spec.state_dim),
                     ("observation.environment_state", spec.env_state_dim)):  # fmt: skip
        if dim:
            obs[key] = torch.from_numpy(rng.normal(size=(batch, n_obs, dim)).astype(np.float32))
    return obs


def bench_policy(
    image_size: int = 64,
    batches: tuple[int, ...] = (1, 16),
    decisions: int = 5,
    repeats: int = 5,
    policy_dirs: tuple[str, ...] = (),
    device: str = "cpu",
    progress: Any = None,
) -> list[PolicyRow]:
    """Decisions/s and actions/s of ``act`` (sampling, as in RL rollouts) for each policy type
    at tabletop shapes, untrained weights, plus any saved policies in ``policy_dirs``, on
    ``device`` (``auto``: CUDA when available); observations start on the CPU, as from envs."""
    import torch

    import embodied.policies  # noqa: F401  (registers the policy types)
    from embodied.core.policy import POLICIES, Policy
    from embodied.train.common import resolve_device

    where = resolve_device(device)

    features = tabletop_features(image_size)
    state_features = tabletop_features(image_size, env_state=True)
    tasks = ["reach the red block", "push the blue block onto the green plate"]
    policies: list[tuple[str, Any]] = []
    for label, kind, overrides in POLICY_VARIANTS:
        if kind in POLICIES:
            cls = POLICIES[kind]
            shape = state_features if "env_state_encoder" in overrides else features
            config = cls.config_from_dataset(shape, tasks, **overrides)
            policies.append((label, cls(config).to(where).eval()))
    for directory in policy_dirs:
        policies.append((str(directory), Policy.from_pretrained(directory, where).eval()))

    rng = np.random.default_rng(0)
    rates: dict[tuple[str, int], tuple[float, float]] = {}
    for label, policy in policies:
        for batch in batches:
            if progress is not None:
                progress(f"policy {label} at batch {batch}")
            obs = _random_observation(policy, batch, rng)
            instructions = [tasks[i % len(tasks)] for i in range(batch)]
            generator = torch.Generator().manual_seed(0)
            chunk = policy.act(obs, instructions, generator=generator).actions.shape[1]

            def run(n: int, policy: Any = policy, obs: Any = obs, text: Any = instructions) -> None:
                with torch.no_grad():
                    for _ in range(n):
                        policy.act(obs, text, generator=generator)  # noqa: B023 (used at once)

            per_s = _median_rate(run, decisions, repeats, where)
            rates[label, batch] = (per_s, per_s * batch * chunk)
    base = POLICY_VARIANTS[0][0]
    return [
        PolicyRow(
            label,
            batch,
            decisions_per_s,
            actions_per_s,
            f"{base} (batch {batch})",
            actions_per_s / rates[base, batch][1] if (base, batch) in rates else float("nan"),
        )
        for (label, batch), (decisions_per_s, actions_per_s) in rates.items()
    ]


@dataclass
class RewardRow(_Row):
    """Scoring speed of a progress reward model on rollouts, against one clip at a time."""

    model: str
    batch: int  # clips scored per call
    frames: int  # frames per clip
    frames_per_s: float
    baseline: str
    speedup: float  # frames/s / baseline frames/s


def bench_reward(
    image_size: int = 64,
    batches: tuple[int, ...] = (1, 16),
    frames: int = 100,
    repeats: int = 5,
    model_dirs: tuple[str, ...] = (),
    device: str = "cpu",
    progress: Any = None,
) -> list[RewardRow]:
    """Frames/s of ``ProgressRewardModel.progress`` on batches of rollout-length clips (GRPO's
    scoring step): the default (configs/reward.yaml-sized) model at ``image_size`` and any saved
    models, each against the same model scoring one clip per call, on ``device`` (``auto``: CUDA
    when available) with the clips starting on the CPU."""
    import torch

    from embodied.rewards import ProgressConfig, ProgressRewardModel
    from embodied.train.common import resolve_device

    where = resolve_device(device)
    tasks = ["put the red block on the green plate", "push the blue block to the purple plate"]
    default = ProgressRewardModel(ProgressConfig(image_size=image_size))
    models: list[tuple[str, Any]] = [("progress (default)", default.to(where).eval())]
    models += [(str(d), ProgressRewardModel.from_pretrained(d, where).eval()) for d in model_dirs]
    rng = np.random.default_rng(0)
    rows = []
    for label, model in models:
        size = model.config.image_size
        rates = {}
        for batch in sorted(set(batches) | {1}):
            if progress is not None:
                progress(f"reward {label} at batch {batch}")
            clips = torch.from_numpy(
                rng.integers(0, 256, (batch, frames, size, size, 3), dtype=np.uint8)
            )
            text = [tasks[i % len(tasks)] for i in range(batch)]

            def run(n: int, model: Any = model, clips: Any = clips, text: Any = text) -> None:
                for _ in range(n):
                    model.progress(clips, text)

            rates[batch] = _median_rate(run, 2, repeats, where) * batch * frames
        rows += [
            RewardRow(label, b, frames, rates[b], f"{label} (batch 1)", rates[b] / rates[1])
            for b in batches
        ]
    return rows


@dataclass
class TrainRow(_Row):
    """Training steps/s (forward, backward, AdamW) of a model with one malloc setting, against
    glibc's default setting in the same process."""

    model: str
    batch: int
    allocator: str  # "glibc default" or "keep freed memory" (embodied.apps.allocator)
    steps_per_s: float
    baseline: str
    speedup: float  # steps/s / baseline steps/s


def bench_train(
    image_size: int = 96,
    batch_size: int = 32,
    steps: int = 3,
    repeats: int = 3,
    device: str = "cpu",
    progress: Any = None,
) -> list[TrainRow]:
    """Training steps/s of the default progress reward model (clips of 8 frames) and the diffusion
    planner (BC) at ``image_size`` on ``device`` (``auto``: CUDA when available; batches already
    there), with glibc's default malloc and with ``keep_freed_memory``, the default first. Off
    glibc the one row per model is the system's malloc."""
    import torch

    from embodied.apps.allocator import keep_freed_memory
    from embodied.policies import DiffusionPolicy
    from embodied.rewards import ProgressConfig, ProgressRewardModel
    from embodied.train.common import resolve_device, to_device

    where = resolve_device(device)
    rng = np.random.default_rng(0)
    tasks = ["put the red block on the green plate", "push the blue block to the purple plate"]
    text = [tasks[i % len(tasks)] for i in range(batch_size)]
    reward = ProgressRewardModel(ProgressConfig(image_size=image_size)).to(where)
    reward_batch = {
        "frames": torch.from_numpy(
            rng.integers(0, 256, (batch_size, 8, image_size, image_size, 3), dtype=np.uint8)
        ),
        "progress": torch.rand(batch_size, 8),
        "success": torch.zeros(batch_size),
        "instruction": text,
    }
    config = DiffusionPolicy.config_from_dataset(tabletop_features(image_size), tasks)
    planner = DiffusionPolicy(config).to(where)
    planner_batch = {
        **_random_observation(planner, batch_size, rng),
        "action": torch.zeros(batch_size, config.horizon, 4),
        "action_is_pad": torch.zeros(batch_size, config.horizon, dtype=torch.bool),
        "instruction": text,
    }
    reward_batch, planner_batch = to_device(reward_batch, where), to_device(planner_batch, where)
    jobs = [
        ("progress (default)", reward, lambda: reward.loss(reward_batch)),
        ("diffusion BC", planner, lambda: planner.bc_loss(planner_batch)),
    ]
    glibc = keep_freed_memory(False, respect_environment=False)
    settings = [("glibc default", False), ("keep freed memory", True)] if glibc else []
    rows = []
    try:
        for label, model, loss in jobs:
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def run(n: int, loss: Any = loss, optimizer: Any = optimizer) -> None:
                for _ in range(n):
                    optimizer.zero_grad()
                    loss().backward()
                    optimizer.step()

            if not glibc:  # one row: whatever malloc this system has
                rate = _median_rate(run, steps, repeats, where)
                rows.append(TrainRow(label, batch_size, "system malloc", rate, "itself", 1.0))
            base = None
            for name, keep in settings:
                keep_freed_memory(keep, respect_environment=False)
                if progress is not None:
                    progress(f"train {label} at batch {batch_size}, {name}")
                rate = _median_rate(run, steps, repeats, where)
                base = base or rate
                rows.append(TrainRow(label, batch_size, name, rate, settings[0][0], rate / base))
    finally:
        keep_freed_memory(True)  # as `embodied` runs (glibc defaults if the user set malloc's)
    return rows


@dataclass
class RolloutRow(_Row):
    """Rollout throughput of the policy-driven engine on one backend, against a synchronous
    vector env in this process."""

    backend: str
    envs: int
    steps_per_s: float
    episodes_per_min: float
    baseline: str
    speedup: float


def bench_rollout(
    task: str = "PickPlace",
    envs: int = 4,
    episodes: int = 8,
    repeats: int = 3,
    ray_workers: int = 2,
    progress: Any = None,
) -> list[RolloutRow]:
    """Env steps/s of GRPO-style rollouts (the ``configs/bc_diffusion.yaml`` planner, untrained,
    stochastic, decisions recorded, state observations): a sync vector env in this process, an
    async one (a process per env), and Ray actors when Ray is installed."""
    import embodied.policies  # noqa: F401  (registers the policy types)
    from embodied.core.policy import POLICIES
    from embodied.rollout.backends import DistributedConfig, LocalRollouts, make_rollouts

    tasks = ["put the red block on the green plate"]
    config = POLICIES["diffusion"].config_from_dataset(
        tabletop_features(64, env_state=True), tasks, **POLICY_VARIANTS[1][2], n_action_steps=4
    )
    policy = POLICIES["diffusion"](config).eval()
    env_kwargs = {"obs_mode": "state"}
    backends: list[tuple[str, int, Any]] = [
        ("sync", envs, lambda: LocalRollouts(task, env_kwargs, policy, envs)),
        ("async", envs, lambda: LocalRollouts(task, env_kwargs, policy, envs, asynchronous=True)),
    ]
    try:
        import ray  # noqa: F401

        per_worker = max(1, envs // ray_workers)
        cfg = DistributedConfig("ray", workers=ray_workers, envs_per_worker=per_worker)
        backends.append(
            (
                "ray",
                ray_workers * per_worker,
                lambda: make_rollouts(cfg, task, env_kwargs, policy, 1),
            )
        )
    except ImportError:
        pass
    rates: dict[str, tuple[int, float, float]] = {}
    for name, count, build in backends:
        if progress is not None:
            progress(f"rollouts on {name} ({count} envs)")
        rollouts = build()
        try:
            rollouts.run(list(range(count)), sample_seed=0)  # warm-up: workers, first renders
            runs = []
            for r in range(repeats):
                start = time.perf_counter()
                trajs = rollouts.run([1000 * r + e for e in range(episodes)], sample_seed=r)
                seconds = time.perf_counter() - start
                steps = sum(t.length for t in trajs)
                runs.append((steps / seconds, len(trajs) / seconds * 60))
        finally:
            rollouts.close()
        rates[name] = (
            count,
            statistics.median(s for s, _ in runs),
            statistics.median(e for _, e in runs),
        )
    base = rates["sync"][1]
    return [
        RolloutRow(name, count, steps, eps, f"sync ({envs} envs)", steps / base)
        for name, (count, steps, eps) in rates.items()
    ]


def format_table(rows: list[Any]) -> str:
    """Fixed-width text table of bench rows (dataclasses with ``as_dict``)."""
    return format_dicts([r.as_dict() for r in rows])


def format_dicts(dicts: list[dict[str, Any]]) -> str:
    """Fixed-width text table of rows given as dicts with the same keys."""
    header = tuple(dicts[0]) if dicts else ()

    def show(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
        return str(value)

    lines = [tuple(show(d[k]) for k in header) for d in dicts]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line) for line in lines]
    return "\n".join(out)
