"""What the planners condition on: one vector per decision ("global conditioning", as in Diffusion
Policy) from the observation window and the instruction::

    cond = concat(image features of every camera and observation step,   # [n_obs * n_cam * E]
                  normalised state of every observation step,           # [n_obs * D]
                  environment state, when configured,                  # [n_obs * D_env]
                  instruction embedding)                                # [E]
    # env_state_encoder="flat": the normalised values; "objects": ObjectStateEncoder's
    # instruction-queried attention over per-object tokens (needs the values' names), [K * E]
    cond = cond_mlp(cond)     # optional (``cond_mlp_dims``); identity by default

A camera encoder may be FiLM-conditioned on the instruction (``vision_film``: the named object's
keypoints), and a state head may predict the environment state from every camera's keypoints:
that prediction is the auxiliary training target (``aux_state_weight``) and, with
``aux_state_encoder``, stands in for the environment state above. It is computed from the images
alone, so a pixel policy reads no privileged state at inference.

``ObservationEncoder`` holds the encoders (their weights are averaged by the EMA with the U-Net);
the normalisers stay with the policy and are passed in. Everything that turns observations into
``cond`` lives here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from embodied.core.features import ENV_STATE_KEY, STATE_KEY
from embodied.core.nn import InstructionEncoder, Mish, Normalizer, ObjectStateEncoder
from embodied.core.vision import build_image_encoder, random_shift
from embodied.policies.aux_state import aux_state_head
from embodied.policies.base import check_instructions
from embodied.policies.diffusion.config import DiffusionConfig


def observation_window(
    obs: Mapping[str, Any],
    key: str,
    trailing: tuple[int, ...],
    n_obs_steps: int,
    device: torch.device,
) -> torch.Tensor:
    """One observation feature ``[B, n_obs_steps, *trailing]`` on ``device``, shape-checked."""
    if key not in obs:
        raise ValueError(f"observation has no {key!r}; keys: {sorted(obs)}")
    x = torch.as_tensor(obs[key], device=device)
    expected = (n_obs_steps, *trailing)
    if x.ndim != len(expected) + 1 or tuple(x.shape[1:]) != expected:
        raise ValueError(
            f"observation {key!r} has shape {tuple(x.shape)}, the policy expects "
            f"(B, {', '.join(map(str, expected))})"
        )
    return x


class ObservationEncoder(nn.Module):
    """The image, instruction and object-state encoders and the conditioning MLP; ``condition``
    maps an observation window and instructions to ``cond [B, global_cond_dim]``."""

    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__()
        self.image_keys, self.image_size = list(config.image_keys), config.image_size
        self.n_obs_steps = config.n_obs_steps
        self.state_dim, self.env_state_dim = config.state_dim, config.env_state_dim
        self.aux_state_encoder = config.aux_state_encoder
        self.image_encoders = nn.ModuleList(
            build_image_encoder(
                config.vision_encoder,
                config.vision_channels,
                config.num_keypoints,
                config.embed_dim,
                config.embed_dim if config.vision_film else 0,
                config.pretrained_blocks,
                config.pretrained_trainable,
                cache_trunk=not config.image_shift,  # a shifted frame never repeats
            )
            for _ in config.image_keys
        )
        self.instruction_encoder = InstructionEncoder(config.vocab, config.embed_dim)
        per_step = len(config.image_keys) * config.embed_dim + config.state_dim
        # The environment state predicted from every camera's keypoints (normalised), per step.
        self.state_head = aux_state_head(config)
        self.object_encoder = None
        objects = config.env_state_encoder == "objects" or config.aux_state_encoder == "objects"
        if objects:
            names = config.aux_state_names if config.aux_state_encoder == "objects" else None
            self.object_encoder = ObjectStateEncoder(
                names or config.env_state_names,
                self.instruction_encoder,
                config.embed_dim,
                config.object_queries,
                config.object_heads,
                config.object_relative,
            )
            per_step += self.object_encoder.output_dim
        else:
            per_step += config.env_state_dim
            per_step += config.aux_state_dim if config.aux_state_encoder == "flat" else 0
        width = config.n_obs_steps * per_step + config.embed_dim
        # Optional MLP mixing the instruction with the observations (an instruction that picks
        # one object of several needs a product of the two, which FiLM's affine map lacks).
        layers: list[nn.Module] = []
        for size in config.cond_mlp_dims:
            layers += [nn.Linear(width, size), Mish()]
            width = size
        self.cond_mlp = nn.Sequential(*layers)
        self.global_cond_dim = width  # the size of ``condition``'s output

    def condition(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        state_normalizer: Normalizer,
        env_state_normalizer: Normalizer | None,
        aux_state_normalizer: Normalizer | None = None,
        state_noise: float = 0.0,
        image_shift: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[B, G]``: per-step image features, normalised state (and environment state: its
        values, or the object encoder's output), flattened, ++ instruction; and the environment
        state the state head predicts from the images (normalised ``[B, n_obs, D]``, or None).
        ``state_noise > 0`` adds ``N(0, state_noise^2)`` to the normalised states and
        ``image_shift > 0`` shifts the images at random (BC augmentation)."""
        device, n_obs = next(self.parameters()).device, self.n_obs_steps
        state = observation_window(obs, STATE_KEY, (self.state_dim,), n_obs, device).float()
        batch = state.shape[0]
        if not torch.isfinite(state).all():
            raise ValueError(f"observation {STATE_KEY!r} holds NaN or infinite values")
        check_instructions(instructions, batch)
        instruction = self.instruction_encoder(list(instructions))
        film = instruction.repeat_interleave(n_obs, dim=0)
        per_step, keypoints = [], []
        for key, encoder in zip(self.image_keys, self.image_encoders, strict=True):
            size = (self.image_size, self.image_size, 3)
            images = observation_window(obs, key, size, n_obs, device)
            if images.shape[0] != batch or images.dtype != torch.uint8:
                raise ValueError(
                    f"observation {key!r} must be uint8 with batch {batch}, got "
                    f"{images.dtype} {tuple(images.shape)}"
                )
            images = random_shift(images, image_shift)
            features, points = encoder.encode(images.reshape(-1, *size), film)  # [B * n_obs, .]
            per_step.append(features.reshape(batch, n_obs, -1))
            keypoints.append(points)
        predicted = None
        if self.state_head is not None:
            predicted = self.state_head(torch.cat(keypoints, dim=-1)).view(batch, n_obs, -1)
        states = [state_normalizer.normalize(state)]
        env_state = None  # raw values, for relative object tokens
        if env_state_normalizer is not None:
            trailing = (self.env_state_dim,)
            env_state = observation_window(obs, ENV_STATE_KEY, trailing, n_obs, device).float()
            if env_state.shape[0] != batch or not torch.isfinite(env_state).all():
                raise ValueError(
                    f"observation {ENV_STATE_KEY!r} must be finite with batch {batch}, got "
                    f"shape {tuple(env_state.shape)}"
                )
            states.append(env_state_normalizer.normalize(env_state))
        elif self.aux_state_encoder != "none":  # the state predicted from the images
            states.append(predicted)
            env_state = aux_state_normalizer.unnormalize(predicted)
        if state_noise > 0:  # BC augmentation against memorising exact states
            states = [x + state_noise * torch.randn_like(x) for x in states]
        if self.object_encoder is not None:  # per step: [B * n_obs, D_env] -> [B, n_obs, K * E]
            steps_env = states[1].flatten(0, 1)
            queries = instruction.repeat_interleave(n_obs, dim=0)
            hand = state[..., :3].flatten(0, 1).float()  # agent_pos starts with the grip site
            objects = self.object_encoder(
                steps_env, queries, self.instruction_encoder, env_state.flatten(0, 1), hand
            )
            states[1] = objects.view(batch, n_obs, -1)
        per_step += states
        steps = torch.cat(per_step, dim=-1).flatten(1)  # [B, n_obs * (n_cam * E + D)]
        return self.cond_mlp(torch.cat([steps, instruction], dim=-1)), predicted
