"""A vision-language-action policy (OpenVLA-style): a Hugging Face image-text-to-text backbone
(``backbone.py``: a tiny Llava or a local model) that emits discretised actions as tokens.

Input sequence of one decision (embeddings, no attention mask: every position is attended)::

    [<bos>] [image tokens] [proprio tokens] [object tokens] [<pad>... instruction] | actions

- image tokens: the projected vision features of the newest frame of every camera in
  ``image_keys`` (uint8 ``[B, n_obs, H, W, 3]`` or ``[B, H, W, 3]``), scaled to [0, 1], resized to
  the vision tower's size when it differs, normalised with the image mean/std; or, with a
  keypoint ``vision_encoder``, one token per spatial-softmax keypoint (``KeypointTokens``),
  whose feature map ``vision_film`` FiLMs by the mean input embedding of the instruction.
- proprio tokens (``use_proprio``, on when the dataset has states): the newest
  ``observation.state`` and ``observation.environment_state``, normalised with dataset mean/std
  (``Normalizer``), mapped by a 2-layer MLP to ``n_proprio_tokens`` embeddings.
- object tokens (``env_state_encoder="objects"``, instead of the environment state in the MLP):
  one token per object of the environment state (values named ``object.quantity``): the mean
  input embedding of the object's name words plus a linear map of its normalised values
  (``ObjectTokens``). The decoder can then match "red" in the instruction with ``block_red``.
  With ``object_relative`` a token also carries its object's offset from the hand.
- the predicted state (``aux_state_*``, ``policies/aux_state.py``): a head maps the keypoints to
  the environment state, BC's training-only target; ``aux_state_encoder`` "objects" makes the
  object tokens from this prediction ("flat": into the proprio MLP), so a camera policy gets
  object tokens without ever reading the observed state.
- the instruction: ``max_instruction_tokens`` ids, left-padded with ``<pad>`` (a fixed-length
  slot, so a decision does not depend on what else is in its batch); longer instructions keep
  their first ``max_instruction_tokens`` tokens.

Action tokenizer (``tokenizer.py``, OpenVLA): each action dimension is cut into ``n_bins`` uniform
bins; bin ``i`` of any dimension is token ``action_token_start + i``.

A decision is ``n_action_steps`` (the chunk) actions of ``A`` dimensions: ``K = chunk * A`` tokens,
decoded autoregressively step-major (all dimensions of step 0, then step 1, ...).

Decoding (``act``): constrained to the action tokens: the logits of the other tokens are masked
out, which is computing only the action rows of the output embedding::

    logits_k = h_k @ W_out[action_token_start:]^T / temperature,   p_k = softmax(logits_k)

``deterministic=True`` takes ``argmax p_k`` (greedy); otherwise ``token ~ p_k`` drawn with the given
``torch.Generator`` (reproducible). The decoder runs once over the prefix and then one token at a
time with its KV cache (``past_key_values``). Recorded log-probabilities are ``log p_k(token)`` of
this temperature-scaled constrained distribution (the sampling distribution; in deterministic
mode the same distribution's log-probability of the greedy token), and ``log_prob`` recomputes
exactly these (same temperature) in one teacher-forced pass with gradients, for GRPO / PPO ratios.

``bc_loss``: cross-entropy of the expert's action tokens (steps ``n_obs_steps - 1 ..`` of the BC
window, the first at the newest observation, ``n_action_steps`` of them) under the constrained
distribution at temperature 1, teacher-forced, with padded steps (``action_is_pad``) masked out.

Executed actions: bin centres (raw units), clipped to the env box [-1, 1].
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embodied.core.features import ENV_STATE_KEY, STATE_KEY, ObservationSpec
from embodied.core.nn import Normalizer, ObjectTokens, build_vocab, mean_embedding, tokenize_words
from embodied.core.policy import ActionOutput, register_policy
from embodied.core.sampling import Generators, multinomial
from embodied.core.vision import random_shift
from embodied.policies.aux_state import (
    AuxStateTarget,
    aux_state_head,
    aux_state_values,
    fit_aux_normalizer,
    wants_aux_state,
)
from embodied.policies.base import (
    ACTION_HIGH,
    ACTION_LOW,
    ChunkedPolicy,
    check_instructions,
    config_observation_spec,
    dataset_cameras,
    dataset_state_values,
    env_state_values,
    fit_normalizers,
    newest_step,
    require_features,
)
from embodied.policies.vla.backbone import (
    KeypointTokens,
    build_backbone,
    image_features,
    padded_ids,
)
from embodied.policies.vla.config import VLAConfig
from embodied.policies.vla.tokenizer import ActionTokenizer


@register_policy("vla")
class VLAPolicy(AuxStateTarget, ActionTokenizer, ChunkedPolicy):
    """Image-text-to-text backbone + OpenVLA action tokens, with proprio tokens and chunking."""

    config_class = VLAConfig
    config: VLAConfig

    def __init__(self, config: VLAConfig) -> None:
        super().__init__(config)
        built = build_backbone(config)
        self.backbone, self.tokenizer = built.model, built.tokenizer
        self.vision_size, vocab_end = built.vision_size, built.vocab_end
        if vocab_end <= config.n_bins:
            raise ValueError(f"the vocabulary ({vocab_end}) is smaller than n_bins={config.n_bins}")
        self.action_token_start = vocab_end - config.n_bins
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id or 0)
        bos = self.tokenizer.bos_token_id
        self.bos_ids = [] if bos is None else [int(bos)]
        hidden = self.backbone.get_input_embeddings().weight.shape[1]
        mean, std = torch.tensor(built.image_mean), torch.tensor(built.image_std)
        self.register_buffer("image_mean", mean.view(1, 3, 1, 1), persistent=False)
        self.register_buffer("image_std", std.view(1, 3, 1, 1), persistent=False)
        self.keypoint_tokens = KeypointTokens(config, hidden) if config.keypoint_vision else None
        # The environment state predicted from the keypoints (a training target; never observed).
        self.aux_state_normalizer = (
            Normalizer(config.aux_state_dim, "mean_std") if config.aux_state_dim else None
        )
        self.state_head = aux_state_head(config)
        self.state_normalizer = (
            Normalizer(config.state_dim, "mean_std")
            if config.use_proprio and config.state_dim > 0
            else None
        )
        objects = config.env_state_encoder == "objects"
        self.env_state_normalizer = (
            Normalizer(config.env_state_dim, "mean_std")
            if (config.use_proprio or objects) and config.env_state_dim > 0
            else None
        )
        self.proprio = (
            nn.Sequential(
                nn.Linear(config.proprio_dim, hidden),
                nn.GELU(),
                nn.Linear(hidden, config.n_proprio_tokens * hidden),
            )
            if config.proprio_dim > 0
            else None
        )
        self.object_tokens = (
            ObjectTokens(config.object_state_names, hidden, config.object_relative)
            if config.object_state_names
            else None
        )
        if self.object_tokens is not None:  # object names, embedded with the backbone's words
            texts = [name.replace("_", " ") for name in self.object_tokens.object_names]
            name_ids = padded_ids(self.tokenizer, texts, self.pad_id)
            self.register_buffer("name_ids", name_ids, persistent=False)
            self.register_buffer("name_mask", name_ids != self.pad_id, persistent=False)
        # Bin bounds of the action tokenizer (raw units), set by fit_normalizers.
        self.register_buffer("action_low", torch.full((config.action_dim,), ACTION_LOW))
        self.register_buffer("action_high", torch.full((config.action_dim,), ACTION_HIGH))

    # --- dataset-shaped construction -----------------------------------------------------------
    @classmethod
    def config_from_dataset(
        cls,
        features: Mapping[str, Mapping[str, Any]],
        tasks: Sequence[str] = (),
        horizon: int | None = None,
        **overrides: Any,
    ) -> VLAConfig:
        """A config shaped by a LeRobot dataset (what ``embodied train bc`` calls): its cameras
        (square, one size), action size, states (proprio tokens when present), the words of its
        instructions, and a chunk filling the BC window unless ``n_action_steps`` is given."""
        require_features(features, ("action",))
        image_keys, image_size = dataset_cameras(features)
        if not image_keys:
            raise ValueError(f"the VLA needs a camera; dataset features: {sorted(features)}")
        tasks = list(tasks)
        env_values, texts = env_state_values(features, tasks)
        if overrides.get("env_state_dim") == 0 and not wants_aux_state(overrides):
            env_values = {}  # a pixel VLA: the state's names do not apply
        env_values = aux_state_values(env_values, overrides)  # a target, or an input
        values: dict[str, Any] = {
            "action_dim": int(features["action"]["shape"][-1]),
            "image_keys": image_keys,
            "image_size": image_size,
            "vocab": build_vocab(texts)[1:],
            **env_values,
        }
        if tasks:
            values["max_instruction_tokens"] = max(1, *(len(tokenize_words(t)) for t in tasks))
        values.update(dataset_state_values(features))
        if horizon is not None:
            values["horizon"] = int(horizon)
            n_obs = int(overrides.get("n_obs_steps", 1))
            values["n_action_steps"] = max(1, int(horizon) - n_obs + 1)
        return VLAConfig(**{**values, **overrides})

    def fit_normalizers(self, stats: Mapping[str, Mapping[str, Any]]) -> VLAPolicy:
        """State normalisers (mean/std) and the action bins' bounds (min/max or q01/q99)."""
        normalizers = {STATE_KEY: self.state_normalizer, ENV_STATE_KEY: self.env_state_normalizer}
        fit_normalizers(stats, normalizers, needed=["action"])
        if self.aux_state_normalizer is not None:
            fit_aux_normalizer(self.aux_state_normalizer, stats)
        self.fit_action_range(stats["action"])
        return self

    @property
    def observation_spec(self) -> ObservationSpec:
        """The cameras and (with proprio tokens) the state features."""
        return config_observation_spec(
            self.config,
            reads_state=self.state_normalizer is not None,
            reads_env_state=self.env_state_normalizer is not None,
        )

    # --- observations -> prefix embeddings --------------------------------------------------------
    def _instruction_ids(self, instructions: Sequence[str], batch: int) -> torch.Tensor:
        """``[B, max_instruction_tokens]`` ids, left-padded, truncated to the slot."""
        check_instructions(instructions, batch)
        length = self.config.max_instruction_tokens
        ids = padded_ids(self.tokenizer, instructions, self.pad_id, length, left=True)
        return ids.to(self.device)

    def prefix_embeddings(
        self, obs: Mapping[str, Any], instructions: Sequence[str]
    ) -> torch.Tensor:
        """``[B, P, hidden]``: bos, image tokens, proprio tokens, object tokens, instruction."""
        return self._prefix(obs, instructions)[0]

    def _prefix(
        self, obs: Mapping[str, Any], instructions: Sequence[str]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The prefix and the environment state predicted from the keypoints (normalised
        ``[B, aux_state_dim]``; None without a state head)."""
        config = self.config
        size = (config.image_size, config.image_size, 3)
        images = [newest_step(obs, k, size, torch.uint8, self.device) for k in config.image_keys]
        batch = images[0].shape[0]
        for key, image in zip(config.image_keys, images, strict=True):
            if image.shape[0] != batch:
                raise ValueError(
                    f"observation {key!r} has batch {image.shape[0]}, "
                    f"{config.image_keys[0]!r} has {batch}"
                )
        ids = self._instruction_ids(instructions, batch)
        embed = self.backbone.get_input_embeddings()
        predicted = None
        if self.keypoint_tokens is not None:
            film = mean_embedding(embed, ids, ids != self.pad_id) if config.vision_film else None
            features, points = self.keypoint_tokens(images, film)
            predicted = self.state_head(points) if self.state_head is not None else None
        else:
            features = image_features(
                self.backbone, torch.cat(images), self.vision_size, self.image_mean, self.image_std
            ).reshape(batch, -1, embed.weight.shape[1])
        parts = []
        if self.bos_ids:
            bos = torch.tensor(self.bos_ids, device=self.device).expand(batch, -1)
            parts.append(embed(bos))
        parts.append(features.to(embed.weight.dtype))
        states, raw = {}, {}
        for key, dim, normalizer in (
            (STATE_KEY, config.state_dim, self.state_normalizer),
            (ENV_STATE_KEY, config.env_state_dim, self.env_state_normalizer),
        ):
            if normalizer is None:
                continue
            state = newest_step(obs, key, (dim,), torch.float32, self.device)
            if state.shape[0] != batch:
                raise ValueError(
                    f"observation {key!r} has shape {tuple(obs[key].shape)}, batch {batch} "
                    f"expected (from {config.image_keys[0]!r})"
                )
            states[key], raw[key] = normalizer.normalize(state), state
        objects = None  # the values the object tokens read: (normalised, raw)
        if config.env_state_encoder == "objects":
            objects = states.pop(ENV_STATE_KEY), raw[ENV_STATE_KEY]
        elif config.aux_state_encoder == "objects":
            objects = predicted, self.aux_state_normalizer.unnormalize(predicted)
        elif config.aux_state_encoder == "flat":
            states["predicted"] = predicted
        if self.proprio is not None:
            tokens = self.proprio(torch.cat(list(states.values()), dim=-1))
            parts.append(tokens.reshape(batch, config.n_proprio_tokens, -1).to(embed.weight.dtype))
        if self.object_tokens is not None:
            names = mean_embedding(embed, self.name_ids, self.name_mask)  # [O, hidden]
            hand = None
            if config.object_relative:  # observation.state starts with the grip site's xyz
                trailing = (config.state_dim,)
                hand = newest_step(obs, STATE_KEY, trailing, torch.float32, self.device)[:, :3]
            values, raw_values = objects
            tokens = self.object_tokens(values, names, raw_values, hand)
            parts.append(tokens.to(embed.weight.dtype))
        parts.append(embed(ids))
        return torch.cat(parts, dim=1), predicted

    # --- the constrained distribution ----------------------------------------------------------
    def action_logits(self, hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """Logits over the ``n_bins`` action tokens only ``[..., n_bins]`` (every other token of
        the vocabulary masked out), divided by ``temperature``."""
        head = self.backbone.get_output_embeddings()
        rows = slice(self.action_token_start, self.action_token_start + self.config.n_bins)
        bias = None if head.bias is None else head.bias[rows]
        return F.linear(hidden, head.weight[rows], bias) / temperature

    @functools.cached_property
    def _cache_argument(self) -> str:
        """The decoder's name for its KV cache argument and output. Transformers 5 renamed
        ``past_key_values`` to ``cache`` (the old name warns, and goes in 5.40); 4.x takes only
        the old one. Read once from the decoder's ``forward``: decoding asks for every token."""
        params = inspect.signature(self.backbone.get_decoder().forward).parameters
        return "cache" if "cache" in params else "past_key_values"

    def _decoder(
        self, embeds: torch.Tensor, cache: Any = None, use_cache: bool = False
    ) -> tuple[torch.Tensor, Any]:
        """The decoder's last hidden states ``[B, T, H]`` and its KV cache."""
        name = self._cache_argument
        out = self.backbone.get_decoder()(
            inputs_embeds=embeds, use_cache=use_cache, **{name: cache}
        )
        return out.last_hidden_state, getattr(out, name, None)

    def _token_embeddings(self, ids: torch.Tensor) -> torch.Tensor:
        return self.backbone.get_input_embeddings()(ids)

    def teacher_forced_logits(
        self, prefix: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0
    ) -> torch.Tensor:
        """Constrained logits ``[B, K, n_bins]`` of each of the ``K`` action tokens ``ids`` given
        the prefix and the tokens before it: one forward pass, no cache."""
        k = ids.shape[1]
        embeds = torch.cat([prefix, self._token_embeddings(ids[:, :-1])], dim=1)
        hidden = self._decoder(embeds)[0][:, -k:]
        return self.action_logits(hidden, temperature)

    def _check_ids(self, ids: Any, batch: int) -> torch.Tensor:
        ids = torch.as_tensor(ids, device=self.device)
        expected = (batch, self.config.num_action_tokens)
        if tuple(ids.shape) != expected or ids.dtype.is_floating_point:
            raise ValueError(
                f"policy_outputs 'action_tokens' has shape {tuple(ids.shape)} ({ids.dtype}), "
                f"expected integer ids of shape {expected}"
            )
        ids = ids.long()
        low, high = self.action_token_start, self.action_token_start + self.config.n_bins
        if ids.min() < low or ids.max() >= high:
            raise ValueError(f"policy_outputs 'action_tokens' must lie in [{low}, {high})")
        return ids

    # --- the Policy interface --------------------------------------------------------------------
    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        deterministic: bool = False,
        generator: Generators = None,
        use_cache: bool = True,
    ) -> ActionOutput:
        """Decode one chunk per observation: ``actions [B, chunk, A]`` (raw, clipped to [-1, 1]),
        ``log_prob [B]``, ``policy_outputs`` ``action_tokens`` / ``log_probs`` ``[B, chunk * A]``.
        ``use_cache=False`` re-runs the whole sequence for every token (a reference for tests)."""
        self.check_inputs(obs)
        prefix = self.prefix_embeddings(obs, instructions)
        temperature = self.config.temperature
        states, cache = self._decoder(prefix, use_cache=use_cache)
        hidden = states[:, -1]
        sequence = prefix
        tokens, log_probs = [], []
        for k in range(self.config.num_action_tokens):
            log_p = torch.log_softmax(self.action_logits(hidden, temperature).float(), dim=-1)
            sample = not deterministic
            choice = multinomial(log_p.exp(), generator) if sample else log_p.argmax(dim=-1)
            tokens.append(choice + self.action_token_start)
            log_probs.append(log_p.gather(-1, choice[:, None]).squeeze(-1))
            if k + 1 == self.config.num_action_tokens:
                break
            step = self._token_embeddings(tokens[-1][:, None])
            if use_cache:
                states, cache = self._decoder(step, cache=cache, use_cache=True)
            else:
                sequence = torch.cat([sequence, step], dim=1)
                states, _ = self._decoder(sequence)
            hidden = states[:, -1]
        ids = torch.stack(tokens, dim=1)
        token_log_probs = torch.stack(log_probs, dim=1)
        actions = self.decode(ids).clamp(ACTION_LOW, ACTION_HIGH)
        return ActionOutput(
            actions=actions,
            log_prob=token_log_probs.sum(dim=1),
            policy_outputs={"action_tokens": ids, "log_probs": token_log_probs},
        )

    def log_prob(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        policy_outputs: Mapping[str, Any],
    ) -> torch.Tensor:
        """Per-token log-probabilities ``[B, chunk * A]`` of recorded action tokens under the
        temperature-scaled constrained distribution, with gradients (teacher forcing)."""
        self.check_inputs(obs)
        if "action_tokens" not in policy_outputs:
            raise ValueError(
                f"policy_outputs has no 'action_tokens'; keys: {sorted(policy_outputs)}"
            )
        prefix = self.prefix_embeddings(obs, instructions)
        ids = self._check_ids(policy_outputs["action_tokens"], prefix.shape[0])
        logits = self.teacher_forced_logits(prefix, ids, self.config.temperature)
        log_p = torch.log_softmax(logits.float(), dim=-1)
        return log_p.gather(-1, (ids - self.action_token_start)[..., None]).squeeze(-1)

    def bc_loss(self, batch: Mapping[str, Any], auxiliary: bool = True) -> torch.Tensor:
        """Cross-entropy of the expert chunk's action tokens (temperature 1), pads masked out,
        plus the auxiliary state target's weighted MSE (``aux_state_weight > 0`` and
        ``auxiliary``)."""
        config = self.config
        if "instruction" not in batch or "action" not in batch:
            raise ValueError(f"batch needs 'action' and 'instruction'; keys: {sorted(batch)}")
        if config.image_shift:  # DrQ: every window's frames shifted by one random offset
            shifted = {
                k: random_shift(torch.as_tensor(batch[k]), config.image_shift)
                for k in config.image_keys
                if k in batch
            }
            batch = {**batch, **shifted}
        prefix, predicted = self._prefix(batch, batch["instruction"])
        actions = torch.as_tensor(batch["action"], device=self.device, dtype=torch.float32)
        start, chunk = config.n_obs_steps - 1, config.n_action_steps
        if (
            actions.ndim != 3
            or actions.shape[0] != prefix.shape[0]
            or actions.shape[1] < start + chunk
            or actions.shape[2] != config.action_dim
        ):
            raise ValueError(
                f"batch 'action' has shape {tuple(actions.shape)}, expected "
                f"({prefix.shape[0]}, horizon >= {start + chunk}, {config.action_dim})"
            )
        if not torch.isfinite(actions).all():
            raise ValueError("batch 'action' holds NaN or infinite values")
        ids = self.encode(actions[:, start : start + chunk])
        logits = self.teacher_forced_logits(prefix, ids)
        nll = F.cross_entropy(
            logits.float().reshape(-1, config.n_bins),
            (ids - self.action_token_start).reshape(-1),
            reduction="none",
        ).reshape(ids.shape)
        if "action_is_pad" in batch:
            pad = torch.as_tensor(batch["action_is_pad"], device=self.device, dtype=torch.bool)
            keep = (~pad[:, start : start + chunk]).repeat_interleave(config.action_dim, dim=1)
        else:
            keep = torch.ones_like(ids, dtype=torch.bool)
        keep = keep.to(nll.dtype)
        loss = (nll * keep).sum() / keep.sum().clamp(min=1.0)
        self.bc_terms = {"action_nll": loss.detach()}  # this call's terms only
        if config.aux_state_weight > 0 and auxiliary:
            trailing = (config.aux_state_dim,)
            target = newest_step(batch, ENV_STATE_KEY, trailing, torch.float32, self.device)
            aux = self.state_head.loss(
                predicted, target, self.aux_state_normalizer, config.aux_state_weight
            )
            self.bc_terms["aux_state"] = aux.detach()
            loss = loss + aux
        return loss
