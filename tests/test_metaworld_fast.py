"""What makes Meta-World fast (``speed_up_rendering``, ``embodied.sims.meshes``,
``vectorize_contact_test``): the same physics and Meta-World numbers, nearly the same images. The
Meta-World tests are skipped without Meta-World."""

from __future__ import annotations

import importlib.util

import mujoco
import numpy as np
import pytest

import embodied.sims as sims
from embodied.sims.meshes import pixel_footprint, simplify_meshes

needs_metaworld = pytest.mark.skipif(
    importlib.util.find_spec("metaworld") is None, reason="Meta-World is not installed"
)


def sphere_model(radius: float = 0.05, rings: int = 24) -> mujoco.MjModel:
    """A model with one finely tessellated sphere mesh (a UV sphere) and a camera."""
    angles = np.linspace(0, np.pi, rings + 1)[1:-1]
    turns = np.linspace(0, 2 * np.pi, 2 * rings, endpoint=False)
    ring = [
        (np.sin(a) * np.cos(t), np.sin(a) * np.sin(t), np.cos(a)) for a in angles for t in turns
    ]
    verts = radius * np.array([(0, 0, 1), *ring, (0, 0, -1)])
    n, faces = 2 * rings, []
    last = 1 + (rings - 2) * n  # first vertex of the lowest ring
    for j in range(n):  # the two caps
        faces += [(0, 1 + j, 1 + (j + 1) % n), (len(verts) - 1, last + (j + 1) % n, last + j)]
    for i in range(rings - 2):
        for j in range(n):
            a, b = 1 + i * n + j, 1 + i * n + (j + 1) % n
            faces += [(a, a + n, b), (b, a + n, b + n)]
    vertex = " ".join(f"{v:.6f}" for v in verts.ravel())
    face = " ".join(str(i) for f in faces for i in f)
    return mujoco.MjModel.from_xml_string(f"""
<mujoco>
  <asset><mesh name="ball" vertex="{vertex}" face="{face}"/></asset>
  <worldbody>
    <light pos="0 0 1"/>
    <camera name="eye" pos="0 -0.3 0" xyaxes="1 0 0 0 0 1"/>
    <geom type="mesh" mesh="ball" rgba="0.8 0.2 0.2 1"/>
  </worldbody>
</mujoco>""")


def test_simplify_meshes_merges_faces_and_keeps_the_vertices() -> None:
    model = sphere_model()
    verts, faces = model.mesh_vert.copy(), int(model.mesh_facenum[0])
    assert simplify_meshes(model, 0.0) == (faces, faces)  # no cell: untouched
    before, after = simplify_meshes(model, 0.01)
    assert before == faces and 0 < after < faces // 2
    np.testing.assert_array_equal(model.mesh_vert, verts)  # what the physics reads
    kept = model.mesh_face[: model.mesh_facenum[0]]
    assert (kept[:, 0] != kept[:, 1]).all() and (kept[:, 1] != kept[:, 2]).all()
    assert (kept[:, 0] != kept[:, 2]).all() and kept.max() < model.mesh_vertnum[0]
    with pytest.raises(ValueError, match="cell must be a finite length in metres, got nan"):
        simplify_meshes(model, float("nan"))


def test_pixel_footprint_is_the_width_a_pixel_spans() -> None:
    model = sphere_model()  # fovy 45 degrees
    footprint = pixel_footprint(model, 0, distance=1.0, height=100)
    assert footprint == pytest.approx(2 * np.tan(np.radians(22.5)) / 100)


def _expert_states(task: str, seed: int, steps: int) -> list[np.ndarray]:
    """Full physics states along an expert episode (every 10th step)."""
    env = sims.make(f"metaworld/{task}", obs_mode="state")
    inner, expert = env.unwrapped, sims.make_expert(env)
    kind = mujoco.mjtState.mjSTATE_FULLPHYSICS
    obs, _ = env.reset(seed=seed)
    states = []
    for step in range(steps):
        if step % 10 == 0:
            state = np.empty(mujoco.mj_stateSize(inner.model, kind))
            mujoco.mj_getState(inner.model, inner.data, state, kind)
            states.append(state)
        obs, *_ = env.step(expert(obs))
    env.close()
    return states


@needs_metaworld
@pytest.mark.parametrize("task", ["pick-place-v3", "door-open-v3"])
def test_fast_images_are_close_to_the_full_meshes_with_reflections(
    task: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same states rendered at 64 px by the fast renderer and by the renderer as it was
    (whole meshes, mirror reflections). Tolerance: over expert episodes of pick-place, door-open
    and peg-insert-side the corner2 images differed by 0.81 grey levels on average and 0.56% of
    pixels by more than 32 levels (arm edges moved by a pixel), about what one expert step
    changes (0.71 on average); the bound leaves room for other states."""
    from embodied.sims import metaworld as mw

    fast = sims.make(f"metaworld/{task}", image_size=64)
    with monkeypatch.context() as patch:
        patch.setattr(mw, "speed_up_rendering", lambda *args, **kwargs: 0.0)
        full = sims.make(f"metaworld/{task}", image_size=64)
    assert fast.unwrapped.mesh_cell > 0 and full.unwrapped.mesh_cell == 0
    for env in (fast, full):
        env.reset(seed=0)  # places the task's fixtures (model-level) as in the recorded episode
    kind = mujoco.mjtState.mjSTATE_FULLPHYSICS
    for state in _expert_states(task, seed=0, steps=60):
        images = []
        for env in (fast, full):
            inner = env.unwrapped
            mujoco.mj_setState(inner.model, inner.data, state, kind)
            mujoco.mj_forward(inner.model, inner.data)
            images.append(inner._render("corner2"))
        assert images[0].shape == images[1].shape == (64, 64, 3) and images[0].dtype == np.uint8
        diff = np.abs(images[0].astype(int) - images[1].astype(int)).max(axis=-1)
        assert diff.mean() < 1.5 and (diff > 32).mean() < 0.02, (diff.mean(), (diff > 32).mean())
    fast.close()
    full.close()


@needs_metaworld
def test_the_adapter_keeps_meta_worlds_own_episode() -> None:
    """Simplified render meshes, the stage evaluation at reset and the vectorized contact test
    leave Meta-World's episode (observations, rewards, grasp flags) as its own env runs it, for
    the same goal and actions."""
    import metaworld

    from embodied.sims.metaworld import mt1_goals

    task = "pick-place-v3"
    env = sims.make(f"metaworld/{task}", obs_mode="state", image_size=64)
    own = metaworld.ALL_V3_ENVIRONMENTS[task]()
    own.set_task(mt1_goals(task, 0)[3])
    expected, _ = own.reset()
    obs, _ = env.reset(seed=3)
    expert = sims.make_expert(env)
    np.testing.assert_array_equal(obs["environment_state"], expected.astype(np.float32))
    grasped = 0
    for _ in range(60):
        action = expert(obs)
        obs, reward, _, _, info = env.step(action)
        expected, own_reward, _, _, own_info = own.step(action)
        np.testing.assert_array_equal(obs["environment_state"], expected.astype(np.float32))
        assert reward == own_reward and info["grasp_success"] == own_info["grasp_success"]
        grasped += own_info["grasp_success"]
    assert grasped > 10  # the expert lifted the puck: the contact test was exercised
    env.close()
    own.close()


@needs_metaworld
def test_meshes_stay_whole_for_cameras_on_the_robot_and_for_slow_render() -> None:
    corner = sims.make("metaworld/reach-v3", image_size=64, cameras=["corner2"]).unwrapped
    wrist = sims.make("metaworld/reach-v3", image_size=64, cameras=["corner2", "gripperPOV"])
    pretty = sims.make("metaworld/reach-v3", image_size=64, fast_render=False).unwrapped
    assert corner.mesh_cell > 0 and corner.model.mesh_facenum.sum() < 30_000
    assert wrist.unwrapped.mesh_cell == 0 and pretty.mesh_cell == 0
    whole = pretty.model.mesh_facenum.sum()
    assert wrist.unwrapped.model.mesh_facenum.sum() == whole > 60_000
    assert (corner.model.mat_reflectance == 0).all() and pretty.model.mat_reflectance.max() > 0
    assert wrist.reset(seed=0)[0]["pixels"]["gripperPOV"].shape == (64, 64, 3)
    for env in (corner, wrist, pretty):
        env.close()


@needs_metaworld
@pytest.mark.parametrize("task", ["push-v3", "pick-place-v3"])
def test_vectorized_contact_test_answers_as_meta_worlds_own(task: str) -> None:
    env = sims.make(f"metaworld/{task}", obs_mode="state")
    inner, expert = env.unwrapped._env, sims.make_expert(env)
    touching = 0
    for seed in (0, 1):
        obs, _ = env.reset(seed=seed)
        for _ in range(70):
            obs, *_ = env.step(expert(obs))
            geom = inner._get_id_main_object()
            own = type(inner).touching_object(inner, geom)  # Meta-World's method
            assert inner.touching_object(geom) == own
            touching += own
    assert touching > 10
    env.close()
