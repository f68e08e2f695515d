"""Stages of Meta-World tasks (``embodied.sims.metaworld_stages``) and the MT10 preset; skipped
without Meta-World."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("metaworld")

import embodied.sims as sims  # noqa: E402
from embodied.sims import metaworld as mw  # noqa: E402
from embodied.sims.metaworld_stages import DEFAULT, MT10, RULES, stage_rule  # noqa: E402


def expert_env(task: str):
    """One env for all of a task's seeds: a reset with a seed starts the same episode as a new env
    would (checked below), and building the env costs more than an expert episode."""
    return sims.make(f"metaworld/{task}", obs_mode="state", terminate_on_success=True)


def expert_stages(env, seed: int) -> tuple[list[int], dict]:
    """Stage after the reset and after every step of one expert episode, and the last info."""
    expert = sims.make_expert(env)
    obs, info = env.reset(seed=seed)
    stages, done = [info["stage"]], False
    while not done:
        obs, _, terminated, truncated, info = env.step(expert(obs))
        stages.append(info["stage"])
        assert info["stage_name"] == env.unwrapped.stages[info["stage"]]
        n = len(env.unwrapped.stages)
        assert info["progress"] == np.float32((info["stage"] + info["success"]) / n)
        done = terminated or truncated
    return stages, info


@pytest.mark.parametrize("task", MT10)
def test_expert_stages_rise_and_end_at_the_last_stage(task: str) -> None:
    n = len(stage_rule(task).names)
    env = expert_env(task)
    # Seeds 0-2 (door-open: 0, 1, 3; Meta-World's door expert misses seed 2's handle).
    for seed in (0, 1, 3) if task == "door-open-v3" else (0, 1, 2):
        stages, info = expert_stages(env, seed)
        assert info["success"], f"{task} seed {seed}: the expert failed"
        assert np.all(np.diff(stages) >= 0), f"{task} seed {seed}: stages {stages}"
        assert stages[0] == 0 and stages[-1] == n - 1
        if n > 1:  # every stage is visited on the way
            assert set(stages) == set(range(n)), f"{task} seed {seed}: stages {stages}"
    env.close()


@pytest.mark.slow
@pytest.mark.parametrize("task", MT10)
def test_expert_stages_over_twenty_seeds(task: str) -> None:
    """Seeds 0-19. Meta-World's peg-insert-side expert once pulls a jammed peg back out of the
    hole and pushes it in again (seed 9): that episode undoes its last stage, as it undoes the
    task, and is counted rather than failed."""
    regressions, env = [], expert_env(task)
    for seed in range(20):
        stages, info = expert_stages(env, seed)
        if info["success"]:
            assert stages[-1] == len(stage_rule(task).names) - 1
        if np.any(np.diff(stages) < 0):
            regressions.append(seed)
    assert len(regressions) <= (1 if task == "peg-insert-side-v3" else 0), regressions
    env.close()


def test_a_seeded_reset_replays_the_episode_a_new_env_plays() -> None:
    """What lets one env serve every seed above: after other episodes, ``reset(seed=s)`` gives
    the stages and final state of seed s in a new env."""
    task = "peg-insert-side-v3"
    used = expert_env(task)
    for seed in (4, 1):
        expert_stages(used, seed)
    for seed in (1, 2):
        new = expert_env(task)
        assert expert_stages(used, seed)[0] == expert_stages(new, seed)[0]
        np.testing.assert_array_equal(used.unwrapped.data.qpos, new.unwrapped.data.qpos)
        new.close()
    used.close()


def test_every_mt10_task_has_its_own_rule_and_others_the_default() -> None:
    assert set(MT10) <= set(RULES)
    assert stage_rule("basketball-v3") is DEFAULT
    assert DEFAULT.names == ("approach", "manipulate")
    for task in MT10:  # the joints and sites the rules read exist in the task's model
        env = mw.MetaWorldEnv(task, obs_mode="state")
        rule = stage_rule(task)
        assert env.stages == rule.names
        for site in rule.sites:
            env.data.site(site)
        env.close()


def test_default_rule_on_a_task_outside_mt10() -> None:
    env = sims.make("metaworld/coffee-button-v3", obs_mode="state", terminate_on_success=True)
    expert = sims.make_expert(env)
    obs, info = env.reset(seed=0)
    assert info["stage_name"] == "approach" and info["progress"] == 0.0
    stages, done = [info["stage"]], False
    while not done:
        obs, _, terminated, truncated, info = env.step(expert(obs))
        stages.append(info["stage"])
        done = terminated or truncated
    assert info["success"] and stages[-1] == 1 and np.all(np.diff(stages) >= 0)
    env.close()


def test_stage_falls_back_when_the_task_is_undone() -> None:
    """Stages read the state now: a drawer pushed back shut returns to an earlier stage."""
    env = sims.make("metaworld/drawer-open-v3", obs_mode="state")
    env.reset(seed=0)
    inner = env.unwrapped
    adr = inner.model.jnt_qposadr[inner.model.joint("goal_slidey").id]
    inner.data.qpos[adr] = -0.1  # pulled 10 cm out
    _, _, _, _, info = env.step(np.zeros(4, dtype=np.float32))
    assert info["stage_name"] == "pull"
    inner.data.qpos[adr] = 0.0  # shut again
    _, _, _, _, info = env.step(np.zeros(4, dtype=np.float32))
    assert info["stage_name"] in ("approach", "hook")
    env.close()


def test_presets_expand_to_mt10_in_eval_and_collect() -> None:
    from embodied.apps.collect import CollectConfig
    from embodied.core.config import validate
    from embodied.evaluation.suite import suite_tasks

    assert mw.preset_tasks("mt10") == mw.preset_tasks("MT10") == MT10
    assert mw.preset_tasks("reach-v3") is None
    assert suite_tasks("metaworld", ["MT10"]) == [f"metaworld/{t}" for t in MT10]
    validate(CollectConfig(task="MT10"))
    with pytest.raises(ValueError, match="unknown task 'MT11'.*metaworld/<name> or MT10"):
        validate(CollectConfig(task="MT11"))


def test_mt10_collection_writes_one_multi_task_dataset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from embodied.apps import collect
    from embodied.datasets import LeRobotDataset

    # Two of the ten tasks keep the test short; the preset path is the same.
    monkeypatch.setitem(mw.PRESETS, "MT10", ("reach-v3", "button-press-topdown-v3"))
    cfg = collect.CollectConfig(task="MT10", episodes=2, obs_mode="state", out=str(tmp_path))
    summary = collect.run_collect(cfg)
    assert summary.episodes == 4 and summary.out == tmp_path
    dataset = LeRobotDataset(tmp_path)
    tasks = [row["task_name"] for row in dataset.episodes_table()]
    assert tasks == ["reach-v3"] * 2 + ["button-press-topdown-v3"] * 2  # Meta-World names


def test_failure_data_collects_and_gets_procedure_labels(tmp_path: Path) -> None:
    """Noisy, cut-off and rewound Meta-World episodes, labelled as on the tabletop."""
    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.apps.label import run_label
    from embodied.datasets import LeRobotDataset
    from embodied.rewards.labels import observation_stages

    cfg = CollectConfig(
        task="metaworld/button-press-topdown-v3",
        episodes=4,
        noise=0.1,
        cutoff=0.5,
        rewind=1.0,
        image_size=32,
        out=str(tmp_path),
    )
    summary = run_collect(cfg)
    assert summary.rewound >= 1
    run_label(tmp_path, method="procedure")
    dataset = LeRobotDataset(tmp_path)
    kinds = set()
    for i in range(dataset.num_episodes):
        traj = dataset.episode(i)
        labels = dataset.episode_frames(i, keys=["progress.label"])["progress.label"].ravel()
        stages = observation_stages(traj)
        if traj.success:
            kinds.add("success")
            assert labels[-1] == 1.0 and stages[-1] == 1
        elif traj.metadata.get("synthetic") == "rewind":
            kinds.add("rewind")
            assert labels[-1] < labels.max() < 1.0
        else:
            kinds.add("cut off")
            assert traj.truncated[-1] and labels[-1] < 1.0
    assert kinds == {"success", "rewind", "cut off"}
