"""LeRobot's SmolVLA (``--policy.type=smolvla``) as a toolkit chain, with ReinFlow's noise injection
for exact per-step log-probabilities over its flow-matching sampler.

SmolVLA embeds the cameras, the tokenised instruction and the state with its VLM once per decision
(the "prefix", kept as the VLM's key/value cache), then integrates the action expert's velocity
``v_theta`` from noise to actions over ``N = num_steps`` Euler steps. Time runs from ``tau = 1``
(noise) to ``tau = 0`` (actions), ``dt = -1 / N``, ``tau_k = 1 + k dt`` (LeRobot's
``euler_integrate``)::

    x_{k+1} = x_k + dt v_theta(x_k, tau_k, prefix)                        # LeRobot's step

The chain's ``x`` is LeRobot's padded chunk ``[chunk_size, max_action_dim]`` of normalised
actions; only the first ``A`` values (the action's size) are actions, the rest are padding that
the expert also moves. A fine-tuned step (ReinFlow, with a fixed exploration std) adds noise to
the action values only::

    x_{k+1} ~ N(x_k + dt v_theta(x_k, tau_k, prefix), diag(s)^2),  s = min_std on the A action
    values, 0 on the padding (deterministic there, so it adds nothing to the log-density)

Deterministic acting takes the Euler means from ``x_0 = 0``, which is LeRobot's
``predict_action_chunk(batch, noise=zeros)``. A decision executes the first ``n_action_steps``
rows' action values, unnormalised by LeRobot's postprocessor (as ``select_action``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from embodied.core.sampling import Generators
from embodied.policies.lerobot.chain import LeRobotChain
from embodied.policies.sampler import Step, gaussian_log_prob

LANGUAGE_TOKENS = "observation.language.tokens"  # what LeRobot's tokenizer step writes
LANGUAGE_MASK = "observation.language.attention_mask"


class SmolVLAChain(LeRobotChain):
    """SmolVLA's Euler chain over its action expert, the VLM prefix cached (module docstring)."""

    time_key = "taus"
    time_dtype = torch.float32

    def __init__(self, model: nn.Module, min_std: float, explore_executed: bool) -> None:
        super().__init__(model, min_std, explore_executed)
        config = model.config
        if config.adapt_to_pi_aloha:
            raise ValueError(
                "SmolVLA with adapt_to_pi_aloha=true (ALOHA's joint flips) is not supported"
            )
        if config.rtc_config is not None and config.rtc_config.enabled:
            raise ValueError(
                "SmolVLA with real-time chunking (rtc_config.enabled) is not supported"
            )
        steps = int(config.num_steps)
        self.dt = -1.0 / steps
        # As LeRobot's euler_integrate: each time computed in Python, then made float32.
        taus = torch.tensor([1.0 + k * self.dt for k in range(steps)], dtype=torch.float32)
        self.times: torch.Tensor
        self.register_buffer("times", taus, persistent=False)
        action_dim = int(config.output_features["action"].shape[0])
        std = torch.zeros(1, 1, int(config.max_action_dim))
        std[..., :action_dim] = min_std
        self.std: torch.Tensor
        self.register_buffer("std", std, persistent=False)
        self.action_dim = action_dim

    @property
    def shape(self) -> tuple[int, int]:
        """``(chunk_size, max_action_dim)``: LeRobot's padded chunk."""
        config = self.model.config
        return int(config.chunk_size), int(config.max_action_dim)

    def context(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """The prefix's padding mask and the VLM's key/value cache over cameras, instruction and
        state (LeRobot's ``sample_actions`` up to its Euler loop)."""
        from lerobot.policies.smolvla.modeling_smolvla import make_att_2d_masks

        policy, flow = self.model, self.model.model
        images, image_masks = policy.prepare_images(batch)
        state = policy.prepare_state(batch)
        embeddings, pad_masks, att_masks = flow.embed_prefix(
            images, image_masks, batch[LANGUAGE_TOKENS], batch[LANGUAGE_MASK], state=state
        )
        _, cache = flow.vlm_with_expert.forward(
            attention_mask=make_att_2d_masks(pad_masks, att_masks),
            position_ids=torch.cumsum(pad_masks, dim=1) - 1,
            past_key_values=None,
            inputs_embeds=[embeddings, None],
            use_cache=flow.config.use_cache,
        )
        return pad_masks, cache

    def _mean(self, x: torch.Tensor, t: torch.Tensor, context: Any) -> torch.Tensor:
        """The Euler mean ``x + dt v_theta(x, t, prefix)`` (the expert call restores the cache)."""
        pad_masks, cache = context
        v = self.model.model.denoise_step(
            prefix_pad_masks=pad_masks, past_key_values=cache, x_t=x, timestep=t
        )
        return x + self.dt * v

    def lerobot_step(
        self, x: torch.Tensor, t: torch.Tensor, context: Any, generator: Generators
    ) -> torch.Tensor:
        """LeRobot's Euler step (noiseless)."""
        return self._mean(x, t, context)

    def step_distribution(self, x: torch.Tensor, t: torch.Tensor, context: Any) -> Step:
        """``N(Euler mean, diag(s)^2)``, ``s`` = ``min_std`` on the action values, 0 on padding."""
        mean = self._mean(x, t, context)
        return Step(mean, self.std, mean)

    def log_probs(
        self, context: Any, t: torch.Tensor, x: torch.Tensor, x_next: torch.Tensor, k: int
    ) -> torch.Tensor:
        """One expert call per recorded step index over the ``B`` decisions (the prefix cache
        belongs to the B observations), as ``act`` made them."""
        b = x.shape[0] // k
        t, x, x_next = t.view(b, k), x.view(b, k, *x.shape[1:]), x_next.view(b, k, *x.shape[1:])
        steps = [self.gaussian_step(x[:, i], t[:, i], context) for i in range(k)]
        columns = [gaussian_log_prob(x_next[:, i], s.mean, s.std) for i, s in enumerate(steps)]
        return torch.stack(columns, dim=1).reshape(-1)

    @property
    def executed_rows(self) -> slice:
        """The first ``n_action_steps`` rows."""
        return slice(0, self.model.config.n_action_steps)

    def executed(self, x: torch.Tensor) -> torch.Tensor:
        """The executed rows' action values (the padding dropped)."""
        return super().executed(x)[..., : self.action_dim]
