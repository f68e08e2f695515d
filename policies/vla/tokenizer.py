"""The VLA's action tokenizer (OpenVLA): each action dimension is cut into ``n_bins`` uniform bins
between ``action_low`` and ``action_high`` (buffers set by ``fit_normalizers``); a value maps to
the bin it falls in (values outside are clipped to the end bins) and a bin decodes to its centre.
Bin ``i`` of any dimension is token ``action_token_start + i``: the last ``n_bins`` ids of the
vocabulary. ``action_range="min_max"`` (default) takes the bounds from the dataset's per-
dimension min/max, ``"quantile"`` from its q01/q99 (OpenVLA's choice, robust to outliers). The
default is min/max because the toolkit's actions already live in the env box [-1, 1] (no outliers
to cut) and because the q01/q99 of a LeRobot ``stats.json`` are the count-weighted *mean of per-
episode quantiles* (``datasets/lerobot/stats.py``), which can be far inside the real range (e.g.
Reach: q01 -0.13 while 10% of the actions are -1), so binning by them would clip real actions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


class ActionTokenizer:
    """Policy mixin: raw actions <-> action-token ids through per-dimension uniform bins between
    the ``action_low`` / ``action_high`` buffers (``config.n_bins``, ``action_token_start``)."""

    action_low: torch.Tensor
    action_high: torch.Tensor
    action_token_start: int

    def fit_action_range(self, action: Mapping[str, Any]) -> None:
        """The bins' bounds from the actions' dataset statistics: min/max or q01/q99
        (``config.action_range``)."""
        low_key, high_key = (
            ("min", "max") if self.config.action_range == "min_max" else ("q01", "q99")
        )
        if low_key not in action or high_key not in action:
            raise ValueError(
                f"action statistics lack {low_key!r}/{high_key!r} (action_range="
                f"{self.config.action_range!r}); given: {sorted(action)}"
            )
        self.set_action_range(action[low_key], action[high_key])

    @torch.no_grad()
    def set_action_range(self, low: Any, high: Any) -> ActionTokenizer:
        """Set the action bins' bounds ``[A]`` (raw units). A dimension whose range is (nearly)
        empty gets a tiny one around its value, so it decodes back to that value."""
        low = torch.as_tensor(low, dtype=torch.float32).reshape(-1)
        high = torch.as_tensor(high, dtype=torch.float32).reshape(-1)
        if low.shape != self.action_low.shape or high.shape != self.action_low.shape:
            raise ValueError(
                f"action range has shapes {tuple(low.shape)} / {tuple(high.shape)}, the policy "
                f"expects {tuple(self.action_low.shape)}"
            )
        if not (torch.isfinite(low).all() and torch.isfinite(high).all() and (high >= low).all()):
            raise ValueError(f"action range must be finite with high >= low, got {low} .. {high}")
        flat = (high - low) < 1e-6
        centre = (high + low) / 2
        self.action_low.copy_(torch.where(flat, centre - 1e-3, low))
        self.action_high.copy_(torch.where(flat, centre + 1e-3, high))
        return self

    @property
    def bin_width(self) -> torch.Tensor:
        """Per-dimension bin width ``[A]``."""
        return (self.action_high - self.action_low) / self.config.n_bins

    def encode_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Raw actions ``[..., A]`` -> bin indices ``[..., A]`` in ``0 .. n_bins - 1`` (clipped)."""
        x = (actions.float() - self.action_low) / (self.action_high - self.action_low)
        bins = torch.floor(x * self.config.n_bins).long()
        return bins.clamp(0, self.config.n_bins - 1)

    def decode_actions(self, bins: torch.Tensor) -> torch.Tensor:
        """Bin indices ``[..., A]`` -> raw actions ``[..., A]`` at the bin centres."""
        if bins.min() < 0 or bins.max() >= self.config.n_bins:
            raise ValueError(f"action bins must lie in 0 .. {self.config.n_bins - 1}")
        return self.action_low + (bins.float() + 0.5) * self.bin_width

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Raw action chunks ``[B, chunk, A]`` -> vocabulary ids ``[B, chunk * A]`` (step-major)."""
        return (self.encode_actions(actions) + self.action_token_start).flatten(-2)

    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids ``[B, chunk * A]`` -> raw chunks ``[B, chunk, A]`` (bin centres)."""
        a = self.config.action_dim
        if ids.shape[-1] % a:
            raise ValueError(f"{ids.shape[-1]} action tokens are not a whole number of {a}-D steps")
        bins = ids - self.action_token_start
        return self.decode_actions(bins.reshape(*ids.shape[:-1], ids.shape[-1] // a, a))
