"""Observation and instruction encoders for the planners.

- ``ImageEncoder``: Diffusion Policy's camera encoder, scaled down: a small ResNet with GroupNorm
  (batch statistics are a poor fit for the small, correlated batches of RL) ending in a
  spatial-softmax keypoint head, whose expected (x, y) keypoint coordinates feed a linear layer.
  It takes ``uint8 [N, H, W, 3]`` images and scales them to [0, 1] itself.
- ``InstructionEncoder``: a bag of words. Instructions are lower-cased and split into words; each
  word's index in ``vocab`` (index 0 = unknown word) selects a learned embedding, and the
  embeddings of an instruction's words are averaged (padding masked out).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

UNKNOWN_WORD = "<unk>"
_WORD = re.compile(r"[a-z0-9]+")


def _group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with up to 8 groups that divide ``channels``."""
    return nn.GroupNorm(math.gcd(channels, 8), channels)


class ResidualBlock2d(nn.Module):
    """Two 3x3 convolutions with GroupNorm and a (projected) skip: ``relu(f(x) + skip(x))``."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.norm1 = _group_norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.norm2 = _group_norm(out_channels)
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.skip = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                _group_norm(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, C_in, H, W] -> [N, C_out, H / stride, W / stride]``."""
        h = F.relu(self.norm1(self.conv1(x)))
        h = self.norm2(self.conv2(h))
        return F.relu(h + self.skip(x))


class SpatialSoftmax(nn.Module):
    """Keypoints from a feature map: ``softmax`` over pixels per keypoint channel, then the
    expected pixel coordinates in [-1, 1] (Levine et al. 2016; Diffusion Policy's image head)."""

    def __init__(self, in_channels: int, num_keypoints: int) -> None:
        super().__init__()
        self.keypoints = nn.Conv2d(in_channels, num_keypoints, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``[N, C, H, W] -> [N, 2 * num_keypoints]`` as (x_1, y_1, x_2, y_2, ...)."""
        logits = self.keypoints(features)  # [N, K, H, W]
        n, k, h, w = logits.shape
        attention = torch.softmax(logits.reshape(n, k, h * w), dim=-1)  # [N, K, H*W]
        ys, xs = torch.meshgrid(
            torch.linspace(-1, 1, h, device=features.device, dtype=features.dtype),
            torch.linspace(-1, 1, w, device=features.device, dtype=features.dtype),
            indexing="ij",
        )
        grid = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)  # [H*W, 2]
        return (attention @ grid).reshape(n, 2 * k)  # E[x], E[y] per keypoint


class ImageEncoder(nn.Module):
    """One camera's encoder: ``uint8 [N, H, W, 3] -> float [N, out_dim]``.

    A stride-2 stem, one residual block per entry of ``channels`` (the first keeps the
    resolution, the rest halve it), a spatial-softmax keypoint head and ``Linear + ReLU``.
    """

    def __init__(
        self, channels: Sequence[int] = (32, 64, 128), num_keypoints: int = 32, out_dim: int = 64
    ) -> None:
        super().__init__()
        channels = list(channels)
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels[0], 3, 2, 1, bias=False), _group_norm(channels[0]), nn.ReLU()
        )
        blocks, width = [], channels[0]
        for i, c in enumerate(channels):
            blocks.append(ResidualBlock2d(width, c, stride=1 if i == 0 else 2))
            width = c
        self.blocks = nn.Sequential(*blocks)
        self.pool = SpatialSoftmax(width, num_keypoints)
        self.out = nn.Linear(2 * num_keypoints, out_dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Channels-last uint8 images to features; pixels are scaled to [0, 1] here."""
        x = images.permute(0, 3, 1, 2).float() / 255.0
        return F.relu(self.out(self.pool(self.blocks(self.stem(x)))))


def tokenize_words(text: str) -> list[str]:
    """Lower-cased alphanumeric words of an instruction (``"Pick the Red-cube."`` -> 4 words)."""
    return _WORD.findall(text.lower())


def build_vocab(instructions: Iterable[str]) -> list[str]:
    """The vocabulary of a set of instructions: ``["<unk>", *sorted words]`` (index 0 = unknown)."""
    words = {word for text in instructions for word in tokenize_words(text)}
    return [UNKNOWN_WORD, *sorted(words - {UNKNOWN_WORD})]


class InstructionEncoder(nn.Module):
    """Bag-of-words instruction embedding: the mean of learned word embeddings.

    ``vocab[i]`` has id ``i`` for ``i >= 1``; id 0 is every word not in ``vocab[1:]``. An empty
    instruction embeds to zeros.
    """

    def __init__(self, vocab: Sequence[str], embed_dim: int) -> None:
        super().__init__()
        self.word_ids = {word: i for i, word in enumerate(vocab) if i > 0}
        self.embedding = nn.Embedding(max(len(vocab), 1), embed_dim)

    def tokenize(
        self, instructions: Sequence[str], device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Word ids ``[B, L]`` (int64, padded with 0) and a mask ``[B, L]`` (True = real word)."""
        ids = [[self.word_ids.get(w, 0) for w in tokenize_words(text)] for text in instructions]
        length = max([len(row) for row in ids] + [1])
        padded = torch.zeros(len(ids), length, dtype=torch.long)
        mask = torch.zeros(len(ids), length, dtype=torch.bool)
        for b, row in enumerate(ids):
            padded[b, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[b, : len(row)] = True
        return padded.to(device), mask.to(device)

    def forward(self, instructions: Sequence[str]) -> torch.Tensor:
        """``B`` instructions -> ``[B, embed_dim]``: ``sum(mask * emb) / max(sum(mask), 1)``."""
        ids, mask = self.tokenize(instructions, self.embedding.weight.device)
        weights = mask.to(self.embedding.weight.dtype).unsqueeze(-1)  # [B, L, 1]
        total = (self.embedding(ids) * weights).sum(dim=1)
        return total / weights.sum(dim=1).clamp(min=1.0)
