"""GRPO's training loop: updates, rewards, several tasks, refusals, exact resume; its ratios and
monitor are in test_grpo_ratios.py, its formulas by hand in test_grpo_loss.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny_policies import STATS, TASK_WORDS, tiny_policies

from embodied.policies import make_policy
from embodied.rewards import ProgressConfig, ProgressRewardModel
from embodied.rollout.backends import LocalRollouts
from embodied.train.grpo import GRPOConfig, train_grpo
from embodied.train.onpolicy import (
    TaskGroups,
    check_task,
    env_kwargs,
    rollout_groups,
    task_names,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("grpo")
    torch.manual_seed(0)
    policy = make_policy("mlp", state_dim=4, action_dim=4, env_state_dim=39, hidden=[32])
    policy.fit_normalizers(STATS).save_pretrained(root / "policy")
    model = ProgressRewardModel(
        ProgressConfig(image_size=16, vocab=TASK_WORDS, vision_channels=[4, 8], num_keypoints=4,
                       d_model=16, n_heads=2, n_layers=1, ff_dim=32, num_bins=8)
    )  # fmt: skip
    model.save_pretrained(root / "reward")
    # A policy that explores widely: the hand reaches different stages in different rollouts.
    explorer = make_policy("mlp", state_dim=4, action_dim=4, env_state_dim=39, hidden=[32],
                           init_log_std=0.5)  # fmt: skip
    explorer.fit_normalizers(STATS).save_pretrained(root / "explorer")
    return {"policy": root / "policy", "explorer": root / "explorer", "reward": root / "reward",
            "root": root}  # fmt: skip


def _cfg(saved: dict[str, Path], out: Path, **overrides) -> GRPOConfig:
    values = dict(
        policy=str(saved["policy"]), task="Reach", reward="learned",
        reward_model=str(saved["reward"]), iterations=2, groups=2, group_size=3, keep_low=0.0,
        keep_high=1.0, epochs=2, minibatch_size=64, eval_episodes=2, eval_every=1, save_every=1,
        out=str(out), device="cpu",
    )  # fmt: skip
    values.update(overrides)
    cfg = GRPOConfig(**values)
    cfg.optim.lr = 1e-3
    return cfg


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.parametrize("agg", ["token-mean", "traj-mean"])
def test_grpo_updates_logs_and_resumes_exactly(saved, tmp_path: Path, agg: str) -> None:
    run = train_grpo(_cfg(saved, tmp_path / "full", eval_sampled=True, loss_agg=agg))
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    iteration = [r for r in rows if "update/policy_loss" in r]
    assert [r["step"] for r in iteration] == [1, 2]
    first = iteration[0]
    assert first["update/first_ratio_error"] < 1e-4
    for key in ("rollout/success_rate", "score/return_std", "update/clip_fraction",
                "update/grad_norm", "monitor/reward_corr", "time/rollout", "time/update",
                "eval/Reach/success_rate", "eval_sampled/Reach/mean_length"):  # fmt: skip
        assert key in first, key
    assert first["score/return_std"] > 0  # the learned reward told the rollouts apart
    start = _weights(saved["policy"])
    final = _weights(run.path / "policy")
    assert any(not torch.equal(start[k], final[k]) for k in start)  # it trained

    # Interrupted after iteration 1 (its checkpoint is the latest), resumed: the same final
    # weights as the uninterrupted run.
    part = tmp_path / "part"
    shutil.copytree(run.path, part)
    shutil.rmtree(part / "checkpoints" / "step-0000002")
    shutil.rmtree(part / "policy")

    # The reward-hacking monitor's state is in the checkpoint; give it a history to go on from.
    def trainer_state(path: Path) -> dict:
        return json.loads(path.joinpath("trainer.json").read_text())

    checkpoint = part / "checkpoints" / "step-0000001"
    state = trainer_state(checkpoint)
    assert set(state["extra"]["monitor"]) == {"history", "falling"}
    state["extra"]["monitor"] = {"history": [0.9], "falling": False}
    checkpoint.joinpath("trainer.json").write_text(json.dumps(state))
    resumed = train_grpo(
        _cfg(saved, tmp_path / "unused", resume=str(part), eval_sampled=True, loss_agg=agg)
    )
    assert resumed.path == part
    again = _weights(resumed.path / "policy")
    for key in final:
        torch.testing.assert_close(again[key], final[key], rtol=0, atol=0)
    # ... and its monitor went on from the checkpoint's history, not afresh
    steps = [trainer_state(run.path / "checkpoints" / f"step-000000{i}") for i in (1, 2)]
    full = [s["extra"]["monitor"]["history"] for s in steps]
    resumed_history = trainer_state(part / "checkpoints" / "step-0000002")["extra"]["monitor"]
    assert resumed_history["history"] == [0.9] + full[1][len(full[0]) :]


@pytest.mark.parametrize("reward", ["learned", "judge", "privileged", "success"])
def test_grpo_trains_with_every_reward_model(saved, judge_dir, tmp_path: Path, reward) -> None:
    """The four reward implementations through the one interface: each scores the rollouts, the
    returns follow, the policy is updated; the reward-hacking monitor runs for the two models."""
    model = {"learned": str(saved["reward"]), "judge": str(judge_dir)}.get(reward, "")
    cfg = _cfg(saved, tmp_path, reward=reward, reward_model=model, iterations=1, eval_episodes=0,
               policy=str(saved["explorer"]))  # fmt: skip
    run = train_grpo(cfg)
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if "rollout/success_rate" in r]
    assert ("monitor/reward_corr" in row) == (reward in ("learned", "judge"))
    if reward == "success" and "update/skipped" not in row:  # a group mixed success and failure
        assert row["score/success_ranking"] == 1.0
    start, final = _weights(saved["explorer"]), _weights(run.path / "policy")
    if "update/skipped" in row:  # no group's returns differed: nothing to learn, no update
        # a random policy reaches no Reach stage: only the untrained learned model tells apart
        assert reward != "learned"
        assert all(torch.equal(start[k], final[k]) for k in start)
    else:
        assert row["score/return_std"] > 0
        assert any(not torch.equal(start[k], final[k]) for k in start)


def test_groups_take_the_tasks_in_turn_and_one_task_rolls_out_as_before() -> None:
    """Group g runs on tasks[g % n] from seeds[g]; on one task the trajectories are the ones its
    backend gives for the same seeds and sampling seed."""
    torch.manual_seed(0)
    policy = tiny_policies()["mlp"].fit_normalizers(STATS).eval()
    options = {"obs_mode": "state", "max_episode_steps": 6}
    cfg = GRPOConfig(group_size=2)
    both = TaskGroups(cfg, {"Reach": options, "Push": options}, policy, groups=3)
    try:
        trajs = both.run([5, 6, 7], group_size=2, sample_seed=3)
    finally:
        both.close()
    assert [t.task for t in trajs] == ["Reach", "Reach", "Push", "Push", "Reach", "Reach"]
    assert [t.seed for t in trajs] == [5, 5, 6, 6, 7, 7]
    one = TaskGroups(cfg, {"Reach": options}, policy, groups=2)
    backend = LocalRollouts("Reach", options, policy, 4)
    try:
        grouped = one.run([5, 7], group_size=2, sample_seed=3)
        alone = rollout_groups(backend, [5, 7], group_size=2, sample_seed=3)
    finally:
        one.close()
        backend.close()
    for a, b in zip(grouped, alone, strict=True):
        np.testing.assert_array_equal(a.actions, b.actions)


def test_task_names_expand_a_preset_and_refuse_a_repeat() -> None:
    assert task_names(GRPOConfig(task="Push")) == ["Push"]
    mt10 = task_names(GRPOConfig(tasks=["MT10"]))
    assert len(mt10) == 10 and mt10[0] == "metaworld/reach-v3"
    assert task_names(GRPOConfig(task="mt10")) == mt10
    with pytest.raises(ValueError, match="name a task more than once"):
        task_names(GRPOConfig(tasks=["MT10", "metaworld/push-v3"]))


def test_rollouts_end_at_the_first_success_as_in_evaluation(saved) -> None:
    """Meta-World runs every episode to 500 steps unless told to end at success; GRPO's and TPO's
    rollouts end there as evaluation's do (and ``env`` can still say otherwise)."""
    from embodied.policies import Policy
    from embodied.rewards.models import make_reward_model

    policy = Policy.from_pretrained(saved["policy"])
    model = make_reward_model("success", "", 8, torch.device("cpu"))
    assert env_kwargs("metaworld/reach-v3", policy, model)["terminate_on_success"] is True
    kept = env_kwargs("metaworld/reach-v3", policy, model, {"terminate_on_success": False})
    assert kept["terminate_on_success"] is False


def test_grpo_trains_one_policy_on_several_tasks(saved, tmp_path: Path) -> None:
    """tasks=[Reach, Push]: rollouts and held-out success per task and their mean are logged, and
    the one policy is updated."""
    cfg = _cfg(saved, tmp_path, tasks=["Reach", "Push"], iterations=1,
               policy=str(saved["explorer"]))  # fmt: skip
    run = train_grpo(cfg)
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    first, last = rows[0], rows[-1]
    for row in (first, last):
        rates = [row["eval/Reach/success_rate"], row["eval/Push/success_rate"]]
        assert row["eval/success_rate"] == pytest.approx(np.mean(rates))
    assert "rollout/Reach/success_rate" in last and "rollout/Push/success_rate" in last
    kept = last["rollout/Reach/groups_kept"] + last["rollout/Push/groups_kept"]
    assert kept == last["rollout/groups_kept"]
    for task in ("Reach", "Push"):  # is the learned reward any good on each task?
        assert f"monitor/{task}/reward_corr" in last and f"score/{task}/success_ranking" in last
    assert last["rollout/episodes"] == 2 * 3
    # one group per task: it failed (or succeeded) throughout exactly where the task's rate is 0 (1)
    rates = [last[f"rollout/{task}/success_rate"] for task in ("Reach", "Push")]
    assert [last[f"rollout/{task}/groups_failed"] for task in ("Reach", "Push")] == [
        float(r == 0) for r in rates
    ]
    assert last["rollout/groups_failed"] == sum(r == 0 for r in rates)
    assert last["rollout/groups_solved"] == sum(r == 1 for r in rates)
    start, final = _weights(saved["explorer"]), _weights(run.path / "policy")
    assert any(not torch.equal(start[k], final[k]) for k in start)


def test_grpo_trains_a_planner_recomputing_one_block_of_its_chain(saved, tmp_path: Path) -> None:
    """update_steps=1 on a planner of 3 fine-tuned steps: every minibatch recomputes one step
    per decision, the ratio is 1 before the first update, and the planner is updated."""
    torch.manual_seed(0)
    tiny_policies()["diffusion"].fit_normalizers(STATS).save_pretrained(tmp_path / "planner")
    ProgressRewardModel(  # an untrained model: returns that differ within a group
        ProgressConfig(image_size=32, vocab=TASK_WORDS, vision_channels=[4, 8], num_keypoints=4,
                       d_model=16, n_heads=2, n_layers=1, ff_dim=32, num_bins=8)
    ).save_pretrained(tmp_path / "reward")  # fmt: skip
    cfg = _cfg(saved, tmp_path, policy=str(tmp_path / "planner"), iterations=1, eval_episodes=0,
               reward_model=str(tmp_path / "reward"), update_steps=1,
               env={"max_episode_steps": 8})  # fmt: skip
    run = train_grpo(cfg)
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if "rollout/success_rate" in r]
    assert row["update/first_ratio_error"] < 1e-4
    start, final = _weights(tmp_path / "planner"), _weights(run.path / "policy")
    assert any(not torch.equal(start[k], final[k]) for k in start)


def test_target_kl_ends_the_update_after_the_step_that_moved_the_policy_past_it(
    saved, tmp_path: Path
) -> None:
    """Without target_kl every planned minibatch steps; with a tiny one the first step moves the
    policy past it and the next minibatch stops the iteration's update before its step."""
    kw = dict(iterations=1, eval_episodes=0, epochs=3, minibatch_size=8,
              policy=str(saved["explorer"]))  # fmt: skip

    def update_row(out: str, **more) -> dict:
        run = train_grpo(_cfg(saved, tmp_path / out, **kw, **more))
        lines = (run.path / "metrics.jsonl").read_text().splitlines()
        (row,) = [r for r in map(json.loads, lines) if "update/steps" in r]
        return row

    full = update_row("full")
    assert full["update/planned_steps"] > 3
    assert full["update/steps"] == full["update/planned_steps"]
    assert "update/stop_kl" not in full
    stopped = update_row("stopped", target_kl=1e-9)
    assert stopped["update/steps"] == 1 < stopped["update/planned_steps"]
    assert stopped["update/stop_kl"] > 1e-9
    assert stopped["update/sampling_kl"] < 1e-6  # the one step taken was from the sampling policy


def test_grpo_refuses_bad_settings(saved, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="the mlp policy samples no chain"):
        train_grpo(_cfg(saved, tmp_path, update_steps=2))
    with pytest.raises(ValueError, match="config key 'loss_agg' = 'sum': expected one of"):
        train_grpo(_cfg(saved, tmp_path, loss_agg="sum"))
    with pytest.raises(ValueError, match="reward=learned needs reward_model"):
        train_grpo(_cfg(saved, tmp_path, reward_model=""))
    with pytest.raises(ValueError, match="config key 'reward' = 'vibes': expected one of"):
        train_grpo(_cfg(saved, tmp_path, reward="vibes"))
    with pytest.raises(ValueError, match="config key 'group_size' = 1 is out of range"):
        train_grpo(_cfg(saved, tmp_path, group_size=1))
    with pytest.raises(ValueError, match=r"policy_overrides names \['temperature'\]"):
        train_grpo(_cfg(saved, tmp_path, policy_overrides={"temperature": 1.6}))
    # ``env`` options reach the env: the goal adds 6 state values this 39-D policy never read.
    with pytest.raises(
        ValueError, match="reads a 39-D observation.environment_state, Reach gives 45-D"
    ):
        train_grpo(_cfg(saved, tmp_path, env={"goal_state": True}))


def test_a_state_policys_rollouts_render_only_the_frames_the_judge_reads(saved, judge_dir) -> None:
    """With the judge as reward, a state policy's env records render states (it rendered every
    step before), and the frames the judge scores, replayed, equal an every-step rendering."""
    import embodied.sims as sims
    from embodied.core.reward import camera_frames
    from embodied.policies import Policy
    from embodied.rewards.models import make_reward_model
    from embodied.rollout.episodes import ExpertActor, rollout_vector
    from embodied.sims.replay import attach_replay_frames

    judge = make_reward_model("judge", str(judge_dir), 8, torch.device("cpu"))
    kwargs = env_kwargs("Reach", Policy.from_pretrained(saved["policy"]), judge)
    assert kwargs["obs_mode"] == "state" and kwargs["render_state"] is True
    frames = []
    for options in (kwargs, {**kwargs, "obs_mode": "pixels_state", "render_state": False}):
        vec = sims.make_vec_env("Reach", 1, autoreset_mode="disabled", max_episode_steps=6,
                                **options)  # fmt: skip
        try:
            traj = list(rollout_vector(vec, ExpertActor(vec), [3]))[0]
        finally:
            vec.close()
        if options["render_state"]:
            attach_replay_frames([traj], "Reach", options)
        frames.append(camera_frames(traj))
    assert len(frames[0]) == 7  # every observation, at the env's default size
    np.testing.assert_array_equal(frames[0], frames[1])


def test_grpo_refuses_a_tabletop_policy_on_metaworld_before_any_rollout(tmp_path: Path) -> None:
    """Same action and state sizes, other state values: refused before any rollout or output."""
    pytest.importorskip("metaworld")
    names = ["ee.x", "ee.y", "ee.z", "gripper.gap"]  # what tabletop datasets record
    policy = make_policy("mlp", state_dim=4, action_dim=4, state_names=names)
    stats = {k: v for k, v in STATS.items() if k != "observation.environment_state"}
    policy.fit_normalizers(stats).save_pretrained(tmp_path / "tabletop")
    cfg = GRPOConfig(policy=str(tmp_path / "tabletop"), task="metaworld/reach-v3",
                     reward="success", out=str(tmp_path / "runs"), device="cpu")  # fmt: skip
    with pytest.raises(ValueError, match=r"reads observation.state values \['ee.x'.*'hand.x'"):
        train_grpo(cfg)
    assert not (tmp_path / "runs").exists()


def test_shipped_config_loads_with_the_command_line_overrides() -> None:
    from embodied.apps.cli import build_parser
    from embodied.core.config import load_config

    config = Path(__file__).parents[1] / "configs" / "grpo_pickplace.yaml"
    args = build_parser().parse_args(["train", "grpo", str(config), "policy=p", "reward=success"])
    cfg = load_config(GRPOConfig, args.config, args.overrides)
    assert (cfg.policy, cfg.reward, cfg.task, cfg.group_size) == ("p", "success", "PickPlace", 4)
    assert (cfg.loss_agg, cfg.iterations, cfg.optim.schedule) == ("traj-mean", 48, "constant")
    assert cfg.policy_overrides == {"min_std": 0.05, "finetune_steps": 10}
    mt10 = load_config(
        GRPOConfig, str(config.with_name("grpo_mt10.yaml")), ["policy=p", "reward_model=r"]
    )
    assert task_names(mt10) == [f"metaworld/{t}-v3" for t in
                                ("reach", "push", "pick-place", "peg-insert-side")]  # fmt: skip
    assert (mt10.env, mt10.groups, mt10.group_size, mt10.max_minutes, mt10.update_steps) == (
        {"max_episode_steps": 200}, 16, 8, 60.0, 5)  # fmt: skip
    assert mt10.policy_overrides["min_std"] == 0.15
    pixels = load_config(GRPOConfig, str(config.with_name("grpo_pickplace_pixels.yaml")),
                         ["policy=p", "reward_model=r"])  # fmt: skip
    assert (pixels.task, pixels.reward, pixels.optim.lr, pixels.eval_episodes) == (
        "PickPlace", "learned", 1e-5, 0)  # fmt: skip
    assert pixels.policy_overrides == {"min_std": 0.1, "finetune_steps": 10, "ddim_eta": 0.0,
                                       "init_noise": 0.0}  # fmt: skip
    vla = load_config(GRPOConfig, str(config.with_name("grpo_vla.yaml")), ["policy=p"])
    assert (vla.task, vla.loss_agg) == ("Reach", "traj-mean")
    assert vla.policy_overrides == {"temperature": 0.7}


def test_rollouts_show_the_reward_model_the_camera_it_was_trained_on(saved) -> None:
    """A state policy's rollouts render the reward model's camera (here the wrist, not the
    default front) for it to score; a pixel policy whose env lacks that camera is refused before
    any rollout, naming it."""
    import embodied.sims as sims
    from embodied.policies import Policy
    from embodied.rewards.models import LearnedProgress
    from embodied.rollout.episodes import ExpertActor, rollout_vector
    from embodied.sims.replay import attach_replay_frames

    model = ProgressRewardModel.from_pretrained(saved["reward"])
    model.config.image_key = "observation.images.wrist"
    reward = LearnedProgress(model)
    kwargs = env_kwargs("Reach", Policy.from_pretrained(saved["policy"]), reward)
    assert kwargs["cameras"] == ["wrist"] and kwargs["render_state"] is True
    vec = sims.make_vec_env("Reach", 1, autoreset_mode="disabled", max_episode_steps=4, **kwargs)
    try:
        traj = list(rollout_vector(vec, ExpertActor(vec), [3]))[0]
    finally:
        vec.close()
    attach_replay_frames([traj], "Reach", kwargs)
    env = sims.make("Reach", obs_mode="pixels", image_size=16, cameras=["wrist"])
    wrist, _ = env.reset(seed=3)
    env.close()
    np.testing.assert_array_equal(traj.frames[0], wrist["pixels"]["wrist"])

    pixels = make_policy("diffusion", state_dim=4, action_dim=4, image_keys=["observation.image"],
                         image_size=16, n_obs_steps=1, horizon=8, n_action_steps=4,
                         down_dims=[16, 32], vision_channels=[4, 8], num_keypoints=4)  # fmt: skip
    options = env_kwargs("Reach", pixels, reward)
    with pytest.raises(ValueError, match=r"the reward model reads observation.images.wrist, "
                       r"Reach offers \['observation.image'\]"):  # fmt: skip
        check_task(pixels, "Reach", options, reward)


def test_hard_states_start_groups_where_the_greedy_policy_fails(saved, tmp_path: Path) -> None:
    """hard_seeds runs each task's candidates once deterministically and gives its groups the
    states the greedy policy failed, in seed order, then solved ones where too few failed; a run
    with hard_states logs the greedy success of its candidates."""

    class Greedy:  # a stand-in backend whose greedy policy solves the seeds divisible by 3
        def __init__(self) -> None:
            self.calls: list[tuple[list[int], bool, list[str]]] = []

        def run(self, seeds, sample_seed, deterministic=False, tasks=None):
            self.calls.append((list(seeds), deterministic, list(tasks)))
            return [SimpleNamespace(ever_succeeded=seed % 3 == 0) for seed in seeds]

        def close(self) -> None:
            pass

    policy = tiny_policies()["mlp"].fit_normalizers(STATS).eval()
    options = {"obs_mode": "state", "max_episode_steps": 6}
    groups = TaskGroups(GRPOConfig(group_size=2), {"Reach": options, "Push": options}, policy, 3)
    groups.close()
    assert [lane for lane, _ in groups.backends] == [["Reach", "Push"]]  # one vector env
    backend = Greedy()
    groups.backends = [(["Reach", "Push"], backend)]
    seeds, rates = groups.hard_seeds(3, first=9, candidates=2)  # Reach: groups 0, 2; Push: 1
    # both tasks' candidates in one call
    assert backend.calls == [([9, 10, 11, 12, 9, 10], True, ["Reach"] * 4 + ["Push"] * 2)]
    assert seeds == [10, 10, 11]  # Reach fails 10, 11 (solves 9, 12); Push fails 10
    assert rates == {"Reach": 0.5, "Push": 0.5}
    seeds, rates = groups.hard_seeds(2, first=0, candidates=1)  # each task has only seed 0
    assert seeds == [0, 0] and rates == {"Reach": 1.0, "Push": 1.0}  # solved, used all the same

    run = train_grpo(_cfg(saved, tmp_path, iterations=1, hard_states=2, eval_episodes=0))
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert 0.0 <= rows[-1]["rollout/greedy_success"] <= 1.0
    assert rows[-1]["rollout/episodes"] == 2 * 3  # the candidates are not training episodes
