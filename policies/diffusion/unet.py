"""The conditional 1-D U-Net of Diffusion Policy (Chi et al. 2023) and its blocks: it maps a noisy
action chunk ``[B, T, A]``, a timestep and a global conditioning vector to a chunk of the same
shape (the noise, ``x_0`` or a flow velocity, by what the planner trains it on)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from embodied.core.nn import Mish


class SinusoidalPosEmb(nn.Module):
    """Timestep embedding ``[sin(t w_i), cos(t w_i)]``, ``w_i = 10000^(-i / (half - 1))``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """``[B]`` timesteps -> ``[B, dim]``."""
        half = self.dim // 2
        freqs = torch.exp(
            torch.arange(half, device=t.device) * (-math.log(10000.0) / max(half - 1, 1))
        )
        angles = t.float()[:, None] * freqs[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


class Conv1dBlock(nn.Module):
    """``Conv1d -> GroupNorm -> Mish`` (same length)."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, n_groups: int
    ) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2),
            nn.GroupNorm(n_groups, out_channels),
            Mish(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C_in, T] -> [B, C_out, T]``."""
        return self.block(x)


class ConditionalResidualBlock1D(nn.Module):
    """Two conv blocks with FiLM in between: ``h = scale(c) * block1(x) + bias(c)``,
    ``out = block2(h) + skip(x)``, where ``c`` is the timestep embedding ++ global conditioning."""

    def __init__(
        self, in_channels: int, out_channels: int, cond_dim: int, kernel_size: int, n_groups: int
    ) -> None:
        super().__init__()
        self.block1 = Conv1dBlock(in_channels, out_channels, kernel_size, n_groups)
        self.block2 = Conv1dBlock(out_channels, out_channels, kernel_size, n_groups)
        self.film = nn.Sequential(Mish(), nn.Linear(cond_dim, 2 * out_channels))
        self.skip = (
            nn.Conv1d(in_channels, out_channels, 1)
            if in_channels != out_channels
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """``x [B, C_in, T]``, ``cond [B, cond_dim]`` -> ``[B, C_out, T]``."""
        scale, bias = self.film(cond).unsqueeze(-1).chunk(2, dim=1)  # each [B, C_out, 1]
        h = scale * self.block1(x) + bias
        return self.block2(h) + self.skip(x)


class ConditionalUnet1D(nn.Module):
    """Diffusion Policy's noise predictor over an action sequence ``[B, T, A]``.

    Down path: per level two conditional residual blocks, then a stride-2 conv (except the last
    level); two middle blocks; up path: concatenate the skip, two blocks, transposed-conv
    upsample; a final conv block and 1x1 conv back to ``A`` channels.
    """

    def __init__(
        self,
        action_dim: int,
        global_cond_dim: int,
        embed_dim: int = 64,
        down_dims: Sequence[int] = (64, 128, 256),
        kernel_size: int = 5,
        n_groups: int = 8,
    ) -> None:
        super().__init__()
        self.step_encoder = nn.Sequential(
            SinusoidalPosEmb(embed_dim),
            nn.Linear(embed_dim, 4 * embed_dim),
            Mish(),
            nn.Linear(4 * embed_dim, embed_dim),
        )
        cond_dim = embed_dim + global_cond_dim
        dims = [action_dim, *down_dims]
        levels = list(zip(dims[:-1], dims[1:], strict=True))

        def block(c_in: int, c_out: int) -> ConditionalResidualBlock1D:
            return ConditionalResidualBlock1D(c_in, c_out, cond_dim, kernel_size, n_groups)

        self.down = nn.ModuleList()
        for i, (c_in, c_out) in enumerate(levels):
            last = i == len(levels) - 1
            resample = nn.Identity() if last else nn.Conv1d(c_out, c_out, 3, 2, 1)
            self.down.append(nn.ModuleList([block(c_in, c_out), block(c_out, c_out), resample]))
        self.mid = nn.ModuleList([block(dims[-1], dims[-1]), block(dims[-1], dims[-1])])
        self.up = nn.ModuleList()
        for c_in, c_out in reversed(levels[1:]):
            self.up.append(
                nn.ModuleList(
                    [
                        block(2 * c_out, c_in),
                        block(c_in, c_in),
                        nn.ConvTranspose1d(c_in, c_in, 4, 2, 1),
                    ]
                )
            )
        self.final = nn.Sequential(
            Conv1dBlock(down_dims[0], down_dims[0], kernel_size, n_groups),
            nn.Conv1d(down_dims[0], action_dim, 1),
        )

    def forward(
        self, sample: torch.Tensor, timestep: torch.Tensor, global_cond: torch.Tensor
    ) -> torch.Tensor:
        """``sample [B, T, A]``, ``timestep [B]``, ``global_cond [B, G]`` -> ``[B, T, A]``."""
        x = sample.transpose(1, 2)  # [B, A, T]: convolve over time
        cond = torch.cat([self.step_encoder(timestep), global_cond], dim=-1)
        skips = []
        for res1, res2, downsample in self.down:
            x = res2(res1(x, cond), cond)
            skips.append(x)
            x = downsample(x)
        for res in self.mid:
            x = res(x, cond)
        for res1, res2, upsample in self.up:
            x = torch.cat([x, skips.pop()], dim=1)
            x = upsample(res2(res1(x, cond), cond))
        return self.final(x).transpose(1, 2)
