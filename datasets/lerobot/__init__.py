"""LeRobot dataset v3.0 on disk: write ``Trajectory`` objects into it and read them back exactly.

Layout (LeRobot v3.0)::

    meta/info.json            codebase_version "v3.0", fps, features, totals, path patterns
    meta/stats.json           {feature: {min, max, mean, std, count, q01, q10, q50, q90, q99}}
    meta/tasks.parquet        one row per instruction: column ``task`` (the pandas index) and
                              ``task_index``
    meta/episodes/chunk-XXX/file-YYY.parquet   one row per episode (where its frames live, stats)
    data/chunk-XXX/file-YYY.parquet            the per-frame columns of many episodes
    videos/<key>/chunk-XXX/file-YYY.mp4        the images of many episodes, one after another

Trajectory -> frames. An episode of T steps becomes T+1 frames, one per observation:

- LeRobot's columns ``timestamp`` (float32, frame_index / fps), ``frame_index``,
  ``episode_index``, ``index`` (global) and ``task_index`` (the instruction's row in tasks).
- ``observations["agent_pos"]`` -> ``observation.state``; ``observations["pixels"]`` -> video
  ``observation.image`` (one camera) or ``observation.images.<camera>`` (a dict of cameras); any
  other observation key k -> ``observation.<k>`` (nested keys joined with ".").
- ``action`` holds a_t; the last frame (the final observation) repeats a_{T-1}, and
  ``has_action`` is False only there (datasets written before hold ``action_is_pad``, its
  negation, and zeros: both are read). ``next.reward``, ``next.done`` (terminated or truncated),
  ``next.terminated`` and ``next.truncated`` hold the step's outcome (0 / False on the last
  frame).
- ``info[k][t]`` describes the observation after step t, so it goes to frame t+1. Frame 0 takes
  ``metadata["reset_info"][k]`` (what the rollout records) when it is there with the right
  shape; otherwise frame 0 repeats frame 1's value. Info keys keep their names, except that
  ``progress`` becomes ``progress.privileged`` (labellers write ``progress.label``).
- ``policy_outputs[k]`` -> ``decision.<k>``: decision j's output on frame ``decision_steps[j]``,
  zeros elsewhere, with ``decision_mask`` True on those frames (written only for trajectories
  that carry decisions).
- Episode rows also hold ``success``, ``seed`` (-1 for None, so seeds must be >= 0), ``suite``,
  ``task_name`` (``Trajectory.task``) and ``metadata`` (``Trajectory.metadata`` as JSON).

Every feature that came from a Trajectory field names it in ``info.json`` as
``"trajectory_field"`` (the ``Trajectory.to_dict`` key, e.g. ``"info/stage"``), which is how the
reader rebuilds the Trajectory. The exact per-frame shape of a column is its parquet type
(a scalar column, or nested fixed-size lists); ``info.json`` writes LeRobot's ``[1]`` for scalars.
Images are encoded at their exact size (odd sizes need ``yuv444p`` or lossless), and statistics
are computed as LeRobot computes them (``stats``), so LeRobot reads these datasets and appends
to them.

Datasets LeRobot wrote are read too: image features (PNG structs), variable-size list columns
(its 2-D features), episodes without the writer's ``success`` / ``seed`` / ... columns, and
features without ``trajectory_field``, mapped to Trajectory fields by LeRobot's names.

Crash safety. The writer commits finished episodes as NEW files (a data file, a video file per
camera, an episodes file), then ``meta/tasks.parquet``, ``meta/stats.json`` and
``meta/info.json`` last, each atomically; a commit comes within ``COMMIT_INTERVAL_S`` (2 s) of an
episode finishing (every episode, when episodes take longer than that). ``info.json`` is the
commit point: episodes files that hold only episodes beyond its ``total_episodes`` are leftovers
of an interrupted write and are ignored (``validate_dataset`` warns about them, about temporary
files and about unreferenced files). Files holding earlier episodes are never modified, so a
writer killed at any moment leaves a valid dataset with every episode committed before the kill,
and ``LeRobotDatasetWriter.open`` deletes the leftovers before appending. Ctrl-C is held back
while an episode is buffered or committed, so an interrupted writer commits every finished
episode. Parquet pages carry checksums and episode rows the sha256 of their video files
(``videos/<key>/sha256``): reading damaged data is an error naming the file.

One writer at a time: writers hold an ``flock`` on ``<root>/.embodied.lock`` (the kernel drops it
when the process dies); a second one raises ``DatasetBusyError`` naming the holder's pid.

Errors. Anything wrong on disk is a ``DatasetError`` (a ValueError) whose one-line message starts
with the file at fault; ``validate_dataset`` also reads every data column and decodes every video
frame (``quick=True``: headers only), checking decoded sizes against ``info.json``.

Modules, lowest first: ``layout`` (constants, paths, DatasetError), ``frames`` (Trajectory <->
per-frame columns), ``arrow`` (numpy <-> arrow), ``files`` (parquet/JSON I/O), ``stats``,
``videos`` (mp4 encode/decode), ``lock`` (the writer lock, Ctrl-C held back), ``file_checks``
(data and video files against the metadata), ``metadata`` (loading and checking it),
``validate``, ``add_feature``, ``recovery`` (picking up a dataset a writer left), ``writer``,
``reader``, ``prepared`` (episodes made ready for a writer elsewhere), ``summary``.
"""

from embodied.datasets.lerobot.layout import CODEBASE_VERSION, DatasetBusyError, DatasetError
from embodied.datasets.lerobot.prepared import EpisodeSettings, PreparedEpisode, prepare_episode
from embodied.datasets.lerobot.reader import LeRobotDataset
from embodied.datasets.lerobot.summary import dataset_summary
from embodied.datasets.lerobot.validate import validate_dataset
from embodied.datasets.lerobot.writer import LeRobotDatasetWriter

__all__ = [
    "CODEBASE_VERSION",
    "DatasetBusyError",
    "DatasetError",
    "LeRobotDataset",
    "LeRobotDatasetWriter",
    "EpisodeSettings",
    "PreparedEpisode",
    "dataset_summary",
    "prepare_episode",
    "validate_dataset",
]
