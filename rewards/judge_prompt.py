"""The pure pieces of the GVL judge (see ``embodied.rewards.vlm_judge``): the frame permutation,
the prompt, parsing a completion into per-frame progress, unshuffling, and VOC of judged
episodes with missing answers counted. No model is needed to test them."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embodied.rewards.metrics import value_order_correlation

__all__ = [
    "JudgeRequest",
    "JudgeResult",
    "build_prompt",
    "judged_voc",
    "make_permutation",
    "parse_completion",
    "prompt_parts",
    "result_from_text",
    "unshuffle",
]

DEFAULT_IMAGE_TOKEN = "<image>"


# ---------------------------------------------------------------------------------------------
# Pure pieces: permutation, prompt, parsing, unshuffling
# ---------------------------------------------------------------------------------------------


def _rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def make_permutation(
    n: int, seed: int | np.random.Generator | None = 0, anchor: bool = True
) -> np.ndarray:
    """int64 ``[n]``: ``perm[j]`` is the time index shown at position j.

    ``anchor=True`` keeps ``perm[0] = 0`` (GVL's anchor frame) and shuffles ``1..n-1``; a seed (or
    a ``numpy.random.Generator``) makes it reproducible.
    """
    if not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"make_permutation needs n >= 1 frames, got {n!r}")
    rng = _rng(seed)
    if anchor:
        return np.concatenate([[0], 1 + rng.permutation(int(n) - 1)]).astype(np.int64)
    return rng.permutation(int(n)).astype(np.int64)


def unshuffle(values_shown: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Put values given in shown order back in time order: ``out[perm[j]] = values_shown[j]``."""
    values_shown = np.asarray(values_shown, dtype=np.float64)
    perm = np.asarray(perm, dtype=np.int64)
    if values_shown.shape != perm.shape or perm.ndim != 1:
        raise ValueError(
            f"unshuffle: values {values_shown.shape} and permutation {perm.shape} must be the "
            "same 1-D shape"
        )
    if not np.array_equal(np.sort(perm), np.arange(len(perm))):
        raise ValueError("unshuffle: perm is not a permutation of 0..n-1")
    out = np.empty_like(values_shown)
    out[perm] = values_shown
    return out


def build_prompt(
    instruction: str, n_queried: int, anchor: bool = True, image_token: str = "<image>"
) -> str:
    """The plain GVL-style prompt with ``image_token`` placeholders (one per shown frame)."""
    return "".join(prompt_parts(instruction, n_queried, anchor, image_token))


def prompt_parts(instruction: str, n_queried: int, anchor: bool, image: Any) -> list[Any]:
    """Prompt as a list of text pieces and ``image`` markers (for chat templates and splicing)."""
    parts: list[Any] = [
        "You are an expert roboticist. Predict the task completion percentage of each frame of "
        f"a robot episode for the task: {instruction.strip()}. The percentage is between 0 and "
        "100, where 100 means the task is fully completed. The frames are shown in random "
        "order, so judge every frame on its own.\n"
    ]
    if anchor:
        parts += [
            "Initial robot scene: ",
            image,
            "\nIn the initial robot scene, the task completion percentage is 0%.\n",
        ]
    for j in range(1, n_queried + 1):
        parts += [f"Frame {j}: ", image, "\n"]
    parts.append(
        f"Answer with one line per frame, exactly in the form 'Frame i: p%', for i = 1 to "
        f"{n_queried}.\n"
    )
    return parts


_NUMBER = r"-?\d+(?:\.\d+)?"
_FRAME_RE = re.compile(r"\bframe\s*#?\s*(\d+)\b\s*(?:[:=)\]\-–—]\s*)?", re.IGNORECASE)
_PERCENT_RE = re.compile(rf"({_NUMBER})\s*%")
_KEYWORD_RE = re.compile(rf"(?:completion|progress)[^0-9\-]*({_NUMBER})", re.IGNORECASE)
_NUMBER_RE = re.compile(_NUMBER)
_LONE_NUMBER_RE = re.compile(rf"^\s*[-*•]?\s*({_NUMBER})\s*%?\s*[.,;]?\s*$")


def _clamp(value: float) -> float:
    return float(min(max(value, 0.0), 100.0)) if math.isfinite(value) else math.nan


def _as_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        if isinstance(value, str):
            match = _NUMBER_RE.search(value)
            return _clamp(float(match.group())) if match else math.nan
        return math.nan
    return _clamp(float(value))


def _parse_json(text: str, n_frames: int) -> np.ndarray | None:
    """A JSON list of n_frames values, or an object keyed by frame number; None if absent."""
    for match in re.finditer(r"\[[^\[\]]*\]|\{[^{}]*\}", text):
        try:
            data = json.loads(match.group())
        except ValueError:
            continue
        if isinstance(data, list) and len(data) == n_frames:
            return np.array([_as_number(v) for v in data], dtype=np.float64)
        if isinstance(data, dict) and data:
            out = np.full(n_frames, np.nan)
            found = False
            for key, value in data.items():
                index = re.search(r"\d+", str(key))
                if index and 1 <= int(index.group()) <= n_frames:
                    found = True
                    if np.isnan(out[int(index.group()) - 1]):
                        out[int(index.group()) - 1] = _as_number(value)
            if found:
                return out
    return None


def _segment_value(segment: str) -> float:
    """The percentage in the text after one ``frame i`` (see the module docstring)."""
    for pattern in (_PERCENT_RE, _KEYWORD_RE, _NUMBER_RE):
        match = pattern.search(segment)
        if match:
            return _clamp(float(match.group(1) if pattern.groups else match.group()))
    return math.nan


def parse_completion(text: str, n_frames: int) -> np.ndarray:
    """Percentages ``float64 [n_frames]`` (shown order) in [0, 100], NaN where missing.

    See the module docstring for the accepted formats; unparseable text gives all NaN.
    """
    if n_frames < 0:
        raise ValueError(f"parse_completion needs n_frames >= 0, got {n_frames}")
    out = np.full(n_frames, np.nan)
    if n_frames == 0 or not text:
        return out
    from_json = _parse_json(text, n_frames)
    if from_json is not None:
        return from_json

    matches = list(_FRAME_RE.finditer(text))
    indexed = [m for m in matches if 1 <= int(m.group(1)) <= n_frames]
    if indexed:
        for k, match in enumerate(matches):
            index = int(match.group(1))
            if not 1 <= index <= n_frames or not np.isnan(out[index - 1]):
                continue
            end = matches[k + 1].start() if k + 1 < len(matches) else len(text)
            segment = text[match.end() : end]
            out[index - 1] = _segment_value(segment)
        return out
    if matches:  # frame indices, all out of range: nothing to trust
        return out

    values: list[float] = []
    for line in text.splitlines():
        percents = _PERCENT_RE.findall(line)
        if percents:
            values.extend(_clamp(float(p)) for p in percents)
            continue
        lone = _LONE_NUMBER_RE.match(line)
        if lone:
            values.append(_clamp(float(lone.group(1))))
    values = values[:n_frames]
    out[: len(values)] = values
    return out


# ---------------------------------------------------------------------------------------------
# Results and metrics
# ---------------------------------------------------------------------------------------------


@dataclass
class JudgeRequest:
    """One episode prepared for the model: frames in shown order and how to read the answer."""

    frames: np.ndarray  # uint8 [T, H, W, 3], shown order (anchor first when anchored)
    instruction: str
    permutation: np.ndarray  # int64 [T]: shown position j -> time index
    anchor: bool

    @property
    def n_queried(self) -> int:
        """Frames the model is asked about (T, or T - 1 with the anchor)."""
        return len(self.permutation) - int(self.anchor)


@dataclass
class JudgeResult:
    """The judge's answer for one episode.

    ``progress``: float64 ``[T]`` in [0, 1], time order, NaN where the answer was missing or
    unparseable; with ``anchor`` the first entry is the given 0. ``n_missing`` counts the
    queried frames (not the anchor) without an answer.
    """

    progress: np.ndarray
    text: str
    n_missing: int
    n_queried: int
    permutation: np.ndarray
    anchor: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def predicted(self) -> np.ndarray:
        """Bool ``[T]``: frames whose progress came from the model (excludes the anchor)."""
        mask = ~np.isnan(self.progress)
        if self.anchor:
            mask[0] = False
        return mask


def result_from_text(request: JudgeRequest, text: str) -> JudgeResult:
    """Parse the model's text for ``request`` and restore time order."""
    parsed = parse_completion(text, request.n_queried) / 100.0
    shown = np.concatenate([[0.0], parsed]) if request.anchor else parsed
    progress = unshuffle(shown, request.permutation)
    return JudgeResult(
        progress=progress,
        text=text,
        n_missing=int(np.isnan(parsed).sum()),
        n_queried=request.n_queried,
        permutation=request.permutation,
        anchor=request.anchor,
    )


def judged_voc(results: Sequence[JudgeResult], include_anchor: bool = False) -> dict[str, Any]:
    """VOC of judged episodes, with missing answers counted and reported.

    Per episode, VOC (``value_order_correlation``) over the frames with an answer, in time order
    (Spearman against their ranks equals Spearman against their time indices). The anchor frame's
    given 0% is left out unless ``include_anchor`` (it is not a prediction and would inflate VOC).
    An episode with fewer than 2 valid frames is *missing*: its VOC is NaN in ``voc``, it is left
    out of ``mean`` / ``median`` / ``std`` and counted in ``n_missing_episodes``;
    ``mean_missing_as_zero`` scores missing episodes 0 (no order information) instead.

    Returns ``{"voc": float64 [N] (NaN = missing), "mean", "median", "std", "n" (valid
    episodes), "n_missing_episodes", "mean_missing_as_zero", "n_missing_frames",
    "n_queried_frames", "missing_frame_rate"}``; statistics are NaN when no episode is valid.
    """
    if len(results) == 0:
        raise ValueError("judged_voc needs at least one judged episode")
    vocs = np.full(len(results), np.nan)
    for i, result in enumerate(results):
        valid = ~np.isnan(result.progress)
        if result.anchor and not include_anchor:
            valid[0] = False
        if valid.sum() >= 2:
            vocs[i] = value_order_correlation(result.progress[valid])
    ok = ~np.isnan(vocs)
    n_missing_frames = int(sum(r.n_missing for r in results))
    n_queried = int(sum(r.n_queried for r in results))
    return {
        "voc": vocs,
        "mean": float(vocs[ok].mean()) if ok.any() else math.nan,
        "median": float(np.median(vocs[ok])) if ok.any() else math.nan,
        "std": float(vocs[ok].std()) if ok.any() else math.nan,
        "n": int(ok.sum()),
        "n_missing_episodes": int((~ok).sum()),
        "mean_missing_as_zero": float(np.where(ok, vocs, 0.0).mean()),
        "n_missing_frames": n_missing_frames,
        "n_queried_frames": n_queried,
        "missing_frame_rate": n_missing_frames / n_queried if n_queried else math.nan,
    }


# ---------------------------------------------------------------------------------------------
# The judge
# ---------------------------------------------------------------------------------------------
