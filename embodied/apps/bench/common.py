"""What the benches share: table rows, the median timing, tabletop-shaped inputs and tables."""

from __future__ import annotations

import importlib.util
import statistics
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

import embodied.sims as sims


class Row:
    """A bench table row (each bench's dataclass): ``as_dict`` gives it to JSON and the table."""

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON output."""
        return asdict(self)  # subclasses are dataclasses


def metaworld_available() -> bool:
    """Whether the ``metaworld`` extra is installed (the benches add its rows then)."""
    return importlib.util.find_spec("metaworld") is not None


def median_rate(run: Any, steps: int, repeats: int, device: Any = None) -> float:
    """Median steps/s of ``run(steps)`` over ``repeats`` timed calls (after one warm-up); on a
    CUDA ``device`` each timed call ends when the GPU has finished its queued work."""
    return paired_rates({0: run}, steps, repeats, device)[0]


def paired_rates(
    runs: dict[Any, Any], steps: int, repeats: int, device: Any = None
) -> dict[Any, float]:
    """``median_rate`` of each of ``runs`` (key -> ``run(n)``), their timed calls interleaved
    (each repeat times every run once, starting one further along), so a figure and its baseline
    see the same moments of a noisy machine and their ratio is paired."""

    def timed(run: Any, n: int) -> float:
        start = time.perf_counter()
        run(n)
        if device is not None and torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
        return n / (time.perf_counter() - start)

    keys = list(runs)
    for key in keys:
        timed(runs[key], min(steps, 20))
    rates: dict[Any, list[float]] = {key: [] for key in keys}
    for r in range(repeats):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            rates[key].append(timed(runs[key], steps))
    return {key: statistics.median(rates[key]) for key in keys}


def tabletop_features(image_size: int, env_state: bool = False) -> dict[str, dict[str, Any]]:
    """Dataset features of a tabletop recording (one camera, agent_pos, 4-D actions, and with
    ``env_state`` the named privileged state)."""
    features: dict[str, dict[str, Any]] = {
        "observation.image": {"dtype": "video", "shape": [image_size, image_size, 3]},
        "observation.state": {"dtype": "float32", "shape": [4]},
        "action": {"dtype": "float32", "shape": [4]},
    }
    if env_state:
        env = sims.make("Reach", obs_mode="state")
        names = env.get_wrapper_attr("feature_names")["environment_state"]
        env.close()
        features["observation.environment_state"] = {
            "dtype": "float32",
            "shape": [len(names)],
            "names": names,
        }
    return features


def random_observation(policy: Any, batch: int, rng: np.random.Generator) -> dict[str, Any]:
    """A batch ``[B, n_obs, ...]`` of every feature ``policy`` reads (uint8 images)."""
    spec = policy.observation_spec
    n_obs = spec.n_obs_steps
    obs = {}
    for key, (height, width) in spec.cameras.items():
        shape = (batch, n_obs, height, width, 3)
        obs[key] = torch.from_numpy(rng.integers(0, 256, shape, dtype=np.uint8))
    for key, dim in (("observation.state", spec.state_dim),
                     ("observation.environment_state", spec.env_state_dim)):  # fmt: skip
        if dim:
            obs[key] = torch.from_numpy(rng.normal(size=(batch, n_obs, dim)).astype(np.float32))
    return obs


def format_table(rows: list[Any]) -> str:
    """Fixed-width text table of bench rows (dataclasses with ``as_dict``)."""
    return format_dicts([r.as_dict() for r in rows])


def format_dicts(dicts: list[dict[str, Any]]) -> str:
    """Fixed-width text table of rows given as dicts with the same keys."""
    header = tuple(dicts[0]) if dicts else ()

    def show(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
        return str(value)

    lines = [tuple(show(d[k]) for k in header) for d in dicts]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line) for line in lines]
    return "\n".join(out)
