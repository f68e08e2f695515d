"""Rollout backends: per-episode sampling makes trajectories independent of how episodes are
batched; the Ray backend (local instance, 2 CPUs) reproduces the local one, follows weight
broadcasts, and survives a worker's death. Skipped without Ray (extra ``distributed``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.policies import make_policy
from embodied.rollout.backends import DistributedConfig, LocalRollouts, TaskEnvs, make_rollouts
from embodied.sims import make_vec_env

STATS = {
    "observation.state": {"mean": np.zeros(4), "std": np.full(4, 0.1)},
    "observation.environment_state": {"mean": np.zeros(39), "std": np.ones(39)},
    "action": {"min": -np.ones(4), "max": np.ones(4)},
}
ENV = {"obs_mode": "state", "max_episode_steps": 15}
SEEDS = [3, 3, 4, 4, 5, 5]  # three GRPO groups of two


def _policy():
    torch.manual_seed(0)
    policy = make_policy("mlp", state_dim=4, action_dim=4, env_state_dim=39, hidden=[16])
    return policy.fit_normalizers(STATS).eval()


def _assert_same(a: list, b: list) -> None:
    assert [t.seed for t in a] == [t.seed for t in b] == SEEDS
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x.actions, y.actions, atol=1e-5)
        np.testing.assert_allclose(
            x.observations["agent_pos"], y.observations["agent_pos"], atol=1e-5
        )
        np.testing.assert_allclose(x.policy_outputs["log_probs"], y.policy_outputs["log_probs"],
                                   atol=1e-4)  # fmt: skip
        assert (x.length, x.success) == (y.length, y.success)


def test_local_trajectories_do_not_depend_on_the_batch() -> None:
    policy = _policy()
    runs = []
    for num_envs in (1, 4):
        rollouts = LocalRollouts("Reach", ENV, policy, num_envs)
        try:
            runs.append(rollouts.run(SEEDS, sample_seed=7))
        finally:
            rollouts.close()
    _assert_same(*runs)
    first, second = runs[0][0], runs[0][1]  # one group: same start, different samples
    np.testing.assert_array_equal(
        first.observations["agent_pos"][0], second.observations["agent_pos"][0]
    )
    assert not np.allclose(first.actions, second.actions)
    with pytest.raises(ValueError, match="config key 'backend' = 'mpi': expected one of"):
        make_rollouts(DistributedConfig(backend="mpi"), "Reach", ENV, policy, 1)


def test_tasks_share_a_vector_env_and_keep_their_trajectories(monkeypatch) -> None:
    """Two tasks' episodes in one vector env (one batched policy call for both) are the episodes
    each task's own backend gives for the same seeds, episode ids and sampling seed; an episode
    runs on a sub-env of its task, and a task the vector env lacks is refused by name."""
    policy = _policy()
    act, sizes = policy.act, []

    def counted(obs, *args, **kwargs):
        sizes.append(len(next(iter(obs.values()))))
        return act(obs, *args, **kwargs)

    seeds, tasks = [3, 3, 4, 4, 5, 5], ["Reach", "Push", "Reach", "Push", "Push", "Push"]
    both = TaskEnvs(["Reach", "Push"], ENV, 2)
    try:
        monkeypatch.setattr(policy, "act", counted)
        mixed = both.rollout(policy, seeds, range(6), tasks, sample_seed=7, deterministic=False)
        monkeypatch.undo()
        assert sizes[0] == 4  # two episodes of each task in the first call
        with pytest.raises(ValueError, match=r"episode task\(s\) \['Pick'\] have no sub-env"):
            both.rollout(policy, [1], [0], ["Pick"], sample_seed=7, deterministic=False)
    finally:
        both.close()
    assert [t.task for t in mixed] == tasks and [t.seed for t in mixed] == seeds
    for task in ("Reach", "Push"):
        ids = [i for i, k in enumerate(tasks) if k == task]
        alone = TaskEnvs([task], ENV, 1)
        try:
            own = alone.rollout(policy, [seeds[i] for i in ids], ids, [task] * len(ids), 7, False)
        finally:
            alone.close()
        for i, traj in zip(ids, own, strict=True):
            np.testing.assert_allclose(mixed[i].actions, traj.actions, atol=1e-5)
            assert mixed[i].length == traj.length
    local = LocalRollouts(["Reach", "Push"], ENV, policy, 1)
    try:
        with pytest.raises(ValueError, match="name each episode's task"):
            local.run([3], sample_seed=7)
        with pytest.raises(ValueError, match=r"task\(s\) \['Pick'\] are not this backend's"):
            local.run([3], sample_seed=7, tasks=["Pick"])
    finally:
        local.close()
    with pytest.raises(ValueError, match="got 1 tasks for 2 envs"):
        make_vec_env(["Reach"], 2)


def test_idle_envs_cost_no_policy_call(monkeypatch) -> None:
    """Sub-envs without an episode (more envs than seeds, or finished early) keep stepping but
    the policy is asked only for the episodes' observations."""
    policy = _policy()
    act, sizes = policy.act, []

    def counted(obs, *args, **kwargs):
        sizes.append(len(next(iter(obs.values()))))
        return act(obs, *args, **kwargs)

    monkeypatch.setattr(policy, "act", counted)
    rollouts = LocalRollouts("Reach", ENV, policy, 4)
    try:
        (traj,) = rollouts.run([3], sample_seed=7)
    finally:
        rollouts.close()
    assert sizes and set(sizes) == {1}  # three of the four envs never had an episode
    assert len(sizes) == traj.num_decisions


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
    yield ray
    ray.shutdown()


def test_ray_backend_gives_the_local_trajectories(ray_instance) -> None:
    policy = _policy()
    local = LocalRollouts("Reach", ENV, policy, 4)
    cfg = DistributedConfig(backend="ray", workers=2, envs_per_worker=2)
    remote = make_rollouts(cfg, "Reach", ENV, policy, 4)
    try:
        _assert_same(remote.run(SEEDS, sample_seed=7), local.run(SEEDS, sample_seed=7))
        # New weights on the driver reach the workers with set_weights.
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(0.3)
        remote.set_weights(policy)
        after = remote.run(SEEDS, sample_seed=7)
        _assert_same(after, local.run(SEEDS, sample_seed=7))
        # A worker dies: the iteration finishes on the other one, with a warning.
        ray_instance.kill(remote.workers[0])
        with pytest.warns(UserWarning, match="rollout worker died"):
            survived = remote.run(SEEDS, sample_seed=7)
        assert len(remote.workers) == 1
        _assert_same(survived, after)
    finally:
        remote.close()
        local.close()


def test_a_multi_task_run_fits_its_ray_actors_on_the_machine(ray_instance) -> None:
    """Tasks whose envs share their options step in one backend: two actors, each holding its
    half of every task's episodes (2 groups of 2 on Reach, 1 on Push), so it steps them all in one
    batched call. Tasks of different options get a backend each; those take turns, so their four
    actors share the instance's two CPUs (a CPU each would leave two of them waiting forever).
    Either way the trajectories are the local ones; more workers than the instance has CPUs is
    refused by name instead of waiting."""
    from embodied.train.grpo import GRPOConfig
    from embodied.train.onpolicy import TaskGroups

    policy, cfg = _policy(), GRPOConfig(group_size=2)
    cfg.distributed = DistributedConfig(backend="ray", workers=2)
    with pytest.raises(ValueError, match=r"distributed.workers=3: the local Ray instance has "
                       r"2 CPUs"):  # fmt: skip
        make_rollouts(DistributedConfig(backend="ray", workers=3), "Reach", ENV, policy, 1)
    longer = ENV | {"max_episode_steps": 20}
    for envs, actors in (({"Reach": ENV, "Push": ENV}, 2), ({"Reach": ENV, "Push": longer}, 4)):
        remote, local = TaskGroups(cfg, envs, policy, 3), TaskGroups(GRPOConfig(group_size=2),
                                                                    envs, policy, 3)  # fmt: skip
        try:
            workers = [w for _, backend in remote.backends for w in backend.workers]
            assert all(backend.envs_per_worker == 2 for _, backend in remote.backends)
            pids = ray_instance.get([w.pid.remote() for w in workers], timeout=120)
            assert len(set(pids)) == actors
            got, want = (g.run([3, 4, 5], group_size=2, sample_seed=7) for g in (remote, local))
            assert [t.task for t in got] == ["Reach", "Reach", "Push", "Push", "Reach", "Reach"]
            assert [t.seed for t in got] == [3, 3, 4, 4, 5, 5]
            for x, y in zip(got, want, strict=True):
                np.testing.assert_allclose(x.actions, y.actions, atol=1e-5)
        finally:
            remote.close()
            local.close()


def test_bench_rollout_compares_backends_with_the_sync_baseline(ray_instance, capsys) -> None:
    import json

    from embodied.apps.bench.rollout import (
        CAMERA_EVERY,
        CAMERA_ONE,
        CAMERA_READ,
        RAY_SHARE,
        TASKS_IN_TURN,
        TASKS_SHARED,
    )
    from embodied.apps.cli import main

    assert main(["bench", "rollout", "--json", "--task", "Reach", "--envs", "2",
                 "--episodes", "2", "--repeats", "1", "--ray-workers", "2",
                 "--max-steps", "16", "--multi", "2"]) == 0  # fmt: skip
    rows = {r["backend"]: r for r in json.loads(capsys.readouterr().out)}
    every, read = CAMERA_EVERY, CAMERA_READ
    assert set(rows) == {"sync", "async", "ray", RAY_SHARE, every, read, CAMERA_ONE,
                         TASKS_IN_TURN, TASKS_SHARED}  # fmt: skip
    # two tasks' sub-envs in one vector env, against each task's two in turn
    shared, turns = rows[TASKS_SHARED], rows[TASKS_IN_TURN]
    assert (shared["envs"], shared["baseline"]) == (4, f"{TASKS_IN_TURN} (2 envs)")
    assert turns["speedup"] == 1.0 and shared["steps_per_s"] > 0
    assert rows["sync"]["speedup"] == 1.0 and rows["ray"]["envs"] == 2
    # Ray's default: a sub-env per episode (one each on two workers), against two in all
    assert (rows[RAY_SHARE]["envs"], rows[RAY_SHARE]["baseline"]) == (2, "ray (2 envs)")
    assert rows[every]["speedup"] == 1.0 and rows[read]["baseline"] == f"{every} (2 envs)"
    state = [rows[b] for b in ("sync", "async", "ray")]
    assert all(r["steps_per_s"] > 0 and r["baseline"] == "sync (2 envs)" for r in state)
    assert rows[RAY_SHARE]["steps_per_s"] > 0
    assert rows[read]["steps_per_s"] > 0
    one = rows[CAMERA_ONE]  # one policy call per sub-env step, against the batched call of two
    assert (one["envs"], one["baseline"]) == (1, f"{read} (2 envs)") and one["steps_per_s"] > 0
    for r in rows.values():  # episodes cut at --max-steps (Reach's own limit is 80 steps)
        assert r["steps_per_s"] * 60 / r["episodes_per_min"] == pytest.approx(16)


def test_a_private_ray_instance_rolls_out_at_the_learners_priority() -> None:
    """The workers of a Ray instance the backend starts run as nice as the learner (Ray's default
    would add 15): niced workers lose the cores to anything else on the machine while the learner
    waits on their rollouts. A fresh process, since this module's Ray instance is started apart."""
    pytest.importorskip("ray")
    script = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_distributed import ENV, _policy\n"
        "from embodied.rollout.backends import DistributedConfig, make_rollouts\n"
        "cfg = DistributedConfig('ray', workers=1, num_cpus=1)\n"
        "rollouts = make_rollouts(cfg, 'Reach', ENV, _policy(), 1)\n"
        "pid = rollouts.ray.get(rollouts.workers[0].pid.remote())\n"
        "nice = [os.getpriority(os.PRIO_PROCESS, p) for p in (0, pid)]\n"
        "print('niceness', *nice)\n"
        "rollouts.close()\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, preexec_fn=lambda: os.nice(3))  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    learner, worker = run.stdout.split("niceness")[-1].split()
    assert (int(learner), int(worker)) == (3, 3)
