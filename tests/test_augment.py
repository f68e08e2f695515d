"""Planar rigid-motion augmentation: a turned and shifted tabletop window is the same scene seen
from elsewhere (relative geometry, heights, orientation and the expert's action all agree)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from embodied.policies.augment import PlanarAugment, planar_indices
from embodied.policies.diffusion import DiffusionConfig, DiffusionPolicy

NAMES = [
    *[f"block_red.{q}" for q in ("x", "y", "z", "qw", "qx", "qy", "qz")],
    *[f"plate_green.{q}" for q in "xyz"],
    "drawer.opening",
]
RED, PLATE, RED_Q = [0, 1, 2], [7, 8, 9], [3, 4, 5, 6]


def window(batch: int = 6, steps: int = 2, horizon: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    state = torch.rand(batch, steps, 4, generator=g) * 0.4 - 0.2
    env = torch.rand(batch, steps, len(NAMES), generator=g) * 0.4 - 0.2
    quaternion = torch.randn(batch, steps, 4, generator=g)
    env[..., RED_Q] = quaternion / quaternion.norm(dim=-1, keepdim=True)
    action = torch.rand(batch, horizon, 4, generator=g) * 2 - 1
    return state, env, action


def turn_of(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """The angle that takes the 2-D vectors ``before`` to ``after`` ``[..., 2]``."""
    cross = before[..., 0] * after[..., 1] - before[..., 1] * after[..., 0]
    return torch.atan2(cross, (before * after).sum(-1))


def test_planar_indices_find_positions_and_quaternions():
    assert planar_indices(NAMES) == ([(0, 1), (7, 8)], [(3, 4, 5, 6)])


def test_turned_scene_keeps_its_geometry_and_turns_actions_and_orientations():
    state, env, action = window()
    center = torch.tensor([0.05, -0.08])
    new_state, new_env, new_action = PlanarAugment(NAMES, yaw=180, shift=0.05)(
        state, env, action, center
    )
    hand, new_hand = state[..., :2], new_state[..., :2]
    for index in (RED, PLATE):
        # Offsets from the hand keep their length and turn by the sample's angle.
        offset, new_offset = env[..., index[:2]] - hand, new_env[..., index[:2]] - new_hand
        torch.testing.assert_close(new_offset.norm(dim=-1), offset.norm(dim=-1))
        torch.testing.assert_close(new_env[..., index[2]], env[..., index[2]])  # heights
    theta = turn_of(env[..., RED[:2]] - hand, new_env[..., RED[:2]] - new_hand)  # [B, T]
    assert theta.abs().max() > 0.5  # really turned
    torch.testing.assert_close(theta, theta[:, :1].expand_as(theta))  # one angle per window
    plate_turn = turn_of(env[..., PLATE[:2]] - hand, new_env[..., PLATE[:2]] - new_hand)
    torch.testing.assert_close(
        torch.remainder(plate_turn - theta + np.pi, 2 * np.pi) - np.pi,
        torch.zeros_like(theta),
        atol=1e-5,
        rtol=0,
    )
    # Actions turn by the same angle; the gripper and untouched values stay.
    action_turn = turn_of(action[..., :2], new_action[..., :2])
    torch.testing.assert_close(
        torch.remainder(action_turn - theta[:, :1] + np.pi, 2 * np.pi) - np.pi,
        torch.zeros_like(action_turn),
        atol=1e-5,
        rtol=0,
    )
    torch.testing.assert_close(new_action[..., 2:], action[..., 2:])
    torch.testing.assert_close(new_state[..., 2:], state[..., 2:])
    torch.testing.assert_close(new_env[..., -1], env[..., -1])
    # The block's orientation: the new rotation is the turn about z after the old one.
    wxyz = env[..., RED_Q].reshape(-1, 4).double().numpy()
    new_wxyz = new_env[..., RED_Q].reshape(-1, 4).double().numpy()
    turns = Rotation.from_euler("z", theta.reshape(-1, 1).double().numpy())
    expected = (turns * Rotation.from_quat(wxyz, scalar_first=True)).as_matrix()
    np.testing.assert_allclose(
        Rotation.from_quat(new_wxyz, scalar_first=True).as_matrix(), expected, atol=1e-5
    )
    # The centre stays where it is under a pure turn.
    pinned = torch.zeros_like(state)
    pinned[..., :2] = center
    turned, _, _ = PlanarAugment(NAMES, yaw=90, shift=0.0)(pinned, None, action, center)
    torch.testing.assert_close(turned, pinned)


def test_nothing_asked_changes_nothing_and_inputs_are_not_modified():
    state, env, action = window()
    copies = [x.clone() for x in (state, env, action)]
    same = PlanarAugment(NAMES, yaw=0.0, shift=0.0)(state, env, action)
    for a, b in zip(same, copies, strict=True):
        torch.testing.assert_close(a, b)
    PlanarAugment(NAMES, yaw=30.0, shift=0.1)(state, env, action)
    for a, b in zip((state, env, action), copies, strict=True):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="yaw >= 0"):
        PlanarAugment(NAMES, yaw=-1.0, shift=0.0)


def policy_config(**overrides) -> DiffusionConfig:
    values = dict(
        state_dim=4,
        action_dim=4,
        env_state_dim=len(NAMES),
        env_state_names=NAMES,
        env_state_encoder="objects",
        object_relative=True,
        n_obs_steps=2,
        horizon=8,
        n_action_steps=4,
        vocab=["<unk>", "block", "green", "plate", "push", "red", "the", "to"],
        embed_dim=16,
        down_dims=[16, 32],
        num_train_timesteps=20,
        num_inference_steps=5,
        augment_yaw=180.0,
        augment_shift=0.03,
    )
    return DiffusionConfig(**{**values, **overrides})


def test_diffusion_bc_trains_on_turned_windows():
    """``augment_yaw`` turns each BC window (the loss sees new actions, the batch is untouched)
    and the loss still trains the network; images or unnamed states are refused."""
    state, env, action = window(batch=4)
    stats = {
        "observation.state": {"mean": np.zeros(4), "std": np.ones(4)},
        "observation.environment_state": {"mean": np.zeros(len(NAMES)), "std": np.ones(len(NAMES))},
        "action": {"min": -np.ones(4), "max": np.ones(4)},
    }
    torch.manual_seed(0)
    policy = DiffusionPolicy(policy_config()).fit_normalizers(stats)
    batch = {
        "observation.state": state,
        "observation.environment_state": env,
        "action": action,
        "instruction": ["push the red block to the green plate"] * 4,
    }
    kept = {k: v.clone() for k, v in batch.items() if torch.is_tensor(v)}
    torch.manual_seed(1)
    _, _, x0, _, _ = policy.bc_inputs(batch)
    assert (x0[..., :2] - action[..., :2]).abs().max() > 0.1  # the actions were turned
    assert x0.abs().max() <= 1.0  # and kept in the data's range
    torch.testing.assert_close(x0[..., 2:], action[..., 2:])
    for key, value in kept.items():
        torch.testing.assert_close(batch[key], value)
    loss = policy.bc_loss(batch)
    loss.backward()
    assert (
        torch.isfinite(loss)
        and policy.model.object_encoder.tokens.value_proj.weight.grad.abs().sum() > 0
    )

    with pytest.raises(ValueError, match="cannot turn images"):
        policy_config(image_keys=["observation.image"])
    with pytest.raises(ValueError, match="env_state_dim=11 with 0 names"):
        policy_config(env_state_names=[], env_state_encoder="flat")
    with pytest.raises(ValueError, match="augment_shift must be >= 0"):
        policy_config(augment_shift=-0.1)


@pytest.mark.parametrize(("yaw", "shift"), [(30.0, 0.02), (180.0, 0.05)])
def test_turned_stats_match_the_turned_data(yaw: float, shift: float):
    """The normalisers' statistics under the augmentation equal those measured on turned data
    (a block's ``qw`` at std 0.01 would otherwise normalise a quarter turn to -70)."""
    n = 40000
    g = torch.Generator().manual_seed(0)
    state = torch.randn(n, 1, 4, generator=g) * torch.tensor([0.1, 0.05, 0.02, 0.01])
    state += torch.tensor([0.0, -0.1, 0.07, 0.0])
    env = torch.randn(n, 1, len(NAMES), generator=g) * 0.01
    env[..., RED[:2]] = env[..., RED[:2]] * 14 + torch.tensor([0.03, -0.09])
    env[..., PLATE[:2]] = env[..., PLATE[:2]] * 7 + torch.tensor([-0.1, 0.2])
    env[..., RED_Q[0]] += 1.0
    env[..., RED_Q] = env[..., RED_Q] / env[..., RED_Q].norm(dim=-1, keepdim=True)

    def stats(x: torch.Tensor) -> dict:
        flat = x.reshape(n, -1).double()
        return {"mean": flat.mean(0).numpy(), "std": flat.std(0).numpy(), "count": n}

    augment = PlanarAugment(NAMES, yaw=yaw, shift=shift)
    center = state[:, 0, :2].mean(0)
    turned = augment(state, env, torch.zeros(n, 2, 4), center, generator=g)
    predicted = augment.turned_stats(stats(state), stats(env), center.tolist())
    for new, measured in zip(predicted, turned[:2], strict=True):
        expected = stats(measured)
        assert new["count"] == n  # other keys are kept
        np.testing.assert_allclose(new["mean"], expected["mean"], atol=4e-3)
        np.testing.assert_allclose(new["std"], expected["std"], rtol=0.03, atol=2e-4)
    qw = RED_Q[0]
    assert predicted[1]["std"][qw] > 0.005 > 10 * stats(env)["std"][qw]  # really widened
