"""A LeRobot diffusion policy (``lerobot-train --policy.type=diffusion``) as a toolkit ``Policy``,
with DPPO's exact log-probabilities over its denoising chain, so ``embodied eval``,
``embodied train grpo`` and ``tpo`` run on it and it saves back in LeRobot's layout.

Everything numeric is LeRobot's own: its network (``DiffusionPolicy``: ResNet image encoders,
the conditional U-Net), its processors (rename, normalise observations and actions as its
``normalization_mapping`` says, unnormalise actions) and its scheduler's formulas
(``chain.py``). ``act`` maps the toolkit's observation windows ``{feature: [B, n_obs, ...]}``
(uint8 ``[H, W, 3]`` images, LeRobot's feature names) to LeRobot's batch (float ``[3, H, W]``
images in [0, 1]), normalises it with the preprocessor, encodes it with
``DiffusionModel._prepare_global_conditioning`` and runs the chain over the scheduler's timesteps:

- ``deterministic=True``: ``x_T = 0`` and LeRobot's noiseless steps (DDIM ``eta = 0``; DDPM's
  mean), so the actions equal LeRobot's ``predict_action_chunk(batch, noise=zeros)``.
- ``deterministic=False`` (RL): ``x_T ~ N(0, init_noise^2 I)`` (1: LeRobot's and DPPO's start;
  0: deterministic acting's, so RL trains the greedy chain); the first ``N - K`` steps are
  LeRobot's own (DDIM ``eta = 0``; DDPM with its noise), each of the last ``K = finetune_steps``
  a recorded Gaussian ``N(mean, max(sigma, min_std)^2)`` (DDIM mean and sigma at ``ddim_eta``).

``policy_outputs`` records the normalised ``chain [B, K+1, horizon, A]``, ``timesteps [B, K]`` and
per-step ``log_probs [B, K]``; ``log_prob`` recomputes them in one batched pass through LeRobot's
network, with gradients. Executed actions are chunk steps ``n_obs_steps - 1 ..`` (as LeRobot's
``generate_actions``), unnormalised by the postprocessor and not clipped (LeRobot does not clip).

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
from typing import Any, ClassVar

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
from embodied.policies.lerobot.chain import SchedulerSteps
from embodied.policies.lerobot.config import (
    FINETUNING_NAME,
    RL_SETTINGS,
    LeRobotPolicyConfig,
    is_lerobot_config,
    read_lerobot_directory,
)
from embodied.policies.sampler import Step, gaussian_log_prob, recorded_steps, run_chain

IMAGES = "observation.images"  # LeRobot's key of all cameras stacked [B, n_obs, cams, 3, H, W]


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
    """A LeRobot diffusion policy with DPPO log-probabilities (module docstring)."""

    config_class = LeRobotPolicyConfig
    config: LeRobotPolicyConfig
    time_key: ClassVar[str] = "timesteps"

    def __init__(self, config: LeRobotPolicyConfig) -> None:
        super().__init__(config)
        _, get_policy_class, _, _ = _lerobot()
        self.lerobot_config = _parse_config(config.lerobot)
        build = copy.deepcopy(self.lerobot_config)
        if getattr(build, "pretrained_backbone_weights", None) is not None:
            # Weights come from model.safetensors (or training); do not download ImageNet's.
            build.pretrained_backbone_weights = None
        self.model = get_policy_class(build.type)(build)
        self.build_processors()
        diffusion = self.model.diffusion
        diffusion.noise_scheduler.set_timesteps(diffusion.num_inference_steps)
        self.steps = SchedulerSteps(diffusion.noise_scheduler)

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
        """A new LeRobot policy (``type`` override, default diffusion) reading the dataset's
        cameras and ``observation.state`` (and, with no camera, the privileged
        ``observation.environment_state``, as LeRobot's diffusion needs one or the other);
        other overrides are LeRobot config fields or the fine-tuning settings."""
        pretrained_config, _, _, to_policy_features = _lerobot()
        settings = {k: overrides.pop(k) for k in RL_SETTINGS if k in overrides}
        kind = overrides.pop("type", "diffusion")
        cameras = [k for k, f in features.items() if f.get("dtype") in ("video", "image")]
        keys = [*cameras, STATE_KEY, *([] if cameras else [ENV_STATE_KEY]), "action"]
        chosen = to_policy_features({k: dict(features[k]) for k in keys if k in features})
        inputs = {k: f for k, f in chosen.items() if k != "action"}
        values = {"input_features": inputs, "output_features": {"action": chosen["action"]}}
        if horizon is not None:
            values["horizon"] = horizon
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
        """The predicted chunk: ``horizon`` actions."""
        return self.lerobot_config.horizon

    def _toolkit_name(self, key: str) -> str:
        """The toolkit feature a LeRobot input reads (before the preprocessor's renaming)."""
        inverse = {new: old for old, new in self.config.rename_map.items()}
        return inverse.get(key, key)

    # --- LeRobot's batch ----------------------------------------------------------------------
    def lerobot_batch(
        self, obs: Mapping[str, Any], action: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """LeRobot's normalised batch of toolkit observation windows (and an action chunk):
        images to float ``[B, n_obs, 3, H, W]`` in [0, 1], then LeRobot's preprocessor."""
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
        if action is not None:
            batch["action"] = torch.as_tensor(action, dtype=torch.float32, device=cpu)
        batch = self.preprocessor(batch)
        return {k: v.to(self.device) for k, v in batch.items() if isinstance(v, torch.Tensor)}

    def condition(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """LeRobot's global conditioning ``[B, G]`` of a normalised batch (its own encoders)."""
        batch = dict(batch)
        image_keys = list(self.lerobot_config.image_features)
        if image_keys:
            batch[IMAGES] = torch.stack([batch[key] for key in image_keys], dim=-4)
        return self.model.diffusion._prepare_global_conditioning(batch)

    # --- the chain (formulas in policies/lerobot/chain.py) ------------------------------------
    def _terms(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> Any:
        """One U-Net call at ``x_t`` (per-sample ``t``), as the scheduler's step reads it."""
        output = self.model.diffusion.unet(x, t, global_cond=cond)
        return self.steps.terms(output, x, t)

    def lerobot_step(
        self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, generator: Generators
    ) -> torch.Tensor:
        """LeRobot's own step: DDIM at ``eta = 0``; DDPM's mean plus its noise (none without a
        ``generator``: the noiseless chain of ``deterministic=True``)."""
        mean, sigma = self.steps.mean_std(self._terms(x, t, cond), x, t, eta=0.0)
        if self.steps.ddim or generator is None:
            return mean
        return mean + sigma * randn(x.shape, generator, device=x.device)

    def gaussian_step(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor) -> Step:
        """A fine-tuned step: ``N(mean, max(sigma, min_std)^2)`` (DDIM at ``ddim_eta``) and the
        noiseless update of the same U-Net call."""
        terms = self._terms(x, t, cond)
        mean, sigma = self.steps.mean_std(terms, x, t, eta=self.config.ddim_eta)
        noiseless = mean if not self.steps.ddim else self.steps.mean_std(terms, x, t, 0.0)[0]
        return Step(mean, sigma.clamp(min=self.config.min_std), noiseless)

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
        ``log_prob [B]`` and the recorded chain. ``initial_noise`` ``[B, horizon, A]`` replaces
        ``x_T`` (LeRobot's ``noise`` argument). LeRobot's diffusion policy reads no instruction
        (one per observation is still required)."""
        batch = self.lerobot_batch(obs)
        check_instructions(instructions, len(next(iter(batch.values()))))
        cond = self.condition(batch)
        config = self.lerobot_config
        shape = (cond.shape[0], config.horizon, self.action_spec.dim)
        if initial_noise is not None:
            x = torch.as_tensor(initial_noise, dtype=torch.float32, device=cond.device)
            if tuple(x.shape) != shape:
                raise ValueError(f"initial_noise has shape {tuple(x.shape)}, expected {shape}")
        elif deterministic:
            x = torch.zeros(shape, device=cond.device)
        else:
            x = self.config.init_noise * randn(shape, generator, device=cond.device)
        untuned = None if deterministic else generator
        chain = run_chain(
            x,
            self.steps.timesteps,
            self.config.finetune_steps,
            lambda x, t: self.lerobot_step(x, t, cond, untuned),
            lambda x, t: self.gaussian_step(x, t, cond),
            deterministic,
            generator,
        )
        start = config.n_obs_steps - 1
        chunk = chain.x[:, start : start + config.n_action_steps]
        if not torch.isfinite(chunk).all():
            raise ValueError("the LeRobot policy produced NaN or infinite actions")
        actions = self.postprocessor(chunk.cpu()).to(cond.device)
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
        LeRobot's encoders and U-Net (one batched call over the B * K steps)."""
        cond = self.condition(self.lerobot_batch(obs))
        shape = (self.lerobot_config.horizon, self.action_spec.dim)
        t, x, x_next, k = recorded_steps(
            policy_outputs, self.time_key, torch.long, cond.shape[0], shape, cond.device
        )
        step = self.gaussian_step(x, t, cond.repeat_interleave(k, dim=0))
        return gaussian_log_prob(x_next, step.mean, step.std).reshape(-1, k)

    def bc_loss(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """LeRobot's own training loss (``DiffusionPolicy.forward``) of a toolkit BC batch."""
        lerobot_batch = self.lerobot_batch(batch, action=batch["action"])
        if "action_is_pad" in batch:
            pad = torch.as_tensor(batch["action_is_pad"], dtype=torch.bool, device=self.device)
            lerobot_batch["action_is_pad"] = pad
        loss, _ = self.model.forward(lerobot_batch)
        return loss
