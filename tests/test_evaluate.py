"""``embodied eval``: Wilson intervals, per-task summaries, videos with overlays, the report,
refusals before any rollout, repeats, and the rollout engine's video capture (expert labels and
DAgger: test_dagger.py)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path

import av
import numpy as np
import pytest

import embodied.sims as sims
from embodied.apps.cli import main
from embodied.core.policy import Policy
from embodied.core.trajectory_builder import TrajectoryBuilder
from embodied.evaluation.results import summarize, wilson_interval
from embodied.evaluation.suite import EvalConfig, rollout_task, run_eval, suite_tasks
from embodied.evaluation.video import annotate_frames
from embodied.rollout.episodes import ExpertActor, PolicyActor, rollout_vector


def _wilson_by_hand(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize(("k", "n"), [(0, 10), (5, 10), (10, 10), (37, 50), (1, 3)])
def test_wilson_interval_matches_the_formula(k: int, n: int) -> None:
    low, high = wilson_interval(k, n)
    want_low, want_high = _wilson_by_hand(k, n)
    assert low == pytest.approx(max(want_low, 0.0), abs=1e-9)
    assert high == pytest.approx(min(want_high, 1.0), abs=1e-9)
    assert low <= k / n <= high
    assert wilson_interval(0, 0) == (0.0, 1.0)


def _traj(successes: list[bool], collisions: list[int], progress: list[float]):
    builder = TrajectoryBuilder({"agent_pos": np.zeros(4, np.float32)}, instruction="do it")
    for s, c, p in zip(successes, collisions, progress, strict=True):
        info = {"success": s, "collisions": c, "progress": np.float32(p)}
        builder.add_step(np.zeros(4, np.float32), {"agent_pos": np.zeros(4, np.float32)}, 0.0,
                         False, False, info)  # fmt: skip
    return builder.build()


def test_summary_counts_a_success_raised_at_any_step() -> None:
    # Meta-World never terminates: success once during the episode counts (its convention).
    trajs = [
        _traj([False, True, False], [0, 1, 1], [0.2, 1.0, 0.5]),
        _traj([False, False], [0, 0], [0.1, 0.3]),
        _traj([False, False, True], [2, 0, 0], [0.2, 0.6, 1.0]),
    ]
    result = summarize("Push", trajs)
    assert (result.successes, result.episodes) == (2, 3)
    assert result.success_rate == pytest.approx(2 / 3)
    assert (result.ci_low, result.ci_high) == pytest.approx(wilson_interval(2, 3))
    assert result.collisions_per_episode == pytest.approx((2 + 0 + 2) / 3)
    assert result.final_progress == pytest.approx((0.5 + 0.3 + 1.0) / 3)
    assert result.mean_length == pytest.approx(8 / 3)
    assert result.episode_successes == [True, False, True]
    assert (result.states, result.states_solved) == (3, 2)  # unseeded: each its own state
    repeated = summarize(
        "Push", [replace(t, seed=s) for t, s in zip(trajs, [7, 8, 7], strict=True)]
    )
    assert (repeated.states, repeated.states_solved, repeated.episode_seeds) == (2, 1, [7, 8, 7])
    # State 7 always succeeds, 8 never: 3 episodes worth 2 (design effect 1.5)
    assert (repeated.ci_low, repeated.ci_high) == pytest.approx(wilson_interval(1, 2))
    mixed = [replace(trajs[i], seed=s) for i, s in zip([0, 1, 2, 1], [7, 7, 8, 8], strict=True)]
    assert summarize("Push", mixed).ci_low == pytest.approx(wilson_interval(2, 4)[0])  # no ICC
    metrics = result.metrics()
    assert metrics["eval/Push/success_rate"] == pytest.approx(2 / 3)
    assert metrics["eval/Push/collisions"] == pytest.approx(4 / 3)
    del trajs[1].info["collisions"]  # an env that does not count them: unknown, not 0
    assert summarize("Push", trajs).collisions_per_episode is None


def test_suite_tasks_expand_presets_and_name_unknown_tasks() -> None:
    assert suite_tasks("tabletop") == sims.list_tasks()
    assert suite_tasks("tabletop", ["Push"]) == ["Push"]
    with pytest.raises(ValueError, match=r"Psh"):
        suite_tasks("tabletop", ["Psh"])
    with pytest.raises(ValueError, match=r"unknown suite 'libero'"):
        suite_tasks("libero")


def test_annotate_frames_draws_text_and_a_progress_bar() -> None:
    frames = np.full((3, 64, 96, 3), 128, np.uint8)
    out = annotate_frames(frames, "push the red block", [0.5, 1.0], min_height=64)
    assert out.shape == frames.shape and (frames == 128).all()  # the input is left alone
    bottom = out[:, -1, :, 1]
    assert (bottom[0] < 128).all()  # progress 0 (per step: the first frame shows 0): empty bar
    assert (bottom[1, :48] == 200).all() and (bottom[1, 48:] < 128).all()  # half full
    assert (bottom[2] == 200).all()
    assert (out[:, 2:8] != 128).any()  # the instruction's band and text
    with pytest.raises(ValueError, match="progress has 5 values for 3 frames"):
        annotate_frames(frames, "x", [0.1] * 5)


def test_annotate_frames_enlarges_small_frames_by_a_whole_factor() -> None:
    frames = np.zeros((2, 64, 96, 3), np.uint8)
    frames[:, 40:, :, 0] = 255  # a red lower part survives the nearest-neighbour enlargement
    out = annotate_frames(frames, "reach", min_height=160)
    assert out.shape == (2, 192, 288, 3)  # 64 -> 3 x 64 >= 160
    assert (out[:, 120:, :, 0] == 255).all() and (out[:, 120:, :, 1:] == 0).all()


def test_capture_records_the_rendered_frames_of_the_first_episodes() -> None:
    vec = sims.make_vec_env("Reach", 2, autoreset_mode="disabled", image_size=48)
    try:
        trajs = sorted(
            rollout_vector(vec, ExpertActor(vec), [5, 6, 7], capture=2), key=lambda t: t.seed
        )
    finally:
        vec.close()
    for traj in trajs[:2]:
        # The front camera's render is the observation: frames must match it one for one.
        assert traj.frames is not None and traj.frames.shape == (traj.length + 1, 48, 48, 3)
        np.testing.assert_array_equal(traj.frames, traj.observations["pixels"])
    assert trajs[2].frames is None


def test_capture_renders_only_the_sub_envs_it_films(monkeypatch) -> None:
    vec = sims.make_vec_env("Reach", 3, autoreset_mode="disabled", obs_mode="state")
    renders = [0] * 3
    for i, env in enumerate(vec.envs):
        original = env.render

        def counted(i: int = i, original=original) -> np.ndarray:
            renders[i] += 1
            return original()

        monkeypatch.setattr(env, "render", counted)
    try:
        trajs = list(rollout_vector(vec, ExpertActor(vec), [5, 6, 7], capture=1))
    finally:
        vec.close()
    (filmed,) = [t for t in trajs if t.frames is not None]
    # One render per frame of the filmed episode (sub-env 0), none on the other two.
    assert renders == [filmed.length + 1, 0, 0]
    assert filmed.frames.shape[0] == filmed.length + 1


def test_eval_expert_and_random_write_a_complete_report(tmp_path: Path, capsys) -> None:
    code = main(
        ["eval", "--policy", "expert", "--tasks", "Reach", "Push", "--episodes", "3",
         "--videos", "1", "--out", str(tmp_path), "image_size=64"]
    )  # fmt: skip
    assert code == 0
    out, err = capsys.readouterr()
    assert re.search(r"\| Reach \| 3 \| 100% \| 44%-100% \|", out), out
    # A line on stderr as each task finishes: a long suite can be read as it goes.
    lines = [line for line in err.splitlines() if line.startswith("[")]
    assert [line.split(":")[0] for line in lines] == ["[1/2] Reach", "[2/2] Push"], err
    assert lines[0].startswith("[1/2] Reach: 100% (44%-100%) of 3 episodes, "), err
    assert "suite average" in out
    (run,) = tmp_path.iterdir()
    results = json.loads((run / "results.json").read_text())
    assert [r["task"] for r in results["results"]] == ["Reach", "Push"]
    assert results["suite_success_rate"] == 1.0
    assert results["config"]["seed"] == 100_000  # held-out seeds by default
    page = (run / "report.html").read_text()
    assert "<table>" in page and page.count("data:image/png;base64,") == 2
    for task in ("Reach", "Push"):
        video = run / "videos" / f"{task}-100000.mp4"
        assert f'src="videos/{task}-100000.mp4"' in page
        with av.open(str(video)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        length = next(r for r in results["results"] if r["task"] == task)["mean_length"]
        assert frames[0].shape == (192, 192, 3) and len(frames) > 10  # 64 px, enlarged x3
        assert length > 0
    assert (run / "report.md").read_text().count("| Push |") == 1

    cfg = EvalConfig(policy="random", tasks=["Reach"], episodes=4, videos=0, out=str(tmp_path))
    _, (result,) = run_eval(cfg)
    assert result.success_rate == 0.0 and result.mean_length == 80


def test_eval_records_its_episodes_as_a_dataset_to_label_and_train_on(tmp_path: Path) -> None:
    """``record=DIR`` writes every evaluated episode (its successes and failures, seeds held out)
    into a LeRobot dataset, appending on a second run, that ``embodied label`` then labels for
    reward training on the policy's own episodes; a run whose observations differ is refused."""
    from embodied.apps.label import run_label
    from embodied.datasets import LeRobotDataset

    data = tmp_path / "data"
    pixels = {"obs_mode": "pixels_state", "image_size": 32}
    _, results = run_eval(EvalConfig(policy="random", tasks=["Reach"], episodes=2, videos=0,
                                     env=pixels, out=str(tmp_path), record=str(data)))  # fmt: skip
    assert main(["eval", "--policy", "expert", "--tasks", "Reach", "--episodes", "2", "--seed",
                 "7", "--videos", "0", "--out", str(tmp_path), "--record", str(data),
                 "env.obs_mode=pixels_state", "env.image_size=32"]) == 0  # fmt: skip
    dataset = LeRobotDataset(data)
    table = dataset.episodes_table()
    assert [int(r["seed"]) for r in table] == [100_000, 100_001, 7, 8]
    assert [bool(r["success"]) for r in table] == [False, False, True, True]
    assert results[0].success_rate == 0.0 and "observation.image" in dataset.features
    summary = run_label(data)
    assert summary.episodes == 4 and summary.final_success == pytest.approx(1.0)
    runs = sorted(tmp_path.iterdir())
    with pytest.raises(ValueError, match="image_size: this run records observation.image"):
        run_eval(EvalConfig(policy="random", tasks=["Reach"], episodes=1, videos=0,
                            env={**pixels, "image_size": 16}, out=str(tmp_path),
                            record=str(data)))  # fmt: skip
    assert sorted(tmp_path.iterdir()) == runs  # refused before any run directory


def test_label_gives_a_task_the_policy_never_solved_uniform_stage_budgets(tmp_path: Path) -> None:
    """A policy's own rollouts of several tasks, one of which it never solves (a weak planner's
    MT10 pick-place), get labelled: that task's failures on uniform budgets over its stages, named
    in the summary line. Before, one such task refused the whole dataset."""
    from embodied.apps.label import run_label
    from embodied.datasets import LeRobotDataset
    from embodied.rewards.labels import observation_stages

    data = tmp_path / "data"
    common = ["--videos", "0", "--out", str(tmp_path), "--record", str(data),
              "env.obs_mode=pixels_state", "env.image_size=32"]  # fmt: skip
    assert main(["eval", "--policy", "expert", "--tasks", "Reach", "--episodes", "1", *common]) == 0
    assert main(["eval", "--policy", "random", "--tasks", "Push", "--episodes", "2", *common]) == 0
    summary = run_label(data)
    assert summary.uniform == ("Push",) and summary.final_success == 1.0
    assert summary.line().endswith("uniform stage budgets (no success) for Push"), summary.line()
    dataset = LeRobotDataset(data)
    for i in range(1, 3):  # Push has two stages: each owns half of the progress
        traj = dataset.episode(i)
        labels = dataset.episode_frames(i, keys=["progress.label"])["progress.label"].ravel()
        stages = observation_stages(traj)
        assert traj.task == "Push" and not traj.success and labels[-1] < 1.0
        assert np.all(labels >= stages / 2) and np.all(labels <= (stages + 1) / 2)
    assert sims.task_stages("Push") == ("approach", "push")
    assert sims.task_stages("metaworld/pick-place-v3") == ("approach", "grasp", "carry")
    assert sims.task_stages("pick-place-v3") == sims.task_stages("metaworld/pick-place-v3")
    with pytest.raises(ValueError, match="'Pusj'"):
        sims.task_stages("Pusj")


def test_eval_refuses_bad_input_before_any_rollout(tmp_path: Path) -> None:
    from embodied.policies import make_policy

    policy = make_policy("mlp", state_dim=4, action_dim=3)
    policy.save_pretrained(tmp_path / "policy3")
    cfg = EvalConfig(policy=str(tmp_path / "policy3"), tasks=["Reach"], out=str(tmp_path / "r"))
    with pytest.raises(ValueError, match="the policy outputs 3-D actions, Reach takes 4-D"):
        run_eval(cfg)
    assert not (tmp_path / "r").exists()  # refused before a run directory or rollout
    with pytest.raises(ValueError, match="has no config.json"):
        run_eval(EvalConfig(policy=str(tmp_path / "nothing"), out=str(tmp_path / "r")))
    with pytest.raises(ValueError, match="videos = 3: expected at most episodes x repeats = 2"):
        run_eval(EvalConfig(episodes=2, videos=3, out=str(tmp_path / "r")))
    with pytest.raises(ValueError, match=r"repeats = 4 runs each initial state again.*sample=true"):
        run_eval(EvalConfig(policy=str(tmp_path / "policy3"), repeats=4, out=str(tmp_path / "r")))


def test_eval_env_options_give_a_policy_without_names_the_goal(tmp_path: Path) -> None:
    """A policy that records no value names (LeRobot's) and read the goal in the state needs
    ``env.goal_state=true``; without it the state sizes differ and eval refuses it."""
    from embodied.policies import make_policy

    env = sims.make("PickPlace", obs_mode="state", goal_state=True)
    size = env.observation_space["environment_state"].shape[0]
    env.close()
    policy = make_policy("mlp", state_dim=4, action_dim=4, env_state_dim=size)
    policy.save_pretrained(tmp_path / "goal")
    cfg = EvalConfig(policy=str(tmp_path / "goal"), tasks=["PickPlace"], episodes=1, videos=0,
                     out=str(tmp_path / "r"))  # fmt: skip
    with pytest.raises(ValueError, match=f"reads a {size}-D observation.environment_state"):
        run_eval(cfg)
    cfg.env = {"goal_sate": True}  # a misspelt option: refused by name, before any run directory
    with pytest.raises(ValueError, match="PickPlace takes no env option goal_sate"):
        run_eval(cfg)
    assert not (tmp_path / "r").exists()
    expert = EvalConfig(
        tasks=["Reach"], episodes=1, videos=0, env={"nope": 1}, out=str(tmp_path / "r")
    )
    with pytest.raises(ValueError, match="Reach takes no env option nope"):
        run_eval(expert)  # the scripted expert too: no policy check, the options are checked
    assert not (tmp_path / "r").exists()
    args = ["--tasks", "PickPlace", "--episodes", "1", "--videos", "0"]
    args += ["--out", str(tmp_path / "ok")]
    code = main(["eval", "--policy", str(tmp_path / "goal"), *args, "env.goal_state=true"])
    assert code == 0
    (result,) = json.loads(next((tmp_path / "ok").glob("*/results.json")).read_text())["results"]
    assert result["episodes"] == 1


def test_a_tabletop_policy_is_refused_on_metaworld_before_any_rollout(tmp_path: Path) -> None:
    """Same action and state sizes, other state values: the names tell them apart."""
    pytest.importorskip("metaworld")
    from embodied.policies import make_policy

    names = ["ee.x", "ee.y", "ee.z", "gripper.gap"]  # what tabletop datasets record
    policy = make_policy("mlp", state_dim=4, action_dim=4, state_names=names)
    policy.save_pretrained(tmp_path / "tabletop")
    cfg = EvalConfig(
        policy=str(tmp_path / "tabletop"), suite="metaworld", tasks=["reach-v3"], episodes=1,
        videos=0, out=str(tmp_path / "r"),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"reads observation.state values \['ee.x'.*hand.x"):
        run_eval(cfg)
    assert not (tmp_path / "r").exists()
    # The same policy on its own suite runs.
    cfg = EvalConfig(policy=str(tmp_path / "tabletop"), tasks=["Reach"], episodes=1, videos=0,
                     out=str(tmp_path / "ok"))  # fmt: skip
    _, (result,) = run_eval(cfg)
    assert result.episodes == 1


def test_overrides_may_follow_a_list_flag_or_come_after_flags(tmp_path: Path) -> None:
    """``--tasks Reach episodes=1`` and ``--out DIR name=x``: the key=value words are overrides,
    not a task named "episodes=1" or an unrecognised argument; a stray word is still refused."""
    code = main(["eval", "--policy", "random", "--tasks", "Reach", "episodes=1", "--videos", "0",
                 "--out", str(tmp_path), "name=mine"])  # fmt: skip
    assert code == 0
    (run,) = tmp_path.iterdir()
    results = json.loads((run / "results.json").read_text())
    assert run.name.startswith("mine-") and [r["task"] for r in results["results"]] == ["Reach"]
    assert results["results"][0]["episodes"] == 1
    with pytest.raises(SystemExit):
        main(["eval", "--policy", "random", "--out", str(tmp_path), "stray", "name=x", "--bad"])


def test_a_camera_policys_recorded_episodes_keep_every_image(tmp_path: Path) -> None:
    """Evaluating a camera planner skips the images it does not read, but ``--record`` writes
    every step's image: the dataset holds the env's renders, none black."""
    from embodied.datasets import LeRobotDataset
    from embodied.policies import make_policy

    policy = make_policy(
        "diffusion", state_dim=4, action_dim=4, image_keys=["observation.image"], image_size=16,
        n_obs_steps=1, horizon=8, n_action_steps=4, down_dims=[8, 16], vision_channels=[4, 8],
        num_keypoints=4, num_inference_steps=2,
    )  # fmt: skip
    policy.fit_normalizers({"observation.state": {"mean": np.zeros(4), "std": np.ones(4)},
                            "action": {"min": -np.ones(4), "max": np.ones(4)}})  # fmt: skip
    policy.save_pretrained(tmp_path / "camera")
    data = tmp_path / "recorded"
    assert main(["eval", "--policy", str(tmp_path / "camera"), "--tasks", "Reach", "--episodes",
                 "1", "--videos", "0", "--out", str(tmp_path), "--record", str(data),
                 "env.max_episode_steps=9"]) == 0  # fmt: skip
    images = LeRobotDataset(data).episode_frames(0, keys=["observation.image"])
    images = images["observation.image"]
    env = sims.make("Reach", image_size=16)
    try:
        first, _ = env.reset(seed=100_000)
    finally:
        env.close()
    assert len(images) == 10 and images.reshape(10, -1).max(axis=1).min() > 100
    assert np.abs(images[0].astype(int) - first["pixels"]).mean() < 10  # lossy video


def test_eval_repeats_sample_each_initial_state_again_and_count_the_states_solved(
    tmp_path: Path, monkeypatch
) -> None:
    """``repeats`` with ``sample=true`` runs every seed several times with fresh noise (where a
    sampling RL group can find a success) and the report counts the states ever solved, and
    those of them the greedy policy fails."""
    from embodied.policies import make_policy

    make_policy("mlp", state_dim=4, action_dim=4, init_log_std=-1.0).save_pretrained(tmp_path / "p")
    cfg = EvalConfig(policy=str(tmp_path / "p"), tasks=["Reach"], episodes=2, repeats=3,
                     sample=True, videos=2, out=str(tmp_path / "r"))  # fmt: skip
    run, (result,) = run_eval(cfg)
    assert (result.episodes, result.states) == (6, 2)
    assert result.episode_seeds == [100_000] * 3 + [100_001] * 3
    by_seed = {}
    for seed, won in zip(result.episode_seeds, result.episode_successes, strict=True):
        by_seed[seed] = by_seed.get(seed, False) or won
    assert result.states_solved == sum(by_seed.values())
    assert result.videos == ["videos/Reach-100000-0.mp4", "videos/Reach-100000-1.mp4"]
    report = (run.path / "report.md").read_text()
    assert "2 initial states per task" in report and "3 episodes each" in report
    # The untrained policy's greedy episode fails both states: all its solved states count
    assert (result.greedy_failed, result.solved_where_greedy_fails) == (2, result.states_solved)
    row = re.search(
        r"\| sampled where greedy fails \|\n.*\n"
        r"\| Reach \| 6 \|.* \| (\d)/2 \| (\d)/2 \| 0% \| (\d+)% \|",
        report,
    )
    assert row and int(row.group(1)) == int(row.group(2)) == result.states_solved, report
    assert int(row.group(3)) == round(100 * result.success_rate), report  # every state failed
    # Counting on made-up outcomes: greedy fails 5 and 7, sampling solves 5 and 6
    import embodied.evaluation.suite as suite

    greedy = [
        replace(_traj([w], [0], [0.0]), seed=s) for s, w in [(5, False), (6, True), (7, False)]
    ]
    monkeypatch.setattr(suite, "rollout_task", lambda *args, **kwargs: greedy)
    made_up = replace(
        result, episode_seeds=[5, 5, 6, 7], episode_successes=[False, True, True, False]
    )
    policy = Policy.from_pretrained(tmp_path / "p").eval()
    suite._compare_with_greedy(made_up, "Reach", policy, cfg, {})
    assert (made_up.greedy_failed, made_up.solved_where_greedy_fails) == (2, 1)
    assert made_up.greedy_success_rate == pytest.approx(1 / 3)
    assert made_up.sampled_where_greedy_fails == pytest.approx(1 / 3)  # 3 episodes of 5 and 7
    monkeypatch.undo()
    sampling = lambda vec: PolicyActor(policy, vec.num_envs, deterministic=False)  # noqa: E731
    trajs = rollout_task("Reach", sampling, 1, 7, {"obs_mode": "state"}, repeats=3)
    assert [t.seed for t in trajs] == [7, 7, 7]
    first = [t.actions[0].tolist() for t in trajs]  # one initial state, three noise draws
    assert first[0] != first[1] != first[2] != first[0]


def test_eval_policy_overrides_change_the_saved_config_not_the_weights(tmp_path: Path) -> None:
    """``policy_overrides`` evaluate a saved policy as GRPO samples it (its overrides, the same
    weights); a key the config lacks, or overrides for the scripted expert, are refused by name
    before any run directory."""
    import torch

    from embodied.evaluation.suite import _actor_factory
    from embodied.policies import make_policy

    saved = make_policy("mlp", state_dim=4, action_dim=4, init_log_std=-1.0)
    saved.save_pretrained(tmp_path / "p")
    cfg = EvalConfig(policy=str(tmp_path / "p"), tasks=["Reach"], episodes=1, videos=0,
                     sample=True, policy_overrides={"max_log_std": -1.0, "min_log_std": -6.0},
                     out=str(tmp_path / "r"))  # fmt: skip
    _, policy = _actor_factory(cfg)
    assert (policy.config.max_log_std, policy.config.min_log_std) == (-1.0, -6.0)
    for name, value in saved.state_dict().items():
        assert torch.equal(policy.state_dict()[name], value), name
    _, (result,) = run_eval(cfg)
    assert result.episodes == 1
    cfg.policy_overrides = {"min_stdd": 0.2}
    with pytest.raises(ValueError, match=r"policy_overrides names \['min_stdd'\], which the mlp"):
        run_eval(replace(cfg, out=str(tmp_path / "bad")))
    with pytest.raises(ValueError, match="policy_overrides apply to a saved policy, not "):
        run_eval(EvalConfig(tasks=["Reach"], policy_overrides={"min_std": 0.2},
                            out=str(tmp_path / "bad")))  # fmt: skip
    assert not (tmp_path / "bad").exists()


def test_eval_envs_step_in_one_process_with_one_policy_call_per_step(
    tmp_path: Path, monkeypatch
) -> None:
    """``envs=N`` runs N sub-envs in this process, acted on by one batched policy call per step
    (where a pixel planner's time goes), with each seed's episode as one sub-env runs it."""
    from embodied.policies import make_policy

    make_policy("mlp", state_dim=4, action_dim=4).save_pretrained(tmp_path / "p")
    kind = type(Policy.from_pretrained(tmp_path / "p"))
    calls: list[int] = []
    act = kind.act

    def counted(self: Policy, obs: dict, *args, **kwargs) -> object:
        calls.append(len(obs["observation.state"]))
        return act(self, obs, *args, **kwargs)

    monkeypatch.setattr(kind, "act", counted)
    runs, batches = {}, {}
    for name, options in [("one", {}), ("four", {"envs": 4})]:
        calls.clear()
        cfg = EvalConfig(policy=str(tmp_path / "p"), tasks=["Reach"], episodes=6, videos=0,
                         out=str(tmp_path / name), **options)  # fmt: skip
        _, (runs[name],) = run_eval(cfg)
        batches[name] = list(calls)
    assert set(batches["one"]) == {1} and len(batches["one"]) == 6 * 80  # Reach runs 80 steps
    assert max(batches["four"]) == 4 and len(batches["four"]) == 2 * 80  # 4, then the last 2
    for key in ("episode_seeds", "episode_successes", "progress_curves"):
        assert getattr(runs["four"], key) == getattr(runs["one"], key), key
    expert = [EvalConfig(tasks=["Push"], episodes=3, videos=0, out=str(tmp_path / f"e{n}"), envs=n)
              for n in (0, 3)]  # fmt: skip
    one, three = (run_eval(cfg)[1][0] for cfg in expert)
    assert three.progress_curves == one.progress_curves and three.success_rate == 1.0
    monkeypatch.undo()
    # With workers > 1, whole tasks go to worker processes, each loading the policy and stepping
    # its batched sub-envs: the same episodes, videos and recording, in task order
    from embodied.datasets import LeRobotDataset

    runs = {}
    for name, workers in [("here", 1), ("workers", 2)]:
        cfg = EvalConfig(policy=str(tmp_path / "p"), tasks=["Reach", "Push", "Reach"], episodes=3,
                         envs=3, workers=workers, videos=1, out=str(tmp_path / name),
                         record=str(tmp_path / name / "data"))  # fmt: skip
        run, runs[name] = run_eval(cfg)
        assert (run.path / "videos" / "Push-100000.mp4").is_file()
        table = LeRobotDataset(tmp_path / name / "data").episodes_table()
        runs[name + " recorded"] = [(str(r["tasks"]), int(r["seed"]), r["length"]) for r in table]
    assert [r.task for r in runs["workers"]] == ["Reach", "Push", "Reach"]
    assert runs["workers recorded"] == runs["here recorded"] and len(runs["here recorded"]) == 9
    for here, there in zip(runs["here"], runs["workers"], strict=True):
        assert there.progress_curves == here.progress_curves, here.task
