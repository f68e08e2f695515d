"""A progress reward model: per-frame progress in [0, 1] and a success probability, causally.

``ProgressRewardModel`` scores a rollout frame by frame, so it can run online:

- each frame (``uint8 [H, W, 3]``) goes through a camera encoder chosen by name, as the planners
  choose theirs (``embodied.core.vision.build_image_encoder``): the small ResNet trained from
  scratch (default), the frozen ImageNet EfficientNet-Lite0 or a local ``transformers`` vision
  model, each with a spatial-softmax keypoint head;
- the instruction is a bag of words over the dataset's vocabulary (``InstructionEncoder``);
- a frame token is ``Linear([image, instruction]) + sinusoidal(position)``; a causal
  ``nn.TransformerEncoder`` runs over the frame tokens, so frame ``t``'s outputs depend only on
  frames ``0..t``;
- heads: progress as a distribution over ``num_bins`` bins whose centres are evenly spaced on
  [0, 1] (the estimate is the expected centre), and a success logit ("the task has succeeded by
  this frame").

``loss`` is the cross-entropy of the progress label's two-hot encoding over the two neighbouring
bin centres (exact for any label in [0, 1]; ``soft_labels=False`` uses the nearest bin) plus
``success_weight`` times the BCE of success at each clip's final frame. Saved Hugging Face style
(``config.json`` + ``model.safetensors``) with ``embodied.core.nn``'s atomic, shape-checked helpers.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from embodied.core.config import check_ints
from embodied.core.nn import UNKNOWN_WORD, InstructionEncoder
from embodied.core.pretrained import (
    config_from_dict,
    load_weights,
    read_pretrained,
    save_pretrained,
)
from embodied.core.vision import (
    build_image_encoder,
    check_pretrained_trainable,
    check_vision_encoder,
)

__all__ = ["MODEL_TYPE", "ProgressConfig", "ProgressRewardModel", "augment_frames"]

MODEL_TYPE = "progress"


@dataclass
class ProgressConfig:
    """Architecture of a ``ProgressRewardModel`` (JSON-able; ``config.json`` holds it)."""

    image_size: int = 64  # frames are uint8 [B, T, image_size, image_size, 3]
    image_key: str = ""  # the camera trained on (observation.images.<name>); "": the first one
    vocab: list[str] = field(default_factory=lambda: [UNKNOWN_WORD])  # build_vocab(instructions)
    vision_encoder: str = "resnet"  # resnet | efficientnet_lite0 | hf:<local model directory>
    vision_channels: list[int] = field(default_factory=lambda: [16, 32, 64])  # pretrained: adapter
    # resnet: the stem's stride; 0: image_size // 32, at least 2 (``stem_stride``)
    vision_stem_stride: int = 0
    pretrained_blocks: int = 4  # efficientnet_lite0: the trunk is cut after this many blocks
    # efficientnet_lite0: its top layers that fine-tune (0: frozen; pretrained_blocks + 1: all)
    pretrained_trainable: int = 0
    num_keypoints: int = 16
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    ff_dim: int = 128
    dropout: float = 0.0
    num_bins: int = 16
    soft_labels: bool = True  # two-hot targets between neighbouring bins (else the nearest bin)
    success_weight: float = 0.5

    def __post_init__(self) -> None:
        check_ints(self, {"image_size": 8, "num_keypoints": 1, "d_model": 1, "n_heads": 1,
                          "n_layers": 1, "ff_dim": 1, "num_bins": 2,
                          "pretrained_blocks": 1, "pretrained_trainable": 0,
                          "vision_stem_stride": 0})  # fmt: skip
        check_vision_encoder(self.vision_encoder)
        if self.vision_stem_stride and self.vision_encoder != "resnet":
            raise ValueError(
                f"ProgressConfig.vision_stem_stride={self.vision_stem_stride} sets the resnet "
                f"encoder's stem; vision_encoder={self.vision_encoder!r} keeps its own"
            )
        check_pretrained_trainable("ProgressConfig", self.vision_encoder,
                                   self.pretrained_trainable, self.pretrained_blocks)  # fmt: skip
        if self.d_model % self.n_heads:
            raise ValueError(
                f"ProgressConfig.d_model ({self.d_model}) must be divisible by n_heads "
                f"({self.n_heads})"
            )
        channels = list(self.vision_channels)
        if not channels or any(not isinstance(c, int) or c < 1 for c in channels):
            raise ValueError(
                f"ProgressConfig.vision_channels must be a non-empty list of integers >= 1, "
                f"got {self.vision_channels!r}"
            )
        self.vision_channels = channels
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"ProgressConfig.dropout must be in [0, 1), got {self.dropout}")
        if self.success_weight < 0:
            raise ValueError(
                f"ProgressConfig.success_weight must be >= 0, got {self.success_weight}"
            )
        vocab = list(self.vocab)
        if not vocab or vocab[0] != UNKNOWN_WORD or not all(isinstance(w, str) for w in vocab):
            raise ValueError(
                f"ProgressConfig.vocab must be a list of words starting with {UNKNOWN_WORD!r} "
                f"(use build_vocab), got {self.vocab[:5]!r}..."
            )
        self.vocab = vocab

    @property
    def stem_stride(self) -> int:
        """The resnet stem's stride: ``vision_stem_stride``, or by default ``image_size // 32``
        (at least 2), so the residual blocks see about 32 px whatever the camera's size: a 96 px
        model then costs a 64 px one's blocks per frame and its scoring batches as well (1.5-2x
        the frames/s of the stride-2 stem at 16 clips a call, 2.1-2.3x batch 1's rate against
        ~1.5x; the six-task model trained to the same VOC and success AUROC)."""
        return self.vision_stem_stride or max(2, self.image_size // 32)

    def resolved(self) -> ProgressConfig:
        """This config with the resnet's stem stride written out, as a model records it (so a
        saved model keeps its architecture whatever the default becomes)."""
        if self.vision_encoder != "resnet":
            return self
        return dataclasses.replace(self, vision_stem_stride=self.stem_stride)


def sinusoidal_embedding(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Transformer position encoding of integer positions ``[...] -> [..., dim]``."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10_000.0)
        * torch.arange(half, device=positions.device, dtype=torch.float32)
        / max(half, 1)
    )
    angles = positions.float().unsqueeze(-1) * freqs
    emb = torch.cat([angles.sin(), angles.cos()], dim=-1)
    return F.pad(emb, (0, dim - 2 * half))


class ProgressRewardModel(nn.Module):
    """Progress in [0, 1] and success probability per frame from ``uint8 [B, T, H, W, 3]`` frames
    and ``B`` instructions; causal in time (see the module docstring)."""

    model_type = MODEL_TYPE

    def __init__(self, config: ProgressConfig) -> None:
        super().__init__()
        if not isinstance(config, ProgressConfig):
            raise TypeError(f"ProgressRewardModel needs a ProgressConfig, got {type(config)}")
        self.config = config = config.resolved()
        d = config.d_model
        self.image_encoder = build_image_encoder(
            config.vision_encoder, config.vision_channels, config.num_keypoints, d,
            pretrained_blocks=config.pretrained_blocks,
            pretrained_trainable=config.pretrained_trainable,
            cache_trunk=False,  # augmented clips never repeat a frame
            stem_stride=config.stem_stride,
        )  # fmt: skip
        self.image_encoder.channels_last_inference = True  # scores are never recomputed
        self.instruction_encoder = InstructionEncoder(config.vocab, d)
        self.fuse = nn.Linear(2 * d, d)
        layer = nn.TransformerEncoderLayer(
            d, config.n_heads, config.ff_dim, config.dropout, batch_first=True, norm_first=True
        )
        self.temporal = nn.TransformerEncoder(
            layer, config.n_layers, norm=nn.LayerNorm(d), enable_nested_tensor=False
        )
        self.progress_head = nn.Linear(d, config.num_bins)
        self.success_head = nn.Linear(d, 1)
        self.register_buffer(
            "bin_centres", torch.linspace(0.0, 1.0, config.num_bins), persistent=False
        )

    @property
    def device(self) -> torch.device:
        """Where the parameters live."""
        return next(self.parameters()).device

    # --- inputs ------------------------------------------------------------------------------
    def check_inputs(self, frames: Any, instructions: Any) -> torch.Tensor:
        """``frames`` as a uint8 tensor on the model's device; ValueError naming what is wrong."""
        size = self.config.image_size
        expected = f"uint8 [B, T, {size}, {size}, 3]"
        if isinstance(frames, np.ndarray):
            frames = torch.from_numpy(np.ascontiguousarray(frames))
        if not torch.is_tensor(frames):
            raise ValueError(f"frames must be a tensor or array {expected}, got {type(frames)}")
        if frames.ndim != 5:
            raise ValueError(
                f"frames must have 5 dims {expected}, got {frames.ndim} dims "
                f"(shape {tuple(frames.shape)})"
            )
        if tuple(frames.shape[2:]) != (size, size, 3):
            raise ValueError(
                f"frames must have shape {expected}, got {tuple(frames.shape)} (the model was "
                f"built for {size}x{size} RGB, channels last)"
            )
        if frames.dtype != torch.uint8:
            raise ValueError(f"frames must have dtype uint8 {expected}, got {frames.dtype}")
        if frames.shape[0] < 1 or frames.shape[1] < 1:
            raise ValueError(
                f"frames must hold at least one clip and frame, got {tuple(frames.shape)}"
            )
        if isinstance(instructions, str) or not isinstance(instructions, Sequence):
            raise ValueError(
                f"instructions must be a list of {frames.shape[0]} strings, "
                f"got {type(instructions).__name__}"
            )
        if len(instructions) != frames.shape[0]:
            raise ValueError(
                f"got {len(instructions)} instructions for {frames.shape[0]} clips: need one per "
                f"clip (frames have shape {tuple(frames.shape)}, expected {expected})"
            )
        if not all(isinstance(text, str) for text in instructions):
            raise ValueError("instructions must all be strings")
        return frames.to(self.device)

    # --- model -------------------------------------------------------------------------------
    def forward(
        self,
        frames: torch.Tensor,
        instructions: Sequence[str],
        positions: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """``progress_logits [B, T, K]``, ``progress [B, T]`` (expected bin centre),
        ``success_logits [B, T]``. ``positions`` (int ``[B, T]``, default ``0..T-1``) is what the
        time embedding sees."""
        frames = self.check_inputs(frames, instructions)
        b, t = frames.shape[:2]
        image = self.image_encoder(frames.reshape(b * t, *frames.shape[2:])).reshape(b, t, -1)
        text = self.instruction_encoder(list(instructions)).unsqueeze(1).expand(b, t, -1)
        if positions is None:
            positions = torch.arange(t, device=frames.device).expand(b, t)
        tokens = self.fuse(torch.cat([image, text], dim=-1))
        tokens = tokens + sinusoidal_embedding(positions.to(frames.device), tokens.shape[-1])
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=frames.device)
        hidden = self.temporal(tokens, mask=causal, is_causal=True)
        logits = self.progress_head(hidden)
        progress = torch.softmax(logits, dim=-1) @ self.bin_centres
        return {
            "progress_logits": logits,
            "progress": progress,
            "success_logits": self.success_head(hidden).squeeze(-1),
        }

    @torch.no_grad()
    def progress(self, frames: torch.Tensor, instructions: Sequence[str]) -> torch.Tensor:
        """Progress estimates ``float [B, T]`` in [0, 1] (no gradients)."""
        return self(frames, instructions)["progress"]

    @torch.no_grad()
    def success_probability(
        self, frames: torch.Tensor, instructions: Sequence[str]
    ) -> torch.Tensor:
        """P(the task has succeeded by frame t), ``float [B, T]`` (no gradients)."""
        return torch.sigmoid(self(frames, instructions)["success_logits"])

    def progress_target(self, labels: torch.Tensor) -> torch.Tensor:
        """Labels in [0, 1] ``[...]`` -> target distributions over the bins ``[..., K]``."""
        k = self.config.num_bins
        position = labels.float().clamp(0.0, 1.0) * (k - 1)
        if not self.config.soft_labels:
            return F.one_hot(position.round().long(), k).float()
        low = position.floor().long().clamp(max=k - 1)
        high = (low + 1).clamp(max=k - 1)
        w = (position - low.float()).unsqueeze(-1)
        return F.one_hot(low, k).float() * (1 - w) + F.one_hot(high, k).float() * w

    def losses(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """Loss terms of a batch: ``frames`` uint8 ``[B, T, H, W, 3]``, ``instruction`` (B
        strings), ``progress`` labels ``[B, T]``, ``success`` ``[B]`` (succeeded by the clip's last
        frame); optional ``mask`` ``[B, T]`` (True = real frame)."""
        for key in ("frames", "instruction", "progress", "success"):
            if key not in batch:
                raise ValueError(f"a progress batch needs {key!r}; it has {sorted(batch)}")
        out = self(batch["frames"], batch["instruction"])
        labels = torch.as_tensor(batch["progress"], device=self.device).float()
        if labels.shape != out["progress"].shape:
            raise ValueError(
                f"progress labels have shape {tuple(labels.shape)}, frames give "
                f"{tuple(out['progress'].shape)} ([B, T])"
            )
        mask = batch.get("mask")
        mask = (
            torch.ones_like(labels)
            if mask is None
            else torch.as_tensor(mask, device=self.device).float()
        )
        target = self.progress_target(labels)
        ce = -(target * torch.log_softmax(out["progress_logits"], dim=-1)).sum(-1)
        ce = (ce * mask).sum() / mask.sum().clamp(min=1.0)
        success = torch.as_tensor(batch["success"], device=self.device).float().reshape(-1)
        bce = F.binary_cross_entropy_with_logits(out["success_logits"][:, -1], success)
        mae = ((out["progress"] - labels).abs() * mask).sum() / mask.sum().clamp(min=1.0)
        return {
            "loss": ce + self.config.success_weight * bce,
            "progress_ce": ce,
            "success_bce": bce,
            "progress_mae": mae.detach(),
        }

    def loss(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The training loss (see ``losses``)."""
        return self.losses(batch)["loss"]

    # --- save / load -------------------------------------------------------------------------
    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into ``directory`` (atomically)."""
        config = {"model_type": self.model_type, **dataclasses.asdict(self.config)}
        return save_pretrained(self, config, directory)

    @classmethod
    def from_pretrained(
        cls, directory: str | os.PathLike[str], device: str | torch.device = "cpu"
    ) -> ProgressRewardModel:
        """Rebuild a saved model; weights that do not match the config are an error naming the
        tensor and both shapes."""
        directory = Path(directory)
        config, weights = read_pretrained(directory, "progress reward model")
        model_type = config.pop("model_type", None)
        config.setdefault("vision_stem_stride", 2)  # saved before the field: a stride-2 stem
        if model_type != cls.model_type:
            raise ValueError(
                f"{directory}: config.json's model_type is {model_type!r}, not {cls.model_type!r}"
            )
        model = cls(config_from_dict(ProgressConfig, config, directory))
        load_weights(model, weights)
        return model.to(device)


def augment_frames(
    frames: torch.Tensor,
    generator: torch.Generator,
    shift: int = 4,
    brightness: float = 0.2,
    color: float = 0.1,
) -> torch.Tensor:
    """Image augmentation of clips ``uint8 [B, T, H, W, 3]``, the same for every frame of a clip
    (a camera that moved a little, other lighting): a random shift of up to ``shift`` pixels
    (edge pixels repeated), a brightness factor in ``1 +- brightness`` and a per-channel colour
    factor in ``1 +- color``. Plain torch ops; deterministic given ``generator`` (on the CPU)."""
    b, t, h, w, c = frames.shape
    x = frames.permute(0, 1, 4, 2, 3).reshape(b, t * c, h, w).float()
    if shift > 0:
        padded = F.pad(x, (shift, shift, shift, shift), mode="replicate")
        offsets = torch.randint(0, 2 * shift + 1, (b, 2), generator=generator)
        x = torch.stack(
            [padded[i, :, dy : dy + h, dx : dx + w] for i, (dy, dx) in enumerate(offsets.tolist())]
        )
    x = x.reshape(b, t, c, h, w)
    gain = 1.0 + brightness * (2 * torch.rand(b, 1, 1, 1, 1, generator=generator) - 1)
    gain = gain * (1.0 + color * (2 * torch.rand(b, 1, c, 1, 1, generator=generator) - 1))
    x = (x * gain.to(x.device)).clamp(0, 255).round()
    return x.to(torch.uint8).permute(0, 1, 3, 4, 2).contiguous()
