"""``VLAConfig``: the sizes, action tokenizer, decoding settings and tiny backbone of the VLA policy
(saved to a policy's ``config.json``), and the special tokens of the tiny word tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field

from embodied.core.config import check_choice, check_ints, check_scalars
from embodied.core.nn import UNKNOWN_WORD, object_groups, tokenize_words
from embodied.core.vision import (
    VISION_ENCODERS,
    check_image_shift,
    check_pretrained_trainable,
    check_vision_encoder,
)
from embodied.policies.aux_state import check_aux_state, wants_aux_state
from embodied.policies.base import (
    check_chunk,
    check_env_state_encoder,
    check_image_keys,
)

PAD_TOKEN, BOS_TOKEN, UNK_TOKEN, IMAGE_TOKEN = "<pad>", "<bos>", UNKNOWN_WORD, "<image>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, UNK_TOKEN, IMAGE_TOKEN]  # ids 0..3 of the tiny vocab


@dataclass
class VLAConfig:
    """Sizes, action tokenizer and decoding settings of ``VLAPolicy`` (saved to ``config.json``)."""

    action_dim: int
    state_dim: int = 0  # 0 = no observation.state input
    state_names: list[str] = field(default_factory=list)  # the state values' names, when known
    env_state_dim: int = 0  # > 0: also read the privileged observation.environment_state
    env_state_names: list[str] = field(default_factory=list)  # "object.quantity" per value
    env_state_encoder: str = "flat"  # "flat": into the proprio MLP; "objects": a token per object
    object_relative: bool = False  # "objects": add each object's offset from the hand (xyz)
    image_keys: list[str] = field(default_factory=lambda: ["observation.image"])
    image_size: int = 64  # expected (square) camera size; the tiny vision tower's input size
    n_obs_steps: int = 1  # observation steps a window holds (only the newest is read)
    horizon: int = 8  # actions per BC window
    n_action_steps: int = 4  # the chunk: actions decoded and executed per decision
    use_proprio: bool = True  # proprio tokens from the state(s)
    n_proprio_tokens: int = 1
    vocab: list[str] = field(default_factory=list)  # instruction words of the tiny tokenizer
    max_instruction_tokens: int = 16
    n_bins: int = 256
    action_range: str = "min_max"  # bin bounds from the dataset's "min_max" or "quantile" (q01/q99)
    temperature: float = 1.0
    backbone_path: str = ""  # a local image-text-to-text model directory; "" = tiny Llava
    # The cameras' tokens: "siglip" = the backbone's vision tower (its patch features,
    # projected); "resnet" / "efficientnet_lite0" / "hf:<dir>" = a camera encoder of
    # embodied.core.vision whose spatial-softmax keypoints are the tokens, one per keypoint
    vision_encoder: str = "siglip"
    vision_channels: list[int] = field(default_factory=lambda: [32, 64])  # resnet stages
    num_keypoints: int = 16  # image tokens per camera of a keypoint encoder
    pretrained_blocks: int = 4  # efficientnet_lite0: MBConv blocks kept (4: stride 8)
    # efficientnet_lite0: its top layers that fine-tune (0: frozen; pretrained_blocks + 1: all)
    pretrained_trainable: int = 0
    vision_film: bool = False  # FiLM a keypoint encoder's map by the instruction's mean embedding
    image_shift: int = 0  # BC augmentation (DrQ): images padded by this many pixels, cropped
    # Training-only target (policies/aux_state.py): the environment state predicted from the
    # keypoints; aux_state_encoder "flat" / "objects" read the PREDICTED state (in the proprio
    # MLP / as object tokens), never the observed one
    aux_state_dim: int = 0
    aux_state_names: list[str] = field(default_factory=list)
    aux_state_weight: float = 0.0  # weight of the MSE of the normalised predicted state
    aux_state_encoder: str = "none"
    # the quantities (name after the dot, e.g. [x, y, z]) the target holds; [] = all
    aux_state_quantities: list[str] = field(default_factory=list)
    # The tiny backbone (ignored with backbone_path):
    patch_size: int = 8
    vision_hidden_size: int = 64
    vision_layers: int = 2
    vision_heads: int = 2
    vision_intermediate_size: int = 128
    hidden_size: int = 128
    text_layers: int = 4
    text_heads: int = 4
    text_intermediate_size: int = 256
    image_mean: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    image_std: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    attn_implementation: str = "sdpa"

    def __post_init__(self) -> None:
        """Refuse settings that cannot build a policy, naming the field."""
        check_scalars(self)
        self.image_keys = list(self.image_keys)
        self.vision_channels = list(self.vision_channels)
        self.vocab = [str(w) for w in self.vocab]
        self.image_mean = [float(v) for v in self.image_mean]
        self.image_std = [float(v) for v in self.image_std]
        check_ints(
            self,
            {
                "action_dim": 1,
                "state_dim": 0,
                "env_state_dim": 0,
                "image_size": 8,
                "n_obs_steps": 1,
                "horizon": 1,
                "n_action_steps": 1,
                "n_proprio_tokens": 1,
                "max_instruction_tokens": 1,
                "n_bins": 2,
                "num_keypoints": 1,
                "pretrained_blocks": 1,
                "pretrained_trainable": 0,
                "image_shift": 0,
                "aux_state_dim": 0,
                "patch_size": 1,
                "vision_hidden_size": 1,
                "vision_layers": 1,
                "vision_heads": 1,
                "vision_intermediate_size": 1,
                "hidden_size": 1,
                "text_layers": 1,
                "text_heads": 1,
                "text_intermediate_size": 1,
            },
        )
        check_chunk(self)
        if not self.image_keys:
            raise ValueError("VLAConfig.image_keys must name at least one camera")
        check_image_keys(self)
        check_env_state_encoder(self)
        self._check_inputs()
        check_choice(self, "action_range", ("min_max", "quantile"))
        if not (isinstance(self.temperature, int | float) and self.temperature > 0):
            raise ValueError(f"VLAConfig.temperature must be > 0, got {self.temperature!r}")
        self.temperature = float(self.temperature)
        self._check_backbone()
        if self.keypoint_vision:
            try:
                check_vision_encoder(self.vision_encoder)
            except ValueError:
                raise ValueError(
                    f"VLAConfig.vision_encoder must be 'siglip' or one of {VISION_ENCODERS}, "
                    f"got {self.vision_encoder!r}"
                ) from None
            if not self.vision_channels or not all(
                isinstance(c, int) and c > 0 for c in self.vision_channels
            ):
                raise ValueError(
                    f"VLAConfig.vision_channels must be positive ints, got {self.vision_channels}"
                )
        check_image_shift("VLAConfig", self.image_shift, self.image_size)
        check_pretrained_trainable(
            "VLAConfig", self.vision_encoder, self.pretrained_trainable, self.pretrained_blocks
        )
        if not isinstance(self.vision_film, bool) or (
            self.vision_film and not self.keypoint_vision
        ):
            raise ValueError(
                f"VLAConfig.vision_film={self.vision_film!r} must be a bool, and True only with a "
                f"keypoint vision_encoder (got {self.vision_encoder!r})"
            )

    def _check_inputs(self) -> None:
        """Proprio and object tokens need the states they read; images a mean/std per channel;
        the predicted state a keypoint encoder to predict it from."""
        check_aux_state(self)
        if wants_aux_state(vars(self)) and not self.keypoint_vision:
            raise ValueError(
                "VLAConfig.aux_state_weight / aux_state_encoder predict the state from a keypoint "
                f"vision_encoder's keypoints, got vision_encoder={self.vision_encoder!r}"
            )
        if self.aux_state_encoder == "flat" and not self.use_proprio:
            raise ValueError(
                "VLAConfig.aux_state_encoder='flat' reads it in the proprio tokens: "
                "it needs use_proprio=True"
            )
        if self.object_relative and (not self.object_state_names or self.state_dim < 3):
            raise ValueError(
                "VLAConfig.object_relative needs object tokens (env_state_encoder or "
                "aux_state_encoder 'objects') and an observation.state starting with the hand's "
                f"xyz (state_dim >= 3), got env_state_encoder={self.env_state_encoder!r}, "
                f"aux_state_encoder={self.aux_state_encoder!r}, state_dim={self.state_dim}"
            )
        if not isinstance(self.use_proprio, bool):
            raise ValueError(f"VLAConfig.use_proprio must be a bool, got {self.use_proprio!r}")
        for name in ("image_mean", "image_std"):
            values = getattr(self, name)
            if len(values) != 3 or (name == "image_std" and min(values) <= 0):
                raise ValueError(f"VLAConfig.{name} must be 3 values (std > 0), got {values}")

    def _check_backbone(self) -> None:
        """The tiny backbone's sizes must build a SigLIP + Llama pair; its vocabulary is words."""
        if not isinstance(self.backbone_path, str):
            raise ValueError(f"VLAConfig.backbone_path must be a str, got {self.backbone_path!r}")
        if not self.backbone_path and not self.keypoint_vision:
            if self.image_size % self.patch_size:
                raise ValueError(
                    f"VLAConfig.image_size={self.image_size} must be divisible by "
                    f"patch_size={self.patch_size}"
                )
            for hidden, heads in (
                ("vision_hidden_size", "vision_heads"),
                ("hidden_size", "text_heads"),
            ):
                if getattr(self, hidden) % getattr(self, heads):
                    raise ValueError(
                        f"VLAConfig.{hidden}={getattr(self, hidden)} must be divisible by "
                        f"{heads}={getattr(self, heads)}"
                    )
            if (self.hidden_size // self.text_heads) % 2:
                raise ValueError(
                    f"VLAConfig: hidden_size / text_heads = {self.hidden_size // self.text_heads}"
                    " must be even (rotary embeddings)"
                )
        bad = [w for w in self.vocab if not w or w in SPECIAL_TOKENS or tokenize_words(w) != [w]]
        if bad or len(set(self.vocab)) != len(self.vocab):
            raise ValueError(
                f"VLAConfig.vocab must be distinct lower-case alphanumeric words, got bad entries "
                f"{bad or 'duplicates'}"
            )
        check_choice(self, "attn_implementation", ("sdpa", "eager"))

    @property
    def proprio_dim(self) -> int:
        """Width of the proprio MLP's input (0 = no proprio tokens)."""
        if not self.use_proprio:
            return 0
        env = self.env_state_dim if self.env_state_encoder == "flat" else 0
        predicted = self.aux_state_dim if self.aux_state_encoder == "flat" else 0
        return self.state_dim + env + predicted

    @property
    def keypoint_vision(self) -> bool:
        """Whether a keypoint camera encoder, not the backbone's tower, makes the image tokens."""
        return self.vision_encoder != "siglip"

    @property
    def image_tokens(self) -> int:
        """Image tokens per camera: a keypoint encoder's keypoints, or the tiny tower's patches
        (a local backbone's tower decides its own)."""
        if self.keypoint_vision:
            return self.num_keypoints
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_object_tokens(self) -> int:
        """Prompt tokens of the (observed or predicted) environment state's objects."""
        return len(object_groups(self.object_state_names))

    @property
    def object_state_names(self) -> list[str]:
        """The ``object.quantity`` names the object tokens read: the observed environment
        state's (``env_state_encoder="objects"``), the predicted one's, or none."""
        if self.env_state_encoder == "objects":
            return self.env_state_names
        return self.aux_state_names if self.aux_state_encoder == "objects" else []

    @property
    def num_action_tokens(self) -> int:
        """Tokens per decision: ``n_action_steps * action_dim``."""
        return self.n_action_steps * self.action_dim
