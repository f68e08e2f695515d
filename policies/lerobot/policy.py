"""A LeRobot policy as a toolkit ``Policy``: its diffusion policy (``lerobot-train
--policy.type=diffusion``) with DPPO's exact log-probabilities over the denoising chain, and SmolVLA
(``--policy.type=smolvla``) with ReinFlow's over its flow-matching chain. ``embodied eval``,
``embodied train grpo`` and ``tpo`` run on them, and they save back in LeRobot's layout.

Everything numeric is LeRobot's own: its network, its processors (rename, normalise observations
and actions as its ``normalization_mapping`` says, tokenise the instruction for SmolVLA,
unnormalise actions) and its sampler's formulas, per type a ``LeRobotChain`` (diffusion:
``chain.py``; SmolVLA: ``smolvla.py``). ``act`` maps the toolkit's observation windows
``{feature: [B, n_obs, ...]}`` (uint8 ``[H, W, 3]`` images, LeRobot's feature names) and the
instructions to LeRobot's batch (float ``[3, H, W]`` images in [0, 1], ``task`` strings), runs
the preprocessor, computes what every step reads once (the chain's ``context``) and runs the chain:

- ``deterministic=True``: ``x = 0`` and LeRobot's noiseless steps, so the actions equal LeRobot's
  ``predict_action_chunk(batch, noise=zeros)``.
- ``deterministic=False`` (RL): ``x ~ N(0, init_noise^2 I)`` (1: LeRobot's start; 0: deterministic
  acting's, so RL trains the greedy chain); the first ``N - K`` steps are LeRobot's own, each of
  the last ``K = finetune_steps`` a recorded Gaussian (the chain's ``gaussian_step``).

``policy_outputs`` records the normalised ``chain [B, K+1, *chunk]``, the steps' times ``[B, K]``
(``timesteps`` or ``taus``) and per-step ``log_probs [B, K]``; ``log_prob`` recomputes them through
LeRobot's network, with gradients. Executed actions are unnormalised by the postprocessor and not
clipped (LeRobot does not clip).

LeRobot is imported only when such a policy is built (it needs Python >= 3.12), so importing
``embodied.policies`` works without it.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodied.core.features import (
    ENV_STATE_KEY,
    STATE_KEY,
    ActionSpec,
    ObservationSpec,
    is_image_key,
)
from embodied.core.policy import ActionOutput, Policy, register_policy
from embodied.core.pretrained import load_exact
from embodied.core.sampling import Generators, randn
from embodied.policies.base import check_instructions
from embodied.policies.diffusion.conditioning import observation_window
from embodied.policies.lerobot.chain import DiffusionChain, LeRobotChain
from embodied.policies.lerobot.config import (
    FINETUNING_NAME,
    HORIZON_FIELDS,
    RL_SETTINGS,
    LeRobotPolicyConfig,
    is_lerobot_config,
    read_lerobot_directory,
)
from embodied.policies.lerobot.smolvla import SmolVLAChain
from embodied.policies.sampler import recorded_steps, run_chain

EMPTY_CAMERA = "empty_camera_"  # SmolVLA's stand-ins for absent cameras (it fills them itself)


def _lerobot() -> Any:
    """LeRobot's config class and factories, imported on first use."""
    try:
        from lerobot.configs.policies import PreTrainedConfig
        from lerobot.policies.factory import get_policy_class, make_pre_post_processors
        from lerobot.utils.feature_utils import dataset_to_policy_features
    except ImportError as error:
        raise ImportError(
            "LeRobot policies need the lerobot package (Python >= 3.12): pip install "
            "'lerobot[diffusion]==0.6.1', or use the environment `make test-lerobot` builds"
        ) from error
    return PreTrainedConfig, get_policy_class, make_pre_post_processors, dataset_to_policy_features


def _parse_config(values: Mapping[str, Any]) -> Any:
    """LeRobot's ``PreTrainedConfig`` of a config.json dict (parsed by LeRobot itself)."""
    pretrained_config = _lerobot()[0]
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, "config.json").write_text(json.dumps(values))
        return pretrained_config.from_pretrained(directory)


def _config_dict(config: Any) -> dict[str, Any]:
    """A LeRobot config as its config.json dict (serialised by LeRobot itself)."""
    with tempfile.TemporaryDirectory() as directory:
        config._save_pretrained(Path(directory))
        return json.loads(Path(directory, "config.json").read_text())


@register_policy("lerobot", recognizes=is_lerobot_config)
class LeRobotPolicy(Policy):
    """A LeRobot diffusion policy or SmolVLA with exact log-probabilities (module docstring)."""

    config_class = LeRobotPolicyConfig
    config: LeRobotPolicyConfig

    def __init__(self, config: LeRobotPolicyConfig) -> None:
        super().__init__(config)
        _, get_policy_class, _, _ = _lerobot()
        self.lerobot_config = _parse_config(config.lerobot)
        build = copy.deepcopy(self.lerobot_config)
        if getattr(build, "pretrained_backbone_weights", None) is not None:
            # Weights come from model.safetensors (or training); do not download ImageNet's.
            build.pretrained_backbone_weights = None
        try:
            self.model = get_policy_class(build.type)(build)
            self.build_processors()
        except OSError as error:  # a VLM directory or Hub name that is not there
            name = getattr(build, "vlm_model_name", None)
            if name is None:
                raise
            reason = str(error).splitlines()[0]
            raise ValueError(
                f"LeRobot {build.type} policy: cannot load its VLM {name!r} ({reason})"
            ) from None
        self.chain: LeRobotChain
        if build.type == "smolvla":
            self.chain = SmolVLAChain(self.model, config.min_std, config.explore_executed)
        else:
            self.chain = DiffusionChain(
                self.model, config.min_std, config.ddim_eta, config.explore_executed
            )

    @property
    def time_key(self) -> str:
        """Where ``policy_outputs`` records the stochastic steps' times."""
        return self.chain.time_key

    @property
    def chain_steps(self) -> int:
        """The recorded chain's K: its last ``finetune_steps`` denoising steps."""
        return self.config.finetune_steps

    def build_processors(self) -> None:
        """LeRobot's pre- and postprocessor for this policy type from ``config.stats`` (on the
        CPU; inputs move to the policy's device after them)."""
        _, _, make_pre_post_processors, _ = _lerobot()
        config = copy.deepcopy(self.lerobot_config)
        config.device = "cpu"
        stats = {
            key: {stat: np.asarray(value, dtype=np.float32) for stat, value in values.items()}
            for key, values in self.config.stats.items()
        }
        self.preprocessor, self.postprocessor = make_pre_post_processors(
            config, dataset_stats=stats
        )
        for step in self.preprocessor.steps:
            if hasattr(step, "rename_map"):
                step.rename_map = dict(self.config.rename_map)

    # --- construction from a dataset, and from LeRobot's saved layout ------------------------
    @classmethod
    def config_from_dataset(
        cls,
        features: Mapping[str, Mapping[str, Any]],
        tasks: Sequence[str] = (),
        horizon: int | None = None,
        **overrides: Any,
    ) -> LeRobotPolicyConfig:
        """A new LeRobot policy (``type`` override: diffusion, the default, or smolvla) reading the
        dataset's cameras and ``observation.state`` (and, with no camera, the privileged
        ``observation.environment_state``, as LeRobot's diffusion needs one or the other);
        ``horizon`` is the diffusion ``horizon`` or SmolVLA's ``chunk_size``; other overrides are
        LeRobot config fields or the fine-tuning settings."""
        pretrained_config, _, _, to_policy_features = _lerobot()
        settings = {k: overrides.pop(k) for k in RL_SETTINGS if k in overrides}
        kind = overrides.pop("type", "diffusion")
        cameras = [k for k, f in features.items() if f.get("dtype") in ("video", "image")]
        keys = [*cameras, STATE_KEY, *([] if cameras else [ENV_STATE_KEY]), "action"]
        chosen = to_policy_features({k: dict(features[k]) for k in keys if k in features})
        inputs = {k: f for k, f in chosen.items() if k != "action"}
        values = {"input_features": inputs, "output_features": {"action": chosen["action"]}}
        if horizon is not None:
            values[HORIZON_FIELDS.get(kind, "horizon")] = horizon
        config_class = pretrained_config.get_choice_class(kind)
        config = config_class(**{**values, "device": "cpu", **overrides})
        return LeRobotPolicyConfig(lerobot=_config_dict(config), **settings)

    def fit_normalizers(self, stats: Mapping[str, Mapping[str, Any]]) -> LeRobotPolicy:
        """Use dataset statistics for the features the policy reads and writes (LeRobot's
        normaliser leaves a feature without statistics as it is)."""
        features = {**self.lerobot_config.input_features, **self.lerobot_config.output_features}
        self.config.stats = {
            key: {stat: np.asarray(value).tolist() for stat, value in stats[key].items()}
            for key in features
            if key in stats
        }
        self.build_processors()
        return self

    @classmethod
    def load_saved(cls, directory: Path, config: dict[str, Any], weights: Path) -> LeRobotPolicy:
        """A policy LeRobot saved (``pretrained_model/``), or this class did."""
        policy = cls(read_lerobot_directory(directory, config))
        from safetensors.torch import load_file

        load_exact(policy.model, load_file(str(weights)), weights)
        return policy

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write LeRobot's layout (config.json, model.safetensors, both processors) and the
        fine-tuning settings; files are written aside and moved in one by one (atomically).
        ``pretrained_backbone_weights`` is saved as null: the backbone is in the weights."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
        try:
            self.model.save_pretrained(staging)
            self.preprocessor.save_pretrained(staging)
            self.postprocessor.save_pretrained(staging)
            text = json.dumps(self.config.finetuning(), indent=2) + "\n"
            (staging / FINETUNING_NAME).write_text(text)
            for path in sorted(staging.iterdir()):
                os.replace(path, directory / path.name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return directory

    # --- what callers read --------------------------------------------------------------------
    @property
    def observation_spec(self) -> ObservationSpec:
        """LeRobot's input features: cameras (``[3, H, W]``), ``observation.state`` and, for a
        privileged policy, ``observation.environment_state``; ValueError for other inputs,
        which no toolkit environment offers."""
        config = self.lerobot_config
        cameras, state_dim, env_dim = {}, 0, 0
        for key, feature in config.input_features.items():
            name = self._toolkit_name(key)
            if EMPTY_CAMERA in key:
                continue
            if is_image_key(name):
                cameras[name] = tuple(int(s) for s in feature.shape[1:])
            elif name == STATE_KEY:
                state_dim = int(feature.shape[0])
            elif name == ENV_STATE_KEY:
                env_dim = int(feature.shape[0])
            else:
                raise ValueError(
                    f"the LeRobot policy reads {key!r}, which toolkit environments do not offer "
                    "(they offer cameras, observation.state, observation.environment_state)"
                )
        return ObservationSpec(
            cameras=cameras, state_dim=state_dim, env_state_dim=env_dim,
            n_obs_steps=config.n_obs_steps,
        )  # fmt: skip

    @property
    def action_spec(self) -> ActionSpec:
        """``n_action_steps`` actions of LeRobot's action size per decision."""
        action = self.lerobot_config.output_features["action"]
        return ActionSpec(int(action.shape[0]), self.lerobot_config.n_action_steps)

    @property
    def bc_horizon(self) -> int:
        """The predicted chunk: ``horizon`` (diffusion) or ``chunk_size`` (SmolVLA) actions."""
        return self.chain.shape[0]

    def _toolkit_name(self, key: str) -> str:
        """The toolkit feature a LeRobot input reads (before the preprocessor's renaming)."""
        inverse = {new: old for old, new in self.config.rename_map.items()}
        return inverse.get(key, key)

    # --- LeRobot's batch ----------------------------------------------------------------------
    def lerobot_batch(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        action: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """LeRobot's normalised batch of toolkit observation windows, their instructions (as
        ``task``) and an action chunk: images to float ``[B, n_obs, 3, H, W]`` in [0, 1], then
        LeRobot's preprocessor (SmolVLA's tokenises the instructions)."""
        self.check_inputs(obs)
        spec = self.observation_spec
        cpu = torch.device("cpu")
        batch: dict[str, Any] = {}
        for key, (height, width) in spec.cameras.items():
            x = observation_window(obs, key, (height, width, 3), spec.n_obs_steps, cpu)
            if x.dtype != torch.uint8:
                raise ValueError(f"observation {key!r} must be uint8 images, got {x.dtype}")
            batch[key] = x.permute(0, 1, 4, 2, 3).float() / 255.0
        for key, dim in ((STATE_KEY, spec.state_dim), (ENV_STATE_KEY, spec.env_state_dim)):
            if dim:
                batch[key] = observation_window(obs, key, (dim,), spec.n_obs_steps, cpu).float()
        check_instructions(instructions, len(next(iter(batch.values()))))
        batch["task"] = [str(text) for text in instructions]
        if action is not None:
            batch["action"] = torch.as_tensor(action, dtype=torch.float32, device=cpu)
        batch = self.preprocessor(batch)
        return {k: v.to(self.device) for k, v in batch.items() if isinstance(v, torch.Tensor)}

    # --- the Policy interface -----------------------------------------------------------------
    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        deterministic: bool = False,
        generator: Generators = None,
        initial_noise: torch.Tensor | None = None,
    ) -> ActionOutput:
        """Sample a chunk (module docstring): raw ``actions [B, n_action_steps, A]``,
        ``log_prob [B]`` and the recorded chain. ``initial_noise`` ``[B, *chunk]`` replaces the
        chain's start (LeRobot's ``noise`` argument). LeRobot's diffusion policy reads no
        instruction (one per observation is still required); SmolVLA reads it."""
        context = self.chain.context(self.lerobot_batch(obs, instructions))
        shape = (len(instructions), *self.chain.shape)
        if initial_noise is not None:
            x = torch.as_tensor(initial_noise, dtype=torch.float32, device=self.device)
            if tuple(x.shape) != shape:
                raise ValueError(f"initial_noise has shape {tuple(x.shape)}, expected {shape}")
        elif deterministic:
            x = torch.zeros(shape, device=self.device)
        else:
            x = self.config.init_noise * randn(shape, generator, device=self.device)
        untuned = None if deterministic else generator
        chain = run_chain(
            x,
            self.chain.times,
            self.config.finetune_steps,
            lambda x, t: self.chain.lerobot_step(x, t, context, untuned),
            lambda x, t: self.chain.gaussian_step(x, t, context),
            deterministic,
            generator,
        )
        chunk = self.chain.executed(chain.x)
        if not torch.isfinite(chunk).all():
            raise ValueError("the LeRobot policy produced NaN or infinite actions")
        actions = self.postprocessor(chunk.cpu()).to(self.device)
        return ActionOutput(
            actions=actions,
            log_prob=chain.log_probs.sum(dim=1),
            policy_outputs={
                "chain": chain.chain,
                self.time_key: chain.times,
                "log_probs": chain.log_probs,
            },
        )

    def log_prob(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        policy_outputs: Mapping[str, Any],
    ) -> torch.Tensor:
        """Per-step log-densities ``[B, K]`` of a recorded chain, with gradients through
        LeRobot's network."""
        context = self.chain.context(self.lerobot_batch(obs, instructions))
        t, x, x_next, k = recorded_steps(
            policy_outputs, self.time_key, self.chain.time_dtype, len(instructions),
            self.chain.shape, self.device,
        )  # fmt: skip
        return self.chain.log_probs(context, t, x, x_next, k).reshape(-1, k)

    def bc_loss(self, batch: Mapping[str, Any], auxiliary: bool = True) -> torch.Tensor:
        """LeRobot's own training loss (its policy's ``forward``) of a toolkit BC batch (no
        auxiliary target of ours)."""
        lerobot_batch = self.lerobot_batch(batch, batch["instruction"], action=batch["action"])
        if "action_is_pad" in batch:
            pad = torch.as_tensor(batch["action_is_pad"], dtype=torch.bool, device=self.device)
            lerobot_batch["action_is_pad"] = pad
        loss, _ = self.model.forward(lerobot_batch)
        return loss
