"""Shared pytest setup."""

from __future__ import annotations

import importlib.util
import os

import pytest

# tests/lerobot needs LeRobot, which needs Python >= 3.12 and its own torch: `make test-lerobot`
# runs it in an environment of its own. Elsewhere (the main suite) it is not collected.
collect_ignore = [] if importlib.util.find_spec("lerobot") else ["lerobot"]

# Headless offscreen rendering: MuJoCo reads MUJOCO_GL when it is first imported, so this must run
# before any test module imports mujoco (a user's explicit choice wins).
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: tiny convolutions and transformers run fastest that way,
    and results do not depend on the thread count. Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def state_env(request):
    """A state-mode env of the task named by ``request.param`` (PickPlace by default): the tabletop
    tests (test_tabletop*.py) share it."""
    import embodied.sims as sims

    env = sims.make(getattr(request, "param", "PickPlace"), obs_mode="state")
    yield env
    env.close()


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


@pytest.fixture(scope="session")
def judge_dir(tmp_path_factory: pytest.TempPathFactory):
    """A saved tiny Llava with its processor: a local judge directory."""
    path = tmp_path_factory.mktemp("judge")
    model, processor = tiny_llava()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path
