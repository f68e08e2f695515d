"""Rollout backends: per-episode sampling makes trajectories independent of how episodes are
batched; the Ray backend (local instance, 2 CPUs) reproduces the local one, follows weight
broadcasts, and survives a worker's death. Skipped without Ray (extra ``distributed``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from embodied.policies import make_policy
from embodied.rollout.backends import DistributedConfig, LocalRollouts, make_rollouts

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
    """Two tasks' backends take turns, so their four actors share the instance's two CPUs
    (a CPU each would leave two of them waiting forever) and give the local trajectories; more
    workers than the instance has CPUs is refused by name instead of waiting. Each worker holds
    its half of a task's episodes (2 groups of 2), so it steps them all in one batched call."""
    from embodied.train.grpo import GRPOConfig
    from embodied.train.onpolicy import TaskGroups

    policy, envs = _policy(), {"Reach": ENV, "Push": ENV}
    cfg = GRPOConfig(group_size=2)
    cfg.distributed = DistributedConfig(backend="ray", workers=2)
    remote, local = TaskGroups(cfg, envs, policy, 3), TaskGroups(GRPOConfig(group_size=2), envs,
                                                                policy, 3)  # fmt: skip
    try:
        workers = [w for backend in remote.backends.values() for w in backend.workers]
        assert [b.envs_per_worker for b in remote.backends.values()] == [2, 2]
        with pytest.raises(ValueError, match=r"distributed.workers=3: the local Ray instance has "
                           r"2 CPUs"):  # fmt: skip
            make_rollouts(DistributedConfig(backend="ray", workers=3), "Reach", ENV, policy, 1)
        pids = ray_instance.get([w.pid.remote() for w in workers], timeout=120)
        assert len(set(pids)) == 4
        got, want = (g.run([3, 4, 5], group_size=2, sample_seed=7) for g in (remote, local))
        assert [t.task for t in got] == ["Reach", "Reach", "Push", "Push", "Reach", "Reach"]
        for x, y in zip(got, want, strict=True):
            np.testing.assert_allclose(x.actions, y.actions, atol=1e-5)
    finally:
        remote.close()
        local.close()


def test_bench_rollout_compares_backends_with_the_sync_baseline(ray_instance, capsys) -> None:
    import json

    from embodied.apps.bench.rollout import CAMERA_EVERY, CAMERA_ONE, CAMERA_READ, RAY_SHARE
    from embodied.apps.cli import main

    assert main(["bench", "rollout", "--json", "--task", "Reach", "--envs", "2",
                 "--episodes", "2", "--repeats", "1", "--ray-workers", "2",
                 "--max-steps", "16"]) == 0  # fmt: skip
    rows = {r["backend"]: r for r in json.loads(capsys.readouterr().out)}
    every, read = CAMERA_EVERY, CAMERA_READ
    assert set(rows) == {"sync", "async", "ray", RAY_SHARE, every, read, CAMERA_ONE}
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
