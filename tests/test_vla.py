"""Vision-language-action policy: action tokenizer, constrained decoding with a KV cache,
log-probability recomputation, BC training, bad input, object tokens. Building it from a dataset,
the registry and save/load are in test_vla_construction.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from embodied.core.policy import Policy
from embodied.policies.vla import VLAConfig, VLAPolicy
from embodied.policies.vla.backbone import build_word_tokenizer

INSTRUCTIONS = ["Reach the red block", "go to the BLUE block", "unknown words only", ""]
STATS = {
    "observation.state": {"mean": np.array([0.5, -1.0, 2.0]), "std": np.array([2.0, 0.5, 1.0])},
    "observation.environment_state": {"mean": np.zeros(5), "std": np.ones(5)},
    "action": {
        "min": np.array([-1.0, -0.5]),
        "max": np.array([1.0, 0.5]),
        "q01": np.array([-0.9, -0.4]),
        "q99": np.array([0.9, 0.4]),
    },
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_config(**overrides) -> VLAConfig:
    """A policy small enough for CPU tests: one 16 px camera (4 patches), 2-layer decoder."""
    values = dict(
        action_dim=2,
        state_dim=3,
        env_state_dim=5,
        image_size=16,
        patch_size=8,
        horizon=4,
        n_action_steps=3,
        n_bins=32,
        vocab=["block", "blue", "go", "reach", "red", "the", "to"],
        max_instruction_tokens=5,
        vision_hidden_size=32,
        vision_layers=1,
        vision_heads=2,
        vision_intermediate_size=64,
        hidden_size=32,
        text_layers=2,
        text_heads=2,
        text_intermediate_size=64,
    )
    return VLAConfig(**{**values, **overrides})


def tiny_policy(seed: int = 0, **overrides) -> VLAPolicy:
    torch.manual_seed(seed)
    return VLAPolicy(tiny_config(**overrides)).fit_normalizers(STATS)


def observations(batch: int = 4, n_obs: int = 1, seed: int = 0, size: int = 16) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "observation.image": torch.randint(0, 256, (batch, n_obs, size, size, 3), generator=g).to(
            torch.uint8
        ),
        "observation.state": torch.randn(batch, n_obs, 3, generator=g),
        "observation.environment_state": torch.randn(batch, n_obs, 5, generator=g),
    }


# --- the action tokenizer ------------------------------------------------------------------------
def test_action_tokenizer_round_trip():
    policy = tiny_policy()
    n_bins, start = policy.config.n_bins, policy.action_token_start
    assert start + n_bins == len(policy.tokenizer)  # the last n_bins ids of the vocabulary
    low, high = policy.action_low, policy.action_high
    torch.testing.assert_close(low, torch.tensor([-1.0, -0.5]))
    actions = low + (high - low) * torch.rand(64, 3, 2, generator=torch.Generator().manual_seed(0))
    actions[0, 0] = low  # both ends of the range
    actions[0, 1] = high
    ids = policy.encode(actions)
    assert ids.shape == (64, 6) and ids.dtype == torch.long
    assert ids.min() >= start and ids.max() < start + n_bins
    assert (ids[0, :2] == start).all() and (ids[0, 2:4] == start + n_bins - 1).all()
    width = (high - low) / n_bins
    assert ((policy.decode(ids) - actions).abs() <= width / 2 + 1e-6).all()
    every = torch.arange(start, start + n_bins).repeat_interleave(2).reshape(-1, 2)[None]
    every = every.reshape(1, -1)  # every bin of every dimension
    assert torch.equal(policy.encode(policy.decode(every)), every)
    # Out-of-range actions land in the end bins.
    outside = torch.tensor([[[-5.0, 5.0]]])
    assert policy.encode(outside).tolist() == [[start, start + n_bins - 1]]


def test_action_range_from_quantiles_and_constant_dimensions():
    policy = tiny_policy(action_range="quantile")
    torch.testing.assert_close(policy.action_low, torch.tensor([-0.9, -0.4]))
    torch.testing.assert_close(policy.action_high, torch.tensor([0.9, 0.4]))
    policy.set_action_range([-1.0, -1.0], [1.0, -1.0])  # a gripper that never moves
    ids = policy.encode(torch.tensor([[[0.3, -1.0]]]))
    assert policy.decode(ids)[0, 0, 1].item() == pytest.approx(-1.0, abs=1e-4)
    with pytest.raises(ValueError, match="lack 'q01'/'q99'"):
        tiny_policy().__class__(tiny_config(action_range="quantile")).fit_normalizers(
            {**STATS, "action": {"min": np.zeros(2), "max": np.ones(2)}}
        )


def test_word_tokenizer():
    tokenizer = build_word_tokenizer(["block", "red"], n_bins=4)
    ids = tokenizer(["Red-block!", "a red"], add_special_tokens=False)["input_ids"]
    unk = tokenizer.unk_token_id
    assert ids == [[5, 4], [unk, 5]]
    assert len(tokenizer) == 4 + 2 + 4


# --- acting ---------------------------------------------------------------------------------------
def test_act_shapes_range_and_reproducibility():
    policy = tiny_policy()
    obs = observations()
    out = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(3))
    assert out.actions.shape == (4, 3, 2) and out.actions.dtype == torch.float32
    assert out.actions.min() >= -1.0 and out.actions.max() <= 1.0
    tokens, log_probs = out.policy_outputs["action_tokens"], out.policy_outputs["log_probs"]
    assert tokens.shape == (4, 6) and tokens.dtype == torch.long
    assert log_probs.shape == (4, 6) and (log_probs <= 0).all()
    torch.testing.assert_close(out.log_prob, log_probs.sum(1))
    torch.testing.assert_close(out.actions, policy.decode(tokens).clamp(-1, 1))
    again = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(3))
    assert torch.equal(again.policy_outputs["action_tokens"], tokens)
    other = policy.act(obs, INSTRUCTIONS, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(other.policy_outputs["action_tokens"], tokens)
    # One observation alone decodes the same as inside the batch (fixed-length prompt slot).
    single = {k: v[1:2] for k, v in obs.items()}
    greedy = policy.act(obs, INSTRUCTIONS, deterministic=True)
    alone = policy.act(single, INSTRUCTIONS[1:2], deterministic=True)
    assert torch.equal(
        alone.policy_outputs["action_tokens"], greedy.policy_outputs["action_tokens"][1:2]
    )
    # A single-step observation [B, ...] works like [B, 1, ...].
    flat = {k: v[:, 0] for k, v in obs.items()}
    assert torch.equal(policy.act(flat, INSTRUCTIONS, deterministic=True).actions, greedy.actions)


def test_greedy_is_the_argmax_of_the_constrained_logits():
    policy = tiny_policy(temperature=0.5)
    obs = observations(seed=1)
    out = policy.act(obs, INSTRUCTIONS, deterministic=True)
    tokens = out.policy_outputs["action_tokens"]
    with torch.no_grad():
        prefix = policy.prefix_embeddings(obs, INSTRUCTIONS)
        k = tokens.shape[1]
        embeds = torch.cat([prefix, policy.backbone.get_input_embeddings()(tokens[:, :-1])], 1)
        hidden = policy.backbone.get_decoder()(inputs_embeds=embeds).last_hidden_state[:, -k:]
        full = policy.backbone.get_output_embeddings()(hidden)  # every token of the vocabulary
    start, n_bins = policy.action_token_start, policy.config.n_bins
    masked = torch.full_like(full, float("-inf"))
    masked[..., start : start + n_bins] = full[..., start : start + n_bins]
    assert torch.equal(masked.argmax(-1), tokens)
    # The recorded log-probabilities are of the constrained distribution at the temperature.
    expected = torch.log_softmax(masked / 0.5, -1).gather(-1, tokens[..., None]).squeeze(-1)
    torch.testing.assert_close(out.policy_outputs["log_probs"], expected, atol=1e-5, rtol=0)
    # The unconstrained argmax is (for a random model) often a non-action token.
    assert (full.argmax(-1) < start).any()


def test_kv_cache_decoding_matches_full_recomputation():
    """Decoding with the KV cache gives the tokens and log-probs of re-running the sequence, and
    passes the cache by the name the installed transformers takes (``cache`` in 5.x, where
    ``past_key_values`` warns of its removal)."""
    import warnings

    policy = tiny_policy(n_action_steps=4)
    obs = observations(seed=2)
    for deterministic in (True, False):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cached = policy.act(
                obs, INSTRUCTIONS, deterministic, generator=torch.Generator().manual_seed(5)
            )
        assert not [w for w in caught if "past_key_values" in str(w.message)]
        full = policy.act(
            obs,
            INSTRUCTIONS,
            deterministic,
            generator=torch.Generator().manual_seed(5),
            use_cache=False,
        )
        assert torch.equal(
            cached.policy_outputs["action_tokens"], full.policy_outputs["action_tokens"]
        )
        torch.testing.assert_close(
            cached.policy_outputs["log_probs"], full.policy_outputs["log_probs"], atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("deterministic", [True, False])
def test_log_prob_recomputes_the_sampling_log_probs_with_gradients(deterministic: bool):
    policy = tiny_policy(temperature=0.8)
    obs = observations(seed=3)
    out = policy.act(obs, INSTRUCTIONS, deterministic, generator=torch.Generator().manual_seed(1))
    log_probs = policy.log_prob(obs, INSTRUCTIONS, out.policy_outputs)
    assert log_probs.shape == (4, 6) and log_probs.requires_grad
    torch.testing.assert_close(log_probs, out.policy_outputs["log_probs"], atol=1e-4, rtol=0)
    log_probs.sum().backward()
    grads = {
        "vision tower": policy.backbone.model.vision_tower,
        "projector": policy.backbone.model.multi_modal_projector,
        "language model": policy.backbone.model.language_model,
        "proprio": policy.proprio,
    }
    for name, module in grads.items():
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters()), name
    head = policy.backbone.get_output_embeddings().weight.grad
    assert head[policy.action_token_start :].abs().sum() > 0
    assert head[: policy.action_token_start].abs().sum() == 0  # constrained: no other token


def test_pixel_vla_reads_the_camera_state_and_instruction_only():
    """The VLA from pixels (no environment-state tokens): it says so in its observation spec,
    refuses the privileged state, and its per-token log-probs recompute to 1e-4 with gradients
    through the vision tower."""
    policy = tiny_policy(temperature=0.8, env_state_dim=0)
    spec = policy.observation_spec
    assert not spec.privileged
    assert spec.read_keys() == ["observation.image", "observation.state"]
    obs = observations(seed=3)
    privileged = obs.pop("observation.environment_state")
    out = policy.act(obs, INSTRUCTIONS, False, generator=torch.Generator().manual_seed(1))
    log_probs = policy.log_prob(obs, INSTRUCTIONS, out.policy_outputs)
    torch.testing.assert_close(log_probs, out.policy_outputs["log_probs"], atol=1e-4, rtol=0)
    log_probs.sum().backward()
    tower = policy.backbone.model.vision_tower
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tower.parameters())
    with pytest.raises(ValueError, match="does not read 'observation.environment_state'"):
        policy.act({**obs, "observation.environment_state": privileged}, INSTRUCTIONS, True)


# --- behaviour cloning ----------------------------------------------------------------------------
def synthetic_batch(policy: VLAPolicy, batch: int = 16) -> dict:
    """An expert whose chunk depends on the observation: dimension 0 follows the sign of the
    state's first entry, dimension 1 whether the image is bright, and the chunk ramps over time."""
    g = torch.Generator().manual_seed(11)
    obs = observations(batch, n_obs=1, seed=11)
    bright = torch.rand(batch, generator=g) > 0.5
    obs["observation.image"] = torch.where(
        bright.view(-1, 1, 1, 1, 1),
        torch.full_like(obs["observation.image"], 220),
        torch.full_like(obs["observation.image"], 30),
    )
    sign = torch.sign(obs["observation.state"][:, 0, 0])
    steps = torch.arange(4, dtype=torch.float32)  # horizon 4
    action = torch.stack(
        [
            sign[:, None] * (0.3 + 0.2 * steps),
            torch.where(bright, 0.3, -0.3)[:, None].expand(-1, 4),
        ],
        dim=-1,
    )
    is_pad = torch.zeros(batch, 4, dtype=torch.bool)
    is_pad[0, 2:] = True  # the episode ended: these steps repeat the last action
    action[0, 2:] = 0.9  # junk that must not be learned (masked)
    words = ["reach the red block", "go to the blue block"]
    return {
        **obs,
        "action": action,
        "action_is_pad": is_pad,
        "instruction": [words[i % 2] for i in range(batch)],
    }


def test_bc_loss_fits_a_synthetic_expert():
    policy = tiny_policy()
    batch = synthetic_batch(policy)
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = policy.bc_loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] > 3.0  # ~log(32) at initialisation
    assert losses[-1] < 0.3 * losses[0], losses
    obs = {k: v for k, v in batch.items() if k.startswith("observation.")}
    actions = policy.act(obs, batch["instruction"], deterministic=True).actions
    target = batch["action"][:, :3]
    keep = ~batch["action_is_pad"][:, :3]
    width = (policy.action_high - policy.action_low) / policy.config.n_bins
    error = (actions - target).abs()[keep]  # [n_valid, A]
    assert (error <= width / 2 + 1e-5).float().mean() > 0.9, error


def test_bc_loss_masks_padded_steps():
    policy = tiny_policy()
    batch = synthetic_batch(policy)
    loss = policy.bc_loss(batch)
    changed = dict(batch, action=batch["action"].clone())
    changed["action"][0, 2:] = -0.9  # only padded steps differ (they end the chunk: causal)
    torch.testing.assert_close(policy.bc_loss(changed), loss)
    with pytest.raises(ValueError, match=r"batch 'action' has shape \(16, 2, 2\)"):
        policy.bc_loss(dict(batch, action=batch["action"][:, :2]))


# --- bad input ------------------------------------------------------------------------------------
def test_bad_observations_and_instructions():
    policy = tiny_policy()
    obs = observations()
    with pytest.raises(
        ValueError, match=r"'observation.image' has shape \(4, 1, 32, 32, 3\).*16, 16, 3"
    ):
        policy.act(
            {**obs, "observation.image": torch.zeros(4, 1, 32, 32, 3, dtype=torch.uint8)},
            INSTRUCTIONS,
        )
    with pytest.raises(ValueError, match=r"'observation.image' must be uint8.*float32"):
        policy.act({**obs, "observation.image": obs["observation.image"].float()}, INSTRUCTIONS)
    with pytest.raises(ValueError, match=r"no 'observation.state'"):
        policy.act({k: v for k, v in obs.items() if k != "observation.state"}, INSTRUCTIONS)
    with pytest.raises(ValueError, match=r"'observation.environment_state' has shape \(4, 1, 4\)"):
        policy.act({**obs, "observation.environment_state": torch.zeros(4, 1, 4)}, INSTRUCTIONS)
    with pytest.raises(ValueError, match=r"'observation.state' has shape \(2, 1, 3\), batch 4"):
        policy.act({**obs, "observation.state": torch.zeros(2, 1, 3)}, INSTRUCTIONS)
    with pytest.raises(ValueError, match="NaN"):
        policy.act({**obs, "observation.state": torch.full((4, 1, 3), float("nan"))}, INSTRUCTIONS)
    with pytest.raises(ValueError, match="need 4 instructions.*got 3"):
        policy.act(obs, INSTRUCTIONS[:3])
    with pytest.raises(ValueError, match="need 4 instructions.*single string"):
        policy.act(obs, "reach the red block")
    out = policy.act(obs, INSTRUCTIONS)
    with pytest.raises(ValueError, match=r"'action_tokens' has shape \(4, 5\).*\(4, 6\)"):
        policy.log_prob(
            obs, INSTRUCTIONS, {"action_tokens": out.policy_outputs["action_tokens"][:, :5]}
        )
    with pytest.raises(ValueError, match=r"must lie in"):
        policy.log_prob(obs, INSTRUCTIONS, {"action_tokens": torch.zeros(4, 6, dtype=torch.long)})
    with pytest.raises(ValueError, match="no 'action_tokens'"):
        policy.log_prob(obs, INSTRUCTIONS, {})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"action_dim": 0}, "VLAConfig.action_dim"),
        ({"n_action_steps": 5}, "n_action_steps <= horizon"),
        ({"image_size": 20}, "VLAConfig.image_size=20 must be divisible by patch_size=8"),
        ({"action_range": "percentile"}, "VLAConfig.action_range"),
        ({"temperature": 0.0}, "VLAConfig.temperature"),
        ({"image_keys": ["pixels"]}, "VLAConfig.image_keys"),
        ({"vocab": ["Red", "red"]}, "VLAConfig.vocab"),
        ({"hidden_size": 31}, "VLAConfig.hidden_size=31 must be divisible by text_heads"),
    ],
)
def test_bad_config_names_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_bad_statistics():
    policy = VLAPolicy(tiny_config())
    with pytest.raises(ValueError, match="statistics lack"):
        policy.fit_normalizers({"action": STATS["action"]})
    with pytest.raises(ValueError, match=r"action range has shapes \(3,\)"):
        policy.set_action_range([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])


@pytest.mark.parametrize("relative", [False, True])
def test_object_tokens_from_named_environment_state(tmp_path: Path, relative: bool):
    """``env_state_encoder="objects"``: one prompt token per object of the named environment
    state, its name's words embedded like the instruction's (with ``object_relative``, also the
    offset of an object with xyz from the hand); exact log-probs and save/load."""
    names = ["block_red.x", "block_red.y", "block_red.z", "block_blue.x", "drawer.opening"]
    features = {
        "observation.image": {"dtype": "video", "shape": [16, 16, 3]},
        "observation.state": {"dtype": "float32", "shape": [3]},
        "observation.environment_state": {"dtype": "float32", "shape": [5], "names": names},
        "action": {"dtype": "float32", "shape": [2]},
    }
    tiny = tiny_config()
    backbone = [k for k in tiny.__dict__ if k.startswith(("vision_", "text_", "hidden_"))]
    sizes = {k: getattr(tiny, k) for k in [*backbone, "patch_size", "n_bins", "n_action_steps"]}
    config = VLAPolicy.config_from_dataset(
        features,
        ["reach the red block"],
        horizon=4,
        env_state_encoder="objects",
        object_relative=relative,
        **sizes,
    )
    assert config.env_state_names == names and {"drawer", "blue"} <= set(config.vocab)
    assert config.num_object_tokens == 3 and config.proprio_dim == 3  # the state alone
    torch.manual_seed(0)
    policy = VLAPolicy(config).fit_normalizers(STATS)
    obs = observations()
    instructions = ["reach the red block", "reach the blue block", "reach the red block", ""]
    prefix = policy.prefix_embeddings(obs, instructions)
    start = len(policy.bos_ids) + 4 + 1  # bos, 4 image patches, 1 proprio token
    assert prefix.shape[1] == start + 3 + config.max_instruction_tokens  # + 3 object tokens
    # Moving only the red block changes its token and nothing before it in the prompt.
    moved = {**obs, "observation.environment_state": obs["observation.environment_state"].clone()}
    moved["observation.environment_state"][..., 0] += 1.0
    changed = (policy.prefix_embeddings(moved, instructions) - prefix).abs().sum(-1)[0]
    assert changed[:start].max() == 0 and changed[start] > 0 and changed[start + 1 :].max() == 0
    # Moving the hand changes the proprio token, and with relative tokens the red block's (the
    # only object with x, y and z) as well.
    moved = {**obs, "observation.state": obs["observation.state"].clone()}
    moved["observation.state"][..., 0] += 1.0
    changed = (policy.prefix_embeddings(moved, instructions) - prefix).abs().sum(-1)[0]
    assert changed[: start - 1].max() == 0 and changed[start - 1] > 0
    assert (changed[start] > 0) == relative and changed[start + 1 :].max() == 0

    out = policy.act(obs, instructions, generator=torch.Generator().manual_seed(3))
    recomputed = policy.log_prob(obs, instructions, out.policy_outputs)
    torch.testing.assert_close(recomputed.sum(-1), out.log_prob, atol=1e-4, rtol=0)
    recomputed.sum().backward()
    assert policy.object_tokens.value_proj.weight.grad.abs().sum() > 0

    loaded = Policy.from_pretrained(policy.save_pretrained(tmp_path / "vla"))
    torch.testing.assert_close(
        loaded.act(obs, instructions, deterministic=True).actions,
        policy.act(obs, instructions, deterministic=True).actions,
    )
    with pytest.raises(ValueError, match="env_state_names has 0"):
        tiny_config(env_state_encoder="objects")
    with pytest.raises(ValueError, match="object_relative needs object tokens"):
        tiny_config(object_relative=True)
