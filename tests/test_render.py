"""The shared offscreen renderer (``embodied.sims.render``)."""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys

import pytest

SCRIPT = """
import weakref
weakref.finalize(weakref, print)  # a finalizer before any GL context, as importing torch makes
import embodied.sims as sims
envs = [sims.make("Reach", image_size=16) for _ in range(2)]
for env in envs:
    env.reset(seed=0)  # renders: each env holds a GL context, and none is closed
print("done")
"""


def test_open_renderers_are_released_cleanly_at_exit() -> None:
    """Envs left open at exit free their GL contexts before EGL is torn down (no EGL errors)."""
    env = {**os.environ, "MUJOCO_GL": "egl"}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr
    assert "Error" not in result.stderr, result.stderr


def test_replayed_frames_are_the_frames_the_rollout_showed() -> None:
    """A rollout that records render states instead of images re-renders any of its frames
    later, pixel for pixel, and only the ones read."""
    import numpy as np

    import embodied.sims as sims
    from embodied.rollout.episodes import rollout_vector

    kwargs = {"obs_mode": "pixels_state", "image_size": 32, "render_state": True}
    vec = sims.make_vec_env("DrawerOpen", 2, autoreset_mode="disabled", **kwargs)
    try:
        expert = lambda obs: np.stack(vec.call("scripted_action"))  # noqa: E731
        trajs = list(rollout_vector(vec, expert, [4, 5, 6], "tabletop"))
    finally:
        vec.close()
    sims.attach_replay_frames(trajs, "DrawerOpen", kwargs)
    for traj in trajs:
        shown = traj.observations["pixels"]
        assert isinstance(traj.frames, sims.ReplayFrames) and len(traj.frames) == len(shown)
        replayed = traj.frames[np.arange(len(shown))]
        assert replayed.dtype == np.uint8 and traj.frames.shape == shown.shape
        np.testing.assert_array_equal(replayed, shown)
        np.testing.assert_array_equal(traj.frames[len(shown) // 2], shown[len(shown) // 2])


def _two_camera_rollouts() -> tuple[object, dict[bool, list]]:
    """A two-camera planner reading 2 observations per 4-step chunk, rolled out on DrawerOpen
    rendering every step (``False``) and only the images it reads (``True``), same seeds."""
    import numpy as np
    import torch

    import embodied.sims as sims
    from embodied.policies import make_policy
    from embodied.rollout.episodes import PolicyActor, rollout_vector

    torch.manual_seed(0)
    policy = make_policy(
        "diffusion", state_dim=4, action_dim=4, image_size=16, n_obs_steps=2, horizon=8,
        image_keys=["observation.images.front", "observation.images.wrist"], n_action_steps=4,
        down_dims=[8, 16], vision_channels=[4, 8], num_keypoints=4, num_inference_steps=2,
    )  # fmt: skip
    stats = {"mean": np.zeros(4), "std": np.ones(4)}
    policy.fit_normalizers({"observation.state": stats, "action": {"min": -np.ones(4),
                            "max": np.ones(4)}}).eval()  # fmt: skip
    kwargs = {"obs_mode": "pixels", "image_size": 16, "cameras": ["front", "wrist"],
              "render_state": True, "max_episode_steps": 10}  # fmt: skip
    assert sims.skips_unread_images(kwargs)
    runs = {}
    for skip in (False, True):
        vec = sims.make_vec_env("DrawerOpen", 2, autoreset_mode="disabled", **kwargs)
        try:
            actor = PolicyActor(policy, 2, deterministic=False, seed=1, record=True)
            trajs = list(rollout_vector(vec, actor, [4, 5, 6], skip_unread_images=skip))
        finally:
            vec.close()
        trajs = sorted(trajs, key=lambda t: t.seed)
        sims.attach_replay_frames(trajs, "DrawerOpen", kwargs)
        runs[skip] = trajs
    return policy, runs


def test_a_camera_policy_rollout_renders_only_the_images_its_policy_reads() -> None:
    """``skip_unread_images``: the same episodes, actions and decision windows as rendering every
    step; the skipped images are black and listed, the reward model's frames (any camera) come
    back replayed pixel for pixel, and a window over a black image is refused."""
    import numpy as np

    from embodied.core.reward import camera_frames
    from embodied.rollout.episodes import decision_windows

    policy, runs = _two_camera_rollouts()
    for full, lazy in zip(runs[False], runs[True], strict=True):
        np.testing.assert_array_equal(full.actions, lazy.actions)
        skipped = lazy.metadata["unrendered"]
        read = np.unique(np.asarray(lazy.decision_steps)[:, None] + [-1, 0])
        assert "unrendered" not in full.metadata and skipped and not set(skipped) & set(read)
        for camera in ("front", "wrist"):
            images = full.observations["pixels"][camera]
            assert not lazy.observations["pixels"][camera][skipped].any()
            kept = np.setdiff1d(np.arange(len(images)), skipped)
            np.testing.assert_array_equal(lazy.observations["pixels"][camera][kept], images[kept])
            frames = camera_frames(lazy, f"observation.images.{camera}")
            np.testing.assert_array_equal(frames[np.arange(len(images))], images)
        for key, window in decision_windows(full, policy.observation_spec).items():
            np.testing.assert_array_equal(decision_windows(lazy, policy.observation_spec)[key],
                                          window)  # fmt: skip
    lazy.metadata["unrendered"].append(int(lazy.decision_steps[0]))
    with pytest.raises(ValueError, match="whose camera images the rollout did not render"):
        decision_windows(lazy, policy.observation_spec)


def test_a_slice_or_rewind_of_a_skipped_rollout_scores_the_images_it_shows() -> None:
    """Slicing or rewinding a rollout that left unread images black renumbers them and keeps
    its replayable frames, so a reward model scores exactly what the full rendering showed (the
    black images and frames used to keep the whole episode's numbering, or be dropped)."""
    import numpy as np

    from embodied.core.reward import camera_frames
    from embodied.rewards.rewind import rewind, rewind_order

    _, runs = _two_camera_rollouts()
    for full, lazy in zip(runs[False], runs[True], strict=True):
        skipped = lazy.metadata["unrendered"]
        for part, shown in ((lazy.slice(3, 8), np.arange(3, 9)),
                            (rewind(lazy, 6), rewind_order(6))):  # fmt: skip
            black = [j for j, i in enumerate(shown) if i in skipped]
            assert part.metadata.get("unrendered", []) == black and len(part.frames) == len(shown)
            for camera in ("front", "wrist"):
                images = full.observations["pixels"][camera][shown]
                assert not part.observations["pixels"][camera][black].any()
                frames = camera_frames(part, f"observation.images.{camera}")
                np.testing.assert_array_equal(frames[np.arange(len(shown))], images)


def test_renderers_share_one_context_and_draw_what_mujoco_renderer_draws() -> None:
    """Envs in one process draw in one GL context (a fresh one costs ~0.15 s with software
    OpenGL, a switch ~5 ms a frame), envs whose models have the same assets (the tabletop tasks
    share one scene's) with one MuJoCo render context (its meshes, textures and framebuffer: ~36
    MB a Meta-World env), and every frame is MuJoCo's own
    ``Renderer``'s, pixel for pixel, whichever env drew last; the last env closed frees it."""
    import mujoco
    import numpy as np

    import embodied.sims as sims
    from embodied.sims import render

    def asset_contexts() -> dict[int, int]:  # this process's render contexts: users of each
        return {id(c): users for k, (c, users) in render._ASSETS.items() if k[0] == os.getpid()}

    gc.collect()  # earlier tests' envs that nothing holds: closed now, not during this test
    before = asset_contexts()
    tasks = ("DrawerOpen", "Reach", "DrawerOpen", "DrawerOpen")
    # the last one renders with MuJoCo's default quality: other assets, its own context
    envs = [sims.make(t, image_size=32, fast_render=i < 3) for i, t in enumerate(tasks)]
    try:
        shown = [env.reset(seed=i)[0]["pixels"] for i, env in enumerate(envs)]
        mine = [k for k in render._CONTEXTS if k[0] == os.getpid()]
        assert len(mine) == 1
        contexts = [id(env.unwrapped._renderer._context) for env in envs]
        assert contexts[0] == contexts[1] == contexts[2] != contexts[3]
        added = {c: n - before.get(c, 0) for c, n in asset_contexts().items()}  # earlier tests'
        assert added[contexts[0]] == 3 and added[contexts[3]] == 1  # envs may hold some too
        for env, image in zip(envs, shown, strict=True):
            base = env.unwrapped
            with mujoco.Renderer(base.model, 32, 32) as reference:
                reference.update_scene(base.data, base.cameras[0])
                np.testing.assert_array_equal(image, reference.render())
            # drawn again after another env drew with the same or another context: the same frame
            np.testing.assert_array_equal(base.render(), image)
        assert not np.array_equal(shown[0], shown[1])  # another task, another scene
        assert not np.array_equal(shown[0], shown[2])  # the same model, another state
        envs[0].close()  # the others still draw with it
        np.testing.assert_array_equal(envs[2].unwrapped.render(), shown[2])
    finally:
        for env in envs:
            env.close()
    assert asset_contexts() == before


def test_an_unknown_camera_is_named() -> None:
    import embodied.sims as sims

    env = sims.make("Reach", image_size=16)
    try:
        env.reset(seed=0)
        base = env.unwrapped
        with pytest.raises(ValueError, match=r"camera 'no_such_camera' is not in the model; it "
                           r"has \['front', 'wrist'\]"):  # fmt: skip
            base._renderer.render(base.data, "no_such_camera")
    finally:
        env.close()


def test_a_scene_that_fills_grows_and_drops_no_geom() -> None:
    """A scene too small for the model grows on the frame that fills it: the frame is still
    mujoco.Renderer's, every geom drawn."""
    import mujoco
    import numpy as np

    import embodied.sims as sims

    env = sims.make("PickPlace", image_size=32)
    try:
        base = env.unwrapped
        env.reset(seed=0)
        renderer = base._renderer
        renderer._scene = mujoco.MjvScene(base.model, maxgeom=2)  # far fewer than drawn
        image = renderer.render(base.data, base.cameras[0])
        assert renderer._scene.maxgeom > renderer._scene.ngeom > 2
        with mujoco.Renderer(base.model, 32, 32) as reference:
            reference.update_scene(base.data, base.cameras[0])
            np.testing.assert_array_equal(image, reference.render())
    finally:
        env.close()


ROTATED_AND_UPRIGHT = {"cameras": ["corner", "topview", "gripperPOV"]}


@pytest.mark.parametrize(
    ("task", "kwargs"),
    [
        ("Reach", {}),
        pytest.param(
            "metaworld/reach-v3",
            ROTATED_AND_UPRIGHT,
            marks=pytest.mark.skipif(
                importlib.util.find_spec("metaworld") is None, reason="Meta-World is not installed"
            ),
        ),
    ],
)
def test_observation_images_are_contiguous_arrays_torch_takes_as_they_are(
    task: str, kwargs: dict
) -> None:
    """Every camera's image (Meta-World's upright and rotated cameras too) and ``render()`` are
    C-contiguous arrays: ``torch.from_numpy`` refuses a flipped (negative-stride) view."""
    import torch

    import embodied.sims as sims

    env = sims.make(task, obs_mode="pixels", image_size=16, **kwargs)
    try:
        pixels = env.reset(seed=0)[0]["pixels"]
        images = dict(pixels) if isinstance(pixels, dict) else {"pixels": pixels}
        images["render()"] = env.render()
        for name, image in images.items():
            assert image.flags["C_CONTIGUOUS"], f"{task} {name}: strides {image.strides}"
            assert torch.from_numpy(image).shape == image.shape
    finally:
        env.close()
