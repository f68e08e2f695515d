"""Zero-shot progress judge (GVL / OpenGVL) over any local transformers image-text-to-text model.

GVL asks a generative VLM for the task-completion percentage of every frame of an episode, with
the frames **shuffled** so that the model cannot read progress off the frame order, and with the
episode's first frame shown as an in-context anchor at 0%. The answers are put back in time order
and scored with Value-Order Correlation (``rewards.metrics.value_order_correlation``).

Pieces (all but ``VLMJudge`` are pure functions in ``embodied.rewards.judge_prompt``, testable
without a model):

- ``make_permutation(n, seed, anchor)``: ``perm[j]`` = the time index of the frame shown at
  position ``j``. With ``anchor=True`` (GVL), ``perm[0] = 0`` (the first frame is the anchor) and
  ``perm[1:]`` is a seeded shuffle of ``1..n-1``.
- ``build_prompt``: the GVL-style instruction text. With an anchor::

      ... Initial robot scene: <image> In the initial robot scene, the task completion
      percentage is 0%. ... Frame 1: <image> Frame 2: <image> ... Frame n-1: <image>
      Answer with one line per frame, exactly in the form 'Frame i: p%' ...

  ``Frame j`` (1-based) shows the frame at time ``perm[j]`` (anchor) or ``perm[j-1]`` (no
  anchor). The anchor's 0% is given, not predicted: ``progress[0] = 0`` and it is not counted as
  a queried frame.
- ``parse_completion(text, n_frames)``: percentages ``[n_frames]`` in *shown* order, clamped to
  [0, 100], NaN where a frame has no parseable answer (never a guessed number). Accepted, tried in
  this order:

  1. a JSON list of ``n_frames`` numbers (``null`` -> NaN), or a JSON object ``{"1": 45, ...}``;
  2. frame-indexed answers: ``Frame 3: 45%``, ``frame 3 - 45``, ``Frame #3 = 45 %``, GVL's
     ``Frame 3: Frame Description: ..., Task Completion Percentages: 45%``. The value of frame i
     is, in the text between ``frame i`` and the next ``frame k``: the first number followed by
     ``%``; else the first number after "completion" / "progress"; else the first number. The
     first answer for a frame wins; indices outside 1..n_frames are ignored;
  3. no frame index anywhere: one value per line, in order (a ``45%`` / ``45 %`` on the line, or
     a line that is a single number); a short answer (generation cut off) leaves the last frames
     NaN, extra values are ignored.

  Numbers are read as percentages (``0.45`` is 0.45%, not 45%).
- ``unshuffle(values_shown, perm)``: back to time order (``out[perm[j]] = values_shown[j]``).
- ``judged_voc(results)``: VOC of judged episodes with missing values counted (see there).

``VLMJudge`` wraps a model and its processor (or only a tokenizer):

- **processor mode** (the processor has an ``image_processor``, e.g. ``LlavaProcessor``): the
  prompt goes through the processor's chat template when it has one (a user turn of text and
  ``{"type": "image"}`` items, ``add_generation_prompt=True``), else it is the plain prompt with
  the processor's ``image_token`` as placeholder; the processor expands the placeholders and
  preprocesses the frames.
- **tokenizer mode** (only a tokenizer): for Llava-style models that take ``pixel_values`` and an
  ``image_token_id`` placeholder per image feature (``model.config.image_token_index`` /
  ``image_token_id``). Frames are resized to the vision tower's ``image_size``, scaled to [0, 1]
  and normalised with ``image_mean`` / ``image_std`` (default 0.5 / 0.5, SigLIP's); each image
  becomes as many placeholder ids as ``model.get_image_features`` returns tokens. No chat template.

Generation is greedy (``do_sample=False``), ``max_new_tokens`` configurable; the new tokens are
decoded with ``skip_special_tokens=True``.

Batching (``judge_batch``): episodes are run ``batch_size`` at a time in **one batched
``generate`` call with left padding** (the tokenizer's ``padding_side`` is set to ``"left"`` for
the call and restored after) when the tokenizer has a pad token (or an eos token to pad with);
otherwise, or with ``batch_size=1``, it loops one episode per ``generate`` call. Greedy decoding
with left padding and an attention mask gives the same tokens as one-by-one decoding up to float
rounding. ``VLMJudge.batched`` says which applies.

A long episode is many images in one prompt: subsample the frames before judging (GVL uses a few
dozen frames), e.g. ``frames[np.linspace(0, T - 1, 30).round().astype(int)]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from embodied.rewards.judge_prompt import (
    DEFAULT_IMAGE_TOKEN,
    JudgeRequest,
    JudgeResult,
    build_prompt,
    make_permutation,
    prompt_parts,
    result_from_text,
)

__all__ = ["VLMJudge"]


def _check_frames(frames: Any, index: int | None = None) -> np.ndarray:
    where = "" if index is None else f"episode {index}: "
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(
            f"{where}frames must be uint8 [T, H, W, 3], got dtype {frames.dtype} with shape "
            f"{frames.shape}"
        )
    if frames.shape[0] < 1:
        raise ValueError(f"{where}frames must hold at least one frame")
    return frames


class VLMJudge:
    """GVL-style zero-shot progress judge around a local image-text-to-text model.

    Args:
        model: a transformers generative VLM (``generate(input_ids, attention_mask,
            pixel_values, ...)``).
        processor_or_tokenizer: its processor (with ``image_processor``) or only its tokenizer
            (tokenizer mode, Llava-style models; see the module docstring).
        max_new_tokens: generation budget; about 8 tokens per frame for ``Frame i: p%``.
        anchor: show the first frame as the 0% anchor (GVL) and ask about the rest.
        batch_size: episodes per batched ``generate`` call in ``judge_batch``.
        image_mean, image_std: normalisation in tokenizer mode.
        use_chat_template: use the processor's chat template when it has one.
    """

    def __init__(
        self,
        model: Any,
        processor_or_tokenizer: Any,
        *,
        max_new_tokens: int = 256,
        anchor: bool = True,
        batch_size: int = 4,
        image_mean: Sequence[float] = (0.5, 0.5, 0.5),
        image_std: Sequence[float] = (0.5, 0.5, 0.5),
        use_chat_template: bool = True,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.processor = processor_or_tokenizer
        self.max_new_tokens = int(max_new_tokens)
        self.anchor = bool(anchor)
        self.batch_size = int(batch_size)
        self.image_mean = tuple(float(v) for v in image_mean)
        self.image_std = tuple(float(v) for v in image_std)
        self.use_chat_template = use_chat_template
        self.has_image_processor = (
            getattr(processor_or_tokenizer, "image_processor", None) is not None
        )
        self.tokenizer = getattr(processor_or_tokenizer, "tokenizer", processor_or_tokenizer)
        self._n_image_tokens: int | None = None
        if not self.has_image_processor and self._image_token_id() is None:
            raise ValueError(
                "VLMJudge got a tokenizer without an image processor, and the model config has "
                "no image_token_id / image_token_index: pass the model's processor instead"
            )

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str, **kwargs: Any) -> VLMJudge:
        """Load a local model directory (``AutoModelForImageTextToText`` + ``AutoProcessor``,
        falling back to ``AutoTokenizer``), offline, never with remote code."""
        from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

        model = AutoModelForImageTextToText.from_pretrained(
            path, local_files_only=True, trust_remote_code=False
        ).eval()
        try:
            processor = AutoProcessor.from_pretrained(
                path, local_files_only=True, trust_remote_code=False
            )
        except (OSError, ValueError, TypeError, KeyError):
            processor = None
        if processor is None or getattr(processor, "image_processor", None) is None:
            processor = AutoTokenizer.from_pretrained(
                path, local_files_only=True, trust_remote_code=False
            )
        return cls(model, processor, **kwargs)

    @property
    def batched(self) -> bool:
        """True when ``judge_batch`` runs batched (left-padded) generation, else it loops."""
        tok = self.tokenizer
        has_pad = getattr(tok, "pad_token_id", None) is not None or (
            getattr(tok, "eos_token_id", None) is not None
        )
        return self.batch_size > 1 and has_pad

    # --- public API -----------------------------------------------------------------------------
    def prepare(
        self, frames: np.ndarray, instruction: str, seed: int | np.random.Generator | None = 0
    ) -> JudgeRequest:
        """Shuffle one episode's frames (seeded) into a ``JudgeRequest``."""
        frames = _check_frames(frames)
        anchor = self.anchor and len(frames) > 1
        perm = make_permutation(len(frames), seed, anchor=anchor)
        return JudgeRequest(frames[perm], str(instruction), perm, anchor)

    def judge(
        self, frames: np.ndarray, instruction: str, seed: int | np.random.Generator | None = 0
    ) -> JudgeResult:
        """Progress of one episode's frames ``uint8 [T, H, W, 3]`` (see ``JudgeResult``)."""
        request = self.prepare(frames, instruction, seed)
        (text,) = self.generate([request])
        return result_from_text(request, text)

    def judge_batch(
        self,
        episodes: Sequence[tuple[np.ndarray, str]],
        seed: int | np.random.Generator | None = 0,
    ) -> list[JudgeResult]:
        """Judge many ``(frames, instruction)`` episodes; episode i is shuffled with a generator
        seeded by ``(seed, i)`` (or drawn from ``seed`` when it is a Generator), so a result does
        not depend on the batch size."""
        requests = []
        for i, (frames, instruction) in enumerate(episodes):
            _check_frames(frames, i)
            episode_seed = (
                seed
                if isinstance(seed, np.random.Generator)
                else (np.random.default_rng(None if seed is None else [int(seed), i]))
            )
            requests.append(self.prepare(frames, instruction, episode_seed))
        step = self.batch_size if self.batched else 1
        texts: list[str] = []
        for start in range(0, len(requests), step):
            texts.extend(self.generate(requests[start : start + step]))
        return [result_from_text(r, t) for r, t in zip(requests, texts, strict=True)]

    # --- the model call (monkeypatch ``generate`` to test the mechanics without a model) -------
    def prompt_text(self, request: JudgeRequest) -> str:
        """The text given to the processor (chat template applied when there is one)."""
        image_token = self._image_token()
        if (
            self.has_image_processor
            and self.use_chat_template
            and getattr(self.processor, "chat_template", None)
        ):
            content = [
                {"type": "image"} if part is None else {"type": "text", "text": part}
                for part in prompt_parts(
                    request.instruction, request.n_queried, request.anchor, None
                )
            ]
            messages = [{"role": "user", "content": content}]
            return self.processor.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        return build_prompt(request.instruction, request.n_queried, request.anchor, image_token)

    def generate(self, requests: Sequence[JudgeRequest]) -> list[str]:
        """Greedy-generate the answer text of each request (one batched call, left padding)."""
        import torch

        if not requests:
            return []
        inputs = self._encode(requests)
        param = next(self.model.parameters())
        inputs = {
            k: (v.to(param.device, param.dtype) if v.is_floating_point() else v.to(param.device))
            if isinstance(v, torch.Tensor)
            else v
            for k, v in inputs.items()
        }
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id
        with torch.no_grad():
            out = self.model.generate(
                **inputs,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
            )
        sequences = getattr(out, "sequences", out)
        if not getattr(self.model.config, "is_encoder_decoder", False):
            sequences = sequences[:, inputs["input_ids"].shape[1] :]
        return list(self.tokenizer.batch_decode(sequences, skip_special_tokens=True))

    # --- encoding -----------------------------------------------------------------------------
    def _image_token(self) -> str:
        token = getattr(self.processor, "image_token", None) or getattr(
            self.tokenizer, "image_token", None
        )
        return token or DEFAULT_IMAGE_TOKEN

    def _image_token_id(self) -> int | None:
        config = self.model.config
        for name in ("image_token_id", "image_token_index"):
            value = getattr(config, name, None)
            if value is not None:
                return int(value)
        return None

    def _encode(self, requests: Sequence[JudgeRequest]) -> dict[str, Any]:
        tokenizer = self.tokenizer
        old_side = getattr(tokenizer, "padding_side", "left")
        old_pad = tokenizer.pad_token
        try:
            tokenizer.padding_side = "left"
            if tokenizer.pad_token is None and tokenizer.eos_token is not None:
                tokenizer.pad_token = tokenizer.eos_token
            if self.has_image_processor:
                texts = [self.prompt_text(r) for r in requests]
                images = [frame for r in requests for frame in r.frames]
                return dict(
                    self.processor(text=texts, images=images, return_tensors="pt", padding=True)
                )
            return self._encode_with_tokenizer(requests)
        finally:
            tokenizer.padding_side = old_side
            if old_pad is None and tokenizer.pad_token is not None:
                with contextlib.suppress(AttributeError, ValueError, TypeError):
                    tokenizer.pad_token = None  # some tokenizers refuse None

    def _pixel_values(self, frames: np.ndarray) -> Any:
        import torch
        import torch.nn.functional as F

        vision = getattr(self.model.config, "vision_config", None)
        size = int(getattr(vision, "image_size", frames.shape[1]))
        x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float() / 255.0
        if x.shape[-2:] != (size, size):
            x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True)
        mean = torch.tensor(self.image_mean).view(1, 3, 1, 1)
        std = torch.tensor(self.image_std).view(1, 3, 1, 1)
        dtype = next(self.model.parameters()).dtype
        return ((x - mean) / std).to(dtype)

    def _count_image_tokens(self, pixel_values: Any) -> int:
        import torch

        if self._n_image_tokens is None:
            device = next(self.model.parameters()).device
            with torch.no_grad():
                out = self.model.get_image_features(pixel_values=pixel_values[:1].to(device))
            features = getattr(out, "pooler_output", out)
            if isinstance(features, list | tuple):
                features = features[0]
            self._n_image_tokens = int(features.reshape(-1, features.shape[-1]).shape[0])
        return self._n_image_tokens

    def _encode_with_tokenizer(self, requests: Sequence[JudgeRequest]) -> dict[str, Any]:
        import torch

        tokenizer = self.tokenizer
        image_id = self._image_token_id()
        pixel_values = self._pixel_values(np.concatenate([r.frames for r in requests]))
        n_tokens = self._count_image_tokens(pixel_values)
        rows = []
        for request in requests:
            ids: list[int] = []
            if tokenizer.bos_token_id is not None:
                ids.append(int(tokenizer.bos_token_id))
            for part in prompt_parts(request.instruction, request.n_queried, request.anchor, None):
                if part is None:
                    ids.extend([image_id] * n_tokens)
                else:
                    ids.extend(tokenizer(part, add_special_tokens=False)["input_ids"])
            rows.append(ids)
        length = max(len(ids) for ids in rows)
        pad_id = int(tokenizer.pad_token_id)
        input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, ids in enumerate(rows):  # left padding
            input_ids[i, length - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, length - len(ids) :] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "pixel_values": pixel_values,
        }
