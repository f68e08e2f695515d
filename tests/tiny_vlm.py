"""A tiny randomly initialised Llava for the VLM judge's tests (a plain module: test modules
import it by name, never from ``conftest``, which is not unique once tests/lerobot has one)."""

from __future__ import annotations

WORDS = ["frame", "task", "completion", "percentage", "robot", "scene", "the", "is", "%", ":"]


def tiny_llava(with_processor: bool = True, chat_template: str | None = None):
    """A randomly initialised SigLIP + Llama Llava small enough for CPU tests, with a word-level
    tokenizer (and a processor): a VLM judge's mechanics without any download."""
    import torch
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import (
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
        PreTrainedTokenizerFast,
        SiglipImageProcessorPil,
        SiglipVisionConfig,
    )

    vocab = ["<pad>", "<bos>", "<eos>", "<unk>", "<image>", *map(str, range(101)), *WORDS]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\d+|[a-z]+|[^\sa-z0-9]"), behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        extra_special_tokens={"image_token": "<image>"},
    )
    vision = SiglipVisionConfig(
        image_size=16,
        patch_size=8,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        vision_use_head=False,
    )
    text = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=4,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
    )
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    if not with_processor:
        return model, tokenizer
    processor = LlavaProcessor(
        image_processor=SiglipImageProcessorPil(size={"height": 16, "width": 16}),
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy="full",
        image_token="<image>",
        chat_template=chat_template,
    )
    return model, processor
