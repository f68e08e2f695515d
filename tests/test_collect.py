"""Vectorized rollouts and the collection job."""

from __future__ import annotations

import numpy as np
import pytest

import embodied.sims as sims
from embodied.rollout import rollout_episode, rollout_vector
from embodied.trajectory import trajectories_equal


def _expert_batch(vec):
    return lambda obs: np.stack(vec.call("scripted_action"))


@pytest.mark.parametrize("asynchronous", [False, True])
def test_vector_rollouts_equal_single_env_rollouts(asynchronous: bool) -> None:
    kwargs = {"obs_mode": "pixels_state", "image_size": 32}
    vec = sims.make_vec_env(
        "ButtonPress", 2, asynchronous=asynchronous, autoreset_mode="disabled", **kwargs
    )
    seeds = [5, 6, 7]
    trajs = sorted(rollout_vector(vec, _expert_batch(vec), seeds, "tabletop"), key=lambda t: t.seed)
    vec.close()
    assert [t.seed for t in trajs] == seeds
    env = sims.make("ButtonPress", **kwargs)
    for traj in trajs:
        single = rollout_episode(env, sims.make_expert(env), seed=traj.seed, suite="tabletop")
        assert traj.success and trajectories_equal(traj, single)


def test_step_limits_cut_episodes_off_as_failures() -> None:
    vec = sims.make_vec_env("PickPlace", 2, autoreset_mode="disabled", obs_mode="state")
    trajs = list(rollout_vector(vec, _expert_batch(vec), [0, 1, 2], "tabletop", [10, None, 20]))
    by_seed = {t.seed: t for t in trajs}
    assert by_seed[0].length == 10 and by_seed[2].length == 20
    for seed in (0, 2):
        assert by_seed[seed].truncated[-1] and not by_seed[seed].success
    assert by_seed[1].success and by_seed[1].terminated[-1]
    assert by_seed[1].metadata["reset_info"]["stage"] == 0
