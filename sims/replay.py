"""Camera images of a finished episode, rendered only when read.

A rollout run with ``render_state=True`` (tabletop and Meta-World tasks) records the kinematic
state each step's images would show instead of rendering them. ``ReplayFrames`` stands in for the
episode's ``[T+1, H, W, 3]`` images: indexing it renders just those steps, exactly as the rollout
would have (a progress model reads 8 frames of a 100-step episode; rendering is most of a CPU
rollout's cost). It holds only the task, the env options, the seed and the states, so it pickles
(Ray); each process renders with one replay env per task and options, reset to the episode's seed
(the layout and colours come from the seed, the states from the recording).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embodied.sims.registry import make, suite_of

_replay_envs: dict[tuple[str, str], Any] = {}  # (task, options) -> [env, seed it was reset to]


def supports_render_state(task: str) -> bool:
    """Whether ``task``'s env can record render states and skip camera images on request
    (``render_images``): the tabletop suite and Meta-World."""
    return suite_of(task) in ("tabletop", "metaworld")


def skips_unread_images(env_kwargs: dict[str, Any]) -> bool:
    """Whether a rollout on an env built with ``env_kwargs`` may leave the camera images no
    policy reads unrendered (``rollout_vector(skip_unread_images=True)``): a camera env that
    records render states, so any frame can be replayed when read."""
    return bool(env_kwargs.get("render_state")) and env_kwargs.get("obs_mode") != "state"


def attach_replay_frames(trajectories: list[Any], task: str, env_kwargs: dict[str, Any]) -> None:
    """Give each trajectory rolled out with ``render_state=True`` and no captured ``frames`` a
    ``ReplayFrames`` of its recorded states (reset with its seed alone)."""
    if not env_kwargs.get("render_state"):
        return
    for traj in trajectories:
        if traj.frames is not None:  # captured for a video already
            continue
        first = traj.metadata["reset_info"]["render_state"]
        states = np.concatenate([np.asarray(first)[None], traj.info["render_state"]])
        traj.frames = ReplayFrames(task, env_kwargs, traj.seed, states)


class ReplayFrames:
    """One camera's images of one episode (by default the env's first camera), rendered from its
    recorded render states when indexed (an int gives ``[H, W, 3]``, a slice or index array
    ``[*index.shape, H, W, 3]``)."""

    def __init__(
        self,
        task: str,
        env_kwargs: dict[str, Any],
        seed: int | None,
        states: np.ndarray,
        camera: str | None = None,
    ) -> None:
        """``env_kwargs``: options of the env that renders (its cameras and image size);
        ``states``: ``[T+1, S]`` render states, the reset's first."""
        if seed is None:
            raise ValueError("replaying an episode needs the seed it was reset with")
        self.task, self.env_kwargs, self.seed = task, dict(env_kwargs), int(seed)
        self.states = np.asarray(states, dtype=np.float64)
        self.camera = camera
        # Imported here: importing embodied.sims must not load MuJoCo (conventions does).
        from embodied.sims.conventions import image_shape
        from embodied.sims.tabletop import DEFAULT_IMAGE_SIZE

        height, width = image_shape(self.env_kwargs.get("image_size", DEFAULT_IMAGE_SIZE))
        self.shape = (len(self.states), height, width, 3)
        self.dtype = np.dtype(np.uint8)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: Any) -> np.ndarray:
        picks = np.arange(len(self))[index]
        env = self._env()
        images = [env.render_state_image(self.states[i], self.camera) for i in np.ravel(picks)]
        if np.ndim(picks) == 0:
            return images[0]
        if not images:
            return np.empty((*np.shape(picks), *self.shape[1:]), dtype=self.dtype)
        return np.stack(images).reshape(*np.shape(picks), *self.shape[1:])

    def take(self, indices: Any, axis: int = 0) -> ReplayFrames:
        """The frames at ``indices`` (as ``numpy.take`` along steps), still unrendered."""
        if axis != 0:
            raise ValueError(f"ReplayFrames.take works along the steps (axis 0), got axis={axis}")
        states = self.states[np.asarray(indices, dtype=np.int64)]
        return ReplayFrames(self.task, self.env_kwargs, self.seed, states, self.camera)

    def for_camera(self, camera: str | None) -> ReplayFrames:
        """The same episode seen by ``camera`` (None: the env's first camera)."""
        return ReplayFrames(self.task, self.env_kwargs, self.seed, self.states, camera)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """Every frame (renders them all)."""
        frames = self[:]
        return frames if dtype is None else frames.astype(dtype)

    def _env(self) -> Any:
        """This process's replay env for the task and options, reset to the episode's seed."""
        key = (self.task, repr(sorted(self.env_kwargs.items())))
        if key not in _replay_envs:
            kwargs = {**self.env_kwargs, "obs_mode": "state", "render_state": False}
            _replay_envs[key] = [make(self.task, **kwargs), None]
        entry = _replay_envs[key]
        if entry[1] != self.seed:
            entry[0].reset(seed=self.seed)
            entry[1] = self.seed
        return entry[0].unwrapped
