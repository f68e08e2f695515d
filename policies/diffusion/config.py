"""``DiffusionConfig``: the sizes, schedules, augmentation and RL settings of the diffusion planner
(and, extended by ``FlowConfig``, of the flow planner), saved to a policy's ``config.json``."""

from __future__ import annotations

from dataclasses import dataclass, field

from embodied.core.config import check_choice, check_ints, check_scalars
from embodied.core.nn import UNKNOWN_WORD
from embodied.core.vision import (
    check_image_shift,
    check_pretrained_trainable,
    check_vision_encoder,
)
from embodied.policies.aux_state import check_aux_state
from embodied.policies.base import (
    check_chunk,
    check_env_state_encoder,
    check_image_keys,
)


@dataclass
class DiffusionConfig:
    """Sizes, schedules and RL settings of ``DiffusionPolicy`` (saved to ``config.json``)."""

    state_dim: int
    action_dim: int
    state_names: list[str] = field(default_factory=list)  # the state values' names, when known
    image_keys: list[str] = field(default_factory=list)  # cameras; [] = state only
    image_size: int = 96
    env_state_dim: int = 0  # > 0: also condition on the privileged ``environment_state``
    env_state_names: list[str] = field(default_factory=list)  # "object.quantity" per value
    env_state_encoder: str = "flat"  # "flat" values, or "objects": attention over object tokens
    object_queries: int = 4  # "objects": instruction-dependent queries (output K * embed_dim)
    object_heads: int = 4
    object_relative: bool = False  # "objects": add each object's offset from the hand (xyz)
    n_obs_steps: int = 2
    horizon: int = 16
    n_action_steps: int = 8
    vocab: list[str] = field(default_factory=lambda: [UNKNOWN_WORD])  # index 0 = unknown word
    embed_dim: int = 64  # timestep, per-camera image feature and instruction embedding size
    down_dims: list[int] = field(default_factory=lambda: [64, 128, 256])
    kernel_size: int = 5
    n_groups: int = 8
    vision_channels: list[int] = field(default_factory=lambda: [32, 64, 128])
    num_keypoints: int = 32
    # "resnet" (vision_channels, trained from scratch), "efficientnet_lite0" (ImageNet, frozen,
    # cut after pretrained_blocks) or "hf:<local dir>" (a transformers vision model, frozen)
    vision_encoder: str = "resnet"
    pretrained_blocks: int = 4  # efficientnet_lite0: MBConv blocks kept (4: stride 8)
    # efficientnet_lite0: its top layers that fine-tune (0: frozen; pretrained_blocks + 1: all)
    pretrained_trainable: int = 0
    vision_film: bool = False  # FiLM the cameras' feature maps with the instruction embedding
    image_shift: int = 0  # BC augmentation: images padded by this many pixels, cropped at random
    # Training-only auxiliary target: the environment state predicted from the cameras'
    # keypoints (the dataset's ``environment_state``; never an input at inference)
    aux_state_dim: int = 0
    aux_state_names: list[str] = field(default_factory=list)
    aux_state_weight: float = 0.0  # weight of the MSE of the normalised predicted state
    aux_state_encoder: str = "none"  # "flat" / "objects": condition on the PREDICTED state
    # the quantities (name after the dot, e.g. [x, y, z]) the target holds; [] = all
    aux_state_quantities: list[str] = field(default_factory=list)
    cond_mlp_dims: list[int] = field(default_factory=list)  # MLP on the conditioning; [] = none
    state_noise: float = 0.0  # BC augmentation: N(0, s^2) added to the normalised (env) state
    # BC augmentation (state only): the scene turned by up to augment_yaw degrees about the
    # vertical axis and shifted up to augment_shift metres (``PlanarAugment``)
    augment_yaw: float = 0.0
    augment_shift: float = 0.0
    num_train_timesteps: int = 100
    num_inference_steps: int = 10
    beta_schedule: str = "squaredcos_cap_v2"
    prediction_type: str = "epsilon"
    ddim_eta: float = 1.0  # eta of the stochastic (RL) steps
    min_std: float = 0.1  # DPPO exploration floor on each stochastic step's std
    finetune_steps: int | None = None  # last K denoising steps that are stochastic; None = all
    # std of the chain's start x_T when sampling (RL): 1 is DPPO's N(0, I); 0 starts at the zeros
    # the deterministic chain starts from, so RL explores around (and trains) the greedy chain
    init_noise: float = 1.0
    # True: the stochastic steps add noise only to the n_action_steps the env executes; the rest of
    # the chunk takes the noiseless update, so a decision's log-prob scores only executed actions
    # (DPPO's executed-steps likelihood, here exact: the other entries are deterministic)
    explore_executed: bool = False
    ema_decay: float = 0.995

    def __post_init__(self) -> None:
        """Refuse settings that cannot build a policy, naming the field."""
        check_scalars(self)
        self.image_keys = list(self.image_keys)
        self.vocab = list(self.vocab)
        self.down_dims = list(self.down_dims)
        self.vision_channels = list(self.vision_channels)
        self.cond_mlp_dims = list(self.cond_mlp_dims)
        if self.finetune_steps is None:
            self.finetune_steps = self.num_inference_steps
        check_ints(
            self,
            {
                "state_dim": 1,
                "action_dim": 1,
                "env_state_dim": 0,
                "image_size": 8,
                "n_obs_steps": 1,
                "n_action_steps": 1,
                "embed_dim": 4,
                "num_keypoints": 1,
                "num_train_timesteps": 1,
                "num_inference_steps": 1,
                "finetune_steps": 1,
                "object_queries": 1,
                "object_heads": 1,
                "pretrained_blocks": 1,
                "pretrained_trainable": 0,
                "aux_state_dim": 0,
                "image_shift": 0,
            },
        )
        check_chunk(self)
        check_image_keys(self)
        check_env_state_encoder(self)
        self._check_network()
        self._check_sampler()
        self._check_augmentation()
        self._check_vision()

    def _check_network(self) -> None:
        """The encoders' and the U-Net's sizes must fit together."""
        name = type(self).__name__
        if self.embed_dim % 2:
            raise ValueError(f"{name}.embed_dim must be even, got {self.embed_dim}")
        if self.env_state_encoder == "objects" and self.embed_dim % self.object_heads:
            raise ValueError(
                f"{name}.object_heads ({self.object_heads}) must divide embed_dim "
                f"({self.embed_dim})"
            )
        if not self.down_dims or any(d % self.n_groups for d in self.down_dims):
            raise ValueError(
                f"{name}.down_dims must be non-empty multiples of n_groups={self.n_groups}, got "
                f"{self.down_dims}"
            )
        if self.horizon % 2 ** (len(self.down_dims) - 1):
            raise ValueError(
                f"{name}.horizon={self.horizon} must be divisible by "
                f"2 ** (len(down_dims) - 1) = {2 ** (len(self.down_dims) - 1)}"
            )

    def _check_sampler(self) -> None:
        """Steps, prediction type and the RL noise must describe a chain."""
        name = type(self).__name__
        if self.num_inference_steps > self.num_train_timesteps:
            raise ValueError(
                f"{name}.num_inference_steps={self.num_inference_steps} exceeds "
                f"num_train_timesteps={self.num_train_timesteps}"
            )
        if self.finetune_steps > self.num_inference_steps:
            raise ValueError(
                f"{name}.finetune_steps={self.finetune_steps} exceeds "
                f"num_inference_steps={self.num_inference_steps}"
            )
        check_choice(self, "prediction_type", ("epsilon", "sample"))
        if not 0.0 < self.ema_decay < 1.0 or self.min_std <= 0 or self.ddim_eta < 0:
            raise ValueError(
                f"{name} needs 0 < ema_decay < 1, min_std > 0, ddim_eta >= 0; got "
                f"{self.ema_decay}, {self.min_std}, {self.ddim_eta}"
            )
        if not self.init_noise >= 0:
            raise ValueError(f"{name}.init_noise={self.init_noise} must be >= 0")

    def _check_vision(self) -> None:
        """Camera-encoder and auxiliary-state settings that can work together."""
        name = type(self).__name__
        check_vision_encoder(self.vision_encoder)
        check_image_shift(name, self.image_shift, self.image_size)
        check_pretrained_trainable(
            name, self.vision_encoder, self.pretrained_trainable, self.pretrained_blocks
        )
        check_aux_state(self)
        if self.aux_state_encoder == "objects" and self.embed_dim % self.object_heads:
            raise ValueError(
                f"{name}.object_heads ({self.object_heads}) must divide embed_dim "
                f"({self.embed_dim})"
            )

    def _check_augmentation(self) -> None:
        """BC augmentation is non-negative; the planar turn needs named, state-only inputs."""
        name = type(self).__name__
        for field_name in ("state_noise", "augment_yaw", "augment_shift"):
            if getattr(self, field_name) < 0:
                raise ValueError(
                    f"{name}.{field_name} must be >= 0, got {getattr(self, field_name)}"
                )
        if (self.augment_yaw or self.augment_shift) and (
            self.image_keys
            or self.state_dim < 2
            or self.action_dim < 2
            or len(self.env_state_names) != self.env_state_dim
        ):
            raise ValueError(
                f"{name}.augment_yaw / augment_shift turn and shift states whose values start "
                "with the hand's x, y, environment states with named values (object.x, "
                "object.y) and actions starting with dx, dy; they cannot turn images "
                f"(image_keys={self.image_keys}, state_dim={self.state_dim}, action_dim="
                f"{self.action_dim}, env_state_dim={self.env_state_dim} with "
                f"{len(self.env_state_names)} names)"
            )
