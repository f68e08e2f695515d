"""Progress labels for training reward models: procedure-grounded (ProcVLM) vs. naive time labels.

Time labels (``time_labels``) say "frame i of N is i/(N-1) done": they conflate elapsed time with
progress, keep rising while the robot stalls, and cannot tell a failure from a success. ProcVLM
grounds progress in the task's procedure instead (``procedure_labels``):

1. Every observation has a subtask stage (``observation_stages``, from the simulator's privileged
   ``info["stage"]``).
2. Each stage gets a progress budget (``stage_budgets``: its share of the mean stage duration over
   successful episodes, or uniform); ``base[k] = budgets[0] + ... + budgets[k-1]``.
3. Within a stage, the budget is spread over the frames in proportion to visual change measured
   with OpenCV (``visual_change``), not elapsed time, so a pause is flat.

``label_trajectories`` does all of this for a dataset (``embodied.rewards.rewind`` makes the
synthetic failures a reward model also needs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import cv2
import numpy as np

from embodied.core.trajectory import Trajectory
from embodied.rewards.rewind import rewind_order

__all__ = [
    "DEFAULT_FAILURE_CAP",
    "DEFAULT_FAILURE_FINAL",
    "label_trajectories",
    "median_stage_change",
    "observation_stages",
    "procedure_labels",
    "stage_budgets",
    "time_labels",
    "trajectory_frames",
    "visual_change",
]

BLUR_KERNEL = (5, 5)  # Gaussian blur before differencing: ignores single-pixel render noise
DIFF_NOISE_FLOOR = 2.0  # grey levels (of 255) subtracted from every pixel's absolute difference
FLOW_NOISE_FLOOR = 0.05  # pixels subtracted from every changed pixel's optical-flow magnitude
MIN_STAGE_FRAMES = 1.0  # in duration budgets every stage counts as at least one frame
DEFAULT_FAILURE_CAP = 0.9  # an unfinished stage run earns at most this fraction of its budget
DEFAULT_FAILURE_FINAL = 0.5  # time labels of a failed episode end here


# ---------------------------------------------------------------------------------------------
# Inputs: stages and frames of a trajectory, visual change between frames
# ---------------------------------------------------------------------------------------------


def observation_stages(traj: Trajectory) -> np.ndarray:
    """Stage index of every observation, int64 [T+1]: reset stage, then ``info["stage"]``.

    ``info["stage"][t]`` is the stage after step t (of observation t+1); the stage of observation 0
    comes from ``metadata["reset_info"]["stage"]`` (recorded by ``rollout_episode``).
    """
    if "stage" not in traj.info:
        raise ValueError(
            f"trajectory has no info['stage'] (info keys: {sorted(traj.info)}); procedure labels "
            "need the simulator's per-step subtask stage"
        )
    reset_info = traj.metadata.get("reset_info", {})
    if "stage" not in reset_info:
        raise ValueError(
            "trajectory has no metadata['reset_info']['stage'] (the stage of observation 0); "
            "record it as rollout_episode does"
        )
    step_stages = np.asarray(traj.info["stage"])
    if step_stages.ndim != 1:
        raise ValueError(f"info['stage'] must be 1-D [T], got shape {step_stages.shape}")
    first = np.array([int(np.asarray(reset_info["stage"]))])
    return np.concatenate([first, step_stages]).astype(np.int64)


def trajectory_frames(
    traj: Trajectory, frames_key: str = "pixels", camera: str | None = None
) -> np.ndarray:
    """The image frames uint8 [T+1, H, W, 3] of ``observations[frames_key]`` (one camera of a dict).

    When the observation is a dict of cameras, ``camera`` picks one; by default the first.
    """
    if frames_key not in traj.observations:
        raise ValueError(
            f"trajectory has no observations[{frames_key!r}] (observation keys: "
            f"{sorted(traj.observations)}); procedure labels need image frames"
        )
    frames = traj.observations[frames_key]
    if isinstance(frames, dict):
        if camera is None:
            camera = next(iter(frames))
        if camera not in frames:
            raise ValueError(
                f"observations[{frames_key!r}] has no camera {camera!r} (cameras: {sorted(frames)})"
            )
        frames = frames[camera]
    elif camera is not None:
        raise ValueError(f"camera={camera!r} given but observations[{frames_key!r}] is one image")
    return frames


def _grey(frame: np.ndarray) -> np.ndarray:
    """Blurred greyscale version of one RGB frame (uint8 [H, W])."""
    grey = cv2.cvtColor(np.ascontiguousarray(frame), cv2.COLOR_RGB2GRAY)
    return cv2.GaussianBlur(grey, BLUR_KERNEL, 0)


def visual_change(frames: np.ndarray, method: str = "diff") -> np.ndarray:
    """Visual change into each frame from the previous one, float64 [N] (entry 0 is 0).

    Both methods work on blurred greyscale frames with a per-pixel noise floor, so identical or
    near-identical frames give exactly 0 (``diff = |grey[i] - grey[i-1]|`` per pixel):

    - ``"diff"``: ``change[i] = mean(max(diff - 2 grey levels, 0))``
    - ``"flow"``: ``change[i] = mean(max(|flow| - 0.05 px, 0) * (diff > 2 grey levels))`` with
      Farneback flow from grey[i-1] to grey[i]; flow counts only where the image changed, because
      Farneback reports spurious flow of up to ~1.5 px on identical small frames.
    """
    if method not in ("diff", "flow"):
        raise ValueError(f"visual_change method must be 'diff' or 'flow', got {method!r}")
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(
            "visual_change needs uint8 RGB frames [N, H, W, 3], got dtype "
            f"{frames.dtype} with shape {frames.shape}"
        )
    change = np.zeros(len(frames), dtype=np.float64)
    if len(frames) == 0:
        return change
    previous = _grey(frames[0])
    for i in range(1, len(frames)):
        current = _grey(frames[i])
        diff = cv2.absdiff(current, previous).astype(np.float64)
        if method == "diff":
            change[i] = np.maximum(diff - DIFF_NOISE_FLOOR, 0.0).mean()
        else:
            flow = cv2.calcOpticalFlowFarneback(
                previous,
                current,
                None,
                pyr_scale=0.5,
                levels=3,
                winsize=15,
                iterations=3,
                poly_n=5,
                poly_sigma=1.2,
                flags=0,
            )
            magnitude = np.linalg.norm(flow, axis=-1).astype(np.float64)
            changed = diff > DIFF_NOISE_FLOOR
            change[i] = (np.maximum(magnitude - FLOW_NOISE_FLOOR, 0.0) * changed).mean()
        previous = current
    return change


# ---------------------------------------------------------------------------------------------
# Budgets and typical change per stage, from successful episodes
# ---------------------------------------------------------------------------------------------


def _check_stages(stages: np.ndarray, n_stages: int) -> np.ndarray:
    """Return stages as int64 [N], raising ValueError unless every entry is in [0, n_stages)."""
    stages = np.asarray(stages)
    if stages.ndim != 1 or (stages.size and stages.dtype.kind not in "iu"):
        raise ValueError(f"stages must be a 1-D integer array, got {stages.dtype} {stages.shape}")
    stages = stages.astype(np.int64)
    if stages.size and (stages.min() < 0 or stages.max() >= n_stages):
        raise ValueError(
            f"stages must lie in [0, {n_stages}) for n_stages = {n_stages}, got values in "
            f"[{stages.min()}, {stages.max()}]"
        )
    return stages


def stage_budgets(
    stage_sequences: Sequence[np.ndarray], n_stages: int, method: str = "duration"
) -> np.ndarray:
    """Progress budget per stage, float64 [n_stages] summing to 1: each subtask's share of progress.

    - ``"duration"`` (default): ``budget[k] ∝ max(mean frames in stage k, 1)``, the mean taken over
      the given (successful) episodes' observation stages; a stage never seen still counts as one
      frame, so it gets a small positive share.
    - ``"uniform"``: ``budget[k] = 1 / n_stages`` (``stage_sequences`` is not used).
    """
    if n_stages < 1:
        raise ValueError(f"n_stages must be >= 1, got {n_stages}")
    if method == "uniform":
        return np.full(n_stages, 1.0 / n_stages)
    if method != "duration":
        raise ValueError(f"stage_budgets method must be 'duration' or 'uniform', got {method!r}")
    if len(stage_sequences) == 0:
        raise ValueError("duration budgets need the stage sequences of successful episodes")
    frames_per_stage = np.zeros(n_stages, dtype=np.float64)
    for stages in stage_sequences:
        stages = _check_stages(stages, n_stages)
        frames_per_stage += np.bincount(stages, minlength=n_stages)
    mean_frames = frames_per_stage / len(stage_sequences)
    mean_frames = np.maximum(mean_frames, MIN_STAGE_FRAMES)
    return mean_frames / mean_frames.sum()


def median_stage_change(
    stage_sequences: Sequence[np.ndarray], change_sequences: Sequence[np.ndarray], n_stages: int
) -> np.ndarray:
    """Median over episodes of the total visual change spent in each stage, float64 [n_stages].

    ``total[k] = sum(change[stages == k])`` per episode (change into a frame counts for the frame's
    stage); the median runs over the episodes that visit stage k, NaN where none does. Computed on
    successful episodes, it is how much change finishing a stage typically takes.
    """
    if len(stage_sequences) != len(change_sequences):
        raise ValueError(
            f"got {len(stage_sequences)} stage sequences but {len(change_sequences)} change ones"
        )
    totals: list[list[float]] = [[] for _ in range(n_stages)]
    for stages, change in zip(stage_sequences, change_sequences, strict=True):
        stages = _check_stages(stages, n_stages)
        change = np.asarray(change, dtype=np.float64)
        if change.shape != stages.shape:
            raise ValueError(f"stages {stages.shape} and change {change.shape} differ in shape")
        for stage in np.unique(stages):
            totals[stage].append(float(change[stages == stage].sum()))
    return np.array([np.median(t) if t else np.nan for t in totals], dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# Labels
# ---------------------------------------------------------------------------------------------


def _runs(stages: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of equal stage as (start, stop) index pairs, stop exclusive."""
    boundaries = np.flatnonzero(np.diff(stages) != 0) + 1
    starts = [0, *boundaries.tolist()]
    stops = [*boundaries.tolist(), len(stages)]
    return list(zip(starts, stops, strict=True))


def procedure_labels(
    stages: np.ndarray,
    change: np.ndarray,
    success: bool,
    budgets: np.ndarray,
    typical_stage_change: np.ndarray | None = None,
    failure_cap: float = DEFAULT_FAILURE_CAP,
) -> np.ndarray:
    """ProcVLM progress labels float32 [N]: stage budgets spread over frames by visual change.

    The episode is split into maximal runs of one stage. Frame i of a run of stage k gets::

        label[i] = base[k] + budgets[k] * fraction[i]      base[k] = budgets[0] + ... + budgets[k-1]
        accumulated[i] = change[start] + ... + change[i]   (change into each of the run's frames)

    and ``fraction`` depends on how the run ends:

    - completed (the next run is a higher stage): ``fraction = accumulated / accumulated[-1]``,
      reaching 1 at the run's last frame (1 there too if the run had no change at all);
    - final run of a successful episode: the same, but the run spans ``base[k]`` to exactly 1.0
      (it also owns the budget of any later stage it skipped), so the last label is 1.0;
    - not completed (final run of a failed episode, or a run followed by a LOWER stage, i.e. a stage
      undone): ``fraction = min(accumulated / typical_stage_change[k], failure_cap)``, where the
      run's own ``accumulated[-1]`` replaces the typical change when that is None, NaN or 0; the
      fraction stays <= failure_cap (0.9) < 1, so a failure ends below 1.0.

    Budgets are normalised to sum 1. Frames with zero change add no progress (a pause is flat).
    The label follows the stage held NOW, not the highest stage reached: where a stage is undone (a
    dropped block) the label drops to that lower stage's base, so a rewound video drops stage by
    stage (within a stage it still rises, visual change having no direction; ``label_trajectories``
    therefore labels ``rewind`` episodes by mirroring their forward labels).
    """
    stages = np.asarray(stages)
    change = np.asarray(change, dtype=np.float64)
    budgets = np.asarray(budgets, dtype=np.float64)
    if budgets.ndim != 1 or budgets.size == 0 or not np.all(np.isfinite(budgets)):
        raise ValueError(f"budgets must be a non-empty 1-D finite array, got {budgets}")
    if np.any(budgets <= 0):
        raise ValueError(f"every stage budget must be > 0, got {budgets}")
    n_stages = len(budgets)
    stages = _check_stages(stages, n_stages)
    if stages.size == 0:
        raise ValueError("procedure_labels needs at least one frame")
    if change.shape != stages.shape:
        raise ValueError(f"stages {stages.shape} and change {change.shape} differ in shape")
    if not np.all(np.isfinite(change)) or np.any(change < 0):
        raise ValueError("visual change must be finite and >= 0")
    if not 0.0 <= failure_cap < 1.0:
        raise ValueError(f"failure_cap must be in [0, 1), got {failure_cap}")
    if typical_stage_change is not None:
        typical_stage_change = np.asarray(typical_stage_change, dtype=np.float64)
        if typical_stage_change.shape != budgets.shape:
            raise ValueError(
                f"typical_stage_change has shape {typical_stage_change.shape} but budgets has "
                f"{budgets.shape}"
            )

    budgets = budgets / budgets.sum()
    base = np.concatenate([[0.0], np.cumsum(budgets)[:-1]])
    labels = np.zeros(len(stages), dtype=np.float64)
    runs = _runs(stages)
    for index, (start, stop) in enumerate(runs):
        stage = stages[start]
        accumulated = np.cumsum(change[start:stop])
        own_total = accumulated[-1]
        is_last = index == len(runs) - 1
        completed = not is_last and stages[runs[index + 1][0]] > stage
        top = base[stage] + budgets[stage]

        if completed or (is_last and success):
            fraction = np.zeros_like(accumulated)
            if own_total > 0:
                fraction = accumulated / own_total
            fraction[-1] = 1.0
            if is_last:
                top = 1.0
        else:
            denominator = own_total
            if typical_stage_change is not None:
                typical = typical_stage_change[stage]
                if np.isfinite(typical) and typical > 0:
                    denominator = typical
            if denominator > 0:
                fraction = np.minimum(accumulated / denominator, failure_cap)
            else:
                fraction = np.zeros_like(accumulated)

        labels[start:stop] = base[stage] + (top - base[stage]) * fraction

    if success:
        labels[-1] = 1.0  # exact, whatever the float rounding of the budget sums
    return np.clip(labels, 0.0, 1.0).astype(np.float32)


def time_labels(num_frames: int, success: bool, final: float | None = None) -> np.ndarray:
    """Naive time-interpolated labels float32 [N] (the baseline ProcVLM argues against).

    ``label[i] = end * i / (N - 1)`` with ``end = 1`` for a successful episode and ``end = final``
    (default 0.5, "half done") for a failed one; a single frame gets ``end``.
    """
    if num_frames < 1:
        raise ValueError(f"time_labels needs num_frames >= 1, got {num_frames}")
    end = DEFAULT_FAILURE_FINAL if final is None else float(final)
    if not 0.0 <= end <= 1.0:
        raise ValueError(f"final must be in [0, 1], got {final}")
    if success:
        end = 1.0
    if num_frames == 1:
        return np.array([end], dtype=np.float32)
    return (end * np.arange(num_frames) / (num_frames - 1)).astype(np.float32)


def label_trajectories(
    trajs: Sequence[Trajectory],
    method: str = "procedure",
    n_stages: int | Mapping[str, int] | None = None,
    frames_key: str = "pixels",
    camera: str | None = None,
    budgets: np.ndarray | None = None,
    change_method: str = "diff",
) -> list[np.ndarray]:
    """Progress labels float32 [T+1] for every trajectory of a dataset ("procedure" or "time").

    For "procedure", budgets (duration shares, unless given) and the typical change per stage come
    from the successful episodes among ``trajs``; ``n_stages`` defaults to ``len(budgets)`` or the
    highest stage seen + 1 (pass the task's stage count when some stage may be missing; a mapping
    gives it per task). A task with no successful episode but a known stage count gets uniform
    budgets (its failures are labelled by the stages they reached); without either it is an error.

    A ReWiND episode (``metadata["synthetic"] == "rewind"``, from ``rewind``) is labelled the way
    ReWiND does it: the forward part obs[0..split] by the procedure rules as an unfinished episode,
    and each rewound frame gets the label of the forward frame it shows, so the labels retrace
    their way down. (``procedure_labels`` on the raw rewound sequence would only drop where the
    stage drops, since visual change has no direction.) Time labels stay naive for every episode.

    Trajectories of several tasks (``Trajectory.task``) are labelled task by task: stage counts,
    budgets and typical change are per task (a Reach episode has one stage, a PickPlace one five).
    """
    trajs = list(trajs)
    if method == "time":
        return [time_labels(t.length + 1, bool(t.success)) for t in trajs]
    if method != "procedure":
        raise ValueError(f"label method must be 'procedure' or 'time', got {method!r}")
    if not trajs:
        return []
    tasks = list(dict.fromkeys(t.task for t in trajs))
    if len(tasks) > 1:
        labels_by_index: dict[int, np.ndarray] = {}
        for task in tasks:
            members = [i for i, t in enumerate(trajs) if t.task == task]
            group = label_trajectories(
                [trajs[i] for i in members],
                method,
                n_stages,
                frames_key,
                camera,
                budgets,
                change_method,
            )
            labels_by_index.update(zip(members, group, strict=True))
        return [labels_by_index[i] for i in range(len(trajs))]

    if isinstance(n_stages, Mapping):
        n_stages = n_stages.get(tasks[0])
    successful = [index for index, t in enumerate(trajs) if t.success]
    if budgets is None and not successful:
        if n_stages is None:
            raise ValueError(
                "procedure labels need at least one successful trajectory to set the stage "
                f"budgets (none of the {len(trajs)} {tasks[0] or 'unnamed-task'} trajectories "
                "succeeded); pass the task's stage count (n_stages=) or budgets= to label "
                "failures alone"
            )
        budgets = stage_budgets([], n_stages, method="uniform")
    stages = [observation_stages(t) for t in trajs]
    if n_stages is None:
        n_stages = len(budgets) if budgets is not None else max(int(s.max()) for s in stages) + 1
    if budgets is None:
        budgets = stage_budgets([stages[i] for i in successful], n_stages)
    budgets = np.asarray(budgets, dtype=np.float64)
    if budgets.shape != (n_stages,):
        raise ValueError(f"budgets has shape {budgets.shape} but n_stages = {n_stages}")

    changes = [
        visual_change(trajectory_frames(t, frames_key, camera), change_method) for t in trajs
    ]
    typical = None
    if successful:
        typical = median_stage_change(
            [stages[i] for i in successful], [changes[i] for i in successful], n_stages
        )
    labels = []
    for s, c, t in zip(stages, changes, trajs, strict=True):
        if t.metadata.get("synthetic") == "rewind":
            split = int(t.metadata["rewind_split"])
            forward = procedure_labels(s[: split + 1], c[: split + 1], False, budgets, typical)
            labels.append(forward[rewind_order(split, rewind_steps=len(s) - 1 - split)])
        else:
            labels.append(procedure_labels(s, c, bool(t.success), budgets, typical))
    return labels
