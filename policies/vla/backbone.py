"""The VLA's backbone and text side: its construction, the vision tokens of camera images, and
instruction and object-name token ids.

Backbone (``VLAConfig.backbone_path``):

- ``""`` (default): a tiny, randomly initialised ``LlavaForConditionalGeneration`` built from
  configs (a SigLIP vision tower of ``vision_layers`` layers over ``patch_size`` patches, a
  2-layer projector and a Llama decoder of ``text_layers`` layers; only the Llama when
  ``vision_encoder`` names a keypoint encoder, which then makes the image tokens) and a
  word-level tokenizer (``tokenizers`` ``WordLevel`` over ``vocab``, the dataset's instruction
  words, wrapped as a ``PreTrainedTokenizerFast``). A few hundred thousand to a few million
  parameters: CPU sized.
- a local directory: loaded with ``AutoModelForImageTextToText`` / ``AutoTokenizer`` (and the
  ``AutoProcessor``'s image mean/std when it has one), offline (``local_files_only``), never with
  remote code. The model must offer ``get_image_features(pixel_values=...)``, a decoder
  (``get_decoder()``) that accepts ``inputs_embeds`` and a KV cache (``cache``, or
  ``past_key_values`` before transformers 5), and an output
  embedding (Llava, PaliGemma, Idefics3-style models do). Tied input/output embeddings are untied
  (the head is copied) so the weights save as safetensors. ``from_pretrained`` of a saved policy
  needs the same directory again (for the architecture and tokenizer), then loads the saved
  weights over it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from embodied.core.vision import build_image_encoder
from embodied.policies.vla.config import (
    BOS_TOKEN,
    IMAGE_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    UNK_TOKEN,
    VLAConfig,
)


class Backbone(NamedTuple):
    """A built backbone, its tokenizer, the vision tower's input size and image mean/std, and
    the end of the vocabulary rows usable as action tokens."""

    model: nn.Module
    tokenizer: Any
    vision_size: int
    image_mean: list[float]
    image_std: list[float]
    vocab_end: int


def build_backbone(config: VLAConfig) -> Backbone:
    """The tiny Llava (``backbone_path=""``) or the local model at ``backbone_path`` (with its
    processor's image mean/std when it has them)."""
    mean, std = config.image_mean, config.image_std
    if not config.backbone_path:
        tokenizer = build_word_tokenizer(config.vocab, config.n_bins)
        model = build_tiny_backbone(config, len(tokenizer))
        return Backbone(model, tokenizer, config.image_size, mean, std, len(tokenizer))
    model, tokenizer, processor = load_backbone(config.backbone_path, config.attn_implementation)
    vision = getattr(model.config, "vision_config", None)
    vision_size = int(getattr(vision, "image_size", config.image_size))
    if processor is not None and getattr(processor, "image_mean", None) is not None:
        mean, std = list(processor.image_mean), list(processor.image_std)
    vocab_end = min(len(tokenizer), model.get_output_embeddings().weight.shape[0])
    return Backbone(model, tokenizer, vision_size, mean, std, vocab_end)


def build_word_tokenizer(words: Sequence[str], n_bins: int) -> Any:
    """A ``PreTrainedTokenizerFast`` over ``SPECIAL_TOKENS + words + <act_0..n_bins-1>``: lower-case
    alphanumeric words (what ``tokenize_words`` splits), anything unknown -> ``<unk>``."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = [*SPECIAL_TOKENS, *words, *(f"<act_{i}>" for i in range(n_bins))]
    model = models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=UNK_TOKEN)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Lowercase(), normalizers.Replace(Regex("[^a-z0-9]+"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token=PAD_TOKEN, bos_token=BOS_TOKEN, unk_token=UNK_TOKEN
    )


def build_tiny_backbone(config: VLAConfig, vocab_size: int) -> nn.Module:
    """A randomly initialised tiny ``LlavaForConditionalGeneration`` (SigLIP vision, Llama text),
    or only its Llama (``LlamaForCausalLM``) when a keypoint encoder makes the image tokens."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        LlavaConfig,
        LlavaForConditionalGeneration,
        SiglipVisionConfig,
    )

    n_tokens = (
        1
        + len(config.image_keys) * config.image_tokens
        + config.n_proprio_tokens
        + config.num_object_tokens
        + config.max_instruction_tokens
        + config.num_action_tokens
    )
    text = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.text_intermediate_size,
        num_hidden_layers=config.text_layers,
        num_attention_heads=config.text_heads,
        num_key_value_heads=config.text_heads,
        max_position_embeddings=max(512, 2 ** math.ceil(math.log2(n_tokens))),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=None,
        tie_word_embeddings=False,
    )
    if config.keypoint_vision:
        text._attn_implementation = config.attn_implementation
        return LlamaForCausalLM(text)
    vision = SiglipVisionConfig(
        image_size=config.image_size,
        patch_size=config.patch_size,
        hidden_size=config.vision_hidden_size,
        intermediate_size=config.vision_intermediate_size,
        num_hidden_layers=config.vision_layers,
        num_attention_heads=config.vision_heads,
        vision_use_head=False,
    )
    llava = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=SPECIAL_TOKENS.index(IMAGE_TOKEN),
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",  # SigLIP has no CLS token to drop
        projector_hidden_act="gelu",
        tie_word_embeddings=False,
    )
    llava._attn_implementation = config.attn_implementation
    return LlavaForConditionalGeneration(llava)


def load_backbone(path: str, attn_implementation: str) -> tuple[nn.Module, Any, Any]:
    """A local image-text-to-text model, its tokenizer and (if any) image processor; offline."""
    from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    model = AutoModelForImageTextToText.from_pretrained(
        path, local_files_only=True, attn_implementation=attn_implementation
    ).float()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    try:
        processor = AutoProcessor.from_pretrained(path, local_files_only=True)
        image_processor = getattr(processor, "image_processor", processor)
    except (OSError, ValueError, TypeError):
        image_processor = None
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head.weight is embed.weight:  # untie: safetensors refuses shared tensors
        head.weight = nn.Parameter(head.weight.detach().clone())
        model.config.tie_word_embeddings = False
        if hasattr(model.config, "text_config"):
            model.config.text_config.tie_word_embeddings = False
    return model, tokenizer, image_processor


def image_features(
    backbone: nn.Module,
    images: torch.Tensor,
    vision_size: int,
    mean: torch.Tensor,
    std: torch.Tensor,
) -> torch.Tensor:
    """uint8 ``[N, H, W, 3]`` -> projected vision tokens ``[N, n_tokens, hidden]``: scaled to
    [0, 1], resized to the vision tower's size when it differs, normalised with ``mean``/``std``
    (``[1, 3, 1, 1]``)."""
    x = images.permute(0, 3, 1, 2).float() / 255.0
    if x.shape[-2:] != (vision_size, vision_size):
        size = (vision_size, vision_size)
        x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
    x = (x - mean) / std
    out = backbone.get_image_features(pixel_values=x)
    features = getattr(out, "pooler_output", out)
    if isinstance(features, list | tuple):
        features = torch.stack(list(features))
    return features.reshape(x.shape[0], -1, features.shape[-1])


class KeypointTokens(nn.Module):
    """Image tokens from keypoint encoders (``embodied.core.vision``), one encoder per camera:
    keypoint ``k`` at ``(x_k, y_k)`` in [-1, 1] becomes the token ``W (x_k, y_k) + e_k`` (a
    learned embedding ``e_k`` says which keypoint it is), so the decoder reads positions. With
    ``vision_film`` each camera's feature map is FiLM'd by a condition (the instruction), so the
    keypoints can follow the object the instruction names."""

    def __init__(self, config: VLAConfig, hidden: int) -> None:
        super().__init__()
        self.encoders = nn.ModuleList(
            build_image_encoder(
                config.vision_encoder,
                config.vision_channels,
                config.num_keypoints,
                0,  # no output layer: the keypoints themselves
                hidden if config.vision_film else 0,
                config.pretrained_blocks,
                config.pretrained_trainable,
                cache_trunk=not config.image_shift,  # a shifted frame never repeats
            )
            for _ in config.image_keys
        )
        self.position = nn.Linear(2, hidden)
        n_tokens = len(config.image_keys) * config.num_keypoints
        self.embedding = nn.Parameter(0.02 * torch.randn(n_tokens, hidden))

    def forward(
        self, images: Sequence[torch.Tensor], condition: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One uint8 ``[B, H, W, 3]`` per camera (and ``condition [B, hidden]`` with FiLM) ->
        the tokens ``[B, cameras * num_keypoints, hidden]`` and the keypoints they place,
        ``[B, cameras * num_keypoints * 2]`` (what a state head reads)."""
        cameras = zip(self.encoders, images, strict=True)
        points = torch.cat([encoder(image, condition) for encoder, image in cameras], dim=-1)
        xy = points.reshape(len(images[0]), -1, 2)
        return self.position(xy) + self.embedding, points


def padded_ids(
    tokenizer: Any, texts: Sequence[str], pad_id: int, length: int | None = None, left: bool = False
) -> torch.Tensor:
    """Token ids ``[N, length]`` of ``texts`` (no special tokens; each row's first ``length``),
    padded with ``pad_id`` on the left or right; ``length=None``: the longest row's."""
    rows = tokenizer([str(t) for t in texts], add_special_tokens=False)["input_ids"]
    if length is None:
        length = max(len(row) for row in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        row = row[:length]
        if row:
            start = length - len(row) if left else 0
            ids[i, start : start + len(row)] = torch.tensor(row, dtype=torch.long)
    return ids
