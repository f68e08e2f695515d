"""Tests for the Meta-World adapter (``embodied.sims.metaworld``); skipped without Meta-World."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("metaworld")

from gymnasium.error import ResetNeeded  # noqa: E402
from gymnasium.utils.env_checker import check_env  # noqa: E402

import embodied.sims as sims  # noqa: E402
from embodied.sims import metaworld as mw  # noqa: E402


def make(task: str = "reach-v3", **kwargs):
    return sims.make(f"metaworld/{task}", **kwargs)


def rollout(env, seed: int, actions: np.ndarray) -> list[np.ndarray]:
    """Raw states after reset and after each action."""
    obs, _ = env.reset(seed=seed)
    states = [obs["environment_state"]]
    for action in actions:
        obs, *_ = env.step(action)
        states.append(obs["environment_state"])
    return states


def test_check_env_passes() -> None:
    env = make(image_size=32)
    check_env(env.unwrapped)
    env.close()


def test_seed_reproduces_initial_state_and_episode() -> None:
    env = make("pick-place-v3", obs_mode="state")
    actions = np.random.default_rng(0).uniform(-1, 1, size=(20, 4)).astype(np.float32)
    first = rollout(env, seed=7, actions=actions)
    again = rollout(env, seed=7, actions=actions)  # after a different history
    other_env = make("pick-place-v3", obs_mode="state")
    fresh = rollout(other_env, seed=7, actions=actions)
    for a, b, c in zip(first, again, fresh, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)

    # Object (4:7) and goal (36:39) positions differ across seeds, also past the first 50 goals.
    starts = [env.reset(seed=s)[0]["environment_state"] for s in (7, 8, 57)]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not np.allclose(starts[i][36:39], starts[j][36:39])
            assert not np.allclose(starts[i][4:7], starts[j][4:7])
    env.close()
    other_env.close()


@pytest.mark.parametrize("task", ["reach-v3", "push-v3", "pick-place-v3"])
def test_metaworld_scripted_expert_succeeds(task: str) -> None:
    env = make(task, obs_mode="state")
    expert = sims.make_expert(env)
    successes = 0
    for seed in range(10):
        obs, info = env.reset(seed=seed)
        truncated = False
        while not (info["success"] or truncated):
            obs, _, _, truncated, info = env.step(expert(obs))
        successes += info["success"]
    assert successes >= 9, f"{task}: scripted expert solved {successes}/10"
    env.close()


def test_observation_and_info_contents() -> None:
    env = make("push-v3", obs_mode="pixels_state", image_size=32)
    obs, info = env.reset(seed=3)
    assert obs["pixels"].shape == (32, 32, 3) and obs["pixels"].dtype == np.uint8
    assert obs["agent_pos"].dtype == np.float32 and obs["agent_pos"].shape == (4,)
    assert obs["environment_state"].dtype == np.float32 and obs["environment_state"].shape == (39,)
    np.testing.assert_array_equal(obs["agent_pos"], obs["environment_state"][:4])
    assert info["success"] is False and info["stage"] == 0 and info["stage_name"] == "approach"
    assert info["instruction"] == env.unwrapped.instruction == "push the puck to the goal"
    assert info["task"] == "push-v3"

    obs, reward, terminated, truncated, info = env.step(np.zeros(4, dtype=np.float32))
    assert isinstance(reward, float) and not terminated and not truncated
    assert isinstance(info["success"], bool)
    assert info["ee_pos"].dtype == np.float32
    np.testing.assert_array_equal(info["ee_pos"], obs["agent_pos"][:3])
    assert isinstance(info["obj_to_target"], float)  # Meta-World's own numbers pass through
    assert "error" not in info
    env.close()


def test_instructions_for_known_and_other_tasks() -> None:
    assert mw.task_instruction("pick-place-v3") == "pick up the puck and place it at the goal"
    assert mw.task_instruction("door-open-v3") == "open the door"
    assert mw.task_instruction("peg-insert-side-v3") == "insert the peg into the hole from the side"
    assert mw.task_instruction("stick-pull-v3") == "stick pull"  # built from the name


def test_bad_actions_raise() -> None:
    env = make(obs_mode="state")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"shape \(4,\).*got shape \(3,\)"):
        env.step(np.zeros(3))
    with pytest.raises(ValueError, match="non-finite.*nan"):
        env.step(np.array([0.0, np.nan, 0.0, 0.0]))
    with pytest.raises(ValueError, match="goal must be None"):
        env.unwrapped.scripted_action(goal={"color": "red"})
    env.close()


def test_step_before_reset_needs_a_reset() -> None:
    env = mw.MetaWorldEnv("reach-v3", obs_mode="state")
    with pytest.raises(ResetNeeded, match=r"before calling env\.reset\(\)"):
        env.step(np.zeros(4, dtype=np.float32))
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"image_size": 0}, r"image_size must be .* \[8, 4096\] pixels, got 0"),
        ({"image_size": (64, 2)}, r"image_size must be .*, got \(64, 2\)"),
        ({"cameras": "corner2"}, r"cameras must be .*'corner2'.*a list of names is needed"),
        ({"cameras": ["corner2", "corner2"]}, r"cameras must be .*repeated: \['corner2'\]"),
        ({"cameras": ["front"]}, r"cameras must be .*'topview'.*unknown: \['front'\]"),
    ],
)
def test_bad_image_size_and_cameras_are_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(**kwargs)


def test_unknown_task_lists_available_tasks() -> None:
    with pytest.raises(ValueError, match="unknown Meta-World task 'fly-v3'.*reach-v3"):
        make("fly-v3")


def test_list_tasks_includes_metaworld() -> None:
    tasks = sims.list_tasks("metaworld")
    assert "metaworld/reach-v3" in tasks and "metaworld/pick-place-v3" in tasks
    assert len(tasks) == 50 and tasks == sorted(tasks)


def test_missing_metaworld_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "metaworld", None)  # makes ``import metaworld`` fail
    with pytest.raises(ImportError, match=r"pip install 'embodied-toolkit\[metaworld\]'"):
        mw.metaworld_tasks()


def test_pixels_are_upright_and_match_render() -> None:
    env = make("pick-place-v3", image_size=64, cameras=("corner2", "topview"))
    obs, _ = env.reset(seed=0)
    image = obs["pixels"]["corner2"]
    assert set(obs["pixels"]) == {"corner2", "topview"}
    assert image.std() > 20  # a real scene, not a blank frame
    # Upright corner2 view: plain grey backdrop at the top, robot pedestal and table legs at the
    # bottom (checked by eye); Meta-World's raw corner image has them the other way round.
    top, bottom = image[:8].astype(float), image[-8:].astype(float)
    assert top.std() < 10 and bottom.std() > 30
    np.testing.assert_array_equal(env.render(), image)
    env.close()


def test_state_mode_never_renders(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("rendered in state mode")

    monkeypatch.setattr(mw.CameraRenderer, "render", fail)
    env = make(obs_mode="state")
    obs, _ = env.reset(seed=0)
    obs, *_ = env.step(np.zeros(4, dtype=np.float32))
    assert "pixels" not in obs and obs["environment_state"].shape == (39,)
    env.close()


def test_episode_limit_and_stepping_past_it() -> None:
    env = sims.make("metaworld/reach-v3", obs_mode="state", max_episode_steps=600)
    env.reset(seed=0)
    zero = np.zeros(4, dtype=np.float32)
    truncations = [env.step(zero)[3] for _ in range(600)]
    assert not any(truncations[:-1]) and truncations[-1]  # longer than Meta-World's 500
    with pytest.raises(ResetNeeded, match=r"after the episode ended \(truncated=True\)"):
        env.step(zero)
    assert env.unwrapped.max_episode_steps == 600
    assert mw.MetaWorldEnv("reach-v3", obs_mode="state").max_episode_steps == 500
    env.close()


def test_physics_blow_up_truncates_with_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # MuJoCo appends its warning to ./MUJOCO_LOG.TXT
    env = make(obs_mode="state")
    env.reset(seed=0)
    env.unwrapped.data.qvel[:] = 1e12  # MuJoCo resets the state and warns on the next step
    _, reward, terminated, truncated, info = env.step(np.zeros(4, dtype=np.float32))
    assert truncated and not terminated and reward == 0.0 and not info["success"]
    assert "physics instability" in info["error"]
    obs, info = env.reset(seed=0)  # the env recovers on reset
    assert "error" not in info and np.isfinite(obs["environment_state"]).all()
    env.close()


def test_feature_names_label_the_state_values() -> None:
    env = make("push-v3", obs_mode="state")
    obs, _ = env.reset(seed=3)
    names = env.get_wrapper_attr("feature_names")
    assert len(names["environment_state"]) == len(obs["environment_state"]) == 39
    assert names["environment_state"][:4] == names["agent_pos"]
    assert names["agent_pos"] == ["hand.x", "hand.y", "hand.z", "gripper.gap"]
    value = dict(zip(names["environment_state"], obs["environment_state"], strict=True))
    inner = env.unwrapped._env  # Meta-World's own env: where the goal and the puck really are
    np.testing.assert_allclose([value[f"goal.{q}"] for q in "xyz"], inner._target_pos, atol=1e-6)
    puck = [value[f"object_1.{q}"] for q in "xyz"]
    np.testing.assert_allclose(puck, inner._get_pos_objects()[:3], atol=1e-6)
    env.close()


def test_terminate_on_success_ends_the_episode_at_the_first_success() -> None:
    env = make("reach-v3", obs_mode="state", terminate_on_success=True)
    expert = sims.make_expert(env)
    obs, info = env.reset(seed=3)
    terminated = truncated = False
    steps = 0
    while not (terminated or truncated):
        obs, _, terminated, truncated, info = env.step(expert(obs))
        steps += 1
    assert terminated and not truncated and info["success"] and steps < 500
    env.close()


def test_eval_of_the_scripted_expert_and_random_actions_on_metaworld(tmp_path: Path) -> None:
    from embodied.evaluation.suite import EvalConfig, run_eval, suite_tasks

    assert suite_tasks("metaworld", ["reach-v3", "metaworld/push-v3"]) == [
        "metaworld/reach-v3",
        "metaworld/push-v3",
    ]
    assert len(suite_tasks("metaworld")) == 10  # MT10 by default
    assert "metaworld/window-close-v3" in suite_tasks("metaworld", ["MT10"])
    with pytest.raises(ValueError, match="reach-v9"):
        suite_tasks("metaworld", ["reach-v9"])

    common = {"suite": "metaworld", "tasks": ["reach-v3"], "episodes": 3, "out": str(tmp_path)}
    run, (expert,) = run_eval(EvalConfig(policy="expert", videos=1, image_size=48, **common))
    assert expert.task == "metaworld/reach-v3" and expert.success_rate == 1.0
    assert expert.mean_length < 500  # episodes end at the first success
    assert (run.path / expert.videos[0]).stat().st_size > 0
    _, (random,) = run_eval(EvalConfig(policy="random", videos=0, **common))
    assert random.success_rate <= expert.success_rate and random.mean_length > expert.mean_length


def test_collect_ends_metaworld_episodes_at_the_first_success(tmp_path: Path) -> None:
    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.datasets import LeRobotDataset

    common = {"task": "metaworld/reach-v3", "episodes": 2, "obs_mode": "state"}
    run_collect(CollectConfig(out=str(tmp_path / "ended"), **common))
    ended = LeRobotDataset(tmp_path / "ended")
    assert ended.episode_success().all() and max(ended.episode_lengths()) < 500
    for episode in range(ended.num_episodes):  # success at the last frame only
        success = ended.episode_frames(episode, keys=["success"])["success"]
        assert success[-1] and not success[:-1].any()
    run_collect(CollectConfig(out=str(tmp_path / "full"), terminate_on_success=False, **common))
    assert LeRobotDataset(tmp_path / "full").episode_lengths().tolist() == [500, 500]


def test_collect_records_the_named_metaworld_cameras(tmp_path: Path) -> None:
    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.datasets import LeRobotDataset

    common = {"task": "metaworld/reach-v3", "episodes": 1, "image_size": 16}
    run_collect(
        CollectConfig(out=str(tmp_path / "named"), cameras=["corner", "gripperPOV"], **common)
    )
    features = LeRobotDataset(tmp_path / "named").features
    assert {"observation.images.corner", "observation.images.gripperPOV"} <= set(features)
    # One camera other than the default keeps its name: a policy trained on it is given that
    # camera (env_options), not corner2.
    run_collect(CollectConfig(out=str(tmp_path / "one"), cameras=["corner"], **common))
    features = LeRobotDataset(tmp_path / "one").features
    assert "observation.images.corner" in features and "observation.image" not in features
    run_collect(CollectConfig(out=str(tmp_path / "default"), **common))  # Meta-World's corner2
    features = LeRobotDataset(tmp_path / "default").features
    assert "observation.image" in features and not any(
        k.startswith("observation.images.") for k in features
    )
    with pytest.raises(ValueError, match="front"):  # a tabletop camera, named in the error
        run_collect(CollectConfig(out=str(tmp_path / "bad"), cameras=["front"], **common))


def test_the_mt10_camera_recipe_trains_and_acts_from_its_two_cameras_alone(
    tmp_path: Path,
) -> None:
    """configs/bc_pixels_mt10.yaml on a two-task Meta-World dataset that also holds a wrist
    camera: one policy that reads the corner and topview cameras, agent_pos and the instruction,
    and acts in the stateless env eval builds, which renders those two cameras only."""
    import torch

    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.core.config import load_config
    from embodied.core.policy import Policy
    from embodied.evaluation.suite import policy_check
    from embodied.rollout.matching import env_options
    from embodied.train.bc import BCConfig, train_bc

    data = tmp_path / "data"
    for task in ("reach-v3", "drawer-close-v3"):
        cameras = ["corner", "topview", "gripperPOV"]
        run_collect(CollectConfig(task="metaworld/" + task, episodes=1, out=str(data),
                                  image_size=24, cameras=cameras))  # fmt: skip
    recipe = Path(__file__).parents[1] / "configs" / "bc_pixels_mt10.yaml"
    overrides = [f"dataset={data}", f"out={tmp_path}", "steps=2", "batch_size=4", "save_every=2"]
    cfg = load_config(BCConfig, recipe, overrides)
    policy_dir = train_bc(cfg).path / "policy"
    policy = Policy.from_pretrained(policy_dir)
    spec = policy.observation_spec
    views = {"observation.images.corner": (24, 24), "observation.images.topview": (24, 24)}
    assert dict(spec.cameras) == views and not spec.privileged
    assert env_options(spec) == {
        "obs_mode": "pixels",
        "image_size": (24, 24),
        "cameras": ["corner", "topview"],
    }
    assert len(policy.config.vocab) > 2  # both instructions' words, for the FiLM
    env = sims.make("metaworld/drawer-close-v3", **env_options(spec))  # what eval builds
    try:
        policy_check(policy, "metaworld/drawer-close-v3")(env)  # eval's check before rollouts
        obs, _ = env.reset(seed=100_000)
        assert set(obs) == {"pixels", "agent_pos"}  # no environment_state to leak
        assert set(obs["pixels"]) == {"corner", "topview"}  # named, not the default
        batch = {f"observation.images.{k}": torch.from_numpy(v)[None, None]
                 for k, v in obs["pixels"].items()}  # fmt: skip
        batch["observation.state"] = torch.from_numpy(obs["agent_pos"])[None, None]
        out = policy.act(
            batch,
            [env.unwrapped.instruction],
            deterministic=True,
        )
        assert out.actions.shape[-1] == 4 and torch.isfinite(out.actions).all()
    finally:
        env.close()


def test_render_states_replay_every_image_and_unread_steps_skip_rendering() -> None:
    """``render_state=True`` records what each image shows and ``render_images = False`` leaves
    one step's images black: replayed later, every image (the reset's too, where drawer-open's
    drawer used to be drawn where it was before the reset) equals the one an env rendering every
    step showed, for a fixed camera and the one on the gripper."""
    from embodied.sims import ReplayFrames

    task, seed = "metaworld/drawer-open-v3", 3
    kwargs = {"obs_mode": "pixels", "image_size": 32, "cameras": ["corner2", "gripperPOV"],
              "max_episode_steps": 12}  # fmt: skip
    shown, states, black = {}, [], []
    for lazy in (False, True):
        env = sims.make(task, **kwargs, render_state=lazy)
        obs, info = env.reset(seed=seed)
        images = [obs["pixels"]]
        states = [info["render_state"]] if lazy else []
        for t in range(12):
            if lazy and t % 3:
                env.unwrapped.render_images = False
                black.append(t + 1)
            obs, _, _, _, info = env.step(env.unwrapped.scripted_action())
            images.append(obs["pixels"])
            states += [info["render_state"]] if lazy else []
        env.close()
        shown[lazy] = {c: np.stack([i[c] for i in images]) for c in kwargs["cameras"]}
    replay = ReplayFrames(task, kwargs, seed, np.stack(states))
    for camera, full in shown[False].items():
        assert not shown[True][camera][black].any() and shown[True][camera][0].any()
        kept = np.setdiff1d(np.arange(len(full)), black)
        np.testing.assert_array_equal(shown[True][camera][kept], full[kept])
        np.testing.assert_array_equal(replay.for_camera(camera)[np.arange(len(full))], full)


def test_two_tasks_in_one_vector_env_keep_their_render_states_and_replays() -> None:
    """reach and door-open (render states of 23 and 17 numbers: Gymnasium would batch both into
    the first one's shape and fail) step in one vector env, as a multi-task GRPO run steps them:
    each episode keeps its own task's render states, and its frames replay as that task's env
    alone gives them."""
    import torch

    from embodied.policies import make_policy
    from embodied.rollout.backends import TaskEnvs

    torch.manual_seed(0)
    stats = {
        "observation.state": {"mean": np.zeros(4), "std": np.full(4, 0.1)},
        "observation.environment_state": {"mean": np.zeros(39), "std": np.ones(39)},
        "action": {"min": -np.ones(4), "max": np.ones(4)},
    }
    policy = make_policy("mlp", state_dim=4, action_dim=4, env_state_dim=39, hidden=[16])
    policy = policy.fit_normalizers(stats).eval()
    kwargs = {"obs_mode": "state", "render_state": True, "image_size": 32, "cameras": ["corner"],
              "max_episode_steps": 6}  # fmt: skip
    tasks = ["metaworld/reach-v3", "metaworld/door-open-v3"]
    both = TaskEnvs(tasks, kwargs, 1)
    try:
        mixed = both.rollout(policy, [3, 3], [0, 1], tasks, sample_seed=7, deterministic=False)
    finally:
        both.close()
    assert [t.info["render_state"].shape[1] for t in mixed] == [23, 17]
    for i, task in enumerate(tasks):
        alone = TaskEnvs([task], kwargs, 1)
        try:
            (own,) = alone.rollout(policy, [3], [i], [task], sample_seed=7, deterministic=False)
        finally:
            alone.close()
        np.testing.assert_allclose(mixed[i].info["render_state"], own.info["render_state"])
        steps = np.arange(mixed[i].length + 1)
        np.testing.assert_array_equal(mixed[i].frames[steps], own.frames[steps])
