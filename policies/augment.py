"""Planar rigid-motion augmentation of tabletop BC batches: the whole scene turned about a
vertical axis and slid across the table.

A tabletop task whose physics and expert depend only on where things are relative to each other
(push a block to a plate, reach a block) gives, for each demonstrated window, a valid window for
every turned and shifted copy of its scene. Each sample of a batch draws its own motion, shared
by all of its steps::

    theta ~ U(-yaw, yaw),  s ~ U(-shift, shift)^2
    p_xy   <- R(theta) (p_xy - c) + c + s    hand (observation.state[:2]), every object with .x .y
    q      <- q_z(theta) (x) q               every object with .qw .qx .qy .qz (yaw in front)
    a_xy   <- R(theta) a_xy                  actions (dx, dy, ...) are world-frame displacements

about a centre ``c`` (a policy passes the mean hand position of its data, the middle of where
things happen).

Heights, other values (a drawer's opening, the gripper) and images are untouched, so turning a
scene is only valid for state-only policies on tasks without a fixed orientation (a drawer that
opens toward the robot is not one).

Turned states leave the data's range (a block's ``qw`` has std 0.01 when blocks sit square), so
``turned_stats`` gives the mean and std of every value under the augmentation, for the
normalisers. With ``u = x - c_x``, ``v = y - c_y`` and ``k_n = E[cos n theta] = sin(n yaw) /
(n yaw)`` (``E[sin] = 0``)::

    E[x'] = c_x + k_1 E[u]
    E[(x' - c_x)^2] = (1 + k_2) / 2 E[u^2] + (1 - k_2) / 2 E[v^2] + shift^2 / 3   (y': swap u, v)

and the quaternion pairs ``(qw, qz)``, ``(qx, qy)`` turn by ``theta / 2`` about 0, unshifted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from embodied.core.nn import object_groups, value_quantity

QUATERNION = ("qw", "qx", "qy", "qz")


def planar_indices(names: Sequence[str]) -> tuple[list[tuple[int, int]], list[tuple[int, ...]]]:
    """The ``(x, y)`` value index pairs and ``(qw, qx, qy, qz)`` index quadruples of the objects of
    a flat state whose values are named ``object.quantity``."""
    positions, quaternions = [], []
    for _, values in object_groups(names):
        local = {value_quantity(names[i]): i for i in values}
        if "x" in local and "y" in local:
            positions.append((local["x"], local["y"]))
        if all(q in local for q in QUATERNION):
            quaternions.append(tuple(local[q] for q in QUATERNION))
    return positions, quaternions


def turn(
    x: torch.Tensor, y: torch.Tensor, angle: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` turned by ``angle [B]`` (``x``, ``y``: ``[B, ...]``, one angle per sample)."""
    angle = angle.view(-1, *[1] * (x.ndim - 1))
    cos, sin = torch.cos(angle), torch.sin(angle)
    return cos * x - sin * y, sin * x + cos * y


class PlanarAugment:
    """Turn (up to ``yaw`` degrees either way) and shift (up to ``shift`` metres on each axis) raw
    tabletop windows: ``observation.state [B, T, S]`` starting with the hand's x, y;
    ``observation.environment_state [B, T, D]`` with value ``names``; actions ``[B, H, A]``
    starting with dx, dy."""

    def __init__(self, names: Sequence[str], yaw: float, shift: float) -> None:
        if yaw < 0 or shift < 0:
            raise ValueError(f"augmentation needs yaw >= 0 and shift >= 0, got {yaw}, {shift}")
        self.yaw, self.shift = math.radians(yaw), shift
        positions, quaternions = planar_indices(names)
        self.x = torch.tensor([i for i, _ in positions], dtype=torch.long)
        self.y = torch.tensor([j for _, j in positions], dtype=torch.long)
        self.q = torch.tensor(quaternions, dtype=torch.long).reshape(-1, 4)

    def __call__(
        self,
        state: torch.Tensor,
        env_state: torch.Tensor | None,
        action: torch.Tensor,
        center: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Turned (about ``center`` ``[2]``, default the origin) and shifted copies; the inputs
        are not modified."""
        batch = state.shape[0]
        theta = ((2 * torch.rand(batch, generator=generator) - 1) * self.yaw).to(state)
        shift = ((2 * torch.rand(batch, 2, generator=generator) - 1) * self.shift).to(state)
        c = torch.zeros(2).to(state) if center is None else torch.as_tensor(center).to(state)
        # p' = R (p - c) + c + s = R p + t, with t = c - R c + s the same for every point.
        turned_c = turn(c[0].expand(batch), c[1].expand(batch), theta)
        tx, ty = (c[k] - turned_c[k] + shift[:, k] for k in range(2))

        state, action = state.clone(), action.clone()
        x, y = turn(state[..., 0], state[..., 1], theta)
        state[..., 0], state[..., 1] = x + tx[:, None], y + ty[:, None]
        action[..., 0], action[..., 1] = turn(action[..., 0], action[..., 1], theta)
        if env_state is not None:
            env_state = env_state.clone()
            x, y = turn(env_state[..., self.x], env_state[..., self.y], theta)
            env_state[..., self.x], env_state[..., self.y] = (
                x + tx[:, None, None],
                y + ty[:, None, None],
            )
            # q_z(theta) (x) q turns the pairs (qw, qz) and (qx, qy) by theta / 2.
            for a, b in ((0, 3), (1, 2)):
                ia, ib = self.q[:, a], self.q[:, b]
                pair = turn(env_state[..., ia], env_state[..., ib], theta / 2)
                env_state[..., ia], env_state[..., ib] = pair
        return state, env_state, action

    def turned_stats(
        self,
        state: Mapping[str, Any],
        env_state: Mapping[str, Any] | None,
        center: Sequence[float],
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Statistics (``mean``, ``std``) of the state and environment state under the
        augmentation about ``center``, from the data's (other keys are kept)."""

        def turned(
            stats: Mapping[str, Any],
            pairs: list[tuple[int, int]],
            angle: float,
            c: Sequence[float],
            shift: float,
        ) -> dict[str, Any]:
            mean = np.asarray(stats["mean"], dtype=np.float64).reshape(-1).copy()
            std = np.asarray(stats["std"], dtype=np.float64).reshape(-1).copy()
            k1, k2 = np.sinc(angle / np.pi), np.sinc(2 * angle / np.pi)  # sin(n a) / (n a)
            for i, j in pairs:
                u, v = mean[i] - c[0], mean[j] - c[1]
                uu, vv = std[i] ** 2 + u**2, std[j] ** 2 + v**2
                for index, first, second, centre, offset in (
                    (i, uu, vv, c[0], u),
                    (j, vv, uu, c[1], v),
                ):
                    second_moment = (1 + k2) / 2 * first + (1 - k2) / 2 * second
                    mean[index] = centre + k1 * offset
                    std[index] = np.sqrt(
                        max(second_moment - (k1 * offset) ** 2, 0.0) + shift**2 / 3
                    )
            return {**stats, "mean": mean, "std": std}

        center = [float(x) for x in center]
        state = turned(state, [(0, 1)], self.yaw, center, self.shift)
        if env_state is not None:
            positions = list(zip(self.x.tolist(), self.y.tolist(), strict=True))
            env_state = turned(env_state, positions, self.yaw, center, self.shift)
            halves = [(w, z) for w, _, _, z in self.q.tolist()]
            halves += [(x, y) for _, x, y, _ in self.q.tolist()]
            env_state = turned(env_state, halves, self.yaw / 2, [0.0, 0.0], 0.0)
        return state, env_state
