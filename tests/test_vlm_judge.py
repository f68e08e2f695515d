"""GVL-style VLM judge: parsing, shuffling, batching, tiny Llava end to end, VOC with missing."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_vlm import tiny_llava

from embodied.rewards.judge_prompt import (
    JudgeResult,
    build_prompt,
    judged_voc,
    make_permutation,
    parse_completion,
    unshuffle,
)
from embodied.rewards.vlm_judge import VLMJudge

# --- pure functions ---------------------------------------------------------------------------


def test_make_permutation_anchor_seed():
    perm = make_permutation(8, seed=3)
    assert perm[0] == 0 and sorted(perm) == list(range(8))
    np.testing.assert_array_equal(perm, make_permutation(8, seed=3))
    assert any(not np.array_equal(perm, make_permutation(8, seed=s)) for s in range(4, 8))
    free = make_permutation(8, seed=3, anchor=False)
    assert sorted(free) == list(range(8))
    np.testing.assert_array_equal(make_permutation(1, seed=0), [0])
    with pytest.raises(ValueError):
        make_permutation(0)


def test_unshuffle_inverts_shuffle():
    values = np.linspace(0, 1, 6)
    perm = make_permutation(6, seed=1, anchor=False)
    np.testing.assert_allclose(unshuffle(values[perm], perm), values)
    with pytest.raises(ValueError):
        unshuffle(values, np.array([0, 0, 1, 2, 3, 4]))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Frame 1: 10%\nFrame 2: 45%\nFrame 3: 100%", [10, 45, 100]),
        ("frame 2 - 45\nframe 1 - 5\nframe 3 - 60", [5, 45, 60]),
        ("Frame #3 = 7 %  Frame 1: 3 %", [3, np.nan, 7]),
        ("Frame 1: 150%\nFrame 2: -20%\nFrame 3: 12.5%", [100, 0, 12.5]),
        (
            "Frame 2: Frame Description: gripper holds 2 cubes, Task Completion Percentages: 40%"
            "\nFrame 1: Frame Description: arm at 3 o'clock, Task Completion: 20",
            [20, 40, np.nan],
        ),
        ("Frame 1: 5%\nFrame 1: 90%\nFrame 9: 50%\nFrame 2: no idea", [5, np.nan, np.nan]),
        ("45 %\n50%\n", [45, 50, np.nan]),
        ("Sure!\n10\n20\n30\n40", [10, 20, 30]),
        ("The answer: [0, 55.5, null]", [0, 55.5, np.nan]),
        ('{"1": 30, "3": 90}', [30, np.nan, 90]),
        ("54 7 59 31 5 26", [np.nan, np.nan, np.nan]),
        ("blah blah no numbers", [np.nan, np.nan, np.nan]),
        ("", [np.nan, np.nan, np.nan]),
    ],
)
def test_parse_completion(text, expected):
    np.testing.assert_allclose(parse_completion(text, 3), expected)


def test_build_prompt_counts_images():
    prompt = build_prompt("pick the cube", 4, anchor=True, image_token="<image>")
    assert prompt.count("<image>") == 5 and "Frame 4: <image>" in prompt
    assert "Frame 5" not in prompt and "pick the cube" in prompt
    assert build_prompt("x", 4, anchor=False).count("<image>") == 4


def test_judged_voc_counts_missing():
    def result(progress, anchor=True):
        progress = np.asarray(progress, dtype=float)
        n_missing = int(np.isnan(progress[int(anchor) :]).sum())
        perm = np.arange(len(progress))
        return JudgeResult(progress, "", n_missing, len(progress) - int(anchor), perm, anchor)

    results = [
        result([0.0, 0.2, 0.5, 0.9]),  # VOC 1 (anchor excluded)
        result([0.0, 0.9, np.nan, 0.1]),  # VOC -1 over frames 1, 3
        result([0.0, 0.4, np.nan, np.nan]),  # 1 valid frame: missing episode
    ]
    summary = judged_voc(results)
    np.testing.assert_allclose(summary["voc"], [1.0, -1.0, np.nan])
    assert summary["n"] == 2 and summary["n_missing_episodes"] == 1
    assert summary["mean"] == pytest.approx(0.0)
    assert summary["mean_missing_as_zero"] == pytest.approx(0.0)
    assert summary["n_missing_frames"] == 3 and summary["n_queried_frames"] == 9
    assert summary["missing_frame_rate"] == pytest.approx(3 / 9)
    all_missing = judged_voc([results[2]])
    assert all_missing["n"] == 0 and np.isnan(all_missing["mean"])


CHAT_TEMPLATE = (
    "{% for m in messages %}<bos>{{ m['role'] }} :{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endfor %}{% if add_generation_prompt %} robot :{% endif %}"
)


def _episodes(n: int, steps: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [
        (rng.integers(0, 255, size=(steps + i % 2, 20, 24, 3), dtype=np.uint8), f"pick {i}")
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def llava():
    return tiny_llava()


def test_tiny_llava_judge_mechanics(llava):
    model, processor = llava
    judge = VLMJudge(model, processor, max_new_tokens=12)
    frames, instruction = _episodes(1)[0]
    result = judge.judge(frames, instruction, seed=0)
    assert result.progress.shape == (len(frames),)
    assert result.progress[0] == 0.0 and result.anchor
    assert result.n_queried == len(frames) - 1
    valid = result.progress[~np.isnan(result.progress)]
    assert np.all((valid >= 0) & (valid <= 1))
    # Garbage text: whatever parsed is exactly what the parser reads, NaN otherwise.
    expected = unshuffle(
        np.concatenate([[0.0], parse_completion(result.text, result.n_queried) / 100]),
        result.permutation,
    )
    np.testing.assert_array_equal(result.progress, expected)
    assert result.n_missing == int(np.isnan(result.progress).sum())
    again = judge.judge(frames, instruction, seed=0)
    assert again.text == result.text
    np.testing.assert_array_equal(again.permutation, result.permutation)


def test_batched_generation_matches_loop(llava):
    model, processor = llava
    episodes = _episodes(3)
    batched = VLMJudge(model, processor, max_new_tokens=6, batch_size=3)
    looped = VLMJudge(model, processor, max_new_tokens=6, batch_size=1)
    assert batched.batched and not looped.batched
    a, b = batched.judge_batch(episodes, seed=1), looped.judge_batch(episodes, seed=1)
    assert [r.text for r in a] == [r.text for r in b]
    assert processor.tokenizer.padding_side == "right"  # restored after the call


def test_chat_template_and_tokenizer_mode():
    model, processor = tiny_llava(chat_template=CHAT_TEMPLATE)
    judge = VLMJudge(model, processor, max_new_tokens=4)
    request = judge.prepare(*_episodes(1)[0], seed=0)
    prompt = judge.prompt_text(request)
    assert prompt.startswith("<bos>user :") and prompt.endswith(" robot :")
    assert prompt.count("<image>") == len(request.frames)
    assert judge.judge(*_episodes(1)[0]).progress.shape == (5,)

    model, tokenizer = tiny_llava(with_processor=False)
    judge = VLMJudge(model, tokenizer, max_new_tokens=4, batch_size=2)
    results = judge.judge_batch(_episodes(2), seed=0)
    assert [r.progress.shape for r in results] == [(5,), (6,)]
    assert judge._n_image_tokens == 4  # (16 / 8) ** 2 patches per frame


class _StubJudge(VLMJudge):
    """Answers with the true progress of each shown frame, in shown (shuffled) order."""

    def __init__(self, truth, drop=()):
        self.anchor, self.batch_size, self.truth, self.drop = True, 4, truth, drop
        self.tokenizer = None
        self.calls = []

    @property
    def batched(self):
        return True

    def generate(self, requests):
        self.calls.append(len(requests))
        texts = []
        for request in requests:
            truth = self.truth[request.instruction]
            lines = [
                f"Frame {j}: {100 * truth[request.permutation[j]]:.0f}%"
                for j in range(1, len(request.permutation))
                if request.permutation[j] not in self.drop
            ]
            texts.append("\n".join(lines[::-1]))  # any line order
        return texts


def test_stub_generate_is_unshuffled():
    truth = {"a": np.linspace(0, 1, 7), "b": np.array([0.0, 0.6, 0.3, 0.9, 0.1])}
    episodes = [(np.zeros((len(t), 4, 4, 3), np.uint8), key) for key, t in truth.items()]
    judge = _StubJudge(truth)
    results = judge.judge_batch(episodes, seed=5)
    assert judge.calls == [2]
    for result, key in zip(results, truth, strict=True):
        assert not np.array_equal(result.permutation, np.arange(len(truth[key])))
        np.testing.assert_allclose(result.progress, np.round(100 * truth[key]) / 100)
        assert result.n_missing == 0
    assert judged_voc(results)["voc"][0] == pytest.approx(1.0)

    dropped = _StubJudge(truth, drop=(3,)).judge(*episodes[1], seed=2)
    assert np.isnan(dropped.progress[3]) and dropped.n_missing == 1
    np.testing.assert_allclose(np.delete(dropped.progress, 3), [0.0, 0.6, 0.3, 0.1])


def test_from_pretrained_offline(tmp_path, llava):
    model, processor = llava
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    judge = VLMJudge.from_pretrained(str(tmp_path), max_new_tokens=5)
    assert judge.has_image_processor
    frames, instruction = _episodes(1)[0]
    reference = VLMJudge(model, processor, max_new_tokens=5).judge(frames, instruction)
    assert judge.judge(frames, instruction).text == reference.text


def test_bad_frames():
    judge = _StubJudge({"x": np.zeros(3)})
    with pytest.raises(ValueError, match="uint8"):
        judge.judge(np.zeros((3, 4, 4, 3), np.float32), "x")
    with pytest.raises(ValueError, match="episode 1"):
        judge.judge_batch([(np.zeros((3, 4, 4, 3), np.uint8), "x"), (np.zeros((3, 4, 4)), "x")])
