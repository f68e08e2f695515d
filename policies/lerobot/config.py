"""A LeRobot policy as the toolkit holds it (``LeRobotPolicyConfig``) and LeRobot's saved layout.

LeRobot saves a policy (``lerobot-train``'s ``pretrained_model/``: ``PreTrainedPolicy``'s
``save_pretrained`` plus its processors) as::

    config.json                        the policy config, with its "type" ("diffusion", ...)
    model.safetensors                  the network's weights
    policy_preprocessor.json           steps: rename, batch, device, normalizer (+ state_file)
    policy_preprocessor_step_*_normalizer_processor.safetensors   stats, "<feature>.<stat>"
    policy_postprocessor.json (+ its unnormalizer's state file)

The toolkit keeps config.json as a dict, the normaliser's stats of the features the policy reads
and writes, and the preprocessor's rename map; its own fine-tuning settings (which LeRobot's
config would refuse as unknown keys) go to ``embodied_finetuning.json`` beside them, a file
LeRobot ignores. Nothing here imports LeRobot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodied.core.config import check_scalars

FINETUNING_NAME = "embodied_finetuning.json"
PREPROCESSOR_NAME = "policy_preprocessor.json"
POSTPROCESSOR_NAME = "policy_postprocessor.json"
SUPPORTED_TYPES = ("diffusion", "smolvla")
HORIZON_FIELDS = {"diffusion": "horizon", "smolvla": "chunk_size"}  # the predicted chunk's length
RL_SETTINGS = ("finetune_steps", "min_std", "ddim_eta", "init_noise", "explore_executed")


def is_lerobot_config(config: dict[str, Any]) -> bool:
    """Whether a saved config.json is LeRobot's (a ``type`` and no toolkit ``policy_type``)."""
    return isinstance(config.get("type"), str) and "policy_type" not in config


@dataclass
class LeRobotPolicyConfig:
    """A LeRobot policy and the toolkit's settings for fine-tuning it with RL.

    ``finetune_steps`` of the last sampler steps are stochastic and recorded (None: all of them),
    in LeRobot's normalised action space, from ``x ~ N(0, init_noise^2 I)``: 0 starts where
    deterministic acting starts, so RL trains the greedy chain. A diffusion step samples
    ``N(mean, max(sigma, min_std)^2)``, DDIM at ``eta = ddim_eta`` (DPPO; ``chain.py``); a
    SmolVLA step ``N(Euler mean, min_std^2)`` on the action values (ReinFlow; ``smolvla.py``).
    ``explore_executed`` puts that noise, and so the log-probability, on the chunk rows a
    decision executes only; the other rows take the noiseless update.
    """

    lerobot: dict[str, Any] = field(default_factory=dict)  # LeRobot's config.json, with "type"
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)  # normaliser stats, as lists
    rename_map: dict[str, str] = field(default_factory=dict)  # the preprocessor's renames
    finetune_steps: int | None = None
    min_std: float = 0.1
    ddim_eta: float = 1.0
    init_noise: float = 1.0
    explore_executed: bool = False

    def __post_init__(self) -> None:
        check_scalars(self)
        kind = self.lerobot.get("type")
        if kind not in SUPPORTED_TYPES:
            raise ValueError(
                f"LeRobot policy type {kind!r} is not supported here; supported: "
                f"{', '.join(SUPPORTED_TYPES)}"
            )
        steps = self.num_inference_steps
        if self.finetune_steps is None:
            self.finetune_steps = steps
        if not isinstance(self.finetune_steps, int) or not 1 <= self.finetune_steps <= steps:
            raise ValueError(
                f"LeRobotPolicyConfig.finetune_steps must be an int in [1, {steps}] (the "
                f"policy's denoising steps), got {self.finetune_steps!r}"
            )
        if not self.min_std > 0 or not self.ddim_eta >= 0 or not self.init_noise >= 0:
            raise ValueError(
                "LeRobotPolicyConfig needs min_std > 0, ddim_eta >= 0 and init_noise >= 0, got "
                f"{self.min_std}, {self.ddim_eta}, {self.init_noise}"
            )

    @property
    def num_inference_steps(self) -> int:
        """Sampler steps per decision (diffusion: ``num_train_timesteps`` when unset; SmolVLA:
        ``num_steps``, 10 by default)."""
        if self.lerobot.get("type") == "smolvla":
            return int(self.lerobot.get("num_steps", 10))
        steps = self.lerobot.get("num_inference_steps")
        return int(steps if steps is not None else self.lerobot.get("num_train_timesteps", 100))

    def finetuning(self) -> dict[str, Any]:
        """What ``embodied_finetuning.json`` holds."""
        return {name: getattr(self, name) for name in RL_SETTINGS}


def _read_json(path: Path) -> Any:
    """A JSON file; ValueError naming it when missing or invalid."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (not a saved LeRobot policy?)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not readable JSON ({error})") from None


def _step(pipeline: dict[str, Any], registry_name: str, path: Path) -> dict[str, Any] | None:
    """The step of a saved processor pipeline with that registry name, or None."""
    steps = pipeline.get("steps") if isinstance(pipeline, dict) else None
    if not isinstance(steps, list):
        raise ValueError(f"{path}: expected a processor pipeline with a list of 'steps'")
    return next((s for s in steps if s.get("registry_name") == registry_name), None)


def read_lerobot_directory(directory: Path, config: dict[str, Any]) -> LeRobotPolicyConfig:
    """The ``LeRobotPolicyConfig`` of a saved LeRobot policy (``config`` is its config.json):
    the normaliser's stats of its input and output features, the rename map, and the
    fine-tuning settings saved beside them (defaults when there are none)."""
    from safetensors.torch import load_file

    path = directory / PREPROCESSOR_NAME
    pipeline = _read_json(path)
    normalizer = _step(pipeline, "normalizer_processor", path)
    if normalizer is None or "state_file" not in normalizer:
        raise ValueError(f"{path}: has no normalizer_processor step with a state_file")
    features = normalizer.get("config", {}).get("features", {})
    state = load_file(str(directory / normalizer["state_file"]))
    stats: dict[str, dict[str, Any]] = {}
    for flat, tensor in state.items():
        key, stat = flat.rsplit(".", 1)
        if key in features:
            stats.setdefault(key, {})[stat] = tensor.tolist()
    rename = _step(pipeline, "rename_observations_processor", path)
    rename_map = dict((rename or {}).get("config", {}).get("rename_map", {}))
    settings = {}
    if (directory / FINETUNING_NAME).is_file():
        settings = _read_json(directory / FINETUNING_NAME)
        unknown = sorted(set(settings) - set(RL_SETTINGS))
        if unknown:
            raise ValueError(f"{directory / FINETUNING_NAME}: unknown keys {unknown}")
    return LeRobotPolicyConfig(lerobot=config, stats=stats, rename_map=rename_map, **settings)
