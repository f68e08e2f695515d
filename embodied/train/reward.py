"""Progress reward model training: ``embodied train reward CONFIG [key=value ...]``.

Reads top to bottom: load a labelled LeRobot dataset (``embodied label`` writes ``progress.label``)
-> split episodes into train / validation by held-out seeds (all episodes of a seed, rewound copies
included, go to one side) and, optionally, held-out instructions -> build the model (vocabulary from
the dataset's instructions, image size from its camera), or load a ``pretrained`` one to fine-tune
-> AdamW + cosine -> each step, a batch of clips that is a pure function of (seed, step), so
``resume`` continues exactly: a prefix clip from ``RewardDataset``'s index, its end jittered (or,
with probability ``final_frame``, the episode's last frame, where success AUROC is read), a random
stride and sometimes a random start (so the model sees histories of every length and spacing),
sometimes (``rewind``) cut from a successful episode played forward and back, ending on the way back
(ReWiND), then image augmentation (a shift of a few pixels, brightness and colour jitter) ->
periodic validation on whole held-out episodes: VOC on successes, success AUROC of the final
progress, MAE vs the label -> checkpoints -> the final model via ``save_pretrained`` in
``run_dir/model``.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import torch

from embodied.core.config import seed_setting, setting
from embodied.core.nn import UNKNOWN_WORD, build_vocab
from embodied.core.run import RunDir
from embodied.datasets import LeRobotDataset
from embodied.datasets.training import RewardDataset
from embodied.rewards.metrics import success_auroc, voc_summary
from embodied.rewards.progress import ProgressConfig, ProgressRewardModel, augment_frames
from embodied.rewards.rewind import rewind_order, rewind_split
from embodied.train.loop import Trainer, batch_indices, begin
from embodied.train.optim import OptimConfig


def _default_optim() -> OptimConfig:
    return OptimConfig(lr=3e-4, weight_decay=1e-4, betas=(0.9, 0.999), warmup_steps=100)


@dataclass
class RewardTrainConfig:
    """Reward-model run; every field can be overridden as ``key=value`` (``model.d_model=128``).
    ``model.image_size`` and ``model.vocab`` always come from the dataset."""

    dataset: str = "???"
    name: str = "reward"
    out: str = "runs"
    model: ProgressConfig = field(default_factory=ProgressConfig)
    label_key: str = "progress.label"
    image_key: str = ""  # default: the dataset's first camera
    clip_len: int = setting(8, low=2)
    clip_len_max: int = setting(0, low=0)  # > clip_len: each batch draws a length up to it
    clips_per_episode: int = setting(8, low=1)
    start_crop: float = setting(0.3, low=0.0, high=1.0)  # P(a clip starts at a random frame)
    # Probability that a clip's frames are evenly spaced over its whole history (how episodes
    # are scored: ``eval_indices``), not taken at a random stride back from its end.
    full_span: float = setting(0.0, low=0.0, high=1.0)
    # ReWiND on the fly: probability that a clip of a successful episode is cut from it played
    # forward to a random split and then back, ending on the way back (labels follow the frames
    # shown): a failure whose last frame only its history can tell apart from the way up.
    rewind: float = setting(0.0, low=0.0, high=1.0)
    # Probability that a clip (not rewound) ends exactly on its episode's last frame, the frame
    # whose progress decides success AUROC; otherwise clip ends are spread over the episode.
    final_frame: float = setting(0.0, low=0.0, high=1.0)
    # A saved ProgressRewardModel directory to start from (fine-tuning); ``model`` must then
    # match its config (image size and vocabulary come from it, not from the dataset).
    pretrained: str = ""
    shift: int = setting(4, low=0)  # image augmentation: pixels
    brightness: float = setting(0.2, low=0.0)
    color: float = setting(0.1, low=0.0)
    val_fraction: float = setting(0.2, low=0.0, high=0.99)  # of the seeds (episode groups) held out
    val_instruction_fraction: float = setting(0.0, low=0.0, high=0.99)  # of the instructions
    # At most this many evenly spaced frames scored per val episode; 0 = the longest training clip
    # (scoring more frames than the model was trained on puts positions out of distribution).
    eval_frames: int = setting(0, low=0)
    steps: int = setting(2000, low=1)
    # > 0: stop after the last step that fits in this many minutes (the schedule still spans steps)
    max_minutes: float = setting(0.0, low=0.0)
    batch_size: int = setting(32, low=1, high=4096)
    optim: OptimConfig = field(default_factory=_default_optim)
    seed: int = seed_setting()
    device: str = "auto"
    eval_every: int = setting(500, low=1)
    save_every: int = setting(500, low=0)  # 0: only at the end
    log_every: int = setting(50, low=1)
    resume: str = ""  # a run directory to continue from its latest checkpoint

    def check(self) -> None:
        """A clip-length range that is a range."""
        if self.clip_len_max and self.clip_len_max < self.clip_len:
            raise ValueError(
                f"clip_len_max = {self.clip_len_max}: expected 0 or >= clip_len ({self.clip_len})"
            )


def _unit_hash(text: str) -> float:
    """A stable number in [0, 1) for ``text`` (the same on every machine and Python run)."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16) / 16**12


def split_episodes(
    table: list[dict[str, Any]], val_fraction: float, val_instruction_fraction: float = 0.0
) -> tuple[list[int], list[int]]:
    """(train, val) episode indices. ``round(val_fraction * seeds)`` seeds (at least one when the
    fraction is > 0 and there are two or more), those with the smallest hash, go to validation
    with all their episodes; so do episodes whose instruction's hash is below
    ``val_instruction_fraction`` (instruction variants never seen in training)."""

    def group(row: dict[str, Any]) -> str:
        seed = int(row.get("seed", -1))
        return f"seed:{seed}" if seed >= 0 else f"episode:{row['episode_index']}"

    groups = sorted({group(row) for row in table}, key=_unit_hash)
    n_val = round(val_fraction * len(groups))
    if val_fraction > 0 and len(groups) > 1:
        n_val = min(max(n_val, 1), len(groups) - 1)
    held = set(groups[:n_val])
    train, val = [], []
    for row in table:
        text = " | ".join(row.get("tasks", []))
        unseen = _unit_hash(f"instruction:{text}") < val_instruction_fraction
        (val if group(row) in held or unseen else train).append(int(row["episode_index"]))
    return train, val


def sample_clip(
    end: int,
    last: int,
    clip_len: int,
    start_crop: float,
    rng: np.random.Generator,
    full_span: float = 0.0,
    jitter: bool = True,
) -> np.ndarray:
    """Frame indices ``[clip_len]`` of a clip ending near ``end`` (jittered unless ``jitter`` is
    off, within ``0..last``), starting at 0 unless cropped: with probability ``full_span`` evenly
    spaced from the start to the end (the view ``eval_indices`` scores), else at a random stride
    up to that spacing."""
    if jitter:
        spread = max(1, last // 8)
        end = int(np.clip(end + rng.integers(-spread, spread + 1), 0, last))
    start = int(rng.integers(0, end + 1)) if rng.random() < start_crop else 0
    if full_span > 0 and rng.random() < full_span:
        return np.linspace(start, end, clip_len).round().astype(int)
    max_stride = max(1, math.ceil((end - start) / max(clip_len - 1, 1)))
    stride = int(rng.integers(1, max_stride + 1))
    idx = end - stride * np.arange(clip_len)[::-1]
    return np.clip(idx, start, last)


def eval_indices(length: int, max_frames: int) -> np.ndarray:
    """Evenly spaced frames of an episode (first and last included), at most ``max_frames``."""
    return np.unique(np.linspace(0, length - 1, min(length, max_frames)).round().astype(int))


def make_batch(
    clips: Any, cfg: RewardTrainConfig, step: int, device: torch.device
) -> dict[str, Any]:
    """The training batch of ``step``: a pure function of (``cfg.seed``, ``step``). With
    ``clip_len_max``, the clip length varies per batch (so the time embedding sees every position
    up to it) and the batch shrinks to keep about ``batch_size * clip_len`` frames."""
    rng = np.random.default_rng([cfg.seed, step, 1])
    length = cfg.clip_len
    if cfg.clip_len_max > cfg.clip_len:
        length = int(rng.integers(cfg.clip_len, cfg.clip_len_max + 1))
    size = max(1, cfg.batch_size * cfg.clip_len // length)
    idx = batch_indices(len(clips), size, cfg.seed, step)
    frames, labels, success, instructions = [], [], [], []
    for i in idx:
        episode, end = clips.index[int(i)]
        columns = clips.cache.frames(episode)
        last = len(columns[clips.label_key]) - 1
        if cfg.rewind > 0 and clips.success[episode] and last > 3 and rng.random() < cfg.rewind:
            split = rewind_split(last, rng)
            shown = rewind_order(split)  # original frame at each rewound step
            end = int(rng.integers(split + 1, len(shown)))  # a frame on the way back
            sel = shown[sample_clip(end, end, length, cfg.start_crop, rng, cfg.full_span, False)]
        else:
            final = cfg.final_frame > 0 and rng.random() < cfg.final_frame
            end = last if final else end
            sel = sample_clip(end, last, length, cfg.start_crop, rng, cfg.full_span, not final)
        frames.append(torch.from_numpy(np.ascontiguousarray(columns[clips.image_key][sel])))
        labels.append(torch.from_numpy(columns[clips.label_key][sel].astype(np.float32)))
        done = columns["success"][sel[-1]] if "success" in columns else sel[-1] == last
        success.append(bool(done) and bool(clips.success[episode]))
        instructions.append(clips.cache.instruction(columns))
    generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
    batch_frames = augment_frames(
        torch.stack(frames), generator, cfg.shift, cfg.brightness, cfg.color
    )
    return {
        "frames": batch_frames.to(device),
        "progress": torch.stack(labels).to(device),
        "success": torch.tensor(success, dtype=torch.float32, device=device),
        "instruction": instructions,
    }


@torch.no_grad()
def evaluate_progress(model: Any, clips: Any, episodes: list[int], max_frames: int) -> dict:
    """VOC (successful and all episodes), success AUROC of the final progress and of the success
    head, and MAE vs the label, on whole episodes scored causally at ``max_frames`` frames."""
    was_training = model.training
    model.eval()
    preds, finals, probs, outcomes, errors = [], [], [], [], []
    for episode in episodes:
        columns = clips.cache.frames(episode)
        sel = eval_indices(len(columns[clips.label_key]), max_frames)
        frames = torch.from_numpy(np.ascontiguousarray(columns[clips.image_key][sel]))[None]
        out = model(frames, [clips.cache.instruction(columns)])
        pred = out["progress"][0].cpu().numpy().astype(np.float64)
        preds.append(pred)
        finals.append(pred[-1])
        probs.append(float(torch.sigmoid(out["success_logits"][0, -1])))
        outcomes.append(bool(clips.success[episode]))
        errors.append(np.abs(pred - columns[clips.label_key][sel]))
    model.train(was_training)
    outcomes_arr = np.array(outcomes, dtype=bool)
    result: dict[str, float] = {
        "val/episodes": len(episodes),
        "val/progress_mae": float(np.concatenate(errors).mean()),
    }
    successes = [p for p, ok in zip(preds, outcomes, strict=True) if ok]
    if successes:
        summary = voc_summary(successes)
        result |= {
            "val/voc_success_mean": summary["mean"],
            "val/voc_success_median": summary["median"],
        }
    result["val/voc_all_mean"] = voc_summary(preds)["mean"]
    if outcomes_arr.any() and not outcomes_arr.all():
        result["val/success_auroc"] = success_auroc(np.array(finals), outcomes_arr)
        result["val/success_prob_auroc"] = success_auroc(np.array(probs), outcomes_arr)
    return result


def pretrained_model(
    directory: str, wanted: ProgressConfig, image_size: int, instructions: Sequence[str]
) -> Any:
    """The saved model to fine-tune; an error names every architecture field where ``wanted``
    (the run's ``model``) differs from it, and a frame size that differs from the dataset's; a
    warning names the dataset's instruction words its vocabulary lacks (they read as unknown)."""
    model = ProgressRewardModel.from_pretrained(directory)
    have = model.config
    if have.image_size != image_size:
        raise ValueError(
            f"pretrained model {directory} reads {have.image_size} px frames; the dataset's are "
            f"{image_size} px"
        )
    wanted = replace(wanted, image_size=image_size).resolved()  # the stem stride at this size
    names = [f.name for f in fields(ProgressConfig)
             if f.name not in ("image_size", "image_key", "vocab")]  # fmt: skip
    differ = [
        f"model.{name}={getattr(wanted, name)!r} (pretrained: {getattr(have, name)!r})"
        for name in names
        if getattr(wanted, name) != getattr(have, name)
    ]
    if differ:
        raise ValueError(
            f"the run's model config differs from the pretrained model {directory}: "
            + ", ".join(differ)
        )
    unknown = sorted(set(build_vocab(instructions)) - set(have.vocab))
    if unknown:
        warnings.warn(
            f"pretrained model {directory} has no embedding for {len(unknown)} instruction "
            f"word(s) of the dataset, which read as {UNKNOWN_WORD!r}: {', '.join(unknown[:20])}",
            stacklevel=2,
        )
    return model


def train_reward(cfg: RewardTrainConfig) -> RunDir:
    """Train, validate, checkpoint; return the run directory (final model in ``model/``)."""
    device = begin(cfg)
    dataset = LeRobotDataset(cfg.dataset)
    if cfg.label_key not in dataset.features:
        raise ValueError(
            f"dataset {cfg.dataset} has no {cfg.label_key!r} labels: run "
            f"`embodied label {cfg.dataset}` first"
        )
    train_eps, val_eps = split_episodes(
        dataset.episodes_table(), cfg.val_fraction, cfg.val_instruction_fraction
    )
    if not train_eps:
        raise ValueError(
            f"no training episodes left after holding out val_fraction={cfg.val_fraction} and "
            f"val_instruction_fraction={cfg.val_instruction_fraction} of {dataset.num_episodes}"
        )
    clips = RewardDataset(
        dataset,
        clip_len=cfg.clip_len,
        clips_per_episode=cfg.clips_per_episode,
        label_key=cfg.label_key,
        image_key=cfg.image_key or None,
        episodes=train_eps,
    )
    shape = dataset.features[clips.image_key]["shape"]  # [H, W, 3]
    if shape[0] != shape[1]:
        raise ValueError(f"{clips.image_key} frames must be square, got shape {shape}")
    model_cfg = cfg.model
    if not isinstance(model_cfg, ProgressConfig):
        model_cfg = ProgressConfig(**dict(model_cfg))
    if cfg.pretrained:
        model = pretrained_model(cfg.pretrained, model_cfg, int(shape[0]), dataset.tasks).to(device)
        model.config.image_key = clips.image_key  # now trained on this dataset's camera
    else:
        model_cfg = replace(model_cfg, image_size=int(shape[0]), image_key=clips.image_key,
                            vocab=build_vocab(dataset.tasks))  # fmt: skip
        model = ProgressRewardModel(model_cfg).to(device)
    recorded = replace(cfg, model=model.config)  # image size and vocabulary as trained
    eval_frames = cfg.eval_frames or max(cfg.clip_len, cfg.clip_len_max)
    with Trainer(cfg, model, "steps", recorded) as trainer:
        if trainer.start == 0:
            trainer.metrics.log(
                {"data/train_episodes": len(train_eps), "data/val_episodes": len(val_eps)}, 0
            )
        for step in trainer.steps("reward"):
            losses = model.losses(make_batch(clips, cfg, step, device))
            trainer.update(losses["loss"], f"reward loss at step {step}")
            done = step + 1
            if trainer.due(done, cfg.log_every):
                logged = {f"train/{k}": v.item() for k, v in losses.items()}
                lr = trainer.scheduler.get_last_lr()[0]
                trainer.metrics.log({**logged, "train/lr": lr}, done)
            if val_eps and trainer.due(done, cfg.eval_every):
                trainer.metrics.log(evaluate_progress(model, clips, val_eps, eval_frames), done)
            if trainer.due(done, cfg.save_every):
                trainer.save(done)
    model.save_pretrained(trainer.run.path / "model")
    return trainer.run
