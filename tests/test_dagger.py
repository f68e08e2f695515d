"""Expert labels and DAgger: the scripted expert's action recorded at the states a noisy expert
or an evaluated policy reached, as eval's ``record_actions=expert`` writes them into a dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import embodied.sims as sims
from embodied.apps.cli import main
from embodied.evaluation.suite import EvalConfig, run_eval
from embodied.rollout.episodes import ExpertActor, ExpertLabels, rollout_vector


def test_expert_labels_are_recorded_while_the_noisy_action_is_executed() -> None:
    class Labelled:
        """Executes a constant push along +x but labels every step with the zero action."""

        def __call__(self, obs):
            self.labels = np.zeros((1, 4), np.float32)
            return np.array([[1.0, 0.0, 0.0, 0.0]], np.float32)

    vec = sims.make_vec_env("Reach", 1, autoreset_mode="disabled", obs_mode="state")
    try:
        (traj,) = rollout_vector(vec, Labelled(), [0])
        rng = np.random.default_rng(0)
        actor = ExpertActor(vec, noise=0.5, rng=rng, record="expert")
        vec.reset(seed=[1])
        executed = actor(None)
        clean = np.stack(vec.call("scripted_action"))
    finally:
        vec.close()
    assert (traj.actions == 0).all()
    x = traj.observations["agent_pos"][:, 0]
    assert x[-1] - x[0] > 0.1  # the executed action moved the hand
    np.testing.assert_array_equal(actor.labels, clean)
    assert np.abs(executed - clean).max() > 0.05
    with pytest.raises(ValueError, match="record must be"):
        ExpertActor(vec, record="clean")


def test_dagger_labels_are_the_experts_actions_at_the_states_the_policy_reached() -> None:
    """``ExpertLabels``: the wrapped actor drives and is told of resets; the trajectory holds the
    scripted expert's action at each state it reached, which a replay of the executed actions
    reproduces exactly."""

    class Driver:
        """Drives the hand along +x and +y, remembering what it did and when it was reset."""

        def __init__(self) -> None:
            self.executed: list[np.ndarray] = []
            self.resets = 0

        def reset(self, envs, instructions, episodes=None) -> None:
            self.resets += 1

        def __call__(self, obs):
            self.executed.append(np.array([1.0, 0.5, 0.0, 0.0], np.float32))
            return self.executed[-1][None]

    driver = Driver()
    vec = sims.make_vec_env("Push", 1, autoreset_mode="disabled", obs_mode="state")
    try:
        (traj,) = rollout_vector(vec, ExpertLabels(driver, vec), [3])
    finally:
        vec.close()
    env = sims.make("Push", obs_mode="state")
    try:
        env.reset(seed=3)
        expert = []
        for action in driver.executed[: traj.length]:
            expert.append(env.get_wrapper_attr("scripted_action")())
            env.step(action)
    finally:
        env.close()
    assert driver.resets >= 1
    np.testing.assert_array_equal(traj.actions, np.stack(expert))
    assert np.abs(traj.actions - np.stack(driver.executed[: traj.length])).max() > 0.1


def test_eval_records_dagger_data_only_into_a_dataset(tmp_path: Path) -> None:
    """``record_actions=expert`` writes the expert's action at each state the evaluated policy
    reached; without ``--record`` there is nothing to label, which is refused."""
    from embodied.datasets import LeRobotDataset

    data = tmp_path / "dagger"
    assert main(["eval", "--policy", "random", "--tasks", "Reach", "--episodes", "2", "--seed",
                 "5", "--videos", "0", "--out", str(tmp_path), "--record", str(data),
                 "record_actions=expert", "env.obs_mode=state"]) == 0  # fmt: skip
    dataset = LeRobotDataset(data)
    first = dataset.episode_frames(1, keys=["action"])["action"][0]
    env = sims.make("Reach", obs_mode="state")
    try:
        env.reset(seed=6)
        np.testing.assert_allclose(first, env.get_wrapper_attr("scripted_action")(), atol=1e-6)
    finally:
        env.close()
    with pytest.raises(ValueError, match="record_actions = 'expert' labels the episodes --record"):
        run_eval(EvalConfig(policy="random", tasks=["Reach"], record_actions="expert"))


def test_dagger_into_a_dataset_records_what_it_holds_and_the_policy_reads_its_camera(
    tmp_path: Path,
) -> None:
    """Appending with ``--record`` takes the dataset's cameras, image size and environment state
    as env options, so DAgger data for a front-camera planner lands in a front + wrist + state
    dataset without env.* settings (it was refused: the observations differ)."""
    from embodied.datasets import LeRobotDataset
    from embodied.policies import make_policy

    data = tmp_path / "demos"
    assert main(["collect", "--task", "Reach", "--episodes", "1", "--out", str(data),
                 "image_size=16", "cameras=[front,wrist]",
                 "obs_mode=pixels_state"]) == 0  # fmt: skip
    policy = make_policy(
        "diffusion", state_dim=4, action_dim=4, image_keys=["observation.images.front"],
        image_size=16, n_obs_steps=1, horizon=8, n_action_steps=4, down_dims=[8, 16],
        vision_channels=[4, 8], num_keypoints=4, num_inference_steps=2,
    )  # fmt: skip
    policy.fit_normalizers({"observation.state": {"mean": np.zeros(4), "std": np.ones(4)},
                            "action": {"min": -np.ones(4), "max": np.ones(4)}})  # fmt: skip
    policy.save_pretrained(tmp_path / "front")
    features = dict(LeRobotDataset(data).features)
    assert main(["eval", "--policy", str(tmp_path / "front"), "--tasks", "Reach", "--episodes",
                 "1", "--videos", "0", "--out", str(tmp_path), "--record", str(data),
                 "record_actions=expert", "env.max_episode_steps=9"]) == 0  # fmt: skip
    dataset = LeRobotDataset(data)
    assert dataset.num_episodes == 2 and dict(dataset.features) == features
    frames = dataset.episode_frames(1, keys=["observation.images.wrist", "action"])
    wrist = frames["observation.images.wrist"]
    assert len(wrist) == 10 and wrist.reshape(10, -1).max(axis=1).min() > 50  # rendered
    env = sims.make("Reach", obs_mode="state")
    try:
        env.reset(seed=100_000)
        expert = env.get_wrapper_attr("scripted_action")()
    finally:
        env.close()
    np.testing.assert_allclose(frames["action"][0], expert, atol=1e-6)  # the expert's label
