"""Training and evaluating the progress reward model: ``embodied train reward`` end to end, resume,
episode splits, clip sampling, fine-tuning, the CLI, and ``embodied eval reward``'s metrics."""

from __future__ import annotations

import dataclasses
import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from test_progress import tiny_config

from embodied.core.config import validate
from embodied.core.nn import build_vocab
from embodied.rewards.progress import ProgressConfig, ProgressRewardModel


# --- training ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def labelled_reach(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Reach demos with failures (cut off, rewound), 32 px, procedure-labelled."""
    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.apps.label import run_label

    root = tmp_path_factory.mktemp("reward") / "reach"
    run_collect(
        CollectConfig(
            task="Reach", episodes=6, out=str(root), image_size=32, cutoff=0.3, rewind=1.0
        )
    )
    run_label(root)
    return root


def _train_config(dataset: Path, out: Path, **overrides):
    from embodied.train.reward import RewardTrainConfig

    model = ProgressConfig(
        vision_channels=[8, 16], num_keypoints=8, d_model=32, ff_dim=64, num_bins=11
    )
    values = dict(
        dataset=str(dataset),
        out=str(out),
        model=model,
        clip_len=6,
        clip_len_max=10,
        batch_size=8,
        steps=30,
        eval_every=15,
        save_every=10,
        log_every=10,
        val_fraction=0.34,
    )
    return RewardTrainConfig(**{**values, **overrides})


def test_train_reward_end_to_end(labelled_reach: Path, tmp_path: Path) -> None:
    from embodied.core.run import read_metrics
    from embodied.datasets import LeRobotDataset
    from embodied.train.reward import train_reward

    run = train_reward(_train_config(labelled_reach, tmp_path))
    metrics = read_metrics(run.path / "metrics.jsonl")
    val = [m for m in metrics if "val/progress_mae" in m]
    assert [m["step"] for m in val] == [15, 30]
    for key in ("val/voc_success_mean", "val/success_auroc", "val/progress_mae"):
        assert np.isfinite(val[-1][key]), key
    assert -1 <= val[-1]["val/voc_success_mean"] <= 1 and 0 <= val[-1]["val/success_auroc"] <= 1
    assert any("train/loss" in m for m in metrics)
    data = [m for m in metrics if "data/val_episodes" in m][0]
    assert data["data/val_episodes"] >= 2 and data["data/train_episodes"] >= 2
    model = ProgressRewardModel.from_pretrained(run.path / "model")
    dataset = LeRobotDataset(labelled_reach)
    assert model.config.image_size == 32 and model.config.vocab == build_vocab(dataset.tasks)
    assert model.config.image_key == "observation.image"  # the camera it scores in GRPO
    recorded = OmegaConf.load(run.path / "config.yaml").model
    assert recorded.image_size == 32 and list(recorded.vocab) == model.config.vocab
    frames = dataset.episode_frames(0, keys=["observation.image"])["observation.image"]
    progress = model.progress(torch.from_numpy(frames)[None], [dataset.tasks[0]])
    assert progress.shape == (1, len(frames))


def test_resume_continues_exactly(labelled_reach: Path, tmp_path: Path) -> None:
    """Bit for bit on the CPU. On CUDA, cuDNN's and attention's backward kernels are not
    deterministic unless the user asks for them (``embodied.core.run.seed_everything``)."""
    from embodied.train.checkpoints import latest_checkpoint
    from embodied.train.reward import train_reward

    cpu = {"steps": 20, "eval_every": 10, "device": "cpu"}
    full = train_reward(_train_config(labelled_reach, tmp_path / "a", **cpu))
    stopped = tmp_path / "b"
    shutil.copytree(full.path, stopped)
    shutil.rmtree(stopped / "checkpoints" / "step-0000020")
    shutil.rmtree(stopped / "model")
    assert latest_checkpoint(stopped / "checkpoints").name == "step-0000010"
    resumed = train_reward(
        _train_config(labelled_reach, tmp_path / "unused", resume=str(stopped), **cpu)
    )
    assert resumed.path == stopped
    a = ProgressRewardModel.from_pretrained(full.path / "model").state_dict()
    b = ProgressRewardModel.from_pretrained(stopped / "model").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_unlabelled_dataset_says_to_run_embodied_label(tmp_path: Path) -> None:
    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.train.reward import train_reward

    root = tmp_path / "raw"
    run_collect(CollectConfig(task="Reach", episodes=1, out=str(root), image_size=32))
    with pytest.raises(ValueError, match="run `embodied label"):
        train_reward(_train_config(root, tmp_path))


def test_split_holds_out_whole_seeds_and_instructions() -> None:
    from embodied.train.reward import split_episodes

    table = [
        {"episode_index": i, "seed": i // 2, "tasks": [f"reach the {c} block"]}
        for i, c in enumerate(["red", "red", "blue", "blue", "green", "green"] * 3)
    ]
    for row in table[6:]:
        row["seed"] += 3
    train, val = split_episodes(table, 0.34)
    assert sorted(train + val) == list(range(18)) and not set(train) & set(val)
    seed_of = {row["episode_index"]: row["seed"] for row in table}
    assert not {seed_of[e] for e in train} & {seed_of[e] for e in val}  # whole seeds
    assert len({seed_of[e] for e in val}) == 3  # round(0.34 * 9)
    assert split_episodes(table, 0.34) == (train, val)  # deterministic
    _, val_text = split_episodes(table, 0.0, val_instruction_fraction=0.7)
    held = {table[e]["tasks"][0] for e in val_text}
    assert held and all(table[e]["tasks"][0] not in held for e in range(18) if e not in val_text)


def test_full_span_clips_are_the_view_episodes_are_scored_at() -> None:
    from embodied.train.reward import RewardTrainConfig, eval_indices, sample_clip

    last, clip_len = 96, 8
    spans = [
        sample_clip(last, last, clip_len, 0.0, np.random.default_rng(s), 1.0) for s in range(50)
    ]
    for idx in spans:  # evenly spaced from frame 0 to the (jittered) end, in order
        assert idx[0] == 0 and len(idx) == clip_len and np.all(np.diff(idx) > 0)
        assert np.abs(np.diff(idx) - idx[-1] / (clip_len - 1)).max() <= 1.0
    assert any(np.array_equal(idx, eval_indices(last + 1, clip_len)) for idx in spans)
    strided = [sample_clip(last, last, clip_len, 0.0, np.random.default_rng(s)) for s in range(50)]
    covers = [idx[0] == 0 and idx[-1] - idx[-2] >= last // clip_len for idx in strided]
    assert sum(covers) < 25  # without full_span most clips look at a recent window only
    with pytest.raises(ValueError, match="'full_span' = 1.5 is out of range"):
        validate(RewardTrainConfig(dataset="d", full_span=1.5))


def test_rewind_clips_play_a_success_forward_then_back(labelled_reach: Path, tmp_path) -> None:
    """``rewind=1``: every clip of a successful episode shows its frames up to a split and then
    the same frames backwards, ending on the way back, with the labels of the frames shown and no
    success at the end."""
    from embodied.datasets import LeRobotDataset
    from embodied.datasets.training import RewardDataset
    from embodied.train.reward import make_batch

    dataset = LeRobotDataset(labelled_reach)
    successes = [e for e, ok in enumerate(dataset.episode_success()) if ok]
    clips = RewardDataset(dataset, clip_len=8, clips_per_episode=4, episodes=successes)
    cfg = _train_config(labelled_reach, tmp_path, clip_len=8, clip_len_max=0, rewind=1.0)
    cfg = dataclasses.replace(cfg, full_span=1.0, start_crop=0.0, shift=0, brightness=0, color=0)
    videos = {e: torch.from_numpy(clips.cache.frames(e)["observation.image"]) for e in successes}

    def where(frame: torch.Tensor, video: torch.Tensor) -> list[int]:
        return [i for i in range(len(video)) if torch.equal(frame, video[i])]

    turned = total = 0
    for step in range(6):
        batch = make_batch(clips, cfg, step, torch.device("cpu"))
        for frames, labels, success in zip(
            batch["frames"], batch["progress"], batch["success"], strict=True
        ):
            episode = next(e for e in successes if where(frames[0], videos[e])[:1] == [0])
            shown = [where(frame, videos[episode])[0] for frame in frames]
            label = clips.cache.frames(episode)["progress.label"]
            assert np.allclose(labels.numpy(), label[shown])
            peak = int(np.argmax(shown))
            assert np.all(np.diff(shown[: peak + 1]) >= 0) and np.all(np.diff(shown[peak:]) <= 0)
            turned += shown[-1] < shown[peak]
            total += 1
            assert not success
    # Every clip ends after the split; only when the spaced frames skip it can the last frame
    # shown equal the peak (before clips ended on the way back, about a third of them did).
    assert turned >= 0.8 * total
    with pytest.raises(ValueError, match="'rewind' = -0.1 is out of range"):
        validate(_train_config(labelled_reach, tmp_path, rewind=-0.1))


def test_final_frame_clips_end_on_their_episode_last_frame(labelled_reach, tmp_path) -> None:
    """``final_frame=1``: every clip ends on its episode's last frame (the frame success AUROC
    reads) with that frame's label and the episode's outcome; by default few clips do."""
    from embodied.datasets import LeRobotDataset
    from embodied.datasets.training import RewardDataset
    from embodied.train.reward import make_batch

    dataset = LeRobotDataset(labelled_reach)
    clips = RewardDataset(dataset, clip_len=8, clips_per_episode=4)
    outcome = dataset.episode_success()
    last = {}
    for e in range(dataset.num_episodes):
        columns = clips.cache.frames(e)
        frame = torch.from_numpy(columns["observation.image"][-1])
        last[e] = (frame, columns["progress.label"][-1])

    def ends(final_frame: float) -> list[bool]:
        cfg = _train_config(labelled_reach, tmp_path, clip_len=8, clip_len_max=0)
        cfg = dataclasses.replace(cfg, final_frame=final_frame, shift=0, brightness=0, color=0)
        on_last = []
        for step in range(6):
            batch = make_batch(clips, cfg, step, torch.device("cpu"))
            for frames, labels, success in zip(
                batch["frames"], batch["progress"], batch["success"], strict=True
            ):
                hits = [e for e, (frame, _) in last.items() if torch.equal(frames[-1], frame)]
                on_last.append(bool(hits))
                if hits:
                    assert labels[-1].item() == pytest.approx(last[hits[0]][1])
                    assert bool(success) == bool(outcome[hits[0]])
        return on_last

    assert all(ends(1.0))
    assert sum(ends(0.0)) < 0.5 * len(ends(0.0))
    with pytest.raises(ValueError, match="'final_frame' = 2.0 is out of range"):
        validate(_train_config(labelled_reach, tmp_path, final_frame=2.0))


def test_fine_tuning_starts_from_the_pretrained_weights(labelled_reach, tmp_path) -> None:
    from embodied.train.reward import pretrained_model, train_reward

    base = train_reward(_train_config(labelled_reach, tmp_path / "base", steps=10))
    saved = ProgressRewardModel.from_pretrained(base.path / "model").state_dict()
    cfg = _train_config(labelled_reach, tmp_path / "tuned", steps=2, eval_every=2)
    tuned_cfg = dataclasses.replace(
        cfg, pretrained=str(base.path / "model"), optim=dataclasses.replace(cfg.optim, lr=1e-12)
    )
    tuned = ProgressRewardModel.from_pretrained(train_reward(tuned_cfg).path / "model")
    assert all(torch.allclose(saved[k], v, atol=1e-8) for k, v in tuned.state_dict().items())
    wider = dataclasses.replace(cfg.model, d_model=64)
    with pytest.raises(ValueError, match=r"model.d_model=64 \(pretrained: 32\)"):
        train_reward(dataclasses.replace(tuned_cfg, model=wider))
    finer = dataclasses.replace(cfg.model, vision_stem_stride=1)
    with pytest.raises(ValueError, match=r"model.vision_stem_stride=1 \(pretrained: 2\)"):
        pretrained_model(str(base.path / "model"), finer, 32, tuned.config.vocab[1:])
    with pytest.raises(ValueError, match="reads 32 px frames; the dataset's are 64 px"):
        pretrained_model(str(base.path / "model"), cfg.model, 64, tuned.config.vocab[1:])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every word of the dataset is known: no warning
        pretrained_model(str(base.path / "model"), cfg.model, 32, tuned.config.vocab[1:])
    with pytest.warns(UserWarning, match=r"1 instruction word.*'<unk>': teleport"):
        pretrained_model(str(base.path / "model"), cfg.model, 32, ["teleport the block"])


def test_cli_wires_train_reward(labelled_reach: Path, tmp_path: Path) -> None:
    from embodied.apps.cli import build_parser, main

    args = build_parser().parse_args(["train", "reward", "configs/reward.yaml", "steps=5"])
    assert args.func.__name__ == "_cmd_train" and args.algorithm == "reward"
    assert args.overrides == ["steps=5"]
    config = Path(__file__).parents[1] / "configs" / "reward.yaml"
    code = main(
        [
            "train",
            "reward",
            str(config),
            f"dataset={labelled_reach}",
            f"out={tmp_path}",
            "steps=2",
            "batch_size=2",
            "model.d_model=30",
        ]
    )
    assert code == 2  # a bad model field is a clear error, not a traceback


# --- evaluation --------------------------------------------------------------------------------
def test_eval_reward_gives_each_task_of_a_multi_task_dataset_its_own_row(tmp_path) -> None:
    from embodied.apps.collect import CollectConfig, run_collect
    from embodied.apps.label import run_label
    from embodied.datasets import LeRobotDataset
    from embodied.evaluation.reward import evaluate_reward

    root = tmp_path / "two-tasks"
    for task in ("Reach", "ButtonPress"):
        run_collect(CollectConfig(task=task, episodes=4, out=str(root), image_size=32, cutoff=0.5))
    run_label(root)
    table = LeRobotDataset(root).episodes_table()
    rows = {r["task"]: r for r in evaluate_reward(str(root), ["time"])}
    assert list(rows) == ["all", "Reach", "ButtonPress"]
    for task in ("Reach", "ButtonPress"):
        mine = [r for r in table if r["task_name"] == task]
        assert rows[task]["episodes"] == len(mine) == 4
        assert rows[task]["failed"] == sum(not r["success"] for r in mine)
    assert rows["all"]["episodes"] == 8 and rows["all"]["voc_success_mean"] == pytest.approx(1.0)


def test_eval_reward_row_matches_hand_computed_metrics() -> None:
    """Four scored episodes worked out by hand: VOC on successes and failures, AUROC of the final
    (last answered) progress, failed median, MAE over answered frames, the head's AUROC and ECE,
    and the missing answers counted."""
    from embodied.evaluation.reward import Scored, summarize

    nan = float("nan")
    scored = [  # progress, success head, label, success, missing
        Scored(np.array([0.0, 0.5, 1.0]), 0.85, np.array([0.0, 0.5, 1.0]), True),
        Scored(np.array([0.2, 0.1, 0.6]), 0.55, np.array([0.0, 0.5, 1.0]), True),
        Scored(np.array([0.3, nan, 0.7]), 0.25, np.array([0.1, 0.3, 0.5]), False, missing=1),
        Scored(np.array([0.4, 0.3, 0.2]), 0.65, np.array([0.2, 0.3, 0.4]), False),
    ]
    row = summarize("m", scored)
    assert row["episodes"] == 4 and row["failed"] == 2 and row["missing"] == 1
    # VOC: 1 and 1 - 6 * 2 / (3 * 8) = 0.5 on successes; 1 (two answered frames) and -1 on failures
    assert row["voc_success_mean"] == pytest.approx(0.75)
    assert row["voc_success_median"] == pytest.approx(0.75)
    assert row["voc_success_std"] == pytest.approx(0.25)
    assert row["voc_failed_mean"] == pytest.approx(0.0)
    # finals 1.0, 0.6 | 0.7, 0.2: three of four (success, failure) pairs ordered
    assert row["success_auroc"] == pytest.approx(0.75)
    assert row["failed_median_final"] == pytest.approx(0.45)
    # |errors|: 0 0 0, 0.2 0.4 0.4, 0.2 (NaN skipped) 0.2, 0.2 0 0.2 -> 1.8 over 11 frames
    assert row["mae"] == pytest.approx(1.8 / 11)
    assert row["success_head_auroc"] == pytest.approx(0.75)
    # one probability per bin: (0.15 + 0.45 + 0.25 + 0.65) / 4
    assert row["success_head_ece"] == pytest.approx(0.375)


def test_eval_reward_scores_privileged_progress_and_success_only(labelled_reach):
    """Every reward implementation is a method of ``embodied eval reward``: the simulator's
    progress as the dataset recorded it, and success only (no progress at all)."""
    from embodied.datasets import LeRobotDataset
    from embodied.evaluation.reward import evaluate_reward

    rows = {r["method"]: r for r in evaluate_reward(str(labelled_reach), ["privileged", "success"])}
    dataset = LeRobotDataset(labelled_reach)
    finals, wins = [], []
    for r in dataset.episodes_table():
        recorded = dataset.episode_frames(int(r["episode_index"]), keys=["progress.privileged"])
        finals.append(float(recorded["progress.privileged"][-1]))
        wins.append(bool(r["success"]))
    failed = [f for f, w in zip(finals, wins, strict=True) if not w]
    privileged, success = rows["privileged"], rows["success"]
    assert privileged["failed"] == len(failed) > 0 and privileged["episodes"] == len(finals)
    assert privileged["failed_median_final"] == pytest.approx(np.median(failed))
    assert privileged["success_auroc"] == 1.0  # only successes finish at full progress
    assert success["failed_median_final"] == 0.0 and success["success_auroc"] == 0.5


def test_eval_reward_table_has_the_model_and_its_baselines(labelled_reach, tmp_path, capsys):
    from embodied.apps.cli import main
    from embodied.datasets import LeRobotDataset

    torch.manual_seed(0)
    dataset = LeRobotDataset(labelled_reach)
    model = ProgressRewardModel(tiny_config(image_size=32, vocab=build_vocab(dataset.tasks)))
    model.save_pretrained(tmp_path / "model")
    out = tmp_path / "rows.json"
    code = main(["eval", "reward", "--model", str(tmp_path / "model"), "--dataset",
                 str(labelled_reach), "--json", str(out)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    rows = {r["method"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {str(tmp_path / "model"), "untrained", "time interpolation"}
    time_row = rows["time interpolation"]
    table = dataset.episodes_table()
    failed = sum(not r["success"] for r in table)
    assert time_row["episodes"] == len(table) and time_row["failed"] == failed > 0
    # time interpolation: perfect order everywhere, 1.0 at the end of every failure, no head
    assert time_row["voc_success_mean"] == 1.0 and time_row["voc_failed_mean"] == 1.0
    assert time_row["failed_median_final"] == 1.0 and time_row["success_auroc"] == 0.5
    assert "success_head_auroc" not in time_row  # a method without a success head
    model_row = rows[str(tmp_path / "model")]
    assert 0.0 <= model_row["success_head_ece"] <= 1.0 and -1 <= model_row["voc_success_mean"] <= 1
    assert "| time interpolation |" in printed and "n/a" in printed
    assert main(["eval", "reward", "--model", "nowhere", "--dataset", str(labelled_reach)]) == 2
    assert "'nowhere' is not 'time', 'privileged'" in capsys.readouterr().err
