"""Diffusion Policy: an action-chunk planner that denoises ``horizon`` actions with a 1-D U-Net
(``unet.py``) conditioned on the observation window and instruction (``conditioning.py``), with
DPPO's exact per-denoising-step log-probabilities for RL fine-tuning.

Training (``bc_loss``), DDPM on normalised actions ``x_0`` (min/max -> [-1, 1])::

    t ~ U{0..T-1},  eps ~ N(0, I),  x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps
    loss = mean over non-padded (step, dim) of (eps_theta(x_t, t, cond) - eps)^2

(with ``prediction_type="sample"`` the target is ``x_0``). ``ema_update`` keeps an exponential
moving average of the network (``ema_model``, saved with the weights); ``use_ema`` /
``ema_weights()`` make ``act`` and ``log_prob`` use it (keep it off for RL: the EMA copy has no
gradients).

Sampling (``act``), DDIM over ``num_inference_steps`` timesteps (the step ``x_t -> mu, sigma_t``
is written out in ``policies/sampler.py``):

- ``deterministic=True``: ``x_T = 0`` and every step is the ``eta = 0`` update ``x_prev = mu``,
  so the actions are a function of the observation alone (DDIM's deterministic sampler).
- ``deterministic=False`` (the RL mode, DPPO): ``x_T ~ N(0, init_noise^2 I)``; the first
  ``N - finetune_steps`` steps are ``eta = 0`` mean updates, and each of the last
  ``K = finetune_steps`` steps is a Gaussian with ``eta = ddim_eta`` (default 1, DPPO's DDIM
  fine-tuning)::

      x_prev ~ N(mu, std_t^2 I),   std_t = max(sigma_t, min_std)

  ``min_std`` is DPPO's exploration floor; it also keeps the last step (``sigma = 0``) a proper
  Gaussian. ``init_noise = 1`` is DPPO's start; ``init_noise = 0`` starts at the deterministic
  chain's zeros, so the sampled chain is the greedy one plus the steps' noise and RL improves the
  chain greedy evaluation runs (x_T has no parameters, so it is no term of the log-probability).
  The decision's log-probability is the exact sum over the K steps and over every
  (horizon, action) dimension of ``log N(x_prev; mu, std_t^2)``; with ``explore_executed`` only
  the ``n_action_steps`` rows the env executes are Gaussian (the rest take the ``eta = 0`` update,
  std 0), so only they count: the other rows' noise moves no action but would weigh in the policy
  ratio (DPPO likewise scores executed steps only). ``policy_outputs`` records
  ``chain`` ``[B, K+1, horizon, A]`` (normalised ``x`` before the first fine-tuned step, then after
  each), ``timesteps`` ``[B, K]`` (the ``t`` of each fine-tuned step) and ``log_probs`` ``[B, K]``.
  In deterministic mode the same keys are recorded, the log-probabilities being those of the
  ``eta = 0`` chain under the stochastic kernel (diagnostics only; sample RL data stochastically).

Executed actions: the last chain element clipped to [-1, 1] (the data's min/max range),
unnormalised, steps ``n_obs_steps - 1 .. n_obs_steps - 2 + n_action_steps`` of the horizon (the
first action at the newest observation, as Diffusion Policy does). Log-probabilities are densities
of the unclipped normalised chain; the clip belongs to the environment.

``FlowPolicy`` (``policies/flow.py``) reuses all of this but the training target and the step.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from embodied.core.features import ENV_STATE_KEY, STATE_KEY, ObservationSpec
from embodied.core.nn import Normalizer, build_vocab
from embodied.core.policy import ActionOutput, register_policy
from embodied.core.sampling import Generators, randn
from embodied.policies.augment import PlanarAugment
from embodied.policies.aux_state import (
    AuxStateTarget,
    aux_state_values,
    fit_aux_normalizer,
)
from embodied.policies.base import (
    ChunkedPolicy,
    NormalizedPolicy,
    config_observation_spec,
    dataset_cameras,
    dataset_state_values,
    env_state_values,
    require_features,
)
from embodied.policies.diffusion.conditioning import ObservationEncoder, observation_window
from embodied.policies.diffusion.config import DiffusionConfig
from embodied.policies.diffusion.unet import ConditionalUnet1D
from embodied.policies.sampler import (
    Step,
    ddim_alphas,
    ddim_mean,
    ddim_x0,
    explore_rows,
    gaussian_log_prob,
    recorded_steps,
    run_chain,
)


class DiffusionNet(ObservationEncoder):
    """Everything with learned weights that the EMA averages: the encoders and the U-Net."""

    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__(config)
        self.unet = ConditionalUnet1D(
            config.action_dim,
            self.global_cond_dim,
            config.embed_dim,
            config.down_dims,
            config.kernel_size,
            config.n_groups,
        )


@register_policy("diffusion")
class DiffusionPolicy(AuxStateTarget, ChunkedPolicy, NormalizedPolicy):
    """Diffusion Policy (DDPM training, DDIM sampling) with DPPO log-probabilities."""

    config_class = DiffusionConfig
    config: DiffusionConfig
    time_key: ClassVar[str] = "timesteps"  # where policy_outputs records the steps' times

    def __init__(self, config: DiffusionConfig) -> None:
        super().__init__(config)
        self.build_normalizers(config.state_dim, config.env_state_dim, config.action_dim)
        # The auxiliary target's scaling (the environment state's statistics; never an input).
        self.aux_state_normalizer = (
            Normalizer(config.aux_state_dim, "mean_std") if config.aux_state_dim else None
        )
        self.model = DiffusionNet(config)
        self.planar_augment = None
        if config.augment_yaw or config.augment_shift:
            self.planar_augment = PlanarAugment(
                config.env_state_names, config.augment_yaw, config.augment_shift
            )
        self.ema_model = copy.deepcopy(self.model).requires_grad_(False)
        self.register_buffer("ema_steps", torch.zeros((), dtype=torch.long))
        self.use_ema = False  # act / log_prob with the EMA weights (evaluation after BC)
        self.build_sampler()

    def build_sampler(self) -> None:
        """DDPM training noise, the DDIM timesteps (``sampling_times``) and ``abar`` buffers (the
        flow planner overrides this with its Euler grid)."""
        from diffusers import DDIMScheduler, DDPMScheduler  # slow import: only when built

        config = self.config
        self.noise_scheduler = DDPMScheduler(
            num_train_timesteps=config.num_train_timesteps,
            beta_schedule=config.beta_schedule,
            clip_sample=True,
            prediction_type=config.prediction_type,
        )
        ddim = DDIMScheduler(
            num_train_timesteps=config.num_train_timesteps,
            beta_schedule=config.beta_schedule,
            clip_sample=True,
            set_alpha_to_one=True,
            prediction_type=config.prediction_type,
        )
        ddim.set_timesteps(config.num_inference_steps)
        self.step_ratio = config.num_train_timesteps // config.num_inference_steps
        # Derived from the config, so not saved (persistent=False) but moved by .to(device).
        self.register_buffer("sampling_times", ddim.timesteps.long().clone(), persistent=False)
        self.register_buffer(
            "alphas_cumprod", ddim.alphas_cumprod.float().clone(), persistent=False
        )

    # --- dataset-shaped construction and normalisation ----------------------------------------
    @classmethod
    def config_from_dataset(
        cls,
        features: Mapping[str, Mapping[str, Any]],
        tasks: Sequence[str] = (),
        horizon: int | None = None,
        **overrides: Any,
    ) -> DiffusionConfig:
        """A config shaped by a LeRobot dataset (what ``embodied train bc`` calls): its state and
        action sizes, every camera (square images), and a vocabulary of its instructions."""
        require_features(features, (STATE_KEY, "action"))
        image_keys, image_size = dataset_cameras(features)
        env_values, texts = env_state_values(features, tasks)
        env_values = aux_state_values(env_values, overrides)  # a target, or an input
        values: dict[str, Any] = {
            **dataset_state_values(features),
            "action_dim": int(features["action"]["shape"][-1]),
            "image_keys": image_keys,
            "vocab": build_vocab(texts),
            **env_values,
        }
        if image_size is not None:
            values["image_size"] = image_size
        if horizon is not None:
            values["horizon"] = horizon
        return cls.config_class(**{**values, **overrides})

    def fit_normalizers(self, stats: Mapping[str, Mapping[str, Any]]) -> DiffusionPolicy:
        """State and environment state by mean/std, actions by min/max (dataset statistics;
        with planar augmentation, the statistics of the turned and shifted states)."""
        if self.planar_augment is not None and STATE_KEY in stats:
            center = np.asarray(stats[STATE_KEY]["mean"], dtype=np.float64).reshape(-1)[:2]
            state, env_state = self.planar_augment.turned_stats(
                stats[STATE_KEY], stats.get(ENV_STATE_KEY), center
            )
            stats = {**stats, STATE_KEY: state}
            if env_state is not None:
                stats[ENV_STATE_KEY] = env_state
        if self.aux_state_normalizer is not None:
            fit_aux_normalizer(self.aux_state_normalizer, stats)
        return self.fit_state_normalizers(stats)

    @property
    def chain_steps(self) -> int:
        """The recorded chain's K: its last ``finetune_steps`` denoising steps."""
        return self.config.finetune_steps

    @property
    def observation_spec(self) -> ObservationSpec:
        """Cameras, ``observation.state`` and (when configured) the environment state."""
        return config_observation_spec(self.config)

    # --- EMA ----------------------------------------------------------------------------------
    @torch.no_grad()
    def ema_update(self) -> None:
        """``ema = d * ema + (1 - d) * model`` with ``d = min(ema_decay, (1 + n) / (10 + n))``
        (warm-up as in diffusers' EMAModel), ``n`` = updates so far; call after each step."""
        n = int(self.ema_steps)
        decay = min(self.config.ema_decay, (1 + n) / (10 + n))
        for ema, live in zip(self.ema_model.parameters(), self.model.parameters(), strict=True):
            ema.lerp_(live, 1.0 - decay)
        for ema, live in zip(self.ema_model.buffers(), self.model.buffers(), strict=True):
            ema.copy_(live)
        self.ema_steps += 1

    @contextlib.contextmanager
    def ema_weights(self) -> Iterator[DiffusionPolicy]:
        """``with policy.ema_weights(): policy.act(...)`` acts with the EMA network."""
        previous, self.use_ema = self.use_ema, True
        try:
            yield self
        finally:
            self.use_ema = previous

    @torch.no_grad()
    def adopt_ema(self) -> DiffusionPolicy:
        """Copy the EMA weights into the live network: what BC saves and RL starts from."""
        self.model.load_state_dict(self.ema_model.state_dict())
        return self

    def _net(self) -> DiffusionNet:
        """The network acting now: the EMA copy when ``use_ema`` is set."""
        return self.ema_model if self.use_ema else self.model

    def global_cond(
        self, net: DiffusionNet, obs: Mapping[str, Any], instructions: Sequence[str]
    ) -> torch.Tensor:
        """``net``'s conditioning ``[B, G]`` of observations normalised by this policy's
        statistics (``ObservationEncoder.condition``)."""
        return self.conditioning(net, obs, instructions)[0]

    def conditioning(
        self,
        net: DiffusionNet,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        state_noise: float = 0.0,
        image_shift: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``global_cond`` and the state predicted from the images, with BC augmentation."""
        return net.condition(
            obs, instructions, self.state_normalizer, self.env_state_normalizer,
            self.aux_state_normalizer, state_noise, image_shift,
        )  # fmt: skip

    # --- training -----------------------------------------------------------------------------
    def bc_inputs(
        self, batch: Mapping[str, Any], auxiliary: bool = True
    ) -> tuple[DiffusionNet, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """What every planner's BC loss starts from: the live network, its conditioning
        ``[B, G]``, the normalised action chunk ``[B, horizon, A]``, a keep-mask of the same
        shape (0 where ``action_is_pad``) and the weighted auxiliary loss (0 without one: the
        MSE of the environment state predicted from the images, normalised; 0 when not
        ``auxiliary``)."""
        config = self.config
        net = self.model
        actions = torch.as_tensor(batch["action"], device=self.device, dtype=torch.float32)
        state = self._window(batch, STATE_KEY, config.state_dim)
        expected = (state.shape[0], config.horizon, config.action_dim)
        if tuple(actions.shape) != expected:
            raise ValueError(
                f"batch 'action' has shape {tuple(actions.shape)}, expected {expected}"
            )
        if self.planar_augment is not None:
            batch, actions = self.augmented(batch, state, actions)
        cond, predicted = self.conditioning(
            net, batch, batch["instruction"], config.state_noise, config.image_shift
        )
        aux = cond.new_zeros(())
        if config.aux_state_weight > 0 and auxiliary:
            target = self._window(batch, ENV_STATE_KEY, config.aux_state_dim)
            aux = net.state_head.loss(
                predicted, target, self.aux_state_normalizer, config.aux_state_weight
            )
        self.bc_terms = {"aux_state": aux.detach()}
        x0 = self.action_normalizer.normalize(actions)
        if self.planar_augment is not None:  # a turned action may leave the data's range
            x0 = x0.clamp(-1.0, 1.0)
        if "action_is_pad" in batch:
            pad = torch.as_tensor(batch["action_is_pad"], device=self.device, dtype=torch.bool)
            keep = (~pad).to(x0.dtype).unsqueeze(-1).expand_as(x0)
        else:
            keep = torch.ones_like(x0)
        return net, cond, x0, keep, aux

    def _window(self, batch: Mapping[str, Any], key: str, dim: int) -> torch.Tensor:
        """A state feature's window ``[B, n_obs_steps, dim]`` (float, on our device)."""
        return observation_window(batch, key, (dim,), self.config.n_obs_steps, self.device).float()

    def augmented(
        self, batch: Mapping[str, Any], state: torch.Tensor, actions: torch.Tensor
    ) -> tuple[dict[str, Any], torch.Tensor]:
        """The batch (its checked ``state``) and actions with every window's scene turned and
        shifted on the table."""
        config = self.config
        env_state = None
        if config.env_state_dim:
            env_state = self._window(batch, ENV_STATE_KEY, config.env_state_dim)
        center = self.state_normalizer.shift[:2]  # the data's mean hand position
        state, env_state, actions = self.planar_augment(state, env_state, actions, center)
        batch = {**batch, STATE_KEY: state}
        if env_state is not None:
            batch[ENV_STATE_KEY] = env_state
        return batch, actions

    @staticmethod
    def masked_mse(
        prediction: torch.Tensor, target: torch.Tensor, keep: torch.Tensor
    ) -> torch.Tensor:
        """``sum(keep * (prediction - target)^2) / sum(keep)``."""
        return ((prediction - target) ** 2 * keep).sum() / keep.sum().clamp(min=1.0)

    def bc_loss(self, batch: Mapping[str, Any], auxiliary: bool = True) -> torch.Tensor:
        """DDPM loss: MSE between predicted and true noise (or x_0), masked by ``action_is_pad``."""
        net, cond, x0, keep, aux = self.bc_inputs(batch, auxiliary)
        noise = torch.randn_like(x0)
        t = torch.randint(0, self.config.num_train_timesteps, (x0.shape[0],), device=x0.device)
        x_t = self.noise_scheduler.add_noise(x0, noise, t)
        prediction = net.unet(x_t, t, cond)
        target = noise if self.config.prediction_type == "epsilon" else x0
        denoise = self.masked_mse(prediction, target, keep)
        self.bc_terms["denoise"] = denoise.detach()
        return denoise + aux

    # --- the DDIM step (formulas in policies/sampler.py) --------------------------------------
    def predict_x0(
        self, net: DiffusionNet, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One U-Net call at ``x_t`` (per-sample ``t`` [B]): clipped ``x0_hat``, re-derived
        ``eps_hat``, ``abar_t`` and ``abar_prev`` (``[B, 1, 1]``)."""
        abar, abar_prev = ddim_alphas(self.alphas_cumprod, t, self.step_ratio)
        x0_hat, eps_hat = ddim_x0(net.unet(x, t, cond), x, abar, self.config.prediction_type)
        return x0_hat, eps_hat, abar, abar_prev

    def denoise_step(
        self, net: DiffusionNet, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, eta: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DDIM step from ``x_t``: mean ``mu`` and ``sigma_t``."""
        return ddim_mean(*self.predict_x0(net, x, t, cond), eta=eta)

    def noiseless_step(
        self, net: DiffusionNet, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor
    ) -> torch.Tensor:
        """A chain step that is not fine-tuned: DDIM's ``eta = 0`` update."""
        return self.denoise_step(net, x, t, cond, eta=0.0)[0]

    def gaussian_step(
        self, net: DiffusionNet, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor
    ) -> Step:
        """A fine-tuned step: ``N(mu, max(sigma_t, min_std)^2)`` with ``eta = ddim_eta``, and the
        ``eta = 0`` update of the same U-Net call."""
        prediction = self.predict_x0(net, x, t, cond)
        mean, sigma = ddim_mean(*prediction, eta=self.config.ddim_eta)
        noiseless, _ = ddim_mean(*prediction, eta=0.0)
        step = Step(mean, sigma.clamp(min=self.config.min_std), noiseless)
        return explore_rows(step, self.executed_slice) if self.config.explore_executed else step

    @property
    def executed_slice(self) -> slice:
        """The chunk's rows the env executes: from the newest observation, ``n_action_steps``."""
        start = self.config.n_obs_steps - 1
        return slice(start, start + self.config.n_action_steps)

    # --- the Policy interface -----------------------------------------------------------------
    def executed_actions(self, x: torch.Tensor) -> torch.Tensor:
        """Raw actions ``[B, n_action_steps, A]`` of a final normalised chunk ``[B, horizon, A]``:
        steps from the newest observation on, clipped to the data's [-1, 1] range."""
        executed = x[:, self.executed_slice].clamp(-1.0, 1.0)
        if not torch.isfinite(executed).all():
            raise ValueError(f"the {self.policy_type} policy produced NaN or infinite actions")
        return self.action_normalizer.unnormalize(executed)

    @torch.no_grad()
    def act(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        deterministic: bool = False,
        generator: Generators = None,
    ) -> ActionOutput:
        """Sample a chunk: ``actions [B, n_action_steps, A]`` (raw), ``log_prob [B]``, and the
        ``chain`` / step times / per-step ``log_probs`` in ``policy_outputs``; the chain starts
        at zeros when deterministic, else at ``N(0, init_noise^2 I)`` from ``generator``."""
        self.check_inputs(obs)
        net = self._net()
        cond = self.global_cond(net, obs, instructions)
        shape = (cond.shape[0], self.config.horizon, self.config.action_dim)
        if deterministic:
            x = torch.zeros(shape, device=cond.device)
        else:
            x = self.config.init_noise * randn(shape, generator, device=cond.device)
        chain = run_chain(
            x,
            self.sampling_times,
            self.config.finetune_steps,
            lambda x, t: self.noiseless_step(net, x, t, cond),
            lambda x, t: self.gaussian_step(net, x, t, cond),
            deterministic,
            generator,
        )
        return ActionOutput(
            actions=self.executed_actions(chain.x),
            log_prob=chain.log_probs.sum(dim=1),
            policy_outputs={
                "chain": chain.chain,  # [B, K + 1, horizon, A]
                self.time_key: chain.times,  # [B, K]
                "log_probs": chain.log_probs,  # [B, K]
            },
        )

    def log_prob(
        self,
        obs: Mapping[str, Any],
        instructions: Sequence[str],
        policy_outputs: Mapping[str, Any],
    ) -> torch.Tensor:
        """Per-step log-densities ``[B, K]`` of a recorded chain, with gradients (one batched
        network call over the B * K steps)."""
        self.check_inputs(obs)
        net = self._net()
        cond = self.global_cond(net, obs, instructions)
        shape = (self.config.horizon, self.config.action_dim)
        time_dtype = self.sampling_times.dtype
        t, x, x_next, k = recorded_steps(
            policy_outputs, self.time_key, time_dtype, cond.shape[0], shape, cond.device
        )
        step = self.gaussian_step(net, x, t, cond.repeat_interleave(k, dim=0))
        return gaussian_log_prob(x_next, step.mean, step.std).reshape(-1, k)
